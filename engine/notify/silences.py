"""Silences: "don't tell us about this for a while", set from Slack buttons or ``whywait silence``.

A :class:`Silence` matches incidents by their labels (glob patterns, all must
match) and holds for a time, or until the incident it was set on resolves.  The
notification pipeline consults a :class:`SilenceStore` before announcing, for every
receiver; a silenced incident is still kept accurate (updates notify nobody), and its
resolution is always announced if its firing was.

Stores: :class:`InMemorySilenceStore` (tests, single process) and
:class:`KafkaSilenceStore`, a compacted topic (:data:`SILENCES_TOPIC`, key = silence
id) that every notifier follows, so a silence set by the CLI on one machine is
applied by the engine on another.
"""

from __future__ import annotations

import fnmatch
import logging
import math
import threading
import time
import uuid
from abc import ABC, abstractmethod
from dataclasses import asdict, dataclass, field, replace
from typing import Any, Mapping

from whywait.engine.errors import NotifyError

from whywait.errors import EXIT_USAGE

log = logging.getLogger(__name__)

SILENCES_TOPIC = "whywait.silences.v1"

#: The longest a silence may be set for: a year.  Longer is not a silence but a rule change, and an end beyond what the
#: platform's clock can format (``--for 99999999999999999999d``) broke every ``whywait silence list``.  Silences
#: already stored beyond it are still read, shown and expirable; only new ones are held to it.
MAX_SILENCE_S = 365 * 86400.0
MAX_SILENCE_TEXT = "365d"

# Names a matcher may use besides the diagnosis' labels.
MATCH_FIELDS = ("rule_id", "job", "culprit", "severity", "fingerprint", "group", "channel", "team", "project")


class SilenceError(NotifyError):
    """A silence is malformed or names an unknown id; never retryable.

    Bad input, not an unreachable service: the CLI exits 2 for it (``whywait silence add -m job``,
    ``whywait silence expire nosuchid``), where other notify errors exit 3.
    """

    exit_code = EXIT_USAGE

    def __init__(self, message: str) -> None:
        super().__init__(message, retryable=False)


@dataclass(frozen=True)
class Silence:
    """Mutes the incidents whose fields match every matcher, from ``starts_at`` to ``ends_at``.

    ``ends_at`` None means "until the incident resolves" (a ``group`` matcher names it).
    Matcher values are glob patterns (``node-*``); names are labels or one of
    :data:`MATCH_FIELDS`.
    """

    id: str
    matchers: dict[str, str]
    starts_at: float
    ends_at: float | None
    created_by: str
    comment: str = ""
    expired_by: str | None = None

    def __post_init__(self) -> None:
        # Types first: a silence read back from the silences topic may have been written by anyone, and a
        # wrong one must be refused here (and ignored with a warning), not fail later inside notify().
        if not isinstance(self.id, str) or not self.id:
            raise SilenceError(f"a silence id must be a non-empty string (got {self.id!r})")
        if not isinstance(self.matchers, dict) or not all(
                isinstance(k, str) and isinstance(v, str) for k, v in self.matchers.items()):
            raise SilenceError(f"matchers must map names to patterns (got {self.matchers!r:.80})")
        for name in ("starts_at", "ends_at"):
            v = getattr(self, name)
            if not (v is None and name == "ends_at") and (
                    not isinstance(v, (int, float)) or isinstance(v, bool) or not math.isfinite(v)):
                raise SilenceError(f"{name} must be a Unix time in seconds (got {v!r:.40})")
        for name in ("created_by", "comment", "expired_by"):
            v = getattr(self, name)
            if not isinstance(v, str) and not (v is None and name == "expired_by"):
                raise SilenceError(f"{name} must be a string (got {v!r:.40})")
        if not self.matchers:
            raise SilenceError("a silence needs at least one matcher (e.g. job=llm-70b)")
        if self.ends_at is None and "group" not in self.matchers:
            raise SilenceError("a silence without an end must name its incident (group=...)")
        if self.ends_at is not None and self.ends_at <= self.starts_at:
            raise SilenceError(f"a silence must end after it starts (starts {self.starts_at}, ends {self.ends_at})")

    @classmethod
    def new(cls, matchers: Mapping[str, str], *, duration: float | None, created_by: str, comment: str = "",
            now: float | None = None) -> Silence:
        """A silence starting ``now`` for ``duration`` seconds (None: until resolved), with a fresh id.

        ``duration`` must be more than 0 and at most :data:`MAX_SILENCE_S`, else a :class:`SilenceError`.
        """
        if duration is not None:
            if not duration > 0:  # NaN too
                raise SilenceError(f"a silence must last longer than 0s (got {duration!r:.40})")
            if not duration <= MAX_SILENCE_S:
                raise SilenceError(f"a silence lasts at most {MAX_SILENCE_TEXT} (a year; got {duration:.3g}s)")
        now = time.time() if now is None else now
        return cls(id=uuid.uuid4().hex[:12], matchers=dict(matchers), starts_at=now,
                   ends_at=None if duration is None else now + duration, created_by=created_by, comment=comment)

    def active(self, now: float) -> bool:
        """True while the silence holds at ``now``."""
        return self.starts_at <= now and (self.ends_at is None or now < self.ends_at)

    def matches(self, fields: Mapping[str, str]) -> bool:
        """True when every matcher's pattern matches the incident's field of that name."""
        return all(fnmatch.fnmatchcase(str(fields.get(k, "")), v) for k, v in self.matchers.items())

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> Silence:
        """A silence from :meth:`to_dict` output (the silences topic); a :class:`SilenceError` if it is not one."""
        if not isinstance(d, Mapping):
            raise SilenceError(f"a silence must be an object (got {type(d).__name__})")
        return cls(**{k: v for k, v in d.items() if k in cls.__dataclass_fields__})


