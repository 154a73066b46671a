"""An idle notifier sleeps: its scheduler and sender threads must not wake each other for ever.

Found with py-spy on a partitioned engine at 95% CPU before it had any partition: the sender notified the
condition on every idle wake-up, which woke the scheduler, whose own notify woke the sender again. Every
``whywait engine`` burnt up to a core in its notifier. Counted, not timed: the scheduler reads the clock once
per pass, so the passes of an idle second are counted through the clock it is given.
"""

from __future__ import annotations

import io
import threading
import time

from whywait.engine.notify.pipeline.core import Pipeline
from whywait.engine.notify.receivers.console import ConsoleReceiver
from whywait.engine.notify.receivers.webhook import WebhookReceiver


def test_an_idle_pipeline_does_not_spin() -> None:
    calls = [0]
    lock = threading.Lock()

    def clock() -> float:
        with lock:
            calls[0] += 1
        return time.time()

    # Two lanes: each sender used to bounce off the scheduler (and off each other).
    p = Pipeline([ConsoleReceiver(io.StringIO()), WebhookReceiver("http://127.0.0.1:9/never-called")], clock=clock)
    try:
        time.sleep(0.5)  # started and settled
        with lock:
            before = calls[0]
        time.sleep(2.0)
        with lock:
            passes = calls[0] - before
    finally:
        p.close(1.0)
    # About one scheduler pass a second when idle; the ping-pong made tens of thousands.
    assert passes <= 20, passes
