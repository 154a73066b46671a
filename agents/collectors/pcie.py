"""PCIe links of the node's GPUs, NICs and NVMe drives, from sysfs.

A GPU whose x16 link trained at x8, or a Gen5 link that came up at Gen3, still
works: it only moves half the data per second or less, and its rank becomes the
job's straggler.  The kernel shows what each device negotiated against what it
can do, per device under ``/sys/bus/pci/devices/<addr>/``:

* ``current_link_width`` / ``max_link_width`` (lanes),
* ``current_link_speed`` / ``max_link_speed`` (``"16.0 GT/s PCIe"``; the
  generation follows from the transfer rate),
* ``aer_dev_correctable`` / ``aer_dev_nonfatal`` / ``aer_dev_fatal`` (AER
  counters, one ``NAME count`` line each, the last ``TOTAL_ERR_*``).

Which devices: display and 3D controllers of NVIDIA and AMD (class ``0x03``;
a BMC's VGA chip is neither vendor), Ethernet and InfiniBand controllers
(``0x0200``, ``0x0207``) and NVMe drives (``0x0108``); SR-IOV virtual
functions (they have a ``physfn``) are left out, their link is their parent's.
A device that was seen and then vanished from the bus (a GPU "fallen off the
bus", a NIC lost) is reported with width and generation 0 until the agent
restarts, so the loss stays visible.

Links are read every :attr:`PcieSource.every_s` seconds: they change only on
retraining, and a node has a few hundred PCI devices to list.
"""

from __future__ import annotations

import os
import re
from typing import Any, Sequence

from whywait.agents.collectors.base import parse_counter, parse_int
from whywait.agents.collectors.base import read_text as _read
from whywait.agents.rates import RateTracker

_PCI_ADDR = re.compile(r"^[0-9a-f]{4}:[0-9a-f]{2}:[0-9a-f]{2}\.[0-7]$")
# Transfer rate (GT/s) -> PCIe generation.
_GEN_BY_GTS: tuple[tuple[float, int], ...] = ((2.5, 1), (5.0, 2), (8.0, 3), (16.0, 4), (32.0, 5), (64.0, 6))
_GPU_VENDORS = frozenset({0x10DE, 0x1002})  # NVIDIA, AMD
_AER_FILES = (("aer_correctable", "aer_dev_correctable"), ("aer_nonfatal", "aer_dev_nonfatal"),
              ("aer_fatal", "aer_dev_fatal"))


def parse_speed(text: str | None) -> float | None:
    """``"16.0 GT/s PCIe"`` (or older kernels' ``"8 GT/s"``) → 16.0; ``"Unknown"`` or garbage → None."""
    m = re.match(r"\s*(\d{1,4}(?:\.\d{1,4})?)\s*GT/s", text or "")
    return float(m.group(1)) if m else None


def generation(gts: float | None) -> int | None:
    """The PCIe generation of a transfer rate: 2.5 → 1 ... 64 → 6; None when unknown."""
    if gts is None:
        return None
    for rate, gen in _GEN_BY_GTS:
        if abs(gts - rate) < 0.01:
            return gen
    return None


def parse_aer(text: str | None) -> int | None:
    """An ``aer_dev_*`` file → its total: the ``TOTAL_ERR_*`` line, or the sum of the lines when absent."""
    if not text:
        return None
    total = 0
    seen = False
    for line in text.splitlines():
        name, _, value = line.strip().rpartition(" ")
        v = parse_counter(value)  # AER counters: unsigned; a damaged file's -1 or 2**70 is no count
        if v is None or not name:
            continue
        if name.startswith("TOTAL_ERR"):
            return v
        total += v
        seen = True
    return total if seen else None


def device_class(cls: int, vendor: int | None) -> str | None:
    """The contract's ``class`` for a PCI class code and vendor, or None for a device not followed."""
    if cls >> 16 == 0x03 and vendor in _GPU_VENDORS:
        return "gpu"
    if cls >> 8 in (0x0200, 0x0207):
        return "nic"
    if cls >> 8 == 0x0108:
        return "nvme"
    return None


