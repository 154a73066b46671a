"""The ``hw`` collector: the node's hardware health, for the fail-slow faults.

One ``hw`` message per interval carries what its sources found:

========  ==========================================  =================================
list      source                                      cadence
========  ==========================================  =================================
pcie      :class:`~whywait.agents.collectors.pcie.PcieSource`  every 10 s
ports     :class:`~whywait.agents.collectors.ports.PortSource` every 10 s
kernel    :class:`~whywait.agents.collectors.kmsg.KmsgSource`  every interval (new records only)
bmc       :class:`~whywait.agents.collectors.bmc.BmcSource`    when a background poll finished
nvml      the GPU collector's per-GPU NVML health      every interval
========  ==========================================  =================================

A source that cannot run here (no ``/dev/kmsg`` permission, no BMC configured,
no GPU collector) is turned off with one line and the others go on; a source
that fails while running is counted and retried the next time it is due.  When
no source can run at all the collector turns itself off.  An interval in which
no source was due sends nothing.

The kernel reader keeps its place across restarts in ``kmsg.state`` in the
agent's state folder (``whywait agent --state-dir``; without it
``WHYWAIT_STATE_DIR``, else ``/var/lib/whywait``, or ``~/.cache/whywait`` when
that is not writable).
"""

from __future__ import annotations

import os
from typing import Any, Protocol, Sequence

from whywait.agents.collectors.base import Collector, CollectorOff, failure_key
from whywait.agents.collectors.bmc import BmcSource
from whywait.agents.collectors.kmsg import KmsgSource
from whywait.agents.collectors.pcie import PcieSource
from whywait.agents.collectors.pcie import _norm as _norm_pci
from whywait.agents.collectors.ports import PortSource

from whywait.paths import state_folder

STATE_ENV = "WHYWAIT_STATE_DIR"
DEFAULT_STATE = "/var/lib/whywait"


class Source(Protocol):
    """One part of the ``hw`` message: ``available()`` says why it cannot run (or None), ``read()`` reads."""

    name: str
    every_s: float
    errors: int

    def available(self) -> str | None: ...

    def read(self, mono: float) -> list[dict[str, Any]] | None: ...


def state_dir() -> str:
    """Where agent state (the kernel log's last sequence number) lives (:func:`whywait.paths.state_folder`)."""
    return state_folder(STATE_ENV, DEFAULT_STATE, "")


