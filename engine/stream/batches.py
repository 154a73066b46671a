"""faust's Kafka consumer, handing each fetch to the engine as one batch instead of one event per record.

Why: faust delivers every record on its own way to a processor: a ``Message`` and an ``Event`` per
record, two tasks per record while the fetcher waits for the conductor to take it (``wait_first``),
the conductor's flow control, the stream's queue, iterator, sensors and processors, and an ack under
a lock.  At 1,024 GPUs that cost about as much CPU as the evaluator itself (py-spy: ``_drain_messages``,
``Agent._execute_actor``).  The engine reads its input topics in batches anyway (it evaluated
``stream.take_events`` batches), so here faust's consumer fetches as before (its consumer thread,
group membership, rebalances, seeks and periodic offset commits are unchanged), and each fetch of
the topics a :class:`BatchFeed` names goes to that feed as one :class:`Batch` of aiokafka records.

Offsets: a batch's offsets are committed only after the engine says it is done with it
(:meth:`BatchFeed.done`, after its messages were evaluated and their outputs sent), by faust's own
commit (every ``broker_commit_interval``, on a rebalance and as the worker stops).  On a rebalance
the batches not yet taken are dropped (faust seeks back to the committed offsets when the flow
resumes, as it drops its streams' buffers), and faust's wait for the streams waits for the batch
being evaluated, so what was evaluated is committed before the partitions go.  A record delivered
again at an offset the feed has handed over already (the group re-read from its last commit) is
dropped, so the evaluator never counts a message twice.

Each batch carries the feed's *epoch* (bumped by every revoke) from when it was fetched, and a batch
of an earlier epoch is never handed over.  Why: the fetcher may be waiting for room in the queue as
the revoke empties it; its fetch then went in *after* the revoke, the processor took it ahead of the
dropped ones, the feed counted its partitions handed up to its end, and the re-read from the committed
offset was dropped as delivered again (and the fetch's offsets, once evaluated, committed past that
hole).  One 2-worker run at 1,024 GPUs forwarded 2,392 of its 44,289 records never and 1,308 twice
that way, its input commits at the end.  Within an epoch the batches of a partition follow each other;
a hole is counted (``<name>.feed_gap``) and logged.

Topics no feed names (the partitioned pipeline's processors) keep faust's per-event path.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
from dataclasses import dataclass
from typing import Any, AsyncIterator, Iterable, Iterator, Mapping, Optional

from faust.transport.drivers import aiokafka as faust_aiokafka
from faust.types import TP
from whywait.engine.stream.alignment import align

log = logging.getLogger(__name__)

_NONE = object()


@dataclass(frozen=True)
class Batch:
    """One fetch of a feed's topics: aiokafka records, round-robin across partitions as faust delivers them."""

    records: list[Any]  # aiokafka ConsumerRecord: topic, partition, offset, timestamp (ms), key, value, headers
    first: Mapping[TP, int]  # partition -> its first offset in ``records``
    last: Mapping[TP, int]  # partition -> its last offset in ``records``
    epoch: int = 0  # the feed's epoch when it was fetched (see BatchFeed.revoked): an older one is stale


