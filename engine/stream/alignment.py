"""Event-time alignment of the input partitions: read no partition far ahead of the slowest one behind.

Why: on a backlog (an engine restarted after minutes down, or one slower than its inputs for a while),
the consumer fetches up to ``consumer_max_fetch_size`` bytes per partition per fetch.  A topic of small
messages (host, storage: a few hundred bytes) then moves through event time several times faster
than one of large ones (GPUs, steps: kilobytes).  The evaluator ticks at the slowest input's time
(its watermark), so everything the fast topics bring ahead of it waits in the store's staging until
the clock gets there.  Measured with 1,280 nodes read behind the feed: host, storage and hw ran
280 s ahead of steps and the engine's RSS grew by about 3.7 MB per event second, past 1.5 GB, with no
bound but the store's hard staging limit (whose overrun then applies points before their ticks).

This is Flink's watermark alignment (FLIP-182) and Kafka Streams' timestamp-ordered choice between a
task's partitions, done with the consumer's own flow control: a partition whose newest record is
more than ``ahead_s`` past the slowest partition that still has unread records is paused (faust then
takes nothing of it from the fetcher, and aiokafka fetches at most one more slice of it), and resumed
once that partition is within half of ``ahead_s`` (hysteresis: no pause and resume on every fetch).
The slowest partition behind is never paused, so reading always progresses; a partition with nothing
unread holds nobody back (a topic that went quiet, or a live engine that is caught up).

Event time here is the Kafka record's timestamp: the agents' send time (CreateTime), which is the
sample's time give or take the send delay, or the time the producer set (the bench and ``whywait
import`` set the event's own).  It only decides what to read first; the evaluator still orders by
the event time in each message.

This module is pure (no faust, no Kafka): :class:`BatchConsumer` calls :func:`align` after each fetch.
"""

from __future__ import annotations

from typing import AbstractSet, Hashable, Mapping, TypeVar

P = TypeVar("P", bound=Hashable)


def align(newest: Mapping[P, int], behind: AbstractSet[P], paused: AbstractSet[P], ahead_s: float
          ) -> tuple[set[P], set[P]]:
    """Which partitions to pause and which to resume, after a fetch.

    ``newest``: per partition, the timestamp (ms) of the newest record read from it; ``behind``: the
    partitions that still have unread records; ``paused``: those this policy paused and has not
    resumed.  ``ahead_s`` <= 0 turns alignment off (everything paused is resumed).  Returns
    ``(pause, resume)``, disjoint, ``pause`` never holding a partition already paused.
    """
    if ahead_s <= 0:
        return set(), set(paused)
    known = [newest[p] for p in behind if p in newest]
    if not known:  # nothing unread (caught up), or nothing read yet of what is: hold nobody back
        return set(), set(paused)
    floor = min(known)
    limit = floor + ahead_s * 1000.0
    pause = {p for p, ts in newest.items() if ts > limit and p not in paused}
    resume = {p for p in paused if p not in newest or newest[p] <= floor + ahead_s * 500.0}
    return pause, resume
