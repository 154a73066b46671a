"""Simulated hardware health (the ``hw`` topic) and the fail-slow faults, with ground truth.

:class:`HwReporter` builds, per node, what the agent's ``hw`` collector sends: NVML health and the
kernel log every interval, PCIe links and ports every 10 s, BMC sensors every 30 s, all healthy.  The
:class:`~whywait.simulate.sim.Simulation` emits one such ``hw`` message per node per interval, after the
node's ``host`` report, and lets every active fault change it through its ``on_hw`` hook.

The faults of :data:`HW_FAULTS` are ordinary :class:`~whywait.simulate.faults.Fault` subclasses: the
Simulation calls their ``on_step``/``on_gpu`` hooks as for any fault (the rank they slow) and their
``on_hw`` hook on the node's report.  This module imports :mod:`whywait.simulate.faults`, so they join
its registry :data:`~whywait.simulate.faults.FAULTS` from here (:func:`~whywait.simulate.faults.register`,
at import; ``simulate`` imports this module, so scenario files, ``--fault`` and ``whywait eval``
see them whatever is imported first).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, ClassVar

from whywait.agents.collectors.bmc import ON_DEMAND_GAP_S, SlowdownWatch
from whywait.simulate.faults import Fault, _GpuFault, register

if TYPE_CHECKING:
    from whywait.simulate.sim import JobState, Simulation, StepEffects

_NIC_MODEL = "15b3:1021"  # ConnectX-7


class HwFault(Fault):
    """A fault that also shows in the node's ``hw`` report (it overrides :meth:`Fault.on_hw`)."""

    def _node_ranks(self, job: JobState) -> list[int]:
        return [r for n in sorted(self.nodes) for r in job.node_ranks.get(n, ())]


class PcieDowngrade(_GpuFault, HwFault):
    """One GPU's PCIe link trained at x8 of x16: its rank's transfers crawl, the others wait for it."""

    name = "pcie-downgrade"
    cause = "hardware.pcie-downgraded"
    signals = ("hw.pcie[gpu].width", "steps.comm_s (culprit rank)")
    PARAMS = {"width": 8.0, "tail_s": 0.12}
    doc = "the GPU's link width drops to `width` of 16; its rank finishes each collective `tail_s` late."

    def on_step(self, t: float, job: JobState, fx: StepEffects) -> None:
        fx.tail_s[self.victims[job.spec.job]] += self.params["tail_s"]

    def on_hw(self, t: float, node: str, report: dict[str, Any]) -> None:
        for link in report.get("pcie") or ():
            if link.get("gpu") == self.gpu:
                link["width"] = int(self.params["width"])


class NicSpeedLow(HwFault):
    """One of a node's rails negotiated half its speed: the node's ranks finish collectives late."""

    name = "nic-speed-low"
    cause = "hardware.nic-speed-low"
    signals = ("hw.ports.speed_mbps", "steps.comm_s (culprit ranks)")
    PARAMS = {"fraction": 0.5, "tail_s": 0.1}
    doc = "the node's first rail runs at `fraction` of its speed; the node's ranks finish collectives late."

    def on_step(self, t: float, job: JobState, fx: StepEffects) -> None:
        for r in self._node_ranks(job):
            fx.tail_s[r] += self.params["tail_s"]

    def on_hw(self, t: float, node: str, report: dict[str, Any]) -> None:
        ports = report.get("ports") or []
        if ports and ports[0].get("speed_mbps"):
            ports[0]["speed_mbps"] = ports[0]["speed_mbps"] * self.params["fraction"]


class CoolingDegraded(HwFault):
    """A fan failed and the node's inlet runs hot: its GPUs clock down, its ranks compute slowly."""

    name = "cooling-degraded"
    cause = "hardware.cooling-power-degraded"
    signals = ("hw.bmc (fan failed, inlet hot)", "gpu.sm_clock_mhz", "steps.compute_s (culprit ranks)")
    PARAMS = {"compute_mult": 1.2, "inlet_c": 38.0}
    doc = "a fan reports critical, the inlet reads `inlet_c`; the node's ranks compute `compute_mult` slower."

    def on_step(self, t: float, job: JobState, fx: StepEffects) -> None:
        for r in self._node_ranks(job):
            fx.compute_mult[r] *= self.params["compute_mult"]

    def on_gpu(self, t: float, frac: float, node: str, gpus: list[dict[str, Any]]) -> None:
        for g in gpus:
            if g.get("sm_clock_max_mhz"):
                g["sm_clock_mhz"] = round(g["sm_clock_max_mhz"] * 0.92, 0)  # below boost, not a throttle flag

    def on_hw(self, t: float, node: str, report: dict[str, Any]) -> None:
        for s in report.get("bmc") or ():
            if s["type"] == "fan" and s["name"].endswith("1"):
                s.update(health="critical", reading=0.0, note="Status.Health Critical")
            if s.get("context") == "inlet":
                s["reading"] = self.params["inlet_c"]


