"""A node root built from gpud's real H100 ``/sys/class/infiniband`` capture, for agent and topology tests.

The capture (``tests/fixtures/agents/gpud/``, see its ATTRIBUTION.md) holds the real
names, counters and link states of eight ConnectX-7 ports and a bond, but not the two
things a real sysfs also has and the capture left out: each HCA's ``node_guid`` and
port GIDs, and the ``device`` link to its PCI function.  :func:`h100_root` adds
them in the kernel's formats (``e09d:7303:0085:94c4``; a ``device`` symlink into
``/sys/devices/pci<dom>:<bus>/<addr>``) with values the caller gives: in the
topology tests, the GUIDs a real fabric dump shows for one host and the PCI
addresses of a real NCCL XML, so that all three real files describe one machine.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path
from typing import Mapping

CAPTURE = Path(__file__).resolve().parents[1] / "fixtures" / "agents" / "gpud" / "sys-class-infiniband-h100.0"

# Host a06-p1-dgx-02-c18 in topograph's real ibnetdiscover dump: its HCAs' node GUIDs, by the kernel name of
# the port they are (the dump's HCA-<n+1> is mlx5_<n>: dual-port cards, GUIDs in pairs).
DUMP_HOST = "a06-p1-dgx-02-c18"
DUMP_GUIDS = {"mlx5_0": "e09d7303008594c4", "mlx5_1": "e09d7303008594c8",
              "mlx5_4": "e09d730300857b64", "mlx5_5": "e09d730300857b68"}
# Azure ND H100 v5's NCCL XML (azhpc-images ndv5-topo.xml): its eight IB functions in bus order.
NDV5_NIC_PCI = {f"mlx5_{i}": f"{0x101 + i:04x}:00:00.0" for i in range(8)}


def h100_root(tmp: str | os.PathLike[str], guids: Mapping[str, str] = DUMP_GUIDS,
              pci: Mapping[str, str] = NDV5_NIC_PCI) -> str:
    """Return a writable node root whose ``/sys/class/infiniband`` is the real capture plus identities."""
    root = os.path.join(str(tmp), "h100-root")
    ib = os.path.join(root, "sys", "class", "infiniband")
    shutil.copytree(CAPTURE, ib)
    for dirpath, dirnames, filenames in os.walk(root):
        for name in dirnames + filenames:
            os.chmod(os.path.join(dirpath, name), 0o755 if name in dirnames else 0o644)
    for hca, guid in guids.items():
        g = ":".join(guid[i:i + 4] for i in range(0, 16, 4))
        Path(ib, hca, "node_guid").write_text(g + "\n")
        gids = Path(ib, hca, "ports", "1", "gids")
        gids.mkdir(exist_ok=True)
        (gids / "0").write_text(f"fe80:0000:0000:0000:{g}\n")
    for hca, addr in pci.items():
        if not Path(ib, hca).is_dir():
            continue
        dom, bus = addr.split(":")[:2]
        dev = Path(root, "sys", "devices", f"pci{dom}:{bus}", addr)
        dev.mkdir(parents=True, exist_ok=True)
        os.symlink(os.path.relpath(dev, Path(ib, hca)), Path(ib, hca, "device"))
    return root
