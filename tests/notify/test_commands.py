"""``whywait notify render`` and ``whywait silence add|list|expire`` (against an in-memory store)."""

from __future__ import annotations

import argparse
import json
import re

import pytest
from whywait.engine.commands import notify_cmd, silence_cmd
from whywait.engine.errors import ConfigError
from whywait.engine.notify.silences import InMemorySilenceStore, Silence, SilenceError, parse_matchers


def _run(module, argv: list[str]) -> int:
    p = argparse.ArgumentParser()
    module.register(p)
    return module.run(p.parse_args(argv))


def test_notify_render_prints_block_kit_and_preview(tmp_path, capsys, make_diagnosis) -> None:
    f = tmp_path / "d.json"
    f.write_text(json.dumps(make_diagnosis(job="<!channel>").to_dict()))
    assert _run(notify_cmd, ["render", str(f)]) == 0
    out = capsys.readouterr().out
    payload_text, preview = out.split("\n\n[FIRING", 1)
    payload = json.loads(payload_text)
    assert payload["channel"] == "#ml-infra" and payload["blocks"][0]["type"] == "section"
    assert "<!channel>" not in json.dumps(payload) and "&lt;!channel&gt;" in json.dumps(payload)
    assert preview.startswith(" · warning] Rank 12") and "Job: <!channel>" in preview


def test_notify_render_group_and_formats(tmp_path, capsys, make_diagnosis) -> None:
    f = tmp_path / "g.json"
    f.write_text(json.dumps([make_diagnosis(rank=i, node=f"node-{i}").to_dict() for i in range(3)]))
    assert _run(notify_cmd, ["render", str(f), "--format", "text"]) == 0
    out = capsys.readouterr().out
    assert out.startswith("[FIRING") and "ranks 0–2" in out
    assert _run(notify_cmd, ["render", str(f), "--format", "json"]) == 0
    assert "3 findings grouped" in json.loads(capsys.readouterr().out)["blocks"][1]["elements"][0]["text"]


def test_notify_render_takes_json_lines_one_message_a_line(tmp_path, capsys, make_diagnosis) -> None:
    """`replay --json` writes JSON lines; render refused them ('not JSON (Extra data)')."""
    f = tmp_path / "diagnoses.jsonl"
    group = [make_diagnosis(rank=i, node=f"node-{i}").to_dict() for i in range(3)]
    f.write_text(json.dumps(make_diagnosis(node="node-7").to_dict(), sort_keys=True) + "\n\n"
                 + json.dumps(group) + "\n")
    assert _run(notify_cmd, ["render", str(f), "--format", "text"]) == 0
    out = capsys.readouterr().out
    assert out.count("[FIRING") == 2 and "ranks 0–2" in out.split("[FIRING")[2]
    assert _run(notify_cmd, ["render", str(f), "--format", "json"]) == 0
    assert capsys.readouterr().out.count('"blocks"') == 2
    f.write_text(f.read_text() + "{oops\n")
    with pytest.raises(ConfigError, match=re.escape(f"{f}:4: not JSON (Expecting property name enclosed in double "
                                                    "quotes); expected one diagnosis a line")):
        _run(notify_cmd, ["render", str(f)])
    f.write_text(json.dumps(group[0]) + "\n" + json.dumps([1]) + "\n")
    with pytest.raises(ConfigError, match=re.escape(f"{f}:2[0]: a diagnosis must be a JSON object (got int)")):
        _run(notify_cmd, ["render", str(f)])


@pytest.mark.parametrize("content, message", [
    ("{", "not JSON"), ("[1]", "a diagnosis must be a JSON object (got int)"), ('{"x": 1}', "not a diagnosis"),
])
def test_notify_render_bad_input_is_one_line(tmp_path, content, message) -> None:
    f = tmp_path / "bad.json"
    f.write_text(content)
    with pytest.raises(ConfigError, match=re.escape(message)):
        _run(notify_cmd, ["render", str(f)])


