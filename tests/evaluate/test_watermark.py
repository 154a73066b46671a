"""The live watermark on a backlog: topics arriving minutes apart in event time must not lose windows."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from whywait.engine.evaluate.evaluator import Evaluator
from whywait.engine.rules.loader import load_rules
from whywait.simulate.cluster import make_cluster, make_job
from whywait.simulate.faults import make_fault
from whywait.simulate.sim import Simulation
from whywait.topology.model import Topology

RULES = Path(__file__).resolve().parents[2] / "rules"
START = 1_764_442_800.0


class FakeClock:
    def __init__(self) -> None:
        self.t = 0.0

    def __call__(self) -> float:
        return self.t


def messages() -> tuple[Topology, list[dict[str, Any]]]:
    topo = make_cluster(nodes=8)
    infra = Topology.from_dict(topo.to_dict())
    sim = Simulation(topo, [make_job(topo)], [make_fault("nic-packet-loss", "node-03", 120, 220)],
                     start_time=START, duration_s=260, seed=2)
    return infra, [m for _, m in sim.messages()]


def first_firing(ev: Evaluator, batches: list[list[dict[str, Any]]], pending: list[set[str]],
                 clock: FakeClock) -> float | None:
    for batch, pend in zip(batches, pending, strict=True):
        ev.begin_batch()
        clock.t += 1.0  # one wall second per batch: longer than the idle limit over the whole backlog
        for m in batch:
            for d in ev.ingest(m):
                if d.status == "firing":
                    return d.detected_at - START
        ev.set_pending(pend)
    return None


def test_backlog_one_topic_at_a_time_still_detects_on_time() -> None:
    topo, msgs = messages()
    # The consumer drains each topic's backlog in turn, 500 messages a batch: host first, then the rest.
    order = ["placement", "host", "gpu", "storage", "steps", "net", "checkpoint", "hw"]
    ordered = sorted(msgs, key=lambda m: (order.index(m["kind"]), m["time"]))
    batches = [ordered[i:i + 500] for i in range(0, len(ordered), 500)]
    # after each batch, the kinds not yet fully read are pending
    seen = 0
    pending = []
    for b in batches:
        seen += len(b)
        pending.append({m["kind"] for m in ordered[seen:]})
    clock = FakeClock()
    ev = Evaluator(load_rules([RULES]), topo, arrival_clock=clock, idle_wall_s=10.0)
    assert first_firing(ev, batches, pending, clock) == 128.0


def test_without_lag_information_the_start_up_hold_still_waits_for_every_input() -> None:
    topo, msgs = messages()
    clock = FakeClock()
    ev = Evaluator(load_rules([RULES]), topo, arrival_clock=clock)
    # only host messages so far, in one batch: no tick may run yet
    ev.begin_batch()
    for m in [m for m in msgs if m["kind"] in ("placement", "host")][:400]:
        assert ev.ingest(m) == []
    assert ev.ticks == 0


def test_unread_placements_hold_time() -> None:
    topo, msgs = messages()
    clock = FakeClock()
    ev = Evaluator(load_rules([RULES]), topo, arrival_clock=clock)
    telemetry = [m for m in msgs if m["kind"] != "placement"]
    ev.begin_batch()
    ev.set_pending({"placement"})  # the consumer has not reached the placement partition yet
    for m in telemetry[:3000]:
        ev.ingest(m)
    assert ev.ticks == 0
    firing = []
    ev.set_pending(set())
    for m in [msgs[0]] + telemetry[3000:]:  # the placement arrives, late, with the rest
        firing += [d for d in ev.ingest(m) if d.status == "firing"]
    assert firing and firing[0].detected_at - START == 128.0


def test_time_starts_at_the_earliest_message_not_the_first_delivered() -> None:
    topo, msgs = messages()
    clock = FakeClock()
    ev = Evaluator(load_rules([RULES]), topo, arrival_clock=clock)
    late_first = [m for m in msgs if m["kind"] == "checkpoint"][:1]  # a save at +150 s, delivered first
    assert late_first and late_first[0]["time"] - START > 100
    ev.begin_batch()
    firing = []
    for m in late_first + [m for m in msgs if m is not late_first[0]]:
        firing += [d for d in ev.ingest(m) if d.status == "firing"]
    assert firing and firing[0].detected_at - START == 128.0
