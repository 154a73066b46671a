"""The engine says when its broker goes away and comes back, and stops cleanly while it is gone.

A new user stopped the broker under a running engine: for over a minute the engine logged nothing at all (its
alerts silently off), and on SIGTERM it logged "faust's Thread-1 stopped on CancelledError" and mode's
"Error while stopping child ... TimeoutError()" after a 10 s wait.  Now a WARNING names the broker and since when
within about 10 s, again every minute while it lasts, an INFO says when it is back, ``/metrics`` has
``whywait_engine_broker_up``, ``/readyz`` is 503 with the same words, and a SIGTERM while it is gone exits in a
few seconds with one line.
"""

from __future__ import annotations

import asyncio
import logging
import os
import re
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

import pytest
from whywait.engine.observe.metrics import EngineMetrics, Readiness
from whywait.engine.stream.app import BrokerWatch, say_duration

REPO = Path(__file__).resolve().parents[2]


class Clock:
    def __init__(self, t: float) -> None:
        self.t = t

    def __call__(self) -> float:
        return self.t


def _said(caplog: pytest.LogCaptureFixture) -> list[tuple[str, str]]:
    out = [(r.levelname, r.getMessage()) for r in caplog.records if r.name == "whywait.engine.stream.app"]
    caplog.clear()
    return out


def test_an_outage_is_said_after_the_grace_then_every_minute_and_its_end_once(
        caplog: pytest.LogCaptureFixture) -> None:
    clock = Clock(1_796_452_262.0)  # 06:31:02 UTC
    metrics = EngineMetrics()
    w = BrokerWatch("127.0.0.1:19341", grace_s=8, repeat_s=60, clock=clock, metrics=metrics)
    caplog.set_level(logging.INFO, logger="whywait.engine.stream.app")
    w.observe(None)
    assert _said(caplog) == [] and not w.down and w.reason() is None
    w.observe("connection refused")  # the first failed probe: not said yet (a restart of a few seconds)
    assert _said(caplog) == [] and not w.down
    assert metrics.registry.get_sample_value("whywait_engine_broker_up") == 0  # the gauge is the probe's answer
    clock.t += 3
    w.observe("connection refused")
    assert _said(caplog) == []
    clock.t += 6  # 9 s since the first failure
    w.observe("connection refused")
    assert _said(caplog) == [("WARNING", "broker 127.0.0.1:19341 unreachable since 06:31:02 UTC (9s: connection "
                                         "refused): retrying; no events are being evaluated")]
    assert w.down and w.reason() == ("broker 127.0.0.1:19341 unreachable since 06:31:02 UTC (9s: connection "
                                     "refused); no events are being evaluated")
    for _ in range(19):  # every 3 s for 57 s: not said again
        clock.t += 3
        w.observe("no answer within 2s")
    assert _said(caplog) == []
    clock.t += 3
    w.observe("no answer within 2s")
    assert _said(caplog) == [("WARNING", "broker 127.0.0.1:19341 still unreachable since 06:31:02 UTC (1m 09s: "
                                         "no answer within 2s): retrying; no events are being evaluated")]
    clock.t += 61
    w.observe(None)
    assert _said(caplog) == [("INFO", "broker 127.0.0.1:19341 back after 2m 10s; resuming from committed offsets")]
    assert not w.down and w.reason() is None
    assert metrics.registry.get_sample_value("whywait_engine_broker_up") == 1


def test_a_blip_shorter_than_the_grace_says_nothing(caplog: pytest.LogCaptureFixture) -> None:
    clock = Clock(1000.0)
    w = BrokerWatch("k:9092", grace_s=8, clock=clock)
    caplog.set_level(logging.DEBUG, logger="whywait.engine.stream.app")
    for _ in range(2):
        w.observe("connection refused")
        clock.t += 3
    w.observe(None)
    assert _said(caplog) == []
    w.observe("connection refused")  # a new outage counts from its own first failure
    clock.t += 7
    w.observe("connection refused")
    assert _said(caplog) == []


def test_readyz_says_the_broker_is_down_at_once_not_when_the_lag_goes_stale() -> None:
    clock = Clock(5000.0)
    processor = type("P", (), {"evaluator": type("E", (), {"rules": {"r": 1}})()})()
    ready = Readiness(processor, clock=clock)
    ready.sampled()
    ready.assigned(3)
    w = BrokerWatch("k:9092", grace_s=8, clock=clock)
    ready.broker = w.reason
    assert ready() is None
    w.observe("connection refused")
    clock.t += 9
    w.observe("connection refused")
    assert ready() == ("broker k:9092 unreachable since 01:23:20 UTC (9s: connection refused); no events are "
                       "being evaluated")  # the lag sample is only 9 s old: before, /readyz said "ready"
    w.observe(None)
    assert ready() is None


