"""Network ports' negotiated speed and RDMA GID tables, from sysfs.

A rail that came up at 200 Gb/s beside seven at 400 Gb/s, or a RoCE port whose
GID table lost its RoCE v2 entries, slows (or breaks) every collective that
crosses it.  Per port:

* Ethernet: ``/sys/class/net/<if>/speed`` (Mbit/s; absent or ``-1`` while the
  link is down) and ``operstate``, for interfaces with a PCI device behind them;
* InfiniBand/RoCE: ``/sys/class/infiniband/<hca>/ports/<n>/rate``
  (``"400 Gb/sec (4X NDR)"``), ``state``, ``link_layer`` and the first
  :data:`GID_SLOTS` entries of ``gids/`` with ``gid_attrs/types/``.

Linux's sysfs does not say which speeds a port *supports*.  For Ethernet ports
the collector asks the driver (``ETHTOOL_GLINKSETTINGS``, the ioctl behind
``ethtool <if>``): the fastest mode the port supports, and the fastest both the
port and its link partner support (``speed_common_max_mbps``; only when the
partner advertises, i.e. with auto-negotiation).  A port below what both ends
can do negotiated down.  Each port also carries its adapter model (PCI
``vendor:device``): ports of one model on one node, and the same rails across a
job's nodes, should negotiate the same speed, and the engine compares them
(the only comparison for InfiniBand, whose sysfs has no supported speeds).
"""

from __future__ import annotations

import ctypes
import fcntl
import os
import re
import socket
import struct
from typing import Any

from whywait.agents.collectors.base import MAX_MBPS, parse_gbps, parse_word
from whywait.agents.collectors.base import read_text as _read

SIOCETHTOOL = 0x8946
ETHTOOL_GLINKSETTINGS = 0x4C
_LINK_SETTINGS_HEADER = 48  # struct ethtool_link_settings up to link_mode_masks[] (include/uapi/linux/ethtool.h)
# enum ethtool_link_mode_bit_indices: the speed (Mbit/s) of every mode bit that names one (the others are
# pause, autoneg, port and FEC bits).  A mode's speed is the number its name starts with.
_MODE_SPEEDS: dict[int, int] = {
    0: 10, 1: 10, 2: 100, 3: 100, 4: 1000, 5: 1000, 12: 10000, 15: 2500, 17: 1000, 18: 10000, 19: 10000,
    21: 20000, 22: 20000, 23: 40000, 24: 40000, 25: 40000, 26: 40000, 27: 56000, 28: 56000, 29: 56000, 30: 56000,
    31: 25000, 32: 25000, 33: 25000, 34: 50000, 35: 50000, 36: 100000, 37: 100000, 38: 100000, 39: 100000,
    40: 50000, 41: 1000, 42: 10000, 43: 10000, 44: 10000, 45: 10000, 46: 10000, 47: 2500, 48: 5000,
    **{b: 50000 for b in range(52, 57)}, **{b: 100000 for b in range(57, 62)}, **{b: 200000 for b in range(62, 67)},
    67: 100, 68: 1000, **{b: 400000 for b in range(69, 74)}, **{b: 100000 for b in range(75, 80)},
    **{b: 200000 for b in range(80, 85)}, **{b: 400000 for b in range(85, 90)}, 90: 100, 91: 100, 92: 10,
    **{b: 800000 for b in range(93, 99)}, 99: 10, 100: 10, 101: 10, 102: 10, **{b: 200000 for b in range(103, 109)},
    **{b: 400000 for b in range(109, 115)}, **{b: 800000 for b in range(115, 121)},
    **{b: 1600000 for b in range(121, 125)},
}


def fastest_mode(words: tuple[int, ...] | list[int]) -> int | None:
    """The fastest speed (Mbit/s) among the link modes set in a mask of 32-bit words; None when none is."""
    best = None
    for w, word in enumerate(words):
        for bit in range(32):
            if word >> bit & 1:
                speed = _MODE_SPEEDS.get(w * 32 + bit)
                if speed is not None and (best is None or speed > best):
                    best = speed
    return best


