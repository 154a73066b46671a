"""NVIDIA NetQ exports (Spectrum Ethernet fabrics) as a topology source: real API responses from topograph."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from whywait.engine.cli import main
from whywait.topology import Topology
from whywait.topology.errors import TopologyError
from whywait.topology.sources import read_netq

FIX = Path(__file__).resolve().parents[1] / "fixtures" / "topology"
GRAPH = FIX / "netq-topologyGraph.json"
COMPUTE = FIX / "netq-computeNodes.json"
PORTS = ["ens1f0np1", "ens1f1np3", "ens4f0np0", "ens4f1np2"]


def test_the_graph_gives_switches_by_wiring_and_each_host_s_cabled_ports() -> None:
    f = read_netq(GRAPH)
    assert {s.id: (s.tier, s.uplinks) for s in f.switches.values()} == {
        "net-unit-l1": ("leaf", {"net-unit-s1"}), "net-unit-l2": ("leaf", {"net-unit-s1"}),
        "net-unit-s1": ("spine", set())}
    assert sorted(f.hosts) == [f"dgx-0{i}" for i in range(1, 9)]
    leaf_of = {h.name: {n.leaf for n in h.nics} for h in f.hosts.values()}
    assert leaf_of == {**{f"dgx-0{i}": {"net-unit-l1"} for i in (1, 2, 3, 4)},
                       **{f"dgx-0{i}": {"net-unit-l2"} for i in (5, 6, 7, 8)}}
    assert all([n.name for n in h.nics] == PORTS for h in f.hosts.values())
    assert all(h.gpus is None for h in f.hosts.values())  # the fabric says nothing of GPUs
    device_line = next(k for k, line in enumerate(GRAPH.read_text().splitlines(), 1) if '"id": "node2",' in line)
    assert f.hosts["dgx-04"].where == f"{GRAPH}:{device_line}"  # NetQ's node2: where its device entry is
    assert f.skipped == []


def test_the_compute_nodes_give_gpu_counts() -> None:
    f = read_netq(COMPUTE)
    assert {h.name: h.gpus for h in f.hosts.values()} == {"node1": (0, 1, 2, 3), "node2": (0, 1, 2, 3)}
    assert not f.switches


def test_import_writes_a_cluster_the_engine_loads(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    types = tmp_path / "types.yaml"
    types.write_text('node_types:\n  - {name: dgx-h100, match: "dgx-*", gpus: 8}\n')
    out = tmp_path / "cluster.yaml"
    assert main(["topology", "import", "netq", str(GRAPH), "--types", str(types), "-o", str(out)]) == 0
    err = capsys.readouterr().err
    assert f"{GRAPH}: netq: 8 host(s), 3 switch(es), 0 line(s) skipped" in err
    topo = Topology.from_yaml(out)
    assert topo.gpus_of("dgx-05") == tuple(range(8))
    assert [n.name for n in topo.nics_of("dgx-05")] == PORTS
    assert topo.leaf_of("dgx-05") == "net-unit-l2"


def test_what_is_not_netq_is_one_line(tmp_path: Path) -> None:
    bad = tmp_path / "x.json"
    bad.write_text('{"items": []}')
    with pytest.raises(TopologyError, match=r"x.json: expected a NetQ topology graph"):
        read_netq(bad)
    bad.write_text('[{"nodes": [], "links": [\n  {"id": "a"},\n')
    with pytest.raises(TopologyError, match=r"x.json:3: not valid JSON"):
        read_netq(bad)


def test_a_link_to_a_device_the_graph_lacks_is_skipped_and_said(tmp_path: Path) -> None:
    graph = json.loads(GRAPH.read_text())
    graph[0]["nodes"] = [t for t in graph[0]["nodes"] if t["id"] != "tier-2"]  # the spine's tier is gone
    cut = tmp_path / "cut.json"
    cut.write_text(json.dumps(graph, indent=2))
    f = read_netq(cut)
    assert "net-unit-s1" not in f.switches and {s.tier for s in f.switches.values()} == {"leaf"}
    assert len(f.skipped) == 47 and all("device 'node3' is not among the graph's nodes, skipped" in s
                                        for s in f.skipped)


def test_a_roce_host_s_rdma_ports_match_the_netdevs_netq_cabled(tmp_path: Path) -> None:
    """NetQ names a RoCE host's ports by netdev (``ens1f0np1``); the agent reports each adapter as that netdev and as
    its RDMA port (``mlx5_0/1``, with GUIDs), both with the adapter's PCI address.  Imported together, each
    adapter is one NIC cabled to its leaf, and the engine stores the RDMA port's counters under NetQ's name."""
    from whywait.agents.events import envelope
    from whywait.engine.evaluate.store import MetricStore

    pci = {port: f"0000:{bus}" for port, bus in zip(PORTS, ("1a:00.0", "1a:00.1", "9b:00.0", "9b:00.1"), strict=True)}

    def sample(nic: str, port: str, tx: float, up: bool = True, **ids: str) -> dict[str, object]:
        return {"nic": nic, "link_up": up, "rx_bytes_per_s": 1.0, "tx_bytes_per_s": tx, "rx_packets_per_s": 1.0,
                "tx_packets_per_s": 1.0, "pci_bus_id": pci[port], **ids}

    def message(t: float, down: str | None = None) -> dict[str, object]:
        nics = [sample(p, p, 1e3, up=p != down) for p in PORTS]
        nics += [sample(f"mlx5_{i}/1", p, 4e10, up=p != down, node_guid=f"b83f:d203:0012:34{i:02x}",
                        port_guid=f"ba3f:d2ff:fe12:34{i:02x}") for i, p in enumerate(PORTS)]
        return envelope("net", "dgx-05", t, tcp_retrans_segs_per_s=0.0, tcp_out_segs_per_s=10.0, nics=nics)

    agent = tmp_path / "agent.jsonl"
    agent.write_text(json.dumps(message(1_764_442_800.0)) + "\n")
    out = tmp_path / "cluster.yaml"
    assert main(["topology", "import", "netq", str(GRAPH), "agent", str(agent), "-o", str(out)]) == 0
    topo = Topology.from_yaml(out)
    nics = topo.nics_of("dgx-05")
    assert [n.name for n in nics] == PORTS  # four adapters, not eight NICs
    assert {n.leaf for n in nics} == {"net-unit-l2"}
    assert [n.pci for n in nics] == [pci[p] for p in PORTS]
    assert all(f"mlx5_{i}/1" in n.aliases for i, n in enumerate(nics))
    hit = topo.resolve_nic("dgx-05", "mlx5_3/1", "ba3f:d2ff:fe12:3403")
    assert hit is not None and hit.name == "ens4f1np2"

    store = MetricStore()  # keeps every metric; the evaluator hands it each net message canonical, as here
    for s in range(5):
        store.ingest(topo.canonical_net(message(1_764_442_800.0 + s, down="ens4f0np0" if s >= 3 else None)))
    now = 1_764_442_804.0
    times, values = store.window("nic.tx_bytes_per_s", "dgx-05/ens1f0np1", now - 10, now)
    assert list(values) == [4e10] * 5  # one point a second, the RDMA port's (NCCL's traffic), not the netdev's too
    assert list(store.window("net.links_down", "dgx-05", now - 1.5, now)[1]) == [1.0, 1.0]  # one port, not two
