"""One object with every setting of a Slack-only notifier: :class:`SlackConfig`.

The settings are split by owner: the pipeline's (grouping, timing, routing, outbox,
retry) are :class:`~whywait.engine.notify.pipeline.config.PipelineConfig`, the Slack
receiver's (API URL, mentions, pace, timeouts, dashboard link) are
:class:`~whywait.engine.notify.receivers.slack.SlackSettings`.  ``SlackConfig`` holds both, as
code and tests built it before the split, and hands each its part
(:meth:`SlackConfig.pipeline`, :meth:`SlackConfig.slack`).

Environment variables: those of both parts (see their docstrings and ``docs/notify.md``).
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Mapping

from whywait.engine.notify.pipeline.config import (  # noqa: F401 - re-exported for earlier callers
    SEVERITIES,
    PipelineConfig,
    default_outbox_dir,
    parse_duration,
)
from whywait.engine.notify.receivers.slack import SlackSettings, check_dashboard_template, parse_mention  # noqa: F401


@dataclass(frozen=True)
class SlackConfig:
    """The pipeline's and the Slack receiver's settings together (field meanings: in each part)."""

    api_url: str | None = None
    default_channel: str = "#whywait"
    severity_channels: dict[str, str] = field(default_factory=dict)
    mentions: dict[str, str] = field(default_factory=lambda: {"critical": "<!here>"})
    group_by: tuple[str, ...] = ("job",)
    group_wait: float = 1.0
    group_interval: float = 60.0
    repeat_interval: float = 4 * 3600.0
    reopen_within: float = 3600.0
    forget_after: float = 7 * 86400.0
    evidence_growth: float = 1.5
    rate_per_channel: float = 1.0
    outbox_dir: Path | None = None
    outbox_shared_ok: bool = False
    outbox_max_age: float = 86400.0
    retry_backoff: tuple[float, float] = (0.5, 30.0)
    max_429_retries: int = 5
    request_timeout: float = 10.0
    dashboard_url_template: str | None = None
    timeline_limit: int = 50

    def __post_init__(self) -> None:
        self.pipeline()  # each part checks its own settings, with the same messages as before
        self.slack()

    def pipeline(self) -> PipelineConfig:
        """The pipeline's part."""
        names = {f.name for f in fields(PipelineConfig)}
        return PipelineConfig(**{k: getattr(self, k) for k in names})

    def slack(self) -> SlackSettings:
        """The Slack receiver's part."""
        names = {f.name for f in fields(SlackSettings)}
        return SlackSettings(**{k: getattr(self, k) for k in names})

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None) -> SlackConfig:
        """Read both parts' ``WHYWAIT_*`` variables; unset ones keep defaults."""
        env = os.environ if env is None else env
        return cls(**{**PipelineConfig.env_kwargs(env), **SlackSettings.env_kwargs(env)})
