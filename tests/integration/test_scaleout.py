"""Scale-out on Kafka partitions: 1, 2 and 3 ``whywait engine`` workers in one consumer group give
the same diagnoses, for faults on jobs in every partition and for a contention fault across workers.

Real parts only: a private broker (its own, so this test's 4-partition topics cannot change how the
other integration tests' engines run), the simulator, N engine processes.  Job names are chosen so
that, at 4 partitions, each of the four jobs is evaluated from a different partition, and the two
jobs of the contention fault (``train-llm`` waits on pool ``scratch``, loaded by ``etl-d`` of another
project) are evaluated on different partitions at 2, 3 and 4 (so by different workers whenever the
group gives them to different members): see ``test_jobs_span_every_partition``.
"""

from __future__ import annotations

import asyncio
import json
import subprocess
import time
from pathlib import Path
from typing import Any

import pytest
from whywait.agents.events import TOPIC_DIAGNOSES

from tests.support.workers import REPO, Workers, engine_env, private_broker, whywait

# Several engine processes on one broker take minutes each here: `make test-scaleout` runs them, `make test` does not.
pytestmark = [pytest.mark.integration, pytest.mark.scaleout]

PARTITIONS = 4
DURATION = 240
JOBS = {"train-llm": "node-01..node-06", "etl-d": "node-07..node-08", "job-e": "node-09..node-12",
        "job-a": "node-13..node-16"}
SCENARIO = f"""\
seed: 3
duration_s: {DURATION}
cluster: {{nodes: 16, pools: [scratch, datasets]}}
jobs:
- {{job: train-llm, project: llm, team: ml-platform, nodes: {JOBS['train-llm']}, pool: scratch}}
- {{job: etl-d, project: etl, team: data-eng, nodes: {JOBS['etl-d']}, pool: scratch}}
- {{job: job-e, project: vision, team: cv, nodes: {JOBS['job-e']}, pool: datasets}}
- {{job: job-a, project: speech, team: asr, nodes: {JOBS['job-a']}, pool: datasets}}
faults:
- {{fault: contention, target: etl-d/scratch, start: 100, end: 140}}
- {{fault: nic-packet-loss, target: node-10, start: 150, end: 185}}
- {{fault: nic-packet-loss, target: node-14, start: 195, end: 230}}
"""
DAY = 86_400
# job-e and job-a read another pool: with every job on `scratch`, which of the three victims of etl-d's reads
# crossed the contention rule's thresholds first varied from run to run (one worker named job-a and job-e, the
# next train-llm), and the comparison between worker counts compared that chance, not the scale-out.


broker = private_broker  # this module's own broker (test_failover imports it too)


async def lag(bootstrap: str, group: str) -> int:
    """Records of the engine's topics not yet committed by ``group`` (inputs and the repartition topic)."""
    from aiokafka import AIOKafkaConsumer, TopicPartition
    from aiokafka.admin import AIOKafkaAdminClient
    from whywait.agents.events import INPUT_TOPICS
    from whywait.engine.stream.topics import TOPIC_BY_JOB

    admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap)
    await admin.start()
    try:
        committed = await admin.list_consumer_group_offsets(group)
    finally:
        await admin.close()
    tps = [TopicPartition(t, p) for t in (*INPUT_TOPICS, TOPIC_BY_JOB) for p in range(PARTITIONS)]
    c = AIOKafkaConsumer(bootstrap_servers=bootstrap)
    await c.start()
    try:
        ends = await c.end_offsets(tps)
    finally:
        await c.stop()
    return sum(max(0, ends[tp] - (committed[tp].offset if tp in committed else 0)) for tp in tps)


async def read_diagnoses(bootstrap: str, since: float, until: float, group: str,
                         quiet_s: float = 20.0) -> list[dict[str, Any]]:
    """Every diagnosis detected at or after ``since`` (event time), read until the group has no lag and
    none came for ``quiet_s`` (the machine may be slow: a fixed wait would cut a slow run short)."""
    from aiokafka import AIOKafkaConsumer

    c = AIOKafkaConsumer(TOPIC_DIAGNOSES, bootstrap_servers=bootstrap, auto_offset_reset="earliest", group_id=None)
    await c.start()
    out: list[dict[str, Any]] = []
    last = time.time()
    try:
        while time.time() < until:
            if time.time() - last >= quiet_s:
                try:
                    behind = await lag(bootstrap, group)
                except Exception:  # noqa: BLE001 - a coordinator moving on a busy machine: ask again later
                    behind = -1
                if behind == 0:
                    break
                last = time.time() - quiet_s / 2
            for msgs in (await c.getmany(timeout_ms=500)).values():
                got = [d for d in (json.loads(m.value) for m in msgs) if d.get("detected_at", 0) >= since]
                if got:
                    out += got
                    last = time.time()
        return out
    finally:
        await c.stop()


