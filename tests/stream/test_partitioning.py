"""The partitioned pipeline's pure parts: routing, ownership, per-job checkpoints, event-time order."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import pytest
from whywait.engine.stream.partitioning import (
    HeldOffsets,
    OwnedTopology,
    ReorderBuffer,
    drop_jobs,
    job_of_entity,
    partition_for,
    routes,
    split_snapshot,
)

SCENARIO = """\
seed: 1
duration_s: 3
cluster: {nodes: 16}
jobs:
- {job: train-llm, project: llm, team: ml-platform, nodes: node-01..node-06}
- {job: etl-d, project: etl, team: data-eng, nodes: node-07..node-08}
- {job: job-e, project: vision, team: cv, nodes: node-09..node-12}
- {job: same-proj, project: llm, team: ml-platform, nodes: node-13..node-14}
"""


@pytest.fixture
def sim(tmp_path: Path) -> Any:
    from whywait.simulate.scenario import load_scenario
    from whywait.simulate.sim import Simulation

    p = tmp_path / "s.yaml"
    p.write_text(SCENARIO)
    sc = load_scenario(p)
    sim = Simulation(sc.topology, sc.jobs, [], start_time=1e9, duration_s=30, interval_s=1, seed=1)
    sim.msgs = [m for _, m in sim.messages()]  # type: ignore[attr-defined]  # one pass: it is a generator
    return sim


@pytest.fixture
def topo(sim: Any, tmp_path: Path) -> Any:
    from whywait.topology.model import Topology

    sim.topology.to_yaml(tmp_path / "t.yaml")
    t = Topology.from_yaml(tmp_path / "t.yaml")
    for m in sim.msgs:
        if m["kind"] == "placement":
            t.apply_placement(m)
    return t


def first(sim: Any, kind: str, node: str | None = None) -> dict[str, Any]:
    return next(m for m in sim.msgs if m["kind"] == kind and (node is None or m.get("node") == node))


def test_partition_is_stable_and_in_range() -> None:
    assert partition_for("train-llm", 4) == partition_for("train-llm", 4) == 0  # CRC-32: same in every process
    assert {partition_for(f"job-{i}", 7) for i in range(200)} == set(range(7))
    assert partition_for("anything", 1) == 0


def test_node_telemetry_goes_to_its_jobs_partition(sim: Any, topo: Any) -> None:
    msg = first(sim, "gpu", "node-10")
    assert routes(msg, topo, 4) == {partition_for("job-e", 4): "job-e"}


def test_steps_go_to_their_job_and_placements_nowhere(sim: Any, topo: Any) -> None:
    steps = first(sim, "steps")
    assert routes(steps, topo, 4) == {partition_for(steps["job"], 4): steps["job"]}
    assert routes(first(sim, "placement"), topo, 4) == {}


def test_a_jobless_node_is_keyed_by_its_own_name(sim: Any, topo: Any) -> None:
    msg = dict(first(sim, "host", "node-10"), node="node-16")  # node-16 runs no job
    assert routes(msg, topo, 4) == {partition_for("node-16", 4): "node-16"}


def test_storage_of_a_job_is_copied_to_other_projects_sharing_its_pool(sim: Any, topo: Any) -> None:
    msg = first(sim, "storage", "node-07")  # etl-d's node; every node mounts the shared pool
    where = routes(msg, topo, 64)
    jobs = set(where.values())
    assert {"etl-d", "train-llm", "job-e"} <= jobs
    # a job of the *same* project as the node's job gets no copy for contention (host: no copies at all)
    assert routes(first(sim, "host", "node-07"), topo, 64) == {partition_for("etl-d", 64): "etl-d"}
    llm = routes(first(sim, "storage", "node-01"), topo, 64)
    assert "same-proj" not in llm.values() or partition_for("same-proj", 64) == partition_for("train-llm", 64)


def test_copies_are_one_per_partition(sim: Any, topo: Any) -> None:
    msg = first(sim, "storage", "node-07")
    assert len(routes(msg, topo, 2)) <= 2
    assert len(routes(msg, topo, 1)) == 1


def test_owned_topology_evaluates_only_its_jobs(topo: Any) -> None:
    owned = OwnedTopology(topo, 4)
    assert owned.jobs() == ()  # no assignment yet: evaluates nothing
    owned.owned = frozenset({partition_for("job-e", 4)})
    assert "job-e" in [j.job for j in owned.jobs()]
    assert all(partition_for(j.job, 4) in owned.owned for j in owned.jobs())
    assert owned.has_job("etl-d") and owned.leaf_of("node-01") == topo.leaf_of("node-01")  # the rest is whole


def test_snapshot_splits_by_job(topo: Any) -> None:
    inc = {"rule_id": "r", "fingerprint": "fp1", "labels": {"job": "job-e"}, "pending_since": 1.0, "last_true": 2.0,
           "firing": True, "announced": True, "last": None, "cost_lost_s": 0.0, "cost_until": None}
    other = dict(inc, fingerprint="fp2", labels={"job": "etl-d"})
    snap = {"incidents": [inc, other], "counted_until": {"fp1": 5.0, "fp2": 6.0},
            "cond_state": [[["r", 3, "node-10"], 1.5], [["r", 3, "job-e", 4], 2.5], [["r", 3, "node-07/gpu0"], 9.0],
                           [["r", 3, "job-e:7"], 3.5]]}
    parts = split_snapshot(json.loads(json.dumps(snap)), topo, ["job-e", "etl-d", "job-a"])
    assert [i["fingerprint"] for i in parts["job-e"]["incidents"]] == ["fp1"]
    assert parts["job-e"]["counted_until"] == {"fp1": 5.0}
    assert sorted(v for _, v in parts["job-e"]["cond_state"]) == [1.5, 2.5, 3.5]
    assert [v for _, v in parts["etl-d"]["cond_state"]] == [9.0]
    assert parts["job-a"] == {"incidents": [], "cond_state": [], "counted_until": {}}
    assert job_of_entity(42, {}) is None


def test_dropping_lost_jobs_does_not_resolve_them() -> None:
    class Inc:
        def __init__(self, job: str) -> None:
            self.labels = {"job": job}

    class Ev:
        incidents = {"a": Inc("job-e"), "b": Inc("etl-d")}

    ev = Ev()
    assert drop_jobs(ev, lambda j: j == "job-e") == 1
    assert list(ev.incidents) == ["a"]


def test_reorder_buffer_waits_for_every_partitions_steady_kinds() -> None:
    buf = ReorderBuffer({"net", "steps"})
    buf.push("net-0@10", 10.0, "net", 0.0, partition=0)
    buf.push("steps-0@5", 5.0, "steps", 0.0, partition=0)
    buf.push("net-1@30", 30.0, "net", 0.0, partition=1)  # a sparse partition runs ahead in event time
    assert buf.release(0.1, backlog=True) == ["steps-0@5"]  # partition 0's steps are at 5
    buf.push("steps-0@12", 12.0, "steps", 0.2, partition=0)
    assert buf.release(0.3, backlog=True) == ["net-0@10"]
    # live (no backlog): a kind that went quiet is not waited for, and nothing is held for long
    assert buf.release(10.0, backlog=False) == ["steps-0@12", "net-1@30"]
    assert len(buf) == 0


def test_reorder_buffer_does_not_wait_for_a_hung_jobs_steps_on_a_backlog() -> None:
    buf = ReorderBuffer({"net", "steps"}, idle_event_s=60)
    buf.push("steps@1", 1.0, "steps", 0.0)
    for t in range(2, 100):
        buf.push(f"net@{t}", float(t), "net", 10.0)
    out = buf.release(10.0, backlog=True)
    assert out[0] == "steps@1" and out[-1] == "net@99"  # steps 98 s behind: idle, not waited for


def test_reorder_buffer_waits_for_an_input_another_worker_still_routes() -> None:
    # Live here (no backlog on this worker), so held records would go after max_hold_s; but another
    # worker's router says the steps partition it reads has records left, routed up to t=5 so far.
    buf = ReorderBuffer({"net", "steps"}, stale_s=30)
    buf.progress("whywait.steps.v1/2", 5.0, 400, wall=0.0)
    buf.push("net@4", 4.0, "net", 0.0)
    buf.push("net@9", 9.0, "net", 0.0)
    assert buf.release(10.0, backlog=False) == ["net@4"]  # not past what that router has routed
    buf.progress("whywait.steps.v1/2", 12.0, 0, wall=10.5)  # it caught up
    assert buf.release(11.0, backlog=False) == ["net@9"]


def test_reorder_buffer_forgets_a_router_that_went_silent() -> None:
    buf = ReorderBuffer({"net"}, stale_s=30)
    buf.progress("whywait.net.v1/0", float("-inf"), 10, wall=0.0)  # read nothing yet, records waiting
    buf.push("net@1", 1.0, "net", 0.0)
    assert buf.release(5.0, backlog=False) == []
    assert buf.release(31.0, backlog=False) == ["net@1"]  # its partitions went to a worker that says anew


def test_reorder_buffer_is_bounded() -> None:
    buf = ReorderBuffer({"net", "steps"}, max_records=10)
    buf.push("s", 0.0, "steps", 0.0)
    for t in range(20):
        buf.push(t, 1.0 + t, "net", 0.0)
    assert len(buf.release(0.0, backlog=True)) >= 11 and len(buf) <= 10


def test_the_evaluate_stage_commits_only_up_to_the_oldest_record_it_still_holds() -> None:
    from collections import namedtuple

    Rec = namedtuple("Rec", "partition offset")
    held = HeldOffsets()
    assert held.commit_point(0) is None
    held.received(0, 0, True)
    held.received(0, 1, False)  # a progress marker: nothing to evaluate
    held.received(0, 2, True)
    held.received(1, 0, True)
    held.received(0, 3, True)
    assert held.commit_point(0) == 0 and held.commit_point(1) == 0 and held.held() == 4
    # Released in event-time order, not offset order: offset 2 first, then 0.
    assert held.released([Rec(0, 2)]) == {0}
    assert held.commit_point(0) == 0  # 0 is still held: an evaluated 2 commits nothing yet
    held.released([Rec(0, 0), Rec(1, 0)])
    assert held.commit_point(0) == 3 and held.commit_point(1) == 1
    held.released([Rec(0, 3)])
    assert held.commit_point(0) == 4 and held.held() == 0
    held.received(0, 4, False)
    assert held.commit_point(0) == 5


def test_router_counts_every_record_once_and_dead_letters_at_the_door(sim: Any, topo: Any) -> None:
    from whywait.agents.events import TOPIC_GPU, TOPIC_PLACEMENT, TOPIC_STORAGE
    from whywait.engine.evaluate.evaluator import Evaluator
    from whywait.engine.rules.loader import RuleSet
    from whywait.engine.stream.processor import Processor, Record

    proc = Processor(Evaluator(RuleSet({}), OwnedTopology(topo, 4)))
    gpu = first(sim, "gpu", "node-10")
    storage = first(sim, "storage", "node-07")
    recs = [Record(TOPIC_GPU, json.dumps(gpu).encode(), None, 0, 1, 123),
            Record(TOPIC_STORAGE, json.dumps(storage).encode(), None, 0, 2),
            Record(TOPIC_GPU, b"{not json", None, 0, 3),
            Record(TOPIC_GPU, json.dumps(dict(gpu, node="node-999")).encode(), None, 0, 4),
            Record(TOPIC_PLACEMENT, json.dumps(first(sim, "placement")).encode(), None, 0, 5),
            Record(TOPIC_PLACEMENT, None, None, 0, 6)]
    out = proc.route(recs, 4)
    c = proc.counts
    assert c["route.records"] == 6
    assert (c["route.forwarded"], c["route.placements"], c["route.tombstones"], c["dead_letters"]) == (2, 1, 1, 2)
    assert {json.loads(v)["category"] for _, v in out.dead_letters} == {"contract", "unknown_node"}
    part, key, value, t_ms, topic, produced, src = out.forwards[0]
    assert (part, key, topic, produced, src) == (partition_for("job-e", 4), b"job-e", TOPIC_GPU, 123, None)
    assert t_ms == int(gpu["time"] * 1000) and value == recs[0].value
    copies = [f for f in out.forwards if f[4] == TOPIC_STORAGE]
    assert len(copies) == c["route.copies"] - 1 >= 1
    if len(copies) > 1:  # copies name their source so a worker owning two of them ingests it once
        assert {f[6] for f in copies} == {f"{TOPIC_STORAGE}/0/2"}


def test_partitions_and_replication_are_checked() -> None:
    from whywait.engine.commands.engine_cmd import _count
    from whywait.engine.errors import ConfigError
    from whywait.engine.stream.topics import env_int

    assert env_int("WHYWAIT_PARTITIONS", 1, {"WHYWAIT_PARTITIONS": "6"}) == 6
    assert env_int("WHYWAIT_PARTITIONS", 1, {}) == 1
    for bad in ("0", "-2", "six"):
        with pytest.raises(ConfigError, match="WHYWAIT_PARTITIONS must be a whole number >= 1"):
            env_int("WHYWAIT_PARTITIONS", 1, {"WHYWAIT_PARTITIONS": bad})
    with pytest.raises(ConfigError, match="--partitions must be a whole number >= 1"):
        _count(0, "--partitions", "WHYWAIT_PARTITIONS")
    assert _count(3, "--partitions", "WHYWAIT_PARTITIONS") == 3


def test_notifier_topic_names_match_the_notifier() -> None:
    from whywait.engine.notify.silences import SILENCES_TOPIC
    from whywait.engine.notify.state import STATE_TOPIC
    from whywait.engine.stream.topics import TOPIC_NOTIFY_STATE, TOPIC_SILENCES

    assert (TOPIC_NOTIFY_STATE, TOPIC_SILENCES) == (STATE_TOPIC, SILENCES_TOPIC)


def test_a_worker_adopts_the_incident_another_worker_announced() -> None:
    """Failover: the notifier of the worker that gains a job takes the other's incident record (its Slack
    receipt), so the next finding of the same fingerprint updates that incident instead of opening one."""
    from whywait.engine.diagnosis import Diagnosis, Owner
    from whywait.engine.notify.pipeline.config import PipelineConfig
    from whywait.engine.notify.pipeline.incidents import IncidentBook

    d = Diagnosis(rule_id="network.straggler-retransmits", fingerprint="fp-job-e", status="firing",
                  severity="warning", title="job-e waits on node-10", cause="loss", job="job-e",
                  owner=Owner("vision", "cv", "#cv"), starts_at=100.0, detected_at=105.0, next_step="x",
                  confidence=0.9)
    first = IncidentBook(PipelineConfig())
    inc = first.observe(d, 1000.0)
    assert inc is not None
    inc.receipts["slack"] = {"channel_id": "C1", "ts": "1.000"}
    record = json.loads(json.dumps(inc.to_dict()))
    survivor = IncidentBook(PipelineConfig())
    assert survivor.adopt({inc.key: record, "damaged": {"nonsense": 1}}) == 1
    assert survivor.key_for(d) == inc.key
    again = survivor.observe(d, 1010.0)
    assert again is not None and again.receipts["slack"]["ts"] == "1.000"
    assert survivor.adopt({inc.key: record}) == 0  # what it holds already is left as it is


def test_a_console_worker_adopts_nothing_and_prints_the_incident() -> None:
    """A console-only worker keeps its state in memory and never writes the state topic: what is there came
    from other runs' receivers (an Alertmanager run left the incident firing).  Adopting it marked the incident
    announced, so the console group never printed it; a worker with a shared state store still adopts."""
    import io

    from whywait.engine.diagnosis import Diagnosis, Owner
    from whywait.engine.notify.pipeline import Pipeline
    from whywait.engine.notify.pipeline.config import PipelineConfig
    from whywait.engine.notify.pipeline.incidents import IncidentBook
    from whywait.engine.notify.receivers.console import ConsoleReceiver
    from whywait.engine.notify.state import StateStore

    d = Diagnosis(rule_id="gpu.thermal-throttle", fingerprint="fp-job-t", status="firing", severity="warning",
                  title="job-t waits on node-03/gpu2", cause="hot", job="job-t", owner=Owner("llm", "ml", "#ml"),
                  starts_at=100.0, detected_at=105.0, next_step="x", confidence=0.9)
    other_run = IncidentBook(PipelineConfig())
    inc = other_run.observe(d, time.time())
    assert inc is not None
    inc.posted, inc.receipts["alertmanager"] = True, {"alerts": 1}
    record = json.loads(json.dumps(inc.to_dict()))
    cfg = PipelineConfig(group_wait=0.0)
    out = io.StringIO()
    with Pipeline([ConsoleReceiver(out)], cfg) as console:
        assert console.adopt({inc.key: record}) == 0
        console.notify(d)
        assert console.flush(5)
    assert "[FIRING · warning] job-t waits on node-03/gpu2" in out.getvalue()

    class Shared(StateStore):  # stands for the Kafka topic
        def load(self) -> dict[str, dict[str, Any]]:
            return {}

        def put(self, key: str, record: dict[str, Any]) -> None:
            pass

        def delete(self, key: str) -> None:
            pass

    with Pipeline([ConsoleReceiver(io.StringIO())], cfg, state_store=Shared()) as shared:
        assert shared.adopt({inc.key: record}) == 1


def test_router_counts_a_redelivered_record_apart(sim: Any, topo: Any) -> None:
    from whywait.agents.events import TOPIC_GPU
    from whywait.engine.evaluate.evaluator import Evaluator
    from whywait.engine.rules.loader import RuleSet
    from whywait.engine.stream.processor import Processor, Record

    proc = Processor(Evaluator(RuleSet({}), OwnedTopology(topo, 4)))
    value = json.dumps(first(sim, "gpu", "node-10")).encode()
    proc.route([Record(TOPIC_GPU, value, None, 1, 7), Record(TOPIC_GPU, value, None, 1, 8)], 4)
    out = proc.route([Record(TOPIC_GPU, value, None, 1, 8), Record(TOPIC_GPU, value, None, 1, 9)], 4)
    assert len(out.forwards) == 1
    assert (proc.counts["route.records"], proc.counts["route.redelivered"]) == (3, 1)


def test_reorder_buffer_holds_what_arrived_after_a_routers_last_nothing_left() -> None:
    # Another worker's router said at wall 0 it had routed its net partition with nothing left, its frontier at
    # t=10, then went quiet (its loop busy evaluating a backlog). Records that arrived here later may run far
    # ahead of what now waits in its partition: at --speed 0 this worker released them after max_hold_s, and a
    # node whose telemetry that router had not routed yet fired job.node-unseen (30 s of silence).
    buf = ReorderBuffer({"net"}, stale_s=30, quiet_event_s=10)
    buf.progress("whywait.net.v1/1", 10.0, 0, wall=0.0)
    for t in (8.0, 19.0, 50.0):
        buf.push(f"net@{t:.0f}", t, "net", 1.0)
    assert buf.release(5.0, backlog=False) == ["net@8", "net@19"]  # held past max_hold_s, yet not past 10 + 10
    assert buf.behind(5.0) == float("inf") and buf.behind(5.0, arrived=1.0) == 20.0
    buf.progress("whywait.net.v1/1", 52.0, 0, wall=5.5)  # it speaks again, caught up
    assert buf.release(6.0, backlog=False) == ["net@50"]
    # a router that has routed nothing (t -inf) and has nothing left bounds nothing, as before
    buf.progress("whywait.net.v1/1", float("-inf"), 0, wall=7.0)
    buf.push("net@90", 90.0, "net", 8.0)
    assert buf.release(10.5, backlog=False) == ["net@90"]
    # and a router gone silent for stale_s is not heard: what arrived after its word goes after all
    buf.progress("whywait.net.v1/1", 91.0, 0, wall=11.0)
    buf.push("net@200", 200.0, "net", 12.0)
    assert buf.release(20.0, backlog=False) == []
    assert buf.release(42.0, backlog=False) == ["net@200"]