class PsuFailed(HwFault):
    """One of two power supplies failed (redundancy lost) and the GPUs' power is capped: ranks slow down."""

    name = "psu-failed"
    cause = "hardware.cooling-power-degraded"
    signals = ("hw.bmc (psu failed, redundancy lost)", "steps.compute_s (culprit ranks)")
    PARAMS = {"compute_mult": 1.15}
    doc = "PSU 1 critical, power redundancy lost; the node's ranks compute `compute_mult` slower."

    def on_step(self, t: float, job: JobState, fx: StepEffects) -> None:
        for r in self._node_ranks(job):
            fx.compute_mult[r] *= self.params["compute_mult"]

    def on_hw(self, t: float, node: str, report: dict[str, Any]) -> None:
        for s in report.get("bmc") or ():
            if s["type"] == "psu" and s["name"].endswith("1"):
                s.update(health="critical", reading=0.0, note="Failure detected")
            if s["type"] == "redundancy" and "Power" in s["name"]:
                s.update(health="warning", note="Non-Redundant")


class KernelMce(HwFault):
    """The node's kernel logs machine checks (a failing DIMM or CPU); its ranks compute slowly."""

    name = "kernel-mce"
    cause = "hardware.kernel-errors"
    signals = ("hw.kernel (mce)", "steps.compute_s (culprit ranks)")
    PARAMS = {"compute_mult": 1.15, "every_s": 10.0}
    doc = "two MCE lines every `every_s` seconds; the node's ranks compute `compute_mult` slower."

    def on_step(self, t: float, job: JobState, fx: StepEffects) -> None:
        for r in self._node_ranks(job):
            fx.compute_mult[r] *= self.params["compute_mult"]

    def on_hw(self, t: float, node: str, report: dict[str, Any]) -> None:
        if "kernel" not in report or (int(t - self.start) - 1) % int(self.params["every_s"]) != 0:
            return
        seq = 10_000 + int(t) * 2
        report["kernel"] += [
            {"seq": seq, "class": "mce", "level": 4, "message": "mce: [Hardware Error]: Machine check events logged"},
            {"seq": seq + 1, "class": "mce", "level": 4,
             "message": "mce: [Hardware Error]: CPU 0: Machine Check: 0 Bank 5: be00000000800400"}]


class GpuNvmlHang(_GpuFault, HwFault):
    """A GPU stops answering NVML; its rank hangs in the next collective and the job stalls."""

    name = "gpu-nvml-hang"
    cause = "hardware.gpu-unresponsive"
    signals = ("hw.nvml[gpu].responsive", "steps (the job stalls)")
    PARAMS: ClassVar[dict[str, float]] = {}
    doc = "the GPU's NVML calls time out; the whole job stalls (no rank completes a step)."

    def on_step(self, t: float, job: JobState, fx: StepEffects) -> None:
        fx.stalled = True

    def on_hw(self, t: float, node: str, report: dict[str, Any]) -> None:
        for h in report.get("nvml") or ():
            if h["gpu"] == self.gpu:
                elapsed = (t - self.start) * 1000.0
                h.update(responsive=False, latency_ms=round(max(2000.0, elapsed), 1), calls=0,
                         timeouts=1 if t - self.start <= 1.0 else 0)


class RdmaGidMissing(HwFault):
    """A RoCE port lost its RoCE v2 GID: NCCL falls back to sockets through that node and it straggles."""

    name = "rdma-gid-missing"
    cause = "hardware.rdma-gid-missing"
    signals = ("hw.ports.roce_v2_gids", "steps.comm_s (culprit ranks)")
    PARAMS = {"tail_s": 0.2}
    doc = "the node's first port reports no RoCE v2 GID; its ranks finish collectives `tail_s` late."

    def on_step(self, t: float, job: JobState, fx: StepEffects) -> None:
        for r in self._node_ranks(job):
            fx.tail_s[r] += self.params["tail_s"]

    def on_hw(self, t: float, node: str, report: dict[str, Any]) -> None:
        ports = report.get("ports") or []
        if ports:
            ports[0].update(link_layer="Ethernet", gids=1, roce_v2_gids=0)


