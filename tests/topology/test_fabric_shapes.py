"""Fabric dumps in the shapes operators paste: a core switch carrying a host, ``ibnetdiscover -p``,
``iblinkinfo``, Slurm files written over several lines or with several bracket groups, and bad lines.

The ``-p`` captures are real (tests/fixtures/topology/ATTRIBUTION.md).  No real ``iblinkinfo`` capture with a
licence could be found, so its input here is laid out exactly as rdma-core's ``infiniband-diags/iblinkinfo.c``
prints it (``print_node_header`` and ``print_port``: ``"%6d %4d[%2s] ==%s==>  %s"``, the far end
``"%s%6d %4d[%2s] \\"%s\\" (%s %s)"``), with GUIDs and names of our own.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from whywait.engine.cli import main
from whywait.topology.errors import TopologyError
from whywait.topology.loaders import (
    expand_hostlist,
    load_ibnetdiscover,
    load_nccl_topology,
    load_slurm_topology,
    switch_tiers,
)
from whywait.topology.model import Topology
from whywait.topology.reconcile import merge
from whywait.topology.sources import read_ibnetdiscover, read_slurm_conf

from whywait.errors import EXIT_INTERNAL

FIX = Path(__file__).resolve().parents[1] / "fixtures" / "topology"
OSC = FIX / "ibnetdiscover-ports-osc.out"
HDR = FIX / "ibnetdiscover-ports-hdr.out"


def _write(tmp_path: Path, text: str, name: str = "dump.out") -> Path:
    (tmp_path / name).write_text(text)
    return tmp_path / name


# ---------------------------------------------------------------------------------------------- a host on a core


def _three_tier(host_on: str | None) -> tuple[list[str], dict[str, dict[str, int]], dict[str, int]]:
    """Two pods (leaves L0,L1 under S0,S1; L2,L3 under S2,S3), every spine up to cores C0 and C1."""
    names = [f"L{i}" for i in range(4)] + [f"S{i}" for i in range(4)] + ["C0", "C1"]
    neighbours: dict[str, dict[str, int]] = {s: {} for s in names}
    links = [(f"L{p * 2 + i}", f"S{p * 2 + j}") for p in (0, 1) for i in (0, 1) for j in (0, 1)]
    links += [(f"S{s}", f"C{c}") for s in range(4) for c in (0, 1)]
    for a, b in links:
        neighbours[a][b] = neighbours[b][a] = 2
    hosts = {s: 16 for s in names if s.startswith("L")}
    if host_on:
        hosts[host_on] = 1
    return names, neighbours, hosts


def test_a_core_switch_carrying_a_host_is_still_a_core() -> None:
    # A subnet manager or UFM host cabled to a core director: the core was taken for a leaf (its spines then
    # its uplinks), because a switch with a host on it starts as a leaf and only spines were looked for.
    names, neighbours, hosts = _three_tier("C0")
    tiers = switch_tiers(names, neighbours, hosts, hosts)
    assert tiers == {**{f"L{i}": "leaf" for i in range(4)}, **{f"S{i}": "spine" for i in range(4)},
                     "C0": "core", "C1": "core"}
    # A 2-tier fabric, every leaf under every spine, has no pods to span: a lightly loaded leaf stays a leaf.
    two = {"L0": {"S0": 1, "S1": 1}, "L1": {"S0": 1, "S1": 1}, "L2": {"S0": 1, "S1": 1},
           "S0": {"L0": 1, "L1": 1, "L2": 1}, "S1": {"L0": 1, "L1": 1, "L2": 1}}
    few = {"L0": 16, "L1": 16, "L2": 1}
    assert switch_tiers(list(two), two, few, few) == {"L0": "leaf", "L1": "leaf", "L2": "leaf",
                                                      "S0": "spine", "S1": "spine"}


def _dump_of(neighbours: dict[str, dict[str, int]], hosts: dict[str, int]) -> str:
    """An ibnetdiscover dump of the wiring: one cable per neighbour pair, ``hosts[s]`` HCAs on switch s."""
    guid = {s: f"{i + 1:016x}" for i, s in enumerate(sorted(neighbours))}
    port: dict[str, int] = {s: 0 for s in neighbours}
    ports: dict[str, list[str]] = {s: [] for s in neighbours}
    cas: list[str] = []
    for a in sorted(neighbours):
        for b in sorted(neighbours[a]):
            if a < b:
                port[a] += 1
                port[b] += 1
                ports[a].append(f'[{port[a]}]\t"S-{guid[b]}"[{port[b]}]\t\t# "MF0;{b}:MQM8700/U1" lid 1 4xHDR')
                ports[b].append(f'[{port[b]}]\t"S-{guid[a]}"[{port[a]}]\t\t# "MF0;{a}:MQM8700/U1" lid 1 4xHDR')
    n = 0
    for s in sorted(hosts):
        for _ in range(hosts[s]):
            n += 1
            port[s] += 1
            hca = f"{0xa000 + n:016x}"
            host = "ufm-01" if s.startswith("C") else f"node-{n:03d}"
            ports[s].append(f'[{port[s]}]\t"H-{hca}"[1]({hca})\t\t# "{host} mlx5_0" lid 2 4xHDR')
            cas.append(f'Ca\t1 "H-{hca}"\t\t# "{host} mlx5_0"\n[1]({hca})\t"S-{guid[s]}"[{port[s]}]\t\t# lid 2 4xHDR')
    blocks = [f'Switch\t{port[s]} "S-{guid[s]}"\t\t# "MF0;{s}:MQM8700/U1" enhanced port 0 lid 1 lmc 0\n'
              + "\n".join(ports[s]) for s in sorted(neighbours)]
    return "\n\n".join(blocks + cas) + "\n"


def test_a_host_on_a_core_keeps_its_nic_and_says_why_it_has_no_leaf(tmp_path: Path) -> None:
    names, neighbours, hosts = _three_tier("C0")
    dump = _write(tmp_path, _dump_of(neighbours, {s: (2 if s.startswith("L") else n) for s, n in hosts.items()}))
    topo = load_ibnetdiscover(dump)
    assert topo.switches("core") == ("C0", "C1") and len(topo.switches("leaf")) == 4
    assert topo.uplinks_of("S0") == ("C0", "C1") and topo.uplinks_of("L0") == ("S0", "S1")
    # The host is kept, its NIC is not on any switch (the model cables a NIC to a leaf only), and a line says so.
    assert [(n.name, n.leaf) for n in topo.nics_of("ufm-01")] == [("mlx5_0", None)]
    assert len(topo.unmatched) == 1 and "ufm-01 NIC mlx5_0" in topo.unmatched[0] and "a core" in topo.unmatched[0]
    # Contention walks NIC → switch: the core's "pod" is no longer every host in the fabric under a fake leaf.
    assert "ufm-01" not in topo.nodes_under("C0") and len(topo.nodes_under("C0")) == 8
    pods = [topo.nodes_under(leaf)[0] for leaf in ("L0", "L2")]
    assert topo.common_switch(pods) in ("C0", "C1") and topo.common_switch(topo.nodes_under("L0")) == "L0"
    # The import command's reader agrees, and its cluster file is one the schema accepts.
    merged = merge([read_ibnetdiscover(dump)]).topology
    assert merged.tier_of("C0") == "core" and len(merged.unmatched) == 1
    assert Topology.from_dict(merged.to_dict()).tier_of("C0") == "core"


# ---------------------------------------------------------------------------------------------- ibnetdiscover -p


def test_ibnetdiscover_ports_list_is_read_as_the_same_fabric() -> None:
    # Was: "expected an ibnetdiscover dump with 'Switch' blocks (found none)".
    topo = load_ibnetdiscover(OSC)
    assert topo.nodes() == ("o0001", "o0002", "p0001")
    assert [(n.name, n.leaf) for n in topo.nics_of("o0001")] == [("HCA-1", "ib-i1l1s01")]
    assert topo.tier_of("ib-i1l1s01") == "leaf" and topo.uplinks_of("ib-i1l1s01") == ("ib-i1l2s01",)
    assert topo.nodes_under("ib-i1l2s01") == ("o0001", "o0002")
    facts = read_ibnetdiscover(OSC)
    assert facts.format == "ibnetdiscover -p" and facts.skipped == []
    assert facts.hosts["p0001"].nics[0].guids == {"506b4b0300cc02a6"}


def test_ibnetdiscover_ports_list_with_padded_names_and_an_aggregation_node() -> None:
    rep_topo = load_ibnetdiscover(HDR)
    assert "5FB0405-leaf-IB01" in rep_topo.switches() and " 5FB0406-spine-IB02 " not in rep_topo.switches()
    assert rep_topo.nodes() == ("worker20",)
    assert [(n.name, n.leaf) for n in rep_topo.nics_of("worker20")] == [("mlx5_3", "5FB0405-leaf-IB01")]
    facts = read_ibnetdiscover(HDR)
    assert any("Aggregation Node" in s and "names no host" in s for s in facts.skipped)


# ---------------------------------------------------------------------------------------------- iblinkinfo

SW = "0x0002c902004b2678"
LINKINFO = (
    "CA: gpu-a01 mlx5_0:\n"
    "      0xb8599f0300a1b2c1      4    1[  ] ==( 4X       53.125 Gbps Active/  LinkUp)==>       2    1[  ] "
    '"MF0;leaf-01:MQM8700/U1" ( )\n'
    "CA: gpu-a01 mlx5_1:\n"
    "      0xb8599f0300a1b2d1      5    1[  ] ==( 4X       53.125 Gbps Active/  LinkUp)==>       2    2[  ] "
    '"MF0;leaf-01:MQM8700/U1" ( )\n'
    "CA: storage-01 HCA-1:\n"
    "      0xb8599f0300c0ffe1      6    1[  ] ==( 4X       53.125 Gbps Active/  LinkUp)==>       2    3[  ] "
    '"MF0;leaf-01:MQM8700/U1" ( )\n'
    "      0xb8599f0300c0ffe2      7    2[  ] ==( 4X       53.125 Gbps Active/  LinkUp)==>       2    4[  ] "
    '"MF0;leaf-01:MQM8700/U1" ( )\n'
    f"Switch: {SW} MF0;leaf-01:MQM8700/U1:\n"
    "           2    1[  ] ==( 4X       53.125 Gbps Active/  LinkUp)==>       4    1[  ] \"gpu-a01 mlx5_0\" ( )\n"
    "           2    2[  ] ==( 4X       53.125 Gbps Active/  LinkUp)==>       5    1[  ] \"gpu-a01 mlx5_1\" ( )\n"
    "           2    3[  ] ==( 4X       53.125 Gbps Active/  LinkUp)==>       6    1[  ] \"storage-01 HCA-1\" ( )\n"
    "           2    4[  ] ==( 4X       53.125 Gbps Active/  LinkUp)==>       7    2[  ] \"storage-01 HCA-1\" ( )\n"
    "           2    5[  ] ==( 4X       53.125 Gbps Active/  LinkUp)==>       9    1[  ] \"gpu-a02 mlx5_0\" "
    "( Could be 106.25 Gbps)\n"
    "           2    6[  ] ==(                Down/ Polling)==>             [  ] \"\" ( )\n"
    "           2   40[  ] ==( 4X       53.125 Gbps Active/  LinkUp)==>       1   17[  ] "
    '"MF0;spine-01:MQM8700/U1" ( )\n'
    "Switch: 0x0002c902004b9999 MF0;spine-01:MQM8700/U1:\n"
    "           1   17[  ] ==( 4X       53.125 Gbps Active/  LinkUp)==>       2   40[  ] "
    '"MF0;leaf-01:MQM8700/U1" ( )\n')
# The same links with -l: one line per port, node GUID and description on each, far end by GUID.
LINKINFO_L = (
    f'{SW} "        MF0;leaf-01:MQM8700/U1"      2    1[  ] ==( 4X 53.125 Gbps Active/  LinkUp)==>  '
    '0xb8599f0300a1b2c1      4    1[  ] "gpu-a01 mlx5_0" ( )\n'
    f'{SW} "        MF0;leaf-01:MQM8700/U1"      2    2[  ] ==( 4X 53.125 Gbps Active/  LinkUp)==>  '
    '0xb8599f0300a1b2d1      5    1[  ] "gpu-a01 mlx5_1" ( )\n'
    f'{SW} "        MF0;leaf-01:MQM8700/U1"      2    6[  ] ==(                Down/ Polling)==>'
    '             [  ] "" ( )\n'
    '0xb8599f0300a1b2c1 "                gpu-a01 mlx5_0"      4    1[  ] ==( 4X 53.125 Gbps Active/  LinkUp)==>  '
    f'{SW}      2    1[  ] "MF0;leaf-01:MQM8700/U1" ( )\n')


def test_iblinkinfo_gives_switches_hosts_and_port_guids(tmp_path: Path) -> None:
    topo = load_ibnetdiscover(_write(tmp_path, LINKINFO))
    assert {s: topo.tier_of(s) for s in topo.switches()} == {"leaf-01": "leaf", "spine-01": "spine"}
    assert topo.nodes() == ("gpu-a01", "gpu-a02", "storage-01")
    assert [(n.name, n.leaf) for n in topo.nics_of("gpu-a01")] == [("mlx5_0", "leaf-01"), ("mlx5_1", "leaf-01")]
    facts = read_ibnetdiscover(_write(tmp_path, LINKINFO))
    assert facts.format == "iblinkinfo" and facts.skipped == [] and facts.unmatched == []
    storage = facts.hosts["storage-01"].nics  # one CA header, two ports: one adapter with both port GUIDs
    assert [(n.name, n.guids) for n in storage] == [("HCA-1", {"b8599f0300c0ffe1", "b8599f0300c0ffe2"})]
    assert facts.hosts["gpu-a02"].nics[0].guids == set()  # seen from the switch only: its LID, no GUID

    lined = read_ibnetdiscover(_write(tmp_path, LINKINFO_L, "l.out"))
    assert {h: [(n.name, n.leaf, n.guids) for n in f.nics] for h, f in lined.hosts.items()} == {
        "gpu-a01": [("mlx5_0", "leaf-01", {"b8599f0300a1b2c1"}), ("mlx5_1", "leaf-01", {"b8599f0300a1b2d1"})]}


def test_iblinkinfo_of_two_adapters_cabled_back_to_back_says_there_is_no_switch(tmp_path: Path) -> None:
    text = ("CA: kvm mlx4_0:\n      0x0002c90300002779      4    1[  ] ==( 4X           5.0 Gbps Active/  LinkUp)==>"
            "       3    1[  ] \"hostname mlx4_0\" ( )\n")
    with pytest.raises(TopologyError, match=r"dump\.out: expected iblinkinfo output with a switch"):
        load_ibnetdiscover(_write(tmp_path, text))


# ---------------------------------------------------------------------------------------------- bad lines


@pytest.mark.parametrize(("text", "line", "what"), [
    ("SW  1719 10 0x7cfe9003009ce5b0 4x EDR - SW  1516  1 0x7cfe900300b07320 ( 'a' - 'b' )\nSW garbage here\n", 2,
     "expected an 'ibnetdiscover -p' port line"),
    (LINKINFO.replace('"gpu-a01 mlx5_1" ( )', "truncat"), 10, "expected an iblinkinfo port line"),
    ("           2    1[  ] ==( 4X 53.125 Gbps Active/  LinkUp)==>       4    1[  ] \"x mlx5_0\" ( )\n", 1,
     "port line before any 'Switch:' or 'CA:' header"),
])
def test_a_bad_line_names_the_file_and_line(tmp_path: Path, text: str, line: int, what: str) -> None:
    path = _write(tmp_path, text)
    with pytest.raises(TopologyError) as err:
        load_ibnetdiscover(path)
    assert err.value.problems[0].startswith(f"{path}:{line}: {what}")
    if line > 1 and "garbage" not in text:  # the reader skips the line and reads the rest
        assert any(s.startswith(f"{path}:{line}: {what}") for s in read_ibnetdiscover(path).skipped)


def test_the_import_command_reads_every_shape_and_a_damaged_one_is_never_a_traceback(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    for name, text in (("osc.out", OSC.read_text()), ("li.out", LINKINFO), ("lil.out", LINKINFO_L)):
        src = _write(tmp_path, text, name)
        assert main(["topology", "import", "ibnetdiscover", str(src), "-o", str(tmp_path / "c.yaml")]) == 0
        assert main(["topology", "check", str(tmp_path / "c.yaml")]) == 0
        data = text.encode()
        for cut in range(1, len(data), max(1, len(data) // 40)):
            src.write_bytes(data[:cut])
            rc = main(["topology", "import", "ibnetdiscover", str(src), "-o", str(tmp_path / "d.yaml")])
            err = capsys.readouterr().err
            assert rc != EXIT_INTERNAL and "Traceback" not in err, (name, cut, err[-300:])


# ---------------------------------------------------------------------------------------------- Slurm topology.conf

CONF = """\
# written by hand: long lists go on over several lines, keys in any case
SwitchName=leaf-a Nodes=gpu[001-004,\\
    007]   # the rest of the rack
