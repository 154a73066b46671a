"""The partitioned pipeline's faust wiring: route, evaluate, placement table, per-job checkpoints.

Called by :func:`whywait.engine.stream.app.build_app` when ``EngineConfig.partitions`` > 1 (the
design is in ``engine/stream/partitioning.py``).  One worker process runs both stages; the
consumer group splits the input partitions (routing) and the repartition topic's partitions
(evaluation) between the workers independently.

On every rebalance (faust's are eager: everything is revoked, then the new set assigned):

- before the revoke, each owned job's incidents are checkpointed under their own key;
- after the assignment, the jobs of lost partitions are forgotten (not resolved: their new owner
  continues them), and for each gained partition the worker re-reads the last window of event
  time before the group's committed offset into its store (:func:`~.tables.read_window`) and
  restores the gained jobs' incidents from their checkpoints (:func:`~.tables.read_job_states`),
  *before* it consumes the partition.  A restored incident keeps its announced state, so the new
  owner does not announce it again; it updates or resolves it like its own.
"""

from __future__ import annotations

import itertools
import json
import logging
import time
from typing import Any, Awaitable, Callable

import faust
from faust.types import TP
from whywait.agents.events import NODE_KINDS, TOPIC_PLACEMENT, TOPICS, kind_for_topic
from whywait.engine.stream import batches
from whywait.engine.stream.partitioning import (
    HeldOffsets,
    ReorderBuffer,
    drop_jobs,
    is_empty,
    partition_for,
    split_snapshot,
)
from whywait.engine.stream.processor import Processor, Record
from whywait.engine.stream.tables import PlacementTable, job_state_key, read_job_states, read_notify_state, read_window
from whywait.engine.stream.topics import TOPIC_BY_JOB

from whywait import jsonl

log = logging.getLogger(__name__)

# A copied message's source (topic/partition/offset), in a header of each copy.
COPY_HEADER = "whywait-copy-of"
# A router's progress marker on the repartition topic (not a message; see ReorderBuffer.progress).
PROGRESS_HEADER = "whywait-progress"
# The inputs that arrive steadily while a job runs: the reorder buffer waits for them.
STEADY_KINDS = frozenset({t.kind for t in TOPICS if t.periodic} | {"steps"})


