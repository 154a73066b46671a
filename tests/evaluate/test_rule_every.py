"""A rule's ``every``: evaluated on the ticks at a multiple of it only, its incidents kept as they were between.

The rule under test is ``tests/evaluate/test_evaluator.py``'s (a node retransmitting while the job's
communication grows), with ``every: 5s``; the same stream with no ``every`` (a tick every second) is the
reference.  T0 is a multiple of 5 s, so the aligned ticks are T0 + 5k.
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
from whywait.engine.evaluate import conditions
from whywait.engine.evaluate import evaluator as evaluator_mod
from whywait.engine.evaluate.evaluator import Evaluator, due
from whywait.engine.rules.loader import RuleSet, load_rules
from whywait.simulate.cluster import make_cluster

from tests.evaluate.test_evaluator import INHIBITOR, RULE, T0, run, stream

RULE_ID = "network.test-straggler"


def _rules(tmp_path: Path, every: str | None, for_: str = "2s", kff: str = "0s",
           extra: dict[str, str] | None = None) -> RuleSet:
    d = tmp_path / f"rules-{every}-{for_}-{kff}-{len(extra or {})}"
    d.mkdir()
    text = RULE.replace("@FOR@", for_).replace("@KFF@", kff)
    if every:
        text = text.replace("group_by:", f"every: {every}\ngroup_by:")
    (d / f"{RULE_ID}.yaml").write_text(text)
    for name, body in (extra or {}).items():
        (d / name).write_text(body)
    return load_rules([d])


def _evaluator(rules: RuleSet) -> Evaluator:
    return Evaluator(rules, make_cluster(nodes=4, gpus_per_node=1))


def _story(diags: list[Any]) -> list[tuple[str, float, float]]:
    return [(d.status, d.starts_at - T0, (d.ends_at if d.status == "resolved" else d.detected_at) - T0)
            for d in diags]


def test_every_evaluates_only_on_aligned_ticks(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    ev = _evaluator(_rules(tmp_path, "5s"))
    ticks: list[float] = []
    at: list[float] = []  # the ticks the rule was evaluated on (not counting the look back for an onset)
    looking_back = [False]
    real_tick, real_onsets, real_evaluate = Evaluator.tick, Evaluator._onsets, conditions.evaluate

    def tick(self: Evaluator, now: float) -> list[Any]:
        ticks.append(now)
        return real_tick(self, now)

    def onsets(self: Evaluator, *a: Any) -> dict[str, float]:
        looking_back[0] = True
        try:
            return real_onsets(self, *a)
        finally:
            looking_back[0] = False

    def evaluate(node: Any, ctx: Any) -> Any:
        if ctx.rule_id == RULE_ID and not looking_back[0]:
            at.append(ctx.now)
        return real_evaluate(node, ctx)

    monkeypatch.setattr(Evaluator, "tick", tick)
    monkeypatch.setattr(Evaluator, "_onsets", onsets)
    monkeypatch.setattr(evaluator_mod, "evaluate", evaluate)
    diags = run(ev, stream(140, "node-03", (80, 110)))
    assert diags, "the fault should be diagnosed"
    assert len(ticks) > 100
    assert at == [t for t in ticks if (t - T0) % 5 == 0]  # every aligned tick, and no other


def test_every_incident_neither_resolves_nor_flaps_between_evaluations(tmp_path: Path) -> None:
    # The fault stops for two seconds between two aligned ticks: judged every second the incident resolves
    # and fires again; judged every 5 s it is one incident, and nothing is said on the ticks between.
    faults = ((80, 100), (102, 130))
    each = run(_evaluator(_rules(tmp_path, None)), stream(160, "node-03", faults[0], faults=faults[1:]))
    assert [d.status for d in each] == ["firing", "resolved", "firing", "resolved"]
    ev = _evaluator(_rules(tmp_path, "5s"))
    said: list[tuple[float, Any]] = []
    open_at: list[float] = []
    for m in stream(160, "node-03", faults[0], faults=faults[1:]):
        before = ev.ticks
        said += [(ev.next_tick - ev.step_s if ev.next_tick else 0.0, d) for d in ev.ingest(m)]
        if ev.ticks != before and any(i.rule_id == RULE_ID and i.firing for i in ev.incidents.values()):
            open_at.append(ev.next_tick - ev.step_s if ev.next_tick else 0.0)
    assert [d.status for _, d in said] == ["firing", "resolved"]
    assert all((t - T0) % 5 == 0 for t, _ in said)  # announced and resolved on evaluations only
    # open on every tick from its firing until the tick that resolved it, idle ticks included
    fired = said[0][1].detected_at
    resolved_at = said[1][0]
    assert [t for t in open_at if fired <= t < resolved_at] == [fired + k for k in range(int(resolved_at - fired))]
    # the onset is where the condition began to hold (as judged every second), not the evaluation that saw it
    assert said[0][1].starts_at == each[0].starts_at
    assert said[1][1].ends_at <= each[-1].ends_at


@pytest.mark.parametrize("for_", ["0s", "2s", "3s"])
def test_every_for_counts_event_time_from_the_onset(tmp_path: Path, for_: str) -> None:
    each = [d for d in run(_evaluator(_rules(tmp_path, None, for_=for_)), stream(140, "node-03", (80, 110)))
            if d.status == "firing"]
    five = [d for d in run(_evaluator(_rules(tmp_path, "5s", for_=for_)), stream(140, "node-03", (80, 110)))
            if d.status == "firing"]
    assert len(each) == len(five) == 1
    assert five[0].starts_at == each[0].starts_at
    # fired at the first aligned tick at least `for` after the onset: no later than needed
    need = each[0].starts_at + float(for_[:-1])
    assert (five[0].detected_at - T0) % 5 == 0 and need <= five[0].detected_at < need + 5
    assert five[0].detected_at >= each[0].detected_at


def test_keep_firing_for_is_event_time_with_every(tmp_path: Path) -> None:
    # (A longer pause would let the self-history baseline move: a stateful condition judged every 5 s does
    # not unfreeze and freeze it on the same ticks as one judged every second, which is why `every` is for
    # rules over slow signals.)
    each = run(_evaluator(_rules(tmp_path, None, kff="30s")), stream(200, "node-03", (80, 100), faults=((108, 125),)))
    five = run(_evaluator(_rules(tmp_path, "5s", kff="30s")), stream(200, "node-03", (80, 100), faults=((108, 125),)))
    assert [d.status for d in five] == [d.status for d in each] == ["firing", "resolved"]
    # resolved 30 s after the last evaluation that saw it hold, which is at most 5 s before the per-second one
    assert each[1].ends_at - 5 <= five[1].ends_at <= each[1].ends_at


def test_an_idle_root_cause_keeps_inhibiting(tmp_path: Path) -> None:
    # The root cause is judged every 5 s; its symptom (for: 9s) would fire on an idle tick of it.
    root = INHIBITOR.replace("inhibits:", "every: 5s\ninhibits:")
    diags = run(_evaluator(_rules(tmp_path, None, for_="9s", extra={"network.test-root.yaml": root})),
                stream(140, "node-03", (80, 110)))
    assert diags and {d.rule_id for d in diags} == {"network.test-root"}


def test_due_is_event_time_alone() -> None:
    rule = next(iter(load_rules([Path(__file__).resolve().parents[2] / "rules"]).rules.values()))
    every5 = replace(rule, every_s=5.0)
    assert [due(every5, T0 + s) for s in range(6)] == [True, False, False, False, False, True]
    assert all(due(rule, T0 + s) for s in range(6))  # no every: each tick
    # ticks 2 s apart: the tick whose step holds a multiple of 5 s
    assert [due(every5, T0 + s, 2.0) for s in range(0, 12, 2)] == [True, False, False, True, False, True]
