"""The Slack receiver: one living message per incident, in the owning team's channel.

A ``post`` is the incident's root message (Block Kit, ``whywait.engine.notify.render``), an
``update`` edits it (``chat.update``), a ``reply`` goes into its thread.  The receipt is
``{"channel": name, "channel_id": id, "ts": ts}``, so later edits and replies go to the
same message, across restarts.  What the pipeline cannot know, the receiver handles
within one ``send``:

* a channel Slack refuses (``channel_not_found``, ``not_in_channel``, ...) for a first
  post: posted to the default channel instead, and said in the incident's timeline;
* a message gone (``message_not_found``, ...) on an edit or reply: a new root is posted;
* blocks Slack refuses (``invalid_blocks``, ``msg_too_long``): the same as plain text.

Errors become :class:`ReceiverError`: rate limits (429, honouring ``Retry-After``),
5xx, connection errors and a rejected token are ``retryable`` (the items wait in the
outbox); anything else is not.  A token Slack rejects at start is fatal, in one line:
``NotifyRefused("Slack rejected the token (invalid_auth)")``, exit 2 (the configuration must change).  The
token is never logged (slack_sdk redacts the header; we hold it in a
:class:`~whywait.engine.notify.secrets.Secret`).

:class:`SlackNotifier` is the pipeline with this one receiver, as the engine used
before receivers were split out.
"""

from __future__ import annotations

import logging
import re
import time
from collections import Counter
from dataclasses import dataclass, field
from typing import Any, Callable, Mapping
from urllib.error import URLError

from slack_sdk import WebClient
from slack_sdk.errors import SlackApiError, SlackClientError
from slack_sdk.http_retry.builtin_handlers import (
    ConnectionErrorRetryHandler,
    RateLimitErrorRetryHandler,
    ServerErrorRetryHandler,
)
from slack_sdk.http_retry.builtin_interval_calculators import BackoffRetryIntervalCalculator
from whywait.engine.errors import ConfigError, NotifyRefused
from whywait.engine.notify.pipeline.core import Pipeline
from whywait.engine.notify.pipeline.receiver import Announcement, Receipt, Receiver, ReceiverError
from whywait.engine.notify.render import MessageContext, escape_mrkdwn, fallback_text, plain_text, render_blocks
from whywait.engine.notify.secrets import Secret, read_secret
from whywait.engine.notify.silences import SilenceStore
from whywait.engine.notify.state import StateStore

log = logging.getLogger(__name__)
# slack_sdk logs an ERROR line per failed attempt; during an outage the pipeline says it once.
_sdk_log = logging.getLogger("whywait.engine.notify.slack.sdk")
_sdk_log.setLevel(logging.CRITICAL)

AUTH_ERRORS = frozenset({"invalid_auth", "not_authed", "token_revoked", "token_expired", "account_inactive",
                         "missing_scope", "not_allowed_token_type"})
CHANNEL_ERRORS = frozenset({"channel_not_found", "not_in_channel", "is_archived", "restricted_action"})
GONE_ERRORS = frozenset({"message_not_found", "cant_update_message", "edit_window_closed", "thread_not_found"})
# msg_blocks_too_long: Slack's answer to blocks of about 13,000 characters in all, each within its own limit
# (slackapi/bolt-js#2509); a message is then sent again as plain text, like any other refused layout.
FORMAT_ERRORS = frozenset({"invalid_blocks", "invalid_blocks_format", "msg_too_long", "msg_blocks_too_long",
                           "too_many_attachments"})
TRANSIENT_ERRORS = frozenset({"ratelimited", "service_unavailable", "internal_error", "fatal_error", "request_timeout"})

# How each kind of reply line reads in Slack.
LINE_EMOJI = {"added": ":arrow_up:", "ranks": ":arrow_up:", "recovered": ":arrow_down:",
              "raised": ":arrow_double_up:", "lowered": ":arrow_double_down:", "grown": ":chart_with_upwards_trend:",
              "reopened": ":repeat:", "repeat": ":hourglass:", "resolved": ":white_check_mark:",
              "silenced": ":no_bell:"}

