"""``whywait export``: cut an incident's events, placements, topology and rules into one bundle file.

The bundle (``whywait.engine.importers.bundle``) replays with no broker (``whywait replay --input``)
and can be written back into topics elsewhere (``whywait import``), so a postmortem no
longer depends on the topics' retention.  Reading is streamed in event-time order.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path


def register(p: argparse.ArgumentParser) -> None:
    from whywait.engine.commands.replay_cmd import allow_relative_times

    allow_relative_times(p)
    p.add_argument("--since", required=True, help="start of the window: Unix s, ISO 8601, or relative (-10m)")
    p.add_argument("--until", help="end of the window (default: now)")
    p.add_argument("--lead", default="15m", help="also keep this much before --since, to warm baselines (15m)")
    p.add_argument("--job", action="append", default=[], help="only this job (repeatable)")
    p.add_argument("--project", action="append", default=[], help="only this project's jobs (repeatable)")
    p.add_argument("--topology", type=Path, help="topology YAML to include (default: WHYWAIT_TOPOLOGY)")
    p.add_argument("--rules", action="append", type=Path,
                   help="rule files or folders to include (default: the engine's, ./rules or the shipped rules, "
                        "plus $WHYWAIT_SITE_RULES)")
    p.add_argument("--bootstrap", help="Kafka bootstrap (default: WHYWAIT_KAFKA_BOOTSTRAP or the local broker)")
    p.add_argument("-o", "--output", type=Path, required=True, help="the bundle to write (incident.whywait)")
    p.add_argument("--read-to-end", action="store_true",
                   help="read every partition to its end however much was written after the window (history "
                        "backfilled with `whywait import`); by default only when that tail is short")


def rule_files(paths: list[Path]) -> list[tuple[str, Path]]:
    """``(name inside the bundle, file)`` for every rule YAML under ``paths``.

    Each path keeps its own top-level name (a folder's name, or a file's), which the replay of the
    bundle loads as one rule path each.  Two with the same name (``./rules`` and a site's
    ``/etc/whywait/rules``) get ``rules`` and ``rules-2``: the second no longer overwrites the first.
    """
    from whywait.engine.errors import ConfigError

    out: list[tuple[str, Path]] = []
    tops: set[str] = set()
    for p in paths:
        top, k = p.name, 2
        while top in tops:
            top, k = (f"{p.stem}-{k}{p.suffix}" if p.is_file() else f"{p.name}-{k}"), k + 1
        tops.add(top)
        if p.is_dir():
            out += [(f"{top}/{f.relative_to(p)}", f) for f in sorted(p.rglob("*")) if f.is_file()]
        elif p.is_file():
            out.append((top, p))
        else:
            raise ConfigError(f"--rules {p}: no such file or folder")
    return out


def run(args: argparse.Namespace) -> int:
    from whywait.engine.commands.engine_cmd import default_rule_paths, load_topology
    from whywait.engine.commands.outputs import check_output
    from whywait.engine.commands.replay_cmd import _fmt, kafka_batches, parse_duration, parse_time, progress_bar
    from whywait.engine.errors import ConfigError
    from whywait.engine.importers.bundle import BundleWriter
    from whywait.engine.localkafka.broker import resolve_bootstrap
    from whywait.engine.replay import EventTimeMerge, Window
    from whywait.engine.rules.loader import load_rules

    now = time.time()
    since = parse_time(args.since, now, "--since")
    until = parse_time(args.until, now, "--until") if args.until else now
    if until <= since:
        raise ConfigError(f"--until ({_fmt(until)}) must be after --since ({_fmt(since)})")
    check_output(args.output, "--output")  # refused now, not after the whole window was read
    topo = args.topology or (Path(os.environ["WHYWAIT_TOPOLOGY"]) if os.environ.get("WHYWAIT_TOPOLOGY") else None)
    if topo is not None:
        load_topology(topo)  # a broken topology is refused now, not at replay time
    rules = args.rules or default_rule_paths()  # what the live engine loads, as replay does
    load_rules(rules)
    w = Window(since, until, parse_duration(args.lead, "--lead"), frozenset(args.job), frozenset(args.project))
    merge = EventTimeMerge([], w)
    merge.raw = True
    window = {"since": since, "until": until, "lead_s": w.lead_s, "jobs": sorted(w.jobs),
              "projects": sorted(w.projects)}
    with BundleWriter(args.output, window) as bw, \
            progress_bar(w, "exporting", lambda _: max(merge.released_to, w.read_from)) as tick:
        for topic, raw in kafka_batches(args.bootstrap or resolve_bootstrap(), w, merge,
                                          read_to_end=args.read_to_end):
            bw.add(topic, raw)
            if tick is not None:
                tick(None)
        bw.close(topo, rule_files(rules))
    total = sum(bw.counts.values())
    print(f"exported {total} messages from {_fmt(since)} to {_fmt(until)} UTC into {args.output} "
          f"({args.output.stat().st_size / 1e6:.1f} MB)")
    for why, n in sorted(merge.skipped.items()):
        print(f"  skipped {n}: {why}")
    # What replay says of the same window: a --job or --project that matched nothing (the bundle then holds
    # only node telemetry), and where reading stopped.
    for note in merge.notes + merge.filter_hints() + [n for n in (merge.late_note(),) if n]:
        print(f"  note: {note}")
    if merge.stopped_early:
        first, more = merge.stopped_early[0], len(merge.stopped_early) - 1
        print(f"whywait export: stopped reading {first['partition']} at offset {first['offset']} of "
              f"{first['end']}" + (f" (and {more} more partition(s))" if more else "")
              + ": records after it are stamped after the window; --read-to-end reads them all", file=sys.stderr)
    if topo is None:
        print("whywait export: no topology in the bundle (give --topology FILE or set WHYWAIT_TOPOLOGY): "
              f"`whywait replay --input {args.output}` will know only the nodes its placements name, and no "
              "NIC, switch or pool", file=sys.stderr)
    return 0