def link_modes(ifname: str) -> tuple[int | None, int | None] | None:
    """``(fastest supported, fastest both ends support)`` in Mbit/s for an Ethernet interface, from the
    driver (``ETHTOOL_GLINKSETTINGS``); None when the driver does not say (a virtual NIC, another
    network namespace, an old kernel)."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    try:
        name = ifname.encode()[:15]
        # First call with no mask words: the kernel answers with minus the number it uses.
        buf = ctypes.create_string_buffer(_LINK_SETTINGS_HEADER)
        struct.pack_into("I", buf, 0, ETHTOOL_GLINKSETTINGS)
        fcntl.ioctl(sock.fileno(), SIOCETHTOOL, struct.pack("16sP", name, ctypes.addressof(buf)) + bytes(16))
        nwords = -struct.unpack_from("b", buf, 15)[0]
        if not 0 < nwords <= 127:
            return None
        buf = ctypes.create_string_buffer(_LINK_SETTINGS_HEADER + 3 * 4 * nwords)
        struct.pack_into("I", buf, 0, ETHTOOL_GLINKSETTINGS)
        struct.pack_into("b", buf, 15, nwords)
        fcntl.ioctl(sock.fileno(), SIOCETHTOOL, struct.pack("16sP", name, ctypes.addressof(buf)) + bytes(16))
        masks = struct.unpack_from(f"{3 * nwords}I", buf, _LINK_SETTINGS_HEADER)
    except OSError:
        return None
    finally:
        sock.close()
    supported, partner = masks[:nwords], masks[2 * nwords:]
    common = [a & b for a, b in zip(supported, partner, strict=True)]
    return fastest_mode(supported), fastest_mode(common)


_PCI_ADDR = re.compile(r"^[0-9a-f]{4}:[0-9a-f]{2}:[0-9a-f]{2}\.[0-7]$")
GID_SLOTS = 16  # enough to see the link-local and the first RoCE v2 entries, without reading 255 files per port
_ZERO_GID = "0000:0000:0000:0000:0000:0000:0000:0000"
_VIRTUAL = re.compile(r"^(lo|veth|docker|br-|virbr|cali|flannel|cni|vxlan|tun|tap|ifb|dummy|kube|lxc|bond)")


class PortSource:
    """Reads every physical port's speed, state and GID table under ``root``."""

    name = "ports"
    every_s = 10.0

    def __init__(self, root: str = "/", link_modes: Any = link_modes) -> None:
        self.root = root
        self.errors = 0
        self.link_modes = link_modes  # the driver query; tests pass a fake

    def _sys(self, *parts: str) -> str:
        return os.path.join(self.root, "sys", *parts)

    def available(self) -> str | None:
        """None when ``/sys/class/net`` or ``/sys/class/infiniband`` exists; else why the source is off."""
        if os.path.isdir(self._sys("class", "net")) or os.path.isdir(self._sys("class", "infiniband")):
            return None
        return f"no {self._sys('class', 'net')} and no {self._sys('class', 'infiniband')}"

    def read(self, mono: float) -> list[dict[str, Any]]:
        """One record per port, IB/RoCE ports first; called when the source is due."""
        return self._rdma_ports() + self._ethernet()

    def _rdma_ports(self) -> list[dict[str, Any]]:
        base = self._sys("class", "infiniband")
        try:
            hcas = sorted(os.listdir(base))
        except OSError:
            return []
        out = []
        for hca in hcas:
            model = _model(os.path.join(base, hca, "device"))
            pdir = os.path.join(base, hca, "ports")
            try:
                ports = sorted(os.listdir(pdir), key=lambda p: (len(p), p))
            except OSError:
                self.errors += 1
                continue
            for port in ports:
                d = os.path.join(pdir, port)
                # One-word attributes: a damaged file's megabyte line or escape sequence is no state.
                state = parse_word(_read(os.path.join(d, "state")))  # "4: ACTIVE"
                layer = parse_word(_read(os.path.join(d, "link_layer")))
                rec: dict[str, Any] = {"nic": f"{hca}/{port}", "link_up": state.endswith("ACTIVE"), "rdma": True}
                if layer:
                    rec["link_layer"] = layer
                if model:
                    rec["model"] = model
                speed = parse_gbps(_read(os.path.join(d, "rate")))  # None for "1.2.3", "1e400", garbage
                if speed is not None and rec["link_up"]:
                    rec["speed_mbps"] = speed
                gids, v2 = self._gids(d)
                if gids is not None:
                    rec["gids"] = gids
                    if layer == "Ethernet":
                        rec["roce_v2_gids"] = v2
                out.append(rec)
        return out

    def _gids(self, port_dir: str) -> tuple[int | None, int]:
        gdir = os.path.join(port_dir, "gids")
        if not os.path.isdir(gdir):
            return None, 0
        valid = v2 = 0
        for i in range(GID_SLOTS):
            gid = (_read(os.path.join(gdir, str(i))) or "").strip()
            if not gid or gid == _ZERO_GID:
                continue
            valid += 1
            if (_read(os.path.join(port_dir, "gid_attrs", "types", str(i))) or "").strip().lower() == "roce v2":
                v2 += 1
        return valid, v2

    def _ethernet(self) -> list[dict[str, Any]]:
        base = self._sys("class", "net")
        try:
            names = sorted(os.listdir(base))
        except OSError:
            return []
        out = []
        for name in names:
            d = os.path.join(base, name)
            pci_dir = _pci_device_dir(d)
            if _VIRTUAL.match(name) or pci_dir is None:
                continue  # no physical link to negotiate
            oper = parse_word(_read(os.path.join(d, "operstate")))
            rec: dict[str, Any] = {"nic": name, "link_up": oper == "up", "link_layer": "Ethernet"}
            model = _model(pci_dir)
            if model:
                rec["model"] = model
            try:
                speed = int((_read(os.path.join(d, "speed")) or "").strip())
            except ValueError:
                speed = -1  # EINVAL while the link is down
            if 0 < speed <= MAX_MBPS and rec["link_up"]:  # not a damaged file's 2**70
                rec["speed_mbps"] = float(speed)
            modes = self.link_modes(name) if self.root == "/" else None  # the ioctl sees this host's NICs only
            if modes is not None:
                if modes[0]:
                    rec["speed_max_mbps"] = float(modes[0])
                if modes[1]:
                    rec["speed_common_max_mbps"] = float(modes[1])
            rec["rdma"] = os.path.isdir(os.path.join(pci_dir, "infiniband"))
            out.append(rec)
        return out


def _pci_device_dir(entry: str) -> str | None:
    """The PCI device directory behind a ``/sys/class/net`` entry (its ``device`` link, or the last PCI
    address in its resolved path), or None for a virtual interface."""
    if os.path.exists(os.path.join(entry, "device")):
        return os.path.realpath(os.path.join(entry, "device"))
    parts = os.path.realpath(entry).split(os.sep)
    for i in range(len(parts) - 1, -1, -1):
        if _PCI_ADDR.match(parts[i]):
            return os.sep.join(parts[: i + 1])
    return None


_PCI_ID = re.compile(r"0x([0-9a-fA-F]{4})")


def _model(device_dir: str) -> str | None:
    """``15b3:1021`` from the PCI ``vendor`` and ``device`` files; None unless both hold a 16-bit id."""
    vendor = _PCI_ID.fullmatch((_read(os.path.join(device_dir, "vendor")) or "").strip())
    device = _PCI_ID.fullmatch((_read(os.path.join(device_dir, "device")) or "").strip())
    if vendor and device:
        return f"{vendor.group(1).lower()}:{device.group(1).lower()}"
    return None

