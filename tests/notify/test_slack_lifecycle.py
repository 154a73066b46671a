"""The Slack notifier against the local Slack server: one living message per incident."""

from __future__ import annotations

import dataclasses
import logging
import time

from whywait.engine.notify.state import InMemoryStateStore

from tests.notify.conftest import T0


def _stragglers(make_diagnosis, n: int, start: int = 0):
    return [make_diagnosis(rank=start + i, node=f"node-{start + i:02d}") for i in range(n)]


def test_lifecycle_fire_grow_resolve_is_one_message_with_edits_and_replies(slack_server, make_notifier,
                                                                           make_diagnosis) -> None:
    n = make_notifier()
    first = _stragglers(make_diagnosis, 8)
    for d in first:  # eight stragglers behind one switch, within group_wait
        n.notify(d)
    assert n.flush(10)
    roots = slack_server.roots("#ml-infra")
    assert len(roots) == 1, "eight findings of one job are one message"
    assert "8 findings grouped" in roots[0].all_text
    assert "0–7" in roots[0].all_text  # ranks collapsed

    # grows: two more ranks, and one value triples
    time.sleep(0.35)  # past group_interval
    n.notify(make_diagnosis(rank=8, node="node-08"))
    n.notify(make_diagnosis(rank=9, node="node-09"))
    assert n.flush(10)
    root = slack_server.roots("#ml-infra")[0]
    assert len(slack_server.roots()) == 1
    assert "10 findings grouped" in root.all_text and len(root.edits) == 1
    replies = slack_server.thread(root.ts)
    assert len(replies) == 1 and "2 more findings" in replies[0].text and "8 → 10" in replies[0].text

    # resolves: every finding clears
    for d in [*first, make_diagnosis(rank=8, node="node-08"), make_diagnosis(rank=9, node="node-09")]:
        n.notify(dataclasses.replace(d, status="resolved", ends_at=T0 + 1800))
    assert n.flush(10)
    root = slack_server.roots()[0]
    assert len(slack_server.roots()) == 1
    assert root.text.startswith("RESOLVED") and ":large_green_circle: *RESOLVED*" in root.all_text
    replies = slack_server.thread(root.ts)
    assert len(replies) == 2 and "resolved at 2025-06-15 15:36:40 UTC after 30m" in replies[1].text
    posts = slack_server.posts()
    assert [p.thread_ts for p in posts] == [None, root.ts, root.ts]  # one root, two replies
    assert len(slack_server.calls_to("chat.update")) == 2
    assert n.stats()["posted"] == 1 and n.stats()["replied"] == 2


def test_same_diagnosis_again_is_not_news(slack_server, make_notifier, make_diagnosis) -> None:
    n = make_notifier()
    d = make_diagnosis()
    n.notify(d)
    assert n.flush(5)
    time.sleep(0.35)
    n.notify(dataclasses.replace(d, detected_at=d.detected_at + 60))
    assert n.flush(5)
    assert len(slack_server.posts()) == 1 and not slack_server.calls_to("chat.update")


def test_evidence_growth_and_severity_raise_are_news_with_mention(slack_server, make_notifier,
                                                                    make_diagnosis) -> None:
    n = make_notifier()
    d = make_diagnosis()
    n.notify(d)
    assert n.flush(5)
    assert "<!here>" not in slack_server.roots()[0].all_text  # warning: no mention
    time.sleep(0.35)
    ev = (dataclasses.replace(d.evidence[0], value=2000.0), d.evidence[1])
    n.notify(dataclasses.replace(d, severity="critical", evidence=ev))
    assert n.flush(5)
    root = slack_server.roots()[0]
    reply = slack_server.thread(root.ts)[0].text
    assert reply.startswith("<!here> ") and "severity raised: warning → critical" in reply
    assert "`tcp_retrans_segs_per_s` on `node-07`: 412 → 2,000 /s" in reply
    assert "<!here>" in root.all_text


