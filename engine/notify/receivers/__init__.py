"""Receivers: where announcements go.  :data:`RECEIVERS` is the one registry, name → class.

Each receiver is one module here implementing
:class:`~whywait.engine.notify.pipeline.receiver.Receiver` (``send(announcement) -> receipt``,
raising ``ReceiverError(retryable=...)``) and a ``from_env`` that reads its settings.
Adding one: write ``engine/notify/receivers/NAME.py``, add it below, test it
(``docs/architecture.md``, "Adding a receiver").
"""

from __future__ import annotations

from whywait.engine.errors import ConfigError
from whywait.engine.notify.pipeline.receiver import Receiver
from whywait.engine.notify.receivers.alertmanager import AlertmanagerReceiver
from whywait.engine.notify.receivers.console import ConsoleReceiver
from whywait.engine.notify.receivers.slack import SlackReceiver
from whywait.engine.notify.receivers.webhook import WebhookReceiver

RECEIVERS: dict[str, type[Receiver]] = {
    "alertmanager": AlertmanagerReceiver,
    "console": ConsoleReceiver,
    "slack": SlackReceiver,
    "webhook": WebhookReceiver,
}


def receiver_class(name: str) -> type[Receiver]:
    """The class registered as ``name``; a :class:`ConfigError` listing the valid names otherwise."""
    if name not in RECEIVERS:
        raise ConfigError(f"unknown receiver {name!r} (expected one of {', '.join(sorted(RECEIVERS))})")
    return RECEIVERS[name]


__all__ = ["RECEIVERS", "AlertmanagerReceiver", "ConsoleReceiver", "SlackReceiver", "WebhookReceiver",
           "receiver_class"]
