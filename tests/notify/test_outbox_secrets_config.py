"""The durable outbox, secrets from env or files, and configuration errors."""

from __future__ import annotations

import json
import logging

import pytest
from whywait.engine.errors import ConfigError, NotifyError
from whywait.engine.notify.config import SlackConfig, parse_duration
from whywait.engine.notify.pipeline.outbox import Outbox
from whywait.engine.notify.receivers.slack import SlackReceiver
from whywait.engine.notify.secrets import Secret, read_secret


def test_outbox_survives_reopen_in_order(tmp_path) -> None:
    box = Outbox(tmp_path)
    a = box.append("post", "k1", "#a", 1.0, receiver="slack")
    box.append("reply", "k1", "#a", 2.0, text="hello", receiver="slack")
    box.append("post", "k2", "#b", 3.0, receiver="slack")
    box.done(a.seq)
    box.close()
    again = Outbox(tmp_path)
    assert [(i.kind, i.key, i.text) for i in again.items()] == [("reply", "k1", "hello"), ("post", "k2", "")]
    assert again.append("update", "k2", "#b", 4.0, receiver="alertmanager").seq == 4  # sequence continues
    again.close()
    third = Outbox(tmp_path)
    assert [i.receiver for i in third.items()] == ["slack", "slack", "alertmanager"]
    assert third.count("alertmanager") == 1 and third.has("k2", receiver="alertmanager")
    assert not third.has("k1", receiver="alertmanager")
    third.close()


def test_outbox_written_before_receivers_reads_as_slack(tmp_path) -> None:
    """An outbox left by a version that had only Slack keeps its items for the Slack receiver."""
    rec = {"seq": 7, "kind": "post", "key": "k", "lane": "#a", "created": 1.0, "text": "", "blocks": None,
           "attempts": 0, "meta": {}}
    (tmp_path / "outbox.jsonl").write_text(json.dumps({"add": rec}) + "\n")
    box = Outbox(tmp_path)
    assert [(i.seq, i.receiver) for i in box.items()] == [(7, "slack")]
    box.close()


def test_outbox_skips_a_torn_last_line(tmp_path, caplog) -> None:
    box = Outbox(tmp_path)
    box.append("post", "k1", "#a", 1.0, receiver="slack")
    box.close()
    with (tmp_path / "outbox.jsonl").open("a") as f:
        f.write('{"add": {"seq": 2, "ki')
    caplog.set_level(logging.WARNING)
    again = Outbox(tmp_path)
    assert [i.key for i in again.items()] == ["k1"] and "damaged outbox record" in caplog.text
    again.close()


def test_outbox_folder_is_exclusive(tmp_path) -> None:
    box = Outbox(tmp_path)
    with pytest.raises(NotifyError, match="in use by another notifier"):
        Outbox(tmp_path)
    box.close()
    Outbox(tmp_path).close()


def test_default_outbox_folder_moves_aside_when_busy(tmp_path) -> None:
    first = Outbox.first_free(tmp_path / "box")
    second = Outbox.first_free(tmp_path / "box")
    assert first.directory == tmp_path / "box" and second.directory == tmp_path / "box-1"
    first.close()
    second.close()


def test_outbox_compacts_when_drained(tmp_path) -> None:
    box = Outbox(tmp_path)
    for i in range(5):
        box.done(box.append("post", f"k{i}", "#a", 0.0, receiver="slack").seq)
    assert (tmp_path / "outbox.jsonl").read_text() == ""
    box.close()


def test_secret_from_env_or_file_never_shown(tmp_path) -> None:
    f = tmp_path / "token"
    f.write_text("xoxb-from-file\n")
    s = read_secret("SLACK_BOT_TOKEN", {"SLACK_BOT_TOKEN_FILE": str(f)})
    assert s is not None and s.reveal() == "xoxb-from-file"
    assert "xoxb" not in repr(s) and "xoxb" not in str(s) and "xoxb" not in f"{s}"
    assert read_secret("SLACK_BOT_TOKEN", {"SLACK_BOT_TOKEN": "xoxb-env"}) == Secret("xoxb-env")
    assert read_secret("SLACK_BOT_TOKEN", {}) is None
    with pytest.raises(ConfigError, match="not both"):
        read_secret("SLACK_BOT_TOKEN", {"SLACK_BOT_TOKEN": "a", "SLACK_BOT_TOKEN_FILE": str(f)})
    with pytest.raises(ConfigError, match=r"SLACK_SIGNING_SECRET_FILE: .*nope: cannot read"):
        read_secret("SLACK_SIGNING_SECRET", {"SLACK_SIGNING_SECRET_FILE": str(tmp_path / "nope")})


def test_make_notifier_token_from_file(slack_server, tmp_path, make_diagnosis) -> None:
    from whywait.engine.notify import make_notifier

    from tests.notify.conftest import TOKEN

    f = tmp_path / "token"
    f.write_text(TOKEN)
    n = make_notifier({"SLACK_BOT_TOKEN_FILE": str(f), "WHYWAIT_SLACK_API_URL": slack_server.url,
                       "WHYWAIT_NOTIFY_OUTBOX": str(tmp_path / "o")})
    slack = n.receivers["slack"]
    assert list(n.receivers) == ["slack"] and isinstance(slack, SlackReceiver)
    assert slack.identity  # the token read from the file worked
    n.close()


