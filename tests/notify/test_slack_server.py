"""The local Slack Web API server itself: the protocol details the notifier tests rely on."""

from __future__ import annotations

import json
import urllib.error
import urllib.request

import pytest
from slack_sdk import WebClient
from slack_sdk.errors import SlackApiError

from tests.notify.conftest import TOKEN


def _raw(url: str, body: bytes, headers: dict[str, str]) -> tuple[int, dict]:
    req = urllib.request.Request(url, data=body, headers=headers, method="POST")
    try:
        with urllib.request.urlopen(req, timeout=5) as r:
            return r.status, json.loads(r.read())
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read())


def test_auth(slack_server) -> None:
    assert WebClient(token=TOKEN, base_url=slack_server.url).auth_test()["user_id"] == "U0000001"
    with pytest.raises(SlackApiError) as err:
        WebClient(token="xoxb-nope", base_url=slack_server.url).auth_test()
    assert err.value.response["error"] == "invalid_auth"
    assert _raw(slack_server.url + "auth.test", b"", {}) == (200, {"ok": False, "error": "not_authed"})
    # the token may also come as a form field, as older clients send it
    status, body = _raw(slack_server.url + "auth.test", f"token={TOKEN}".encode(),
                        {"Content-Type": "application/x-www-form-urlencoded"})
    assert body["ok"] is True


def test_post_thread_update_and_errors(slack_server) -> None:
    c = WebClient(token=TOKEN, base_url=slack_server.url)
    root = c.chat_postMessage(channel="#ml-infra", text="root")
    assert root["channel"] == slack_server.channel_id("#ml-infra") and root["ts"]
    reply = c.chat_postMessage(channel=root["channel"], thread_ts=root["ts"], text="reply")
    c.chat_postMessage(channel="ml-infra", thread_ts=reply["ts"], text="reply to reply")  # lands in the thread
    c.chat_update(channel=root["channel"], ts=root["ts"], text="edited",
                  blocks=[{"type": "section", "text": {"type": "mrkdwn", "text": "b"}}])
    assert [m.text for m in slack_server.thread(root["ts"])] == ["reply", "reply to reply"]
    (msg,) = slack_server.roots()
    assert msg.text == "edited" and msg.edits == [{"text": "root", "blocks": None}] and "b" in msg.all_text
    replies = c.conversations_replies(channel=root["channel"], ts=root["ts"])["messages"]
    assert [m["text"] for m in replies] == ["edited", "reply", "reply to reply"]
    for call, error in [
        (lambda: c.chat_postMessage(channel="#nope", text="x"), "channel_not_found"),
        (lambda: c.chat_postMessage(channel="#ml-infra", text="x", thread_ts="1.2"), "thread_not_found"),
        (lambda: c.chat_update(channel="#ml-infra", ts="1.2", text="x"), "message_not_found"),
        (lambda: c.api_call("chat.postMessage", json={"channel": "#ml-infra"}), "no_text"),
        (lambda: c.api_call("chat.delete"), "unknown_method"),
    ]:
        with pytest.raises(SlackApiError) as err:
            call()
        assert err.value.response["error"] == error
    names = [ch["name"] for ch in c.conversations_list()["channels"]]
    assert names == ["ml-infra", "vision", "whywait", "incidents"]


def test_rate_limit_429_and_outages(slack_server) -> None:
    c = WebClient(token=TOKEN, base_url=slack_server.url, retry_handlers=[])
    slack_server.rate_limit(1.0, channel="#ml-infra")
    c.chat_postMessage(channel="#ml-infra", text="1")
    c.chat_postMessage(channel="#vision", text="other channels are not limited")
    with pytest.raises(SlackApiError) as err:
        c.chat_postMessage(channel="#ml-infra", text="2")
    assert err.value.response.status_code == 429 and err.value.response.headers["Retry-After"] == "1"
    slack_server.rate_limit(None, channel="#ml-infra")
    slack_server.force_429(1, retry_after=3)
    with pytest.raises(SlackApiError) as err:
        c.auth_test()
    assert err.value.response.headers["Retry-After"] == "3"
    with slack_server.down("503"):
        with pytest.raises(SlackApiError) as err:
            c.auth_test()
        assert err.value.response.status_code == 503
    port = slack_server.port
    with slack_server.down("refuse"):
        with pytest.raises(urllib.error.URLError):
            c.auth_test()
    assert slack_server.port == port and c.auth_test()["ok"]
    assert [x.status for x in slack_server.calls_to("auth.test", ok=None)] == [429, 503, 200]
