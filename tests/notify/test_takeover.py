"""A worker that takes a job over continues the incident another worker announced: one message, edited.

The failover test (``tests/integration/test_failover.py``) once saw two roots: the survivor re-read the dead
worker's window, fired the incident again before it adopted the dead worker's record, opened it as new, saved a
record without a receipt over the dead worker's (the state topic keeps the newest per key), and posted.  A
notifier now asks the state store, read to its end, about every incident it opens before it announces or saves
it (``IncidentBook.confirm``).  These tests hold that without Kafka; ``test_slack_kafka_stores`` with it.
"""

from __future__ import annotations

import dataclasses
import json
import threading
import time
from typing import Any

import pytest
from whywait.engine.notify.pipeline.config import PipelineConfig
from whywait.engine.notify.pipeline.incidents import IncidentBook
from whywait.engine.notify.state import InMemoryStateStore

from tests.notify.conftest import T0

CFG = PipelineConfig(group_wait=30, group_interval=300, repeat_interval=4 * 3600, reopen_within=3600,
                     forget_after=86400)


def _announced(make_diagnosis: Any) -> tuple[str, dict[str, Any]]:
    """The key and stored record of an incident another worker posted (Slack's ts 1.000)."""
    other = IncidentBook(CFG)
    other.observe(make_diagnosis(), T0)
    assert [s.kind for s in other.due(T0 + 30)] == ["post"]
    (inc,) = other.incidents.values()
    inc.receipts["slack"] = {"channel": "#ml-infra", "channel_id": "C1", "ts": "1.000"}
    return inc.key, json.loads(json.dumps(inc.to_dict()))


def test_an_incident_opened_waits_for_the_store_before_it_is_announced(make_diagnosis) -> None:
    book = IncidentBook(CFG, confirm_new=True)
    book.observe(make_diagnosis(), T0)
    (key,) = book.incidents
    assert key in book.unconfirmed and book.due(T0 + 60) == [] and book.next_due() is None
    assert book.confirm(key, None, T0 + 60) is False  # nothing in the store: it goes ahead as opened
    assert [s.kind for s in book.due(T0 + 60)] == ["post"]


def test_confirm_continues_the_message_another_worker_posted(make_diagnosis) -> None:
    key, record = _announced(make_diagnosis)
    survivor = IncidentBook(CFG, confirm_new=True)  # its store was read at start, before the other one posted
    d = make_diagnosis()
    survivor.observe(d, T0 + 100)  # the re-read of the dead worker's window fires it again
    survivor.observe(dataclasses.replace(d, status="resolved", ends_at=T0 + 200), T0 + 101)
    assert survivor.due(T0 + 200) == []  # held, not dropped as a flap nor posted as new
    assert survivor.confirm(key, record, T0 + 102) is True
    steps = survivor.due(T0 + 102)
    assert [s.kind for s in steps] == ["update", "reply"] and "resolved at" in steps[1].text
    inc = survivor.incidents[key]
    assert inc.receipts["slack"]["ts"] == "1.000" and inc.status == "resolved" and key in survivor.changed


def test_adopting_after_the_incident_fired_again_takes_the_record(make_diagnosis) -> None:
    """The order the failover test's survivor logged: the re-read fired it, then the scale-out adopted."""
    key, record = _announced(make_diagnosis)
    survivor = IncidentBook(CFG, confirm_new=True)
    survivor.observe(make_diagnosis(), T0 + 100)
    assert survivor.adopt({key: record}, T0 + 100) == 1
    assert survivor.incidents[key].receipts["slack"]["ts"] == "1.000" and key not in survivor.unconfirmed
    assert all(s.kind != "post" for s in survivor.due(T0 + 1000))


def test_a_flap_nobody_announced_is_still_dropped_after_confirm(make_diagnosis) -> None:
    book = IncidentBook(CFG, confirm_new=True)
    d = make_diagnosis()
    book.observe(d, T0)
    book.observe(dataclasses.replace(d, status="resolved", ends_at=d.detected_at + 5), T0 + 5)
    (key,) = book.incidents
    assert book.confirm(key, None, T0 + 6) is False
    assert not book.incidents and book.dropped_unannounced == 1 and book.due(T0 + 60) == []


