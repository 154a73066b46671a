"""Moved to :mod:`whywait.engine.notify.pipeline.incidents` (incidents are the pipeline's, not Slack's);
kept so records and callers written against the old name still load."""

from __future__ import annotations

from whywait.engine.notify.pipeline.incidents import (  # noqa: F401
    Incident,
    IncidentBook,
    Step,
    changes,
    group_key,
    incident_id,
    routed_channel,
    snapshot,
)
