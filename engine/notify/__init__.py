"""Notifiers: where diagnoses go.  ``make_notifier`` picks one from the environment.

:data:`NOTIFIERS` is the explicit registry, name → class.
"""

from __future__ import annotations

import logging
import os
from typing import Any, Mapping

from engine.errors import ConfigError
from engine.notify.base import Notifier
from engine.notify.console import ConsoleNotifier
from engine.notify.secrets import read_secret
from engine.notify.slack import SlackNotifier

log = logging.getLogger(__name__)

NOTIFIERS: dict[str, type[Notifier]] = {"console": ConsoleNotifier, "slack": SlackNotifier}


def notifier_class(name: str) -> type[Notifier]:
    """The class registered as ``name``; a :class:`ConfigError` listing the valid names otherwise."""
    if name not in NOTIFIERS:
        raise ConfigError(f"unknown notifier {name!r} (expected one of {', '.join(sorted(NOTIFIERS))})")
    return NOTIFIERS[name]


def make_notifier(env: Mapping[str, str] | None = None, **kwargs: Any) -> Notifier:
    """Return the notifier the environment asks for.

    Slack when ``SLACK_BOT_TOKEN`` (or ``SLACK_BOT_TOKEN_FILE``) is set, talking to
    ``WHYWAIT_SLACK_API_URL`` when that is set; otherwise the console.  ``kwargs``
    go to the notifier's constructor.  A rejected token raises
    :class:`~engine.errors.NotifyError` (``retryable=False``) here, at start.
    """
    env = os.environ if env is None else env
    token = read_secret("SLACK_BOT_TOKEN", env)
    if token is None:
        log.info("no SLACK_BOT_TOKEN set: printing notifications to the console")
        return ConsoleNotifier(**kwargs)
    from engine.notify.config import SlackConfig

    return SlackNotifier(token, SlackConfig.from_env(env), **kwargs)


__all__ = ["NOTIFIERS", "ConsoleNotifier", "Notifier", "make_notifier", "notifier_class", "SlackNotifier"]
