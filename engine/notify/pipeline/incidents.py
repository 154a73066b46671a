"""Incidents, grouping and what to say when: the pure core of the notification pipeline.

An *incident* is what one message (in Slack: one message and its thread) stands for.  Diagnoses are grouped into
incidents by :func:`group_key`: the rule, the owner's channel and the values of the
``group_by`` labels (``job`` by default), so eight stragglers of one job behind one
switch become one message, not eight.  Each incident is keyed by that string in
the state store; :func:`incident_id` is its short public id (Slack's buttons carry it).

:class:`IncidentBook` is fed diagnoses (:meth:`~IncidentBook.observe`) and the wall
clock (:meth:`~IncidentBook.due`), and answers with :class:`Step` objects: post
(first announcement), update (current state), reply (news, as :class:`Line` s).  The timing follows
Alertmanager:

* a new incident is announced ``group_wait`` after its first finding (its
  siblings arriving meanwhile join the same first message);
* later *material* changes (findings added or recovered, ranks added, severity
  changed, a value grown by ``evidence_growth``) are announced at most every
  ``group_interval``, as an update plus a short reply;
* an incident still firing with nothing new is re-announced in its thread after
  ``repeat_interval``;
* resolution is announced at once (edit + reply saying when and after how long),
  and always for an incident whose firing was announced, silenced or not.
* An incident that resolves before it was announced is dropped without a word when it
  kept firing for less than ``group_wait`` *of event time* after its detection (it flapped).  One that held longer is
  posted as resolved, with the resolution in its thread: the wall clock is no guide
  when the engine reads a backlog (after an outage, a restart, a replay), where a
  two-minute incident can fire and resolve within the same second of wall time, and
  Alertmanager's wall-clock rule would lose it.

A resolved incident that fires again within ``reopen_within`` reopens its message;
later, it starts a new one.  No I/O and no sink here: the pipeline hands the steps to
every receiver and persists :meth:`Incident.to_dict` records.  Texts are plain, with
outside values in Markdown code spans; receivers escape and style them.
"""

from __future__ import annotations

import hashlib
import logging
from dataclasses import InitVar, asdict, dataclass, field
from typing import Any, Callable, Literal

from whywait.engine.diagnosis import Diagnosis
from whywait.engine.notify.format import fmt_duration, fmt_number, fmt_ranks, fmt_time, merge
from whywait.engine.notify.pipeline.config import PipelineConfig
from whywait.engine.notify.pipeline.receiver import Line
from whywait.engine.notify.silences import Silence

log = logging.getLogger(__name__)

StepKind = Literal["post", "update", "reply"]
_SEVERITY_RANK = {"info": 0, "warning": 1, "critical": 2}


def code(value: object) -> str:
    """``value`` as a Markdown code span (a backtick inside would end it early)."""
    return "`" + str(value).replace("`", "'") + "`"


@dataclass(frozen=True)
class Step:
    """One thing to tell every receiver about incident ``key``: a reply carries its ``lines``;
    ``raised`` marks a reply announcing a raised severity."""

    kind: StepKind
    key: str
    lines: tuple[Line, ...] = ()
    raised: bool = False

    @property
    def text(self) -> str:
        """The reply's lines as plain text."""
        return "\n".join(line.text for line in self.lines)


def _field(d: Diagnosis, name: str) -> str:
    if name in d.labels:
        return str(d.labels[name])
    value = getattr(d, name, None) if name in ("job", "culprit", "severity", "rule_id") else None
    return "" if value is None else str(value)


def routed_channel(d: Diagnosis, config: PipelineConfig) -> str:
    """The route of a new incident for ``d``: the severity's override channel, else the
    owner's team channel, else the default channel."""
    override = config.severity_channels.get(d.severity)
    if override:
        return override
    if d.owner is not None and d.owner.channel:
        return d.owner.channel
    return config.default_channel


