"""Step and checkpoint timings from inside a training script.

A training script imports this module (standard library only: no torch, no
Kafka client) and wraps its loop::

    from whywait.agents.training import Reporter
    rep = Reporter()                      # job and rank from the scheduler (see job_id_from_env)
    batches = iter(loader)
    for n in range(steps):
        with rep.step(n):
            with rep.data_wait():
                batch = next(batches)
            with rep.compute():
                loss = model(batch); loss.backward()
            with rep.comm():
                optimizer.step()          # where the un-overlapped all-reduce waits

Each completed step is one JSON datagram sent, fire-and-forget, over a local
Unix datagram socket to the node agent (``/run/whywait/agent.sock``, or
``$WHYWAIT_AGENT_SOCKET``).  The socket is non-blocking: with no agent
listening, its buffer full, or no permission to write it (the agent's socket
is mode 0660: the training user must be in its group, see
``docs/security.md``), the event is dropped and counted in
:attr:`Reporter.dropped`.  Nothing here raises inside the training loop; a
failure to report never costs a step.  The agent learns who sent each
datagram from the kernel, and always reports its own node, whatever ``node``
a datagram carries.

Datagram shapes (``v`` is this module's datagram version)::

    {"v": 1, "type": "step", "job", "rank", "node"?, "pid", "time", "step",
     "duration_s", "data_wait_s", "compute_s", "comm_s", "checkpoint_s"}
    {"v": 1, "type": "checkpoint", "job", "rank", "pid", "time", "checkpoint_id",
     "phase": "start"|"end"|"failed", "bytes"?, "duration_s"?, "path"?, "error"?}

Adapters for PyTorch Lightning and Hugging Face ``transformers`` live in
:mod:`whywait.agents.integrations` and import those libraries only when asked for.
"""

from __future__ import annotations

import functools
import json
import os
import re
import socket
import time
import uuid
from typing import Any, Callable, Mapping, TypeVar

DEFAULT_SOCKET = "/run/whywait/agent.sock"
SOCKET_ENV = "WHYWAIT_AGENT_SOCKET"
JOB_ENV = "WHYWAIT_JOB"
# What the event contract refuses in a name (whywait.agents.events.STRING_MAX, NOT_IN_NAMES; this module
# imports nothing of whywait's, so tests/agents/test_training.py checks the two agree): a job id the agent
# would refuse is said when the Reporter is made, not lost with every step.
JOB_MAX = 256
_NOT_IN_NAMES = re.compile("[\x00-\x1f\x80-\x9f\ud800-\udfff]")
DATAGRAM_VERSION = 1
PHASES = ("data_wait", "compute", "comm", "checkpoint")

F = TypeVar("F", bound=Callable[..., Any])


def slurm_job_id(job_id: str | int, array_job_id: str | int | None = None,
                 array_task_id: str | int | None = None) -> str:
    """The job id whywait gives a Slurm job: ``slurm-<id>``, or ``slurm-<array id>_<task>`` for an array task.

    The one format shared by ``whywait placement slurm`` (which publishes the job's placement) and
    :class:`Reporter` (whose steps must name the same job, or the engine cannot join them).
    """
    if array_job_id not in (None, "") and array_task_id not in (None, ""):
        return f"slurm-{array_job_id}_{array_task_id}"
    return f"slurm-{job_id}"


def job_id_from_env(env: Mapping[str, str] | None = None) -> str | None:
    """The job id the placement hooks publish for the job this process runs in, from its environment.

    ``$WHYWAIT_JOB`` when set (Kubernetes: the watcher's ``NAMESPACE/JOB``, set through the downward
    API; any scheduler the hooks do not cover), else Slurm's ``SLURM_JOB_ID`` (and array ids) as
    ``slurm-<id>``; None when neither is there.
    """
    env = os.environ if env is None else env
    explicit = (env.get(JOB_ENV) or "").strip()
    if explicit:
        return explicit
    jid = (env.get("SLURM_JOB_ID") or "").strip()
    if jid:
        return slurm_job_id(jid, (env.get("SLURM_ARRAY_JOB_ID") or "").strip(),
                            (env.get("SLURM_ARRAY_TASK_ID") or "").strip())
    return None


def rank_from_env(env: Mapping[str, str] | None = None) -> int | None:
    """This process's global rank: ``RANK`` (torchrun, Kubeflow, accelerate), else Slurm's ``SLURM_PROCID``."""
    env = os.environ if env is None else env
    for key in ("RANK", "SLURM_PROCID"):
        v = (env.get(key) or "").strip()
        if v.isdigit():
            return int(v)
    return None


