"""Topology queries on a made cluster: locality, paths, shared components, jobs, caching by version."""

from __future__ import annotations

import subprocess
import sys

import pytest
from whywait.simulate.cluster import make_cluster
from whywait.topology import Topology, UnknownEntityError


@pytest.fixture
def topo() -> Topology:
    t = make_cluster(nodes=16, gpus_per_node=8, nodes_per_leaf=4, spines=2, pools=("scratch", "datasets"))
    t.place_job("train-llm", "llm", "ml-platform", "#ml-platform",
                {r: (f"node-{r // 8 + 1:02d}", r % 8) for r in range(64)})  # node-01..node-08
    t.place_job("eval", "vision", "cv-team", "#cv", {0: ("node-08", 0), 1: ("node-09", 0)})
    return t


def test_physical_queries(topo):
    assert topo.nodes()[:3] == ("node-01", "node-02", "node-03") and len(topo.nodes()) == 16
    assert topo.gpus_of("node-07") == tuple(range(8))
    assert [n.name for n in topo.nics_of("node-07")] == ["mlx5_0", "mlx5_1", "mlx5_2", "mlx5_3"]
    assert topo.nics_of("node-07")[2].gpus == (4, 5)
    assert topo.leaf_of("node-07") == "leaf-02"
    assert topo.spines_of("leaf-02") == ("spine-01", "spine-02")
    assert topo.rack_of("node-07") == "rack-02"
    assert topo.pools_of("node-07") == ("datasets", "scratch")
    assert topo.nodes_under("leaf-02") == ("node-05", "node-06", "node-07", "node-08")
    assert len(topo.nodes_under("spine-01")) == 16
    assert topo.nodes_under("rack-01") == ("node-01", "node-02", "node-03", "node-04")
    assert topo.expected_nic("node-07", 4) == "mlx5_2"


def test_paths(topo):
    assert topo.path_for_rank("train-llm", 52) == (
        "job train-llm rank 52", "node-07 gpu 4", "node-07", "node-07 mlx5_2", "leaf-02",
        "spine-01, spine-02", "rack-02")
    assert topo.path_for_node("node-07") == ("node-07", "node-07 mlx5_0", "leaf-02", "spine-01, spine-02",
                                             "rack-02")


def test_jobs_and_sharing(topo):
    job = topo.job("train-llm")
    assert job.nodes == tuple(f"node-{i:02d}" for i in range(1, 9)) and job.world_size == 64
    assert [j.job for j in topo.jobs_on_node("node-08")] == ["eval", "train-llm"]
    assert [j.job for j in topo.jobs_on_switch("leaf-03")] == ["eval"]
    assert [j.job for j in topo.jobs_on_pool("scratch")] == ["eval", "train-llm"]
    assert topo.ranks_on("train-llm", "node-07") == tuple(range(48, 56))
    assert topo.rank_on("train-llm", "node-07") == 48
    assert topo.rank_of("train-llm", "node-07", 3) == 51
    assert [j.job for j in topo.other_jobs_sharing("train-llm", "leaf-02")] == ["eval"]
    assert topo.other_jobs_sharing("train-llm", "leaf-01") == []
    assert [j.job for j in topo.other_jobs_sharing("eval", "scratch")] == ["train-llm"]
    assert topo.common_switch(["node-05", "node-07"]) == "leaf-02"
    assert topo.common_switch(["node-01", "node-07"]) == "spine-01"
    assert topo.common_rack(["node-05", "node-08"]) == "rack-02"
    assert topo.common_rack(["node-04", "node-05"]) is None
    assert topo.common_pool(["node-01", "node-16"]) == "datasets"


