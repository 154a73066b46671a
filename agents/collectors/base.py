"""The collector interface and the agents package's exception tree.

::

    AgentError                  anything the node agent reports as one line
    ├── CollectorOff            a collector (or a source inside it) cannot run here; says why
    └── AgentConfigError        bad flags or environment for ``whywait agent``

A collector reads one kind of source (NVML, a dcgm-exporter, ``/proc`` and
``/sys``) and returns the body of one event-contract message per interval.  It
never raises out of :meth:`Collector.collect`: a missing source turns the
collector (or that part of it) off with one log line saying why, a malformed
line is skipped and counted in :attr:`Collector.errors`.
"""

from __future__ import annotations

import logging
import math
import os
import re
import time
from abc import ABC, abstractmethod
from typing import Any

from whywait.agents.collectors.fit import fit
from whywait.agents.errors import AgentConfigError, AgentError, CollectorOff  # noqa: F401  (re-exported)

log = logging.getLogger("whywait.agent")


class Collector(ABC):
    """One source of samples.

    ``root`` prefixes every ``/proc`` and ``/sys`` path so tests point a
    collector at a fixture tree.  ``kind`` is the event-contract kind the body
    returned by :meth:`collect` belongs to.
    """

    name: str = ""
    kind: str = ""

    def __init__(self, root: str = "/") -> None:
        self.root = root
        self.errors = 0           # malformed lines skipped and reads that failed
        self.off_reason: str | None = None
        self._off_parts: dict[str, str] = {}
        self._sampled = False     # a sample has run to its end once: the collector can run here
        self._said: set[Any] = set()  # problems already logged (see say_once)

    # --- paths and logging -------------------------------------------------
    def path(self, *parts: str) -> str:
        """``root`` joined with an absolute host path such as ``/proc/stat``."""
        return os.path.join(self.root, *(p.lstrip("/") for p in parts))

    def turn_off(self, why: str) -> None:
        """Turn the whole collector off, saying why once."""
        if self.off_reason is None:
            self.off_reason = why
            log.warning("%s collector off: %s", self.label, why)

    def part_off(self, part: str, why: str, level: int = logging.INFO) -> None:
        """Turn one source inside the collector off (``infiniband``, ``nfs``), saying why once (at ``level``:
        a part this host simply lacks is news, a part the operator asked for and cannot be read a warning)."""
        if part not in self._off_parts:
            self._off_parts[part] = why
            log.log(level, "%s collector: %s off: %s", self.label, part, why)

    def part_on(self, part: str) -> None:
        """A source that was off came back (a file appeared): log it once."""
        if self._off_parts.pop(part, None) is not None:
            log.info("%s collector: %s back on", self.label, part)

    def say_once(self, key: Any, msg: str, *args: Any, level: int = logging.WARNING) -> None:
        """Log ``msg`` the first time ``key`` comes up, never again: a file that stays bad, or a bug that
        fails every round, must not write a line every interval for as long as it lasts.  Every
        occurrence is still counted in :attr:`errors` (published in ``agent_health``) by the caller.
        At most :data:`SAY_ONCE_KEYS` distinct problems are remembered (and logged) per collector."""
        if key in self._said or len(self._said) >= SAY_ONCE_KEYS:
            return
        self._said.add(key)
        log.log(level, msg, *args)

    @property
    def label(self) -> str:
        return {"gpu": "GPU", "dcgm": "DCGM"}.get(self.name, self.name.capitalize() or type(self).__name__)

    @property
    def parts_off(self) -> dict[str, str]:
        """The sources inside this collector that are off, with why."""
        return dict(self._off_parts)

    @property
    def enabled(self) -> bool:
        return self.off_reason is None

    def read(self, *parts: str, part: str | None = None) -> str | None:
        """Read a text file under ``root``; None (and ``part`` off, when given) if it cannot be read."""
        p = self.path(*parts)
        try:
            with open(p, encoding="utf-8", errors="replace") as fh:
                text = fh.read()
        except OSError as exc:
            if part is not None:
                self.part_off(part, f"cannot read {p}: {exc.strerror or exc}")
            return None
        if part is not None:
            self.part_on(part)
        return text

    # --- the interface -----------------------------------------------------
    @abstractmethod
    def sample(self, now: float, mono: float) -> dict[str, Any] | None:
        """Read the source once; return the message body, or None when there is nothing yet.

        ``now`` is wall-clock time (the event time), ``mono`` a monotonic clock
        used for rates.  Counter-based collectors return None on their first
        call (a rate needs two readings).
        """

    def collect(self, now: float | None = None, mono: float | None = None) -> dict[str, Any] | None:
        """Called once per interval by the agent: :meth:`sample`, but never raises, and never returns what
        the event contract refuses.

        * :class:`CollectorOff` on the first sample turns the collector off (it cannot run here).  Once a
          sample has run, the same words only skip this reading, with one line, until a sample runs again:
          a ``/proc/stat`` read empty, truncated or unreadable for a moment must not silence the host
          collector until the agent restarts.
        * Any other exception (a bug, an unexpected file shape) skips the reading and is counted; each
          distinct failure (its type and the line it was raised at) is logged once, not every interval.
        * The body goes through :func:`~whywait.agents.collectors.fit.fit`: what the contract would refuse
          (a damaged counter's 10^21 bytes/s, a name holding an escape sequence) is left out instead of
          costing the whole message at the publisher; each distinct problem is logged once.
        """
        if not self.enabled:
            return None
        try:
            body = self.sample(time.time() if now is None else now, time.monotonic() if mono is None else mono)
        except CollectorOff as exc:
            if not self._sampled:
                self.turn_off(str(exc))
                return None
            self.errors += 1
            if "readings" not in self._off_parts:
                log.warning("%s collector: skipping its readings until it can read again: %s", self.label, exc)
            self._off_parts["readings"] = str(exc)
            return None
        except Exception as exc:  # a bug or an unexpected file shape must not stop the agent
            self.errors += 1
            self.say_once(failure_key(exc), "%s collector: sample failed: %s: %s "
                          "(counted; logged once)", self.label, type(exc).__name__, str(exc)[:300])
            return None
        self._sampled = True
        if self._off_parts.pop("readings", None) is not None:
            log.info("%s collector: reading again", self.label)
        if body is None:
            return None
        body, problems = fit(self.kind, body)
        if problems:
            self.errors += len(problems)
            new = [p for p in dict.fromkeys(problems) if p not in self._said]
            if new and len(self._said) < SAY_ONCE_KEYS:
                self._said.update(new)
                log.warning("%s collector: left out what the event contract refuses: %s (each problem is "
                            "logged once)", self.label, "; ".join(new[:5]) + (f" (+{len(new) - 5} more)"
                                                                           if len(new) > 5 else ""))
        return body

    def prime(self, now: float | None = None, mono: float | None = None) -> None:
        """The agent's first reading, taken only so that rates have a start; nothing of it is published.

        :meth:`collect` by default.  A collector with a source whose reading uses up what it reads (the
        kernel log) overrides this so that the source is not read now, and the first round reports it.
        """
        self.collect(now, mono)

    @property
    def down(self) -> bool:
        """True while the collector has nothing to publish from a source it was asked to read (on
        ``/metrics`` as ``whywait_agent_collector_off``, like a collector turned off)."""
        return self.off_reason is not None

    def close(self) -> None:  # noqa: B027 - an optional hook
        """Release what the collector holds (NVML, event sets); called once at shutdown."""