def socket_path(path: str | None = None) -> str:
    """The agent's socket: ``path``, else ``$WHYWAIT_AGENT_SOCKET``, else the default."""
    return path or os.environ.get(SOCKET_ENV) or DEFAULT_SOCKET


class _Phase:
    """Times one phase of the current step (``with reporter.compute():``)."""

    __slots__ = ("_rep", "_name", "_t0")

    def __init__(self, rep: Reporter, name: str) -> None:
        self._rep = rep
        self._name = name
        self._t0 = 0.0

    def __enter__(self) -> _Phase:
        self._t0 = time.perf_counter()
        return self

    def __exit__(self, *exc: object) -> None:
        self._rep._add(self._name, time.perf_counter() - self._t0)


class _Step:
    """Times one whole step and sends it when the block ends (even on an exception)."""

    __slots__ = ("_rep", "_n", "_t0", "phases")

    def __init__(self, rep: Reporter, n: int) -> None:
        self._rep = rep
        self._n = n
        self._t0 = 0.0
        self.phases = dict.fromkeys(PHASES, 0.0)

    def __enter__(self) -> _Step:
        self._t0 = time.perf_counter()
        self._rep._current = self
        return self

    def __exit__(self, *exc: object) -> None:
        duration = time.perf_counter() - self._t0
        self._rep._current = None
        self._rep._send_step(self._n, duration, self.phases)


