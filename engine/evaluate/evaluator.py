"""The evaluator: fed contract messages and event time, it returns diagnoses.

Pure and synchronous: no Kafka, no faust, no Slack.  The live engine, ``whywait
rules test``, ``whywait eval`` and replays all drive this one class, so a rule
that passes its test behaves the same in production.

Time is event time.  The watermark is how far every input has come (as far as most
of its producers have: one node's wrong clock cannot move it) minus the
allowed lateness; every ``step_s`` of watermark the evaluator runs one *tick*:
each rule against each running job.  A rule's lifecycle follows Prometheus:
a condition must hold ``for`` before it fires, and it keeps firing for
``keep_firing_for`` after it stops holding.  A firing rule inhibits the rules it
names for the same job (a root cause mutes its symptoms).
"""

from __future__ import annotations

import bisect
import hashlib
import heapq
import logging
import math
import time
import traceback
import typing
from collections import ChainMap, Counter
from dataclasses import dataclass, field, replace
from dataclasses import fields as dataclass_fields
from functools import cache
from pathlib import Path
from typing import Any, Callable, Iterable, Mapping

from whywait.agents.events import NODE_KINDS, TOPICS
from whywait.engine.diagnosis import Diagnosis, Evidence, Owner
from whywait.engine.evaluate.conditions import IMPLICIT_METRICS, Ctx, Result, evaluate, rule_leaves, rule_metrics
from whywait.engine.evaluate.frontier import InputFrontier
from whywait.engine.evaluate.identity import NodeIdentities
from whywait.engine.evaluate.steps import PHASES
from whywait.engine.evaluate.store import MetricStore
from whywait.engine.rules.condition_types import Kind
from whywait.engine.rules.loader import RuleSet
from whywait.engine.rules.metrics import METRICS
from whywait.engine.rules.schema import Condition, Rule, leaves
from whywait.engine.rules.templating import render as _render

log = logging.getLogger(__name__)



# Inputs every node sends every interval (``periodic`` in the event contract): the watermark waits
# for all of them.
_PERIODIC = frozenset(t.kind for t in TOPICS if t.periodic)
# Steps stop when a job hangs or stalls in a checkpoint, which is exactly when the rules must run:
# the watermark stops waiting for them after a few seconds, not after ``idle_s``.
_IDLE_S = {"steps": 5.0}


@dataclass
class Incident:
    """The lifecycle state of one (rule, grouping labels) incident."""

    rule_id: str
    fingerprint: str
    labels: dict[str, str]
    pending_since: float
    last_true: float
    firing: bool = False
    announced: bool = False
    signature: tuple[Any, ...] = ()
    last: Diagnosis | None = None
    # The cost so far: wall seconds the job lost to this incident, summed over the steps that ended
    # after it began (each counted once: up to ``cost_until``).
    cost_lost_s: float = 0.0
    cost_until: float = -math.inf
    # The end of the first step counted as lost (the walk back reaches where the waiting began): the
    # incident's own evidence starts there, which may be long before it fired (a periodic slowdown).
    cost_since: float = math.inf
    # The end of the last step that lost a material share of its time (2%): with ``cost_since``, where the loss
    # lies within the incident, so overlapping incidents of one job whose losses fall on different steps are
    # not taken for one loss counted twice (``lost_from``/``lost_until`` in the cost; engine/report/costs.py).
    cost_last: float = -math.inf
    # Restored from a checkpoint: until the windows refill (see ``Evaluator.warmup_s``), a restored
    # incident whose condition does not hold is *unknown*, not clear, and is neither resolved nor dropped.
    restored: bool = False
    # Not announced before this event time: its explanation (an inhibiting incident) ended, and it must
    # hold its rule's ``for`` again first (see ``Evaluator.tick``).
    quiet_until: float = -math.inf



@dataclass
class ClockSkew:
    """What the event-time guard has seen of one producing node (for its agent-health diagnosis)."""

    rejected: int = 0
    last_rejected_wall: float = 0.0
    worst_s: float = 0.0  # seconds ahead of the engine's clock (positive) of the last refused message
    announced: Diagnosis | None = None


