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
``$WHYWAIT_AGENT_SOCKET``); see :mod:`whywait.agents.training` for the datagrams.  Its
trust model (``docs/security.md``):

* the socket is mode 0660, owned by a configurable group (``--socket-group``,
  default ``whywait`` when that group exists, else the agent's own): only members
  can send at all;
* the kernel tells the agent each sender's uid and pid (``SO_PASSCRED`` /
  ``SCM_CREDENTIALS``, which the sender cannot forge); the first uid to report a job
  on this node owns it there, and datagrams for that job from any other uid (root
  and the agent's own user excepted) are refused, counted and logged;
* the node is always the agent's own, never what the datagram claims, and the
  published batch names the sending user (``sender_uid``, ``sender_user``) so the
  engine can check it against the placement's ``user``.
"""

from __future__ import annotations

import asyncio
import grp
import json
import logging
import math
import os
import pwd
import socket
import struct
import time
from typing import Any, Callable, Iterable

from whywait.agents.collectors.base import AgentConfigError, Collector
from whywait.agents.collectors.bmc import SlowdownWatch
from whywait.agents.collectors.fit import clean_prose, name_ok
from whywait.agents.collectors.host import HostCollector
from whywait.agents.events import (
    FIELD_BOUNDS,
    PHASE_SLACK,
    RANK_MAX,
    STRING_MAX_BY_FIELD,
    TOPIC_AGENT_HEALTH,
    TOPIC_CHECKPOINTS,
    TOPIC_STEPS,
    UNIT_BOUNDS,
    envelope,
    topic_for_kind,
)
from whywait.agents.publisher import Publisher

log = logging.getLogger("whywait.agent")

MAX_STEPS_PER_JOB = 20_000  # per interval; past it steps are dropped and counted
SOCKET_GROUP = "whywait"  # the default group allowed to write the training socket, when it exists
OWNER_TTL_S = 3600.0  # a job silent this long on this node may be claimed by another user (a new run)
MAX_JOBS = 1024  # distinct jobs tracked per node: a flood of invented job names cannot grow memory
MAX_SAID = 1024  # distinct (job, reason) pairs of refused datagrams logged; past it, none more until restart
_UCRED = struct.Struct("3i")  # struct ucred: pid, uid, gid
# What the contract takes from a datagram's numbers (a datagram is the training process's word, and a
# value the contract refuses would cost the whole job's batch for the interval at the publisher).
_STEP_MAX = FIELD_BOUNDS["step"][1]
_SECONDS_MAX = UNIT_BOUNDS["s"][1]
_EPOCH_MAX = UNIT_BOUNDS["s since epoch (UTC)"][1]
_BYTES_MAX = 2 ** 63 - 1


class TrainingInbox:
    """Turns the training module's datagrams into ``steps`` batches and ``checkpoint`` messages.

    Fed by :meth:`feed` (raw datagram bytes); :meth:`take_steps` empties the
    per-job step buffers once per interval; :meth:`take_checkpoints` the
    checkpoint messages.  Malformed datagrams are skipped and counted.
    """

    def __init__(self, node: str, trusted_uids: frozenset[int] | None = None) -> None:
        self.node = node
        self.received = 0
        self.malformed = 0
        self.dropped = 0
        self.rejected = 0  # datagrams refused because their sender does not own the job here
        self.pids: set[int] = set()
        self._steps: dict[str, list[dict[str, Any]]] = {}
        self._checkpoints: list[dict[str, Any]] = []
        # job -> (owner uid, monotonic time of its last datagram)
        self.owners: dict[str, tuple[int, float]] = {}
        self.trusted_uids = trusted_uids if trusted_uids is not None else frozenset({0, os.getuid()})
        self._users: dict[str, dict[str, Any]] = {}  # job -> sender_uid (and sender_user) for the batches
        self._said: set[tuple[str, str]] = set()  # (job, reason) of refused datagrams already logged

    def _say(self, job: Any, why: str, msg: str, *args: Any) -> None:
        """Log a refused datagram once per job and reason: a job whose every datagram is refused says so
        once (its step timings are lost), not once per step; the counters see every one."""
        key = (str(job)[:80] if isinstance(job, str) else "?", why)
        if key in self._said or len(self._said) >= MAX_SAID:
            return
        self._said.add(key)
        log.warning(msg + " (said once per job and reason; counted in agent_health and on /metrics)", *args)

    def feed(self, data: bytes, uid: int | None = None, pid: int | None = None) -> None:
        """Take one datagram; ``uid``/``pid`` are the kernel's word on the sender (None: not known).

        A datagram whose job, rank or step the contract would refuse (a control character in the job, a
        rank past 2^31 - 1, a phase longer than its step can hold, a 400-digit number) is malformed: it
        is counted and dropped alone, so it never takes the other ranks' steps of the interval with it
        (the publisher refuses a batch whole).
        """
        self.received += 1
        job: Any = None
        try:
            d = json.loads(data)
            if not isinstance(d, dict):
                raise ValueError("not a JSON object")
            job = d.get("job")
            if "job" not in d or "rank" not in d:
                raise ValueError("no 'job' or no 'rank'")
            rank = d["rank"]
            if not name_ok(job):
                raise ValueError("a job name the contract refuses (empty, over 256 characters, a control "
                                 "character, or not text)")
            if not _is_int(rank) or not 0 <= rank <= RANK_MAX:
                raise ValueError(f"a rank that is no integer from 0 to {RANK_MAX}")
            if uid is not None and not self._may_report(job, uid, pid):
                return
            kind = d.get("type")
            if kind == "step":
                self._step(job, rank, d)
            elif kind == "checkpoint":
                self._checkpoint(job, rank, d)
            else:
                raise ValueError(f"unknown type {kind!r}")
            sender = pid if pid is not None else d.get("pid")  # the kernel's pid when known
            if isinstance(sender, int) and not isinstance(sender, bool) and sender > 0:
                self.pids.add(sender)
        except (ValueError, KeyError, TypeError, RecursionError, OverflowError) as exc:
            self.malformed += 1
            if isinstance(exc, (json.JSONDecodeError, UnicodeDecodeError)):
                why = "not JSON"
            elif isinstance(exc, KeyError):
                why = f"no {exc} field"
            elif isinstance(exc, ValueError) and str(exc):
                why = str(exc)
            else:
                why = type(exc).__name__
            shown = repr(job[:80]) if isinstance(job, str) and name_ok(job[:80]) else "(unnamed)"
            self._say(job, why, "training datagram for job %s refused: %s", shown, why[:200])

    def _may_report(self, job: str, uid: int, pid: int | None) -> bool:
        """Whether ``uid`` may report for ``job`` on this node; pins the job to its first reporter."""
        now = time.monotonic()
        owner = self.owners.get(job)
        if owner is None or now - owner[1] > OWNER_TTL_S:
            if uid in self.trusted_uids:
                return True  # root or the agent's own user: trusted, but never the job's owner by default
            if owner is None and len(self.owners) >= MAX_JOBS:
                self._forget_oldest()
            self.owners[job] = (uid, now)
            self._users[job] = _sender(uid)
            return True
        if uid == owner[0]:
            self.owners[job] = (uid, now)
            return True
        if uid in self.trusted_uids:
            return True
        self.rejected += 1
        self._say(job, f"uid {uid}", "training datagram for job %r refused: sent by uid %d (pid %s), but uid %d "
                  "owns the job on this node", job[:80], uid, pid, owner[0])
        return False

    def _forget_oldest(self) -> None:
        job = min(self.owners, key=lambda j: self.owners[j][1])
        del self.owners[job]
        self._users.pop(job, None)

    def _step(self, job: str, rank: int, d: dict[str, Any]) -> None:
        step = d["step"]
        if not _is_int(step) or not 0 <= step <= _STEP_MAX:
            raise ValueError("bad step")
        rec: dict[str, Any] = {"rank": rank, "step": step}
        for k in ("duration_s", "data_wait_s", "compute_s", "comm_s", "checkpoint_s"):
            v = d.get(k, 0.0)
            if not _is_num(v) or not 0 <= v <= _SECONDS_MAX:
                raise ValueError(f"bad {k}")
            rec[k] = float(v)
        lim = rec["duration_s"] * PHASE_SLACK[0] + PHASE_SLACK[1]  # the contract's bound on a phase
        if any(rec[k] > lim for k in ("data_wait_s", "compute_s", "comm_s", "checkpoint_s")):
            raise ValueError("a phase longer than its step")
        rec["node"] = self.node  # the agent's own node, whatever the datagram claims
        if _is_num(d.get("time")) and 0 <= d["time"] <= _EPOCH_MAX:
            rec["ended_at"] = float(d["time"])
        buf = self._steps.setdefault(job, [])
        if len(buf) >= MAX_STEPS_PER_JOB:
            self.dropped += 1
            return
        buf.append(rec)

    def _checkpoint(self, job: str, rank: int, d: dict[str, Any]) -> None:
        phase = d.get("phase")
        cid = d.get("checkpoint_id")
        if phase not in ("start", "end", "failed") or not name_ok(cid):
            raise ValueError("bad checkpoint")
        # Optional figures the contract would refuse are left out; a time it would refuse is the agent's.
        t = float(d["time"]) if _is_num(d.get("time")) and 0 <= d["time"] <= _EPOCH_MAX else time.time()
        body: dict[str, Any] = {"job": job, "rank": rank, "checkpoint_id": cid, "phase": phase}
        if _is_int(d.get("bytes")) and 0 <= d["bytes"] <= _BYTES_MAX:
            body["bytes"] = d["bytes"]
        if _is_num(d.get("duration_s")) and 0 <= d["duration_s"] <= _SECONDS_MAX:
            body["duration_s"] = float(d["duration_s"])
        path, error = d.get("path"), d.get("error")
        if isinstance(path, str) and path:
            path = path[:STRING_MAX_BY_FIELD["path"]]
            if name_ok(path, STRING_MAX_BY_FIELD["path"]):  # a path with a control character: left out
                body["path"] = path
        error = clean_prose(error, STRING_MAX_BY_FIELD["error"])  # free text: control characters shown as \xNN
        if error:
            body["error"] = error
        body.update(self._users.get(job, {}))
        self._checkpoints.append(envelope("checkpoint", self.node, t, **body))

    def take_steps(self, now: float) -> list[dict[str, Any]]:
        """One ``steps`` message per job with the steps received since the last call.

        A job pinned to a user carries ``sender_uid`` and, when the name resolves here,
        ``sender_user`` (extension fields the contract allows), which the engine checks against
        the placement's ``user``.
        """
        out = []
        for job, steps in self._steps.items():
            if steps:
                out.append(envelope("steps", self.node, now, job=job, steps=steps, **self._users.get(job, {})))
        self._steps = {}
        return out

    def take_checkpoints(self) -> list[dict[str, Any]]:
        out, self._checkpoints = self._checkpoints, []
        return out


def _sender(uid: int) -> dict[str, Any]:
    """``sender_uid``, plus ``sender_user`` when this node can name the uid (a container may not)."""
    try:
        return {"sender_uid": uid, "sender_user": pwd.getpwuid(uid).pw_name}
    except KeyError:
        return {"sender_uid": uid}


def read_datagrams(sock: socket.socket, inbox: TrainingInbox, limit: int = 1000) -> int:
    """Read the waiting datagrams with their senders' credentials into ``inbox``; return how many.

    Called when the socket is readable.  ``SCM_CREDENTIALS`` carries the sender's pid, uid and gid
    as the kernel saw them; without it (a platform without ``SO_PASSCRED``) the sender is unknown.
    """
    n = 0
    space = socket.CMSG_SPACE(_UCRED.size)
    while n < limit:
        try:
            data, anc, _flags, _addr = sock.recvmsg(65536, space)
        except (BlockingIOError, InterruptedError):
            break
        except OSError as exc:
            log.warning("training socket: %s", exc.strerror or exc)
            break
        uid = pid = None
        for level, kind, payload in anc:
            if level == socket.SOL_SOCKET and kind == getattr(socket, "SCM_CREDENTIALS", -1) \
                    and len(payload) >= _UCRED.size:
                pid, uid, _gid = _UCRED.unpack(payload[:_UCRED.size])
        inbox.feed(data, uid=uid, pid=pid)
        n += 1
    return n


def socket_gid(group: str | None) -> int | None:
    """The group the training socket belongs to: ``group`` (name or number), else ``whywait`` if it exists.

    None: leave the agent's own group.  An unknown name raises :class:`AgentConfigError`.
    """
    if group is None:
        try:
            return grp.getgrnam(SOCKET_GROUP).gr_gid
        except KeyError:
            return None
    if group.isdigit():
        return int(group)
    try:
        return grp.getgrnam(group).gr_gid
    except KeyError:
        raise AgentConfigError(f"--socket-group: no group named {group!r} on this node") from None


def bind_training_socket(path: str, gid: int | None = None) -> socket.socket:
    """Bind the agent's Unix datagram socket at ``path`` (mode 0660, group ``gid``), replacing a stale one.

    The socket asks the kernel for its senders' credentials (``SO_PASSCRED``).  Raises
    :class:`AgentConfigError` when another agent is already listening there.
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
    old = os.umask(0o117)  # no window in which the socket exists with wider permissions
    try:
        sock.bind(path)
    finally:
        os.umask(old)
    if gid is not None:
        os.chown(path, -1, gid)
    os.chmod(path, 0o660)
    if hasattr(socket, "SO_PASSCRED"):
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_PASSCRED, 1)
    sock.setblocking(False)
    return sock



