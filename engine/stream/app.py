"""The faust application: thin processors that decode, evaluate and publish.

Called by ``whywait engine``.  One *processor* (a faust task; faust calls its stream
functions agents, here "agent" means the node daemon) takes every input topic in
batches: each fetch of faust's consumer whole (``engine/stream/batches.py``), because
faust's per-event path (an event, tasks, queues, sensors and an ack per record) cost as
much CPU as the evaluator, and its per-event windowed tables write a changelog message
per update (measured at ~3,700 events/s, against ~160,000 for a plain consume-and-decode).  Windowed state is
kept in memory by the pure :class:`~whywait.engine.evaluate.evaluator.Evaluator`; the
incident lifecycle is checkpointed compactly to ``whywait.engine-state.v1`` so a
restarted engine neither re-announces nor forgets to resolve an incident.

With more than one input partition (``whywait engine --partitions N``) the app runs the
partitioned pipeline of ``engine/stream/partitioning.py``: a *route* processor on the input
topics forwards each message to the repartition topic ``whywait.by-job.v1`` on its job's
partition, and the *evaluate* processor reads that topic; every worker follows the placement
topic whole (``engine/stream/tables.py``), checkpoints incidents per job, and on a rebalance
re-reads the window of the partitions it gains and continues their jobs' incidents.

Diagnoses go to ``whywait.diagnoses.v1`` (key: fingerprint) and to the notifier;
messages that break the contract go to ``whywait.deadletter.v1`` with the reason.
The notifier's calls (slack_sdk is synchronous, and waits out rate limits) run on
one worker thread so they keep their order and never stall consumption.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

import faust
from whywait.agents.events import INPUT_TOPICS, TOPIC_DEADLETTER, TOPIC_DIAGNOSES, kind_for_topic
from whywait.engine.diagnosis import Diagnosis
from whywait.engine.notify.base import Notifier
from whywait.engine.stream import batches
from whywait.engine.stream.processor import Processor, Record
from whywait.engine.stream.topics import TOPIC_BY_JOB, TOPIC_ENGINE_STATE

log = logging.getLogger(__name__)


@dataclass
class EngineConfig:
    """How the engine connects and batches."""

    bootstrap: str
    group_id: str = "whywait-engine"
    checkpoint_every_s: float = 10.0
    drain_timeout_s: float = 10.0  # how long a stopping engine waits to write its last checkpoint
    thread_stop_s: float = 10.0  # ... and for faust's consumer thread (bound_consumer_thread_stop)
    from_beginning: bool = True
    reload_every_s: float = 3.0
    lag_every_s: float = 5.0  # how often the consumer lag is read from the broker (metrics and /readyz)
    # Consumer-group liveness.  faust's default 60 s session meant a killed engine's partitions
    # stayed with the dead member for ~50 s after a restart.  A static member id (KIP-345) lets the
    # restarted engine take its partitions back at once, without waiting for the session to end;
    # the short session bounds the wait when a *different* instance takes over.
    instance_id: str | None = None
    session_timeout_s: float = 10.0
    heartbeat_s: float = 2.0
    # Partitions of the repartition topic; more than 1 runs the partitioned pipeline (the caller
    # passes the input topics' partition count, so every worker of a group agrees).
    partitions: int = 1
    # Event time re-read from a gained partition before evaluating it (None: the store's retention).
    restore_window_s: float | None = None
    # Partitioned: restore the per-job incident checkpoints of gained jobs (False: ``--no-restore``).
    restore_state: bool = True
    fetch_bytes: int = 64 << 10  # per partition and fetch, partitioned pipeline only (see build_app)
    # How far (event time, s) an input partition may be read ahead of the slowest one with unread records
    # before it is paused (engine/stream/alignment.py): bounds what a backlog makes the store hold.  0: off.
    align_s: float = 30.0
    # The broker is probed every ``broker_check_s`` (BrokerWatch); not answering for ``broker_grace_s`` is a
    # WARNING, repeated every ``broker_repeat_s`` while it lasts.
    broker_check_s: float = 3.0
    broker_grace_s: float = 8.0
    broker_repeat_s: float = 60.0
    datadir: str = field(default_factory=lambda: os.path.join(
        os.environ.get("XDG_STATE_HOME") or os.path.join(os.path.expanduser("~"), ".local", "state"),
        "whywait", "faust", "{conf.name}"))  # faust expands {conf.name}: one folder per consumer group


def diagnosis_value(d: Diagnosis, latency: dict[str, Any] | None = None) -> bytes:
    """Serialise a diagnosis for the diagnoses topic, with its latency figures when known."""
    body = d.to_dict()
    if latency:
        body["latency"] = latency
    return json.dumps(body, separators=(",", ":"), default=str).encode()


def reload_notice(errors: tuple[str, ...] | None, now: float, since: float | None = None) -> Diagnosis:
    """The operations-channel message for a refused (or, with ``errors=None``, a recovered) rule reload.

    ``since``: when the first refusal of this run of refused edits came (the rules have been stale since),
    so the message says how long the engine ran on them; ``now`` when omitted.
    """
    n = len(errors or ())
    since = now if since is None else since
    return Diagnosis(
        rule_id="whywait.rules-reload", fingerprint="whywait-rules-reload",
        status="firing" if errors else "resolved", severity="warning",
        title=f"Rule reload refused: {n} error(s); the last good rules keep running" if errors
        else "Rules reloaded: the refused edit is fixed",
        cause="\n".join(errors or ()) or "The rule files load again.", job=None, owner=None,
        starts_at=since, detected_at=now, ends_at=None if errors else now,
        next_step="Fix the files named above; `whywait rules check` shows "
        "the same errors before you save.", confidence=1.0)


def say_duration(seconds: float) -> str:
    """``45s``, ``2m 10s``, ``1h 05m``: how long, for a log line."""
    s = max(0, int(round(seconds)))
    if s < 60:
        return f"{s}s"
    if s < 3600:
        return f"{s // 60}m {s % 60:02d}s" if s % 60 else f"{s // 60}m"
    return f"{s // 3600}h {s % 3600 // 60:02d}m"


def _utc(ts: float) -> str:
    return time.strftime("%H:%M:%S UTC", time.gmtime(ts))


class BrokerWatch:
    """Whether the Kafka broker answers, asked every few seconds, and said when that changes.

    Why: faust and aiokafka retry a broker that went away quietly, for ever, so an engine whose broker was
    gone logged nothing at all, its alerts silently off.  Now, once the broker has not answered for
    ``grace_s`` (a restart of a few seconds says nothing), a WARNING names it and since when, again every
    ``repeat_s`` while it lasts, and an INFO says when it is back; ``whywait_engine_broker_up`` (``metrics``)
    is the last probe's answer and ``/readyz`` (``readiness``) is 503 with the same words while it is down.
    ``/healthz`` stays 200: the engine resumes by itself, and a restart would not bring the broker back.

    :meth:`observe` takes each probe's answer (None: it answered; else why not) and does the saying; the
    engine's timer calls :meth:`check`, which probes with :func:`~whywait.engine.localkafka.broker.probe_error`
    (ApiVersions and Metadata on a connection of its own, off the event loop).
    """

    def __init__(self, bootstrap: str, *, grace_s: float = 8.0, repeat_s: float = 60.0, timeout_s: float = 2.0,
                 clock: Any = time.time, metrics: Any = None) -> None:
        self.bootstrap = bootstrap
        self.grace_s = grace_s
        self.repeat_s = repeat_s
        self.timeout_s = timeout_s
        self.clock = clock
        self.metrics = metrics
        self.failing_since: float | None = None  # when the first probe of this outage failed
        self.said_at: float | None = None  # when the outage was last logged (None: not said, or not down)
        self.error: str | None = None  # the last probe's reason

    @property
    def down(self) -> bool:
        """The broker has not answered for ``grace_s`` or more (what the log and /readyz say)."""
        return self.said_at is not None

    @property
    def failing(self) -> bool:
        """The last probe got no answer: a stopping engine does not wait for the broker then."""
        return self.failing_since is not None

    def reason(self) -> str | None:
        """/readyz's one line while :attr:`down`, else None."""
        if not self.down or self.failing_since is None:
            return None
        return (f"broker {self.bootstrap} unreachable since {_utc(self.failing_since)} "
                f"({say_duration(self.clock() - self.failing_since)}: {self.error}); no events are being evaluated")

    def observe(self, error: str | None) -> None:
        """One probe's answer: None when the broker answered, else why it did not."""
        now = self.clock()
        if self.metrics is not None:
            self.metrics.broker_up.set(0 if error else 1)
        if error is None:
            if self.down and self.failing_since is not None:
                log.info("broker %s back after %s; resuming from committed offsets", self.bootstrap,
                         say_duration(now - self.failing_since))
            self.failing_since = self.said_at = self.error = None
            return
        self.error = error
        if self.failing_since is None:
            self.failing_since = now
        if self.said_at is None and now - self.failing_since < self.grace_s:
            return
        if self.said_at is not None and now - self.said_at < self.repeat_s:
            return
        log.warning("broker %s %sunreachable since %s (%s: %s): retrying; no events are being evaluated",
                    self.bootstrap, "still " if self.said_at is not None else "", _utc(self.failing_since),
                    say_duration(now - self.failing_since), error)
        self.said_at = now

    async def check(self) -> None:
        """Probe the broker (in a thread: a probe waits up to ``timeout_s``) and :meth:`observe` the answer."""
        from whywait.engine.localkafka.broker import probe_error

        error = await asyncio.get_running_loop().run_in_executor(None, probe_error, self.bootstrap, self.timeout_s)
        self.observe(error)


