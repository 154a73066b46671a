"""The pure incident book: grouping and Alertmanager-style timing, on a fake clock."""

from __future__ import annotations

import dataclasses

from whywait.engine.notify.pipeline.config import PipelineConfig
from whywait.engine.notify.pipeline.incidents import IncidentBook, group_key, routed_channel
from whywait.engine.notify.silences import Silence

from tests.notify.conftest import T0

CFG = PipelineConfig(group_wait=30, group_interval=300, repeat_interval=4 * 3600, reopen_within=3600,
                  forget_after=86400)


def kinds(anns):
    return [a.kind for a in anns]


def test_group_wait_collects_siblings_into_one_post(make_diagnosis) -> None:
    book = IncidentBook(CFG)
    for i in range(8):
        book.observe(make_diagnosis(rank=i, node=f"node-{i}"), T0 + i)
    assert book.due(T0 + 29) == []
    anns = book.due(T0 + 30)
    assert kinds(anns) == ["post"] and len(book.incidents) == 1
    (inc,) = book.incidents.values()
    assert len(inc.members) == 8 and inc.view().ranks == tuple(range(8))
    assert book.next_due() == T0 + 30 + 4 * 3600  # the repeat


def test_group_interval_spaces_updates_and_resolution_is_immediate(make_diagnosis) -> None:
    book = IncidentBook(CFG)
    d = make_diagnosis()
    book.observe(d, T0)
    book.due(T0 + 30)
    book.observe(make_diagnosis(rank=5, node="node-05"), T0 + 60)
    assert book.due(T0 + 100) == []  # not before last announcement + group_interval
    anns = book.due(T0 + 330)
    assert kinds(anns) == ["update", "reply"] and "1 more finding" in anns[1].text
    book.observe(dataclasses.replace(d, status="resolved", ends_at=T0 + 400), T0 + 400)
    assert "recovered: `node-07`" in book.due(T0 + 630)[1].text
    book.observe(dataclasses.replace(make_diagnosis(rank=5, node="node-05"), status="resolved",
                                     ends_at=T0 + 700), T0 + 700)
    anns = book.due(T0 + 700)  # no group_interval wait for the resolution
    assert kinds(anns) == ["update", "reply"] and "resolved at" in anns[1].text and "after 11m 40s" in anns[1].text


def test_repeat_interval_reannounces_once_per_interval(make_diagnosis) -> None:
    book = IncidentBook(CFG)
    book.observe(make_diagnosis(), T0)
    book.due(T0 + 30)
    assert book.due(T0 + 30 + 4 * 3600 - 1) == []
    anns = book.due(T0 + 30 + 4 * 3600)
    assert kinds(anns) == ["update", "reply"] and "still firing since" in anns[1].text
    assert book.due(T0 + 31 + 4 * 3600) == []


def test_a_flap_resolved_before_announcement_is_dropped_silently(make_diagnosis) -> None:
    book = IncidentBook(CFG)
    d = make_diagnosis()  # detected at T0 + 30
    book.observe(d, T0)
    book.observe(dataclasses.replace(d, status="resolved", ends_at=d.detected_at + 5), T0 + 5)  # 5 s < group_wait
    assert book.due(T0 + 30) == [] and not book.incidents and book.dropped_unannounced == 1


def test_an_incident_read_from_a_backlog_is_posted_as_resolved(make_diagnosis) -> None:
    # A 140-s incident read in one wall-clock second (a backlog, a restart): not a flap; said once, resolved.
    book = IncidentBook(CFG)
    d = make_diagnosis()
    book.observe(d, T0)
    book.observe(dataclasses.replace(d, status="resolved", ends_at=d.detected_at + 140), T0 + 1)
    anns = book.due(T0 + 1)
    assert kinds(anns) == ["post", "reply"] and "resolved at" in anns[1].text and "after 2m 50s" in anns[1].text
    (inc,) = book.incidents.values()
    assert inc.posted and inc.status == "resolved" and book.dropped_unannounced == 0
    assert book.due(T0 + 2) == []


def test_an_incident_silenced_throughout_stays_unsaid_when_it_resolves(make_diagnosis) -> None:
    book = IncidentBook(CFG)
    silence = Silence.new({"job": "llm-*"}, duration=3600, created_by="ops", now=T0)
    d = make_diagnosis()
    book.observe(d, T0)
    book.observe(dataclasses.replace(d, status="resolved", ends_at=d.detected_at + 140), T0 + 1)
    assert book.due(T0 + 1, lambda inc: silence if silence.matches(inc.fields()) else None) == []
    assert not book.incidents and book.dropped_unannounced == 1


