"""The engine's in-process hot path: decoding, the metric store's ingest, evaluation ticks, and memory.

Run: ``.venv/bin/python benchmarks/store_bench.py [--nodes 128 1280] [--seconds 60] [--repeat 3]``
and, for memory, ``--rss 128:60,128:900`` (nodes:seconds of event time, each in a fresh process).

No Kafka: this measures what the engine does with a message once it has its bytes, so the figures
isolate decoding, the store and the rules (``whywait bench`` measures the engine end to end on the
real broker).  The data: a simulated cluster of N nodes × 8 GPUs running one job on every GPU,
1 s interval (GPU, network, storage, host, hardware and step messages per node per second).
Ten seconds are simulated once and replayed with shifted event times, so a long run costs no
simulation time.  Every figure is CPU seconds (``time.process_time``), which a busy shared machine
disturbs less than wall time; each is the median of ``--repeat`` runs, with the spread.

Figures, per node count:

* decode: contract messages per CPU-second for ``decode`` alone (and ``json.loads`` alone, the floor);
* ingest: messages per CPU-second into :class:`MetricStore` (including applying staged points);
* tick: CPU milliseconds per evaluation tick (every shipped rule against the job), after the windows
  have filled (including applying the staged points its rules read);
* evaluator_cores: CPU seconds the evaluator spends (ingest and ticks) per second of event time at a
  1 s interval, after 30 s of warm-up: the cores the cluster needs, decoding and Kafka excluded;
* with ``--rss``: the process's resident memory after ingesting (and ticking) N nodes for S seconds
  of event time.

It prints a table; it is a benchmark, not a test.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]

TEMPLATE_S = 10
START = 1.7e9


def templates(nodes: int) -> tuple[Any, list[tuple[str, bytes]], list[list[tuple[str, bytes]]]]:
    """The topology, the placement, and ``TEMPLATE_S`` seconds of encoded messages (one list per second)."""
    from whywait.agents.events import encode
    from whywait.simulate.cluster import make_cluster, make_job
    from whywait.simulate.sim import Simulation

    topo = make_cluster(nodes=nodes)
    sim = Simulation(topo, [make_job(topo)], [], start_time=START, duration_s=TEMPLATE_S, seed=5)
    first: list[tuple[str, bytes]] = []
    per_s: list[list[tuple[str, bytes]]] = [[] for _ in range(TEMPLATE_S)]
    for topic, m in sim.messages():
        if m["kind"] == "placement":
            first.append((topic, encode(m)))
            continue
        sec = min(TEMPLATE_S - 1, max(0, int(m["time"] - START)))
        per_s[sec].append((topic, encode(m)))
    return topo, first, per_s


def shifted(msg: Any, dt: float) -> Any:
    """``msg`` with its event time (and its steps' end times) moved by ``dt``: a typed event or a dict."""
    m: Any = msg
    t = m["time"] + dt
    try:  # a typed event (msgspec Struct): copy with the new time
        import msgspec

        if isinstance(m, msgspec.Struct):
            if m["kind"] == "steps" and any(s.get("ended_at") is not None for s in m["steps"]):  # type: ignore[index]
                steps = [msgspec.structs.replace(s, ended_at=s["ended_at"] + dt) if s.get("ended_at") else s
                         for s in m["steps"]]  # type: ignore[index]
                return msgspec.structs.replace(m, time=t, steps=steps)
            return msgspec.structs.replace(m, time=t)
    except ImportError:
        pass
    out = {**msg, "time": t}
    if msg["kind"] == "steps":
        out["steps"] = [{**s, "ended_at": s["ended_at"] + dt} if s.get("ended_at") else s for s in msg["steps"]]
    return out


def cpu(fn: Any) -> float:
    t = time.process_time()
    fn()
    return time.process_time() - t


def one_run(nodes: int, seconds: int, data: Any) -> dict[str, float]:
    """One measurement of every figure at ``nodes``; returns them by name."""
    import json as _json

    from whywait.agents.events import decode
    from whywait.engine.evaluate.evaluator import Evaluator
    from whywait.engine.evaluate.store import MetricStore
    from whywait.engine.rules.loader import load_rules
    from whywait.topology.model import Topology

    topo, first, per_s = data
    raws = [(t, r) for sec in per_s for t, r in sec]
    out: dict[str, float] = {}
    out["json_loads_per_cpu_s"] = len(raws) / cpu(lambda: [_json.loads(r) for _, r in raws])
    out["decode_per_cpu_s"] = len(raws) / cpu(lambda: [decode(r, t) for t, r in raws])

    decoded = [[decode(r, t) for t, r in sec] for sec in per_s]
    placement = [decode(r, t) for t, r in first]

    # ingest: the store alone, one second of event time at a time (staged points applied each second)
    store = MetricStore()
    for p in placement:
        store.ingest(p)
    spent, n = 0.0, 0
    for sec in range(seconds):
        batch = [shifted(m, sec) for m in decoded[sec % TEMPLATE_S]]
        t = time.process_time()
        for m in batch:
            store.ingest(m)
        spent += time.process_time() - t
        n += len(batch)
    # the columnar store stages points and applies them before a read: count applying them all
    spent += cpu(getattr(store, "flush", lambda: None))
    out["ingest_per_cpu_s"] = n / spent
    out["store_mib"] = getattr(store, "memory_bytes", lambda: float("nan"))() / 2 ** 20

    # ticks: the evaluator with every shipped rule, fed the same data; ticks timed once windows are full
    ev = Evaluator(load_rules([REPO / "rules"]), Topology.from_dict(topo.to_dict()))
    tick_cpu: list[float] = []
    orig = ev.tick

    def timed(now: float) -> Any:
        t = time.process_time()  # includes applying the staged points the tick's rules read
        r = orig(now)
        if now >= START + min(30, seconds - 10):
            tick_cpu.append(time.process_time() - t)
        return r
    ev.tick = timed  # type: ignore[method-assign]
    for p in placement:
        ev.ingest(p)
    warm = min(30, seconds - 10)
    busy = 0.0
    for sec in range(seconds):
        batch = [shifted(m, sec) for m in decoded[sec % TEMPLATE_S]]
        t = time.process_time()
        for m in batch:
            ev.ingest(m)
        if sec >= warm:
            busy += time.process_time() - t
    out["tick_ms"] = 1000 * statistics.median(tick_cpu)
    # everything the evaluator does (ingest and one tick per second) per second of event time
    out["evaluator_cores"] = busy / (seconds - warm)
    out["ticks_timed"] = len(tick_cpu)
    return out


def rss_run(nodes: int, seconds: int) -> dict[str, float]:
    """Ingest and tick ``nodes`` for ``seconds`` of event time in this process; return its RSS."""
    from whywait.agents.events import decode
    from whywait.engine.evaluate.evaluator import Evaluator
    from whywait.engine.rules.loader import load_rules
    from whywait.topology.model import Topology

    topo, first, per_s = templates(nodes)
    decoded = [[decode(r, t) for t, r in sec] for sec in per_s]
    ev = Evaluator(load_rules([REPO / "rules"]), Topology.from_dict(topo.to_dict()))
    for t, r in first:
        ev.ingest(decode(r, t))
    marks: dict[str, float] = {}
    for sec in range(seconds):
        for m in decoded[sec % TEMPLATE_S]:
            ev.ingest(shifted(m, sec))
        if sec + 1 in (60, 300, 900, 1800) or sec + 1 == seconds:
            marks[f"rss_mib_at_{sec + 1}s"] = _rss_mib()
    return marks


def _rss_mib() -> float:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return float("nan")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--nodes", type=int, nargs="+", default=[128, 1280])
    ap.add_argument("--seconds", type=int, default=60, help="event time fed per run (ticks timed after 30 s)")
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--rss", default="", help="nodes:seconds[,nodes:seconds...], each measured in a fresh process")
    ap.add_argument("--rss-child", default="", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.rss_child:
        n, s = map(int, args.rss_child.split(":"))
        print(json.dumps(rss_run(n, s)))
        return 0
    for nodes in args.nodes:
        data = templates(nodes)
        runs = [one_run(nodes, args.seconds, data) for _ in range(args.repeat)]
        print(f"\n{nodes} nodes x 8 GPUs, {args.seconds} s of event time, median of {args.repeat} "
              f"(min..max):")
        for k in runs[0]:
            vals = [r[k] for r in runs]
            fmt = ".3f" if statistics.median(vals) < 10 else ".1f"
            print(f"  {k:24} {statistics.median(vals):12{fmt}}   ({min(vals):{fmt}}..{max(vals):{fmt}})")
    for spec in filter(None, args.rss.split(",")):
        r = subprocess.run([sys.executable, __file__, "--rss-child", spec], capture_output=True, text=True,
                           check=True)
        print(f"\nRSS {spec} (nodes:seconds): {r.stdout.strip()}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
