"""The notification pipeline: from diagnoses to deliveries, for any number of receivers.

:meth:`Pipeline.notify` only records the diagnosis (it never blocks the stream on a
sink); worker threads do the rest:

1. the scheduler asks the :class:`~whywait.engine.notify.pipeline.incidents.IncidentBook` what is
   due (first announcement, update, re-announcement, resolution: grouping and timing as in
   Alertmanager), checking the :class:`~whywait.engine.notify.silences.SilenceStore`, and queues one
   item per receiver in the durable :class:`~whywait.engine.notify.pipeline.outbox.Outbox`; it also
   queues a refresh for receivers that want a firing incident re-sent (``refresh_interval``);
2. one sender thread per receiver sends that receiver's items in order (per incident lane),
   no faster than the receiver's ``rate`` per route; a :class:`ReceiverError` with
   ``retryable`` keeps the item and backs off (at least its ``retry_after``), one without
   drops it (counted as failed); an item older than ``outbox_max_age`` is given up, counted
   and logged.  A receiver that is down or slow holds back only its own items;
3. each incident's record (its findings, what was announced, every receiver's receipt) is
   written to the :class:`~whywait.engine.notify.state.StateStore`, so a restarted pipeline edits
   the same messages.  An incident the pipeline opens itself is first looked up in the store, read
   to its end (``_confirm``), before it is announced or saved: another engine worker (the one whose
   job this one took over) may have announced it, and its message is then edited, not posted again.

Nothing here knows a sink: the receivers (``whywait.engine.notify.receivers``) render and send.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import Counter
from dataclasses import dataclass, field
from typing import Any, Callable, Sequence

from whywait.engine.diagnosis import Diagnosis
from whywait.engine.errors import ConfigError, NotifyError
from whywait.engine.notify.base import Notifier
from whywait.engine.notify.format import fmt_time
from whywait.engine.notify.pipeline.config import PipelineConfig
from whywait.engine.notify.pipeline.incidents import Incident, IncidentBook, Step, incident_id
from whywait.engine.notify.pipeline.outbox import Outbox, OutboxItem
from whywait.engine.notify.pipeline.ratelimit import ChannelRateLimiter
from whywait.engine.notify.pipeline.receiver import Announcement, Line, Receiver, ReceiverError
from whywait.engine.notify.silences import InMemorySilenceStore, Silence, SilenceStore
from whywait.engine.notify.state import InMemoryStateStore, StateStore

log = logging.getLogger(__name__)

# Actions a person may take on an incident (Slack's buttons carry these ids; see engine.notify.render).
ACTION_ACK = "whywait.ack"
ACTION_SILENCE_1H = "whywait.silence.1h"
ACTION_SILENCE_4H = "whywait.silence.4h"
ACTION_SILENCE_RESOLVED = "whywait.silence.until-resolved"
ACTION_TIMELINE = "whywait.timeline"
SILENCE_ACTIONS = {ACTION_SILENCE_1H: 3600.0, ACTION_SILENCE_4H: 4 * 3600.0, ACTION_SILENCE_RESOLVED: None}

# How long an incident this notifier opened waits for the state store to say whether another worker announced it.
CONFIRM_PATIENCE_S = 15.0

COUNTERS = ("sent", "posted", "updated", "replied", "retried", "rate_limited", "failed", "given_up")


@dataclass
class _Lane:
    """One receiver's delivery state: pacing, backoff, what it is sending now, its counters."""

    receiver: Receiver
    limiter: ChannelRateLimiter | None
    stats: Counter[str] = field(default_factory=Counter)
    retry_at: float = 0.0  # monotonic; nothing is sent before this (backoff after a failure)
    backoff: float = 0.0
    down_since: float | None = None
    last_error: str | None = None  # while down: why the last try failed
    busy: bool = False
    inflight: int | None = None


