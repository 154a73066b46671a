"""Write a bundle of a simulated incident, for measuring replay: ``python make_bundle.py NODES SECONDS OUT``.

One job on NODES 8-GPU nodes, the fifth node's NIC (``node-05``, or ``node-005`` from 100 nodes on) dropping
packets from +120 s to +200 s.
Run from the repository root (the rules are read from ``rules/``).
"""

from __future__ import annotations

import sys
from pathlib import Path

from whywait.agents.events import encode
from whywait.engine.commands.export_cmd import rule_files
from whywait.engine.importers.bundle import BundleWriter
from whywait.engine.replay import EventTimeMerge, Window
from whywait.simulate.cluster import make_cluster, make_job
from whywait.simulate.faults import make_fault
from whywait.simulate.sim import Simulation

START = 1_764_442_800.0


def main(nodes: int, duration: float, out: Path) -> int:
    topo = make_cluster(nodes=nodes)
    # The fifth node by name, not "node-05": the simulator pads node numbers to the cluster's size.
    names = sorted(topo.nodes())
    culprit = names[min(4, len(names) - 1)]
    sim = Simulation(topo, [make_job(topo)], [make_fault("nic-packet-loss", culprit, 120, 200)],
                     start_time=START, duration_s=duration, seed=2)
    topo_path = out.with_suffix(".yaml")
    make_cluster(nodes=nodes).to_yaml(topo_path)
    merge = EventTimeMerge(["sim"], Window(START, START + duration))
    merge.raw = True
    with BundleWriter(out, {"since": START, "until": START + duration, "lead_s": 0.0}) as bw:
        for topic, msg in sim.messages():
            merge.add("sim", topic, [encode(msg)])
            for t, raw in merge.ready():
                bw.add(t, raw)
        for t, raw in merge.drain():
            bw.add(t, raw)
        bw.close(topo_path, rule_files([Path("rules")]))
    print(f"{out}: {sum(bw.counts.values())} messages")
    return 0


if __name__ == "__main__":
    if len(sys.argv) != 4 or not sys.argv[1].isdigit() or float(sys.argv[2]) <= 200:
        sys.exit("usage: make_bundle.py NODES SECONDS OUT (SECONDS over 200: the fault runs from +120 s to +200 s)")
    sys.exit(main(int(sys.argv[1]), float(sys.argv[2]), Path(sys.argv[3])))
