"""``whywait engine``'s reliability options: one-line errors, and what their defaults mean."""

from __future__ import annotations

import socket

import pytest
from whywait.engine.commands.engine_cmd import instance_id, parse_skew
from whywait.engine.errors import ConfigError


def test_clock_skew_option() -> None:
    assert parse_skew("300") == 300.0 and parse_skew("90s") == 90.0
    assert parse_skew("off") is None and parse_skew("0") is None and parse_skew(None) is None
    for bad in ("-5", "soon", "inf", "nan"):
        with pytest.raises(ConfigError, match="--max-clock-skew"):
            parse_skew(bad)


def test_static_member_id_defaults_to_group_at_host() -> None:
    assert instance_id(None, "whywait-engine") == f"whywait-engine@{socket.gethostname()}"
    assert instance_id("eng-a", "g") == "eng-a" and instance_id("none", "g") is None


@pytest.mark.parametrize("flag,value", [("--align", "-1"), ("--restore-window", "-5"), ("--warmup", "-2"),
                                        ("--partitions", "0")])
def test_a_bad_setting_is_said_before_the_broker_is_asked(tmp_path, capsys, flag: str, value: str) -> None:
    # Both wrong (the broker at port 1 answers nothing): the flag is named, not hidden behind "unreachable".
    from whywait.engine.cli import main
    from whywait.simulate.cluster import make_cluster

    topo = tmp_path / "t.yaml"
    make_cluster(nodes=2).to_yaml(topo)
    assert main(["engine", "--bootstrap", "127.0.0.1:1", "--topology", str(topo), flag, value]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and flag in err[0] and "127.0.0.1:1" not in err[0], err


class _Answer:
    def __init__(self, topic_errors: list[tuple[str, int, str]]) -> None:
        self.topic_errors = topic_errors


class _RefusingAdmin:
    """aiokafka's admin client as a one-broker cluster answers ``--replication 3``: per-topic errors, no raise."""

    def __init__(self, **_: object) -> None:
        pass

    async def start(self) -> None:
        pass

    async def close(self) -> None:
        pass

    async def list_topics(self) -> list[str]:
        return []

    async def create_topics(self, new: list[object]) -> _Answer:
        why = ("Unable to replicate the partition 3 time(s): The target replication factor of 3 cannot be "
               "reached because only 1 broker(s) are registered.")
        return _Answer([(t.name, 38, why) for t in new])  # type: ignore[attr-defined]


def test_a_replication_the_cluster_cannot_give_is_one_line_naming_the_flag(monkeypatch, tmp_path, capsys) -> None:
    # The refusal was dropped: the topics went missing, were auto-created with one replica (or the engine
    # retried for 15 s and said the broker was unreachable).  Now it is exit 2 with the broker's reason.
    from whywait.engine.cli import main
    from whywait.simulate.cluster import make_cluster

    monkeypatch.setattr("whywait.engine.localkafka.broker.probe", lambda *a, **k: True)
    monkeypatch.setattr("aiokafka.admin.AIOKafkaAdminClient", _RefusingAdmin)
    for var in ("SLACK_BOT_TOKEN", "SLACK_BOT_TOKEN_FILE", "WHYWAIT_RECEIVERS"):
        monkeypatch.delenv(var, raising=False)
    topo = tmp_path / "t.yaml"
    make_cluster(nodes=2).to_yaml(topo)
    assert main(["engine", "--bootstrap", "127.0.0.1:1", "--topology", str(topo), "--replication", "3"]) == 2
    err = [line for line in capsys.readouterr().err.strip().splitlines() if not line.startswith("20")]
    assert len(err) == 1, err
    assert "INVALID_REPLICATION_FACTOR" in err[0] and "only 1 broker(s)" in err[0], err
    assert "--replication" in err[0] and "unreachable" not in err[0], err


def test_topic_creation_answers() -> None:
    from aiokafka.errors import KafkaError
    from whywait.engine.stream.topics import refused

    refused(_Answer([("a", 0, ""), ("b", 36, "Topic 'b' already exists.")]), 1)  # a race between workers: fine
    with pytest.raises(ConfigError, match=r"topic a \(and 1 more\): TOPIC_AUTHORIZATION_FAILED") as bad:
        refused(_Answer([("a", 29, ""), ("b", 29, "")]), 1)
    assert "--replication" not in str(bad.value)
    with pytest.raises(KafkaError, match="NOT_CONTROLLER"):  # retriable: engine_partitions tries again
        refused(_Answer([("a", 41, "")]), 1)


def test_existing_topics_with_fewer_replicas_than_asked_are_said(monkeypatch, caplog) -> None:
    # --replication 3 applies to topics it creates; existing ones (auto-created when agents published first,
    # or by an earlier run) kept one replica and the engine said nothing.
    import asyncio
    import logging

    from whywait.engine.stream.topics import ensure_topics_async

    class Admin(_RefusingAdmin):
        async def list_topics(self) -> list[str]:
            return ["whywait.gpu.v1", "whywait.net.v1", "whywait.host.v1", "whywait.steps.v1", "other"]

        async def create_topics(self, new: list[object]) -> _Answer:
            return _Answer([])

        async def describe_topics(self, topics: list[str]) -> list[dict[str, object]]:
            replicas = {"whywait.gpu.v1": [[1], [1, 2, 3]], "whywait.net.v1": [[1, 2, 3]]}
            return [{"topic": t, "error_code": 0,
                     "partitions": [{"partition": i, "replicas": r} for i, r in enumerate(replicas.get(t, [[1, 2]]))]}
                    for t in topics]

    caplog.set_level(logging.WARNING, logger="whywait.engine.stream.topics")
    monkeypatch.setattr("aiokafka.admin.AIOKafkaAdminClient", Admin)
    asyncio.run(ensure_topics_async("b:9092", replication=3))
    warned = [r.getMessage() for r in caplog.records]
    assert len(warned) == 1, warned
    assert warned[0].startswith("3 existing topic(s) have fewer replicas than --replication 3 (as few as 1: "
                                "whywait.gpu.v1, whywait.host.v1, whywait.steps.v1)"), warned
    caplog.clear()
    asyncio.run(ensure_topics_async("b:9092", replication=1))
    assert not caplog.records


def test_the_reload_notices_say_since_when_the_rules_were_stale() -> None:
    """The tester's "Rules reloaded" said `resolved at 13:06:49 after 0s` for rules refused since 13:06:13."""
    from whywait.engine.notify.render import plain_text
    from whywait.engine.stream.app import reload_notice

    refused = reload_notice(("site/x.yaml:3: bad",), now=1_000_060.0, since=1_000_000.0)
    assert refused.status == "firing" and refused.starts_at == 1_000_000.0 and refused.detected_at == 1_000_060.0
    fixed = reload_notice(None, now=1_000_096.0, since=1_000_000.0)
    assert fixed.status == "resolved" and fixed.starts_at == 1_000_000.0 and fixed.ends_at == 1_000_096.0
    assert "after 1m 36s" in plain_text(fixed)
