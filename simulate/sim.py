"""The cluster simulator: a pure, seeded generator of contract messages with known faults.

:class:`Simulation` walks event time in fixed intervals.  At each interval end it
emits, per node, one ``gpu``, ``net``, ``storage``, ``host`` and ``hw`` report (the ``hw`` one
carries what the agent's hardware collector sends that interval: NVML health and the kernel log
always, PCIe links and ports every 10 s, BMC sensors every 30 s; see
:class:`~whywait.simulate.hardware.HwReporter`), and per job
one ``steps`` batch per node holding the steps its ranks completed during the
interval; ``checkpoint`` events are emitted at their own times.  One ``placement``
message per job comes first.  Messages come out in event-time order.

Training is synchronous.  Data parallel: each step, every rank waits for its
input (``data_wait_s``), computes (``compute_s``), then enters the all-reduce,
which can only finish once the slowest rank has arrived and the collective's
transfer is done; so every rank's ``duration_s`` is the same (a few ms apart),
and a rank slow in *compute* or *input* shows only in the split: the most
``compute_s`` (or ``data_wait_s``) and the *least* ``comm_s``, while everyone
else's ``comm_s`` grows.  A rank whose *network* is bad stretches the collective
for everyone (its own ``comm_s`` is the largest: it finishes its sends last).
Pipeline parallel (``pp`` > 1; placement carries each rank's ``dp``/``pp``/``tp``):
in each replica a microbatch moves at the pace of the slowest stage, so a step
takes (m + pp - 1) slots (the fill and drain bubbles); each rank reports its
``pipeline_wait_s`` and ``collective_s`` apart (``comm_s`` their sum), and the
slowest stage waits least.  Steps last from 0.1 s to minutes (``step_s``), are
batched per node per interval with their ``ended_at``, and a job may publish
``duration_s`` alone (``split: false``).

Fault-free runs are not clean: per-step lognormal jitter, a rare hiccup (one
slow step on one rank), GC pauses, and heterogeneous hardware (``slow_nodes``
slower from the start).  Each step draws its noise once and is laid out with
the active faults and, for the ground truth's cost, without each of them: the
difference is the time that fault cost (``GroundTruth.gpu_hours_lost``).

Faults (:mod:`whywait.simulate.faults`) perturb the step model through
:class:`StepEffects` and the reports through hooks; each records its
:class:`~whywait.simulate.faults.GroundTruth`.

Everything is deterministic for a given seed: each node, job and fault draws
from its own random stream, so adding a fault leaves the other streams' noise
unchanged.
"""

from __future__ import annotations

import math
import random
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Iterator, Sequence

from whywait.agents.events import (
    TOPIC_CHECKPOINTS,
    TOPIC_GPU,
    TOPIC_HOST,
    TOPIC_HW,
    TOPIC_NET,
    TOPIC_PLACEMENT,
    TOPIC_STEPS,
    TOPIC_STORAGE,
    envelope,
)
from whywait.simulate.cluster import JobSpec
from whywait.simulate.errors import SimulationError
from whywait.simulate.hardware import HwReporter
from whywait.topology import Topology, TopologyError

if TYPE_CHECKING:
    from whywait.simulate.faults import Fault, GroundTruth

DEFAULT_START_TIME = 1_764_442_800.0  # 2025-11-29T19:00:00Z: a fixed origin keeps default runs reproducible
PRODUCER = "simulator"  # the envelope ``node`` of placement messages (the scheduler hook's role)

GPU_MEM_TOTAL = 80 * 2**30
GPU_POWER_LIMIT = 700.0
GPU_SM_MAX = 1980.0
NIC_SPEED_MBPS = 400_000.0
HOST_MEM_TOTAL = 2 * 2**40
HOST_CPUS = 112


@dataclass
class StepEffects:
    """What the active faults do to one step of one job; faults mutate it in ``Fault.on_step``.

    Lists are indexed by rank.  ``comm_add_s`` stretches the collective for every
    rank; ``tail_s`` delays a rank's own exit from it (it finishes its sends last);
    ``stalled`` means no rank completes a step now (a hang); ``silent`` ranks
    complete steps but report none.
    """

    compute_mult: list[float]
    data_add_s: list[float]
    tail_s: list[float]
    comm_mult: float = 1.0
    comm_add_s: float = 0.0
    stalled: bool = False
    silent: set[int] = field(default_factory=set)


