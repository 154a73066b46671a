"""Scheduler → ``whywait placement`` (real processes) → Kafka (the real broker) → the engine's Processor.

The Slurm hook runs as PrologSlurmctld would (``SLURM_JOB_ID`` set) on a recorded
``scontrol show job -d --json``; the Kubernetes watcher runs against a local API server
replaying a recorded pod list and watch stream.  What they published is read back from
the broker and fed, in order, to the engine's Processor over the topology imported from
the real fabric dump: the jobs are joined to its hosts, a pod restarted on another
node moves its ranks in the live graph, and a pod on a node the topology lacks is
dead-lettered with its reason and counted, without stopping anything.
"""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
from whywait.engine.evaluate.evaluator import Evaluator
from whywait.engine.rules.loader import load_rules
from whywait.engine.stream.processor import Processor, Record
from whywait.topology.model import Topology
from whywait.topology.reconcile import load_node_types, merge
from whywait.topology.sources import read_ibnetdiscover

from tests.support.k8s_server import K8sReplayServer
from tests.support.kafka import create_topic

pytestmark = pytest.mark.integration

REPO = Path(__file__).resolve().parents[2]
PFIX = REPO / "tests" / "fixtures" / "placement"
TFIX = REPO / "tests" / "fixtures" / "topology"


def whywait(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "whywait", *args], capture_output=True, text=True, timeout=120,
                          cwd=REPO, env={**os.environ, **(env or {})}, check=False)


async def read_all(bootstrap: str, topic: str, want: int, timeout_s: float = 30.0) -> list[Any]:
    from aiokafka import AIOKafkaConsumer

    c = AIOKafkaConsumer(topic, bootstrap_servers=bootstrap, auto_offset_reset="earliest", group_id=None)
    await c.start()
    out: list[Any] = []
    try:
        until = time.time() + timeout_s
        while time.time() < until and len(out) < want:
            for msgs in (await c.getmany(timeout_ms=500)).values():
                out += msgs
        return out
    finally:
        await c.stop()


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Path:
    d = tmp_path_factory.mktemp("cluster")
    (d / "ndv5-topo.xml").write_bytes((TFIX / "ndv5-topo.xml").read_bytes())
    (d / "types.yaml").write_text("node_types:\n  - {name: dgx-h100, match: '*-dgx-*', nccl: ndv5-topo.xml}\n")
    res = merge([read_ibnetdiscover(TFIX / "ibnetdiscover-example.out")], load_node_types(d / "types.yaml"))
    assert res.conflicts == []
    res.topology.to_yaml(d / "cluster.yaml")
    return d / "cluster.yaml"


