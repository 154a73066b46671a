"""The node agent: every interval, sample each collector and publish one message per source.

Per interval (default 1 s) the agent

1. takes one sample from each collector (in a worker thread, so a slow
   dcgm-exporter scrape does not hold up the training socket),
2. publishes each body as one message of its kind (``gpu``, ``net``,
   ``storage``, ``host``), keyed by node,
3. publishes one ``steps`` message per job with the steps the training module
   reported on the Unix socket during the interval (checkpoint events are
   published as they arrive),
4. publishes its own health (``agent_health``).

The training socket is a Unix datagram socket (``/run/whywait/agent.sock`` or
``$WHYWAIT_AGENT_SOCKET``); see :mod:`agents.training` for the datagrams.  It
is made world-writable so training jobs of any user on the node can report;
a local user could therefore inject step timings (telemetry only, nothing runs).
"""

from __future__ import annotations

import asyncio
import json
import logging
import math
import os
import socket
import time
from typing import Any, Callable, Iterable

from agents.collectors.base import AgentConfigError, Collector
from agents.collectors.host import HostCollector
from agents.events import TOPIC_AGENT_HEALTH, TOPIC_CHECKPOINTS, TOPIC_STEPS, envelope, topic_for_kind
from agents.publisher import Publisher

log = logging.getLogger("whywait.agent")

MAX_STEPS_PER_JOB = 20_000  # per interval; past it steps are dropped and counted


class TrainingInbox:
    """Turns the training module's datagrams into ``steps`` batches and ``checkpoint`` messages.

    Fed by :meth:`feed` (raw datagram bytes); :meth:`take_steps` empties the
    per-job step buffers once per interval; :meth:`take_checkpoints` the
    checkpoint messages.  Malformed datagrams are skipped and counted.
    """

    def __init__(self, node: str) -> None:
        self.node = node
        self.received = 0
        self.malformed = 0
        self.dropped = 0
        self.pids: set[int] = set()
        self._steps: dict[str, list[dict[str, Any]]] = {}
        self._checkpoints: list[dict[str, Any]] = []

    def feed(self, data: bytes) -> None:
        self.received += 1
        try:
            d = json.loads(data)
            if not isinstance(d, dict):
                raise ValueError("not an object")
            job = d["job"]
            rank = d["rank"]
            if not isinstance(job, str) or not job or not _is_int(rank):
                raise ValueError("bad job or rank")
            kind = d.get("type")
            if kind == "step":
                self._step(job, rank, d)
            elif kind == "checkpoint":
                self._checkpoint(job, rank, d)
            else:
                raise ValueError(f"unknown type {kind!r}")
            pid = d.get("pid")
            if isinstance(pid, int) and not isinstance(pid, bool) and pid > 0:
                self.pids.add(pid)
        except (ValueError, KeyError, TypeError):
            self.malformed += 1

    def _step(self, job: str, rank: int, d: dict[str, Any]) -> None:
        step = d["step"]
        if not _is_int(step) or step < 0:
            raise ValueError("bad step")
        rec: dict[str, Any] = {"rank": rank, "step": step}
        for k in ("duration_s", "data_wait_s", "compute_s", "comm_s", "checkpoint_s"):
            v = d.get(k, 0.0)
            if not _is_num(v) or v < 0:
                raise ValueError(f"bad {k}")
            rec[k] = float(v)
        if isinstance(d.get("node"), str) and d["node"]:
            rec["node"] = d["node"]
        if _is_num(d.get("time")):
            rec["ended_at"] = float(d["time"])
        buf = self._steps.setdefault(job, [])
        if len(buf) >= MAX_STEPS_PER_JOB:
            self.dropped += 1
            return
        buf.append(rec)

    def _checkpoint(self, job: str, rank: int, d: dict[str, Any]) -> None:
        phase = d.get("phase")
        cid = d.get("checkpoint_id")
        if phase not in ("start", "end", "failed") or not isinstance(cid, str) or not cid:
            raise ValueError("bad checkpoint")
        t = float(d["time"]) if _is_num(d.get("time")) else time.time()
        body: dict[str, Any] = {"job": job, "rank": rank, "checkpoint_id": cid, "phase": phase}
        if _is_int(d.get("bytes")) and d["bytes"] >= 0:
            body["bytes"] = d["bytes"]
        if _is_num(d.get("duration_s")) and d["duration_s"] >= 0:
            body["duration_s"] = float(d["duration_s"])
        for k in ("path", "error"):
            if isinstance(d.get(k), str) and d[k]:
                body[k] = d[k]
        self._checkpoints.append(envelope("checkpoint", self.node, t, **body))

    def take_steps(self, now: float) -> list[dict[str, Any]]:
        """One ``steps`` message per job with the steps received since the last call."""
        out = [envelope("steps", self.node, now, job=job, steps=steps) for job, steps in self._steps.items()
               if steps]
        self._steps = {}
        return out

    def take_checkpoints(self) -> list[dict[str, Any]]:
        out, self._checkpoints = self._checkpoints, []
        return out


