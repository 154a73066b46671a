"""Each fault of the library: its signature in the generated signals, and its ground truth.

Every run is an 8-node cluster (two leaves) with one 64-rank job checkpointing every
40 s; the fault is active from 50 s to 130 s.  "Before" is 10-45 s, "during" 65-130 s.
"""

from __future__ import annotations

import statistics
from typing import Any

import pytest
from whywait.agents.events import validate
from whywait.simulate.cluster import make_job
from whywait.simulate.errors import SimulationError
from whywait.simulate.faults import FAULTS, make_fault, parse_fault_spec

from tests.simulate.conftest import run_sim
from tests.simulate.support import START, by_rank, gpu_samples, mean, of_kind, steps

FAULT_START, FAULT_END = 50, 130


def _run(name: str, target: str, jobs: Any = None, **params: Any):
    jobs = jobs or (lambda t: [make_job(t, checkpoint_every_s=40)])
    sim, msgs = run_sim([make_fault(name, target, FAULT_START, FAULT_END, **params)], duration=150, nodes=8,
                        jobs=jobs)
    for topic, m in msgs:
        validate(m, topic)
    return sim, msgs


def _ratio(msgs, field: str) -> dict[int, float]:
    before = by_rank(steps(msgs, 10, 45), field)
    during = by_rank(steps(msgs, 65, 130), field)
    return {r: during[r] / before[r] for r in during}


def _truth(sim, **expected):
    (gt,) = sim.ground_truth()
    assert gt.start == START + FAULT_START and gt.end == START + FAULT_END
    for k, v in expected.items():
        assert getattr(gt, k) == v, k
    return gt


def test_registry_names_match_and_every_fault_documents_itself():
    for name, cls in FAULTS.items():
        assert cls.name == name and cls.cause and cls.signals and cls.doc


def test_gpu_thermal_slows_one_rank_in_compute_and_the_rest_wait():
    sim, msgs = _run("gpu-thermal", "node-07:gpu3")
    hot = gpu_samples(msgs, "node-07", 3, 75, 130)
    assert min(g["temp_c"] for g in hot) >= 90
    assert all("hw_thermal_slowdown" in g["throttle_reasons"] for g in hot)
    assert max(g["sm_clock_mhz"] for g in hot) < 1500
    assert max(g["temp_c"] for g in gpu_samples(msgs, "node-07", 2, 75, 130)) < 75
    comp = by_rank(steps(msgs, 75, 130), "compute_s")
    comm = by_rank(steps(msgs, 75, 130), "comm_s")
    assert comp[51] > 1.4 * statistics.median(comp.values())
    assert comm[51] == min(comm.values())  # the straggler never waits
    assert statistics.median(comm.values()) > 2 * comm[51]
    _truth(sim, culprit="node-07 gpu 3", culprit_kind="gpu", job="train-llm", cause="gpu.thermal-throttle",
           ranks=(51,))


def test_gpu_power_cap():
    sim, msgs = _run("gpu-power", "node-02:gpu0")
    capped = gpu_samples(msgs, "node-02", 0, 55, 130)
    assert all(g["throttle_reasons"] == ["sw_power_cap"] and g["power_w"] <= g["power_limit_w"] == 350.0
               for g in capped)
    comp = by_rank(steps(msgs, 65, 130), "compute_s")
    assert comp[8] > 1.2 * statistics.median(comp.values())
    _truth(sim, culprit="node-02 gpu 0", culprit_kind="gpu", cause="gpu.power-cap", ranks=(8,))


def test_gpu_ecc_xid_reports_the_error_and_hangs_the_job():
    sim, msgs = _run("gpu-ecc-xid", "node-03:gpu5")
    first = gpu_samples(msgs, "node-03", 5, 50, 51)[0]
    assert first["xid"] == [48, 79] and first["ecc_uncorrected"] == 1 and first["remapped_rows_pending"]
    assert all(g["util_pct"] == 0 for g in gpu_samples(msgs, "node-03", 5, 52, 130))
    assert steps(msgs, 55, 130) == []  # nobody completes a step
    spinning = gpu_samples(msgs, "node-01", 0, 55, 130)
    assert min(g["util_pct"] for g in spinning) > 90 and max(g["power_w"] for g in spinning) < 250
    assert steps(msgs, 135, 150)  # recovers after the window
    _truth(sim, culprit="node-03 gpu 5", culprit_kind="gpu", cause="gpu.xid", ranks=(21,))


