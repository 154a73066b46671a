"""Decode → evaluate → outputs, for one polled batch of Kafka records.

The stream layer (faust) calls :meth:`Processor.process` with each batch it takes
from the input topics; this class decodes and validates every value against the
event contract, feeds the valid ones to the pure :class:`Evaluator`, and returns
what must be published: diagnoses, and dead letters for the messages that broke
the contract.  It imports neither faust nor aiokafka, so it is unit-tested with
plain bytes.
"""

from __future__ import annotations

import base64
import hashlib
import json
import logging
import math
import re
import time
from collections import Counter
from dataclasses import dataclass, field
from typing import Any, Callable, Iterable, Mapping

from whywait.agents.events import NODE_KINDS, ContractError, decode
from whywait.engine.diagnosis import Diagnosis
from whywait.engine.evaluate.evaluator import Evaluator
from whywait.topology.errors import TopologyError
from whywait.topology.model import node_name_in

log = logging.getLogger(__name__)



_UNIX_USER = re.compile(r"^([A-Za-z_][A-Za-z0-9_.-]*\$?)(?:\((\d+)\))?$")


def _unix_user(user: str | None) -> tuple[str, int | None] | None:
    """A placement's ``user`` as (name, uid or None) when it names a Unix user (``alice``, Slurm's
    ``alice(1000)``); None for anything else (a Kubernetes service account), which is not checked."""
    m = _UNIX_USER.match(user or "")
    return (m.group(1), int(m.group(2)) if m.group(2) else None) if m else None


# Distinct unknown node names logged (once each) by one processor: a producer can invent names without end.
_LOGGED_UNKNOWN_MAX = 1000
# Event seconds a job's steps may come before a placement names it, before the engine says so (a hook run late).
UNPLACED_GRACE_S = 60.0


@dataclass(frozen=True)
class Record:
    """One consumed Kafka record, as the stream layer hands it over."""

    topic: str
    value: bytes | None
    key: bytes | None = None
    partition: int = 0
    offset: int = -1
    timestamp_ms: int | None = None  # broker/producer timestamp, used only for latency figures


@dataclass
class Output:
    """What one batch produced."""

    diagnoses: list[Diagnosis] = field(default_factory=list)
    dead_letters: list[tuple[bytes, bytes]] = field(default_factory=list)  # (key, value) for the DLQ topic
    # The partitioned engine's router: (partition, key, value, event time ms, source topic, producer
    # time ms or None) for the repartition topic (the source topic travels in a header: the value is
    # decoded against it; the producer's time too, for latency figures).
    # The last item names the source record when it was copied to more than one partition (else None).
    forwards: list[tuple[int, bytes, bytes, int, str, int | None, str | None]] = field(default_factory=list)


# The dead-letter record must always fit in one produce request (aiokafka's ``max_request_size``
# is 1 MiB): the original is kept up to this many bytes, with its full size and SHA-256, so a
# 2 MB bad message is still traceable without being able to block the topic.
DLQ_ORIGINAL_MAX = 64 << 10
REASON_MAX = 2000


def dead_letter(rec: Record, reason: str, category: str = "contract") -> tuple[bytes, bytes]:
    """Build the dead-letter message for ``rec``: the reason, and the original (cut to fit) with its checksum.

    ``value`` holds the original as text when it is UTF-8 (else ``value_base64``), cut to
    ``DLQ_ORIGINAL_MAX`` bytes; ``value_bytes`` and ``value_sha256`` describe the whole original,
    and ``value_truncated`` says whether it was cut.  The result is at most a few hundred KiB
    whatever came in (worst case: every kept byte escaped as ``\\u00XX``).
    """
    raw = rec.value or b""
    kept = raw[:DLQ_ORIGINAL_MAX]
    try:
        raw.decode()
        text: str | None = kept.decode(errors="ignore")  # a cut may split the last character only
        b64 = None
    except UnicodeDecodeError:
        text, b64 = None, base64.b64encode(kept).decode()
    key = rec.key.decode(errors="replace")[:1000] if rec.key else None
    body = {"schema": 1, "kind": "dead_letter", "time": time.time(), "source_topic": rec.topic,
            "partition": rec.partition, "offset": rec.offset, "reason": reason[:REASON_MAX],
            "category": category, "value": text, "value_base64": b64, "value_bytes": len(raw),
            "value_sha256": hashlib.sha256(raw).hexdigest(), "value_truncated": len(raw) > len(kept), "key": key}
    return rec.topic.encode(), json.dumps(body, separators=(",", ":")).encode()


