"""The pipeline and its receivers: several at once, each failing on its own, the webhook's payload
and signature, the registry, and a pipeline that knows no sink."""

from __future__ import annotations

import dataclasses
import hashlib
import hmac
import io
import json
import subprocess
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any, Iterator

import pytest
from whywait.engine.errors import ConfigError
from whywait.engine.notify import make_notifier
from whywait.engine.notify.pipeline import Pipeline, PipelineConfig
from whywait.engine.notify.receivers.console import ConsoleReceiver
from whywait.engine.notify.receivers.slack import SlackReceiver
from whywait.engine.notify.receivers.webhook import WebhookReceiver
from whywait.engine.notify.state import InMemoryStateStore

from tests.notify.conftest import T0, TOKEN

FAST = PipelineConfig(group_wait=0.1, group_interval=0.2, retry_backoff=(0.05, 0.2))


class Hook:
    """A loopback HTTP endpoint recording each POST (headers, body); ``fail`` answers that status instead."""

    def __init__(self) -> None:
        self.requests: list[tuple[dict[str, str], bytes]] = []
        self.attempts: list[dict[str, str]] = []  # the headers of every POST, refused ones too
        self.fail: list[int] = []  # statuses to answer, one per request, before answering 200
        hook = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, format: str, *args: Any) -> None:  # noqa: A002
                pass

            def do_POST(self) -> None:  # noqa: N802
                body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
                status = hook.fail.pop(0) if hook.fail else 200
                hook.attempts.append({k.lower(): v for k, v in self.headers.items()})
                if status == 200:
                    hook.requests.append(({k.lower(): v for k, v in self.headers.items()}, body))
                self.send_response(status)
                self.send_header("Content-Length", "2")
                self.end_headers()
                self.wfile.write(b"{}")

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/whywait"
        threading.Thread(target=self.server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True).start()

    def bodies(self) -> list[dict[str, Any]]:
        return [json.loads(b) for _, b in self.requests]


@pytest.fixture
def hook() -> Iterator[Hook]:
    h = Hook()
    yield h
    h.server.shutdown()
    h.server.server_close()


def test_webhook_payload_and_signature(hook: Hook, make_diagnosis: Any) -> None:
    secret = "s3cret-for-hmac"
    with Pipeline([WebhookReceiver(hook.url, secret=secret)], FAST) as p:
        d = make_diagnosis()
        p.notify(d)
        assert p.flush(5)
        p.notify(dataclasses.replace(d, status="resolved", ends_at=T0 + 90))
        assert p.flush(5)
    kinds = [b["kind"] for b in hook.bodies()]
    assert kinds == ["post", "update", "reply"]
    first, _, reply = hook.bodies()
    assert first["version"] == "1" and first["incident"]["status"] == "firing"
    assert first["incident"]["rule_id"] == "network.straggler-retransmits" and first["incident"]["culprit"] == "node-07"
    assert first["incident"]["owner"] == {"project": "llm-pretrain", "team": "ml-infra", "channel": "#ml-infra"}
    assert first["findings"][0]["fingerprint"] == d.fingerprint
    assert reply["lines"] == [{"kind": "resolved", "text": "resolved at 2025-06-15 15:08:10 UTC after 1m 30s"}]
    for headers, body in hook.requests:  # the receiving side's check, as docs/notify.md describes it
        ts = headers["x-whywait-timestamp"]
        expected = "sha256=" + hmac.new(secret.encode(), ts.encode() + b"." + body, hashlib.sha256).hexdigest()
        assert hmac.compare_digest(headers["x-whywait-signature"], expected)


def test_webhook_5xx_is_retried_and_4xx_is_dropped(hook: Hook, make_diagnosis: Any) -> None:
    with Pipeline([WebhookReceiver(hook.url)], FAST) as p:
        hook.fail = [503, 503]
        p.notify(make_diagnosis())
        assert p.flush(5)
        s = p.stats()["receivers"]["webhook"]
        assert s["retried"] == 2 and s["posted"] == 1 and s["failed"] == 0
        hook.fail = [400]
        p.notify(make_diagnosis(job="other", labels={"job": "other"}))
        assert p.flush(5)
        assert p.stats()["receivers"]["webhook"]["failed"] == 1
    assert len(hook.requests) == 1


def test_webhook_retries_repeat_the_delivery_id(hook: Hook, make_diagnosis: Any) -> None:
    # docs/notify.md: X-Whywait-Delivery identifies a delivery, "a retry repeats it"; it used the attempt's
    # time, so each retry had a new id and a receiver could not tell a retry from a new announcement.
    with Pipeline([WebhookReceiver(hook.url, secret="s")], FAST) as p:
        hook.fail = [503, 503]
        p.notify(make_diagnosis())
        assert p.flush(5)
    ids = [h["x-whywait-delivery"] for h in hook.attempts]
    assert len(ids) == 3 and len(set(ids)) == 1 and ids[0].endswith(":post:" + ids[0].rsplit(":", 1)[1])
    assert int(hook.attempts[-1]["x-whywait-timestamp"]) >= int(hook.attempts[0]["x-whywait-timestamp"])


