"""Loaders of real formats, tested on copied real captures (see tests/fixtures/topology/ATTRIBUTION.md)."""

from __future__ import annotations

from pathlib import Path

import pytest
from whywait.topology import Topology, TopologyError
from whywait.topology.loaders import (
    LoadReport,
    add_nccl_node,
    expand_hostlist,
    load_ibnetdiscover,
    load_nccl_topology,
    load_slurm_topology,
    switch_name,
)

FIX = Path(__file__).resolve().parents[1] / "fixtures" / "topology"


@pytest.fixture(scope="module")
def fabric() -> tuple[Topology, LoadReport]:
    rep = LoadReport("ibnetdiscover")
    topo = load_ibnetdiscover(FIX / "ibnetdiscover-example.out", rack_of=r"^(.*)-c\d+$", report=rep)
    return topo, rep


def test_ibnetdiscover_switch_hierarchy(fabric):
    topo, rep = fabric
    assert rep.switches == 40
    assert len(topo.switches("leaf")) == 31 and len(topo.switches("spine")) == 9
    assert all("IBLEAF" in s for s in topo.switches("leaf"))
    assert all("IBSPINE" in s for s in topo.switches("spine"))
    assert topo.spines_of("A09-P1-IBLEAF-04-04")[:2] == ("A10-P1-IBSPINE-02", "A10-P1-IBSPINE-03")


def test_ibnetdiscover_hosts_and_rails(fabric):
    topo, rep = fabric
    assert rep.nodes == len(topo.nodes()) == 122
    # A DGX has several HCAs, each cabled to a different leaf (a rail-optimised fabric).
    nics = topo.nics_of("a08-p1-dgx-04-c01")
    assert [n.name for n in nics] == ["mlx5_0", "mlx5_1", "mlx5_4", "mlx5_5"]
    assert nics[3].leaf == "A09-P1-IBLEAF-04-04"
    assert len(topo.leaves_of("a08-p1-dgx-04-c01")) == 4
    assert topo.rack_of("a08-p1-dgx-04-c01") == "a08-p1-dgx-04"
    assert "a08-p1-dgx-04-c17" in topo.nodes_under("A09-P1-IBLEAF-04-04")
    assert len(topo.nodes_under("A10-P1-IBSPINE-01")) > 100
    assert any("Aggregation Node" in s for s in rep.skipped)  # SHARP nodes are not hosts
    assert topo.path_for_node("a08-p1-dgx-04-c01")[:3] == (
        "a08-p1-dgx-04-c01", "a08-p1-dgx-04-c01 mlx5_0", topo.nics_of("a08-p1-dgx-04-c01")[0].leaf)


def test_ibnetdiscover_round_trips_through_yaml(fabric, tmp_path):
    topo, _ = fabric
    topo.to_yaml(tmp_path / "fabric.yaml")
    again = Topology.from_yaml(tmp_path / "fabric.yaml")
    assert again.to_dict() == topo.to_dict()


def test_ibnetdiscover_errors_name_the_line(tmp_path):
    bad = tmp_path / "bad.out"
    bad.write_text('Switch\t65 "S-2c5e"\t\t# "MF0;LEAF-1:X" enhanced port 0 lid 1 lmc 0\n[1]\tgarbage\n')
    with pytest.raises(TopologyError) as info:
        load_ibnetdiscover(bad)
    assert str(info.value) == (f"{bad}:2: expected a port line '[N] \"S-|H-<guid>\"[M] # \"desc\"' "
                               "(got '[1]\\tgarbage')")
    empty = tmp_path / "empty.out"
    empty.write_text("# nothing\n")
    with pytest.raises(TopologyError, match="expected an ibnetdiscover dump with 'Switch' blocks"):
        load_ibnetdiscover(empty)


def test_switch_names():
    assert switch_name("MF0;A09-P1-IBLEAF-04-04:MQM9701/U1", "S-1") == "A09-P1-IBLEAF-04-04"
    assert switch_name("", "S-1") == "S-1"


def test_slurm_tree():
    topo = load_slurm_topology(FIX / "slurm-tree.conf")
    assert topo.switches("core") == ("switch.3.1",)
    assert len(topo.switches("spine")) == 6 and len(topo.switches("leaf")) == 12
    assert topo.leaf_of("srv1101") == "switch.1.1"
    assert topo.nodes_under("switch.2.1") == tuple(f"srv{n}" for n in (*range(1101, 1109), *range(1201, 1209)))
    assert topo.common_switch(["srv1101", "srv1201"]) == "switch.2.1"
    assert topo.common_switch(["srv1101", "srv6208"]) == "switch.3.1"


def test_slurm_block_gives_racks():
    topo = load_slurm_topology(FIX / "slurm-block.conf")
    assert topo.racks()[:2] == ("rack11", "rack12") and topo.rack_of("srv2203") == "rack22"
    assert topo.common_rack([f"srv110{i}" for i in range(1, 9)]) == "rack11"


def test_slurm_errors(tmp_path):
    bad = tmp_path / "topology.conf"
    bad.write_text("SwitchName=s1 Switches=s[2-3]\nSwitchName=s2 Nodes=n[1-2]\nNodeName\n")
    with pytest.raises(TopologyError) as info:
        load_slurm_topology(bad)
    assert info.value.problems == (
        f"{bad}:3: expected KEY=VALUE (got 'NodeName')",
        f"{bad}: SwitchName=s1: Switches= names 's3', which no SwitchName= line defines",
    )


def test_hostlists():
    assert expand_hostlist("srv[1101-1103,1105]") == ["srv1101", "srv1102", "srv1103", "srv1105"]
    assert expand_hostlist("node-[01-03],login") == ["node-01", "node-02", "node-03", "login"]
    assert expand_hostlist("switch.1.[9-10]") == ["switch.1.9", "switch.1.10"]


def test_nccl_topology_pairs_gpus_with_their_nics():
    for name in ("ndv4-topo.xml", "ndv5-topo.xml"):
        loc = load_nccl_topology(FIX / name)
        assert loc.nic_gpus == {f"mlx5_{i}": (i,) for i in range(8)}, name
    loc = load_nccl_topology(FIX / "ndv4-topo.xml")
    assert loc.gpus[2] == "0003:00:00.0" and loc.nics["mlx5_2"] == "0103:00:00.0"
    topo = Topology()
    topo.add_switch("leaf-1", "leaf")
    add_nccl_node(topo, "vm-1", loc, leaf="leaf-1")
    assert topo.expected_nic("vm-1", 5) == "mlx5_5"


def test_nccl_topology_errors(tmp_path):
    bad = tmp_path / "t.xml"
    bad.write_text("<graphs/>")
    with pytest.raises(TopologyError, match=r"expected a <system> root element \(got <graphs>\): an NCCL graph file"):
        load_nccl_topology(bad)


def test_a_truncated_dump_is_one_line_naming_the_undescribed_switch(tmp_path: Path) -> None:
    # The real dump cut where read_ibnetdiscover's test cuts it: a port names a switch whose block is gone.
    cut = tmp_path / "cut.out"
    cut.write_text("\n".join((FIX / "ibnetdiscover-example.out").read_text().splitlines()[:44]) + "\n")
    with pytest.raises(TopologyError) as info:
        load_ibnetdiscover(cut)
    assert str(info.value).startswith(f"{cut}:")
    assert str(info.value).endswith("which the dump does not describe (truncated?)")
    assert "\n" not in str(info.value)
