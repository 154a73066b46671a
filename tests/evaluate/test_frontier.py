"""``InputFrontier`` and the watermark built on it: one producer's wrong clock cannot move event time.

Before it, an input's progress was its newest stamp: a node 30 s ahead took every tick 30 s ahead of
the other nodes' data (a NIC fault elsewhere went unseen; the rule-test cases beside
``network.straggler-retransmits`` and ``job.node-clock-skew`` show it end to end).
"""

from __future__ import annotations

import random

import pytest
from whywait.agents.events import envelope, validate
from whywait.engine.evaluate.evaluator import Evaluator
from whywait.engine.evaluate.frontier import InputFrontier
from whywait.engine.rules.loader import RuleSet
from whywait.simulate.cluster import make_cluster

T0 = 1_764_442_800.0


def lower_median(newest: dict[str, float]) -> float:
    vals = sorted(newest.values())
    return vals[(len(vals) - 1) // 2]


def test_whole_second_stamps_move_it_once_half_the_producers_passed() -> None:
    fr = InputFrontier()
    for n in range(8):
        fr.note(f"node-{n}", T0)
    assert fr.value == T0
    seen = []
    for n in range(8):
        seen.append(fr.note(f"node-{n}", T0 + 1))
    # the lower median of 8 is the 4th oldest: it moves with the 5th producer, not the 1st
    assert seen == [T0] * 4 + [T0 + 1] * 4


@pytest.mark.parametrize("ahead", [30.0, 120.0, 1e6])
def test_a_minority_of_producers_ahead_cannot_move_it(ahead: float) -> None:
    fr = InputFrontier()
    for s in range(60):
        for n in range(8):
            fr.note(f"node-{n}", T0 + s + (ahead if n in (2, 5, 6) else 0.0))
        assert fr.value == T0 + s
    assert fr.raw == T0 + 59 + ahead  # what a single clock moved


def test_of_two_producers_it_is_the_older() -> None:
    fr = InputFrontier()
    for s in range(10):
        fr.note("a", T0 + s + 30)
        fr.note("b", T0 + s)
    assert fr.value == T0 + 9


def test_producers_that_stop_stop_holding_it() -> None:
    fr = InputFrontier(idle_rounds=5)
    for s in range(10):
        for n in range(8):
            fr.note(f"node-{n}", T0 + s)
    # five of eight nodes die (a rack loses power): the three left carry the input on
    for s in range(10, 40):
        for n in range(3):
            fr.note(f"node-{n}", T0 + s)
    assert fr.value == T0 + 39


def test_stamps_at_their_own_phases_track_the_exact_median() -> None:
    rng = random.Random(7)
    phase = {f"node-{n}": rng.random() for n in range(50)}
    fr = InputFrontier()
    newest: dict[str, float] = {}
    for s in range(40):
        for node in sorted(phase, key=phase.__getitem__):  # each node sends at its own phase of the second
            t = T0 + s + phase[node] + rng.gauss(0, 0.01)
            newest[node] = max(newest.get(node, t), t)
            v = fr.note(node, t)
            exact = lower_median(newest)
            assert exact - fr.step_s <= v <= exact


def test_the_first_producer_heard_does_not_set_it() -> None:
    """At start-up the first message may be the ahead node's: the others, joining, bring it back."""
    fr = InputFrontier()
    fr.note("node-0", T0 + 30)
    for n in range(1, 8):
        fr.note(f"node-{n}", T0)
    assert fr.value == T0


def test_a_flood_of_invented_producers_stays_bounded() -> None:
    fr = InputFrontier(max_producers=100)
    for i in range(10_000):
        fr.note(f"fake-{i}", T0 + i * 1e-3)
    assert len(fr.newest) <= 100 and len(fr.heard) == len(fr.newest)


# ---- the evaluator's watermark -------------------------------------------------------------------


class Wall:
    """The live engine's arrival clock, moved by the test: one second (and one batch) per second sent."""

    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def feed(ev: Evaluator, seconds: int, nodes: int, ahead: dict[str, float], kinds: tuple[str, ...],
         start: int = 0) -> None:
    """Send every node's periodic messages for ``seconds`` seconds, stamped by each node's clock."""
    for s in range(start, start + seconds):
        if isinstance(ev.arrival_clock, Wall):
            ev.arrival_clock.now = float(s)
            ev.begin_batch()
        for n in range(nodes):
            node = f"node-{n + 1:02d}"
            t = T0 + s + ahead.get(node, 0.0)
            for kind in kinds:
                if kind == "host":
                    msg = envelope("host", node, t, cpu_busy_pct=20.0, cpu_iowait_pct=1.0,
                                   mem_used_bytes=1 << 30, mem_total_bytes=1 << 34)
                elif kind == "steps":
                    msg = envelope("steps", node, t, job="j", steps=[{"rank": n, "step": s + 1, "duration_s": 1.0}])
                ev.ingest(validate(msg))


@pytest.mark.parametrize("live", [False, True])
def test_one_node_ahead_does_not_move_the_watermark(live: bool) -> None:
    ev = Evaluator(RuleSet({}, ()), make_cluster(nodes=8, gpus_per_node=8), arrival_clock=Wall() if live else None)
    # host and steps only: live, the inputs never heard of go idle after ``idle_wall_s``
    feed(ev, 60, 8, {"node-03": 30.0}, ("host", "steps"))
    assert ev.watermark() == T0 + 59 - ev.lateness_s
    assert ev.next_tick is not None and ev.next_tick <= T0 + 58


def test_steps_reported_alone_still_make_time() -> None:
    """A steps-only stream (an imported profiler trace, a rule test of events): the steps carry time."""
    ev = Evaluator(RuleSet({}, ()), make_cluster(nodes=4, gpus_per_node=8))
    feed(ev, 30, 4, {}, ("steps",))
    assert ev.watermark() == T0 + 29 - ev.lateness_s


def test_steps_keep_time_when_every_node_collector_stops() -> None:
    """Offline, telemetry that stopped on every node is an idle input; the steps' own median carries time on."""
    ev = Evaluator(RuleSet({}, ()), make_cluster(nodes=4, gpus_per_node=8))
    feed(ev, 30, 4, {}, ("host", "steps"))
    for s in range(30, 200):
        for n in range(4):
            msg = envelope("steps", f"node-{n + 1:02d}", T0 + s, job="j",
                           steps=[{"rank": n, "step": s + 1, "duration_s": 1.0}])
            ev.ingest(validate(msg))
    assert ev.watermark() == T0 + 199 - ev.lateness_s


def test_one_steps_producer_far_ahead_does_not_move_the_watermark() -> None:
    """Its telemetry on time, its steps (its job's reporter) 300 s ahead: more than ``idle_s``, so
    with the newest steps as the measure every node's telemetry counted as stopped."""
    ev = Evaluator(RuleSet({}, ()), make_cluster(nodes=8, gpus_per_node=8))
    feed(ev, 60, 8, {}, ("host",))
    for n in range(8):
        t = T0 + 59 + (300.0 if n == 2 else 0.0)
        ev.ingest(validate(envelope("steps", f"node-{n + 1:02d}", t, job="j",
                                    steps=[{"rank": n, "step": 1, "duration_s": 1.0}])))
    assert ev.watermark() == T0 + 59 - ev.lateness_s