@dataclass
class Evaluator:
    """Holds the rules, the topology, the metric store and every incident's lifecycle."""

    rules: RuleSet
    topology: Any
    step_s: float = 1.0
    lateness_s: float = 2.0
    store: MetricStore = field(default_factory=MetricStore)
    incidents: dict[str, Incident] = field(default_factory=dict)
    cond_state: dict[tuple[Any, ...], Any] = field(default_factory=dict)
    idle_s: float = 60.0
    next_tick: float | None = None
    ticks: int = 0
    # "finished" placements stamped ahead of the evaluated time, applied once the ticks reach them (a
    # job's last steps, held back by the lateness, are still judged with the job placed)
    finishing: list[tuple[float, int, dict[str, Any]]] = field(default_factory=list)
    # Per periodic input: how far it has come in event time, robust to producers whose clocks are off
    # (see :mod:`.frontier`); ``kind_max`` holds their values, which the watermark reads.
    frontiers: dict[str, InputFrontier] = field(default_factory=dict)
    kind_max: dict[str, float] = field(default_factory=dict)
    # Live engines pass a wall clock: an input is "idle" when nothing of it has *arrived* lately,
    # which stays right while the consumer catches up on a backlog (every topic still arrives,
    # at event times far behind each other).  Without it (rule tests, replays: sorted input) an
    # input is idle when its event time lags the newest one.
    # After a stall (a busy machine, a broker hiccup) the first batch may hold one topic only, so
    # an input must also have been missing from several consecutive batches to count as idle.
    arrival_clock: Callable[[], float] | None = None
    idle_wall_s: float = 10.0
    idle_batches: int = 5
    kind_arrival: dict[str, tuple[float, int]] = field(default_factory=dict)
    batch_no: int = 0
    first_arrival: tuple[float, int] | None = None
    # Inputs the consumer knows have unread messages (its offset is behind the partition's end):
    # such an input is never idle, however long the consumer spends on other topics' backlog.
    pending_kinds: frozenset[str] = frozenset()
    # ---- guards against hostile or broken time ----
    # One batch never runs more than this many ticks (live engine: ``begin_batch`` sets the budget;
    # rule tests and replays run unbounded); the rest wait for the next batch.
    max_ticks_per_batch: int = 600
    tick_budget: int | None = None
    # A watermark jump longer than this (no data in between: an outage, or an agent that sent one
    # message from far away in time) is skipped, not ticked through second by second.
    max_gap_s: float = 900.0
    skipped_gap_s: float = 0.0
    tick_errors: int = 0
    # Per rule id: how many ticks it raised on, and its last error (one rule's failure skips that rule only).
    rule_errors: dict[str, int] = field(default_factory=dict)
    rule_error_last: dict[str, str] = field(default_factory=dict)
    # The event-time guard (:meth:`admit`): a message more than ``max_skew_s`` ahead of the engine's
    # wall clock (None: no limit), or more than ``max_late_s`` behind the watermark, is refused.
    max_skew_s: float | None = 300.0
    max_late_s: float = 900.0
    skew: dict[str, ClockSkew] = field(default_factory=dict)
    # The agent processes sending as each node, from their health messages (see :mod:`.identity`), and the
    # duplicate-node diagnoses announced (node -> its firing diagnosis).
    identities: NodeIdentities = field(default_factory=NodeIdentities)
    duplicates: dict[str, Diagnosis] = field(default_factory=dict)
    # Per node, the seconds its clock is off while a ``clock_offset`` rule fires for it (its incident's
    # evidence): its telemetry's stamps are moved by that much, back in line with its peers' (see
    # :meth:`_refresh_clock_fix`).  Its steps are not moved: the rule measures the offset from them.
    clock_fix: dict[str, float] = field(default_factory=dict)
    _clock_rules: frozenset[str] = field(default=frozenset(), repr=False)
    late: dict[str, int] = field(default_factory=dict)  # node -> messages refused as too late
    # After a restore: event time of the first tick, and how much event time a restored incident is
    # held (its rule's longest recent window + ``for``, at most ``warmup_max_s``).
    # ``warmup_s`` set: that fixed hold for every rule.
    warmup_s: float | None = None
    warmup_max_s: float = 900.0
    restored_at: float | None = None
    _restoring: bool = False
    # Per incident fingerprint, the end of the last step an incident of it counted as lost: a fault
    # that flaps (resolves, fires again) opens a new incident with the same fingerprint whose cost
    # walks back over steps the previous one already counted; they are not counted twice.
    counted_until: dict[str, float] = field(default_factory=dict)
    # The latest incidents that resolved, per job, for a ``supersedes`` rule that fires later and takes
    # them over (bounded; not checkpointed: after a restart only open incidents can be taken over).
    closed: dict[str, list[tuple[Incident, Diagnosis]]] = field(default_factory=dict)
    # ---- counters for whywait's own metrics (engine.observe reads them when scraped) ----
    # rule id -> incidents muted by a firing root cause (counted once per incident, when first muted)
    inhibited: Counter[str] = field(default_factory=Counter)
    _inhibited_fps: set[str] = field(default_factory=set)
    # Called with each tick's duration in seconds (the live engine's histogram); None: not timed.
    tick_observer: Callable[[float], None] | None = None
    # The rule set the store was last told to keep the metrics of (see MetricStore.set_keep).
    _keep_for: Any = field(default=None, repr=False)
    # The topology whose ``canonical_node`` names each message's node (see ``ingest``), and that method (None:
    # no topology, or one that names nodes only one way).
    _names_of: Any = field(default=None, repr=False)
    _node_name: Callable[[str], str | None] | None = field(default=None, repr=False)
    # Per rule with an ``every``: the event time of the last tick that evaluated it (see ``tick``).  Not
    # checkpointed: which ticks evaluate a rule is a function of event time alone.
    _evaluated_at: dict[str, float] = field(default_factory=dict, repr=False)
    # The first tick this evaluator ran (this process): a rule's onset is never looked for before it.
    _first_tick: float | None = field(default=None, repr=False)
    # The offline watermark, kept until an input's progress moves (see ``watermark``): it was computed
    # for every message, although it changes about once per input per second.
    _offline_wm: tuple[tuple[float | None, ...], float, float, float] | None = field(default=None, repr=False)

    # ---- feeding ---------------------------------------------------------------------------------

    def ingest(self, msg: Mapping[str, Any]) -> list[Diagnosis]:
        """Add one validated message; run every tick the watermark now passes; return their diagnoses."""
        if self._keep_for is not self.rules:  # new rules (or a reload): the store keeps what they read
            self._keep_for = self.rules
            self.store.set_keep(rule_metrics(self.rules))
            self.store.set_spans(rule_spans(self.rules))
            self._clock_rules = frozenset(r.id for r in self.rules
                                          if any(c.type == "clock_offset" for c in leaves(r.when)))
        if msg["kind"] in NODE_KINDS:
            # The agent's name for its host may not be the topology's (node01.cluster.local / node01): the
            # message is stored under the topology's, which the placements and the rules use.
            if self._names_of is not self.topology:
                self._names_of = self.topology
                self._node_name = getattr(self.topology, "canonical_node", None)
            if self._node_name is not None:
                node = self._node_name(msg["node"])
                if node is not None and node is not msg["node"]:
                    msg = {**msg, "node": node}
            if self.clock_fix:
                off = self.clock_fix.get(msg["node"])
                if off is not None:
                    msg = {**msg, "time": msg["time"] - off}
        if msg["kind"] == "placement":
            self._place(msg)
        elif msg["kind"] == "net" and self.topology is not None:
            # One name per adapter: the agent's ``mlx5_0/1`` becomes the topology's ``HCA-1`` (by GUID,
            # PCI id or alias), so rules comparing a NIC with its GPUs' expected NIC can match them.
            msg = self.topology.canonical_net(msg)
        elif msg["kind"] == "gpu" and self.topology is not None:
            msg = self.topology.canonical_gpu(msg)  # NVML's index order → the topology's, by PCI bus id
        elif msg["kind"] == "agent_health" and msg.get("instance"):
            self.identities.note(str(msg["node"]), str(msg["instance"]), float(msg["time"]))
        t = self.store.ingest(msg)
        kind = msg["kind"]
        if kind in _PERIODIC:
            fr = self.frontiers.get(kind)
            if fr is None:
                fr = self.frontiers[kind] = InputFrontier()
            self.kind_max[kind] = fr.note(msg["node"], t)
            if self.arrival_clock is not None:
                self.kind_arrival[kind] = (self.arrival_clock(), self.batch_no)
                if self.first_arrival is None:
                    self.first_arrival = self.kind_arrival[kind]
        if self.ticks == 0:
            # Until the first tick runs, time starts at the *earliest* message seen: a consumer may
            # hand over a sparse topic first (a checkpoint at +150 s before the telemetry of +1 s).
            first = math.floor(t) + self.step_s
            if self.next_tick is None or first < self.next_tick:
                self.next_tick = first
                # the store keeps points far ahead of the clock staged (see MetricStore.clock)
                self.store.clock = first - self.step_s
        return self.advance(self.watermark())

    def watermark(self) -> float:
        """Event time up to which every input is complete (minus the allowed lateness).

        The minimum over the periodic inputs, as in Flink (each input's progress is robust to the few
        producers whose clocks are off: :meth:`_progress`): when the consumer catches up on a
        backlog, one topic can run minutes ahead of another, and evaluating at the fastest
        topic's time would see steps without their network samples.  Offline (sorted input), an
        input lagging the newest by more than ``idle_s`` (a collector that is off) no longer holds
        time back; live (``arrival_clock`` set), an input is idle only when it has no unread
        messages and has not arrived for ``idle_wall_s`` and ``idle_batches``; no tick runs
        before every input has arrived or gone idle, nor while placements are unread.
        """
        if self.arrival_clock is None and not self.kind_max:
            return self.store.max_time - self.lateness_s  # sorted input without telemetry (events only)
        if self.arrival_clock is not None:
            now = self.arrival_clock()
            # An input not seen yet holds time back too, until it counts as idle since the first
            # arrival: at start-up the consumer's first batches may hold one topic only (minutes of
            # it, on a backlog), and ticking on those would pass windows before their data came.
            # Unread placements hold time too: a job the evaluator does not know yet is not
            # evaluated, and the windows that pass before its placement arrives are lost to it.
            if "placement" in self.pending_kinds:
                return -math.inf
            if any(k not in self.kind_arrival and (k in self.pending_kinds
                                                   or not self._idle_since(self.first_arrival, now))
                   for k in _PERIODIC):
                return -math.inf
            if not self.kind_max:
                return -math.inf
            prog = self._progress()
            active = [t for k, t in prog.items() if not self._idle(k, now)]
            return min(active or prog.values()) - self.lateness_s
        # Sorted input: a function of the inputs' progress (and two settings) only, so it is kept
        # until one of them moves.
        steps = self.frontiers.get("steps")
        times = (*self.kind_max.values(), steps.raw if steps is not None else None)
        kept = self._offline_wm
        if kept is not None and kept[0] == times and kept[1] == self.lateness_s and kept[2] == self.idle_s:
            return kept[3]
        prog = self._progress()
        top = max(prog.values())
        wm = min(t for k, t in prog.items() if top - t <= _IDLE_S.get(k, self.idle_s)) - self.lateness_s
        self._offline_wm = (times, self.lateness_s, self.idle_s, wm)
        return wm

    def _progress(self) -> dict[str, float]:
        """Each periodic input's progress in event time, for the watermark.

        Node telemetry: its robust frontier (:mod:`.frontier`).  Steps: jobs report at their own cadence
        (a job with 30 s steps sends every 30 s), so the median over producers lags the jobs that just
        reported; steps count as far as their newest report, but never past the furthest input's robust
        frontier (the steps' own median included, for when they are all that arrives), so one producer
        whose clock runs ahead cannot move them either.
        """
        steps = self.frontiers.get("steps")
        if steps is None:
            return self.kind_max
        prog = dict(self.kind_max)
        prog["steps"] = min(steps.raw, max(self.kind_max.values()))
        return prog

    def _idle(self, kind: str, now: float) -> bool:
        return kind not in self.pending_kinds and self._idle_since(self.kind_arrival.get(kind), now)

    def set_pending(self, kinds: Iterable[str]) -> None:
        """Called by the live engine after each batch with the inputs that still have unread messages."""
        self.pending_kinds = frozenset(kinds)

    def _idle_since(self, seen: tuple[float, int] | None, now: float) -> bool:
        at, batch = seen if seen is not None else (now, self.batch_no)
        return now - at > self.idle_wall_s and self.batch_no - batch >= self.idle_batches

    def begin_batch(self) -> None:
        """Called by the live engine before each consumed batch (see ``idle_batches``).

        Also gives the batch its tick budget: however far the watermark moves, one batch runs at
        most ``max_ticks_per_batch`` ticks, so no message can keep the engine ticking for minutes.
        """
        self.batch_no += 1
        self.tick_budget = self.max_ticks_per_batch

    def advance(self, watermark: float) -> list[Diagnosis]:
        """Run the due ticks up to ``watermark`` (event time); return the diagnoses they produce.

        Called after every ingested message (and by the live engine after each batch, to use the
        rest of its budget).  A gap longer than ``max_gap_s`` is skipped to its end (less the
        longest window a rule could need); the ticks beyond the batch's budget wait for the next call.
        """
        out: list[Diagnosis] = []
        if self.next_tick is None or not math.isfinite(watermark):
            return out
        if watermark - self.next_tick > self.max_gap_s:
            target = math.floor(watermark - self.max_gap_s)
            self.skipped_gap_s += target - self.next_tick
            log.warning("event time jumped %.0fs ahead; skipping the gap instead of ticking through it",
                        target - self.next_tick)
            self.next_tick = float(target)
        while self.next_tick <= watermark:
            if self.tick_budget is not None:
                if self.tick_budget <= 0:
                    break
                self.tick_budget -= 1
            now = self.next_tick
            self.next_tick += self.step_s  # first: a tick that fails is skipped, never retried forever
            if self.next_tick <= now:
                # Past 2**53 s of event time a step no longer moves a float clock: this loop would tick the same
                # second forever (a rule test run out by a `for: 10000000000000d` the loader now refuses).
                _stuck_clock(now, self.step_s)
                self.next_tick = now
                break
            if self.finishing:
                self._finish_due(now)
            self.store.close_buckets(now)
            t0 = time.perf_counter()
            try:
                out += self.tick(now)
            except Exception:  # noqa: BLE001 - one bad tick (a rule meeting data it did not expect)
                self.tick_errors += 1  # costs that second of evaluation, not the engine
                if self.tick_errors <= 10 or self.tick_errors % 1000 == 0:
                    log.exception("tick at %.0f failed (%d so far)", now, self.tick_errors)
            if self._clock_rules:
                self._refresh_clock_fix(now)
            if self.tick_observer is not None:
                self.tick_observer(time.perf_counter() - t0)
            self.ticks += 1
            if self.ticks % 60 == 0:
                self.store.trim(now)
        return out

    def catch_up(self) -> list[Diagnosis]:
        """Run what the batch's budget still allows up to the current watermark (end of a live batch)."""
        return self.advance(self.watermark())

    # ---- the event-time guard --------------------------------------------------------------------

    def admit(self, msg: Mapping[str, Any], wall_now: float) -> str | None:
        """Return why a validated message must be refused for its event time, or None to ingest it.

        Called by the live engine before :meth:`ingest`.  Event time comes from the message body,
        so a producer with a wrong clock (or a hostile one) could otherwise move the watermark for
        every job: a message too far ahead of ``wall_now`` is refused and counted against its node
        (see :meth:`clock_diagnoses`); a message more than ``max_late_s`` behind what was evaluated
        already, or behind the newest message of its kind, can no longer be evaluated and is
        refused too (an agent flushing a spool after a long outage gets its reason on the DLQ).
        Placements are exempt from lateness: the compacted topic keeps a job's placement from when
        it started.
        """
        t = float(msg["time"])
        node = str(msg["node"])
        if self.max_skew_s is not None and t > wall_now + self.max_skew_s:
            ahead = t - wall_now
            sk = self.skew.get(node)
            if sk is None:
                if len(self.skew) >= 10_000:  # bounded: a flood of invented node names cannot grow it
                    self.skew.pop(next(iter(self.skew)))
                sk = self.skew[node] = ClockSkew()
            sk.rejected += 1
            sk.last_rejected_wall = wall_now
            sk.worst_s = ahead
            return (f"event time {t:.3f} is {ahead:.0f}s ahead of the engine's clock (limit {self.max_skew_s:g}s): "
                    f"the clock of {node} is wrong")
        if msg["kind"] != "placement":
            # The reference is what was evaluated already (the next tick) or the newest message of the
            # same kind: either is known from the first messages on, and neither can be pushed
            # forward by a future-stamped message (those are refused above).
            ref = max(self.next_tick if self.ticks and self.next_tick is not None else -math.inf,
                      self.kind_max.get(msg["kind"], -math.inf))
            if math.isfinite(ref) and t < ref - self.max_late_s:
                if node in self.late or len(self.late) < 10_000:
                    self.late[node] = self.late.get(node, 0) + 1
                return (f"event time {t:.3f} is {ref - t:.0f}s behind the stream (limit {self.max_late_s:g}s): "
                        "too late to evaluate")
        return None

    def clock_diagnoses(self, wall_now: float, quiet_s: float = 120.0) -> list[Diagnosis]:
        """Agent-health diagnoses for nodes whose clocks the guard refused; called after each live batch.

        A node is announced once when its messages start being refused, and resolved when none has
        been refused for ``quiet_s`` of wall time.  The diagnosis goes to the operations channel
        (no job): a skewed clock is the agent's problem, not a training job's.
        """
        out: list[Diagnosis] = []
        kind_of = getattr(self.topology, "kind_of", None)
        for node, sk in list(self.skew.items()):
            fp = "whywait-clock-skew-" + hashlib.sha1(node.encode()).hexdigest()[:12]
            if kind_of is not None and kind_of(node) != "node":
                # Only nodes of the topology are announced: a producer can invent any name, and
                # invented names must not become Slack messages.  They are counted and logged.
                if wall_now - sk.last_rejected_wall >= quiet_s:
                    del self.skew[node]
                continue
            if sk.announced is None and wall_now - sk.last_rejected_wall < quiet_s:
                sk.announced = Diagnosis(
                    rule_id="whywait.agent-clock-skew", fingerprint=fp, status="firing", severity="warning",
                    title=f"Clock of {node} is {sk.worst_s:.0f}s ahead: its telemetry is refused",
                    cause=f"Messages from {node} carry event times {sk.worst_s:.0f}s ahead of the engine's clock "
                          f"(limit {self.max_skew_s:g}s). They go to the dead-letter topic instead of moving "
                          "event time for every job, so rules cannot see this node.",
                    job=None, owner=None, starts_at=wall_now, detected_at=wall_now,
                    next_step=f"Check time synchronisation on {node} (`chronyc tracking` or `timedatectl`).",
                    confidence=1.0, culprit=node, labels={"node": node})
                out.append(sk.announced)
            elif sk.announced is not None and wall_now - sk.last_rejected_wall >= quiet_s:
                out.append(replace(sk.announced, status="resolved", ends_at=wall_now))
                del self.skew[node]
        return out

    def _refresh_clock_fix(self, now: float) -> None:
        """Take each node's clock offset from the firing incidents of ``clock_offset`` rules; called after each tick.

        Why: with event time stamped by the node, a node 30 s behind put every sample 30 s in the past of
        the tick that read its peers, outside the windows the rules read: a NIC losing packets on it was
        never found (and 30 s ahead, 36 s late).  The job's own steps say by how much its clock is off
        (``job.node-clock-skew``); while that holds, its telemetry is moved back in line.  An incident
        whose condition stopped holding at its rule's last evaluation (the clock was fixed) moves nothing,
        even while it keeps firing.  A correction that moved by less than 0.5 s is kept as it was, so the
        node's samples are not shuffled by the estimate's milliseconds.
        """
        fix: dict[str, float] = {}
        for inc in self.incidents.values():
            if inc.rule_id not in self._clock_rules or not inc.firing or inc.last is None:
                continue
            if inc.last_true < self._evaluated_at.get(inc.rule_id, now):
                continue
            node = inc.labels.get("node")
            for e in inc.last.evidence:
                # Never further than a message may be late: the offset comes from a job's own timings,
                # which its owner sends, and must not move a node's telemetry out of every window.
                if (e.metric == "step.end_offset_s" and e.entity == node and node not in fix
                        and abs(e.value) <= self.max_late_s):
                    old = self.clock_fix.get(node)
                    fix[node] = old if old is not None and abs(old - e.value) < 0.5 else float(e.value)
        if fix != self.clock_fix:
            for node in fix.keys() - self.clock_fix.keys():
                # debug: the rule's diagnosis tells the operator (this would print in every rule test)
                log.debug("%s: moving its telemetry %+.1f s, its clock's offset from its job's ranks", node, -fix[node])
            self.clock_fix = fix

    def duplicate_diagnoses(self) -> list[Diagnosis]:
        """Diagnoses for nodes that two agent processes publish as; called after each live batch.

        A node is announced once two of its agents' instances have taken turns (:mod:`.identity`), and
        resolved once they stopped for ``quiet_s`` of event time.  Operations channel, no job: a
        duplicated host name is the cluster's problem, and it makes every job's view of that node a mix.
        """
        out: list[Diagnosis] = []
        ids = self.identities
        kind_of = getattr(self.topology, "kind_of", None)
        for node in list(ids.nodes):
            if node not in self.duplicates:
                turns = ids.duplicated(node)
                if turns is None or (kind_of is not None and kind_of(node) != "node"):
                    continue  # one process; or a name outside the topology (it never becomes a message)
                # an instance is the agent's word: no backtick of it may close the code span it is shown in
                shown = ", ".join(f"`{i.replace('`', chr(39))[:80]}`" for i in turns[:4])
                first = ids.nodes[node].returns[0][0]
                d = Diagnosis(
                    rule_id="whywait.duplicate-node",
                    fingerprint="whywait-duplicate-node-" + hashlib.sha1(node.encode()).hexdigest()[:12],
                    status="firing", severity="warning",
                    title=f"{len(turns)} agents publish as {node}: its telemetry mixes {len(turns)} machines",
                    cause=f"Agent processes {shown} (boot id/pid) take turns sending as {node}. Every metric of "
                          f"{node} alternates between machines, so what whywait says of {node} (and of the jobs "
                          "placed on it) is not to be trusted until one of them is renamed.",
                    job=None, owner=None, starts_at=first, detected_at=ids.now,
                    next_step=f"Find the machines: `cat /proc/sys/kernel/random/boot_id` on the hosts named {node} "
                              "(a machine cloned from an image keeps its host name); give each agent its own "
                              "`--node`, matching the topology.",
                    confidence=1.0, culprit=node, labels={"node": node})
                self.duplicates[node] = d
                out.append(d)
            elif ids.quiet(node):
                out.append(replace(self.duplicates.pop(node), status="resolved", ends_at=ids.now))
        return out

    def _place(self, msg: Mapping[str, Any]) -> None:
        """Apply a placement to the topology; a placement naming unknown nodes raises TopologyError.

        A ``finished`` one stamped after the time the ticks have reached waits until they reach it: the
        epilog's message arrives as the job's last steps do, and those are judged up to the lateness
        later; removing the job at once left its last seconds unjudged (and its open incident's cost
        short of them).
        """
        t = msg.get("time")
        table = self.store.step_tables.get(str(msg.get("job")))
        # Only while the job has steps the ticks have not reached: with none waiting, nothing is left to judge
        # (and a placement-only reader, with no data to move its ticks, would hold the job for ever).
        if msg.get("state") == "finished" and self.next_tick is not None and isinstance(t, (int, float)) \
                and t >= self.next_tick and table is not None and table.newest_t >= self.next_tick:
            held = dict(msg)
            heapq.heappush(self.finishing, (float(t), id(held), held))  # id: a tie never compares dicts
            return
        self.topology.apply_placement(msg)

    def _finish_due(self, now: float) -> None:
        """Apply the deferred ``finished`` placements stamped at or before ``now`` (called before each tick)."""
        while self.finishing and self.finishing[0][0] <= now:
            self.topology.apply_placement(heapq.heappop(self.finishing)[2])

    # ---- one tick --------------------------------------------------------------------------------

    def tick(self, now: float) -> list[Diagnosis]:
        """Evaluate every rule for every running job at event time ``now``.

        A rule with an ``every`` is evaluated only on the ticks at a multiple of it (:func:`due`); on the
        others it is *idle*: its incidents stay as they were (none resolves, opens, fires or is announced
        again), and those that held at its last evaluation and fire go on inhibiting the rules they name.
        Its ``for`` and ``keep_firing_for`` are still event time, judged at its evaluations; an incident it
        opens begins where its condition began to hold since the previous evaluation (:meth:`_onsets`).
        """
        if self._first_tick is None:
            self._first_tick = now
        idle = {r.id for r in self.rules if not due(r, now, self.step_s)}
        for rule in self.rules:
            if rule.every_s > self.step_s and rule.id not in idle:
                self._evaluated_at[rule.id] = now
        seen: set[str] = set()
        out: list[Diagnosis] = []
        # An idle rule's firing incidents that held at its last evaluation inhibit as they did then.
        firing: list[Incident] = [inc for inc in self.incidents.values()
                                  if inc.rule_id in idle and inc.firing
                                  and inc.last_true >= self._evaluated_at.get(inc.rule_id, math.inf)]
        for job in self.topology.jobs():
            entity_cache: dict[str, list[str]] = {}  # the job's entities per level, for all its rules this tick
            for rule in self.rules:
                if rule.id in idle:
                    continue
                try:
                    self._tick_rule(rule, job, now, entity_cache, seen, firing)
                except Exception as exc:  # noqa: BLE001 - one rule meeting data (or a template) it did not expect
                    # costs that rule's second of evaluation, not every other rule's: its incidents stay as
                    # they were, as an idle rule's do (none resolves because its rule could not be judged).
                    idle.add(rule.id)
                    self._rule_failed(rule, now, exc)
        if self._restoring and self.restored_at is None:
            self.restored_at = now
        # Lifecycle: announce new or changed incidents, resolve the ones that stopped holding.
        for fp, inc in list(self.incidents.items()):
            if fp not in self.incidents:
                continue  # taken over this tick by a superseding incident (see _supersede)
            if inc.rule_id in idle:
                continue  # its rule was not evaluated this tick: the incident stays as it was
            rule = self.rules.rules.get(inc.rule_id)
            if fp not in seen:
                if inc.restored and rule is not None and self._still_unknown(inc, rule, now):
                    continue  # the windows are still refilling: "not holding" means "unknown" here
                inc.restored = False
                if rule is None or not inc.firing or now - inc.last_true >= rule.keep_firing_for_s:
                    del self.incidents[fp]
                    self._inhibited_fps.discard(fp)
                    if inc.announced and inc.last is not None:
                        done = replace(inc.last, status="resolved", ends_at=self._ended_at(inc, rule, now))
                        out.append(done)
                        self._remember_closed(inc, done)
                continue
            if not inc.firing or inc.last is None:
                continue
            if self._inhibited(inc, firing):
                if fp not in self._inhibited_fps:
                    self._inhibited_fps.add(fp)
                    self.inhibited[inc.rule_id] += 1
                continue
            if fp in self._inhibited_fps and not inc.announced:
                # Its explanation has just ended.  What still holds may be the tail of the explained fault
                # (the last slow steps of a loader that has recovered), not yet a finding of its own: it must
                # go on holding for its rule's `for` again before it is announced (with its start unchanged).
                # Without this a symptom rule that had held, muted, through a whole fault fired the moment
                # the fault's rule resolved.
                self._inhibited_fps.discard(fp)
                inc.quiet_until = now + (rule.for_s if rule is not None else 0.0)
            if now < inc.quiet_until:
                continue
            if not inc.announced and rule is not None and rule.supersedes:
                # Only an incident that is announced takes others over: one muted by a root cause
                # would re-label them with a story the user never sees.
                out += self._supersede(inc, rule, now)
            sig = _signature(inc.last)
            if not inc.announced or sig != inc.signature:
                inc.announced = True
                inc.signature = sig
                out.append(inc.last)
        return out

    def _tick_rule(self, rule: Rule, job: Any, now: float, entity_cache: dict[str, list[str]], seen: set[str],
                   firing: list[Incident]) -> None:
        """Evaluate one rule for one job at ``now``: open, hold and fire its incidents (``seen``, ``firing``)."""
        ctx = Ctx(self.store, now, job, self.topology, rule.id, self.cond_state, entity_cache=entity_cache)
        res = evaluate(rule.when, ctx)
        if not res.holds:
            return
        groups = [(_fingerprint(rule.id, labels), labels, ents) for labels, ents in self._groups(rule, ctx, res)]
        fresh = {fp for fp, _, _ in groups if fp not in self.incidents}
        onsets = self._onsets(rule, job, now, fresh) if fresh and rule.every_s > self.step_s else {}
        for fp, labels, ents in groups:
            seen.add(fp)
            inc = self.incidents.get(fp)
            if inc is None:
                inc = self.incidents[fp] = Incident(rule.id, fp, labels, pending_since=onsets.get(fp, now),
                                                    last_true=now)
            inc.last_true = now
            if now - inc.pending_since + 1e-9 >= rule.for_s:
                inc.firing = True
                inc.last = self._diagnose(rule, ctx, res, inc, ents, now)
                firing.append(inc)

    def _unmeasured(self, node: Any, cctx: Ctx, now: float) -> bool:
        """Whether a check that did not hold was never measured, so it cannot be said "checked and clean".

        Called for each check that did not hold.  Two ways a check measured nothing:

        - it reads only phases of the step the job has never reported: "the job's data wait did not grow"
          is no finding for a job that reports step durations only;
        - one of the node-side metrics it reads (a GPU's clocks, a NIC's drops, a disk's latency) has no
          point at all on the entities it looks at: "GPU clocks and temperature normal on node-02" was said
          of a node whose agent runs without its GPU collector (no NVML) and sent no GPU sample.
        """
        phases = set()
        others = False
        for leaf in leaves(node):
            metric = getattr(leaf.params, "metric", None)
            if not isinstance(metric, str):
                others = True  # a topology predicate or a count of events: nothing to have measured
                continue
            level, _, name = metric.partition(".")
            name = "data_wait_s" if name == "data_wait_share" else name
            if level in ("job", "step") and name in PHASES:  # the step's parts a producer may leave out
                phases.add(name)
                continue
            others = True
            m = METRICS.get(metric)
            if m is None or m.level not in ("node", "gpu", "nic", "device"):
                continue
            ents = cctx.entities(m.level, leaf.on)
            if not ents:
                if m.level in ("gpu", "node"):  # no GPU or node of the job's to look at
                    return True
                continue
            # An occurrence metric (an XID) has no point while nothing happens: whether its entities were
            # measured at all is whether any other metric of their level was (the collector ran).
            probe = [metric] if not m.occurrences else [
                k for k, other in METRICS.items() if other.level == m.level and not other.occurrences]
            if not any(self.store.ever(k, e, now) for k in probe for e in ents):
                return True
        if others:
            return False
        return bool(phases) and not any(self.store.ever(f"job.{p}", cctx.job.job, now) for p in phases)

    def _rule_failed(self, rule: Rule, now: float, exc: BaseException) -> None:
        """Count and log a rule that raised on a tick (``tick_errors``, ``rule_errors``; ``rules test`` shows them)."""
        self.tick_errors += 1
        n = self.rule_errors[rule.id] = self.rule_errors.get(rule.id, 0) + 1
        where = rule.file or rule.id
        self.rule_error_last[rule.id] = f"{type(exc).__name__}: {exc}"
        if n <= 3 or n % 1000 == 0:
            # One line, naming where it raised: a user running a replay reads it, and a traceback belongs in a
            # bug report (logged at debug level, where `whywait -v` shows it).
            frame = traceback.extract_tb(exc.__traceback__)[-1] if exc.__traceback__ else None
            at = f" at {Path(frame.filename).name}:{frame.lineno}" if frame else ""
            log.error("rule %s (%s) failed at %.0f (%d so far): %s: %s%s", rule.id, where, now, n,
                      type(exc).__name__, exc, at)
            if n == 1:
                log.debug("rule %s failed", rule.id, exc_info=exc)

    def _onsets(self, rule: Rule, job: Any, now: float, fresh: set[str]) -> dict[str, float]:
        """When each new incident (fingerprint in ``fresh``) of a rule with an ``every`` began to hold.

        Called by ``tick`` when such a rule, evaluated at ``now``, opens incidents.  Its condition was not
        judged on the ticks since its previous evaluation, so it may have begun on any of them: the rule is
        judged again at each, newest first, back to the tick after its previous evaluation (and never
        before this evaluator's first tick), and an incident begins at the earliest tick from which it held
        on every tick up to ``now``; ``for`` counts from there, as it would have with a tick every second.
        Those judgements write to a scratch copy of the conditions' state, so they change nothing else.
        Rare (a new incident), and bounded by ``every`` ticks: no cost while nothing is wrong.
        """
        out: dict[str, float] = {}
        lo = max(now - rule.every_s + self.step_s, self._first_tick if self._first_tick is not None else now)
        running = set(fresh)
        t = now - self.step_s
        while running and t >= lo - 1e-9:
            scratch = typing.cast(dict[tuple[Any, ...], Any], ChainMap({}, self.cond_state))
            ctx = Ctx(self.store, t, job, self.topology, rule.id, scratch)
            res = evaluate(rule.when, ctx)
            held = {_fingerprint(rule.id, labels) for labels, _ in self._groups(rule, ctx, res)} if res.holds else set()
            for fp in list(running):
                if fp in held:
                    out[fp] = t
                else:
                    running.discard(fp)
            t -= self.step_s
        return out

    def _inhibited(self, inc: Incident, firing: list[Incident]) -> bool:
        """Whether a firing incident of a rule that inhibits ``inc``'s rule covers it.

        It covers it when it is about the same job and explains every node ``inc`` blames (or one
        of them blames no node: a job-wide cause or symptom), or, topology-aware, when its culprit
        is a place (a leaf switch, a rack, a storage pool) and every node ``inc`` blames lies
        beneath it: a leaf-switch diagnosis mutes the straggler diagnoses of the ranks under that
        switch, whichever job they belong to.

        Why not the whole job, as ``inhibits`` once meant: a throttled GPU on one node muted a
        straggler on another node of the same job for as long as it fired, so a second, unrelated
        fault was announced minutes late (after the first resolved) with the wrong start.  Several
        stragglers at once are what large jobs have; a root cause mutes only what it explains.
        """
        targets = self._blamed_nodes(inc)
        if not targets:
            # A job-wide finding in the aftermath of a cause that explained it: the one long step a hang
            # leaves behind ends as the hang stops holding, while its incident is still firing (its
            # keep_firing_for), and was told again as a stall of the whole job.
            firing = [*firing, *(o for o in self.incidents.values() if o.firing and o.announced
                                 and o.labels.get("job") == inc.labels.get("job") and o not in firing)]
        for other in firing:
            rule = self.rules.rules.get(other.rule_id)
            if other is inc or rule is None or (inc.rule_id not in rule.inhibits
                                                and inc.rule_id not in rule.supersedes):
                continue
            place = other.last.culprit if other.last is not None else None
            under = (set(self.topology.nodes_under(place))
                     if place and self.topology.kind_of(place) in ("switch", "rack", "pool") else None)
            if other.labels.get("job") == inc.labels.get("job"):
                source = under if under is not None else self._blamed_nodes(other)
                if not targets or not source or targets <= source:
                    return True
                continue  # another culprit in the same job: its own finding, not this one's symptom
            if under is not None and targets and targets <= under:
                return True
        return False

    def _ended_at(self, inc: Incident, rule: Rule | None, now: float) -> float:
        """When a resolving incident ended: once ``keep_firing_for`` (at least one tick) ran out after its
        condition last held, and never later than ``now``.

        Called as the incident resolves.  The same as ``now`` while ticks come every second; after a gap
        in event time that was skipped (the end of a replay, an engine down for an hour) ``now`` is the
        first tick after it, and an incident over at 19:01 was said to have ended at 19:46.
        """
        if rule is None or not inc.firing or not math.isfinite(inc.last_true):
            return now
        # Not past the newest input either: a condition over the last N steps goes on holding on the last
        # steps a replayed table holds after its end, and the incident was said to last two minutes longer.
        held = min(inc.last_true, self.store.max_time) if math.isfinite(self.store.max_time) else inc.last_true
        return min(now, held + max(rule.keep_firing_for_s, self.step_s))

    def _remember_closed(self, inc: Incident, done: Diagnosis) -> None:
        """Keep a resolved incident a while, for a ``supersedes`` rule that may take it over later."""
        job = inc.labels.get("job", "")
        kept = self.closed.setdefault(job, [])
        kept.append((inc, done))
        if len(kept) > 32:  # bounded per job: a period longer than 32 incidents ago is not taken over
            del kept[0]
        if len(self.closed) > 4096:
            del self.closed[next(iter(self.closed))]

    def _supersede(self, inc: Incident, rule: Rule, now: float) -> list[Diagnosis]:
        """Take over the incidents of the rules ``rule`` supersedes that ``inc``'s evidence covers.

        Called when ``inc`` is first announced.  An incident of a superseded rule for the same job
        that began since ``inc``'s evidence began (its first lost step, or when its condition began
        to hold, less the rule's ``for``) is part of it: a periodic slowdown's first spells looked like
        a slowdown of the whole job because no one can see a period in one spell.  Each such incident
        is closed now (open) or re-announced (resolved already), status resolved, with the labels
        ``superseded_by`` (the rule) and ``superseded_by_fingerprint``, and its cause saying so, so a
        receiver updates the earlier message in place and the story left is the superseding one.
        """
        job = inc.labels.get("job")
        assert inc.last is not None
        since = min(inc.pending_since, inc.cost_since) - rule.for_s - self.step_s
        note = {"superseded_by": rule.id, "superseded_by_fingerprint": inc.fingerprint}
        tail = f" Taken over by a later finding: {inc.last.title}."
        out: list[Diagnosis] = []
        for fp, other in list(self.incidents.items()):
            if (other.rule_id in rule.supersedes and other.labels.get("job") == job
                    and other.pending_since >= since and other is not inc):
                del self.incidents[fp]
                self._inhibited_fps.discard(fp)
                if other.announced and other.last is not None:
                    out.append(replace(other.last, status="resolved", ends_at=now,
                                       labels={**other.last.labels, **note}, cause=other.last.cause + tail))
        kept = self.closed.get(job or "", [])
        for item in list(kept):
            other, done = item
            if other.rule_id in rule.supersedes and other.pending_since >= since:
                kept.remove(item)
                out.append(replace(done, labels={**done.labels, **note}, cause=done.cause + tail))
        return out

    def _blamed_nodes(self, inc: Incident) -> set[str]:
        """The nodes an incident blames: its ``node`` label, else the nodes its ``gpu`` label, culprit
        (``node-03``, ``node-03/gpu2``, ``node-03/mlx5_0``, comma-separated) or culprit ranks lie on;
        empty for a job-wide finding.  Read by :meth:`_inhibited`.
        """
        if inc.labels.get("node"):
            return {inc.labels["node"]}
        culprit = inc.last.culprit if inc.last is not None else None
        nodes = set(self.topology.nodes())
        out = {c.strip().split("/", 1)[0] for c in (inc.labels.get("gpu", ""), *(culprit or "").split(","))}
        out &= nodes
        job = inc.labels.get("job")
        if not out and inc.last is not None and inc.last.ranks and job and self.topology.has_job(job):
            where = self.topology.job(job).ranks
            out = {where[r][0] for r in inc.last.ranks if r in where}
        return out

    def _groups(self, rule: Rule, ctx: Ctx, res: Result) -> list[tuple[dict[str, str], list[str]]]:
        """Split the culprit entities into incidents by the rule's ``group_by`` labels."""
        job = ctx.job
        base = {"job": job.job, "project": job.project}
        if not ctx.culprits:
            return [({k: base[k] for k in rule.group_by if k in base}, [])]
        groups: dict[tuple[tuple[str, str], ...], list[str]] = {}
        for e in ctx.culprits:
            labels = dict(base)
            node = ctx.node_of(e)
            if node != job.job:
                labels["node"] = node
                labels["switch"] = self.topology.leaf_of(node) or ""
                labels["rack"] = self.topology.rack_of(node) or ""
                pools = self.topology.pools_of(node)
                labels["pool"] = ctx.facts.get("pool") or (pools[0] if pools else "")
            if e.startswith(job.job + ":"):
                labels["rank"] = e.rsplit(":", 1)[1]
            if "/gpu" in e:
                labels["gpu"] = e
            key = tuple((k, labels.get(k, "")) for k in rule.group_by)
            groups.setdefault(key, []).append(e)
        return [(dict(k), v) for k, v in groups.items()]

    # ---- building the diagnosis ------------------------------------------------------------------

    def _diagnose(self, rule: Rule, ctx: Ctx, res: Result, inc: Incident, ents: list[str],
                  now: float) -> Diagnosis:
        job = ctx.job
        topo = self.topology
        ents = ents or list(ctx.culprits)
        ctx.culprits = ents or ctx.culprits
        nodes = sorted({ctx.node_of(e) for e in ents if ctx.node_of(e) != job.job})
        if ctx.culprit_level in ("rank", "gpu"):
            ranks = tuple(ctx.culprit_ranks())  # the culprit's own rank(s), not all of its node's
        else:
            ranks = tuple(sorted(r for r, (n, _) in job.ranks.items() if n in nodes))
        culprit = nodes[0] if len(nodes) == 1 else (", ".join(nodes) if nodes else None)
        if not ents or job.job in ents:
            evidence = list(res.evidence)  # the job itself is the culprit: every figure speaks to it
        else:
            ev_ents = set(ents) | set(nodes) | {job.job}
            evidence = [e for e in res.evidence if e.entity in ev_ents or ctx.node_of(e.entity) in nodes
                        or e.metric == "topology"]
        if ranks:
            path = tuple(topo.path_for_rank(job.job, ranks[0]))
        elif nodes:
            path = tuple(topo.path_for_node(nodes[0]))
        else:
            path = (f"job {job.job}",)
        for extra in rule.evidence:  # figures that round out the story, if present
            ectx = Ctx(self.store, now, job, topo, rule.id + "#evidence", self.cond_state, list(ctx.culprits),
                       ctx.culprit_level, {**ctx.facts, "incident_since": inc.pending_since,
                                          "cost_until": inc.cost_until})
            r = evaluate(extra, ectx)
            if r.holds:
                evidence += r.evidence
                for k, v in ectx.facts.items():
                    ctx.facts.setdefault(k, v)
        # One figure per metric and entity: two conditions over one metric (a rule's recent median and its
        # fastest of ten) gave each rank twice, with two thresholds and nothing to tell them apart.  The first
        # is kept: it is the one the templates read (``ev``).
        firsts: dict[tuple[str, str], Evidence] = {}
        for e in evidence:
            firsts.setdefault((e.metric, e.entity), e)
        evidence = list(firsts.values())
        cost = self._cost(inc, job, ctx.facts)
        ev_by_metric: dict[str, Evidence] = {}
        for e in evidence:
            ev_by_metric.setdefault(e.metric, e)
        tctx = {
            "job": job.job, "project": job.project, "team": job.team, "channel": job.channel,
            "job_name": getattr(job, "name", None), "culprit": culprit,
            "node": nodes[0] if nodes else None, "nodes": nodes,
            # the culprit's nodes that have sent no telemetry (steps only: an imported table, no agent there):
            # a text must not say their hardware was ruled out
            "unseen_nodes": [n for n in nodes if self.store.age("node.since_last_s", n, now) is None],
            # ...and the job's: a job-wide finding (no culprit) must not say its nodes were checked either
            "job_unseen_nodes": sorted({n for n, _ in job.ranks.values()
                                        if self.store.age("node.since_last_s", n, now) is None}),
            "rank": ranks[0] if ranks else None, "ranks": list(ranks), "n_ranks": len(job.ranks),
            # the culprit GPU when the incident is grouped by GPU (``group_by: [gpu]``); a topology predicate's
            # own ``gpu`` (in the facts below) wins.  It was only ``labels.gpu``, and ``{{ gpu }}``, which
            # `rules check` accepts, rendered empty.
            "gpu": inc.labels.get("gpu"),
            "switch": topo.leaf_of(nodes[0]) if nodes else None, "rack": topo.rack_of(nodes[0]) if nodes else None,
            "pools": sorted({p for n in nodes for p in topo.pools_of(n)}),
            "ev": ev_by_metric, "evidence": evidence, "path": list(path), "labels": inc.labels, **ctx.facts,
            "cost": cost,
        }
        clean: list[str] = []
        confidence = rule.confidence
        for check in rule.checks:
            cctx = Ctx(self.store, now, job, topo, rule.id + "#check", self.cond_state, list(ctx.culprits),
                       ctx.culprit_level)
            name = _render(check.name, tctx)
            if evaluate(check.when, cctx).holds:
                confidence -= 0.15  # a symptom that should be absent is present: the story is less certain
                evidence.append(Evidence("check", name, 1.0, note="also seen: " + name))
            elif not self._unmeasured(check.when, cctx, now):
                clean.append(name)
        if rule.culprit:  # place-level rules name their culprit: a switch, a pool, another job
            culprit = _render(rule.culprit, tctx) or culprit
        owner = Owner(job.project, job.team, job.channel)
        return Diagnosis(
            rule_id=rule.id, fingerprint=inc.fingerprint, status="firing", severity=rule.severity,  # type: ignore[arg-type]
            title=_render(rule.title, tctx), cause=_render(rule.cause, tctx), job=job.job, owner=owner,
            starts_at=inc.pending_since, detected_at=now,
            labels={**{k: (_render(v, tctx) if "{" in v else v) for k, v in rule.labels.items()}, **inc.labels,
                    # the name its users know the job by (Slurm's --job-name), shown beside the id
                    **({"job_name": str(tctx["job_name"])} if tctx["job_name"] else {})},
            evidence=tuple(evidence), topology_path=path, clean_checks=tuple(clean),
            confidence=round(max(0.05, min(1.0, confidence)), 2), next_step=_render(rule.next_step, tctx),
            culprit=culprit, ranks=ranks, runbook_url=rule.runbook_url, cost=cost,
        )

    def _cost(self, inc: Incident, job: Any, facts: dict[str, Any]) -> dict[str, float] | None:
        """Add the steps lost since the last tick to ``inc``'s running cost; return the cost figure.

        ``step_losses`` (end time, step time, seconds lost) come from the rule's step-aligned leaves
        (``what_if``, ``periodic``).  Each step counts once; on the first tick the leaves walk back
        to where the waiting began, so the figure covers the time before the rule fired.  Every GPU the
        job holds waits for the lost time, so GPU-hours are the lost seconds times the job's GPUs (a rank
        with part of a GPU counts its share).
        """
        losses = facts.get("step_losses")
        if losses is None:
            if inc.cost_until == -math.inf:
                return None
            losses = []  # no complete step this tick (a checkpoint, a late rank): the cost so far stands
        floor = self.counted_until.get(inc.fingerprint, -math.inf)
        for t, step_s, lost in sorted(losses):
            # Steps before the rule fired count too: the leaves walk back to where the waiting began,
            # but not over steps an earlier incident of the same fingerprint counted (a flapping fault).
            if t > inc.cost_until and t > floor:
                inc.cost_lost_s += lost
                inc.cost_until = t
                if lost > 0:
                    inc.cost_since = min(inc.cost_since, t)
                if lost > 0.02 * step_s:
                    inc.cost_last = max(inc.cost_last, t)
        if inc.cost_until > floor:
            self.counted_until[inc.fingerprint] = inc.cost_until
            if len(self.counted_until) > 4096:  # bounded: forget the oldest fingerprints
                for fp in sorted(self.counted_until, key=self.counted_until.__getitem__)[:1024]:
                    del self.counted_until[fp]
        coords = getattr(job, "coords", None) or {}
        gpus = sum(float((coords.get(r) or {}).get("gpu_share", 1.0)) for r in job.ranks)
        # Steps quicker than the job's past count negative (its noise sums to nothing), so the running sum
        # may dip below zero while nothing is lost: it is kept signed and shown as no loss.
        lost_s = max(0.0, inc.cost_lost_s)
        out = {"gpus": round(gpus, 3), "gpu_hours_lost": round(lost_s * gpus / 3600.0, 4), "lost_s": round(lost_s, 3)}
        if math.isfinite(inc.cost_since) and math.isfinite(inc.cost_last) and inc.cost_last >= inc.cost_since:
            out["lost_from"], out["lost_until"] = inc.cost_since, inc.cost_last  # where the loss lies (event time)
        for k in ("step_s", "whatif_step_s", "slowdown_pct"):
            if facts.get(k) is not None:
                out[k] = facts[k]
        return out

    def _still_unknown(self, inc: Incident, rule: Rule, now: float) -> bool:
        """Whether a restored incident's condition cannot be judged yet at ``now``.

        True until ``warmup_for(rule)`` of event time has passed since the first tick after the
        restore, and while a node the incident blames has not reported over that whole span since
        the restore (its agent or topic is not caught up: absent data is not a clear signal).
        """
        if self.restored_at is None:
            return True
        warm = self.warmup_for(rule)
        if now - self.restored_at < warm:
            return True
        if now - self.restored_at >= self.warmup_max_s:
            return False  # a node that never comes back (drained, the job gone) cannot hold it forever
        for node in self._blamed_nodes(inc):
            seen = self.store.node_seen.get(node)
            if seen is None:
                return True
            i = bisect.bisect_right(seen.t, self.restored_at)
            if i >= len(seen.t) or seen.t[i] > now - warm + self.step_s or seen.t[-1] < now - warm:
                return True
        return False

    def warmup_for(self, rule: Rule) -> float:
        """Event time a restored incident of ``rule`` is held after a restart before it may resolve.

        ``warmup_s`` when set; otherwise the longest recent window of the rule's conditions plus its
        ``for``: by then every window the rule reads holds only data seen since the restart.
        """
        if self.warmup_s is not None:
            return self.warmup_s
        return min(self.warmup_max_s, _longest_window(rule.when) + rule.for_s + self.step_s)

    # ---- durable state ---------------------------------------------------------------------------

    def snapshot(self) -> dict[str, Any]:
        """Return the incident lifecycle state as JSON-ready data (checkpointed by the engine)."""
        return {"next_tick": self.next_tick,
                # frozen self-history baselines: without them a restart mid-fault would compare the
                # fault with itself and resolve it
                "cond_state": [[list(k), v] for k, v in self.cond_state.items()
                               if isinstance(v, (int, float))],
                "incidents": [
            {"rule_id": i.rule_id, "fingerprint": i.fingerprint, "labels": i.labels,
             "pending_since": i.pending_since, "last_true": i.last_true, "firing": i.firing,
             "announced": i.announced, "last": i.last.to_dict() if i.last else None,
             "cost_lost_s": i.cost_lost_s, "cost_until": i.cost_until if math.isfinite(i.cost_until) else None,
             "cost_since": i.cost_since if math.isfinite(i.cost_since) else None,
             "cost_last": i.cost_last if math.isfinite(i.cost_last) else None}
            for i in self.incidents.values()],
                "counted_until": self.counted_until}

    def restore(self, snap: dict[str, Any]) -> None:
        """Reload :meth:`snapshot` output, so a restarted engine neither re-fires nor forgets to resolve.

        The windows themselves are not in the snapshot: each restored incident is held (neither
        resolved nor dropped) until its rule's windows have refilled with event time seen since the
        restart (:meth:`warmup_for`); a condition that holds again in the meantime updates it as usual.
        """
        for k, v in snap.get("cond_state", ()):
            key = tuple(tuple(x) if isinstance(x, list) else x for x in k)
            self.cond_state[key] = v
        for d in snap.get("incidents", ()):
            last = Diagnosis.from_dict(d["last"]) if d.get("last") else None
            inc = Incident(d["rule_id"], d["fingerprint"], d["labels"], d["pending_since"], d["last_true"],
                           d["firing"], d["announced"], last=last, restored=True,
                           cost_lost_s=float(d.get("cost_lost_s") or 0.0),
                           cost_until=float(d["cost_until"]) if d.get("cost_until") is not None else -math.inf,
                           cost_since=float(d["cost_since"]) if d.get("cost_since") is not None else math.inf,
                           cost_last=float(d["cost_last"]) if d.get("cost_last") is not None else -math.inf)
            if last is not None:
                inc.signature = _signature(last)
            self.incidents[inc.fingerprint] = inc
        self.counted_until.update({str(k): float(v) for k, v in (snap.get("counted_until") or {}).items()})
        self._restoring = bool(self.incidents)
        self.restored_at = None


