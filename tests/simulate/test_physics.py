"""The step physics real jobs have: synchronous collectives, pipeline bubbles, long and short steps,
duration-only producers, mixed hardware, noise; and the straggler faults with their cost truth."""

from __future__ import annotations

import re
import statistics
from typing import Any

import pytest
from whywait.agents.events import validate
from whywait.simulate.cluster import make_job
from whywait.simulate.errors import SimulationError
from whywait.simulate.faults import make_fault

from tests.simulate.conftest import run_sim
from tests.simulate.support import START, by_rank, gpu_samples, of_kind, steps

Msgs = list[tuple[str, dict[str, Any]]]


def _run(faults: list[Any] | None = None, duration: float = 150, nodes: int = 4, **job: Any):
    sim, msgs = run_sim(faults or [], duration=duration, nodes=nodes,
                        jobs=lambda t: [make_job(t, checkpoint_every_s=1e6, **job)])
    for topic, m in msgs:
        validate(m, topic)
    return sim, msgs


def _by_step(recs: list[dict[str, Any]]) -> dict[int, list[dict[str, Any]]]:
    out: dict[int, list[dict[str, Any]]] = {}
    for s in recs:
        out.setdefault(s["step"], []).append(s)
    return out


def _independent_cost(msgs: Msgs, lo: float, hi: float, gpus: int) -> float:
    """GPU-hours lost, from the published steps alone: each step in the window over the healthy median."""
    healthy = statistics.median(s["duration_s"] for s in steps(msgs, 5, lo) if s["rank"] == 0)
    window = [s for s in steps(msgs, lo, hi + 60) if s["rank"] == 0 and START + lo <= s["ended_at"] - s["duration_s"]
              < START + hi]
    return sum(s["duration_s"] - healthy for s in window) * gpus / 3600


def test_synchronous_ranks_end_together_and_a_compute_straggler_shows_only_in_the_split():
    sim, msgs = _run([make_fault("straggler-compute", "train-llm:13", 50, 120, compute_mult=1.8)])
    by_step = _by_step(steps(msgs, 60, 120))
    assert len(by_step) > 40
    for recs in by_step.values():
        if len(recs) < 32:
            continue  # a step split across two batches
        durations = [s["duration_s"] for s in recs]
        assert max(durations) - min(durations) < 0.01 * statistics.median(durations)  # everyone waits for all
    comp, comm = by_rank(steps(msgs, 60, 120), "compute_s"), by_rank(steps(msgs, 60, 120), "comm_s")
    assert max(comp, key=comp.get) == 13 and min(comm, key=comm.get) == 13
    assert comp[13] / statistics.median(comp.values()) == pytest.approx(1.8, rel=0.05)
    # No hardware signature: its GPU's clocks, temperature and throttle reasons are those of a healthy GPU.
    for g in gpu_samples(msgs, "node-02", 5, 60, 120):
        assert g["throttle_reasons"] == [] and g["sm_clock_mhz"] >= 1965 and g["temp_c"] < 75
    (gt,) = sim.ground_truth()
    assert (gt.cause, gt.phase, gt.culprit, gt.culprit_kind, gt.ranks) == (
        "straggler.unknown-cause", "compute", "node-02", "ranks", (13,))
    assert gt.whatif_step_s == pytest.approx(0.76, rel=0.1) and gt.step_s > gt.whatif_step_s * 1.5
    assert gt.gpu_hours_lost == pytest.approx(_independent_cost(msgs, 50, 120, 32), rel=0.1)
    written = gt.to_dict()  # what `whywait simulate --truth-out` writes
    assert written["phase"] == "compute" and written["ranks"] == [13] and written["steps"] > 40
    assert written["gpu_hours_lost"] == gt.gpu_hours_lost and written["whatif_step_s"] == gt.whatif_step_s


def test_an_input_straggler_waits_longest_for_data_and_least_in_comm():
    sim, msgs = _run([make_fault("straggler-input", "train-llm:3", 50, 120, slowdown=0.6)])
    data, comm = by_rank(steps(msgs, 70, 120), "data_wait_s"), by_rank(steps(msgs, 70, 120), "comm_s")
    assert max(data, key=data.get) == 3 and min(comm, key=comm.get) == 3
    assert data[3] > 0.3
    host = [m for m in of_kind(msgs, "host", 60, 120) if m["node"] == "node-01"]
    assert max(h["cpu_busy_pct"] for h in host) < 60  # no CPU sign
    (gt,) = sim.ground_truth()
    assert gt.phase == "input" and gt.gpu_hours_lost > 0


