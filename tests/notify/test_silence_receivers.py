"""Silences hold for every receiver, say which silence muted what, and ``notify send`` says what it did.

The engine loaded the silences topic only for receivers that keep messages, so with the console alone (the demo's
default) ``whywait silence add`` changed nothing; with the webhook a silence muted the posts but nothing said so,
and the demo still printed a wall-clock "event produced → notification posted".  ``whywait notify send`` ignored
silences, and with its receiver unreachable it exited 1 ("a check found problems") after saying both that the
notification waited in the outbox and that it was lost for want of one.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import socket
import uuid
from pathlib import Path
from typing import Any, Iterator

import pytest
from whywait.engine.commands import demo
from whywait.engine.diagnosis import Evidence
from whywait.engine.notify import make_notifier
from whywait.engine.notify.silences import KafkaSilenceStore, Silence

from tests.notify.test_receivers import Hook

FAST_ENV = {"WHYWAIT_NOTIFY_GROUP_WAIT": "0s", "WHYWAIT_NOTIFY_GROUP_INTERVAL": "200ms"}


@pytest.fixture
def hook() -> Iterator[Hook]:
    h = Hook()
    yield h
    h.server.shutdown()
    h.server.server_close()


@pytest.fixture
def silenced_job(kafka_bootstrap: str) -> Iterator[tuple[str, Silence]]:
    """A job of its own and a silence on it, in the silences topic every notifier reads; expired at the end."""
    job = f"job-{uuid.uuid4().hex[:8]}"
    s = Silence.new({"job": job}, duration=3600.0, created_by="tester", comment="maintenance")
    store = KafkaSilenceStore(kafka_bootstrap, follow=False)
    try:
        store.add(s)
        yield job, s
        store.expire(s.id, by="tester")
    finally:
        store.close()


def _of(make_diagnosis: Any, job: str) -> Any:
    """A finding of ``job`` (its label too: incidents are grouped by the job label)."""
    return make_diagnosis(job=job, labels={"job": job, "node": "node-07", "switch": "leaf-3"})


def _muted_lines(caplog: pytest.LogCaptureFixture, silence_id: str) -> list[str]:
    return [r.getMessage() for r in caplog.records if f"silenced by {silence_id}" in r.getMessage()]


def _grown(d: Any) -> Any:
    """The same finding with news (a sibling node joining the incident)."""
    return dataclasses.replace(d, fingerprint=d.fingerprint.replace("node-07", "node-08"), culprit="node-08",
                               evidence=(*d.evidence, Evidence("tcp_retrans_segs_per_s", "node-08", 900.0, "/s", 3.1,
                                                                "> 3x peers' median", 60)))


def test_the_console_alone_applies_the_silences_topic(kafka_bootstrap, silenced_job, make_diagnosis, capsys,
                                                      caplog) -> None:
    job, s = silenced_job
    caplog.set_level(logging.INFO, logger="whywait.engine.notify")
    n = make_notifier(FAST_ENV, kafka_bootstrap=kafka_bootstrap)
    try:
        assert list(n.receivers) == ["console"]
        assert isinstance(n.silences, KafkaSilenceStore)
        assert n.outbox.directory is None  # still no disk outbox for what is only printed
        d = _of(make_diagnosis, job)
        n.notify(d)
        assert n.flush(10)
        n.notify(_grown(d))  # an update of the muted incident: still said once
        assert n.flush(10)
        assert n.stats()["sent"] == 0
        assert job not in capsys.readouterr().out
        (line,) = _muted_lines(caplog, s.id)
        assert f"job={job}" in line and "by tester: maintenance" in line
        other = _of(make_diagnosis, f"other-{job}")
        n.notify(other)
        assert n.flush(10)
        assert n.stats()["sent"] == 1 and f"other-{job}" in capsys.readouterr().out
    finally:
        n.close()


def test_the_webhook_is_muted_and_the_log_says_by_which_silence_once(kafka_bootstrap, silenced_job, hook,
                                                                      make_diagnosis, caplog, tmp_path) -> None:
    job, s = silenced_job
    caplog.set_level(logging.INFO, logger="whywait.engine.notify")
    env = {**FAST_ENV, "WHYWAIT_RECEIVERS": "webhook", "WHYWAIT_WEBHOOK_URL": hook.url,
           "WHYWAIT_NOTIFY_OUTBOX": str(tmp_path / "outbox")}
    from whywait.engine.notify.state import InMemoryStateStore

    n = make_notifier(env, kafka_bootstrap=kafka_bootstrap, state_store=InMemoryStateStore())
    try:
        d = _of(make_diagnosis, job)
        for finding in (d, _grown(d), _grown(d)):
            n.notify(finding)
            assert n.flush(10)
        assert hook.requests == []
        (line,) = _muted_lines(caplog, s.id)
        # the demo reads this line: its wall-clock figure names the silence instead of claiming a post
        m = demo._SILENCED.search(line)
        assert m is not None and m.group("job") == job and m.group("silence") == s.id
        assert demo.notification_figure([1937], m.group("silence")) == \
            f"wall-clock       : silenced by {s.id} (nothing posted)"
        assert demo.notification_figure([1937], None) == \
            "wall-clock       : 1937 ms (event produced → notification posted)"
        assert demo.notification_figure([], None) is None
    finally:
        n.close()


def _send(tmp_path: Path, d: Any, capsys: pytest.CaptureFixture[str]) -> tuple[int, str]:
    from whywait.engine.cli import main

    f = tmp_path / "d1.json"
    f.write_text(json.dumps(d.to_dict()))
    code = main(["notify", "send", "--timeout", "3", str(f)])
    return code, capsys.readouterr().err


def test_notify_send_holds_a_silenced_diagnosis_and_says_so(kafka_bootstrap, silenced_job, hook, make_diagnosis,
                                                            monkeypatch, capsys, tmp_path) -> None:
    job, s = silenced_job
    monkeypatch.setenv("WHYWAIT_KAFKA_BOOTSTRAP", kafka_bootstrap)
    monkeypatch.setenv("WHYWAIT_RECEIVERS", "webhook")
    monkeypatch.setenv("WHYWAIT_WEBHOOK_URL", hook.url)
    monkeypatch.setenv("WHYWAIT_NOTIFY_GROUP_WAIT", "0s")
    code, err = _send(tmp_path, _of(make_diagnosis, job), capsys)
    assert code == 0, err
    assert hook.requests == []
    assert err.strip().splitlines()[-1] == f"not sent: silenced by {s.id} (`whywait silence expire {s.id}` ends it)"
    code, err = _send(tmp_path, _of(make_diagnosis, f"other-{job}"), capsys)
    assert (code, err.strip().splitlines()[-1]) == (0, "delivered")
    assert len(hook.requests) == 1


def test_notify_send_without_kafka_sends_and_says_silences_were_not_checked(hook, make_diagnosis, monkeypatch,
                                                                             capsys, tmp_path) -> None:
    monkeypatch.setenv("WHYWAIT_KAFKA_BOOTSTRAP", f"127.0.0.1:{_free_port()}")
    monkeypatch.setenv("WHYWAIT_RECEIVERS", "webhook")
    monkeypatch.setenv("WHYWAIT_WEBHOOK_URL", hook.url)
    monkeypatch.setenv("WHYWAIT_NOTIFY_GROUP_WAIT", "0s")
    code, err = _send(tmp_path, make_diagnosis(), capsys)
    assert code == 0 and len(hook.requests) == 1
    assert "silences not checked: Kafka at 127.0.0.1:" in err and err.strip().splitlines()[-1] == "delivered"


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@pytest.mark.parametrize("receiver", ["webhook", "slack"])
def test_notify_send_to_an_unreachable_receiver_exits_3_and_says_one_thing(receiver, make_diagnosis, monkeypatch,
                                                                           capsys, tmp_path) -> None:
    port = _free_port()  # nothing listens there
    for var in ("WHYWAIT_NOTIFY_OUTBOX", "SLACK_BOT_TOKEN", "SLACK_BOT_TOKEN_FILE", "WHYWAIT_RECEIVERS"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("WHYWAIT_KAFKA_BOOTSTRAP", f"127.0.0.1:{_free_port()}")
    monkeypatch.setenv("WHYWAIT_NOTIFY_GROUP_WAIT", "0s")
    if receiver == "webhook":
        monkeypatch.setenv("WHYWAIT_RECEIVERS", "webhook")
        monkeypatch.setenv("WHYWAIT_WEBHOOK_URL", f"http://127.0.0.1:{port}/hook")
    else:
        monkeypatch.setenv("SLACK_BOT_TOKEN", "x")
        monkeypatch.setenv("WHYWAIT_SLACK_API_URL", f"http://127.0.0.1:{port}/api/")
    code, err = _send(tmp_path, make_diagnosis(), capsys)
    assert code == 3, err  # unavailable, as `whywait --help` defines it; 1 is "a check found problems"
    assert "outbox" not in err and "lost" not in err, err
    last = err.strip().splitlines()[-1]
    assert last.startswith(f"whywait notify: not delivered within 3s: {receiver} ") or \
        last.startswith("whywait notify: not delivered within 3s: Slack "), last
    assert "unreachable" in last and last.endswith("1 delivery(ies) dropped"), last