def test_silenced_incident_is_not_posted_but_a_posted_one_always_resolves(make_diagnosis) -> None:
    book = IncidentBook(CFG)
    silence = Silence.new({"job": "llm-*"}, duration=3600, created_by="ops", now=T0)
    d = make_diagnosis()
    book.observe(d, T0)
    assert book.due(T0 + 30, lambda inc: silence if silence.matches(inc.fields()) else None) == []
    assert book.due(T0 + 3600, lambda inc: None) and book.incidents[book.key_for(d)].posted  # after it ends
    book.observe(dataclasses.replace(d, status="resolved", ends_at=T0 + 4000), T0 + 4000)
    anns = book.due(T0 + 4000, lambda inc: silence)  # silenced again: the resolution goes out anyway
    assert kinds(anns) == ["update", "reply"]


def test_reopen_within_window_reuses_message_later_starts_new(make_diagnosis) -> None:
    book = IncidentBook(CFG)
    d = make_diagnosis()
    book.observe(d, T0)
    book.due(T0 + 30)
    # the message a receiver posted (its receipt) is what a reopened incident edits
    book.incidents[book.key_for(d)].receipts["slack"] = {"channel": "#x", "ts": "111.222"}
    book.observe(dataclasses.replace(d, status="resolved"), T0 + 100)
    book.due(T0 + 100)
    book.observe(d, T0 + 200)
    anns = book.due(T0 + 200)
    assert kinds(anns) == ["update", "reply"] and "firing again" in anns[1].text
    assert book.incidents[book.key_for(d)].receipts["slack"]["ts"] == "111.222"
    book.observe(dataclasses.replace(d, status="resolved"), T0 + 300)
    book.due(T0 + 300)
    book.observe(d, T0 + 300 + 3601)
    assert book.incidents[book.key_for(d)].receipts == {}  # a new incident: a new message
    assert kinds(book.due(T0 + 300 + 3601 + 30)) == ["post"]


def test_keys_and_routing(make_diagnosis) -> None:
    from whywait.engine.diagnosis import Owner

    d = make_diagnosis()
    assert group_key(d, ("job",)) == "network.straggler-retransmits|#ml-infra|job=llm-70b"
    assert group_key(d, ()) == f"network.straggler-retransmits|#ml-infra|fingerprint={d.fingerprint}"
    assert group_key(d, ("switch", "culprit")).endswith("switch=leaf-3|culprit=node-07")
    cfg = PipelineConfig(default_channel="#default", severity_channels={"info": "#quiet"})
    assert routed_channel(d, cfg) == "#ml-infra"
    assert routed_channel(dataclasses.replace(d, severity="info"), cfg) == "#quiet"
    assert routed_channel(dataclasses.replace(d, owner=Owner("p", "t")), cfg) == "#default"
    assert routed_channel(dataclasses.replace(d, owner=None), cfg) == "#default"


def test_state_round_trips_through_records(make_diagnosis) -> None:
    book = IncidentBook(CFG)
    d = make_diagnosis()
    book.observe(d, T0)
    book.due(T0 + 30)
    records = {k: inc.to_dict() for k, inc in book.incidents.items()}
    again = IncidentBook(CFG, records)
    assert again.key_for(d) == book.key_for(d)
    assert again.incidents[book.key_for(d)].to_dict() == records[book.key_for(d)]
    again.observe(dataclasses.replace(d, status="resolved", ends_at=T0 + 60), T0 + 60)
    assert kinds(again.due(T0 + 60)) == ["update", "reply"]


def test_a_damaged_state_record_is_ignored_at_load_not_failed_on_later(make_diagnosis) -> None:
    """Every field of a real record replaced by a value of another type: the book loads it or ignores it,
    and whatever it loads can be announced (a wrong type used to fail in the delivery, every time it came due)."""
    import copy
    import json

    book = IncidentBook(CFG)
    book.observe(make_diagnosis(rank=3, node="node-3"), T0)
    book.due(T0 + 30)
    ((key, inc),) = book.incidents.items()
    real = json.loads(json.dumps(inc.to_dict()))
    failures = []
    for field in list(real):
        for wrong in (None, "x", -1, [], {}, True, [["a"]], {"k": "v"}):
            rec = copy.deepcopy(real)
            rec[field] = wrong
            try:
                loaded = IncidentBook(CFG, {key: rec})
                for i in loaded.incidents.values():
                    i.view(), i.fields()
                loaded.force(T0 + 10_000)
                loaded.due(T0 + 10_000)
            except Exception as exc:  # noqa: BLE001 - any escape is the defect this test looks for
                failures.append(f"{field}={wrong!r}: {type(exc).__name__}: {exc}")
    member = next(iter(real["members"]))
    rec = copy.deepcopy(real)
    rec["members"][member]["evidence"] = [{"metric": "m", "entity": "e", "value": "909"}]
    assert IncidentBook(CFG, {key: rec}).incidents == {}  # a member that is no diagnosis: the record is ignored
    assert failures == []
