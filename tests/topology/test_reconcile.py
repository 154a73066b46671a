"""Merging sources: conflicts name both sources, node types are declared with file:line errors, diff, CLI."""

from __future__ import annotations

from pathlib import Path

import pytest
from whywait.engine.cli import main
from whywait.topology.errors import TopologyError
from whywait.topology.model import Topology
from whywait.topology.reconcile import diff, findings, load_node_types, merge
from whywait.topology.sources import HostFacts, NicFacts, SourceFacts, SwitchFacts, read_slurm_conf

FIX = Path(__file__).resolve().parents[1] / "fixtures" / "topology"


def fabric(leaf_of_n1: str = "leaf-1") -> SourceFacts:
    f = SourceFacts("fabric.out", "ibnetdiscover")
    f.switches = {"spine-1": SwitchFacts("spine-1", "fabric.out:1", "spine"),
                  "leaf-1": SwitchFacts("leaf-1", "fabric.out:2", "leaf", {"spine-1"}),
                  "leaf-2": SwitchFacts("leaf-2", "fabric.out:3", "leaf", {"spine-1"})}
    f.hosts = {"n1": HostFacts("n1", "fabric.out:10", nics=[
        NicFacts("HCA-1", "fabric.out:10", leaf_of_n1, guids={"00000000000000a1"})])}
    return f


def test_a_node_under_two_switches_names_both_sources(tmp_path: Path) -> None:
    conf = tmp_path / "topology.conf"
    conf.write_text("SwitchName=leaf-2 Nodes=n1\n")
    res = merge([read_slurm_conf(conf), fabric()])
    assert res.conflicts == [f"node 'n1' is under two switches: 'leaf-2' ({conf}:1) but leaf-1 (fabric.out:10)"]


def test_one_nic_seen_under_two_leaves() -> None:
    other = fabric("leaf-2")
    other.source = "fabric2.out"
    for h in other.hosts.values():
        h.nics[0].where = "fabric2.out:7"
    res = merge([fabric(), other])
    assert res.conflicts == ["node 'n1' NIC 'HCA-1' is under two switches: 'leaf-1' (fabric.out:10) but 'leaf-2' "
                             "(fabric2.out:7)"]


def test_gpu_counts_that_disagree_and_a_nic_serving_a_missing_gpu() -> None:
    a = SourceFacts("a.xml", "nccl", {"n1": HostFacts("n1", "a.xml:1", (0, 1, 2, 3))})
    b = SourceFacts("b.txt", "nvidia-smi", {"n1": HostFacts("n1", "b.txt:2", (0, 1), nics=[
        NicFacts("mlx5_0", "b.txt:5", None, (0, 3))])})
    res = merge([a, b])
    assert res.conflicts[0] == "node 'n1': GPUs: (0, 1, 2, 3) (a.xml:1) but (0, 1) (b.txt:2)"
    assert len(res.conflicts) == 1  # the NIC's GPU 3 exists under the first source's count


def test_agent_nic_matched_by_guid_gets_its_aliases_and_the_fabric_name_stays() -> None:
    agent = SourceFacts("agent.jsonl", "agent", {"n1": HostFacts("n1", "agent.jsonl:1", nics=[
        NicFacts("mlx5_0", "agent.jsonl:1", guids={"00000000000000a1"}, pci="0000:1a:00.0", aliases={"mlx5_0/1"}),
        NicFacts("mlx5_1", "agent.jsonl:1", guids={"00000000000000b2"})])})
    res = merge([agent, fabric()])  # the order given does not matter: cabling sources go first
    nic = res.topology.nic("n1", "HCA-1")
    assert nic.aliases == ("mlx5_0", "mlx5_0/1") and nic.pci == "0000:1a:00.0" and nic.leaf == "leaf-1"
    assert res.topology.unmatched == ("agent.jsonl:1: n1 NIC mlx5_1 (00000000000000b2) matches no NIC the fabric "
                                      "shows on that host; not added",)
    assert findings(res.topology).non_gpu_hosts == ["n1"]