def group_key(d: Diagnosis, group_by: tuple[str, ...]) -> str:
    """The incident key of ``d``: rule, owner channel and the ``group_by`` values, ``|``-joined.

    With an empty ``group_by`` every fingerprint is its own incident.
    """
    owner = d.owner.channel if d.owner is not None and d.owner.channel else ""
    if not group_by:
        return f"{d.rule_id}|{owner}|fingerprint={d.fingerprint}"
    return "|".join([d.rule_id, owner, *(f"{name}={_field(d, name)}" for name in group_by)])


def incident_id(key: str) -> str:
    """A short stable id for incident ``key``: the value of its message's buttons (a key holds
    job names and labels, which have no place in a button and may be long)."""
    return hashlib.sha256(key.encode("utf-8")).hexdigest()[:16]


_KIND_NAMES = {str: "a string", int: "a number", float: "a number", bool: "true or false", dict: "an object",
               list: "a list", type(None): "null"}
#: The JSON types of an :class:`Incident` record's fields (what :meth:`Incident.to_dict` writes).
_RECORD_TYPES: dict[str, tuple[type, ...]] = {
    "key": (str,), "rule_id": (str,), "lane": (str,), "channel": (str,), "members": (dict,), "status": (str,),
    "created": (int, float), "due": (int, float, type(None)), "posted": (bool,), "receipts": (dict,),
    "delivered_at": (dict,), "ts": (str, type(None)), "channel_id": (str, type(None)),
    "announced": (dict, type(None)), "last_announced_at": (int, float, type(None)),
    "resolved_at": (int, float, type(None)), "reopen_note": (str, type(None)), "acked_by": (str, type(None)),
    "acked_at": (int, float, type(None)), "silence_id": (str, type(None)), "silenced_by": (str, type(None)),
    "silenced_until": (int, float, type(None)), "silenced_until_resolved": (bool,), "timeline": (list,),
}