def parse_matchers(items: list[str]) -> dict[str, str]:
    """``["job=llm-70b", "node=node-0*"]`` → a matcher dict; a :class:`SilenceError` for a malformed item."""
    out: dict[str, str] = {}
    for item in items:
        k, sep, v = item.partition("=")
        if not sep or not k.strip() or not v.strip():
            raise SilenceError(f"a matcher must look like NAME=PATTERN, e.g. job=llm-70b (got {item!r})")
        out[k.strip()] = v.strip()
    return out


class SilenceStore(ABC):
    """Where silences are kept.  Thread-safe; ``list`` includes expired ones."""

    @abstractmethod
    def add(self, silence: Silence) -> None:
        """Store a new silence (or replace one with the same id)."""

    @abstractmethod
    def all(self) -> list[Silence]:
        """Every silence known, oldest first."""

    def expire(self, silence_id: str, *, by: str = "", now: float | None = None) -> Silence:
        """End a silence now; a :class:`SilenceError` if there is no such id."""
        now = time.time() if now is None else now
        current = next((s for s in self.all() if s.id == silence_id), None)
        if current is None:
            raise SilenceError(f"no silence with id {silence_id!r}")
        if not current.active(now):
            return current
        # It ends now.  A silence expired within a millisecond of its start keeps ends_at > starts_at by
        # moving its start back, never its end forward: an expired silence must not hold a moment longer.
        ended = replace(current, starts_at=min(current.starts_at, now - 1e-3), ends_at=now, expired_by=by or None)
        self.add(ended)
        return ended

    def active(self, now: float | None = None) -> list[Silence]:
        """The silences holding at ``now``."""
        now = time.time() if now is None else now
        return [s for s in self.all() if s.active(now)]

    def matching(self, fields: Mapping[str, str], now: float | None = None) -> Silence | None:
        """The first active silence matching ``fields``, or None."""
        return next((s for s in self.active(now) if s.matches(fields)), None)

    def close(self) -> None:  # noqa: B027 - optional hook
        """Release resources."""


@dataclass
class InMemorySilenceStore(SilenceStore):
    """Silences in a dict; share one instance between notifiers to share silences."""

    _items: dict[str, Silence] = field(default_factory=dict)
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def add(self, silence: Silence) -> None:
        with self._lock:
            self._items[silence.id] = silence

    def all(self) -> list[Silence]:
        with self._lock:
            return sorted(self._items.values(), key=lambda s: (s.starts_at, s.id))


class KafkaSilenceStore(SilenceStore):
    """Silences in the compacted topic :data:`SILENCES_TOPIC`, followed in the background.

    ``follow=False`` (the CLI) reads the topic once at start; ``follow=True`` (the
    engine) keeps reading, so silences added elsewhere apply within a second.
    """

    def __init__(self, bootstrap: str, *, topic: str = SILENCES_TOPIC, follow: bool = True,
                 timeout: float = 30.0) -> None:
        from whywait.engine.notify.kafka_kv import CompactedTopic

        self._table = CompactedTopic(bootstrap, topic, follow=follow, client_id="whywait-silences")
        self._table.start(timeout=timeout)

    def add(self, silence: Silence) -> None:
        self._table.put(silence.id, silence.to_dict())

    def all(self) -> list[Silence]:
        items = []
        for key, value in self._table.snapshot().items():
            try:
                items.append(Silence.from_dict(value))
            except (TypeError, ValueError, NotifyError) as exc:
                log.warning("%s: ignoring a malformed silence %r: %s", SILENCES_TOPIC, key, exc)
        return sorted(items, key=lambda s: (s.starts_at, s.id))

    def close(self) -> None:
        self._table.close()
