"""The accuracy benchmark's scorer and suite (simulate.eval) and the `whywait eval` command."""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

import pytest
from whywait.engine.commands import eval_cmd
from whywait.simulate import eval as ev

RULES = Path(__file__).resolve().parents[2] / "rules"
S = ev.START


def _truth(fault: str, cause: str, culprit: str, kind: str, start: float = 100, end: float = 160,
           job: str = "train-llm", ranks: tuple[int, ...] = ()) -> dict[str, Any]:
    return {"fault": fault, "cause": cause, "culprit": culprit, "culprit_kind": kind, "job": job,
            "start": S + start, "end": S + end, "ranks": list(ranks)}


def _diag(rule: str, cause: str, at: float, culprit: str | None = None, job: str = "train-llm",
          status: str = "firing", labels: dict[str, str] | None = None,
          evidence: list[dict[str, Any]] | None = None) -> dict[str, Any]:
    return {"rule_id": rule, "fingerprint": f"{rule}|{culprit}|{(labels or {}).get('gpu', '')}", "status": status,
            "job": job, "culprit": culprit, "detected_at": S + at, "labels": {"cause": cause, **(labels or {})},
            "evidence": evidence or []}


def _run(name: str, classes: tuple[str, ...], truths: list[dict[str, Any]], diags: list[dict[str, Any]],
         duration: float = 200, placement: dict[int, tuple[str, int]] | None = None) -> ev.ScenarioRun:
    sc = ev.EvalScenario(name, classes, {"duration_s": duration})
    return ev.ScenarioRun(sc, truths, diags, {"train-llm": placement or {18: ("node-03", 2)}},
                          messages=100, seconds=0.1)


def test_suite_covers_every_class_on_several_shapes_pairs_and_four_hours_fault_free() -> None:
    suite = ev.build_suite()
    for cls in ev.FAULT_CLASSES:
        mine = [s for s in suite if s.classes == (cls,)]
        assert len(mine) >= 6, cls
        assert len({s.name.split("/")[1] for s in mine}) >= (1 if cls == "contention" else 3), cls
    assert all(s.spec["jobs"][1]["project"] != s.spec["jobs"][0]["project"]
               for s in suite if s.classes == ("contention",))
    assert sum(1 for s in suite if len(s.classes) == 2) >= 4
    free = [s for s in suite if s.fault_free]
    assert sum(s.spec["duration_s"] for s in free) == pytest.approx(4 * 3600)
    # The false-alarm hours include mixed hardware, half the ranks slow since the start, long steps and pipelines.
    jobs = [s.spec["jobs"][0] for s in free]
    assert any(j.get("slow_nodes") and len(j["slow_nodes"]) * 2 == len(j["nodes"]) for j in jobs)
    assert any(j.get("slow_nodes") and len(j["slow_nodes"]) * 2 < len(j["nodes"]) for j in jobs)
    assert any(j.get("step_s", 0) >= 30 for j in jobs) and any(j.get("pp", 1) > 1 for j in jobs)
    assert any(j.get("split") is False for j in jobs) and any(j.get("step_s") == 0.1 for j in jobs)
    # A fault on a job that shares a switch and a pool with another project's job.
    assert any(len(s.spec["jobs"]) == 2 and s.classes and s.classes[0] != "contention" for s in suite)


def test_straggler_classes_span_step_times_from_a_tenth_of_a_second_to_a_minute() -> None:
    suite = ev.build_suite()
    for cls in ev.STRAGGLER_CLASSES:
        steps = {s.spec["jobs"][0].get("step_s") for s in suite if s.classes == (cls,)}
        assert 0.1 in steps and max(x for x in steps if x) >= 30, cls
        for s in (s for s in suite if s.classes == (cls,)):
            f = s.spec["faults"][0]
            step = s.spec["jobs"][0].get("step_s") or ev.DEFAULT_STEP_S
            assert f["start"] >= 12 * step * 0.99  # a healthy history before the fault
            if cls == "transient-straggler":
                assert 20 <= f["end"] - f["start"] <= 90 or 5 <= (f["end"] - f["start"]) / step <= 20
            if cls == "stage-imbalance":
                assert s.spec["jobs"][0]["pp"] > 1
            if cls == "periodic-slowdown":
                assert (f["end"] - f["start"]) / f["params"]["period_s"] >= 3
        if cls in ("rotating-straggler", "periodic-slowdown"):  # slow in compute and in input, both
            assert {s.spec["faults"][0]["params"]["input"] for s in suite if s.classes == (cls,)} == {0.0, 1.0}


