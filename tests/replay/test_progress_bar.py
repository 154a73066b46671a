"""The progress bar of `whywait replay` and `whywait export`: on a terminal only, over event time."""

from __future__ import annotations

import io
import time
from typing import Any, Callable

import pytest
from whywait.engine.commands.replay_cmd import progress_bar
from whywait.engine.replay import Window


class _Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_no_terminal_no_bar_and_nothing_to_call(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("sys.stderr", io.StringIO())
    with progress_bar(Window(1000.0, 2000.0)) as tick:
        assert tick is None


@pytest.mark.parametrize(("label", "time_of"), [("replaying", None), ("exporting", lambda _: 1500.0)])
def test_on_a_terminal_it_shows_the_label_and_the_rate(monkeypatch: pytest.MonkeyPatch, label: str,
                                                       time_of: Callable[[Any], float] | None) -> None:
    term = _Terminal()
    monkeypatch.setattr("sys.stderr", term)
    bar = progress_bar(Window(1000.0, 2000.0), label, time_of) if time_of else progress_bar(Window(1000.0, 2000.0))
    with bar as tick:
        assert tick is not None
        for _ in range(3):
            tick({"time": 1500.0} if time_of is None else None)
            time.sleep(0.25)  # it redraws five times a second, not per message
        assert bar.bar.tasks[0].completed == 500.0  # half of the window's event time
    out = term.getvalue()
    assert label in out and "events/s" in out