class Pipeline(Notifier):
    """Groups, silences, times and queues announcements and delivers them to every receiver.

    ``state_store`` and ``silence_store`` default to in-memory ones; pass Kafka ones
    (``KafkaStateStore``, ``KafkaSilenceStore``) for restarts and shared silences.
    ``clock`` is the wall clock (tests may pass their own).  Receivers are closed with it.
    """

    name = "pipeline"

    def __init__(self, receivers: Sequence[Receiver], config: PipelineConfig | None = None, *,
                 state_store: StateStore | None = None, silence_store: SilenceStore | None = None,
                 clock: Callable[[], float] = time.time, close_stores: bool = False) -> None:
        names = [r.name for r in receivers]
        if not receivers or len(set(names)) != len(names):
            raise ConfigError(f"a pipeline needs one or more receivers with distinct names (got {names})")
        self.config = config or PipelineConfig()
        self.receivers = {r.name: r for r in receivers}
        self._clock = clock
        self._close_state = close_stores or state_store is None
        self._close_silences = close_stores or silence_store is None
        self.state_store = state_store if state_store is not None else InMemoryStateStore()
        self.silences = silence_store if silence_store is not None else InMemorySilenceStore()
        self._cond = threading.Condition()
        try:
            self.book = IncidentBook(self.config, self.state_store.load(), confirm_new=True)
            if self.config.outbox_dir is not None and self.config.outbox_shared_ok:
                self.outbox = Outbox.first_free(self.config.outbox_dir)
            else:
                self.outbox = Outbox(self.config.outbox_dir)
        except BaseException:
            self._close_owned_stores()
            raise
        self._lanes = {r.name: _Lane(r, ChannelRateLimiter(r.rate) if r.rate else None) for r in receivers}
        self._drop_orphans()
        self._ended: list[str] = []  # incidents resolved since the last tick (their silences end)
        self._muted: dict[str, Silence] = {}  # incident key -> the silence holding it (said once in the log)
        self._resolved_unknown = 0
        self._stopping = False
        self._resume()
        self._persist_lock = threading.Lock()
        self._persist_retry_at = 0.0  # monotonic; after a failed save, the next try waits until then
        self._confirm_retry_at = 0.0  # monotonic; after a failed read of the state store (_confirm)
        self._threads = [threading.Thread(target=self._schedule, name="notify-schedule", daemon=True)]
        self._threads += [threading.Thread(target=self._send, args=(lane,), name=f"notify-send-{lane.receiver.name}",
                                           daemon=True) for lane in self._lanes.values()]
        for t in self._threads:
            t.start()

    def _drop_orphans(self) -> None:
        """Items left for a receiver that is no longer configured would wait forever: say so and drop them."""
        orphans: dict[str, int] = {}
        for item in self.outbox.items():
            if item.receiver not in self.receivers:
                orphans[item.receiver] = orphans.get(item.receiver, 0) + 1
                self.outbox.done(item.seq)
        for name, n in orphans.items():
            log.warning("outbox %s: dropped %d delivery(ies) for receiver %r, which is no longer configured "
                        "(WHYWAIT_RECEIVERS)", self.outbox.directory, n, name)

    def _resume(self, keys: set[str] | None = None) -> None:
        """After a restart (or with a receiver added), or for incidents taken from another worker (``keys``):
        queue the first announcement of incidents that were announced but that a receiver never took, unless
        the outbox holds it already."""
        now = self._clock()
        for inc in self.book.incidents.values():
            if not inc.posted or (keys is not None and inc.key not in keys):
                continue
            for r in self.receivers.values():
                if r.name not in inc.receipts and "post" in r.kinds and not self.outbox.has(inc.key, receiver=r.name):
                    self.outbox.append("post", inc.key, inc.lane, now, receiver=r.name)
        if self.book.incidents and keys is None:
            log.info("notifier state: %d incident(s) resumed, %d delivery(ies) waiting in the outbox",
                     len(self.book.incidents), len(self.outbox))

    def _confirm(self) -> None:
        """Settle the incidents this notifier opened against the state store as it is now (read to its end:
        ``StateStore.current``), before any is announced or saved (``IncidentBook.confirm``): when this worker
        has just taken a job over, the worker before it may have announced the same incident, and it must be
        edited, not posted again, and its record (the message's receipt) not overwritten.

        The store unreachable: tried again each second; an incident still unsettled after
        :data:`CONFIRM_PATIENCE_S` goes ahead as opened (posting twice is better than never posting)."""
        with self._cond:
            keys = list(self.book.unconfirmed)
        if not keys:
            return
        try:
            stored: dict[str, dict[str, Any]] | None = self.state_store.current(keys)
        except Exception as exc:
            stored, error = None, exc
        with self._cond:
            now = self._clock()
            if stored is None:
                self._confirm_retry_at = time.monotonic() + 1.0
                late = [k for k in keys if now - self.book.unconfirmed.get(k, now) >= CONFIRM_PATIENCE_S]
                if not late:
                    return
                log.warning("notifier state store unreadable (%s); announcing %d incident(s) without knowing "
                            "whether another engine worker announced them", error, len(late))
                keys, stored = late, {}
            taken = {k for k in keys if self.book.confirm(k, stored.get(k), now)}
            if taken:
                log.info("notifier: continuing %d incident(s) another engine worker announced", len(taken))
                self._resume(taken)
            self._cond.notify_all()

    # ---- the Notifier interface --------------------------------------------------------------

    def notify(self, diagnosis: Diagnosis) -> None:
        """Record ``diagnosis``; the workers announce it when due.  Never blocks on a receiver."""
        with self._cond:
            if self._stopping:
                raise NotifyError("the notifier is closed", retryable=False)
            inc = self.book.observe(diagnosis, self._clock())
            if inc is None:
                self._resolved_unknown += 1
                log.debug("resolution of %s: no incident known for it", diagnosis.fingerprint)
            elif inc.status == "resolved":
                self._ended.append(inc.key)
            self._cond.notify_all()

    def adopt(self, records: dict[str, dict[str, Any]]) -> int:
        """Take over incidents another engine worker announced (state records by key); return how many.

        Called by the partitioned engine when it gains jobs (``engine/stream/scaleout.py``): their
        incidents' later updates then edit the messages the other worker posted.

        A pipeline whose state lives in memory (the console alone) takes none: it never writes the
        state topic, so what is there is other runs' announcements to other receivers, and taking one
        as its own kept it from ever printing that incident (a console group started after an
        Alertmanager run said nothing of a fault still firing in the topic).
        """
        if isinstance(self.state_store, InMemoryStateStore):
            return 0
        with self._cond:
            n = self.book.adopt(records, self._clock())
            self._resume(set(records))  # one announced but never delivered (the worker died first) is posted
            self._cond.notify_all()
            return n

    def flush(self, timeout: float = 10.0) -> bool:
        """Announce everything pending now (not waiting for ``group_wait``/``group_interval``)
        and wait until every receiver has taken it all; False if ``timeout`` passed first."""
        deadline = time.monotonic() + timeout
        with self._cond:
            self.book.force(self._clock())
            self._cond.notify_all()
            while True:
                if self._idle():
                    return True
                remaining = deadline - time.monotonic()
                if remaining <= 0 or not all(t.is_alive() for t in self._threads):
                    return False
                self._cond.wait(min(remaining, 0.1))

    def close(self, timeout: float = 10.0) -> None:
        """Flush for up to ``timeout`` seconds, then stop.  What is left stays in the outbox
        (on disk when configured) for the next start."""
        if self._stopping:
            return
        flushed = self.flush(timeout)
        with self._cond:
            self._stopping = True
            self._cond.notify_all()
        for t in self._threads:
            t.join(timeout=15.0)
        left = len(self.outbox)
        if not flushed and left:
            where = f"in {self.outbox.directory}, sent on the next start" if self.outbox.directory else \
                "and are lost (they were kept in memory only)"
            log.warning("notifier closed with %d delivery(ies) undelivered %s", left, where)
        self._persist()
        self.outbox.close()
        for r in self.receivers.values():
            try:
                r.close()
            except Exception as exc:  # one receiver's cleanup must not keep the others open
                log.warning("closing receiver %s: %s", r.name, exc)
        self._close_owned_stores()

    def _close_owned_stores(self) -> None:
        if self._close_state:
            self.state_store.close()
        if self._close_silences:
            self.silences.close()

    def stats(self) -> dict[str, Any]:
        """Delivery counters, a plain dict: the totals over all receivers (``sent``, ``posted``,
        ``updated``, ``replied``, ``retried``, ``rate_limited``, ``failed``, ``given_up``, ``waiting``),
        ``dropped_unannounced`` and ``resolved_unknown``, and ``receivers``: the same per receiver
        name, plus each receiver's own counters."""
        with self._cond:
            per: dict[str, dict[str, int]] = {}
            total: Counter[str] = Counter({c: 0 for c in COUNTERS})
            for name, lane in self._lanes.items():
                own = {c: lane.stats.get(c, 0) for c in COUNTERS}
                own["waiting"] = self.outbox.count(name)
                total.update(own)
                per[name] = {**lane.receiver.stats(), **own}
            out: dict[str, Any] = dict(total)
            for counters in per.values():  # receivers' own counters (e.g. fallback_channel), summed
                for k, v in counters.items():
                    if k not in out:
                        out[k] = v
                    elif k not in COUNTERS and k != "waiting":
                        out[k] += v
            out["dropped_unannounced"] = self.book.dropped_unannounced
            out["resolved_unknown"] = self._resolved_unknown
            out["receivers"] = per
            return out

    def silenced(self) -> dict[str, Silence]:
        """The incidents a silence holds now, by incident id, as the scheduler last found them: what a
        one-shot sender (``whywait notify send``) reports instead of a delivery."""
        with self._cond:
            return {incident_id(key): s for key, s in self._muted.items()}

    def problems(self) -> dict[str, str]:
        """Why each receiver that is failing now failed last (its error), by receiver name."""
        with self._cond:
            return {name: lane.last_error or "failing" for name, lane in self._lanes.items()
                    if lane.down_since is not None}

    def discard_pending(self) -> dict[str, int]:
        """Drop every delivery still waiting, counted by receiver; for a one-shot sender that gave up and
        says so itself (``close`` then has nothing left to warn about).  One being sent now is dropped from
        the queue too: it is not retried, whatever its attempt in progress turns out to be."""
        with self._cond:
            dropped: Counter[str] = Counter()
            for item in self.outbox.items():
                dropped[item.receiver] += 1
                self.outbox.done(item.seq)
            self._cond.notify_all()
            return dict(dropped)

    # ---- actions (Slack's buttons) -----------------------------------------------------------

    def handle_action(self, action_id: str, ref: str, user: str) -> str:
        """Apply a person's action (``whywait.engine.notify.interactivity``) to the incident whose id or key
        is ``ref``; return a short text for the person."""
        now = self._clock()
        with self._cond:
            inc = self.book.find(ref)
            if inc is None:
                return "whywait no longer tracks this incident."
            key = inc.key
            if action_id == ACTION_ACK:
                steps = self.book.ack(key, user, now)
                answer = "Acknowledged."
            elif action_id in SILENCE_ACTIONS:
                silence = Silence.new({"group": key}, duration=SILENCE_ACTIONS[action_id], created_by=user, now=now,
                                      comment="set from Slack")
                self.silences.add(silence)
                steps = self.book.silenced_by_button(key, silence, now)
                answer = f"Silenced ({silence.id})."
            elif action_id == ACTION_TIMELINE:
                steps = self.book.timeline(key)
                answer = "Timeline posted in the thread."
            else:
                raise NotifyError(f"unknown action {action_id!r}", retryable=False)
            self._enqueue(steps, now)
            self._cond.notify_all()
            return answer

    # ---- scheduling ----------------------------------------------------------------------------

    def _idle(self) -> bool:
        now = self._clock()
        return not any(lane.busy for lane in self._lanes.values()) and not self.outbox.items() and not any(
            inc.due is not None and inc.due <= now for inc in self.book.incidents.values())

    def _enqueue(self, steps: list[Step], now: float) -> None:
        for step in steps:
            inc = self.book.incidents.get(step.key)
            if inc is None:
                continue
            for name, lane in self._lanes.items():
                if step.kind not in lane.receiver.kinds:
                    continue
                if step.kind == "update" and any(i.key == step.key and i.kind == "update" and i.seq != lane.inflight
                                                 for i in self.outbox.items(name)):
                    continue  # an update already queued renders the latest state when it is sent
                meta: dict[str, Any] = {}
                if step.lines:
                    meta["lines"] = [[line.kind, line.text] for line in step.lines]
                if step.raised:
                    meta["raised"] = True
                self.outbox.append(step.kind, step.key, inc.lane, now, text=step.text, meta=meta, receiver=name,
                                   sync=False)
        if steps:
            self.outbox.sync()  # one fsync per batch: a burst of incidents is not one disk flush per item

    def _refresh(self, now: float) -> None:
        """Queue a re-send of each firing incident's state to receivers that want one every
        ``refresh_interval`` (Alertmanager forgets an alert not re-sent within its resolve_timeout)."""
        queued = False
        for name, lane in self._lanes.items():
            every = lane.receiver.refresh_interval
            if not every:
                continue
            for inc in self.book.incidents.values():
                last = inc.delivered_at.get(name)
                if inc.status == "firing" and inc.posted and last is not None and now - last >= every \
                        and not self.outbox.has(inc.key, receiver=name):
                    self.outbox.append("update", inc.key, inc.lane, now, receiver=name, sync=False)
                    queued = True
        if queued:
            self.outbox.sync()

    def _next_refresh(self) -> float | None:
        """The earliest wall time a refresh is due (None: no receiver refreshes, or nothing fires)."""
        times = [inc.delivered_at[name] + lane.receiver.refresh_interval
                 for name, lane in self._lanes.items() if lane.receiver.refresh_interval
                 for inc in self.book.incidents.values()
                 if inc.status == "firing" and inc.posted and name in inc.delivered_at]
        return min(times) if times else None

    def _schedule(self) -> None:
        """Thread: turn due steps into outbox items, and save changed incidents.  Separate from
        sending, so a receiver that hangs delays no decision and no save."""
        while True:
            try:
                if time.monotonic() >= self._confirm_retry_at:
                    self._confirm()  # outside the lock: it reads the state store (Kafka)
                with self._cond:
                    if self._stopping:
                        return
                    now = self._clock()
                    self._enqueue(self.book.due(now, self._silence_for), now)
                    if len(self._muted) > len(self.book.incidents):  # forgotten ones
                        self._muted = {k: v for k, v in self._muted.items() if k in self.book.incidents}
                    self._refresh(now)
                    self._end_silences()
                    self._cond.notify_all()  # the senders, and flush() waiters
                    nxt = min((t for t in (self.book.next_due(), self._next_refresh()) if t is not None), default=None)
                    wait = 1.0 if nxt is None else min(1.0, max(0.0, nxt - now))
                    mono = time.monotonic()
                    unsaved = bool(self.book.removed) or any(k not in self.book.unconfirmed for k in self.book.changed)
                    if unsaved and mono < self._persist_retry_at:  # the store is failing: don't hammer it
                        wait, unsaved = min(wait, self._persist_retry_at - mono), False
                    if self.book.unconfirmed:  # opened meanwhile (notify): settle them now, or at the retry
                        wait = min(wait, max(0.0, self._confirm_retry_at - mono))
                    if not unsaved and wait > 0:
                        self._cond.wait(wait)
                if time.monotonic() >= self._persist_retry_at and not self._persist():
                    self._persist_retry_at = time.monotonic() + 1.0
            except Exception:  # must outlive any bug
                log.exception("notifier (scheduling): unexpected error; continuing")
                time.sleep(1.0)

    def _silence_for(self, inc: Incident) -> Silence | None:
        try:
            silence = self.silences.matching(inc.fields(), self._clock())
        except Exception as exc:  # a broken silence store must not stop notifications
            log.warning("silences unavailable (%s); notifying anyway", exc)
            return None
        if silence is None:
            self._muted.pop(inc.key, None)
        elif (known := self._muted.get(inc.key)) is None or known.id != silence.id:
            self._muted[inc.key] = silence
            v = inc.view()
            until = "until resolved" if silence.ends_at is None else f"until {fmt_time(silence.ends_at)}"
            why = f"by {silence.created_by}" + (f": {silence.comment}" if silence.comment else "")
            # Once per incident and silence (its updates are not said again); `whywait demo` reads this line.
            log.info("incident %s (rule=%s job=%s): silenced by %s %s (%s); its receivers are not notified while "
                     "it holds", inc.id, v.rule_id, v.job or "-", silence.id, until, why)
        return silence

    def _end_silences(self) -> None:
        """Silences set "until resolved" end when their incident does."""
        ended, self._ended = self._ended, []
        for key in ended:
            for s in self.silences.active(self._clock()):
                if s.ends_at is None and s.matchers.get("group") == key:
                    try:
                        self.silences.expire(s.id, by="whywait (incident resolved)")
                    except Exception as exc:
                        log.warning("could not end silence %s: %s", s.id, exc)

    # ---- sending -------------------------------------------------------------------------------

    def _send(self, lane: _Lane) -> None:
        """Thread: deliver one receiver's outbox items in order, paced, backing off on failure."""
        while True:
            try:
                with self._cond:
                    went_idle = lane.busy
                    lane.busy, lane.inflight = False, None
                    if self._stopping:
                        return
                    item, wait = self._pick(lane, time.monotonic())
                    if item is None:
                        # Only when this lane has just finished (flush() waiters, the scheduler): notifying on
                        # every idle wake-up woke the scheduler, whose notify woke this thread again, and the
                        # two ping-ponged for ever (an idle engine burnt a core in its notifier).
                        if went_idle:
                            self._cond.notify_all()
                        self._cond.wait(min(wait, 1.0))
                        continue
                    lane.busy, lane.inflight = True, item.seq
                self._deliver(lane, item)
            except Exception:  # must outlive any bug in one delivery
                log.exception("notifier (sending to %s): unexpected error; retrying shortly", lane.receiver.name)
                with self._cond:
                    lane.busy = False
                    lane.retry_at = time.monotonic() + 1.0

    def _pick(self, lane: _Lane, mono: float) -> tuple[OutboxItem | None, float]:
        """The first queued item of this receiver whose lane has nothing earlier waiting and whose
        route the limiter allows now; else how long until one may be ready."""
        if mono < lane.retry_at:
            return None, lane.retry_at - mono
        seen: set[str] = set()
        wait = float("inf")
        for item in self.outbox.items(lane.receiver.name):
            if item.lane in seen:
                continue
            seen.add(item.lane)
            inc = self.book.incidents.get(item.key)
            if inc is None or lane.limiter is None:
                return item, 0.0  # (forgotten meanwhile: _deliver drops it)
            ready = lane.limiter.ready_at(lane.receiver.rate_key(inc.channel, inc.receipts.get(lane.receiver.name)))
            if ready <= mono:
                return item, 0.0
            wait = min(wait, ready - mono)
        return None, wait

    def _announcement(self, lane: _Lane, item: OutboxItem, inc: Incident, kind: str, now: float) -> Announcement:
        silenced = inc.silenced_by is not None and (
            inc.silenced_until_resolved or (inc.silenced_until is not None and inc.silenced_until > now))
        lines = tuple(Line(str(k), str(t)) for k, t in item.meta.get("lines") or ())
        return Announcement(
            kind=kind, incident_id=inc.id, key=inc.key, status=inc.status, view=inc.view(),  # type: ignore[arg-type]
            findings=tuple(inc.diagnoses()), route=inc.channel, now=now, lines=lines,
            raised=bool(item.meta.get("raised")), receipt=inc.receipts.get(lane.receiver.name),
            acked_by=inc.acked_by, acked_at=inc.acked_at, silenced_by=inc.silenced_by if silenced else None,
            silenced_until=None if inc.silenced_until_resolved else inc.silenced_until,
            resolved_at=inc.resolved_at, attempt=item.attempts, meta=dict(item.meta), queued_at=item.created)

    def _deliver(self, lane: _Lane, item: OutboxItem) -> None:
        r = lane.receiver
        with self._cond:
            now = self._clock()
            inc = self.book.incidents.get(item.key)
            if inc is None:
                self.outbox.done(item.seq)
                return
            if now - item.created > self.config.outbox_max_age:
                self._give_up(lane, item, f"still undelivered after {now - item.created:.0f}s")
                return
            kind = item.kind
            receipt = inc.receipts.get(r.name)
            if kind == "post" and receipt:
                kind = "update"  # taken already (a resumed outbox): update instead of duplicating
            keep = False
            if kind != "post" and not receipt and "post" in r.kinds:
                keep = kind == "reply"  # the first announcement goes first; the reply follows next turn
                kind = "post"
            ann = self._announcement(lane, item, inc, kind, now)
            key_before = r.rate_key(inc.channel, receipt)
        try:
            new_receipt = r.send(ann)
        except ReceiverError as exc:
            if lane.limiter is not None:
                lane.limiter.record(key_before, time.monotonic())
            if exc.retryable:
                self._transient(lane, item, exc)
            else:
                self._failed(lane, item, kind, exc)
            return
        done_at = time.monotonic()
        with self._cond:
            self._recovered(lane)
            inc = self.book.incidents.get(item.key)
            if lane.limiter is not None:
                lane.limiter.record(key_before, done_at)
            first = False
            if inc is not None:
                note = new_receipt.pop("note", None) if isinstance(new_receipt, dict) else None
                if note:
                    inc.note(self._clock(), str(note))
                first = r.name not in inc.receipts
                if new_receipt != inc.receipts.get(r.name):
                    inc.receipts[r.name] = dict(new_receipt or {})
                    first = True
                inc.delivered_at[r.name] = self._clock()
                self.book.changed.add(inc.key)
                if lane.limiter is not None:  # a name and its id (Slack) are one route
                    key_after = r.rate_key(inc.channel, inc.receipts.get(r.name))
                    if key_after != key_before:
                        lane.limiter.record(key_after, done_at)
            lane.stats["sent"] += 1
            lane.stats[{"post": "posted", "update": "updated", "reply": "replied"}[kind]] += 1
            if not keep:
                self.outbox.done(item.seq)
            lane.busy = False
            self._cond.notify_all()
        if first:
            self._persist()  # a new receipt must survive a crash, or a restart would post a duplicate

    def _failed(self, lane: _Lane, item: OutboxItem, kind: str, exc: ReceiverError) -> None:
        with self._cond:
            lane.busy = False
            lane.stats["failed"] += 1
            log.error("%s refused a %s for incident %s (%s); dropped", lane.receiver.name, kind, item.key, exc)
            self.outbox.done(item.seq)
            self._cond.notify_all()

    def _transient(self, lane: _Lane, item: OutboxItem, exc: ReceiverError) -> None:
        with self._cond:
            lane.busy = False
            item.attempts += 1
            lane.stats["retried"] += 1
            if exc.rate_limited:
                lane.stats["rate_limited"] += 1
            first, cap = self.config.retry_backoff
            lane.backoff = first if lane.backoff == 0 else min(cap, lane.backoff * 2)
            pause = max(lane.backoff, exc.retry_after or 0.0)
            lane.retry_at = time.monotonic() + pause
            lane.last_error = str(exc)
            if lane.down_since is None:
                lane.down_since = self._clock()
                where = f"in the outbox {self.outbox.directory}" if self.outbox.directory else "in memory"
                log.warning("%s; %d notification(s) for %s wait %s, retrying", exc,
                            self.outbox.count(lane.receiver.name), lane.receiver.name, where)
            else:
                log.debug("%s still failing (%s); next try in %.1fs", lane.receiver.name, exc, pause)

    def _recovered(self, lane: _Lane) -> None:
        if lane.down_since is not None:
            log.info("%s: delivering again after %.0fs; %d notification(s) waiting", lane.receiver.name,
                     self._clock() - lane.down_since, self.outbox.count(lane.receiver.name))
        lane.down_since, lane.backoff, lane.last_error = None, 0.0, None

    def _give_up(self, lane: _Lane, item: OutboxItem, why: str) -> None:
        lane.stats["given_up"] += 1
        log.error("gave up on a %s %s for incident %s: %s (WHYWAIT_NOTIFY_OUTBOX_MAX_AGE is %.0fs)",
                  lane.receiver.name, item.kind, item.key, why, self.config.outbox_max_age)
        self.outbox.done(item.seq)
        lane.busy = False
        self._cond.notify_all()

    def _persist(self) -> bool:
        """Write changed incident records to the state store, outside the lock (it may be Kafka);
        serialised, so records reach the store in the order they were taken.  False if a write
        failed (the record is kept for the next try)."""
        with self._persist_lock:
            with self._cond:
                # not one still unconfirmed: its record would overwrite another worker's (its message's receipt)
                changed = {k: self.book.incidents[k].to_dict() for k in self.book.changed
                           if k in self.book.incidents and k not in self.book.unconfirmed}
                removed = set(self.book.removed)
                self.book.changed.intersection_update(self.book.unconfirmed)
                self.book.removed.clear()
            failed: set[str] = set()
            for key, rec in changed.items():
                try:
                    self.state_store.put(key, rec)
                except Exception as exc:
                    log.warning("could not save notifier state for %s (%s); will retry", key, exc)
                    failed.add(key)
            for key in removed:
                try:
                    self.state_store.delete(key)
                except Exception as exc:
                    log.warning("could not delete notifier state for %s (%s)", key, exc)
            if failed:
                with self._cond:
                    self.book.changed.update(k for k in failed if k in self.book.incidents)
            return not failed
