"""The runs of ``whywait bench``: raw consume, the engine and replay on the same data, alternating.

Called by :mod:`whywait.engine.commands.bench_cmd`.  Per cluster size the data is written once
(:mod:`.feed`), paced, while one engine consumes it live: that run gives the event→diagnosis
latency.  Then, ``reps`` times and in a rotating order, the three readers go over exactly that
data (the same offsets):

* raw: :mod:`.raw` in its own process;
* engine: real ``whywait engine`` process(es) whose consumer group starts at the size's first
  offsets; timed from their partition assignment until ONE admin client sees the group's
  committed offsets reach the end of every partition with data (with input topics of several
  partitions the engine runs the partitioned pipeline: then the end of the repartition topic too,
  where the evaluate stage commits what it has evaluated, for the input topics' commits are its router's);
* replay: ``whywait replay`` over the size's event-time range.

CPU-seconds come from the kernel for the engine (``/proc``, sampled at assignment and when caught
up) and from the processes' own reading loops for raw and replay (both print them; their
start-up, like the engine's, is outside the clock).  Every process's peak RSS is from the kernel.
"""

from __future__ import annotations

import asyncio
import json
import math
import os
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

from whywait.engine.bench import procs, stats
from whywait.engine.bench.feed import TP, MakeCluster, Written, write
from whywait.engine.errors import EngineError

ENGINE_MARK = "engine: consuming "
# Sizes are this far apart in event time, so that replay's seek (600 s before its window) never reads another's.
_GAP_S = 7200.0


@dataclass(frozen=True)
class BenchConfig:
    """What ``whywait bench`` was asked to measure."""

    nodes: tuple[int, ...] = (16, 128, 1280)
    seconds: float = 120.0
    reps: int = 3
    feed_speed: float = 4.0
    workers: tuple[int, ...] = (1,)
    partitions: int = 1
    sustained: bool = False
    sustained_nodes: int = 1280
    sustained_seconds: float = 900.0
    sustained_speed: float = 1.0
    rules: tuple[Path, ...] = ()
    timeout_s: float = 1800.0


@dataclass
class Run:
    """One timed run of one reader."""

    what: str
    messages: int
    cpu_s: float
    wall_s: float
    peak_rss: int
    load: float
    extra: dict[str, Any] = field(default_factory=dict)


class BenchError(EngineError):
    """A run that did not finish (a process exited early, or never caught up): one line, exit 1."""

    exit_code = 1


# ---- the engine: one function to launch it, so a partition-aware engine's flags change one place ----------


def launch_engine(bootstrap: str, topology: Path, group: str, not_before: float, work: Path, index: int = 0,
                  rules: tuple[Path, ...] = ()) -> tuple[subprocess.Popen[bytes], Path]:
    """Start one ``whywait engine`` worker in consumer group ``group``; return it and its log file.

    Every worker of a group gets its own static member id (two on one host must not share one).
    The input topics' partition count is the broker's (the bench creates them); the engine needs no
    flag for it.  Its event time is ahead of the wall clock, hence ``--max-clock-skew off``.
    """
    log = work / f"{group}-{index}.log"
    env = {**os.environ, "WHYWAIT_KAFKA_BOOTSTRAP": bootstrap, "PYTHONUNBUFFERED": "1",
           "WHYWAIT_NOTIFY_OUTBOX": str(work / f"outbox-{group}-{index}")}  # one outbox per notifier
    for k in ("SLACK_BOT_TOKEN", "WHYWAIT_METRICS_ADDR", "WHYWAIT_SITE_RULES"):
        env.pop(k, None)
    # JSON log lines: the periodic summary carries the engine's counters as a field (read by the tests).
    cmd = [sys.executable, "-m", "whywait", "--log-format", "json", "engine", "--topology", str(topology),
           "--group", group,
           "--not-before", str(not_before), "--no-restore", "--max-clock-skew", "off",
           "--instance-id", f"{group}-w{index}", *(a for r in rules for a in ("--rules", str(r)))]
    with log.open("wb") as fh:
        proc = subprocess.Popen(cmd, stdout=fh, stderr=subprocess.STDOUT, env=env)
    return proc, log


