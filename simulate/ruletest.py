"""Unit tests for rules, in the spirit of ``promtool test rules``.

Called by ``whywait rules test DIR|FILE...`` (and, to check without running, by
``whywait rules check``) and by the test suite (every shipped rule must have
cases).  A test file is read by :mod:`whywait.yamlio` and checked whole before
any case runs (:func:`load_cases`), so every problem has its file and line.  A test file, ``<rule id>.test.yaml``
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
``status: resolved``; resolutions always follow firings and need not be listed.  An incident a later
one took over (a rule's ``supersedes``: the first spells of a periodic slowdown, told as a slowdown of
the whole job before a period could be seen) does not count against ``strict`` either, as ``whywait
eval`` scores it: the evaluator re-announces it resolved and labelled ``superseded_by``, so what
stays with the user is the later story.  An expectation may still name it.
Offsets (``at``, ``detected``) are durations (:mod:`whywait.durations`) or plain seconds.
:func:`junit_xml` writes results for CI (``--junit FILE``).
"""

from __future__ import annotations

import copy
import dataclasses
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Collection, Iterable, Sequence

from whywait.agents.events import ContractError, envelope, validate
from whywait.engine.diagnosis import Diagnosis
from whywait.engine.errors import RuleError
from whywait.engine.evaluate.evaluator import Evaluator
from whywait.engine.rules.loader import TEST_SUFFIXES, RuleSet, is_test_file, tested_rule_id, yaml_files, yaml_hint
from whywait.engine.rules.templating import capture_render_errors

from whywait import yamlio
from whywait.durations import parse_duration
from whywait.errors import DurationError, YamlError

START = 1_764_442_800.0
MAX_AT_S = 86_400.0  # a test event's `at`: as far as a scenario's duration_s may run (RULE_TEST_LIMITS)
_TOP_KEYS = ("cases", "rule")
_CASE_KEYS = ("events", "expect", "name", "scenario", "start", "strict", "topology")
_DIAGNOSIS_FIELDS = tuple(f.name for f in dataclasses.fields(Diagnosis))
# what an expectation may state: any Diagnosis field, plus these matchers
_EXPECT_EXTRA = ("absent", "detected", "message_contains", "text_contains")
_EXPECT_KEYS = tuple(sorted(set(_DIAGNOSIS_FIELDS) | set(_EXPECT_EXTRA) | {"rule"}))


class RuleTestError(RuleError):
    """A rule-test file is malformed; each of ``problems`` names the file, line and key.

    ``str()`` is the single problem, or a count followed by every problem on its own line.
    """

    def __init__(self, problems: Sequence[str] | str) -> None:
        self.problems: tuple[str, ...] = (problems,) if isinstance(problems, str) else tuple(problems)
        text = self.problems[0] if len(self.problems) == 1 else (
            f"{len(self.problems)} problems:\n" + "\n".join(f"  {p}" for p in self.problems))
        super().__init__(text)


@dataclass
class CaseResult:
    """The outcome of one case: its failures (empty when it passed) and the diagnoses seen."""

    file: str
    name: str
    failures: list[str] = field(default_factory=list)
    diagnoses: list[Diagnosis] = field(default_factory=list)
    seconds: float = 0.0  # wall-clock time the case took (JUnit reports it)

    @property
    def ok(self) -> bool:
        return not self.failures


def _offset(v: Any, where: str) -> float:
    """Seconds from a case offset (``120``, ``120s``, ``2m``: the one duration syntax, bare seconds allowed)."""
    try:
        return parse_duration(v, bare_seconds=True)
    except DurationError as exc:
        raise RuleTestError(f"{where}: must be {exc.expected} (got {v!r})") from None


class _Checker:
    """Collects every problem of one test file, each as ``file:line: key.path: message``."""

    def __init__(self, doc: yamlio.Document) -> None:
        self.doc = doc
        self.problems: list[str] = []

    def where(self, path: yamlio.KeyPath) -> str:
        key = yamlio.format_path(path)
        return f"{self.doc.source}:{self.doc.line(path)}" + (f": {key}" if key else "")

    def err(self, path: yamlio.KeyPath, message: str) -> None:
        self.problems.append(f"{self.where(path)}: {message}")


