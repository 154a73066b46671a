"""Estimated costs of overlapping incidents are shared, so they add up to the job's loss."""

from __future__ import annotations

import pytest
from whywait.engine.report.cost import shared_gpu_hours


def test_overlaps_are_shared_not_added() -> None:
    # 8 GPUs; A is half lost for an hour; B overlaps A's second half; C stands alone later
    got = shared_gpu_hours([(0, 3600, 0.5), (1800, 3600, 0.5), (7200, 9000, 0.25)], 8)
    assert got[0] == pytest.approx(0.5 * 8 * 0.5 + 0.5 * 8 * 0.5 / 2)  # alone, then shared with B
    assert got[1] == pytest.approx(0.5 * 8 * 0.5 / 2)
    assert got[2] == pytest.approx(0.25 * 8 * 0.5)
    assert sum(got[:2]) == pytest.approx(0.5 * 8 * 1.0)  # the job's loss over the hour, once


def test_no_incidents() -> None:
    assert shared_gpu_hours([], 8) == []