def _assigned(log: Path) -> int | None:
    """How many partitions the worker's latest assignment gave it (None: no assignment logged yet)."""
    try:
        text = log.read_text(errors="replace")
    except FileNotFoundError:
        return None
    n: int | None = None
    for line in text.splitlines():
        if ENGINE_MARK in line:
            word = line.split(ENGINE_MARK, 1)[1].split()[0]
            if word.isdigit():
                n = int(word)
    return n


def _stop(procs_: list[subprocess.Popen[bytes]]) -> None:
    for p in procs_:
        if p.poll() is None:
            p.send_signal(signal.SIGTERM)
    for p in procs_:
        try:
            p.wait(30)
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait()


class Offsets:
    """The ONE admin client (and one plain consumer for end offsets) the bench reads group progress with."""

    def __init__(self, bootstrap: str) -> None:
        self.bootstrap = bootstrap
        self.admin: Any = None
        self.consumer: Any = None

    async def __aenter__(self) -> Offsets:
        from aiokafka import AIOKafkaConsumer
        from aiokafka.admin import AIOKafkaAdminClient

        self.admin = AIOKafkaAdminClient(bootstrap_servers=self.bootstrap)
        await self.admin.start()
        self.consumer = AIOKafkaConsumer(bootstrap_servers=self.bootstrap, enable_auto_commit=False)
        await self.consumer.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.consumer.stop()
        await self.admin.close()

    async def committed(self, group: str) -> dict[TP, int]:
        """The group's committed offsets; empty while the broker cannot say yet (the caller polls again).

        A loaded broker answers "coordinator not available" (or another retriable error) for a while after a
        group forms; that is "not caught up yet", not a failed run.
        """
        from aiokafka.errors import KafkaError

        try:
            got = await self.admin.list_consumer_group_offsets(group)
        except KafkaError as exc:
            if not getattr(exc, "retriable", False):
                raise
            return {}
        return {(tp.topic, tp.partition): m.offset for tp, m in got.items() if m.offset >= 0}

    async def repartition_ends(self) -> dict[TP, int]:
        """The repartition topic's end offsets when the engine runs the partitioned pipeline, else empty.

        The engine runs it when the input topics or the repartition topic have more than one partition
        (``engine_partitions``); the bench creates them all with the same count.
        """
        from aiokafka import TopicPartition
        from whywait.agents.events import INPUT_TOPICS
        from whywait.engine.stream.topics import TOPIC_BY_JOB, topic_partitions_async

        counts = await topic_partitions_async(self.bootstrap, [*INPUT_TOPICS, TOPIC_BY_JOB])
        if max(counts.values(), default=1) <= 1 or TOPIC_BY_JOB not in counts:
            return {}
        tps = [TopicPartition(TOPIC_BY_JOB, p) for p in range(counts[TOPIC_BY_JOB])]
        return {(tp.topic, tp.partition): o for tp, o in (await self.consumer.end_offsets(tps)).items()}

    async def mark_start(self, group: str, offsets: dict[TP, int]) -> None:
        """Record where ``group`` starts, as ``whywait engine --latest`` does: a partitioned worker that gains a
        partition re-reads a window of event time before the committed offset, never before this start (else
        it would re-read an earlier run's copies of the same data into its store)."""
        from aiokafka import AIOKafkaProducer
        from whywait.engine.stream.tables import group_start_key
        from whywait.engine.stream.topics import TOPIC_ENGINE_STATE

        p = AIOKafkaProducer(bootstrap_servers=self.bootstrap, acks="all")
        await p.start()
        try:
            await p.send_and_wait(TOPIC_ENGINE_STATE, json.dumps({f"{t}/{n}": o for (t, n), o in offsets.items()},
                                                                 sort_keys=True).encode(), key=group_start_key(group))
        finally:
            await p.stop()

    async def commit(self, group: str, offsets: dict[TP, int]) -> None:
        """Start ``group`` at ``offsets`` (before any member joins), so it reads exactly one size's data."""
        from aiokafka import AIOKafkaConsumer, TopicPartition
        from aiokafka.structs import OffsetAndMetadata

        c = AIOKafkaConsumer(bootstrap_servers=self.bootstrap, group_id=group, enable_auto_commit=False)
        await c.start()
        try:
            tps = {TopicPartition(t, p): o for (t, p), o in offsets.items()}
            c.assign(list(tps))
            await c.commit({tp: OffsetAndMetadata(o, "") for tp, o in tps.items()})
        finally:
            await c.stop()