class ScaleOut:
    """One worker's share of the partitioned pipeline (made by :func:`wire`)."""

    def __init__(self, app: faust.App, cfg: Any, processor: Processor, state_topic: Any,
                 notifier: Any = None) -> None:
        self.app = app
        self.notifier = notifier
        self.cfg = cfg
        self.processor = processor
        self.state_topic = state_topic
        self.owned = processor.evaluator.topology  # an OwnedTopology (engine_cmd builds it)
        if not hasattr(self.owned, "owned"):
            raise TypeError("the partitioned engine needs its evaluator on an OwnedTopology")
        self.table = PlacementTable(cfg.bootstrap, processor.apply_placement, not_before=processor.not_before)
        self.written: dict[str, str] = {}  # job -> the checkpoint last written for it
        self.restored_copies: set[bytes] = set()  # during one restore: copied messages taken already
        self.received: dict[int, int] = {}  # partition of the repartition topic -> last offset received here

    @property
    def caught_up(self) -> bool:
        """Whether the placement table has read every placement published so far."""
        return self.table.caught_up

    async def checkpoint(self) -> None:
        """Write the incident checkpoint of every owned job whose state changed (a tombstone when empty).

        A failure (the broker away) is logged, never raised: the next checkpoint writes what changed.
        """
        try:
            await self._checkpoint()
        except Exception as exc:  # noqa: BLE001 - a timer that raises would stop the worker
            log.error("engine: checkpoint failed: %s: %s", type(exc).__name__, exc)

    async def _checkpoint(self) -> None:
        ev = self.processor.evaluator
        owns = self.owned.owns
        here = [j.job for j in self.owned.jobs()]
        log.info("engine: %s; placements applied %d; jobs on this worker: %s", self.processor.summary(),
                 self.table.applied, ", ".join(here[:10]) + (f" and {len(here) - 10} more" if len(here) > 10 else "")
                 if here else "none", extra={"counters": self.processor.stats()})  # for scripts: the JSON log
        snap = ev.snapshot()
        jobs = {j.job for j in self.owned.jobs()}
        jobs |= {j for j in self.written if owns(j)}
        jobs |= {i["labels"]["job"] for i in snap["incidents"] if i["labels"].get("job") and owns(i["labels"]["job"])}
        for job, part in split_snapshot(snap, self.owned.base, jobs).items():
            body = "" if is_empty(part) else json.dumps(part, default=str, sort_keys=True)
            if body == self.written.get(job, ""):
                continue
            await self.state_topic.send(key=job_state_key(self.cfg.group_id, job),
                                        value=body.encode() if body else None)
            if body:
                self.written[job] = body
            else:
                self.written.pop(job, None)

    async def refill_gaps(self, kept: frozenset[int]) -> None:
        """Re-read into the store what another worker consumed of a partition this one keeps.

        Why: with a worker pausing (a busy machine misses heartbeats), the group can give its partitions
        to another worker and back within seconds; that worker consumes and commits meanwhile, and this
        one resumes at its commit.  The records in between (from our last received offset to that
        commit) were never seen here, and the windows of this worker's jobs would keep a hole.
        """
        from aiokafka import TopicPartition
        from whywait.engine.stream.tables import committed_offsets, read_range

        mine = {TopicPartition(TOPIC_BY_JOB, p): off for p, off in self.received.items() if p in kept}
        if not mine:
            return
        try:
            committed = await committed_offsets(self.cfg.bootstrap, self.cfg.group_id, list(mine))
            ranges = {tp: (mine[tp] + 1, c) for tp, c in committed.items() if c > mine[tp] + 1}
            if not ranges:
                return
            self.restored_copies = set()
            n = await read_range(self.cfg.bootstrap, ranges, self._restore)
        except Exception as exc:  # noqa: BLE001 - the broker away: evaluate on, with the hole
            log.error("engine: could not re-read what another worker took of %s: %s: %s", sorted(kept),
                      type(exc).__name__, exc)
            return
        for tp, (_, end) in ranges.items():
            self.received[tp.partition] = max(self.received.get(tp.partition, -1), end - 1)
        log.info("engine: re-read %d record(s) another worker consumed meanwhile of %s", n,
                 ", ".join(f"{TOPIC_BY_JOB}[{tp.partition}]@{a}..{b}" for tp, (a, b) in sorted(ranges.items())))

    async def assigned(self, tps: Any) -> None:
        """Take the new assignment: forget lost jobs, refill and restore gained ones."""
        new = frozenset(tp.partition for tp in tps if tp.topic == TOPIC_BY_JOB)
        old = self.owned.owned
        gained, lost = new - old, old - new
        self.owned.owned = new
        kept = new & old
        if kept:
            await self.refill_gaps(kept)
        if lost:
            n = drop_jobs(self.processor.evaluator, self.owned.owns)
            self.written = {j: b for j, b in self.written.items() if self.owned.owns(j)}
            log.info("engine: handed over %d partition(s) of %s and %d open incident(s)", len(lost), TOPIC_BY_JOB, n)
        if not gained:
            return
        from aiokafka import TopicPartition

        window = self.cfg.restore_window_s
        if window is None:
            window = float(self.processor.evaluator.store.retention_s)
        tpl = [TopicPartition(TOPIC_BY_JOB, p) for p in sorted(gained)]
        self.restored_copies = set()
        try:
            n = await read_window(self.cfg.bootstrap, self.cfg.group_id, tpl, window, self._restore)
            mine = lambda j: partition_for(j, self.cfg.partitions) in gained  # noqa: E731
            states = await read_job_states(self.cfg.bootstrap, self.cfg.group_id, mine) \
                if self.cfg.restore_state else {}
            adopted = 0
            if self.cfg.restore_state and self.notifier is not None and hasattr(self.notifier, "adopt"):
                adopted = self.notifier.adopt(await read_notify_state(self.cfg.bootstrap, mine))
        except Exception as exc:  # noqa: BLE001 - the broker gone mid-rebalance: evaluate without history
            log.error("engine: could not restore gained partitions %s: %s: %s", sorted(gained), type(exc).__name__, exc)
            return
        merged: dict[str, Any] = {"incidents": [], "cond_state": [], "counted_until": {}}
        for part in states.values():
            merged["incidents"] += part.get("incidents", [])
            merged["cond_state"] += part.get("cond_state", [])
            merged["counted_until"].update(part.get("counted_until") or {})
            job = next((i["labels"].get("job") for i in part.get("incidents", ())), None)
            if job:
                self.written[job] = json.dumps(part, default=str, sort_keys=True)
        if merged["incidents"] or merged["cond_state"]:
            ev = self.processor.evaluator
            try:
                ev.restore(merged)
            except (KeyError, TypeError, ValueError) as exc:  # a checkpoint from another version
                log.warning("ignoring unreadable job checkpoints (%s: %s)", type(exc).__name__, exc)
            else:
                # The evaluator holds a restored incident open until its windows refill (after a restart
                # they are empty).  Here they were re-read: an incident whose rule's windows the re-read
                # covers is judged at once, so it resolves when its fault has ended, not a warm-up later.
                for inc in merged["incidents"]:
                    held = ev.incidents.get(inc["fingerprint"])
                    rule = ev.rules.rules.get(inc["rule_id"])
                    if held is not None and rule is not None and n and ev.warmup_for(rule) <= window:
                        held.restored = False
        log.info("engine: took %d partition(s) of %s: re-read %d record(s) of the last %.0fs, "
                 "continued %d incident(s) of %d job(s), adopted %d notifier incident(s)", len(gained), TOPIC_BY_JOB,
                 n, window, len(merged["incidents"]), len(states), adopted)

    def _restore(self, recs: list[Any]) -> None:
        pairs = []
        for r in recs:
            headers = dict(r.headers or ())
            if PROGRESS_HEADER in headers:  # a router's progress marker, not a message
                continue
            copy = headers.get(COPY_HEADER)
            if copy is not None:  # one copy per message, whichever gained partition holds it
                if copy in self.restored_copies:
                    continue
                self.restored_copies.add(copy)
            src = headers.get("whywait-topic")
            pairs.append((src.decode() if isinstance(src, bytes) else str(src), r.value))
        self.processor.restore(pairs)


