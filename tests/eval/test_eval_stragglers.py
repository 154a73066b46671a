"""Scoring the straggler classes (issue 8) with hand-made diagnoses: several classes share one cause,
the root cause needs the ranks (or stage) and the phase, latency counts steps, and cost is checked."""

from __future__ import annotations

from typing import Any

import pytest
from whywait.simulate import eval as ev

S = ev.START
CAUSE = "straggler.unknown-cause"


def _truth(fault: str, culprit: str = "node-03", kind: str = "ranks", ranks: tuple[int, ...] = (18,),
           phase: str = "compute", cause: str = CAUSE, start: float = 100, end: float = 160,
           lost: float = 0.1, whatif: float = 0.8, detail: dict[str, Any] | None = None) -> dict[str, Any]:
    return {"fault": fault, "cause": cause, "culprit": culprit, "culprit_kind": kind, "job": "train-llm",
            "start": S + start, "end": S + end, "ranks": list(ranks), "phase": phase, "gpu_hours_lost": lost,
            "whatif_step_s": whatif, "detail": detail or {}}


def _diag(at: float, cause: str = CAUSE, culprit: str | None = "node-03", ranks: tuple[int, ...] = (18,),
          status: str = "firing", cost: float | None = None, fp: str = "job.straggler|train-llm",
          **labels: str) -> dict[str, Any]:
    return {"rule_id": "job.straggler", "fingerprint": fp, "status": status, "job": "train-llm",
            "culprit": culprit, "ranks": list(ranks), "detected_at": S + at, "labels": {"cause": cause, **labels},
            "evidence": [], "cost": None if cost is None else {"gpu_hours_lost": cost}}


def _run(name: str, truths: list[dict[str, Any]], diags: list[dict[str, Any]],
         step_ends: list[float] | None = None, duration: float = 220) -> ev.ScenarioRun:
    classes = tuple(t["fault"] for t in truths)
    return ev.ScenarioRun(ev.EvalScenario(name, classes, {"duration_s": duration}), truths, diags,
                          {"train-llm": {18: ("node-03", 2)}}, 100, 0.1,
                          step_ends={"train-llm": [S + x for x in (step_ends or [])]})


def test_one_cause_for_four_classes_is_matched_by_job_cause_and_window() -> None:
    runs = [
        _run("a", [_truth("straggler-compute")], [_diag(105, phase="compute")]),
        _run("b", [_truth("transient-straggler", start=100, end=130)], [_diag(104, phase="compute")]),
        # A straggler diagnosis with no fault: false for every class with that cause.
        _run("c", [], [_diag(50, phase="compute")]),
    ]
    rep = ev.score(runs)
    for cls in ("straggler-compute", "transient-straggler"):
        c = rep.classes[cls]
        assert (c.truths, c.detected, c.root_cause_ok, c.true_diagnoses, c.false_diagnoses) == (1, 1, 1, 1, 1)
    assert rep.classes["multi-straggler"].false_diagnoses == 1 and rep.classes["multi-straggler"].truths == 0
    assert "stage-imbalance" not in rep.classes  # another cause
    assert len(rep.fault_free_diagnoses) == 1


def test_a_false_straggler_during_another_straggler_fault_is_charged_to_that_class_only() -> None:
    run = _run("x", [_truth("straggler-input", phase="input", start=100, end=130)],
               [_diag(105, phase="input"), _diag(200, phase="input", fp="other")])
    rep = ev.score([run])
    assert rep.classes["straggler-input"].false_diagnoses == 1
    assert "straggler-compute" not in rep.classes


@pytest.mark.parametrize(("diag", "ok"), [
    ({"ranks": (18,), "phase": "compute"}, True),
    ({"ranks": (18,), "phase": "input"}, False),  # the wrong phase
    ({"ranks": (18, 19), "phase": "compute"}, False),  # a bystander named too
    ({"ranks": (), "culprit": "node-03", "phase": "compute"}, True),  # no ranks: the node decides
    ({"ranks": (), "culprit": "node-04", "phase": "compute"}, False),
    ({"ranks": (18,)}, False),  # no phase said
])
def test_root_cause_needs_the_straggler_ranks_and_the_phase(diag: dict[str, Any], ok: bool) -> None:
    labels = {"phase": diag["phase"]} if "phase" in diag else {}
    d = _diag(105, culprit=diag.get("culprit", "node-03"), ranks=diag["ranks"], **labels)
    c = ev.score([_run("x", [_truth("straggler-compute")], [d])]).classes["straggler-compute"]
    assert (c.detected, c.root_cause_ok) == (1, int(ok))