class BatchFeed:
    """The batches of ``topics``, from :class:`BatchConsumer` to the engine's processor.

    Made by ``build_app``; the processor iterates it (``async for batch in feed``) and calls
    :meth:`done` once a batch is evaluated.  At most ``max_batches`` fetches wait here: then the
    fetcher waits too (each fetch is at most ``consumer_max_fetch_size`` per partition).
    ``counts`` (the processor's counters), when given, gets what the feed drops under ``name``:
    ``<name>.feed_stale`` (records of batches fetched before a rebalance, read again from the
    committed offsets), ``<name>.feed_redelivered`` (records handed over already) and
    ``<name>.feed_gap`` (records skipped between two batches of one partition: never, unless a bug).
    """

    def __init__(self, topics: Iterable[str], max_batches: int = 2, counts: Any = None, name: str = "feed",
                 commit_on_done: bool = True, align: bool = True) -> None:
        self.topics = frozenset(topics)
        # False: :meth:`done` commits nothing, the processor says how far with :meth:`commit` (the evaluate stage:
        # a batch in its reorder buffer is not evaluated yet).
        self.commit_on_done = commit_on_done
        self.max_batches = max_batches
        # Whether its partitions are read aligned in event time (BatchConsumer._align), among themselves.
        self.align = align
        self._queue: asyncio.Queue[Batch] | None = None
        self._handed: dict[TP, int] = {}  # partition -> last offset handed to the processor
        self._this_epoch: set[TP] = set()  # partitions handed over in this epoch (their next batch follows on)
        self._fetched_first: dict[TP, int] = {}  # partition -> first offset fetched in this epoch
        self.commit_at: dict[TP, int] = {}  # partition -> the offset to commit (the next one to read)
        self.busy: Batch | None = None  # the batch being evaluated
        self._idle: asyncio.Event | None = None
        self.epoch = 0  # bumped by every revoke: batches fetched before it are stale
        self.dropped = 0  # records dropped: batches of a revoked assignment, records delivered again
        self.counts = counts
        self.name = name

    def make(self, records: Mapping[TP, list[Any]]) -> Batch:
        """One fetch (partition -> its records, in offset order) as a batch of this epoch (called by the fetcher)."""
        for tp, recs in records.items():
            self._fetched_first.setdefault(tp, recs[0].offset)
        return Batch(list(round_robin(records)), {tp: recs[0].offset for tp, recs in records.items()},
                     {tp: recs[-1].offset for tp, recs in records.items()}, self.epoch)

    def _count(self, what: str, n: int) -> None:
        self.dropped += n
        if self.counts is not None and n:
            self.counts[f"{self.name}.{what}"] += n

    @property
    def queue(self) -> asyncio.Queue[Batch]:
        if self._queue is None:  # made in the worker's loop, on first use
            self._queue = asyncio.Queue(self.max_batches)
        return self._queue

    @property
    def idle(self) -> asyncio.Event:
        if self._idle is None:
            self._idle = asyncio.Event()
            self._idle.set()
        return self._idle

    async def put(self, batch: Batch) -> None:
        """Called by the consumer's fetcher with each fetch; waits while ``max_batches`` wait already."""
        await self.queue.put(batch)

    def fetched_first(self, tp: TP) -> int | None:
        """The first offset of ``tp`` fetched since the last rebalance (None: nothing fetched from it yet).

        Read by the partitioned engine's progress markers (``scaleout.say_progress``) for a partition it
        has routed nothing from: its records from this offset on are still to be routed.
        """
        return self._fetched_first.get(tp)

    def __aiter__(self) -> AsyncIterator[Batch]:
        return self._batches()

    async def _batches(self) -> AsyncIterator[Batch]:
        while True:
            batch = await self.queue.get()
            if batch.epoch != self.epoch:
                # Fetched before a rebalance, put here after the revoke emptied the queue: faust reads its
                # partitions again from the committed offsets, whoever owns them now.
                self._count("feed_stale", len(batch.records))
                continue
            handed = self._handed
            seen = self._this_epoch
            for tp, first in batch.first.items():
                if tp in seen and first > handed.get(tp, -1) + 1:
                    n = first - handed.get(tp, -1) - 1
                    self._count("feed_gap", n)
                    log.error("engine: %d record(s) of %s[%d] were never handed over (offsets %d..%d)", n, tp.topic,
                              tp.partition, handed.get(tp, -1) + 1, first - 1)
            if any(first <= handed.get(tp, -1) for tp, first in batch.first.items()):
                # Some of it was handed over already (re-read from the last commit after a rebalance).
                keep = [r for r in batch.records if r.offset > handed.get(TP(r.topic, r.partition), -1)]
                self._count("feed_redelivered", len(batch.records) - len(keep))
                batch = Batch(keep, batch.first, batch.last, batch.epoch)
            for tp, off in batch.last.items():
                seen.add(tp)
                if off > handed.get(tp, -1):
                    handed[tp] = off
            self.busy = batch
            self.idle.clear()
            yield batch

    def done(self, batch: Batch) -> None:
        """Called by the processor once ``batch`` is evaluated and its outputs sent: its offsets may be committed
        (unless the feed was made with ``commit_on_done=False``)."""
        if self.commit_on_done:
            for tp, off in batch.last.items():
                if off + 1 > self.commit_at.get(tp, -1):
                    self.commit_at[tp] = off + 1
        self._finish(batch)

    def commit(self, tp: TP, offset: int | None) -> None:
        """Let faust commit ``tp`` up to ``offset`` (the next one to read; never backwards)."""
        if offset is not None and offset > self.commit_at.get(tp, -1):
            self.commit_at[tp] = offset

    def release(self, batch: Batch) -> None:
        """Called by the processor when ``batch`` was not evaluated (cancelled): it is neither committed nor skipped."""
        for tp, first in batch.first.items():
            if self._handed.get(tp, -1) == batch.last[tp]:
                self._handed[tp] = first - 1
        self._finish(batch)

    def _finish(self, batch: Batch) -> None:
        if self.busy is batch:
            self.busy = None
            self.idle.set()

    def revoked(self, tps: Iterable[TP]) -> None:
        """Called on a rebalance: drop the batches not taken yet (faust re-reads from the committed offsets).

        A new epoch begins: a fetch the fetcher puts here from now on but made before (it was waiting for room
        in the queue) is dropped when taken, never handed over ahead of the re-read of what was dropped here.
        """
        self.epoch += 1
        self._this_epoch.clear()
        self._fetched_first.clear()
        q = self._queue
        while q is not None and not q.empty():
            self._count("feed_stale", len(q.get_nowait().records))

    def forget(self, tps: Iterable[TP]) -> None:
        """Called after the revoke committed: the revoked partitions' offsets are the next owner's now."""
        for tp in tps:
            self.commit_at.pop(tp, None)

    async def wait_idle(self, timeout: float) -> bool:
        """Wait until no batch is being evaluated (at most ``timeout`` s); whether it was reached."""
        if self.busy is None:
            return True
        try:
            await asyncio.wait_for(self.idle.wait(), timeout)
        except asyncio.TimeoutError:
            return False
        return True


