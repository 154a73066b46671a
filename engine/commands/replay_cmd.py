"""``whywait replay``: re-run the rules over recorded Kafka topics, for a postmortem.

Reads the input topics between two event times (``--since``/``--until``: Unix
seconds, ISO 8601, or relative like ``-2h``), evaluates them with the current
rules (or ``--rules`` from the incident's time), prints the diagnoses as a
timeline, and optionally writes them as JSON lines and a PNG timeline plot.
Nothing is published and nobody is notified.

The messages of the window are held in memory and sorted by event time (about
1 KiB each: an hour of a 16-node job is ~300,000 messages, ~300 MiB); for longer
windows replay in pieces.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import re
import sys
import time
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from engine.errors import ConfigError

_REL = re.compile(r"^-(\d+(?:\.\d+)?)([smhd])$")


def parse_time(v: str, now: float | None = None) -> float:
    """Unix seconds from ``1764442800``, ``2025-11-29T19:00:00Z`` or ``-2h`` (relative to now)."""
    now = time.time() if now is None else now
    m = _REL.match(v.strip())
    if m:
        return now - float(m.group(1)) * {"s": 1, "m": 60, "h": 3600, "d": 86400}[m.group(2)]
    try:
        return float(v)
    except ValueError:
        pass
    try:
        dt = datetime.fromisoformat(v.replace("Z", "+00:00"))
    except ValueError:
        raise ConfigError(f"cannot read time {v!r}: use Unix seconds, ISO 8601 or -2h") from None
    return (dt if dt.tzinfo else dt.replace(tzinfo=timezone.utc)).timestamp()


def register(p: argparse.ArgumentParser) -> None:
    p.add_argument("--since", required=True, help="start of the window (Unix s, ISO 8601, or -2h)")
    p.add_argument("--until", help="end of the window (default: now)")
    p.add_argument("--topology", type=Path, help="topology YAML (default: WHYWAIT_TOPOLOGY)")
    p.add_argument("--rules", action="append", type=Path, help="rule files or folders (default: ./rules)")
    p.add_argument("--bootstrap", help="Kafka bootstrap (default: WHYWAIT_KAFKA_BOOTSTRAP or the local broker)")
    p.add_argument("--lead", default="15m", help="read this much before --since to warm baselines (default 15m)")
    p.add_argument("--json", type=Path, help="write the diagnoses as JSON lines")
    p.add_argument("--plot", type=Path, help="write a PNG timeline")


async def fetch(bootstrap: str, since: float, until: float, progress: Any = None) -> list[dict[str, Any]]:
    """Read every valid input message with ``since <= time <= until``, sorted by event time."""
    from aiokafka import AIOKafkaConsumer, TopicPartition

    from agents.events import INPUT_TOPICS, TOPIC_PLACEMENT, ContractError, decode

    c = AIOKafkaConsumer(bootstrap_servers=bootstrap, enable_auto_commit=False, group_id=None)
    await c.start()
    try:
        tps = [TopicPartition(t, p) for t in INPUT_TOPICS for p in (c.partitions_for_topic(t) or {0})]
        c.assign(tps)
        ends = await c.end_offsets(tps)
        # Producer timestamps trail event time by little on live clusters; seek a margin earlier.
        starts = await c.offsets_for_times({tp: int((since - 600) * 1000) for tp in tps})
        for tp in tps:
            off = starts.get(tp)
            if tp.topic == TOPIC_PLACEMENT or off is None:
                await c.seek_to_beginning(tp)  # placements are compacted and may be older than the window
            else:
                c.seek(tp, off.offset)
        out: list[dict[str, Any]] = []
        placements: dict[str, dict[str, Any]] = {}
        pending = {tp for tp in tps if ends[tp] > 0}
        while pending:
            batch = await c.getmany(*pending, timeout_ms=1000, max_records=5000)
            if not batch:
                break
            for tp, msgs in batch.items():
                for m in msgs:
                    if m.offset >= ends[tp] - 1:
                        pending.discard(tp)
                    if m.value is None:
                        continue
                    try:
                        d = decode(m.value, tp.topic)
                    except ContractError:
                        continue
                    if d["kind"] == "placement":
                        if d["time"] <= until:
                            placements[d["job"]] = d  # the latest placement of each job before the end
                    elif since <= d["time"] <= until:
                        out.append(d)
                if progress is not None:
                    progress.update(len(msgs))
            for tp in list(pending):
                if await c.position(tp) >= ends[tp]:
                    pending.discard(tp)
        for p in placements.values():
            p = dict(p)
            p["time"] = min(p["time"], since)
            out.append(p)
        out.sort(key=lambda d: (d["time"], d["kind"] != "placement"))
        return out
    finally:
        await c.stop()


def run(args: argparse.Namespace) -> int:
    import os

    from tqdm import tqdm

    from engine.commands.engine_cmd import default_rules_dir, load_topology
    from engine.localkafka.broker import resolve_bootstrap
    from engine.replay import incidents, plot_timeline, replay
    from engine.rules.loader import load_rules

    now = time.time()
    since = parse_time(args.since, now)
    until = parse_time(args.until, now) if args.until else now
    lead = -parse_time("-" + args.lead.lstrip("-"), 0.0)  # "15m" -> 900 s
    if until <= since:
        raise ConfigError(f"--until ({until:.0f}) must be after --since ({since:.0f})")
    rules = load_rules(args.rules or [default_rules_dir()])
    topology = load_topology(args.topology or (Path(os.environ["WHYWAIT_TOPOLOGY"])
                                               if os.environ.get("WHYWAIT_TOPOLOGY") else None))
    bootstrap = args.bootstrap or resolve_bootstrap()
    with tqdm(desc="reading", unit="msg", file=sys.stderr, disable=not sys.stderr.isatty()) as bar:
        msgs = asyncio.run(fetch(bootstrap, since - lead, until, bar))
    with tqdm(total=len(msgs), desc="evaluating", unit="msg", file=sys.stderr,
              disable=not sys.stderr.isatty()) as bar:
        res = replay(msgs, rules, topology, progress=bar)
    spans = incidents(res.diagnoses, res.end)
    print(f"replayed {res.messages} messages from {_fmt(since)} to {_fmt(until)}: {len(spans)} incident(s)")
    for d, a, b in spans:
        if b < since:
            continue
        print(f"  {_fmt(a)} → {_fmt(b)}  {d.severity:8} {d.rule_id}  {d.culprit or d.job}: {d.title}")
        print(f"      {d.cause}")
    if args.json:
        with args.json.open("w") as fh:
            for d in res.diagnoses:
                fh.write(json.dumps(d.to_dict(), default=str) + "\n")
    if args.plot:
        plot_timeline(res, args.plot)
        print(f"timeline: {args.plot}")
    return 0


def _fmt(t: float) -> str:
    return datetime.fromtimestamp(t, timezone.utc).strftime("%Y-%m-%d %H:%M:%S")
