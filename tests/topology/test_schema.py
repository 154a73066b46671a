"""The topology YAML format: round trips, and malformed files with their exact messages."""

from __future__ import annotations

from pathlib import Path

import pytest
from whywait.simulate.cluster import make_cluster
from whywait.topology import Topology, TopologyError
from whywait.topology.model import TIERS

FIX = Path(__file__).resolve().parents[1] / "fixtures" / "topology"


def test_small_file_loads():
    topo = Topology.from_yaml(FIX / "small.yaml")
    assert topo.name == "lab" and topo.nodes() == ("gpu-a1", "gpu-b1")
    assert topo.expected_nic("gpu-a1", 3) == "mlx5_1"
    assert topo.mounts_of("gpu-b1")[0].device == "lustre:/scratch"  # default device: <type>:/<pool>
    assert topo.pool_type("scratch") == "lustre"
    assert topo.rack_of("gpu-b1") is None
    assert topo.common_switch(["gpu-a1", "gpu-b1"]) == "spine-1"
    assert topo.job("finetune").ranks == {0: ("gpu-a1", 0), 1: ("gpu-b1", 1)}
    assert topo.path_for_rank("finetune", 1) == (
        "job finetune rank 1", "gpu-b1 gpu 1", "gpu-b1", "gpu-b1 eth0", "leaf-2", "spine-1")


def test_round_trip_of_a_made_cluster(tmp_path):
    topo = make_cluster(nodes=10, nodes_per_leaf=4, pools=("scratch", "data"))
    topo.place_job("j", "p", "t", "#c", {0: ("node-03", 1), 1: ("node-10", 7)})
    topo.to_yaml(tmp_path / "t.yaml")
    again = Topology.from_yaml(tmp_path / "t.yaml")
    assert again.to_dict() == topo.to_dict()
    assert again.path_for_rank("j", 1) == topo.path_for_rank("j", 1)
    assert Topology.from_dict(topo.to_dict(include_jobs=False)).jobs() == ()


def test_every_problem_of_a_file_is_reported_with_its_line():
    path = FIX / "malformed" / "many.yaml"
    with pytest.raises(TopologyError) as info:
        Topology.from_yaml(path)
    assert info.value.problems == (
        f"{path}:4: racks[1].id: duplicate id 'rack-a' (first declared at racks[0].id)",
        f"{path}:6: switches[0].tier: expected one of leaf, spine, core (got 'edge')",
        f"{path}:7: switches[1].uplinks[0]: expected a switch declared under 'switches' (got 'spine-9')",
        f"{path}:9: storage_pools[0].size: unknown key (valid: id, type)",
        f"{path}:12: nodes[0].gpus: expected a GPU count or a list of distinct GPU indexes (at most 1024) "
        "(got 'eight')",
        f"{path}:14: nodes[1].rack: expected a rack declared under 'racks' (got 'rack-z')",
        f"{path}:17: nodes[1].nics[0].leaf: expected a switch of tier 'leaf' declared under 'switches' "
        "(got 'leaf-9')",
        f"{path}:17: nodes[1].nics[0].gpus: expected a list of this node's GPU indexes [0, 1] (got [0, 5])",
        f"{path}:19: nodes[1].mounts[0].pool: expected a pool declared under 'storage_pools' (got 'nowhere')",
        f"{path}:21: nodes[2].gpu: unknown key (valid: aliases, gpu_pci, gpus, id, mounts, nics, rack, type)",
        f"{path}:23: jobs[0].ranks[0].node: expected a node declared under 'nodes' (got 'n9')",
    )
    assert str(info.value).startswith(f"11 problems in {path}:\n  {path}:4: racks[1].id: duplicate id")