def test_critical_mentions_here_in_root(slack_server, make_notifier, make_diagnosis) -> None:
    n = make_notifier()
    n.notify(make_diagnosis(severity="critical"))
    assert n.flush(5)
    root = slack_server.roots()[0]
    assert root.text.startswith("<!here> FIRING (critical)")


def test_repeat_interval_reannounces_in_thread(slack_server, make_notifier, make_diagnosis) -> None:
    n = make_notifier(repeat_interval=0.5)
    n.notify(make_diagnosis())
    assert n.flush(5)
    time.sleep(1.3)
    root = slack_server.roots()[0]
    replies = slack_server.thread(root.ts)
    assert len(slack_server.roots()) == 1
    assert replies and all("still firing since" in r.text for r in replies)


def test_resolved_before_announced_says_nothing(slack_server, make_notifier, make_diagnosis) -> None:
    n = make_notifier(group_wait=5.0)
    d = make_diagnosis()
    n.notify(d)
    n.notify(dataclasses.replace(d, status="resolved", ends_at=d.detected_at + 2))  # fired for 2 s < group_wait
    assert n.flush(5)
    assert slack_server.posts() == [] and n.stats()["dropped_unannounced"] == 1


def test_routing_owner_channel_default_and_severity_override(slack_server, make_notifier, make_diagnosis) -> None:
    from whywait.engine.diagnosis import Owner

    n = make_notifier(severity_channels={"critical": "#incidents"})
    n.notify(make_diagnosis(job="a", labels={"job": "a"}))
    n.notify(make_diagnosis(job="b", labels={"job": "b"}, owner=Owner("vision", "vision", None)))
    n.notify(make_diagnosis(job="c", labels={"job": "c"}, severity="critical"))
    assert n.flush(5)
    assert len(slack_server.roots("#ml-infra")) == 1
    assert len(slack_server.roots("#whywait")) == 1  # owner without a channel: the default
    assert len(slack_server.roots("#incidents")) == 1


def test_channel_not_found_falls_back_to_default_and_logs(slack_server, make_notifier, make_diagnosis,
                                                          caplog) -> None:
    from whywait.engine.diagnosis import Owner

    n = make_notifier()
    caplog.set_level(logging.WARNING, logger="whywait.engine.notify.slack")
    d = make_diagnosis(owner=Owner("ghost", "ghost-team", "#no-such-channel"))
    n.notify(d)
    assert n.flush(5)
    assert len(slack_server.roots("#whywait")) == 1
    assert n.stats()["fallback_channel"] == 1
    assert any("#no-such-channel" in r.getMessage() and "channel_not_found" in r.getMessage()
               for r in caplog.records)
    n.notify(dataclasses.replace(d, status="resolved", ends_at=T0 + 60))  # later writes follow it there
    assert n.flush(5)
    root = slack_server.roots("#whywait")[0]
    assert root.edits and len(slack_server.thread(root.ts)) == 1


def test_job_named_channel_mention_is_escaped_everywhere(slack_server, make_notifier, make_diagnosis) -> None:
    n = make_notifier()
    evil = "<!channel> & <@U123>"
    d = make_diagnosis(job=evil, labels={"job": evil}, title=f"Rank 3 of {evil} is slow", culprit="<!here>",
                       cause="<!everyone>", next_step="<https://evil|click>")
    n.notify(d)
    assert n.flush(5)
    n.notify(dataclasses.replace(d, status="resolved", ends_at=T0 + 60))
    assert n.flush(5)
    for call in slack_server.calls_to("chat.postMessage") + slack_server.calls_to("chat.update"):
        blob = repr(call.text) + repr(call.blocks)
        for raw in ("<!channel>", "<!here>", "<!everyone>", "<@U123>", "<https://evil"):
            assert raw not in blob
    assert "&lt;!channel&gt; &amp; &lt;@U123&gt;" in slack_server.roots()[0].all_text


