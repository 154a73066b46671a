"""The button endpoint refuses replays and bad Content-Length values (the endpoint is on the network)."""

from __future__ import annotations

import json
import socket
import time
from typing import Any
from urllib.parse import urlencode

import pytest
from whywait.engine.notify.interactivity import InteractivityServer, ReplayGuard, parse_content_length, sign
from whywait.engine.notify.render import ACTION_TIMELINE

from tests.notify.test_interactivity import SECRET, _post, _signed


def _payload(action_id: str, value: str, action_ts: str) -> bytes:
    payload = {"type": "block_actions", "user": {"id": "U1", "username": "alice"},
               "actions": [{"action_id": action_id, "value": value, "type": "button", "action_ts": action_ts}]}
    return urlencode({"payload": json.dumps(payload)}).encode()


@pytest.fixture
def posted(slack_server: Any, make_notifier: Any, make_diagnosis: Any) -> Any:
    n = make_notifier()
    n.notify(make_diagnosis())
    assert n.flush(5)
    (inc,) = n.book.incidents.values()
    with InteractivityServer(n, SECRET) as server:
        yield n, server, inc.id


def test_the_same_signed_request_runs_once(posted: Any, slack_server: Any) -> None:
    n, server, inc_id = posted
    body = _payload(ACTION_TIMELINE, inc_id, "1750000000.000100")
    headers = _signed(body)
    answers = [_post(server.url, body, headers) for _ in range(5)]
    assert [s for s, _ in answers] == [200, 401, 401, 401, 401]
    assert all(a["error"] == "replayed request" for _, a in answers[1:])
    assert n.flush(5)
    root = slack_server.roots()[0]
    assert len(slack_server.thread(root.ts)) == 1  # one timeline reply, not five


def test_the_same_action_re_signed_later_is_refused(posted: Any) -> None:
    _, server, inc_id = posted
    body = _payload(ACTION_TIMELINE, inc_id, "1750000000.000200")
    assert _post(server.url, body, _signed(body))[0] == 200
    later = _signed(body, ts=time.time() + 2)  # a fresh signature over the same press
    assert _post(server.url, body, later) == (401, {"ok": False, "error": "replayed request"})


def test_replay_guard_forgets_after_the_window() -> None:
    g = ReplayGuard(window_s=300)
    assert g.check_and_remember(["a"], 1000.0) is None
    assert g.check_and_remember(["a"], 1200.0) == "a"
    assert g.check_and_remember(["a"], 1301.0) is None


def _raw_post(url: str, content_length: str, body: bytes = b"") -> int:
    host, port = url.split("//")[1].split("/")[0].split(":")
    with socket.create_connection((host, int(port)), timeout=5) as s:
        s.sendall(b"POST /slack/actions HTTP/1.1\r\nHost: x\r\nContent-Length: " + content_length.encode()
                  + b"\r\n\r\n" + body)
        return int(s.recv(4096).split(b" ", 2)[1])


@pytest.mark.parametrize("value", ["abc", "-1", "1e3", "", "99999999999999999999999"])
def test_bad_content_length_is_a_400_or_413(posted: Any, value: str) -> None:
    _, server, _ = posted
    assert _raw_post(server.url, value) in ((413,) if value.isdigit() else (400,))


def test_content_length_parsing() -> None:
    assert parse_content_length("12") == 12 and parse_content_length(" 0 ") == 0
    assert parse_content_length("-1") is None and parse_content_length("abc") is None
    assert parse_content_length(None) is None


def test_signature_comes_from_slack_sdk() -> None:
    from slack_sdk.signature import SignatureVerifier

    assert sign(SECRET, "1", b"x") == SignatureVerifier(SECRET).generate_signature(timestamp="1", body=b"x")
