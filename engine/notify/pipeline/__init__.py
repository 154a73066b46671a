"""The sink-neutral notification pipeline: grouping, timing, silences, routing, outbox, retry.

:class:`Pipeline` takes diagnoses and delivers announcements to one or more
:class:`Receiver` s (``whywait.engine.notify.receivers``).  Nothing in this package knows a sink:
no Slack client, no message markup (a test checks it).
"""

from __future__ import annotations

from whywait.engine.notify.pipeline.config import PipelineConfig, parse_duration
from whywait.engine.notify.pipeline.core import Pipeline
from whywait.engine.notify.pipeline.incidents import (
           Incident,
           IncidentBook,
           Step,
           group_key,
           incident_id,
           routed_channel,
)
from whywait.engine.notify.pipeline.outbox import Outbox, OutboxItem
from whywait.engine.notify.pipeline.receiver import Announcement, Line, Receipt, Receiver, ReceiverError

__all__ = ["Announcement", "Incident", "IncidentBook", "Line", "Outbox", "OutboxItem", "Pipeline", "PipelineConfig",
           "Receipt", "Receiver", "ReceiverError", "Step", "group_key", "incident_id", "parse_duration",
           "routed_channel"]
