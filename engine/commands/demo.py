"""``whywait demo``: the whole product on one machine, in about a minute.

Called by ``make demo``.  It starts (or reuses) a Kafka broker, writes a 16-node
cluster's topology, starts ``whywait engine`` and ``whywait simulate`` as real
processes talking through Kafka, injects one fault (a NIC dropping packets on
one node), and waits for the diagnosis.  The engine prints the Slack message it
would post (or posts it, when ``SLACK_BOT_TOKEN`` is set).  At the end the demo
prints the detection latency (fault start → diagnosis, in event time) and the
wall-clock latency (event produced → notification), read from the engine's
``latency:`` log lines, and last the ``whywait replay`` command that replays it.

The simulated event time ends about when the demo does (it starts ``--duration`` before
now), so every event is stamped in the past: ``whywait replay --since -10m`` and
``whywait digest`` right after the demo see all of it, as they would a real cluster's.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import re
import shlex
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

_LATENCY = re.compile(r"latency: rule=(\S+) status=(\S+) job=(\S+) produced_to_notified_ms=(\d+)")
# The notifier's line when a silence mutes an incident (engine/notify/pipeline/core.py, once per incident).
_SILENCED = re.compile(r"incident \S+ \(rule=(?P<rule>\S+) job=(?P<job>\S+)\): silenced by (?P<silence>\S+)")


def register(p: argparse.ArgumentParser) -> None:
    p.add_argument("--nodes", type=int, default=16, help="cluster size (default 16)")
    p.add_argument("--culprit", default="node-07", help="node whose NIC drops packets (default node-07)")
    p.add_argument("--fault-start", type=float, default=120.0, help="seconds of event time before the fault")
    p.add_argument("--fault-end", type=float, default=300.0, help="seconds of event time when it clears")
    p.add_argument("--duration", type=float, default=360.0, help="simulated seconds in all")
    p.add_argument("--speed", type=float, default=12.0, help="event time runs this many times faster than wall")
    p.add_argument("--timeout", type=float, default=120.0, help="give up waiting for the diagnosis after this")
    p.add_argument("--workdir", type=Path, help="keep topology, ground truth and logs here")


def _whywait(*args: str) -> list[str]:
    return [sys.executable, "-m", "whywait", *args]


async def _read_diagnoses(bootstrap: str, not_before: float, job: str, deadline: float,
                          want_resolved: bool) -> list[dict[str, Any]]:
    """Consume the diagnoses topic until a firing (and, if asked, its resolved) diagnosis for ``job``."""
    from aiokafka import AIOKafkaConsumer
    from whywait.agents.events import TOPIC_DIAGNOSES

    c = AIOKafkaConsumer(TOPIC_DIAGNOSES, bootstrap_servers=bootstrap, auto_offset_reset="earliest",
                         enable_auto_commit=False, group_id=None)
    await c.start()
    found: list[dict[str, Any]] = []
    try:
        while time.time() < deadline:
            batch = await c.getmany(timeout_ms=500)
            for msgs in batch.values():
                for m in msgs:
                    d = json.loads(m.value)
                    if d.get("job") == job and d.get("detected_at", 0) >= not_before:
                        found.append(d)
            statuses = {d["status"] for d in found}
            if "firing" in statuses and (not want_resolved or "resolved" in statuses):
                break
        return found
    finally:
        await c.stop()


async def _newest_event_time(bootstrap: str) -> float:
    """The newest event time on any input topic: a demo must start after it.

    A demo run a few minutes ago wrote telemetry up to about then (an older version wrote it
    minutes into the future); starting this run's event time after it keeps the two runs'
    samples from mixing in one window.
    """
    from aiokafka import AIOKafkaConsumer, TopicPartition
    from whywait.agents.events import INPUT_TOPICS

    c = AIOKafkaConsumer(bootstrap_servers=bootstrap, enable_auto_commit=False, group_id=None)
    await c.start()
    newest = 0.0
    try:
        tps = [TopicPartition(t, p) for t in INPUT_TOPICS for p in (c.partitions_for_topic(t) or {0})]
        c.assign(tps)
        ends = await c.end_offsets(tps)
        for tp in tps:
            if ends[tp] == 0:
                continue
            c.seek(tp, max(0, ends[tp] - 50))
            batch = await c.getmany(tp, timeout_ms=2000)
            for m in batch.get(tp, []):
                try:
                    newest = max(newest, float(json.loads(m.value)["time"]))
                except (ValueError, KeyError, TypeError):
                    continue
        return newest
    finally:
        await c.stop()


def event_start(now: float, duration: float, newest: float) -> float:
    """The simulation's first event time: ``duration`` before ``now``, so it ends about when the demo does.

    Simulated faster than the wall clock from then, its event time trails the clock at any speed
    and catches up only at its end: every event is stamped in the past, as a real cluster's are,
    and ``whywait replay --since -10m`` right after the demo reads all of it.  Unless an earlier
    demo's data (``newest``) is that recent: this run then starts a minute after it, so the two
    runs' samples never mix in one window.
    """
    return float(int(max(now - duration, newest + 60)))


def _timeline(bootstrap: str, topo_file: Path, since: float, until: float, out: Path) -> Path | None:
    """Replay the demo's window from Kafka and draw its timeline; None (and a line) if that fails."""
    try:
        from whywait.engine.commands.engine_cmd import default_rules_dir
        from whywait.engine.commands.replay_cmd import plot_window

        return plot_window(bootstrap, topo_file, [default_rules_dir()], since, until, out)
    except Exception as exc:  # the plot is a bonus: the demo's figures stand without it
        print(f"(no timeline plot: {exc})", file=sys.stderr)
        return None


