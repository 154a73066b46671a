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
import os
import time
from abc import ABC, abstractmethod
from typing import Any

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

    # --- paths and logging -------------------------------------------------
    def path(self, *parts: str) -> str:
        """``root`` joined with an absolute host path such as ``/proc/stat``."""
        return os.path.join(self.root, *(p.lstrip("/") for p in parts))

    def turn_off(self, why: str) -> None:
        """Turn the whole collector off, saying why once."""
        if self.off_reason is None:
            self.off_reason = why
            log.warning("%s collector off: %s", self.label, why)

    def part_off(self, part: str, why: str) -> None:
        """Turn one source inside the collector off (``infiniband``, ``nfs``), saying why once."""
        if part not in self._off_parts:
            self._off_parts[part] = why
            log.info("%s collector: %s off: %s", self.label, part, why)

    def part_on(self, part: str) -> None:
        """A source that was off came back (a file appeared): log it once."""
        if self._off_parts.pop(part, None) is not None:
            log.info("%s collector: %s back on", self.label, part)

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
        """Called once per interval by the agent: :meth:`sample`, but never raises."""
        if not self.enabled:
            return None
        try:
            return self.sample(time.time() if now is None else now, time.monotonic() if mono is None else mono)
        except CollectorOff as exc:
            self.turn_off(str(exc))
        except Exception as exc:  # a bug or an unexpected file shape must not stop the agent
            self.errors += 1
            log.warning("%s collector: sample failed: %s: %s", self.label, type(exc).__name__, exc)
        return None

    def close(self) -> None:  # noqa: B027 - an optional hook
        """Release what the collector holds (NVML, event sets); called once at shutdown."""


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


def parse_psi(text: str | None) -> dict[str, float]:
    """``/proc/pressure/*`` → ``{"some_avg10": 0.1, "full_avg10": 0.2, ...}``; bad lines skipped."""
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
                out[f"{kind}_{k}"] = float(v)
            except ValueError:
                continue
    return out