@dataclass
class Incident:
    """One message's worth of findings, and what has been said about it (to every receiver)."""

    key: str
    rule_id: str
    lane: str  # the channel routed at creation; orders this incident's deliveries
    channel: str  # the route (channel) the incident goes to
    members: dict[str, dict[str, Any]] = field(default_factory=dict)  # fingerprint -> Diagnosis.to_dict()
    status: str = "firing"  # "firing" | "resolved"
    created: float = 0.0  # wall time of the first finding
    due: float | None = None  # wall time the pending announcement is due; None: none pending
    posted: bool = False  # the first announcement was queued
    receipts: dict[str, dict[str, Any]] = field(default_factory=dict)  # receiver name -> its last receipt
    delivered_at: dict[str, float] = field(default_factory=dict)  # receiver name -> wall time of last delivery
    ts: InitVar[str | None] = None  # legacy records (Slack's message ts): moved into receipts["slack"]
    channel_id: InitVar[str | None] = None
    announced: dict[str, Any] | None = None  # snapshot of what was last announced
    last_announced_at: float | None = None
    resolved_at: float | None = None
    reopen_note: str | None = None
    acked_by: str | None = None
    acked_at: float | None = None
    silence_id: str | None = None
    silenced_by: str | None = None
    silenced_until: float | None = None
    silenced_until_resolved: bool = False
    timeline: list[list[Any]] = field(default_factory=list)  # [time, plain text]

    def __post_init__(self, ts: str | None, channel_id: str | None) -> None:
        if ts is not None or channel_id is not None:  # a record written before receivers were split out
            self.receipts.setdefault("slack", {"channel": self.channel, "channel_id": channel_id, "ts": ts})

    @property
    def id(self) -> str:
        return incident_id(self.key)

    def to_dict(self) -> dict[str, Any]:
        """The JSON-ready record written to the state store.

        ``ts`` and ``channel_id`` repeat the Slack receipt at the top level, where ``whywait report``
        and earlier versions read them (the thread links of a postmortem)."""
        out = asdict(self)
        chat = self.receipts.get("slack") or {}
        out["ts"], out["channel_id"] = chat.get("ts"), chat.get("channel_id")
        return out

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> Incident:
        """Rebuild from :meth:`to_dict` output; unknown keys (a newer writer) are ignored.

        A record of the wrong shape (the state topic is a Kafka topic like any other) raises
        ``ValueError`` naming the field, here, rather than a ``TypeError`` in a later delivery.
        """
        if not isinstance(d, dict):
            raise ValueError(f"an incident record must be an object (got {type(d).__name__})")
        for name, kinds in _RECORD_TYPES.items():
            if name in d and not (isinstance(d[name], kinds) and not (isinstance(d[name], bool) and bool not in kinds)):
                raise ValueError(f"{name} must be {' or '.join(_KIND_NAMES[k] for k in kinds)} (got {d[name]!r:.40})")
        if d.get("status", "firing") not in ("firing", "resolved"):
            raise ValueError(f"status must be firing or resolved (got {d['status']!r:.40})")
        inc = cls(**{k: v for k, v in d.items() if k in cls.__dataclass_fields__})
        inc.diagnoses()  # every member must read back as a diagnosis (DiagnosisFormatError is a ValueError)
        if not all(isinstance(r, dict) for r in inc.receipts.values()) or not all(
                isinstance(t, list) for t in inc.timeline):
            raise ValueError("receipts must be objects and timeline entries lists")
        return inc

    def diagnoses(self) -> list[Diagnosis]:
        return [Diagnosis.from_dict(m) for m in self.members.values()]

    def firing(self) -> list[Diagnosis]:
        return [d for d in self.diagnoses() if d.status == "firing"]

    def view(self) -> Diagnosis:
        """The one diagnosis the root message shows: the firing findings merged, or all of
        them once resolved."""
        firing = self.firing()
        return merge(firing if firing else self.diagnoses())

    def fields(self) -> dict[str, str]:
        """What silences match against: the view's labels and main attributes, the key, the channel."""
        v = self.view()
        out = {k: str(val) for k, val in v.labels.items()}
        out.update({"rule_id": v.rule_id, "job": v.job or "", "culprit": v.culprit or "", "severity": v.severity,
                    "fingerprint": v.fingerprint, "group": self.key, "channel": self.channel,
                    "team": v.owner.team if v.owner else "", "project": v.owner.project if v.owner else ""})
        return out

    def note(self, t: float, text: str, limit: int = 50) -> None:
        """Add a timeline entry (kept to the last ``limit``, the first one always kept)."""
        self.timeline.append([t, text])
        if len(self.timeline) > limit:
            self.timeline[1:] = self.timeline[-(limit - 1):]


def snapshot(inc: Incident) -> dict[str, Any]:
    """What an announcement says, reduced to what decides whether there is news."""
    firing = inc.firing()
    v = inc.view()
    culprits = {d.fingerprint: d.culprit or "" for d in firing}
    return {
        "fingerprints": sorted(culprits),
        "culprits": culprits,
        "ranks": sorted({r for d in firing for r in d.ranks}),
        "severity": v.severity,
        "evidence": {f"{e.metric}|{e.entity}": [e.value, e.unit, e.metric, e.entity] for e in v.evidence},
        "status": inc.status,
    }