async def run_engine(off: Offsets, w: Written, group: str, work: Path, workers: int = 1,
                     rules: tuple[Path, ...] = (), timeout_s: float = 1800.0,
                     sample: Callable[[list[subprocess.Popen[bytes]]], None] | None = None,
                     feed: Any = None, broker_pid: int | None = None) -> Run:
    """Run ``workers`` engines over ``w``'s offsets; time them from assignment to caught up.

    With ``feed`` (a coroutine writing the data), the engines start first and consume it live.
    With ``broker_pid`` (the bench's own broker), the broker's CPU-seconds over the same stretch are
    kept in the run's ``extra`` (``broker_cpu_s``): what the machine spent serving the workers.
    """
    # The partitioned engine's evaluate stage reads the repartition topic: from its end now, not from the
    # beginning (a fresh group's reset), where earlier runs' copies of the same data lie.
    rep = await off.repartition_ends()
    start = {**(w.first if feed is None else await _current_ends(off)), **rep}
    await off.commit(group, start)
    if rep:
        await off.mark_start(group, start)
    started = [launch_engine(off.bootstrap, w.topology, group, w.start, work, i, rules) for i in range(workers)]
    ps = [p for p, _ in started]
    try:
        deadline = time.monotonic() + 300
        idle_since: float | None = None
        # Each worker's clock starts at its first assignment (the first may consume alone until the others join,
        # and that work counts); its CPU from there, so start-up (imports, topology) is not timed for any.
        first_seen: dict[int, tuple[float, float]] = {}
        b0: float | None = None
        while True:
            got = [_assigned(log) for _, log in started]
            for i, n in enumerate(got):
                if n is not None and i not in first_seen:
                    if not first_seen and broker_pid:
                        b0 = procs.cpu_seconds(broker_pid)
                    first_seen[i] = (time.perf_counter(), procs.cpu_seconds(ps[i].pid))
            if all(n is not None for n in got):
                if sum(n or 0 for n in got) > 0:
                    break
                # Every worker has joined and none took a partition: an engine that is not partition-aware.
                idle_since = idle_since or time.monotonic()
                if time.monotonic() - idle_since > 60:
                    raise BenchError(f"{workers} engine worker(s) in group {group} joined but took no partitions "
                                     f"in 60 s: see {started[0][1]}")
            for p, log in started:
                if p.poll() is not None:
                    raise BenchError(f"the engine exited ({p.returncode}) before consuming: see {log}")
            if time.monotonic() > deadline:
                raise BenchError(f"the engine never got its partitions in 300 s: see {started[0][1]}")
            await asyncio.sleep(0.1)
        load0 = procs.load_average()
        t0 = min(t for t, _ in first_seen.values())
        cpu0 = [first_seen[i][1] for i in range(len(ps))]
        # A live feed runs beside the polling, so samples cover it; "caught up" is judged once it is written.
        task = asyncio.ensure_future(feed) if feed is not None else None
        deadline = time.monotonic() + timeout_s
        try:
            while True:
                if task is None or task.done():
                    if task is not None:
                        task.result()  # a failed feed is this run's error
                    done = await off.committed(group)
                    if caught_up(done, w, await off.repartition_ends() if rep else {}):
                        break
                for p, log in started:
                    if p.poll() is not None:
                        raise BenchError(f"the engine exited ({p.returncode}) while consuming: see {log}")
                if time.monotonic() > deadline:
                    raise BenchError(f"the engine did not catch up within {timeout_s:.0f} s: see {started[0][1]}")
                if sample is not None:
                    sample(ps)
                await asyncio.sleep(0.25)
        finally:
            if task is not None and not task.done():
                task.cancel()
        wall = time.perf_counter() - t0
        cpu = sum(procs.cpu_seconds(p.pid) - c0 for p, c0 in zip(ps, cpu0, strict=True))
        peak = max(procs.rss_bytes(p.pid)[1] for p in ps)
        extra: dict[str, Any] = {"workers": workers}
        if broker_pid and b0 is not None:
            extra["broker_cpu_s"] = procs.cpu_seconds(broker_pid) - b0
        return Run("engine", w.messages, cpu, wall, peak, max(load0, procs.load_average()), extra)
    finally:
        _stop(ps)