_MENTION_RE = re.compile(r"^<(!here|!channel|!everyone|@[UW][A-Z0-9]+|!subteam\^[A-Z0-9]+)>$")


def parse_mention(value: str, what: str) -> str:
    """``@here``/``here``/``<!here>`` → ``<!here>``; likewise channel, everyone, user and group ids."""
    v = value.strip()
    if v.lstrip("@!") in ("here", "channel", "everyone"):
        v = f"<!{v.lstrip('@!')}>"
    if not _MENTION_RE.match(v):
        raise ConfigError(f"{what} must be a mention like '@here', '<@U123ABC>' or '<!subteam^S123>' (got {value!r})")
    return v


@dataclass(frozen=True)
class SlackSettings:
    """The Slack receiver's own settings (the pipeline's are in ``PipelineConfig``).

    Environment: ``WHYWAIT_SLACK_API_URL`` (a Slack-compatible API; tests: the local server),
    ``WHYWAIT_SLACK_CHANNEL`` (where a refused channel's message goes instead; #whywait),
    ``WHYWAIT_SLACK_MENTIONS`` (per severity: ``critical=@here``, the default),
    ``WHYWAIT_SLACK_RATE`` (messages per second per channel, 1), ``WHYWAIT_DASHBOARD_URL``.
    """

    api_url: str | None = None  # None: Slack's own (https://slack.com/api/)
    default_channel: str = "#whywait"
    mentions: dict[str, str] = field(default_factory=lambda: {"critical": "<!here>"})
    rate_per_channel: float = 1.0  # Slack's limit is about 1 message per second per channel
    max_429_retries: int = 5
    request_timeout: float = 10.0
    dashboard_url_template: str | None = None

    def __post_init__(self) -> None:
        from whywait.engine.notify.pipeline.config import SEVERITIES

        if self.rate_per_channel <= 0:
            raise ConfigError(f"rate_per_channel must be > 0 (got {self.rate_per_channel})")
        for sev in self.mentions:
            if sev not in SEVERITIES:
                raise ConfigError(f"unknown severity {sev!r} (expected one of {', '.join(SEVERITIES)})")
        if self.dashboard_url_template:
            check_dashboard_template(self.dashboard_url_template)

    @classmethod
    def env_kwargs(cls, env: Mapping[str, str]) -> dict[str, Any]:
        """The keyword arguments the variables in the class docstring set (unset: absent)."""
        from whywait.engine.notify.pipeline.config import severity_pairs

        kw: dict[str, Any] = {}
        if env.get("WHYWAIT_SLACK_API_URL"):
            kw["api_url"] = env["WHYWAIT_SLACK_API_URL"]
        if env.get("WHYWAIT_SLACK_CHANNEL"):
            kw["default_channel"] = env["WHYWAIT_SLACK_CHANNEL"]
        if "WHYWAIT_SLACK_MENTIONS" in env:
            kw["mentions"] = {k: parse_mention(v, "WHYWAIT_SLACK_MENTIONS")
                              for k, v in severity_pairs(env["WHYWAIT_SLACK_MENTIONS"],
                                                         "WHYWAIT_SLACK_MENTIONS").items()}
        if env.get("WHYWAIT_SLACK_RATE"):
            try:
                kw["rate_per_channel"] = float(env["WHYWAIT_SLACK_RATE"])
            except ValueError:
                raise ConfigError(f"WHYWAIT_SLACK_RATE must be a number of messages per second "
                                  f"(got {env['WHYWAIT_SLACK_RATE']!r})") from None
        if env.get("WHYWAIT_DASHBOARD_URL"):
            kw["dashboard_url_template"] = env["WHYWAIT_DASHBOARD_URL"]
        return kw


