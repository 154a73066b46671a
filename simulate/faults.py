"""The simulator's fault library, with ground truth.

:data:`FAULTS` is the explicit registry from a fault's name (as written in a
scenario file or ``--fault NAME:TARGET@START-END``) to its class.  A fault is
``(target, start, end, **params)``: ``start`` and ``end`` are offsets in seconds
from the simulation's start; ``target`` names a node, a node's NIC
(``node-07:mlx5_1``), a rank (``train-llm:12``), several ranks
(``train-llm:3,21,44``), a GPU (``node-07:gpu3``), a leaf switch, a storage pool
or a job, depending on the fault (``target_kind``).  The straggler classes
(``straggler-*``, ``multi-straggler``, ``transient-straggler``) and the job
patterns (``stage-imbalance``, ``rotating-straggler``, ``periodic-slowdown``)
leave no hardware signature: only the step split shows them.

Each fault perturbs the generator through hooks the :class:`~whywait.simulate.sim.Simulation`
calls while the fault is active: ``on_step`` (the step model, through
:class:`~whywait.simulate.sim.StepEffects`), ``on_checkpoint``, and
``on_gpu``/``on_net``/``on_storage``/``on_host`` (one node's reports for one
interval; ``frac`` is the share of the interval the fault covered, since the
reports carry per-interval rates), and for the fail-slow hardware faults of
:mod:`whywait.simulate.hardware` (registered here by :func:`register`) ``on_hw``
(the node's ``hw`` report).  :meth:`Fault.truth` says what was injected,
which job it hurt, and where the culprit is: the answer the engine should give.
"""

from __future__ import annotations

import random
import re
import statistics
from dataclasses import asdict, dataclass, field, replace
from typing import TYPE_CHECKING, Any, ClassVar, Mapping

from whywait.simulate.errors import SimulationError

if TYPE_CHECKING:
    from whywait.simulate.sim import CheckpointPlan, JobState, Simulation, StepEffects


@dataclass(frozen=True)
class GroundTruth:
    """One injected fault as it affected one job (``job`` None when it hit no job).

    ``start``/``end`` are absolute event times (Unix s); ``culprit`` is the entity
    to blame and ``culprit_kind`` its kind (``node``, ``nic``, ``gpu``, ``rank``,
    ``switch``, ``pool``, ``job``); ``cause`` is the dotted cause class the
    engine's diagnosis should name; ``signals`` lists the perturbed fields as
    ``topic-kind.field``; ``ranks`` the job's ranks at the culprit (if any).

    What it cost, measured by the simulator (which lays every step out with and
    without the fault, on the same noise): ``phase`` the part of the step that
    grew (``compute``, ``input``, ``communication`` or ``none``); ``steps`` the
    job's steps that began in the window; ``step_s`` and ``whatif_step_s`` their
    median length with and without the fault; ``gpu_hours_lost`` the sum over
    them of (actual - without) x the GPUs the job holds / 3600 (a hang counts
    its stalled time).
    """

    fault: str
    start: float
    end: float
    culprit: str
    culprit_kind: str
    job: str | None
    cause: str
    signals: tuple[str, ...] = ()
    ranks: tuple[int, ...] = ()
    detail: Mapping[str, Any] = field(default_factory=dict)
    phase: str = "none"
    steps: int = 0
    step_s: float | None = None
    whatif_step_s: float | None = None
    gpu_hours_lost: float = 0.0

    def to_dict(self) -> dict[str, Any]:
        """The JSON form written by ``whywait simulate --truth-out``."""
        d = asdict(self)
        d["signals"] = list(self.signals)
        d["ranks"] = list(self.ranks)
        d["detail"] = dict(self.detail)
        return d


class Fault:
    """Base class: a fault on ``target`` active in ``[start, end)`` seconds after the simulation's start.

    Subclasses set the class attributes and override the hooks they need; the
    hooks default to doing nothing.  ``PARAMS`` maps each accepted parameter to
    its default; an unknown parameter is a :class:`SimulationError`.
    """

    name: ClassVar[str] = ""
    cause: ClassVar[str] = ""
    phase: ClassVar[str] = "none"  # the part of the step it lengthens: compute, input, communication, none
    culprit_kind: ClassVar[str] = "node"
    target_kind: ClassVar[str] = "node"  # node, nic, gpu, rank, leaf, pool, job
    signals: ClassVar[tuple[str, ...]] = ()
    PARAMS: ClassVar[dict[str, float]] = {}
    doc: ClassVar[str] = ""

    def __init__(self, target: str, start: float, end: float, **params: Any) -> None:
        if not isinstance(target, str) or not target:
            raise SimulationError(f"fault {self.name!r}: target must be a {self.target_kind} id (got {target!r})")
        try:
            self.start = float(start)
            self.end = float(end)
        except (TypeError, ValueError):
            raise SimulationError(f"fault {self.name!r}: start and end must be seconds "
                                  f"(got {start!r}, {end!r})") from None
        if not 0 <= self.start < self.end:
            raise SimulationError(f"fault {self.name!r} on {target}: needs 0 ≤ start < end "
                                  f"(got {self.start:g}-{self.end:g})")
        unknown = set(params) - set(self.PARAMS)
        if unknown:
            valid = ", ".join(sorted(self.PARAMS)) or "none"
            raise SimulationError(f"fault {self.name!r}: unknown parameter(s) {', '.join(sorted(unknown))} "
                                  f"(valid: {valid})")
        self.params: dict[str, float] = dict(self.PARAMS)
        for k, v in params.items():
            if isinstance(v, bool) or not isinstance(v, (int, float)):
                raise SimulationError(f"fault {self.name!r}: parameter {k!r} must be a number (got {v!r})")
            self.params[k] = float(v)
        self.target = target
        self.nodes: frozenset[str] = frozenset()
        self.job_ids: frozenset[str] = frozenset()
        self.rng = random.Random(0)
        # job -> [seconds lost, step lengths with the fault, step lengths without it]
        self._cost: dict[str, tuple[list[float], list[float], list[float]]] = {}

    # ------------------------------------------------------------------ binding to a simulation

    def bind(self, sim: Simulation, rng: random.Random) -> None:
        """Resolve the target against the simulation's topology and jobs; called once by the Simulation."""
        self.rng = rng
        if self.start >= sim.duration_s:
            raise SimulationError(f"fault {self.name!r} on {self.target}: starts at {self.start:g}s, after the "
                                  f"simulation ends ({sim.duration_s:g}s)")
        self.end = min(self.end, sim.duration_s)
        self.resolve(sim)

    def resolve(self, sim: Simulation) -> None:
        """Set :attr:`nodes` (whose reports the fault perturbs) and :attr:`job_ids` (whose steps it may touch)."""
        node = self._node(sim, self.target)
        self.node = node
        self.nodes = frozenset({node})
        self.job_ids = frozenset(j.spec.job for j in sim.jobs if node in j.node_ranks)

    def _node(self, sim: Simulation, name: str) -> str:
        if name not in sim.topology.nodes():
            raise SimulationError(f"fault {self.name!r}: unknown node {name!r} "
                                  f"(cluster: {sim.nodes[0]} … {sim.nodes[-1]})")
        return name

    def _job(self, sim: Simulation, name: str) -> JobState:
        js = sim.job_by_id.get(name)
        if js is None:
            raise SimulationError(f"fault {self.name!r}: unknown job {name!r} "
                                  f"(jobs: {', '.join(sim.job_by_id) or 'none'})")
        return js

    def touches(self, node: str) -> bool:
        """Whether this fault perturbs ``node``'s reports."""
        return node in self.nodes

    def affects_job(self, job: str) -> bool:
        """Whether this fault's hooks should see ``job``'s steps and checkpoints."""
        return job in self.job_ids

    def level(self, t: float, ramp_s: float = 0.0, floor: float = 1.0) -> float:
        """Severity at offset ``t``: rises linearly from ``floor`` to 1 over ``ramp_s`` seconds after start."""
        if ramp_s <= 0:
            return 1.0
        return min(1.0, floor + (1.0 - floor) * max(0.0, t - self.start) / ramp_s)

    # ------------------------------------------------------------------ hooks

    def on_step(self, t: float, job: JobState, fx: StepEffects) -> None:
        """Change one step of ``job`` starting at offset ``t`` (called only while active, for bound jobs)."""

    def on_checkpoint(self, t: float, job: JobState, plan: CheckpointPlan) -> None:
        """Change a checkpoint save starting at offset ``t``."""

    def on_gpu(self, t: float, frac: float, node: str, gpus: list[dict[str, Any]]) -> None:
        """Change one node's GPU samples for the interval ending at offset ``t``."""

    def on_net(self, t: float, frac: float, node: str, report: dict[str, Any]) -> None:
        """Change one node's network report."""

    def on_storage(self, t: float, frac: float, node: str, report: dict[str, Any]) -> None:
        """Change one node's storage report."""

    def on_host(self, t: float, frac: float, node: str, report: dict[str, Any]) -> None:
        """Change one node's host sample."""

    def on_hw(self, t: float, node: str, report: dict[str, Any]) -> None:
        """Change ``node``'s ``hw`` report for the interval ending at offset ``t``; called after
        :meth:`on_host` while the fault is active during that interval (the fail-slow hardware faults)."""

    def silences(self, node: str) -> bool:
        """Whether nothing of ``node``'s reaches Kafka while the fault is active (its agent is down): no
        telemetry, and no steps of its ranks, which the training reporter sends through the agent."""
        return False

    def clock_offset_s(self, node: str) -> float:
        """Seconds ``node``'s clock is off while the fault is active (its messages and step ends are
        stamped that far from the true time); 0 for every fault but a clock's."""
        return 0.0

    # ------------------------------------------------------------------ ground truth

    def tally(self, job: str, lost_s: float, step_s: float | None, whatif_s: float | None) -> None:
        """Record what one step of ``job`` lost to this fault; called by the Simulation for each step
        that begins while the fault is active (``step_s`` None for a stalled attempt)."""
        lost, actual, whatif = self._cost.setdefault(job, ([0.0], [], []))
        lost[0] += lost_s
        if step_s is not None and whatif_s is not None:
            actual.append(step_s)
            whatif.append(whatif_s)

    def truth_phase(self) -> str:
        """The phase the fault lengthens, as the truth states it (a class attribute unless it depends
        on the target)."""
        return self.phase

    def culprit(self) -> str:
        """The entity to blame (its id as the topology or the engine names it)."""
        return self.target

    def truth(self, sim: Simulation) -> list[GroundTruth]:
        """One :class:`GroundTruth` per affected job (or one with ``job`` None)."""
        start = sim.start_time + self.start
        end = sim.start_time + self.end
        out = []
        for job in sorted(self.job_ids):
            js = sim.job_by_id[job]
            ranks = tuple(r for n in sorted(self.nodes) for r in js.node_ranks.get(n, ()))
            lost, actual, whatif = self._cost.get(job, ([0.0], [], []))
            gpus = len(js.ranks)
            out.append(GroundTruth(
                self.name, start, end, self.culprit(), self.culprit_kind, job, self.cause, self.signals,
                self.culprit_ranks(js, ranks), self.detail(), self.truth_phase(), len(actual),
                round(statistics.median(actual), 4) if actual else None,
                round(statistics.median(whatif), 4) if whatif else None,
                round(lost[0] * gpus / 3600.0, 6)))
        if not out:
            out.append(GroundTruth(self.name, start, end, self.culprit(), self.culprit_kind, None, self.cause,
                                   self.signals, (), self.detail(), self.truth_phase()))
        return out

    def culprit_ranks(self, job: JobState, ranks: tuple[int, ...]) -> tuple[int, ...]:
        """The job's ranks at the culprit; by default those on the fault's nodes."""
        return ranks

    def detail(self) -> dict[str, Any]:
        """Extra facts for the truth file: the target and parameters."""
        return {"target": self.target, **self.params}


