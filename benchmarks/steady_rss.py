"""The evaluator's resident memory at steady state: one simulated cluster fed in process for the retention.

Run: ``.venv/bin/python benchmarks/steady_rss.py [NODES] [SECONDS]`` (default 1280 nodes, 960 s).

Unlike ``store_bench.py --rss`` (ten simulated seconds replayed), the simulator runs for the whole
range, so the step tables, rings and report times fill as they do in a real job: memory is flat
once the range passes the 900 s retention.  Every message goes through ``encode`` → ``decode`` →
``Evaluator.ingest`` with the shipped rules; every 60 s of event time it prints the process's RSS
(``/proc/self/status``), the columns' bytes and the CPU used so far.  At 1,280 nodes it takes about
25 CPU-minutes.  A benchmark, not a test.
"""

from __future__ import annotations

import resource
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def rss_mib() -> int:
    """The process's resident set now, in MiB."""
    for line in open("/proc/self/status"):
        if line.startswith("VmRSS"):
            return int(line.split()[1]) // 1024
    return -1


def main(nodes: int = 1280, seconds: float = 960.0) -> None:
    from whywait.agents.events import decode, encode
    from whywait.engine.commands.bench_cmd import simulated_cluster
    from whywait.engine.evaluate.evaluator import Evaluator
    from whywait.engine.rules.loader import load_rules
    from whywait.topology.model import Topology

    start = 1.7e9
    tmp = Path(tempfile.mkdtemp())
    msgs, _ = simulated_cluster(nodes, start, seconds, tmp / "topology.yaml")
    ev = Evaluator(load_rules([REPO / "rules"]), Topology.from_yaml(tmp / "topology.yaml"))
    cpu0, wall0, shown, n = time.process_time(), time.time(), None, 0
    for topic, msg in msgs:
        ev.ingest(decode(encode(msg), topic))
        n += 1
        sec = int(float(msg["time"]) - start)
        if sec % 60 == 0 and sec != shown:
            shown = sec
            print(f"t={sec:4d}s rss={rss_mib()} MiB columns={ev.store.memory_bytes() >> 20} MiB messages={n} "
                  f"cpu={time.process_time() - cpu0:.0f}s wall={time.time() - wall0:.0f}s", flush=True)
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss // 1024
    print(f"end rss={rss_mib()} MiB peak={peak} MiB cpu={time.process_time() - cpu0:.0f}s", flush=True)


if __name__ == "__main__":
    args = sys.argv[1:]
    try:
        nodes, seconds = int(args[0]) if args else 1280, float(args[1]) if len(args) > 1 else 960.0
    except ValueError:
        sys.exit(f"usage: steady_rss.py [NODES] [SECONDS] (whole nodes, seconds of event time; got {' '.join(args)})")
    main(nodes, seconds)