def changes(before: dict[str, Any] | None, after: dict[str, Any], growth: float) -> list[Line]:
    """The news between two snapshots, as short lines (empty: nothing worth saying)."""
    if before is None:
        return []
    out: list[Line] = []
    added = [fp for fp in after["fingerprints"] if fp not in before["fingerprints"]]
    gone = [fp for fp in before["fingerprints"] if fp not in after["fingerprints"]]
    new_ranks = sorted(set(after["ranks"]) - set(before["ranks"]))
    if added:
        who = ", ".join(code(after['culprits'].get(fp) or fp) for fp in added[:5])
        more = f" and {len(added) - 5} more" if len(added) > 5 else ""
        out.append(Line("added", f"{len(added)} more finding{'s' if len(added) > 1 else ''}: {who}{more}"))
    if new_ranks:
        out.append(Line("ranks", f"ranks affected: {len(before['ranks'])} → {len(after['ranks'])} "
                                 f"(new: {fmt_ranks(tuple(new_ranks))})"))
    if gone:
        who = ", ".join(code(before['culprits'].get(fp) or fp) for fp in gone[:5])
        out.append(Line("recovered", f"recovered: {who}"))
    s0, s1 = before["severity"], after["severity"]
    if s0 != s1:
        word = "raised" if _SEVERITY_RANK.get(s1, 0) > _SEVERITY_RANK.get(s0, 0) else "lowered"
        out.append(Line(word, f"severity {word}: {s0} → {s1}"))
    for k, (value, unit, metric, entity) in after["evidence"].items():
        old = before["evidence"].get(k)
        if old is None or not old[0] or value is None:
            continue
        if abs(value) >= growth * abs(old[0]):
            u = f" {unit}" if unit else ""
            out.append(Line("grown", f"{code(metric)} on {code(entity)}: {fmt_number(old[0])} → "
                                     f"{fmt_number(value)}{u}"))
    return out


SilenceLookup = Callable[[Incident], "Silence | None"]


