"""One host, several names: ``node01`` to Slurm, ``node01.cluster.local`` to Kubernetes, a fabric dump or an agent.

The topology's own name is the host's; a short name and a full one are the same host when exactly one host
has that short name, never two full names (``node01.a`` is not ``node01.b``).  The model, the merge of
import sources, placements and the engine's telemetry path all resolve through
:meth:`Topology.canonical_node`; a name that matches nothing is refused with the names the topology holds.
"""

from __future__ import annotations

import json
import logging
from pathlib import Path

import pytest
from whywait.agents.events import TOPIC_GPU, TOPIC_HOST, TOPIC_PLACEMENT, TOPIC_STEPS, encode, envelope
from whywait.engine.evaluate.evaluator import Evaluator
from whywait.engine.placement.filesource import placements_from_text
from whywait.engine.placement.model import JobFacts, Owner, placement_message
from whywait.engine.placement.ownership import OwnershipFile
from whywait.engine.placement.slurm import facts_from_env
from whywait.engine.rules.loader import load_rules
from whywait.engine.stream.partitioning import OwnedTopology
from whywait.engine.stream.processor import Processor, Record
from whywait.topology.errors import UnknownEntityError
from whywait.topology.model import NodeNames, Topology, node_name_groups, short_name
from whywait.topology.reconcile import merge
from whywait.topology.sources import HostFacts, NicFacts, SourceFacts, SwitchFacts, read_slurm_conf

from tests.placement.conftest import FIX as PLACEMENT_FIX

RULES = Path(__file__).resolve().parents[2] / "rules"


def topo(*names: str, gpus: int = 2) -> Topology:
    t = Topology()
    for n in names:
        t.add_node(n, gpus=gpus)
    return t


# ---------------------------------------------------------------------------------------------- the model

def test_short_names() -> None:
    assert short_name("node01.cluster.local") == "node01"
    assert short_name("node01") == "node01"
    assert short_name("node01.cluster.local.") == "node01"  # a rooted DNS name
    assert short_name("10.0.0.1") == "10.0.0.1"  # an address is not host "10"
    assert short_name(".odd") == ".odd"


@pytest.mark.parametrize(("hosts", "given", "want", "how"), [
    (("node01", "node02"), "node01.cluster.local", "node01", "short"),  # the agent's FQDN, Slurm's topology
    (("node01.cluster.local", "node02.cluster.local"), "node01", "node01.cluster.local", "short"),  # the reverse
    (("node01",), "NODE01.Cluster.Local.", "node01", "short"),  # DNS names ignore case and a trailing dot
    (("node01",), "Node01", "node01", "case"),
    (("node01",), "node01", "node01", "exact"),
])
def test_a_host_is_matched_by_its_other_name(hosts: tuple[str, ...], given: str, want: str, how: str) -> None:
    t = topo(*hosts)
    m = t.match_node(given)
    assert (m.node, m.how, m.ambiguous) == (want, how, ())
    assert t.canonical_node(given) == want


def test_two_full_names_are_never_one_host() -> None:
    t = topo("node01.a")
    assert t.canonical_node("node01.b") is None  # another domain's node01
    assert t.canonical_node("node01") == "node01.a"  # the only node01 there is


def test_a_short_name_two_hosts_share_is_neither() -> None:
    t = topo("node01.a", "node01.b", "node02")
    m = t.match_node("node01")
    assert m.node is None and m.ambiguous == ("node01.a", "node01.b")
    assert t.canonical_node("node01") is None
    assert t.canonical_node("node01.c") is None  # unknown; the similar ones are listed
    # a bare host and a full one of one short name: a third full name could be either
    t2 = topo("node01", "node01.a")
    assert t2.canonical_node("node01.b") is None and t2.match_node("node01.b").ambiguous == ("node01", "node01.a")
    assert t2.canonical_node("node01") == "node01" and t2.canonical_node("node01.a") == "node01.a"


def test_a_host_added_later_makes_a_short_name_ambiguous() -> None:
    t = topo("node01.a")
    assert t.canonical_node("node01") == "node01.a"  # remembered...
    t.add_node("node01.b", gpus=1)
    assert t.canonical_node("node01") is None  # ...until the hosts change


def test_placing_a_job_does_not_rebuild_the_name_index() -> None:
    t = topo("node01", "node02")
    index = t.node_names()
    t.place_job("j", "p", "t", None, {0: ("node01.x", 0)})
    assert t.node_names() is index


def test_the_memo_of_other_names_is_bounded() -> None:
    from whywait.topology import model

    t = topo("node01")
    for i in range(model._NODE_MEMO_MAX + 50):
        assert t.canonical_node(f"invented-{i}") is None
    assert len(t._node_memo) <= model._NODE_MEMO_MAX
    assert t.canonical_node("node01.cluster.local") == "node01"