def _nic_target(target: str) -> tuple[str, str | None]:
    node, _, nic = target.partition(":")
    return node, nic or None


class NicPacketLoss(Fault):
    """One node's NIC drops packets: its TCP retransmits climb, its ranks drag every all-reduce."""

    name = "nic-packet-loss"
    cause = "network.packet-loss"
    phase = "communication"
    culprit_kind = "node"
    target_kind = "node or node:nic"
    signals = ("net.nics[].rx_drops_per_s", "net.nics[].tx_drops_per_s", "net.nics[].rx_errors_per_s",
               "net.tcp_retrans_segs_per_s", "net.tcp_timeouts_per_s", "steps.comm_s", "steps.duration_s")
    PARAMS = {"loss_pct": 1.5, "slowdown": 0.8, "retrans_per_s": 1200.0}
    nic: str | None
    doc = ("rx/tx drops and errors on the NIC; TCP retransmits from ~1/s to ~hundreds-thousands/s, timeouts up; "
           "every rank's comm_s and duration_s grow by ~slowdown × the healthy step; the culprit's ranks "
           "exit the collective last (largest comm_s).")

    def resolve(self, sim: Simulation) -> None:
        node, nic = _nic_target(self.target)
        self.node = self._node(sim, node)
        nics = [n.name for n in sim.topology.nics_of(self.node)]
        if nic is not None and nic not in nics:
            raise SimulationError(f"fault {self.name!r}: {self.node} has no NIC {nic!r} (has {', '.join(nics)})")
        self.nic = nic or (nics[0] if nics else None)
        self.nodes = frozenset({self.node})
        self.job_ids = frozenset(j.spec.job for j in sim.jobs if self.node in j.node_ranks)

    def culprit(self) -> str:
        return self.node

    def detail(self) -> dict[str, Any]:
        return {"target": self.target, "nic": self.nic, **self.params}

    def on_step(self, t: float, job: JobState, fx: StepEffects) -> None:
        extra = self.params["slowdown"] * job.spec.base_step_s * self.rng.lognormvariate(0.0, 0.25)
        extra *= self.level(t, 10.0, 0.6)
        fx.comm_add_s += extra
        for r in job.node_ranks[self.node]:
            fx.tail_s[r] += 0.12 * extra

    def on_net(self, t: float, frac: float, node: str, report: dict[str, Any]) -> None:
        lvl = self.level(t, 15.0, 0.4) * frac
        rng = self.rng
        loss = self.params["loss_pct"] / 100.0
        for c in report["nics"]:
            if c["nic"] != self.nic:
                continue
            c["rx_drops_per_s"] = round(c["rx_packets_per_s"] * loss * lvl * rng.lognormvariate(0, 0.2), 1)
            c["tx_drops_per_s"] = round(c["tx_packets_per_s"] * loss * 0.6 * lvl * rng.lognormvariate(0, 0.2), 1)
            c["rx_errors_per_s"] = round(20.0 * lvl * rng.lognormvariate(0, 0.5), 1)
        report["tcp_retrans_segs_per_s"] = round(
            report["tcp_retrans_segs_per_s"] + self.params["retrans_per_s"] * lvl * rng.lognormvariate(0, 0.3), 2)
        report["tcp_timeouts_per_s"] = round(report["tcp_timeouts_per_s"] + 25.0 * lvl * rng.lognormvariate(0, 0.4), 2)


def _gpu_sample(gpus: list[dict[str, Any]], index: int) -> dict[str, Any] | None:
    for g in gpus:
        if g["gpu"] == index:
            return g
    return None


def _nic_counters(report: dict[str, Any], name: str | None) -> dict[str, Any] | None:
    for c in report["nics"]:
        if c["nic"] == name:
            return c
    return None


def _mount_devices(report: dict[str, Any], pool: str | None = None) -> list[dict[str, Any]]:
    return [d for d in report["devices"] if "pool" in d and (pool is None or d["pool"] == pool)]


class _GpuFault(Fault):
    """A fault on one GPU (``node-07:gpu3``, ``node-07:3``, or ``node-07`` for GPU 0); the culprit is that GPU."""

    culprit_kind = "gpu"
    target_kind = "node:gpuN"

    def resolve(self, sim: Simulation) -> None:
        node, _, g = self.target.partition(":")
        self.node = self._node(sim, node)
        try:
            self.gpu = int(g[3:] if g.startswith("gpu") else g) if g else 0
        except ValueError:
            raise SimulationError(f"fault {self.name!r}: target must be NODE:gpuN such as node-07:gpu3 "
                                  f"(got {self.target!r})") from None
        if self.gpu not in sim.topology.gpus_of(self.node):
            raise SimulationError(f"fault {self.name!r}: {self.node} has no GPU {self.gpu} "
                                  f"(has {list(sim.topology.gpus_of(self.node))})")
        self.nodes = frozenset({self.node})
        # (job, rank) running on the GPU, if any.
        self.victims = {j.spec.job: r for j in sim.jobs for r in j.ranks
                        if j.node_of[r] == self.node and j.gpu_of[r] == self.gpu}
        self.job_ids = frozenset(self.victims)

    def culprit(self) -> str:
        return f"{self.node} gpu {self.gpu}"

    def culprit_ranks(self, job: JobState, ranks: tuple[int, ...]) -> tuple[int, ...]:
        return (self.victims[job.spec.job],)

    def on_step(self, t: float, job: JobState, fx: StepEffects) -> None:
        # Throttling deepens as the GPU heats up: half the slowdown at once, all of it after 20 s.
        extra = (self.params["compute_mult"] - 1.0) * self.level(t, 20.0, 0.5)
        fx.compute_mult[self.victims[job.spec.job]] *= 1.0 + extra