SAY_ONCE_KEYS = 256  # distinct problems a collector remembers having logged


def failure_key(exc: BaseException, *more: Any) -> tuple[Any, ...]:
    """What makes a failure the same failure again: its type and the line that raised it (not its message,
    which may carry the changing value that caused it)."""
    tb = exc.__traceback__
    while tb is not None and tb.tb_next is not None:
        tb = tb.tb_next
    where = (tb.tb_frame.f_code.co_filename, tb.tb_lineno) if tb is not None else None
    return ("failed", type(exc).__name__, where, *more)


COUNTER_MAX = 2 ** 64 - 1  # the kernel's counters are at most 64-bit unsigned


def read_text(path: str) -> str | None:
    """The whole of a small file (sysfs, procfs), or None when it cannot be read.

    Called by the collectors for every attribute they read; a device that vanished between listing
    and reading is absent, not an error.
    """
    try:
        with open(path, encoding="utf-8", errors="replace") as fh:
            return fh.read()
    except OSError:
        return None


def parse_int(text: str) -> int | None:
    """An integer from a sysfs file (``"4: ACTIVE"`` → 4 is not wanted; plain digits only)."""
    try:
        return int(text.strip())
    except ValueError:
        return None


def parse_counter(text: str | None) -> int | None:
    """A kernel counter (a sysfs statistic, a ``/proc`` column): plain ASCII digits of an unsigned 64-bit
    integer.  Anything else (``-1``, ``2**70``, ``1e400``, ``NaN``, a truncated or empty file) is None:
    no counter holds it, and a rate taken from it would be absurd."""
    t = (text or "").strip()
    if not t or len(t) > 20 or not (t.isascii() and t.isdigit()):
        return None
    v = int(t)
    return v if v <= COUNTER_MAX else None


_GBPS = re.compile(r"\s*(\d{1,7}(?:\.\d{1,6})?)\s*Gb/sec")
MAX_MBPS = 1e9  # the contract's bound for a link speed (Mbit/s)


def parse_gbps(text: str | None) -> float | None:
    """An InfiniBand/RoCE ``rate`` file (``"400 Gb/sec (4X NDR)"``) → Mbit/s (400000.0); None when the file
    says no speed a link can have (garbage, ``1e400``, a 400-digit number, ``1.2.3``)."""
    m = _GBPS.match(text or "")
    if not m:
        return None
    mbps = float(m.group(1)) * 1000.0
    return mbps if 0 < mbps <= MAX_MBPS else None


def parse_word(text: str | None, cap: int = 64) -> str:
    """A one-word sysfs attribute (``operstate``, ``state``, ``link_layer``): its first line, stripped; ""
    when that is empty, longer than ``cap`` or not printable ASCII (a damaged file), so no escape
    sequence or megabyte line travels on as a state."""
    line = (text or "").split("\n", 1)[0].strip()
    return line if len(line) <= cap and line.isascii() and line.isprintable() else ""


def parse_psi(text: str | None) -> dict[str, float]:
    """``/proc/pressure/*`` → ``{"some_avg10": 0.1, "full_avg10": 0.2, ...}``; bad lines skipped.

    The averages are percentages: a value that is not a finite number within 0..100 (a damaged file's
    ``NaN``, ``1e400``, ``-1``) is left out rather than published.
    """
    out: dict[str, float] = {}
    if not text:
        return out
    for line in text.splitlines():
        kind, _, rest = line.partition(" ")
        if kind not in ("some", "full"):
            continue
        for item in rest.split():
            k, _, v = item.partition("=")
            try:
                x = float(v)
            except ValueError:
                continue
            if math.isfinite(x) and x >= 0 and (x <= 100.0 or not k.startswith("avg")):
                out[f"{kind}_{k}"] = x
    return out