def wire(app: faust.App, cfg: Any, processor: Processor, inputs: Any, by_job: Any, dead: Any, state_topic: Any,
         send: Callable[[Any, bytes, bytes, str], Awaitable[None]],
         evaluate: Callable[[list[Record]], Awaitable[None]], record: Callable[[Any], Record],
         notifier: Any = None) -> ScaleOut:
    """Add the route and evaluate processors, the placement table and the rebalance hooks to ``app``."""
    from whywait.engine.stream.app import PRODUCED_HEADER, SOURCE_HEADER

    so = ScaleOut(app, cfg, processor, state_topic, notifier)
    # faust's consumer hands each fetch over whole, to the router (inputs) and to the evaluator (the
    # repartition topic): see engine/stream/batches.py.
    to_route = batches.BatchFeed(inputs.topics, counts=processor.counts, name="route")
    # The evaluate stage commits only what its reorder buffer has released and evaluated (see HeldOffsets).
    to_evaluate = batches.BatchFeed(by_job.topics, counts=processor.counts, name="evaluate", commit_on_done=False,
                                        align=False)  # one job a key: nothing to align across
    batches.install(app, to_route, to_evaluate, align_s=cfg.align_s)

    async def run_feed(feed: batches.BatchFeed, take: Callable[[list[Any]], Awaitable[None]], what: str) -> None:
        async for batch in feed:
            try:
                await take(batch.records)
            except Exception:  # noqa: BLE001 - never a stuck stage: the batch is logged, counted and passed
                log.exception("engine: %s: a batch of %d record(s) failed", what, len(batch.records))
                processor.counts[f"errors.{what}_batch"] += 1
            except BaseException:  # cancelled as the worker stops: read again by the next engine
                feed.release(batch)
                raise
            feed.done(batch)

    @app.task
    async def route() -> None:
        await run_feed(to_route, route_batch, "route")

    @app.task
    async def evaluate_jobs() -> None:
        await run_feed(to_evaluate, evaluate_batch, "evaluate")

    async def route_batch(records: list[Any]) -> None:
        if any(kind_for_topic(r.topic) in NODE_KINDS for r in records) and not await so.table.sync():
            processor.counts["route.placements_unsynced"] += 1  # routed with the placements known so far
        out = processor.route([record(r) for r in records], cfg.partitions)
        for key, value in out.dead_letters:
            await send(dead, key, value, "dead_letter")
        for part, key, value, t_ms, topic, produced_ms, src in out.forwards:
            headers = {SOURCE_HEADER: topic.encode()}
            if src is not None:
                headers[COPY_HEADER] = src.encode()
            if produced_ms is not None:
                headers[PRODUCED_HEADER] = str(produced_ms).encode()
            try:
                await by_job.send(key=key, value=value, partition=part, timestamp=t_ms / 1000.0, headers=headers)
            except Exception as exc:  # noqa: BLE001 - counted and logged; consumption goes on
                processor.counts["send_failed.forward"] += 1
                log.error("could not forward a %s record to %s[%d]: %s", topic, TOPIC_BY_JOB, part, exc)
        await say_progress()

    positions: dict[TP, int] = {}  # partition -> where this worker resumed it (this epoch's)
    positions_epoch = [to_route.epoch]

    async def resumed_at(tp: TP) -> int:
        """The offset this worker resumed ``tp`` from since the last rebalance (asked once per epoch)."""
        if positions_epoch[0] != to_route.epoch:
            positions.clear()
            positions_epoch[0] = to_route.epoch
        pos = positions.get(tp)
        if pos is None:
            pos = positions[tp] = await app.consumer.position(tp) or 0
        return pos

    async def say_progress() -> None:
        """Tell every partition of the repartition topic how far this worker has routed each steady input
        partition it reads, and how many records wait there (after the records: same producer, same
        partition, so a marker never overtakes what it speaks of)."""
        sources: dict[str, list[Any]] = {}
        try:
            for tp in app.consumer.assignment():
                if kind_for_topic(tp.topic) not in STEADY_KINDS:
                    continue
                hw = app.consumer.highwater(tp)
                if not hw:
                    continue  # not fetched yet, or empty: nothing to say
                last = processor.routed_to.get((tp.topic, tp.partition), -1)
                # What waits is what lies past where this worker resumed, when it has routed nothing from
                # the partition since (gained at a rebalance, or just started).  Counting from its last
                # routed offset alone said "thousands unrouted, routed to -inf" for a partition the previous
                # owner had routed to its end, and every worker's evaluate stage held everything for stale_s
                # (30 s): the 2-worker bench ran at half one worker's speed, and a test's run stopped with a
                # partition handed over twice.
                resume = to_route.fetched_first(tp)
                if resume is None:
                    resume = await resumed_at(tp)
                last = max(last, resume - 1)
                sources[f"{tp.topic}/{tp.partition}"] = [processor.routed_time.get((tp.topic, tp.partition)),
                                                         max(0, hw - last - 1)]
        except Exception:  # noqa: BLE001 - no consumer yet (a rebalance): the next batch says it
            return
        if not sources:
            return
        known = [t for t, _ in sources.values() if t is not None]
        if known:
            # A partition with nothing left to route has been routed as far as this router got on any: its own
            # last record may be old (a sparse partition), and an evaluate stage bounds what arrived after this
            # word by it (ReorderBuffer.behind).
            frontier = max(known)
            for v in sources.values():
                if v[1] == 0:
                    v[0] = frontier
        body = json.dumps({"sources": sources}, separators=(",", ":")).encode()
        for part in range(cfg.partitions):
            try:
                await by_job.send(key=b"", value=body, partition=part,
                                  timestamp=max(known) if known else None, headers={PROGRESS_HEADER: b"1"})
            except Exception as exc:  # noqa: BLE001 - the next batch says it again
                processor.counts["send_failed.progress"] += 1
                log.debug("could not send a progress marker to %s[%d]: %s", TOPIC_BY_JOB, part, exc)

    order = ReorderBuffer(STEADY_KINDS)
    held = HeldOffsets()
    received = so.received  # partition of the repartition topic -> last offset received
    copies: dict[bytes, None] = {}  # source ids of copied messages taken already (insertion-ordered)

    def backlog() -> bool:
        """Whether this worker has unread records: on the repartition topic, or on the input partitions
        it routes (what it has not forwarded yet will arrive here or at another worker)."""
        try:
            for p, off in received.items():
                hw = app.consumer.highwater(TP(TOPIC_BY_JOB, p))
                if hw is not None and off + 1 < hw:
                    return True
            for tp in app.consumer.assignment():
                if tp.topic != TOPIC_BY_JOB and tp.topic != TOPIC_PLACEMENT:
                    last = processor.routed_to.get((tp.topic, tp.partition))
                    hw = app.consumer.highwater(tp)  # (a partition not read from yet says nothing here)
                    if last is not None and hw and last + 1 < hw:
                        return True
        except Exception:  # noqa: BLE001 - no consumer yet: judge by arrival only
            return False
        return False

    def take_progress(value: bytes | None, wall: float) -> None:
        try:
            for source, (t, unrouted) in jsonl.loads(value or b"{}").get("sources", {}).items():
                order.progress(str(source), float("-inf") if t is None else float(t), int(unrouted), wall)
        except (ValueError, TypeError, AttributeError) as exc:  # another version's marker: ignored, counted
            processor.counts["evaluate.bad_progress"] += 1
            log.debug("ignoring a progress marker: %s", exc)

    async def evaluate_batch(records: list[Any]) -> None:
        wall = time.monotonic()
        for e in records:
            if e.offset <= received.get(e.partition, -1):
                # Delivered again (the group re-read from its last commit): taken already, and a
                # second copy of a point would weigh twice in its window.
                processor.counts["evaluate.redelivered"] += 1
                continue
            received[e.partition] = e.offset
            headers = dict(e.headers or ())
            if PROGRESS_HEADER in headers:
                held.received(e.partition, e.offset, False)
                take_progress(e.value, wall)
                continue
            copy = headers.get(COPY_HEADER)
            if copy is not None:
                if copy in copies:  # a copy this worker has already taken from another partition
                    held.received(e.partition, e.offset, False)
                    processor.counts["route.copies_dropped"] += 1
                    continue
                copies[copy] = None
                if len(copies) > 200_000:  # bounded: copies of one message are forwarded together
                    for old in list(itertools.islice(copies, 50_000)):
                        del copies[old]
            rec = record(e)
            held.received(e.partition, e.offset, True)
            order.push(rec, (e.timestamp or 0) / 1000.0, kind_for_topic(rec.topic), wall, e.partition)
        await evaluate_released(order.release(wall, backlog()))
        for p in {e.partition for e in records}:
            to_evaluate.commit(TP(TOPIC_BY_JOB, p), held.commit_point(p))

    async def evaluate_released(ready: list[Record]) -> None:
        """Evaluate what the reorder buffer released; then its offsets may be committed (a batch that failed is
        logged and counted by the caller, and committed too: it is never stuck)."""
        if not ready:
            return
        try:
            await evaluate(ready)
        finally:
            for p in held.released(ready):
                to_evaluate.commit(TP(TOPIC_BY_JOB, p), held.commit_point(p))

    @app.timer(0.5)
    async def release_held() -> None:  # what waited for a kind that has since gone quiet
        if len(order):
            try:
                await evaluate_released(order.release(time.monotonic(), backlog()))
            except Exception:  # noqa: BLE001 - a timer that raises stops: logged and counted, the next one goes on
                log.exception("engine: evaluating held records failed")
                processor.counts["errors.evaluate_batch"] += 1

    @app.task
    async def placements() -> None:
        await so.table.run()

    @app.on_partitions_revoked.connect  # type: ignore[misc,arg-type]
    async def _revoked(app: faust.App, revoked: Any, **kwargs: Any) -> None:
        try:
            await so.checkpoint()  # the next owner continues from here
        except Exception as exc:  # noqa: BLE001
            log.error("engine: checkpoint before the rebalance failed: %s", exc)

    @app.on_partitions_assigned.connect  # type: ignore[misc,arg-type]
    async def _assigned(app: faust.App, assigned: Any, **kwargs: Any) -> None:
        await so.assigned(assigned)

    return so