HW_FAULTS: dict[str, type[HwFault]] = {f.name: f for f in (PcieDowngrade, NicSpeedLow, CoolingDegraded, PsuFailed,
                                                           KernelMce, GpuNvmlHang, RdmaGidMissing)}
register(*HW_FAULTS.values())


class HwReporter:
    """Builds each node's healthy ``hw`` body the way the agent's ``hw`` collector sends it.

    One per :class:`~whywait.simulate.sim.Simulation`; the cadences are in seconds of event time and
    round to whole intervals (at least one).
    """

    def __init__(self, sim: Simulation, pcie_every_s: float = 10.0, bmc_every_s: float = 30.0,
                 on_demand_gap_s: float = ON_DEMAND_GAP_S) -> None:
        self.sim = sim
        self.pcie_every_s = pcie_every_s
        self.bmc_every_s = bmc_every_s
        # Like the agent (agents.agent.Agent.watch_bmc): a node that slows down reads its BMC at once, at
        # most once per gap; the read lands in the node's next hw report (a BMC answers in about a second).
        self.on_demand_gap_s = on_demand_gap_s
        self._watch: dict[str, SlowdownWatch] = {}
        self._asked: dict[str, float] = {}  # node -> when its last on-demand read was asked for
        self._due: set[str] = set()  # nodes whose on-demand read goes in their next report

    def observe(self, node: str, t: float, gpus: list[dict[str, Any]] | None = None, job: str = "",
                steps: list[dict[str, Any]] | None = None) -> None:
        """What the node's agent saw this interval (its GPU records, a job's new steps): ask for a BMC
        read now when it shows the node slowing down (:class:`~whywait.agents.collectors.bmc.SlowdownWatch`)."""
        w = self._watch.setdefault(node, SlowdownWatch())
        why = w.gpus(gpus) if gpus else None
        if steps:
            why = w.steps(job, steps) or why
        if why and t - self._asked.get(node, float("-inf")) >= self.on_demand_gap_s:
            self._asked[node] = t
            self._due.add(node)

    def body(self, node: str, t: float) -> dict[str, Any]:
        """The hw body of ``node`` for the interval ending at offset ``t`` (seconds from the start)."""
        topo = self.sim.topology
        gpus = topo.gpus_of(node)
        body: dict[str, Any] = {"kernel": [],
                                "nvml": [{"gpu": g, "responsive": True, "latency_ms": 0.6, "calls": 24, "errors": 0,
                                          "timeouts": 0} for g in gpus]}
        k = round(t / self.sim.interval_s)  # 1 for the first interval: the agent's first message says everything
        if (k - 1) % max(1, round(self.pcie_every_s / self.sim.interval_s)) == 0:
            body["pcie"] = [{"device": f"0000:{0x18 + g:02x}:00.0", "class": "gpu", "gpu": g, "width": 16,
                             "width_max": 16, "gen": 5, "gen_max": 5} for g in gpus]
            body["ports"] = [{"nic": n.name, "speed_mbps": 400_000.0, "link_layer": "InfiniBand",
                              "model": _NIC_MODEL, "rdma": True, "link_up": True, "gids": 2}
                             for n in topo.nics_of(node)]
        demanded = node in self._due
        self._due.discard(node)
        if demanded or (k - 1) % max(1, round(self.bmc_every_s / self.sim.interval_s)) == 0:
            body["bmc"] = [
                {"name": "Fan 1", "type": "fan", "health": "ok", "reading": 9000.0, "unit": "RPM"},
                {"name": "Fan 2", "type": "fan", "health": "ok", "reading": 9100.0, "unit": "RPM"},
                {"name": "Inlet Temp", "type": "temperature", "health": "ok", "context": "inlet", "reading": 24.0,
                 "unit": "°C"},
                {"name": "PSU 1", "type": "psu", "health": "ok", "context": "psu", "reading": 2900.0, "unit": "W"},
                {"name": "PSU 2", "type": "psu", "health": "ok", "context": "psu", "reading": 2850.0, "unit": "W"},
                {"name": "Power Redundancy", "type": "redundancy", "health": "ok"},
                {"name": "Fan Redundancy", "type": "redundancy", "health": "ok"}]
        return body