def test_a_transient_straggler_is_slow_in_its_window_only():
    sim, msgs = _run([make_fault("transient-straggler", "train-llm:20", 60, 90, compute_mult=2.0)])
    for lo, hi, slow in ((20, 58, False), (65, 90, True), (100, 150, False)):
        comp = by_rank(steps(msgs, lo, hi), "compute_s")
        assert (comp[20] / statistics.median(comp.values()) > 1.7) is slow, (lo, hi)
    (gt,) = sim.ground_truth()
    assert (gt.start, gt.end) == (START + 60, START + 90)
    assert gt.gpu_hours_lost == pytest.approx(_independent_cost(msgs, 60, 90, 32), rel=0.1)


def test_several_stragglers_on_different_nodes_at_once():
    sim, msgs = _run([make_fault("multi-straggler", "train-llm", 50, 120, count=3, compute_mult=1.6)])
    (gt,) = sim.ground_truth()
    assert len(gt.ranks) == 3 and len(gt.culprit.split(", ")) == 3
    comp = by_rank(steps(msgs, 60, 120), "compute_s")
    assert set(sorted(comp, key=comp.get)[-3:]) == set(gt.ranks)
    listed = _run([make_fault("multi-straggler", "train-llm:1,9", 50, 60)], duration=70)[0].ground_truth()[0]
    assert listed.ranks == (1, 9) and listed.culprit == "node-01, node-02"


def test_a_rotating_straggler_has_a_different_slow_rank_each_step():
    sim, msgs = _run([make_fault("rotating-straggler", "train-llm", 40, 140, compute_mult=1.8)])
    slowest = [max(recs, key=lambda s: s["compute_s"])["rank"] for recs in _by_step(steps(msgs, 45, 140)).values()
               if len(recs) == 32]
    assert len(slowest) > 60
    assert statistics.mode(slowest) and slowest.count(statistics.mode(slowest)) < 0.15 * len(slowest)
    assert len(set(slowest)) > 25
    (gt,) = sim.ground_truth()
    assert (gt.culprit, gt.culprit_kind, gt.phase) == ("", "none", "compute")


def test_uneven_batches_spread_every_rank_but_keep_the_job_s_work():
    # Sequence-length imbalance: every rank's work varies each step (mean 1, so the total is unchanged), no
    # rank is slow for long, and the job pays for the slowest draw each step.
    sim, msgs = _run([make_fault("rotating-straggler", "train-llm", 40, 140, spread=0.25)])

    def iqr(recs: list[dict[str, Any]]) -> float:
        q = statistics.quantiles([s["compute_s"] for s in recs], n=4)
        return (q[2] - q[0]) / q[1]

    before = [iqr(r) for r in _by_step(steps(msgs, 5, 38)).values() if len(r) == 32]
    during = [iqr(r) for r in _by_step(steps(msgs, 45, 140)).values() if len(r) == 32]
    assert statistics.median(during) > 3 * statistics.median(before)
    comp_before = statistics.mean(s["compute_s"] for s in steps(msgs, 5, 38))
    comp_during = statistics.mean(s["compute_s"] for s in steps(msgs, 45, 140))
    assert abs(comp_during / comp_before - 1) < 0.03  # the work is shared out unevenly, not grown
    slowest = [max(r, key=lambda s: s["compute_s"])["rank"] for r in _by_step(steps(msgs, 45, 140)).values()]
    assert slowest.count(statistics.mode(slowest)) < 0.15 * len(slowest)
    (gt,) = sim.ground_truth()
    assert gt.gpu_hours_lost > 0 and gt.phase == "compute"
    # Input: a heavy batch waits for its loader, a light one no less than usual.
    sim, msgs = _run([make_fault("rotating-straggler", "train-llm", 40, 140, spread=0.25, input=1)])
    waits = [s["data_wait_s"] for s in steps(msgs, 45, 140)]
    healthy = statistics.median(s["data_wait_s"] for s in steps(msgs, 5, 38))
    assert min(waits) > 0 and statistics.quantiles(waits, n=4)[2] > 2 * healthy


