"""The bench's figures as rich tables (on a terminal) and as JSON (``--json FILE``)."""

from __future__ import annotations

import json
import math
import os
import sys
from pathlib import Path
from typing import Any


def _f(x: float | None, fmt: str = "{:.2f}") -> str:
    return "-" if x is None or (isinstance(x, float) and math.isnan(x)) else fmt.format(x)


def _sp(s: dict[str, Any], fmt: str = "{:.2f}") -> str:
    """``median ±spread%`` of a :class:`~whywait.engine.bench.stats.Spread` dict."""
    rel = s.get("spread")
    pm = "" if rel is None or math.isnan(rel) else f" ±{rel * 100:.0f}%"
    return _f(s.get("median"), fmt) + pm


def render(result: dict[str, Any], console: Any = None) -> None:
    """Print the per-size table, then the worker and sustained figures when measured."""
    from rich.console import Console
    from rich.table import Table

    # Piped into a file or a CI log, rich would fold the eleven columns into 80 characters ("eng…"):
    # off a terminal, print them at full width (COLUMNS still wins when set).
    con = console or Console(width=None if sys.stdout.isatty() or os.environ.get("COLUMNS") else 220)
    cfg = result["config"]
    t = Table(title=f"whywait bench: {cfg['reps']} alternating runs per size, {cfg['seconds']:g} s of event time "
                    f"(median ±spread); ratios are messages per CPU-second relative to raw consume+decode")
    for col in ("GPUs", "messages", "raw msgs/CPU-s", "engine / raw", "replay / raw", "raw wall s",
                "engine wall s", "replay wall s", "peak RSS MiB raw/engine/replay", "latency p50/p99 s", "load"):
        t.add_column(col, justify="right")
    for s in result["sizes"]:
        lat = s["latency_s"]
        t.add_row(f"{s['gpus']:,}", f"{s['messages']:,}", _sp(s["raw"]["msgs_per_cpu_s"], "{:,.0f}"),
                  _sp(s["ratio_engine_raw"]), _sp(s["ratio_replay_raw"]), _sp(s["raw"]["wall_s"], "{:.1f}"),
                  _sp(s["engine"]["wall_s"], "{:.1f}"), _sp(s["replay"]["wall_s"], "{:.1f}"),
                  "/".join(f"{s[k]['peak_rss_bytes'] / 2**20:,.0f}" for k in ("raw", "engine", "replay")),
                  f"{_f(lat['p50'], '{:.1f}')}/{_f(lat['p99'], '{:.1f}')} (n={lat['n']})",
                  _sp(s["engine"]["load"], "{:.1f}"))
    con.print(t)
    if result.get("workers"):
        jobs = cfg.get("jobs", 1)
        plural = "s" if jobs != 1 else ""
        w = Table(title=f"workers in one consumer group (same data, the largest size, {jobs} job{plural})")
        for col in ("workers", "partitions with data", "msgs/s", "× one worker", "CPU-s", "cores busy",
                    "ceiling here", "peak RSS MiB"):
            w.add_column(col, justify="right")
        for r in result["workers"]:
            if "error" in r:
                w.add_row(str(r["workers"]), str(r["partitions"]), "failed: " + r["error"][:90], "-", "-", "-", "-",
                          "-")
                continue
            w.add_row(str(r["workers"]), str(r["partitions"]), f"{r['msgs_per_s']:,.0f}", _f(r["ratio_to_one"]),
                      _f(r["cpu_s"], "{:.1f}"), _f(r.get("cores_busy", math.nan)),
                      _f(r.get("ceiling_here", math.nan), "{:.2f}×"), f"{r['peak_rss_bytes'] / 2**20:,.0f}")
        con.print(w)
        con.print("cores busy: the workers' CPU, and the bench's own broker's, per wall second; ceiling here: "
                  "the most any number of workers could gain over that row on this machine (CPUs / cores busy)")
    s = result.get("sustained")
    if s:
        con.print(f"sustained: {s['gpus']:,} GPUs ({s['nodes']:,} nodes), {s['seconds']:g} s of event time fed at "
                  f"{s['speed']:g}x real time ({'the feed kept pace' if s['kept_pace'] else 'the feed fell behind'}"
                  f"; {'the engine kept up' if s.get('engine_kept_up', True) else 'the engine fell behind'}): "
                  f"{_f(s['cores_used'])} cores used, {_f(s.get('cores_needed', math.nan))} needed at real time "
                  f"(CPU-s per event second), "
                  f"steady RSS {_f(s['steady_rss_bytes'] / 2**20, '{:,.0f}')} MiB, "
                  f"peak {s['peak_rss_bytes'] / 2**20:,.0f} MiB, "
                  f"caught up {_f(s['caught_up_after_feed_s'], '{:.1f}')} s "
                  "after the feed ended")
    m = result["machine"]
    con.print(f"machine: {m['cpus']} CPUs, load {m['load_at_start']:.1f} at start, {m['load_at_end']:.1f} at end")


def write_json(result: dict[str, Any], path: Path) -> None:
    """Write the figures as JSON (NaN as null, so any JSON reader takes it)."""

    def clean(x: Any) -> Any:
        if isinstance(x, float) and math.isnan(x):
            return None
        if isinstance(x, dict):
            return {k: clean(v) for k, v in x.items()}
        if isinstance(x, (list, tuple)):
            return [clean(v) for v in x]
        return x

    path.write_text(json.dumps(clean(result), indent=2, sort_keys=True, default=str) + "\n")