# The source topic of a forwarded record, in a header of the repartition topic's records.
SOURCE_HEADER = "whywait-topic"
PRODUCED_HEADER = "whywait-produced-ms"  # and the producer's timestamp of the original record
_SLICE_BYTES = 2 << 20  # input bytes evaluated (and their outputs sent) at a time, see _evaluate
_UNACKED_BYTES = 4 << 20  # bytes sent and not yet acknowledged before consumption waits for the producer
_ALL_KINDS = frozenset(k for k in (kind_for_topic(t) for t in INPUT_TOPICS) if k and k != "placement")


async def _pending_kinds(app: faust.App, done: dict[tuple[str, int], int]) -> set[str]:
    """The input kinds whose partitions hold messages not yet processed (consumer lag > 0).

    The evaluator never counts such an input as idle: while the engine works through a
    backlog one topic at a time, the others are late, not silent.  A partition this process has
    not read from yet is judged by the consumer's position: a restarted engine resumes at its
    committed offset, and a partition already read to its end (the compacted placements, say)
    is not pending just because nothing new came.
    """
    pending: set[str] = set()
    try:
        consumer = app.consumer
        for tp in consumer.assignment():
            kind = kind_for_topic(tp.topic)
            if tp.topic == TOPIC_BY_JOB:
                kind = "*"  # any input kind may be behind on the repartition topic
            elif kind is None:
                continue
            hw = consumer.highwater(tp)
            last = done.get((tp.topic, tp.partition))
            if hw is None:
                pending.add(kind)
            elif last is not None:
                if last + 1 < hw:
                    pending.add(kind)
            elif hw > 0:
                pos = await consumer.position(tp)
                if pos is None or pos < hw:
                    pending.add(kind)
    except Exception:  # no consumer yet, or a driver without highwater: fall back to arrival times
        return set()
    if "*" in pending:
        pending = (pending - {"*"}) | _ALL_KINDS
    return pending


