"""Network ports' negotiated speed and RDMA GID tables, from sysfs.

A rail that came up at 200 Gb/s beside seven at 400 Gb/s, or a RoCE port whose
GID table lost its RoCE v2 entries, slows (or breaks) every collective that
crosses it.  Per port:

* Ethernet: ``/sys/class/net/<if>/speed`` (Mbit/s; absent or ``-1`` while the
  link is down) and ``operstate``, for interfaces with a PCI device behind them;
* InfiniBand/RoCE: ``/sys/class/infiniband/<hca>/ports/<n>/rate``
  (``"400 Gb/sec (4X NDR)"``), ``state``, ``link_layer`` and the first
  :data:`GID_SLOTS` entries of ``gids/`` with ``gid_attrs/types/``.

Linux's sysfs does not say which speeds a port *supports* (only ethtool's
netlink interface does), so each port carries its adapter model (PCI
``vendor:device``): ports of one model on one node, and the same rails across
a job's nodes, should negotiate the same speed, and the engine compares them.
"""

from __future__ import annotations

import os
import re
from typing import Any

_PCI_ADDR = re.compile(r"^[0-9a-f]{4}:[0-9a-f]{2}:[0-9a-f]{2}\.[0-7]$")
GID_SLOTS = 16  # enough to see the link-local and the first RoCE v2 entries, without reading 255 files per port
_ZERO_GID = "0000:0000:0000:0000:0000:0000:0000:0000"
_VIRTUAL = re.compile(r"^(lo|veth|docker|br-|virbr|cali|flannel|cni|vxlan|tun|tap|ifb|dummy|kube|lxc|bond)")


class PortSource:
    """Reads every physical port's speed, state and GID table under ``root``."""

    name = "ports"
    every_s = 10.0

    def __init__(self, root: str = "/") -> None:
        self.root = root
        self.errors = 0

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
                state = (_read(os.path.join(d, "state")) or "").strip()  # "4: ACTIVE"
                layer = (_read(os.path.join(d, "link_layer")) or "").strip()
                rec: dict[str, Any] = {"nic": f"{hca}/{port}", "link_up": state.endswith("ACTIVE"), "rdma": True}
                if layer:
                    rec["link_layer"] = layer
                if model:
                    rec["model"] = model
                m = re.match(r"\s*([\d.]+)\s*Gb/sec", _read(os.path.join(d, "rate")) or "")
                if m and rec["link_up"]:
                    rec["speed_mbps"] = float(m.group(1)) * 1000.0
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
            oper = (_read(os.path.join(d, "operstate")) or "").strip()
            rec: dict[str, Any] = {"nic": name, "link_up": oper == "up", "link_layer": "Ethernet"}
            model = _model(pci_dir)
            if model:
                rec["model"] = model
            try:
                speed = int((_read(os.path.join(d, "speed")) or "").strip())
            except ValueError:
                speed = -1  # EINVAL while the link is down
            if speed > 0 and rec["link_up"]:
                rec["speed_mbps"] = float(speed)
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


def _model(device_dir: str) -> str | None:
    vendor = (_read(os.path.join(device_dir, "vendor")) or "").strip()
    device = (_read(os.path.join(device_dir, "device")) or "").strip()
    if vendor.startswith("0x") and device.startswith("0x"):
        return f"{vendor[2:]}:{device[2:]}"
    return None


def _read(path: str) -> str | None:
    try:
        with open(path, encoding="utf-8", errors="replace") as fh:
            return fh.read()
    except OSError:
        return None
