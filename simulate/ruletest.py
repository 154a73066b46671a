"""Unit tests for rules, in the spirit of ``promtool test rules``.

Called by ``whywait rules test FILE...``, by the test suite (every shipped rule
must have cases) and by ``whywait eval``.  A test file, ``<rule id>.test.yaml``
beside its rule, holds cases; each case feeds the *same* :class:`Evaluator` the
live engine runs, either a simulator scenario or explicit events, and states
the diagnoses expected::

    rule: network.straggler-retransmits     # optional: the rule under test (for the coverage check)
    cases:
      - name: packet loss on one node
        scenario:                           # simulate.scenario format
          cluster: {nodes: 8}
          duration_s: 240
          faults:
            - {fault: nic-packet-loss, target: node-03, start: 120, end: 200}
        expect:
          - rule: network.straggler-retransmits
            culprit: node-03                # any Diagnosis field: job, severity, culprit, ranks (subset)...
            detected: [120s, 135s]          # detected_at, as an offset from the start
          - rule: network.straggler-retransmits
            status: resolved
        # strict (default true): any diagnosis not matched by an expectation fails the case
      - name: synthetic events
        events:                             # messages of the contract; `at` (seconds) replaces `time`
          - {at: 0, kind: placement, node: sched, job: j, project: p, team: t, state: running,
             ranks: [{rank: 0, node: node-01, gpu: 0}]}
        topology: {cluster: {nodes: 2}}     # with events: the cluster they run on
        expect: []

Only *firing* diagnoses count against ``strict`` unless an expectation names
``status: resolved``; resolutions always follow firings and need not be listed.
"""

from __future__ import annotations

import copy
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterable

from whywait.agents.events import ContractError, envelope, validate
from whywait.engine.diagnosis import Diagnosis
from whywait.engine.errors import RuleError
from whywait.engine.evaluate.evaluator import Evaluator
from whywait.engine.rules.loader import RuleSet
from whywait.engine.rules.yamlsrc import YamlSyntaxError, load_with_lines

START = 1_764_442_800.0
_DUR = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*(s|m)?\s*$")


class RuleTestError(RuleError):
    """A rule-test file is malformed; the message names the file, line and key."""


@dataclass
class CaseResult:
    """The outcome of one case: its failures (empty when it passed) and the diagnoses seen."""

    file: str
    name: str
    failures: list[str] = field(default_factory=list)
    diagnoses: list[Diagnosis] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not self.failures


def _offset(v: Any, where: str) -> float:
    if isinstance(v, (int, float)) and not isinstance(v, bool):
        return float(v)
    m = _DUR.match(str(v))
    if not m:
        raise RuleTestError(f"{where}: must be seconds like '120s' or '2m' (got {v!r})")
    return float(m.group(1)) * (60 if m.group(2) == "m" else 1)


def load_cases(path: Path) -> tuple[str | None, list[dict[str, Any]]]:
    """Read a test file; return ``(rule id or None, cases)``; raise :class:`RuleTestError` when malformed."""
    try:
        data, lines = load_with_lines(path.read_text())
    except YamlSyntaxError as e:
        raise RuleTestError(f"{path}:{e.line}: {e}") from None
    if not isinstance(data, dict) or not isinstance(data.get("cases"), list) or not data["cases"]:
        raise RuleTestError(f"{path}:1: must be a mapping with a non-empty 'cases' list")
    unknown = set(data) - {"rule", "cases"}
    if unknown:
        raise RuleTestError(f"{path}:1: unknown key(s) {sorted(unknown)} (valid: cases, rule)")
    for i, c in enumerate(data["cases"]):
        where = f"{path}:{lines.get(('cases', i), 1)}: cases[{i}]"
        if not isinstance(c, dict) or "name" not in c or ("scenario" in c) == ("events" in c):
            raise RuleTestError(f"{where}: needs a 'name' and exactly one of 'scenario' or 'events'")
        bad = set(c) - {"name", "scenario", "events", "topology", "expect", "strict", "start"}
        if bad:
            raise RuleTestError(f"{where}: unknown key(s) {sorted(bad)} "
                                "(valid: events, expect, name, scenario, start, strict, topology)")
        if not isinstance(c.get("expect", []), list):
            raise RuleTestError(f"{where}.expect: must be a list of expected diagnoses")
        c["_where"] = where
    return data.get("rule"), data["cases"]


def _messages(case: dict[str, Any], start: float) -> tuple[Any, Iterable[tuple[str | None, dict[str, Any]]]]:
    """Build (engine topology, messages) for a case."""
    from whywait.simulate.scenario import parse_scenario
    from whywait.simulate.sim import Simulation

    if "scenario" in case:
        sc = parse_scenario(copy.deepcopy(case["scenario"]), source=case["_where"])
        engine_topo = copy.deepcopy(sc.topology)  # the engine learns the jobs from placement messages
        sim = Simulation(sc.topology, sc.jobs, sc.faults, start_time=start, duration_s=sc.duration_s,
                         interval_s=sc.interval_s, seed=sc.seed)
        return engine_topo, sim.messages()
    sc = parse_scenario(copy.deepcopy(case.get("topology") or {"cluster": {"nodes": 4}}), source=case["_where"])
    msgs = []
    for i, ev in enumerate(case["events"]):
        ev = dict(ev)
        at = _offset(ev.pop("at", 0), f"{case['_where']}.events[{i}].at")
        where = f"{case['_where']}.events[{i}]"
        if not isinstance(ev.get("kind"), str):
            raise RuleTestError(f"{where}: needs a 'kind' (one of the contract's kinds)")
        msg = envelope(ev.pop("kind"), ev.pop("node", "node-01"), start + at, **ev)
        try:
            msgs.append((None, validate(msg)))
        except ContractError as exc:  # a malformed test event is the test file's error, with its place
            raise RuleTestError(f"{where}: breaks the event contract: {exc}") from None
    msgs.sort(key=lambda tm: tm[1]["time"])
    return sc.topology, msgs