class GpuThermal(_GpuFault):
    """One GPU overheats and throttles: its rank computes slowly, everyone else waits for it."""

    name = "gpu-thermal"
    cause = "gpu.thermal-throttle"
    phase = "compute"
    signals = ("gpu.temp_c", "gpu.throttle_reasons", "gpu.sm_clock_mhz", "steps.compute_s (culprit rank)",
               "steps.comm_s (other ranks)")
    PARAMS = {"temp_c": 92.0, "compute_mult": 1.6, "sm_clock_mhz": 1250.0}
    doc = ("temp_c 90+, throttle_reasons [hw_thermal_slowdown, sw_thermal_slowdown], sm_clock down; the rank's "
           "compute_s × compute_mult with LOW comm_s, every other rank's comm_s up.")

    def on_gpu(self, t: float, frac: float, node: str, gpus: list[dict[str, Any]]) -> None:
        g = _gpu_sample(gpus, self.gpu)
        if g is None:
            return
        lvl = self.level(t, 20.0, 0.5)
        g["temp_c"] = round(g["temp_c"] + (self.params["temp_c"] - g["temp_c"]) * lvl
                            + self.rng.gauss(0, 0.8), 1)
        g["throttle_reasons"] = ["hw_thermal_slowdown", "sw_thermal_slowdown"]
        g["sm_clock_mhz"] = round(self.params["sm_clock_mhz"] + self.rng.gauss(0, 30), 0)


class GpuPower(_GpuFault):
    """One GPU is held at a low power cap: clocks drop, its rank computes slowly, the others wait."""

    name = "gpu-power"
    cause = "gpu.power-cap"
    phase = "compute"
    signals = ("gpu.power_w", "gpu.power_limit_w", "gpu.throttle_reasons", "gpu.sm_clock_mhz",
               "steps.compute_s (culprit rank)", "steps.comm_s (other ranks)")
    PARAMS = {"power_limit_w": 350.0, "compute_mult": 1.3, "sm_clock_mhz": 1410.0}
    doc = "power_limit_w lowered and power_w pinned at it, throttle_reasons [sw_power_cap], sm_clock down."

    def on_gpu(self, t: float, frac: float, node: str, gpus: list[dict[str, Any]]) -> None:
        g = _gpu_sample(gpus, self.gpu)
        if g is None:
            return
        cap = self.params["power_limit_w"]
        g["power_limit_w"] = cap
        g["power_w"] = round(min(cap, cap * (0.97 + self.rng.gauss(0, 0.01))), 1)
        g["throttle_reasons"] = ["sw_power_cap"]
        g["sm_clock_mhz"] = round(self.params["sm_clock_mhz"] + self.rng.gauss(0, 25), 0)


class GpuEccXid(_GpuFault):
    """A GPU reports an uncorrectable ECC error and an XID, then falls out: its job hangs in the collective."""

    name = "gpu-ecc-xid"
    cause = "gpu.xid"
    signals = ("gpu.xid", "gpu.ecc_uncorrected", "gpu.remapped_rows_pending", "gpu.util_pct (culprit idle)",
               "steps (none: the job hangs)")
    PARAMS = {"xid": 79.0, "hang": 1.0}
    doc = ("first interval: xid [48, <xid>] and ecc_uncorrected 1; remapped_rows_pending true and the XID "
           "repeated every 10 s after; the GPU idles (util 0), the job's other GPUs spin (util ~100, low power) "
           "and no rank completes a step (hang=0: only the culprit rank slows 3x).")

    def resolve(self, sim: Simulation) -> None:
        super().resolve(sim)
        # The whole job hangs, so every node of the job shows it; remember them for the GPU hook.
        self.job_nodes = {n for j in self.job_ids for n in sim.job_by_id[j].node_ranks}

    def truth_phase(self) -> str:
        return "none" if self.params["hang"] else "compute"

    def on_step(self, t: float, job: JobState, fx: StepEffects) -> None:
        if self.params["hang"]:
            fx.stalled = True
        else:
            fx.compute_mult[self.victims[job.spec.job]] *= 3.0

    def on_gpu(self, t: float, frac: float, node: str, gpus: list[dict[str, Any]]) -> None:
        g = _gpu_sample(gpus, self.gpu)
        if g is None:
            return
        first = t - self.start <= 1.0 + 1e-9
        xid = int(self.params["xid"])
        if first:
            g["xid"] = [48, xid] if xid != 48 else [48]
            g["ecc_uncorrected"] = 1
        elif int(t - self.start) % 10 == 0:
            g["xid"] = [xid]
        g["remapped_rows_pending"] = True
        if self.params["hang"]:
            g.update(util_pct=0.0, mem_util_pct=0.0, power_w=round(75.0 + self.rng.gauss(0, 2), 1),
                     sm_clock_mhz=345.0)


class NicLocality(Fault):
    """A node's GPUs send through the wrong NIC (e.g. a bad NCCL_IB_HCA): one NIC carries it all, the rest idle."""

    name = "wrong-nic"
    cause = "topology.wrong-nic"
    phase = "communication"
    culprit_kind = "node"
    target_kind = "node or node:gpuN"
    signals = ("net.nics[].tx_bytes_per_s (expected NIC idle, another busy)", "net.nics[].xmit_wait_per_s",
               "steps.comm_s")
    PARAMS = {"comm_mult": 1.5}
    doc = ("the traffic of the GPUs (all of the node's, or one) moves from their PCIe-local NIC to the node's "
           "first other NIC: the expected NIC's bytes fall to ~0, the used one carries the sum and its "
           "xmit_wait climbs; every rank's comm_s × comm_mult.")

    def resolve(self, sim: Simulation) -> None:
        node, _, g = self.target.partition(":")
        self.node = self._node(sim, node)
        topo = sim.topology
        gpus = topo.gpus_of(self.node)
        if g:
            try:
                idx = int(g[3:] if g.startswith("gpu") else g)
            except ValueError:
                idx = -1
            if idx not in gpus:
                raise SimulationError(f"fault {self.name!r}: {self.node} has no GPU {g!r}")
            self.gpus: tuple[int, ...] = (idx,)
        else:
            self.gpus = tuple(gpus)
        nics = topo.nics_of(self.node)
        if len(nics) < 2:
            raise SimulationError(f"fault {self.name!r}: {self.node} needs two NICs to misroute (has {len(nics)})")
        expected = {topo.expected_nic(self.node, gg) for gg in self.gpus}
        # The wrongly used NIC: the first one that is not local to the chosen GPUs (or the primary, for all).
        self.used = next((n.name for n in nics if n.name not in expected), nics[0].name)
        self.expected = {gg: topo.expected_nic(self.node, gg) for gg in self.gpus}
        self.nodes = frozenset({self.node})
        self.job_ids = frozenset(j.spec.job for j in sim.jobs if self.node in j.node_ranks)

    def culprit(self) -> str:
        return self.node if len(self.gpus) > 1 else f"{self.node} gpu {self.gpus[0]}"

    def detail(self) -> dict[str, Any]:
        return {"target": self.target, "used_nic": self.used,
                "expected_nics": {str(k): v for k, v in self.expected.items()}, **self.params}

    def on_step(self, t: float, job: JobState, fx: StepEffects) -> None:
        fx.comm_mult *= self.params["comm_mult"]

    def on_net(self, t: float, frac: float, node: str, report: dict[str, Any]) -> None:
        by_name = {c["nic"]: c for c in report["nics"]}
        used = by_name[self.used]
        for c in report["nics"]:
            if c is used:
                continue
            served = c.get("gpus") or []
            share = sum(1 for g in served if g in self.expected) / max(len(served), 1)
            if share == 0:
                continue
            for k in ("rx_bytes_per_s", "tx_bytes_per_s", "rx_packets_per_s", "tx_packets_per_s"):
                moved = c[k] * share * frac
                c[k] = round(c[k] - moved + (abs(self.rng.gauss(0, 5e3)) if "bytes" in k else 0.0), 1)
                used[k] = round(used[k] + moved, 1)
        used["xmit_wait_per_s"] = round(used["xmit_wait_per_s"] + 4.0e6 * frac * self.rng.lognormvariate(0, 0.3), 1)


