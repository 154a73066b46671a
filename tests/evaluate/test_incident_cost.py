"""The incident's cost figure (Evaluator._cost): each lost step counted once, across flapping incidents too."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

from whywait.engine.evaluate.evaluator import Evaluator, Incident
from whywait.engine.rules.loader import load_rules
from whywait.simulate.cluster import make_cluster

RULES = Path(__file__).resolve().parents[2] / "rules"
JOB = SimpleNamespace(job="train", ranks={r: ("node-01", r) for r in range(8)}, coords={})


def _losses(first: int, last: int) -> list[tuple[float, float, float]]:
    """Steps ending at second ``first``..``last``, each 1.5 s long with 0.5 s lost."""
    return [(float(t), 1.5, 0.5) for t in range(first, last + 1)]


def test_a_flapping_fault_s_second_incident_does_not_recount_the_first_s_steps() -> None:
    ev = Evaluator(load_rules([RULES]), make_cluster(nodes=1))
    first = Incident("job.straggler", "fp1", {"job": "train"}, pending_since=100.0, last_true=100.0)
    cost = ev._cost(first, JOB, {"step_losses": _losses(90, 120)})  # walked back to where it began
    assert cost is not None and cost["lost_s"] == 31 * 0.5
    # resolved, then the same fault fires again: the new incident walks back over steps 100-120 too
    again = Incident("job.straggler", "fp1", {"job": "train"}, pending_since=125.0, last_true=125.0)
    cost = ev._cost(again, JOB, {"step_losses": _losses(100, 130)})
    assert cost is not None and cost["lost_s"] == 10 * 0.5  # only 121-130
    assert cost["gpu_hours_lost"] == round(5.0 * 8 / 3600, 4)
    # another incident (another fingerprint) counts its own steps in full
    other = Incident("job.straggler", "fp2", {"job": "train"}, pending_since=125.0, last_true=125.0)
    cost = ev._cost(other, JOB, {"step_losses": _losses(100, 130)})
    assert cost is not None and cost["lost_s"] == 31 * 0.5


def test_a_tick_without_a_complete_step_keeps_the_cost_so_far() -> None:
    ev = Evaluator(load_rules([RULES]), make_cluster(nodes=1))
    inc = Incident("job.straggler", "fp", {"job": "train"}, pending_since=100.0, last_true=100.0)
    assert ev._cost(inc, JOB, {}) is None  # nothing counted yet: no figure
    ev._cost(inc, JOB, {"step_losses": _losses(100, 109)})
    cost = ev._cost(inc, JOB, {})
    assert cost is not None and cost["lost_s"] == 5.0


def test_the_counted_steps_survive_a_restart() -> None:
    ev = Evaluator(load_rules([RULES]), make_cluster(nodes=1))
    ev._cost(Incident("job.straggler", "fp", {}, 100.0, 100.0), JOB, {"step_losses": _losses(100, 120)})
    again = Evaluator(load_rules([RULES]), make_cluster(nodes=1))
    again.restore(ev.snapshot())
    cost = again._cost(Incident("job.straggler", "fp", {}, 125.0, 125.0), JOB, {"step_losses": _losses(110, 125)})
    assert cost is not None and cost["lost_s"] == 5 * 0.5