def test_quick_suite_is_small_and_deterministic() -> None:
    quick = ev.build_suite(quick=True)
    assert len(quick) < 40  # one scenario per class (30), three pairs, three fault-free runs
    assert {s.classes[0] for s in quick if s.classes} >= set(ev.STRAGGLER_CLASSES)
    assert [s.spec for s in quick] == [s.spec for s in ev.build_suite(quick=True)]


@pytest.mark.parametrize(("truth", "diag", "ok"), [
    (_truth("nic-packet-loss", "network.packet-loss", "node-03", "node"), {"culprit": "node-03"}, True),
    (_truth("nic-packet-loss", "network.packet-loss", "node-03", "node"), {"culprit": "node-04"}, False),
    (_truth("wrong-nic", "topology.wrong-nic", "node-03 gpu 3", "node"), {"culprit": "node-03"}, True),
    (_truth("gpu-thermal", "gpu.thermal-throttle", "node-03 gpu 2", "gpu"),
     {"culprit": "node-03", "labels": {"gpu": "node-03/gpu2"}}, True),
    (_truth("gpu-thermal", "gpu.thermal-throttle", "node-03 gpu 2", "gpu"),
     {"culprit": "node-03", "labels": {"gpu": "node-03/gpu1"}}, False),
    (_truth("rank-silent", "job.rank-hung", "job train-llm rank 18", "rank"), {"labels": {"rank": "18"}}, True),
    (_truth("rank-silent", "job.rank-hung", "job train-llm rank 18", "rank"),
     {"labels": {"gpu": "node-03/gpu2"}}, True),
    (_truth("rank-silent", "job.rank-hung", "job train-llm rank 18", "rank"), {"labels": {"rank": "17"}}, False),
    (_truth("uplink-oversubscribed", "network.uplink-oversubscribed", "leaf-01", "switch"),
     {"labels": {"switch": "leaf-01"}}, True),
    (_truth("storage-slow", "storage.pool-slow", "scratch", "pool"),
     {"evidence": [{"metric": "topology", "entity": "scratch"}]}, True),
    (_truth("storage-slow", "storage.pool-slow", "scratch", "pool"),
     {"evidence": [{"metric": "storage.read_latency_ms", "entity": "scratch"}]}, False),
    (_truth("contention", "contention.storage", "batch-etl", "job"),
     {"evidence": [{"metric": "topology", "entity": "batch-etl"}]}, True),
    (_truth("whole-job-slow", "job.slow-everywhere", "train-llm", "job"), {"job": "train-llm"}, True),
])
def test_culprit_matches_at_the_truths_kind(truth: dict[str, Any], diag: dict[str, Any], ok: bool) -> None:
    d = {"job": "train-llm", "culprit": None, "labels": {}, "evidence": [], **diag}
    assert ev.culprit_matches(d, truth, {18: ("node-03", 2)}) is ok