def _combine(effects: Sequence[StepEffects], n: int) -> StepEffects:
    """The joint effect of several faults on one step: multipliers multiply, additions add."""
    out = StepEffects([1.0] * n, [0.0] * n, [0.0] * n)
    for fx in effects:
        for r in range(n):
            out.compute_mult[r] *= fx.compute_mult[r]
            out.data_add_s[r] += fx.data_add_s[r]
            out.tail_s[r] += fx.tail_s[r]
        out.comm_mult *= fx.comm_mult
        out.comm_add_s += fx.comm_add_s
        out.stalled = out.stalled or fx.stalled
        out.silent |= fx.silent
    return out


@dataclass
class CheckpointPlan:
    """One collective checkpoint save, decided at the step that starts it; faults may change it."""

    checkpoint_id: str
    index: int
    bytes: int
    duration_s: float
    failed: bool = False
    error: str = ""


@dataclass
class RankStep:
    """The latest completed step of one rank, as telemetry sees it."""

    duration_s: float
    data_wait_s: float
    compute_s: float
    comm_s: float
    checkpoint_s: float = 0.0


class JobState:
    """A running simulated job: its spec, step clock and pending (not yet emitted) step records."""

    def __init__(self, spec: JobSpec, rng: random.Random) -> None:
        self.spec = spec
        self.rng = rng
        self.ranks: list[int] = sorted(spec.ranks)
        if self.ranks != list(range(len(self.ranks))):
            raise SimulationError(f"job {spec.job!r}: ranks must be 0..{len(self.ranks) - 1} "
                                  f"(got {self.ranks[:5]}…)")
        self.node_of: list[str] = [spec.ranks[r][0] for r in self.ranks]
        self.gpu_of: list[int] = [spec.ranks[r][1] for r in self.ranks]
        self.node_ranks: dict[str, list[int]] = {}
        for r in self.ranks:
            self.node_ranks.setdefault(self.node_of[r], []).append(r)
        self.step = 0
        self.next_start = 0.0
        # node -> (offset the step ends, its record, what the rank really did) not yet published.
        self.pending: dict[str, list[tuple[float, dict[str, Any], RankStep]]] = {n: [] for n in self.node_ranks}
        # Each rank's hardware speed from the start: 1, or slow_mult on the job's slow nodes.
        slow = set(spec.slow_nodes)
        self.hw: list[float] = [spec.slow_mult if self.node_of[r] in slow else 1.0 for r in self.ranks]
        # Pipeline layout: replicas[dp][pp] is the ranks (one tensor-parallel group) of that stage.
        self.coords: list[dict[str, int]] = [spec.coords(r) for r in self.ranks]
        self.replicas: list[list[list[int]]] = [[[] for _ in range(spec.pp)] for _ in range(spec.dp)]
        for r in self.ranks:
            c = self.coords[r]
            self.replicas[c["dp"]][c["pp"]].append(r)
        self.last: list[RankStep] = [RankStep(spec.base_step_s, spec.data_wait_s, spec.compute_s, spec.comm_s)
                                     for _ in self.ranks]
        self.last_step_end = [0.0 for _ in self.ranks]
        self.events: list[tuple[float, dict[str, Any]]] = []
        self.next_checkpoint = spec.checkpoint_every_s if spec.checkpoint_every_s > 0 else math.inf
        self.checkpoints = 0
        self.checkpoint_windows: list[tuple[float, float, int]] = []  # (start, end, bytes)
        n = len(self.ranks)
        self.bytes_per_step = 2.0 * spec.grad_bytes * (n - 1) / n if n > 1 else 0.0
        self.stalled_at = -1.0  # offset of the latest hung attempt: the collective makes no progress
        self.stall_since: float | None = None  # offset where the step now hung began (None: not hung)

    def activity(self, t0: float, t1: float) -> str:
        """What the job's GPUs did during [t0, t1): ``hung``, ``checkpoint`` or ``train``."""
        if self.stalled_at >= t0 - 1e-9 and self.stalled_at < t1 + 1e-9:
            return "hung"
        for cs, ce, _ in self.checkpoint_windows[-2:]:
            if cs <= t0 and ce >= t1:
                return "checkpoint"
        return "train"