def test_rate_limit_429_is_counted(hook: Hook, make_diagnosis: Any) -> None:
    with Pipeline([WebhookReceiver(hook.url)], FAST) as p:
        hook.fail = [429]
        p.notify(make_diagnosis())
        assert p.flush(5)
        s = p.stats()
    assert s["receivers"]["webhook"]["rate_limited"] == 1 and s["rate_limited"] == 1 and s["posted"] == 1


def test_a_receiver_that_is_down_holds_back_only_its_own_deliveries(make_diagnosis: Any, tmp_path: Path) -> None:
    out = io.StringIO()
    down = WebhookReceiver("http://127.0.0.1:9/unreachable", timeout=1.0)
    cfg = dataclasses.replace(FAST, outbox_dir=tmp_path / "outbox")
    state = InMemoryStateStore()  # shared: the second pipeline is the first one restarted
    p = Pipeline([ConsoleReceiver(out), down], cfg, state_store=state)
    p.notify(make_diagnosis())
    assert not p.flush(2)  # the webhook never takes it...
    assert "[FIRING · warning]" in out.getvalue()  # ...and the console had it all the same
    s = p.stats()["receivers"]
    assert s["console"]["posted"] == 1 and s["console"]["waiting"] == 0
    assert s["webhook"]["retried"] >= 1 and s["webhook"]["waiting"] == 1
    p.close(timeout=0.5)
    # the webhook's item waits on disk for the next start; the console's is gone (delivered)
    again = Pipeline([ConsoleReceiver(io.StringIO()), WebhookReceiver("http://127.0.0.1:9/x", timeout=1.0)], cfg,
                     state_store=state)
    try:
        assert [(i.receiver, i.kind) for i in again.outbox.items()] == [("webhook", "post")]
        (inc,) = again.book.incidents.values()
        assert set(inc.receipts) == {"console"}  # the console had it; the webhook still owes it
    finally:
        again.close(timeout=0.2)


def test_several_receivers_from_the_environment(slack_server: Any, hook: Hook, make_diagnosis: Any,
                                                tmp_path: Path) -> None:
    env = {"WHYWAIT_RECEIVERS": "slack, webhook", "SLACK_BOT_TOKEN": TOKEN, "WHYWAIT_SLACK_API_URL": slack_server.url,
           "WHYWAIT_WEBHOOK_URL": hook.url, "WHYWAIT_NOTIFY_OUTBOX": str(tmp_path / "o"),
           "WHYWAIT_NOTIFY_GROUP_WAIT": "100ms"}
    with make_notifier(env) as n:
        assert list(n.receivers) == ["slack", "webhook"]
        n.notify(make_diagnosis())
        assert n.flush(5)
        (inc,) = n.book.incidents.values()
        assert inc.receipts["slack"]["ts"] == slack_server.roots()[0].ts
    assert [b["kind"] for b in hook.bodies()] == ["post"]


@pytest.mark.parametrize("env, message", [
    ({"WHYWAIT_RECEIVERS": "alertmanager"}, "the alertmanager receiver needs WHYWAIT_ALERTMANAGER_URL"),
    ({"WHYWAIT_RECEIVERS": "alertmanager", "WHYWAIT_ALERTMANAGER_URL": "am:9093"},
     "WHYWAIT_ALERTMANAGER_URL must be an http(s) URL like 'http://alertmanager:9093' (got 'am:9093')"),
    ({"WHYWAIT_RECEIVERS": "alertmanager", "WHYWAIT_ALERTMANAGER_URL": "http://am:9093",
      "WHYWAIT_ALERTMANAGER_REFRESH": "often"}, "WHYWAIT_ALERTMANAGER_REFRESH must be a duration like '30s'"),
    ({"WHYWAIT_RECEIVERS": "webhook"}, "the webhook receiver needs WHYWAIT_WEBHOOK_URL"),
    ({"WHYWAIT_RECEIVERS": "slack"}, "the slack receiver needs SLACK_BOT_TOKEN (or SLACK_BOT_TOKEN_FILE)"),
    ({"WHYWAIT_RECEIVERS": "console,console"}, "WHYWAIT_RECEIVERS names a receiver twice"),
])
def test_receiver_settings_errors_name_the_variable(env: dict[str, str], message: str) -> None:
    with pytest.raises(ConfigError) as err:
        make_notifier(env)
    assert message in str(err.value)


