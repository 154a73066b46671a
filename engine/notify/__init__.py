"""Notification: the sink-neutral pipeline (``whywait.engine.notify.pipeline``) and its receivers
(``whywait.engine.notify.receivers``).  :func:`make_notifier` builds both from the environment.
"""

from __future__ import annotations

import logging
import os
from typing import TYPE_CHECKING, Any, Mapping

from whywait.engine.errors import ConfigError
from whywait.engine.notify.base import Notifier
from whywait.engine.notify.secrets import read_secret

if TYPE_CHECKING:  # imported lazily at run time (the pipeline pulls in the receivers' registry)
    from whywait.engine.notify.pipeline import Pipeline

log = logging.getLogger(__name__)

# Loaded on first use, so importing the pipeline (or the console alone) pulls in no sink's client.
_LAZY = {"RECEIVERS": "whywait.engine.notify.receivers", "receiver_class": "whywait.engine.notify.receivers",
         "Pipeline": "whywait.engine.notify.pipeline", "PipelineConfig": "whywait.engine.notify.pipeline",
         "ConsoleNotifier": "whywait.engine.notify.receivers.console",
         "SlackNotifier": "whywait.engine.notify.receivers.slack"}


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        import importlib

        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def receiver_names(env: Mapping[str, str]) -> list[str]:
    """The receivers the environment asks for: ``WHYWAIT_RECEIVERS`` (comma-separated), else
    ``slack`` when ``SLACK_BOT_TOKEN`` (or ``_FILE``) is set, else ``console``."""
    from whywait.engine.notify.receivers import RECEIVERS

    raw = env.get("WHYWAIT_RECEIVERS", "")
    if raw.strip():
        names = [n.strip() for n in raw.split(",") if n.strip()]
        for n in names:
            if n not in RECEIVERS:
                raise ConfigError(f"WHYWAIT_RECEIVERS: unknown receiver {n!r} "
                                  f"(expected one of {', '.join(sorted(RECEIVERS))})")
        if len(set(names)) != len(names):
            raise ConfigError(f"WHYWAIT_RECEIVERS names a receiver twice (got {raw!r})")
        return names
    return ["slack"] if read_secret("SLACK_BOT_TOKEN", env) is not None else ["console"]


def make_notifier(env: Mapping[str, str] | None = None, *, kafka_bootstrap: str | None = None,
                  outbox: bool = True, **kwargs: Any) -> Pipeline:
    """Return the pipeline with the receivers the environment asks for (:func:`receiver_names`).

    Each receiver reads its own settings (``RECEIVERS[name].from_env``), the pipeline its own
    (:meth:`PipelineConfig.from_env`).  With ``kafka_bootstrap`` the silences are the compacted
    silences topic's, whatever the receivers (the console too: ``whywait silence add`` holds for
    every receiver), and with a receiver that keeps messages (any but the console) the incident
    state lives in its compacted topic too (so a restart edits the same messages); otherwise in memory.
    ``kwargs`` go to :class:`Pipeline` (``state_store``, ``silence_store``, ``clock``, ``close_stores``).
    ``outbox=False`` keeps deliveries in memory whatever ``WHYWAIT_NOTIFY_OUTBOX`` says: a one-shot sender
    (``whywait notify send``) must not take the engine's outbox, whose items only the engine's incident
    state can deliver (without it they are dropped as forgotten).  A bad setting raises :class:`ConfigError`;
    a rejected Slack token ``NotifyError(retryable=False)``.
    """
    from whywait.engine.notify.pipeline import Pipeline, PipelineConfig
    from whywait.engine.notify.receivers import receiver_class

    env = os.environ if env is None else env
    names = receiver_names(env)
    receivers = [receiver_class(n).from_env(env) for n in names]
    durable = any(r.durable for r in receivers)
    cfg_kw = PipelineConfig.env_kwargs(env)
    if not outbox or (not durable and not env.get("WHYWAIT_NOTIFY_OUTBOX")):
        cfg_kw["outbox_dir"], cfg_kw["outbox_shared_ok"] = None, False  # nothing printed is worth a disk queue
    config = PipelineConfig(**cfg_kw)
    # Each store on its own: a caller passing its own state store (the engine's --no-restore) still
    # gets the silences topic; defaulting both together left it in-memory silences, so silences set
    # with `whywait silence add` did not hold and a button's silence was lost on the next start.
    # The silences do not depend on the receivers: tying them to a durable one left the console (the
    # demo's default) deaf to every silence.
    if durable and kafka_bootstrap and "state_store" not in kwargs:
        from whywait.engine.notify.state import KafkaStateStore

        kwargs["state_store"] = KafkaStateStore(kafka_bootstrap)
        kwargs.setdefault("close_stores", True)
    if kafka_bootstrap and "silence_store" not in kwargs:
        from whywait.engine.notify.silences import KafkaSilenceStore

        kwargs["silence_store"] = KafkaSilenceStore(kafka_bootstrap)
        kwargs.setdefault("close_stores", True)
    log.info("notifications go to: %s", ", ".join(names))
    try:
        return Pipeline(receivers, config, **kwargs)
    except BaseException:
        for r in receivers:
            r.close()
        raise


__all__ = ["RECEIVERS", "ConsoleNotifier", "Notifier", "Pipeline", "SlackNotifier", "make_notifier",
           "receiver_class", "receiver_names"]
