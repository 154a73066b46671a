"""The simulator's healthy behaviour, its contract conformance, determinism and the nic-packet-loss fault."""

from __future__ import annotations

import statistics
import time

from whywait.agents.events import TOPIC_PLACEMENT, validate
from whywait.simulate.cluster import make_cluster, make_job
from whywait.simulate.faults import make_fault
from whywait.simulate.sim import Simulation

from tests.simulate.conftest import run_sim
from tests.simulate.support import START, by_rank, mean, net_field, of_kind, steps


def test_every_message_validates_and_time_never_goes_back(healthy, packet_loss):
    for _, msgs in (healthy, packet_loss):
        last = 0.0
        for topic, msg in msgs:
            validate(msg, topic)
            assert msg["time"] >= last
            last = msg["time"]


def test_placement_comes_first_and_matches_the_topology(healthy):
    sim, msgs = healthy
    topic, first = msgs[0]
    assert topic == TOPIC_PLACEMENT and first["state"] == "running"
    assert len(first["ranks"]) == 128
    assert sim.topology.job("train-llm").ranks[55] == ("node-07", 7)
    assert {r["node"] for r in first["ranks"]} == set(sim.topology.nodes())


def test_same_seed_same_messages_other_seed_different():
    a = run_sim(duration=20, seed=5)[1]
    b = run_sim(duration=20, seed=5)[1]
    c = run_sim(duration=20, seed=6)[1]
    assert a == b
    assert a != c


def test_each_node_reports_every_source_every_interval(healthy):
    sim, msgs = healthy
    for kind in ("gpu", "net", "storage", "host"):
        per_node = {n: 0 for n in sim.nodes}
        for m in of_kind(msgs, kind):
            per_node[m["node"]] += 1
        assert set(per_node.values()) == {240}, kind


def test_ranks_complete_about_one_step_per_second(healthy):
    _, msgs = healthy
    recs = [s for m in of_kind(msgs, "steps", 10, 110) for s in m["steps"]]
    per_rank = {}
    for s in recs:
        per_rank[s["rank"]] = per_rank.get(s["rank"], 0) + 1
    assert len(per_rank) == 128
    assert all(100 / 1.5 <= n <= 100 / 0.5 for n in per_rank.values())
    for s in recs:
        assert abs(s["duration_s"] - (s["data_wait_s"] + s["compute_s"] + s["comm_s"]
                                      + s.get("checkpoint_s", 0.0))) < 1e-3


def test_healthy_run_has_nothing_anomalous(healthy):
    sim, msgs = healthy
    retrans = [m["tcp_retrans_segs_per_s"] for m in of_kind(msgs, "net")]
    assert max(retrans) <= 2.0
    out_segs = statistics.median(m["tcp_out_segs_per_s"] for m in of_kind(msgs, "net"))
    assert 15000 < out_segs < 25000
    durations = [s["duration_s"] for s in steps(msgs, 5, 240)]
    med = statistics.median(durations)
    assert 0.5 < med < 1.5
    # Realistic noise: most steps within a few % of the median, a rare hiccup or GC pause above it.
    assert sorted(durations)[int(0.9 * len(durations))] / med < 1.1
    assert 0 < sum(d > 1.4 * med for d in durations) / len(durations) < 0.05
    comm = by_rank(steps(msgs, 5, 240), "comm_s")
    assert max(comm.values()) / statistics.median(comm.values()) < 1.15
    samples = [g for m in of_kind(msgs, "gpu") for g in m["gpus"]]
    for g in samples:
        assert 50 <= g["temp_c"] <= 72 and g["throttle_reasons"] == [] and g["xid"] == []
        assert g["ecc_uncorrected"] == 0
    assert statistics.median(g["util_pct"] for g in samples) > 90
    for m in of_kind(msgs, "net"):
        for c in m["nics"]:
            assert c["rx_drops_per_s"] == 0 and c["link_up"]


def test_checkpoints_start_and_end_periodically(healthy):
    _, msgs = healthy
    cps = of_kind(msgs, "checkpoint")
    assert [c["phase"] for c in cps] == ["start", "end"]
    assert cps[0]["checkpoint_id"] == cps[1]["checkpoint_id"]
    assert 5 < cps[1]["duration_s"] < 20 and cps[1]["bytes"] > 0
    assert 150 <= cps[0]["time"] - START < 152


