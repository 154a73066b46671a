"""The evaluator's per-tick shortcuts change no diagnosis: each is turned off and the same scenario run again.

Four shortcuts keep a tick's cost down at 1,024 ranks: ``step_outlier`` looks only at the ranks that pass its
first tests or that it flagged before (:func:`step_conditions._looked_at`); what one step says for the cost
figure is kept on the step (:func:`steps.kept_stat`); a job's entity lists are kept for its placement
(:func:`conditions._placed`); the rotation keeps its per-step figures and judges only its new steps, at once.
The vectorised parts of the straggler judgement (the others' growth noise, the
steps where another rank was newly slow) are checked against the loops over judgements they replaced.
"""

from __future__ import annotations

import random
import statistics
import warnings
from typing import Any

import numpy as np
import pytest
from whywait.engine.evaluate import conditions, step_conditions, steps
from whywait.engine.evaluate.steps import StepRec, StepTable, judge_window

T0 = 1_764_442_800.0


@pytest.mark.parametrize("fault", ["straggler-compute", "nic-packet-loss"])
def test_tick_shortcuts_change_no_diagnosis(fault: str, monkeypatch: pytest.MonkeyPatch) -> None:
    from whywait.engine.rules.loader import load_rules
    from whywait.simulate.eval import build_suite, run_scenario

    rules = load_rules(["rules"])
    sc = next(s for s in build_suite(quick=True, classes=[fault]) if not s.fault_free)
    fast = run_scenario(rules, sc).diagnoses
    monkeypatch.setattr(step_conditions, "_looked_at", lambda judged, ok, held: list(range(len(judged))))
    monkeypatch.setattr(step_conditions, "kept_stat", lambda row, key, compute: compute())
    monkeypatch.setattr(steps, "kept_stat", lambda row, key, compute: compute())
    monkeypatch.setattr(conditions, "_placed", lambda job, what, build: build())
    slow = run_scenario(rules, sc).diagnoses
    assert fast == slow
    assert fast, f"{sc.name}: the scenario should give diagnoses to compare"


class _Forgetful(dict[Any, Any]):
    """A cache that never finds anything (a kept layout is built again on every call)."""

    def get(self, key: Any, default: Any = None) -> Any:
        return default


def _every_result(monkeypatch: pytest.MonkeyPatch, rules: Any, sc: Any) -> list[str]:
    """Each rule's result on each tick of the scenario (``when``, evidence and checks): whether it held, its
    entities, evidence, culprits and facts (functions left out), written out exactly (``repr``)."""
    from whywait.engine.evaluate import evaluator
    from whywait.simulate.eval import run_scenario

    seen: list[str] = []
    real = conditions.evaluate

    def record(node: Any, ctx: Any) -> Any:
        r = real(node, ctx)
        facts = sorted((k, v) for k, v in ctx.facts.items() if not callable(v))
        seen.append(repr((ctx.rule_id, ctx.now, r.holds, r.entities, r.evidence, ctx.culprits, facts)))
        return r

    with monkeypatch.context() as m:
        m.setattr(evaluator, "evaluate", record)
        run_scenario(rules, sc)
    return seen


