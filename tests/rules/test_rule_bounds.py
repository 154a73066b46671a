"""Every duration and step count a rule can hold is bounded, and the evaluator cannot spin on an absurd one.

A site rule copied with ``for: 10000000000000d`` passed ``rules check``; ``rules test`` then ran its cases out
to 8.6e17 s of event time, where adding a 1 s tick no longer moves a float clock, and spun forever.
"""

from __future__ import annotations

import signal
import subprocess
import sys
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path

import pytest
from whywait.engine.evaluate.evaluator import Evaluator
from whywait.engine.evaluate.steps import StepTable
from whywait.engine.evaluate.store import MetricStore
from whywait.engine.rules.condition_types import JOB_RETENTION_S, RETENTION_S, STEPS_KEPT
from whywait.engine.rules.loader import RuleLoadError, RuleSet, load_rules

T0 = 1_800_000_000.0


class Hung(BaseException):
    """Raised by :func:`deadline`: a BaseException, so the evaluator's per-tick ``except Exception`` cannot eat it."""


@contextmanager
def deadline(seconds: int) -> Iterator[None]:
    """Fail (rather than hang the suite) when the body runs longer than ``seconds``."""
    def expired(*_: object) -> None:
        raise Hung(f"still running after {seconds}s")

    old = signal.signal(signal.SIGALRM, expired)
    signal.alarm(seconds)
    try:
        yield
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, old)


# ---- defence in depth: the evaluator's tick loop ---------------------------------------------------------------


@pytest.mark.parametrize("watermark", [T0 + 864_000_000_000_000_000.0, 2.0 ** 60])
def test_advance_to_an_absurd_watermark_returns(watermark: float) -> None:
    """Past 2**53 s a tick no longer moves the clock: the loop stops instead of ticking the same second forever."""
    ev = Evaluator(RuleSet(), None)
    ev.next_tick = T0 if watermark > T0 else watermark - 10
    with deadline(20):
        assert ev.advance(watermark) == []
    assert ev.next_tick is not None and ev.next_tick <= watermark


# ---- the loader: every duration and count bounded, refused at its file and line --------------------------------

ROOT = Path(__file__).resolve().parents[2]
SHIPPED = ROOT / "rules"

RULE = """\
apiVersion: whywait/v1
id: site.bounds
title: "{{ job }} slow"
cause: "because"
next_step: "look"
for: 3s
keep_firing_for: 20s
when:
  all:
    - type: peer_outlier
      metric: net.tcp_retrans_segs_per_s
      window: 5s
      ratio: "> 10"
      culprit: true
    - type: self_history
      metric: job.comm_s
      window: 5s
      baseline: 300s
      ratio: "> 1.3"
"""
F = "{f}"


def load_errors(tmp_path: Path, text: str, *, name: str = "site.bounds.yaml", extra: Sequence[Path] = ()) -> list[str]:
    d = tmp_path / "site"
    d.mkdir(exist_ok=True)
    f = d / name
    f.write_text(text)
    try:
        load_rules([*extra, d])
    except RuleLoadError as e:
        return [str(x).replace(str(f), F) for x in e.errors]
    return []


