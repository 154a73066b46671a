"""One second of a job's time is lost at most once: overlapping incidents of one job combine their losses."""

from __future__ import annotations

import math
from pathlib import Path

import pytest
from whywait.engine.report.costs import Loss, counted_losses


def test_an_incident_alone_keeps_its_own_figure() -> None:
    assert counted_losses([Loss("j", 0, 3600, 2.5)]) == [pytest.approx(2.5)]


def test_three_rules_on_one_slow_node_count_its_lost_time_once() -> None:
    # The 32-node simulation: retransmits, link flap and PCIe each charged ~3.1 GPU-h for the same 43.5 lost
    # seconds; the report said 19.94 GPU-h in all, the digest 19.25 of 26.59 used.  Counted once, it is 3.1.
    got = counted_losses([Loss("llm", 100, 300, 3.0956), Loss("llm", 100, 300, 3.0957), Loss("llm", 100, 300, 3.1051)])
    assert sum(got) == pytest.approx(3.1051)  # the worst of them, once
    assert got[0] / got[2] == pytest.approx(3.0956 / 3.1051)  # shared in proportion to their rates


def test_the_largest_rate_counts_where_they_overlap_and_each_keeps_its_own_elsewhere() -> None:
    # A: 1 GPU-h over an hour; B overlaps A's second half at 4x A's rate; C is another job's, at the same time
    a, b, c = Loss("j", 0, 3600, 1.0), Loss("j", 1800, 3600, 2.0), Loss("k", 0, 3600, 1.0)
    got = counted_losses([a, b, c])
    # first half: A alone, 0.5; second half: B's rate (2 GPU-h per half hour), shared 1:4
    assert got[0] == pytest.approx(0.5 + 2.0 * 1 / 5)
    assert got[1] == pytest.approx(2.0 * 4 / 5)
    assert got[0] + got[1] == pytest.approx(2.5)  # not 3.0: the second half counted once
    assert got[2] == pytest.approx(1.0)  # another job never shares


def test_only_the_part_in_the_period_counts() -> None:
    got = counted_losses([Loss("j", 0, 3600, 1.0), Loss("j", -7200, -3600, 5.0), Loss("j", 1800, 1800, 0.3)],
                         lo=1800, hi=7200)
    assert got == [pytest.approx(0.5), 0.0, pytest.approx(0.3)]  # half of the first; none of the one before


def test_nothing_and_nonsense_count_nothing() -> None:
    assert counted_losses([]) == []
    assert counted_losses([Loss("j", 0, 10, -1.0), Loss("j", 0, 10, math.nan), Loss("j", 0, 10, 0.0)]) == [0, 0, 0]


def test_losses_on_different_steps_of_overlapping_incidents_both_count() -> None:
    """A tester's pipeline job: a stage imbalance open for the whole run lost 0.20 GPU-hours on its first 150 steps,
    a straggler 0.20 on the next 150.  Spread over their spans the two looked like one loss (the report said 0.29 of
    0.40); with where each loss lies (the cost's lost_from/lost_until) they add up."""
    from whywait.engine.report.costs import loss_span

    imbalance = {"gpu_hours_lost": 0.2, "lost_from": 0.0, "lost_until": 150.0}
    straggler = {"gpu_hours_lost": 0.2, "lost_from": 150.0, "lost_until": 300.0}
    losses = [Loss("pipe", *loss_span(imbalance, 0.0, 300.0), 0.2),
              Loss("pipe", *loss_span(straggler, 150.0, 300.0), 0.2)]
    assert sum(counted_losses(losses)) == pytest.approx(0.4)
    assert loss_span(None, 5.0, 9.0) == (5.0, 9.0) and loss_span({"lost_from": 7.0}, 5.0, 9.0) == (5.0, 9.0)
    # without them, as before: the overlap is counted once
    assert sum(counted_losses([Loss("pipe", 0.0, 300.0, 0.2), Loss("pipe", 150.0, 300.0, 0.2)])) < 0.35


def test_the_evaluators_cost_says_where_its_loss_lies(tmp_path: Path) -> None:
    from whywait.engine.replay import incidents

    from tests.replay.test_cost_text import straggler_table
    from tests.support.tables import replay_table

    res, _ = replay_table(tmp_path, straggler_table())
    [span] = [s for s in incidents(res.diagnoses, res.end, res.open_at_end) if s.first.rule_id == "job.straggler"]
    cost = span.told.cost or {}
    first_slow = 1_764_443_800.0 + 100 * 0.755  # step 100 of the table ends about here
    assert cost["lost_from"] == pytest.approx(first_slow, abs=10.0) and cost["lost_until"] > cost["lost_from"] + 100
