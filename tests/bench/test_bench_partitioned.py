"""The bench's engine runs over partitioned topics time the whole pipeline, not only its router.

With input topics of several partitions ``whywait engine`` routes them onto the repartition topic and
evaluates from there; the input topics' offsets are the router's.  The bench once stopped the engine when
those were committed: a 1,024-GPU live run had evaluated 6 s of its 60 s and timed no diagnosis, and each
later run's fresh group read the repartition topic from its beginning (the earlier runs' copies of the same
data) as well as its own.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest
from whywait.engine.bench.feed import Written, write
from whywait.engine.bench.harness import Offsets, caught_up, run_engine

BY_JOB = "whywait.by-job.v1"


def _written() -> Written:
    w = Written(4, 1000.0, 30.0, Path("t.yaml"), ("node-004", 1010.0, 1020.0))
    w.first = {("whywait.gpu.v1", 0): 5, ("whywait.gpu.v1", 1): 7, ("whywait.net.v1", 0): 3}
    w.end = {("whywait.gpu.v1", 0): 50, ("whywait.gpu.v1", 1): 70, ("whywait.net.v1", 0): 3}
    return w


def test_caught_up_needs_the_inputs_and_for_the_partitioned_engine_the_repartition_topic() -> None:
    w = _written()
    inputs = {("whywait.gpu.v1", 0): 50, ("whywait.gpu.v1", 1): 70}  # the empty net partition is not waited for
    assert caught_up(inputs, w, {})
    assert not caught_up({**inputs, ("whywait.gpu.v1", 1): 69}, w, {})
    # Routed (inputs committed) but not yet evaluated: the repartition topic's commits are behind its end.
    rep_ends = {(BY_JOB, 0): 900, (BY_JOB, 1): 40}
    assert not caught_up({**inputs, (BY_JOB, 0): 120, (BY_JOB, 1): 40}, w, rep_ends)
    assert not caught_up(inputs, w, rep_ends)  # nothing committed there yet
    assert caught_up({**inputs, (BY_JOB, 0): 900, (BY_JOB, 1): 40}, w, rep_ends)
    assert not caught_up({(BY_JOB, 0): 900, (BY_JOB, 1): 40}, w, rep_ends)


def _evaluated(log: Path) -> dict[str, int]:
    """The counts in the worker's last checkpoint line (logged as it stops)."""
    lines = [ln for ln in log.read_text(errors="replace").splitlines() if '"counters"' in ln]
    assert lines, log.read_text()[-3000:]
    return dict(json.loads(lines[-1])["counters"])


@contextmanager
def _broker_with_cluster(tmp_path: Path, partitions: int, nodes: int, seconds: float
                         ) -> Iterator[tuple[str, Written]]:
    """A private local broker whose input topics have ``partitions``, holding a simulated cluster two days back."""
    from whywait.engine.commands.bench_cmd import simulated_cluster
    from whywait.engine.localkafka.broker import LocalBroker
    from whywait.engine.stream.topics import ensure_topics_async

    broker = LocalBroker()
    bootstrap = broker.start(data_dir=tmp_path / "kafka")
    try:
        asyncio.run(ensure_topics_async(bootstrap, partitions=partitions))
        msgs, w = simulated_cluster(nodes, float(int(time.time()) - 86_400 * 2), seconds, tmp_path / "topology.yaml")
        asyncio.run(write(bootstrap, msgs, w, 0.0))
        yield bootstrap, w
    finally:
        broker.stop()


@pytest.mark.integration
def test_partitioned_engine_runs_evaluate_everything_once(tmp_path: Path) -> None:
    # Its own broker: the input topics get 2 partitions (the session broker's must keep theirs).
    with _broker_with_cluster(tmp_path, partitions=2, nodes=4, seconds=30.0) as (bootstrap, w):
        async def runs() -> None:
            async with Offsets(bootstrap) as off:
                for group in ("g1", "g2"):  # the second over the same data, the first's copies on the topic
                    await run_engine(off, w, group, tmp_path, 1, timeout_s=300)
                    rep = await off.repartition_ends()
                    assert rep, "a partitioned run"
                    committed = await off.committed(group)
                    assert all(committed.get(tp, -1) >= end for tp, end in rep.items()), (committed, rep)

        asyncio.run(runs())
    for group in ("g1", "g2"):
        counts = _evaluated(tmp_path / f"{group}-0.log")
        # Every routed message evaluated, and once: none left behind the router, no earlier run's copies.
        assert counts["route.records"] == w.messages, counts
        assert counts["messages"] == counts["route.forwarded"] > 0, counts


@pytest.mark.integration
def test_a_two_worker_run_stops_once_every_worker_has_evaluated_what_was_routed(tmp_path: Path) -> None:
    """With two workers the evaluate stage of the worker owning the job holds most of a backlog in its reorder
    buffer (it waits for the other worker's router); it used to commit it there, unevaluated, and the bench
    stopped a 1,024-GPU run with 5,665 of 44,288 messages evaluated.  Now its commits cover evaluated records
    only: when the bench says caught up, every routed message has been evaluated."""
    with _broker_with_cluster(tmp_path, partitions=4, nodes=64, seconds=60.0) as (bootstrap, w):
        async def run() -> None:
            async with Offsets(bootstrap) as off:
                await run_engine(off, w, "two", tmp_path, 2, timeout_s=300)

        asyncio.run(run())
    counts = [_evaluated(tmp_path / f"two-{i}.log") for i in range(2)]
    total = {k: sum(c.get(k, 0) for c in counts) for k in ("route.records", "route.forwarded", "messages")}
    assert total["route.records"] == w.messages, counts
    # Stopped as soon as the bench judged it caught up: by then everything routed had been evaluated.  When the
    # job moved at the second worker's join, its new owner evaluated again from the last commit what the first
    # had evaluated after it (at least once across a handover; duplicates within one worker are dropped): the
    # excess is at most what the worker that lost the job had evaluated.
    excess = total["messages"] - total["route.forwarded"]
    assert total["route.forwarded"] > 0 and 0 <= excess <= min(c.get("messages", 0) for c in counts), counts