def test_packet_loss_culprit_retransmits_jump_within_three_seconds(packet_loss):
    _, msgs = packet_loss
    peers = [n for n in (f"node-{i:02d}" for i in range(1, 17)) if n != "node-07"]
    peer_median = statistics.median(v for n in peers for v in net_field(msgs, "tcp_retrans_segs_per_s", n, 119, 123))
    culprit = net_field(msgs, "tcp_retrans_segs_per_s", "node-07", 120, 123)
    assert max(culprit) >= 50 * peer_median
    assert min(net_field(msgs, "tcp_retrans_segs_per_s", "node-07", 130, 200)) >= 50 * peer_median
    assert max(net_field(msgs, "tcp_retrans_segs_per_s", "node-07", 0, 120)) <= 2.0
    assert max(net_field(msgs, "tcp_retrans_segs_per_s", "node-07", 202, 240)) <= 2.0
    drops = [c["rx_drops_per_s"] for m in of_kind(msgs, "net", 125, 200) if m["node"] == "node-07"
             for c in m["nics"] if c["nic"] == "mlx5_0"]
    assert min(drops) > 0
    assert mean(net_field(msgs, "tcp_timeouts_per_s", "node-07", 125, 200)) > 5


def test_packet_loss_stretches_every_rank_and_makes_the_culprit_the_straggler(packet_loss):
    _, msgs = packet_loss
    before = by_rank(steps(msgs, 20, 115), "duration_s")
    during = by_rank(steps(msgs, 135, 200), "duration_s")
    for r in range(128):
        assert 1.4 <= during[r] / before[r] <= 2.5, r
    comm_before = by_rank(steps(msgs, 20, 115), "comm_s")
    comm_during = by_rank(steps(msgs, 135, 200), "comm_s")
    assert all(comm_during[r] > 2 * comm_before[r] for r in range(128))
    culprit_ranks = range(48, 56)
    slowest = sorted(comm_during, key=comm_during.get, reverse=True)[:8]
    assert sorted(slowest) == list(culprit_ranks)
    compute_during = by_rank(steps(msgs, 135, 200), "compute_s")
    assert max(compute_during.values()) / min(compute_during.values()) < 1.2  # nobody is slow in compute
    after = by_rank(steps(msgs, 215, 240), "duration_s")
    assert all(after[r] / before[r] < 1.2 for r in range(128))


def test_packet_loss_ground_truth_matches_the_schedule(packet_loss):
    sim, _ = packet_loss
    (gt,) = sim.ground_truth()
    assert (gt.fault, gt.culprit, gt.culprit_kind, gt.job, gt.cause) == (
        "nic-packet-loss", "node-07", "node", "train-llm", "network.packet-loss")
    assert (gt.start, gt.end) == (START + 120, START + 200)
    assert gt.ranks == tuple(range(48, 56))
    assert gt.detail["nic"] == "mlx5_0"
    assert gt.to_dict()["signals"][0].startswith("net.")


def test_generation_is_fast_enough():
    topo = make_cluster()
    sim = Simulation(topo, [make_job(topo)], [make_fault("nic-packet-loss", "node-07", 120, 400)],
                     start_time=START, duration_s=600, seed=1)
    t0 = time.process_time()
    n = sum(1 for _ in sim.messages())
    elapsed = time.process_time() - t0
    assert n > 40000
    assert elapsed < 5.0, f"{n} messages took {elapsed:.2f}s of CPU"


def test_simulator_core_imports_no_engine_kafka_or_slack():
    import subprocess
    import sys

    code = ("import sys, simulate.sim, simulate.faults, simulate.scenario, "
            "whywait.simulate.cli; "
            "print(sorted({'faust', 'aiokafka', 'slack_sdk', 'pynvml', 'engine'} & set(sys.modules)))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"


def test_two_jobs_on_one_gpu_and_faults_after_the_end_are_refused():
    import pytest
    from whywait.simulate.errors import SimulationError

    topo = make_cluster(nodes=2)
    a = make_job(topo, job="a", nodes=["node-01"])
    b = make_job(topo, job="b", nodes=["node-01"], gpus_per_node=1)
    with pytest.raises(SimulationError, match="job 'b' rank 0 and job 'a' rank 0 both use node-01 gpu 0"):
        Simulation(topo, [a, b])
    topo = make_cluster(nodes=2)
    with pytest.raises(SimulationError, match=r"starts at 700s, after the simulation ends \(600s\)"):
        Simulation(topo, [make_job(topo)], [make_fault("nic-packet-loss", "node-01", 700, 800)])
