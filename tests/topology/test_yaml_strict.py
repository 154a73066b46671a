"""Topology files are read by whywait.yamlio: a duplicate key is an error, not a silently lost value."""

from __future__ import annotations

from pathlib import Path

import pytest
from whywait.topology import Topology, TopologyError


def test_a_duplicate_key_in_a_cluster_file_names_both_lines(tmp_path: Path) -> None:
    f = tmp_path / "topo.yaml"
    f.write_text("format: 1\nracks:\n  - id: rack-01\nnodes:\n  - id: node-01\n    rack: rack-01\n"
                 "    gpus: 8\n    gpus: 4\n")
    with pytest.raises(TopologyError) as exc:
        Topology.from_yaml(f)
    assert str(exc.value) == f"{f}:8: duplicate key 'gpus' (the first is on line 7)"


def test_a_bad_cluster_file_is_one_line_with_its_place(tmp_path: Path) -> None:
    f = tmp_path / "topo.yaml"
    f.write_text("format: 1\nnodes: [\n")
    with pytest.raises(TopologyError, match=r"topo\.yaml:3: not valid YAML: "):
        Topology.from_yaml(f)


def test_a_slurm_topology_yaml_with_a_duplicate_key_is_refused(tmp_path: Path) -> None:
    from whywait.topology.sources import read_source

    f = tmp_path / "topology.yaml"
    f.write_text("- topology: t\n  flat: true\n  topology: u\n")
    with pytest.raises(TopologyError, match=r"topology\.yaml:3: duplicate key 'topology' \(the first is on line 1\)"):
        read_source("slurm-yaml", str(f))