def test_several_stragglers_need_one_incident_naming_all() -> None:
    truth = _truth("multi-straggler", culprit="node-02, node-05, node-07", ranks=(9, 40, 57))
    one = _diag(104, culprit="node-02", ranks=(9,), phase="compute")
    all_ = _diag(104, culprit="node-02, node-05, node-07", ranks=(57, 9, 40), phase="compute")
    assert ev.score([_run("one", [truth], [one])]).classes["multi-straggler"].root_cause_ok == 0
    assert ev.score([_run("all", [truth], [all_])]).classes["multi-straggler"].root_cause_ok == 1


def test_stage_imbalance_names_the_stage_and_no_node() -> None:
    truth = _truth("stage-imbalance", culprit="stage 3", kind="stage", ranks=(), cause="job.stage-imbalance",
                   detail={"stage": 3})
    good = _diag(104, cause="job.stage-imbalance", culprit=None, ranks=(), stage="3")
    node = _diag(104, cause="job.stage-imbalance", culprit="node-07", ranks=(), stage="3")
    other = _diag(104, cause="job.stage-imbalance", culprit=None, ranks=(), stage="2")
    for d, ok in ((good, 1), (node, 0), (other, 0)):
        assert ev.score([_run("s", [truth], [d])]).classes["stage-imbalance"].root_cause_ok == ok


def test_rotating_straggler_has_no_culprit_and_a_phase() -> None:
    truth = _truth("rotating-straggler", culprit="", kind="none", ranks=(), cause="job.rotating-straggler",
                   phase="input")
    good = _diag(104, cause="job.rotating-straggler", culprit=None, ranks=(), phase="input")
    blamed = _diag(104, cause="job.rotating-straggler", culprit="node-03", ranks=(), phase="input")
    assert ev.score([_run("r", [truth], [good])]).classes["rotating-straggler"].root_cause_ok == 1
    assert ev.score([_run("r", [truth], [blamed])]).classes["rotating-straggler"].root_cause_ok == 0


def test_periodic_slowdown_period_and_latency_from_its_third_spell() -> None:
    # One interval is no period: the third spell on schedule is the first moment one can be seen.
    truth = _truth("periodic-slowdown", culprit="", kind="none", ranks=(), cause="job.periodic-slowdown",
                   start=100, end=500, detail={"period_s": 120.0, "spells": [100.0, 220.0, 340.0, 460.0]})
    good = _diag(346, cause="job.periodic-slowdown", culprit=None, ranks=(), period_s="118")
    wrong = _diag(346, cause="job.periodic-slowdown", culprit=None, ranks=(), period_s="60")
    c = ev.score([_run("p", [truth], [good], duration=600)]).classes["periodic-slowdown"]
    assert c.root_cause_ok == 1 and c.latencies == [246.0] and c.onset_latencies == [6.0] and c.on_time == 1
    assert c.second_spell_latencies == [126.0]
    assert ev.score([_run("p", [truth], [wrong], duration=600)]).classes["periodic-slowdown"].root_cause_ok == 0
    late = ev.score([_run("p", [truth], [_diag(366, cause="job.periodic-slowdown", culprit=None, ranks=(),
                                                period_s="120")], duration=600)]).classes["periodic-slowdown"]
    assert late.onset_latencies == [26.0] and late.on_time == 0


def test_a_whole_job_slowdown_taken_over_by_the_period_is_scored_as_part_of_it() -> None:
    # The first spell is told as a slowdown of the whole job (nobody can see a period in one spell);
    # at the third spell the periodic incident takes it over (the rule's `supersedes`).
    truth = _truth("periodic-slowdown", culprit="", kind="none", ranks=(), cause="job.periodic-slowdown",
                   start=100, end=500, detail={"period_s": 120.0, "spells": [100.0, 220.0, 340.0, 460.0]})
    wjs = dict(_diag(112, cause="job.slow-everywhere", culprit=None, ranks=(), fp="wjs"), starts_at=S + 102)
    done = {**wjs, "status": "resolved", "detected_at": S + 125}
    periodic = dict(_diag(346, cause="job.periodic-slowdown", culprit=None, ranks=(), period_s="120", fp="per"),
                    starts_at=S + 343)
    taken = {**done, "labels": {**done["labels"], "superseded_by": "job.periodic-slowdown",
                                "superseded_by_fingerprint": "per"}}
    before = ev.score([_run("p", [truth], [wjs, done, periodic], duration=600)])
    assert before.classes["periodic-slowdown"].root_cause_ok == 0
    assert before.classes["whole-job-slow"].false_diagnoses == 1
    after = ev.score([_run("p", [truth], [wjs, done, periodic, taken], duration=600)])
    c = after.classes["periodic-slowdown"]
    assert (c.detected, c.root_cause_ok, c.latencies) == (1, 1, [246.0])  # still timed from its own firing
    assert "whole-job-slow" not in after.classes  # no false diagnosis left for it