def test_forced_429_is_retried_after_retry_after(slack_server, make_notifier, make_diagnosis) -> None:
    n = make_notifier()
    slack_server.force_429(2, retry_after=1)
    n.notify(make_diagnosis())
    assert n.flush(15)
    assert len(slack_server.roots()) == 1
    limited = [c for c in slack_server.calls if c.status == 429]
    assert len(limited) == 2


def test_server_side_rate_limit_without_client_limiter_loses_nothing(slack_server, make_notifier,
                                                                      make_diagnosis) -> None:
    slack_server.rate_limit(1.0)
    n = make_notifier(rate_per_channel=1000.0)  # limiter effectively off: the 429 handler does the work
    for i in range(3):
        n.notify(make_diagnosis(job=f"job-{i}", labels={"job": f"job-{i}"}))
    assert n.flush(30)
    assert len(slack_server.roots()) == 3
    assert any(c.status == 429 for c in slack_server.calls)


def test_restarted_notifier_edits_the_existing_message(slack_server, make_notifier, make_diagnosis,
                                                       tmp_path) -> None:
    store = InMemoryStateStore()
    d = make_diagnosis()
    first = make_notifier(state_store=store, outbox_dir=tmp_path / "a")
    first.notify(d)
    assert first.flush(5)
    first.close()
    second = make_notifier(state_store=store, outbox_dir=tmp_path / "b")
    second.notify(dataclasses.replace(d, status="resolved", ends_at=T0 + 120))
    assert second.flush(5)
    roots = slack_server.roots()
    assert len(roots) == 1 and len(slack_server.posts()) == 2  # the root and one reply
    assert roots[0].text.startswith("RESOLVED") and "after 2m" in slack_server.thread(roots[0].ts)[0].text


def test_outage_loses_nothing_and_delivers_in_order(slack_server, make_notifier, make_diagnosis) -> None:
    n = make_notifier(group_wait=0.0)
    jobs = [f"job-{i}" for i in range(6)]
    slack_server.outage("refuse")
    try:
        for j in jobs:
            n.notify(make_diagnosis(job=j, labels={"job": j}, title=f"straggler in {j}"))
            time.sleep(0.02)
        assert not n.flush(1.5)
        assert n.stats()["waiting"] == len(jobs) and n.stats().get("retried", 0) >= 1
    finally:
        slack_server.outage(None)
    assert n.flush(15)
    roots = slack_server.roots("#ml-infra")
    assert [r.text.split("straggler in ")[1].split(" ·")[0] for r in roots] == jobs


def test_503_outage_then_resolution_still_delivered(slack_server, make_notifier, make_diagnosis) -> None:
    n = make_notifier()
    d = make_diagnosis()
    n.notify(d)
    assert n.flush(5)
    with slack_server.down("503"):
        n.notify(dataclasses.replace(d, status="resolved", ends_at=T0 + 300))
        assert not n.flush(1.0)
    assert n.flush(15)
    root = slack_server.roots()[0]
    assert root.text.startswith("RESOLVED") and len(slack_server.thread(root.ts)) == 1


def test_outbox_survives_a_restart_during_an_outage(slack_server, make_notifier, make_diagnosis, tmp_path) -> None:
    store = InMemoryStateStore()
    outbox = tmp_path / "outbox-shared"
    first = make_notifier(state_store=store, outbox_dir=outbox, group_wait=0.0)
    slack_server.outage("refuse")
    first.notify(make_diagnosis())
    assert not first.flush(1.0)
    first.close(timeout=0.5)
    slack_server.outage(None)
    second = make_notifier(state_store=store, outbox_dir=outbox)
    assert second.flush(10)
    assert len(slack_server.roots()) == 1 and len(slack_server.posts()) == 1


def test_gives_up_after_max_age_counted_and_logged(slack_server, make_notifier, make_diagnosis, caplog) -> None:
    caplog.set_level(logging.ERROR, logger="whywait.engine.notify.pipeline")
    n = make_notifier(group_wait=0.0, outbox_max_age=0.5)
    slack_server.outage("503")
    n.notify(make_diagnosis())
    deadline = time.monotonic() + 15
    while time.monotonic() < deadline and not n.stats().get("given_up"):
        time.sleep(0.05)
    slack_server.outage(None)
    assert n.flush(5)
    assert n.stats()["given_up"] == 1 and slack_server.posts() == []
    assert any("gave up on a slack post" in r.getMessage() for r in caplog.records)