def test_wrong_nic_idles_the_local_nic_and_loads_another():
    sim, msgs = _run("wrong-nic", "node-04")
    nics = {c["nic"]: c["tx_bytes_per_s"] for m in of_kind(msgs, "net", 70, 71) if m["node"] == "node-04"
            for c in m["nics"]}
    # Every GPU's traffic leaves through mlx5_0 (as with a stray NCCL_IB_HCA=mlx5_0): the others idle.
    assert nics["mlx5_1"] < 1e5 and nics["mlx5_2"] < 1e5 and nics["mlx5_3"] < 1e5
    assert nics["mlx5_0"] > 1.5e10
    peer = {c["nic"]: c["tx_bytes_per_s"] for m in of_kind(msgs, "net", 70, 71) if m["node"] == "node-05"
            for c in m["nics"]}
    assert min(peer.values()) > 3e9
    assert mean(_ratio(msgs, "comm_s").values()) > 1.2
    gt = _truth(sim, culprit="node-04", culprit_kind="node", cause="topology.wrong-nic")
    assert gt.detail["used_nic"] == "mlx5_0"


def test_wrong_nic_for_one_gpu():
    sim, msgs = _run("wrong-nic", "node-04:gpu4")
    before = {c["nic"]: c["tx_bytes_per_s"] for m in of_kind(msgs, "net", 30, 31) if m["node"] == "node-04"
              for c in m["nics"]}
    during = {c["nic"]: c["tx_bytes_per_s"] for m in of_kind(msgs, "net", 70, 71) if m["node"] == "node-04"
              for c in m["nics"]}
    assert during["mlx5_2"] < 0.7 * before["mlx5_2"]  # GPU 4's half of mlx5_2's traffic has left it
    assert during["mlx5_0"] > 1.3 * before["mlx5_0"]
    gt = _truth(sim, culprit="node-04 gpu 4", cause="topology.wrong-nic")
    assert gt.detail["expected_nics"] == {"4": "mlx5_2"} and gt.detail["used_nic"] == "mlx5_0"


def test_link_flap_counts_carrier_changes():
    sim, msgs = _run("link-flap", "node-06:mlx5_2")
    flaps = [c for m in of_kind(msgs, "net", 50, 130) if m["node"] == "node-06" for c in m["nics"]
             if c["nic"] == "mlx5_2" and c["carrier_changes"]]
    assert 5 <= len(flaps) <= 20
    assert all(not c["link_up"] and c["tx_bytes_per_s"] == 0 for c in flaps)
    assert not [c for m in of_kind(msgs, "net") if m["node"] != "node-06" for c in m["nics"] if c["carrier_changes"]]
    # Each flap stalls one step in fifteen seconds' worth: the time lost shows in the mean, not the median.
    during, before = (mean(s["duration_s"] for s in steps(msgs, lo, hi)) for lo, hi in ((65, 130), (10, 45)))
    assert during > 1.1 * before
    _truth(sim, culprit="node-06", culprit_kind="node", cause="network.link-flap")


def test_storage_slow_raises_pool_latency_and_everyones_data_wait():
    sim, msgs = _run("storage-slow", "scratch")
    lat = [d["read_latency_ms"] for m in of_kind(msgs, "storage", 55, 130) for d in m["devices"]
           if d.get("pool") == "scratch"]
    healthy = [d["read_latency_ms"] for m in of_kind(msgs, "storage", 0, 50) for d in m["devices"]
               if d.get("pool") == "scratch"]
    assert statistics.median(lat) > 10 * statistics.median(healthy)
    dw = _ratio(msgs, "data_wait_s")
    assert min(dw.values()) > 10  # every rank waits for input
    comm = by_rank(steps(msgs, 65, 130), "comm_s")
    assert max(comm.values()) / min(comm.values()) < 1.5  # no straggler
    _truth(sim, culprit="scratch", culprit_kind="pool", cause="storage.pool-slow", ranks=())


def test_storage_client_slow_is_one_node_while_the_pool_is_fine():
    sim, msgs = _run("storage-client-slow", "node-02")
    def lat(node):
        return statistics.median(d["read_latency_ms"] for m in of_kind(msgs, "storage", 55, 130)
                                 if m["node"] == node for d in m["devices"] if d.get("pool"))
    assert lat("node-02") > 10 * lat("node-03")
    assert lat("node-03") < 3
    dw = by_rank(steps(msgs, 65, 130), "data_wait_s")
    comm = by_rank(steps(msgs, 65, 130), "comm_s")
    assert min(dw[r] for r in range(8, 16)) > 10 * max(dw[r] for r in range(16, 64))
    assert max(comm[r] for r in range(8, 16)) < min(comm[r] for r in range(16, 64))
    _truth(sim, culprit="node-02", culprit_kind="node", cause="storage.client-slow", ranks=tuple(range(8, 16)))