def kafka_errors_in_one_line(loop: asyncio.AbstractEventLoop, context: dict[str, Any]) -> None:
    """The exception handler of the engine's loops: an aiokafka error nobody awaited is one warning line.

    Set on every loop made after :func:`quiet_kafka_errors` (the worker's and faust's threads' own). aiokafka runs
    some requests as tasks of their own (the offset commit as the worker stops, a heartbeat while the broker
    restarts); when the connection goes first, their exception reaches asyncio's default handler as "Task exception
    was never retrieved" and a twenty-line traceback on the console of a process that is fine. Anything else goes to
    the default handler, traceback and all.
    """
    from aiokafka.errors import KafkaError

    exc = context.get("exception")
    if isinstance(exc, KafkaError):
        task = context.get("future")
        name = getattr(getattr(task, "get_coro", lambda: None)(), "__qualname__", None) or "a Kafka request"
        # Stopping with the broker gone, the sends given up (drop_unsent) fail one by one: said once already.
        log.log(logging.DEBUG if _GAVE_UP.is_set() else logging.WARNING,
                "Kafka: %s (in %s; the consumer retries or the engine is stopping)", exc, name)
        return
    message = str(context.get("message") or "")
    if exc is None and message.startswith("Unclosed AIOKafka"):
        # aiokafka's __del__ of a client whose thread stopped before closing it (the broker gone as the engine
        # stopped): asyncio's default printed it as an ERROR of two lines, the client's repr on the second.
        log.warning("Kafka: %s, dropped as the engine stopped (its thread ended before closing it)",
                    message.splitlines()[0].replace("Unclosed", "an unclosed"))
        return
    loop.default_exception_handler(context)


