"""How the Slack notifier routes, groups, paces and retries: :class:`SlackConfig`.

Built from the environment by :meth:`SlackConfig.from_env` (``make_notifier`` does
this) or directly in code and tests.  Durations follow Alertmanager's meaning:

``group_wait``
    how long a new incident waits for its siblings before its first message;
``group_interval``
    the least time between two updates of one incident (resolution is not held back);
``repeat_interval``
    after this long without news, a still-firing incident is re-announced in its thread.

Environment variables (all optional)::

    WHYWAIT_SLACK_API_URL           a Slack-compatible API base URL (tests: the local server)
    WHYWAIT_SLACK_CHANNEL           default channel when the owner has none (#whywait)
    WHYWAIT_SLACK_SEVERITY_CHANNELS per-severity channels overriding the owner's: info=#whywait-low
    WHYWAIT_SLACK_MENTIONS          per-severity mentions: critical=@here (the default)
    WHYWAIT_SLACK_RATE              messages per second per channel (1)
    WHYWAIT_NOTIFY_GROUP_BY         labels grouping findings into one message (job)
    WHYWAIT_NOTIFY_GROUP_WAIT       1s      WHYWAIT_NOTIFY_GROUP_INTERVAL  1m
    WHYWAIT_NOTIFY_REPEAT_INTERVAL  4h      WHYWAIT_NOTIFY_OUTBOX_MAX_AGE  24h
    WHYWAIT_NOTIFY_OUTBOX           outbox folder (~/.local/state/whywait/notify-outbox)
    WHYWAIT_DASHBOARD_URL           dashboard link template, e.g. https://grafana/d/x?var-job={job}
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Mapping

from whywait.engine.errors import ConfigError

SEVERITIES = ("info", "warning", "critical")
_DURATION = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*(ms|s|m|h|d)?\s*$")
_UNITS = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0, None: 1.0}
_MENTION = re.compile(r"^<(!here|!channel|!everyone|@[UW][A-Z0-9]+|!subteam\^[A-Z0-9]+)>$")


def parse_duration(value: str | float | int, what: str) -> float:
    """Seconds from ``"90s"``, ``"5m"``, ``"4h"``, ``"1d"``, ``"250ms"`` or a number;
    a :class:`ConfigError` naming ``what`` otherwise."""
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        if value < 0:
            raise ConfigError(f"{what} must be a duration like '30s' (got {value!r})")
        return float(value)
    m = _DURATION.match(str(value))
    if not m:
        raise ConfigError(f"{what} must be a duration like '30s' (got {value!r})")
    return float(m.group(1)) * _UNITS[m.group(2)]


def parse_mention(value: str, what: str) -> str:
    """``@here``/``here``/``<!here>`` → ``<!here>``; likewise channel, everyone, user and group ids."""
    v = value.strip()
    if v.lstrip("@!") in ("here", "channel", "everyone"):
        v = f"<!{v.lstrip('@!')}>"
    if not _MENTION.match(v):
        raise ConfigError(f"{what} must be a mention like '@here', '<@U123ABC>' or '<!subteam^S123>' (got {value!r})")
    return v


def _pairs(value: str, what: str) -> dict[str, str]:
    out: dict[str, str] = {}
    for item in filter(None, (p.strip() for p in value.split(","))):
        k, sep, v = item.partition("=")
        if not sep or not k.strip() or not v.strip():
            raise ConfigError(f"{what} must be a list like 'critical=#incidents,info=#quiet' (got {value!r})")
        k = k.strip()
        if k not in SEVERITIES:
            raise ConfigError(f"{what}: unknown severity {k!r} (expected one of {', '.join(SEVERITIES)})")
        out[k] = v.strip()
    return out


def default_outbox_dir(env: Mapping[str, str]) -> Path:
    """``$XDG_STATE_HOME/whywait/notify-outbox`` (``~/.local/state/...`` when unset)."""
    base = env.get("XDG_STATE_HOME") or os.path.join(os.path.expanduser("~"), ".local", "state")
    return Path(base) / "whywait" / "notify-outbox"


@dataclass(frozen=True)
class SlackConfig:
    """Routing, grouping, pacing and delivery settings of :class:`~whywait.engine.notify.slack.SlackNotifier`."""

    api_url: str | None = None  # None: Slack's own (https://slack.com/api/)
    default_channel: str = "#whywait"
    severity_channels: dict[str, str] = field(default_factory=dict)  # overrides the owner's channel
    mentions: dict[str, str] = field(default_factory=lambda: {"critical": "<!here>"})
    group_by: tuple[str, ...] = ("job",)
    group_wait: float = 1.0
    group_interval: float = 60.0
    repeat_interval: float = 4 * 3600.0
    reopen_within: float = 3600.0  # a resolved incident that fires again this soon reuses its message
    forget_after: float = 7 * 86400.0  # resolved incidents are dropped from the state store after this
    evidence_growth: float = 1.5  # a value this many times its last announced one is news
    rate_per_channel: float = 1.0  # messages per second per channel (Slack's limit is about 1)
    outbox_dir: Path | None = None  # None: kept in memory (lost on restart)
    outbox_shared_ok: bool = False  # True (the default folder): if in use, take a free sibling folder
    outbox_max_age: float = 86400.0
    retry_backoff: tuple[float, float] = (0.5, 30.0)  # first and largest pause after a failed delivery
    max_429_retries: int = 5
    request_timeout: float = 10.0
    dashboard_url_template: str | None = None
    timeline_limit: int = 50

    def __post_init__(self) -> None:
        for name in ("group_wait", "group_interval", "repeat_interval", "outbox_max_age"):
            if getattr(self, name) < 0:
                raise ConfigError(f"{name} must not be negative (got {getattr(self, name)})")
        if self.rate_per_channel <= 0:
            raise ConfigError(f"rate_per_channel must be > 0 (got {self.rate_per_channel})")
        for sev in (*self.severity_channels, *self.mentions):
            if sev not in SEVERITIES:
                raise ConfigError(f"unknown severity {sev!r} (expected one of {', '.join(SEVERITIES)})")
        if self.dashboard_url_template:
            _check_dashboard_template(self.dashboard_url_template)

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None) -> SlackConfig:
        """Read the ``WHYWAIT_*`` variables listed in the module docstring; unset ones keep defaults."""
        env = os.environ if env is None else env
        kw: dict[str, object] = {}
        if env.get("WHYWAIT_SLACK_API_URL"):
            kw["api_url"] = env["WHYWAIT_SLACK_API_URL"]
        if env.get("WHYWAIT_SLACK_CHANNEL"):
            kw["default_channel"] = env["WHYWAIT_SLACK_CHANNEL"]
        if env.get("WHYWAIT_SLACK_SEVERITY_CHANNELS"):
            kw["severity_channels"] = _pairs(env["WHYWAIT_SLACK_SEVERITY_CHANNELS"], "WHYWAIT_SLACK_SEVERITY_CHANNELS")
        if "WHYWAIT_SLACK_MENTIONS" in env:
            kw["mentions"] = {k: parse_mention(v, "WHYWAIT_SLACK_MENTIONS")
                              for k, v in _pairs(env["WHYWAIT_SLACK_MENTIONS"], "WHYWAIT_SLACK_MENTIONS").items()}
        if env.get("WHYWAIT_SLACK_RATE"):
            try:
                kw["rate_per_channel"] = float(env["WHYWAIT_SLACK_RATE"])
            except ValueError:
                raise ConfigError(f"WHYWAIT_SLACK_RATE must be a number of messages per second "
                                  f"(got {env['WHYWAIT_SLACK_RATE']!r})") from None
        if env.get("WHYWAIT_NOTIFY_GROUP_BY") is not None and "WHYWAIT_NOTIFY_GROUP_BY" in env:
            kw["group_by"] = tuple(filter(None, (s.strip() for s in env["WHYWAIT_NOTIFY_GROUP_BY"].split(","))))
        for var, name in (("WHYWAIT_NOTIFY_GROUP_WAIT", "group_wait"),
                          ("WHYWAIT_NOTIFY_GROUP_INTERVAL", "group_interval"),
                          ("WHYWAIT_NOTIFY_REPEAT_INTERVAL", "repeat_interval"),
                          ("WHYWAIT_NOTIFY_OUTBOX_MAX_AGE", "outbox_max_age")):
            if env.get(var):
                kw[name] = parse_duration(env[var], var)
        if env.get("WHYWAIT_NOTIFY_OUTBOX"):
            kw["outbox_dir"] = Path(env["WHYWAIT_NOTIFY_OUTBOX"])
        else:
            kw["outbox_dir"], kw["outbox_shared_ok"] = default_outbox_dir(env), True
        if env.get("WHYWAIT_DASHBOARD_URL"):
            kw["dashboard_url_template"] = env["WHYWAIT_DASHBOARD_URL"]
        return cls(**kw)  # type: ignore[arg-type]


def _check_dashboard_template(template: str) -> None:
    from whywait.engine.diagnosis import Diagnosis
    from whywait.engine.notify.render import dashboard_url

    sample = Diagnosis(rule_id="r", fingerprint="f", status="firing", severity="info", title="t", cause="c",
                       job="j", owner=None, starts_at=0.0, detected_at=0.0)
    try:
        dashboard_url(template, sample)
    except (KeyError, IndexError, ValueError, AttributeError) as exc:
        raise ConfigError(f"WHYWAIT_DASHBOARD_URL: {template!r} has an unknown field {exc} (fields: {{job}}, "
                          "{rule_id}, {fingerprint}, {culprit}, {severity}, {starts_at}, {from_ms}, {to_ms}, "
                          "{labels[NAME]})") from None