def round_robin(records: Mapping[TP, list[Any]]) -> Iterator[Any]:
    """Records of several partitions, one of each in turn (faust's order; C-speed, no per-record generator)."""
    if len(records) == 1:
        return iter(next(iter(records.values())))
    return (r for r in itertools.chain.from_iterable(itertools.zip_longest(*records.values(), fillvalue=_NONE))
            if r is not _NONE)


# How long a fetch may wait on the broker for partitions without new data (aiokafka's fetch_max_wait_ms).
# faust hard-codes 1,500 ms.  aiokafka keeps one fetch in flight per broker and leaves out of it the
# partitions whose records are still buffered, so once one busy partition's buffer was drained the next
# fetch of it waited behind a long poll of the idle ones: reading a backlog of the repartition topic went
# in bursts 1.4 s apart with the worker idle (a 1,024-GPU backlog: 0.5 of 2 cores busy).  100 ms keeps
# that wait short; an idle engine then asks the broker ten times a second, a few hundred bytes each.
FETCH_MAX_WAIT_MS = 100


# How long a stopping worker waits for its last offset commit (BatchConsumer.wait_empty): a commit takes
# milliseconds when the broker answers.
STOP_COMMIT_S = 5.0


class BatchConsumerThread(faust_aiokafka.AIOKafkaConsumerThread):
    """faust's consumer thread, its aiokafka consumer made with :data:`FETCH_MAX_WAIT_MS`."""

    def _create_worker_consumer(self, transport: Any) -> Any:
        consumer = super()._create_worker_consumer(transport)
        # faust passes 1500 as a literal; aiokafka reads this attribute when it starts its fetcher.
        consumer._fetch_max_wait_ms = FETCH_MAX_WAIT_MS
        return consumer

    async def on_thread_stop(self) -> None:
        """faust's: stop the thread's method queue, then the aiokafka consumer; and finish it when aiokafka cannot.

        With the broker gone, aiokafka's ``Fetcher.close`` cancels its fetch request, which is waiting out its retry
        backoff, then awaits it, and that request's ``CancelledError`` came out of ``consumer.stop()``
        (aio-libs/aiokafka#647).  mode's thread took it for its own cancellation and died without saying it had
        stopped ("faust's Thread-1 stopped on CancelledError"), and the worker waited the thread's whole
        ``shutdown_timeout`` for it ("Error while stopping child ... TimeoutError"): every stop with the broker
        down took 10 s longer and said two lines of noise.  This thread was not cancelled: the rest of the
        consumer is closed here and the thread stops as usual.
        """
        try:
            await super().on_thread_stop()
        except asyncio.CancelledError:
            task = asyncio.current_task()
            if task is None or task.cancelling():  # this thread itself is cancelled: so be it
                raise
            log.debug("engine: aiokafka's consumer stop raised its own fetch's cancellation; closing the rest")
            await _close_after_cancelled_stop(self._consumer)