def caught_up(committed: dict[TP, int], w: Written, repartition_ends: dict[TP, int]) -> bool:
    """Whether the group's ``committed`` offsets cover every input partition with ``w``'s data and, for the
    partitioned engine, the repartition topic up to ``repartition_ends`` (read after the inputs were routed).

    Why both: in the partitioned pipeline the input topics' offsets are committed by the router once it has
    forwarded a batch to the repartition topic; the evaluate stage, which concludes the diagnoses, commits its
    own offsets there and may be far behind (stopped at the routers' commit, one 1,024-GPU live run had
    evaluated 4,992 of 44,288 messages, 6 s of its 60 s, and timed no diagnosis).  The evaluate stage commits
    only what its reorder buffer has released and evaluated (``partitioning.HeldOffsets``; it used to commit
    what it had put there, and one 2-worker run had evaluated 5,665 of 44,288 messages when this held), so
    its commits at the topic's end mean every worker has evaluated everything routed to it.
    """
    if not all(committed.get(tp, -1) >= w.end[tp] for tp in w.partitions_with_data()):
        return False
    return all(committed.get(tp, -1) >= end for tp, end in repartition_ends.items())


async def _current_ends(off: Offsets) -> dict[TP, int]:
    from whywait.engine.bench.feed import end_offsets

    return await end_offsets(off.bootstrap)


# ---- raw and replay: processes that print their own loop's figures ---------------------------------------


def run_raw(bootstrap: str, w: Written, work: Path, timeout_s: float) -> Run:
    """The raw floor over exactly ``w``'s offsets."""
    ranges = work / "ranges.json"
    ranges.write_text(json.dumps([[t, p, w.first.get((t, p), 0), e] for (t, p), e in sorted(w.end.items())]))
    load0 = procs.load_average()
    with (work / "raw.out").open("wb") as fo, (work / "raw.err").open("wb") as fe:
        p = subprocess.Popen([sys.executable, "-m", "whywait.engine.bench.raw", bootstrap, str(ranges)],
                             stdout=fo, stderr=fe)
        rc, use = procs.wait_usage(p, timeout_s)
    out, err = (work / "raw.out").read_bytes(), (work / "raw.err").read_bytes()
    if rc != 0:
        raise BenchError(f"the raw consumer failed ({rc}): {err.decode(errors='replace').strip()[-500:]}")
    got = json.loads(out)
    if got["messages"] + got["contract_errors"] != w.messages:
        raise BenchError(f"the raw consumer read {got['messages']} messages, {w.messages} were written")
    return Run("raw", got["messages"], got["cpu_s"], got["wall_s"], use.peak_rss,
               max(load0, procs.load_average()), {"process_cpu_s": use.cpu_s})