def test_token_never_appears_in_logs_or_messages(slack_server, make_notifier, make_diagnosis, caplog) -> None:
    from tests.notify.conftest import TOKEN

    caplog.set_level(logging.DEBUG)
    n = make_notifier()
    n.notify(make_diagnosis())
    assert n.flush(5)
    assert TOKEN not in caplog.text
    assert all(TOKEN not in (repr(c.text) + repr(c.blocks)) for c in slack_server.calls)
    assert TOKEN not in repr(n.__dict__)


def test_whole_lifecycle_during_an_outage_arrives_in_order(slack_server, make_notifier, make_diagnosis) -> None:
    n = make_notifier(group_wait=0.0, group_interval=0.0)
    d = make_diagnosis()
    n.notify(d)
    assert n.flush(5)
    with slack_server.down("refuse"):
        n.notify(make_diagnosis(rank=3, node="node-03"))
        assert not n.flush(0.5)
        n.notify(make_diagnosis(rank=4, node="node-04"))
        assert not n.flush(0.5)
        for x in (d, make_diagnosis(rank=3, node="node-03"), make_diagnosis(rank=4, node="node-04")):
            n.notify(dataclasses.replace(x, status="resolved", ends_at=T0 + 900))
        assert not n.flush(0.5)
    assert n.flush(15)
    (root,) = slack_server.roots()
    replies = [m.text for m in slack_server.thread(root.ts)]
    assert "node-03" in replies[0] and "node-04" in replies[1] and "resolved at" in replies[-1]
    assert root.text.startswith("RESOLVED")


def test_a_failing_state_store_does_not_stop_notifications(slack_server, make_notifier, make_diagnosis,
                                                           caplog) -> None:
    class Broken(InMemoryStateStore):
        def put(self, key, record):
            raise OSError("disk on fire")

    caplog.set_level(logging.WARNING, logger="whywait.engine.notify.slack")
    n = make_notifier(state_store=Broken())
    n.notify(make_diagnosis())
    assert n.flush(5)
    assert len(slack_server.roots()) == 1
    assert "could not save notifier state" in caplog.text


def test_deleted_message_is_posted_anew_and_its_news_follows(slack_server, make_notifier, make_diagnosis) -> None:
    """Someone deleted the incident's message: the next update posts a new root (the receipt
    moves to it) and the news reply lands in the new thread, nothing lost."""
    n = make_notifier()
    n.notify(make_diagnosis(rank=1, node="node-01"))
    assert n.flush(5)
    (old,) = slack_server.roots()
    del slack_server.messages[old.ts]
    time.sleep(0.35)  # past group_interval
    n.notify(make_diagnosis(rank=2, node="node-02"))
    assert n.flush(5)
    (new,) = slack_server.roots()
    assert new.ts != old.ts and "2 findings grouped" in new.all_text
    assert any("1 more finding" in r.text for r in slack_server.thread(new.ts))
    (inc,) = n.book.incidents.values()
    assert inc.receipts["slack"]["ts"] == new.ts and n.stats()["failed"] == 0


def test_incident_read_from_a_backlog_is_posted_resolved_once(slack_server, make_notifier, make_diagnosis) -> None:
    n = make_notifier(group_wait=5.0)
    d = make_diagnosis()
    n.notify(d)
    n.notify(dataclasses.replace(d, status="resolved", ends_at=d.detected_at + 140))  # same wall second
    assert n.flush(5)
    (root,) = slack_server.roots()
    assert "RESOLVED" in root.all_text.upper() and n.stats()["dropped_unannounced"] == 0
    assert any("resolved at" in r.text for r in slack_server.thread(root.ts))