ONE_HOUR = "1h (the longest history the metric store keeps)"
REFUSED = [
    ("absurd-for", RULE.replace("for: 3s", "for: 10000000000000d"),
     f"{F}:6: rule 'site.bounds': 'for' must be a duration from 0s to 1h (got '10000000000000d')"),
    ("for-past-an-hour", RULE.replace("for: 3s", "for: 61m"),
     f"{F}:6: rule 'site.bounds': 'for' must be a duration from 0s to 1h (got '61m')"),
    ("keep-firing-past-an-hour", RULE.replace("keep_firing_for: 20s", "keep_firing_for: 2h"),
     f"{F}:7: rule 'site.bounds': 'keep_firing_for' must be a duration from 0s to 1h (got '2h')"),
    ("zero-window", RULE.replace("window: 5s", "window: 0s", 1),
     f"{F}:12: rule 'site.bounds': 'when.all[0].window' must be a duration from 1s (a tick's second) to "
     f"{ONE_HOUR} (got '0s')"),
    ("sub-second-window", RULE.replace("window: 5s", "window: 500ms", 1),
     f"{F}:12: rule 'site.bounds': 'when.all[0].window' must be a duration from 1s (a tick's second) to "
     f"{ONE_HOUR} (got '500ms')"),
    ("zero-baseline", RULE.replace("baseline: 300s", "baseline: 0s"),
     f"{F}:18: rule 'site.bounds': 'when.all[1].baseline' must be a duration from 1s (a tick's second) to "
     f"{ONE_HOUR} (got '0s')"),
    ("window-past-all-history", RULE.replace("window: 5s", "window: 1d", 1),
     f"{F}:12: rule 'site.bounds': 'when.all[0].window' must be a duration from 1s (a tick's second) to "
     f"{ONE_HOUR} (got '1d')"),
    ("window-past-the-metric's-retention", RULE.replace("window: 5s", "window: 16m", 1),
     f"{F}:12: rule 'site.bounds': 'when.all[0].window' reaches back 16m, but the metric store keeps only 15m of "
     "net.tcp_retrans_segs_per_s (node level), so the window is never filled: at most 15m in all"),
    ("baseline-past-the-metric's-retention",
     RULE.replace("metric: job.comm_s", "metric: host.cpu_busy_pct").replace("baseline: 300s", "baseline: 15m"),
     f"{F}:18: rule 'site.bounds': 'when.all[1].baseline' plus 'window' reaches back 15m5s, but the metric store "
     "keeps only 15m of host.cpu_busy_pct (node level), so the window is never filled: at most 15m in all"),
    ("job-baseline-past-an-hour", RULE.replace("baseline: 300s", "baseline: 1h"),
     f"{F}:18: rule 'site.bounds': 'when.all[1].baseline' plus 'window' reaches back 1h5s, but the metric store "
     "keeps only 1h of job.comm_s (job level), so the window is never filled: at most 1h in all"),
    ("steps-fractional", RULE.replace("window: 5s", "window: 5s\n      steps: 2.5", 1),
     f"{F}:13: rule 'site.bounds': 'when.all[0].steps' must be a whole number from 0 to 600: a job's step table "
     "keeps its last 600 steps (got 2.5)"),
    ("steps-past-the-table", RULE.replace("window: 5s", "window: 5s\n      steps: 601", 1),
     f"{F}:13: rule 'site.bounds': 'when.all[0].steps' must be a whole number from 0 to 600: a job's step table "
     "keeps its last 600 steps (got 601)"),
    ("every-zero", RULE.replace("for: 3s", "for: 3s\nevery: 0s"),
     f"{F}:7: rule 'site.bounds': 'every' must be a duration of whole seconds from 1s to 60s (got '0s')"),
]


@pytest.mark.parametrize("text,error", [c[1:] for c in REFUSED], ids=[c[0] for c in REFUSED])
def test_out_of_range_value_is_refused_at_its_line(tmp_path: Path, text: str, error: str) -> None:
    assert load_errors(tmp_path, text) == [error]


ACCEPTED = [
    ("bounds-themselves", RULE.replace("for: 3s", "for: 1h").replace("keep_firing_for: 20s", "keep_firing_for: 60m")
     .replace("window: 5s", "window: 15m", 1)),
    ("zero-for", RULE.replace("for: 3s", "for: 0s").replace("keep_firing_for: 20s", "keep_firing_for: 0s")),
    ("job-metric-keeps-an-hour", RULE.replace("baseline: 300s", "baseline: 59m55s")),
    ("node-metric-window-and-baseline-fill-15m",
     RULE.replace("metric: job.comm_s", "metric: host.cpu_busy_pct").replace("baseline: 300s", "baseline: 14m55s")),
    ("steps-off-and-at-the-table", RULE.replace("window: 5s", "window: 5s\n      steps: 0", 1)
     .replace("baseline: 300s", "baseline: 300s\n      baseline_steps: 600")),
]


@pytest.mark.parametrize("text", [c[1] for c in ACCEPTED], ids=[c[0] for c in ACCEPTED])
def test_values_within_bounds_load(tmp_path: Path, text: str) -> None:
    assert load_errors(tmp_path, text) == []


STEP_RULE = """\
apiVersion: whywait/v1
id: site.bounds
title: "{{ job }} slow"
cause: "because"
next_step: "look"
when:
  type: rotation
  window: 15s
  steps: 8
  min_segment: 3
  levels: 4
"""


@pytest.mark.parametrize("key,bad,error", [
    ("steps: 8", "steps: 0", "'when.steps' must be a whole number from 1 to 600: a job's step table keeps its last "
                             "600 steps (got 0)"),
    ("levels: 4", "levels: 17", "'when.levels' must be a whole number from 1 to 16: each level doubles the size of "
                                "turn judged; past 16 none is ever seen (got 17)"),
    ("levels: 4", "levels: 1000000000000", "'when.levels' must be a whole number from 1 to 16: each level doubles "
                                           "the size of turn judged; past 16 none is ever seen (got 1e+12)"),
])
def test_step_counts_are_whole_and_bounded(tmp_path: Path, key: str, bad: str, error: str) -> None:
    text = STEP_RULE.replace("  min_segment: 3\n", "")
    line = text.splitlines().index("  " + key) + 1
    assert load_errors(tmp_path, text) == []
    assert load_errors(tmp_path, text.replace(key, bad)) == [f"{F}:{line}: rule 'site.bounds': {error}"]