class Simulation:
    """A simulated cluster running ``jobs`` on ``topology`` with ``faults``, for ``duration_s`` of event time.

    ``start_time`` is the event-time origin (Unix seconds); fault windows are
    offsets from it.  Construct, then iterate :meth:`messages` once; call
    :meth:`ground_truth` (exact after the run).  The jobs are placed on ``topology``
    (:meth:`Topology.place_job`), so the engine-side view matches the messages.
    """

    def __init__(self, topology: Topology, jobs: Sequence[JobSpec], faults: Sequence[Fault] = (),
                 start_time: float | None = None, duration_s: float = 600.0, interval_s: float = 1.0,
                 seed: int = 0) -> None:
        if interval_s <= 0 or duration_s <= 0:
            raise SimulationError(f"duration and interval must be positive (got duration={duration_s}, "
                                  f"interval={interval_s})")
        self.topology = topology
        self.start_time = DEFAULT_START_TIME if start_time is None else float(start_time)
        self.duration_s = float(duration_s)
        self.interval_s = float(interval_s)
        self.seed = seed
        self.jobs: list[JobState] = []
        for spec in jobs:
            try:
                topology.place_job(spec.job, spec.project, spec.team, spec.channel, spec.ranks,
                                   {r: spec.coords(r) for r in spec.ranks})
            except TopologyError as exc:
                raise SimulationError(f"job {spec.job!r}: {exc}") from None
            self.jobs.append(JobState(spec, random.Random(f"{seed}:job:{spec.job}")))
        self.job_by_id = {j.spec.job: j for j in self.jobs}
        self.nodes: tuple[str, ...] = topology.nodes()
        self._node_rng = {n: random.Random(f"{seed}:node:{n}") for n in self.nodes}
        # Which (job, rank) runs on each node's GPU, for the telemetry of that GPU.
        self._gpu_rank: dict[str, dict[int, tuple[JobState, int]]] = {n: {} for n in self.nodes}
        for js in self.jobs:
            for r in js.ranks:
                if js.node_of[r] not in self._gpu_rank:
                    raise SimulationError(f"job {js.spec.job!r} rank {r}: node {js.node_of[r]!r} is not in the "
                                          "topology")
                other = self._gpu_rank[js.node_of[r]].get(js.gpu_of[r])
                if other is not None:
                    raise SimulationError(f"job {js.spec.job!r} rank {r} and job {other[0].spec.job!r} rank "
                                          f"{other[1]} both use {js.node_of[r]} gpu {js.gpu_of[r]}")
                self._gpu_rank[js.node_of[r]][js.gpu_of[r]] = (js, r)
        self._temp: dict[tuple[str, int], float] = {}
        self._hw = HwReporter(self)
        self.faults: list[Fault] = list(faults)
        for i, f in enumerate(self.faults):
            f.bind(self, random.Random(f"{seed}:fault:{i}:{f.name}"))

    # ------------------------------------------------------------------ public

    def ground_truth(self) -> list[GroundTruth]:
        """What was injected: one record per fault and affected job (absolute event times).

        Exact once :meth:`messages` is exhausted; before that, a fault whose
        timing depends on the run (a checkpoint-stall begins with the first
        checkpoint inside its window) reports its scheduled window instead.
        """
        out: list[GroundTruth] = []
        for f in self.faults:
            out.extend(f.truth(self))
        return out

    def messages(self) -> Iterator[tuple[str, dict[str, Any]]]:
        """Yield ``(topic, message)`` pairs in event-time order, placements first.

        Called once per simulation (by the CLI or a test); generation is lazy, so
        a paced publisher only holds one interval in memory.
        """
        t_abs = self.start_time
        for js in self.jobs:
            s = js.spec
            yield TOPIC_PLACEMENT, envelope(
                "placement", PRODUCER, t_abs, job=s.job, project=s.project, team=s.team,
                **({"slack_channel": s.channel} if s.channel else {}), state="running", source=PRODUCER,
                ranks=[{"rank": r, "node": js.node_of[r], "gpu": js.gpu_of[r], **js.coords[r]} for r in js.ranks])
        n_ticks = int(math.ceil(self.duration_s / self.interval_s - 1e-9))
        for i in range(n_ticks):
            t0 = i * self.interval_s
            t1 = min((i + 1) * self.interval_s, self.duration_s)
            yield from self._tick(t0, t1)

    # ------------------------------------------------------------------ one interval

    def _active(self, t0: float, t1: float) -> list[tuple[Fault, float]]:
        """Faults active during [t0, t1), with the share of the interval they cover."""
        out = []
        for f in self.faults:
            lo, hi = max(t0, f.start), min(t1, f.end)
            if hi > lo:
                out.append((f, (hi - lo) / (t1 - t0)))
        return out

    def _tick(self, t0: float, t1: float) -> Iterator[tuple[str, dict[str, Any]]]:
        for js in self.jobs:
            self._advance(js, t1)
        start = self.start_time
        ts = start + t1
        events: list[tuple[float, dict[str, Any]]] = []
        for js in self.jobs:
            if js.events:
                keep: list[tuple[float, dict[str, Any]]] = []
                for t, msg in js.events:
                    (events if t <= ts else keep).append((t, msg))
                js.events = keep
        events.sort(key=lambda e: e[0])
        for _, msg in events:
            yield TOPIC_CHECKPOINTS, msg
        active = self._active(t0, t1)
        dt = t1 - t0
        for node in self.nodes:
            rng = self._node_rng[node]
            node_faults = [(f, frac) for f, frac in active if f.touches(node)]
            gpus = self._gpu_report(node, rng, t0, t1)
            net = self._net_report(node, rng, t0, t1)
            storage = self._storage_report(node, rng, t0, t1, dt)
            host = self._host_report(node, rng)
            hw = self._hw.body(node, t1)  # draws no noise: the other reports' streams stay as they were
            for f, frac in node_faults:
                f.on_gpu(t1, frac, node, gpus)
                f.on_net(t1, frac, node, net)
                f.on_storage(t1, frac, node, storage)
                f.on_host(t1, frac, node, host)
                f.on_hw(t1, node, hw)
            self._hw.observe(node, t1, gpus=gpus)
            # A node whose clock is off stamps what it sends that far off (the clock-skew fault); the
            # messages still come out when they are sent, as a live engine would receive them.
            off = sum(f.clock_offset_s(node) for f, _ in node_faults)
            tn = ts + off
            # A node whose agent is down sends nothing; its readings were still drawn above, so the
            # other nodes' noise and the node's own stream after the agent is back stay as they were.
            mute = any(f.silences(node) for f, _ in node_faults)
            if not mute:
                yield TOPIC_GPU, envelope("gpu", node, tn, gpus=gpus)
                yield TOPIC_NET, envelope("net", node, tn, **net)
                yield TOPIC_STORAGE, envelope("storage", node, tn, **storage)
                yield TOPIC_HOST, envelope("host", node, tn, **host)
                yield TOPIC_HW, envelope("hw", node, tn, **hw)
            for js in self.jobs:
                pend = js.pending.get(node)
                if not pend:
                    continue
                done = [(rec, truth) for end, rec, truth in pend if end <= t1]
                if not done:
                    continue
                js.pending[node] = [p for p in pend if p[0] > t1]
                steps = []
                for rec, truth in done:
                    js.last[rec["rank"]] = truth  # the telemetry follows what the GPU did, published or not
                    if not rec.pop("_silent", False):
                        steps.append({**rec, "ended_at": round(rec["ended_at"] + off, 4)} if off else rec)
                if steps:
                    self._hw.observe(node, t1, job=js.spec.job, steps=steps)
                    if not mute:  # the reporter drops what no agent takes
                        yield TOPIC_STEPS, envelope("steps", node, tn, job=js.spec.job, steps=steps)

    # ------------------------------------------------------------------ the step model

    def _advance(self, js: JobState, until: float) -> None:
        """Generate every step of ``js`` that starts before ``until`` (records wait in ``pending``).

        Each step draws its noise once (input waits, compute jitter, hiccups, GC pauses, the
        collective's transfer), then lays out the step with the active faults' effects and, for
        the ground truth's cost, again without each fault (same noise): the difference is what
        that fault cost this step.
        """
        spec = js.spec
        rng = js.rng
        lognorm = rng.lognormvariate
        urand = rng.random
        n = len(js.ranks)
        rank_faults = [f for f in self.faults if f.affects_job(spec.job)]
        sigma = spec.jitter
        dmean, cmean = spec.data_wait_s, spec.compute_s
        hiccup, gc = spec.hiccup_rate, spec.hiccup_rate + spec.gc_rate
        exit_jitter = 0.004 * spec.base_step_s
        while js.next_start < until and js.next_start < self.duration_s:
            s = js.next_start
            active = [f for f in rank_faults if f.start <= s < f.end]
            own: list[StepEffects] = []
            for f in active:
                fx_f = StepEffects([1.0] * n, [0.0] * n, [0.0] * n)
                f.on_step(s, js, fx_f)
                own.append(fx_f)
            fx = _combine(own, n)
            if fx.stalled:
                # A hung collective: nobody completes a step; look again a little later.  The wait is
                # lost to every fault that hangs the job.
                js.stalled_at = s
                if js.stall_since is None:
                    js.stall_since = s
                js.next_start = s + min(1.0, self.interval_s) / 2
                for f, fx_f in zip(active, own, strict=True):
                    if fx_f.stalled:
                        f.tally(spec.job, js.next_start - s, None, None)
                continue
            # The step that hung completes once the hang ends, and its ranks report it as one long step
            # (they waited in the collective all along), as a real job's timer does: the hang is not a gap
            # between short steps.
            held = s - js.stall_since if js.stall_since is not None else 0.0
            js.stall_since = None
            ckpt_s = 0.0
            ckpt_delta: dict[int, float] = {}
            plan: CheckpointPlan | None = None
            if s >= js.next_checkpoint:
                plan, ckpt_delta = self._checkpoint_plan(js, s)
                ckpt_s = plan.duration_s
            # The noise of this step, shared by the actual and the fault-free layouts.
            data0 = [0.0] * n
            comp0 = [0.0] * n
            oneoff = [0.0] * n
            exit_s = [0.0] * n
            hw = js.hw
            for r in range(n):
                data0[r] = dmean * lognorm(0.0, 0.3)
                c = cmean * hw[r] * lognorm(0.0, sigma)
                comp0[r] = c
                u = urand()
                if u < hiccup:  # one slow step on this rank: a slow kernel, a page fault storm, a noisy neighbour
                    oneoff[r] = c * (0.5 + 2.0 * u / hiccup)
                elif u < gc:  # a garbage-collector pause
                    oneoff[r] = spec.gc_pause_s * lognorm(0.0, 0.3)
                exit_s[r] = exit_jitter * u  # ranks leave the collective a few ms apart
            transfer0 = spec.comm_s * lognorm(0.0, sigma)
            data = [data0[r] + fx.data_add_s[r] for r in range(n)]
            comp = [comp0[r] * fx.compute_mult[r] for r in range(n)]
            transfer = transfer0 * fx.comm_mult + fx.comm_add_s
            t_done, ready = self._layout(js, data, comp, oneoff, transfer, ckpt_s)
            step = js.step
            tail = fx.tail_s
            end_max = 0.0
            t_abs = self.start_time + s
            pp = spec.pp > 1
            for r in range(n):
                end = t_done + tail[r] + exit_s[r]
                if end > end_max:
                    end_max = end
                compute = comp[r] + oneoff[r]
                if pp:
                    pipe = ready[r] - ckpt_s - data[r] - compute
                    coll = end - ready[r]
                    comm = pipe + coll
                else:
                    comm = end - ready[r]
                truth = RankStep(end, data[r], compute, comm, ckpt_s)
                rec: dict[str, Any] = {"rank": r, "step": step, "duration_s": round(end + held, 4)}
                if spec.split:
                    rec.update(data_wait_s=round(data[r], 4), compute_s=round(compute, 4),
                               comm_s=round(comm + held, 4))
                    if pp:
                        rec.update(collective_s=round(coll + held, 4), pipeline_wait_s=round(pipe, 4))
                    if ckpt_s:
                        rec["checkpoint_s"] = round(ckpt_s, 4)
                rec.update(node=js.node_of[r], ended_at=round(t_abs + end, 4))
                if r in fx.silent:
                    rec["_silent"] = True
                js.pending[js.node_of[r]].append((s + end, rec, truth))
            if active:
                self._tally(js, active, own, data0, comp0, oneoff, transfer0, ckpt_s, ckpt_delta, t_done,
                            self.duration_s - s)
            js.step += 1
            js.next_start = s + end_max + 0.002  # the launcher's gap between steps
            if plan is not None:
                self._checkpoint_events(js, s, plan)

    def _layout(self, js: JobState, data: list[float], comp: list[float], oneoff: list[float], transfer: float,
                ckpt_s: float) -> tuple[float, list[float]]:
        """Lay one step out: when the collective ends, and when each rank was ready to enter it.

        Data parallel (``pp`` = 1): a rank is ready after its input, compute and any pause; the
        all-reduce ends ``transfer`` after the last rank arrives, so every rank's step ends
        together and the fast ranks' wait shows as ``comm_s``.  Pipeline parallel: in each
        data-parallel replica, a microbatch moves through the stages at the pace of the slowest
        stage (m + pp - 1 slots with the fill and drain bubbles); one-off pauses delay the replica
        once; the replica is ready when its pipeline drains, then the gradient all-reduce across
        replicas waits for the last one.  Returns ``(t_done, ready per rank)``.
        """
        spec = js.spec
        if spec.pp == 1:
            ready = [data[r] + comp[r] + oneoff[r] + ckpt_s for r in range(len(data))]
            return max(ready) + transfer, ready
        m, p = spec.microbatches, spec.pp
        ready = [0.0] * len(data)
        latest = 0.0
        for replica in js.replicas:
            ranks = [r for stage in replica for r in stage]
            begin = max(data[r] for r in ranks)
            slot = max(max(comp[r] for r in stage) / m for stage in replica)
            done = begin + (m + p - 1) * slot + max(oneoff[r] for r in ranks) + ckpt_s
            for r in ranks:
                ready[r] = done
            latest = max(latest, done)
        return latest + transfer, ready

    def _tally(self, js: JobState, active: list[Fault], own: list[StepEffects], data0: list[float],
               comp0: list[float], oneoff: list[float], transfer0: float, ckpt_s: float,
               ckpt_delta: dict[int, float], t_done: float, horizon: float = math.inf) -> None:
        """Charge each active fault what it cost this step: the step's length minus its length without it.

        Only what is lost by the end of the run (``horizon``: seconds from the step's start to it): a
        save still running when the run ends has cost the time it has taken so far over its length
        without the fault, not what it will cost once it ends, which nobody watching the run has seen
        (an incident still open at the end is scored on its figure at the last tick).
        """
        n = len(data0)
        for i, f in enumerate(active):
            rest = _combine([fx for j, fx in enumerate(own) if j != i], n)
            data = [data0[r] + rest.data_add_s[r] for r in range(n)]
            comp = [comp0[r] * rest.compute_mult[r] for r in range(n)]
            transfer = transfer0 * rest.comm_mult + rest.comm_add_s
            ckpt = ckpt_s - ckpt_delta.get(id(f), 0.0) if ckpt_s else 0.0
            without, _ = self._layout(js, data, comp, oneoff, transfer, ckpt)
            f.tally(js.spec.job, max(0.0, min(t_done, horizon) - without), t_done, without)

    def _checkpoint_plan(self, js: JobState, s: float) -> tuple[CheckpointPlan, dict[int, float]]:
        """Plan the save starting at ``s``: the plan, and each fault's change to its duration (by ``id``)."""
        spec = js.spec
        js.checkpoints += 1
        js.next_checkpoint = s + spec.checkpoint_every_s
        dur = spec.checkpoint_bytes / spec.checkpoint_write_bytes_per_s * js.rng.lognormvariate(0.0, 0.05)
        plan = CheckpointPlan(f"{spec.job}-step-{js.step}", js.checkpoints, int(spec.checkpoint_bytes), dur)
        delta: dict[int, float] = {}
        for f in self.faults:
            if f.affects_job(spec.job) and f.start <= s < f.end:
                before = plan.duration_s
                f.on_checkpoint(s, js, plan)
                if plan.duration_s != before:
                    delta[id(f)] = plan.duration_s - before
        return plan, delta

    def _checkpoint_events(self, js: JobState, s: float, plan: CheckpointPlan) -> None:
        spec = js.spec
        node0 = js.node_of[0]
        path = f"/{spec.pool or 'checkpoints'}/{spec.job}/{plan.checkpoint_id}"
        t_start = self.start_time + s
        t_end = t_start + plan.duration_s
        js.events.append((t_start, envelope("checkpoint", node0, t_start, job=spec.job, rank=0,
                                            checkpoint_id=plan.checkpoint_id, phase="start", path=path)))
        if plan.failed:
            js.events.append((t_end, envelope("checkpoint", node0, t_end, job=spec.job, rank=0,
                                              checkpoint_id=plan.checkpoint_id, phase="failed",
                                              duration_s=round(plan.duration_s, 3), path=path,
                                              error=plan.error or "write failed")))
        else:
            js.events.append((t_end, envelope("checkpoint", node0, t_end, job=spec.job, rank=0,
                                              checkpoint_id=plan.checkpoint_id, phase="end", bytes=plan.bytes,
                                              duration_s=round(plan.duration_s, 3), path=path)))
        js.checkpoint_windows.append((s, s + plan.duration_s, plan.bytes))

    # ------------------------------------------------------------------ telemetry

    def _gpu_report(self, node: str, rng: random.Random, t0: float, t1: float) -> list[dict[str, Any]]:
        out = []
        gauss = rng.gauss
        placed = self._gpu_rank[node]
        activity: dict[str, str] = {}
        for g in self.topology.gpus_of(node):
            where = placed.get(g)
            if where is None:
                power = 68.0 + gauss(0, 2)
                out.append({
                    "gpu": g, "util_pct": 0.0, "mem_util_pct": 0.0, "mem_used_bytes": 512 * 2**20,
                    "mem_total_bytes": GPU_MEM_TOTAL, "temp_c": round(33.0 + gauss(0, 1.5), 1),
                    "power_w": round(power, 1), "power_limit_w": GPU_POWER_LIMIT,
                    "sm_clock_mhz": 345.0, "sm_clock_max_mhz": GPU_SM_MAX, "throttle_reasons": ["gpu_idle"],
                    "ecc_corrected": 0, "ecc_uncorrected": 0, "xid": []})
                continue
            js, r = where
            last = js.last[r]
            dur = last.duration_s or 1.0
            # NCCL kernels keep the SMs "busy" while a rank waits in the collective, so utilisation only
            # drops for input waits and checkpoints; power follows the share of real compute.
            busy = max(0.0, 1.0 - (last.data_wait_s + last.checkpoint_s) / dur)
            compute_share = min(1.0, last.compute_s / dur)
            act = activity.get(js.spec.job)
            if act is None:
                act = activity[js.spec.job] = js.activity(t0, t1)
            if act == "hung":
                busy, compute_share = 1.0, 0.03  # spinning in a collective that never completes
            elif act == "checkpoint":
                busy, compute_share = 0.04, 0.02
            util = min(100.0, max(0.0, 97.0 * busy + gauss(0, 1.5)))
            power = 140.0 + 560.0 * compute_share * 0.93 + gauss(0, 12)
            # A heatsink has inertia: temperature follows power slowly, so a checkpoint barely dents it.
            key = (node, g)
            prev = self._temp.get(key, 38.0 + 0.045 * power)
            temp_base = prev + (38.0 + 0.045 * power - prev) * 0.05
            self._temp[key] = temp_base
            temp = temp_base + gauss(0, 0.8)
            out.append({
                "gpu": g, "util_pct": round(util, 1),
                "mem_util_pct": round(min(100.0, max(0.0, 55.0 * busy + gauss(0, 3))), 1),
                "mem_used_bytes": int(71.5 * 2**30 + gauss(0, 2**28)), "mem_total_bytes": GPU_MEM_TOTAL,
                "temp_c": round(temp, 1), "power_w": round(min(power, GPU_POWER_LIMIT), 1),
                "power_limit_w": GPU_POWER_LIMIT, "sm_clock_mhz": 1980.0 if rng.random() < 0.9 else 1965.0,
                "sm_clock_max_mhz": GPU_SM_MAX, "throttle_reasons": [],
                "ecc_corrected": 0, "ecc_uncorrected": 0, "xid": []})
        return out

    def _net_report(self, node: str, rng: random.Random, t0: float, t1: float) -> dict[str, Any]:
        gauss = rng.gauss
        dt = t1 - t0
        placed = self._gpu_rank[node]
        nics = []
        for nic in self.topology.nics_of(node):
            tx = 0.0
            for g in nic.gpus:
                where = placed.get(g)
                if where is not None:
                    js, r = where
                    if js.activity(t0, t1) == "train":
                        tx += js.bytes_per_step / max(js.last[r].duration_s, 1e-3)
            tx = max(0.0, tx * (1.0 + gauss(0, 0.03))) + 2.0e4 + abs(gauss(0, 5e3))
            rx = max(0.0, tx * (1.0 + gauss(0, 0.03)))
            nics.append({
                "nic": nic.name, "rx_bytes_per_s": round(rx, 1), "tx_bytes_per_s": round(tx, 1),
                "rx_packets_per_s": round(rx / 4096.0, 1), "tx_packets_per_s": round(tx / 4096.0, 1),
                "rx_errors_per_s": 0.0, "tx_errors_per_s": 0.0, "rx_drops_per_s": 0.0, "tx_drops_per_s": 0.0,
                "link_up": True, "speed_mbps": NIC_SPEED_MBPS, "carrier_changes": 0, "symbol_errors": 0,
                "xmit_wait_per_s": round(abs(gauss(2.0e3, 8.0e2)), 1), "gpus": list(nic.gpus)})
        out_segs = 20000.0 * (1.0 + gauss(0, 0.05))
        # Healthy hosts retransmit a segment now and then: 0-2 per second.
        retrans = min(2.0, rng.lognormvariate(-0.6, 0.6))
        return {"interval_s": dt, "nics": nics, "tcp_retrans_segs_per_s": round(retrans, 2),
                "tcp_out_segs_per_s": round(out_segs, 1),
                "tcp_timeouts_per_s": 0.0 if rng.random() < 0.97 else 1.0}

    def _storage_report(self, node: str, rng: random.Random, t0: float, t1: float, dt: float) -> dict[str, Any]:
        gauss = rng.gauss
        devices = []
        nvme_r = abs(gauss(40.0, 10.0))
        devices.append({
            "device": "nvme0n1", "read_iops": round(nvme_r, 1), "write_iops": round(abs(gauss(60.0, 15.0)), 1),
            "read_bytes_per_s": round(nvme_r * 131072, 1), "write_bytes_per_s": round(abs(gauss(4e6, 1e6)), 1),
            "read_latency_ms": round(0.09 + abs(gauss(0, 0.01)), 3),
            "write_latency_ms": round(0.03 + abs(gauss(0, 0.005)), 3),
            "queue_depth": round(abs(gauss(0.05, 0.02)), 3), "util_pct": round(abs(gauss(2.0, 0.5)), 1)})
        for m in self.topology.mounts_of(node):
            read_b = 0.0
            write_b = 0.0
            for js in self.jobs:
                if js.spec.pool != m.pool or node not in js.node_ranks:
                    continue
                if js.activity(t0, t1) == "train":
                    for r in js.node_ranks[node]:
                        read_b += js.spec.read_bytes_per_step / max(js.last[r].duration_s, 1e-3)
                share = len(js.node_ranks[node]) / len(js.ranks)
                for cs, ce, nbytes in js.checkpoint_windows[-3:]:
                    lo, hi = max(cs, t0), min(ce, t1)
                    if hi > lo:
                        write_b += nbytes * share / (ce - cs) * (hi - lo) / dt
            read_b = read_b * (1.0 + gauss(0, 0.05)) + abs(gauss(2e5, 5e4))
            write_b = write_b * (1.0 + gauss(0, 0.03)) + abs(gauss(1e5, 3e4))
            r_iops = read_b / 1048576.0
            w_iops = write_b / 1048576.0
            r_lat = 1.6 * rng.lognormvariate(0.0, 0.12)
            w_lat = 2.4 * rng.lognormvariate(0.0, 0.12)
            devices.append({
                "device": m.device, "pool": m.pool, "read_iops": round(r_iops, 1), "write_iops": round(w_iops, 1),
                "read_bytes_per_s": round(read_b, 1), "write_bytes_per_s": round(write_b, 1),
                "read_latency_ms": round(r_lat, 3), "write_latency_ms": round(w_lat, 3),
                "queue_depth": round((r_iops * r_lat + w_iops * w_lat) / 1000.0, 3),
                "util_pct": round(min(100.0, (r_iops + w_iops) / 40.0), 1)})
        return {"interval_s": dt, "devices": devices,
                "io_pressure_some_avg10": round(abs(gauss(0.3, 0.2)), 2)}

    def _host_report(self, node: str, rng: random.Random) -> dict[str, Any]:
        gauss = rng.gauss
        loader = 0.0
        for js in self.jobs:
            ranks = js.node_ranks.get(node)
            if ranks:
                loader += js.spec.loader_cpu_pct * len(ranks) / 8.0
        loader = max(0.0, loader * (1.0 + gauss(0, 0.06)))
        busy = min(100.0, 6.0 + loader / HOST_CPUS * 0.9 + 25.0 * bool(loader) + gauss(0, 2.0))
        return {"cpu_busy_pct": round(max(0.5, busy), 1), "cpu_iowait_pct": round(abs(gauss(0.8, 0.3)), 2),
                "cpu_steal_pct": 0.0, "cpu_count": HOST_CPUS,
                "mem_used_bytes": int(0.31 * HOST_MEM_TOTAL * (1.0 + gauss(0, 0.01))),
                "mem_total_bytes": HOST_MEM_TOTAL,
                "cpu_pressure_some_avg10": round(abs(gauss(1.0, 0.5)), 2),
                "mem_pressure_some_avg10": 0.0, "mem_pressure_full_avg10": 0.0,
                "loader_cpu_pct": round(loader, 1)}