class PcieSource:
    """Reads the PCIe links of the GPUs, NICs and NVMe drives under ``root``.

    ``gpu_bus_ids`` are the GPUs' PCI addresses in index order (NVML's); without
    them GPUs are indexed in PCI address order, which is NVML's default order.
    """

    name = "pcie"
    every_s = 10.0

    def __init__(self, root: str = "/", gpu_bus_ids: Sequence[str] | None = None) -> None:
        self.root = root
        self.gpu_bus_ids = [_norm(b) for b in gpu_bus_ids] if gpu_bus_ids else None
        self.rates = RateTracker()
        self.errors = 0
        self._kinds: dict[str, str | None] = {}  # address -> class (None: not followed), cached
        self._seen: dict[str, dict[str, Any]] = {}  # followed devices last seen, for loss reporting

    def _sys(self, *parts: str) -> str:
        return os.path.join(self.root, "sys", *parts)

    def available(self) -> str | None:
        """None when sysfs has PCI devices here; else why the source is off."""
        d = self._sys("bus", "pci", "devices")
        return None if os.path.isdir(d) else f"no {d}"

    def _kind(self, addr: str, d: str) -> str | None:
        if addr not in self._kinds:
            cls = _hex(_read(os.path.join(d, "class")))
            vendor = _hex(_read(os.path.join(d, "vendor")))
            kind = device_class(cls, vendor) if cls is not None else None
            if kind is not None and os.path.exists(os.path.join(d, "physfn")):
                kind = None  # an SR-IOV virtual function: its link is the physical function's
            self._kinds[addr] = kind
        return self._kinds[addr]

    def read(self, mono: float) -> list[dict[str, Any]]:
        """One record per followed device (see the module docstring); called when the source is due."""
        base = self._sys("bus", "pci", "devices")
        try:
            addrs = sorted(a for a in os.listdir(base) if _PCI_ADDR.match(a))
        except OSError:
            return []
        gpus = self.gpu_bus_ids or [a for a in addrs if self._kind(a, os.path.join(base, a)) == "gpu"]
        out: list[dict[str, Any]] = []
        present: set[str] = set()
        for addr in addrs:
            d = os.path.join(base, addr)
            kind = self._kind(addr, d)
            if kind is None:
                continue
            width = parse_int(_read(os.path.join(d, "current_link_width")) or "")
            width_max = parse_int(_read(os.path.join(d, "max_link_width")) or "")
            gen = generation(parse_speed(_read(os.path.join(d, "current_link_speed"))))
            gen_max = generation(parse_speed(_read(os.path.join(d, "max_link_speed"))))
            if width is None or width_max is None or gen_max is None or not 0 < width_max <= 32 \
                    or not 0 <= width <= 32:
                continue  # no PCIe capability exposed (an emulated device), or a damaged file: nothing to compare
            rec: dict[str, Any] = {"device": addr, "class": kind, "width": width, "width_max": width_max,
                                   "gen": gen if gen is not None else 0, "gen_max": gen_max}
            if kind == "gpu" and addr in gpus:
                rec["gpu"] = gpus.index(addr)
            if kind == "nic":
                names = self._nic_names(d)
                if names:
                    rec["nics"] = names
            for field, fname in _AER_FILES:
                total = parse_aer(_read(os.path.join(d, fname)))
                if total is not None:
                    delta = self.rates.update((addr, field), total, mono).delta
                    if delta is not None:
                        rec[field] = delta
            present.add(addr)
            self._seen[addr] = rec
            out.append(rec)
        for addr, last in self._seen.items():
            if addr not in present:  # fell off the bus: keep saying so
                lost: dict[str, Any] = {k: last[k] for k in ("device", "class", "gpu", "nics", "width_max",
                                                             "gen_max") if k in last}
                out.append({**lost, "width": 0, "gen": 0})
        return out

    def _nic_names(self, d: str) -> list[str]:
        """The interfaces (``net/``) and IB ports (``infiniband/<hca>/ports/<n>``) this adapter backs."""
        names: list[str] = []
        try:
            names += sorted(os.listdir(os.path.join(d, "net")))
        except OSError:
            pass
        try:
            for hca in sorted(os.listdir(os.path.join(d, "infiniband"))):
                try:
                    ports = sorted(os.listdir(os.path.join(d, "infiniband", hca, "ports")), key=lambda p: (len(p), p))
                except OSError:
                    ports = []
                names += [f"{hca}/{p}" for p in ports] or [hca]
        except OSError:
            pass
        return names


def _norm(addr: str) -> str:
    """``00000000:83:00.0`` (NVML) → ``0000:83:00.0``."""
    addr = addr.strip().lower()
    dom, _, rest = addr.partition(":")
    try:
        return f"{int(dom, 16):04x}:{rest}" if rest else addr
    except ValueError:
        return addr


def _hex(text: str | None) -> int | None:
    try:
        return int((text or "").strip(), 16)
    except ValueError:
        return None

