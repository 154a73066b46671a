"""change_point: finds a level shift and when it happened, even with a checkpoint spike in the window."""

from __future__ import annotations

import random

from whywait.engine.evaluate.conditions import change_point


def series(shift_at: int, n: int = 180, before: float = 0.8, after: float = 1.15, seed: int = 1) -> list[float]:
    rng = random.Random(seed)
    return [(before if i < shift_at else after) + rng.gauss(0, 0.015) for i in range(n)]


def test_finds_the_shift_and_its_time() -> None:
    v = series(140)
    score, at, mb, ma = change_point([float(i) for i in range(len(v))], v, 10)  # type: ignore[misc]
    assert at == 140.0 and score > 50 and abs(mb - 0.8) < 0.01 and abs(ma - 1.15) < 0.01


def test_a_checkpoint_spike_does_not_hide_the_shift() -> None:
    v = series(150)
    v[60:63] = [10.0, 10.5, 9.8]  # a checkpoint save stalls three steps
    score, at, _, _ = change_point([float(i) for i in range(len(v))], v, 10)  # type: ignore[misc]
    assert at == 150.0 and score > 20


def test_no_shift_scores_low_and_short_windows_have_none() -> None:
    v = series(10_000)
    score, _, _, _ = change_point([float(i) for i in range(len(v))], v, 10)  # type: ignore[misc]
    assert score < 6
    assert change_point([0.0, 1.0], [1.0, 2.0], 10) is None