def test_latency_in_steps_and_on_time_within_five_long_steps() -> None:
    ends = [60.0 + 40 * k for k in range(12)]  # 40 s steps ending at 60, 100, 140, ...
    truth = _truth("straggler-compute", whatif=40.0, start=100, end=600)
    fast = _run("f", [truth], [_diag(250, phase="compute")], step_ends=ends, duration=700)
    fifth = _run("s", [truth], [_diag(330, phase="compute")], step_ends=ends, duration=700)
    slow = _run("s", [truth], [_diag(350, phase="compute")], step_ends=ends, duration=700)
    a = ev.score([fast]).classes["straggler-compute"]
    b = ev.score([fifth]).classes["straggler-compute"]
    c = ev.score([slow]).classes["straggler-compute"]
    assert a.latency_steps == [3] and a.on_time == 1  # steps ended at 140, 180, 220; 150 s <= 5 x 40 s
    # ... 260, 300: 230 s is more than 5 healthy steps, but only 5 of the job's steps had ended
    assert b.latency_steps == [5] and b.on_time == 1
    assert c.latency_steps == [6] and c.on_time == 0  # ... 340: the sixth


def test_cost_is_read_from_the_incidents_last_diagnosis_and_right_within_20_percent() -> None:
    truth = _truth("straggler-compute", lost=0.10)

    def run(cost: float | None) -> ev.ClassScore:
        diags = [_diag(105, phase="compute"), _diag(120, phase="compute", cost=0.5),  # an update mid-way
                 _diag(170, phase="compute", status="resolved", cost=cost)]
        return ev.score([_run("c", [truth], diags)]).classes["straggler-compute"]

    ok, off, none = run(0.115), run(0.13), run(None)
    assert (ok.cost_truths, ok.cost_right) == (1, 1) and ok.cost_errors == [pytest.approx(0.15)]
    assert (off.cost_truths, off.cost_right) == (1, 0) and off.cost_errors == [pytest.approx(0.3)]
    assert (none.cost_truths, none.cost_right, none.cost_errors) == (1, 0, [])
    low = ev.score([_run("c", [truth], [_diag(105, phase="compute"),
                                        _diag(170, phase="compute", status="resolved", cost=0.05)])])
    assert "cost 0.05 GPU-h, truth 0.1 (-50%)" in ev.format_details(low)
    assert "no cost given" in ev.format_details(ev.score([_run("c", [truth], [_diag(105, phase="compute")])]))


def test_a_fault_split_into_two_incidents_is_costed_as_their_sum() -> None:
    truth = _truth("transient-straggler", lost=0.2)
    diags = [_diag(105, phase="compute"), _diag(120, phase="compute", status="resolved", cost=0.09),
             _diag(125, phase="compute"), _diag(150, phase="compute", status="resolved", cost=0.1)]
    c = ev.score([_run("t", [truth], diags)]).classes["transient-straggler"]
    assert c.cost_right == 1 and c.cost_errors == [pytest.approx(0.05)]


def test_an_older_class_is_wrong_only_when_its_phase_label_is_wrong() -> None:
    truth = {**_truth("gpu-thermal", culprit="node-03 gpu 2", kind="gpu", ranks=(18,),
                      cause="gpu.thermal-throttle"), "gpu_hours_lost": 0.0}
    for labels, ok in (({}, 1), ({"phase": "compute"}, 1), ({"phase": "communication"}, 0)):
        d = _diag(105, cause="gpu.thermal-throttle", gpu="node-03/gpu2", **labels)
        c = ev.score([_run("g", [truth], [d])]).classes["gpu-thermal"]
        assert c.root_cause_ok == ok and c.cost_truths == 0  # no cost truth, no cost scored


def test_every_class_must_give_its_cost_where_the_truth_lost_time() -> None:
    truth = {**_truth("gpu-thermal", culprit="node-03 gpu 2", kind="gpu", ranks=(18,),
                      cause="gpu.thermal-throttle"), "gpu_hours_lost": 0.1}
    d = _diag(105, cause="gpu.thermal-throttle", gpu="node-03/gpu2")
    rep = ev.score([_run("g", [truth], [d])])
    c = rep.classes["gpu-thermal"]
    assert (c.cost_truths, c.cost_right) == (1, 0)
    assert "no cost given (truth 0.1 GPU-h)" in ev.format_details(rep)


def test_the_table_shows_steps_on_time_and_cost_columns() -> None:
    rep = ev.score([_run("a", [_truth("straggler-compute")],
                         [_diag(105, phase="compute"), _diag(170, status="resolved", phase="compute", cost=0.1)],
                         step_ends=[101.0, 102.0, 103.0])])
    table = ev.format_table(rep)
    assert "steps" in table and "cost ok" in table
    row = next(line for line in table.splitlines() if line.startswith("straggler-compute"))
    assert row.split()[-4:] == ["3", "1.00", "1.00", "0%"]
