"""``whywait bench``: the engine and replay against a raw consume+decode of the same topic, through real Kafka.

Simulated clusters (``--gpus 128,1024,10240``, 8 GPUs a node, one NIC fault each) are written once
through the broker (a private local one, or ``--bootstrap``); then raw consume+decode, the engine
and replay read the same data in one run, alternating, ``--reps`` times.  It prints the median and
spread of their messages per CPU-second relative to raw, wall times, peak RSS, event→diagnosis
latency and the load average; ``--json FILE`` keeps them.  ``--sustained`` adds one worker fed
1,280 nodes live for the baseline retention; ``--workers 1,2`` compares consumer-group sizes.
A benchmark, not a test: it asserts nothing about speed.
"""

from __future__ import annotations

import argparse
import functools
import tempfile
from pathlib import Path
from typing import Callable

from whywait.engine.bench.feed import GPUS_PER_NODE, Messages, Written


def _ints(what: str) -> Callable[[str], tuple[int, ...]]:
    def parse(v: str) -> tuple[int, ...]:
        try:
            vals = tuple(int(x) for x in v.split(",") if x.strip())
        except ValueError:
            raise argparse.ArgumentTypeError(f"{what}: expected comma-separated whole numbers (got {v!r})") from None
        if not vals or any(x <= 0 for x in vals):
            raise argparse.ArgumentTypeError(f"{what}: expected positive whole numbers (got {v!r})")
        return vals

    return parse