class _InboxProtocol(asyncio.DatagramProtocol):
    def __init__(self, inbox: TrainingInbox, on_checkpoint: Callable[[], None]) -> None:
        self.inbox = inbox
        self.on_checkpoint = on_checkpoint

    def datagram_received(self, data: bytes, addr: Any) -> None:
        self.inbox.feed(data)
        if self.inbox._checkpoints:
            self.on_checkpoint()


def bind_training_socket(path: str) -> socket.socket:
    """Bind the agent's Unix datagram socket at ``path``, replacing a stale one.

    Raises :class:`AgentConfigError` when another agent is already listening there.
    """
    os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
    if os.path.exists(path):
        probe = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        try:
            probe.connect(path)
        except OSError:
            os.unlink(path)  # nobody listens: a leftover from an agent that died
        else:
            raise AgentConfigError(f"another agent is already listening on {path}")
        finally:
            probe.close()
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    sock.bind(path)
    os.chmod(path, 0o666)
    sock.setblocking(False)
    return sock


class Agent:
    """Runs the collectors every ``interval`` seconds and publishes what they return.

    ``clock`` gives event time (wall clock); rates use a monotonic clock.
    """

    def __init__(self, node: str, collectors: Iterable[Collector], publisher: Publisher, interval: float = 1.0,
                 socket_path: str | None = None, clock: Callable[[], float] = time.time) -> None:
        if not node:
            raise AgentConfigError("--node must not be empty")
        if not (interval > 0 and math.isfinite(interval)):
            raise AgentConfigError(f"--interval must be a positive number of seconds (got {interval})")
        self.node = node
        self.collectors = list(collectors)
        self.publisher = publisher
        self.interval = interval
        self.socket_path = socket_path
        self.clock = clock
        self.inbox = TrainingInbox(node)
        self.samples = 0
        self.rounds = 0
        self._transport: asyncio.BaseTransport | None = None
        self._ckpt_wake = asyncio.Event()

    # --- one round ---------------------------------------------------------
    def prime(self) -> None:
        """Take a first reading from every collector (rates need two)."""
        now, mono = self.clock(), time.monotonic()
        for c in self.collectors:
            c.collect(now, mono)

    def collect(self) -> list[tuple[str, dict[str, Any]]]:
        """Sample every collector once; return ``(topic, message)`` pairs.  Called in a worker thread."""
        now, mono = self.clock(), time.monotonic()
        out = []
        for c in self.collectors:
            body = c.collect(now, mono)
            if body is None:
                continue
            self.samples += 1
            out.append((topic_for_kind(c.kind), envelope(c.kind, self.node, now, **body)))
        return out

    def health(self, now: float) -> dict[str, Any]:
        """The agent's own health message."""
        p = self.publisher
        msg = envelope(
            "agent_health", self.node, now,
            samples=self.samples, sent=p.sent, spooled=p.spooled, dropped=p.dropped_total,
            collector_errors=sum(c.errors for c in self.collectors),
            invalid=p.invalid,
            collectors_off={c.name: c.off_reason for c in self.collectors if c.off_reason},
            sources_off={f"{c.name}.{k}": v for c in self.collectors for k, v in c.parts_off.items()},
            training_datagrams=self.inbox.received, training_malformed=self.inbox.malformed,
            training_dropped=self.inbox.dropped,
        )
        return msg

    def _sync_pids(self) -> None:
        if self.inbox.pids:
            for c in self.collectors:
                if isinstance(c, HostCollector):
                    c.pids |= self.inbox.pids
            self.inbox.pids = set()

    async def publish(self, topic: str, msg: dict[str, Any]) -> None:
        from agents.events import message_key  # noqa: PLC0415

        await self.publisher.send(topic, message_key(msg).decode(), msg)

    async def run_round(self) -> None:
        """Collect and publish one interval's messages, then the health message."""
        self._sync_pids()
        msgs = await asyncio.to_thread(self.collect)
        now = self.clock()
        for topic, msg in msgs:
            await self.publish(topic, msg)
        for msg in self.inbox.take_steps(now):
            await self.publish(TOPIC_STEPS, msg)
        await self._publish_checkpoints()
        await self.publish(TOPIC_AGENT_HEALTH, self.health(now))
        self.rounds += 1

    async def _publish_checkpoints(self) -> None:
        for msg in self.inbox.take_checkpoints():
            await self.publish(TOPIC_CHECKPOINTS, msg)

    async def _checkpoint_loop(self) -> None:
        while True:
            await self._ckpt_wake.wait()
            self._ckpt_wake.clear()
            await self._publish_checkpoints()

    # --- the loop ----------------------------------------------------------
    async def open_socket(self) -> None:
        """Start receiving the training module's datagrams (when a socket path is set)."""
        if not self.socket_path:
            return
        try:
            sock = bind_training_socket(self.socket_path)
        except OSError as exc:
            log.warning("training socket off: cannot bind %s: %s", self.socket_path, exc.strerror or exc)
            return
        loop = asyncio.get_running_loop()
        self._transport, _ = await loop.create_datagram_endpoint(
            lambda: _InboxProtocol(self.inbox, self._ckpt_wake.set), sock=sock)
        log.info("listening for training timings on %s", self.socket_path)

    def close_socket(self) -> None:
        if self._transport is not None:
            self._transport.close()
            self._transport = None
            try:
                os.unlink(self.socket_path)  # type: ignore[arg-type]
            except OSError:
                pass

    async def run(self, rounds: int | None = None, stop: asyncio.Event | None = None) -> None:
        """Run ``rounds`` intervals (forever when None) or until ``stop`` is set."""
        await self.publisher.start()
        await self.open_socket()
        ckpt = asyncio.create_task(self._checkpoint_loop())
        try:
            await asyncio.to_thread(self.prime)
            start = time.monotonic()
            k = 0
            while rounds is None or k < rounds:
                k += 1
                # Fixed schedule: a slow round skips ahead rather than drifting.
                target = start + k * self.interval
                delay = target - time.monotonic()
                if delay < 0:
                    k += int(-delay // self.interval)
                    delay = 0.0
                if stop is not None:
                    try:
                        await asyncio.wait_for(stop.wait(), delay)
                        break
                    except asyncio.TimeoutError:
                        pass
                else:
                    await asyncio.sleep(delay)
                await self.run_round()
        finally:
            ckpt.cancel()
            self.close_socket()
            await self._publish_checkpoints()
            await self.publisher.close()
            for c in self.collectors:
                c.close()


def _is_int(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _is_num(v: Any) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)
