"""A real cluster from real files: topograph's ibnetdiscover dump, Azure's ND H100 v5 NCCL XML and the
node agent reading gpud's real H100 sysfs capture (see tests/fixtures/*/ATTRIBUTION.md).

The dump names a host's adapters ``HCA-1``…``HCA-6`` (103 hosts) or ``mlx5_N`` (19 hosts); the agent
calls them ``mlx5_0/1``; the XML knows only PCI addresses.  These tests check that the three are
reconciled into one identity per adapter, that non-GPU hosts stay GPU-less, and that
``topology.wrong-nic`` fires on the agent's own messages.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import pytest
from whywait.agents.collectors.network import NetworkCollector
from whywait.agents.events import envelope, validate
from whywait.engine.cli import main
from whywait.engine.evaluate.evaluator import Evaluator
from whywait.engine.rules.loader import load_rules
from whywait.topology.model import Topology
from whywait.topology.reconcile import findings, load_node_types, merge, startup_warnings
from whywait.topology.sources import read_agent, read_ibnetdiscover

from tests.support.real_h100 import DUMP_HOST, h100_root

REPO = Path(__file__).resolve().parents[2]
FIX = REPO / "tests" / "fixtures" / "topology"
DUMP = FIX / "ibnetdiscover-example.out"
T0 = 1_764_442_800.0
NON_GPU = ["B11-P1-CUFM-02", "localhost", "ubuntu"]

TYPES = """\
# Declared, not guessed: the fabric's DGX hosts are this machine; their HCA-<n> is the kernel's mlx5_<n-1>.
node_types:
  - name: dgx-h100
    match: "*-dgx-*"
    nccl: ndv5-topo.xml
    nic_names: {HCA-1: mlx5_0, HCA-2: mlx5_1, HCA-3: mlx5_2, HCA-4: mlx5_3,
                HCA-5: mlx5_4, HCA-6: mlx5_5, HCA-7: mlx5_6, HCA-8: mlx5_7}
