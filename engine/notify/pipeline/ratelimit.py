"""Client-side pacing: at most ``rate`` deliveries per second into each route of a receiver.

A receiver declares its pace (``Receiver.rate``; Slack allows about one message per
second per channel and answers 429 beyond it).  Keeping under the limit ourselves
means a burst of incidents is delivered at the allowed pace instead of bouncing off
429s; a receiver's ``retryable`` error with a retry-after stays as a safety net.
Pure (time is passed in), so the pipeline's sender can ask when the
next write into a channel may go without sleeping.
"""

from __future__ import annotations

import threading


class ChannelRateLimiter:
    """Spaces writes into one channel at least ``1/rate + margin`` seconds apart.

    ``margin`` absorbs the jitter between our clock and the moment the server sees
    the request, so the server never observes two messages within one interval.
    """

    def __init__(self, rate: float = 1.0, margin: float = 0.03) -> None:
        if rate <= 0:
            raise ValueError(f"rate must be > 0 (got {rate})")
        self.interval = 1.0 / rate + margin
        self._last: dict[str, float] = {}
        self._lock = threading.Lock()

    def ready_at(self, channel: str) -> float:
        """The earliest monotonic time a write into ``channel`` may start (0 when never written)."""
        with self._lock:
            last = self._last.get(channel)
        return 0.0 if last is None else last + self.interval

    def record(self, channel: str, now: float) -> None:
        """Note that a write into ``channel`` started at ``now`` (monotonic)."""
        with self._lock:
            self._last[channel] = max(now, self._last.get(channel, 0.0))