class HardwareCollector(Collector):
    """Samples the hardware-health sources for a ``hw`` message.

    ``sources`` replaces the default set (tests); ``gpu`` is the node's GPU collector, whose NVML health
    and PCIe throughput this collector publishes (the agent links them; without it the ``nvml`` list is
    off).
    """

    name = "hw"
    kind = "hw"

    @property
    def label(self) -> str:
        return "HW"

    def __init__(self, root: str = "/", sources: Sequence[Source] | None = None, gpu: Any = None,
                 gpu_bus_ids: Sequence[str] | None = None, state_path: str | None = None,
                 keep_place: bool = True) -> None:
        super().__init__(root)
        self.gpu = gpu
        if sources is None:
            kmsg_state = state_path or os.path.join(state_dir(), "kmsg.state")
            # keep_place=False (`agent --once --print`, a look): the kernel reader does not save its position.
            sources = [PcieSource(root, gpu_bus_ids), PortSource(root),
                       KmsgSource(root, kmsg_state, save=keep_place), BmcSource(root)]
        self.sources: list[Source] = []
        for s in sources:
            why = s.available()
            if why:
                self.part_off(s.name, why)
            else:
                self.sources.append(s)
        if gpu is None or not getattr(gpu, "enabled", False):
            self.part_off("nvml", "the GPU collector is not running")
            self.gpu = None
        if not self.sources and self.gpu is None:
            self.turn_off("no source of hardware health here: " +
                          "; ".join(f"{k}: {v}" for k, v in self.parts_off.items()))
        self._due: dict[str, float] = {}
        self._source_errors = 0  # the sources' own counts, as last added to errors
        self._calls = 0
        self._has_sysfs_pcie = any(isinstance(s, PcieSource) for s in self.sources)

    def prime(self, now: float | None = None, mono: float | None = None) -> None:
        """The agent's priming read, without the sources whose reading uses records up (``uses_up``: the
        kernel log, the BMC's finished poll): their records are the first round's.  The kernel records
        logged while the agent was down (after a restart), or since the boot, were read here and thrown
        away with the priming body, and the saved position had moved past them: never published."""
        self._priming = True
        try:
            self.collect(now, mono)
        finally:
            self._priming = False

    _priming = False

    def sample(self, now: float, mono: float) -> dict[str, Any] | None:
        if not self.sources and self.gpu is None:
            raise CollectorOff("no source of hardware health here")
        body: dict[str, Any] = {}
        self._calls += 1
        for s in self.sources:
            if self._priming and getattr(s, "uses_up", False):
                continue
            # The agent's first call only primes rates; the second is the first message, and it should
            # say everything (`whywait agent --once --print` shows what the node has).
            if s.every_s and self._calls > 2 and mono < self._due.get(s.name, float("-inf")):
                continue
            self._due[s.name] = mono + s.every_s
            try:
                got = s.read(mono)
            except Exception as exc:  # one broken source must not silence the others
                # Counted every time, logged once per distinct failure: a source that fails on a file that
                # stays damaged must not write a line every interval.
                self.errors += 1
                self.say_once(failure_key(exc, s.name), "HW collector: %s failed: %s: %s "
                              "(counted; logged once)", s.name, type(exc).__name__, str(exc)[:300])
                continue
            if got is not None:
                body[s.name] = got
        if self.gpu is not None:
            body["nvml"] = self.gpu.take_health()
            if "pcie" in body or (not self._has_sysfs_pcie and (self._calls <= 2 or self._calls % 10 == 0)):
                body["pcie"] = self._with_nvml_links(body.get("pcie") or [])
        # Add what the sources counted since the last round (not overwrite: the errors collect() counts,
        # such as what the contract refused, would be lost every round).
        source_errors = sum(getattr(s, "errors", 0) for s in self.sources)
        self.errors += source_errors - self._source_errors
        self._source_errors = source_errors
        return body or None

    def _with_nvml_links(self, links: list[dict[str, Any]]) -> list[dict[str, Any]]:
        """Each GPU's link: sysfs's with NVML's throughput beside it, or NVML's alone where sysfs has none
        (a container without the host's ``/sys``)."""
        self._add_gpu_throughput(links)
        have = {rec.get("gpu") for rec in links if rec.get("class") == "gpu"}
        pcie = getattr(self.gpu, "pcie", {})
        bus_ids = getattr(self.gpu, "bus_ids", [])
        for i, g in sorted(pcie.items()):
            if i in have or not all(k in g for k in ("pcie_link_width", "pcie_link_width_max", "pcie_link_gen",
                                                     "pcie_link_gen_max")):
                continue
            bus = bus_ids[i] if i < len(bus_ids) and bus_ids[i] else None
            rec: dict[str, Any] = {"device": _norm_pci(bus) if bus else f"nvml-gpu{i}", "class": "gpu", "gpu": i,
                                   "width": g["pcie_link_width"], "width_max": g["pcie_link_width_max"],
                                   "gen": g["pcie_link_gen"], "gen_max": g["pcie_link_gen_max"]}
            links.append(rec)
        self._add_gpu_throughput(links)
        return links

    def _add_gpu_throughput(self, links: list[dict[str, Any]] | None) -> None:
        """Put NVML's PCIe throughput beside each GPU's sysfs link: the link's width and what crosses it."""
        if not links:
            return
        pcie = getattr(self.gpu, "pcie", {})
        for rec in links:
            g = pcie.get(rec.get("gpu")) if rec.get("class") == "gpu" else None
            if g:
                for src, dst in (("pcie_tx_bytes_per_s", "tx_bytes_per_s"), ("pcie_rx_bytes_per_s", "rx_bytes_per_s")):
                    if g.get(src) is not None:
                        rec[dst] = g[src]

    def close(self) -> None:
        for s in self.sources:
            closer = getattr(s, "close", None)
            if closer is not None:
                closer()
