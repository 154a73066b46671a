"""How the notification pipeline groups, paces, routes and keeps deliveries: :class:`PipelineConfig`.

Built from the environment by :meth:`PipelineConfig.from_env` (``make_notifier`` does this)
or directly in code and tests.  These settings apply to every receiver; each receiver
reads its own (``WHYWAIT_SLACK_*``, ``WHYWAIT_ALERTMANAGER_*``, ``WHYWAIT_WEBHOOK_*``) in its
``from_env``.  Durations follow Alertmanager's meaning:

``group_wait``
    how long a new incident waits for its siblings before its first announcement;
``group_interval``
    the least time between two updates of one incident (resolution is not held back);
``repeat_interval``
    after this long without news, a still-firing incident is re-announced.

Environment variables (all optional)::

    WHYWAIT_NOTIFY_GROUP_BY         labels grouping findings into one incident (job)
    WHYWAIT_NOTIFY_GROUP_WAIT       1s      WHYWAIT_NOTIFY_GROUP_INTERVAL  1m
    WHYWAIT_NOTIFY_REPEAT_INTERVAL  4h      WHYWAIT_NOTIFY_OUTBOX_MAX_AGE  24h
    WHYWAIT_NOTIFY_OUTBOX           outbox folder (~/.local/state/whywait/notify-outbox)
    WHYWAIT_SLACK_CHANNEL           the route of an incident whose owner names no channel (#whywait)
    WHYWAIT_SLACK_SEVERITY_CHANNELS per-severity routes overriding the owner's: info=#whywait-low

The two routing variables keep their historical ``SLACK`` names: the route is a channel
name that the Slack receiver posts into and the others pass on (webhook payload).
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Mapping

from whywait.engine.diagnosis import SEVERITIES
from whywait.engine.errors import ConfigError

from whywait.durations import parse_duration as _parse_duration
from whywait.errors import DurationError


def parse_duration(value: str | float | int, what: str) -> float:
    """Seconds from ``"90s"``, ``"5m"``, ``"4h"``, ``"1d"``, ``"250ms"`` or a number (the one syntax,
    :mod:`whywait.durations`); a :class:`ConfigError` naming ``what`` otherwise."""
    try:
        return _parse_duration(value, what, bare_seconds=True)
    except DurationError:
        raise ConfigError(f"{what} must be a duration like '30s' (got {value!r})") from None


def severity_pairs(value: str, what: str) -> dict[str, str]:
    """``"critical=#incidents,info=#quiet"`` → a dict by severity; a :class:`ConfigError` naming ``what``."""
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
class PipelineConfig:
    """Grouping, timing, routing and delivery settings shared by every receiver."""

    default_channel: str = "#whywait"  # the route when the owner has none
    severity_channels: dict[str, str] = field(default_factory=dict)  # routes overriding the owner's
    group_by: tuple[str, ...] = ("job",)
    group_wait: float = 1.0
    group_interval: float = 60.0
    repeat_interval: float = 4 * 3600.0
    reopen_within: float = 3600.0  # a resolved incident that fires again this soon reopens
    forget_after: float = 7 * 86400.0  # resolved incidents are dropped from the state store after this
    evidence_growth: float = 1.5  # a value this many times its last announced one is news
    outbox_dir: Path | None = None  # None: kept in memory (lost on restart)
    outbox_shared_ok: bool = False  # True (the default folder): if in use, take a free sibling folder
    outbox_max_age: float = 86400.0
    retry_backoff: tuple[float, float] = (0.5, 30.0)  # first and largest pause after a failed delivery
    timeline_limit: int = 50

    def __post_init__(self) -> None:
        for name in ("group_wait", "group_interval", "repeat_interval", "outbox_max_age"):
            if getattr(self, name) < 0:
                raise ConfigError(f"{name} must not be negative (got {getattr(self, name)})")
        for sev in self.severity_channels:
            if sev not in SEVERITIES:
                raise ConfigError(f"unknown severity {sev!r} (expected one of {', '.join(SEVERITIES)})")

    @classmethod
    def env_kwargs(cls, env: Mapping[str, str]) -> dict[str, Any]:
        """The keyword arguments the ``WHYWAIT_*`` variables in the module docstring set (unset: absent)."""
        kw: dict[str, Any] = {}
        if env.get("WHYWAIT_SLACK_CHANNEL"):
            kw["default_channel"] = env["WHYWAIT_SLACK_CHANNEL"]
        if env.get("WHYWAIT_SLACK_SEVERITY_CHANNELS"):
            kw["severity_channels"] = severity_pairs(env["WHYWAIT_SLACK_SEVERITY_CHANNELS"],
                                                     "WHYWAIT_SLACK_SEVERITY_CHANNELS")
        if "WHYWAIT_NOTIFY_GROUP_BY" in env:
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
        return kw

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None) -> PipelineConfig:
        """Read the variables listed in the module docstring; unset ones keep their defaults."""
        return cls(**cls.env_kwargs(os.environ if env is None else env))