def test_node_types_file_errors_have_lines(tmp_path: Path) -> None:
    (tmp_path / "x.xml").write_bytes((FIX / "ndv5-topo.xml").read_bytes())
    p = tmp_path / "types.yaml"
    p.write_text("node_types:\n"
                 "  - name: dgx\n"
                 "    match: ['*-dgx-*']\n"
                 "    gpus: 4\n"
                 "    nccl: x.xml\n"
                 "    nic_names: {HCA-1: mlx5_9}\n"
                 "  - name: cpu\n"
                 "    match: []\n"
                 "    gpu: 0\n")
    with pytest.raises(TopologyError) as exc:
        load_node_types(p)
    assert exc.value.problems == (
        f"{p}:6: node_types[0].nic_names.HCA-1: expected one of the NCCL XML's NICs ['mlx5_0', 'mlx5_1', 'mlx5_2', "
        "'mlx5_3', 'mlx5_4', 'mlx5_5', 'mlx5_6', 'mlx5_7'] (got 'mlx5_9')",
        f"{p}:4: node_types[0].gpus: the NCCL XML has 8 GPUs (got 4)",
        f"{p}:9: node_types[1].gpu: unknown key (valid: gpus, match, name, nccl, nic_names)",
        f"{p}:8: node_types[1].match: expected a host-name glob or a list of them, such as '*-dgx-*' (got [])")


def test_diff_says_what_changed() -> None:
    old = merge([fabric()]).topology
    new_f = fabric("leaf-2")
    new_f.hosts["n2"] = HostFacts("n2", "x:1", (0, 1))
    new = merge([new_f]).topology
    assert diff(old, new) == ["+ node n2 (2 GPUs)", "~ nic n1 HCA-1: leaf 'leaf-1' -> 'leaf-2'"]
    assert diff(old, old) == []


def test_check_lists_gaps_with_lines_and_fails_on_schema_errors(tmp_path: Path,
                                                                 capsys: pytest.CaptureFixture[str]) -> None:
    topo = merge([fabric()]).topology
    topo.to_yaml(tmp_path / "c.yaml")
    assert main(["topology", "check", str(tmp_path / "c.yaml")]) == 0
    assert main(["topology", "check", "--strict", str(tmp_path / "c.yaml")]) == 0  # a non-GPU host is no gap
    (tmp_path / "bad.yaml").write_text("nodes:\n  - id: n1\n    gpus: two\n")
    assert main(["topology", "check", str(tmp_path / "bad.yaml")]) == 1
    out = capsys.readouterr().out
    assert f"{tmp_path / 'bad.yaml'}:3: nodes[0].gpus: expected a GPU count or a list of distinct GPU indexes " \
           "(at most 1024) (got 'two')" in out
    gpu = Topology.from_dict({"switches": [{"id": "l1", "tier": "leaf"}], "nodes": [
        {"id": "n1", "gpus": 2, "nics": [{"name": "mlx5_0", "leaf": "l1", "gpus": [0]}, {"name": "mlx5_1",
                                                                                       "leaf": "l1"}]}]})
    gpu.to_yaml(tmp_path / "g.yaml")
    assert main(["topology", "check", "--strict", str(tmp_path / "g.yaml")]) == 1
    out = capsys.readouterr().out.splitlines()
    text = (tmp_path / "g.yaml").read_text().splitlines()
    nic_line = text.index("  - name: mlx5_1") + 1
    gpus_line = text.index("  gpus:") + 1
    assert out == [f"{tmp_path / 'g.yaml'}:{nic_line}: n1 mlx5_1: NIC without GPUs on GPU hosts",
                   f"{tmp_path / 'g.yaml'}:{gpus_line}: n1 gpu 1: GPU without a NIC"]


