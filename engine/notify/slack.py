"""The Slack notifier: one living message per incident, in the owning team's channel, never lost.

:meth:`SlackNotifier.notify` only records the diagnosis (it never blocks the
stream on Slack); a worker thread does the rest:

1. asks the :class:`~whywait.engine.notify.lifecycle.IncidentBook` what is due (first
   message, update, re-announcement, resolution: grouping and timing as in
   Alertmanager), checking the :class:`~whywait.engine.notify.silences.SilenceStore`;
2. queues each write in the durable :class:`~whywait.engine.notify.outbox.Outbox`;
3. sends the queue in order, per channel, no faster than ``rate_per_channel``
   (client-side limiter), with slack_sdk's retry handlers for 429 (honouring
   ``Retry-After``), connection errors and 5xx; a write that still fails stays
   queued and is retried with backoff until it goes through, or until it is older
   than ``outbox_max_age``, when it is given up, counted and logged;
4. writes each incident's record (channel, ``ts``, what was announced) to the
   :class:`~whywait.engine.notify.state.StateStore`, so a restarted notifier edits the
   same messages.

A token Slack rejects is reported once, at start, as
``NotifyError("Slack rejected the token (invalid_auth)", retryable=False)``.
The token itself is never logged (slack_sdk redacts the header; we hold it in a
:class:`~whywait.engine.notify.secrets.Secret`).
"""

from __future__ import annotations

import logging
import threading
import time
from collections import Counter
from typing import Any, Callable
from urllib.error import URLError

from slack_sdk import WebClient
from slack_sdk.errors import SlackApiError, SlackClientError
from slack_sdk.http_retry.builtin_handlers import (
    ConnectionErrorRetryHandler,
    RateLimitErrorRetryHandler,
    ServerErrorRetryHandler,
)
from slack_sdk.http_retry.builtin_interval_calculators import BackoffRetryIntervalCalculator
from whywait.engine.diagnosis import Diagnosis
from whywait.engine.errors import NotifyError
from whywait.engine.notify.base import Notifier
from whywait.engine.notify.config import SlackConfig
from whywait.engine.notify.lifecycle import Announcement, Incident, IncidentBook
from whywait.engine.notify.outbox import Outbox, OutboxItem
from whywait.engine.notify.ratelimit import ChannelRateLimiter
from whywait.engine.notify.render import (
    ACTION_ACK,
    ACTION_SILENCE_1H,
    ACTION_SILENCE_4H,
    ACTION_SILENCE_RESOLVED,
    ACTION_TIMELINE,
    MessageContext,
    escape_mrkdwn,
    fallback_text,
    plain_text,
    render_blocks,
)
from whywait.engine.notify.secrets import Secret
from whywait.engine.notify.silences import InMemorySilenceStore, Silence, SilenceStore
from whywait.engine.notify.state import InMemoryStateStore, StateStore

log = logging.getLogger(__name__)
# slack_sdk logs an ERROR line per failed attempt; during an outage we say it once ourselves.
_sdk_log = logging.getLogger("whywait.engine.notify.slack.sdk")
_sdk_log.setLevel(logging.CRITICAL)

AUTH_ERRORS = frozenset({"invalid_auth", "not_authed", "token_revoked", "token_expired", "account_inactive",
                         "missing_scope", "not_allowed_token_type"})
CHANNEL_ERRORS = frozenset({"channel_not_found", "not_in_channel", "is_archived", "restricted_action"})
GONE_ERRORS = frozenset({"message_not_found", "cant_update_message", "edit_window_closed", "thread_not_found"})
FORMAT_ERRORS = frozenset({"invalid_blocks", "invalid_blocks_format", "msg_too_long", "too_many_attachments"})

SILENCE_ACTIONS = {ACTION_SILENCE_1H: 3600.0, ACTION_SILENCE_4H: 4 * 3600.0, ACTION_SILENCE_RESOLVED: None}