def run_workers(bootstrap: str, work: Path, n: int, start: float,
                latest: bool = False) -> tuple[list[dict[str, Any]], list[str]]:
    """Start ``n`` workers in one fresh group, simulate the scenario from ``start``; return diagnoses and logs.

    The group reads from the beginning and skips older event times (``--not-before``), or with ``latest``
    starts where the topics end when the workers start (``--latest``, as an operator starts a new group).
    """
    scen = work / "scenario.yaml"
    scen.write_text(SCENARIO)
    topo = work / f"topology-{n}.yaml"
    from whywait.simulate.scenario import load_scenario

    load_scenario(scen).topology.to_yaml(topo)  # the jobs come from the placement topic
    env = engine_env(bootstrap, WHYWAIT_RECEIVERS="console")
    group = f"scaleout-{n}-{start:.0f}"
    first = ("--latest",) if latest else ("--not-before", str(start))
    workers = Workers(work, topo, group, n, env, PARTITIONS, tag=f"{n}-",
                      args=(*first, "--no-restore", "--max-clock-skew", "off"))
    try:
        workers.start().wait_settled()  # every worker has its share before any telemetry is produced
        subprocess.run(whywait("simulate", "--scenario", str(scen), "--speed", "0", "--start-time", str(start)),
                       env=env, cwd=REPO, check=True, timeout=300)
        diags = asyncio.run(read_diagnoses(bootstrap, start, time.time() + 420, group))
    finally:
        workers.stop()
    return diags, workers.texts()


def summary(diags: list[dict[str, Any]]) -> set[tuple[str, str, str]]:
    """What was diagnosed (rule, job, culprit), firing ones, whatever worker said it."""
    return {(d["rule_id"], d.get("job") or "", d.get("culprit") or "") for d in diags if d["status"] == "firing"}


class Runs(dict):  # type: ignore[type-arg]
    """Each worker count's run, made when a test first asks for it (``runs[n]``)."""

    def __init__(self, broker: str, tmp: pytest.TempPathFactory) -> None:
        super().__init__()
        self.broker, self.tmp = broker, tmp
        self.base = float(int(time.time()) + 50 * DAY)  # +50 d: this test's own stretch of event time

    def __missing__(self, n: int | str) -> tuple[list[dict[str, Any]], list[str]]:
        if n == "latest-2":  # two workers in a new group started with --latest
            self[n] = run_workers(self.broker, self.tmp.mktemp("scaleout-latest"), 2, self.base + 5 * DAY, latest=True)
        else:
            self[n] = run_workers(self.broker, self.tmp.mktemp(f"scaleout-{n}"), int(n), self.base + int(n) * DAY)
        return self[n]


@pytest.fixture(scope="module")
def runs(broker: str, tmp_path_factory: pytest.TempPathFactory) -> Runs:
    return Runs(broker, tmp_path_factory)


def test_jobs_span_every_partition() -> None:
    from whywait.engine.stream.partitioning import partition_for

    assert {partition_for(j, PARTITIONS) for j in JOBS} == set(range(PARTITIONS))
    for n in (2, 3, 4):
        assert partition_for("train-llm", n) != partition_for("etl-d", n)


def test_one_worker_finds_every_fault(runs: dict[int, Any]) -> None:
    diags, logs = runs[1]
    found = summary(diags)
    jobs = {j for _, j, _ in found}
    assert {"train-llm", "job-e", "job-a"} <= jobs, (found, logs[0][-3000:])
    assert any(r == "contention.shared-pool" and j == "train-llm" and c == "etl-d" for r, j, c in found), found
    assert any(j == "job-e" and "node-10" in c for _, j, c in found), found
    assert any(j == "job-a" and "node-14" in c for _, j, c in found), found


@pytest.mark.parametrize("n", [2, 3])
def test_n_workers_give_the_same_diagnoses(runs: dict[int, Any], n: int) -> None:
    one = summary(runs[1][0])
    many, logs = runs[n]
    assert summary(many) == one, (sorted(summary(many) ^ one), [t[-2000:] for t in logs])
    # every worker evaluated: each took partitions of the repartition topic
    assert all("took" in t for t in logs), [t[-1500:] for t in logs]


def test_a_new_group_started_with_latest_misses_nothing_published_after(runs: dict[Any, Any]) -> None:
    """``--latest`` with two workers joining a new group: once started, every input is evaluated (each
    partition used to start wherever its end was when some worker first fetched it, and most was skipped)."""
    one = summary(runs[1][0])
    many, logs = runs["latest-2"]
    assert summary(many) == one, (sorted(summary(many) ^ one), [t[-2000:] for t in logs])
    assert any("starts at the latest offsets" in t for t in logs), [t[-1500:] for t in logs]


@pytest.mark.parametrize("n", [1, 2, 3])
def test_each_incident_is_announced_once(runs: dict[int, Any], n: int) -> None:
    firing = [(d["fingerprint"]) for d in runs[n][0] if d["status"] == "firing"]
    resolved = [(d["fingerprint"]) for d in runs[n][0] if d["status"] == "resolved"]
    assert len(resolved) == len(set(resolved)), resolved
    assert set(resolved) <= set(firing)


# ---- no record lost across a rebalance -------------------------------------------------------------------