def test_mutations_bump_the_version_and_refresh_caches(topo):
    v = topo.version
    assert [j.job for j in topo.jobs_on_switch("leaf-04")] == []
    topo.place_job("hog", "ads", "ads-team", None, {0: ("node-13", 0)})
    assert topo.version == v + 1
    assert [j.job for j in topo.jobs_on_switch("leaf-04")] == ["hog"]
    assert topo.remove_job("hog") is not None and topo.version == v + 2
    assert topo.jobs_on_switch("leaf-04") == ()
    assert topo.remove_job("hog") is None and topo.version == v + 2


def test_apply_placement_message(topo):
    msg = {"schema": 1, "kind": "placement", "time": 1.0, "node": "sched", "job": "j2", "project": "p",
           "team": "t", "slack_channel": "#t", "state": "running",
           "ranks": [{"rank": 0, "node": "node-16", "gpu": 7}]}
    info = topo.apply_placement(msg)
    assert info is not None and info.ranks[0] == ("node-16", 7) and info.channel == "#t"
    assert topo.apply_placement({**msg, "state": "finished"}) is None
    assert not topo.has_job("j2")


def test_a_placement_older_than_the_one_applied_changes_nothing(topo):
    # A Slurm prolog spooled while Kafka was down, sent after the job's epilog: the job stays finished.
    running = {"kind": "placement", "time": 100.0, "job": "j1", "project": "p", "team": "t", "state": "running",
               "ranks": [{"rank": 0, "node": "node-01", "gpu": 0}]}
    finished = {**running, "time": 200.0, "state": "finished", "ranks": []}
    assert topo.apply_placement(finished) is None
    assert topo.apply_placement(running) is None and not topo.has_job("j1")
    assert topo.apply_placement({**running, "time": 300.0}) is not None  # a newer run of the same id places it
    moved = {**running, "time": 250.0, "ranks": [{"rank": 0, "node": "node-02", "gpu": 0}]}
    assert topo.apply_placement(moved).ranks[0] == ("node-01", 0)  # older than what is applied: ignored


def test_unknown_entities_are_named(topo):
    with pytest.raises(UnknownEntityError, match=r"unknown node 'node-99' \(known: node-01 … node-16, 16 in all\)"):
        topo.gpus_of("node-99")
    with pytest.raises(UnknownEntityError, match=r"unknown gpu 'node-01 gpu 9' \(job 'x' rank 0; node-01 has GPUs"):
        topo.place_job("x", "p", "t", None, {0: ("node-01", 9)})
    with pytest.raises(UnknownEntityError, match="unknown job 'nope'"):
        topo.job("nope")