def test_config_from_env() -> None:
    cfg = SlackConfig.from_env({
        "WHYWAIT_SLACK_CHANNEL": "#alerts", "WHYWAIT_SLACK_SEVERITY_CHANNELS": "info=#quiet, critical=#pager",
        "WHYWAIT_SLACK_MENTIONS": "critical=@channel,warning=<!subteam^S123>",
        "WHYWAIT_NOTIFY_GROUP_BY": "job,switch", "WHYWAIT_NOTIFY_GROUP_WAIT": "250ms",
        "WHYWAIT_NOTIFY_REPEAT_INTERVAL": "2h", "WHYWAIT_SLACK_RATE": "0.5", "WHYWAIT_NOTIFY_OUTBOX": "/x/y",
        "WHYWAIT_DASHBOARD_URL": "https://g/d?job={job}"})
    assert cfg.default_channel == "#alerts" and cfg.severity_channels == {"info": "#quiet", "critical": "#pager"}
    assert cfg.mentions == {"critical": "<!channel>", "warning": "<!subteam^S123>"}
    assert cfg.group_by == ("job", "switch") and cfg.group_wait == 0.25 and cfg.repeat_interval == 7200
    assert cfg.rate_per_channel == 0.5 and str(cfg.outbox_dir) == "/x/y"
    assert SlackConfig.from_env({"WHYWAIT_SLACK_MENTIONS": ""}).mentions == {}


@pytest.mark.parametrize("env, message", [
    ({"WHYWAIT_NOTIFY_GROUP_WAIT": "soon"}, "WHYWAIT_NOTIFY_GROUP_WAIT must be a duration like '30s' (got 'soon')"),
    ({"WHYWAIT_SLACK_RATE": "fast"}, "WHYWAIT_SLACK_RATE must be a number of messages per second (got 'fast')"),
    ({"WHYWAIT_SLACK_SEVERITY_CHANNELS": "urgent=#x"}, "unknown severity 'urgent'"),
    ({"WHYWAIT_SLACK_MENTIONS": "critical=bob"}, "must be a mention like '@here'"),
    ({"WHYWAIT_DASHBOARD_URL": "https://g/{nope}"}, "has an unknown field 'nope'"),
])
def test_config_errors_name_the_variable(env, message) -> None:
    with pytest.raises(ConfigError) as err:
        SlackConfig.from_env(env)
    assert message in str(err.value)


def test_parse_duration() -> None:
    assert [parse_duration(v, "x") for v in ("90s", "5m", "4h", "1d", "250ms", "12", 3)] == \
        [90, 300, 14400, 86400, 0.25, 12, 3]


def test_unknown_receiver_lists_valid_ones() -> None:
    from whywait.engine.notify import RECEIVERS, make_notifier, receiver_class

    assert set(RECEIVERS) == {"alertmanager", "console", "slack", "webhook"}
    valid = r"\(expected one of alertmanager, console, slack, webhook\)"
    with pytest.raises(ConfigError, match=r"unknown receiver 'email' " + valid):
        receiver_class("email")
    with pytest.raises(ConfigError, match=r"WHYWAIT_RECEIVERS: unknown receiver 'email' " + valid):
        make_notifier({"WHYWAIT_RECEIVERS": "console,email"})


def test_console_is_default_and_imports_no_kafka() -> None:
    import subprocess
    import sys

    # Without a broker named, nothing of Kafka is loaded.  With one, the console reads the silences topic
    # like every receiver (tests/notify/test_silence_receivers.py), and still keeps no disk queue or state.
    code = ("import sys; from whywait.engine.notify import make_notifier; "
            "n = make_notifier({}); "
            "print(','.join(n.receivers), n.outbox.directory, 'aiokafka' in sys.modules); n.close()")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.split() == ["console", "None", "False"]  # nothing printed is worth a disk queue



def test_make_notifier_keeps_the_silences_topic_with_a_state_store_of_its_own(monkeypatch, tmp_path) -> None:
    # The engine's --no-restore passes its own (fresh) state store; the silences then fell back to an
    # in-memory store: `whywait silence add` did not apply and Slack's Silence buttons were not kept.
    from whywait.engine.notify import make_notifier, silences, state
    from whywait.engine.notify.silences import InMemorySilenceStore
    from whywait.engine.notify.state import InMemoryStateStore

    made: list[str] = []

    class FakeSilences(InMemorySilenceStore):
        def __init__(self, bootstrap: str) -> None:
            super().__init__()
            made.append("silences@" + bootstrap)

    class FakeState(InMemoryStateStore):
        def __init__(self, bootstrap: str) -> None:
            super().__init__()
            made.append("state@" + bootstrap)

    monkeypatch.setattr(silences, "KafkaSilenceStore", FakeSilences)
    monkeypatch.setattr(state, "KafkaStateStore", FakeState)
    env = {"WHYWAIT_RECEIVERS": "webhook", "WHYWAIT_WEBHOOK_URL": "http://127.0.0.1:9/x",
           "WHYWAIT_NOTIFY_OUTBOX": str(tmp_path / "o")}
    own = InMemoryStateStore()
    n = make_notifier(env, kafka_bootstrap="b:9092", state_store=own)
    try:
        assert made == ["silences@b:9092"] and isinstance(n.silences, FakeSilences)
    finally:
        n.close()
    n = make_notifier({**env, "WHYWAIT_NOTIFY_OUTBOX": str(tmp_path / "o2")}, kafka_bootstrap="b:9092")
    try:
        assert made == ["silences@b:9092", "state@b:9092", "silences@b:9092"]
    finally:
        n.close()