def simulated_cluster(nodes: int, start: float, seconds: float, topo_path: Path,
                      seed: int = 5, jobs: int = 1) -> tuple[Messages, Written]:
    """``jobs`` jobs (one by default) sharing ``nodes`` 8-GPU nodes in contiguous blocks, the fifth node's NIC
    dropping packets in the middle third (so that there are diagnoses to time); passed to the harness, which
    never imports the simulator itself.

    Why ``jobs``: the partitioned engine keys by job (a job's peer comparison needs all its ranks in one
    worker), so one job's evaluation runs on one worker however many there are; only the routing spreads.
    A cluster of several jobs is what more workers can split.
    """
    from whywait.simulate.cluster import make_cluster, make_job
    from whywait.simulate.faults import make_fault
    from whywait.simulate.sim import Simulation

    topo = make_cluster(nodes=nodes, gpus_per_node=GPUS_PER_NODE)
    topo.to_yaml(topo_path)
    names = sorted(topo.nodes())
    node = names[min(4, nodes - 1)]
    f0, f1 = seconds / 3, 2 * seconds / 3
    n_jobs = max(1, min(jobs, nodes))
    blocks = [names[i * nodes // n_jobs:(i + 1) * nodes // n_jobs] for i in range(n_jobs)]
    specs = [make_job(topo)] if n_jobs == 1 else \
        [make_job(topo, job=f"train-{i:02d}", nodes=b) for i, b in enumerate(blocks)]
    sim = Simulation(topo, specs, [make_fault("nic-packet-loss", node, f0, f1)], start_time=start,
                     duration_s=seconds, seed=seed)
    return sim.messages(), Written(nodes, start, seconds, topo_path, (node, start + f0, start + f1))


def register(p: argparse.ArgumentParser) -> None:
    size = p.add_mutually_exclusive_group()
    size.add_argument("--gpus", type=_ints("--gpus"), help="cluster sizes in GPUs, 8 a node (default 128,1024,10240)")
    size.add_argument("--nodes", type=_ints("--nodes"), help="cluster sizes in nodes (instead of --gpus)")
    p.add_argument("--seconds", type=float, default=120.0, help="event time simulated per size (default 120)")
    p.add_argument("--reps", type=int, default=3, help="alternating repetitions per size (default 3)")
    p.add_argument("--feed-speed", type=float, default=4.0,
                   help="write each size at this many event seconds per wall second while one engine consumes it "
                        "live, for the latency figure (0: as fast as possible; default 4)")
    p.add_argument("--workers", type=_ints("--workers"), default=(1,),
                   help="also run the largest size with these numbers of engine workers in one group, e.g. 1,2")
    p.add_argument("--jobs", type=int, default=1,
                   help="jobs the simulated cluster runs, in blocks of nodes (default 1; the partitioned engine "
                        "splits work between workers by job)")
    p.add_argument("--partitions", type=int, default=None,
                   help="partitions of the input topics the bench creates (default: 2 x the most workers)")
    p.add_argument("--sustained", action="store_true",
                   help="also feed one worker a cluster live for the baseline retention: cores used, steady RSS")
    p.add_argument("--sustained-nodes", type=int, default=1280, help="nodes of the sustained run (default 1280)")
    p.add_argument("--sustained-seconds", type=float, default=900.0,
                   help="event time of the sustained run (default 900: the baseline retention)")
    p.add_argument("--sustained-speed", type=float, default=1.0,
                   help="event seconds per wall second of the sustained feed (default 1: real time)")
    p.add_argument("--bootstrap", help="use this Kafka instead of a private local broker (its topics get bench data)")
    p.add_argument("--rules", action="append", type=Path, help="rule files or folders (default: the engine's)")
    p.add_argument("--json", type=Path, help="also write every figure as JSON")
    p.add_argument("--keep", type=Path, metavar="DIR", help="keep the work folder (logs, topologies) in DIR")
    p.add_argument("--timeout", type=float, default=1800.0, help="give up on one run after this many seconds")


def run(args: argparse.Namespace) -> int:
    from whywait.engine.bench.harness import BenchConfig, run_bench
    from whywait.engine.bench.table import render, write_json
    from whywait.engine.errors import ConfigError

    nodes = args.nodes
    if nodes is None:
        gpus = args.gpus or (128, 1024, 10240)
        bad = [g for g in gpus if g % 8]
        if bad:
            raise ConfigError(f"--gpus: sizes must be whole 8-GPU nodes (got {', '.join(map(str, bad))})")
        nodes = tuple(g // 8 for g in gpus)
    for name, v in (("--seconds", args.seconds), ("--sustained-seconds", args.sustained_seconds)):
        if not (v >= 10 and v < float("inf")):
            raise ConfigError(f"{name} must be at least 10 seconds of event time (got {v})")
    if args.reps < 1:
        raise ConfigError(f"--reps must be at least 1 (got {args.reps})")
    if not (args.feed_speed >= 0 and args.sustained_speed > 0):
        raise ConfigError("--feed-speed must be >= 0 and --sustained-speed > 0")
    if args.jobs < 1:
        raise ConfigError(f"--jobs must be at least 1 (got {args.jobs})")
    partitions = args.partitions or (2 * max(args.workers) if max(args.workers) > 1 else 1)
    if partitions < 1:
        raise ConfigError(f"--partitions must be at least 1 (got {partitions})")
    from whywait.engine.commands.outputs import check_outputs

    check_outputs([(args.json, "--json")], [(args.keep, "--keep")])  # refused now, not after the runs
    cfg = BenchConfig(nodes=tuple(nodes), seconds=args.seconds, reps=args.reps, feed_speed=args.feed_speed,
                      workers=tuple(args.workers), partitions=partitions, sustained=args.sustained,
                      sustained_nodes=args.sustained_nodes, sustained_seconds=args.sustained_seconds,
                      sustained_speed=args.sustained_speed, rules=tuple(args.rules or ()), timeout_s=args.timeout)
    from rich.console import Console

    err = Console(stderr=True)

    def say(line: str) -> None:
        err.print(f"[dim]{line}[/dim]", highlight=False)

    make = functools.partial(simulated_cluster, jobs=args.jobs)
    if args.keep:
        args.keep.mkdir(parents=True, exist_ok=True)
        result = run_bench(cfg, args.bootstrap, args.keep, say, make)
    else:
        with tempfile.TemporaryDirectory(prefix="whywait-bench-") as tmp:
            result = run_bench(cfg, args.bootstrap, Path(tmp), say, make)
    result["config"]["jobs"] = args.jobs
    render(result)
    if args.json:
        write_json(result, args.json)
        print(f"figures: {args.json}")
    return 0
