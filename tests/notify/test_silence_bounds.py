"""A silence's length is bounded when it is set, and one already stored beyond any bound breaks nothing.

``silence add --for 99999999999999999999d`` wrote the silence to Kafka, then crashed (exit 70) formatting its end,
so its id was never printed; every later ``silence list`` crashed the same way for everyone, and the notifier
kept an incident it muted quiet until that end even after the silence was expired.
"""

from __future__ import annotations

import io
import logging
import re
import uuid
from typing import Any, Callable, Iterator

import pytest
from whywait.engine.commands import silence_cmd
from whywait.engine.notify.format import fmt_time
from whywait.engine.notify.pipeline import Pipeline, PipelineConfig
from whywait.engine.notify.receivers.console import ConsoleReceiver
from whywait.engine.notify.silences import MAX_SILENCE_S, InMemorySilenceStore, Silence, SilenceError

NOW = 1_750_000_000.0
HUGE = 8.64e24  # what --for 99999999999999999999d stored: beyond any time_t
FAR = 60_480_000_000_000.0 + NOW  # --for 100000000w: year 1918561, which gmtime reads but no one means


@pytest.fixture
def store(monkeypatch: pytest.MonkeyPatch) -> InMemorySilenceStore:
    s = InMemorySilenceStore()
    s.close = lambda: None  # type: ignore[method-assign]
    monkeypatch.setattr(silence_cmd, "open_store", lambda bootstrap: s)
    return s


def _main(*argv: str) -> int:
    from whywait.engine.cli import main

    return main(["silence", *argv])


@pytest.mark.parametrize("given", ["99999999999999999999d", "100000000w", "366d", "53w", "8761h",
                                   "1" + "0" * 400 + "s"])
def test_a_silence_longer_than_a_year_is_refused_before_anything_is_stored(store, capsys, given: str) -> None:
    assert _main("add", "-m", "job=train-llm", "--for", given) == 2  # input: nothing is written
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and f"--for must be at most 365d (a year; got {given!r})" in err, err
    assert "internal error" not in err
    assert store.all() == []


@pytest.mark.parametrize("argv, message", [
    (["--for", "-2h"], "--for must be a positive duration like 30m, 4h or 2d (got '-2h')"),
    (["--for=-2h"], "--for must be a positive duration like 30m, 4h or 2d (got '-2h')"),
    (["--for", "-5"], "--for must be a positive duration like 30m, 4h or 2d (got '-5')"),
    (["--for", "0s"], "--for must be longer than 0s (got '0s')"),
    (["--for", "0h0m"], "--for must be longer than 0s (got '0h0m')"),
])
def test_a_negative_or_zero_duration_gets_one_clear_line(store, capsys, argv: list[str], message: str) -> None:
    # `--for -2h` was taken for an option: argparse's "expected one argument", which says nothing of the sign.
    assert _main("add", "-m", "job=train-llm", *argv) == 2
    err = capsys.readouterr().err
    assert err == f"whywait silence: {message}\n", err
    assert store.all() == []


def test_a_year_is_the_longest_silence_and_help_says_so(store, capsys) -> None:
    assert MAX_SILENCE_S == 365 * 86400
    assert _main("add", "-m", "job=train-llm", "--for", "365d") == 0
    (s,) = store.all()
    assert s.ends_at is not None and s.ends_at - s.starts_at == MAX_SILENCE_S
    assert capsys.readouterr().out.startswith(s.id + "  until ")
    with pytest.raises(SystemExit):
        _main("add", "--help")
    assert "at most 365d" in re.sub(r"\s+", " ", capsys.readouterr().out)
    with pytest.raises(SilenceError, match="at most 365d"):  # the library's own door, not only the CLI's
        Silence.new({"job": "x"}, duration=MAX_SILENCE_S + 1, created_by="me")
    with pytest.raises(SilenceError, match="longer than 0s"):
        Silence.new({"job": "x"}, duration=0, created_by="me")


def _stored(ends_at: float, job: str = "train-llm") -> Silence:
    """A silence as an older whywait wrote it, with no bound on its end."""
    return Silence(id=uuid.uuid4().hex[:12], matchers={"job": job}, starts_at=NOW, ends_at=ends_at,
                   created_by="newcomer")


def test_times_beyond_what_the_platform_formats_are_still_said() -> None:
    assert fmt_time(NOW) == "2025-06-15 15:06:40 UTC"
    assert fmt_time(HUGE) == "after 9999-12-31 (8.64e+24)"
    assert fmt_time(FAR) == "after 9999-12-31 (6.05e+13)"
    assert fmt_time(-1e20).startswith("before 0001-01-01")


@pytest.fixture
def kafka_store(kafka_bootstrap: str, monkeypatch: pytest.MonkeyPatch) -> Iterator[Callable[[], Any]]:
    """``whywait silence`` against the real broker, on a topic of its own."""
    from whywait.engine.notify.silences import KafkaSilenceStore

    topic = f"whywait.silences.test-{uuid.uuid4().hex[:8]}"
    monkeypatch.setattr(silence_cmd, "open_store",
                        lambda bootstrap: KafkaSilenceStore(kafka_bootstrap, topic=topic, follow=False))
    yield lambda: KafkaSilenceStore(kafka_bootstrap, topic=topic, follow=False)


def test_list_and_expire_take_silences_already_stored_without_bound(kafka_store, capsys) -> None:
    writer = kafka_store()
    huge, far = _stored(HUGE), _stored(FAR, job="other")
    try:
        writer.add(huge)
        writer.add(far)
    finally:
        writer.close()
    assert _main("list") == 0, capsys.readouterr().err  # exited 70 for everyone
    out = capsys.readouterr().out
    assert re.search(rf"^{huge.id} +after 9999-12-31 \(8\.64e\+24\) ", out, re.M), out
    assert re.search(rf"^{far.id} +after 9999-12-31 \(6\.05e\+13\) ", out, re.M), out
    assert _main("expire", huge.id) == 0
    assert capsys.readouterr().out.startswith(f"{huge.id}  ended ")
    assert _main("list") == 0
    out = capsys.readouterr().out
    assert huge.id not in out and far.id in out
    assert _main("list", "--all") == 0
    assert re.search(rf"^{huge.id} .*\(expired\)", capsys.readouterr().out, re.M)


def test_an_unbounded_silence_mutes_and_once_expired_lets_the_incident_through(make_diagnosis, caplog) -> None:
    # The notifier scheduled the muted incident's next look at the silence's end: expired early, an 8.64e24
    # silence kept it quiet for ever (and any silence, until its original end).
    silences = InMemorySilenceStore()
    s = _stored(HUGE, job="llm-70b")
    silences.add(s)
    console = ConsoleReceiver(stream=io.StringIO())
    cfg = PipelineConfig(group_wait=0.05, group_interval=0.2, retry_backoff=(0.05, 0.2))
    caplog.set_level(logging.INFO, logger="whywait.engine.notify")
    with Pipeline([console], cfg, silence_store=silences) as p:
        p.notify(make_diagnosis())
        assert p.flush(5)
        assert console.sent == []
        assert any(f"silenced by {s.id} until after 9999-12-31" in r.getMessage() for r in caplog.records)
        silences.expire(s.id, by="me")
        _wait(lambda: len(console.sent) == 1, 3)  # by itself, within group_interval: no flush() forcing it


def _wait(cond: Callable[[], bool], timeout: float) -> None:
    import time

    deadline = time.monotonic() + timeout
    while not cond():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.02)