def test_cpu_bound_loader_saturates_cpu_with_healthy_storage():
    sim, msgs = _run("cpu-bound-loader", "node-05")
    host = [m for m in of_kind(msgs, "host", 55, 130) if m["node"] == "node-05"]
    peers = [m for m in of_kind(msgs, "host", 55, 130) if m["node"] == "node-04"]
    assert min(m["cpu_busy_pct"] for m in host) > 95 and max(m["cpu_busy_pct"] for m in peers) < 60
    assert mean(m["loader_cpu_pct"] for m in host) > 2.5 * mean(m["loader_cpu_pct"] for m in peers)
    assert max(d["read_latency_ms"] for m in of_kind(msgs, "storage", 55, 130) if m["node"] == "node-05"
               for d in m["devices"] if d.get("pool")) < 5
    dw = by_rank(steps(msgs, 65, 130), "data_wait_s")
    assert min(dw[r] for r in range(32, 40)) > 0.3 > max(dw[r] for r in range(0, 32))
    _truth(sim, culprit="node-05", culprit_kind="node", cause="data-loader.cpu-bound")


def test_whole_job_slow_has_no_straggler():
    sim, msgs = _run("whole-job-slow", "train-llm")
    comp = _ratio(msgs, "compute_s")
    assert min(comp.values()) > 1.35
    comm = _ratio(msgs, "comm_s")
    assert max(comm.values()) < 1.5
    dur = _ratio(msgs, "duration_s")
    assert min(dur.values()) > 1.25
    _truth(sim, culprit="train-llm", culprit_kind="job", cause="job.slow-everywhere")


def test_rank_silent_hangs_the_job_and_idles_its_gpu():
    sim, msgs = _run("rank-silent", "train-llm:21")
    assert steps(msgs, 52, 130) == []
    assert all(g["util_pct"] == 0 for g in gpu_samples(msgs, "node-03", 5, 52, 130))
    assert min(g["util_pct"] for g in gpu_samples(msgs, "node-03", 4, 52, 130)) > 90
    _truth(sim, culprit="job train-llm rank 21", culprit_kind="rank", cause="job.rank-hung", ranks=(21,))


def test_rank_silent_without_hang_only_drops_its_reports():
    sim, msgs = _run("rank-silent", "train-llm:21", hang=0)
    during = steps(msgs, 52, 130)
    assert during and 21 not in {s["rank"] for s in during}
    assert len({s["rank"] for s in during}) == 63


def test_uplink_oversubscribed_shows_xmit_wait_under_the_leaf():
    sim, msgs = _run("uplink-oversubscribed", "leaf-02")
    def wait(node):
        return statistics.median(c["xmit_wait_per_s"] for m in of_kind(msgs, "net", 55, 130)
                                 if m["node"] == node for c in m["nics"])
    assert wait("node-06") > 1000 * wait("node-02")
    tx = [c["tx_bytes_per_s"] for m in of_kind(msgs, "net", 70, 71) if m["node"] == "node-06" for c in m["nics"]]
    assert max(tx) > 1.8 * min(tx)  # unbalanced
    assert mean(_ratio(msgs, "comm_s").values()) > 1.5
    _truth(sim, culprit="leaf-02", culprit_kind="switch", cause="network.uplink-oversubscribed")


def _two_jobs(t):
    return [make_job(t, nodes=[f"node-0{i}" for i in range(1, 7)], checkpoint_every_s=40),
            make_job(t, job="batch-etl", project="ads", team="ads-data", channel="#ads",
                     nodes=["node-07", "node-08"], checkpoint_every_s=0)]


def test_contention_on_a_leaf_from_another_project():
    sim, msgs = _run("contention", "batch-etl/leaf-02", jobs=_two_jobs)
    aggr = [c["tx_bytes_per_s"] for m in of_kind(msgs, "net", 55, 130) if m["node"] == "node-07"
            for c in m["nics"]]
    assert min(aggr) > 4e10
    assert statistics.median(c["xmit_wait_per_s"] for m in of_kind(msgs, "net", 55, 130) if m["node"] == "node-05"
                             for c in m["nics"]) > 1e6
    victim = by_rank(steps(msgs, 65, 130, job="train-llm"), "comm_s")
    before = by_rank(steps(msgs, 10, 45, job="train-llm"), "comm_s")
    assert mean(victim.values()) > 1.4 * mean(before.values())
    (gt,) = sim.ground_truth()
    assert (gt.culprit, gt.culprit_kind, gt.job, gt.cause) == ("batch-etl", "job", "train-llm", "contention.network")
    assert gt.detail["aggressor_project"] == "ads"
    assert [j.job for j in sim.topology.other_jobs_sharing("train-llm", "leaf-02")] == ["batch-etl"]


