"""Counters to per-interval rates: wrap-around, resets and saturated counters.

Every collector reads cumulative counters (bytes, packets, errors, retransmits)
and the event contract carries per-interval rates, so the agent keeps the
previous reading of each counter and turns the pair into a rate.  Three things
go wrong with real hardware counters and are handled here, never producing a
negative or absurd rate:

* **wrap-around**: a fixed-width counter (32 or 64 bits) passes its maximum and
  starts again from zero.  A decrease from the upper half of the range to the
  lower half is taken as one wrap (``delta = cur + 2**width - prev``).
* **reset**: a driver reload or NIC reset sets the counter back to zero.  Any
  other decrease is a reset; the rate is taken from zero (``delta = cur``).
* **saturation**: InfiniBand's PMA error counters do not wrap, they stick at
  their maximum (``0xFF``, ``0xFFFF`` or ``0xFFFFFFFF`` depending on the
  counter).  A saturating counter at its maximum is reported as ``saturated``
  with no rate, until someone clears it.

A rate above ``max_rate`` (when given) is reported as ``absurd`` with no rate:
better a gap than a spike that fires an alert.

A reading no ``width``-bit counter can hold (negative, or ``2**width`` and more: a damaged file's
``-1`` or ``2**70``, a library's garbage) is ``absurd`` too, and is not remembered: the next good
reading is measured against the last good one, not against the garbage.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Hashable

# Flags a Delta can carry; "" means an ordinary reading.
FIRST = "first"  # no previous reading: no rate yet
WRAP = "wrap"
RESET = "reset"
SATURATED = "saturated"
ABSURD = "absurd"


@dataclass(frozen=True, slots=True)
class Delta:
    """The change of one counter over one interval.

    ``delta`` is the increase (never negative) and ``per_s`` the rate, both
    None when no trustworthy figure exists (``flag`` says why: first reading,
    saturated, absurd).  ``flag`` is "" for an ordinary reading.
    """

    delta: int | None
    per_s: float | None
    flag: str = ""

    @property
    def ok(self) -> bool:
        return self.delta is not None


def counter_delta(prev: int, cur: int, width: int = 64, saturating: bool = False) -> tuple[int | None, str]:
    """Return ``(increase, flag)`` between two readings of a ``width``-bit counter.

    Called by :class:`RateTracker`; pure so that the edge cases are tested alone.
    """
    top = (1 << width) - 1
    if saturating and cur >= top:
        return None, SATURATED
    if cur >= prev:
        return cur - prev, ""
    half = 1 << (width - 1)
    if not saturating and prev >= half and cur < half and prev <= top:
        return cur + (top + 1) - prev, WRAP
    return cur, RESET


class RateTracker:
    """Remembers the last reading of each counter and returns rates.

    One tracker per collector; keys are whatever identifies a counter
    (``("eth0", "rx_bytes")``).  ``forget_missing`` drops counters that were not
    read in the last round (an unplugged NIC) so the tracker does not grow.
    """

    def __init__(self) -> None:
        self._prev: dict[Hashable, tuple[int, float]] = {}
        self._seen: set[Hashable] = set()

    def update(self, key: Hashable, value: int, t: float, *, width: int = 64, saturating: bool = False,
               max_rate: float | None = None) -> Delta:
        """Record ``value`` read at monotonic time ``t`` and return the change since the last reading."""
        self._seen.add(key)
        if not isinstance(value, int) or isinstance(value, bool) or not 0 <= value < (1 << width):
            return Delta(None, None, ABSURD)  # no counter holds it: keep the last good reading
        prev = self._prev.get(key)
        self._prev[key] = (value, t)
        if saturating and value >= (1 << width) - 1:
            return Delta(None, None, SATURATED)
        if prev is None:
            return Delta(None, None, FIRST)
        pv, pt = prev
        dt = t - pt
        if dt <= 0:
            return Delta(None, None, FIRST)
        d, flag = counter_delta(pv, value, width, saturating)
        if d is None:
            return Delta(None, None, flag)
        rate = d / dt
        if max_rate is not None and rate > max_rate:
            return Delta(None, None, ABSURD)
        return Delta(d, rate, flag)

    def forget_missing(self) -> None:
        """Drop counters not updated since the previous call (called once per round)."""
        for key in [k for k in self._prev if k not in self._seen]:
            del self._prev[key]
        self._seen = set()

    def __len__(self) -> int:
        return len(self._prev)