class IncidentBook:
    """Every incident the notifier knows, and the clock-driven decisions about them.

    Not thread-safe: the notifier holds its lock around every call.  After each call,
    :attr:`changed` and :attr:`removed` name the records to write or delete.
    """

    def __init__(self, config: PipelineConfig, records: dict[str, dict[str, Any]] | None = None, *,
                 confirm_new: bool = False) -> None:
        self.config = config
        self.confirm_new = confirm_new  # hold what it opens until confirm() (a notifier with a state store)
        self.incidents: dict[str, Incident] = {}
        self._by_fingerprint: dict[str, str] = {}
        self.changed: set[str] = set()
        self.removed: set[str] = set()
        self.dropped_unannounced = 0  # resolved before they were ever announced
        # With confirm_new, the incidents this book opened whose key the shared state store has not been asked
        # about yet (key -> wall time opened): neither announced nor saved until :meth:`confirm`, since another
        # engine worker may have announced the same incident (the worker whose job this one took over) and
        # saving would overwrite its receipt.
        self.unconfirmed: dict[str, float] = {}
        for key, rec in (records or {}).items():
            self._load(key, rec)

    def _load(self, key: str, rec: dict[str, Any]) -> bool:
        """Put one stored record in the book (at start, or adopted from another worker); False if damaged."""
        try:
            inc = Incident.from_dict(rec)
            if not inc.members:  # nothing it could show: view() needs a finding
                raise ValueError("an incident without members")
        except (TypeError, ValueError, KeyError, AttributeError) as exc:
            log.warning("ignoring a damaged notifier state record %r: %s", key, exc)
            return False
        self.incidents[key] = inc
        for fp in inc.members:
            self._by_fingerprint[fp] = key
        return True

    # ---- input -----------------------------------------------------------------------------

    def find(self, ref: str) -> Incident | None:
        """The incident whose key or :func:`incident_id` is ``ref``."""
        inc = self.incidents.get(ref)
        if inc is None:
            inc = next((i for i in self.incidents.values() if i.id == ref), None)
        return inc

    def key_for(self, d: Diagnosis) -> str:
        """The incident key ``d`` belongs to (an existing one holding its fingerprint first)."""
        known = self._by_fingerprint.get(d.fingerprint)
        if known is not None and known in self.incidents:
            return known
        return group_key(d, self.config.group_by)

    def observe(self, d: Diagnosis, now: float) -> Incident | None:
        """Take in one diagnosis at wall time ``now``; return its incident (None if it is
        a resolution of nothing known)."""
        key = self.key_for(d)
        inc = self.incidents.get(key)
        if d.status == "resolved":
            return self._resolve_member(inc, d, now)
        if inc is not None and inc.status == "resolved":
            if inc.posted and inc.resolved_at is not None and now - inc.resolved_at <= self.config.reopen_within:
                inc.status = "firing"
                inc.resolved_at = None
                inc.reopen_note = f"firing again, {fmt_duration(now - (inc.last_announced_at or now))} " \
                                  "after it resolved"
                inc.note(now, "Fired again")
                inc.announced = None  # the reopen note says it all; no diff against the resolved state
                inc.due = now
            else:
                self._forget(key)
                inc = None
                self.removed.discard(key)  # the new record replaces it: deleting after the put lost the new one
        elif inc is None and self.confirm_new:
            self.unconfirmed[key] = now  # unknown here: another worker may have announced it (see confirm)
        if inc is None:
            channel = routed_channel(d, self.config)
            inc = Incident(key=key, rule_id=d.rule_id, lane=channel, channel=channel, created=now,
                           due=now + self.config.group_wait)
            inc.note(d.starts_at, f"Condition began ({d.culprit or d.title})")
            self.incidents[key] = inc
        inc.members[d.fingerprint] = d.to_dict()
        self._by_fingerprint[d.fingerprint] = key
        if inc.posted and inc.due is None and changes(inc.announced, snapshot(inc), self.config.evidence_growth):
            inc.due = max(now, (inc.last_announced_at or now) + self.config.group_interval)
        self.changed.add(key)
        return inc

    def _resolve_member(self, inc: Incident | None, d: Diagnosis, now: float) -> Incident | None:
        if inc is None or d.fingerprint not in inc.members:
            return None
        inc.members[d.fingerprint] = d.to_dict()
        self.changed.add(inc.key)
        if inc.firing():
            if inc.posted and inc.due is None:
                inc.due = max(now, (inc.last_announced_at or now) + self.config.group_interval)
            return inc
        if inc.status == "resolved":
            return inc
        inc.status = "resolved"
        inc.resolved_at = now
        if not inc.posted and not self._held(inc) and inc.key not in self.unconfirmed:
            self._drop_flap(inc)
            return inc
        inc.due = now
        return inc

    def _drop_flap(self, inc: Incident) -> None:
        self.dropped_unannounced += 1
        self._forget(inc.key)

    def _held(self, inc: Incident) -> bool:
        """True when a resolved incident's findings kept firing for ``group_wait`` or more of event
        time (from the first detection to the last end): a real incident, not a flap."""
        ds = inc.diagnoses()
        start = min(d.detected_at for d in ds)
        end = max(d.ends_at if d.ends_at is not None else d.detected_at for d in ds)
        return end - start >= self.config.group_wait

    def adopt(self, records: dict[str, dict[str, Any]], now: float | None = None) -> int:
        """Take in incidents another engine worker announced (their receipts: Slack's message ``ts``);
        keys already held are left as they are, except one this book opened and has not confirmed yet,
        which takes the record over (:meth:`confirm`).  Returns how many were taken.

        Called (under the notifier's lock) when the partitioned engine gains the jobs of another
        worker, so a later update of an incident edits the message that worker posted.
        """
        n = 0
        for key, rec in records.items():
            if key in self.unconfirmed:
                n += self.confirm(key, rec, self.unconfirmed[key] if now is None else now)
            elif key not in self.incidents and self._load(key, rec):
                n += 1
        return n

    def confirm(self, key: str, stored: dict[str, Any] | None, now: float) -> bool:
        """Settle an incident this book opened (:attr:`unconfirmed`) against ``stored``, the shared state
        store's record of its key as read after it was opened: None, nothing there, and it goes ahead as
        opened.  A record there is another engine worker's announcement of the same incident (the worker
        whose job this one took over, which may have died): this book continues *that* incident, its
        receipts (the message to edit), what it said and when, and takes in the findings it has itself
        seen meanwhile, as if it had seen them there.  True if it took a record.
        """
        if self.unconfirmed.pop(key, None) is None:
            return False
        held = self.incidents.get(key)
        if held is None:
            return False
        self.changed.add(key)  # saved from now on, whichever it is
        # (a key forgotten here and not yet deleted from the store: what is there is the one forgotten)
        if stored is None or key in self.removed or not self._load(key, stored):
            if held.status == "resolved" and not held.posted and not self._held(held):
                self._drop_flap(held)  # what observe() held back: nobody announced it, and it flapped
            return False
        taken = self.incidents[key]
        taken.note(now, "Continued by another engine worker")
        for fp, member in held.members.items():
            d = Diagnosis.from_dict(member)
            if d.status == "resolved" and fp not in taken.members:
                taken.members[fp] = member  # came and went before this book confirmed: nothing of its own to say
                self._by_fingerprint[fp] = key
            else:
                self.observe(d, now)
        return True

    def _forget(self, key: str) -> None:
        inc = self.incidents.pop(key, None)
        if inc is not None:
            for fp in inc.members:
                if self._by_fingerprint.get(fp) == key:
                    del self._by_fingerprint[fp]
        self.changed.discard(key)
        self.removed.add(key)
        self.unconfirmed.pop(key, None)

    # ---- the clock -------------------------------------------------------------------------

    def next_due(self) -> float | None:
        """The earliest wall time at which :meth:`due` will have something to do."""
        times = []
        for inc in self.incidents.values():
            if inc.key in self.unconfirmed:  # waits for confirm(), not for the clock
                continue
            if inc.due is not None:
                times.append(inc.due)
            if inc.status == "firing" and inc.posted and inc.last_announced_at is not None:
                times.append(inc.last_announced_at + self.config.repeat_interval)
            if inc.status == "resolved" and inc.resolved_at is not None:
                times.append(inc.resolved_at + self.config.forget_after)
        return min(times) if times else None

    def force(self, now: float) -> None:
        """Make every pending announcement due now (``flush``: don't wait for ``group_wait``)."""
        for inc in self.incidents.values():
            if inc.due is not None and inc.due > now:
                inc.due = now

    def due(self, now: float, silenced: SilenceLookup = lambda inc: None) -> list[Step]:
        """The steps due at wall time ``now``, in order; updates the incidents."""
        out: list[Step] = []
        for key in list(self.incidents):
            inc = self.incidents[key]
            if key in self.unconfirmed:  # nothing said before confirm(): another worker may have said it
                continue
            if inc.status == "resolved":
                if inc.due is not None and inc.due <= now:
                    if not inc.posted and silenced(inc) is not None:  # muted all along: stays unsaid
                        self.dropped_unannounced += 1
                        self._forget(key)
                        continue
                    out.extend(self._announce_resolved(inc, now))
                elif inc.resolved_at is not None and now >= inc.resolved_at + self.config.forget_after:
                    self._forget(key)
                continue
            if inc.due is not None and inc.due <= now:
                out.extend(self._announce_firing(inc, now, silenced(inc)))
            elif inc.posted and inc.last_announced_at is not None \
                    and now >= inc.last_announced_at + self.config.repeat_interval:
                out.extend(self._repeat(inc, now, silenced(inc)))
        return out

    def _announce_firing(self, inc: Incident, now: float, silence: Silence | None) -> list[Step]:
        if not inc.posted and silence is not None:
            # Looked at again each group_interval, not only at the silence's end: a silence expired early
            # (`whywait silence expire`) lets the incident through then, and one stored with an end in the
            # far future does not keep it quiet for ever.
            again = now + self.config.group_interval
            inc.due = again if silence.ends_at is None else min(silence.ends_at, again)
            return []  # nothing to save: a restart looks at the silences again anyway
        self.changed.add(inc.key)
        snap = snapshot(inc)
        if not inc.posted:
            inc.posted = True
            inc.due = None
            inc.announced, inc.last_announced_at = snap, now
            n = len(snap["fingerprints"])
            inc.note(now, f"Announced in {inc.channel}" + (f" ({n} findings)" if n > 1 else ""))
            return [Step("post", inc.key)]
        news = changes(inc.announced, snap, self.config.evidence_growth)
        if inc.reopen_note:
            news.insert(0, Line("reopened", inc.reopen_note))
            inc.reopen_note = None
        inc.due = None
        if not news:
            return []
        before = inc.announced or snap
        inc.announced = snap
        for line in news:
            inc.note(now, line.text)
        if silence is not None:
            return [Step("update", inc.key)]  # keep the message true; an update pings nobody
        inc.last_announced_at = now
        raised = _SEVERITY_RANK.get(snap["severity"], 0) > _SEVERITY_RANK.get(before["severity"], 0)
        return [Step("update", inc.key), Step("reply", inc.key, tuple(news), raised=raised)]

    def _repeat(self, inc: Incident, now: float, silence: Silence | None) -> list[Step]:
        self.changed.add(inc.key)
        inc.last_announced_at = now
        if silence is not None:
            return []
        v = inc.view()
        ranks = f" · ranks {fmt_ranks(v.ranks)}" if v.ranks else ""
        culprit = f" · culprit {code(v.culprit)}" if v.culprit else ""
        inc.note(now, "Re-announced (still firing)")
        return [Step("update", inc.key),
                Step("reply", inc.key, (Line("repeat", f"still firing since {fmt_time(v.starts_at)} "
                                                       f"({fmt_duration(now - v.starts_at)}){ranks}{culprit}"),))]

    def _announce_resolved(self, inc: Incident, now: float) -> list[Step]:
        self.changed.add(inc.key)
        inc.due = None
        inc.announced, inc.last_announced_at = snapshot(inc), now
        v = inc.view()
        end = v.ends_at if v.ends_at is not None else (inc.resolved_at or now)
        text = f"resolved at {fmt_time(end)} after {fmt_duration(end - v.starts_at)}"
        reply = Step("reply", inc.key, (Line("resolved", text),))
        if not inc.posted:  # it resolved before its group_wait was up (a backlog): post it as it ended
            inc.posted = True
            inc.note(now, f"Announced in {inc.channel} after it resolved")
            return [Step("post", inc.key), reply]
        inc.note(now, "Resolved")
        return [Step("update", inc.key), reply]

    # ---- actions (Slack's buttons, or any other front end) ------------------------------------

    def ack(self, key: str, user: str, now: float) -> list[Step]:
        """Record an acknowledgement; the root message is edited to show who and when."""
        inc = self.incidents.get(key)
        if inc is None:
            return []
        inc.acked_by, inc.acked_at = user, now
        inc.note(now, f"Acknowledged by {user}")
        self.changed.add(key)
        return [Step("update", key)] if inc.posted else []

    def silenced_by_button(self, key: str, silence: Silence, now: float) -> list[Step]:
        """Record a silence set from the message's buttons: edit the root, say so in the thread."""
        inc = self.incidents.get(key)
        if inc is None:
            return []
        inc.silence_id, inc.silenced_by = silence.id, silence.created_by
        inc.silenced_until = silence.ends_at
        inc.silenced_until_resolved = silence.ends_at is None
        until = "until resolved" if silence.ends_at is None else \
            f"for {fmt_duration(silence.ends_at - now)} (until {fmt_time(silence.ends_at)})"
        text = f"silenced {until} by {silence.created_by}"
        inc.note(now, text)
        self.changed.add(key)
        if not inc.posted:
            return []
        return [Step("update", key), Step("reply", key, (Line("silenced", text),))]

    def timeline(self, key: str) -> list[Step]:
        """Reply in the thread with the incident's timeline."""
        inc = self.incidents.get(key)
        if inc is None or not inc.posted:
            return []
        lines = [f"• {fmt_time(t)}  {text}" for t, text in inc.timeline]
        return [Step("reply", key, (Line("timeline", "Timeline\n" + "\n".join(lines)),))]