def test_placements_are_stored_under_the_topology_names() -> None:
    t = topo("node01", "node02")
    info = t.apply_placement(envelope("placement", "sched", 1.0, job="j", project="p", team="t", state="running",
                                      ranks=[{"rank": 0, "node": "node01.cluster.local", "gpu": 0},
                                             {"rank": 1, "node": "NODE02", "gpu": 1}]))
    assert info is not None and dict(info.ranks) == {0: ("node01", 0), 1: ("node02", 1)}
    assert info.nodes == ("node01", "node02")
    assert t.jobs_on_node("node01") == (info,) and t.rank_on("j", "node02") == 1


def test_a_placement_on_an_ambiguous_or_unknown_name_says_which_hosts_it_could_be() -> None:
    t = topo("node01.a", "node01.b")
    with pytest.raises(UnknownEntityError, match=r"unknown node 'node01' \(it could be any of node01.a, node01.b, "
                                                 r"which share its short name 'node01'\)"):
        t.place_job("j", "p", "t", None, {0: ("node01", 0)})
    big = topo(*(f"gpu-node-{i:02d}" for i in range(1, 21)))
    with pytest.raises(UnknownEntityError, match=r"similar: gpu-node-07"):
        big.place_job("j", "p", "t", None, {0: ("gpu-node-7", 0)})
    with pytest.raises(UnknownEntityError, match=r"unknown gpu 'gpu-node-07 gpu 5'"):  # the GPU under its own name
        big.place_job("j", "p", "t", None, {0: ("gpu-node-07.cluster.local", 5)})


def test_unknown_node_reason_names_similar_hosts_and_the_fix() -> None:
    big = topo(*(f"gpu-node-{i:02d}" for i in range(1, 21)))
    reason = big.unknown_node_reason("gpu-node-7.cluster.local")
    assert reason.startswith("'gpu-node-7.cluster.local' is not in the topology (known: gpu-node-01 … gpu-node-20, "
                             "20 in all; similar: gpu-node-07")
    assert reason.endswith("give the agent the topology's name (whywait agent --node NAME) or add the host to the "
                           "topology")
    small = topo("a1", "a2")
    assert "(known: a1, a2)" in small.unknown_node_reason("zzz")  # a short list names them all
    # a query keeps its plain hint: the names the topology holds
    with pytest.raises(UnknownEntityError, match=r"\(known: a1, a2\)$"):
        small.gpus_of("zzz")


def test_similar_names_are_looked_for_a_bounded_number_of_times() -> None:
    from whywait.topology import model

    big = topo(*(f"gpu-node-{i:02d}" for i in range(1, 21)))
    for i in range(model._SIMILAR_MAX):
        big.node_hint(f"invented-{i}")
    assert "similar" not in big.node_hint("gpu-node-7")  # invented names in bulk cost difflib no more
    assert big.node_hint("gpu-node-07.x") == "the topology calls it 'gpu-node-07'"


def test_user_spellings_of_a_node_or_gpu_take_its_other_name() -> None:
    t = topo("node01", "node02")
    assert t.entity_id("node01.cluster.local") == "node01"
    assert t.entity_id("node01.cluster.local/gpu1") == "node01 gpu 1"
    assert t.entity_id("nowhere") == "nowhere"


def test_name_groups_across_sources() -> None:
    host_of, apart = node_name_groups(["node01.cluster.local", "node02", "node01", "Node02.cluster.local",
                                       "x.a", "x.b", "x", "X"])
    assert host_of["node01"] == host_of["node01.cluster.local"] == "node01.cluster.local"  # the first named wins
    assert host_of["Node02.cluster.local"] == "node02"
    assert host_of["x.a"] == "x.a" and host_of["x.b"] == "x.b" and host_of["x"] == host_of["X"] == "x"
    assert apart == [("x", ("x.a", "x.b"))]


def test_node_names_index_agrees_with_the_groups() -> None:
    names = ["node01.cluster.local", "node01", "x.a", "x.b", "x"]
    host_of, _ = node_name_groups(names)
    index = NodeNames(set(host_of.values()))
    for n in names:
        assert index.match(n).node == host_of[n]


# ---------------------------------------------------------------------------------------------- the merge

def _fabric() -> SourceFacts:
    f = SourceFacts("fabric.out", "ibnetdiscover")
    f.switches = {"spine-1": SwitchFacts("spine-1", "fabric.out:1", "spine"),
                  "leaf-1": SwitchFacts("leaf-1", "fabric.out:2", "leaf", {"spine-1"})}
    f.hosts = {n: HostFacts(n, f"fabric.out:{i}", nics=[NicFacts("mlx5_0", f"fabric.out:{i}", "leaf-1",
                                                                 guids={f"00000000000000a{i}"})])
               for i, n in enumerate(("node01.cluster.local", "node02.cluster.local"), start=1)}
    return f