def test_pipeline_knows_no_sink() -> None:
    """The pipeline imports no Slack client and no renderer, and its source has no Slack markup."""
    code = ("import sys; import whywait.engine.notify.pipeline; "
            "print(sorted(m for m in sys.modules if m.startswith(('slack_sdk', 'whywait.engine.notify.re', "
            "'aiohttp'))))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"
    import whywait.engine.notify.pipeline as pkg

    for f in Path(pkg.__file__).parent.glob("*.py"):
        text = f.read_text()
        for word in ("slack_sdk", "mrkdwn", "escape_mrkdwn", "render_blocks", "chat_postMessage", ":arrow_"):
            assert word not in text, f"{f.name} mentions {word}"


def test_state_records_written_before_receivers_keep_their_slack_message() -> None:
    """A record from the Slack-only notifier (top-level ts/channel_id) reads as the Slack receipt,
    and new records still carry them at the top level, where ``whywait report`` looks."""
    from whywait.engine.notify.pipeline.incidents import Incident

    old = {"key": "k", "rule_id": "r", "lane": "#a", "channel": "#a", "posted": True, "ts": "1.5",
           "channel_id": "C1", "members": {}}
    inc = Incident.from_dict(old)
    assert inc.receipts == {"slack": {"channel": "#a", "channel_id": "C1", "ts": "1.5"}}
    rec = inc.to_dict()
    assert rec["ts"] == "1.5" and rec["channel_id"] == "C1"
    assert Incident.from_dict(json.loads(json.dumps(rec))).receipts == inc.receipts


def test_console_stats_are_a_plain_dict(make_diagnosis: Any) -> None:
    out = io.StringIO()
    with Pipeline([ConsoleReceiver(out)], FAST) as p:
        p.notify(make_diagnosis())
        assert p.flush(5)
        s = p.stats()
    json.dumps(s)  # plain: exportable as it is
    assert s["sent"] == s["posted"] == 1 and s["receivers"]["console"]["sent"] == 1
    assert set(s["receivers"]["console"]) >= {"sent", "retried", "failed", "rate_limited", "given_up", "waiting"}


def test_refresh_resends_a_firing_incident(hook: Hook, make_diagnosis: Any) -> None:
    class Refreshing(WebhookReceiver):
        refresh_interval = 0.3

    with Pipeline([Refreshing(hook.url)], FAST) as p:
        p.notify(make_diagnosis())
        assert p.flush(5)
        t0 = time.monotonic()
        while time.monotonic() - t0 < 10 and [b["kind"] for b in hook.bodies()].count("update") < 3:
            time.sleep(0.05)
        took = time.monotonic() - t0
        kinds = [b["kind"] for b in hook.bodies()]
    assert kinds[0] == "post" and kinds.count("update") >= 3
    assert took < 3.0  # three refreshes 0.3 s apart, not one per scheduler second


def test_each_variable_reaches_its_part(slack_server: Any, tmp_path: Path) -> None:
    """The variables of the one-object SlackConfig keep working after the split: the pipeline's go to
    the pipeline, the Slack receiver's to the receiver."""
    env = {"SLACK_BOT_TOKEN": TOKEN, "WHYWAIT_SLACK_API_URL": slack_server.url,
           "WHYWAIT_NOTIFY_OUTBOX": str(tmp_path / "o"), "WHYWAIT_NOTIFY_GROUP_BY": "job,switch",
           "WHYWAIT_NOTIFY_GROUP_WAIT": "250ms", "WHYWAIT_NOTIFY_GROUP_INTERVAL": "2m",
           "WHYWAIT_NOTIFY_REPEAT_INTERVAL": "1d", "WHYWAIT_NOTIFY_OUTBOX_MAX_AGE": "2h",
           "WHYWAIT_SLACK_CHANNEL": "#alerts", "WHYWAIT_SLACK_SEVERITY_CHANNELS": "info=#quiet",
           "WHYWAIT_SLACK_MENTIONS": "warning=@channel", "WHYWAIT_SLACK_RATE": "2",
           "WHYWAIT_DASHBOARD_URL": "https://g/d?job={job}"}
    with make_notifier(env) as n:
        c = n.config
        assert (c.group_by, c.group_wait, c.group_interval, c.repeat_interval, c.outbox_max_age) == \
            (("job", "switch"), 0.25, 120.0, 86400.0, 7200.0)
        assert (c.default_channel, c.severity_channels) == ("#alerts", {"info": "#quiet"})
        assert str(n.outbox.directory) == str(tmp_path / "o")
        slack = n.receivers["slack"]
        assert isinstance(slack, SlackReceiver)
        assert slack.settings.mentions == {"warning": "<!channel>"} and slack.rate == 2.0
        assert slack.settings.default_channel == "#alerts"
        assert slack.settings.dashboard_url_template == "https://g/d?job={job}"


def test_items_for_a_receiver_no_longer_configured_are_dropped_and_said(tmp_path: Path, caplog: Any) -> None:
    """An outbox left by a run with a webhook, restarted without it: its items would wait forever."""
    from whywait.engine.notify.pipeline.outbox import Outbox

    box = Outbox(tmp_path / "o")
    box.append("post", "k", "#a", 1.0, receiver="webhook")
    box.append("post", "k", "#a", 1.0, receiver="console")
    box.close()
    with Pipeline([ConsoleReceiver(io.StringIO())], dataclasses.replace(FAST, outbox_dir=tmp_path / "o")) as p:
        assert [i.receiver for i in p.outbox.items()] in (["console"], [])  # (the console's is for a forgotten key)
        assert p.flush(2)
    assert any("dropped 1 delivery(ies) for receiver 'webhook', which is no longer configured" in r.getMessage()
               for r in caplog.records)
