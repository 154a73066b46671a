"""The BMC read at once when the node slows down (issue 14): SlowdownWatch, BmcSource.request, Agent.watch_bmc.

A failed fan shows in the BMC up to one poll (30 s) after the node's GPUs clock down; the engine would name
an unknown-cause straggler first.  These tests drive the real classes with a fetch function standing in
for the BMC's HTTP answer (the Redfish parsing itself is tested against a real emulator in test_hardware).
"""

from __future__ import annotations

import threading
import time
from typing import Any

from whywait.agents.agent import Agent
from whywait.agents.collectors.bmc import BmcSource, SlowdownWatch
from whywait.agents.events import envelope
from whywait.agents.publisher import MemoryPublisher


def _gpu(clock: float, reasons: list[str] | None = None) -> dict[str, Any]:
    return {"gpu": 0, "sm_clock_mhz": clock, "sm_clock_max_mhz": 1980.0, "throttle_reasons": reasons or []}


def _steps(step: int, work: dict[int, float]) -> list[dict[str, Any]]:
    return [{"rank": r, "step": step, "duration_s": 1.0, "compute_s": w, "data_wait_s": 0.02} for r, w in work.items()]


def test_gpu_clocks_below_their_maximum_or_a_slowdown_reason_ask_for_a_read() -> None:
    w = SlowdownWatch()
    assert w.gpus([_gpu(1980.0), _gpu(1965.0)]) is None  # boost wobble
    assert w.gpus([_gpu(345.0, ["gpu_idle"])]) is None  # an idle GPU clocks down by design
    assert w.gpus([_gpu(1980.0, ["sw_power_cap"])]) is None  # a busy GPU at its power limit is no news
    assert "1822 of 1980" in (w.gpus([_gpu(1822.0)]) or "")
    assert "hw_power_brake_slowdown" in (w.gpus([_gpu(1980.0, ["hw_power_brake_slowdown"])]) or "")


def test_the_node_s_ranks_slowing_against_their_own_past_ask_for_a_read_one_rank_does_not() -> None:
    w = SlowdownWatch()
    step = 0
    for _ in range(15):  # a healthy past with 2% wobble
        step += 1
        assert w.steps("train", _steps(step, {r: 0.5 * (1 + 0.02 * ((step + r) % 3 - 1)) for r in range(8)})) is None
    for _ in range(3):  # one rank straggles: a GPU of its own, whose report says why; not the BMC's business
        step += 1
        assert w.steps("train", _steps(step, {r: 0.8 if r == 3 else 0.5 for r in range(8)})) is None
    why = None
    for _ in range(3):  # every rank of the node 12% slower: cooling or power
        step += 1
        why = w.steps("train", _steps(step, {r: 0.56 for r in range(8)})) or why
    assert why is not None and "train" in why and "1.12x" in why


def test_request_reads_at_once_and_at_most_once_per_gap() -> None:
    polled = threading.Event()
    calls: list[float] = []

    def fetch() -> list[dict[str, Any]]:
        calls.append(time.monotonic())
        polled.set()
        return [{"name": "Fan 1", "type": "fan", "health": "critical"}]

    src = BmcSource(fetch=fetch, poll_s=3600)
    assert src.request(0.0) is False  # not started: nothing to wake
    assert src.available() is None
    try:
        assert polled.wait(5) and len(calls) == 1  # the first poll at start
        polled.clear()
        assert src.request(100.0, "GPU 0: SM clock low") is True
        assert polled.wait(5), "the asked-for read did not happen at once (the regular poll is an hour away)"
        assert src.read(0.0) == [{"name": "Fan 1", "type": "fan", "health": "critical"}]
        assert src.request(130.0) is False and src.on_demand == 1  # within the gap: no second read
        assert src.request(161.0) is True and src.on_demand == 2
    finally:
        src.close()


def test_the_gap_from_the_environment_is_checked() -> None:
    assert BmcSource(env={"WHYWAIT_BMC_ON_DEMAND_GAP_S": "20"}).gap_s == 20.0
    assert BmcSource(env={"WHYWAIT_BMC_ON_DEMAND_GAP_S": "0"}).available() == (
        "WHYWAIT_BMC_ON_DEMAND_GAP_S must be seconds between 1 and 3600 (got '0')")


class _Hw:
    """A collector holding the BMC source, as the hw collector does (``sources``)."""

    name, kind, errors, off_reason = "hw", "hw", 0, None
    parts_off: dict[str, str] = {}

    def __init__(self, src: BmcSource) -> None:
        self.sources = [src]


def test_the_agent_asks_its_bmc_when_a_round_shows_its_gpus_clocked_down() -> None:
    asked: list[str] = []

    class Src(BmcSource):
        def request(self, mono: float, why: str = "") -> bool:
            asked.append(why)
            return True

    agent = Agent("node-03", [_Hw(Src(fetch=list))], MemoryPublisher())  # type: ignore[list-item]  # duck-typed
    healthy = [("whywait.gpu", envelope("gpu", "node-03", 1.0, gpus=[_gpu(1980.0)]))]
    assert agent.watch_bmc(healthy, []) is None and asked == []
    hot = [("whywait.gpu", envelope("gpu", "node-03", 2.0, gpus=[_gpu(1800.0)]))]
    assert agent.watch_bmc(hot, []) == asked[0] and "SM clock 1800" in asked[0]


def test_an_agent_without_a_bmc_source_never_asks() -> None:
    agent = Agent("node-03", [], MemoryPublisher())
    hot = [("whywait.gpu", envelope("gpu", "node-03", 2.0, gpus=[_gpu(1800.0)]))]
    assert agent.watch_bmc(hot, []) is None
