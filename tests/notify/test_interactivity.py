"""Buttons: a signed request from Slack is applied; a tampered, stale or unsigned one is rejected."""

from __future__ import annotations

import json
import time
import urllib.error
import urllib.request
from typing import Any
from urllib.parse import urlencode

import pytest
from whywait.engine.errors import ConfigError
from whywait.engine.notify.interactivity import InteractivityServer, InvalidSignature, sign, verify_signature
from whywait.engine.notify.render import ACTION_ACK, ACTION_SILENCE_1H, ACTION_SILENCE_RESOLVED, ACTION_TIMELINE
from whywait.engine.notify.silences import InMemorySilenceStore

SECRET = "8f742231b10e8888abcd99yyyzzz85a5"


def _payload(action_id: str, value: str, user: str = "alice") -> bytes:
    payload = {"type": "block_actions", "user": {"id": "U0ALICE", "username": user, "name": user},
               "actions": [{"action_id": action_id, "value": value, "type": "button"}],
               "channel": {"id": "C0000001"}, "message": {"ts": "1.0"}}
    return urlencode({"payload": json.dumps(payload)}).encode()


def _post(url: str, body: bytes, headers: dict[str, str]) -> tuple[int, dict[str, Any]]:
    req = urllib.request.Request(url, data=body, method="POST",
                                 headers={"Content-Type": "application/x-www-form-urlencoded", **headers})
    try:
        with urllib.request.urlopen(req, timeout=5) as resp:
            return resp.status, json.loads(resp.read())
    except urllib.error.HTTPError as err:
        return err.code, json.loads(err.read())


def _signed(body: bytes, ts: float | None = None, secret: str = SECRET) -> dict[str, str]:
    stamp = str(int(time.time() if ts is None else ts))
    return {"X-Slack-Request-Timestamp": stamp, "X-Slack-Signature": sign(secret, stamp, body)}


@pytest.fixture
def posted(slack_server, make_notifier, make_diagnosis):
    """A notifier that has posted one incident, its interactivity endpoint, and the incident id."""
    silences = InMemorySilenceStore()
    n = make_notifier(silence_store=silences)
    n.notify(make_diagnosis())
    assert n.flush(5)
    (inc,) = n.book.incidents.values()
    with InteractivityServer(n, SECRET) as server:
        yield n, server, inc.id, silences


def test_signature_roundtrip_and_failures() -> None:
    body = b"payload=%7B%7D"
    now = 1_750_000_000
    good = sign(SECRET, str(now), body)
    verify_signature(SECRET, str(now), body, good, now=now + 299)
    with pytest.raises(InvalidSignature, match="signature mismatch"):
        verify_signature(SECRET, str(now), body + b"x", good, now=now)
    with pytest.raises(InvalidSignature, match="stale request"):
        verify_signature(SECRET, str(now), body, good, now=now + 301)
    with pytest.raises(InvalidSignature, match="missing"):
        verify_signature(SECRET, None, body, good, now=now)
    with pytest.raises(InvalidSignature, match="signature mismatch"):
        verify_signature("another-secret", str(now), body, good, now=now)


def test_signed_acknowledge_edits_the_message(posted, slack_server) -> None:
    n, server, inc_id, _ = posted
    body = _payload(ACTION_ACK, inc_id)
    status, answer = _post(server.url, body, _signed(body))
    assert status == 200 and answer["ok"]
    assert n.flush(5)
    root = slack_server.roots()[0]
    assert "Acknowledged by alice at " in root.all_text and len(root.edits) == 1


def test_tampered_request_is_rejected(posted, slack_server) -> None:
    n, server, inc_id, _ = posted
    body = _payload(ACTION_ACK, inc_id)
    headers = _signed(body)
    status, answer = _post(server.url, _payload(ACTION_ACK, inc_id, user="mallory"), headers)
    assert status == 401 and "signature mismatch" in answer["error"]
    assert n.flush(5)
    assert not slack_server.roots()[0].edits


def test_stale_request_is_rejected(posted, slack_server) -> None:
    n, server, inc_id, _ = posted
    body = _payload(ACTION_ACK, inc_id)
    status, answer = _post(server.url, body, _signed(body, ts=time.time() - 6 * 60))
    assert status == 401 and "stale" in answer["error"]
    status, _ = _post(server.url, body, {})
    assert status == 401
    assert n.flush(5)
    assert not slack_server.roots()[0].edits