def agent_instance(boot_id_path: str = "/proc/sys/kernel/random/boot_id") -> str:
    """This agent process's identity for its health messages: ``<boot id>/<pid>``.

    Called once when the agent starts.  Why: two machines cloned from one image publish under one host
    name, and their telemetry mixes in every metric of that node; the engine tells them apart by this
    (``whywait.duplicate-node``).  The boot id is random per boot (unlike ``/etc/machine-id``, which a
    clone copies), so an operator can match it on the hosts; a restart changes the pid, never back.
    """
    try:
        with open(boot_id_path) as fh:
            boot = fh.read(64).strip()
    except OSError:
        boot = ""
    if not boot or not name_ok(boot):
        boot = os.urandom(8).hex()  # not Linux, or an odd file: still unique to this process
    return f"{boot}/{os.getpid()}"

class Agent:
    """Runs the collectors every ``interval`` seconds and publishes what they return.

    ``clock`` gives event time (wall clock); rates use a monotonic clock.
    """

    def __init__(self, node: str, collectors: Iterable[Collector], publisher: Publisher, interval: float = 1.0,
                 socket_path: str | None = None, clock: Callable[[], float] = time.time,
                 socket_group: str | None = None, socket_required: bool = False) -> None:
        if not node:
            raise AgentConfigError("--node must not be empty")
        if not (interval > 0 and math.isfinite(interval)):
            raise AgentConfigError(f"--interval must be a positive number of seconds (got {interval})")
        self.node = node
        self.collectors = list(collectors)
        self.publisher = publisher
        self.interval = interval
        self.socket_path = socket_path
        self.socket_required = socket_required  # an explicit --socket: failing to bind it is an error
        self.socket_gid = socket_gid(socket_group) if socket_path else None
        # Why the training socket is not listening (None: listening, or no socket asked for).
        self.socket_off: str | None = None
        self.clock = clock
        self.inbox = TrainingInbox(node)
        self.instance = agent_instance()
        self.samples = 0
        self.rounds = 0
        # collector name -> (samples taken, seconds spent): read by agents.observe for /metrics
        self.collector_time: dict[str, tuple[int, float]] = {}
        self._sock: socket.socket | None = None
        self._ckpt_wake = asyncio.Event()
        # The BMC source, if the hw collector runs one: read at once when the node slows down (issue 14).
        self._bmc = next((s for c in self.collectors for s in getattr(c, "sources", ())
                          if callable(getattr(s, "request", None))), None)
        self._watch = SlowdownWatch()

    # --- one round ---------------------------------------------------------
    def prime(self) -> None:
        """Take a first reading from every collector (rates need two); nothing of it is published.

        Each collector's :meth:`~Collector.prime`: a source whose reading uses up what it reads (the
        kernel log, a finished BMC poll) is not read then, and the first round reports it.
        """
        now, mono = self.clock(), time.monotonic()
        for c in self.collectors:
            prime = getattr(c, "prime", None)
            if callable(prime):
                prime(now, mono)
            else:
                c.collect(now, mono)

    def collect(self) -> list[tuple[str, dict[str, Any]]]:
        """Sample every collector once; return ``(topic, message)`` pairs.  Called in a worker thread."""
        now, mono = self.clock(), time.monotonic()
        out = []
        for c in self.collectors:
            t0 = time.perf_counter()
            body = c.collect(now, mono)
            n, s = self.collector_time.get(c.name, (0, 0.0))
            self.collector_time[c.name] = (n + 1, s + time.perf_counter() - t0)
            if body is None:
                continue
            self.samples += 1
            out.append((topic_for_kind(c.kind), envelope(c.kind, self.node, now, **body)))
        return out

    def health(self, now: float) -> dict[str, Any]:
        """The agent's own health message."""
        p = self.publisher
        sources_off = {f"{c.name}.{k}": v for c in self.collectors for k, v in c.parts_off.items()}
        if self.socket_off:
            sources_off["training.socket"] = self.socket_off  # no step timings from this node
        msg = envelope(
            "agent_health", self.node, now,
            samples=self.samples, sent=p.sent, spooled=p.spooled, dropped=p.dropped_total,
            collector_errors=sum(c.errors for c in self.collectors),
            invalid=p.invalid,
            collectors_off={c.name: c.off_reason for c in self.collectors if c.off_reason},
            sources_off=sources_off,
            training_datagrams=self.inbox.received, training_malformed=self.inbox.malformed,
            training_dropped=self.inbox.dropped, training_rejected=self.inbox.rejected,
            instance=self.instance,
        )
        return msg

    def watch_bmc(self, msgs: list[tuple[str, dict[str, Any]]], steps: list[dict[str, Any]]) -> str | None:
        """Ask the BMC source for a read now when this round shows the node slowing down.

        Called once per round with the round's messages and ``steps`` messages; returns the reason
        when a read was asked for.  The engine would otherwise see the node's ranks straggle up to a
        poll interval (30 s) before the BMC's failed fan or power supply that explains them.
        """
        if self._bmc is None:
            return None
        why = None
        for _, msg in msgs:
            if msg.get("kind") == "gpu":
                why = why or self._watch.gpus(msg.get("gpus") or ())
        for msg in steps:
            why = self._watch.steps(str(msg.get("job")), msg.get("steps") or ()) or why
        if why and self._bmc.request(time.monotonic(), why):
            return why
        return None

    def _sync_pids(self) -> None:
        if self.inbox.pids:
            for c in self.collectors:
                if isinstance(c, HostCollector):
                    c.pids |= self.inbox.pids
            self.inbox.pids = set()

    async def publish(self, topic: str, msg: dict[str, Any]) -> None:
        from whywait.agents.events import message_key  # noqa: PLC0415

        await self.publisher.send(topic, message_key(msg).decode(), msg)

    async def run_round(self) -> None:
        """Collect and publish one interval's messages, then the health message."""
        self._sync_pids()
        msgs = await asyncio.to_thread(self.collect)
        now = self.clock()
        steps = self.inbox.take_steps(now)
        self.watch_bmc(msgs, steps)
        for topic, msg in msgs:
            await self.publish(topic, msg)
        for msg in steps:
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
        """Start receiving the training module's datagrams (when a socket path is set).

        A socket that cannot be bound is an :class:`AgentConfigError` when it was asked for explicitly
        (``socket_required``: ``--socket PATH``); the default one is a warning, and :attr:`socket_off`
        (published in ``agent_health``'s ``sources_off`` and on ``/metrics``) says why.
        """
        if not self.socket_path:
            return
        try:
            sock = bind_training_socket(self.socket_path, self.socket_gid)
        except OSError as exc:
            why = f"cannot bind {self.socket_path}: {exc.strerror or exc}"
            if self.socket_required:
                raise AgentConfigError(f"--socket: {why}") from None
            self.socket_off = why
            log.warning("training socket off: %s (no step timings from this node; pass --socket PATH to choose "
                        "another place, or run the agent as root)", why)
            return
        self.socket_off = None
        loop = asyncio.get_running_loop()

        def readable() -> None:
            read_datagrams(sock, self.inbox)
            if self.inbox._checkpoints:
                self._ckpt_wake.set()

        loop.add_reader(sock.fileno(), readable)
        self._sock = sock
        log.info("listening for training timings on %s (mode 0660, group %s)", self.socket_path,
                 self.socket_gid if self.socket_gid is not None else os.getgid())

    def close_socket(self) -> None:
        if self._sock is not None:
            try:
                asyncio.get_running_loop().remove_reader(self._sock.fileno())
            except RuntimeError:
                pass
            self._sock.close()
            self._sock = None
            try:
                os.unlink(self.socket_path)  # type: ignore[arg-type]
            except OSError:
                pass

    async def run(self, rounds: int | None = None, stop: asyncio.Event | None = None) -> None:
        """Run ``rounds`` intervals (forever when None) or until ``stop`` is set."""
        await self.open_socket()  # an explicit --socket that cannot be bound stops here, before anything runs
        ckpt = asyncio.create_task(self._checkpoint_loop())
        try:
            await self.publisher.start()
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
    """A finite number; an int too large for a float (a 400-digit JSON number) is none."""
    if isinstance(v, bool) or not isinstance(v, (int, float)):
        return False
    if isinstance(v, int):
        return -(2 ** 63) <= v < 2 ** 63
    return math.isfinite(v)
