"""The report's wording: cost phrases that read sensibly, names escaped, an interrupted replay said so."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
from whywait.engine.report.render import _cost


def view(**cost: float) -> SimpleNamespace:
    return SimpleNamespace(cost={"gpu_hours_lost": 3.11, **cost}, cost_source="rule", counted=None, shared_with=())


@pytest.mark.parametrize("pct, says", [
    (45.2, "steps 45% slower"),
    (0.6, "steps 1% slower"),
    (0.3, "steps under 1% slower"),
    (0.0, "steps no slower"),
    (-0.2, "steps no slower"),  # was "steps -0% slower"
    (-1.2, "steps no slower (1% faster)"),  # was "steps -1% slower"
])
def test_the_slowdown_is_said_sensibly_at_or_below_zero(pct: float, says: str) -> None:
    text = _cost(view(slowdown_pct=pct))  # type: ignore[arg-type]
    assert text == f"3.11 GPU-hours lost, {says}", text