def run_replay(bootstrap: str, w: Written, work: Path, rules: tuple[Path, ...], timeout_s: float) -> Run:
    """``whywait replay`` over ``w``'s event-time range (no warm-up lead: the same messages as the others)."""
    st = work / "replay-stats.json"
    st.unlink(missing_ok=True)
    env = {**os.environ}
    env.pop("SLACK_BOT_TOKEN", None)
    load0 = procs.load_average()
    with (work / "replay.out").open("wb") as fo, (work / "replay.err").open("wb") as fe:
        p = subprocess.Popen([sys.executable, "-m", "whywait", "replay", "--bootstrap", bootstrap, "--topology",
                              str(w.topology), "--since", repr(w.start), "--until", repr(w.until), "--lead", "0s",
                              "--stats-json", str(st), *(a for r in rules for a in ("--rules", str(r)))],
                             stdout=fo, stderr=fe, env=env)
        rc, use = procs.wait_usage(p, timeout_s)
    out, err = (work / "replay.out").read_bytes(), (work / "replay.err").read_bytes()
    if rc != 0 or not st.exists():
        raise BenchError(f"whywait replay failed ({rc}): {err.decode(errors='replace').strip()[-500:]}")
    got = json.loads(st.read_text())
    if got["messages"] != w.messages:
        # Kept, not fatal (the other figures took long to measure), and said: the ratio then covers fewer messages.
        # A replay stops reading a partition well past its window, so topics holding records stamped later than
        # the bench's ahead of its data (a simulation in the future, on a shared broker) end it early.
        got["incomplete"] = f"whywait replay read {got['messages']} of the {w.messages} messages written"
    return Run("replay", got["messages"], got["cpu_s"], got["wall_s"], use.peak_rss,
               max(load0, procs.load_average()),
               {"process_cpu_s": use.cpu_s, "incidents": got.get("incidents"), "incomplete": got.get("incomplete"),
                "first_line": out.decode(errors="replace").splitlines()[:1]})


# ---- latency -------------------------------------------------------------------------------------------


async def diagnoses_after(bootstrap: str, offsets: dict[int, int], w: Written) -> list[tuple[dict[str, Any], float]]:
    """Diagnoses published after ``offsets`` (partition -> offset) about ``w``'s window, with their publish times."""
    from aiokafka import AIOKafkaConsumer, TopicPartition
    from whywait.agents.events import TOPIC_DIAGNOSES
    from whywait.engine.commands.replay_cmd import topic_partitions

    parts = (await topic_partitions(bootstrap, [TOPIC_DIAGNOSES])).get(TOPIC_DIAGNOSES, [0])
    c = AIOKafkaConsumer(bootstrap_servers=bootstrap, enable_auto_commit=False)
    await c.start()
    out: list[tuple[dict[str, Any], float]] = []
    try:
        tps = [TopicPartition(TOPIC_DIAGNOSES, p) for p in parts]
        c.assign(tps)
        ends = await c.end_offsets(tps)
        for tp in tps:
            c.seek(tp, offsets.get(tp.partition, 0))
        open_ = {tp for tp in tps if ends[tp] > offsets.get(tp.partition, 0)}
        while open_:
            for tp, recs in (await c.getmany(*open_, timeout_ms=2000)).items():
                for r in recs:
                    if r.offset < ends[tp] and r.value:
                        d = json.loads(r.value)
                        if w.start <= float(d.get("detected_at") or 0) <= w.until + 60:
                            out.append((d, r.timestamp / 1000.0))
                if not recs or recs[-1].offset + 1 >= ends[tp]:
                    open_.discard(tp)
    finally:
        await c.stop()
    return out


async def diagnosis_offsets(bootstrap: str) -> dict[int, int]:
    from aiokafka import AIOKafkaConsumer, TopicPartition
    from whywait.agents.events import TOPIC_DIAGNOSES
    from whywait.engine.commands.replay_cmd import topic_partitions

    parts = (await topic_partitions(bootstrap, [TOPIC_DIAGNOSES])).get(TOPIC_DIAGNOSES, [0])
    c = AIOKafkaConsumer(bootstrap_servers=bootstrap, enable_auto_commit=False)
    await c.start()
    try:
        tps = [TopicPartition(TOPIC_DIAGNOSES, p) for p in parts]
        return {tp.partition: o for tp, o in (await c.end_offsets(tps)).items()}
    finally:
        await c.stop()


def latencies(diags: list[tuple[dict[str, Any], float]], w: Written) -> list[float]:
    """Seconds from the send of the first message at a diagnosis' event time to the diagnosis' publication.

    A diagnosis detected at event time T can only be concluded once a message stamped T or later
    has arrived; the feed kept the wall time it sent each event second, the broker the time the
    engine published the diagnosis.
    """
    out = []
    for d, published in diags:
        sent = w.sent_at(float(d["detected_at"]))
        if sent is not None:
            out.append(published - sent)
    return out


