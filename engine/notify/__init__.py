"""Notifiers: where diagnoses go.  ``make_notifier`` picks one from the environment.

:data:`NOTIFIERS` is the explicit registry, name → class.
"""

from __future__ import annotations

import logging
import os
from typing import Any, Mapping

from whywait.engine.errors import ConfigError
from whywait.engine.notify.base import Notifier
from whywait.engine.notify.console import ConsoleNotifier
from whywait.engine.notify.secrets import read_secret
from whywait.engine.notify.slack import SlackNotifier

log = logging.getLogger(__name__)

NOTIFIERS: dict[str, type[Notifier]] = {"console": ConsoleNotifier, "slack": SlackNotifier}


def notifier_class(name: str) -> type[Notifier]:
    """The class registered as ``name``; a :class:`ConfigError` listing the valid names otherwise."""
    if name not in NOTIFIERS:
        raise ConfigError(f"unknown notifier {name!r} (expected one of {', '.join(sorted(NOTIFIERS))})")
    return NOTIFIERS[name]


def make_notifier(env: Mapping[str, str] | None = None, *, kafka_bootstrap: str | None = None,
                  **kwargs: Any) -> Notifier:
    """Return the notifier the environment asks for.

    Slack when ``SLACK_BOT_TOKEN`` (or ``SLACK_BOT_TOKEN_FILE``) is set, talking to
    ``WHYWAIT_SLACK_API_URL`` when that is set and configured by the other
    ``WHYWAIT_*`` variables (``whywait.engine.notify.config``); otherwise the console.
    With ``kafka_bootstrap``, the Slack notifier keeps its incident state and the
    silences in their compacted topics (so a restart edits the same messages);
    without, in memory.  ``kwargs`` go to the notifier's constructor.  A rejected
    token raises :class:`~whywait.engine.errors.NotifyError` (``retryable=False``) here.
    """
    env = os.environ if env is None else env
    token = read_secret("SLACK_BOT_TOKEN", env)
    if token is None:
        log.info("no SLACK_BOT_TOKEN set: printing notifications to the console")
        return ConsoleNotifier(dashboard_url_template=env.get("WHYWAIT_DASHBOARD_URL") or None, **kwargs)
    from whywait.engine.notify.config import SlackConfig

    config = SlackConfig.from_env(env)
    if kafka_bootstrap and "state_store" not in kwargs:
        from whywait.engine.notify.silences import KafkaSilenceStore
        from whywait.engine.notify.state import KafkaStateStore

        kwargs["state_store"] = KafkaStateStore(kafka_bootstrap)
        kwargs.setdefault("silence_store", KafkaSilenceStore(kafka_bootstrap))
        kwargs.setdefault("close_stores", True)
    return SlackNotifier(token, config, **kwargs)


__all__ = ["NOTIFIERS", "ConsoleNotifier", "Notifier", "SlackNotifier", "make_notifier", "notifier_class"]
