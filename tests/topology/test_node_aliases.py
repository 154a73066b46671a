"""A host's declared other names (``aliases`` in the cluster file): ``ip-10-0-1-5`` or ``gpu-a1-ib`` for ``gpu-a1``.

Names not related by domain cannot be matched by the short-name rules (:mod:`tests.topology.test_node_names`);
the cluster file declares them, the schema refuses a clash with file:line and both hosts, and they resolve
exactly as the host's own name through :meth:`Topology.canonical_node`: placements, ``topology path`` and
the engine's telemetry path.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from whywait.agents.events import TOPIC_HOST, TOPIC_PLACEMENT, encode, envelope
from whywait.engine.evaluate.evaluator import Evaluator
from whywait.engine.rules.loader import load_rules
from whywait.engine.stream.processor import Processor, Record
from whywait.topology.errors import TopologyError
from whywait.topology.model import Topology
from whywait.topology.reconcile import merge
from whywait.topology.sources import HostFacts, NicFacts, SourceFacts, SwitchFacts

RULES = Path(__file__).resolve().parents[2] / "rules"

CLUSTER = """\
racks:
  - id: rack-a
switches:
  - {id: leaf-1, tier: leaf}
nodes:
  - id: gpu-a1
    aliases: [ip-10-0-1-5, gpu-a1-ib]
    gpus: 2
    nics:
      - {name: mlx5_0, leaf: leaf-1, gpus: [0, 1]}
  - id: node01
    aliases:
      - node01-ib
    gpus: 2
    nics:
      - {name: mlx5_0, leaf: leaf-1, gpus: [0, 1]}