# ---- the bench ---------------------------------------------------------------------------------------------


def _summary(runs: list[Run]) -> dict[str, Any]:
    return {"cpu_s": stats.spread([r.cpu_s for r in runs]).to_dict(),
            "wall_s": stats.spread([r.wall_s for r in runs]).to_dict(),
            "msgs_per_cpu_s": stats.spread([r.messages / r.cpu_s if r.cpu_s > 0 else math.nan
                                            for r in runs]).to_dict(),
            "peak_rss_bytes": max((r.peak_rss for r in runs), default=0),
            "load": stats.spread([r.load for r in runs]).to_dict()}


# Each repetition runs the three readers in another order, so none always runs first (cold page cache) or last.
_ORDERS = (("raw", "engine", "replay"), ("engine", "replay", "raw"), ("replay", "raw", "engine"))


async def measure_size(cfg: BenchConfig, bootstrap: str, work: Path, nodes: int, start: float, run_id: str,
                       say: Callable[[str], None], make: MakeCluster) -> dict[str, Any]:
    """Write one cluster size (paced, with a live engine for latency), then time the readers ``cfg.reps`` times."""
    d = work / f"n{nodes}"
    d.mkdir(parents=True, exist_ok=True)
    msgs, w = make(nodes, start, cfg.seconds, d / "topology.yaml")
    say(f"{nodes * 8} GPUs: writing {cfg.seconds:g} s of event time at {cfg.feed_speed:g}x real time "
        "with a live engine (latency)")
    before = await diagnosis_offsets(bootstrap)
    async with Offsets(bootstrap) as off:
        live = await run_engine(off, w, f"bench-{run_id}-n{nodes}-live", d, 1, cfg.rules, cfg.timeout_s,
                                feed=write(bootstrap, msgs, w, cfg.feed_speed))
        lat = latencies(await diagnoses_after(bootstrap, before, w), w)
        say(f"{nodes * 8} GPUs: {w.messages:,} messages ({w.bytes / 1e6:,.0f} MB); "
            f"{len(lat)} diagnoses timed")
        runs: dict[str, list[Run]] = {"raw": [], "engine": [], "replay": []}
        for rep in range(cfg.reps):
            for what in _ORDERS[rep % len(_ORDERS)]:
                if what == "raw":
                    r = run_raw(bootstrap, w, d, cfg.timeout_s)
                elif what == "engine":
                    r = await run_engine(off, w, f"bench-{run_id}-n{nodes}-r{rep}", d, 1, cfg.rules, cfg.timeout_s)
                else:
                    r = run_replay(bootstrap, w, d, cfg.rules, cfg.timeout_s)
                runs[what].append(r)
                if r.extra.get("incomplete"):
                    say(f"{nodes * 8} GPUs, run {rep + 1}: {r.extra['incomplete']}")
                say(f"{nodes * 8} GPUs, run {rep + 1}/{cfg.reps}: {what:6} {r.cpu_s:7.2f} CPU-s "
                    f"{r.wall_s:7.2f} s wall {r.peak_rss / 2**20:7.0f} MiB (load {r.load:.1f})")
    raw_cpu = [r.cpu_s for r in runs["raw"]]
    return {
        "nodes": nodes, "gpus": w.gpus, "seconds": cfg.seconds, "messages": w.messages, "bytes": w.bytes,
        "fault": {"kind": "nic-packet-loss", "node": w.fault[0], "start": w.fault[1], "end": w.fault[2]},
        "raw": _summary(runs["raw"]), "engine": _summary(runs["engine"]), "replay": _summary(runs["replay"]),
        "ratio_engine_raw": stats.spread(stats.throughput_ratios([r.cpu_s for r in runs["engine"]],
                                                                 raw_cpu)).to_dict(),
        "ratio_replay_raw": stats.spread(stats.throughput_ratios([r.cpu_s for r in runs["replay"]],
                                                                 raw_cpu)).to_dict(),
        "latency_s": {"n": len(lat), "p50": stats.percentile(lat, 50), "p99": stats.percentile(lat, 99),
                      "feed_speed": cfg.feed_speed, "live_engine_wall_s": live.wall_s,
                      "live_engine_cpu_s": live.cpu_s},
        "runs": [r.__dict__ for what in ("raw", "engine", "replay") for r in runs[what]],
        "_written": w,
    }


