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
from typing import Any


def register(p: argparse.ArgumentParser) -> None:
    from whywait.engine.commands.replay_cmd import allow_relative_times
    from whywait.engine.commands.rules_cmd import path_arg  # an empty path ("$UNSET") is refused, not read as "."

    allow_relative_times(p)
    p.add_argument("--since", required=True, help="start of the window: Unix s, ISO 8601, or relative (-10m)")
    p.add_argument("--until", help="end of the window (default: now)")
    p.add_argument("--lead", default="15m", help="also keep this much before --since, to warm baselines (15m)")
    p.add_argument("--job", action="append", default=[], help="only this job (repeatable)")
    p.add_argument("--project", action="append", default=[], help="only this project's jobs (repeatable)")
    p.add_argument("--topology", type=path_arg, help="topology YAML to include (default: WHYWAIT_TOPOLOGY)")
    p.add_argument("--rules", action="append", type=path_arg,
                   help="rule files or folders to include (default: the engine's, ./rules or the shipped rules, "
                        "plus $WHYWAIT_SITE_RULES)")
    p.add_argument("--bootstrap", help="Kafka bootstrap (default: WHYWAIT_KAFKA_BOOTSTRAP or the local broker)")
    p.add_argument("-o", "--output", type=path_arg, required=True, help="the bundle to write (incident.whywait)")
    p.add_argument("--read-to-end", action="store_true",
                   help="read every partition to its end however much was written after the window (history "
                        "backfilled with `whywait import`); by default only when that tail is short")


def bundle_rules(paths: list[Path]) -> tuple[list[tuple[str, Path]], list[str]]:
    """The rule files under ``paths`` as the bundle holds them, and the rule paths its replay loads.

    Returns ``(name under rules/, file)`` for every rule YAML file (rules, macros, tests; nothing else: a
    README, an editor's backup or a stray archive in the folder is not a rule, and one over the 4 MiB cap
    would make the bundle unreplayable), and the paths under the bundle's root, in order.  One path (the
    usual: ./rules, or the shipped rules) is laid out as it is: ``rules/macros.yaml``, ``rules/gpu/...``,
    loaded as ``rules``; the bundle stored it as ``rules/rules/...``.  Several keep a folder (or file) each,
    by their own name, so each loads as the path it was (a folder's ``macros.yaml`` at its top, a site's
    ``override:`` after the rules it changes): ``./rules`` and a site's ``/etc/whywait/rules`` are
    ``rules/rules`` and ``rules/rules-2``, the second no longer overwriting the first.
    """
    from whywait.engine.errors import ConfigError
    from whywait.engine.rules.loader import yaml_files

    seen: set[Path] = set()

    def files_of(p: Path, top: str) -> list[tuple[str, Path]]:
        """The files of ``p`` not bundled yet: a path given twice, or inside another (``--rules rules --rules
        rules/gpu``), is loaded once by the engine, and twice over from a bundle holding it twice (every
        rule in it a duplicate id)."""
        if p.is_dir():
            found = [(f"{top}/{f.relative_to(p)}".lstrip("/"), f) for f in yaml_files(p) if f.is_file()]
        elif p.is_file():
            found = [(top or p.name, p)]
        else:
            raise ConfigError(f"--rules {p}: no such file or folder")
        new = [(n, f) for n, f in found if f.resolve() not in seen]
        seen.update(f.resolve() for _, f in new)
        return new

    if len(paths) == 1:
        p = paths[0]
        files = files_of(p, "")
        return files, (["rules" if p.is_dir() else f"rules/{p.name}"] if files else [])
    out: list[tuple[str, Path]] = []
    tops: list[str] = []
    for p in paths:
        name = Path(Path(os.path.abspath(p)).name or "rules")  # "." and ".." have no name of their own
        top, k = name.name, 2
        while top in tops:
            top, k = (f"{name.stem}-{k}{name.suffix}" if p.is_file() else f"{name}-{k}"), k + 1
        files = files_of(p, top)
        if files:
            tops.append(top)
            out += files
    return out, [f"rules/{t}" for t in tops]


def rule_files(paths: list[Path]) -> list[tuple[str, Path]]:
    """``(name under rules/ in the bundle, file)`` for every rule YAML file under ``paths`` (:func:`bundle_rules`)."""
    return bundle_rules(paths)[0]


def run(args: argparse.Namespace) -> int:
    from whywait.engine.commands.engine_cmd import default_rule_paths, load_topology
    from whywait.engine.commands.outputs import check_output
    from whywait.engine.commands.replay_cmd import (
        _fmt,
        kafka_batches,
        parse_duration,
        parse_time,
        progress_bar,
        read_in_order,
    )
    from whywait.engine.errors import ConfigError
    from whywait.engine.importers.bundle import BundleWriter
    from whywait.engine.localkafka.broker import resolve_bootstrap
    from whywait.engine.replay import EventTimeMerge, Window
    from whywait.engine.rules.loader import YAML_SUFFIXES, load_rules

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
    for r in rules:  # a README given as a rule was "README.md:1: must be a mapping with a rule (got str)"
        if r.is_file() and r.suffix not in YAML_SUFFIXES:
            raise ConfigError(f"--rules {r}: is not a rule file (rule files are YAML, named "
                              f"*{' or *'.join(YAML_SUFFIXES)})")
    load_rules(rules)
    w = Window(since, until, parse_duration(args.lead, "--lead"), frozenset(args.job), frozenset(args.project))
    window = {"since": since, "until": until, "lead_s": w.lead_s, "jobs": sorted(w.jobs),
              "projects": sorted(w.projects)}
    bootstrap = resolve_bootstrap(flag=args.bootstrap)
    reading: list[EventTimeMerge] = []  # the pass's merge, whose watermark the progress bar shows

    def messages(m: EventTimeMerge, cut: Any) -> Any:
        reading[:] = [m]
        return kafka_batches(bootstrap, w, m, read_to_end=args.read_to_end, splits=cut)

    def write(items: Any) -> BundleWriter:
        # Each pass writes the bundle anew: a second one (history found written after newer data, see
        # read_in_order) puts the records in event-time order, which a bundle's replay relies on.
        with BundleWriter(args.output, window) as bw, \
                progress_bar(w, "exporting", lambda _: max(reading[0].released_to, w.read_from)) as tick:
            for topic, raw in items:
                bw.add(topic, raw)
                if tick is not None:
                    tick(None)
            bw.close(topo, *bundle_rules(rules))
        return bw

    bw, merge, _ = read_in_order(messages, w, write, raw=True, who="whywait export")
    total = sum(bw.counts.values())
    print(f"exported {total} messages from {_fmt(since)} to {_fmt(until)} UTC into {args.output} "
          f"({args.output.stat().st_size / 1e6:.1f} MB)")
    if total == 0:  # a bundle of topology and rules alone replays to "0 incident(s)": not a postmortem
        print(f"whywait export: no message was read between {_fmt(since)} and {_fmt(until)} UTC"
              f"{' for ' + ', '.join(args.job + args.project) if args.job or args.project else ''}: "
              f"{args.output} holds no events (is the window right, in UTC, and within the topics' retention?)",
              file=sys.stderr)
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