switchname=leaf-b nodes=rack[1-2]-gpu[01-02]
SwitchName=spine Switches=leaf-a,leaf-b \\
    LinkSpeed=400
"""


def test_a_slurm_conf_over_several_lines_with_lower_case_keys_and_two_bracket_groups(tmp_path: Path) -> None:
    # Was: line 3 "expected KEY=VALUE (got '007]')", a host named 'gpu[001-004,\\', line 4 not a SwitchName,
    # and rack1-gpu[01-02] as one host.
    path = _write(tmp_path, CONF, "topology.conf")
    want = ("gpu001", "gpu002", "gpu003", "gpu004", "gpu007", "rack1-gpu01", "rack1-gpu02", "rack2-gpu01",
            "rack2-gpu02")
    topo = load_slurm_topology(path)
    assert topo.nodes() == want and topo.leaf_of("rack2-gpu02") == "leaf-b" and topo.tier_of("spine") == "spine"
    facts = read_slurm_conf(path)
    assert facts.skipped == [] and tuple(sorted(facts.hosts)) == want
    assert facts.hosts["gpu007"].where == f"{path}:2"  # the line the statement starts on


def test_hostlists() -> None:
    assert expand_hostlist("gpu[001-003,015]") == ["gpu001", "gpu002", "gpu003", "gpu015"]
    assert expand_hostlist("r[1-2]n[1-2],x") == ["r1n1", "r1n2", "r2n1", "r2n2", "x"]
    for bad, why in (("gpu[a-b]", "expected N or N-M"), ("gpu[5-1]", "runs backwards"), ("gpu[1-3", "unbalanced"),
                     ("n[0-999999999]", "more than")):
        with pytest.raises(ValueError, match=why):
            expand_hostlist(bad)


def test_a_bad_hostlist_is_one_line_naming_the_file_and_line(tmp_path: Path,
                                                             capsys: pytest.CaptureFixture[str]) -> None:
    path = _write(tmp_path, "SwitchName=s1 Nodes=gpu[001-004]\nSwitchName=s2 Nodes=gpu[9-x]\n", "topology.conf")
    with pytest.raises(TopologyError, match=rf"^{path}:2: hostlist 'gpu\[9-x\]': expected N or N-M"):
        load_slurm_topology(path)
    facts = read_slurm_conf(path)
    assert sorted(facts.hosts) == ["gpu001", "gpu002", "gpu003", "gpu004"]
    assert facts.skipped == [f"{path}:2: hostlist 'gpu[9-x]': expected N or N-M in [9-x] (got '9-x'); line skipped"]
    assert main(["topology", "import", "slurm-conf", str(path), "-o", str(tmp_path / "c.yaml")]) != EXIT_INTERNAL
    assert "Traceback" not in capsys.readouterr().err


# ---------------------------------------------------------------------------------------------- NCCL XML

NESTED = """<system version="1">
  <cpu numaid="0" affinity="ff" arch="x86_64" vendor="GenuineIntel" familyid="6" modelid="85">
    <pci busid="0000:10:00.0" class="0x060400" link_speed="16 GT/s" link_width="16">
      <pci busid="0000:11:00.0" class="0x060400" link_speed="16 GT/s" link_width="16">
        <pci busid="0000:12:00.0" class="0x030200" link_speed="16 GT/s" link_width="16"/>
        <pci busid="0000:13:00.0" class="0x030200" link_speed="16 GT/s" link_width="16"/>
        <pci busid="0000:14:00.0" class="0x020700" link_speed="16 GT/s" link_width="16"/>
      </pci>
      <pci busid="0000:21:00.0" class="0x060400" link_speed="16 GT/s" link_width="16">
        <pci busid="0000:22:00.0" class="0x030200" link_speed="16 GT/s" link_width="16"/>
        <pci busid="0000:23:00.0" class="0x030200" link_speed="16 GT/s" link_width="16"/>
        <pci busid="0000:24:00.0" class="0x020700" link_speed="16 GT/s" link_width="16"/>
      </pci>
    </pci>
  </cpu>
</system>
"""


def test_nccl_xml_with_nested_bridges_pairs_gpus_with_the_nic_of_their_own_switch(tmp_path: Path) -> None:
    # One root port above two PCIe switches, two GPUs and a NIC on each (as NCCL_TOPO_DUMP_FILE nests them).
    # Was: each NIC served all four GPUs, the root port taken for their switch.
    loc = load_nccl_topology(_write(tmp_path, NESTED, "topo.xml"))
    assert loc.nic_gpus == {"mlx5_0": (0, 1), "mlx5_1": (2, 3)}
    # A GPU whose own switch has no NIC still falls back to the NICs of the whole root port, as before.
    lone = NESTED.replace('<pci busid="0000:24:00.0" class="0x020700" link_speed="16 GT/s" link_width="16"/>', "")
    assert load_nccl_topology(_write(tmp_path, lone, "lone.xml")).nic_gpus == {"mlx5_0": (0, 1, 2, 3)}