def load_cases(path: Path, rule_ids: Collection[str] | None = None) -> tuple[str | None, list[dict[str, Any]]]:
    """Read and check a test file; return ``(rule id or None, cases)``.

    Called by ``whywait rules check`` (which runs nothing) and before ``whywait rules test`` runs a case, so a
    case that could not run is refused with its file and line, never a traceback halfway through a run.
    Checked: the keys at each level, each scenario (fault names, targets, times: the simulator's own
    parser), each event against the contract, each expectation's keys against :class:`Diagnosis`, the
    offsets, and, when ``rule_ids`` is given, that every rule named is loaded.  Raises
    :class:`RuleTestError` listing every problem found.
    """
    try:
        doc = yamlio.load(path)
    except YamlError as exc:
        raise RuleTestError(str(exc) + yaml_hint(exc)) from None
    c = _Checker(doc)
    data = doc.data
    if not isinstance(data, dict) or not isinstance(data.get("cases"), list) or not data["cases"]:
        raise RuleTestError(f"{c.where(())}: must be a mapping with a non-empty 'cases' list")
    for k in data:
        if k not in _TOP_KEYS:
            c.err((k,), f"is not a test-file key (valid: {', '.join(_TOP_KEYS)})")
    rid = data.get("rule")
    if "rule" in data and not (isinstance(rid, str) and rid):
        c.err(("rule",), f"must be the id of the rule under test (got {rid!r})")
    elif rule_ids is not None and rid is not None and rid not in rule_ids:
        c.err(("rule",), f"must name a loaded rule (got {rid!r}){_rules_hint(rule_ids)}")
    for i, case in enumerate(data["cases"]):
        _check_case(c, ("cases", i), case, rule_ids)
    if c.problems:
        raise RuleTestError(c.problems)
    return rid, data["cases"]


def _rules_hint(rule_ids: Collection[str]) -> str:
    # `rules check` takes the folder as another path, `rules test` as --rules: name neither flag
    return "; load the folder that holds it too" if rule_ids else "; no rules are loaded"


def _check_case(c: _Checker, p: yamlio.KeyPath, case: Any, rule_ids: Collection[str] | None) -> None:
    from whywait.simulate.errors import SimulationError
    from whywait.simulate.scenario import RULE_TEST_LIMITS, check_simulation, parse_scenario

    if not isinstance(case, dict):
        c.err(p, f"must be a mapping with 'name', 'expect' and 'scenario' or 'events' (got {case!r})")
        return
    ok = True
    for k in case:
        if k not in _CASE_KEYS:
            c.err(p + (k,), f"is not a case key (valid: {', '.join(_CASE_KEYS)})")
            ok = False
    if not isinstance(case.get("name"), str) or not case["name"]:
        c.err(p + ("name",), f"must be the case's name (got {case.get('name')!r})")
        ok = False
    if ("scenario" in case) == ("events" in case):
        c.err(p, "needs exactly one of 'scenario' or 'events'")
        ok = False
    if "topology" in case and "scenario" in case:
        c.err(p + ("topology",), "goes with 'events' only (a scenario has its own cluster)")
        ok = False
    start = case.get("start", START)
    if isinstance(start, bool) or not isinstance(start, (int, float)):
        c.err(p + ("start",), f"must be Unix seconds (got {start!r})")
        ok = False
    if not isinstance(case.get("strict", True), bool):
        c.err(p + ("strict",), f"must be true or false (got {case['strict']!r})")
        ok = False
    for key in ("scenario", "topology"):
        if key in case:
            try:
                sc = parse_scenario(copy.deepcopy(case[key]), source=c.doc.source, lines=c.doc.lines,
                                    prefix=p + (key,), limits=RULE_TEST_LIMITS)
                if key == "scenario":
                    check_simulation(sc, case[key], source=c.doc.source, lines=c.doc.lines, prefix=p + (key,))
            except SimulationError as exc:
                c.problems.append(str(exc))
                ok = False
    if isinstance(case.get("events"), list):
        for j, ev in enumerate(case["events"]):
            try:
                _event_message(ev, START, c.where(p + ("events", j)))
            except RuleTestError as exc:
                c.problems += exc.problems
                ok = False
    elif "events" in case:
        c.err(p + ("events",), f"must be a list of contract messages (got {case['events']!r})")
        ok = False
    expects = case.get("expect", [])
    if not isinstance(expects, list):
        c.err(p + ("expect",), f"must be a list of expected diagnoses (got {expects!r})")
        ok = False
        expects = []
    for j, exp in enumerate(expects):
        ok = _check_expect(c, p + ("expect", j), exp, rule_ids) and ok
    if ok:
        case["_where"] = c.where(p)
        case["_source"], case["_lines"], case["_prefix"] = c.doc.source, c.doc.lines, p