def test_slurm_and_k8s_placements_are_joined_by_the_engine(kafka_bootstrap: str, cluster: Path,
                                                           tmp_path: Path) -> None:
    topic = asyncio.run(create_topic(kafka_bootstrap, compacted=True, prefix="placement"))
    common = ["--bootstrap", kafka_bootstrap, "--topic", topic, "--spool", str(tmp_path / "spool"),
              "--ownership", str(PFIX / "ownership.yaml")]
    prolog = whywait("placement", "slurm", "--prolog", "--scontrol-json", str(PFIX / "scontrol-show-job-23.02.json"),
                     *common, env={"SLURM_JOB_ID": "4242"})
    assert prolog.returncode == 0, prolog.stderr
    assert "placement slurm-4242: 16 rank(s) on 2 node(s), owner llm/pretraining #llm-pretrain" in prolog.stderr
    with K8sReplayServer(PFIX / "k8s-pods-list.json", PFIX / "k8s-pods-watch.jsonl") as srv:
        k8s = whywait("placement", "k8s", "--api-server", srv.url, "--once", *common)
    assert k8s.returncode == 0, k8s.stderr
    assert "placement k8s: 6 placement(s) published" in k8s.stderr
    epilog = whywait("placement", "slurm", "--epilog", *common, env={"SLURM_JOB_ID": "4242"})
    assert epilog.returncode == 0, epilog.stderr

    records = asyncio.run(read_all(kafka_bootstrap, topic, want=8))
    assert len(records) == 8
    assert {r.key.decode() for r in records} == {"slurm-4242", "llm/train-7b", "team-x/notebook-0"}

    topo = Topology.from_yaml(cluster)
    proc = Processor(Evaluator(load_rules([REPO / "rules"]), topo))
    seen: list[tuple[str, Any]] = []
    dead: list[dict[str, Any]] = []
    for r in records:
        out = proc.process([Record("whywait.placement.v1", r.value, r.key, r.partition, r.offset)])
        dead += [json.loads(v) for _, v in out.dead_letters]
        job = r.key.decode()
        seen.append((job, topo.job(job) if topo.has_job(job) else None))

    slurm = seen[0][1]
    assert slurm is not None and slurm.nodes == ("a08-p1-dgx-04-c01", "a08-p1-dgx-04-c02")
    assert slurm.world_size == 16 and slurm.channel == "#llm-pretrain"
    train = [info for job, info in seen if job == "llm/train-7b"]
    assert train[0] is not None and train[0].nodes == ("a08-p1-dgx-04-c01", "a08-p1-dgx-04-c02")
    # The worker restarted on c03: the live graph moves ranks 8-15 there, no restart of anything.
    assert train[2] is not None and train[2].ranks[8] == ("a08-p1-dgx-04-c03", 0)
    assert [j.job for j in topo.jobs_on_node("a08-p1-dgx-04-c03")] == [] and train[-1] is None  # finished
    assert seen[-1] == ("slurm-4242", None)  # the epilog removed it

    # The notebook sits on a node the topology lacks: dead-lettered with its reason, counted, nothing stops.
    assert len(dead) == 1 and proc.counts["dead_letters"] == 1
    assert dead[0]["source_topic"] == "whywait.placement.v1"
    assert dead[0]["reason"].startswith("topology: unknown node 'cpu-node-9'")
    assert json.loads(dead[0]["value"])["job"] == "team-x/notebook-0"
    assert proc.counts["kind.placement"] == 7


def test_concurrent_slurm_hooks_sharing_a_spool_all_finish_and_lose_nothing(kafka_bootstrap: str,
                                                                             tmp_path: Path) -> None:
    """Slurm starts many jobs at once: their prologs share one spool.  Two that loaded the same spooled
    segment used to spin for ever once the other had sent and removed it (a loop that never yielded), and
    a prolog that hangs holds a job's start.  Now they take the spool's lock in turn, each exits in seconds,
    and every placement reaches the broker: the spooled ones (written while it was down) first."""
    topic = asyncio.run(create_topic(kafka_bootstrap, compacted=True, prefix="placement"))
    spool = tmp_path / "spool"
    fixture = str(PFIX / "scontrol-show-job-23.02.json")
    common = ["--topic", topic, "--spool", str(spool), "--ownership", str(PFIX / "ownership.yaml"),
              "--scontrol-json", fixture]
    t0 = time.monotonic()
    down = whywait("placement", "slurm", "--prolog", "--bootstrap", "127.0.0.1:1", *common,
                   env={"SLURM_JOB_ID": "4242"})
    assert down.returncode == 0 and "kept in" in down.stderr, down.stderr
    assert time.monotonic() - t0 < 30, "a prolog with the broker down returns once it has spooled"
    procs = [subprocess.Popen([sys.executable, "-m", "whywait", "placement", "slurm", "--prolog", "--bootstrap",
                               kafka_bootstrap, *common], cwd=REPO, env={**os.environ, "SLURM_JOB_ID": "4242"},
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for _ in range(8)]
    for p in procs:
        _, err = p.communicate(timeout=90)
        assert p.returncode == 0, err
    records = asyncio.run(read_all(kafka_bootstrap, topic, want=9, timeout_s=20))
    assert len(records) == 9, len(records)  # the spooled one, once, and the eight
    assert not list(spool.glob("*.spool")), list(spool.iterdir())