def test_contention_on_a_pool():
    sim, msgs = _run("contention", "batch-etl/scratch", jobs=_two_jobs)
    reads = [d["read_bytes_per_s"] for m in of_kind(msgs, "storage", 55, 130) if m["node"] == "node-08"
             for d in m["devices"] if d.get("pool") == "scratch"]
    assert min(reads) > 2e9
    assert min(_ratio_job(msgs, "data_wait_s", "train-llm").values()) > 5
    (gt,) = sim.ground_truth()
    assert (gt.culprit, gt.job, gt.cause) == ("batch-etl", "train-llm", "contention.storage")


def _ratio_job(msgs, field, job):
    before = by_rank(steps(msgs, 10, 45, job=job), field)
    during = by_rank(steps(msgs, 65, 130, job=job), field)
    return {r: during[r] / before[r] for r in during}


def _checkpoints(msgs):
    return [(round(m["time"] - START, 1), m["phase"], m.get("duration_s")) for m in of_kind(msgs, "checkpoint")]


def test_checkpoint_growth_each_longer_than_the_last():
    sim, msgs = _run("checkpoint-growth", "train-llm")
    ends = [d for t, phase, d in _checkpoints(msgs) if phase == "end" and FAULT_START < t < FAULT_END + 30]
    assert len(ends) >= 2 and all(b > 1.2 * a for a, b in zip(ends, ends[1:], strict=False))
    _truth(sim, culprit="train-llm", culprit_kind="job", cause="checkpoint.growth")


def test_checkpoint_failed_emits_failed_with_an_error():
    sim, msgs = _run("checkpoint-failed", "train-llm")
    failed = [m for m in of_kind(msgs, "checkpoint", FAULT_START, FAULT_END + 10) if m["phase"] == "failed"]
    assert failed and all("Disk quota exceeded" in m["error"] and m["duration_s"] > 0 for m in failed)
    assert [p for _, p, _ in _checkpoints(msgs)][:2] == ["start", "end"]
    _truth(sim, culprit="scratch", culprit_kind="pool", cause="checkpoint.failed")


def test_checkpoint_stall_blocks_training_until_the_window_ends():
    sim, msgs = _run("checkpoint-stall", "train-llm")
    cps = _checkpoints(msgs)
    stalled = next(c for c in cps if c[1] == "start" and c[0] > FAULT_START)
    end = next(c for c in cps if c[1] == "end" and c[0] > stalled[0])
    assert end[0] == pytest.approx(FAULT_END, abs=1.5)
    assert steps(msgs, stalled[0] + 2, FAULT_END - 1) == []
    lat = [d["write_latency_ms"] for m in of_kind(msgs, "storage", stalled[0] + 2, FAULT_END - 1)
           for d in m["devices"] if d.get("pool") == "scratch"]
    assert min(lat) > 100
    (gt,) = sim.ground_truth()
    assert gt.start == pytest.approx(START + stalled[0], abs=0.1)
    assert (gt.culprit, gt.cause) == ("scratch", "checkpoint.stall")


@pytest.mark.parametrize("spec, message", [
    ("nic-packet-loss:node-07", "expected NAME:TARGET@START-END"),
    ("nic-packet-loss:node-07@5-2", "needs 0 ≤ start < end (got 5-2)"),
    ("nic-packet-loss:node-07@1-2,speed=3", "unknown parameter(s) speed (valid: loss_pct, retrans_per_s, slowdown)"),
    ("nic-packet-loss:node-07@1-2,slowdown", "parameter 'slowdown' must be key=number"),
])
def test_bad_fault_specs(spec, message):
    with pytest.raises(SimulationError, match=None) as info:
        parse_fault_spec(spec)
    assert message in str(info.value)


def test_bad_targets_are_named():
    for name, target, message in [
        ("gpu-thermal", "node-01:gpu9", "node-01 has no GPU 9"),
        ("storage-slow", "nowhere", "unknown pool 'nowhere' (pools: scratch)"),
        ("uplink-oversubscribed", "spine-01", "unknown leaf switch 'spine-01' (leaves: leaf-01, leaf-02)"),
        ("rank-silent", "train-llm:64", "a rank of 0..63"),
        ("contention", "train-llm", "AGGRESSOR_JOB/LEAF_OR_POOL"),
        ("whole-job-slow", "nojob", "unknown job 'nojob' (jobs: train-llm)"),
    ]:
        with pytest.raises(SimulationError) as info:
            run_sim([make_fault(name, target, 1, 2)], duration=2, nodes=8)
        assert message in str(info.value), name
