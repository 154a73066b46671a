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


def test_a_quiet_report_of_too_little_data_says_so() -> None:
    # The HTA sample traces: 2 steps per rank, 2 of 128 ranks. "No incident ... every rule stayed quiet" read as
    # a clean bill of health.
    from whywait.engine.report.render import summary

    sampler = SimpleNamespace(step_counts={"hta:0": 2, "hta:1": 2, "ok:0": 40, "ok:1": 41},
                              placements={"hta": {"ranks": [{"rank": r} for r in range(128)]},
                                          "ok": {"ranks": [{"rank": 0}, {"rank": 1}]}})
    data = SimpleNamespace(window=SimpleNamespace(since=1_700_000_000.0, until=1_700_000_600.0), interrupted=False,
                           incidents=[], messages=120, sampler=sampler, read_to=None)
    lines = summary(data)  # type: ignore[arg-type]
    assert lines[0].startswith("No incident between") and len(lines) == 2, lines
    assert lines[1] == ("Too little to judge **hta**: 2 steps per rank (a rank is compared with its peers on at least "
                        "5 aligned steps, and with 8 of its own before them to tell a new straggler from slower "
                        "hardware) and 2 of its 128 ranks reporting, so its quiet says little of stragglers.")


def test_a_change_line_says_what_changed_and_figures_alone_are_no_change() -> None:
    # A tester's report listed eight identical "Changed at 03:08:55 UTC: warning: <the same title>" lines.
    from whywait.engine.diagnosis import Diagnosis, Evidence
    from whywait.engine.report import _changes

    def d(t: float, sev: str = "warning", culprit: str = "node-25", ents: tuple[str, ...] = ("node-25/gpu3",),
          value: float = 1.0) -> Diagnosis:
        return Diagnosis(rule_id="r", fingerprint="f", status="firing", severity=sev, title="t", cause="c",  # type: ignore[arg-type]
                         job="j", owner=None, starts_at=0.0, detected_at=t, culprit=culprit,
                         evidence=tuple(Evidence("gpu.pcie_gen", e, value) for e in ents))
    got = _changes([d(1), d(2, value=2.0), d(3, value=3.0), d(4, sev="critical"),
                    d(5, sev="critical", ents=("node-25/gpu3", "node-26/gpu1"))])
    assert got == [(4, "severity warning → critical"), (5, "the evidence now also names node-26/gpu1")]


def test_an_incident_holding_from_the_first_seconds_read_says_it_may_have_begun_before() -> None:
    # `--lead 0s` over a window inside an incident said it "began" at the window's start, with no warning.
    from whywait.engine.report.render import summary

    def inc(start: float) -> SimpleNamespace:
        return SimpleNamespace(number=1, ranks=(), resolved=True, end=start + 60, job="j", culprit="node-03",
                               start=start, cause="c", names=set(), owner="t", channel=None, counted=0.0,
                               shared_with=(), cost=None, cost_source="unknown")
    for start, says in ((1_700_000_002.0, True), (1_700_000_300.0, False)):
        data = SimpleNamespace(window=SimpleNamespace(since=1_700_000_000.0, until=1_700_000_600.0,
                                                      read_from=1_700_000_000.0),
                               interrupted=False, incidents=[inc(start)], messages=10, sampler=None, read_to=None)
        line = summary(data)[0]  # type: ignore[arg-type]
        assert ("may have begun before them" in line) is says, line
