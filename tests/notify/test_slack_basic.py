"""The first path: a firing diagnosis posts one root message; its resolution edits it."""

from __future__ import annotations

import dataclasses
import io

import pytest
from whywait.engine.errors import NotifyError
from whywait.engine.notify import ConsoleNotifier, make_notifier
from whywait.engine.notify.pipeline import PipelineConfig

from tests.notify.conftest import T0, TOKEN


def test_make_notifier_without_token_is_console() -> None:
    n = make_notifier({})
    try:
        assert list(n.receivers) == ["console"]
    finally:
        n.close()


def test_console_prints_plain_text(make_diagnosis) -> None:
    out = io.StringIO()
    with ConsoleNotifier(out) as n:
        n.notify(make_diagnosis())
        assert n.flush(5)
    text = out.getvalue()
    assert "[FIRING · warning] Rank 12 of llm-70b is the straggler" in text
    assert "node-07" in text and "Next step:" in text


def test_console_groups_like_the_other_receivers(make_diagnosis) -> None:
    """Eight stragglers of one job are one printed incident, not eight; their resolution is one more."""
    out = io.StringIO()
    with ConsoleNotifier(out, config=PipelineConfig(group_wait=0.3)) as n:
        ds = [make_diagnosis(rank=i, node=f"node-{i:02d}") for i in range(8)]
        for d in ds:
            n.notify(d)
        assert n.flush(5)
        assert out.getvalue().count("[FIRING") == 1 and "(8 findings grouped)" in out.getvalue()
        for d in ds:
            n.notify(dataclasses.replace(d, status="resolved", ends_at=T0 + 60))
        assert n.flush(5)
    text = out.getvalue()
    assert text.count("[FIRING") == 1 and text.count("[RESOLVED") == 1, text
    assert "↳ resolved at 2025-06-15 15:07:40 UTC after 1m" in text
    assert n.stats()["receivers"]["console"]["posted"] == 1


def test_firing_then_resolved_is_one_root_message_edited(slack_server, make_diagnosis, tmp_path) -> None:
    env = {"SLACK_BOT_TOKEN": TOKEN, "WHYWAIT_SLACK_API_URL": slack_server.url,
           "WHYWAIT_NOTIFY_OUTBOX": str(tmp_path / "outbox")}
    n = make_notifier(env)
    assert list(n.receivers) == ["slack"]
    d = make_diagnosis()
    n.notify(d)
    assert n.flush(10)
    roots = slack_server.roots("#ml-infra")
    assert len(roots) == 1 and "Rank 12 of llm-70b is the straggler" in roots[0].all_text
    n.notify(dataclasses.replace(d, status="resolved", ends_at=T0 + 600))
    n.close()
    roots = slack_server.roots()
    assert len(roots) == 1
    assert "RESOLVED" in roots[0].text and roots[0].edits
    assert any("after 10m" in m.text for m in slack_server.thread(roots[0].ts))


def test_wrong_token_is_one_clear_error(slack_server, tmp_path) -> None:
    env = {"SLACK_BOT_TOKEN": "xoxb-wrong", "WHYWAIT_SLACK_API_URL": slack_server.url,
           "WHYWAIT_NOTIFY_OUTBOX": str(tmp_path / "outbox")}
    with pytest.raises(NotifyError) as err:
        make_notifier(env)
    assert str(err.value) == "Slack rejected the token (invalid_auth)"
    assert err.value.retryable is False
    assert err.value.exit_code == 2  # the configuration must change: bad input, not an outage (3)
    assert "xoxb-wrong" not in str(err.value)