class SlackNotifier(Notifier):
    """Posts, edits and threads Slack messages for incidents; see the module docstring.

    ``state_store`` and ``silence_store`` default to in-memory ones; pass Kafka ones
    (``KafkaStateStore``, ``KafkaSilenceStore``) for restarts and shared silences.
    ``clock`` is the wall clock (tests may pass their own).
    """

    name = "slack"

    def __init__(self, token: Secret | str, config: SlackConfig | None = None, *,
                 state_store: StateStore | None = None, silence_store: SilenceStore | None = None,
                 clock: Callable[[], float] = time.time, close_stores: bool = False) -> None:
        self.config = config or SlackConfig()
        self._token = token if isinstance(token, Secret) else Secret(token)
        self._clock = clock
        self._close_state = close_stores or state_store is None
        self._close_silences = close_stores or silence_store is None
        self.state_store = state_store if state_store is not None else InMemoryStateStore()
        self.silences = silence_store if silence_store is not None else InMemorySilenceStore()
        kw: dict[str, Any] = {"base_url": self.config.api_url} if self.config.api_url else {}
        self._client = WebClient(
            token=self._token.reveal(), timeout=max(1, int(self.config.request_timeout)),
            # slack_sdk's defaults retry connection errors only; 429 (after Retry-After) and 5xx are
            # added explicitly.  In-call retries are short: the outbox does the long waiting.
            retry_handlers=[
                ConnectionErrorRetryHandler(max_retry_count=1,
                                            interval_calculator=BackoffRetryIntervalCalculator(backoff_factor=0.2)),
                ServerErrorRetryHandler(max_retry_count=1,
                                        interval_calculator=BackoffRetryIntervalCalculator(backoff_factor=0.2)),
                RateLimitErrorRetryHandler(max_retry_count=self.config.max_429_retries)],
            logger=_sdk_log, **kw)
        self._cond = threading.Condition()
        try:
            self.identity = self._check_token()
            self.book = IncidentBook(self.config, self.state_store.load())
            if self.config.outbox_dir is not None and self.config.outbox_shared_ok:
                self.outbox = Outbox.first_free(self.config.outbox_dir)
            else:
                self.outbox = Outbox(self.config.outbox_dir)
        except BaseException:
            self._close_owned_stores()
            raise
        self._limiter = ChannelRateLimiter(self.config.rate_per_channel)
        self._aliases: dict[str, str] = {}  # channel name -> id, learned from Slack's answers
        self._stats: Counter[str] = Counter()
        self._retry_at = 0.0  # monotonic; no write before this (backoff after a failure)
        self._backoff = 0.0
        self._down_since: float | None = None
        self._auth_failed = False
        self._ended: list[str] = []  # incidents resolved since the last tick (their silences end)
        self._stopping = False
        self._busy = False
        self._inflight: int | None = None
        self._resume()
        self._persist_lock = threading.Lock()
        self._persist_retry_at = 0.0  # monotonic; after a failed save, the next try waits until then
        self._threads = [threading.Thread(target=self._schedule, name="slack-notifier-schedule", daemon=True),
                         threading.Thread(target=self._send, name="slack-notifier-send", daemon=True)]
        for t in self._threads:
            t.start()

    # ---- start -----------------------------------------------------------------------------

    def _check_token(self) -> dict[str, Any]:
        """``auth.test`` once: a rejected token is fatal (one line); an unreachable Slack is not."""
        try:
            resp = self._client.auth_test()
        except SlackApiError as exc:
            err = exc.response.get("error") or f"HTTP {exc.response.status_code}"
            if err in AUTH_ERRORS:
                raise NotifyError(f"Slack rejected the token ({err})", retryable=False) from None
            log.warning("Slack auth.test failed (%s); notifications will wait in the outbox until it answers", err)
            return {}
        except (URLError, OSError, SlackClientError) as exc:
            log.warning("Slack is unreachable at %s (%s); notifications will wait in the outbox",
                        self.config.api_url or "https://slack.com/api/", _reason(exc))
            return {}
        log.info("Slack: connected to %s as %s", resp.get("team"), resp.get("user"))
        return {k: resp.get(k) for k in ("team", "team_id", "user", "user_id", "bot_id")}

    def _resume(self) -> None:
        """After a restart: re-queue the first message of incidents that were due to be posted
        but never were, if the outbox (another machine's, perhaps) does not hold it."""
        now = self._clock()
        for inc in self.book.incidents.values():
            if inc.posted and inc.ts is None and not self.outbox.has(inc.key):
                self.outbox.append("post", inc.key, inc.lane, now)
        if self.book.incidents:
            log.info("notifier state: %d incident(s) resumed, %d write(s) waiting in the outbox",
                     len(self.book.incidents), len(self.outbox))

    # ---- the Notifier interface --------------------------------------------------------------

    def notify(self, diagnosis: Diagnosis) -> None:
        """Record ``diagnosis``; the worker announces it when due.  Never blocks on Slack."""
        with self._cond:
            if self._stopping:
                raise NotifyError("the Slack notifier is closed", retryable=False)
            inc = self.book.observe(diagnosis, self._clock())
            if inc is None:
                self._stats["resolved_unknown"] += 1
                log.debug("resolution of %s: no incident known for it", diagnosis.fingerprint)
            elif inc.status == "resolved":
                self._ended.append(inc.key)
            self._cond.notify_all()

    def flush(self, timeout: float = 10.0) -> bool:
        """Announce everything pending now (not waiting for ``group_wait``/``group_interval``)
        and wait until Slack has taken it all; False if ``timeout`` passed first."""
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
            t.join(timeout=max(5.0, self.config.request_timeout * 3))
        left = len(self.outbox)
        if not flushed and left:
            where = f"in {self.outbox.directory}, sent on the next start" if self.outbox.directory else \
                "and are lost (no outbox folder configured)"
            log.warning("Slack notifier closed with %d write(s) undelivered %s", left, where)
        self._persist()
        self.outbox.close()
        self._close_owned_stores()

    def _close_owned_stores(self) -> None:
        if self._close_state:
            self.state_store.close()
        if self._close_silences:
            self.silences.close()

    @property
    def stats(self) -> dict[str, int]:
        """Counters: posted, updated, replied, retried, given_up, failed, fallback_channel, ..."""
        with self._cond:
            out = dict(self._stats)
            out["dropped_unannounced"] = self.book.dropped_unannounced
            out["waiting"] = len(self.outbox)
            return out

    # ---- buttons -----------------------------------------------------------------------------

    def handle_action(self, action_id: str, ref: str, user: str) -> str:
        """Apply a button press from Slack (see ``whywait.engine.notify.interactivity``) to the incident
        whose id (the button's value) or key is ``ref``; return a short text for the person."""
        now = self._clock()
        with self._cond:
            inc = self.book.find(ref)
            if inc is None:
                return "whywait no longer tracks this incident."
            key = inc.key
            if action_id == ACTION_ACK:
                anns = self.book.ack(key, user, now)
                answer = "Acknowledged."
            elif action_id in SILENCE_ACTIONS:
                duration = SILENCE_ACTIONS[action_id]
                silence = Silence.new({"group": key}, duration=duration, created_by=user, now=now,
                                      comment="set from Slack")
                self.silences.add(silence)
                anns = self.book.silenced_by_button(key, silence, now)
                answer = f"Silenced ({silence.id})."
            elif action_id == ACTION_TIMELINE:
                anns = self.book.timeline(key)
                answer = "Timeline posted in the thread."
            else:
                raise NotifyError(f"unknown action {action_id!r}", retryable=False)
            self._enqueue(anns, now)
            self._cond.notify_all()
            return answer

    # ---- the worker ----------------------------------------------------------------------------

    def _idle(self) -> bool:
        now = self._clock()
        return not self._busy and not self.outbox.items() and not any(
            inc.due is not None and inc.due <= now for inc in self.book.incidents.values())

    def _enqueue(self, anns: list[Announcement], now: float) -> None:
        for a in anns:
            inc = self.book.incidents.get(a.key)
            if inc is None:
                continue
            if a.kind == "update" and any(i.key == a.key and i.kind == "update" and i.seq != self._inflight
                                          for i in self.outbox.items()):
                continue  # an edit already queued renders the latest state when it is sent
            self.outbox.append(a.kind, a.key, inc.lane, now, text=a.text)

    def _schedule(self) -> None:
        """Thread: turn due announcements into outbox items, and save changed incidents.
        Separate from sending, so a Slack that hangs delays no decision and no save."""
        while True:
            try:
                with self._cond:
                    if self._stopping:
                        return
                    now = self._clock()
                    self._enqueue(self.book.due(now, self._silence_for), now)
                    self._end_silences()
                    self._cond.notify_all()  # the sender, and flush() waiters
                    nxt = self.book.next_due()
                    wait = 1.0 if nxt is None else min(1.0, max(0.0, nxt - now))
                    mono = time.monotonic()
                    unsaved = bool(self.book.changed or self.book.removed)
                    if unsaved and mono < self._persist_retry_at:  # the store is failing: don't hammer it
                        wait, unsaved = min(wait, self._persist_retry_at - mono), False
                    if not unsaved and wait > 0:
                        self._cond.wait(wait)
                if time.monotonic() >= self._persist_retry_at and not self._persist():
                    self._persist_retry_at = time.monotonic() + 1.0
            except Exception:  # must outlive any bug
                log.exception("Slack notifier (scheduling): unexpected error; continuing")
                time.sleep(1.0)

    def _send(self) -> None:
        """Thread: deliver outbox items in order, paced per channel, backing off on failure."""
        while True:
            try:
                with self._cond:
                    self._busy = False
                    self._inflight = None
                    if self._stopping:
                        return
                    item, wait = self._pick(time.monotonic())
                    if item is None:
                        self._cond.notify_all()
                        self._cond.wait(min(wait, 1.0))
                        continue
                    self._busy = True
                    self._inflight = item.seq
                self._deliver(item)
            except Exception:  # must outlive any bug in one delivery
                log.exception("Slack notifier (sending): unexpected error; retrying shortly")
                with self._cond:
                    self._busy = False
                    self._retry_at = time.monotonic() + 1.0

    def _silence_for(self, inc: Incident) -> Silence | None:
        try:
            return self.silences.matching(inc.fields(), self._clock())
        except Exception as exc:  # a broken silence store must not stop notifications
            log.warning("silences unavailable (%s); notifying anyway", exc)
            return None

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

    def _target(self, inc: Incident) -> str:
        ch = inc.channel_id or inc.channel
        return self._aliases.get(ch, ch)

    def _pick(self, mono: float) -> tuple[OutboxItem | None, float]:
        """The first queued write whose lane has nothing earlier waiting and whose channel
        the limiter allows now; else how long until one may be ready."""
        if mono < self._retry_at:
            return None, self._retry_at - mono
        seen: set[str] = set()
        wait = float("inf")
        for item in self.outbox.items():
            if item.lane in seen:
                continue
            seen.add(item.lane)
            inc = self.book.incidents.get(item.key)
            if inc is None:
                return item, 0.0  # forgotten meanwhile: _deliver drops it
            ready = self._limiter.ready_at(self._target(inc))
            if ready <= mono:
                return item, 0.0
            wait = min(wait, ready - mono)
        return None, wait

    def _render_root(self, inc: Incident, now: float, plain: bool = False) -> tuple[str, list[dict[str, Any]] | None]:
        v = inc.view()
        silenced = inc.silenced_by is not None and (
            inc.silenced_until_resolved or (inc.silenced_until is not None and inc.silenced_until > now))
        ctx = MessageContext(
            key=inc.id, mention=self.config.mentions.get(v.severity),
            members=len(inc.firing()) or len(inc.members),
            acked_by=inc.acked_by, acked_at=inc.acked_at,
            silenced_by=inc.silenced_by if silenced else None,
            silenced_until=None if inc.silenced_until_resolved else inc.silenced_until,
            now=now, dashboard_url_template=self.config.dashboard_url_template)
        if plain:  # Slack refused the blocks: say it in text rather than not at all
            return escape_mrkdwn(plain_text(v, dashboard_url_template=self.config.dashboard_url_template,
                                            now=now))[:3500], None
        return fallback_text(v, ctx), render_blocks(v, ctx)

    def _deliver(self, item: OutboxItem) -> None:
        with self._cond:
            now = self._clock()
            inc = self.book.incidents.get(item.key)
            if inc is None:
                self.outbox.done(item.seq)
                return
            if now - item.created > self.config.outbox_max_age:
                self._give_up(item, f"still undelivered after {now - item.created:.0f}s")
                return
            kind = item.kind
            if kind == "post" and inc.ts:
                kind = "update"  # posted already (a resumed outbox): edit instead of duplicating
            keep = False
            if kind != "post" and not inc.ts:
                keep = kind == "reply"  # the root goes first; the reply follows on the next turn
                kind = "post"
            plain = bool(item.meta.get("plain"))
            if kind == "reply":
                text, blocks = item.text, None
            else:
                text, blocks = self._render_root(inc, now, plain)
            channel, ts, target = inc.channel_id or inc.channel, inc.ts, self._target(inc)
            lane_channel = inc.channel
        try:
            if kind == "post":
                resp = self._client.chat_postMessage(channel=channel, text=text, blocks=blocks,
                                                     unfurl_links=False, unfurl_media=False)
            elif kind == "update":
                resp = self._client.chat_update(channel=channel, ts=ts or "", text=text, blocks=blocks or [])
            else:
                resp = self._client.chat_postMessage(channel=channel, thread_ts=ts, text=text,
                                                     unfurl_links=False, unfurl_media=False)
        except SlackApiError as exc:
            self._limiter.record(target, time.monotonic())
            self._failed(item, kind, exc)
            return
        except (URLError, OSError, SlackClientError) as exc:
            self._transient(item, _reason(exc))
            return
        done_at = time.monotonic()
        self._limiter.record(target, done_at)
        with self._cond:
            self._recovered()
            inc = self.book.incidents.get(item.key)
            if inc is not None and kind == "post":
                inc.ts, inc.channel_id = resp.get("ts"), resp.get("channel")
                if inc.channel_id and lane_channel != inc.channel_id:
                    self._aliases[lane_channel] = inc.channel_id
                    self._limiter.record(inc.channel_id, done_at)  # the name and the id are one channel
                self.book.changed.add(inc.key)
            self._stats[{"post": "posted", "update": "updated", "reply": "replied"}[kind]] += 1
            if not keep:
                self.outbox.done(item.seq)
            self._busy = False
            self._cond.notify_all()
        if kind == "post":
            self._persist()  # the ts must survive a crash, or a restart would post a duplicate

    def _failed(self, item: OutboxItem, kind: str, exc: SlackApiError) -> None:
        status = exc.response.status_code
        err = exc.response.get("error") or f"HTTP {status}"
        if status == 429 or status >= 500 or err in ("ratelimited", "service_unavailable", "internal_error",
                                                     "fatal_error", "request_timeout"):
            retry_after = None
            hdr = (exc.response.headers or {}).get("Retry-After") or (exc.response.headers or {}).get("retry-after")
            if hdr:
                try:
                    retry_after = float(hdr[0] if isinstance(hdr, list) else hdr)
                except ValueError:
                    retry_after = None
            self._transient(item, err, retry_after)
            return
        with self._cond:
            self._busy = False
            inc = self.book.incidents.get(item.key)
            if err in AUTH_ERRORS:
                if not self._auth_failed:
                    log.error("Slack rejected the token (%s); %d notification(s) wait in the outbox",
                              err, len(self.outbox))
                self._auth_failed = True
                self._retry_at = time.monotonic() + self.config.retry_backoff[1]
                return
            if inc is not None and err in CHANNEL_ERRORS and kind == "post" \
                    and inc.channel != self.config.default_channel:
                log.warning("Slack channel %s for incident %s: %s; posting to the default channel %s instead",
                            inc.channel, inc.key, err, self.config.default_channel)
                inc.channel, inc.channel_id = self.config.default_channel, None
                inc.note(self._clock(), f"{escape_mrkdwn(err)}; moved to {escape_mrkdwn(inc.channel)}")
                self.book.changed.add(inc.key)
                self._stats["fallback_channel"] += 1
                return  # the item stays and goes to the default channel next
            if inc is not None and err in GONE_ERRORS and kind != "post":
                log.warning("Slack message of incident %s is gone (%s); posting a new one", inc.key, err)
                inc.ts = inc.channel_id = None
                self.book.changed.add(inc.key)
                return
            if inc is not None and err in FORMAT_ERRORS and kind != "reply" and not item.meta.get("plain"):
                log.warning("Slack refused the message blocks of incident %s (%s); sending plain text", inc.key, err)
                item.meta["plain"] = True
                return
            self._stats["failed"] += 1
            log.error("Slack refused a %s for incident %s (%s); dropped", kind, item.key, err)
            self.outbox.done(item.seq)
            self._cond.notify_all()

    def _transient(self, item: OutboxItem, reason: str, retry_after: float | None = None) -> None:
        with self._cond:
            self._busy = False
            item.attempts += 1
            self._stats["retried"] += 1
            first, cap = self.config.retry_backoff
            self._backoff = first if self._backoff == 0 else min(cap, self._backoff * 2)
            pause = max(self._backoff, retry_after or 0.0)
            self._retry_at = time.monotonic() + pause
            if self._down_since is None:
                self._down_since = self._clock()
                log.warning("Slack unreachable (%s); %d notification(s) wait in the outbox, retrying", reason,
                            len(self.outbox))
            else:
                log.debug("Slack still unreachable (%s); next try in %.1fs", reason, pause)

    def _recovered(self) -> None:
        if self._down_since is not None:
            log.info("Slack reachable again after %.0fs; delivering %d waiting notification(s)",
                     self._clock() - self._down_since, len(self.outbox))
        if self._auth_failed:
            log.info("Slack accepts the token again")
        self._down_since, self._backoff, self._auth_failed = None, 0.0, False

    def _give_up(self, item: OutboxItem, why: str) -> None:
        self._stats["given_up"] += 1
        log.error("gave up on a Slack %s for incident %s: %s (WHYWAIT_NOTIFY_OUTBOX_MAX_AGE is %.0fs)",
                  item.kind, item.key, why, self.config.outbox_max_age)
        self.outbox.done(item.seq)
        self._busy = False
        self._cond.notify_all()

    def _persist(self) -> bool:
        """Write changed incident records to the state store, outside the lock (it may be Kafka);
        serialised, so records reach the store in the order they were taken.  False if a write
        failed (the record is kept for the next try)."""
        with self._persist_lock:
            with self._cond:
                changed = {k: self.book.incidents[k].to_dict() for k in self.book.changed
                           if k in self.book.incidents}
                removed = set(self.book.removed)
                self.book.changed.clear()
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


def _reason(exc: BaseException) -> str:
    inner = getattr(exc, "reason", None)
    return str(inner if inner is not None else exc) or type(exc).__name__
