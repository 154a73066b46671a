"""Event-time alignment of input partitions (engine/stream/alignment.py): the pure policy."""

from __future__ import annotations

import random

from whywait.engine.stream.alignment import align

S = 1000  # ms


def test_a_partition_far_ahead_of_the_slowest_behind_is_paused() -> None:
    newest = {"host": 300 * S, "storage": 280 * S, "steps": 20 * S, "gpu": 40 * S}
    pause, resume = align(newest, behind=set(newest), paused=set(), ahead_s=30)
    assert pause == {"host", "storage"}  # gpu is 20 s ahead of steps: within the 30 s
    assert resume == set()


def test_the_slowest_partition_behind_is_never_paused_and_caught_up_ones_hold_nobody_back() -> None:
    newest = {"a": 500 * S, "b": 10 * S}
    # b has nothing unread (a quiet topic, or a live engine caught up on it): a is not held back by it
    assert align(newest, behind={"a"}, paused=set(), ahead_s=30) == (set(), set())
    pause, _ = align(newest, behind={"a", "b"}, paused=set(), ahead_s=30)
    assert pause == {"a"} and "b" not in pause


def test_a_paused_partition_resumes_once_the_slowest_is_within_half_the_limit() -> None:
    newest = {"fast": 100 * S, "slow": 60 * S}
    # 40 s ahead: still past half of 30 s, stays paused (hysteresis, no pause/resume on every fetch)
    assert align(newest, {"fast", "slow"}, paused={"fast"}, ahead_s=30) == (set(), set())
    newest["slow"] = 86 * S  # 14 s behind: within 15 s
    assert align(newest, {"fast", "slow"}, paused={"fast"}, ahead_s=30) == (set(), {"fast"})


def test_nothing_behind_or_alignment_off_resumes_everything() -> None:
    newest = {"a": 500 * S, "b": 10 * S}
    assert align(newest, behind=set(), paused={"a"}, ahead_s=30) == (set(), {"a"})
    assert align(newest, behind={"a", "b"}, paused={"a"}, ahead_s=0) == (set(), {"a"})
    # a partition not read yet says nothing about time: it neither holds others nor is paused
    assert align({"a": 500 * S}, behind={"a", "b"}, paused=set(), ahead_s=30) == (set(), set())


def test_simulated_backlog_stays_within_the_limit_and_always_progresses() -> None:
    """Topics of different message sizes read from a backlog in fixed-size fetches: without alignment
    the small-message topic runs hundreds of seconds ahead; with it the spread stays within the limit
    plus one fetch, every fetch reads something, and every topic reaches the end."""
    rng = random.Random(7)
    # seconds of event time one fetch of each topic covers (1 MB / message size / messages per second)
    per_fetch = {"host": 12.0, "storage": 8.0, "gpu": 2.0, "steps": 1.5}
    end = 900.0

    def run(ahead_s: float) -> tuple[float, int]:
        pos = dict.fromkeys(per_fetch, 0.0)
        paused: set[str] = set()
        worst, fetches = 0.0, 0
        while any(p < end for p in pos.values()):
            fetches += 1
            read = [t for t in per_fetch if t not in paused and pos[t] < end]
            assert read, "a fetch with every unfinished partition paused: no progress"
            for t in read:
                pos[t] = min(end, pos[t] + per_fetch[t] * rng.uniform(0.8, 1.2))
            behind = {t for t in pos if pos[t] < end}
            newest = {t: int(p * S) for t, p in pos.items()}
            pause, resume = align(newest, behind, paused, ahead_s)
            paused = (paused | pause) - resume
            if behind:
                worst = max(worst, max(pos.values()) - min(pos[t] for t in behind))
        return worst, fetches

    free, _ = run(0)
    aligned, fetches = run(30)
    assert free > 300  # the problem: the host topic ran far ahead of steps
    assert aligned <= 30 + max(per_fetch.values()) * 1.2  # one fetch past the limit at most
    assert fetches < 2 * end / min(per_fetch.values())  # no stalls: about as many fetches as steps needs
