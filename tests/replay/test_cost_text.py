"""An incident's cause text and the cost printed beside it agree.

A tester's replay of a step table printed, for one straggler, "the job has lost 0.00 GPU-hours to it so
far" and right under it "cost: 0.16 GPU-hours lost": the text was the first firing's (rendered as the rule
fired, when the loss had just begun) and the cost the latest.  The console and the report now show the
cause as last told (:attr:`whywait.engine.replay.Span.told`), whose figures are the cost's.
"""

from __future__ import annotations

import random
import re
from pathlib import Path

from whywait.engine.commands.replay_cmd import latest_cost
from whywait.engine.replay import PlacedTopology, Window, incidents

from tests.support.tables import replay_table

START = 1_764_443_800.0


def straggler_table() -> list[str]:
    """A synchronous 8-rank job, 300 steps; rank 5 computes 1.6x as long from step 100 on, the others wait."""
    rng = random.Random(2)
    t, rows = START, ["time,job,rank,step,duration_s,data_wait_s,compute_s,comm_s,node"]
    for step in range(1, 301):
        comp = {r: 0.62 * (1 + rng.gauss(0, 0.02)) * (1.6 if r == 5 and step > 100 else 1.0) for r in range(8)}
        slow = max(comp.values())
        dur = slow + 0.135
        t += dur
        rows += [f"{t:.3f},cost-job,{r},{step},{dur:.4f},0.015,{comp[r]:.4f},{0.12 + slow - comp[r]:.4f},"
                 f"node-{r // 4 + 1:02d}" for r in range(8)]
    return rows


def test_the_cause_shown_beside_the_cost_states_that_cost(tmp_path: Path) -> None:
    from whywait.engine.report import build_report

    res, msgs = replay_table(tmp_path, straggler_table())
    [span] = [s for s in incidents(res.diagnoses, res.end, res.open_at_end) if s.first.rule_id == "job.straggler"]
    said = re.compile(r"lost (\d+\.\d\d) GPU-hours")
    assert said.search(span.first.cause)[1] == "0.00"  # type: ignore[index] # the loss had just begun
    cost = latest_cost(span)
    assert cost is not None and cost > 0.1
    assert said.search(span.told.cause)[1] == f"{cost:.2f}"  # type: ignore[index]
    rep = build_report(res, [span], msgs, Window(START, res.end or START), PlacedTopology())
    [view] = rep.data.incidents
    assert said.search(view.cause)[1] == f"{view.cost['gpu_hours_lost']:.2f}" == f"{cost:.2f}"  # type: ignore[index]


def test_the_report_names_the_whole_culprit_as_last_told(tmp_path: Path) -> None:
    """A tester's input stall on one node: its 8 ranks' data wait ramps up over 20 steps.  The first firing named
    3 of them, a second before the rest; the report's culprit, ranks and next step kept those 3 while its cause
    (and every later update) named all 8.  And the incident was announced again 186 times in 200 steps, as its
    evidence rows changed order."""
    from whywait.engine.report import build_report

    rng = random.Random(5)
    t, rows = START, ["time,job,rank,step,duration_s,data_wait_s,compute_s,comm_s,node"]
    for step in range(400):
        own = []
        for r in range(32):
            extra = 0.37 * min(1.0, (step - 200) / 20) if 16 <= r < 24 and step >= 200 else 0.0
            own.append((0.03 * (1 + rng.uniform(-0.03, 0.03)) + extra, 0.95 * (1 + rng.uniform(-0.03, 0.03))))
        dur = max(d + c for d, c in own) + 0.2 * (1 + rng.uniform(-0.03, 0.03))
        t += dur
        rows += [f"{t:.4f},input,{r},{step},{dur:.4f},{d:.4f},{c:.4f},{dur - d - c:.4f},gpu-node-{r // 8:02d}"
                 for r, (d, c) in enumerate(own)]
    res, msgs = replay_table(tmp_path, rows)
    [span] = [s for s in incidents(res.diagnoses, res.end, res.open_at_end) if s.first.rule_id == "job.straggler"]
    assert span.told.ranks == tuple(range(16, 24)) and span.told.culprit == "gpu-node-02"
    assert len(span.updates) <= 5, len(span.updates)  # fired, grew to the node's 8 ranks, closed at the data's end
    rep = build_report(res, [span], msgs, Window(START, res.end or START), PlacedTopology())
    [view] = rep.data.incidents
    assert view.ranks == tuple(range(16, 24)) and "16" in view.next_step and "23" in view.next_step