@pytest.mark.parametrize("text, message", [
    ("[1, 2]", "{p}: expected a mapping at the top level (got list)"),
    ("format: 2\n", "{p}:1: format: expected 1 (got 2)"),
    ("nodes: {id: x}\n", "{p}:1: nodes: expected a list (got {{'id': 'x'}})"),
    ("nodes:\n  - {gpus: 1}\n", "{p}:2: nodes[0].id: is required"),
    ("switches:\n  - {id: s, tier: leaf, uplinks: [s2]}\n  - {id: s2, tier: leaf}\n",
     "{p}:2: switches[0].uplinks[0]: expected a switch of a tier above 'leaf' (got 's2 (leaf)')"),
    ("nodes: [\n", "{p}:2: not valid YAML: expected the node content, but found '<stream end>'"),
])
def test_single_problems(tmp_path, text, message):
    path = tmp_path / "t.yaml"
    path.write_text(text)
    with pytest.raises(TopologyError) as info:
        Topology.from_yaml(path)
    assert str(info.value) == message.format(p=path)


def test_missing_file():
    with pytest.raises(TopologyError, match=r"nope.yaml: cannot read: No such file or directory"):
        Topology.from_yaml("nope.yaml")


def test_a_rank_on_a_refused_node_is_not_a_second_problem(tmp_path, capsys):
    """`topology check` of a file whose node-01 has bad `gpus` also said its job's rank named an undeclared node."""
    from whywait.engine.cli import main

    path = tmp_path / "t.yaml"
    path.write_text("format: 1\nnodes:\n  - {id: node-01, gpus: -1}\n  - {id: node-02, gpus: 1}\njobs:\n"
                    "  - {job: j, project: p, team: t, ranks: [{rank: 0, node: node-01, gpu: 0},\n"
                    "                                          {rank: 1, node: node-09, gpu: 0}]}\n")
    with pytest.raises(TopologyError) as info:
        Topology.from_yaml(path)
    assert info.value.problems == (
        f"{path}:3: nodes[0].gpus: expected a GPU count or a list of distinct GPU indexes (at most 1024) (got -1)",
        f"{path}:7: jobs[0].ranks[1].node: expected a node declared under 'nodes' (got 'node-09')",
    )
    assert main(["topology", "check", str(path)]) == 1
    assert capsys.readouterr().out.splitlines() == list(info.value.problems)


def test_a_job_missing_a_required_key_is_reported_not_a_crash(tmp_path):
    """A job without `project` (a file cut short, or a hand edit) was a KeyError: an internal error."""
    path = tmp_path / "t.yaml"
    path.write_text("format: 1\nnodes:\n  - {id: node-01, gpus: 1}\njobs:\n  - job: finetune\n")
    with pytest.raises(TopologyError) as info:
        Topology.from_yaml(path)
    assert info.value.problems == (
        f"{path}:5: jobs[0].project: is required",
        f"{path}:5: jobs[0].ranks: is required",
        f"{path}:5: jobs[0].team: is required",
    )


def test_a_refused_switch_is_not_a_second_problem_where_it_is_named(tmp_path):
    """A leaf with a bad tier was also reported as undeclared by every uplink and NIC that names it."""
    path = tmp_path / "t.yaml"
    path.write_text("format: 1\nswitches:\n  - {id: spine-1, tier: spine}\n"
                    "  - {id: leaf-1, tier: leef, uplinks: [spine-1]}\n"
                    "  - {id: leaf-2, tier: leaf, uplinks: [leaf-1]}\n"
                    "nodes:\n  - {id: node-01, gpus: 1, nics: [{name: eth0, leaf: leaf-1}]}\n")
    with pytest.raises(TopologyError) as info:
        Topology.from_yaml(path)
    assert info.value.problems == (
        f"{path}:4: switches[1].tier: expected one of {', '.join(TIERS)} (got 'leef')",
    )


def test_a_gpu_count_past_any_machine_is_refused_not_numbered(tmp_path):
    """`gpus: 100000000` (a typo) numbered GPUs 0..N-1 and took the process's memory."""
    path = tmp_path / "t.yaml"
    path.write_text("format: 1\nnodes:\n  - {id: node-01, gpus: 100000000}\n")
    with pytest.raises(TopologyError) as info:
        Topology.from_yaml(path)
    assert info.value.problems == (f"{path}:3: nodes[0].gpus: expected a GPU count or a list of distinct GPU "
                                   "indexes (at most 1024) (got 100000000)",)
