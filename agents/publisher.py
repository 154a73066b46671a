"""Publishers: where the agent's messages go.

:class:`Publisher` is the interface (``send``/``flush``/``close``, all
coroutines); :class:`KafkaPublisher` sends to Kafka with a bounded on-disk
spool, :class:`MemoryPublisher` keeps messages in a list for tests and
``--dry-run``, :class:`PrintPublisher` writes JSON lines (``--print``).

Every publisher validates each message against the event contract before it
accepts it, so a producer bug is caught at the source: an invalid message is
logged, counted in ``invalid`` and not sent.

The spool
---------
When Kafka cannot be reached, messages go to append-only segment files under
``spool_dir`` (``<seq>.spool``, one JSON array ``[topic, key, value]`` per
line) and are sent in order when the broker answers again: the spool is always
drained before any newer message, so a topic's messages arrive in the order
they were produced.  The spool survives a restart of the agent.

Its size is bounded by ``spool_max_bytes``.  Past the bound the **oldest**
segment is dropped (its messages counted in ``dropped``): after a long outage
the recent past is what the engine needs to say why a job is waiting *now*,
and event-time windows would discard hour-old samples anyway.  Segments are
``spool_max_bytes / 8`` each, so at most an eighth of the spool goes at once.

A spool that cannot be written (a full disk, a read-only file system, wrong
permissions) does not stop the publisher: what it could not keep is counted in
``dropped`` and said in a warning naming the folder (once a minute at most).

Delivery is at least once: a message whose acknowledgement was lost in a
failure is sent again from the spool.  When an acknowledgement does not come,
the producer is thrown away with the batches it still holds before those
messages go to the spool, so the producer cannot deliver them a second time
after it reconnects (only a batch the broker wrote but whose answer was lost
arrives twice).
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import re
import sys
import time
from abc import ABC, abstractmethod
from collections import deque
from typing import IO, Any

from whywait.agents.events import ContractError, encode, validate

from whywait import jsonl

# Named after its user: the agent passes its own logger, the placement hooks leave this one.
log = logging.getLogger("whywait.publisher")


#: seconds between two log lines about messages refused for the same kind and field
_REFUSAL_LOG_S = 60.0
#: seconds between two warnings about one lasting problem (an outage, a full spool, an unwritable spool)
SAY_EVERY_S = 60.0


class Throttle:
    """A repeated problem said the first time, then at most once every ``every_s`` with how many since."""

    def __init__(self, every_s: float = SAY_EVERY_S) -> None:
        self.every_s = every_s
        self.last = float("-inf")
        self.since = 0

    def due(self, n: int = 1) -> int | None:
        """Count ``n`` more; return how many to say (these included) when a line is due now, else None."""
        now = time.monotonic()
        if now - self.last < self.every_s:
            self.since += n
            return None
        said, self.last, self.since = self.since + n, now, 0
        return said


def size_text(n: float) -> str:
    """Bytes as an operator reads them: ``5.1 KiB``, ``64 MiB``."""
    for unit in ("bytes", "KiB", "MiB", "GiB"):
        if n < 1024 or unit == "GiB":
            return f"{n:.0f} bytes" if unit == "bytes" else f"{n:.3g} {unit}"
        n /= 1024
    return f"{n:.3g} GiB"  # pragma: no cover - the loop returns


def reason(exc: BaseException) -> str:
    """``Type: message`` of an exception, never an empty message (aiokafka's timeouts and asyncio's have none)."""
    text = str(exc).strip()
    if not text:
        doc = (type(exc).__doc__ or "").strip().splitlines()
        text = doc[0].rstrip(".") if doc and not doc[0].startswith(("Built-in", "Common base")) else "no detail given"
    name = type(exc).__name__
    return text if text.startswith(name) else f"{name}: {text}"  # aiokafka's messages start with their name


class Publisher(ABC):
    """Where messages go.  Counters: ``sent``, ``spooled`` (waiting on disk now), ``dropped``, ``invalid``."""

    def __init__(self) -> None:
        self.sent = 0
        self.dropped = 0
        self.invalid = 0
        self._refusals: dict[tuple[str, str], tuple[float, int]] = {}  # (kind, field) -> (last logged, since)

    @property
    def spooled(self) -> int:
        return 0

    @property
    def dropped_total(self) -> int:
        """Messages lost since start (past the spool bound, or over the in-memory bound)."""
        return self.dropped

    def check(self, topic: str, msg: dict[str, Any]) -> bool:
        """Validate ``msg`` for ``topic``; log and count it when it breaks the contract."""
        try:
            validate(msg, topic)
            return True
        except ContractError as exc:
            self.invalid += 1
            self._log_refusal(str(msg.get("kind", "?")), exc)
            return False

    def _log_refusal(self, kind: str, exc: ContractError) -> None:
        """Log a refused message: the first of its kind and field, then at most once a minute with a count.

        A producer that keeps sending one bad field (every second, from every GPU) would otherwise
        write a line per message; the count in :attr:`invalid` still sees every one.
        """
        key = (kind, re.sub(r"\[\d+\]", "[]", exc.path)[:200])  # gpus[3].temp_c and gpus[5].temp_c: one field
        now = time.monotonic()
        last, since = self._refusals.get(key, (-_REFUSAL_LOG_S, 0))
        if now - last < _REFUSAL_LOG_S:
            self._refusals[key] = (last, since + 1)
            return
        if len(self._refusals) >= 1024:  # bounded: distinct fields are few, but reasons come from the input
            self._refusals.clear()
        self._refusals[key] = (now, 0)
        more = f" ({since} more like it since, not logged)" if since else ""
        log.error("not publishing an invalid %s message: %s%s", kind, exc, more)

    async def start(self) -> None:  # noqa: B027 - an optional hook
        """Connect (when there is something to connect to); never fails for an unreachable broker."""

    @abstractmethod
    async def send(self, topic: str, key: str, msg: dict[str, Any]) -> None:
        """Accept one message for ``topic`` keyed by ``key``; returns without waiting for delivery."""

    async def flush(self, timeout: float | None = None) -> bool:
        """Wait until everything accepted so far is delivered; False if ``timeout`` passed first."""
        return True

    async def close(self) -> None:  # noqa: B027 - an optional hook
        """Flush briefly and release connections; what is left stays in the spool."""


class MemoryPublisher(Publisher):
    """Keeps ``(topic, key, msg)`` tuples in :attr:`messages`; for tests and dry runs."""

    def __init__(self) -> None:
        super().__init__()
        self.messages: list[tuple[str, str, dict[str, Any]]] = []

    async def send(self, topic: str, key: str, msg: dict[str, Any]) -> None:
        if self.check(topic, msg):
            self.messages.append((topic, key, msg))
            self.sent += 1

    def of_kind(self, kind: str) -> list[dict[str, Any]]:
        return [m for _, _, m in self.messages if m.get("kind") == kind]


def json_line(topic: str, key: str, msg: dict[str, Any]) -> str:
    """One message as ``--print`` writes it: a compact JSON object with its ``topic`` and ``key``, and a newline.

    The one output format of ``whywait agent --print`` (every round, and ``--once``), which
    ``whywait events check`` and ``whywait topology import agent`` read back.
    """
    return json.dumps({"topic": topic, "key": key, **msg}, separators=(",", ":")) + "\n"


class PrintPublisher(Publisher):
    """Writes each message as one JSON line (``--print``): :func:`json_line`."""

    def __init__(self, out: IO[str] | None = None) -> None:
        super().__init__()
        self.out = out or sys.stdout

    async def send(self, topic: str, key: str, msg: dict[str, Any]) -> None:
        if self.check(topic, msg):
            self.out.write(json_line(topic, key, msg))
            self.out.flush()
            self.sent += 1


class Spool:
    """A bounded, ordered, on-disk queue of ``(topic, key, value)`` records in segment files."""

    SUFFIX = ".spool"

    def __init__(self, directory: str, max_bytes: int = 64 << 20, logger: logging.Logger | None = None,
                 bound_flag: str | None = None) -> None:
        self.dir = directory
        self.max_bytes = max(int(max_bytes), 4096)
        self.segment_bytes = max(self.max_bytes // 8, 1024)
        os.makedirs(directory, exist_ok=True)
        self.dropped = 0
        self.log = logger or log
        self.bound_flag = bound_flag  # the flag that sets max_bytes, named in the drop warning
        self._drops_said = Throttle()
        self._fresh = False  # the last write failed: the next record starts a new segment (no torn line before it)
        # seq -> [records, bytes]; the head segment's first `self._head_done` records were sent.
        self._segments: dict[int, list[int]] = {}
        self._head_done = 0
        self._head_cache: list[tuple[str, str, bytes]] | None = None
        self._peek_seq: int | None = None
        self._fh: IO[bytes] | None = None
        for name in sorted(os.listdir(directory)):
            if name.endswith(self.SUFFIX) and name[: -len(self.SUFFIX)].isdigit():
                path = os.path.join(directory, name)
                records = sum(1 for _ in self._read_segment(path))
                self._segments[int(name[: -len(self.SUFFIX)])] = [records, os.path.getsize(path)]
        for seq, (records, _) in list(self._segments.items()):
            if records == 0:
                self._remove(seq)

    def __len__(self) -> int:
        return sum(r for r, _ in self._segments.values()) - self._head_done

    @property
    def size_bytes(self) -> int:
        return sum(b for _, b in self._segments.values())

    def _path(self, seq: int) -> str:
        return os.path.join(self.dir, f"{seq:012d}{self.SUFFIX}")

    def _read_segment(self, path: str) -> Any:
        try:
            with open(path, "rb") as fh:
                for line in fh:
                    try:
                        topic, key, value = jsonl.loads(line)
                        yield str(topic), str(key), value.encode() if isinstance(value, str) else b""
                    except (ValueError, TypeError):
                        continue  # a torn last line after a crash
        except OSError:
            return

    def append(self, topic: str, key: str, value: bytes) -> None:
        """Add one record at the tail.  Raises ``OSError`` when the folder cannot be written (a full disk, a
        read-only file system, permissions); the spool is unchanged then and takes the next record."""
        line = (json.dumps([topic, key, value.decode()], separators=(",", ":")) + "\n").encode()
        tail = max(self._segments) if self._segments else None
        new = tail is None or self._fresh or self._segments[tail][1] + len(line) > self.segment_bytes or \
            (tail == min(self._segments) and self._head_cache is not None)
        if new:
            tail = (tail + 1) if tail is not None else 1
            if self._fh is not None:
                self._fh.close()
                self._fh = None
        assert tail is not None
        if self._fh is None:
            self._fh = open(self._path(tail), "ab")  # raises before anything is recorded
        if new:
            self._segments[tail] = [0, 0]
        try:
            self._fh.write(line)
            self._fh.flush()
        except OSError:
            fh, self._fh = self._fh, None
            try:
                fh.close()
            except OSError:
                pass
            self._fresh = True  # a torn line may end this segment: the next record goes to a new one
            if self._segments[tail][0] == 0:
                self._remove(tail)
            raise
        self._fresh = False
        self._segments[tail][0] += 1
        self._segments[tail][1] += len(line)
        while self.size_bytes > self.max_bytes and len(self._segments) > 1:
            head = min(self._segments)
            lost = self._segments[head][0] - self._head_done
            self.dropped += lost
            self._say_drops(lost)
            self._remove(head)

    def _say_drops(self, lost: int) -> None:
        """Warn about messages dropped past the bound: the first time, then at most once a minute."""
        first = self._drops_said.last == float("-inf")
        count = self._drops_said.due(lost)
        if count is None:
            return
        flag = f" ({self.bound_flag})" if self.bound_flag else ""
        hint = f"; raise {self.bound_flag} to keep more of an outage" if self.bound_flag else ""
        self.log.warning("spool %s is full at %s%s: dropped its oldest %d message(s)%s, %d in all since "
                         "start%s (said at most once a minute)", self.dir, size_text(self.max_bytes), flag,
                         count, "" if first else " since the last warning", self.dropped,
                         hint)

    def peek(self, n: int) -> list[tuple[str, str, bytes]]:
        """The oldest unsent records, at most ``n``, all from the head segment.

        A head segment that holds nothing more (its file gone: another process sharing this folder
        delivered it, or emptied by hand) is forgotten, and the next one read: an empty answer means
        the spool is empty, never "ask again" (a publisher did, in a loop that never yielded).
        """
        while self._segments:
            head = min(self._segments)
            self._peek_seq = head
            if self._head_cache is None:
                if head == max(self._segments) and self._fh is not None:
                    self._fh.close()  # the head is also the tail: the next append starts a new segment
                    self._fh = None
                self._head_cache = list(self._read_segment(self._path(head)))
            out = self._head_cache[self._head_done: self._head_done + n]
            if out or n <= 0:
                return out
            self._remove(head)
        return []

    def commit(self, n: int) -> None:
        """The first ``n`` records returned by :meth:`peek` were delivered."""
        if not self._segments or n <= 0:
            return
        head = min(self._segments)
        if head != self._peek_seq:
            return  # the peeked segment was dropped past the bound meanwhile
        self._head_done += n
        if self._head_cache is not None and self._head_done >= len(self._head_cache):
            self._remove(head)

    def _remove(self, seq: int) -> None:
        if seq == min(self._segments, default=None):
            self._head_done = 0
            self._head_cache = None
        if seq == max(self._segments, default=None) and self._fh is not None:
            self._fh.close()
            self._fh = None
        self._segments.pop(seq, None)
        try:
            os.unlink(self._path(seq))
        except OSError:
            pass

    def close(self) -> None:
        if self._fh is not None:
            self._fh.close()
            self._fh = None


class KafkaPublisher(Publisher):
    """Sends to Kafka through aiokafka (``acks="all"``, idempotent, gzip) with an on-disk spool.

    ``send`` never waits on the broker: a background task delivers messages in
    batches, spooling them when the broker is unreachable and retrying with
    backoff.  ``producer_factory`` (tests) builds the producer.  ``logger`` is the
    user's (the agent's, a hook's); ``spool_flag`` and ``bound_flag`` name the
    flags that set the spool folder and its bound, for the warnings.
    """

    def __init__(self, bootstrap: str, spool_dir: str, spool_max_bytes: int = 64 << 20,
                 batch: int = 500, request_timeout_ms: int = 10_000, max_backoff_s: float = 10.0,
                 producer_factory: Any = None, memory_max: int = 10_000, logger: logging.Logger | None = None,
                 spool_flag: str | None = None, bound_flag: str | None = None) -> None:
        super().__init__()
        self.log = logger or log
        self.bootstrap = bootstrap
        self.spool_flag = spool_flag
        self.spool = Spool(spool_dir, spool_max_bytes, logger=self.log, bound_flag=bound_flag)
        self.batch = batch
        self.request_timeout_ms = request_timeout_ms
        self.max_backoff_s = max_backoff_s
        self.memory_max = memory_max
        self._factory = producer_factory
        self._producer: Any = None
        self._queue: deque[tuple[str, str, bytes]] = deque()
        self._connected = False
        self._wake = asyncio.Event()
        self._idle = asyncio.Event()
        self._task: asyncio.Task[None] | None = None
        self._closing = False
        self._inflight: list[tuple[str, str, bytes]] = []
        self.last_error: str | None = None
        self.spool_failed = 0  # messages dropped because the spool could not be written (also in `dropped`)
        self._spool_said = Throttle()
        self._down_since: float | None = None  # monotonic time the current outage was first said
        self._down_said = float("-inf")

    @property
    def spooled(self) -> int:
        return len(self.spool)

    @property
    def dropped_total(self) -> int:
        return self.dropped + self.spool.dropped

    async def start(self) -> None:
        if self._task is None:
            if len(self.spool):
                self.log.info("%d message(s) spooled by an earlier run in %s: sending them first",
                              len(self.spool), self.spool.dir)
            self._task = asyncio.create_task(self._run(), name="whywait-publisher")

    async def send(self, topic: str, key: str, msg: dict[str, Any]) -> None:
        if not self.check(topic, msg):
            return
        record = (topic, key, encode(msg))
        if self._connected and not len(self.spool):
            if len(self._queue) >= self.memory_max:
                self.dropped += 1
                return
            self._queue.append(record)
        else:
            self._to_spool(record)
        self._idle.clear()
        self._wake.set()
        if self._task is None:
            await self.start()

    def _to_spool(self, record: tuple[str, str, bytes]) -> None:
        """Spool one record; one that cannot be written is dropped and counted, and said (once a minute)."""
        try:
            self.spool.append(*record)
        except OSError as exc:
            self.dropped += 1
            self.spool_failed += 1
            if self._spool_said.due() is None:
                return
            flag = f" (set by {self.spool_flag})" if self.spool_flag else ""
            self.log.warning("cannot write the spool %s%s: %s; messages Kafka has not taken are dropped "
                             "(%d so far; said at most once a minute)", self.spool.dir, flag,
                             exc.strerror or exc, self.spool_failed)

    def _pending(self) -> int:
        return len(self._queue) + len(self.spool)

    async def _connect(self) -> bool:
        if self._producer is not None:
            return True
        producer: Any = None
        try:
            if self._factory is not None:
                producer = self._factory()
            else:
                from aiokafka import AIOKafkaProducer  # noqa: PLC0415 - only a Kafka agent needs it

                producer = AIOKafkaProducer(
                    bootstrap_servers=self.bootstrap, acks="all", enable_idempotence=True,
                    compression_type="gzip", linger_ms=50, request_timeout_ms=self.request_timeout_ms,
                    client_id="whywait-agent")
            await producer.start()
        except Exception as exc:
            self._note_down(f"cannot connect: {reason(exc)}")
            if producer is not None:
                try:
                    await producer.stop()
                except Exception:
                    pass
            return False
        self._producer = producer
        self.log.info("Kafka at %s connected", self.bootstrap)
        return True

    def _note_down(self, why: str) -> None:
        """Say an outage when it starts, then once a minute while it lasts (with what waits in the spool)."""
        now = time.monotonic()
        if self._connected or self.last_error is None or self._down_since is None:
            self._down_since = self._down_said = now
            self.log.warning("Kafka at %s unreachable, spooling to %s: %s", self.bootstrap, self.spool.dir, why)
        elif now - self._down_said >= SAY_EVERY_S:
            self._down_said = now
            self.log.warning("Kafka at %s still unreachable after %.0f s; %d message(s) spooled in %s: %s",
                             self.bootstrap, now - self._down_since, len(self.spool) + len(self._queue),
                             self.spool.dir, why)
        self._connected = False
        self.last_error = why

    def _spool_unsent(self, records: list[tuple[str, str, bytes]]) -> None:
        """``records`` (older) then the in-memory queue (newer) go to the spool, in that order."""
        for r in records:
            self._to_spool(r)
        while self._queue:
            self._to_spool(self._queue.popleft())

    async def _deliver(self, records: list[tuple[str, str, bytes]]) -> int:
        """Send ``records`` in order; return how many leading ones were acknowledged.

        When fewer than all were, the producer is thrown away with what it still holds (see
        :meth:`_drop_producer`): the caller spools the rest, and only the spool sends them again.
        """
        futures = []
        try:
            for topic, key, value in records:
                futures.append(await self._producer.send(topic, value=value, key=key.encode()))
        except Exception as exc:
            self._note_down(f"send failed: {reason(exc)}")
        done = 0
        timeout = self.request_timeout_ms / 1000.0 + 5.0
        for fut in futures:
            try:
                await asyncio.wait_for(asyncio.shield(fut), timeout)
            except asyncio.TimeoutError:
                self._note_down(f"not acknowledged within {timeout:.0f} s (the broker is down or does not answer)")
                break
            except Exception as exc:
                self._note_down(f"not acknowledged: {reason(exc)}")
                break
            done += 1
        if done < len(records):
            for fut in futures[done:]:  # their outcome is the spool's business now: no "never retrieved" noise
                fut.add_done_callback(_quiet)
            await self._drop_producer()
        return done

    async def _drop_producer(self) -> None:
        """Throw the producer away without letting it deliver what it still holds.

        aiokafka keeps retrying the batches it was given; had it kept them, it would deliver them after
        reconnecting while the spool sends the same messages again (every message of the ~15 s before an
        outage was noticed arrived twice).  Its sender is stopped first (nothing more goes out), then its
        batches are failed, then it is closed; the next round connects a new one.
        """
        producer, self._producer = self._producer, None
        if producer is None:
            return
        sender = getattr(producer, "_sender", None)
        accumulator = getattr(producer, "_message_accumulator", None)
        try:
            if sender is not None:
                await asyncio.wait_for(sender.close(), 5.0)
            if accumulator is not None:
                accumulator.fail_all(ConnectionError("dropped by whywait: spooled instead"))
        except Exception:  # noqa: BLE001 - aiokafka's internals: stop() below still closes it
            pass
        try:
            await asyncio.wait_for(producer.stop(), 5.0)
        except Exception:  # noqa: BLE001
            pass

    async def _run(self) -> None:
        backoff = 0.5
        while True:
            # Every round yields to the loop: a round that awaits nothing (no record to deliver) must not
            # hold it, or flush()'s timeout and close() never run.
            await asyncio.sleep(0)
            if self._closing:
                return  # close() also cancels, but a wait_for woken at that moment can swallow the cancel
            if not self._pending():
                self._idle.set()
                if self._closing:
                    return
                self._wake.clear()
                await self._wake.wait()
                continue
            if not await self._connect():
                self._spool_unsent([])
                await self._sleep(backoff)
                backoff = min(backoff * 2, self.max_backoff_s)
                continue
            if len(self.spool):
                records = self.spool.peek(self.batch)
                n = await self._deliver(records)
                self.spool.commit(n)
            else:
                self._connected = True
                records = [self._queue.popleft() for _ in range(min(self.batch, len(self._queue)))]
                self._inflight = records
                n = await self._deliver(records)
                self._inflight = []
                if n < len(records):  # the unacknowledged go to the spool ahead of anything newer
                    self._spool_unsent(records[n:])
            self.sent += n
            if n < len(records):
                self._connected = False
                await self._sleep(backoff)
                backoff = min(backoff * 2, self.max_backoff_s)
            else:
                if not len(self.spool):
                    # Until the first connection every message is spooled, so draining is no news then:
                    # "reachable again" only after an outage was said (a one-shot `placement publish`
                    # said it every time, although the broker had never been down).
                    if not self._connected and self.last_error is not None:
                        self.log.info("Kafka at %s reachable again; spool drained", self.bootstrap)
                        self.last_error = None
                        self._down_since = None
                    self._connected = True
                backoff = 0.5

    async def _sleep(self, seconds: float) -> None:
        if self._closing:
            return
        try:
            await asyncio.wait_for(self._wake.wait(), seconds)
        except asyncio.TimeoutError:
            pass
        self._wake.clear()

    @property
    def unreachable(self) -> bool:
        """True once the broker failed to answer and everything handed over is in the spool (nothing in
        memory or in flight): a one-shot sender (a Slurm hook) can stop waiting then; a later run sends it."""
        return self.last_error is not None and not self._connected and not self._queue and not self._inflight

    async def flush(self, timeout: float | None = None) -> bool:
        if not self._pending():
            return True
        await self.start()
        self._wake.set()
        try:
            await asyncio.wait_for(self._idle.wait(), timeout)
            return True
        except asyncio.TimeoutError:
            return False

    async def drain(self, timeout: float) -> bool:
        """Give the broker up to ``timeout`` seconds to take everything accepted; True when it did.

        Stops waiting early once the broker has failed to answer (:attr:`unreachable`): what is left
        stays in the spool.  A broker still being connected to (a one-round agent) gets the time.
        """
        deadline = time.monotonic() + timeout
        while self._pending():
            if self.unreachable or time.monotonic() >= deadline:
                return False
            await self.flush(min(0.1, max(deadline - time.monotonic(), 0.0)))
        return True

    async def close(self, timeout: float = 5.0) -> None:
        """Give the broker up to ``timeout`` seconds to take what is queued (none once it failed to answer:
        a stop during an outage is quick), then stop; what was not delivered stays in the spool."""
        if self._task is not None and self._pending():
            await self.drain(timeout)
        self._closing = True
        self._wake.set()
        if self._task is not None:
            self._task.cancel()
            try:
                await self._task
            except (asyncio.CancelledError, Exception):
                pass
            self._task = None
        held = bool(self._inflight)
        self._spool_unsent(self._inflight)  # anything not delivered survives in the spool
        self._inflight = []
        if held:
            await self._drop_producer()  # what it held is in the spool now: it must not send it too
        elif self._producer is not None:
            try:
                await asyncio.wait_for(self._producer.stop(), timeout)
            except Exception:
                pass
            self._producer = None
        self.spool.close()


def _quiet(fut: "asyncio.Future[Any]") -> None:
    if not fut.cancelled():
        fut.exception()
