"""The Slack notifier (first cut: one root message per fingerprint, edited when resolved)."""

from __future__ import annotations

import logging
import threading
import time

from slack_sdk import WebClient
from slack_sdk.errors import SlackApiError
from slack_sdk.http_retry.builtin_handlers import (
    ConnectionErrorRetryHandler,
    RateLimitErrorRetryHandler,
    ServerErrorRetryHandler,
)

from engine.diagnosis import Diagnosis
from engine.errors import NotifyError
from engine.notify.base import Notifier
from engine.notify.config import SlackConfig
from engine.notify.render import MessageContext, fallback_text, fmt_duration, fmt_time, render_blocks
from engine.notify.secrets import Secret

log = logging.getLogger(__name__)

_AUTH_ERRORS = {"invalid_auth", "not_authed", "token_revoked", "token_expired", "account_inactive"}


class SlackNotifier(Notifier):
    """Posts a diagnosis to its owner's channel and edits that message when it resolves."""

    name = "slack"

    def __init__(self, token: Secret | str, config: SlackConfig | None = None) -> None:
        self.config = config or SlackConfig()
        secret = token if isinstance(token, Secret) else Secret(token)
        kw = {"base_url": self.config.api_url} if self.config.api_url else {}
        self._client = WebClient(token=secret.reveal(), timeout=int(self.config.request_timeout), **kw,
                                 retry_handlers=[ConnectionErrorRetryHandler(max_retry_count=2),
                                                 ServerErrorRetryHandler(max_retry_count=2),
                                                 RateLimitErrorRetryHandler(max_retry_count=self.config.max_429_retries)])
        self._lock = threading.Lock()
        self._messages: dict[str, tuple[str, str]] = {}  # fingerprint -> (channel id, ts)
        try:
            self._client.auth_test()
        except SlackApiError as exc:
            err = exc.response.get("error", "")
            if err in _AUTH_ERRORS:
                raise NotifyError(f"Slack rejected the token ({err})", retryable=False) from None
            raise NotifyError(f"Slack auth.test failed ({err or exc.response.status_code})", retryable=True) from None

    def _channel(self, d: Diagnosis) -> str:
        sev = self.config.severity_channels.get(d.severity)
        return sev or (d.owner.channel if d.owner and d.owner.channel else self.config.default_channel)

    def notify(self, diagnosis: Diagnosis) -> None:
        d = diagnosis
        with self._lock:
            ctx = MessageContext(key=d.fingerprint, mention=self.config.mentions.get(d.severity),
                                 now=time.time(), dashboard_url_template=self.config.dashboard_url_template)
            known = self._messages.get(d.fingerprint)
            try:
                if known is None:
                    if d.status == "resolved":
                        return
                    r = self._post(self._channel(d), d, ctx)
                    self._messages[d.fingerprint] = (r["channel"], r["ts"])
                    return
                channel, ts = known
                self._client.chat_update(channel=channel, ts=ts, text=fallback_text(d, ctx),
                                         blocks=render_blocks(d, ctx))
                if d.status == "resolved":
                    end = d.ends_at if d.ends_at is not None else time.time()
                    self._client.chat_postMessage(
                        channel=channel, thread_ts=ts,
                        text=f":white_check_mark: Resolved at {fmt_time(end)} after {fmt_duration(end - d.starts_at)}")
                    del self._messages[d.fingerprint]
            except SlackApiError as exc:
                err = exc.response.get("error", "")
                raise NotifyError(f"Slack refused the message ({err})", retryable=err not in _AUTH_ERRORS) from None

    def _post(self, channel: str, d: Diagnosis, ctx: MessageContext):  # type: ignore[no-untyped-def]
        try:
            return self._client.chat_postMessage(channel=channel, text=fallback_text(d, ctx),
                                                 blocks=render_blocks(d, ctx))
        except SlackApiError as exc:
            if exc.response.get("error") in ("channel_not_found", "not_in_channel", "is_archived") \
                    and channel != self.config.default_channel:
                log.warning("Slack channel %s: %s; posting to %s instead", channel, exc.response.get("error"),
                            self.config.default_channel)
                return self._client.chat_postMessage(channel=self.config.default_channel, text=fallback_text(d, ctx),
                                                     blocks=render_blocks(d, ctx))
            raise