async def measure_workers(cfg: BenchConfig, bootstrap: str, work: Path, w: Written, run_id: str,
                          say: Callable[[str], None], broker_pid: int | None = None) -> list[dict[str, Any]]:
    """Engine throughput with 1..N workers in one consumer group over the same data (the largest size).

    Each row also says how many cores were busy (the workers', plus the broker's when the bench runs
    its own, ``broker_pid``) and ``ceiling_here``: the most any number of workers could gain over
    this row on this machine, ``cpus / busy cores``, since every process's CPU grows with the
    throughput.  A 2-core machine where one worker and the broker already keep 1.3 cores busy cannot
    show more than 1.5x, whatever the engine does; that figure says so instead of leaving the reader
    to guess.
    """
    out: list[dict[str, Any]] = []
    base = math.nan
    cpus = os.cpu_count() or 1
    async with Offsets(bootstrap) as off:
        for n in cfg.workers:
            try:
                r = await run_engine(off, w, f"bench-{run_id}-w{n}", work / f"n{w.nodes}", n, cfg.rules,
                                     cfg.timeout_s, broker_pid=broker_pid)
            except BenchError as exc:  # a group that cannot split the work is a finding, not the end of the bench
                out.append({"workers": n, "messages": w.messages, "error": str(exc),
                            "partitions": len(w.partitions_with_data())})
                say(f"{n} worker(s): {exc}")
                continue
            thr = w.messages / r.wall_s if r.wall_s > 0 else math.nan
            if math.isnan(base):
                base = thr / n
            broker_cpu = r.extra.get("broker_cpu_s")
            busy = (r.cpu_s + (broker_cpu or 0.0)) / r.wall_s if r.wall_s > 0 else math.nan
            out.append({"workers": n, "messages": w.messages, "wall_s": r.wall_s, "cpu_s": r.cpu_s,
                        "msgs_per_s": thr, "ratio_to_one": thr / base if base else math.nan,
                        "peak_rss_bytes": r.peak_rss, "load": r.load,
                        "partitions": len(w.partitions_with_data()), "broker_cpu_s": broker_cpu,
                        "cores_busy": busy, "ceiling_here": cpus / busy if busy and busy > 0 else math.nan})
            say(f"{n} worker(s): {thr:,.0f} msgs/s over {len(w.partitions_with_data())} partitions with data, "
                f"{busy:.2f} of {cpus} cores busy")
    return out