# Parameters that count a window in points (steps) rather than seconds: a leaf with any of them set may
# read further back than its durations say (a job with 40 s steps), so its metrics get no span.
_POINT_COUNTS = ("steps", "baseline_steps", "history", "count", "min_segment", "min_baseline_points")


@cache
def _durations(params_type: type) -> tuple[str, ...]:
    """The fields of a condition type's parameters that are durations (declared ``Duration``)."""
    hints = typing.get_type_hints(params_type, include_extras=True)
    return tuple(f.name for f in dataclass_fields(params_type)
                 if any(isinstance(m, Kind) and m.text == "duration"
                        for m in getattr(hints.get(f.name), "__metadata__", ())))


def rule_spans(rules: Iterable[Rule]) -> dict[str, float]:
    """The longest window any rule reads of each metric its conditions name (``when``, evidence, checks).

    Called by the evaluator whenever its rule set changes, beside ``rule_metrics``: the store sizes
    each metric's rings to this (:meth:`MetricStore.set_spans`).  A leaf's window is the longest of
    its duration parameters (window, baseline, ...), plus its rule's ``every`` (an incident's onset is
    looked for that far back: :meth:`Evaluator._onsets`).  Left out, so that they keep full rings: metrics
    the engine's own code reads (:data:`IMPLICIT_METRICS`) and those of a leaf that counts its window in
    points too (``steps``, ``baseline_steps``, ...), whose reach depends on how long the job's steps are.
    """
    spans: dict[str, float] = {}
    unbounded: set[str] = set(IMPLICIT_METRICS)
    for rule in rules:
        for params, names in rule_leaves([rule]):
            if any(getattr(params, n, 0) for n in _POINT_COUNTS):
                unbounded |= names
                continue
            kind: Any = type(params)  # a frozen dataclass type: hashable, as the cache needs
            reach = max((float(getattr(params, n) or 0.0) for n in _durations(kind)), default=0.0)
            # A rule with an ``every`` is judged again up to ``every`` back when it opens an incident.
            reach += float(getattr(rule, "every_s", 0.0) or 0.0)
            for m in names:
                spans[m] = max(spans.get(m, 0.0), reach)
    return {m: w for m, w in spans.items() if m not in unbounded}