def test_merge_makes_a_fabric_fqdn_and_a_slurm_short_name_one_host(tmp_path: Path) -> None:
    conf = tmp_path / "topology.conf"
    conf.write_text("SwitchName=leaf-1 Nodes=node[01-02]\n")
    gpus = SourceFacts("smi", "nvidia-smi", {"NODE01": HostFacts("NODE01", "smi:1", (0, 1, 2, 3))})
    res = merge([read_slurm_conf(conf), gpus, _fabric()])
    t = res.topology
    assert t.nodes() == ("node01.cluster.local", "node02.cluster.local")  # not four hosts
    assert res.conflicts == [] and t.unmatched == ()
    assert t.gpus_of("node01.cluster.local") == (0, 1, 2, 3)
    assert [n.name for n in t.nics_of("node01.cluster.local")] == ["mlx5_0"]  # not a second NIC 'ib0' from Slurm
    assert any("2 host(s) named differently" in w and "node01.cluster.local (also node01, NODE01)" in w
               for w in res.warnings), res.warnings
    assert t.canonical_node("node01") == "node01.cluster.local"


def test_merge_says_when_the_short_name_is_both_hosts_a_and_b_and_keeps_it_apart(tmp_path: Path) -> None:
    fab = _fabric()
    fab.hosts = {n: HostFacts(n, f"fabric.out:{i}", nics=[NicFacts("mlx5_0", f"fabric.out:{i}", "leaf-1")])
                 for i, n in enumerate(("node01.a", "node01.b"), start=1)}
    conf = tmp_path / "topology.conf"
    conf.write_text("SwitchName=leaf-1 Nodes=node01\n")
    res = merge([read_slurm_conf(conf), fab])
    assert res.topology.nodes() == ("node01", "node01.a", "node01.b")
    assert res.topology.unmatched == (f"{conf}:1: node 'node01' could be any of node01.a, node01.b (they share its "
                                      "short name); kept as a host of its own: name it in full in this source",)


def test_merge_applies_a_node_type_matched_on_any_of_the_host_names(tmp_path: Path) -> None:
    from whywait.topology.reconcile import NodeType

    conf = tmp_path / "topology.conf"
    conf.write_text("SwitchName=leaf-1 Nodes=node[01-02]\n")
    dgx = NodeType("dgx", ("node0[0-9]",), "types.yaml:1", gpus=8)  # a glob on Slurm's short names
    res = merge([read_slurm_conf(conf), _fabric()], [dgx])
    assert res.topology.gpus_of("node01.cluster.local") == tuple(range(8))
    assert res.topology.node_type_of("node02.cluster.local") == "dgx"


# ---------------------------------------------------------------------------------------------- placements

def test_placements_from_every_source_land_on_the_topology_hosts() -> None:
    t = topo("node01", "node02", gpus=8)
    own = OwnershipFile(PLACEMENT_FIX / "ownership.yaml")
    # a hand-written file with the Kubernetes names, the Slurm prolog's short names
    [from_file] = placements_from_text("job: a\nproject: p\nteam: t\nnodes:\n  - {node: node01.cluster.local, "
                                       "gpus: 2}\n", "p.yaml", own, "me", now=1.0)
    slurm = placement_message(facts_from_env({"SLURM_JOB_ID": "7", "SLURM_JOB_NODELIST": "node[01-02]",
                                              "SLURM_JOB_GPUS": "0,1"}, False), Owner("p", "t", None), 1.0, "ctld")
    k8s = placement_message(JobFacts("ns/c", "k8s", (("node02.cluster.local", (3,)),)), Owner("p", "t", None), 1.0,
                            "watcher")
    for msg in (from_file, slurm, k8s):
        t.apply_placement(msg)
    assert dict(t.job("a").ranks) == {0: ("node01", 0), 1: ("node01", 1)}
    assert t.job("slurm-7").nodes == ("node01", "node02")
    assert dict(t.job("ns/c").ranks) == {0: ("node02", 3)}


# ---------------------------------------------------------------------------------------------- the engine path

def _host(node: str, t: float) -> bytes:
    return encode(envelope("host", node, t, cpu_busy_pct=1.0, cpu_iowait_pct=0.0, mem_used_bytes=1,
                           mem_total_bytes=2))


def _processor(t: Topology) -> Processor:
    return Processor(Evaluator(load_rules([RULES]), t), wall_clock=lambda: 1000.0)