def test_score_counts_recall_precision_root_cause_latency_and_fault_free() -> None:
    runs = [
        # Detected at +6 s with the right culprit.
        _run("a", ("nic-packet-loss",), [_truth("nic-packet-loss", "network.packet-loss", "node-03", "node")],
             [_diag("network.straggler-retransmits", "network.packet-loss", 106, "node-03"),
              _diag("network.straggler-retransmits", "network.packet-loss", 130, "node-03", status="resolved")]),
        # Right cause, wrong node: detected (recall) but not the root cause; a false diagnosis before the fault.
        _run("b", ("nic-packet-loss",), [_truth("nic-packet-loss", "network.packet-loss", "node-03", "node")],
             [_diag("gpu.thermal-throttle", "gpu.thermal-throttle", 50, "node-01", labels={"gpu": "node-01/gpu0"}),
              _diag("network.straggler-retransmits", "network.packet-loss", 110, "node-05")]),
        # Missed.
        _run("c", ("nic-packet-loss",), [_truth("nic-packet-loss", "network.packet-loss", "node-03", "node")], []),
    ]
    rep = ev.score(runs)
    nic = rep.classes["nic-packet-loss"]
    assert (nic.truths, nic.detected, nic.root_cause_ok) == (3, 2, 1)
    assert nic.recall == pytest.approx(2 / 3) and nic.rca == pytest.approx(1 / 3)
    assert nic.precision == 1.0 and nic.latencies == [6.0, 10.0]
    assert rep.classes["gpu-thermal"].precision == 0.0  # its only diagnosis matched no thermal fault
    assert len(rep.fault_free_diagnoses) == 1 and rep.fault_free_s == pytest.approx(300)
    assert "overall" in ev.format_table(rep) and "node-05" in ev.format_details(rep)


def test_a_wrong_first_diagnosis_costs_root_cause_accuracy() -> None:
    run = _run("x", ("gpu-thermal",), [_truth("gpu-thermal", "gpu.thermal-throttle", "node-03 gpu 2", "gpu")],
               [_diag("job.whole-job-slow", "job.slow-everywhere", 104),
                _diag("gpu.thermal-throttle", "gpu.thermal-throttle", 106, "node-03", labels={"gpu": "node-03/gpu2"})])
    s = ev.score([run]).classes["gpu-thermal"]
    assert (s.detected, s.root_cause_ok) == (1, 0)


def test_hardware_classes_target_a_node_or_one_gpu_with_drawn_severity() -> None:
    suite = ev.build_suite()
    for cls in ev.HW_CLASSES:
        faults = [f for s in suite if cls in s.classes for f in s.spec["faults"] if f["fault"] == cls]
        assert len(faults) >= 7, cls
        gpu_target = [":gpu" in f["target"] for f in faults]
        assert all(gpu_target) if cls in ("pcie-downgrade", "gpu-nvml-hang") else not any(gpu_target), cls
        for k in ev._SEVERITY.get(cls, {}):  # severity varies between scenarios, not fixed at the default
            assert len({f["params"][k] for f in faults}) > 1, (cls, k)
    widths = {f["params"]["width"] for s in suite for f in s.spec.get("faults", ()) if f["fault"] == "pcie-downgrade"}
    assert widths == {4.0, 8.0}
    assert all(f["params"]["every_s"] == int(f["params"]["every_s"])
               for s in suite for f in s.spec.get("faults", ()) if f["fault"] == "kernel-mce")
    # A hardware fault beside an older class's fault on another node of the job.
    pairs = [s for s in suite if len(s.classes) == 2 and s.classes[0] in ev.HW_CLASSES]
    assert len(pairs) == len(ev.HW_PAIRS)
    assert all(len({f["target"].split(":")[0] for f in s.spec["faults"]}) == 2 for s in pairs)


def test_adding_the_hardware_classes_left_the_older_scenarios_as_they_were(monkeypatch: Any) -> None:
    with_hw = [s for s in ev.build_suite() if not set(s.classes) & set(ev.HW_CLASSES)]
    monkeypatch.setattr(ev, "FAULT_CLASSES", tuple(c for c in ev.FAULT_CLASSES if c not in ev.HW_CLASSES))
    monkeypatch.setattr(ev, "HW_PAIRS", ())
    assert [(s.name, s.spec) for s in ev.build_suite()] == [(s.name, s.spec) for s in with_hw]