"""


def load(tmp_path: Path, text: str) -> Topology:
    path = tmp_path / "topo.yaml"
    path.write_text(text)
    return Topology.from_yaml(path)


def problems(tmp_path: Path, text: str) -> list[str]:
    with pytest.raises(TopologyError) as err:
        load(tmp_path, text)
    return [line.strip() for line in str(err.value).splitlines()[1:]] or [str(err.value)]


# ---------------------------------------------------------------------------------------------- the schema

@pytest.mark.parametrize(("aliases", "want"), [
    ("[node01]", "5: nodes[0].aliases[0]: alias 'node01' of node 'gpu-a1' is the name of node 'node01' (nodes[1].id, "
                 "line 6)"),
    ("[NODE01.cluster.local.]", None),  # a full name of another host's short name is fine: only its name clashes
    # in file order: the second declaration is the one refused
    ("[node01-IB]", "7: nodes[1].aliases[0]: alias 'node01-ib' of node 'node01' is already an alias of node 'gpu-a1' "
                    "(nodes[0].aliases[0], line 5)"),
    ("[gpu-a1]", "5: nodes[0].aliases[0]: alias 'gpu-a1' of node 'gpu-a1' is that node's own name"),
    ("[leaf-1]", "5: nodes[0].aliases[0]: alias 'leaf-1' of node 'gpu-a1' is already an id (switches[0].id, line 2)"),
])
def test_an_alias_that_clashes_is_refused_with_its_line_and_both_hosts(tmp_path: Path, aliases: str,
                                                                     want: str | None) -> None:
    text = ("switches:\n  - {id: leaf-1, tier: leaf}\nnodes:\n  - id: gpu-a1\n"
            f"    aliases: {aliases}\n  - id: node01\n    aliases: [node01-ib]\n")
    if want is None:
        assert load(tmp_path, text).canonical_node("NODE01.cluster.local.") == "gpu-a1"
        return
    path = tmp_path / "topo.yaml"
    assert problems(tmp_path, text) == [f"{path}:{want}: an alias is unique in the topology"]


def test_an_alias_is_never_another_hosts_short_name_even_declared_later(tmp_path: Path) -> None:
    text = "nodes:\n  - id: gpu-a1\n    aliases: [node02]\n  - id: node02.cluster.local\n"
    assert problems(tmp_path, text) == [
        f"{tmp_path / 'topo.yaml'}:3: nodes[0].aliases[0]: alias 'node02' of node 'gpu-a1' is the short name of node "
        "'node02.cluster.local' (nodes[1].id, line 4): an alias is unique in the topology"]


def test_aliases_must_be_a_list_of_names(tmp_path: Path) -> None:
    text = "nodes:\n  - id: gpu-a1\n    aliases: [ip-10-0-1-5, 7]\n"
    assert problems(tmp_path, text) == [
        f"{tmp_path / 'topo.yaml'}:3: nodes[0].aliases: expected a list of the host's other names (strings) "
        "(got ['ip-10-0-1-5', 7])"]


def test_the_model_refuses_a_clash_too() -> None:
    t = Topology()
    t.add_node("gpu-a1", aliases=["ip-10-0-1-5"])
    with pytest.raises(TopologyError, match="alias 'IP-10-0-1-5' of node 'gpu-b1' is already an alias of node "
                                            "'gpu-a1'"):
        t.add_node("gpu-b1", aliases=["IP-10-0-1-5"])
    with pytest.raises(TopologyError, match="its name .* is already an alias of node 'gpu-a1'"):
        t.add_node("ip-10-0-1-5.ec2.internal")
    assert t.nodes() == ("gpu-a1",)


# ---------------------------------------------------------------------------------------------- resolution

def test_an_alias_resolves_like_the_hosts_own_name(tmp_path: Path) -> None:
    t = load(tmp_path, CLUSTER)
    assert t.aliases_of("gpu-a1") == ("ip-10-0-1-5", "gpu-a1-ib")
    for name in ("ip-10-0-1-5", "gpu-a1-ib", "IP-10-0-1-5", "ip-10-0-1-5.ec2.internal", "gpu-a1"):
        assert t.canonical_node(name) == "gpu-a1", name
    assert t.match_node("ip-10-0-1-5").how == "alias"
    assert t.canonical_node("node01-ib") == "node01"
    assert t.canonical_node("ip-10-0-1-6") is None
    assert "similar: " not in t.node_hint("ip-10-0-1-6")  # two hosts: both are listed instead
    assert t.path_between("ip-10-0-1-5/gpu1", "node01-ib") == (
        "gpu-a1 gpu 1", "gpu-a1", "gpu-a1 mlx5_0", "leaf-1", "node01 mlx5_0", "node01")


def test_a_placement_naming_an_alias_lands_on_the_host(tmp_path: Path) -> None:
    t = load(tmp_path, CLUSTER)
    info = t.apply_placement(envelope("placement", "sched", 1.0, job="j", project="p", team="t", state="running",
                                      ranks=[{"rank": 0, "node": "ip-10-0-1-5", "gpu": 0},
                                             {"rank": 1, "node": "node01-ib", "gpu": 1}]))
    assert info is not None and dict(info.ranks) == {0: ("gpu-a1", 0), 1: ("node01", 1)}
    assert t.jobs_on_node("gpu-a1") == (info,)
    # and a job of the cluster file itself may name a host by its alias
    t2 = load(tmp_path, CLUSTER + "jobs:\n  - {job: k, project: p, team: t, ranks: [{rank: 0, node: gpu-a1-ib, "
                                  "gpu: 1}]}\n")
    assert dict(t2.job("k").ranks) == {0: ("gpu-a1", 1)}


def test_aliases_round_trip_through_to_yaml(tmp_path: Path) -> None:
    t = load(tmp_path, CLUSTER)
    nodes = {n["id"]: n for n in t.to_dict()["nodes"]}
    assert nodes["gpu-a1"]["aliases"] == ["ip-10-0-1-5", "gpu-a1-ib"]
    assert "aliases" not in Topology().to_dict()["nodes"]
    out = tmp_path / "again.yaml"
    t.to_yaml(out)
    again = Topology.from_yaml(out)
    assert again.to_dict() == t.to_dict()
    assert again.canonical_node("gpu-a1-ib") == "gpu-a1" and again.aliases_of("node01") == ("node01-ib",)


# ---------------------------------------------------------------------------------------------- the merge

def _sources() -> list[SourceFacts]:
    fabric = SourceFacts("fabric.out", "ibnetdiscover", switches={"leaf-1": SwitchFacts("leaf-1", "fabric.out:1",
                                                                                       "leaf")})
    fabric.hosts = {"gpu-a1": HostFacts("gpu-a1", "fabric.out:2", nics=[NicFacts("mlx5_0", "fabric.out:2", "leaf-1")])}
    agent = SourceFacts("agent.jsonl", "agent",
                        hosts={"ip-10-0-1-5": HostFacts("ip-10-0-1-5", "agent.jsonl:1", (0, 1))})
    return [fabric, agent]


def test_the_merge_keeps_aliases_and_makes_a_host_named_by_one_that_host() -> None:
    res = merge(_sources(), aliases={"gpu-a1": ["ip-10-0-1-5", "gpu-a1-ib"]})
    t = res.topology
    assert res.conflicts == [] and t.nodes() == ("gpu-a1",)  # not two hosts
    assert t.aliases_of("gpu-a1") == ("ip-10-0-1-5", "gpu-a1-ib")
    assert t.gpus_of("gpu-a1") == (0, 1)  # the agent's GPUs, on the fabric's host
    assert t.canonical_node("ip-10-0-1-5") == "gpu-a1"
    assert not any("named differently" in w for w in res.warnings), res.warnings
    # what a cluster file holds survives a re-import
    again = merge(_sources(), aliases={n: t.aliases_of(n) for n in t.nodes()})
    assert again.topology.to_dict() == t.to_dict()


def test_the_merge_without_aliases_keeps_two_hosts_and_says_unknown_owners() -> None:
    assert merge(_sources()).topology.nodes() == ("gpu-a1", "ip-10-0-1-5")
    res = merge(_sources(), aliases={"gone": ["x-1"]})
    assert any("declared for node 'gone', which no source names" in w for w in res.warnings)


# ---------------------------------------------------------------------------------------------- the engine path

def _host(node: str, t: float) -> bytes:
    return encode(envelope("host", node, t, cpu_busy_pct=1.0, cpu_iowait_pct=0.0, mem_used_bytes=1,
                           mem_total_bytes=2))


def test_telemetry_and_placements_under_an_alias_are_evaluated_under_the_host(tmp_path: Path) -> None:
    t = load(tmp_path, CLUSTER)
    p = Processor(Evaluator(load_rules([RULES]), t), wall_clock=lambda: 1000.0)
    place = envelope("placement", "ctld", 989.0, job="j", project="p", team="t", state="running",
                     ranks=[{"rank": 0, "node": "ip-10-0-1-5", "gpu": 0}])
    out = p.process([Record(TOPIC_PLACEMENT, encode(place)), Record(TOPIC_HOST, _host("ip-10-0-1-5", 990.0)),
                     Record(TOPIC_HOST, _host("node01-ib", 990.0)), Record(TOPIC_HOST, _host("nobody", 990.0))])
    assert [json.loads(v)["category"] for _, v in out.dead_letters] == ["unknown_node"]
    assert set(p.evaluator.store.node_last) == {"gpu-a1", "node01"}
    assert t.job("j").nodes == ("gpu-a1",)


def test_the_evaluator_alone_renames_an_alias(tmp_path: Path) -> None:
    ev = Evaluator(load_rules([RULES]), load(tmp_path, CLUSTER))
    ev.ingest(json.loads(_host("gpu-a1-ib", 5.0)))
    assert set(ev.store.node_last) == {"gpu-a1"}


def test_a_re_import_keeps_the_aliases_added_to_the_cluster_file(tmp_path: Path,
                                                                 capsys: pytest.CaptureFixture[str]) -> None:
    # `topology import` writes the cluster file anew from the sources: aliases added to it by hand were lost on
    # the next import.  `--aliases` takes them from the earlier file (or an `aliases:` mapping).
    from whywait.engine.cli import main
    from whywait.topology.model import Topology

    conf = tmp_path / "topology.conf"
    conf.write_text("SwitchName=s1 Nodes=gpu-a1,gpu-a2\n")
    first = tmp_path / "c1.yaml"
    assert main(["topology", "import", "slurm-conf", str(conf), "-o", str(first)]) == 0
    edited = first.read_text().replace("- id: gpu-a1\n", "- id: gpu-a1\n  aliases: [ip-10-0-1-5]\n", 1)
    assert edited != first.read_text()
    first.write_text(edited)
    again = tmp_path / "c2.yaml"
    assert main(["topology", "import", "slurm-conf", str(conf), "--aliases", str(first), "-o", str(again)]) == 0
    topo = Topology.from_yaml(again)
    assert topo.canonical_node("ip-10-0-1-5") == "gpu-a1" and topo.aliases_of("gpu-a1") == ("ip-10-0-1-5",)
    mapping = tmp_path / "aliases.yaml"
    mapping.write_text("aliases:\n  gpu-a2: [ip-10-0-1-6]\n")
    third = tmp_path / "c3.yaml"
    assert main(["topology", "import", "slurm-conf", str(conf), "--aliases", str(mapping), "-o", str(third)]) == 0
    assert Topology.from_yaml(third).canonical_node("ip-10-0-1-6") == "gpu-a2"
    capsys.readouterr()
    mapping.write_text("aliases:\n  gpu-a2: ip-10-0-1-6\n")
    assert main(["topology", "import", "slurm-conf", str(conf), "--aliases", str(mapping)]) == 2
    err = capsys.readouterr().err.strip()
    assert err == (f"whywait topology: {mapping}:2: aliases.gpu-a2: expected a host's name and a list of names "
                   "(got 'ip-10-0-1-6')"), err


def test_a_hosts_switch_from_topology_conf_is_kept_when_the_agent_names_its_nics(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    # topology.conf says vm is under leaf1 and names no NIC; the agent names vm's NICs and no switch.  The merge
    # dropped the switch ("1 host(s) without a switch"), silently, with the host's paths and contention.
    import json

    from whywait.engine.cli import main
    from whywait.topology.model import Topology

    conf = tmp_path / "topology.conf"
    conf.write_text("SwitchName=leaf1 Nodes=vm\n")
    agent = tmp_path / "agent.jsonl"
    agent.write_text(json.dumps({"schema": 2, "kind": "net", "time": 1.7e9, "node": "vm", "interval_s": 1.0,
                                 "nics": [{"nic": "eth0", "rx_bytes_per_s": 0.0, "tx_bytes_per_s": 0.0}]}) + "\n")
    out = tmp_path / "cluster.yaml"
    assert main(["topology", "import", "slurm-conf", str(conf), "agent", str(agent), "-o", str(out)]) == 0
    err = capsys.readouterr().err
    assert "node 'vm': no source cables its NIC(s) eth0; put under 'leaf1' as" in err, err
    topo = Topology.from_yaml(out)
    assert topo.leaf_of("vm") == "leaf1"
