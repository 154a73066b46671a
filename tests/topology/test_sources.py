"""Readers of real formats into facts: real captures where they exist, documented shapes elsewhere."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from whywait.topology.errors import TopologyError
from whywait.topology.sources import (
    FORMATS,
    read_agent,
    read_ibnetdiscover,
    read_k8s_nodes,
    read_nvidia_smi_topo,
    read_slurm_conf,
    read_slurm_yaml,
    read_source,
)

FIX = Path(__file__).resolve().parents[1] / "fixtures"
H100_SMI = FIX / "agents" / "nvidia-smi" / "linux-x86_64__nvidia-h100-80gb-hbm3__590.48.01.txt"

# `nvidia-smi topo -m` on a host with NICs, in the shape the driver prints (tabs, NIC Legend).
TOPO_M = (
    "\t\x1b[4mGPU0\tGPU1\tGPU2\tGPU3\tNIC0\tNIC1\tCPU Affinity\tNUMA Affinity\tGPU NUMA ID\x1b[0m\n"
    "GPU0\t X \tNV18\tNV18\tNV18\tPXB\tSYS\t0-55\t0\t\tN/A\n"
    "GPU1\tNV18\t X \tNV18\tNV18\tPXB\tSYS\t0-55\t0\t\tN/A\n"
    "GPU2\tNV18\tNV18\t X \tNV18\tSYS\tPIX\t56-111\t1\t\tN/A\n"
    "GPU3\tNV18\tNV18\tNV18\t X \tSYS\tNODE\t56-111\t1\t\tN/A\n"
    "NIC0\tPXB\tPXB\tSYS\tSYS\t X \tSYS\n"
    "NIC1\tSYS\tSYS\tPIX\tNODE\tSYS\t X \n"
    "MIG?\tsomething unexpected\n"
    "\nLegend:\n\n  X    = Self\n  PIX  = Connection traversing at most a single PCIe bridge\n\n"
    "NIC Legend:\n\n  NIC0: mlx5_0\n  NIC1: mlx5_1\n")


def test_every_format_is_registered() -> None:
    assert list(FORMATS) == ["ibnetdiscover", "slurm-conf", "slurm-yaml", "nccl", "nvidia-smi", "k8s-nodes", "agent",
                             "netq"]
    with pytest.raises(TopologyError, match=r"unknown format 'ufm' \(valid: ibnetdiscover, slurm-conf"):
        read_source("ufm", "x")


def test_real_nvidia_smi_capture_with_its_ansi_header() -> None:
    f = read_nvidia_smi_topo(f"h100-1={H100_SMI}")
    h = f.hosts["h100-1"]
    assert h.gpus == (0,) and h.nics == [] and f.skipped == []


def test_nvidia_smi_nics_and_locality(tmp_path: Path) -> None:
    p = tmp_path / "topo.txt"
    p.write_text(TOPO_M)
    f = read_nvidia_smi_topo(f"dgx-1={p}")
    h = f.hosts["dgx-1"]
    assert h.gpus == (0, 1, 2, 3)
    # GPU3 has no NIC behind its PCIe switch: its closest (NODE, same NUMA node) serves it, as NCCL picks it.
    assert {n.name: n.gpus for n in h.nics} == {"mlx5_0": (0, 1), "mlx5_1": (2, 3)}
    assert f.skipped == [f"{p}:8: not a row of the topo -m matrix, skipped (got 'MIG?\\tsomething unexpected')"]
    with pytest.raises(TopologyError, match="does not name its host: give it as HOST="):
        read_nvidia_smi_topo(str(p))


def test_slurm_conf_real_tree_and_a_bad_line(tmp_path: Path) -> None:
    f = read_slurm_conf(FIX / "topology" / "slurm-tree.conf")
    assert f.switches["switch.3.1"].tier == "core" and f.switches["switch.1.1"].tier == "leaf"
    assert f.switches["switch.1.1"].uplinks == {"switch.2.1"}
    assert all(h.leaf for h in f.hosts.values()) and f.skipped == []
    bad = tmp_path / "topology.conf"
    bad.write_text("SwitchName=s1 Nodes=n[1-2]\nthis is not slurm\nSwitchName=s2 Switches=s1,s9\n")
    f = read_slurm_conf(bad)
    assert f.skipped == [f"{bad}:2: expected KEY=VALUE (got 'this'); line skipped",
                         f"{bad}:3: switch 's2' names 's9' under Switches, which no switch defines; skipped"]
    assert sorted(f.hosts) == ["n1", "n2"] and f.switches["s2"].tier == "spine"


def test_slurm_topology_yaml(tmp_path: Path) -> None:
    p = tmp_path / "topology.yaml"
    p.write_text("---\n"
                 "- topology: fabric\n"
                 "  cluster_default: true\n"
                 "  tree:\n"
                 "    switches:\n"
                 "      - switch: sw_root\n"
                 "        children: s[1-2]\n"
                 "      - switch: s1\n"
                 "        nodes: node[01-02]\n"
                 "      - switch: s2\n"
                 "        nodes: node[03-04]\n"
                 "      - switch: s3\n"
                 "- topology: nvl\n"
                 "  block:\n"
                 "    block_sizes: [2]\n"
                 "    blocks:\n"
                 "      - block: b1\n"
                 "        nodes: node[01-02]\n")
    f = read_slurm_yaml(p)
    assert {h: f.hosts[h].leaf for h in f.hosts} == {"node01": "s1", "node02": "s1", "node03": "s2", "node04": "s2"}
    assert f.switches["sw_root"].tier == "spine" and f.switches["s1"].uplinks == {"sw_root"}
    assert f.skipped == [f"{p}:12: switch 's3': expected 'nodes:' or 'children:' as a hostlist string; skipped"]


def test_kubernetes_node_list(tmp_path: Path) -> None:
    nodes = {"apiVersion": "v1", "kind": "List", "items": [
        {"apiVersion": "v1", "kind": "Node", "metadata": {"name": "gpu-1", "labels": {
            "network.topology.nvidia.com/leaf": "leaf-1", "network.topology.nvidia.com/spine": "spine-1",
            "nvidia.com/gpu.count": "8"}}, "status": {"capacity": {"cpu": "224", "nvidia.com/gpu": "8"}}},
        {"apiVersion": "v1", "kind": "Node", "metadata": {"name": "cpu-1", "labels": {
            "kubernetes.io/hostname": "cpu-1"}}, "status": {"capacity": {"cpu": "64"}}},
        {"apiVersion": "v1", "kind": "Node", "metadata": {"name": "gpu-2", "labels": {
            "network.topology.nvidia.com/leaf": "leaf-1"}}, "status": {"capacity": {"nvidia.com/gpu": "eight"}}}]}
    p = tmp_path / "nodes.json"
    p.write_text(json.dumps(nodes, indent=2))
    f = read_k8s_nodes(p)
    assert f.hosts["gpu-1"].gpus == tuple(range(8)) and f.hosts["gpu-1"].leaf == "leaf-1"
    assert f.hosts["cpu-1"].gpus is None  # a node no source gives GPUs has none
    assert f.switches["leaf-1"].uplinks == {"spine-1"} and f.switches["spine-1"].tier == "spine"
    assert len(f.skipped) == 1 and "node 'gpu-2': nvidia.com/gpu capacity must be a count (got 'eight')" \
        in f.skipped[0] and f.skipped[0].startswith(f"{p}:")


def test_agent_messages_and_bad_lines(tmp_path: Path) -> None:
    p = tmp_path / "agent.jsonl"
    p.write_text(json.dumps({"kind": "net", "node": "n1", "nics": [
        {"nic": "mlx5_0/1", "node_guid": "0xe09d7303008594c4", "pci_bus_id": "0101:00:00.0", "gpus": [0]},
        {"nic": "mlx5_0/2", "port_guid": "0xe09d7303008594c5"}]}) + "\nnot json\n"
        + json.dumps({"kind": "gpu", "node": "n1", "gpus": [{"gpu": 0}, {"gpu": 1, "pci_bus_id": "00000000:1A:00.0"}]})
        + "\n" + json.dumps({"kind": "host", "node": "n1"}) + "\n")
    f = read_agent(p)
    h = f.hosts["n1"]
    [nic] = h.nics
    assert nic.name == "mlx5_0" and nic.aliases == {"mlx5_0/1", "mlx5_0/2"} and nic.gpus == (0,)
    assert nic.guids == {"e09d7303008594c4", "e09d7303008594c5"} and nic.pci == "0101:00:00.0"
    assert h.gpus == (0, 1) and h.gpu_pci == {1: "0000:1a:00.0"}
    assert f.skipped == [f"{p}:2: not a JSON message (Expecting value), skipped"]


def test_agent_messages_as_one_json_array(tmp_path: Path) -> None:
    """A saved list of messages (what `agent --once --print` used to write) reads like JSON lines."""
    msgs = [{"topic": "whywait.net.v1", "key": "n1", "kind": "net", "node": "n1",
             "nics": [{"nic": "mlx5_0/1", "pci_bus_id": "0101:00:00.0", "gpus": [0, 1]}]},
            {"kind": "gpu", "node": "n1", "gpus": [{"gpu": 0}, {"gpu": 1}]}, {"kind": "host", "node": "n1"}]
    p = tmp_path / "seen.json"
    p.write_text(json.dumps(msgs, indent=2) + "\n")
    f = read_agent(p)
    [nic] = f.hosts["n1"].nics
    assert (nic.name, nic.pci, nic.gpus, f.hosts["n1"].gpus, f.skipped) == ("mlx5_0", "0101:00:00.0", (0, 1), (0, 1),
                                                                          [])
    p.write_text(json.dumps([{"kind": "host", "node": "n1"}]))
    with pytest.raises(TopologyError, match="one JSON object a line or a JSON array of them"):
        read_agent(p)


def test_ibnetdiscover_unknown_line_is_reported_and_skipped(tmp_path: Path) -> None:
    src = (FIX / "topology" / "ibnetdiscover-example.out").read_text().splitlines()
    src.insert(20, "garbage that is no port")
    p = tmp_path / "fabric.out"
    p.write_text("\n".join(src) + "\n")
    f = read_ibnetdiscover(p)
    assert f"{p}:21: not an ibnetdiscover node or port line, skipped (got 'garbage that is no port')" in f.skipped
    assert len(f.hosts) == 122


def test_nccl_xml_is_one_hosts_locality() -> None:
    from whywait.topology.sources import read_nccl

    xml = FIX / "topology" / "ndv5-topo.xml"
    h = read_nccl(f"nd-1={xml}").hosts["nd-1"]
    assert h.gpus == tuple(range(8)) and h.gpu_pci[0] == "0001:00:00.0"
    assert [(n.name, n.pci, n.gpus) for n in h.nics][:2] == [("mlx5_0", "0101:00:00.0", (0,)),
                                                              ("mlx5_1", "0102:00:00.0", (1,))]
    with pytest.raises(TopologyError, match="an NCCL XML describes one machine, not a cluster: give it as HOST="):
        read_nccl(str(xml))


def test_nccl_xml_of_a_v100_machine_with_one_nic() -> None:
    """ND v2 (8 V100, one InfiniBand adapter as a bare <pci> of class 0x0207 under CPU 0): the NIC serves
    the four GPUs of its CPU, and the other four none (they cross the CPUs' link to reach it)."""
    from whywait.topology.sources import read_nccl

    h = read_nccl(f"nd2-1={FIX / 'topology' / 'ndv2-topo.xml'}").hosts["nd2-1"]
    assert h.gpus == tuple(range(8)) and h.gpu_pci[4] == "0005:00:00.0"
    assert [(n.name, n.pci, n.gpus) for n in h.nics] == [("mlx5_0", "0101:00:00.0", (0, 1, 2, 3))]


def test_nccl_xml_nic_without_a_pci_device_is_imported(tmp_path: Path) -> None:
    """NC A100 v4's XML has `<nic><net name="eth0">` under its first CPU, outside any <pci>: it was dropped
    with '0 line(s) skipped'."""
    from whywait.topology.loaders import load_nccl_topology
    from whywait.topology.sources import read_nccl

    xml = FIX / "topology" / "ncv4-topo.xml"
    loc = load_nccl_topology(xml)
    assert loc.nics == {"eth0": ""} and loc.nic_gpus == {"eth0": (0,)} and loc.skipped == ()  # GPU 0 shares its CPU
    f = read_nccl(f"nc-1={xml}")
    assert [(n.name, n.pci, n.gpus) for n in f.hosts["nc-1"].nics] == [("eth0", None, (0,))] and f.skipped == []
    # one that cannot be named is said, not dropped
    bad = tmp_path / "t.xml"
    bad.write_text(xml.read_text().replace('<net name="eth0"', "<net"))
    f = read_nccl(f"nc-1={bad}")
    assert f.hosts["nc-1"].nics == [] and f.skipped == [
        f"{bad}: <nic> under <cpu numaid='0'> has no <net name=...>: no name to match it by, skipped"]


def test_unreadable_and_empty_sources_are_one_line(tmp_path: Path) -> None:
    with pytest.raises(TopologyError, match=r"nope.out: cannot read: No such file or directory"):
        read_ibnetdiscover(tmp_path / "nope.out")
    (tmp_path / "n.json").write_text('{"items": [\n  {"kind": "Node",}\n]}')
    with pytest.raises(TopologyError, match=r"n.json:2: not valid JSON"):
        read_k8s_nodes(tmp_path / "n.json")
    (tmp_path / "empty.conf").write_text("# nothing\n")
    with pytest.raises(TopologyError, match="expected SwitchName= or BlockName= lines"):
        read_slurm_conf(tmp_path / "empty.conf")


def test_a_truncated_ibnetdiscover_dump_is_one_line_naming_the_undescribed_switch(tmp_path: Path) -> None:
    src = (FIX / "topology" / "ibnetdiscover-example.out").read_text().splitlines()
    p = tmp_path / "fabric.out"
    p.write_text("\n".join(src[:44]) + "\n")  # the first leaf only: the spines it links to are cut off
    with pytest.raises(TopologyError) as exc:
        read_ibnetdiscover(p)
    assert str(exc.value) == (f"{p}:28: port links to switch S-2c5eab0300c26280, which the dump does not describe "
                              "(truncated?)")
