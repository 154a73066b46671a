"""Engine throughput: plain consume+decode, the pure evaluator, and the whole faust engine, on one data set.

Run: ``.venv/bin/python benchmarks/engine_bench.py [--nodes 16] [--seconds 900]``

It starts a private Kafka broker (or uses WHYWAIT_KAFKA_BOOTSTRAP), publishes a
simulated job's telemetry (with one fault) in an event-time window of its own,
then measures, in one run:

1. a plain aiokafka consumer reading and decoding every message (the ceiling);
2. the pure evaluator alone (decode excluded), as ``whywait rules test`` runs it;
3. ``whywait engine`` (faust) consuming from the start until its consumer group
   has committed every offset.

Figures are messages per second and contract records per second (a message
carries one record per GPU, NIC, device or rank-step).  It prints a table; it
is a benchmark, not a test.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from whywait.agents.events import INPUT_TOPICS, decode, encode, message_key  # noqa: E402
from whywait.simulate.cluster import make_cluster, make_job  # noqa: E402
from whywait.simulate.faults import make_fault  # noqa: E402
from whywait.simulate.sim import Simulation  # noqa: E402


def records(msg: dict) -> int:
    for k in ("gpus", "nics", "devices", "steps", "ranks"):
        if k in msg:
            return max(1, len(msg[k]))
    return 1


async def publish(bootstrap: str, msgs: list[tuple[str, dict]]) -> None:
    from aiokafka import AIOKafkaProducer

    p = AIOKafkaProducer(bootstrap_servers=bootstrap, acks="all", enable_idempotence=True, linger_ms=50,
                         compression_type="gzip", max_batch_size=1 << 20)
    await p.start()
    try:
        futs = [await p.send(t, encode(m), key=message_key(m)) for t, m in msgs]
        await asyncio.gather(*futs)
    finally:
        await p.stop()


async def plain_consume(bootstrap: str, n: int, start: float) -> float:
    from aiokafka import AIOKafkaConsumer

    c = AIOKafkaConsumer(*INPUT_TOPICS, bootstrap_servers=bootstrap, auto_offset_reset="earliest",
                         group_id=f"bench-plain-{start:.0f}", enable_auto_commit=False, max_poll_records=5000)
    await c.start()
    seen = 0
    t0 = time.perf_counter()
    try:
        while seen < n:
            for tp, ms in (await c.getmany(timeout_ms=1000, max_records=5000)).items():
                for m in ms:
                    d = decode(m.value, tp.topic)
                    if d["time"] >= start:
                        seen += 1
        return time.perf_counter() - t0
    finally:
        await c.stop()


async def group_caught_up(bootstrap: str, group: str) -> bool:
    from aiokafka import AIOKafkaConsumer, TopicPartition
    from aiokafka.admin import AIOKafkaAdminClient

    admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap)
    c = AIOKafkaConsumer(bootstrap_servers=bootstrap)
    await admin.start()
    await c.start()
    try:
        committed = await admin.list_consumer_group_offsets(group)
        tps = [TopicPartition(t, 0) for t in INPUT_TOPICS]
        ends = await c.end_offsets(tps)
        return all(ends[tp] == 0 or (tp in committed and committed[tp].offset >= ends[tp]) for tp in tps)
    finally:
        await c.stop()
        await admin.close()


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--nodes", type=int, default=16)
    ap.add_argument("--seconds", type=float, default=900.0, help="simulated seconds of telemetry")
    args = ap.parse_args()

    from whywait.engine.evaluate.evaluator import Evaluator
    from whywait.engine.localkafka.broker import LocalBroker
    from whywait.engine.rules.loader import load_rules
    from whywait.engine.stream.topics import ensure_topics
    from whywait.topology.model import Topology

    broker = None
    bootstrap = os.environ.get("WHYWAIT_KAFKA_BOOTSTRAP")
    work = Path(tempfile.mkdtemp(prefix="whywait-bench-"))
    if not bootstrap:
        broker = LocalBroker()
        bootstrap = broker.start(data_dir=work / "kafka")
    try:
        ensure_topics(bootstrap)
        start = float(int(time.time()) + 86_400 * 365)  # a window of event time no one else uses
        topo = make_cluster(nodes=args.nodes)
        infra = Topology.from_dict(topo.to_dict())
        sim = Simulation(topo, [make_job(topo)], [make_fault("nic-packet-loss", "node-03", 300, 500)],
                         start_time=start, duration_s=args.seconds, seed=5)
        msgs = list(sim.messages())
        n, nrec = len(msgs), sum(records(m) for _, m in msgs)
        print(f"data: {n} messages, {nrec} records ({args.nodes} nodes, {args.seconds:g} s of event time)")
        t = time.perf_counter()
        asyncio.run(publish(bootstrap, msgs))
        print(f"published in {time.perf_counter() - t:.1f} s")

        plain_s = asyncio.run(plain_consume(bootstrap, n, start))

        rules = load_rules([REPO / "rules"])
        ev = Evaluator(rules, Topology.from_dict(infra.to_dict()))
        t = time.perf_counter()
        for _, m in msgs:
            ev.ingest(m)
        eval_s = time.perf_counter() - t

        topo_file = work / "topology.yaml"
        infra.to_yaml(topo_file)
        group = f"bench-engine-{start:.0f}"
        env = {**os.environ, "WHYWAIT_KAFKA_BOOTSTRAP": bootstrap, "WHYWAIT_NOTIFY_OUTBOX": str(work / "outbox")}
        env.pop("SLACK_BOT_TOKEN", None)
        t = time.perf_counter()
        proc = subprocess.Popen([sys.executable, "-m", "whywait", "engine", "--topology", str(topo_file),
                                 "--group", group, "--not-before", str(start), "--no-restore",
                                 "--max-clock-skew", "off"],  # its event time is a year ahead
                                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=env, cwd=REPO)
        try:
            while not asyncio.run(group_caught_up(bootstrap, group)):
                if proc.poll() is not None:
                    raise SystemExit("the engine exited early")
                time.sleep(0.5)
            engine_s = time.perf_counter() - t
        finally:
            proc.terminate()
            proc.wait(30)

        rows = [("plain aiokafka consume + decode", plain_s), ("pure evaluator (no Kafka)", eval_s),
                ("whywait engine (faust, end to end, incl. start-up)", engine_s)]
        print(f"\n{'path':52} {'seconds':>8} {'msgs/s':>9} {'records/s':>10}")
        for name, s in rows:
            print(f"{name:52} {s:8.1f} {n / s:9.0f} {nrec / s:10.0f}")
        print(f"\nsimulated cluster rate: {n / args.seconds:.0f} msgs/s; the engine keeps up "
              f"{(n / engine_s) / (n / args.seconds):.0f}x over with {len(rules)} rules")
        (work / "figures.json").write_text(json.dumps({"messages": n, "records": nrec, "plain_s": plain_s,
                                                        "eval_s": eval_s, "engine_s": engine_s}))
        return 0
    finally:
        if broker is not None:
            broker.stop()


if __name__ == "__main__":
    sys.exit(main())