def test_change_point_segments_must_fit_the_points_kept(tmp_path: Path) -> None:
    text = RULE.replace("""    - type: self_history
      metric: job.comm_s
      window: 5s
      baseline: 300s
      ratio: "> 1.3"
""", """    - type: change_point
      metric: step.duration_s
      window: 3m
      ratio: "> 1.3"
      min_segment: 301
""")
    assert load_errors(tmp_path, text) == [
        f"{F}:19: rule 'site.bounds': 'when.all[1].min_segment' must be a whole number from 1 to 300: both sides of "
        "a split must fit in 600 points (got 301)"]


def test_a_macro_out_of_range_is_refused_once_at_its_own_line(tmp_path: Path) -> None:
    """Not at each rule that uses it: the value to fix is in macros.yaml."""
    d = tmp_path / "site"
    d.mkdir()
    macros = d / "macros.yaml"
    macros.write_text("macros:\n  comm-grew:\n    type: self_history\n    metric: job.comm_s\n    window: 0s\n"
                      "    ratio: '> 1.3'\n  any-grew: {any: [{macro: comm-grew}]}\n")
    uses = RULE.split("    - type: self_history")[0] + "    - macro: comm-grew\n"
    (d / "site.other.yaml").write_text(uses.replace("id: site.bounds", "id: site.other")
                                       .replace("macro: comm-grew", "macro: any-grew"))
    assert load_errors(tmp_path, uses) == [
        f"{macros}:5: 'macros.comm-grew.window' must be a duration from 1s (a tick's second) to {ONE_HOUR} (got '0s')"]
    unknown = uses.replace("macro: comm-grew", "macro: comm-grows")
    assert load_errors(tmp_path, unknown)[0].startswith(f"{F}:15: rule 'site.bounds': 'when.all[1].macro' must name")


def test_an_override_out_of_range_is_refused_in_its_own_file(tmp_path: Path) -> None:
    errors = load_errors(tmp_path, "override: network.straggler-retransmits\nfor: 10000000000000d\n",
                         name="my-overrides.yaml", extra=[SHIPPED])
    assert errors == [f"{F}:2: rule 'network.straggler-retransmits': 'for' must be a duration from 0s to 1h "
                      "(got '10000000000000d')"]


def test_the_bounds_are_the_stores() -> None:
    """The schema's retention and step-table sizes are the engine's own, so a window it accepts can be filled."""
    store = MetricStore()
    assert (store.retention_s, store.job_retention_s) == (RETENTION_S, JOB_RETENTION_S)
    assert StepTable().keep == STEPS_KEPT


def test_every_shipped_rule_is_within_bounds() -> None:
    assert len(load_rules([SHIPPED])) > 20


# ---- through the CLI ---------------------------------------------------------------------------------------------


def _site_copy(tmp_path: Path, for_: str) -> Path:
    """The user's report: the shipped straggler rule copied to a site folder as site.retrans, with its test."""
    d = tmp_path / "site"
    d.mkdir()
    src = SHIPPED / "network" / "network.straggler-retransmits.yaml"
    text = src.read_text().replace("id: network.straggler-retransmits", "id: site.retrans")
    (d / "site.retrans.yaml").write_text(text.replace("\nfor: 3s\n", f"\nfor: {for_}\n"))
    test = (SHIPPED / "network" / "network.straggler-retransmits.test.yaml").read_text()
    (d / "site.retrans.test.yaml").write_text(test.replace("network.straggler-retransmits", "site.retrans"))
    return d


def _for_line(d: Path) -> int:
    return next(i for i, line in enumerate((d / "site.retrans.yaml").read_text().splitlines(), 1)
                if line.startswith("for:"))


def test_cli_rules_check_names_file_line_and_range(tmp_path: Path) -> None:
    d = _site_copy(tmp_path, "10000000000000d")
    p = subprocess.run([sys.executable, "-m", "whywait", "rules", "check", str(SHIPPED), str(d)],
                       capture_output=True, text=True, timeout=300, cwd=ROOT)
    assert p.returncode == 1, p.stdout + p.stderr
    lines = [x for x in (p.stdout + p.stderr).splitlines() if "site.retrans" in x]
    assert lines == [f"{d / 'site.retrans.yaml'}:{_for_line(d)}: rule 'site.retrans': 'for' must be a duration "
                     "from 0s to 1h (got '10000000000000d')"], p.stdout + p.stderr


def test_cli_rules_test_refuses_before_running_anything(tmp_path: Path) -> None:
    """It spun at full CPU for good; now the rule is refused at load, in seconds."""
    d = _site_copy(tmp_path, "10000000000000d")
    p = subprocess.run([sys.executable, "-m", "whywait", "rules", "test", "--rules", str(SHIPPED), str(d)],
                       capture_output=True, text=True, timeout=300, cwd=ROOT)
    assert p.returncode == 1, p.stdout + p.stderr
    assert f"{d / 'site.retrans.yaml'}:{_for_line(d)}: rule 'site.retrans': 'for' must be a duration from 0s to 1h" \
        in p.stdout + p.stderr
