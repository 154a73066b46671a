"""whywait.durations: the one duration syntax, used by rules, rule tests, notify settings and the CLI."""

from __future__ import annotations

import pytest

from whywait.durations import format_duration, parse_duration
from whywait.errors import DurationError, WhywaitError


@pytest.mark.parametrize("text, seconds", [
    ("250ms", 0.25), ("90s", 90.0), ("5m", 300.0), ("4h", 14400.0), ("1d", 86400.0), ("2w", 1209600.0),
    ("1h30m", 5400.0), ("1.5s", 1.5), (" 60s ", 60.0), ("0s", 0.0),
])
def test_units_and_sums(text: str, seconds: float) -> None:
    assert parse_duration(text) == seconds


@pytest.mark.parametrize("value", [60, "60", "-5s", "5 s", "5sec", "1y", "", "s", True, None, [1], float("nan")])
def test_rule_files_refuse_anything_else(value: object) -> None:
    with pytest.raises(DurationError) as exc:
        parse_duration(value, "window")
    assert str(exc.value) == f"window: must be a duration like '60s' (units ms, s, m, h, d, w) (got {value!r})"
    assert isinstance(exc.value, WhywaitError) and isinstance(exc.value, ValueError)


def test_bare_seconds_where_asked_for() -> None:
    assert parse_duration(12, bare_seconds=True) == 12.0 and parse_duration("12", bare_seconds=True) == 12.0
    for bad in (-1, float("inf"), float("nan"), "-3"):
        with pytest.raises(DurationError, match="or a number of seconds"):
            parse_duration(bad, bare_seconds=True)


@pytest.mark.parametrize("seconds", [0.25, 0, 5, 90, 3600, 5400, 86400 + 3661, 1209600])
def test_format_reads_back(seconds: float) -> None:
    assert parse_duration(format_duration(seconds)) == seconds


def test_every_place_reads_the_same_syntax() -> None:
    # notify's settings and replay's --lead accept what rule files accept ('1d' was refused by rules once).
    from whywait.engine.commands.replay_cmd import parse_duration as replay_duration
    from whywait.engine.notify.config import parse_duration as notify_duration
    from whywait.engine.rules.schema import _duration as rule_duration

    for text in ("1d", "1h30m", "250ms", "2w"):
        assert notify_duration(text, "X") == replay_duration(text, "--lead") == rule_duration(text)