def test_topology_imports_no_kafka_slack_or_nvml():
    code = ("import sys, whywait.topology, whywait.topology.model, whywait.topology.schema, whywait.topology.loaders, "
            "whywait.topology.sources, whywait.topology.reconcile; "
            "bad = {'faust', 'aiokafka', 'slack_sdk', 'pynvml', 'kafka', 'whywait.engine'} & set(sys.modules); "
            "print(sorted(bad))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"


def test_agent_names_and_nvml_indexes_map_onto_the_topology():
    t = Topology.from_dict({"switches": [{"id": "l1", "tier": "leaf"}], "nodes": [
        {"id": "n1", "gpus": 2, "gpu_pci": {0: "0000:1a:00.0", 1: "0000:3b:00.0"},
         "nics": [{"name": "HCA-1", "leaf": "l1", "gpus": [0], "aliases": ["mlx5_0"],
                   "guids": ["0xe09d7303008594c4"], "pci": "0000:1c:00.0"}]}]})
    # by alias, by GUID, by PCI bus id (each sample alone: one message holds one sample per adapter)
    for sample in ({"nic": "mlx5_0/1"}, {"nic": "ib7", "node_guid": "e09d:7303:0085:94c4"},
                   {"nic": "eth0", "pci_bus_id": "1c:00.0"}):
        net = t.canonical_net({"kind": "net", "node": "n1", "nics": [sample, {"nic": "eth1"}]})
        assert [n["nic"] for n in net["nics"]] == ["HCA-1", "eth1"], sample
    # All three in one message: the adapter's name goes to one of them only (the GUID's), the others keep theirs
    net = t.canonical_net({"kind": "net", "node": "n1", "nics": [
        {"nic": "mlx5_0/1"}, {"nic": "ib7", "node_guid": "e09d:7303:0085:94c4"},
        {"nic": "eth0", "pci_bus_id": "1c:00.0"}, {"nic": "eth1"}]})
    assert [n["nic"] for n in net["nics"]] == ["mlx5_0/1", "HCA-1", "eth0", "eth1"]
    gpu = t.canonical_gpu({"kind": "gpu", "node": "n1", "gpus": [
        {"gpu": 0, "pci_bus_id": "00000000:3B:00.0"}, {"gpu": 1, "pci_bus_id": "00000000:1A:00.0"}, {"gpu": 5}]})
    assert [g["gpu"] for g in gpu["gpus"]] == [1, 0, 5]
    assert t.canonical_net({"kind": "net", "node": "other", "nics": [{"nic": "x"}]})["nics"] == [{"nic": "x"}]
    # Nothing to rename: the message itself comes back (no copy of every message), never modified.
    same = {"kind": "net", "node": "n1", "nics": [{"nic": "HCA-1"}, {"nic": "eth1"}]}
    assert t.canonical_net(same) is same
    same_gpu = {"kind": "gpu", "node": "n1", "gpus": [{"gpu": 0, "pci_bus_id": "0000:1a:00.0"}]}
    assert t.canonical_gpu(same_gpu) is same_gpu
    assert net is not None and gpu["gpus"][2] == {"gpu": 5}


def test_an_adapter_reported_as_netdev_and_as_rdma_port_is_one_nic_in_the_message():
    """A host reports each adapter twice, as its netdev and its RDMA port, with one PCI address; only one sample
    may carry the topology's name, else the NIC gets two points a second and a down link counts twice."""
    t = Topology.from_dict({"switches": [{"id": "l1", "tier": "leaf"}], "nodes": [
        {"id": "n1", "gpus": 0, "nics": [
            {"name": "HCA-1", "leaf": "l1", "pci": "0000:1c:00.0"},  # an NCCL XML gives PCI ids, no GUIDs
            {"name": "ens1f0np1", "leaf": "l1", "pci": "0000:1a:00.0", "aliases": ["mlx5_1"],
             "guids": ["0xba3fd2fffe123400"]}]}]})  # NetQ's netdev name, matched with the agent's RDMA port
    ib = t.canonical_net({"kind": "net", "node": "n1", "nics": [
        {"nic": "ib0", "pci_bus_id": "0000:1c:00.0", "link_up": False},
        {"nic": "mlx5_0/1", "pci_bus_id": "0000:1c:00.0", "node_guid": "e09d:7303:0085:94c4", "link_up": False}]})
    # the RDMA port (it has a GUID: its counters see the RDMA traffic) is HCA-1; IPoIB's ib0 stays ib0
    assert [(n["nic"], n.get("node_guid")) for n in ib["nics"]] == [("ib0", None), ("HCA-1", "e09d:7303:0085:94c4")]
    roce = t.canonical_net({"kind": "net", "node": "n1", "nics": [
        {"nic": "ens1f0np1", "pci_bus_id": "0000:1a:00.0", "tx_bytes_per_s": 1.0},
        {"nic": "mlx5_1/1", "pci_bus_id": "0000:1a:00.0", "port_guid": "ba3f:d2ff:fe12:3400",
         "tx_bytes_per_s": 9.0}]})
    # RoCE: the netdev already has the adapter's name; the RDMA port takes it, the netdev's view is left out
    assert roce["nics"] == [{"nic": "ens1f0np1", "pci_bus_id": "0000:1a:00.0", "port_guid": "ba3f:d2ff:fe12:3400",
                             "tx_bytes_per_s": 9.0}]
