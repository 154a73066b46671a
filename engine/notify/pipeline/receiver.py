"""The receiver interface: what the pipeline asks of a sink, and what a sink answers.

The pipeline decides *what* to say and *when* (grouping, silences, timing, outbox,
retry); a :class:`Receiver` only says it: :meth:`Receiver.send` takes one
:class:`Announcement` and returns a :data:`Receipt`, or raises :class:`ReceiverError`
saying whether trying again may help.  Receivers are registered by name in
``whywait.engine.notify.receivers.RECEIVERS``.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from typing import Any, ClassVar, Literal, Mapping

from whywait.engine.diagnosis import Diagnosis
from whywait.engine.errors import NotifyError

Kind = Literal["post", "update", "reply"]
ALL_KINDS: frozenset[str] = frozenset({"post", "update", "reply"})

Receipt = dict[str, Any]
"""What a receiver remembers about an incident after a delivery (JSON-ready): e.g. Slack's
``{"channel": ..., "channel_id": ..., "ts": ...}`` so later edits go to the same message.  The
pipeline stores it with the incident (and in the state store, so it survives restarts) and hands
it back in :attr:`Announcement.receipt`.  An optional ``"note"`` is added to the incident's timeline."""


class ReceiverError(NotifyError):
    """A delivery failed.  ``retryable``: the pipeline keeps the item and tries again after a backoff
    (at least ``retry_after`` seconds when given); otherwise the item is dropped and counted as failed.
    ``rate_limited`` marks a refusal for pace (HTTP 429), counted apart."""

    def __init__(self, message: str, *, retryable: bool, retry_after: float | None = None,
                 rate_limited: bool = False) -> None:
        super().__init__(message, retryable=retryable)
        self.retry_after = retry_after
        self.rate_limited = rate_limited


@dataclass(frozen=True)
class Line:
    """One line of a reply, with what it says (``kind``) so a receiver may style it.

    Kinds: ``added``, ``ranks``, ``recovered``, ``raised``, ``lowered``, ``grown``, ``reopened``,
    ``repeat``, ``resolved``, ``silenced``, ``timeline``.  ``text`` is plain text in which values
    from outside (names, entities) are set in Markdown code spans (backticks)."""

    kind: str
    text: str


@dataclass(frozen=True)
class Announcement:
    """One thing to tell a receiver about one incident, with everything needed to say it.

    ``kind``: ``post`` (first announcement), ``update`` (the incident's current state, e.g. an edit
    of the first message), ``reply`` (news about it: ``lines``).  ``view`` is the incident's findings
    merged into one diagnosis; ``findings`` are the findings themselves.  ``route`` is the channel
    routing chose (owner's, severity override, or default).  ``receipt`` is what this receiver
    returned last time for this incident (None before its first delivery).  ``now`` is the time of
    this attempt; ``queued_at`` that of the outbox item, which its retries share.
    """

    kind: Kind
    incident_id: str
    key: str
    status: str  # "firing" | "resolved"
    view: Diagnosis
    findings: tuple[Diagnosis, ...]
    route: str
    now: float
    lines: tuple[Line, ...] = ()
    raised: bool = False  # the reply announces a raised severity (a receiver may page for it)
    receipt: Receipt | None = None
    acked_by: str | None = None
    acked_at: float | None = None
    silenced_by: str | None = None
    silenced_until: float | None = None  # None with silenced_by set: until resolved
    resolved_at: float | None = None
    attempt: int = 0
    meta: Mapping[str, Any] = field(default_factory=dict)
    queued_at: float | None = None  # when the outbox item was queued: the same on every retry of it

    @property
    def text(self) -> str:
        """The reply's lines as plain text."""
        return "\n".join(line.text for line in self.lines)


class Receiver(ABC):
    """A sink for announcements.  Subclasses set :attr:`name` and implement :meth:`send`.

    Called from the pipeline's sender thread for this receiver (one at a time), so ``send`` may
    block on I/O; it must return or raise within its own timeout.
    """

    name: ClassVar[str] = ""
    kinds: ClassVar[frozenset[str]] = ALL_KINDS  # the announcement kinds it wants; others are not queued
    durable: ClassVar[bool] = True  # False: nothing to lose on restart (the console); no disk outbox needed
    rate: float | None = None  # deliveries per second per :meth:`rate_key`; None: unpaced
    refresh_interval: float | None = None  # re-send a firing incident's state this often (Alertmanager)

    @classmethod
    def from_env(cls, env: Mapping[str, str]) -> Receiver:
        """Build from the environment (``make_notifier``); a ``ConfigError`` names a bad variable."""
        raise NotImplementedError(f"receiver {cls.name!r} cannot be configured from the environment")

    def rate_key(self, route: str, receipt: Receipt | None) -> str:
        """The key :attr:`rate` is counted per (default: the route)."""
        return route

    @abstractmethod
    def send(self, announcement: Announcement) -> Receipt:
        """Deliver ``announcement``; return the receipt to keep, or raise :class:`ReceiverError`."""

    def stats(self) -> dict[str, int]:
        """The receiver's own counters (merged into the pipeline's per-receiver stats)."""
        return {}

    def close(self) -> None:  # noqa: B027 - optional hook
        """Release resources; called once when the pipeline closes."""