def run(args: argparse.Namespace) -> int:
    from whywait.engine.errors import BrokerUnavailable
    from whywait.engine.localkafka.broker import ensure_broker, probe
    from whywait.engine.stream.topics import ensure_topics
    from whywait.simulate.cluster import make_cluster

    print("whywait demo: a 16-node training job, one NIC dropping packets, and the alert it raises\n")
    bootstrap = ensure_broker()
    if not probe(bootstrap, timeout=5.0):  # $WHYWAIT_KAFKA_BOOTSTRAP set to nothing there: the engine's one line
        raise BrokerUnavailable(bootstrap, "no answer to ApiVersions")
    ensure_topics(bootstrap)
    work = args.workdir or Path(tempfile.mkdtemp(prefix="whywait-demo-"))
    work.mkdir(parents=True, exist_ok=True)
    topo_file, truth_file = work / "topology.yaml", work / "truth.json"
    make_cluster(nodes=args.nodes).to_yaml(topo_file)
    start = event_start(time.time(), args.duration, asyncio.run(_newest_event_time(bootstrap)))
    env = {**os.environ, "WHYWAIT_KAFKA_BOOTSTRAP": bootstrap, "PYTHONUNBUFFERED": "1"}
    engine = subprocess.Popen(
        _whywait("engine", "--topology", str(topo_file), "--group", f"whywait-demo-{int(start)}",
                 "--not-before", str(start), "--no-restore", "--latest",
                 "--max-clock-skew", "off"),  # the simulation runs event time faster than the wall clock
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env)
    latencies: list[tuple[str, str, int]] = []
    silenced: list[tuple[str, str]] = []  # (job, silence id) of incidents a silence muted
    ready = threading.Event()

    def pump() -> None:  # echo the engine's output (the alert), keep its latency lines
        assert engine.stdout is not None
        for line in engine.stdout:
            if "engine: consuming" in line:
                ready.set()
            m = _LATENCY.search(line)
            if m:
                latencies.append((m.group(1), m.group(2), int(m.group(4))))
                continue
            if (s := _SILENCED.search(line)) is not None:
                silenced.append((s.group("job"), s.group("silence")))
            if " INFO " in line and "whywait" not in line:
                continue
            print("  engine | " + line.rstrip() if "INFO" in line or "WARN" in line or "ERROR" in line
                  else line.rstrip())

    threading.Thread(target=pump, daemon=True).start()
    try:
        # Start the telemetry once the engine consumes (from the end of the topics: earlier
        # demos' data stays unread), so the latency figures are the engine's and not its
        # start-up (faust takes a few seconds to join its group).
        if not ready.wait(60):
            print("whywait demo: the engine did not start consuming within 60 s", file=sys.stderr)
        fault = f"nic-packet-loss:{args.culprit}@{args.fault_start:g}-{args.fault_end:g}"
        print(f"simulating {args.duration:g} s of event time at {args.speed:g}x: fault {fault}")
        sim = subprocess.run(
            _whywait("simulate", "--nodes", str(args.nodes), "--duration", str(args.duration),
                     "--fault", fault, "--speed", str(args.speed), "--start-time", str(start),
                     "--truth-out", str(truth_file), "--bootstrap", bootstrap),
            env=env, text=True)
        if sim.returncode != 0:
            print("whywait demo: the simulator failed", file=sys.stderr)
            return sim.returncode
        truth = json.loads(truth_file.read_text())
        t = truth[0] if isinstance(truth, list) else truth["faults"][0]
        job = t["job"]
        found = asyncio.run(_read_diagnoses(bootstrap, start, job, time.time() + args.timeout,
                                            want_resolved=args.fault_end < args.duration))
        time.sleep(1.0)  # let the notifier's last line reach the console
    finally:
        engine.send_signal(signal.SIGTERM)
        try:
            engine.wait(20)
        except subprocess.TimeoutExpired:
            engine.kill()
    firing = [d for d in found if d["status"] == "firing"]
    if not firing:
        print(f"whywait demo: no diagnosis within {args.timeout:g} s (see {work})", file=sys.stderr)
        return 1
    first = firing[0]
    detect = first["detected_at"] - t["start"]
    early = [d for d in firing if d["detected_at"] < t["start"]]
    print("\n── figures " + "─" * 60)
    print(f"ground truth     : {t['fault']} on {t['culprit']} from +{t['start'] - start:.0f}s to "
          f"+{t['end'] - start:.0f}s (job {job})")
    print(f"diagnosis        : {first['rule_id']} → culprit {first['culprit']}, ranks {first['ranks'][:1]}…"
          f"{first['ranks'][-1:]} ({'correct' if first['culprit'] == t['culprit'] else 'WRONG'})")
    print(f"detection latency: {detect:.1f} s of event time (fault start → diagnosis)")
    wall = [ms for _, status, ms in latencies if status == "firing"]
    figure = notification_figure(wall, next((sid for j, sid in silenced if j == job), None))
    if figure:
        print(figure)
    print(f"false alarms     : {len(early)} during the fault-free lead-in")
    png = _timeline(bootstrap, topo_file, start, start + args.duration, work / "timeline.png")
    if png is not None:
        print(f"timeline         : {png} (what `whywait replay --plot` draws; the command is below)")
    print(f"files            : {work}")
    print("replay it        : " + replay_command(start, start + args.duration, topo_file, work / "replay"))
    return 0 if first["culprit"] == t["culprit"] and not early else 1


