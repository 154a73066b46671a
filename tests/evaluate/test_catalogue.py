"""The metric catalogue comes from the event contract: a declared field is collected, stored and usable in rules."""

from __future__ import annotations

import dataclasses
import os
import shutil
from pathlib import Path
from typing import Any

import pytest
from whywait.agents import events
from whywait.agents.collectors.storage import StorageCollector
from whywait.agents.events import TOPIC_STORAGE, envelope, validate
from whywait.engine.evaluate.conditions import Ctx, evaluate
from whywait.engine.evaluate.evaluator import _PERIODIC, Evaluator
from whywait.engine.evaluate.store import PLAN, MetricStore, ingest_plan
from whywait.engine.rules import metrics
from whywait.engine.rules.loader import load_rules
from whywait.engine.rules.schema import leaves
from whywait.simulate.cluster import make_cluster

from tests.agents.conftest import fixture_path
from tests.agents.test_storage import bump_nfs_op

T0 = 1_800_000_000.0
RULES_DIR = Path(__file__).resolve().parents[2] / "rules"


def test_every_declared_field_is_a_metric_at_its_entity_level() -> None:
    declared = events.measured()
    assert len(declared) > 40
    for _topic, list_name, rec, f, m in declared:
        level = rec.entity if list_name else "node"
        if m.metric is not None:
            got = metrics.METRICS[m.metric]
            assert (got.level, got.unit) == (level, m.unit or f.unit), m.metric
        for r in m.rollups:
            assert metrics.METRICS[r.metric].level == "node"
    names = {m.name for m in metrics.DERIVED}
    assert not names & set(metrics.catalogue()), "a metric is both declared and derived"
    assert metrics.METRICS["storage.device.read_rtt_ms"].level == "device"
    # Per-mount NFS round trips are addressable; the node's worst device stays what it was.
    assert metrics.METRICS["storage.read_latency_ms"].doc == "slowest device's read latency"


def test_periodic_inputs_come_from_the_contract() -> None:
    assert _PERIODIC == {"gpu", "net", "storage", "host", "steps"}


def test_store_rollups_and_per_device_series() -> None:
    s = MetricStore()
    dev = {"read_iops": 1.0, "write_iops": 2.0, "read_bytes_per_s": 3.0, "write_bytes_per_s": 4.0,
           "write_latency_ms": 1.0, "queue_depth": 0.5}
    s.ingest(validate(envelope("storage", "n1", T0, interval_s=1.0, devices=[
        {**dev, "device": "nvme0n1", "read_latency_ms": 0.1, "util_pct": 3.0},
        {**dev, "device": "nfs:/scratch", "read_latency_ms": 9.0, "read_rtt_ms": 7.5, "nfs_retransmissions": 2}])))
    assert s.window("storage.read_latency_ms", "n1", 0, T0)[1] == [9.0]  # the max over devices, as before
    assert s.window("storage.read_iops", "n1", 0, T0)[1] == [2.0]  # the sum
    assert s.window("storage.util_pct", "n1", 0, T0)[1] == [3.0]  # max over those that have it
    assert s.window("storage.device.read_rtt_ms", "n1/nfs:/scratch", 0, T0)[1] == [7.5]
    assert s.window("storage.device.nfs_retransmissions", "n1/nfs:/scratch", 0, T0)[1] == [2.0]
    assert s.window("storage.device.read_rtt_ms", "n1/nvme0n1", 0, T0)[1] == ()  # a local disk has no RPCs
    assert s.entities_at("device", ["n1"]) == ["n1/nfs:/scratch", "n1/nvme0n1"]


def _with_field(field: events.Field) -> tuple[events.Topic, ...]:
    """The contract with one more field on DiskStats: what editing agents/events.py would make."""
    disk = dataclasses.replace(events.DISK_STATS, fields=events.DISK_STATS.fields + (field,))
    return tuple(dataclasses.replace(t, lists={**t.lists, "devices": disk}) if t.kind == "storage" else t
                 for t in events.TOPICS)


class _Job:
    """The placed job a condition is evaluated for (``JobView``)."""

    job: str = "j"
    project: str = "p"
    team: str = "t"
    channel: str | None = None
    ranks: dict[int, tuple[str, int]] = {0: ("n1", 0), 1: ("n2", 0), 2: ("n3", 0)}