def test_import_refuses_to_write_a_cluster_with_conflicts(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    a, b = tmp_path / "a.conf", tmp_path / "b.conf"
    a.write_text("SwitchName=s1 Nodes=n1\nSwitchName=s2 Nodes=n2\n")
    b.write_text("SwitchName=s2 Nodes=n1\n")
    out = tmp_path / "c.yaml"
    assert main(["topology", "import", "slurm-conf", str(a), str(b), "-o", str(out)]) == 2
    err = capsys.readouterr().err
    assert f"conflict: node 'n1' is under two switches: 's1' ({a}:1) but 's2' ({b}:1)" in err
    assert "1 conflict(s) between sources; nothing written" in err and not out.exists()
    assert main(["topology", "import", "nosuch", str(a)]) == 2
    assert "expected a format before 'nosuch'" in capsys.readouterr().err


def test_path_between_gpus_and_nodes() -> None:
    res = merge([fabric()])
    topo = res.topology
    assert topo.path_between("n1", "n1") == ("n1",)
    with pytest.raises(TopologyError, match="unknown gpu or node 'n9'"):
        topo.path_between("n1", "n9")


def test_topology_path_takes_the_readmes_form(capsys: pytest.CaptureFixture[str],
                                              monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("WHYWAIT_TOPOLOGY", raising=False)
    small = str(FIX / "small.yaml")
    want = "gpu-a1 gpu 2 -> gpu-a1 -> gpu-a1 mlx5_1 -> leaf-1 -> spine-1 -> leaf-2 -> gpu-b1 eth0 -> gpu-b1\n"
    # FILE A B as the README writes it, --topology FILE A B, and each GPU spelling
    for argv in ([small, "gpu-a1/gpu2", "gpu-b1"], ["--topology", small, "gpu-a1/gpu2", "gpu-b1"],
                 [small, "gpu-a1 gpu 2", "gpu-b1"], [small, "gpu-a1/gpu 2", "gpu-b1"]):
        assert main(["topology", "path", *argv]) == 0, argv
        assert capsys.readouterr().out == want
    monkeypatch.setenv("WHYWAIT_TOPOLOGY", small)
    assert main(["topology", "path", "gpu-b1/gpu1", "gpu-b1"]) == 0
    assert capsys.readouterr().out == "gpu-b1 gpu 1 -> gpu-b1\n"
    # a GPU the node lacks says which it has
    assert main(["topology", "path", small, "gpu-a1/gpu7", "gpu-b1"]) == 2
    assert capsys.readouterr().err == "whywait topology: unknown gpu 'gpu-a1/gpu7' (gpu-a1 has GPUs 0, 1, 2, 3)\n"


def test_topology_path_usage_errors_show_its_own_usage(capsys: pytest.CaptureFixture[str]) -> None:
    small = str(FIX / "small.yaml")
    with pytest.raises(SystemExit) as exc:
        main(["topology", "path", "--bogus", small, "gpu-a1", "gpu-b1"])
    err = capsys.readouterr().err
    assert exc.value.code == 2 and err == ("whywait topology path: unrecognized arguments: --bogus; "
                                           "`whywait topology path --help` lists the options\n")
    assert main(["topology", "path", small, "gpu-a1", "gpu-b1", "extra"]) == 2
    assert "topology path takes [FILE] A B" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        main(["topology", "path", "--help"])
    out = capsys.readouterr().out
    assert "then the two ends" in out and "a GPU as 'node-03/gpu2' or 'node-03 gpu 2'" in out


def test_import_and_check_say_how_many_hosts_have_no_gpus(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """A fabric dump alone gives 122 hosts and no GPUs; the summaries said '2 gap(s)' and '122 host(s) OK'."""
    out = tmp_path / "cluster.yaml"
    assert main(["topology", "import", "ibnetdiscover", str(FIX / "ibnetdiscover-example.out"), "-o", str(out)]) == 0
    err = capsys.readouterr().err.splitlines()
    assert err[-2].startswith(f"wrote {out}: 122 host(s), 0 GPU(s), 40 switch(es); 2 gap(s)")
    assert err[-1] == (f"{out}: 122 of 122 host(s) without GPUs: no source says they have any (for GPU hosts add one "
                       "that does: nccl, nvidia-smi, k8s-nodes, agent, or --types)")
    assert main(["topology", "check", str(out)]) == 0
    assert capsys.readouterr().err.splitlines() == [f"{out}: 122 host(s) OK, 2 gap(s)", err[-1]]
    assert main(["topology", "check", str(FIX / "small.yaml")]) == 0  # every host has GPUs: nothing more to say
    assert capsys.readouterr().err == f"{FIX / 'small.yaml'}: 2 host(s) OK\n"


def test_startup_warnings_leave_the_prefix_to_the_engine_log() -> None:
    """The engine logged 'topology: topology: 486 GPU(s) without a NIC': both added the prefix."""
    from whywait.topology.reconcile import startup_warnings

    lone = SourceFacts("lone.out", "ibnetdiscover")
    lone.hosts = {"n2": HostFacts("n2", "lone.out:1")}
    lines = startup_warnings(merge([fabric(), lone]).topology)
    assert lines == ["1 host(s) without a switch (no NIC cabled to a leaf): n2"]