class NicLinkFlap(Fault):
    """A NIC's link goes down and up: carrier changes, symbol errors, and a stall of the job at each flap."""

    name = "link-flap"
    cause = "network.link-flap"
    phase = "communication"
    culprit_kind = "node"
    target_kind = "node or node:nic"
    signals = ("net.nics[].carrier_changes", "net.nics[].link_up", "net.nics[].symbol_errors",
               "net.tcp_retrans_segs_per_s", "steps.comm_s")
    PARAMS = {"period_s": 15.0, "down_s": 2.0}
    nic: str | None
    doc = ("every period_s the link drops for down_s: link_up false, bytes 0, carrier_changes 2 (down+up), "
           "symbol_errors; retransmits spike after; each flap adds ~down_s to the step in flight for every rank.")

    resolve = NicPacketLoss.resolve
    culprit = NicPacketLoss.culprit
    detail = NicPacketLoss.detail

    def _down(self, t0: float, t1: float) -> bool:
        period, down = self.params["period_s"], self.params["down_s"]
        k0 = int((t0 - self.start) // period)
        for k in (k0, k0 + 1):
            lo = self.start + k * period
            if lo < t1 and lo + down > t0 and lo >= self.start:
                return True
        return False

    def on_step(self, t: float, job: JobState, fx: StepEffects) -> None:
        # A step that starts in a down window waits for the link (NCCL retries until it is back).
        if self._down(t, t + job.spec.base_step_s):
            fx.comm_add_s += self.params["down_s"] * self.rng.uniform(0.5, 1.0)

    def on_net(self, t: float, frac: float, node: str, report: dict[str, Any]) -> None:
        c = _nic_counters(report, self.nic)
        if c is None:
            return
        dt = report["interval_s"]
        if self._down(t - dt, t):
            c.update(link_up=False, carrier_changes=2, rx_bytes_per_s=0.0, tx_bytes_per_s=0.0,
                     rx_packets_per_s=0.0, tx_packets_per_s=0.0,
                     symbol_errors=c.get("symbol_errors", 0) + self.rng.randint(5, 60))
            report["tcp_retrans_segs_per_s"] = round(report["tcp_retrans_segs_per_s"]
                                                     + 150.0 * self.rng.lognormvariate(0, 0.4), 2)
            report["tcp_timeouts_per_s"] = round(report["tcp_timeouts_per_s"] + 8.0, 2)


class _NodeDataFault(Fault):
    """Base of faults that slow one node's input pipeline: its ranks arrive late at every all-reduce."""

    def on_step(self, t: float, job: JobState, fx: StepEffects) -> None:
        extra = self.params["data_wait_s"] * self.level(t, 10.0, 0.5)
        for r in job.node_ranks[self.node]:
            fx.data_add_s[r] += extra * self.rng.lognormvariate(0, 0.25)


class StorageClientSlow(_NodeDataFault):
    """One node's mount of a pool is slow (a client-side problem): the pool is fine for everyone else."""

    name = "storage-client-slow"
    cause = "storage.client-slow"
    phase = "input"
    culprit_kind = "node"
    target_kind = "node"
    signals = ("storage.devices[].read_latency_ms (one node)", "storage.devices[].queue_depth",
               "storage.io_pressure_some_avg10", "host.cpu_iowait_pct", "steps.data_wait_s (node's ranks)",
               "steps.comm_s (other ranks)")
    PARAMS = {"latency_mult": 25.0, "data_wait_s": 0.6}
    doc = ("the node's pool mounts: read_latency_ms × latency_mult, queue depth and io pressure up, iowait up; "
           "its ranks' data_wait_s + data_wait_s; other ranks wait in comm_s; other nodes' mounts healthy.")

    def on_storage(self, t: float, frac: float, node: str, report: dict[str, Any]) -> None:
        mult = 1.0 + (self.params["latency_mult"] - 1.0) * frac
        for d in _mount_devices(report):
            d["read_latency_ms"] = round(d["read_latency_ms"] * mult, 3)
            d["write_latency_ms"] = round(d["write_latency_ms"] * mult, 3)
            d["queue_depth"] = round(d["queue_depth"] * mult + 6.0 * frac, 3)
            d["util_pct"] = round(min(100.0, d.get("util_pct", 0.0) + 80.0 * frac), 1)
        report["io_pressure_some_avg10"] = round(report["io_pressure_some_avg10"] + 35.0 * frac, 2)

    def on_host(self, t: float, frac: float, node: str, report: dict[str, Any]) -> None:
        report["cpu_iowait_pct"] = round(report["cpu_iowait_pct"] + 9.0 * frac, 2)


class CpuBoundLoader(_NodeDataFault):
    """One node's data loaders run out of CPU: its ranks wait for input although storage is healthy."""

    name = "cpu-bound-loader"
    cause = "data-loader.cpu-bound"
    phase = "input"
    culprit_kind = "node"
    target_kind = "node"
    signals = ("host.cpu_busy_pct", "host.cpu_pressure_some_avg10", "host.loader_cpu_pct",
               "steps.data_wait_s (node's ranks)", "steps.comm_s (other ranks)")
    PARAMS = {"data_wait_s": 0.5, "loader_mult": 3.0}
    doc = ("cpu_busy_pct ~99, cpu pressure ~60-80%, loader_cpu_pct × loader_mult; its ranks' data_wait_s up "
           "(others wait in comm_s); storage latency unchanged.")

    def on_host(self, t: float, frac: float, node: str, report: dict[str, Any]) -> None:
        report["cpu_busy_pct"] = round(report["cpu_busy_pct"] + (99.0 - report["cpu_busy_pct"]) * frac
                                       + self.rng.gauss(0, 0.3) * frac, 1)
        report["cpu_busy_pct"] = min(100.0, report["cpu_busy_pct"])
        report["cpu_pressure_some_avg10"] = round(report["cpu_pressure_some_avg10"]
                                                  + 70.0 * frac * self.rng.uniform(0.85, 1.1), 2)
        report["loader_cpu_pct"] = round(report["loader_cpu_pct"] * (1 + (self.params["loader_mult"] - 1) * frac), 1)


class StorageSlow(Fault):
    """A storage pool is slow for everyone: every job reading from it waits for input on every rank."""

    name = "storage-slow"
    cause = "storage.pool-slow"
    phase = "input"
    culprit_kind = "pool"
    target_kind = "pool"
    signals = ("storage.devices[].read_latency_ms (every node mounting the pool)", "storage.devices[].queue_depth",
               "storage.io_pressure_some_avg10", "steps.data_wait_s (all ranks)", "gpu.util_pct")
    PARAMS = {"latency_mult": 20.0, "data_wait_s": 0.45}
    doc = ("on every node mounting the pool: read/write latency × latency_mult, queue depth and io pressure "
           "up; every rank of each job on the pool: data_wait_s + data_wait_s (no straggler, comm_s normal).")

    def resolve(self, sim: Simulation) -> None:
        if self.target not in sim.topology.pools():
            raise SimulationError(f"fault {self.name!r}: unknown pool {self.target!r} "
                                  f"(pools: {', '.join(sim.topology.pools()) or 'none'})")
        self.nodes = frozenset(sim.topology.nodes_under(self.target))
        self.job_ids = frozenset(j.spec.job for j in sim.jobs if j.spec.pool == self.target)

    def culprit_ranks(self, job: JobState, ranks: tuple[int, ...]) -> tuple[int, ...]:
        return ()

    def on_step(self, t: float, job: JobState, fx: StepEffects) -> None:
        extra = self.params["data_wait_s"] * self.level(t, 10.0, 0.5) * self.rng.lognormvariate(0, 0.15)
        for r in job.ranks:
            fx.data_add_s[r] += extra * self.rng.lognormvariate(0, 0.1)

    def on_storage(self, t: float, frac: float, node: str, report: dict[str, Any]) -> None:
        mult = 1.0 + (self.params["latency_mult"] - 1.0) * frac
        for d in _mount_devices(report, self.target):
            d["read_latency_ms"] = round(d["read_latency_ms"] * mult, 3)
            d["write_latency_ms"] = round(d["write_latency_ms"] * mult, 3)
            d["queue_depth"] = round(d["queue_depth"] * mult + 4.0 * frac, 3)
        report["io_pressure_some_avg10"] = round(report["io_pressure_some_avg10"] + 25.0 * frac, 2)


class _JobFault(Fault):
    """A fault whose target is a job id; the culprit is the job unless a subclass says otherwise."""

    culprit_kind = "job"
    target_kind = "job"

    def resolve(self, sim: Simulation) -> None:
        self.js = self._job(sim, self.target)
        self.nodes = frozenset(self.js.node_ranks)
        self.job_ids = frozenset({self.target})
        self.pool = self.js.spec.pool

    def culprit_ranks(self, job: JobState, ranks: tuple[int, ...]) -> tuple[int, ...]:
        return ()


class WholeJobSlow(_JobFault):
    """Every rank of a job computes more slowly (a code or configuration change): no straggler, no wait."""

    name = "whole-job-slow"
    cause = "job.slow-everywhere"
    phase = "compute"
    signals = ("steps.compute_s (all ranks)", "steps.duration_s")
    PARAMS = {"compute_mult": 1.5}
    doc = "every rank's compute_s × compute_mult; comm_s, data_wait_s and the hardware signals stay normal."

    def on_step(self, t: float, job: JobState, fx: StepEffects) -> None:
        m = self.params["compute_mult"]
        fx.compute_mult[:] = [c * m for c in fx.compute_mult]


class _Stalls:
    """Mixin for a fault that hangs its jobs while active: no rank completes a step (the step under way ends,
    as one long step, once it is over)."""

    def on_step(self, t: float, job: JobState, fx: StepEffects) -> None:
        fx.stalled = True


class JobStall(_Stalls, _JobFault):
    """The whole job stops, then goes on: every rank waits on something they all share (a frozen shared
    filesystem, the job suspended), so no rank differs from the others while it lasts."""

    name = "job-stall"
    cause = "job.stalled"
    signals = ("no step completes; the step that hung ends as one long step on every rank",
               "gpu.util_pct (every GPU of the job idle alike)")
    doc = ("no rank of the job completes a step while it lasts; every GPU of the job idles alike (no rank "
           "stands out); the step under way ends once it is over, as long as the stall on every rank")

    def on_gpu(self, t: float, frac: float, node: str, gpus: list[dict[str, Any]]) -> None:
        for g in gpus:
            g.update(util_pct=round(g["util_pct"] * (1 - frac), 1),
                     mem_util_pct=round(g["mem_util_pct"] * (1 - frac), 1))


class CheckpointGrowth(_JobFault):
    """Each checkpoint of a job takes longer than the one before (state or metadata growing, bandwidth falling)."""

    name = "checkpoint-growth"
    cause = "checkpoint.growth"
    signals = ("checkpoint.duration_s (end, rising)", "steps.checkpoint_s", "storage.devices[].write_bytes_per_s")
    PARAMS = {"growth": 1.4, "bytes_growth": 1.0}
    doc = ("the k-th checkpoint inside the window lasts growth^k times the normal and writes "
           "bytes_growth^k times the bytes.")

    def __init__(self, target: str, start: float, end: float, **params: Any) -> None:
        super().__init__(target, start, end, **params)
        self.first: int | None = None

    def on_checkpoint(self, t: float, job: JobState, plan: CheckpointPlan) -> None:
        if self.first is None:
            self.first = plan.index
        k = plan.index - self.first + 1
        plan.duration_s *= self.params["growth"] ** k
        plan.bytes = int(plan.bytes * self.params["bytes_growth"] ** k)


class CheckpointStall(_JobFault):
    """A checkpoint write hangs on the pool: the job does no training until it completes."""

    name = "checkpoint-stall"
    cause = "checkpoint.stall"
    culprit_kind = "pool"
    signals = ("checkpoint (start, then no end for the stall)", "steps (none during the stall)",
               "steps.checkpoint_s", "storage.devices[].write_latency_ms", "storage.devices[].queue_depth",
               "io_pressure_some_avg10", "gpu.util_pct (idle)")
    PARAMS = {"stall_s": 0.0}
    doc = ("the first checkpoint starting in the window lasts stall_s (0: until the fault's end): no step "
           "completes meanwhile, GPUs idle, the job's mounts show write latency ×100 and a deep queue; then "
           "phase end.  The ground truth's start is the stalled checkpoint's start.")

    def __init__(self, target: str, start: float, end: float, **params: Any) -> None:
        super().__init__(target, start, end, **params)
        self.window: tuple[float, float] | None = None

    def culprit(self) -> str:
        return self.pool or self.target

    def detail(self) -> dict[str, Any]:
        return {"target": self.target, "job": self.target, **self.params}

    def truth(self, sim: Simulation) -> list[GroundTruth]:
        out = super().truth(sim)
        if self.window is None:
            return out
        # The stall begins with the checkpoint that hangs, not with the fault's window.
        lo, hi = (sim.start_time + self.window[0], sim.start_time + min(self.window[1], sim.duration_s))
        return [replace(g, start=lo, end=hi) for g in out]

    def on_checkpoint(self, t: float, job: JobState, plan: CheckpointPlan) -> None:
        if self.window is None:
            plan.duration_s = self.params["stall_s"] or max(plan.duration_s, self.end - t)
            self.window = (t, t + plan.duration_s)

    def on_storage(self, t: float, frac: float, node: str, report: dict[str, Any]) -> None:
        if self.window is None or not (self.window[0] < t <= self.window[1] + 1.0):
            return
        for d in _mount_devices(report, self.pool):
            d["write_latency_ms"] = round(d["write_latency_ms"] * 100.0, 3)
            d["queue_depth"] = round(d["queue_depth"] + 64.0, 3)
            d["write_iops"] = round(d["write_iops"] * 0.02, 1)
            d["write_bytes_per_s"] = round(d["write_bytes_per_s"] * 0.02, 1)
        report["io_pressure_some_avg10"] = round(report["io_pressure_some_avg10"] + 60.0, 2)


class CheckpointFailed(_JobFault):
    """Checkpoint saves fail (quota, permissions, a full pool): ``failed`` events instead of ``end``."""

    name = "checkpoint-failed"
    cause = "checkpoint.failed"
    culprit_kind = "pool"
    signals = ("checkpoint.phase failed", "checkpoint.error")
    PARAMS = {"after_s": 4.0}
    doc = ("each checkpoint starting in the window fails after ~after_s with error "
           "'OSError: [Errno 122] Disk quota exceeded'.")

    def culprit(self) -> str:
        return self.pool or self.target

    def on_checkpoint(self, t: float, job: JobState, plan: CheckpointPlan) -> None:
        plan.failed = True
        plan.duration_s = self.params["after_s"] * self.rng.lognormvariate(0, 0.1)
        plan.error = f"OSError: [Errno 122] Disk quota exceeded: '/{self.pool}/{job.spec.job}/{plan.checkpoint_id}'"


class RankSilent(Fault):
    """A rank stops: it hangs (the whole job stops completing steps) or, with hang=0, only its reports stop."""

    name = "rank-silent"
    cause = "job.rank-hung"
    culprit_kind = "rank"
    target_kind = "job:rank"
    signals = ("steps (none from the rank; with hang=1 none from any rank)", "gpu.util_pct (rank's GPU idle, "
               "others spinning ~100 at low power)", "net.nics[].tx_bytes_per_s (falls to ~0)")
    PARAMS = {"hang": 1.0}
    doc = ("hang=1: no rank completes a step; the rank's GPU idles (util 0) while the others spin in NCCL "
           "(util ~100, power ~150 W) and NIC traffic stops. hang=0: training goes on but the rank reports "
           "no steps.")

    def resolve(self, sim: Simulation) -> None:
        job, _, rank = self.target.rpartition(":")
        self.js = self._job(sim, job)
        try:
            self.rank = int(rank)
        except ValueError:
            self.rank = -1
        if self.rank not in self.js.ranks:
            raise SimulationError(f"fault {self.name!r}: target must be JOB:RANK with a rank of 0.."
                                  f"{len(self.js.ranks) - 1} (got {self.target!r})")
        self.node = self.js.node_of[self.rank]
        self.gpu = self.js.gpu_of[self.rank]
        self.nodes = frozenset({self.node})
        self.job_ids = frozenset({job})

    def culprit(self) -> str:
        return f"job {self.js.spec.job} rank {self.rank}"

    def culprit_ranks(self, job: JobState, ranks: tuple[int, ...]) -> tuple[int, ...]:
        return (self.rank,)

    def detail(self) -> dict[str, Any]:
        return {"target": self.target, "node": self.node, "gpu": self.gpu, **self.params}

    def on_step(self, t: float, job: JobState, fx: StepEffects) -> None:
        if self.params["hang"]:
            fx.stalled = True
        else:
            fx.silent.add(self.rank)

    def on_gpu(self, t: float, frac: float, node: str, gpus: list[dict[str, Any]]) -> None:
        if not self.params["hang"]:
            return
        g = _gpu_sample(gpus, self.gpu)
        if g is not None:
            g.update(util_pct=0.0, mem_util_pct=0.0, power_w=round(90.0 + self.rng.gauss(0, 3), 1))


class AgentDown(Fault):
    """A node's agent is stopped (or, from the start, never ran): nothing of the node's reaches Kafka.

    The job itself trains on unaffected, so nothing is lost but whywait's sight of the node: its
    telemetry, and its ranks' steps (the training reporter sends them to the node's agent over a local
    socket and drops them when no agent listens).
    """

    name = "agent-down"
    cause = "agent.down"
    signals: ClassVar[tuple[str, ...]] = ("every message of the node stops: gpu, net, storage, host, hw, and its "
                                          "ranks' steps",)
    doc = ("the node's whywait agent stops (start 0: it never ran there); the job trains on unaffected, "
           "whywait sees nothing of the node")

    def silences(self, node: str) -> bool:
        return node in self.nodes


class NodeDown(_Stalls, AgentDown):
    """A node stops altogether (a kernel panic, lost power, a hard hang): nothing of it reaches Kafka, and
    its ranks' GPUs stop, so no rank of its jobs completes a step (they wait in the collective for the
    lost ranks) until it is back."""

    name = "node-down"
    cause = "node.down"
    signals = ("every message of the node stops (its telemetry and its ranks' steps)",
               "no rank of the node's jobs completes a step")
    doc = ("the node stops (kernel panic, power, hard hang): it sends nothing and its jobs hang in the "
           "collective until it is back")


class ClockSkew(Fault):
    """A node's clock is off: everything it reports is stamped ``offset_s`` from the true time."""

    name = "clock-skew"
    cause = "node.clock-skew"
    signals = ("time of every message from the node", "steps[].ended_at (out of line with the job's other ranks' "
               "ends of the same steps)")
    PARAMS = {"offset_s": -8.0}
    doc = ("every message of the node, and its ranks' step ends, is stamped offset_s seconds from the true time "
           "(a stopped or misconfigured time daemon); training is not slowed, but the node's telemetry no longer "
           "lines up with its peers'")

    def clock_offset_s(self, node: str) -> float:
        return self.params["offset_s"] if node in self.nodes else 0.0


class UplinkOversubscribed(Fault):
    """A leaf's uplinks are oversubscribed: its nodes' ports wait for credits, traffic through it slows."""

    name = "uplink-oversubscribed"
    cause = "network.uplink-oversubscribed"
    phase = "communication"
    culprit_kind = "switch"
    target_kind = "leaf"
    signals = ("net.nics[].xmit_wait_per_s (every node under the leaf)", "net.nics[].tx_bytes_per_s (unbalanced)",
               "steps.comm_s (jobs crossing the leaf)")
    PARAMS = {"comm_mult": 1.8, "xmit_wait_per_s": 5.0e6}
    doc = ("on every node under the leaf: xmit_wait_per_s ~ the parameter (vs ~2e3 healthy), tx bytes skewed "
           "(some NICs ±40%); jobs with ranks under the leaf and elsewhere: comm_s × comm_mult.")

    def resolve(self, sim: Simulation) -> None:
        topo = sim.topology
        if self.target not in topo.switches("leaf"):
            raise SimulationError(f"fault {self.name!r}: unknown leaf switch {self.target!r} "
                                  f"(leaves: {', '.join(topo.switches('leaf'))})")
        self.nodes = frozenset(topo.nodes_under(self.target))
        # Only traffic that crosses the uplinks suffers: jobs with ranks both under the leaf and elsewhere.
        self.job_ids = frozenset(j.spec.job for j in sim.jobs
                                 if set(j.node_ranks) & self.nodes and set(j.node_ranks) - self.nodes)

    def culprit_ranks(self, job: JobState, ranks: tuple[int, ...]) -> tuple[int, ...]:
        return ()

    def on_step(self, t: float, job: JobState, fx: StepEffects) -> None:
        fx.comm_mult *= 1.0 + (self.params["comm_mult"] - 1.0) * self.rng.lognormvariate(0, 0.2)

    def on_net(self, t: float, frac: float, node: str, report: dict[str, Any]) -> None:
        for i, c in enumerate(report["nics"]):
            c["xmit_wait_per_s"] = round(c["xmit_wait_per_s"] + self.params["xmit_wait_per_s"] * frac
                                         * self.rng.lognormvariate(0, 0.3), 1)
            skew = 1.0 + 0.4 * frac * (1 if i % 2 == 0 else -1)
            c["tx_bytes_per_s"] = round(c["tx_bytes_per_s"] * skew, 1)
            c["tx_packets_per_s"] = round(c["tx_packets_per_s"] * skew, 1)


class Contention(Fault):
    """Another job saturates a shared leaf switch or storage pool; the victims are the other jobs sharing it.

    Target ``AGGRESSOR_JOB/RESOURCE``: ``batch-etl/leaf-02`` or ``batch-etl/scratch``.  The culprit is the
    aggressor job; one ground-truth record per victim job.
    """

    name = "contention"
    cause = "contention"
    culprit_kind = "job"
    target_kind = "job/leaf or job/pool"
    signals = ("leaf: net.nics[].tx_bytes_per_s (aggressor nodes near line rate), net.nics[].xmit_wait_per_s "
               "(all nodes under the leaf), steps.comm_s (victims)",
               "pool: storage.devices[].read_bytes_per_s (aggressor nodes), storage.devices[].read_latency_ms "
               "(all nodes on the pool), steps.data_wait_s (victims)")
    PARAMS = {"slowdown": 0.8}
    doc = ("leaf: the aggressor's NICs under the leaf run near line rate, every node under the leaf sees "
           "xmit_wait; victims' comm_s × (1 + slowdown). pool: the aggressor's nodes read ~3 GB/s each, every "
           "node on the pool sees read latency ×10; victims' data_wait_s + slowdown × base step.")

    def resolve(self, sim: Simulation) -> None:
        job, sep, resource = self.target.partition("/")
        if not sep:
            raise SimulationError(f"fault {self.name!r}: target must be AGGRESSOR_JOB/LEAF_OR_POOL such as "
                                  f"batch-etl/leaf-02 (got {self.target!r})")
        self.aggressor = self._job(sim, job)
        topo = sim.topology
        kind = topo.kind_of(resource)
        if kind == "pool":
            self.resource_kind = "pool"
        elif kind == "switch" and topo.tier_of(resource) == "leaf":
            self.resource_kind = "leaf"
        else:
            raise SimulationError(f"fault {self.name!r}: {resource!r} is neither a leaf switch nor a pool "
                                  f"(leaves: {', '.join(topo.switches('leaf'))}; pools: {', '.join(topo.pools())})")
        self.resource = resource
        under = set(topo.nodes_under(resource))
        self.nodes = frozenset(under)
        self.aggr_nodes = set(self.aggressor.node_ranks) & under
        if not self.aggr_nodes:
            raise SimulationError(f"fault {self.name!r}: job {job!r} has no rank on {resource} "
                                  f"(its nodes: {', '.join(self.aggressor.node_ranks)})")
        if self.resource_kind == "pool":
            victims = [j for j in sim.jobs if j is not self.aggressor and j.spec.pool == resource]
        else:
            victims = [j for j in sim.jobs if j is not self.aggressor and set(j.node_ranks) & under]
        self.job_ids = frozenset(j.spec.job for j in victims)

    def culprit(self) -> str:
        return self.aggressor.spec.job

    def culprit_ranks(self, job: JobState, ranks: tuple[int, ...]) -> tuple[int, ...]:
        return ()

    def truth(self, sim: Simulation) -> list[GroundTruth]:
        out = super().truth(sim)
        cause = f"contention.{'network' if self.resource_kind == 'leaf' else 'storage'}"
        return [replace(g, cause=cause) for g in out]

    def truth_phase(self) -> str:
        return "communication" if self.resource_kind == "leaf" else "input"

    def detail(self) -> dict[str, Any]:
        return {"target": self.target, "resource": self.resource, "resource_kind": self.resource_kind,
                "aggressor_project": self.aggressor.spec.project, **self.params}

    def on_step(self, t: float, job: JobState, fx: StepEffects) -> None:
        k = self.params["slowdown"] * self.rng.lognormvariate(0, 0.2)
        if self.resource_kind == "leaf":
            fx.comm_mult *= 1.0 + k
        else:
            extra = k * job.spec.base_step_s
            for r in job.ranks:
                fx.data_add_s[r] += extra * self.rng.lognormvariate(0, 0.1)

    def on_net(self, t: float, frac: float, node: str, report: dict[str, Any]) -> None:
        if self.resource_kind != "leaf":
            return
        line = 0.92 * 400e9 / 8
        for c in report["nics"]:
            if node in self.aggr_nodes:
                c["tx_bytes_per_s"] = round(c["tx_bytes_per_s"] * (1 - frac) + line * frac
                                            * self.rng.uniform(0.97, 1.0), 1)
                c["rx_bytes_per_s"] = round(c["rx_bytes_per_s"] * (1 - frac) + line * frac
                                            * self.rng.uniform(0.95, 1.0), 1)
                c["tx_packets_per_s"] = round(c["tx_bytes_per_s"] / 4096.0, 1)
                c["rx_packets_per_s"] = round(c["rx_bytes_per_s"] / 4096.0, 1)
            c["xmit_wait_per_s"] = round(c["xmit_wait_per_s"] + 3.0e6 * frac * self.rng.lognormvariate(0, 0.3), 1)

    def on_storage(self, t: float, frac: float, node: str, report: dict[str, Any]) -> None:
        if self.resource_kind != "pool":
            return
        for d in _mount_devices(report, self.resource):
            if node in self.aggr_nodes:
                d["read_bytes_per_s"] = round(d["read_bytes_per_s"] + 3.0e9 * frac * self.rng.uniform(0.9, 1.1), 1)
                d["read_iops"] = round(d["read_bytes_per_s"] / 1048576.0, 1)
            d["read_latency_ms"] = round(d["read_latency_ms"] * (1.0 + 9.0 * frac), 3)
            d["queue_depth"] = round(d["queue_depth"] + 3.0 * frac, 3)


# ---- stragglers of unknown cause and the patterns a job's parallel structure shows ----------------
#
# None of these leaves a hardware signature: clocks, temperatures, NICs, storage and CPUs stay as in
# a healthy run.  They show only in the step split (a synchronous job's ranks all take as long as the
# slowest; the slow one computes or waits for input longest and waits in communication least), and
# in which ranks, stages or times are slow.  The diagnoses name cause ``straggler.unknown-cause`` for
# the straggler classes and ``job.<pattern>`` for the patterns.


class _RankFault(Fault):
    """A fault on one rank of one job, ``JOB:RANK``; the culprit is the rank's node (its ranks in the truth)."""

    cause = "straggler.unknown-cause"
    culprit_kind = "ranks"
    target_kind = "job:rank"

    def resolve(self, sim: Simulation) -> None:
        job, sep, rank = self.target.rpartition(":")
        if not sep:
            raise SimulationError(f"fault {self.name!r}: target must be JOB:RANK such as train-llm:12 "
                                  f"(got {self.target!r})")
        self.js = self._job(sim, job)
        try:
            self.rank = int(rank)
        except ValueError:
            self.rank = -1
        if self.rank not in self.js.ranks:
            raise SimulationError(f"fault {self.name!r}: target must be JOB:RANK with a rank of 0.."
                                  f"{len(self.js.ranks) - 1} (got {self.target!r})")
        self.node = self.js.node_of[self.rank]
        self.nodes = frozenset({self.node})
        self.job_ids = frozenset({job})

    def culprit(self) -> str:
        return self.node

    def culprit_ranks(self, job: JobState, ranks: tuple[int, ...]) -> tuple[int, ...]:
        return (self.rank,)

    def detail(self) -> dict[str, Any]:
        return {"target": self.target, "node": self.node, "gpu": self.js.gpu_of[self.rank], **self.params}


class StragglerCompute(_RankFault):
    """One rank computes slower than its peers with no hardware sign (a bad kernel choice, a slow GPU part,
    a neighbour's memory traffic): every rank waits for it at the all-reduce."""

    name = "straggler-compute"
    phase = "compute"
    signals = ("steps.compute_s (the rank: highest)", "steps.comm_s (the rank: lowest; its peers: up)",
               "steps.duration_s (every rank)")
    PARAMS = {"compute_mult": 1.6}
    doc = ("the rank's compute_s × compute_mult (1.2-2.5 in the eval) from the start of the window; every rank's "
           "duration_s grows alike; clocks, temperatures, throttle reasons, NICs, storage and CPU stay normal.")

    def on_step(self, t: float, job: JobState, fx: StepEffects) -> None:
        fx.compute_mult[self.rank] *= self.params["compute_mult"] * self.rng.lognormvariate(0.0, 0.03)


class TransientStraggler(StragglerCompute):
    """A straggler that lasts 20-90 s (or a few steps), then the rank is as fast as its peers again."""

    name = "transient-straggler"
    PARAMS = {"compute_mult": 1.8}
    doc = ("straggler-compute for the window only (the eval draws 20-90 s or 5-20 steps); the truth's start and "
           "end are the window's.")


class StragglerInput(_RankFault):
    """One rank waits for its input longer and longer (a skewed shard, a slow decode path) with no CPU or
    storage sign: the others wait for it in the collective."""

    name = "straggler-input"
    phase = "input"
    signals = ("steps.data_wait_s (the rank: highest, growing)", "steps.comm_s (the rank: lowest)",
               "steps.duration_s (every rank)")
    PARAMS = {"slowdown": 0.5, "ramp_s": 10.0}
    doc = ("the rank's data_wait_s grows from 30% to slowdown × the healthy step over ramp_s; host CPU, loader "
           "CPU and storage latency stay normal.")

    def on_step(self, t: float, job: JobState, fx: StepEffects) -> None:
        extra = self.params["slowdown"] * job.spec.base_step_s * self.level(t, self.params["ramp_s"], 0.3)
        fx.data_add_s[self.rank] += extra * self.rng.lognormvariate(0.0, 0.1)


def _job_ranks_target(fault: Fault, sim: Simulation) -> tuple[JobState, list[int] | None]:
    """Resolve ``JOB`` or ``JOB:R1,R2,...`` for a job-level fault; the ranks None when not given."""
    job, sep, rest = fault.target.partition(":")
    js = fault._job(sim, job)
    if not sep:
        return js, None
    try:
        ranks = [int(x) for x in rest.split(",") if x.strip()]
    except ValueError:
        ranks = []
    bad = [r for r in ranks if r not in js.ranks]
    if not ranks or bad:
        raise SimulationError(f"fault {fault.name!r}: target must be JOB or JOB:R1,R2,... with ranks 0.."
                              f"{len(js.ranks) - 1} (got {fault.target!r})")
    return js, ranks


class MultiStraggler(Fault):
    """Several ranks (2-4, on different nodes) straggle at once and stay slow; one incident should name all."""

    name = "multi-straggler"
    cause = "straggler.unknown-cause"
    phase = "compute"
    culprit_kind = "ranks"
    target_kind = "job or job:r1,r2,..."
    signals = ("steps.compute_s (the stragglers: highest)", "steps.comm_s (the stragglers: lowest)")
    PARAMS = {"count": 3.0, "compute_mult": 1.5}
    doc = ("count ranks on different nodes (chosen by the fault's seed unless listed) compute × compute_mult, "
           "each ×0.85-1.15 of it so they differ; no hardware sign.")

    def resolve(self, sim: Simulation) -> None:
        self.js, ranks = _job_ranks_target(self, sim)
        if ranks is None:
            count = int(self.params["count"])
            nodes = list(self.js.node_ranks)
            if not 2 <= count <= len(nodes):
                raise SimulationError(f"fault {self.name!r}: count must be 2..{len(nodes)} (the job's nodes; got "
                                      f"{count})")
            ranks = sorted(self.rng.choice(self.js.node_ranks[n]) for n in self.rng.sample(nodes, count))
        self.ranks = ranks
        self.mult = {r: self.params["compute_mult"] * self.rng.uniform(0.85, 1.15) for r in ranks}
        self.nodes = frozenset(self.js.node_of[r] for r in ranks)
        self.job_ids = frozenset({self.js.spec.job})

    def culprit(self) -> str:
        return ", ".join(sorted(self.nodes))

    def culprit_ranks(self, job: JobState, ranks: tuple[int, ...]) -> tuple[int, ...]:
        return tuple(self.ranks)

    def detail(self) -> dict[str, Any]:
        return {"target": self.target, "ranks": list(self.ranks),
                "compute_mult_per_rank": {str(r): round(m, 3) for r, m in self.mult.items()}, **self.params}

    def on_step(self, t: float, job: JobState, fx: StepEffects) -> None:
        for r, m in self.mult.items():
            fx.compute_mult[r] *= m * self.rng.lognormvariate(0.0, 0.03)


class _PatternFault(Fault):
    """A job-level pattern: the target is the job, no node is to blame."""

    culprit_kind = "none"
    target_kind = "job"

    def resolve(self, sim: Simulation) -> None:
        self.js = self._job(sim, self.target)
        self.nodes = frozenset()  # no node's telemetry changes
        self.job_ids = frozenset({self.target})

    def culprit(self) -> str:
        return ""

    def culprit_ranks(self, job: JobState, ranks: tuple[int, ...]) -> tuple[int, ...]:
        return ()


class StageImbalance(_PatternFault):
    """One pipeline stage holds more work than the others (a partitioning imbalance): it is slower on every
    replica, the whole pipeline runs at its pace, and it waits least."""

    name = "stage-imbalance"
    cause = "job.stage-imbalance"
    phase = "compute"
    culprit_kind = "stage"
    signals = ("steps.compute_s (the stage's ranks, every replica)", "steps.pipeline_wait_s (the stage: lowest)",
               "steps.duration_s")
    PARAMS = {"stage": -1.0, "compute_mult": 1.5}
    doc = ("every rank of pipeline stage `stage` (-1: the last) computes × compute_mult on every replica; needs a "
           "job with pp > 1.")

    def resolve(self, sim: Simulation) -> None:
        super().resolve(sim)
        pp = self.js.spec.pp
        if pp < 2:
            raise SimulationError(f"fault {self.name!r}: job {self.target!r} has no pipeline (pp={pp}); give it "
                                  f"pp: 2 or more")
        stage = int(self.params["stage"])
        if not -pp <= stage < pp:
            raise SimulationError(f"fault {self.name!r}: stage must be 0..{pp - 1} or negative from the last "
                                  f"(got {stage})")
        self.stage = stage % pp
        self.stage_ranks = [r for r in self.js.ranks if self.js.coords[r]["pp"] == self.stage]

    def culprit(self) -> str:
        return f"stage {self.stage}"

    def detail(self) -> dict[str, Any]:
        # The resolved stage (a parameter of -1 means the last): what a diagnosis must name.
        return {"target": self.target, **self.params, "stage": self.stage, "stage_ranks": self.stage_ranks}

    def on_step(self, t: float, job: JobState, fx: StepEffects) -> None:
        m = self.params["compute_mult"]
        for r in self.stage_ranks:
            fx.compute_mult[r] *= m


class RotatingStraggler(_PatternFault):
    """A different rank is slow each step (sequence-length or input imbalance): no rank is to blame.

    Two shapes, because real imbalance comes in both: one heavy batch a step (``spread`` 0: one rank
    drawn at random does ``compute_mult`` times its work), or uneven batches everywhere (``spread`` >
    0: every rank's work this step is its usual work times a lognormal draw of mean 1 and shape
    ``spread``, as token counts vary with unpacked sequence lengths).  In the second no rank stands
    far out from the others: the slowest of 64 is only ~2.4 spreads up, but the ranks' work is spread
    several times wider than the job's own jitter, and the whole job waits for the slowest each step.
    """

    name = "rotating-straggler"
    cause = "job.rotating-straggler"
    signals = ("steps.compute_s or steps.data_wait_s (a different rank highest each step)", "steps.duration_s")
    PARAMS = {"compute_mult": 1.6, "input": 0.0, "spread": 0.0}
    doc = ("each step one rank, drawn at random, computes × compute_mult (input=1: waits (compute_mult - 1) × the "
           "healthy step for input instead); with spread > 0, every rank's work varies each step instead (× a "
           "lognormal of mean 1 and shape spread; input=1: the heavier half of the draws wait for input); the "
           "phase is compute or input.")

    def truth_phase(self) -> str:
        return "input" if self.params["input"] else "compute"

    def on_step(self, t: float, job: JobState, fx: StepEffects) -> None:
        spread = self.params["spread"]
        if spread > 0:
            # Mean 1: the job's total work is unchanged, only shared out unevenly.
            mu = -spread * spread / 2
            for r in range(len(job.ranks)):
                m = self.rng.lognormvariate(mu, spread)
                if self.params["input"]:
                    # A light batch loads no faster than the loader's usual pace; a heavy one waits.
                    fx.data_add_s[r] += max(0.0, m - 1.0) * job.spec.base_step_s
                else:
                    fx.compute_mult[r] *= m
            return
        r = self.rng.randrange(len(job.ranks))
        m = self.params["compute_mult"] * self.rng.lognormvariate(0.0, 0.08)
        if self.params["input"]:
            fx.data_add_s[r] += (m - 1.0) * job.spec.base_step_s
        else:
            fx.compute_mult[r] *= m


class PeriodicSlowdown(_PatternFault):
    """Every ``period_s`` the whole job slows for ``slow_s`` (a periodic evaluation, a cron job on every node,
    a data loader's reshuffle)."""

    name = "periodic-slowdown"
    cause = "job.periodic-slowdown"
    signals = ("steps.duration_s (every rank, periodically)", "steps.compute_s or steps.data_wait_s")
    PARAMS = {"period_s": 120.0, "slow_s": 20.0, "compute_mult": 1.5, "input": 0.0}
    doc = ("from the window's start, the first slow_s of every period_s: every rank computes × compute_mult "
           "(input=1: waits (compute_mult - 1) × the healthy step for input); the truth's detail lists each "
           "slow spell's start (offsets).")

    def __init__(self, target: str, start: float, end: float, **params: Any) -> None:
        super().__init__(target, start, end, **params)
        if not 0 < self.params["slow_s"] < self.params["period_s"]:
            raise SimulationError(f"fault {self.name!r}: needs 0 < slow_s < period_s (got slow_s="
                                  f"{self.params['slow_s']:g}, period_s={self.params['period_s']:g})")

    def truth_phase(self) -> str:
        return "input" if self.params["input"] else "compute"

    def slow(self, t: float) -> bool:
        """Whether offset ``t`` falls in a slow spell."""
        return (t - self.start) % self.params["period_s"] < self.params["slow_s"]

    def detail(self) -> dict[str, Any]:
        period = self.params["period_s"]
        spells = []
        k = 0
        while self.start + k * period < self.end:
            spells.append(self.start + k * period)
            k += 1
        return {"target": self.target, "spells": spells, **self.params}

    def on_step(self, t: float, job: JobState, fx: StepEffects) -> None:
        if not self.slow(t):
            return
        m = self.params["compute_mult"]
        if self.params["input"]:
            extra = (m - 1.0) * job.spec.base_step_s
            for r in job.ranks:
                fx.data_add_s[r] += extra * self.rng.lognormvariate(0.0, 0.1)
        else:
            fx.compute_mult[:] = [c * m for c in fx.compute_mult]


# name -> class.  The explicit registry: scenario files and --fault name these keys.  The fail-slow
# hardware faults (simulate/hardware.py) join it through register() below.
FAULTS: dict[str, type[Fault]] = {
    NicPacketLoss.name: NicPacketLoss,
    NicLinkFlap.name: NicLinkFlap,
    NicLocality.name: NicLocality,
    UplinkOversubscribed.name: UplinkOversubscribed,
    Contention.name: Contention,
    StorageSlow.name: StorageSlow,
    StorageClientSlow.name: StorageClientSlow,
    CpuBoundLoader.name: CpuBoundLoader,
    CheckpointGrowth.name: CheckpointGrowth,
    CheckpointStall.name: CheckpointStall,
    CheckpointFailed.name: CheckpointFailed,
    GpuThermal.name: GpuThermal,
    GpuPower.name: GpuPower,
    GpuEccXid.name: GpuEccXid,
    WholeJobSlow.name: WholeJobSlow,
    JobStall.name: JobStall,
    RankSilent.name: RankSilent,
    AgentDown.name: AgentDown,
    NodeDown.name: NodeDown,
    ClockSkew.name: ClockSkew,
    StragglerCompute.name: StragglerCompute,
    StragglerInput.name: StragglerInput,
    MultiStraggler.name: MultiStraggler,
    TransientStraggler.name: TransientStraggler,
    StageImbalance.name: StageImbalance,
    RotatingStraggler.name: RotatingStraggler,
    PeriodicSlowdown.name: PeriodicSlowdown,
}


def register(*classes: type[Fault]) -> None:
    """Add fault classes defined outside this module (the fail-slow hardware faults of
    :mod:`whywait.simulate.hardware`, which import this module and so cannot be listed above) to
    :data:`FAULTS`.  Called once, when that module is imported (``simulate`` imports it, so
    the registry is complete whatever a caller imports first).  A name already taken by another
    class is a :class:`SimulationError`: two faults must never answer to one scenario name.
    """
    for cls in classes:
        if not cls.name:
            raise SimulationError(f"fault class {cls.__name__} has no name")
        have = FAULTS.get(cls.name)
        if have is not None and have is not cls:
            raise SimulationError(f"fault {cls.name!r} is already registered ({have.__name__}); "
                                  f"cannot register {cls.__name__}")
        FAULTS[cls.name] = cls


def make_fault(name: str, target: str, start: float, end: float, **params: Any) -> Fault:
    """Build a fault from its registry name; an unknown name lists the valid ones."""
    cls = FAULTS.get(name)
    if cls is None:
        raise SimulationError(f"unknown fault {name!r} (valid: {', '.join(sorted(FAULTS))})")
    return cls(target, start, end, **params)


_SPEC_RE = re.compile(r"^(?P<name>[a-z0-9-]+):(?P<target>[^@]+)@(?P<start>[0-9.]+)-(?P<end>[0-9.]+)"
                      r"(?:,(?P<params>.*))?$")


def parse_fault_spec(spec: str) -> Fault:
    """Parse ``NAME:TARGET@START-END[,key=value...]`` (the ``--fault`` flag) into a fault."""
    m = _SPEC_RE.match(spec.strip())
    if m is None:
        raise SimulationError(f"--fault {spec!r}: expected NAME:TARGET@START-END[,key=value...] "
                              f"such as nic-packet-loss:node-07@120-400")
    params: dict[str, Any] = {}
    for kv in filter(None, (m.group("params") or "").split(",")):
        k, sep, v = kv.partition("=")
        try:
            params[k.strip()] = float(v)
        except ValueError:
            sep = ""
        if not sep:
            raise SimulationError(f"--fault {spec!r}: parameter {kv!r} must be key=number")
    return make_fault(m.group("name"), m.group("target"), float(m.group("start")), float(m.group("end")), **params)
