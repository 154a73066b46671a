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
from whywait.topology.loaders import load_nccl_topology
from whywait.topology.sources import read_nccl, read_nvidia_smi_topo

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
