"""``clock_offset`` and ``job.node-clock-skew``: a node whose clock is off, found from the job's own step ends.

The job is modelled here, independent of the simulator: a synchronous job whose ranks all leave each
step's collective together (a few ms apart), one steps message per node per step, sent when the step
ends and stamped by the node's clock.  Messages arrive in true-time order, as a live engine gets them.
"""

from __future__ import annotations

import random
from pathlib import Path
from typing import Any

from whywait.agents.events import decode, encode, envelope, validate
from whywait.engine.evaluate.evaluator import Evaluator
from whywait.engine.rules.loader import load_rules
from whywait.simulate.cluster import make_cluster

RULES = Path(__file__).resolve().parents[2] / "rules"
T0 = 1_764_442_800.0


def run(nodes: int = 4, offsets: dict[str, float] | None = None, seconds: float = 90.0, step_s: float = 1.0,
        stamped: bool = True, batch_s: float = 0.0, stage_lag: float = 0.0, seed: int = 1) -> list[Any]:
    """Feed a healthy ``nodes`` x 8-rank job to the Evaluator with the shipped rules; return its diagnoses.

    ``offsets``: seconds each node's clock is off.  ``stamped``: records carry ``ended_at``.  ``batch_s``:
    a node sends its records every that many seconds instead of at each step's end.  ``stage_lag``: with
    it, the job is a 4-stage pipeline whose stage k ends each step ``k * stage_lag`` step times later.
    """
    rng = random.Random(seed)
    offsets = offsets or {}
    topo = make_cluster(nodes=nodes, gpus_per_node=8)
    ranks: list[dict[str, Any]] = [{"rank": r, "node": f"node-{r // 8 + 1:02d}", "gpu": r % 8,
                                    **({"pp": r % 4, "dp": r // 4} if stage_lag else {})} for r in range(nodes * 8)]
    ev = Evaluator(load_rules([RULES]), topo)
    out = list(ev.ingest(validate(envelope("placement", "sched", T0, job="train-llm", project="llm",
                                           team="ml", state="running", ranks=ranks))))
    t, step = T0, 0
    pending: dict[str, list[dict[str, Any]]] = {}
    sent_at = {f"node-{n + 1:02d}": T0 for n in range(nodes)}
    while t < T0 + seconds:
        dur = step_s * (1 + rng.gauss(0, 0.03))
        t += dur
        step += 1
        for r in ranks:
            node = r["node"]
            end = t + 0.004 * rng.random() + (stage_lag * step_s * r.get("pp", 0))
            rec: dict[str, Any] = {"rank": r["rank"], "step": step, "duration_s": round(dur, 4),
                                   "compute_s": round(0.7 * dur, 4), "data_wait_s": round(0.05 * dur, 4),
                                   "comm_s": round(0.25 * dur, 4)}
            if stamped:
                rec["ended_at"] = round(end + offsets.get(node, 0.0), 4)
            pending.setdefault(node, []).append(rec)
        for node in sorted(pending):
            if batch_s and t - sent_at[node] < batch_s:
                continue
            sent_at[node] = t
            msg = envelope("steps", node, t + offsets.get(node, 0.0), job="train-llm", steps=pending.pop(node))
            out += ev.ingest(validate(msg))
    return out


def fired(diags: list[Any]) -> dict[str, set[str | None]]:
    got: dict[str, set[str | None]] = {}
    for d in diags:
        if d.status == "firing":
            got.setdefault(d.rule_id, set()).add(d.culprit)
    return got


def test_a_node_whose_clock_is_behind_is_named_and_its_ranks_are_not_called_stuck() -> None:
    diags = run(offsets={"node-03": -6.0})
    assert fired(diags) == {"job.node-clock-skew": {"node-03"}}
    d = next(x for x in diags if x.rule_id == "job.node-clock-skew")
    (e,) = d.evidence
    assert (e.metric, e.entity) == ("step.end_offset_s", "node-03") and abs(e.value + 6.0) < 0.05
    assert "6.0 s off" in d.title and "before the job's other ranks" in d.cause
    assert d.starts_at - T0 < 10  # within the first steps


def _silence_only(offset: float, stop_rank: int | None = None, every: int = 1) -> dict[str, set[str | None]]:
    """Steps of 4 nodes x 8 ranks through the shipped rules without the clock rule; node-03's clock off by
    ``offset``; ``stop_rank`` stops reporting from step 30 while the job trains on; only every ``every``-th
    step is reported (a producer that samples its steps)."""
    from whywait.engine.rules.loader import RuleSet

    shipped = load_rules([RULES])
    rules = RuleSet({k: r for k, r in shipped.rules.items() if k != "job.node-clock-skew"}, shipped.files)
    ev = Evaluator(rules, make_cluster(nodes=4, gpus_per_node=8))
    ev.ingest(validate(envelope("placement", "sched", T0, job="train-llm", project="llm", team="ml",
                                state="running", ranks=[{"rank": r, "node": f"node-{r // 8 + 1:02d}", "gpu": r % 8}
                                                        for r in range(32)])))
    out: list[Any] = []
    t = T0
    for step in range(1, 70):
        t += 1.0
        if step % every:
            continue
        for n in range(4):
            node = f"node-{n + 1:02d}"
            off = offset if node == "node-03" else 0.0
            recs = [{"rank": r, "step": step, "duration_s": 1.0, "ended_at": t + off}
                    for r in range(n * 8, n * 8 + 8) if not (r == stop_rank and step >= 30)]
            out += ev.ingest(validate(envelope("steps", node, t + off, job="train-llm", steps=recs)))
    return fired(out)


def test_rank_silence_alone_tells_a_late_clock_from_a_rank_that_stopped() -> None:
    """Ranks that reported the job's newest step are not silent however old their stamps look (before
    this, node-03's ranks 6 s behind were called stuck); a rank that stopped reporting still is."""
    assert _silence_only(-6.0) == {}
    assert _silence_only(-6.0, stop_rank=5) == {"job.rank-silent": {"node-01"}}
    assert _silence_only(0.0, stop_rank=20) == {"job.rank-silent": {"node-03"}}
    # a producer that reports every 3rd step: the step after a rank's newest is the next one reported
    assert _silence_only(-6.0, every=3) == {}
    assert _silence_only(-6.0, stop_rank=5, every=3) == {"job.rank-silent": {"node-01"}}


def test_a_clock_ahead_is_named_too() -> None:
    assert fired(run(offsets={"node-02": 15.0}, seconds=120)) == {"job.node-clock-skew": {"node-02"}}


def test_healthy_jobs_and_what_is_no_clock_say_nothing() -> None:
    assert fired(run()) == {}
    # a pipeline's later stages end each step later (up to 0.9 step times here): the job's structure
    assert fired(run(stage_lag=0.3)) == {}
    # two nodes: which clock is right cannot be told, so no clock is named; and neither node's ranks are
    # called stuck, for they report every step
    assert fired(run(nodes=2, offsets={"node-02": -6.0})) == {}


def test_records_without_their_own_end_time_say_nothing_of_the_clock() -> None:
    """A producer that sends no ``ended_at`` and batches its records every 5 s: each batch's records take
    the batch's time, seconds from when the steps ended; that is no clock."""
    got = fired(run(stamped=False, batch_s=5.0))
    assert "job.node-clock-skew" not in got


def test_a_step_keeping_statistics_again_after_a_late_record_keeps_them() -> None:
    """A late rank's record empties a step's kept statistics but leaves the step in the table's bounded list;
    when the step keeps statistics again at the list's limit, its own stale entry was the one evicted, and
    the condition then wrote into None (the rule failed for that tick; reading an older step made it likely)."""
    from whywait.engine.evaluate.steps import _STATS_ROWS, StepRec, StepTable, keep_stat

    table = StepTable()
    for s in range(_STATS_ROWS + 10):
        table.add(s, 0, StepRec(T0 + s, 1.0))
    rows = list(table.steps.values())
    newest: Any = rows[-1]  # a StepRow: what it keeps is its ``stats``
    keep_stat(newest, ("k",), 1)
    table.add(_STATS_ROWS + 9, 1, StepRec(T0 + 200, 1.0))  # a late rank of the newest step
    assert newest.stats is None
    for row in rows[:_STATS_ROWS - 1]:  # the list at its limit, the newest step's stale entry first
        keep_stat(row, ("k",), 1)
    keep_stat(newest, ("k",), 2)
    assert newest.stats == {("k",): 2}


def test_a_named_clock_moves_that_nodes_telemetry_back_in_line_while_it_lasts() -> None:
    """While job.node-clock-skew fires, the node's telemetry is moved by the offset its job's steps show (so
    its own faults are seen: the rule tests beside network.straggler-retransmits); once its clock is
    right again, nothing is moved."""
    from whywait.simulate.cluster import make_job
    from whywait.simulate.faults import make_fault
    from whywait.simulate.sim import Simulation
    from whywait.topology.model import Topology

    topo = make_cluster(nodes=8)
    sim = Simulation(topo, [make_job(topo)], [make_fault("clock-skew", "node-03", 30, 120, offset_s=-12.0)],
                     start_time=T0, duration_s=220, seed=5)
    ev = Evaluator(load_rules([RULES]), Topology.from_dict(topo.to_dict()))
    fixes: dict[float, dict[str, float]] = {}
    for topic, m in sim.messages():
        ev.ingest(decode(encode(m), topic))  # typed messages, as the live engine's decoder gives them
        if ev.ticks and ev.next_tick is not None:
            fixes[ev.next_tick] = dict(ev.clock_fix)
    during = [f for t, f in fixes.items() if T0 + 60 <= t <= T0 + 115]
    assert during and all(f.keys() == {"node-03"} and abs(f["node-03"] + 12.0) < 0.5 for f in during)
    assert all(not f for t, f in fixes.items() if t < T0 + 30 or t > T0 + 135)