def notification_figure(wall_ms: list[int], silenced_by: str | None) -> str | None:
    """The wall-clock figure: event produced → notification posted, or the silence that kept it from being posted
    (the engine still notified its pipeline; nothing was posted).  None when there is neither."""
    if silenced_by is not None:
        return f"wall-clock       : silenced by {silenced_by} (nothing posted)"
    if wall_ms:
        return f"wall-clock       : {wall_ms[0]} ms (event produced → notification posted)"
    return None


def replay_command(since: float, until: float, topo_file: Path, report: Path) -> str:
    """The ``whywait replay`` command line that replays the demo's window into a report (what the demo prints last).

    Absolute UTC times, so it works however long after the demo it is run; no lead-in, since the
    engine also started from the demo's first event (``--not-before``); the ``whywait`` next
    to this Python when there is one (``.venv/bin/whywait`` after ``make demo``), else from PATH.
    """
    from datetime import datetime, timezone

    def iso(t: float) -> str:
        return datetime.fromtimestamp(t, timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")

    exe = Path(sys.executable).parent / "whywait"
    if not exe.exists() or str(exe.parent) in os.environ.get("PATH", "").split(os.pathsep):
        cmd = "whywait"
    else:
        rel = os.path.relpath(exe)
        cmd = str(exe) if rel.startswith("..") else rel
    return " ".join([shlex.quote(cmd), "replay", "--since", iso(since), "--until", iso(until), "--lead", "0s",
                     "--topology", shlex.quote(str(topo_file)), "--report", shlex.quote(str(report))])