async def measure_sustained(cfg: BenchConfig, bootstrap: str, work: Path, start: float, run_id: str,
                            say: Callable[[str], None], make: MakeCluster) -> dict[str, Any]:
    """One worker fed a cluster live for ``sustained_seconds`` of event time: cores used and steady RSS."""
    d = work / "sustained"
    d.mkdir(parents=True, exist_ok=True)
    msgs, w = make(cfg.sustained_nodes, start, cfg.sustained_seconds, d / "topology.yaml")
    say(f"sustained: {cfg.sustained_nodes} nodes x 8 GPUs, {cfg.sustained_seconds:g} s of event time "
        f"at {cfg.sustained_speed:g}x real time")
    samples: list[tuple[float, float, int]] = []
    last = [0.0]

    def sample(ps: list[subprocess.Popen[bytes]]) -> None:
        now = time.perf_counter()
        if now - last[0] >= 2.0:
            last[0] = now
            samples.append((now, procs.cpu_seconds(ps[0].pid), procs.rss_bytes(ps[0].pid)[0]))

    feed_done: list[float] = []

    async def feed() -> None:
        await write(bootstrap, msgs, w, cfg.sustained_speed)
        feed_done.append(time.perf_counter())

    async with Offsets(bootstrap) as off:
        r = await run_engine(off, w, f"bench-{run_id}-sustained", d, 1, cfg.rules,
                             cfg.timeout_s + cfg.sustained_seconds / max(cfg.sustained_speed, 1e-9),
                             sample=sample, feed=feed())
    during = [(t, c) for t, c, _ in samples if not feed_done or t <= feed_done[0]]
    cores = stats.cores_used(during)
    rss = [m for t, _, m in samples[len(samples) // 2:]]
    fed = w.feed_wall_s
    return {"nodes": cfg.sustained_nodes, "gpus": cfg.sustained_nodes * 8, "seconds": cfg.sustained_seconds,
            "speed": cfg.sustained_speed, "messages": w.messages, "feed_wall_s": fed,
            "kept_pace": fed <= cfg.sustained_seconds / max(cfg.sustained_speed, 1e-9) * 1.05,
            # The engine kept up when it caught up soon after the feed ended; an engine that fell behind
            # shows at most one core used, so the cores a real-time feed needs are its CPU-seconds per
            # event second.
            "engine_kept_up": r.wall_s - fed <= max(30.0, 0.1 * fed),
            "cores_needed": r.cpu_s / cfg.sustained_seconds if cfg.sustained_seconds > 0 else math.nan,
            "cores_used": cores,
            "cores_at_real_time": cores / cfg.sustained_speed if cfg.sustained_speed > 0 else math.nan,
            "caught_up_after_feed_s": r.wall_s - fed,
            "steady_rss_bytes": stats.percentile([float(x) for x in rss], 50), "peak_rss_bytes": r.peak_rss,
            "samples": len(samples)}


def run_bench(cfg: BenchConfig, bootstrap: str | None, work: Path, say: Callable[[str], None],
              make: MakeCluster) -> dict[str, Any]:
    """Everything ``whywait bench`` measures; a JSON-ready dict (``sizes``, ``workers``, ``sustained``, ``machine``).

    ``make`` gives each cluster's messages (``whywait bench`` passes the simulator's).
    Without ``bootstrap`` a private local broker is started in ``work`` (and stopped); the input
    topics are created with ``cfg.partitions`` partitions when missing.  Each size, the worker runs
    and the sustained run take their own stretch of event time, two days back.
    """
    from whywait.engine.localkafka.broker import LocalBroker
    from whywait.engine.stream.topics import ensure_topics_async

    broker = None
    if bootstrap is None:
        broker = LocalBroker()
        bootstrap = broker.start(data_dir=work / "kafka")
        say(f"local broker at {bootstrap}")
    run_id = f"{int(time.time())}"
    try:
        asyncio.run(ensure_topics_async(bootstrap, partitions=cfg.partitions))
        # Records are stamped with their event time (replay seeks by it), and brokers refuse stamps more than an
        # hour ahead (log.message.timestamp.after.max.ms): the data lives two days back, inside any retention.
        t = float(int(time.time()) - 86_400 * 2)
        sizes: list[dict[str, Any]] = []
        load0 = procs.load_average()
        for nodes in cfg.nodes:
            sizes.append(asyncio.run(measure_size(cfg, bootstrap, work, nodes, t, run_id, say, make)))
            t += cfg.seconds + _GAP_S
        workers: list[dict[str, Any]] = []
        if len(cfg.workers) > 1 or cfg.workers != (1,):
            workers = asyncio.run(measure_workers(cfg, bootstrap, work, sizes[-1]["_written"], run_id, say,
                                                  broker.pid if broker is not None else None))
        sustained = None
        if cfg.sustained:
            sustained = asyncio.run(measure_sustained(cfg, bootstrap, work, t, run_id, say, make))
        for s in sizes:
            s.pop("_written", None)
        return {"machine": {"cpus": os.cpu_count(), "load_at_start": load0, "load_at_end": procs.load_average(),
                            "python": sys.version.split()[0]},
                "config": {"nodes": list(cfg.nodes), "seconds": cfg.seconds, "reps": cfg.reps,
                           "feed_speed": cfg.feed_speed, "workers": list(cfg.workers), "partitions": cfg.partitions,
                           "bootstrap": "local" if broker else bootstrap},
                "sizes": sizes, "workers": workers, "sustained": sustained}
    finally:
        if broker is not None:
            broker.stop()
