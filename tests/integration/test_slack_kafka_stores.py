"""The notifier's state and the silences in their compacted Kafka topics, against the real broker."""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import time

import pytest
from whywait.engine.diagnosis import Diagnosis, Evidence, Owner
from whywait.engine.notify.config import SlackConfig
from whywait.engine.notify.receivers.slack import SlackNotifier
from whywait.engine.notify.silences import KafkaSilenceStore, Silence
from whywait.engine.notify.state import STATE_TOPIC, KafkaStateStore

from tests.support.kafka import unique_topic
from tests.support.slack_server import SlackServer

pytestmark = pytest.mark.integration

TOKEN = "xoxb-integration"
T0 = 1_750_000_000.0


def _diagnosis(**kw) -> Diagnosis:
    d = Diagnosis(rule_id="network.straggler-retransmits", fingerprint="network.straggler-retransmits|job=j|node=n7",
                  status="firing", severity="warning", title="Rank 7 of j is the straggler", cause="n7 drops packets",
                  job="j", owner=Owner("p", "t", "#ml-infra"), starts_at=T0, detected_at=T0 + 30,
                  labels={"job": "j"}, evidence=(Evidence("tcp_retrans_segs_per_s", "n7", 400.0, "/s", 3.0),),
                  culprit="n7", ranks=(7,))
    return dataclasses.replace(d, **kw)


def _config(server: SlackServer, tmp_path, name: str) -> SlackConfig:
    return SlackConfig(api_url=server.url, group_wait=0.0, group_interval=0.2, rate_per_channel=50.0,
                       outbox_dir=tmp_path / name, retry_backoff=(0.05, 0.2))


async def _topic_config(bootstrap: str, topic: str) -> dict[str, str]:
    from aiokafka.admin import AIOKafkaAdminClient
    from aiokafka.admin.config_resource import ConfigResource, ConfigResourceType

    admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap)
    await admin.start()
    try:
        (resp,) = await admin.describe_configs([ConfigResource(ConfigResourceType.TOPIC, topic)])
        return {entry[0]: entry[1] for res in resp.resources for entry in res[4]}
    finally:
        await admin.close()


def test_state_store_round_trip_and_compacted_topic(kafka_bootstrap: str) -> None:
    topic = unique_topic("notify-state")
    store = KafkaStateStore(kafka_bootstrap, topic=topic)
    assert store.load() == {}
    store.put("a", {"x": 1})
    store.put("b", {"x": 2})
    store.put("a", {"x": 3})
    store.delete("b")
    store.close()
    again = KafkaStateStore(kafka_bootstrap, topic=topic)
    assert again.load() == {"a": {"x": 3}}
    again.close()
    assert asyncio.run(_topic_config(kafka_bootstrap, topic))["cleanup.policy"] == "compact"
    assert STATE_TOPIC == "whywait.notify-state.v1"


def test_restarted_notifier_with_kafka_state_edits_the_same_message(kafka_bootstrap: str, tmp_path) -> None:
    topic = unique_topic("notify-state")
    d = _diagnosis()
    with SlackServer(channels=["#ml-infra", "#whywait"], token=TOKEN) as server:
        first = SlackNotifier(TOKEN, _config(server, tmp_path, "a"), state_store=KafkaStateStore(kafka_bootstrap,
                                                                                                  topic=topic),
                              close_stores=True)
        first.notify(d)
        assert first.flush(10)
        first.close()
        second = SlackNotifier(TOKEN, _config(server, tmp_path, "b"), state_store=KafkaStateStore(kafka_bootstrap,
                                                                                                   topic=topic),
                               close_stores=True)
        try:
            second.notify(dataclasses.replace(d, status="resolved", ends_at=T0 + 300))
            assert second.flush(10)
        finally:
            second.close()
        roots = server.roots()
        assert len(roots) == 1 and roots[0].text.startswith("RESOLVED")
        assert [m.text for m in server.thread(roots[0].ts)] == [
            ":white_check_mark: resolved at 2025-06-15 15:11:40 UTC after 5m"]


def test_a_worker_taking_over_edits_the_message_the_dead_worker_posted(kafka_bootstrap: str, tmp_path) -> None:
    """Two workers share the state topic; the survivor read it at start, before the other posted.  The job's
    incident fires again at the survivor (it re-reads the dead worker's window): it reads the topic to its
    end first, edits the dead worker's message and never overwrites its receipt (the failover test saw a
    second root when it did)."""
    topic = unique_topic("notify-state")
    d = _diagnosis()
    with SlackServer(channels=["#ml-infra", "#whywait"], token=TOKEN) as server:
        survivor = SlackNotifier(TOKEN, _config(server, tmp_path, "b"),
                                 state_store=KafkaStateStore(kafka_bootstrap, topic=topic), close_stores=True)
        dead = SlackNotifier(TOKEN, _config(server, tmp_path, "a"),
                             state_store=KafkaStateStore(kafka_bootstrap, topic=topic), close_stores=True)
        try:
            dead.notify(d)
            assert dead.flush(10)
            dead.close()  # its record is written (flush waits for Slack, not for the topic): it is gone
            (root,) = server.roots()
            survivor.notify(d)
            survivor.notify(dataclasses.replace(d, status="resolved", ends_at=T0 + 300))
            assert survivor.flush(10)
        finally:
            survivor.close()
            dead.close()
        assert [m.ts for m in server.roots()] == [root.ts] and server.roots()[0].text.startswith("RESOLVED")
        reader = KafkaStateStore(kafka_bootstrap, topic=topic)
        try:
            (rec,) = reader.load().values()
        finally:
            reader.close()
        assert rec["receipts"]["slack"]["ts"] == root.ts and rec["status"] == "resolved"


def test_silence_added_elsewhere_applies_to_a_following_store(kafka_bootstrap: str) -> None:
    topic = unique_topic("silences")
    engine_side = KafkaSilenceStore(kafka_bootstrap, topic=topic, follow=True)
    cli_side = KafkaSilenceStore(kafka_bootstrap, topic=topic, follow=False)
    try:
        s = Silence.new({"job": "llm-*"}, duration=3600, created_by="alice")
        cli_side.add(s)
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline and not engine_side.active():
            time.sleep(0.05)
        assert [x.id for x in engine_side.active()] == [s.id]
        assert engine_side.matching({"job": "llm-70b"}) is not None
        cli_side.expire(s.id, by="bob")
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline and engine_side.active():
            time.sleep(0.05)
        assert engine_side.active() == [] and engine_side.all()[0].expired_by == "bob"
    finally:
        engine_side.close()
        cli_side.close()
    assert asyncio.run(_topic_config(kafka_bootstrap, topic))["cleanup.policy"] == "compact"


def test_silence_command_against_kafka(kafka_bootstrap: str, capsys, monkeypatch) -> None:
    from whywait.engine.commands import silence_cmd

    topic = unique_topic("silences")
    monkeypatch.setattr(silence_cmd, "open_store",
                        lambda bootstrap: KafkaSilenceStore(bootstrap or kafka_bootstrap, topic=topic, follow=False))

    def run(*argv: str) -> str:
        p = argparse.ArgumentParser()
        silence_cmd.register(p)
        assert silence_cmd.run(p.parse_args(["--bootstrap", kafka_bootstrap, *argv])) == 0
        return capsys.readouterr().out

    sid = run("add", "-m", "team=ml-infra", "--for", "30m", "--by", "carol").split()[0]
    assert sid in run("list")
    run("expire", sid)
    assert "no silences in force" in run("list")