async def read_range(bootstrap: str, ranges: dict[tuple[str, int], tuple[int, int]]) -> list[Any]:
    """The records of each ``(topic, partition)`` from its first to its end offset (exclusive)."""
    from aiokafka import AIOKafkaConsumer, TopicPartition

    want = {TopicPartition(t, p): ab for (t, p), ab in ranges.items() if ab[1] > ab[0]}
    c = AIOKafkaConsumer(bootstrap_servers=bootstrap, enable_auto_commit=False)
    await c.start()
    out: list[Any] = []
    try:
        c.assign(list(want))
        for tp, (a, _) in want.items():
            c.seek(tp, a)
        open_ = set(want)
        while open_:
            for tp, recs in (await c.getmany(*open_, timeout_ms=2000)).items():
                out += [r for r in recs if r.offset < want[tp][1]]
                if recs and recs[-1].offset + 1 >= want[tp][1]:
                    open_.discard(tp)
    finally:
        await c.stop()
    return out


def test_a_worker_joining_mid_backlog_loses_no_record(broker: str, tmp_path: Path) -> None:  # noqa: F811
    """A second worker joins while the first routes a backlog: every input record still reaches the
    repartition topic.  (The first worker's fetcher had a fetch waiting for room in the router's queue; the
    revoke emptied the queue, that fetch went in after it, the router took it out of order and counted its
    partition handed up to its end, and the re-read from the committed offset was dropped as delivered again:
    one 2-worker run at 1,024 GPUs routed 43,205 of its 44,289 records, its input commits at the end.)"""
    import hashlib

    from whywait.agents.events import TOPIC_PLACEMENT
    from whywait.engine.bench.feed import write
    from whywait.engine.bench.harness import Offsets, _assigned, _stop, caught_up, launch_engine
    from whywait.engine.commands.bench_cmd import simulated_cluster
    from whywait.engine.stream.scaleout import PROGRESS_HEADER
    from whywait.engine.stream.topics import ensure_topics_async

    asyncio.run(ensure_topics_async(broker, partitions=PARTITIONS))
    # Two days back: the records are stamped with their event time, and the broker's retention (7 days) must
    # not delete them while they are read; the module's other runs are weeks ahead.
    start = float(int(time.time()) - 2 * DAY)
    msgs, w = simulated_cluster(128, start, 60.0, tmp_path / "topology.yaml")
    asyncio.run(write(broker, msgs, w, 0.0))
    group = f"rebalance-{start:.0f}"

    async def run() -> tuple[dict[tuple[str, int], int], dict[tuple[str, int], int]]:
        async with Offsets(broker) as off:
            rep0 = await off.repartition_ends()
            assert rep0, "a partitioned run"
            begin = {**w.first, **rep0}
            await off.commit(group, begin)
            await off.mark_start(group, begin)
            first, log0 = launch_engine(broker, w.topology, group, start, tmp_path, 0)
            procs = [first]
            try:
                deadline = time.monotonic() + 120
                while not _assigned(log0):  # the first worker has every partition and a backlog of 44,289
                    assert first.poll() is None and time.monotonic() < deadline, log0.read_text()[-3000:]
                    await asyncio.sleep(0.1)
                await asyncio.sleep(1.0)
                procs.append(launch_engine(broker, w.topology, group, start, tmp_path, 1)[0])  # joins mid-backlog
                deadline = time.monotonic() + 300
                while not caught_up(await off.committed(group), w, {}):
                    assert all(p.poll() is None for p in procs) and time.monotonic() < deadline, \
                        [(tmp_path / f"{group}-{i}.log").read_text()[-3000:] for i in range(2)]
                    await asyncio.sleep(0.5)
                await asyncio.sleep(2.0)  # the routers' last sends (committed once queued in the producer)
                return rep0, await off.repartition_ends()
            finally:
                _stop(procs)

    rep0, rep1 = asyncio.run(run())
    logs = [(tmp_path / f"{group}-{i}.log").read_text() for i in range(2)]
    assert all(t.count("engine: consuming") >= 1 for t in logs) and logs[0].count("engine: consuming") >= 2, \
        "the second worker joined after the first had its assignment: a rebalance"
    key = lambda topic, value: (topic, hashlib.sha1(value or b"").digest())  # noqa: E731
    inputs = {key(r.topic, r.value): (r.topic, r.partition, r.offset)
              for r in asyncio.run(read_range(broker, {tp: (w.first.get(tp, 0), e) for tp, e in w.end.items()}))
              if r.topic != TOPIC_PLACEMENT}
    assert len(inputs) == w.messages - 1  # every message but the placement
    routed = set()
    for r in asyncio.run(read_range(broker, {tp: (rep0.get(tp, 0), e) for tp, e in rep1.items()})):
        headers = dict(r.headers or ())
        if PROGRESS_HEADER not in headers:
            routed.add(key(headers["whywait-topic"].decode(), r.value))
    lost = sorted(where for k, where in inputs.items() if k not in routed)
    assert not lost, (len(lost), lost[:5], lost[-5:], [t[-2000:] for t in logs])
