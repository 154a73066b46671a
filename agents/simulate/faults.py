"""The simulator's fault library, with ground truth.

:data:`FAULTS` is the explicit registry from a fault's name (as written in a
scenario file or ``--fault NAME:TARGET@START-END``) to its class.  A fault is
``(target, start, end, **params)``: ``start`` and ``end`` are offsets in seconds
from the simulation's start; ``target`` names a node, a node's NIC
(``node-07:mlx5_1``), a rank (``train-llm:12``), a GPU (``node-07:gpu3``), a leaf
switch, a storage pool or a job, depending on the fault (``TARGETS``).

Each fault perturbs the generator through hooks the :class:`~agents.simulate.sim.Simulation`
calls while the fault is active: ``on_step`` (the step model, through
:class:`~agents.simulate.sim.StepEffects`), ``on_checkpoint``, and
``on_gpu``/``on_net``/``on_storage``/``on_host`` (one node's reports for one
interval; ``frac`` is the share of the interval the fault covered, since the
reports carry per-interval rates).  :meth:`Fault.truth` says what was injected,
which job it hurt, and where the culprit is: the answer the engine should give.
"""

from __future__ import annotations

import random
import re
from dataclasses import asdict, dataclass, field
from typing import TYPE_CHECKING, Any, ClassVar, Mapping

from agents.simulate.errors import SimulationError

if TYPE_CHECKING:
    from agents.simulate.sim import CheckpointPlan, JobState, Simulation, StepEffects


@dataclass(frozen=True)
class GroundTruth:
    """One injected fault as it affected one job (``job`` None when it hit no job).

    ``start``/``end`` are absolute event times (Unix s); ``culprit`` is the entity
    to blame and ``culprit_kind`` its kind (``node``, ``nic``, ``gpu``, ``rank``,
    ``switch``, ``pool``, ``job``); ``cause`` is the dotted cause class the
    engine's diagnosis should name; ``signals`` lists the perturbed fields as
    ``topic-kind.field``; ``ranks`` the job's ranks at the culprit (if any).
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

    # ------------------------------------------------------------------ binding to a simulation

    def bind(self, sim: Simulation, rng: random.Random) -> None:
        """Resolve the target against the simulation's topology and jobs; called once by the Simulation."""
        self.rng = rng
        self.sim_start = sim.start_time
        self.end = min(self.end, sim.duration_s) if self.end > sim.duration_s else self.end
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

    # ------------------------------------------------------------------ ground truth

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
            out.append(GroundTruth(self.name, start, end, self.culprit(), self.culprit_kind, job, self.cause,
                                   self.signals, self.culprit_ranks(js, ranks), self.detail()))
        if not out:
            out.append(GroundTruth(self.name, start, end, self.culprit(), self.culprit_kind, None, self.cause,
                                   self.signals, (), self.detail()))
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
    culprit_kind = "node"
    target_kind = "node or node:nic"
    signals = ("net.nics[].rx_drops_per_s", "net.nics[].tx_drops_per_s", "net.nics[].rx_errors_per_s",
               "net.tcp_retrans_segs_per_s", "net.tcp_timeouts_per_s", "steps.comm_s", "steps.duration_s")
    PARAMS = {"loss_pct": 1.5, "slowdown": 0.8, "retrans_per_s": 1200.0}
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


# name -> class.  The explicit registry: scenario files and --fault name these keys.
FAULTS: dict[str, type[Fault]] = {
    NicPacketLoss.name: NicPacketLoss,
}


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
