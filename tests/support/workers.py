"""Several ``whywait engine`` worker processes in one consumer group, for the scale-out tests.

Used by ``tests/integration/test_scaleout.py`` and ``test_failover.py``: both start N partitioned
workers on a private broker, each with its own log and notifier outbox, and must stop every one of
them whatever the test does.  Real processes, a real broker: nothing here mocks Kafka.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Mapping

import pytest

REPO = Path(__file__).resolve().parents[2]


def whywait(*args: str) -> list[str]:
    """The command line running the CLI of this checkout with the test's interpreter."""
    return [sys.executable, "-m", "whywait", *args]


def engine_env(bootstrap: str, **extra: str) -> dict[str, str]:
    """The environment of a worker: this process's, less any Slack or whywait settings, plus ``extra``."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("SLACK", "WHYWAIT_"))}
    env.update({"WHYWAIT_KAFKA_BOOTSTRAP": bootstrap, "PYTHONUNBUFFERED": "1", **extra})
    return env


class Workers:
    """``n`` engine workers of ``group`` (``--partitions``), started by :meth:`start`, stopped by :meth:`stop`.

    Each writes ``worker-{tag}{i}.log`` in ``work`` and has its own outbox (two notifiers never share one).
    """

    def __init__(self, work: Path, topology: Path, group: str, n: int, env: Mapping[str, str],
                 partitions: int = 4, args: tuple[str, ...] = (), tag: str = "") -> None:
        self.work, self.topology, self.group, self.n = work, topology, group, n
        self.env, self.partitions, self.args = dict(env), partitions, args
        self.logs = [work / f"worker-{tag}{i}.log" for i in range(n)]
        self.outboxes = [work / f"outbox-{tag}{i}" for i in range(n)]
        self.procs: list[subprocess.Popen[bytes]] = []

    def start(self) -> Workers:
        for log, outbox in zip(self.logs, self.outboxes, strict=True):
            self.procs.append(subprocess.Popen(
                whywait("engine", "--topology", str(self.topology), "--group", self.group,
                        "--partitions", str(self.partitions), "--instance-id", "none", *self.args),
                stdout=log.open("w"), stderr=subprocess.STDOUT, cwd=REPO,
                env={**self.env, "WHYWAIT_NOTIFY_OUTBOX": str(outbox)}))
        return self

    def texts(self) -> list[str]:
        """Each worker's log so far."""
        return [p.read_text() for p in self.logs]

    def wait_settled(self, timeout: float = 120.0) -> bool:
        """Wait until every worker holds its share of the group's partitions (logged 'took' and 'consuming',
        and the newest assignments together cover every worker), then a little more for the placement
        tables; False when a worker died or the time ran out."""
        deadline = time.time() + timeout
        while time.time() < deadline:
            texts = self.texts()
            if all("took" in t and "consuming" in t for t in texts):
                time.sleep(5)  # the last rebalance's restores and the placement tables settle
                return True
            if any(p.poll() is not None for p in self.procs):
                return False
            time.sleep(0.5)
        return False

    def stop(self) -> None:
        """Stop every worker still running (SIGTERM, then SIGKILL after 30 s)."""
        for p in self.procs:
            if p.poll() is None:
                p.terminate()
        for p in self.procs:
            try:
                p.wait(30)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait(10)


@pytest.fixture(scope="module")
def private_broker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """A broker of the module's own (4-partition topics must not change how other tests' engines run)."""
    from whywait.engine.localkafka import broker as lb

    if not lb.jars_fetched():
        pytest.skip("no Kafka jars for a private broker")
    b = lb.LocalBroker(detached=False)
    bootstrap = b.start(data_dir=tmp_path_factory.mktemp("private-broker"))
    try:
        yield bootstrap
    finally:
        b.stop()