class Processor:
    """Holds the evaluator and counts what passed through it.

    Every record consumed ends in exactly one counter: ``messages`` (evaluated), ``dead_letters``
    (with ``dead_letters.<category>`` beside it), ``tombstones`` or ``skipped_before_start``.
    """

    def __init__(self, evaluator: Evaluator, not_before: float | None = None,
                 wall_clock: Callable[[], float] = time.time) -> None:
        self.evaluator = evaluator
        # Messages older than this event time are skipped (counted): a replay or demo that
        # shares topics with earlier runs starts from a point in event time, not an offset.
        self.not_before = not_before
        self.wall_clock = wall_clock
        self.counts: Counter[str] = Counter()
        # fingerprint -> producer timestamp (ms) of the record whose arrival made the diagnosis
        # possible: the start of the wall-clock latency (event produced -> Slack post).
        self.trigger_ms: dict[str, int] = {}
        self.owners: dict[str, str] = {}  # job -> the user its placement says it runs as
        self.firing: set[str] = set()  # fingerprints announced firing and not yet resolved (counted once)
        self.routed_to: dict[tuple[str, int], int] = {}  # router: (topic, partition) -> last offset routed
        self.routed_time: dict[tuple[str, int], float] = {}  # router: (topic, partition) -> newest event time forwarded
        self.unknown_nodes: set[str] = set()  # node names whose telemetry was dead-lettered, logged once each
        # job -> event time of its first steps while no placement named it (bounded); and those logged
        self.unplaced: dict[str, float] = {}
        self.unplaced_logged: set[str] = set()

    def process(self, records: Iterable[Record]) -> Output:
        """Decode and evaluate one batch; return diagnoses and dead letters, in order.

        Never raises for a record: whatever one record does (breaks the contract, names an unknown
        node, stamps a wrong time, trips a bug) costs that record only, which goes to the dead-letter
        topic with its reason; the rest of the batch is evaluated.
        """
        out = Output()
        self.evaluator.begin_batch()
        wall = self.wall_clock()
        for rec in records:
            self.counts["records"] += 1
            self.counts[f"topic.{rec.topic}"] += 1
            if rec.value is None:  # a tombstone on a compacted topic: nothing to evaluate
                self.counts["tombstones"] += 1
                continue
            try:
                self._one(rec, wall, out)
            except Exception as exc:  # noqa: BLE001 - a bug must cost one record, never the batch
                log.exception("record %s[%d]@%d failed", rec.topic, rec.partition, rec.offset)
                self._dead(out, rec, f"internal error: {type(exc).__name__}: {exc}", "internal")
        try:
            out.diagnoses += self.evaluator.catch_up()
            out.diagnoses += self.evaluator.clock_diagnoses(wall)
            out.diagnoses += self.evaluator.duplicate_diagnoses()
        except Exception:  # noqa: BLE001 - a tick that fails is logged; the next batch tries again
            log.exception("evaluation after the batch failed")
            self.counts["errors.batch_end"] += 1
        self.counts["diagnoses"] += len(out.diagnoses)
        for d in out.diagnoses:  # per rule, for /metrics: an incident counts once when it fires and once resolved
            if d.status == "firing" and d.fingerprint not in self.firing:
                self.firing.add(d.fingerprint)
                self.counts[f"fired.{d.rule_id}"] += 1
            elif d.status == "resolved":
                self.firing.discard(d.fingerprint)
                self.counts[f"resolved.{d.rule_id}"] += 1
        return out

    def _one(self, rec: Record, wall: float, out: Output) -> None:
        assert rec.value is not None
        try:
            msg = decode(rec.value, rec.topic)
        except ContractError as exc:
            self._dead(out, rec, str(exc), "contract")
            return
        if self.not_before is not None and msg["time"] < self.not_before:
            self.counts["skipped_before_start"] += 1
            return
        if msg["kind"] in NODE_KINDS:
            node = node_name_in(self.evaluator.topology, msg["node"])
            if node is None:
                # Telemetry no rule can use; kept out of the store so invented node names cannot grow it.
                self._unknown_node(out, rec, self.evaluator.topology, msg["node"])
                return
            if node is not msg["node"]:  # the agent's name for a host the topology names otherwise
                msg = {**msg, "node": node}
        why = self.evaluator.admit(msg, wall)
        if why is not None:
            self._dead(out, rec, why, "too_far_ahead" if "ahead" in why else "too_late")
            return
        if msg["kind"] in ("steps", "checkpoint"):
            why = self._sender_problem(msg)
            if why is not None:
                self._dead(out, rec, why, "sender")
                return
            if msg["kind"] == "steps":
                self._note_unplaced(msg)
        try:
            diags = self.evaluator.ingest(msg)
        except TopologyError as exc:  # e.g. a placement on a node the topology does not hold
            self._dead(out, rec, f"topology: {exc}", "topology")
            return
        if msg["kind"] == "placement":
            self._note_owner(msg)
        self.counts["messages"] += 1
        self.counts[f"kind.{msg['kind']}"] += 1
        if diags and rec.timestamp_ms is not None:
            for d in diags:
                self.trigger_ms[d.fingerprint] = rec.timestamp_ms
        out.diagnoses += diags

    # ---- the partitioned engine (engine/stream/partitioning.py) ----------------------------------

    def route(self, records: Iterable[Record], partitions: int) -> Output:
        """The router stage: validate each input record and say where it is forwarded.

        Every record ends in exactly one ``route.*`` counter: ``route.forwarded`` (with
        ``route.copies`` counting the records sent), ``route.placements`` (applied by every
        worker's placement table, not forwarded), ``route.tombstones``, ``route.skipped_before_start``
        or ``dead_letters`` (contract, unknown node: dead-lettered here, once).  So the inputs
        consumed are ``route.records`` == forwarded + placements + tombstones + skipped + dead letters.
        A record delivered again at an offset this worker has routed already (the group resumed
        from its last commit) is counted as ``route.redelivered`` only.
        """
        from whywait.engine.stream.partitioning import routes

        out = Output()
        topo = getattr(self.evaluator.topology, "base", self.evaluator.topology)
        for rec in records:
            if rec.offset >= 0:
                last = self.routed_to.get((rec.topic, rec.partition), -1)
                if rec.offset <= last:
                    # Delivered again (the group re-read from its last commit after a broker restart or
                    # a rebalance): forwarded already by this worker, counted apart, not twice.
                    self.counts["route.redelivered"] += 1
                    continue
                self.routed_to[(rec.topic, rec.partition)] = rec.offset
            self.counts["route.records"] += 1
            if rec.value is None:
                self.counts["route.tombstones"] += 1
                continue
            try:
                msg = decode(rec.value, rec.topic)
            except ContractError as exc:
                self._dead(out, rec, str(exc), "contract")
                continue
            except Exception as exc:  # noqa: BLE001 - a bug must cost one record, never the batch
                self._dead(out, rec, f"internal error: {type(exc).__name__}: {exc}", "internal")
                continue
            if msg["kind"] == "placement":
                self.counts["route.placements"] += 1
                continue
            if self.not_before is not None and msg["time"] < self.not_before:
                self.counts["route.skipped_before_start"] += 1
                continue
            if msg["kind"] in NODE_KINDS:
                node = node_name_in(topo, msg["node"])
                if node is None:
                    self._unknown_node(out, rec, topo, msg["node"])
                    continue
                if node is not msg["node"]:  # routed by the topology's name (the worker renames it again)
                    msg = {**msg, "node": node}
            where = routes(msg, topo, partitions)
            t_ms = int(float(msg["time"]) * 1000)
            if t_ms / 1000 > self.routed_time.get((rec.topic, rec.partition), float("-inf")):
                self.routed_time[(rec.topic, rec.partition)] = t_ms / 1000
            # A message copied to several partitions names its source, so a worker that owns more
            # than one of them ingests it once (engine/stream/scaleout.py drops the later copies).
            src = f"{rec.topic}/{rec.partition}/{rec.offset}" if len(where) > 1 else None
            for part, key in where.items():
                out.forwards.append((part, key.encode(), rec.value, t_ms, rec.topic, rec.timestamp_ms, src))
            self.counts["route.forwarded"] += 1
            self.counts["route.copies"] += len(where)
        return out

    def restore(self, values: Iterable[tuple[str, bytes | None]]) -> int:
        """Put re-read history (``(topic, value)`` pairs) into the metric store only; return how many.

        Called when a worker gains partitions: the window before the committed offset was evaluated
        by the previous owner already, so it only refills the windows (no ticks, no diagnoses, no
        dead letters: the router judged these messages once).  History older than ``not_before`` is
        skipped (``restore.skipped_before_start``), as the router and the evaluate stage skip it: the
        window is found by offsets, and on topics shared with earlier runs (the tests, a demo, a
        replay) it held an earlier run's telemetry.  Stored, that made every node of the gained jobs
        look reported days ago, and the store's telemetry start days old, so a node whose first
        telemetry of this run was still on its way through another worker's router was judged
        unseen at the first tick (``job.node-unseen`` on node-06, "nothing from it for 172,681 s").
        """
        ev = self.evaluator
        topo = ev.topology
        n = 0
        for topic, value in values:
            if value is None:
                continue
            try:
                msg = decode(value, topic)
                if self.not_before is not None and msg["time"] < self.not_before:
                    self.counts["restore.skipped_before_start"] += 1
                    continue
                if msg["kind"] in NODE_KINDS:
                    node = node_name_in(topo, msg["node"])
                    if node is not None and node is not msg["node"]:
                        msg = {**msg, "node": node}
                if msg["kind"] == "net" and topo is not None:
                    msg = topo.canonical_net(msg)
                elif msg["kind"] == "gpu" and topo is not None:
                    msg = topo.canonical_gpu(msg)
                ev.store.ingest(msg)
                n += 1
            except Exception:  # noqa: BLE001 - history that cannot be read is skipped, counted
                self.counts["restore.skipped"] += 1
        self.counts["restore.records"] += n
        return n

    def apply_placement(self, msg: Mapping[str, Any]) -> None:
        """Apply one valid placement from the global placement table (every worker reads it whole)."""
        self.evaluator.topology.apply_placement(msg)
        self._note_owner(msg)

    def _note_owner(self, msg: Mapping[str, Any]) -> None:
        job = str(msg["job"])
        if msg.get("state") == "finished" or not isinstance(msg.get("user"), str):
            self.owners.pop(job, None)
        elif job in self.owners or len(self.owners) < 100_000:
            self.owners[job] = msg["user"]

    def _sender_problem(self, msg: Mapping[str, Any]) -> str | None:
        """Why a job's timings cannot be trusted (None: they can), judged against its placement.

        The node agent names the user who sent a job's timings (``sender_user``, from the kernel's
        credentials) and is the node the timings come from: a rank placed on another node, or a
        sender other than the placement's ``user`` (root excepted), means someone reports for a
        job that is not theirs, and the timings would blame an innocent rank.
        """
        job = str(msg["job"])
        owner = _unix_user(self.owners.get(job))
        if owner is not None:
            name, uid = owner
            s_name, s_uid = msg.get("sender_user"), msg.get("sender_uid")
            if isinstance(s_uid, int) and uid is not None:
                bad = s_uid not in (uid, 0)
            else:
                bad = isinstance(s_name, str) and s_name not in (name, "root")
            if bad:
                who = s_name if isinstance(s_name, str) else f"uid {s_uid}"
                return (f"job {job[:80]}: timings sent by user {str(who)[:40]!r}, but its placement runs it as "
                        f"{self.owners[job][:60]!r}")
        topo = self.evaluator.topology
        if msg["kind"] != "steps" or not getattr(topo, "has_job", lambda _j: False)(job):
            return None
        ranks = topo.job(job).ranks
        for s in msg["steps"]:
            placed = ranks.get(s["rank"])
            reporter = s.get("node") or msg["node"]
            # the agent may name its host otherwise than the placement (node01.cluster.local / node01)
            if placed is not None and placed[0] != reporter and placed[0] != node_name_in(topo, reporter):
                return (f"job {job[:80]}: rank {s['rank']} runs on {placed[0]}, but {str(reporter)[:80]} reported "
                        "its timings")
        return None

    def _note_unplaced(self, msg: Mapping[str, Any]) -> None:
        """Say once (in the log, and ``steps_unplaced_jobs``) when a job's steps have come for
        :data:`UNPLACED_GRACE_S` of event time and no placement names the job.

        No rule judges a job without a placement, so its steps are kept for nothing; the usual cause is
        a training script whose ``Reporter(job=...)`` is not the id its scheduler hook publishes
        (``slurm-777``).  The grace lets a placement that comes after the first steps (a hook run late,
        an engine reading a backlog) arrive first.
        """
        job = str(msg["job"])
        topo = self.evaluator.topology
        if job in self.unplaced_logged or getattr(topo, "has_job", lambda _j: True)(job):
            return
        t = float(msg["time"])
        first = self.unplaced.get(job)
        if first is None:
            if len(self.unplaced) < _LOGGED_UNKNOWN_MAX:
                self.unplaced[job] = t
            return
        if t - first < UNPLACED_GRACE_S:
            return
        self.unplaced_logged.add(job)
        self.counts["steps_unplaced_jobs"] += 1
        placed = [j.job for j in topo.jobs()] if hasattr(topo, "jobs") else []
        shown = ", ".join(placed[:5]) + (f" and {len(placed) - 5} more" if len(placed) > 5 else "")
        log.warning("steps of job %s (from %s) have come for %.0f s, but no placement names that job, so no rule "
                    "judges it: the training's Reporter must name the job as its placement does (placed now: %s; "
                    "under Slurm, Reporter() takes slurm-$SLURM_JOB_ID, as `whywait placement slurm` publishes it)",
                    job[:80], str(msg["node"])[:80], t - first, shown or "none")

    def _unknown_node(self, out: Output, rec: Record, topology: Any, node: Any) -> None:
        """Dead-letter telemetry from a node the topology does not hold, saying which names it holds instead.

        Each distinct name is also logged once (bounded): an agent whose ``--node`` is not the topology's
        name loses all its telemetry, and the engine's log is where its operator looks first.
        """
        name = str(node)
        explain = getattr(topology, "unknown_node_reason", None)
        reason = explain(name) if explain is not None else f"{name[:80]!r} is not in the topology"
        self._dead(out, rec, f"node: {reason}", "unknown_node")
        if name not in self.unknown_nodes and len(self.unknown_nodes) < _LOGGED_UNKNOWN_MAX:
            self.unknown_nodes.add(name)
            log.warning("telemetry from node %s is dead-lettered: %s", name[:80], reason)

    def _dead(self, out: Output, rec: Record, reason: str, category: str) -> None:
        self.counts["dead_letters"] += 1
        self.counts[f"dead_letters.{category}"] += 1
        out.dead_letters.append(dead_letter(rec, reason, category))

    def stats(self) -> dict[str, Any]:
        """Counters for the log and the engine's health line."""
        return dict(self.counts)

    def summary(self, before: Mapping[str, int] | None = None) -> str:
        """The engine's periodic log line, for an operator: what was evaluated, up to which event time,
        how many jobs and open incidents, and what was dead-lettered (by reason).

        ``before`` is the counters of the previous line (``stats()``), to say what changed since.
        Called by the engine's checkpoint timer; the raw counters go to the debug log.
        """
        c = self.counts
        done = f"{c['messages']:,} message(s) evaluated"
        if before is not None:
            done += f" (+{c['messages'] - int(before.get('messages', 0)):,})"
        t = getattr(self.evaluator, "next_tick", None)
        at = (time.strftime("%H:%M:%S UTC", time.gmtime(t)) if isinstance(t, (int, float)) and math.isfinite(t)
              and 0 <= t < 1e11 else "not started")
        topo = self.evaluator.topology
        jobs = len(topo.jobs()) if hasattr(topo, "jobs") else 0
        parts = [done, f"event time {at}", f"{jobs:,} job(s) placed", f"{len(self.firing):,} incident(s) firing"]
        dead = {k.split(".", 1)[1]: v for k, v in c.items() if k.startswith("dead_letters.") and v}
        if dead:
            parts.append(f"{c['dead_letters']:,} dead-lettered (" +
                         ", ".join(f"{k} {v:,}" for k, v in sorted(dead.items(), key=lambda kv: -kv[1])) + ")")
        return "; ".join(parts)