def check_dashboard_template(template: str) -> None:
    """Raise a :class:`ConfigError` naming the unknown field when ``template`` cannot be filled."""
    from whywait.engine.diagnosis import Diagnosis
    from whywait.engine.notify.format import dashboard_url

    sample = Diagnosis(rule_id="r", fingerprint="f", status="firing", severity="info", title="t", cause="c",
                       job="j", owner=None, starts_at=0.0, detected_at=0.0)
    try:
        dashboard_url(template, sample)
    except (KeyError, IndexError, ValueError, AttributeError) as exc:
        raise ConfigError(f"WHYWAIT_DASHBOARD_URL: {template!r} has an unknown field {exc} (fields: {{job}}, "
                          "{rule_id}, {fingerprint}, {culprit}, {severity}, {starts_at}, {from_ms}, {to_ms}, "
                          "{labels[NAME]})") from None


def _reason(exc: BaseException) -> str:
    inner = getattr(exc, "reason", None)
    return str(inner if inner is not None else exc) or type(exc).__name__


class SlackReceiver(Receiver):
    """Posts, edits and threads Slack messages; see the module docstring."""

    name = "slack"

    def __init__(self, token: Secret | str, settings: SlackSettings | None = None) -> None:
        self.settings = settings or SlackSettings()
        self._token = token if isinstance(token, Secret) else Secret(token)
        self.rate = self.settings.rate_per_channel
        kw: dict[str, Any] = {"base_url": self.settings.api_url} if self.settings.api_url else {}
        self.client = WebClient(
            token=self._token.reveal(), timeout=max(1, int(self.settings.request_timeout)),
            # slack_sdk's defaults retry connection errors only; 429 (after Retry-After) and 5xx are
            # added explicitly.  In-call retries are short: the pipeline's outbox does the long waiting.
            retry_handlers=[
                ConnectionErrorRetryHandler(max_retry_count=1,
                                            interval_calculator=BackoffRetryIntervalCalculator(backoff_factor=0.2)),
                ServerErrorRetryHandler(max_retry_count=1,
                                        interval_calculator=BackoffRetryIntervalCalculator(backoff_factor=0.2)),
                RateLimitErrorRetryHandler(max_retry_count=self.settings.max_429_retries)],
            logger=_sdk_log, **kw)
        self._aliases: dict[str, str] = {}  # channel name -> id, learned from Slack's answers
        self._stats: Counter[str] = Counter()
        self._auth_failed = False
        self.identity = self._check_token()

    @classmethod
    def from_env(cls, env: Mapping[str, str]) -> SlackReceiver:
        """From ``SLACK_BOT_TOKEN`` (or ``SLACK_BOT_TOKEN_FILE``) and :class:`SlackSettings`' variables."""
        token = read_secret("SLACK_BOT_TOKEN", env)
        if token is None:
            raise ConfigError("the slack receiver needs SLACK_BOT_TOKEN (or SLACK_BOT_TOKEN_FILE)")
        return cls(token, SlackSettings(**SlackSettings.env_kwargs(env)))

    def _check_token(self) -> dict[str, Any]:
        """``auth.test`` once: a rejected token is fatal (one line); an unreachable Slack is not."""
        try:
            resp = self.client.auth_test()
        except SlackApiError as exc:
            err = exc.response.get("error") or f"HTTP {exc.response.status_code}"
            if err in AUTH_ERRORS:
                raise NotifyRefused(f"Slack rejected the token ({err})") from None
            log.warning("Slack auth.test failed (%s); notifications are retried until it answers", err)
            return {}
        except (URLError, OSError, SlackClientError) as exc:
            log.warning("Slack is unreachable at %s (%s); notifications are retried until it answers",
                        self.settings.api_url or "https://slack.com/api/", _reason(exc))
            return {}
        log.info("Slack: connected to %s as %s", resp.get("team"), resp.get("user"))
        return {k: resp.get(k) for k in ("team", "team_id", "user", "user_id", "bot_id")}

    def rate_key(self, route: str, receipt: Receipt | None) -> str:
        """Slack paces per channel; a name and the id Slack answered with are one channel."""
        ch = (receipt or {}).get("channel_id") or (receipt or {}).get("channel") or route
        return self._aliases.get(ch, ch)

    def stats(self) -> dict[str, int]:
        return dict(self._stats)

    # ---- rendering -----------------------------------------------------------------------------

    def _root(self, ann: Announcement, plain: bool) -> tuple[str, list[dict[str, Any]] | None]:
        v = ann.view
        if plain:  # Slack refused the blocks: say it in text rather than not at all
            return escape_mrkdwn(plain_text(v, dashboard_url_template=self.settings.dashboard_url_template,
                                            now=ann.now))[:3500], None
        ctx = MessageContext(
            key=ann.incident_id, mention=self.settings.mentions.get(v.severity),
            members=sum(1 for d in ann.findings if d.status == "firing") or len(ann.findings),
            acked_by=ann.acked_by, acked_at=ann.acked_at, silenced_by=ann.silenced_by,
            silenced_until=ann.silenced_until, now=ann.now,
            dashboard_url_template=self.settings.dashboard_url_template)
        return fallback_text(v, ctx), render_blocks(v, ctx)

    def _reply(self, ann: Announcement) -> str:
        out = []
        for line in ann.lines:
            if line.kind == "timeline":
                head, _, rest = line.text.partition("\n")
                out.append(f"*{escape_mrkdwn(head)}*\n{escape_mrkdwn(rest)}")
            else:
                emoji = LINE_EMOJI.get(line.kind)
                out.append(f"{emoji} {escape_mrkdwn(line.text)}" if emoji else escape_mrkdwn(line.text))
        mention = self.settings.mentions.get(ann.view.severity) if ann.raised else None
        return (f"{mention} " if mention else "") + "\n".join(out)

    # ---- sending -------------------------------------------------------------------------------

    def send(self, announcement: Announcement) -> Receipt:
        """Post, edit or reply for ``announcement``; return ``{"channel", "channel_id", "ts"}``."""
        ann = announcement
        receipt = dict(ann.receipt or {})
        if ann.kind == "post" or not receipt.get("ts"):
            return self._post_root(ann, receipt.get("channel") or ann.route)
        channel = receipt.get("channel_id") or receipt["channel"]
        if ann.kind == "update":
            text, blocks = self._root(ann, bool(ann.meta.get("plain")))
            try:
                self._call(self.client.chat_update, channel=channel, ts=receipt["ts"], text=text, blocks=blocks or [])
            except _SlackRefused as exc:
                if exc.error in FORMAT_ERRORS:
                    log.warning("Slack refused the message blocks of incident %s (%s); sending plain text",
                                ann.key, exc.error)
                    text, _ = self._root(ann, True)
                    self._call(self.client.chat_update, channel=channel, ts=receipt["ts"], text=text, blocks=[])
                elif exc.error in GONE_ERRORS:
                    log.warning("Slack message of incident %s is gone (%s); posting a new one", ann.key, exc.error)
                    return self._post_root(ann, receipt.get("channel") or ann.route)
                else:
                    raise exc.as_receiver_error() from None
            return receipt
        try:
            self._call(self.client.chat_postMessage, channel=channel, thread_ts=receipt["ts"], text=self._reply(ann),
                       unfurl_links=False, unfurl_media=False)
        except _SlackRefused as exc:
            if exc.error in GONE_ERRORS:
                log.warning("Slack thread of incident %s is gone (%s); posting a new root", ann.key, exc.error)
                return self._post_root(ann, receipt.get("channel") or ann.route)
            raise exc.as_receiver_error() from None
        return receipt

    def _post_root(self, ann: Announcement, channel: str) -> Receipt:
        note = None
        plain = bool(ann.meta.get("plain"))
        for _ in range(3):  # at most: the channel refused, then the blocks refused
            text, blocks = self._root(ann, plain)
            try:
                resp = self._call(self.client.chat_postMessage, channel=channel, text=text, blocks=blocks,
                                  unfurl_links=False, unfurl_media=False)
            except _SlackRefused as exc:
                if exc.error in CHANNEL_ERRORS and channel != self.settings.default_channel:
                    log.warning("Slack channel %s for incident %s: %s; posting to the default channel %s instead",
                                channel, ann.key, exc.error, self.settings.default_channel)
                    note = f"{exc.error}; moved to {self.settings.default_channel}"
                    channel = self.settings.default_channel
                    self._stats["fallback_channel"] += 1
                    continue
                if exc.error in FORMAT_ERRORS and not plain:
                    log.warning("Slack refused the message blocks of incident %s (%s); sending plain text",
                                ann.key, exc.error)
                    plain = True
                    continue
                raise exc.as_receiver_error() from None
            channel_id = resp.get("channel")
            if channel_id and channel_id != channel:
                self._aliases[channel] = channel_id
            out: Receipt = {"channel": channel, "channel_id": channel_id, "ts": resp.get("ts")}
            if note:
                out["note"] = note
            return out
        raise ReceiverError(f"Slack refused the message of incident {ann.key}", retryable=False)

    def _call(self, method: Callable[..., Any], **kw: Any) -> Any:
        """One Web API call; Slack's answers become :class:`_SlackRefused` or :class:`ReceiverError`."""
        try:
            resp = method(**kw)
        except SlackApiError as exc:
            status = exc.response.status_code
            err = exc.response.get("error") or f"HTTP {status}"
            if status == 429 or status >= 500 or err in TRANSIENT_ERRORS:
                raise ReceiverError(f"Slack answered {err}", retryable=True, retry_after=_retry_after(exc),
                                    rate_limited=status == 429 or err == "ratelimited") from None
            if err in AUTH_ERRORS:
                if not self._auth_failed:
                    log.error("Slack rejected the token (%s); notifications are retried until it accepts one", err)
                self._auth_failed = True
                raise ReceiverError(f"Slack rejected the token ({err})", retryable=True, retry_after=30.0) from None
            raise _SlackRefused(err) from None
        except (URLError, OSError, SlackClientError) as exc:
            raise ReceiverError(f"Slack unreachable ({_reason(exc)})", retryable=True) from None
        if self._auth_failed:
            log.info("Slack accepts the token again")
            self._auth_failed = False
        return resp