class _OneLineKafkaErrorsPolicy(asyncio.DefaultEventLoopPolicy):
    """Every loop made from here on (the worker's, and faust's consumer and producer threads' own) reports
    an unawaited Kafka error with :func:`kafka_errors_in_one_line`."""

    def new_event_loop(self) -> asyncio.AbstractEventLoop:
        loop = super().new_event_loop()
        loop.set_exception_handler(kafka_errors_in_one_line)
        return loop


def _thread_excepthook(args: Any) -> None:
    """A faust service thread that dies stopping (its consumer's fetch cancelled, the broker gone) is one line."""
    from aiokafka.errors import KafkaError

    if args.exc_type is not None and issubclass(args.exc_type, (asyncio.CancelledError, KafkaError)):
        name = args.thread.name if args.thread is not None else "a thread"
        why = f"{args.exc_type.__name__}: {args.exc_value}" if str(args.exc_value or "") else args.exc_type.__name__
        log.warning("Kafka: faust's %s stopped on %s (the broker went before it did)", name, why)
        return
    _DEFAULT_THREAD_EXCEPTHOOK(args)


_DEFAULT_THREAD_EXCEPTHOOK = threading.excepthook


# whywait's own faust consumer (BatchConsumer, BatchConsumerThread) are mode services whose records carry
# their module's logger name: mode's "Error while stopping child ... TimeoutError" came with its whole
# traceback under it, as an ERROR, when the engine stopped with the broker gone.
_WHYWAIT_MODE_SERVICES = frozenset({"whywait.engine.stream.batches"})


class _OneLineStopErrors(logging.Filter):
    """A faust, mode or aiokafka log record carrying a timeout, a cancellation or a Kafka error: its message and
    the error's name on one line, as a warning.  (Stopping with the broker gone, mode logs each service that
    did not stop in time with the whole traceback of the wait.)"""

    def filter(self, record: logging.LogRecord) -> bool:
        from aiokafka.errors import KafkaError

        exc = record.exc_info[1] if record.exc_info else None
        if (record.name.split(".", 1)[0] in ("faust", "mode", "aiokafka") or record.name in _WHYWAIT_MODE_SERVICES) \
                and isinstance(exc, (asyncio.TimeoutError, asyncio.CancelledError, KafkaError)):
            record.msg = f"{record.getMessage()} ({type(exc).__name__})"
            record.args = ()
            record.exc_info = None
            record.exc_text = None
            record.levelno, record.levelname = logging.WARNING, "WARNING"
        return True


def quiet_kafka_errors() -> None:
    """Make aiokafka's unawaited errors, faust's threads stopping on them and mode's stop timeouts one line each.

    Called by ``whywait engine`` before it builds the faust app.  Why every loop: aiokafka runs its group
    coordinator and fetcher in faust's consumer thread, with a loop of its own; when the broker is gone
    as the worker stops, that thread's commit task and fetcher end in tracebacks nobody can act on.
    """
    if not isinstance(asyncio.get_event_loop_policy(), _OneLineKafkaErrorsPolicy):
        asyncio.set_event_loop_policy(_OneLineKafkaErrorsPolicy())
    threading.excepthook = _thread_excepthook
    for h in logging.getLogger().handlers:
        if not any(isinstance(f, _OneLineStopErrors) for f in h.filters):
            h.addFilter(_OneLineStopErrors())


