"""The engine's loop exception handler: an aiokafka error nobody awaited is one line, not a traceback."""

from __future__ import annotations

import asyncio
import gc
import logging
from typing import Any

import pytest
from aiokafka.errors import KafkaConnectionError
from whywait.engine.stream.app import kafka_errors_in_one_line


async def _commit_offsets() -> None:  # what aiokafka's commit task does when the broker went first
    raise KafkaConnectionError("Connection at 127.0.0.1:9092 closed")


async def _bug() -> None:
    raise ValueError("a real bug")


def _unretrieved(coro_fn) -> None:  # type: ignore[no-untyped-def]
    async def main() -> None:
        asyncio.get_running_loop().set_exception_handler(kafka_errors_in_one_line)
        t = asyncio.ensure_future(coro_fn())
        await asyncio.sleep(0.01)
        del t
        gc.collect()  # the task is dropped unretrieved: asyncio reports it to the handler now

    asyncio.run(main())


def test_an_unretrieved_kafka_error_is_one_warning_line(caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.DEBUG):
        _unretrieved(_commit_offsets)
    got = [r for r in caplog.records if "Connection at 127.0.0.1:9092 closed" in r.getMessage()]
    assert len(got) == 1 and got[0].levelno == logging.WARNING, [r.getMessage() for r in caplog.records]
    assert "_commit_offsets" in got[0].getMessage()
    assert got[0].exc_info is None and "Traceback" not in caplog.text
    assert "never retrieved" not in caplog.text


def test_any_other_unretrieved_error_keeps_its_traceback(caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.DEBUG):
        _unretrieved(_bug)
    got = [r for r in caplog.records if "never retrieved" in r.getMessage()]
    assert len(got) == 1 and got[0].levelno == logging.ERROR and got[0].exc_info is not None


def test_a_faust_thread_dying_on_a_cancelled_fetch_is_one_line(caplog: pytest.LogCaptureFixture) -> None:
    import threading

    from whywait.engine.stream import app

    def fetch_cancelled() -> None:  # faust's consumer thread, its fetcher cancelled as the broker went
        raise asyncio.CancelledError()

    def bug() -> None:
        raise ValueError("a real bug")

    old = threading.excepthook
    seen: list[Any] = []
    app._DEFAULT_THREAD_EXCEPTHOOK = seen.append  # type: ignore[assignment]  # what the default hook gets
    try:
        threading.excepthook = app._thread_excepthook
        with caplog.at_level(logging.DEBUG):
            for target in (fetch_cancelled, bug):
                t = threading.Thread(target=target, name=target.__name__)
                t.start()
                t.join()
    finally:
        threading.excepthook = old
        app._DEFAULT_THREAD_EXCEPTHOOK = old
    lines = [r.getMessage() for r in caplog.records]
    assert lines == ["Kafka: faust's fetch_cancelled stopped on CancelledError (the broker went before it did)"]
    assert [a.exc_type for a in seen] == [ValueError]  # anything else: the default hook, traceback and all


def test_mode_s_stop_timeouts_are_one_warning_line() -> None:
    from whywait.engine.stream.app import _OneLineStopErrors

    def record(name: str, exc: BaseException) -> logging.LogRecord:
        try:
            raise exc
        except BaseException:
            import sys

            return logging.LogRecord(name, logging.ERROR, __file__, 1, "Error while stopping child %s", ("x",),
                                     sys.exc_info())

    f = _OneLineStopErrors()
    r = record("faust.transport.drivers.aiokafka", asyncio.TimeoutError())
    assert f.filter(r) and r.exc_info is None and r.levelname == "WARNING"
    assert r.getMessage() == "Error while stopping child x (TimeoutError)"
    mine = record("whywait.engine", asyncio.TimeoutError())  # whywait's own records keep their traceback
    assert f.filter(mine) and mine.exc_info is not None and mine.levelname == "ERROR"
    other = record("mode.services", ValueError("a bug"))
    assert f.filter(other) and other.exc_info is not None
    # whywait's own faust consumer is a mode service logging under its module: it printed the traceback
    ours = record("whywait.engine.stream.batches", asyncio.TimeoutError())
    assert f.filter(ours) and ours.exc_info is None and ours.levelname == "WARNING"
    assert ours.getMessage() == "Error while stopping child x (TimeoutError)"


def test_an_unclosed_aiokafka_client_at_stop_is_one_warning_line(caplog: pytest.LogCaptureFixture) -> None:
    # What aiokafka's __del__ reports when its thread ended first: an ERROR of two lines (the repr on the second).
    loop = asyncio.new_event_loop()
    try:
        with caplog.at_level(logging.DEBUG):
            kafka_errors_in_one_line(loop, {"message": "Unclosed AIOKafkaConsumer", "consumer": object()})
            kafka_errors_in_one_line(loop, {"message": "Unclosed something else"})
    finally:
        loop.close()
    got = [(r.levelname, r.getMessage()) for r in caplog.records]
    assert got[0] == ("WARNING", "Kafka: an unclosed AIOKafkaConsumer, dropped as the engine stopped "
                                 "(its thread ended before closing it)"), got
    assert got[1][0] == "ERROR" and got[1][1].startswith("Unclosed something else")  # the default handler


def test_the_consumer_thread_is_waited_for_a_bounded_time() -> None:
    from faust.transport.drivers.aiokafka import AIOKafkaConsumerThread
    from whywait.engine.stream.app import EngineConfig, bound_consumer_thread_stop

    old = AIOKafkaConsumerThread.shutdown_timeout
    try:
        bound_consumer_thread_stop(EngineConfig(bootstrap="x").thread_stop_s)
        # under Kubernetes' default 30 s grace with the checkpoint's own bound (mode's default was 60 s)
        assert AIOKafkaConsumerThread.shutdown_timeout + EngineConfig(bootstrap="x").drain_timeout_s < 30
    finally:
        AIOKafkaConsumerThread.shutdown_timeout = old
