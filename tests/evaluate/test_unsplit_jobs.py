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


def test_a_rule_grouped_by_gpu_can_name_it_as_gpu(tmp_path: Path) -> None:
    # `{{ gpu }}` passed `rules check` (a known variable) and rendered empty unless a topology predicate set it.
    import shutil

    for f in ("gpu.thermal-throttle.yaml", "gpu.thermal-throttle.test.yaml"):
        shutil.copy(RULES / "gpu" / f, tmp_path / f)
    shutil.copy(RULES / "macros.yaml", tmp_path / "macros.yaml")
    rule = tmp_path / "gpu.thermal-throttle.yaml"
    text = rule.read_text()
    assert 'title: "{{ job }} waits on {{ labels.gpu }}' in text
    text = text.replace('title: "{{ job }} waits on {{ labels.gpu }}', 'title: "{{ job }} waits on {{ gpu }}')
    rule.write_text("\n".join(ln for ln in text.splitlines() if not ln.startswith("inhibits:")) + "\n")
    rules = load_rules([tmp_path])
    [(_, cases)] = load_files(rules, [tmp_path / "gpu.thermal-throttle.test.yaml"])
    r = run_case(rules, cases[0])
    assert r.ok, r.failures
    assert any(d.title.startswith("train-llm waits on node-03/gpu2") for d in r.diagnoses)