def test_one_declaration_makes_a_usable_metric(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A test-only field declared with measure=: stored per device and per node, accepted and evaluated by a rule."""
    new = events.F("readahead_kb", "integer", "count", "Test only: the mount's read-ahead.", required=False,
                   measure=events.M("storage.device.readahead_kb", "read-ahead", "",
                                    events.Rollup("storage.readahead_kb_max", "max", "largest read-ahead")))
    topics = _with_field(new)
    catalogue = metrics.catalogue(topics)
    assert catalogue["storage.device.readahead_kb"].level == "device"
    assert catalogue["storage.readahead_kb_max"].level == "node"
    assert "storage.device.readahead_kb" not in metrics.METRICS  # the real contract does not have it
    for name, m in catalogue.items():  # what importing engine.rules.metrics builds from such a contract
        monkeypatch.setitem(metrics.METRICS, name, m)
    store = MetricStore(plan=ingest_plan(topics))
    base = {"read_iops": 1.0, "write_iops": 1.0, "read_bytes_per_s": 1.0, "write_bytes_per_s": 1.0,
            "read_latency_ms": 1.0, "write_latency_ms": 1.0, "queue_depth": 0.1}
    for t in range(1, 6):
        for node, kb in (("n1", 128), ("n2", 128), ("n3", 16384)):
            store.ingest(validate(envelope("storage", node, T0 + t, interval_s=1.0, devices=[
                {**base, "device": "nfs:/data", "readahead_kb": kb}])))
    assert store.window("storage.readahead_kb_max", "n3", 0, T0 + 5)[1][-1] == 16384.0
    f = tmp_path / "storage.test-readahead.yaml"
    f.write_text("apiVersion: whywait/v1\nid: storage.test-readahead\ntitle: t\ncause: c\nnext_step: n\n"
                 "when: {type: peer_outlier, metric: storage.device.readahead_kb, peers: same_name, ratio: '> 10',"
                 " min_peers: 2, culprit: true}\n")
    [leaf] = leaves(load_rules([f]).rules["storage.test-readahead"].when)
    ctx = Ctx(store, T0 + 5, _Job(), None, "storage.test-readahead", {})
    r = evaluate(leaf, ctx)
    assert r.holds and r.entities == ["n3/nfs:/data"] and ctx.culprit_level == "device"
    assert "the median of nfs:/data on the job's nodes" in r.evidence[0].note


def test_the_plan_reads_every_declaration() -> None:
    planned = {m for p in PLAN.values() for m in [b[1] for b in p.body]
               + [d[1] for lp in p.lists for d in lp.direct] + [r[1] for lp in p.lists for r in lp.rollups]}
    assert planned == set(metrics.catalogue())


def _nfs_root(tmp_path: Path, node: str) -> tuple[StorageCollector, str]:
    root = tmp_path / node
    os.makedirs(root / "proc" / "10")
    p = str(root / "proc" / "10" / "mountstats")
    shutil.copy(fixture_path("node_exporter", "proc", "10", "mountstats"), p)
    return StorageCollector(str(root), pid=10), p


def test_real_mountstats_to_a_diagnosis(tmp_path: Path) -> None:
    """node_exporter's real mountstats, read by the agent's collector on four nodes, one with a slow NFS mount:
    the contract carries its per-mount round trip, the store keeps it per mount, and the shipped
    storage.nfs-slow-mount rule names the node and the mount."""
    nodes = ["node-01", "node-02", "node-03", "node-04"]
    collectors = {n: _nfs_root(tmp_path, n) for n in nodes}
    msgs: list[dict[str, Any]] = [envelope("placement", "sched", T0, job="train", project="llm", team="ml",
                                           state="running",
                                           ranks=[{"rank": i, "node": n, "gpu": 0} for i, n in enumerate(nodes)])]
    for c, _ in collectors.values():
        assert c.collect(T0, 0.0) is None  # the first read only primes the counters
    for s in range(1, 16):
        for n, (c, path) in collectors.items():
            rtt = 240 if n == "node-03" else 24  # ms over 20 READs: 12 ms against 1.2 ms per round trip
            # READ: ops, transmissions, timeouts, bytes sent, received, queue ms, rtt ms, execute ms
            bump_nfs_op(path, "/mnt/nfs/test", "READ", {0: 20, 1: 20, 4: 20 << 16, 6: rtt, 7: rtt + 6})
            body = c.collect(T0 + s, float(s))
            assert body is not None
            msgs.append(validate(envelope("storage", n, T0 + s, **body), TOPIC_STORAGE))
    ev = Evaluator(load_rules([RULES_DIR]), make_cluster(nodes=4, gpus_per_node=1))
    diags = [d for m in msgs for d in ev.ingest(m)]
    assert ev.store.window("storage.device.read_rtt_ms", "node-03/nfs:/mnt/nfs/test", 0, T0 + 15)[1][-1] == 12.0
    firing = [d for d in diags if d.status == "firing"]
    assert [(d.rule_id, d.culprit) for d in firing] == [("storage.nfs-slow-mount", "node-03")]
    assert "nfs:/mnt/nfs/test takes 12.0 ms per READ round trip" in firing[0].cause
    assert "other nodes takes 1.2 ms" in firing[0].cause


# Metrics that name figures rather than series: ages the store answers at evaluation time, and the
# step-aligned conditions' evidence (their values come from the step tables, not from a series).
_AGES = {"step.since_last_s", "node.since_last_s", "checkpoint.open_s"}
_EVIDENCE_ONLY = {"step.work_s", "job.step_s", "step.end_offset_s"}


def _every_kind() -> list[dict[str, Any]]:
    """One message of every kind with every measured field set: what the store must turn into every metric."""
    t = T0
    dev = {"read_iops": 1.0, "write_iops": 1.0, "read_bytes_per_s": 1.0, "write_bytes_per_s": 1.0,
           "read_latency_ms": 1.0, "write_latency_ms": 1.0, "queue_depth": 1.0, "util_pct": 1.0}
    nic = {"rx_bytes_per_s": 1.0, "tx_bytes_per_s": 1.0, "rx_packets_per_s": 1.0, "tx_packets_per_s": 1.0,
           "rx_errors_per_s": 1.0, "tx_errors_per_s": 1.0, "rx_drops_per_s": 1.0, "tx_drops_per_s": 1.0,
           "link_up": True, "carrier_changes": 1, "symbol_errors": 1, "xmit_wait_per_s": 1.0, "gpus": [0]}
    step = {"duration_s": 1.0, "data_wait_s": 0.1, "compute_s": 0.5, "comm_s": 0.3, "collective_s": 0.2,
            "pipeline_wait_s": 0.1, "checkpoint_s": 0.1}
    calls: list[tuple[tuple[Any, ...], dict[str, Any]]] = [
        (("gpu", "n1", t), {"gpus": [{"gpu": 0, "util_pct": 1.0, "mem_util_pct": 1.0, "mem_used_bytes": 1,
                                      "mem_total_bytes": 2, "temp_c": 1.0, "power_w": 1.0, "power_limit_w": 2.0,
                                      "sm_clock_mhz": 1.0, "sm_clock_max_mhz": 2.0, "throttle_reasons": [],
                                      "ecc_corrected": 1, "ecc_uncorrected": 1, "remapped_rows_pending": True,
                                      "xid": [79], "pcie_replay": 1, "nvlink_errors": 1}]}),
        (("net", "n1", t), {"interval_s": 1.0, "nics": [{"nic": "mlx5_0/1", **nic}], "tcp_retrans_segs_per_s": 1.0,
                            "tcp_out_segs_per_s": 2.0, "tcp_timeouts_per_s": 1.0}),
        (("storage", "n1", t), {"interval_s": 1.0, "io_pressure_some_avg10": 1.0, "devices": [
            {**dev, "device": "nfs:/scratch", "read_rtt_ms": 1.0, "write_rtt_ms": 1.0, "nfs_errors": 1,
             "nfs_timeouts": 1, "nfs_retransmissions": 1},
            {**dev, "device": "lustre:fs0", "metadata_ops_per_s": 1.0, "metadata_latency_ms": 1.0}]}),
        (("host", "n1", t), {"cpu_busy_pct": 1.0, "cpu_iowait_pct": 1.0, "cpu_steal_pct": 1.0, "mem_used_bytes": 1,
                             "mem_total_bytes": 2, "cpu_pressure_some_avg10": 1.0, "mem_pressure_some_avg10": 1.0,
                             "loader_cpu_pct": 1.0}),
        (("hw", "n1", t), {
            "pcie": [{"device": "0000:01:00.0", "class": "gpu", "gpu": 0, "width": 16, "width_max": 16, "gen": 5,
                      "gen_max": 5, "tx_bytes_per_s": 1.0, "rx_bytes_per_s": 1.0},
                     {"device": "0000:02:00.0", "class": "nic", "nics": ["mlx5_0/1"], "width": 8, "width_max": 16,
                      "gen": 5, "gen_max": 5}],
            "ports": [{"nic": "mlx5_0/1", "speed_mbps": 400000.0, "speed_common_max_mbps": 400000.0,
                       "link_layer": "Ethernet", "rdma": True, "link_up": True, "gids": 2, "roce_v2_gids": 1}],
            "kernel": [{"seq": 1, "class": "mce", "level": 2, "message": "x"}],
            "bmc": [{"name": "in", "type": "temperature", "context": "inlet", "health": "ok", "reading": 20.0},
                    {"name": "out", "type": "temperature", "context": "exhaust", "health": "ok", "reading": 40.0},
                    {"name": "p", "type": "power", "health": "ok", "reading": 300.0}],
            "nvml": [{"gpu": 0, "responsive": True, "latency_ms": 1.0, "calls": 1, "errors": 0, "timeouts": 0}]}),
        (("steps", "n1", t), {"job": "j", "steps": [{"rank": 0, "step": 1, **step}]}),
        (("checkpoint", "n1", t), {"job": "j", "rank": 0, "checkpoint_id": "c1", "phase": "start"}),
        (("checkpoint", "n1", t + 1), {"job": "j", "rank": 0, "checkpoint_id": "c1", "phase": "end",
                                       "duration_s": 1.0}),
        (("checkpoint", "n1", t + 1), {"job": "j", "rank": 0, "checkpoint_id": "c2", "phase": "failed"}),
    ]
    return [envelope(*a, **b) for a, b in calls]


def test_every_catalogue_metric_is_produced_by_the_store() -> None:
    """Declared or derived, every metric a rule may name has a series once its messages arrive: no name
    in the catalogue that the store never writes."""
    s = MetricStore()
    for m in _every_kind():
        s.ingest(validate(m))
    s.close_buckets(T0 + 10)
    stored = {metric for metric, _ in s.series}
    missing = set(metrics.METRICS) - stored - _AGES - _EVIDENCE_ONLY
    assert missing == set()
    assert stored <= set(metrics.METRICS), "the store writes a metric the catalogue does not list"
    assert s.age("node.since_last_s", "n1", T0 + 5) == 5.0 and s.age("step.since_last_s", "j:0", T0 + 5) == 5.0


def test_a_declaration_the_store_cannot_follow_fails_at_import() -> None:
    """A measured field on a record that does not say which entity an entry is, or a rollup of an unknown kind."""
    rec = events.Record("Loose", (events.F("name", "string", "", "n", required=False),
                                  events.F("x", "number", "count", "x", measure=events.M("loose.x", "x"))))
    topic = events.Topic("whywait.loose.v1", "loose", "node id", events.Record("LooseReport", (
        events.F("items", "list[Loose]", "", "items"),)), "test only", lists={"items": rec})
    with pytest.raises(ValueError, match="Loose: measured fields need entity= one of gpu, nic, device, rank"):
        ingest_plan((topic,))
    keyed = dataclasses.replace(rec, entity="device", entity_key="name")
    with pytest.raises(ValueError, match="got 'device', 'name'"):  # the key must be a required field
        ingest_plan((dataclasses.replace(topic, lists={"items": keyed}),))
    bad = events.F("y", "number", "count", "y", measure=events.M(None, "", "", events.Rollup("loose.y", "avg", "y")))
    ok = dataclasses.replace(keyed, fields=(events.F("name", "string", "", "n"), bad))
    with pytest.raises(ValueError, match=r"Loose.y: a rollup is 'max' or 'sum'"):
        ingest_plan((dataclasses.replace(topic, lists={"items": ok}),))