def test_a_periodic_slowdown_repeats_with_its_period():
    sim, msgs = _run([make_fault("periodic-slowdown", "train-llm", 30, 290, period_s=60, slow_s=15,
                                 compute_mult=1.6)], duration=300)
    rank0 = [s for s in steps(msgs, 0, 300) if s["rank"] == 0]
    healthy = statistics.median(s["duration_s"] for s in rank0 if s["ended_at"] < START + 30)
    for k in range(4):
        spell = [s["duration_s"] for s in rank0 if START + 32 + 60 * k < s["ended_at"] < START + 44 + 60 * k]
        calm = [s["duration_s"] for s in rank0 if START + 50 + 60 * k < s["ended_at"] < START + 88 + 60 * k]
        assert statistics.median(spell) > 1.4 * healthy and statistics.median(calm) < 1.05 * healthy
    (gt,) = sim.ground_truth()
    assert gt.detail["spells"] == [30.0, 90.0, 150.0, 210.0, 270.0] and gt.detail["period_s"] == 60


def test_pipeline_stages_have_bubbles_and_the_slow_stage_waits_least():
    sim, msgs = _run([make_fault("stage-imbalance", "train-llm", 60, 150, compute_mult=1.5)], pp=4, tp=4,
                     microbatches=8, jitter=0.01, hiccup_rate=0.0, gc_rate=0.0)
    placement = msgs[0][1]
    coords = {r["rank"]: (r["dp"], r["pp"], r["tp"]) for r in placement["ranks"]}
    assert coords[0] == (0, 0, 0) and coords[5] == (1, 0, 1) and coords[31] == (1, 3, 3)  # tp, then dp, then pp
    healthy = steps(msgs, 10, 55)
    for s in healthy:
        assert s["comm_s"] == pytest.approx(s["collective_s"] + s["pipeline_wait_s"], abs=2e-4)
        assert s["duration_s"] == pytest.approx(s["data_wait_s"] + s["compute_s"] + s["comm_s"], abs=1e-3)
    # Healthy: (m + p - 1) slots of one microbatch, so each stage waits (p - 1) / m of its compute (a little
    # more: a slot lasts as long as the slowest of the replica's ranks, and the replica starts with its last input).
    pipe, comp = by_rank(healthy, "pipeline_wait_s"), by_rank(healthy, "compute_s")
    for r in pipe:
        assert 3 / 8 <= pipe[r] / comp[r] < 3 / 8 * 1.15
    slow = by_rank(steps(msgs, 70, 150), "pipeline_wait_s")
    last = [r for r, c in coords.items() if c[1] == 3]
    assert max(slow[r] for r in last) < min(slow[r] for r in slow if r not in last)
    (gt,) = sim.ground_truth()
    assert (gt.culprit, gt.culprit_kind, gt.detail["stage"]) == ("stage 3", "stage", 3)
    # The whole pipeline runs at the slow stage's pace: (8 + 3) x 1.5 slots instead of 11.
    expected = sim.jobs[0].spec.compute_s * 0.5 * 11 / 8
    assert gt.step_s - gt.whatif_step_s == pytest.approx(expected, rel=0.1)


@pytest.mark.parametrize("step_s", [0.1, 45.0])
def test_step_time_is_a_job_parameter_from_a_tenth_of_a_second_to_a_minute(step_s: float):
    duration = 600 if step_s > 10 else 30
    sim, msgs = _run(step_s=step_s, duration=duration, nodes=2)
    rank0 = [s for s in steps(msgs, 0, duration) if s["rank"] == 0]
    assert statistics.median(s["duration_s"] for s in rank0) == pytest.approx(step_s, rel=0.05)
    assert len(rank0) == pytest.approx(duration / step_s, rel=0.1)
    for m in of_kind(msgs, "steps"):
        assert all(s["ended_at"] <= m["time"] + 1e-6 for s in m["steps"])
    ends = [s["ended_at"] for s in rank0]
    assert ends == sorted(ends)