def _check_expect(c: _Checker, p: yamlio.KeyPath, exp: Any, rule_ids: Collection[str] | None) -> bool:
    if not isinstance(exp, dict):
        c.err(p, f"must be a mapping of diagnosis fields (got {exp!r})")
        return False
    before = len(c.problems)
    for k, v in exp.items():
        q = p + (k,)
        if k not in _EXPECT_KEYS:
            c.err(q, f"is not a diagnosis field (valid: {', '.join(_EXPECT_KEYS)})")
        elif k == "rule" and rule_ids is not None and v not in rule_ids:
            c.err(q, f"must name a loaded rule (got {v!r}){_rules_hint(rule_ids)}")
        elif k == "status" and v not in ("firing", "resolved"):
            c.err(q, f"must be firing or resolved (got {v!r})")
        elif k == "detected":
            if not isinstance(v, list) or len(v) != 2:
                c.err(q, f"must be [earliest, latest] offsets like [120s, 150s] (got {v!r})")
            else:
                for n, x in enumerate(v):
                    try:
                        _offset(x, c.where(q + (n,)))
                    except RuleTestError as exc:
                        c.problems += exc.problems
        elif k == "ranks" and not (isinstance(v, list) and all(isinstance(r, int) and not isinstance(r, bool)
                                                                for r in v)):
            c.err(q, f"must be a list of rank numbers (got {v!r})")
        elif k == "labels" and not isinstance(v, dict):
            c.err(q, f"must be a mapping of label to value (got {v!r})")
        elif k == "absent" and not isinstance(v, bool):
            c.err(q, f"must be true or false (got {v!r})")
        elif k in ("text_contains", "message_contains") and not (
                isinstance(v, str) or (isinstance(v, list) and all(isinstance(x, str) for x in v))):
            c.err(q, f"must be a string or a list of strings (got {v!r})")
    return len(c.problems) == before


def _event_message(ev: Any, start: float, where: str) -> dict[str, Any]:
    """One test event as a validated contract message at ``start`` plus its ``at``; RuleTestError otherwise."""
    if not isinstance(ev, dict):
        raise RuleTestError(f"{where}: must be a mapping (a contract message with 'kind' and 'at')")
    ev = dict(ev)
    at = _offset(ev.pop("at", 0), f"{where}.at")
    if at > MAX_AT_S:  # the evaluator ticks through the time up to the last event
        raise RuleTestError(f"{where}.at: must be at most {MAX_AT_S:,.0f}s (one day) after the start (got {at:,.0f}s)")
    if not isinstance(ev.get("kind"), str):
        raise RuleTestError(f"{where}: needs a 'kind' (one of the contract's kinds)")
    try:
        return validate(envelope(ev.pop("kind"), ev.pop("node", "node-01"), start + at, **ev))
    except ContractError as exc:  # a malformed test event is the test file's error, with its place
        raise RuleTestError(f"{where}: breaks the event contract: {exc}") from None
    except TypeError as exc:  # a key envelope() itself takes, given twice or wrongly
        raise RuleTestError(f"{where}: {exc}") from None