@pytest.mark.parametrize("fault", ["rotating-straggler", "straggler-compute", "stage-imbalance"])
def test_rotation_shortcuts_change_no_rule_result_on_any_tick(fault: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """The rotation reads each step once: its per-step figures kept on the step (the slowest rank over the
    median, the lines), the steps it has not judged yet judged as one matrix, the job's layout kept for its
    placement.  Turned off (every figure computed afresh, each step judged alone), every rule gives the very
    same result on every tick."""
    from whywait.engine.rules.loader import load_rules
    from whywait.simulate.eval import build_suite

    rules = load_rules(["rules"])
    sc = next(s for s in build_suite(quick=True, classes=[fault]) if not s.fault_free)
    fast = _every_result(monkeypatch, rules, sc)
    monkeypatch.setattr(step_conditions, "kept_stat", lambda row, key, compute: compute())
    monkeypatch.setattr(steps, "kept_stat", lambda row, key, compute: compute())
    monkeypatch.setattr(steps, "keep_stat", lambda row, key, value: None)
    monkeypatch.setattr(step_conditions, "_ROTATION_LAYOUTS", _Forgetful())
    monkeypatch.setattr(step_conditions, "_at_once", lambda rows, judge: [judge([r])[0] for r in rows])
    slow = _every_result(monkeypatch, rules, sc)
    assert len(fast) == len(slow)
    assert fast == slow
    if fault == "rotating-straggler":
        assert any(x.startswith("('job.rotating-straggler', ") and ", True, " in x for x in fast), \
            "the rotation should hold on some ticks"


@pytest.mark.parametrize("seed", range(4))
def test_a_steps_top_excess_alone_is_the_matrix_figure(seed: int) -> None:
    """What the rotation keeps per step (its slowest rank over its median) is the float the past's matrix gave:
    ``nanmedian`` takes the same path for one line as for a matrix of them (below and above 600 ranks)."""
    rng = np.random.default_rng(seed)
    for n in (4, 9, 64, 599, 600, 1024):
        m = rng.lognormal(0.0, 0.2, (int(rng.integers(2, 40)), n))
        m[rng.random(m.shape) < (0.0 if seed == 0 else 0.05)] = np.nan
        if seed == 3:
            m[0] = np.nan  # a step without values: NaN either way
        with np.errstate(all="ignore"), warnings.catch_warnings():
            warnings.simplefilter("ignore", RuntimeWarning)
            whole = np.nanmax(m, axis=1) / np.nanmedian(m, axis=1) - 1.0
        alone = np.array([step_conditions._top_excess(m[i]) for i in range(len(m))])
        np.testing.assert_array_equal(alone, whole)


def _table(rng: random.Random, ranks: int, steps_n: int) -> StepTable:
    tab = StepTable()
    slow = set(rng.sample(range(ranks), k=2))
    for s in range(steps_n):
        for r in range(ranks):
            if rng.random() < 0.05:
                continue
            comp = 0.7 * rng.lognormvariate(0, 0.05) * (1.6 if r in slow and s > steps_n // 2 else 1.0)
            tab.add(s, r, StepRec(T0 + s + rng.uniform(0, 0.3), 1.2, data_wait_s=0.01 * rng.random(),
                                  compute_s=comp, comm_s=0.3))
    return tab


def _growth_loop(judged: list[Any]) -> dict[int, tuple[float, float]]:
    """The others' growth per window step, as the loop over judgements computed it."""
    per_step: dict[int, list[float]] = {}
    n = 0
    for j in judged:
        if j.history_ratio and j.ratio_at:
            n += 1
            for i, x in j.ratio_at.items():
                per_step.setdefault(i, []).append(x / j.history_ratio)
    out: dict[int, tuple[float, float]] = {}
    if n < 4:
        return out
    for i, gs in per_step.items():
        if len(gs) < 4:
            continue
        typ = statistics.median(gs)
        if typ <= 0:
            continue
        out[i] = (typ, max(1.4826 * statistics.median(abs(g / typ - 1.0) for g in gs), 0.02))
    return out


def _newly_loop(judged: list[Any], skip: set[int], thr: float) -> set[int]:
    out = set()
    for j in judged:
        if j.rank in skip:
            continue
        for i in j.slow_at:
            x = (j.ratio_at or {}).get(i)
            if j.history_ratio is None or x is None or x > j.history_ratio * thr:
                out.add(i)
    return out


@pytest.mark.parametrize("seed", range(6))
def test_judged_ranks_arrays_equal_the_loops_over_judgements(seed: int) -> None:
    rng = random.Random(seed)
    ranks = rng.choice((8, 17, 64))
    tab = _table(rng, ranks, rng.randint(20, 60))
    done = list(tab.steps.items())
    cut = rng.randint(len(done) // 2, len(done) - 2)
    win, hist = done[cut:], done[:cut]
    members = list(range(ranks))
    groups = {"": members} if seed % 2 else {"0": members[::2], "1": members[1::2]}
    for min_history in (0, 5, 200):
        judged = judge_window(win, hist, groups, "work", 1.1, min_history, z_thr=2.0)
        each = judged.all()
        assert [j.rank for j in each] == judged.rank.tolist()
        np.testing.assert_array_equal(judged.ratio, [j.ratio for j in each])
        np.testing.assert_array_equal(judged.slow_share, [j.slow_share for j in each])
        assert judged.growth_noise() == _growth_loop(each)
        skip = set(rng.sample(members, 2))
        assert judged.newly_slow_steps(skip) == _newly_loop(each, skip, 1.1)