def test_a_duration_only_producer_publishes_no_split():
    sim, msgs = _run(split=False, duration=20, nodes=2)
    recs = steps(msgs, 0, 20)
    assert recs and all(set(s) == {"rank", "step", "duration_s", "node", "ended_at"} for s in recs)
    # The GPUs still do what the job does: busy, not idle.
    assert statistics.median(g["util_pct"] for m in of_kind(msgs, "gpu") for g in m["gpus"]) > 80


def test_mixed_hardware_from_the_start_is_slower_in_compute_yet_ends_every_step_with_the_others():
    sim, msgs = _run(slow_nodes=("node-02", "node-03"), slow_mult=1.25, duration=60)
    comp = by_rank(steps(msgs, 5, 60), "compute_s")
    fast = statistics.median(c for r, c in comp.items() if r < 8 or r >= 24)
    assert all(comp[r] / fast == pytest.approx(1.25, rel=0.04) for r in range(8, 24))
    assert sim.ground_truth() == []


def test_hiccups_and_gc_pauses_are_single_slow_steps_on_one_rank():
    sim, msgs = _run(hiccup_rate=0.01, gc_rate=0.0, duration=60, jitter=0.01)
    recs = steps(msgs, 5, 60)
    med = statistics.median(s["compute_s"] for s in recs)
    slow = [s for s in recs if s["compute_s"] > 1.4 * med]
    assert 0.005 < len(slow) / len(recs) < 0.02
    for s in slow:  # the next step of that rank is normal again
        nxt = [x for x in recs if x["rank"] == s["rank"] and x["step"] == s["step"] + 1]
        assert all(x["compute_s"] < 1.2 * med for x in nxt)


def test_a_hang_costs_its_whole_stall():
    sim, _ = _run([make_fault("rank-silent", "train-llm:4", 50, 80, hang=1)], duration=100)
    (gt,) = sim.ground_truth()
    assert gt.gpu_hours_lost == pytest.approx(30 * 32 / 3600, rel=0.05) and gt.phase == "none"


def test_a_save_still_running_when_the_run_ends_costs_only_what_it_has_taken_so_far():
    def truth(duration: float) -> float:
        sim, _ = run_sim([make_fault("checkpoint-growth", "train-llm", 10, 60, growth=3.0)], duration=duration,
                         nodes=4, jobs=lambda t: [make_job(t, checkpoint_every_s=30)])
        (gt,) = sim.ground_truth()
        return gt.gpu_hours_lost

    # The save that starts near 30 s lasts 3x the usual; a run ending in the middle of it has lost the
    # time so far over the usual save, and one second more of the run adds one second of loss.
    a, b = truth(45.0), truth(46.0)
    assert b - a == pytest.approx(1.0 * 32 / 3600, rel=0.02)


@pytest.mark.parametrize(("job", "fault", "message"), [
    ({}, ("stage-imbalance", "train-llm"), "has no pipeline (pp=1)"),
    ({"pp": 3}, None, "do not split into pp=3 stages"),
    ({"slow_nodes": ("node-09",)}, None, "slow_nodes node-09 are not among the job's nodes"),
    ({"step_s": 0}, None, "step_s must be a positive number"),
    ({"hiccup_rate": 1.5}, None, "hiccup_rate is a probability"),
    ({}, ("multi-straggler", "train-llm:1,99"), "target must be JOB or JOB:R1,R2"),
    ({}, ("straggler-compute", "train-llm"), "target must be JOB:RANK such as train-llm:12"),
    ({}, ("straggler-compute", "train-llm:32"), "target must be JOB:RANK with a rank of 0..31"),
])
def test_impossible_settings_are_refused_with_the_setting_named(job: dict[str, Any], fault: Any, message: str):
    with pytest.raises(SimulationError, match=re.escape(message)):
        _run([make_fault(fault[0], fault[1], 10, 20)] if fault else None, duration=30, **job)


def test_a_periodic_slowdown_longer_than_its_period_is_refused():
    with pytest.raises(SimulationError, match="needs 0 < slow_s < period_s"):
        make_fault("periodic-slowdown", "train-llm", 0, 100, period_s=30, slow_s=30)
