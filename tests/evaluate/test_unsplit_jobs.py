"""A job that reports step durations only: its unmeasured phases are neither a cause nor "checked and clean"."""

from __future__ import annotations

from pathlib import Path

from whywait.engine.rules.loader import load_rules
from whywait.simulate.ruletest import load_files, run_case

RULES = Path(__file__).resolve().parents[2] / "rules"


def _cases() -> dict[str, dict]:
    rules = load_rules([RULES])
    [(_, cases)] = load_files(rules, [RULES / "job" / "job.whole-job-slow.test.yaml"])
    return {c["name"]: c for c in cases}


def test_checks_over_phases_a_job_never_reported_are_not_listed_as_clean() -> None:
    rules = load_rules([RULES])
    cases = _cases()
    split = run_case(rules, cases["every rank computes 1.5x slower (a code change)"])
    unsplit = run_case(rules, cases["a job that reports step durations only slows everywhere (a step table, an old "
                                    "SDK)"])
    assert split.ok and unsplit.ok, (split.failures, unsplit.failures)
    [d] = [d for d in split.diagnoses if d.status == "firing"][:1]
    assert "the job's data wait did not grow" in d.clean_checks
    assert "the job's communication wait did not grow" in d.clean_checks
    [u] = [d for d in unsplit.diagnoses if d.status == "firing"][:1]
    assert u.clean_checks == ()  # both checks read phases the job never reported: not checked, so not clean
    assert "reports step durations only" in u.cause


def test_each_figure_is_given_once_though_two_conditions_read_it() -> None:
    # whole-job-slow reads step.duration_s twice for such a job (the last three steps' median and the fastest of
    # ten): the report listed 32 rows for 16 ranks, each rank twice with two thresholds.
    rules = load_rules([RULES])
    r = run_case(rules, _cases()["a job that reports step durations only slows everywhere (a step table, an old SDK)"])
    [u] = [d for d in r.diagnoses if d.status == "firing"][:1]
    figures = [(e.metric, e.entity) for e in u.evidence]
    assert len(figures) == len(set(figures)) and sum(m == "step.duration_s" for m, _ in figures) > 1
