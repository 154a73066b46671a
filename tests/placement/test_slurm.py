"""Slurm: a job's facts from recorded `scontrol show job -d --json` (23.02 and 24.05 shapes) and its environment."""

from __future__ import annotations

import json

import pytest
from whywait.engine.placement.model import Owner, PlacementError, placement_message
from whywait.engine.placement.slurm import facts_from_env, facts_from_scontrol, gpu_indexes

from tests.placement.conftest import FIX


def test_slurm_23_02_job_record() -> None:
    f = facts_from_scontrol((FIX / "scontrol-show-job-23.02.json").read_text(), "4242")
    assert f.job == "slurm-4242" and f.user == "alice" and f.account == "llm-pretrain"
    assert f.nodes == (("a08-p1-dgx-04-c01", tuple(range(8))), ("a08-p1-dgx-04-c02", tuple(range(8))))
    ranks = f.rank_list()
    assert len(ranks) == 16 and ranks[9] == {"rank": 9, "node": "a08-p1-dgx-04-c02", "gpu": 1}


def test_slurm_24_05_array_task_on_half_a_node() -> None:
    f = facts_from_scontrol((FIX / "scontrol-show-job-24.05.json").read_text(), env={"SLURM_JOB_ID": "4314"})
    assert f.job == "slurm-4311_3" and f.user == "bob" and f.account == "vision"
    assert f.nodes == (("a06-p1-dgx-02-c18", (4, 5, 6, 7)),)


@pytest.mark.parametrize("detail,want", [
    ("gpu:h100:8(IDX:0-7)", tuple(range(8))), ("gpu:4(IDX:0-2,5)", (0, 1, 2, 5)),
    ("gpu:a100:2(IDX:0,2),gpu:v100:1(IDX:4),mps:10", (0, 2, 4)), ("gpu:0(IDX:)", ()), ("mps:100", ())])
def test_gres_detail(detail: str, want: tuple[int, ...]) -> None:
    assert gpu_indexes(detail) == want


def test_bad_outputs_are_one_line_naming_the_source() -> None:
    with pytest.raises(PlacementError, match=r"^out.json:1: not valid JSON"):
        facts_from_scontrol("{oops", "1", source="out.json")
    with pytest.raises(PlacementError, match=r"job 99 is not in the output \(jobs: 4242\)"):
        facts_from_scontrol((FIX / "scontrol-show-job-23.02.json").read_text(), "99")
    err = json.dumps({"jobs": [], "errors": [{"error": "Invalid job id specified"}]})
    with pytest.raises(PlacementError, match="Invalid job id specified"):
        facts_from_scontrol(err, "1")


def test_epilog_needs_only_the_environment() -> None:
    f = facts_from_env({"SLURM_JOB_ID": "4242", "SLURM_JOB_USER": "alice"}, finished=True)
    msg = placement_message(f, Owner("llm", "pretraining", "#llm"), 1.0, "slurmctld")
    assert msg["state"] == "finished" and msg["job"] == "slurm-4242" and msg["ranks"] == []
    with pytest.raises(PlacementError, match="SLURM_JOB_ID is not set"):
        facts_from_env({}, finished=True)


def test_a_job_without_gpus_is_not_placed() -> None:
    f = facts_from_env({"SLURM_JOB_ID": "7", "SLURM_JOB_NODELIST": "cpu[1-2]"}, finished=False)
    with pytest.raises(PlacementError, match="job slurm-7: no GPU is allocated to it"):
        placement_message(f, Owner("p", "t", None), 1.0, "slurmctld")


def test_the_job_name_rides_with_the_placement_and_the_alert_shows_it() -> None:
    # Users know their jobs by --job-name, not slurm-4242: the placement carries it, the alert shows both.
    from pathlib import Path

    from whywait.engine.evaluate.evaluator import Evaluator
    from whywait.engine.notify.render import plain_text
    from whywait.engine.rules.loader import load_rules
    from whywait.simulate import Simulation, make_fault
    from whywait.simulate.cluster import make_cluster, make_job

    f = facts_from_scontrol((FIX / "scontrol-show-job-23.02.json").read_text(), "4242")
    assert f.name == "pretrain-7b"
    assert facts_from_env({"SLURM_JOB_ID": "9", "SLURM_JOB_NAME": "eval\x1b[31m-run"}, True).name == "eval[31m-run"
    assert facts_from_env({"SLURM_JOB_ID": "9"}, True).name is None
    assert placement_message(f, Owner("llm", "pretraining", None), 1.0, "ctl")["name"] == "pretrain-7b"
    # Through the evaluator: a job placed with its name, whose node-03 agent stops.
    topo = make_cluster(nodes=4)
    sim = Simulation(topo, [make_job(topo, job="slurm-4242")], [make_fault("agent-down", "node-03", 60, 120)],
                     start_time=1_700_000_000.0, duration_s=120, seed=1)
    ev = Evaluator(load_rules([Path(__file__).resolve().parents[2] / "rules"]), topo)
    diags = []
    for _, m in sim.messages():
        diags += ev.ingest({**m, "name": "pretrain-7b"} if m["kind"] == "placement" else m)
    [d] = [d for d in diags if d.rule_id == "job.node-unseen" and d.status == "firing"]
    assert d.labels["job_name"] == "pretrain-7b"
    assert "Job: slurm-4242 (pretrain-7b)" in plain_text(d)