@pytest.fixture
def store(monkeypatch) -> InMemorySilenceStore:
    s = InMemorySilenceStore()
    s.close = lambda: None  # type: ignore[method-assign]
    monkeypatch.setattr(silence_cmd, "open_store", lambda bootstrap: s)
    return s


def test_silence_add_list_expire(store, capsys) -> None:
    assert _run(silence_cmd, ["add", "-m", "job=llm-70b", "-m", "culprit=node-0*", "--for", "2h",
                              "--comment", "maintenance", "--by", "alice"]) == 0
    sid = capsys.readouterr().out.split()[0]
    (s,) = store.active()
    assert s.id == sid and s.matchers == {"job": "llm-70b", "culprit": "node-0*"} and s.created_by == "alice"
    assert abs((s.ends_at - s.starts_at) - 7200) < 1
    assert _run(silence_cmd, ["list"]) == 0
    listing = capsys.readouterr().out
    assert sid in listing and "job=llm-70b culprit=node-0*" in listing and "# maintenance" in listing
    assert _run(silence_cmd, ["expire", sid]) == 0
    assert store.active() == []
    assert _run(silence_cmd, ["list"]) == 0 and "no silences in force" in capsys.readouterr().out
    assert _run(silence_cmd, ["list", "--all"]) == 0 and "(expired)" in capsys.readouterr().out