class Reporter:
    """Reports one rank's step and checkpoint timings to the node agent.

    ``job`` and ``rank`` identify the rank.  ``job`` must be the id the job's placement carries, or the
    engine has steps it cannot join to any placement (and says so in its log); left out, it is the
    scheduler's (:func:`job_id_from_env`: ``slurm-$SLURM_JOB_ID`` as ``whywait placement slurm``
    publishes it, or ``$WHYWAIT_JOB``).  ``rank`` left out is ``$RANK`` or ``$SLURM_PROCID``.
    ``node`` is optional and informative only (the node agent always reports its own node).  ``sock``
    overrides the socket path.  Counters: :attr:`sent` and :attr:`dropped` (events the agent could not
    be given).

    Raises ValueError, when it is created and never later, if neither the arguments nor the environment
    give the job or the rank.
    """

    def __init__(self, job: str | None = None, rank: int | None = None, node: str | None = None,
                 sock: str | None = None) -> None:
        if job is None:
            job = job_id_from_env()
            if job is None:
                raise ValueError(f"Reporter: no job id: pass job=..., or set {JOB_ENV} (under Slurm, "
                                 "SLURM_JOB_ID gives it); it must be the id the job's placement carries")
        if rank is None:
            rank = rank_from_env()
            if rank is None:
                raise ValueError("Reporter: no rank: pass rank=..., or run it where RANK (torchrun) or "
                                 "SLURM_PROCID (srun) is set")
        job = str(job)
        if not job or len(job) > JOB_MAX or _NOT_IN_NAMES.search(job):
            raise ValueError(f"Reporter: job id {job[:60]!r}{'...' if len(job) > 60 else ''} would be refused by "
                             f"the agent: 1 to {JOB_MAX} characters with no control characters")
        self.job = job
        self.rank = int(rank)
        self.node = node
        self.path = socket_path(sock)
        self.sent = 0
        self.dropped = 0
        self.pid = os.getpid()
        self._sock: socket.socket | None = None
        self._current: _Step | None = None
        self._pending = dict.fromkeys(PHASES, 0.0)  # phases timed outside any step go to the next one
        self._ckpt: dict[str, float] = {}

    # --- timing ------------------------------------------------------------
    def step(self, n: int) -> _Step:
        """``with reporter.step(n):`` times step ``n``; the phases inside are attributed to it."""
        s = _Step(self, int(n))
        for k, v in self._pending.items():
            s.phases[k] += v
        self._pending = dict.fromkeys(PHASES, 0.0)
        return s

    def data_wait(self) -> _Phase:
        """Time spent waiting on the input pipeline (``next(loader)``)."""
        return _Phase(self, "data_wait")

    def compute(self) -> _Phase:
        """Forward and backward compute."""
        return _Phase(self, "compute")

    def comm(self) -> _Phase:
        """Collective communication not overlapped with compute."""
        return _Phase(self, "comm")

    def checkpoint(self) -> _Phase:
        """Time inside a checkpoint save during the step."""
        return _Phase(self, "checkpoint")

    def timed(self, phase: str) -> Callable[[F], F]:
        """Decorator: every call of the function counts as ``phase`` of the current step.

        ``@reporter.timed("data_wait") def next_batch(): ...``
        """
        if phase not in PHASES:
            raise ValueError(f"phase must be one of {', '.join(PHASES)} (got {phase!r})")

        def wrap(fn: F) -> F:
            @functools.wraps(fn)
            def inner(*args: Any, **kwargs: Any) -> Any:
                with _Phase(self, phase):
                    return fn(*args, **kwargs)
            return inner  # type: ignore[return-value]
        return wrap

    def timed_step(self, fn: F) -> F:
        """Decorator for a function that runs one whole step and takes the step number first."""
        @functools.wraps(fn)
        def inner(n: int, *args: Any, **kwargs: Any) -> Any:
            with self.step(n):
                return fn(n, *args, **kwargs)
        return inner  # type: ignore[return-value]

    def _add(self, phase: str, seconds: float) -> None:
        target = self._current.phases if self._current is not None else self._pending
        target[phase] += seconds

    # --- checkpoints ---------------------------------------------------------
    def checkpoint_start(self, path: str | None = None, checkpoint_id: str | None = None) -> str:
        """A checkpoint save begins; returns its id (pass it to :meth:`checkpoint_end`)."""
        cid = checkpoint_id or f"{self.job}-r{self.rank}-{uuid.uuid4().hex[:12]}"
        self._ckpt[cid] = time.perf_counter()
        self._send({"type": "checkpoint", "checkpoint_id": cid, "phase": "start",
                    **({"path": str(path)} if path else {})})
        return cid

    def checkpoint_end(self, bytes: int | None = None, path: str | None = None,  # noqa: A002 - the brief's name
                       checkpoint_id: str | None = None) -> None:
        """The save ``checkpoint_id`` (default: the latest started) ended, writing ``bytes``."""
        cid, duration = self._ckpt_done(checkpoint_id)
        msg: dict[str, Any] = {"type": "checkpoint", "checkpoint_id": cid, "phase": "end"}
        if bytes is not None:
            msg["bytes"] = int(bytes)
        if duration is not None:
            msg["duration_s"] = duration
        if path:
            msg["path"] = str(path)
        self._send(msg)

    def checkpoint_failed(self, error: str, checkpoint_id: str | None = None) -> None:
        """The save failed; ``error`` says why."""
        cid, duration = self._ckpt_done(checkpoint_id)
        msg: dict[str, Any] = {"type": "checkpoint", "checkpoint_id": cid, "phase": "failed",
                               "error": str(error)[:500] or "unknown"}
        if duration is not None:
            msg["duration_s"] = duration
        self._send(msg)

    def _ckpt_done(self, cid: str | None) -> tuple[str, float | None]:
        if cid is None:
            cid = next(reversed(self._ckpt), None) or f"{self.job}-r{self.rank}-unknown"
        t0 = self._ckpt.pop(cid, None)
        return cid, (round(time.perf_counter() - t0, 6) if t0 is not None else None)

    # --- sending -------------------------------------------------------------
    def _send_step(self, n: int, duration: float, phases: dict[str, float]) -> None:
        msg: dict[str, Any] = {"type": "step", "step": n, "duration_s": round(duration, 6)}
        for k in PHASES:
            msg[f"{k}_s"] = round(phases[k], 6)
        self._send(msg)

    def _send(self, body: dict[str, Any]) -> None:
        try:
            msg = {"v": DATAGRAM_VERSION, "job": self.job, "rank": self.rank, "pid": self.pid,
                   "time": time.time(), **body}
            if self.node:
                msg["node"] = self.node
            data = json.dumps(msg, separators=(",", ":")).encode()
            if self._sock is None:
                s = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
                s.setblocking(False)
                self._sock = s
            self._sock.sendto(data, self.path)
            self.sent += 1
        except Exception:  # no agent, buffer full, anything: the training loop comes first
            self.dropped += 1

    def close(self) -> None:
        """Close the socket (optional; the process exiting does it too)."""
        if self._sock is not None:
            try:
                self._sock.close()
            except OSError:
                pass
            self._sock = None

    def __enter__(self) -> Reporter:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