def _longest_window(node: Any) -> float:
    """The longest recent window (or an absence's ``for``) a condition tree reads.

    Baselines are left out: a self-history baseline of an anomalous entity is frozen while the
    incident holds and travels in the checkpoint (``cond_state``), so a restored incident is judged
    against it as soon as its recent window has refilled.
    """
    if isinstance(node, Condition):
        return node.params.recent_s()
    items = getattr(node, "items", None)
    if items is not None:
        return max((_longest_window(i) for i in items), default=0.0)
    inner = getattr(node, "item", None)
    return _longest_window(inner) if inner is not None else 0.0


_stuck_logged = [0]


def _stuck_clock(now: float, step_s: float) -> None:
    """Log (the first 10 times, then every 1000th) that event time is too large for a tick to move it."""
    _stuck_logged[0] += 1
    if _stuck_logged[0] <= 10 or _stuck_logged[0] % 1000 == 0:
        log.error("event time %.17g is too large for a %gs tick to move the clock: no tick runs past it", now, step_s)


def due(rule: Rule, now: float, step_s: float = 1.0) -> bool:
    """Whether the tick at event time ``now`` evaluates ``rule``: always, unless the rule has an ``every``;
    then only the tick whose step (``(now - step_s, now]``) holds a multiple of it (``now % every == 0``
    with the usual 1 s ticks).

    A function of event time alone, so a replay evaluates a rule on the very ticks the live engine did,
    whenever either started.
    """
    every = rule.every_s
    if every <= step_s:
        return True
    return math.floor((now + 1e-6) / every) > math.floor((now - step_s + 1e-6) / every)


def _signature(d: Diagnosis) -> tuple[Any, ...]:
    """What makes an incident's update worth announcing: severity, ranks, culprit, evidence entities.

    The cost figure (``job.step_s``, from ``what_if``) moves with every step and comes and goes with
    the steps at hand; it is carried by each diagnosis but is no change of the incident.  The evidence
    entities are a set: their order (stragglers by ratio) moves with every step on a noisy job, and an
    incident of eight slow ranks was announced again 186 times in 300 steps for it.
    """
    return (d.severity, d.ranks, d.culprit,
            tuple(sorted({e.entity for e in d.evidence if e.metric != "job.step_s"})))


def _fingerprint(rule_id: str, labels: dict[str, str]) -> str:
    raw = rule_id + "|" + "|".join(f"{k}={v}" for k, v in sorted(labels.items()))
    return hashlib.sha1(raw.encode()).hexdigest()[:16]