def test_silence_button_mutes_and_says_so_in_thread(posted, slack_server) -> None:
    n, server, inc_id, silences = posted
    body = _payload(ACTION_SILENCE_1H, inc_id, user="bob")
    assert _post(server.url, body, _signed(body))[0] == 200
    assert n.flush(5)
    (s,) = silences.active()
    assert s.created_by == "bob" and s.ends_at is not None and 3590 < s.ends_at - s.starts_at <= 3600
    root = slack_server.roots()[0]
    assert "Silenced until" in root.all_text and "by bob" in root.all_text
    assert "silenced for 1h" in slack_server.thread(root.ts)[0].text


def test_silenced_until_resolved_still_announces_resolution_then_ends(posted, slack_server, make_diagnosis) -> None:
    import dataclasses

    n, server, inc_id, silences = posted
    body = _payload(ACTION_SILENCE_RESOLVED, inc_id)
    assert _post(server.url, body, _signed(body))[0] == 200
    assert n.flush(5)
    time.sleep(0.35)
    n.notify(make_diagnosis(rank=3, node="node-03"))  # news, but silenced: the root is edited, no reply
    assert n.flush(5)
    root = slack_server.roots()[0]
    assert len(slack_server.thread(root.ts)) == 1  # only the "silenced" reply
    for d in (make_diagnosis(), make_diagnosis(rank=3, node="node-03")):
        n.notify(dataclasses.replace(d, status="resolved", ends_at=d.starts_at + 90))
    assert n.flush(5)
    replies = slack_server.thread(root.ts)
    assert "resolved at" in replies[-1].text  # a posted firing always gets its resolution
    time.sleep(0.1)
    assert silences.active() == []  # "until resolved" ended with the incident


def test_timeline_button_replies_in_thread(posted, slack_server) -> None:
    n, server, inc_id, _ = posted
    for action in (ACTION_ACK, ACTION_TIMELINE):
        body = _payload(action, inc_id)
        assert _post(server.url, body, _signed(body))[0] == 200
        assert n.flush(5)
    root = slack_server.roots()[0]
    text = slack_server.thread(root.ts)[-1].text
    assert text.startswith("*Timeline*") and "Announced in #ml-infra" in text and "Acknowledged by alice" in text


def test_unknown_incident_is_answered_not_crashed(posted) -> None:
    n, server, _, _ = posted
    body = _payload(ACTION_ACK, "0000000000000000")
    status, answer = _post(server.url, body, _signed(body))
    assert status == 200 and "no longer tracks" in answer["text"]


def test_endpoint_from_env(tmp_path) -> None:
    assert InteractivityServer.from_env(object(), {}) is None  # type: ignore[arg-type]
    f = tmp_path / "secret"
    f.write_text(SECRET)
    srv = InteractivityServer.from_env(object(), {"SLACK_SIGNING_SECRET_FILE": str(f),  # type: ignore[arg-type]
                                                  "WHYWAIT_SLACK_ACTIONS_ADDR": "127.0.0.1:0"})
    assert srv is not None and srv.port == 0 and SECRET not in repr(vars(srv))


@pytest.mark.parametrize("addr", ["127.0.0.1:70000", "127.0.0.1:-1", "127.0.0.1:", "localhost", "host:abc"])
def test_a_bad_actions_addr_is_one_line(addr) -> None:
    with pytest.raises(ConfigError, match=r"^WHYWAIT_SLACK_ACTIONS_ADDR must look like 127\.0\.0\.1:3000"):
        InteractivityServer.from_env(object(), {"SLACK_SIGNING_SECRET": SECRET,  # type: ignore[arg-type]
                                                "WHYWAIT_SLACK_ACTIONS_ADDR": addr})


def test_an_ipv6_actions_addr_is_served() -> None:
    srv = InteractivityServer.from_env(object(), {"SLACK_SIGNING_SECRET": SECRET,  # type: ignore[arg-type]
                                                  "WHYWAIT_SLACK_ACTIONS_ADDR": "[::1]:0"})
    assert srv is not None and srv.host == "::1"
    try:
        srv.start()
    except ConfigError as exc:  # a host without IPv6 loopback: the one line, never a traceback
        assert "cannot listen" in str(exc)
        return
    try:
        assert srv.port > 0 and srv.url == f"http://[::1]:{srv.port}/slack/actions"
    finally:
        srv.stop()