def test_silence_list_columns_stay_in_line(store, capsys) -> None:
    # an expired silence's "(expired)" ran the BY column out of line with the header and the others
    for by in ("alice", "bob"):
        assert _run(silence_cmd, ["add", "-m", f"job={by}-run", "--for", "2h", "--by", by]) == 0
    sid = capsys.readouterr().out.split()[0]
    assert _run(silence_cmd, ["expire", sid]) == 0
    capsys.readouterr()
    assert _run(silence_cmd, ["list", "--all"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert len(lines) == 3 and any("(expired)" in line for line in lines)
    at = {line.index(next(w for w in ("BY", "alice", "bob") if f" {w} " in line)) for line in lines}
    assert len(at) == 1, lines  # the BY column starts at one place on every line


def test_silence_errors(store) -> None:
    with pytest.raises(SilenceError, match="NAME=PATTERN"):
        _run(silence_cmd, ["add", "-m", "job"])
    with pytest.raises(ConfigError, match="--for must be a duration"):
        _run(silence_cmd, ["add", "-m", "job=x", "--for", "later"])
    with pytest.raises(SilenceError, match="no silence with id 'nope'"):
        _run(silence_cmd, ["expire", "nope"])


def test_silence_matching() -> None:
    s = Silence.new(parse_matchers(["job=llm-*", "severity=warning"]), duration=60, created_by="x", now=0)
    assert s.matches({"job": "llm-70b", "severity": "warning"})
    assert not s.matches({"job": "llm-70b", "severity": "critical"})
    assert not s.matches({"severity": "warning"})
    assert s.active(30) and not s.active(60)
    with pytest.raises(SilenceError, match="must name its incident"):
        Silence.new({"job": "x"}, duration=None, created_by="x")
    assert Silence.from_dict(s.to_dict()) == s


@pytest.mark.parametrize("argv, message", [
    (["add", "-m", "job", "--for", "2h"], "a matcher must look like NAME=PATTERN, e.g. job=llm-70b (got 'job')"),
    (["expire", "nosuchid"], "no silence with id 'nosuchid'"),
    (["add", "-m", "jbo=x", "--for", "2h"], "-m jbo=x: unknown name 'jbo': no diagnosis carries it"),
    (["add", "-m", "job=x", "--for", "2"], "--for must be a duration like 30m, 4h or 2d (got '2'); a bare number "
                                           "has no unit: write 2h, 2m or 2s"),
])
def test_silence_input_errors_exit_2_in_one_line(store, capsys, argv: list[str], message: str) -> None:
    from whywait.engine.cli import main

    assert main(["silence", *argv]) == 2  # input, not "service unavailable" (3)
    err = capsys.readouterr().err
    assert err.startswith(f"whywait silence: {message}") and err.count("\n") == 1, err
    assert store.all() == []


def test_silence_names_are_checked_against_what_diagnoses_carry(store, capsys) -> None:
    with pytest.raises(SilenceError) as exc:
        _run(silence_cmd, ["add", "-m", "job=x", "-m", "nod=node-07", "--for", "2h"])
    assert "(valid: cause, channel, culprit, " in str(exc.value) and " node, " in str(exc.value)
    assert "--force if your own rules set it" in str(exc.value)
    # the labels the evaluator sets (node), and the shipped rules' own (cause, phase) are accepted
    assert _run(silence_cmd, ["add", "-m", "node=node-07", "-m", "cause=network.*", "-m", "phase=data",
                              "--for", "30m"]) == 0
    assert _run(silence_cmd, ["add", "-m", "site_label=x", "--for", "2s", "--force"]) == 0
    assert [sorted(s.matchers) for s in store.all()] == [["cause", "node", "phase"], ["site_label"]]
    assert abs(store.all()[1].ends_at - store.all()[1].starts_at - 2) < 1e-6


@pytest.mark.parametrize("change", [
    {"matchers": ["job", "llm"]}, {"matchers": {"job": 5}}, {"starts_at": "yesterday"}, {"ends_at": float("inf")},
    {"id": None}, {"created_by": 7}, {"expired_by": []}, {"starts_at": True},
])
def test_a_silence_of_the_wrong_shape_is_refused_when_read(change: dict) -> None:
    """The silences topic can be written by anyone: a wrong type failed later, inside notify() (matches(), active())."""
    good = Silence.new({"job": "llm"}, duration=60.0, created_by="me", now=1000.0).to_dict()
    with pytest.raises(SilenceError):
        Silence.from_dict({**good, **change})
    with pytest.raises(SilenceError, match="a silence must be an object"):
        Silence.from_dict(["not", "a", "silence"])  # type: ignore[arg-type]


def test_notify_send_says_a_refused_delivery_and_leaves_the_engines_outbox_alone(
        tmp_path, capsys, monkeypatch, make_diagnosis) -> None:
    # It printed "delivered" and exited 0 when the receiver refused (dropped) the delivery, and it took the
    # engine's default outbox: the engine's waiting items, unknown to it, were dropped as forgotten.
    from tests.notify.test_receivers import Hook

    state = tmp_path / "state"
    outbox = state / "whywait" / "notify-outbox"
    outbox.mkdir(parents=True)
    waiting = ('{"add":{"seq":1,"kind":"post","key":"r|#c|job=j","lane":"#c","created":1.0,"text":"",'
               '"blocks":null,"attempts":0,"meta":{},"receiver":"webhook"}}\n')
    (outbox / "outbox.jsonl").write_text(waiting)
    hook = Hook()
    try:
        for var in ("WHYWAIT_NOTIFY_OUTBOX", "SLACK_BOT_TOKEN", "SLACK_BOT_TOKEN_FILE"):
            monkeypatch.delenv(var, raising=False)
        monkeypatch.setenv("XDG_STATE_HOME", str(state))
        monkeypatch.setenv("WHYWAIT_RECEIVERS", "webhook")
        monkeypatch.setenv("WHYWAIT_WEBHOOK_URL", hook.url)
        monkeypatch.setenv("WHYWAIT_NOTIFY_GROUP_WAIT", "0s")
        f = tmp_path / "d.json"
        f.write_text(json.dumps(make_diagnosis().to_dict()))
        hook.fail = [400]
        assert _run(notify_cmd, ["send", str(f), "--timeout", "10"]) == 1
        assert capsys.readouterr().err.strip().splitlines()[-1] == \
            "1 delivery(ies) refused, dropped (the errors above say why)"
        assert _run(notify_cmd, ["send", str(f), "--timeout", "10"]) == 0
        assert capsys.readouterr().err.strip().splitlines()[-1] == "delivered"
        assert len(hook.requests) == 1
    finally:
        hook.server.shutdown()
        hook.server.server_close()
    assert (outbox / "outbox.jsonl").read_text() == waiting