def _messages(case: dict[str, Any], start: float) -> tuple[Any, Iterable[tuple[str | None, dict[str, Any]]]]:
    """Build (engine topology, messages) for a case checked by :func:`load_cases`."""
    from whywait.simulate.scenario import RULE_TEST_LIMITS, parse_scenario
    from whywait.simulate.sim import Simulation

    src, lines, prefix = case.get("_source", case["_where"]), case.get("_lines"), case.get("_prefix", ())
    if "scenario" in case:
        sc = parse_scenario(copy.deepcopy(case["scenario"]), source=src, lines=lines, prefix=prefix + ("scenario",),
                            limits=RULE_TEST_LIMITS)
        engine_topo = copy.deepcopy(sc.topology)  # the engine learns the jobs from placement messages
        sim = Simulation(sc.topology, sc.jobs, sc.faults, start_time=start, duration_s=sc.duration_s,
                         interval_s=sc.interval_s, seed=sc.seed)
        return engine_topo, sim.messages()
    sc = parse_scenario(copy.deepcopy(case.get("topology") or {"cluster": {"nodes": 4}}), source=src, lines=lines,
                        prefix=prefix + ("topology",), limits=RULE_TEST_LIMITS)
    msgs = [(None, _event_message(ev, start, _where(case, "events", i))) for i, ev in enumerate(case["events"])]
    msgs.sort(key=lambda tm: tm[1]["time"])
    return sc.topology, msgs


def _where(case: dict[str, Any], *path: Any) -> str:
    """``file:line: cases[i].<path>`` for a part of a case loaded by :func:`load_cases`."""
    lines, prefix = case.get("_lines"), case.get("_prefix")
    if lines is None or prefix is None:
        return f"{case['_where']}.{yamlio.format_path(path)}"
    full = tuple(prefix) + path
    return f"{case.get('_source', '')}:{yamlio.line_of(lines, full)}: {yamlio.format_path(full)}"


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
        elif k == "message_contains":
            # the whole message as its channel reads it (evidence lines, path, checks), what `rules test --show`
            # prints: a rule author's assertion on an evidence figure or a checked-and-clean line
            from whywait.engine.notify.render import plain_text

            blob = plain_text(d, now=d.detected_at)
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
    with capture_render_errors() as render_failed:
        for _topic, m in msgs:
            res.diagnoses += ev.ingest(m)
        # Let pending `for` and `keep_firing_for` run out, and no longer: ticks cost time.
        tail = max((r.for_s + r.keep_firing_for_s for r in rules), default=0.0) + 10.0
        res.diagnoses += ev.advance(ev.store.max_time + tail)
    # A rule that raised, or a text that failed to render, is a broken rule: the case fails, one line each.
    for rid, n in (getattr(ev, "rule_errors", None) or {}).items():
        last = (getattr(ev, "rule_error_last", None) or {}).get(rid, "an error")
        res.failures.append(f"{case['_where']}: rule {rid} raised on {n} tick{'s' if n != 1 else ''}: "
                            f"{_one_line(last)}")
    res.failures += [f"{case['_where']}: {_one_line(str(e))}" for e in render_failed]
    expects = case.get("expect", [])
    used: set[int] = set()
    for j, exp in enumerate(expects):
        where = _where(case, "expect", j)
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
        taken_over = {d.fingerprint for d in res.diagnoses if d.labels.get("superseded_by")}
        for i, d in enumerate(res.diagnoses):
            if i in used or d.status == "resolved" or d.fingerprint in taken_over:
                continue
            res.failures.append(f"{case['_where']}: unexpected {d.rule_id} ({d.status}) culprit {d.culprit} "
                                f"detected +{d.detected_at - start:.0f}s: {d.title}")
    return res


def _one_line(text: str) -> str:
    return " ".join(text.split())


def _describe(exp: dict[str, Any]) -> str:
    return " ".join(f"{k}={v}" for k, v in exp.items())


