"""The cost figure (GPU-hours lost) against the simulator's truth, end to end: simulated messages through
the evaluator and the shipped rules, scored as `whywait eval` scores them.  Each case is a shape the full
suite got wrong before the cost measures were fixed (a hung job, a growing save, a flapping link slowing
the same steps as a power-capped GPU)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from whywait.engine.rules.loader import load_rules
from whywait.simulate import eval as ev

RULES = Path(__file__).resolve().parents[2] / "rules"


def _spec(faults: list[dict[str, Any]], seed: int, nodes: int = 4, duration: float = 200.0,
          checkpoint_every_s: float = 138.0) -> dict[str, Any]:
    names = [f"node-{i:02d}" for i in range(1, nodes + 1)]
    return {"seed": seed, "duration_s": duration, "cluster": {"nodes": nodes, "nodes_per_leaf": 4},
            "jobs": [{"job": "train-llm", "project": "llm", "team": "ml-platform", "channel": "#ml-platform",
                      "nodes": names, "checkpoint_every_s": checkpoint_every_s}],
            "faults": faults}


@pytest.mark.parametrize("name,faults,extra", [
    # the job hangs on a failed GPU: no step carries the loss, the stretch with none does
    ("xid", [{"fault": "gpu-ecc-xid", "target": "node-02:gpu3", "start": 110.0, "end": 170.0}], {}),
    # each save 1.35x the one before: the saves' time over the job's quickest, the running one too
    ("growth", [{"fault": "checkpoint-growth", "target": "train-llm", "start": 60.0, "end": 240.0,
                 "params": {"growth": 1.35}}], {"duration": 270.0, "checkpoint_every_s": 40.0}),
    # a power cap 15% on one GPU while a link flaps: each incident its own time, not the other's
    ("pair", [{"fault": "link-flap", "target": "node-01", "start": 100.0, "end": 180.0,
               "params": {"period_s": 15.0, "down_s": 2.5}},
              {"fault": "gpu-power", "target": "node-03:gpu7", "start": 105.0, "end": 180.0,
               "params": {"compute_mult": 1.15}}], {}),
])
def test_each_incident_s_cost_is_within_20_percent_of_the_truth(name: str, faults: list[dict[str, Any]],
                                                                 extra: dict[str, Any]) -> None:
    sc = ev.EvalScenario(f"cost:{name}", tuple(f["fault"] for f in faults), _spec(faults, seed=7, **extra))
    rep = ev.score([ev.run_scenario(load_rules([RULES]), sc)])
    for f in faults:
        c = rep.classes[f["fault"]]
        assert c.detected == 1 and c.cost_truths == 1, ev.format_details(rep)
        assert c.cost_right == 1, ev.format_details(rep)
