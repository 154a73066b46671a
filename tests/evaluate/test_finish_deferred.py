"""A job's 'finished' placement takes effect when the evaluator's ticks reach its time, not when it is read."""

from __future__ import annotations

from pathlib import Path

from whywait.engine.evaluate.evaluator import Evaluator
from whywait.engine.rules.loader import load_rules
from whywait.simulate import Simulation
from whywait.simulate.cluster import make_cluster, make_job

RULES = Path(__file__).resolve().parents[2] / "rules"
T0 = 1_700_000_000.0


def test_the_last_seconds_of_a_job_are_judged_with_the_job_still_placed() -> None:
    # An imported table (or a Slurm epilog) ends with 'finished' stamped just after the last step; the ticks
    # run the lateness behind the data, so the job used to be gone before its last seconds were judged.
    topo = make_cluster(nodes=2)
    sim = Simulation(topo, [make_job(topo)], [], start_time=T0, duration_s=30, seed=1)
    ev = Evaluator(load_rules([RULES]), topo)
    last = 0.0
    for _, m in sim.messages():
        ev.ingest(m)
        last = max(last, float(m["time"]))
    assert ev.topology.has_job("train-llm") and ev.next_tick is not None and ev.next_tick < last
    ev.ingest({"schema": 2, "kind": "placement", "time": last + 0.001, "node": "sched", "job": "train-llm",
               "project": "llm", "team": "ml-platform", "state": "finished", "ranks": []})
    assert ev.topology.has_job("train-llm")  # read, but not yet reached by the ticks
    ev.advance(last - 0.5)
    assert ev.topology.has_job("train-llm")
    ev.advance(last + 1.0)
    assert not ev.topology.has_job("train-llm")
    # a 'finished' at or before the ticks' time applies at once, as before
    ev.ingest({"schema": 2, "kind": "placement", "time": last + 1.5, "node": "sched", "job": "j2", "project": "p",
               "team": "t", "state": "running", "ranks": [{"rank": 0, "node": "node-01", "gpu": 0}]})
    assert ev.topology.has_job("j2")
    ev.ingest({"schema": 2, "kind": "placement", "time": last - 5, "node": "sched", "job": "j2", "project": "p",
               "team": "t", "state": "finished", "ranks": []})
    assert ev.topology.has_job("j2")  # older than the running one applied: the topology ignores it


def test_with_no_steps_waiting_a_finished_placement_applies_at_once() -> None:
    # A reader of placements alone (the placement hooks' end-to-end test) has no data to move its ticks: a
    # deferred 'finished' held the job for ever.
    topo = make_cluster(nodes=2)
    ev = Evaluator(load_rules([RULES]), topo)
    run = {"schema": 2, "kind": "placement", "time": T0, "node": "sched", "job": "j", "project": "p", "team": "t",
           "state": "running", "ranks": [{"rank": 0, "node": "node-01", "gpu": 0}]}
    ev.ingest(run)
    ev.ingest({**run, "time": T0 + 30, "state": "finished", "ranks": []})
    assert not ev.topology.has_job("j")