async def _close_after_cancelled_stop(consumer: Any) -> None:
    """What ``AIOKafkaConsumer.stop`` had left to do when its fetcher's close raised a cancelled request: the
    fetcher's other requests, then the client's connections.  Errors here are a stopping consumer's: dropped."""
    if consumer is None:
        return
    fetcher = getattr(consumer, "_fetcher", None)
    pending = [t for t in getattr(fetcher, "_pending_tasks", ()) if not t.done()]
    for t in pending:
        t.cancel()
    if pending:
        await asyncio.gather(*pending, return_exceptions=True)
    client = getattr(consumer, "_client", None)
    if client is not None:
        try:
            await client.close()
        except Exception:  # noqa: BLE001 - closing sockets of a broker that is gone
            pass


class BatchConsumer(faust_aiokafka.Consumer):
    """faust's aiokafka consumer; the fetches of each :class:`BatchFeed`'s topics go to that feed whole.

    It also aligns the feeds' partitions in event time (:mod:`whywait.engine.stream.alignment`): after
    each fetch, a partition read more than the transport's ``align_s`` ahead of the slowest partition
    that has unread records is paused, until that one catches up.
    """

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.newest_ts: dict[TP, int] = {}  # feed partition -> timestamp (ms) of the newest record read
        self.ahead: set[TP] = set()  # feed partitions paused for running ahead (see _align)
        self.align_pauses = 0  # how many times a partition was paused so

    @property
    def feeds(self) -> dict[str, BatchFeed]:
        """Topic -> the feed that takes it (the transport's feeds)."""
        return getattr(self.transport, "feeds", {})

    def _new_consumer_thread(self) -> BatchConsumerThread:
        return BatchConsumerThread(self, loop=self.loop, beacon=self.beacon)

    async def subscribe(self, topics: Iterable[str]) -> None:
        """Subscribe to faust's topics (its agents') and the feeds'."""
        await super().subscribe(sorted({*topics, *self.feeds}))

    async def on_partitions_revoked(self, revoked: set[TP]) -> None:
        """Drop the feeds' waiting batches, let faust commit what was evaluated, then forget the revoked offsets."""
        feeds = set(self.feeds.values())
        for feed in feeds:
            feed.revoked(revoked)
        await super().on_partitions_revoked(revoked)
        for feed in feeds:
            feed.forget(revoked)
        for tp in revoked:  # faust forgets its pauses of revoked partitions too
            self.newest_ts.pop(tp, None)
        self.ahead.difference_update(revoked)

    async def wait_empty(self) -> None:
        """Wait for the batches being evaluated (bounded by the session timeout), then faust's own wait and commit.

        As the worker stops, the commit is bounded: aiokafka waits for a group coordinator for ever, and with the
        broker gone the engine never exited.  It is not even tried when the engine's broker watch got no answer
        from its last probe (``BrokerWatch.failing``; the engine says so once as it stops), and waited for at most
        :data:`STOP_COMMIT_S` otherwise.
        """
        if not self.should_stop:
            for feed in set(self.feeds.values()):
                if not await feed.wait_idle(self.app.conf.broker_session_timeout * 0.25):
                    log.warning("engine: a batch was still being evaluated as the partitions went; it is read again")
        if not self.app.should_stop:  # a rebalance: the commit must happen before the partitions go
            await super().wait_empty()
            return
        watch = getattr(self.app, "broker_watch", None)
        if watch is not None and watch.failing:
            return
        try:
            await asyncio.wait_for(super().wait_empty(), STOP_COMMIT_S)
        except asyncio.TimeoutError:
            log.warning("engine: the last offsets were not committed within %.0fs as the engine stopped (the broker "
                        "is not answering); a restart reads again from the ones before", STOP_COMMIT_S)

    async def on_stop(self) -> None:
        """As the worker stops: the last commit covers the batches being evaluated, when they end in time."""
        for feed in set(self.feeds.values()):
            await feed.wait_idle(2.5)
        await super().on_stop()

    def _new_offset(self, tp: TP) -> Optional[int]:
        feed = self.feeds.get(tp.topic)
        if feed is not None:
            return feed.commit_at.get(tp)
        return super()._new_offset(tp)

    def _filter_tps_with_pending_acks(self, topics: Any = None) -> Iterator[TP]:
        yield from super()._filter_tps_with_pending_acks(topics)
        feeds = set(self.feeds.values())
        if feeds:
            assigned = self.assignment()  # a batch that ended after its partition went is not committed here
            for feed in feeds:
                for tp in list(feed.commit_at):
                    if tp in assigned and (topics is None or tp in topics or tp.topic in topics):
                        yield tp

    async def _drain_messages(self, fetcher: Any) -> None:  # pragma: no cover - runs against a broker
        """The fetcher's loop: each fetch of the feed's topics to the feed as one batch, the rest to faust."""
        feeds = self.feeds
        if not feeds:
            return await super()._drain_messages(fetcher)
        consumer_should_stop = self._stopped.is_set
        fetcher_should_stop = fetcher._stopped.is_set
        read_offset = self._read_offset
        set_flag, unset_flag = self.diag.set_flag, self.diag.unset_flag
        try:
            while not (consumer_should_stop() or fetcher_should_stop()):
                set_flag("FETCHING")
                records, active = await self._wait_next_records(1.0)
                await self.sleep(0)  # faust's getmany can return at once in a loop: let the others run
                if not records or self.should_stop:
                    unset_flag("FETCHING")
                    continue
                if not self.flow_active:
                    # Fetched while a rebalance stopped the flow: faust reads these again from the committed offsets.
                    await self.perform_seek()
                    unset_flag("FETCHING")
                    continue
                generation = self.app.consumer_generation_id
                mine: dict[BatchFeed, dict[TP, list[Any]]] = {}
                others: dict[TP, list[Any]] = {}
                for tp, recs in records.items():
                    if not recs or (active is not None and tp not in active and tp not in self._buffered_partitions):
                        continue
                    r_off = read_offset[tp]
                    if r_off is not None and recs[0].offset < r_off:
                        recs = [r for r in recs if r.offset >= r_off]  # faust drops what it has read already
                        if not recs:
                            continue
                    feed = feeds.get(tp.topic)
                    if feed is None:
                        others[tp] = recs
                    else:
                        mine.setdefault(feed, {})[tp] = recs
                for feed, got in mine.items():
                    batch = feed.make(got)
                    # One wait per fetch (faust: per record): put, unless a rebalance suspends the flow first.
                    put = feed.put(batch)
                    res = await self.wait_first(put, self.suspend_flow.wait())
                    if put not in res.done or batch.epoch != feed.epoch:
                        # Not put, or put after a revoke emptied the queue (the feed drops it): faust forgot the
                        # revoked partitions' read offsets and seeks to the committed ones; leave them so.
                        break
                    for tp, off in batch.last.items():
                        read_offset[tp] = off
                    for tp, recs in got.items():  # faust's TP (faust asserts its type in its partition sets)
                        self.newest_ts[TP(tp.topic, tp.partition)] = recs[-1].timestamp
                if mine:
                    self._align()
                if others:
                    await self._deliver(others, generation)
                unset_flag("FETCHING")
        except self.consumer_stopped_errors:
            if self.transport.app.should_stop:
                self.log.info("Broker stopped consumer, shutting down...")
                return
            raise
        except asyncio.CancelledError:
            if self.transport.app.should_stop:
                self.log.info("Consumer shutting down for user cancel.")
                return
            raise
        except Exception as exc:
            self.log.exception("Drain messages raised: %r", exc)
            raise
        finally:
            unset_flag("FETCHING")

    def _align(self) -> None:
        """After a fetch: pause the feeds' partitions far ahead of the slowest one behind, resume those it caught up.

        Each aligning feed's partitions are weighed among themselves (the partitioned pipeline aligns
        its inputs, not the repartition topic, whose partitions are independent jobs).
        """
        ahead_s = float(getattr(self.transport, "align_s", 0.0))
        assigned = self.assignment()
        self.ahead &= assigned
        read = self._read_offset
        for feed in {f for f in self.feeds.values() if f.align}:
            mine = {tp for tp in assigned if tp.topic in feed.topics}
            newest = {tp: ts for tp, ts in self.newest_ts.items() if tp in mine and ts is not None and ts >= 0}
            behind: set[TP] = set()
            for tp in mine:
                hw = self.highwater(tp)
                off = read.get(tp)
                if hw is not None and hw > (-1 if off is None else off) + 1:
                    behind.add(tp)
            pause, resume = align(newest, behind, self.ahead & mine, ahead_s)
            if pause:
                self.pause_partitions(pause)
                self.ahead |= pause
                self.align_pauses += len(pause)
                slow = min((tp for tp in behind if tp in newest), key=newest.__getitem__)
                log.info("engine: pausing %s: read more than %.0fs ahead of %s[%d], the slowest input with unread "
                         "records", ", ".join(sorted(f"{tp.topic}[{tp.partition}]" for tp in pause)), ahead_s,
                         slow.topic, slow.partition)
            if resume:
                self.resume_partitions(resume)
                self.ahead -= resume

    async def _deliver(self, records: Mapping[TP, list[Any]], generation: int) -> None:
        """faust's own per-record delivery (``Consumer.getmany`` + ``_drain_messages``) for the other topics."""
        callback = self.callback
        acks_enabled_for = self.app.topics.acks_enabled_for
        read_offset = self._read_offset
        n = 0
        for tp, record in self.scheduler.iterate(records):
            if not self.flow_active or self.app.consumer_generation_id != generation:
                break
            n += 1
            if n > 100:
                await asyncio.sleep(0)
                n = 0
            offset = record.offset
            r_offset = read_offset[tp]
            if r_offset is None or offset >= r_offset:
                gap = offset - (r_offset or 0)
                if gap > 1 and r_offset and acks_enabled_for(record.topic):
                    await self._add_gap(tp, r_offset + 1, offset)
                if self._commit_every is not None and self._n_acked >= self._commit_every:
                    self._n_acked = 0
                    await self.commit()
                await self.wait_first(callback(self._to_message(tp, record)), self.suspend_flow.wait())
                read_offset[tp] = offset


class BatchTransport(faust_aiokafka.Transport):
    """faust's aiokafka transport with :class:`BatchConsumer`; ``feeds`` maps each topic to its :class:`BatchFeed`."""

    Consumer = BatchConsumer

    def __init__(self, *args: Any, feeds: Iterable[BatchFeed] = (), align_s: float = 0.0, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.feeds = {t: f for f in feeds for t in f.topics}
        self.align_s = align_s  # see BatchConsumer._align; 0: no alignment


def install(app: Any, *feeds: BatchFeed, align_s: float = 0.0) -> None:
    """Make ``app`` consume through :class:`BatchConsumer` with ``feeds``; called by ``build_app`` before it starts.

    ``align_s``: how far (event time, s) a feed's partition may be read ahead of the slowest one with
    unread records before it is paused (:mod:`whywait.engine.stream.alignment`); 0 turns that off.
    """
    app.transport = BatchTransport(app.conf.broker_consumer, app, feeds=feeds, align_s=align_s)
