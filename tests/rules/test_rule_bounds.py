"""Every duration and step count a rule can hold is bounded, and the evaluator cannot spin on an absurd one.

A site rule copied with ``for: 10000000000000d`` passed ``rules check``; ``rules test`` then ran its cases out
to 8.6e17 s of event time, where adding a 1 s tick no longer moves a float clock, and spun forever.
"""

from __future__ import annotations

import signal
from collections.abc import Iterator
from contextlib import contextmanager

import pytest
from whywait.engine.evaluate.evaluator import Evaluator
from whywait.engine.rules.loader import RuleSet

T0 = 1_800_000_000.0


class Hung(BaseException):
    """Raised by :func:`deadline`: a BaseException, so the evaluator's per-tick ``except Exception`` cannot eat it."""


@contextmanager
def deadline(seconds: int) -> Iterator[None]:
    """Fail (rather than hang the suite) when the body runs longer than ``seconds``."""
    def expired(*_: object) -> None:
        raise Hung(f"still running after {seconds}s")

    old = signal.signal(signal.SIGALRM, expired)
    signal.alarm(seconds)
    try:
        yield
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, old)


# ---- defence in depth: the evaluator's tick loop ---------------------------------------------------------------


@pytest.mark.parametrize("watermark", [T0 + 864_000_000_000_000_000.0, 2.0 ** 60])
def test_advance_to_an_absurd_watermark_returns(watermark: float) -> None:
    """Past 2**53 s a tick no longer moves the clock: the loop stops instead of ticking the same second forever."""
    ev = Evaluator(RuleSet(), None)
    ev.next_tick = T0 if watermark > T0 else watermark - 10
    with deadline(20):
        assert ev.advance(watermark) == []
    assert ev.next_tick is not None and ev.next_tick <= watermark