def bound_consumer_thread_stop(seconds: float) -> None:
    """Wait at most ``seconds`` for faust's consumer thread as the worker stops (mode's default: 60 s).

    Called by ``whywait engine`` before the worker starts; a class attribute of faust's driver, so it
    holds for the process.  A healthy thread stops in a second or two (commit, leave the group); one that
    died on its cancelled fetch with the broker gone never says it stopped, and the engine waited the
    whole minute, past Kubernetes' default 30 s grace before SIGKILL.
    """
    from faust.transport.drivers.aiokafka import AIOKafkaConsumerThread

    AIOKafkaConsumerThread.shutdown_timeout = float(seconds)


# Set by drop_unsent: the engine stops with the broker gone and has said its sends are given up.
_GAVE_UP = threading.Event()


def drop_unsent(app: Any) -> int:
    """Give up what the app's producer has not delivered yet; return how many batches that is.

    Called as the engine stops with the broker gone: faust flushes its producer as it stops, and aiokafka's
    flush and stop wait for every batch to be delivered or to expire (faust's ``producer_request_timeout``:
    20 minutes), so an engine with a checkpoint or a diagnosis in flight did not exit.  Each batch is made
    expired, so aiokafka fails it at its next failed attempt (at once, the broker refusing connections) through
    its own path; failing them from here raced with a request in flight (aiokafka re-queued a batch it no
    longer held: a KeyError as the producer stopped).  Their failures, which nobody awaits, are no longer
    warnings (:func:`kafka_errors_in_one_line`): the engine said once that it drops them.  The inputs of what
    is dropped are not committed either: a restarted engine reads them again.
    """
    _GAVE_UP.set()
    producer = getattr(getattr(app, "_producer", None), "_producer", None)  # faust's Producer -> AIOKafkaProducer
    acc = getattr(producer, "_message_accumulator", None)
    if acc is None:
        return 0
    try:
        batches = [b for queue in acc._batches.values() for b in queue] + list(acc._pending_batches)
        for b in batches:
            b._ttl = -1.0  # MessageBatch.expired(): older than its time to live
    except Exception as exc:  # noqa: BLE001 - another aiokafka's insides: stopping goes on, maybe slower
        log.debug("engine: could not drop the unsent output: %s: %s", type(exc).__name__, exc)
        return 0
    return len(batches)