class _SlackRefused(Exception):
    """Slack answered ``ok: false`` with ``error`` (handled in :meth:`SlackReceiver.send` where it can be)."""

    def __init__(self, error: str) -> None:
        super().__init__(error)
        self.error = error

    def as_receiver_error(self) -> ReceiverError:
        return ReceiverError(f"Slack refused it ({self.error})", retryable=False)


def _retry_after(exc: SlackApiError) -> float | None:
    headers = exc.response.headers or {}
    hdr = headers.get("Retry-After") or headers.get("retry-after")
    if not hdr:
        return None
    try:
        return float(hdr[0] if isinstance(hdr, list) else hdr)
    except ValueError:
        return None


class SlackNotifier(Pipeline):
    """The pipeline with one :class:`SlackReceiver`, configured by one
    :class:`~whywait.engine.notify.config.SlackConfig` (the shape the engine and tests used before
    receivers were split out)."""

    name = "slack"

    def __init__(self, token: Secret | str, config: Any = None, *, state_store: StateStore | None = None,
                 silence_store: SilenceStore | None = None, clock: Callable[[], float] = time.time,
                 close_stores: bool = False) -> None:
        from whywait.engine.notify.config import SlackConfig

        cfg = config or SlackConfig()
        self.receiver = SlackReceiver(token, cfg.slack())
        super().__init__([self.receiver], cfg.pipeline(), state_store=state_store, silence_store=silence_store,
                         clock=clock, close_stores=close_stores)