"""


def agent_messages(root: str, node: str, seconds: int, tx_words: Any) -> list[dict[str, Any]]:
    """Run the real NetworkCollector over ``root``; ``tx_words(second, hca)`` words sent per second."""
    c = NetworkCollector(root)
    base = os.path.join(root, "sys/class/infiniband")
    c.collect(T0, 0.0)
    out = []
    for s in range(1, seconds + 1):
        for hca in sorted(os.listdir(base)):
            f = os.path.join(base, hca, "ports/1/counters/port_xmit_data")
            with open(f) as fh:
                v = int(fh.read())
            with open(f, "w") as fh:
                fh.write(f"{v + int(tx_words(s, hca))}\n")
        body = c.collect(T0 + s, float(s))
        assert body is not None
        out.append(validate(envelope("net", node, T0 + s, **body)))
    return out


@pytest.fixture(scope="module")
def types_file(tmp_path_factory: pytest.TempPathFactory) -> Path:
    d = tmp_path_factory.mktemp("types")
    (d / "ndv5-topo.xml").write_bytes((FIX / "ndv5-topo.xml").read_bytes())
    (d / "types.yaml").write_text(TYPES)
    return d / "types.yaml"


@pytest.fixture(scope="module")
def agent_file(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = h100_root(tmp_path_factory.mktemp("h100"))
    msgs = agent_messages(root, DUMP_HOST, 2, lambda s, hca: 1000)
    path = tmp_path_factory.mktemp("agent") / "agent.jsonl"
    path.write_text("".join(json.dumps(m) + "\n" for m in msgs))
    return path


@pytest.fixture(scope="module")
def cluster(types_file: Path, agent_file: Path) -> Topology:
    res = merge([read_agent(str(agent_file)), read_ibnetdiscover(DUMP)], load_node_types(types_file))
    assert res.conflicts == []
    return res.topology


def test_fabric_dump_plus_nccl_plus_agent_leaves_no_dgx_nic_without_gpus(cluster: Topology) -> None:
    f = findings(cluster)
    assert len(cluster.nodes()) == 122
    assert len(cluster.switches("leaf")) == 31 and len(cluster.switches("spine")) == 9
    assert [n for n in f.nics_without_gpus if "-dgx-" in n] == [] and f.nics_without_gpus == []
    # A host gets GPUs only from a source that says so: the UFM server and the unnamed hosts have none.
    assert f.non_gpu_hosts == NON_GPU
    assert all(cluster.gpus_of(n) == () for n in NON_GPU)
    assert f.generic_names == ["localhost", "ubuntu"]
    dgx = [n for n in cluster.nodes() if "-dgx-" in n]
    assert len(dgx) == 119 and all(len(cluster.gpus_of(n)) == 8 for n in dgx)


def test_one_identity_per_adapter_across_the_three_names(cluster: Topology) -> None:
    hca1 = cluster.nic(DUMP_HOST, "HCA-1")
    assert hca1.leaf == "A09-P1-IBLEAF-01-02" and hca1.gpus == (0,)
    assert hca1.guids == ("e09d7303008594c4",) and hca1.pci == "0101:00:00.0"
    assert "mlx5_0" in hca1.aliases and "mlx5_0/1" in hca1.aliases
    assert cluster.resolve_nic(DUMP_HOST, "mlx5_5/1") == cluster.nic(DUMP_HOST, "HCA-6")
    assert cluster.resolve_nic(DUMP_HOST, "whatever", guid="0xe09d730300857b64").name == "HCA-5"
    assert cluster.resolve_nic(DUMP_HOST, "eth9", pci="0102:00:00.0").name == "HCA-2"
    # The agent's ports the fabric does not show (other rails, the bond) are listed, not dropped, not added.
    assert {u.split(" NIC ")[1].split()[0] for u in cluster.unmatched} == {
        "mlx5_6", "mlx5_7", "mlx5_8", "mlx5_9", "mlx5_bond_0"}
    assert all(u.split(":")[0].endswith("agent.jsonl") for u in cluster.unmatched)
    assert any("could not match" in w for w in startup_warnings(cluster))


def test_the_cluster_file_round_trips_and_show_says_it(cluster: Topology, tmp_path: Path,
                                                       capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "cluster.yaml"
    cluster.to_yaml(path)
    again = Topology.from_yaml(path)
    assert again.to_dict() == cluster.to_dict()
    assert main(["topology", "show", str(path)]) == 0
    out = capsys.readouterr().out
    assert "0 NIC(s) without GPUs" in out
    assert "3 host(s) without GPUs (no source says they have any): B11-P1-CUFM-02, localhost, ubuntu" in out
    assert "switches      40 (31 leaf, 9 spine)" in out


def test_import_command_writes_the_same_cluster(types_file: Path, agent_file: Path, tmp_path: Path,
                                                cluster: Topology, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "c.yaml"
    rc = main(["topology", "import", "agent", str(agent_file), "ibnetdiscover", str(DUMP),
               "--types", str(types_file), "-o", str(out)])
    err = capsys.readouterr().err
    assert rc == 0, err
    assert Topology.from_yaml(out).to_dict() == cluster.to_dict()
    assert f"{DUMP}: ibnetdiscover: 122 host(s), 40 switch(es), 109 line(s) skipped" in err
    assert f"warning: {DUMP}:44: HCA H-2c5eab0300b87b50 ('Mellanox Technologies Aggregation Node') names no host" in err


def test_wrong_nic_fires_on_the_agents_own_names(cluster: Topology, tmp_path: Path) -> None:
    """GPU 0 of the culprit should send through HCA-1 (the agent's mlx5_0): it idles while mlx5_1 carries it."""
    peers = ["a06-p1-dgx-02-c16", "a08-p1-dgx-04-c01", "a08-p1-dgx-04-c02"]
    nodes = [DUMP_HOST, *peers]
    ranks = [{"rank": i * 8 + g, "node": n, "gpu": g} for i, n in enumerate(nodes) for g in range(8)]
    placement = envelope("placement", "slurm", T0, job="train-1", project="llm", team="ml", state="running",
                         ranks=ranks)
    fault_from, seconds = 25, 60
    streams = []
    for i, n in enumerate(nodes):
        root = h100_root(tmp_path / n) if n == DUMP_HOST else h100_root(tmp_path / n, guids={}, pci={})

        def tx(s: int, hca: str, culprit: bool = n == DUMP_HOST, i: int = i) -> float:
            base = 2.5e9 * (1 + 0.01 * i)  # words/s: 10 GB/s per port
            if culprit and s >= fault_from and hca == "mlx5_0":
                return base * 0.02
            if culprit and s >= fault_from and hca == "mlx5_1":
                return base * 1.98
            return base
        streams.append(agent_messages(root, n, seconds, tx))
    ev = Evaluator(load_rules([REPO / "rules"]), Topology.from_dict(cluster.to_dict()))
    diags = ev.ingest(placement)
    for s in range(seconds):
        for st in streams:
            diags += ev.ingest(st[s])
    firing = [d for d in diags if d.status == "firing" and d.rule_id == "topology.wrong-nic"]
    assert firing, "topology.wrong-nic did not fire on the agent's mlx5_N names"
    d = firing[0]
    assert d.culprit == DUMP_HOST
    assert "HCA-1" in d.cause and "HCA-2" in d.cause  # the fabric's names, matched from mlx5_0/1 and mlx5_1/1


def test_without_reconciliation_the_agents_names_never_match(cluster: Topology) -> None:
    """What the issue measured: by name alone ``mlx5_0/1`` is no NIC of the fabric's host."""
    bare = Topology.from_dict({**cluster.to_dict(), "nodes": [
        {**n, "nics": [{k: v for k, v in c.items() if k not in ("aliases", "guids", "pci")} for c in n["nics"]]}
        for n in cluster.to_dict()["nodes"]]})
    assert bare.resolve_nic(DUMP_HOST, "mlx5_0/1") is None
    assert cluster.resolve_nic(DUMP_HOST, "mlx5_0/1") is not None
