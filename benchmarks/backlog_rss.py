"""An engine reading a backlog through the real broker, with and without event-time alignment: peak RSS and CPU.

Run: ``.venv/bin/python benchmarks/backlog_rss.py [NODES] [SECONDS] [ALIGN ...]`` (default 128 nodes,
600 s, alignments 0 and 30; 0 is off).  A private local broker is started; the simulated cluster's
telemetry (the bench's, one NIC fault) is written first, each record stamped with its event time,
then ``whywait engine --align A`` reads it from the beginning, once per alignment, alternating.  It
prints, per run, the engine's peak RSS (VmHWM), CPU-seconds and wall seconds until it has taken every
record written (its logged record count), and how many partitions it paused.  A benchmark, not a test.
"""

from __future__ import annotations

import asyncio
import os
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def main(nodes: int, seconds: float, aligns: list[float]) -> None:
    from whywait.engine.bench.feed import write
    from whywait.engine.bench.procs import cpu_seconds, load_average, rss_bytes
    from whywait.engine.commands.bench_cmd import simulated_cluster
    from whywait.engine.localkafka.broker import LocalBroker
    from whywait.engine.stream.topics import ensure_topics_async

    work = Path(tempfile.mkdtemp(prefix="backlog-"))
    broker = LocalBroker()
    bootstrap = broker.start(data_dir=work / "kafka")
    try:
        asyncio.run(ensure_topics_async(bootstrap, partitions=1))
        start = float(int(time.time()) - 86_400 * 2)  # stamps more than an hour ahead are refused by the broker
        msgs, w = simulated_cluster(nodes, start, seconds, work / "topology.yaml")
        written = asyncio.run(write(bootstrap, iter(msgs), w))
        total = written.messages
        print(f"{nodes} nodes x {seconds:.0f} s: {total} messages, {written.bytes >> 20} MB written", flush=True)
        env = {**os.environ, "WHYWAIT_KAFKA_BOOTSTRAP": bootstrap, "PYTHONUNBUFFERED": "1"}
        env.pop("SLACK_BOT_TOKEN", None)
        for rep in range(2):
            for align in aligns:
                log_path = work / f"engine-{align:g}-{rep}.log"
                env["WHYWAIT_NOTIFY_OUTBOX"] = str(work / f"outbox-{align:g}-{rep}")
                with log_path.open("w") as log:
                    proc = subprocess.Popen(
                        [sys.executable, "-m", "whywait", "engine", "--topology", str(work / "topology.yaml"),
                         "--group", f"backlog-{align:g}-{rep}-{time.time():.0f}", "--no-restore",
                         "--not-before", str(start), "--align", str(align)],
                        stdout=log, stderr=subprocess.STDOUT, env=env, cwd=REPO)
                    t0, load0, got = time.time(), load_average(), 0
                    try:
                        while proc.poll() is None and time.time() - t0 < 1800:
                            time.sleep(1.0)
                            counts = re.findall(r"'records': (\d+)", log_path.read_text())
                            got = int(counts[-1]) if counts else 0
                            if got >= total:
                                break
                        cpu, (_, peak) = cpu_seconds(proc.pid), rss_bytes(proc.pid)
                    finally:
                        proc.terminate()
                        proc.wait(30)
                text = log_path.read_text()
                print(f"align {align:>4g} s run {rep + 1}: took {got}/{total} records, peak RSS {peak >> 20} MiB, "
                      f"{cpu:.1f} CPU-s, {time.time() - t0:.0f} s wall, {text.count('engine: pausing')} pauses "
                      f"(load {load0:.1f})", flush=True)
    finally:
        broker.stop()


if __name__ == "__main__":
    args = sys.argv[1:]
    main(int(args[0]) if args else 128, float(args[1]) if len(args) > 1 else 600.0,
         [float(a) for a in args[2:]] or [0.0, 30.0])