def build_app(cfg: EngineConfig, processor: Processor, notifier: Notifier,
              reloader: Any = None, metrics: Any = None, readiness: Any = None) -> faust.App:
    """Return the faust app wired to ``processor`` and ``notifier``; the caller runs it with a Worker.

    ``metrics`` (:class:`~whywait.engine.observe.metrics.EngineMetrics`) and ``readiness`` (its ``Readiness``), when
    given, are fed the consumer lag every ``cfg.lag_every_s``, rebalances and refused rule reloads.
    """
    os.makedirs(os.path.dirname(cfg.datadir), exist_ok=True)  # faust creates only the last level
    app = faust.App(
        cfg.group_id,
        broker=f"kafka://{cfg.bootstrap}",
        store="memory://",
        web_enabled=False,
        topic_replication_factor=1,
        topic_partitions=1,
        # Topics are created up front by engine.stream.topics (aiokafka's admin client); faust
        # must not declare its own with request versions older than Kafka 4 accepts.
        topic_allow_declare=False,
        consumer_auto_offset_reset="earliest" if cfg.from_beginning else "latest",
        producer_acks=-1,
        producer_compression_type="gzip",
        broker_commit_every=100,
        broker_session_timeout=cfg.session_timeout_s,
        broker_heartbeat_interval=cfg.heartbeat_s,
        consumer_group_instance_id=cfg.instance_id,
        # faust keeps a data folder even with the memory store; never in the user's working directory.
        datadir=cfg.datadir,
        # Partitioned: smaller fetches per partition, so a backlog is read from every input partition
        # in small interleaved slices.  The router forwards in the order it reads; the evaluate stage
        # restores event-time order (partitioning.ReorderBuffer), and smaller slices keep what it
        # must hold small (a megabyte of one topic put a job's steps tens of seconds behind).
        consumer_max_fetch_size=cfg.fetch_bytes if cfg.partitions > 1 else 1 << 20,
        # faust queues up to this many records per partition ahead of the agent (default 4,096): with 10,000
        # hostile messages of up to 0.2-0.6 MB that queue held ~90 MB (the fuzz test's peak RSS 1.76x the clean
        # run's; 1.39x with 512). Throughput at 1,024 GPUs was unchanged (7.5 CPU-s a minute, 7.8 before).
        # The partitioned pipeline keeps faust's default: its fetches are already small (above), and with 512
        # its 3-worker test failed once (of one run) where it had passed twice with the default.
        stream_buffer_maxsize=512 if cfg.partitions <= 1 else 4096,
    )
    inputs = app.topic(*INPUT_TOPICS, key_type=bytes, value_type=bytes, key_serializer="raw",
                       value_serializer="raw", allow_empty=True)
    diagnoses = app.topic(TOPIC_DIAGNOSES, key_serializer="raw", value_serializer="raw")
    dead = app.topic(TOPIC_DEADLETTER, key_serializer="raw", value_serializer="raw")
    state_topic = app.topic(TOPIC_ENGINE_STATE, key_serializer="raw", value_serializer="raw")
    pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="notify")
    seen_at_checkpoint = [-1]
    last_stats: list[dict[str, Any] | None] = [None]  # the counters of the last summary line

    async def checkpoint() -> None:
        """Write the evaluator's compact state (incidents, frozen baselines) if anything moved."""
        n = processor.counts["messages"]
        if n == seen_at_checkpoint[0]:
            return
        seen_at_checkpoint[0] = n
        snap = json.dumps(processor.evaluator.snapshot(), default=str).encode()
        await state_topic.send(key=cfg.group_id.encode(), value=snap)
        # One line an operator can read; the raw counters ride along as a field of the JSON log
        # (`--log-format json`), for scripts, and are on /metrics.
        counters = processor.stats()
        log.info("engine: %s", processor.summary(last_stats[0]), extra={"counters": counters})
        last_stats[0] = counters
        ev = processor.evaluator
        if ev.skew or ev.late:  # per node, so a skewed or lagging agent is named in the log too
            ahead = sorted(((s.rejected, n) for n, s in ev.skew.items()), reverse=True)[:10]
            late = sorted(((c, n) for n, c in ev.late.items()), reverse=True)[:10]
            log.warning("engine: refused for event time, per node: ahead of the clock %s; too late %s",
                        ", ".join(f"{n[:60]!r}={c}" for c, n in ahead) or "none",
                        ", ".join(f"{n[:60]!r}={c}" for c, n in late) or "none")

    def _notify(d: Diagnosis, trigger_ms: int | None) -> None:
        if metrics is not None:
            metrics.note_notified(d, notifier)
        try:
            notifier.notify(d)
        except Exception as exc:  # a notifier failure is logged, never fatal to the stream
            log.error("notifier failed for %s: %s", d.fingerprint, exc)
            return
        if trigger_ms is not None:
            # One parseable line per notification: the demo and the benchmarks read it.
            log.info("latency: rule=%s status=%s job=%s produced_to_notified_ms=%.0f", d.rule_id, d.status,
                     d.job, time.time() * 1000 - trigger_ms)

    done: dict[tuple[str, int], int] = {}  # (topic, partition) -> last offset processed

    # Sends not yet acknowledged: (delivery, what, bytes).  Delivery is not awaited per send, so sends stay
    # pipelined, but their bytes are bounded: a flood of bad messages is dead-lettered faster than the
    # producer compresses and ships the dead letters, and its queue grew without limit.  Past the bound,
    # consumption waits for the producer.
    unacked: list[tuple[Any, str, int]] = []
    unacked_bytes = [0]

    async def _await_sent() -> None:
        sent = unacked[:]
        unacked.clear()
        unacked_bytes[0] = 0
        results = await asyncio.gather(*(f for f, _, _ in sent), return_exceptions=True)
        for (_, what, size), res in zip(sent, results, strict=True):
            if isinstance(res, BaseException):
                processor.counts[f"send_failed.{what}"] += 1
                log.error("could not publish a %s (%d bytes): %s: %s", what, size, type(res).__name__, res)

    async def _send(topic: Any, key: bytes, value: bytes, what: str) -> None:
        # A refused send (too large, broker gone past the producer's retries) is counted and
        # logged; it must not raise out of the processor, which would stop consumption.
        try:
            # force: published now, not attached to the input event (faust holds an attached send until the
            # event is acknowledged, so awaiting its delivery here would wait for ourselves)
            delivery = await topic.send(key=key, value=value, force=True)
        except Exception as exc:  # noqa: BLE001
            processor.counts[f"send_failed.{what}"] += 1
            log.error("could not publish a %s (%d bytes): %s: %s", what, len(value), type(exc).__name__, exc)
            return
        unacked.append((delivery, what, len(value)))
        unacked_bytes[0] += len(value)
        if unacked_bytes[0] > _UNACKED_BYTES:
            await _await_sent()

    partitioned = cfg.partitions > 1
    by_job = app.topic(TOPIC_BY_JOB, key_type=bytes, value_type=bytes, key_serializer="raw",
                       value_serializer="raw", allow_empty=True) if partitioned else None

    async def _evaluate(recs: list[Record]) -> None:
        # A batch is one fetch (up to ``consumer_max_fetch_size`` per partition); its dead letters (up to
        # 64 KiB each) and diagnoses are held until they are sent.  Cut into slices of ``_SLICE_BYTES`` of input,
        # a flood of large bad messages costs a bounded amount of memory instead of one batch's worth,
        # which grew with how far behind the engine ran (the live fuzz test: 1.3-1.9x a clean run's RSS).
        start, size = 0, 0
        for i, r in enumerate(recs):
            size += len(r.value or b"")
            if size >= _SLICE_BYTES:
                await _evaluate_slice(recs[start:i + 1])
                start, size = i + 1, 0
        if start < len(recs):
            await _evaluate_slice(recs[start:])

    async def _evaluate_slice(recs: list[Record]) -> None:
        loop = asyncio.get_running_loop()
        out = processor.process(recs)
        if not partitioned:  # partitioned: a record's topic is its source, its offset the repartition topic's
            for r in recs:
                done[(r.topic, r.partition)] = r.offset
        pending = await _pending_kinds(app, done)
        if table is not None and not table.caught_up:
            pending.add("placement")
        processor.evaluator.set_pending(pending)
        for key, value in out.dead_letters:
            await _send(dead, key, value, "dead_letter")
        for d in out.diagnoses:
            trig = processor.trigger_ms.get(d.fingerprint)
            now_ms = int(time.time() * 1000)
            lat = {"trigger_produced_ms": trig, "evaluated_ms": now_ms} if trig else None
            await _send(diagnoses, d.fingerprint.encode(), diagnosis_value(d, lat), "diagnosis")
            loop.run_in_executor(pool, _notify, d, trig)

    def _record(r: Any) -> Record:
        """The engine's record of one aiokafka record (from a :class:`~.batches.Batch`)."""
        topic = r.topic
        if topic == TOPIC_BY_JOB:  # decoded against the topic it was first published to
            headers = dict(r.headers or ())
            src = headers.get(SOURCE_HEADER)
            topic = src.decode() if isinstance(src, bytes) else (src or topic)
            # its timestamp is its event time; the producer's time (for latency figures) is a header
            produced = headers.get(PRODUCED_HEADER)
            return Record(topic, r.value, r.key, r.partition, r.offset,
                          int(produced) if produced and produced.isdigit() else None)
        return Record(topic, r.value, r.key, r.partition, r.offset, r.timestamp or None)

    if not partitioned:
        table = None
        # faust's consumer hands each fetch of the inputs over whole (engine/stream/batches.py): a faust event
        # per record cost as much CPU as the evaluator.  Offsets are committed once a batch is evaluated.
        feed = batches.BatchFeed(INPUT_TOPICS, counts=processor.counts, name="input")
        batches.install(app, feed, align_s=cfg.align_s)

        @app.task
        async def evaluate() -> None:  # the processor, in this project's words
            async for batch in feed:
                try:
                    await _evaluate([Record(r.topic, r.value, r.key, r.partition, r.offset, r.timestamp or None)
                                     for r in batch.records])
                except Exception:  # noqa: BLE001 - never a stuck engine: the batch is logged, counted and passed
                    log.exception("engine: a batch of %d record(s) failed", len(batch.records))
                    processor.counts["errors.batch"] += 1
                except BaseException:  # cancelled as the worker stops: read again by the next engine
                    feed.release(batch)
                    raise
                feed.done(batch)
    else:
        from whywait.engine.stream import scaleout

        table = scaleout.wire(app, cfg, processor, inputs, by_job, dead, state_topic, _send, _evaluate, _record,
                              notifier)
        checkpoint = table.checkpoint  # per job, instead of the one group-wide snapshot

    @app.timer(cfg.checkpoint_every_s)
    async def periodic_checkpoint() -> None:
        await checkpoint()

    refused: list[float | None] = [None]  # when the first of the refused edits since the last good load came

    if reloader is not None:
        @app.timer(cfg.reload_every_s)
        async def reload_rules() -> None:
            res = reloader.poll()
            if res is None:
                return
            loop = asyncio.get_running_loop()
            if res.ok:
                processor.evaluator.rules = res.rules
                log.info("rules reloaded: %d rule(s)", len(res.rules))
                if refused[0] is not None:
                    since, refused[0] = refused[0], None
                    loop.run_in_executor(pool, _notify, reload_notice(None, time.time(), since), None)
                return
            if refused[0] is None:
                refused[0] = time.time()
            if metrics is not None:
                metrics.reload_failures.inc()
            log.error("rule reload refused, keeping the last good rules:\n  %s", "\n  ".join(res.errors))
            loop.run_in_executor(pool, _notify, reload_notice(res.errors, time.time(), refused[0]), None)

    watch = BrokerWatch(cfg.bootstrap, grace_s=cfg.broker_grace_s, repeat_s=cfg.broker_repeat_s, metrics=metrics)
    app.broker_watch = watch  # type: ignore[attr-defined]  # for the tests, and anyone holding the app
    if readiness is not None:
        readiness.broker = watch.reason

    @app.timer(cfg.broker_check_s)
    async def check_broker() -> None:
        await watch.check()

    if metrics is not None or readiness is not None:
        from whywait.engine.observe.metrics import read_lag

        @app.timer(cfg.lag_every_s)
        async def sample_lag() -> None:
            try:
                lags = await read_lag(app.consumer, INPUT_TOPICS)
            except Exception as exc:  # noqa: BLE001 - the broker gone: /readyz says so; the stream retries itself
                if readiness is not None:
                    readiness.sampled(f"{type(exc).__name__}: {exc}"[:200])
                return
            if metrics is not None:
                metrics.set_lag(lags)
            if readiness is not None:
                readiness.sampled()
                readiness.assigned(len(lags))

    @app.on_partitions_assigned.connect  # type: ignore[misc,arg-type]
    async def _assigned(app: faust.App, assigned: Any, **kwargs: Any) -> None:
        # One line others can wait for (the demo starts its simulator after it).
        log.info("engine: consuming %d partition(s)", len(assigned))

    @app.on_before_shutdown.connect  # type: ignore[misc,arg-type]
    async def _drain(app: faust.App, **kwargs: Any) -> None:
        # A restarted engine resumes the incidents as they stand now.  Bounded: with the broker gone the
        # send waits for it for ever, and a SIGTERM'd engine never exited (a new one resumes from the last
        # checkpoint that was written, at most ``checkpoint_every_s`` old).  With the broker known not to answer
        # it is not tried, and what the producer holds is dropped: faust's flush after this waited for it.
        async def checkpoint_sent() -> None:
            await checkpoint()
            await app.producer.flush()

        if watch.failing:
            dropped = drop_unsent(app)
            log.warning("engine: stopping with broker %s unreachable: the last checkpoint is not written, the last "
                        "offsets are not committed%s; a restart resumes from the ones before", cfg.bootstrap,
                        f" and {dropped} unsent batch(es) of output are dropped" if dropped else "")
        else:
            try:
                await asyncio.wait_for(checkpoint_sent(), cfg.drain_timeout_s)
            except Exception as exc:  # noqa: BLE001 - stopping: say it and go on stopping
                dropped = drop_unsent(app)
                log.warning("engine: the last checkpoint was not written before stopping (%s)%s; a restart resumes "
                            "from the one before", type(exc).__name__ if not str(exc) else exc,
                            f"; {dropped} unsent batch(es) of output are dropped" if dropped else "")
        await asyncio.get_running_loop().run_in_executor(pool, notifier.flush)

    return app