def test_a_hardware_fault_is_found_through_the_simulated_hw_reports() -> None:
    from whywait.engine.rules.loader import load_rules

    sc = next(s for s in ev.build_suite(quick=True) if s.classes == ("pcie-downgrade",))
    run = ev.run_scenario(load_rules([RULES]), sc)
    s = ev.score([run]).classes["pcie-downgrade"]
    assert (s.truths, s.detected, s.root_cause_ok, s.false_diagnoses) == (1, 1, 1, 0)


def test_run_scenario_through_the_shipped_rules() -> None:
    from whywait.engine.rules.loader import load_rules

    sc = next(s for s in ev.build_suite(quick=True) if s.classes == ("gpu-ecc-xid",))
    run = ev.run_scenario(load_rules([RULES]), sc)
    rep = ev.score([run])
    assert rep.classes["gpu-ecc-xid"].root_cause_ok == 1
    assert rep.classes["gpu-ecc-xid"].latency_median is not None and rep.classes["gpu-ecc-xid"].latency_median <= 10


def test_eval_command_prints_the_table_and_writes_json_and_plot(tmp_path: Path, capsys: Any) -> None:
    p = argparse.ArgumentParser()
    eval_cmd.register(p)
    args = p.parse_args(["--rules", str(RULES), "--quick", "--only", "link-flap", "--workers", "1",
                         "--json", str(tmp_path / "e.json"), "--plot", str(tmp_path / "e.png")])
    rc = eval_cmd.run(args)
    out = capsys.readouterr().out
    assert "link-flap" in out and "fault-free" in out
    data = json.loads((tmp_path / "e.json").read_text())
    assert data["classes"]["link-flap"]["recall"] == 1.0
    assert (tmp_path / "e.png").stat().st_size > 1000
    assert rc in (0, 1)


def test_only_runs_the_classes_asked_for_and_fault_free_zero_runs_no_fault_free_scenario() -> None:
    """`eval --quick --only nic-packet-loss --fault-free 0` also showed cpu-bound-loader and pcie-downgrade (the
    pairs that include nic-packet-loss), and --quick ignored --fault-free."""
    only = ev.build_suite(quick=True, classes=["nic-packet-loss"], fault_free_s=0)
    assert [s.name for s in only] == ["nic-packet-loss/8n/0"]
    both = ev.build_suite(quick=True, classes=["nic-packet-loss", "cpu-bound-loader"], fault_free_s=0)
    assert {c for s in both for c in s.classes} == {"nic-packet-loss", "cpu-bound-loader"}
    assert "pair:nic-packet-loss+cpu-bound-loader/8n" in [s.name for s in both]
    assert ev.build_suite(quick=True, classes=["fault-free"], fault_free_s=0) == []
    free = ev.build_suite(quick=True, classes=["fault-free"], fault_free_s=1800)
    assert free and all(s.fault_free for s in free) and sum(s.spec["duration_s"] for s in free) == 1800
    assert sum(s.spec["duration_s"] for s in ev.build_suite(quick=True, classes=["fault-free"])) == 600


def test_fault_free_time_says_how_much_came_from_fault_free_scenarios() -> None:
    runs = [_run("a", ("nic-packet-loss",), [_truth("nic-packet-loss", "network.packet-loss", "node-03", "node")],
                 []),
            _run("fault-free/plain/8n", (), [], [], duration=400)]
    rep = ev.score(runs)
    lead_in = 100 - ev.WARMUP_S
    free = 400 - ev.WARMUP_S
    assert rep.fault_free_s == pytest.approx(lead_in + free) and rep.fault_free_scenarios_s == pytest.approx(free)
    assert (f"diagnoses during {(lead_in + free) / 3600:.2f} h of fault-free simulated time ({free / 3600:.2f} h in "
            f"fault-free scenarios, {lead_in / 3600:.2f} h before the faults of the others): 0") in ev.format_table(rep)
    assert list(ev.score(runs[:1]).classes) == ["nic-packet-loss"]
