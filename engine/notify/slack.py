"""Moved to :mod:`whywait.engine.notify.receivers.slack` (the Slack receiver) and
:mod:`whywait.engine.notify.pipeline` (what used to live here besides Slack); kept for importers."""

from __future__ import annotations

from whywait.engine.notify.receivers.slack import SlackNotifier, SlackReceiver  # noqa: F401