def test_durations_read_as_people_say_them() -> None:
    assert [say_duration(s) for s in (0, 9.4, 59, 60, 130, 3599, 3600, 7380)] == [
        "0s", "9s", "59s", "1m", "2m 10s", "59m 59s", "1h 00m", "2h 03m"]


def test_the_consumer_thread_stops_when_aiokafka_s_stop_raises_its_fetch_s_cancellation(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """aio-libs/aiokafka#647: ``Fetcher.close`` awaits the fetch request it cancelled, and its CancelledError came
    out of ``consumer.stop()``; mode's thread died on it without saying it stopped, and the worker waited 10 s."""
    from faust.transport.drivers import aiokafka as faust_aiokafka
    from whywait.engine.stream.batches import BatchConsumerThread

    closed: list[str] = []

    class Client:
        async def close(self) -> None:
            closed.append("client")

    async def main() -> None:
        async def backoff() -> None:
            await asyncio.sleep(60)

        request = asyncio.ensure_future(backoff())  # a fetch request waiting out its retry backoff
        other = asyncio.ensure_future(backoff())

        async def aiokafka_stop(self: Any) -> None:  # what faust's on_thread_stop -> consumer.stop() does
            request.cancel()
            await request  # raises the request's CancelledError: this task was never cancelled

        monkeypatch.setattr(faust_aiokafka.AIOKafkaConsumerThread, "on_thread_stop", aiokafka_stop)
        thread = object.__new__(BatchConsumerThread)
        thread._consumer = type("C", (), {"_fetcher": type("F", (), {"_pending_tasks": [request, other]})(),
                                          "_client": Client()})()
        await thread.on_thread_stop()  # before: CancelledError
        assert other.cancelled() and closed == ["client"]

        # the thread's own cancellation still cancels it
        async def slow_stop(self: Any) -> None:
            await asyncio.sleep(60)

        monkeypatch.setattr(faust_aiokafka.AIOKafkaConsumerThread, "on_thread_stop", slow_stop)
        task = asyncio.ensure_future(thread.on_thread_stop())
        await asyncio.sleep(0.01)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task

    asyncio.run(main())


def test_stopping_without_a_broker_gives_up_the_unsent_output_through_aiokafka_s_own_expiry(
        caplog: pytest.LogCaptureFixture) -> None:
    """faust's flush as it stops waited for every unsent batch (its request timeout: 20 minutes): each is made
    expired, so aiokafka fails it at its next attempt, and those failures nobody awaits are not warnings."""
    import collections

    from aiokafka.errors import KafkaConnectionError
    from whywait.engine.stream import app as engine_app

    class Batch:
        _ttl = 1200.0

    queued, in_flight = Batch(), Batch()
    acc = type("A", (), {"_batches": {"tp": collections.deque([queued])}, "_pending_batches": {in_flight}})()
    faust_app = type("App", (), {"_producer": type("P", (), {"_producer": type("K", (), {
        "_message_accumulator": acc})()})()})()
    loop = asyncio.new_event_loop()
    try:
        assert engine_app.drop_unsent(faust_app) == 2
        assert queued._ttl < 0 and in_flight._ttl < 0
        with caplog.at_level(logging.DEBUG, logger="whywait.engine.stream.app"):
            engine_app.kafka_errors_in_one_line(loop, {"exception": KafkaConnectionError("gone")})
        assert [r.levelname for r in caplog.records if "gone" in r.getMessage()] == ["DEBUG"]
        assert engine_app.drop_unsent(type("App", (), {})()) == 0  # no producer yet: nothing to give up
    finally:
        engine_app._GAVE_UP.clear()
        loop.close()


# ---------------------------------------------------------------------------------------------- a real broker


def _get(url: str) -> tuple[int, str]:
    try:
        with urllib.request.urlopen(url, timeout=5) as r:
            return r.status, r.read().decode()
    except urllib.error.HTTPError as e:
        return e.code, e.read().decode()


def _broker_up(metrics_url: str) -> float | None:
    m = re.search(r"^whywait_engine_broker_up (\S+)$", _get(metrics_url)[1], re.M)
    return float(m.group(1)) if m else None


def _events(metrics_url: str) -> float:
    return sum(float(v) for v in re.findall(r"^whywait_engine_events_total\{[^}]*\} (\S+)$",
                                            _get(metrics_url)[1], re.M))


@pytest.mark.integration
def test_an_engine_says_its_broker_went_and_came_back_and_stops_cleanly_while_it_is_gone(tmp_path: Path) -> None:
    from whywait.engine.localkafka import broker as lb
    from whywait.simulate.cluster import make_cluster, make_job
    from whywait.simulate.sim import Simulation
    from whywait.topology.model import Topology

    from tests.support.kafka import publish_messages, wait_for

    if not lb.jars_fetched():
        pytest.skip("no Kafka jars for a private broker")
    data = tmp_path / "kafka"
    b = lb.LocalBroker(detached=False)
    bootstrap = b.start(data_dir=data)
    port = b.port
    topo = make_cluster(nodes=4)
    Topology.from_dict(topo.to_dict()).to_yaml(tmp_path / "topology.yaml")
    start = float(int(time.time()) - 600)
    msgs = list(Simulation(topo, [make_job(topo, job="outage")], [], start_time=start, duration_s=20,
                           seed=1).messages())
    metrics_port = lb.free_port()
    url = f"http://127.0.0.1:{metrics_port}"
    env = {k: v for k, v in os.environ.items() if not k.startswith(("SLACK", "WHYWAIT_"))}
    env.update(WHYWAIT_KAFKA_BOOTSTRAP=bootstrap, PYTHONUNBUFFERED="1")
    log = tmp_path / "engine.log"
    engine = subprocess.Popen(
        [sys.executable, "-m", "whywait", "engine", "--topology", str(tmp_path / "topology.yaml"), "--group",
         "outage", "--latest", "--metrics-addr", f"127.0.0.1:{metrics_port}"],
        stdout=log.open("w"), stderr=subprocess.STDOUT, cwd=REPO, env=env)

    def text() -> str:
        return log.read_text()

    try:
        assert wait_for(lambda: "engine: consuming" in text(), 60), text()
        assert _broker_up(url + "/metrics") == 1

        b.stop()
        gone = time.monotonic()
        assert wait_for(lambda: "unreachable since" in text(), 25), text()
        said_after = time.monotonic() - gone
        assert said_after < 16, f"said {said_after:.1f}s after the broker stopped"
        line = next(ln for ln in text().splitlines() if "unreachable since" in ln)
        assert " WARNING " in line and f"broker {bootstrap} unreachable since " in line
        assert "retrying; no events are being evaluated" in line
        assert _broker_up(url + "/metrics") == 0
        status, body = _get(url + "/readyz")
        assert status == 503 and f"broker {bootstrap} unreachable since" in body, body
        assert _get(url + "/healthz")[0] == 200  # alive: it resumes by itself, a restart would not help

        b = lb.LocalBroker(detached=False)
        b.start(port=port, data_dir=data)
        assert wait_for(lambda: "back after" in text(), 20), text()
        assert re.search(rf"INFO .*broker {re.escape(bootstrap)} back after \S+.*; resuming from committed offsets",
                         text()), text()
        assert _broker_up(url + "/metrics") == 1
        assert wait_for(lambda: _get(url + "/readyz")[0] == 200, 20), _get(url + "/readyz")
        before = _events(url + "/metrics")
        asyncio.run(publish_messages(bootstrap, msgs))
        assert wait_for(lambda: _events(url + "/metrics") >= before + len(msgs), 30), \
            (before, _events(url + "/metrics"), text()[-3000:])

        b.stop()  # gone again, and the engine is stopped while it is
        assert wait_for(lambda: text().count("unreachable since") >= 2, 25), text()
        engine.send_signal(signal.SIGTERM)
        stopping = time.monotonic()
        assert engine.wait(20) == 0
        took = time.monotonic() - stopping
    finally:
        if engine.poll() is None:
            engine.kill()
            engine.wait()
        b.stop()
    out = text()
    tail = out[out.rindex("unreachable since"):]
    assert took < 6, f"stopping took {took:.1f}s:\n{tail}"
    for noise in ("Error while stopping child", "stopped on CancelledError", "TimeoutError", "Traceback"):
        assert noise not in tail, tail
    assert [ln for ln in tail.splitlines()[1:] if " WARNING " in ln or " ERROR " in ln] == [
        next(ln for ln in tail.splitlines() if "engine: stopping with broker" in ln)], tail