def test_telemetry_under_the_agents_fqdn_is_evaluated_under_the_topology_name() -> None:
    t = topo("node01", "node02")
    p = _processor(t)
    out = p.process([Record(TOPIC_HOST, _host("node01.cluster.local", 990.0)),
                     Record(TOPIC_GPU, encode(envelope("gpu", "node02.cluster.local", 990.0, gpus=[
                         {"gpu": 0, "util_pct": 90.0, "mem_util_pct": 10.0, "mem_used_bytes": 1,
                          "mem_total_bytes": 2, "temp_c": 60.0, "power_w": 500.0, "sm_clock_mhz": 1900.0,
                          "throttle_reasons": [], "ecc_corrected": 0, "ecc_uncorrected": 0, "xid": []}])))])
    assert out.dead_letters == [] and p.counts["messages"] == 2
    assert set(p.evaluator.store.node_last) == {"node01", "node02"}  # stored as the placements name them


def test_the_evaluator_alone_renames_too() -> None:
    ev = Evaluator(load_rules([RULES]), topo("node01"))
    ev.ingest(json.loads(_host("NODE01.cluster.local", 5.0)))
    assert set(ev.store.node_last) == {"node01"}
    ev.topology = topo("node09")  # a reloaded topology is read afresh
    ev.ingest(json.loads(_host("node09.x", 6.0)))
    assert set(ev.store.node_last) == {"node01", "node09"}


def test_unknown_telemetry_is_dead_lettered_with_the_similar_names_and_logged_once(
        caplog: pytest.LogCaptureFixture) -> None:
    t = topo(*(f"gpu-node-{i:02d}" for i in range(1, 9)))
    p = _processor(t)
    with caplog.at_level(logging.WARNING, "whywait.engine.stream.processor"):
        out = p.process([Record(TOPIC_HOST, _host("gpu-node-7", 990.0 + i)) for i in range(3)])
    reasons = [json.loads(v) for _, v in out.dead_letters]
    assert [d["category"] for d in reasons] == ["unknown_node"] * 3
    assert reasons[0]["reason"] == ("node: 'gpu-node-7' is not in the topology (known: gpu-node-01 … gpu-node-08, "
                                    "8 in all; similar: gpu-node-07, gpu-node-01, gpu-node-02); give the agent the "
                                    "topology's name (whywait agent --node NAME) or add the host to the topology")
    logged = [r.getMessage() for r in caplog.records if "dead-lettered" in r.getMessage()]
    assert len(logged) == 1 and "similar: gpu-node-07" in logged[0]


def test_a_rank_reported_under_the_agents_fqdn_is_not_taken_for_someone_elses() -> None:
    t = topo("node01", "node02")
    p = _processor(t)
    place = envelope("placement", "ctld", 990.0, job="j", project="p", team="t", state="running", user="alice",
                     ranks=[{"rank": 0, "node": "node01", "gpu": 0}, {"rank": 1, "node": "node02", "gpu": 0}])
    steps = envelope("steps", "node02.cluster.local", 991.0, job="j", sender_user="alice", steps=[
        {"rank": 1, "step": 1, "duration_s": 1.0, "compute_s": 0.5, "comm_s": 0.5}])
    wrong = envelope("steps", "node01.cluster.local", 991.0, job="j", sender_user="alice", steps=[
        {"rank": 1, "step": 1, "duration_s": 1.0, "compute_s": 0.5, "comm_s": 0.5}])
    out = p.process([Record(TOPIC_PLACEMENT, encode(place)), Record(TOPIC_STEPS, encode(steps)),
                     Record(TOPIC_STEPS, encode(wrong))])
    assert [json.loads(v)["reason"] for _, v in out.dead_letters] == [
        "job j: rank 1 runs on node02, but node01.cluster.local reported its timings"]


def test_the_router_and_a_restore_use_the_topology_name() -> None:
    from whywait.engine.stream.partitioning import partition_for

    t = topo("node01", "node02")
    t.place_job("j", "p", "t", None, {0: ("node01", 0)})
    p = Processor(Evaluator(load_rules([RULES]), OwnedTopology(t, 4)))
    out = p.route([Record(TOPIC_HOST, _host("node01.cluster.local", 10.0), offset=1),
                   Record(TOPIC_HOST, _host("node09", 10.0), offset=2)], 4)
    assert [(f[0], f[1]) for f in out.forwards] == [(partition_for("j", 4), b"j")]  # routed to the job on node01
    assert [json.loads(v)["category"] for _, v in out.dead_letters] == ["unknown_node"]
    assert p.restore([(TOPIC_HOST, _host("node02.cluster.local", 11.0))]) == 1
    assert "node02" in p.evaluator.store.node_last