def _matches(d: Diagnosis, exp: dict[str, Any], start: float, where: str) -> bool:
    for k, v in exp.items():
        if k == "rule":
            if d.rule_id != v:
                return False
        elif k == "detected":
            lo, hi = (_offset(x, where + ".detected") for x in v)
            if not (start + lo <= d.detected_at <= start + hi):
                return False
        elif k == "ranks":
            if not set(v) <= set(d.ranks):
                return False
        elif k == "absent":
            continue
        elif k == "text_contains":
            blob = " ".join((d.title, d.cause, d.next_step))
            if any(s not in blob for s in ([v] if isinstance(v, str) else v)):
                return False
        elif k == "labels":
            if any(d.labels.get(lk) != lv for lk, lv in v.items()):
                return False
        else:
            if not hasattr(d, k):
                raise RuleTestError(f"{where}: '{k}' is not a diagnosis field")
            if getattr(d, k) != v:
                return False
    return True


def run_case(rules: RuleSet, case: dict[str, Any], file: str = "") -> CaseResult:
    """Run one case through a fresh :class:`Evaluator`; return its result."""
    start = float(case.get("start", START))
    topo, msgs = _messages(case, start)
    ev = Evaluator(rules, topo)
    res = CaseResult(file, str(case["name"]))
    for _topic, m in msgs:
        res.diagnoses += ev.ingest(m)
    # Let pending `for` and `keep_firing_for` run out, and no longer: ticks cost time.
    tail = max((r.for_s + r.keep_firing_for_s for r in rules), default=0.0) + 10.0
    res.diagnoses += ev.advance(ev.store.max_time + tail)
    expects = case.get("expect", [])
    used: set[int] = set()
    for j, exp in enumerate(expects):
        where = f"{case['_where']}.expect[{j}]"
        exp = {"status": "firing", **exp}
        hits = [i for i, d in enumerate(res.diagnoses) if _matches(d, exp, start, where)]
        if exp.get("absent"):
            if hits:
                d = res.diagnoses[hits[0]]
                res.failures.append(f"{where}: expected no {exp.get('rule', 'diagnosis')} but got one "
                                    f"(culprit {d.culprit}, detected +{d.detected_at - start:.0f}s)")
            continue
        if not hits:
            seen = ", ".join(f"{d.rule_id}/{d.status}/{d.culprit}@+{d.detected_at - start:.0f}s"
                             for d in res.diagnoses) or "none"
            res.failures.append(f"{where}: expected {_describe(exp)}; diagnoses seen: {seen}")
            continue
        used.add(hits[0])
        # every diagnosis of the same incident is accounted for by this expectation
        fp = res.diagnoses[hits[0]].fingerprint
        used.update(i for i, d in enumerate(res.diagnoses) if d.fingerprint == fp and d.status == exp["status"])
    if case.get("strict", True):
        for i, d in enumerate(res.diagnoses):
            if i in used or d.status == "resolved":
                continue
            res.failures.append(f"{case['_where']}: unexpected {d.rule_id} ({d.status}) culprit {d.culprit} "
                                f"detected +{d.detected_at - start:.0f}s: {d.title}")
    return res


def _describe(exp: dict[str, Any]) -> str:
    return " ".join(f"{k}={v}" for k, v in exp.items())


def find_test_files(paths: Iterable[str | Path]) -> list[Path]:
    """Expand files and folders into the sorted list of ``*.test.yaml`` files."""
    out: list[Path] = []
    for p in map(Path, paths):
        if not p.exists():
            raise RuleTestError(f"{p}: no such file or folder")
        out += sorted(p.rglob("*.test.yaml")) if p.is_dir() else [p]
    return out


def run_files(rules: RuleSet, paths: Iterable[str | Path]) -> list[CaseResult]:
    """Run every case of every test file under ``paths``."""
    results: list[CaseResult] = []
    for f in find_test_files(paths):
        _, cases = load_cases(f)
        for c in cases:
            results.append(run_case(rules, c, str(f)))
    return results


def untested_rules(rules: RuleSet, paths: Iterable[str | Path]) -> list[str]:
    """Rule ids with no test file that names them (by ``rule:`` or by the file name)."""
    covered: set[str] = set()
    for f in find_test_files(paths):
        rid, _ = load_cases(f)
        covered.add(rid or f.name[: -len(".test.yaml")])
    return sorted(set(rules.rules) - covered)