def find_test_files(paths: Iterable[str | Path]) -> list[Path]:
    """Expand files and folders into the sorted list of ``*.test.yaml`` (and ``*.test.yml``) files.

    A missing path, or a file not named as a test, is one line.
    """
    out: list[Path] = []
    for p in map(Path, paths):
        if not p.exists():
            raise RuleTestError(f"{p}: no such file or folder")
        if p.is_file() and not is_test_file(p):
            raise RuleTestError(f"{p}: is not a rule-test file (its name must end in {' or '.join(TEST_SUFFIXES)})")
        out += sorted(f for f in yaml_files(p) if is_test_file(f)) if p.is_dir() else [p]
    return out


def load_files(rules: RuleSet, paths: Iterable[str | Path]) -> list[tuple[Path, list[dict[str, Any]]]]:
    """Load and check every test file under ``paths`` against ``rules``, before any case runs.

    Raises one :class:`RuleTestError` listing the problems of every file, so a long run never stops halfway.
    """
    loaded: list[tuple[Path, list[dict[str, Any]]]] = []
    problems: list[str] = []
    for f in find_test_files(paths):
        try:
            # a rule an override disabled is known: a case may name it (expecting it absent, say)
            loaded.append((f, load_cases(f, {*rules.rules, *rules.disabled})[1]))
        except RuleTestError as exc:
            problems += exc.problems
    if problems:
        raise RuleTestError(problems)
    return loaded


def run_files(rules: RuleSet, paths: Iterable[str | Path], *, on_start: Callable[[int, int], None] | None = None,
              on_result: Callable[[CaseResult], None] | None = None) -> list[CaseResult]:
    """Run every case of every test file under ``paths`` (all checked first, see :func:`load_files`).

    ``on_start(cases, files)`` is called once every file has loaded, and ``on_result`` after each case, so
    ``whywait rules test`` shows each result as it comes (the whole shipped tree takes minutes).
    """
    loaded = load_files(rules, paths)
    if on_start is not None:
        on_start(sum(len(cases) for _, cases in loaded), len(loaded))
    results: list[CaseResult] = []
    for f, cases in loaded:
        for c in cases:
            t0 = time.perf_counter()
            res = run_case(rules, c, str(f))
            res.seconds = time.perf_counter() - t0
            results.append(res)
            if on_result is not None:
                on_result(res)
    return results


def untested_rules(rules: RuleSet, paths: Iterable[str | Path]) -> list[str]:
    """Rule ids with no test file that names them (by ``rule:`` or by the file name)."""
    covered: set[str] = set()
    for f in find_test_files(paths):
        rid, _ = load_cases(f)
        covered.add(rid or tested_rule_id(f))
    return sorted(set(rules.rules) - covered)


def junit_xml(results: Sequence[CaseResult]) -> str:
    """The results as JUnit XML (one ``<testsuite>`` per test file), for CI systems that draw test reports.

    Called by ``whywait rules test --junit FILE``.  A failed case carries its failures as the
    ``<failure>`` text; the ``classname`` is the test file, so CI groups cases by rule.
    """
    import xml.etree.ElementTree as ET

    root = ET.Element("testsuites", name="whywait rules test", tests=str(len(results)),
                      failures=str(sum(not r.ok for r in results)),
                      time=f"{sum(r.seconds for r in results):.3f}")
    by_file: dict[str, list[CaseResult]] = {}
    for r in results:
        by_file.setdefault(r.file, []).append(r)
    for file, rs in by_file.items():
        suite = ET.SubElement(root, "testsuite", name=file, tests=str(len(rs)), failures=str(sum(not r.ok for r in rs)),
                              errors="0", skipped="0", time=f"{sum(r.seconds for r in rs):.3f}")
        for r in rs:
            case = ET.SubElement(suite, "testcase", classname=file, name=r.name, time=f"{r.seconds:.3f}")
            if not r.ok:
                fail = ET.SubElement(case, "failure", message=r.failures[0][:500], type="RuleTestFailure")
                fail.text = "\n".join(r.failures)
    ET.indent(root)
    return ET.tostring(root, encoding="unicode", xml_declaration=True) + "\n"
