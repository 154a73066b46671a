"""Every topology source, fed its real capture damaged: a result or a one-line error, never an internal error.

The captures are the real InfiniBand fabric dump and NetQ (Ethernet fabric) export, Slurm files,
NCCL topology XML and `nvidia-smi` outputs under tests/fixtures (see the ATTRIBUTION.md files
there), plus the cluster YAML of the fixtures.  The damage is deterministic: cut at many lines and
bytes (a dump copied while being written, a full disk), a line deleted or doubled, one non-UTF-8
byte.  Found this way: a cut ibnetdiscover dump (a port naming a switch whose block was cut off)
and a cluster YAML whose job lacked ``project`` were KeyErrors.
"""

from __future__ import annotations

from pathlib import Path
from typing import Iterator

import pytest
from whywait.engine.cli import main

from whywait.errors import EXIT_INTERNAL

FIX = Path(__file__).resolve().parents[1] / "fixtures"
SMI = sorted((FIX / "agents" / "nvidia-smi").glob("*.txt"))

SOURCES = [("ibnetdiscover", None, FIX / "topology" / "ibnetdiscover-example.out"),
           ("slurm-conf", None, FIX / "topology" / "slurm-tree.conf"),
           ("slurm-conf", None, FIX / "topology" / "slurm-block.conf"),
           ("nccl", "node-01", FIX / "topology" / "ndv5-topo.xml"),
           ("nccl", "node-01", FIX / "topology" / "ncv4-topo.xml"),
           ("nccl", "node-01", FIX / "topology" / "ndv2-topo.xml"),
           ("netq", None, FIX / "topology" / "netq-topologyGraph.json"),
           ("netq", None, FIX / "topology" / "netq-computeNodes.json"),
           *(("nvidia-smi", "node-01", p) for p in SMI[:2])]


def _damaged(data: bytes, cuts: int = 25) -> Iterator[tuple[str, bytes]]:
    lines = data.split(b"\n")
    for i in range(0, len(lines), max(1, len(lines) // cuts)):
        yield f"cut after line {i}", b"\n".join(lines[:i])
        yield f"line {i + 1} deleted", b"\n".join(lines[:i] + lines[i + 1:])
        yield f"line {i + 1} doubled", b"\n".join(lines[:i + 1] + lines[i:])
    for off in range(1, len(data), max(1, len(data) // cuts)):
        yield f"cut at byte {off}", data[:off]
    yield "a non-UTF-8 byte", data[: len(data) // 2] + b"\xff" + data[len(data) // 2:]


def _internal(argv: list[str], capsys: pytest.CaptureFixture[str]) -> str | None:
    """The error when ``whywait argv`` fails as a bug would (exit 70 or a traceback), else None."""
    try:
        rc = main(argv)
    except SystemExit as exc:  # argparse
        rc = exc.code if isinstance(exc.code, int) else 2
    err = capsys.readouterr().err
    return f"rc {rc}: {err.strip()[-300:]}" if rc == EXIT_INTERNAL or "Traceback" in err else None


@pytest.mark.parametrize(("fmt", "host", "capture"), SOURCES, ids=lambda v: getattr(v, "name", v))
def test_topology_import_of_a_damaged_capture(fmt: str, host: str | None, capture: Path, tmp_path: Path,
                                              capsys: pytest.CaptureFixture[str]) -> None:
    bad = tmp_path / capture.name
    failures = []
    for what, data in _damaged(capture.read_bytes()):
        bad.write_bytes(data)
        got = _internal(["topology", "import", fmt, f"{host}={bad}" if host else str(bad),
                         "-o", str(tmp_path / "out.yaml")], capsys)
        if got:
            failures.append(f"{what}: {got}")
    assert failures == []


def test_topology_check_of_a_damaged_cluster_file(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    bad = tmp_path / "cluster.yaml"
    failures = []
    for what, data in _damaged((FIX / "topology" / "small.yaml").read_bytes(), cuts=60):
        bad.write_bytes(data)
        got = _internal(["topology", "check", str(bad)], capsys)
        if got:
            failures.append(f"{what}: {got}")
    assert failures == []