def test_an_incident_opened_again_after_one_was_forgotten_is_saved_not_deleted(make_diagnosis) -> None:
    """Fired again past reopen_within: the old incident is forgotten and a new one opened under the same key;
    its record must be written, not deleted after the write (both were pending)."""
    book = IncidentBook(CFG, confirm_new=True)
    d = make_diagnosis()
    book.observe(d, T0)
    book.confirm(next(iter(book.incidents)), None, T0)
    book.due(T0 + 30)
    book.observe(dataclasses.replace(d, status="resolved", ends_at=T0 + 100), T0 + 100)
    book.due(T0 + 100)
    book.changed.clear()
    book.observe(d, T0 + 100 + 3601)
    (key,) = book.incidents
    assert key in book.changed and key not in book.removed and key not in book.unconfirmed


# ---- the pipeline: one Slack message across two workers sharing a store ------------------------------------


def test_a_worker_taking_over_edits_the_message_the_other_posted(slack_server, make_notifier, make_diagnosis,
                                                                 tmp_path) -> None:
    store = InMemoryStateStore()  # stands for the state topic both workers share
    survivor = make_notifier(state_store=store, outbox_dir=tmp_path / "b")  # started before anything fired
    dead = make_notifier(state_store=store, outbox_dir=tmp_path / "a")
    d = make_diagnosis()
    dead.notify(d)
    assert dead.flush(5)
    dead.close()  # its record written (flush waits for Slack, not for the store), it is gone
    (root,) = slack_server.roots()
    survivor.notify(d)  # the job's new owner fires it again from the window it re-read
    survivor.notify(dataclasses.replace(d, status="resolved", ends_at=T0 + 120))
    assert survivor.flush(5)
    assert [m.ts for m in slack_server.roots()] == [root.ts] and len(slack_server.calls_to("chat.postMessage")) == 2
    assert slack_server.roots()[0].text.startswith("RESOLVED")
    assert "resolved at" in slack_server.thread(root.ts)[0].text
    (rec,) = store.load().values()
    assert rec["receipts"]["slack"]["ts"] == root.ts and rec["status"] == "resolved"


def test_nothing_is_saved_over_the_other_workers_record_before_the_store_answers(
        slack_server, make_notifier, make_diagnosis, tmp_path) -> None:
    answer = threading.Event()

    class Slow(InMemoryStateStore):  # a broker slow to answer the read to the end
        def current(self, keys: list[str]) -> dict[str, dict[str, Any]]:
            answer.wait(10)
            return super().current(keys)

    store = Slow()
    survivor = make_notifier(state_store=store, outbox_dir=tmp_path / "b", group_wait=0.0)
    dead = make_notifier(state_store=InMemoryStateStore(), outbox_dir=tmp_path / "a")
    d = make_diagnosis()
    dead.notify(d)
    assert dead.flush(5)
    dead.close()
    ((key, record),) = dead.state_store.load().items()
    store.put(key, record)  # what the dead worker wrote to the shared topic
    survivor.notify(d)
    time.sleep(0.5)  # past group_wait: without the store's answer nothing may be posted or saved
    assert len(slack_server.roots()) == 1 and store.load()[key] == record
    answer.set()
    time.sleep(0.5)
    survivor.notify(dataclasses.replace(d, status="resolved", ends_at=T0 + 120))
    assert survivor.flush(5)
    assert len(slack_server.roots()) == 1 and slack_server.roots()[0].text.startswith("RESOLVED")
    assert store.load()[key]["receipts"]["slack"]["ts"] == record["receipts"]["slack"]["ts"]


def test_an_unreadable_store_delays_the_post_but_does_not_lose_it(slack_server, make_notifier, make_diagnosis,
                                                                   monkeypatch: pytest.MonkeyPatch, caplog) -> None:
    from whywait.engine.notify.pipeline import core

    class Down(InMemoryStateStore):
        def current(self, keys: list[str]) -> dict[str, dict[str, Any]]:
            raise OSError("broker gone")

    monkeypatch.setattr(core, "CONFIRM_PATIENCE_S", 0.3)
    n = make_notifier(state_store=Down(), group_wait=0.0)
    n.notify(make_diagnosis())
    assert n.flush(10)
    assert len(slack_server.roots()) == 1
    assert "without knowing whether another engine worker announced" in caplog.text
