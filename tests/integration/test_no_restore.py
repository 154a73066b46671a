"""``whywait engine --no-restore`` starts the notifier's message map empty (it used to reopen the last run's)."""

from __future__ import annotations

import uuid

import pytest
from whywait.engine.commands.engine_cmd import fresh_state_store
from whywait.engine.notify.state import KafkaStateStore

pytestmark = pytest.mark.integration


def test_fresh_state_store_loads_nothing_but_still_writes(kafka_bootstrap: str) -> None:
    topic = f"test.notify-state.{uuid.uuid4().hex[:8]}"
    old = KafkaStateStore(kafka_bootstrap, topic=topic)
    old.put("incident-1", {"ts": "1.0", "status": "firing"})
    old.close()

    fresh = fresh_state_store(kafka_bootstrap, topic=topic)
    try:
        assert fresh.load() == {}
        fresh.put("incident-2", {"ts": "2.0", "status": "firing"})
    finally:
        fresh.close()

    later = KafkaStateStore(kafka_bootstrap, topic=topic)  # the next normal restart resumes this run
    try:
        assert set(later.load()) == {"incident-1", "incident-2"}
    finally:
        later.close()
