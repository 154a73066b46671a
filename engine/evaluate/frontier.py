"""How far one input has come in event time, robust to the few producers whose clocks are wrong.

Called by the evaluator for every periodic message (:meth:`InputFrontier.note`); the evaluator's
watermark reads :attr:`InputFrontier.value`.  Pure: no I/O, no wall clock.

Why not the newest event time of the input (what the watermark used before): event time is stamped by
each node's clock, so a single node whose clock ran 30 s ahead moved the whole input 30 s ahead.  Every
tick then ran before the other nodes' data for that second had come; their points landed behind the
evaluation clock, and a NIC losing packets on another node was not found at all (a +120 s clock also
fired a false ``checkpoint.stalled``).  A clock that is off is a node's fault and must stay that node's
problem (``job.node-clock-skew`` names it).

So an input has come as far as *most* of its producers have: the lower median of their newest event
times, over the producers that are still sending.  Fewer than half the producers ahead cannot move it,
and fewer than half behind (a node that died, a collector that stopped) cannot hold it.  With one or two
producers nothing can tell a wrong clock from a right one; the lower median is then the older of the
two, so a clock that is off delays evaluation instead of blinding it.

"Still sending" is measured in the input's own messages, not in event time (which the ahead node moves)
nor in wall time (replays and rule tests have none): a producer is idle once the input has carried
``idle_rounds`` messages per producer without one of its own, about ``idle_rounds`` intervals.

Cost: a message is two dict writes and a comparison.  The median itself is recomputed only when enough
producers have passed the last one by ``step_s`` for it to move (about once per input per second on a
live stream), or every second round of messages (so producers that went idle leave it).
"""

from __future__ import annotations

import bisect
import math


class InputFrontier:
    """The robust progress of one input kind (``value``), fed every message's producer and event time."""

    __slots__ = ("idle_rounds", "step_s", "newest", "heard", "raw", "value", "seq",
                 "_above", "_need", "_seq_at", "max_producers")

    def __init__(self, idle_rounds: int = 20, step_s: float = 0.25, max_producers: int = 100_000) -> None:
        self.idle_rounds = idle_rounds
        # The median is recomputed once it can have moved by this much; finer only costs time (the
        # evaluator ticks on whole seconds).  Stamps on whole seconds move it exactly.
        self.step_s = step_s
        self.max_producers = max_producers
        self.newest: dict[str, float] = {}  # producer -> newest event time it sent
        self.heard: dict[str, int] = {}  # producer -> ``seq`` of its last message
        self.raw = -math.inf  # the newest event time of any producer (what a single clock can move)
        self.value = -math.inf  # the robust frontier
        self.seq = 0  # messages of this input so far
        self._above = 0  # producers whose newest is past ``value + step_s``
        self._need = 1  # how many must be, for the median to have moved past it
        self._seq_at = 0  # ``seq`` at the last recomputation

    def note(self, producer: str, t: float) -> float:
        """Record one message of ``producer`` stamped ``t``; return the frontier after it."""
        self.seq += 1
        old = self.newest.get(producer)
        joined = False
        if old is None or t > old:
            if old is None:
                if len(self.newest) >= self.max_producers:
                    self._forget_idle()
                # A producer that joins behind the frontier can lower the median (the first message
                # of a start-up may come from the one node that is ahead).
                joined = t < self.value
            self.newest[producer] = t
            bar = self.value + self.step_s
            if t > bar and (old is None or old <= bar):
                self._above += 1
            if t > self.raw:
                self.raw = t
        self.heard[producer] = self.seq
        if joined or self._above >= self._need or self.seq - self._seq_at >= 2 * len(self.newest):
            self._recompute()
        return self.value

    def _active(self) -> list[float]:
        cut = self.seq - self.idle_rounds * len(self.newest)
        heard = self.heard
        return [t for p, t in self.newest.items() if heard[p] > cut]

    def _recompute(self) -> None:
        vals = self._active()
        vals.sort()
        n = len(vals)
        self._seq_at = self.seq
        if not n:
            return
        m = (n - 1) // 2  # the lower median: of two producers, the older
        # It may move back (a producer joined behind it): the evaluator's ticks never do, so that only
        # delays the next one.
        self.value = vals[m]
        bar = self.value + self.step_s
        self._above = n - bisect.bisect_right(vals, bar)
        # Once this many active producers are past ``bar``, so is the median (its index is m).
        self._need = n - m

    def _forget_idle(self) -> None:
        """Bound the producer table (a flood of invented node names): drop the idle producers, or the oldest."""
        cut = self.seq - self.idle_rounds * len(self.newest)
        idle = [p for p, s in self.heard.items() if s <= cut] or [min(self.heard, key=self.heard.__getitem__)]
        for p in idle:
            del self.newest[p], self.heard[p]
        self._recompute()
