"""More real topology files, read the way ``whywait topology import`` reads them (origins in
tests/fixtures/topology/ATTRIBUTION.md).  Every expected count is taken from the raw file by a plain
regex or split here, not from the reader under test.

- ``p4d-24xl-topo.xml``: AWS's NCCL topology for p4d.24xlarge (aws/aws-ofi-nccl): four PCIe switches,
  each with two GPUs and one NIC.
- An NCCL topology *dump* names its NICs (``<nic><net name="mlx5_7"/>``) in the kernel's order, which need
  not be the bus order; IBM Cloud's H100 VSI dump has mlx5_7 on the lowest bus.  The reader used to
  rename them mlx5_0.. in bus order, pairing GPU0 with the wrong adapter.
- ``nvidia-smi topo -m`` copied from a terminal has spaces, not tabs; drivers before the NIC Legend
  named the NIC columns by device (``mlx5_0``).  The reader used to reject the first and drop the NICs
  of the second.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from whywait.topology.loaders import (
    IbCable,
    LoadReport,
    ib_fabric,
    load_ibnetdiscover,
    load_nccl_topology,
    switch_tiers,
)
from whywait.topology.reconcile import merge
from whywait.topology.sources import read_ibnetdiscover, read_nccl, read_nvidia_smi_topo

REPO = Path(__file__).resolve().parents[2]
FIX = REPO / "tests" / "fixtures" / "topology"
P4D = FIX / "p4d-24xl-topo.xml"
H100_SMI = REPO / "tests" / "fixtures" / "agents" / "nvidia-smi" / "linux-x86_64__nvidia-h100-80gb-hbm3__590.48.01.txt"


# ---------------------------------------------------------------------------------------------- NCCL XML

def test_p4d_topology_pairs_two_gpus_with_the_nic_of_their_switch() -> None:
    text = P4D.read_text()
    gpus = re.findall(r'busid="([^"]+)" class="0x0302', text)
    nics = re.findall(r'busid="([^"]+)" class="0x0200', text)
    assert (len(gpus), len(nics)) == (8, 4)
    loc = load_nccl_topology(P4D)
    assert sorted(loc.gpus.values()) == sorted(gpus) and sorted(loc.nics.values()) == sorted(nics)
    # Each switch block holds GPUs 2k, 2k+1 and NIC k (the file's own comments).
    assert [loc.nic_gpus[n] for n in sorted(loc.nics)] == [(0, 1), (2, 3), (4, 5), (6, 7)]
    facts = read_nccl(f"p4d-1={P4D}")
    assert len(facts.hosts["p4d-1"].nics) == 4 and facts.skipped == []


# The shape of a dump (NCCL_TOPO_DUMP_FILE), as IBM Cloud's H100 VSI prints it: each bridge holds a NIC and
# a GPU, and the kernel numbered the NICs from the highest bus down.
def _dump(pairs: list[tuple[str, str, str]], two_port: bool = False) -> str:
    body = []
    for i, (nic_bus, gpu_bus, net) in enumerate(pairs):
        nets = f'<net name="{net}" dev="{i}" port="1"/>'
        if two_port:
            nets += f'<net name="{net}p2" dev="{i}" port="2"/>'
        body.append(f'<pci busid="0000:{i:02x}:01.0" class="0x060400">'
                    f'<pci busid="{nic_bus}" class="0x020000"><nic>{nets}</nic></pci>'
                    f'<pci busid="{gpu_bus}" class="0x038000"><gpu dev="{i}" sm="90" rank="{i}"/></pci></pci>')
    return f'<system version="1"><cpu numaid="0">{"".join(body)}</cpu></system>'


def test_a_dump_keeps_the_nic_names_it_gives_not_the_bus_order(tmp_path: Path) -> None:
    pairs = [("0000:a3:00.0", "0000:a4:00.0", "mlx5_3"), ("0000:ad:00.0", "0000:ae:00.0", "mlx5_2"),
             ("0000:b7:00.0", "0000:b8:00.0", "mlx5_1"), ("0000:c1:00.0", "0000:c2:00.0", "mlx5_0")]
    p = tmp_path / "topo.xml"
    p.write_text(_dump(pairs))
    loc = load_nccl_topology(p)
    assert dict(loc.nics) == {net: nic for nic, _gpu, net in pairs}
    # GPU k (bus order, and the dump's dev=k) sits beside the NIC the dump names on its bridge; the GPUs'
    # class here is 0x038000 (a display controller, as RCCL dumps say), known as GPUs by their <gpu>.
    assert {net: loc.nic_gpus[net] for _n, _g, net in pairs} == {"mlx5_3": (0,), "mlx5_2": (1,), "mlx5_1": (2,),
                                                                  "mlx5_0": (3,)}


def test_a_two_port_adapter_is_two_nics_on_one_bus(tmp_path: Path) -> None:
    p = tmp_path / "topo.xml"
    p.write_text(_dump([("0000:42:00.0", "0000:45:00.0", "mlx5_0")], two_port=True))
    loc = load_nccl_topology(p)
    assert dict(loc.nics) == {"mlx5_0": "0000:42:00.0", "mlx5_0p2": "0000:42:00.0"}
    assert loc.nic_gpus == {"mlx5_0": (0,), "mlx5_0p2": (0,)}


# ---------------------------------------------------------------------------------------------- nvidia-smi

def _matrix(capture: Path) -> str:
    """The ``nvidia-smi topo -m`` section of an nvidia_gpu_exporter capture, without its ANSI underline."""
    text = re.sub(r"\x1b\[[0-9;]*m", "", capture.read_text())
    section = text.split("# $ nvidia-smi topo -m\n", 1)[1].split("\n", 1)[1]
    return section.split("\n####", 1)[0]


def test_a_matrix_copied_from_a_terminal_has_spaces_not_tabs(tmp_path: Path) -> None:
    matrix = _matrix(H100_SMI)
    assert "\t" in matrix
    gpus = re.findall(r"^GPU\d+", matrix, re.M)
    p = tmp_path / "topo.txt"
    p.write_text(matrix.expandtabs(8))  # what a terminal shows, and a copy of it holds
    assert "\t" not in p.read_text()
    h = read_nvidia_smi_topo(f"h100-1={p}").hosts["h100-1"]
    assert h.gpus == tuple(range(len(gpus))) == (0,)


TOPO_M = (
    "\tGPU0\tGPU1\tGPU2\tGPU3\tNIC0\tNIC1\tCPU Affinity\tNUMA Affinity\tGPU NUMA ID\n"
    "GPU0\t X \tNV18\tNV18\tNV18\tPXB\tSYS\t0-55\t0\t\tN/A\n"
    "GPU1\tNV18\t X \tNV18\tNV18\tPXB\tSYS\t0-55\t0\t\tN/A\n"
    "GPU2\tNV18\tNV18\t X \tNV18\tSYS\tPIX\t56-111\t1\t\tN/A\n"
    "GPU3\tNV18\tNV18\tNV18\t X \tSYS\tNODE\t56-111\t1\t\tN/A\n"
    "NIC0\tPXB\tPXB\tSYS\tSYS\t X \tSYS\n"
    "NIC1\tSYS\tSYS\tPIX\tNODE\tSYS\t X \n"
    "\nLegend:\n\n  X    = Self\n\nNIC Legend:\n\n  NIC0: mlx5_0\n  NIC1: mlx5_1\n")


@pytest.mark.parametrize("shape", ["tabs", "spaces", "header flush left", "old driver: device columns"])
def test_every_shape_of_the_matrix_gives_the_same_nics(tmp_path: Path, shape: str) -> None:
    text = TOPO_M
    if shape == "spaces":
        text = text.expandtabs(8)
    elif shape == "header flush left":  # as pasted into issues: the header's leading tab lost
        text = text.expandtabs(8).lstrip()
    elif shape == "old driver: device columns":
        text = text.replace("NIC0", "mlx5_0").replace("NIC1", "mlx5_1").split("\nNIC Legend:")[0]
    p = tmp_path / "topo.txt"
    p.write_text(text)
    f = read_nvidia_smi_topo(f"dgx-1={p}")
    h = f.hosts["dgx-1"]
    assert h.gpus == (0, 1, 2, 3) and f.skipped == []
    assert {n.name: n.gpus for n in h.nics} == {"mlx5_0": (0, 1), "mlx5_1": (2, 3)}


# ---------------------------------------------------------------------------------------------- ibnetdiscover
# ``loginoff-ibnetdiscover.topo``: a 2014 ibnetdiscover run of eight Mellanox SX6036 (loginoff/infiniband_topology,
# MIT).  ib7 is a spine that also carries two storage hosts (tank1, tank2): the import used to make it a leaf
# (any switch with a host was a leaf) and then drop the 24 cables between it and ib1..ib6 (leaf to leaf).
# Everything expected below is counted from the raw text by the regexes in ``_raw_fabric``.

LOGINOFF = FIX / "loginoff-ibnetdiscover.topo"


def _raw_fabric(text: str) -> dict:
    """Switches (guid -> name), CAs (guid -> description) and cables of a dump, by plain regexes."""
    names: dict[str, str] = {}
    cas: dict[str, str] = {}
    cables: set[frozenset] = set()
    host_ports: dict[str, list[tuple[str, str]]] = {}  # switch -> (its port, the HCA there)
    for block in re.split(r"\n\s*\n", text):
        head = re.search(r'^(Switch|Ca)\s+\d+\s+"([SH]-[0-9a-f]+)"\s+#\s+"([^"]*)"', block, re.M)
        if head is None:
            continue
        kind, guid, desc = head.groups()
        if kind == "Ca":
            cas[guid] = desc
            continue
        names[guid] = desc.split(";")[1].split(":")[0]
        host_ports[guid] = []
        for port, peer, peer_port in re.findall(r'^\[(\d+)\]\s+"([SH]-[0-9a-f]+)"\[(\d+)\]', block, re.M):
            if peer.startswith("S-"):
                cables.add(frozenset({(guid, port), (peer, peer_port)}))
            else:
                host_ports[guid].append((port, peer))
    return {"names": names, "cas": cas, "cables": cables, "host_ports": host_ports}


def test_loginoff_dump_keeps_every_switch_cable_and_finds_the_spine_that_carries_hosts() -> None:
    raw = _raw_fabric(LOGINOFF.read_text())
    names, cables = raw["names"], raw["cables"]
    assert (len(names), len(raw["cas"]), len(cables)) == (8, 144, 47)
    pairs = {frozenset(g for g, _port in c) for c in cables}
    neighbours = {s: {o for p in pairs if s in p for o in p if o != s} for s in names}
    bearing = {s for s in names if raw["host_ports"][s]}
    switch_cables = {s: sum(1 for c in cables for g, _port in c if g == s) for s in names}
    # From the structure: a spine is cabled only to switches that carry hosts, with more cables to switches than
    # to hosts.
    spines = {names[s] for s in names
              if neighbours[s] <= bearing and len(raw["host_ports"][s]) < switch_cables[s]}
    assert spines == {"ib7", "ib8"} and "ib7" in {names[s] for s in bearing}  # ib7 carries hosts, yet is a spine

    rep = LoadReport("loginoff")
    topo = load_ibnetdiscover(LOGINOFF, report=rep)
    assert set(topo.switches("spine")) == spines
    assert set(topo.switches("leaf")) == set(names.values()) - spines and topo.switches("core") == ()
    # Every switch-to-switch pair the dump cables is an uplink, none left out.
    uplinks = {frozenset({s, u}) for s in topo.switches() for u in topo.uplinks_of(s)}
    assert uplinks == {frozenset(names[g] for g in p) for p in pairs} and len(uplinks) == 12
    hosts = {d.split()[0] for d in raw["cas"].values()}
    assert set(topo.nodes()) == hosts and len(hosts) == 144
    # The hosts on the spine keep their NIC, with no leaf (the model cables NICs to leaves) and a line saying so.
    on_spines = {raw["cas"][h].split()[0] for s in names if names[s] in spines for _port, h in raw["host_ports"][s]}
    assert on_spines == {"tank1", "tank2"}
    for host in on_spines:
        assert [n.leaf for n in topo.nics_of(host)] == [None]
        assert any(f"{host} NIC mlx4_0" in u and "ib7" in u for u in topo.unmatched)
    assert len(topo.unmatched) == len(on_spines)

    # The import command's reader and merge agree, and write the uplinks to the cluster file.
    facts = read_ibnetdiscover(LOGINOFF)
    assert {s.id for s in facts.switches.values() if s.tier == "spine"} == spines
    assert sum(len(s.uplinks) for s in facts.switches.values()) == 12 and len(facts.unmatched) == 2
    merged = merge([facts]).topology
    assert {frozenset({s, u}) for s in merged.switches() for u in merged.uplinks_of(s)} == uplinks
    assert len(merged.unmatched) == 2 and set(merged.nodes()) == hosts
    tank1 = facts.hosts["tank1"].nics[0]  # one adapter, both ports cabled to ib7: both port GUIDs kept
    assert tank1.guids == {"f452140300081a20", "f452140300081a21", "f452140300081a22"}


def test_a_shared_switch_description_gives_every_such_switch_its_guid(tmp_path: Path) -> None:
    # The same dump as if the switches kept their factory description (as SwitchIB's do): no switch may get
    # the bare name, whichever GUID is lowest.
    text = re.sub(r'"MF0;ib\d:SX6036/U1"', '"SwitchIB Mellanox Technologies"', LOGINOFF.read_text())
    guids = set(re.findall(r'^Switch\s+\d+\s+"(S-[0-9a-f]+)"', text, re.M))
    topo = load_ibnetdiscover(_write(tmp_path, text))
    assert set(topo.switches()) == {f"SwitchIB Mellanox Technologies ({g})" for g in guids}
    assert len(topo.switches("spine")) == 2 and len(topo.switches("leaf")) == 6
    assert set(read_ibnetdiscover(_write(tmp_path, text)).switches) == set(topo.switches())


def _write(tmp_path: Path, text: str, name: str = "dump.out") -> Path:
    (tmp_path / name).write_text(text)
    return tmp_path / name


# Real lines of an ibnetdiscover run on LLNL's Atlas (2006, Voltaire), quoted in LLNL/ibtopo's
# perl/ibnetdiscover.pm (BSD, (c) 2015 LLNS): HCA descriptions are the bare host name.
ATLAS = (
    'Switch  24 "S-0008f104003f1e29"         # "ISR2012/ISR2004 Voltaire sLB-2024" base port 0 lid 742 lmc 0\n'
    '[24]    "H-0002c90200247010"[1]         # "atlas35" lid 1252\n'
    '[23]    "H-0002c9020024d5f8"[1]         # "atlas34" lid 3640\n'
    '[21]    "H-0002c90200246fbc"[1]         # "atlas32" lid 2984\n'
    "\n"
    "vendid=0x2c9\n"
    "devid=0x634a\n"
    "sysimgguid=0x2c9020025a4ef\n"
    "caguid=0x2c9020025a4ec\n"
    'Ca      2 "H-0002c9020025a4ec"          # "atlas133"\n'
    '[1](2c9020025a4ed)      "S-000b8cffff004663"[2]         # lid 320 lmc 0 "SW12" lid 37 4xSDR\n'
    "\n"
    "vendid=0x2c9\n"
    "devid=0x634a\n"
    "sysimgguid=0x2c90200269e87\n"
    "caguid=0x2c90200269e84\n"
    'Ca      2 "H-0002c90200269e84"          # "atlas132"\n'
    '[1](2c90200269e85)      "S-000b8cffff004663"[1]         # lid 448 lmc 0 "SW12" lid 37 4xSDR\n')


def test_one_word_hca_descriptions_are_hosts(tmp_path: Path) -> None:
    described = re.findall(r'#\s+"(atlas\d+)"', ATLAS)
    topo = load_ibnetdiscover(_write(tmp_path, ATLAS))
    assert set(topo.nodes()) == set(described) and len(described) == 5
    leaf = "ISR2012/ISR2004 Voltaire sLB-2024"
    assert [(n.name, n.leaf) for n in topo.nics_of("atlas35")] == [("HCA-1", leaf)]
    assert set(topo.nodes_under(leaf)) == {"atlas32", "atlas34", "atlas35"}
    facts = read_ibnetdiscover(_write(tmp_path, ATLAS))
    assert set(facts.hosts) == set(described) and not any("names no host" in s for s in facts.skipped)
    assert facts.hosts["atlas133"].nics[0].name == "HCA-1"


def test_hcas_sharing_a_one_word_description_get_distinct_names_in_guid_order(tmp_path: Path) -> None:
    # atlas132's adapter described as atlas133 too (one host, two HCAs); in either order of the blocks.
    text = ATLAS.replace('"atlas132"', '"atlas133"')
    blocks = text.split("\n\n")
    swapped = "\n\n".join([blocks[0], blocks[2], blocks[1]]) + "\n"
    for dump in (text, swapped):
        facts = read_ibnetdiscover(_write(tmp_path, dump))
        names = {n.name: n.guids for n in facts.hosts["atlas133"].nics}
        assert names == {"HCA-1": {"0002c9020025a4ec"}, "HCA-2": {"0002c90200269e84"}}
        assert [n.name for n in load_ibnetdiscover(_write(tmp_path, dump)).nics_of("atlas133")] == ["HCA-1", "HCA-2"]
    # A one-word description that is no host's name is still skipped.
    lonely = ATLAS.replace('"atlas132"', '"localhost"')
    assert "localhost" not in read_ibnetdiscover(_write(tmp_path, lonely)).hosts


def test_a_cable_between_two_switches_of_one_tier_is_kept_as_unmatched() -> None:
    # Two host-bearing switches cabled to each other (a pair of leaves with an inter-switch link): the model has
    # no same-tier link, so the import says so rather than dropping the cables.
    fabric = ib_fabric({"S-01": "MF0;sw-a:SX6036/U1", "S-02": "MF0;sw-b:SX6036/U1"},
                       {"H-11": "n1 mlx5_0", "H-12": "n2 mlx5_0"},
                       [IbCable("S-01", 1, "H-11", 1, 10), IbCable("S-01", 35, "S-02", 36, 11),
                        IbCable("S-01", 36, "S-02", 35, 12), IbCable("S-02", 1, "H-12", 1, 20),
                        IbCable("S-02", 35, "S-01", 36, 21), IbCable("S-02", 36, "S-01", 35, 22)])
    assert fabric.tier == {"S-01": "leaf", "S-02": "leaf"} and fabric.uplinks == {"S-01": set(), "S-02": set()}
    assert fabric.unmatched == [(11, "switches sw-a and sw-b are both leaves and cabled together (2 cable(s): "
                                     "sw-a[35]-sw-b[36], sw-a[36]-sw-b[35]); the model links a switch only up to a "
                                     "higher tier, so these cables are not in the topology")]


@pytest.mark.parametrize("shape, expected", [
    ("one switch", {"X": "leaf"}),
    ("3-tier", {"L0": "leaf", "L1": "leaf", "L2": "leaf", "L3": "leaf", "S0": "spine", "S1": "spine",
                "S2": "spine", "S3": "spine", "C0": "core", "C1": "core"}),
    ("3-tier, a spine with hosts", {"L0": "leaf", "L1": "leaf", "L2": "leaf", "L3": "leaf", "S0": "spine",
                                    "S1": "spine", "S2": "spine", "S3": "spine", "C0": "core", "C1": "core"}),
])
def test_tiers_by_wiring(shape: str, expected: dict[str, str]) -> None:
    neighbours: dict[str, dict[str, int]] = {s: {} for s in expected}
    if shape != "one switch":  # pods {L0,L1}+{S0,S1} and {L2,L3}+{S2,S3}; every spine up to both cores
        links = [(f"L{p * 2 + i}", f"S{p * 2 + j}") for p in (0, 1) for i in (0, 1) for j in (0, 1)]
        links += [(f"S{s}", f"C{c}") for s in range(4) for c in (0, 1)]
        for a, b in links:
            neighbours[a][b] = neighbours[b][a] = 2
    hosts = {s: 16 for s in expected if s.startswith("L") or s == "X"}
    if "spine with hosts" in shape:
        hosts["S0"] = 2
    assert switch_tiers(list(expected), neighbours, hosts, hosts) == expected
