"""The rule model: typed, frozen rules parsed strictly from YAML.

Called by :mod:`whywait.engine.rules.loader` for each rule file.  Every problem in a file
is collected and reported together, each naming the file, the line, the rule id,
the key path, and what was expected against what was found::

    rules/network/straggler-retransmits.yaml:12: rule 'network.straggler-retransmits':
        'when.all[1].window' must be a duration like '60s' (got 60)

A condition node is either a combinator (``all``, ``any``, ``not``, ``macro``)
or a leaf with a ``type:`` from :data:`CONDITION_TYPES`, the explicit registry of
leaf kinds and their fields.  Evaluation lives elsewhere
(``whywait.engine.evaluate.conditions``) so this module stays a plain data model.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any, Callable

from whywait.engine.rules.metrics import METRICS
from whywait.engine.rules.yamlsrc import Path_, line_of

API_VERSION = "whywait/v1"
SEVERITIES = ("info", "warning", "critical")
AGGS = ("avg", "min", "max", "sum", "count", "last", "median", "p90", "p95", "p99", "rate", "delta")
OPS: dict[str, Callable[[float, float], bool]] = {
    ">": lambda a, b: a > b, ">=": lambda a, b: a >= b, "<": lambda a, b: a < b,
    "<=": lambda a, b: a <= b, "==": lambda a, b: a == b, "!=": lambda a, b: a != b,
}
_DURATION = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*(ms|s|m|h)\s*$")
_COMPARE = re.compile(r"^\s*(>=|<=|==|!=|>|<)\s*(-?\d+(?:\.\d+)?(?:[eE][-+]?\d+)?)\s*$")
_ID = re.compile(r"^[a-z0-9][a-z0-9-]*(\.[a-z0-9][a-z0-9-]*)+$")


class RuleSchemaError(ValueError):
    """One problem in one rule file, with its location."""

    def __init__(self, file: str, line: int, rule_id: str | None, path: str, message: str) -> None:
        self.file, self.line, self.rule_id, self.path, self.message = file, line, rule_id, path, message
        where = f"rule '{rule_id}': " if rule_id else ""
        key = f"'{path}' " if path else ""
        super().__init__(f"{file}:{line}: {where}{key}{message}")


@dataclass(frozen=True)
class Compare:
    """A comparison such as ``> 10``: ``op`` applied as ``value op threshold``."""

    op: str
    value: float

    def __call__(self, x: float) -> bool:
        return OPS[self.op](x, self.value)

    def __str__(self) -> str:
        return f"{self.op} {self.value:g}"


@dataclass(frozen=True)
class Condition:
    """A leaf condition: its ``type`` and its validated parameters."""

    type: str
    params: dict[str, Any]
    culprit: bool = False
    on: str = "job"  # "job": all the job's entities; "culprit": only the culprit's
    name: str | None = None  # a label for evidence and clean-check text
    line: int = 0


@dataclass(frozen=True)
class AllOf:
    items: tuple[Node, ...]


@dataclass(frozen=True)
class AnyOf:
    items: tuple[Node, ...]


@dataclass(frozen=True)
class Not:
    item: Node


Node = Condition | AllOf | AnyOf | Not


@dataclass(frozen=True)
class Check:
    """A clean check: reported as clean when its condition does *not* hold."""

    name: str  # Jinja2 template, e.g. "GPU clocks normal on {{ node }}"
    when: Node


@dataclass(frozen=True)
class Rule:
    """One rule, as loaded from one file."""

    id: str
    file: str
    title: str
    cause: str
    next_step: str
    severity: str
    confidence: float
    when: Node
    for_s: float = 0.0
    keep_firing_for_s: float = 0.0
    group_by: tuple[str, ...] = ("job",)
    checks: tuple[Check, ...] = ()
    # Conditions evaluated after `when` only to add their figures to the evidence (never gate firing):
    # a cause can then quote, say, the culprit's packet drops when there are any.
    evidence: tuple[Node, ...] = ()
    inhibits: tuple[str, ...] = ()
    labels: dict[str, str] = field(default_factory=dict)
    runbook_url: str | None = None
    layer: str = "compute"  # data | communication | checkpoint | compute | availability
    inhibits_line: int = 0  # where `inhibits` stands, for the loader's cross-rule errors
    culprit: str | None = None  # a template naming the culprit when it is not a node (switch, pool, job)


# ---- field kinds -------------------------------------------------------------------------------


class _Bad(Exception):
    def __init__(self, expected: str, got: Any) -> None:
        self.expected, self.got = expected, got


def _duration(v: Any) -> float:
    m = _DURATION.match(v) if isinstance(v, str) else None
    if not m:
        raise _Bad("a duration like '60s' (units ms, s, m, h)", v)
    n, unit = float(m.group(1)), m.group(2)
    return n * {"ms": 0.001, "s": 1, "m": 60, "h": 3600}[unit]


def _number(v: Any) -> float:
    if isinstance(v, bool) or not isinstance(v, (int, float)):
        raise _Bad("a number", v)
    return float(v)


def _compare(v: Any) -> Compare:
    m = _COMPARE.match(v) if isinstance(v, str) else None
    if not m:
        raise _Bad("a comparison like '> 10'", v)
    return Compare(m.group(1), float(m.group(2)))


def _metric(v: Any) -> str:
    if not isinstance(v, str) or v not in METRICS:
        raise _Bad("a known metric (see `whywait rules metrics`)", v)
    return v


def _string(v: Any) -> str:
    if not isinstance(v, str) or not v:
        raise _Bad("a non-empty string", v)
    return v


def _bool(v: Any) -> bool:
    if not isinstance(v, bool):
        raise _Bad("true or false", v)
    return v


def _enum(*choices: str) -> Callable[[Any], str]:
    def parse(v: Any) -> str:
        if v not in choices:
            raise _Bad("one of " + ", ".join(choices), v)
        return str(v)
    return parse


def _strings(v: Any) -> tuple[str, ...]:
    if not isinstance(v, list) or not all(isinstance(x, str) and x for x in v):
        raise _Bad("a list of strings", v)
    return tuple(v)


def _ints(v: Any) -> tuple[int, ...]:
    if not isinstance(v, list) or not all(isinstance(x, int) and not isinstance(x, bool) for x in v):
        raise _Bad("a list of integers", v)
    return tuple(v)


@dataclass(frozen=True)
class P:
    """A parameter of a condition type: its parser, whether required, and its default."""

    parse: Callable[[Any], Any]
    required: bool = False
    default: Any = None


_WINDOW = P(_duration, default=10.0)
_AGG = P(_enum(*AGGS), default="avg")

_STEPS = P(_number, default=5.0)  # at least this many of the latest steps, however long they take
_MEASURE = P(_enum("work", "duration_s", "compute_s", "data_wait_s", "comm_s"), default="work")
_WITHIN = P(_enum("stage", "job"), default="stage")

# The explicit registry of leaf condition types: type name -> its parameters.
CONDITION_TYPES: dict[str, dict[str, P]] = {
    # A metric's windowed aggregate against a fixed threshold, per entity.
    # ``min_entities``/``min_share``: how many (or what share) of the job's entities must match, so a
    # rule can say "the whole pool is slow" (most nodes) rather than "one node is slow".
    "threshold": {"metric": P(_metric, True), "agg": _AGG, "window": _WINDOW, "value": P(_compare, True),
                  "min_entities": P(_number, default=1.0), "min_share": P(_number, default=0.0),
                  # the window holds at least the entity's last `steps` points (rank metrics: steps)
                  "steps": P(_number, default=0.0)},
    # An entity against its job's peers: ratio to the peers' median and robust z-score.
    "peer_outlier": {"metric": P(_metric, True), "agg": _AGG, "window": _WINDOW,
                     "ratio": P(_compare), "zscore": P(_compare), "min_value": P(_compare),
                     "min_peers": P(_number, default=3.0), "direction": P(_enum("high", "low"), default="high"),
                     "steps": P(_number, default=0.0)},
    # An entity against its own past: the recent window over a baseline window before it.
    "self_history": {"metric": P(_metric, True), "agg": _AGG, "window": _WINDOW,
                     "baseline": P(_duration, default=300.0), "ratio": P(_compare, True),
                     "min_value": P(_compare), "min_baseline_points": P(_number, default=10.0),
                     # windows counted in points (steps) too: the recent window holds at least the last
                     # `steps` points and the baseline the `baseline_steps` points before them
                     "steps": P(_number, default=0.0), "baseline_steps": P(_number, default=0.0),
                     # hold only when at least this share of the job's entities grew (0: any one)
                     "min_share": P(_number, default=0.0)},
    # Successive values growing: each of the last `count` points larger than the one before.
    "trend": {"metric": P(_metric, True), "count": P(_number, default=3.0),
              "growth": P(_compare, default=Compare(">", 1.0)), "window": P(_duration, default=3600.0)},
    # A level shift inside the window: the split that best separates "before" from "after"
    # (a two-sample t statistic over every split point), with the shift's size as a ratio.
    "change_point": {"metric": P(_metric, True), "window": P(_duration, default=120.0),
                     "score": P(_compare, default=Compare(">", 6.0)), "ratio": P(_compare, True),
                     "min_segment": P(_number, default=10.0)},
    # An entity that stops reporting while its job runs.
    # ``max_share``: hold only while at most this share of the job's entities is silent (one rank gone
    # quiet while its peers report, as opposed to the whole job pausing for a checkpoint).
    "absence": {"level": P(_enum("rank", "node"), True), "for": P(_duration, True),
                "max_share": P(_number, default=1.0)},
    # Discrete events (XID, uncorrectable ECC, link down, checkpoint failure) counted in a window.
    "event": {"metric": P(_metric, True), "window": _WINDOW, "count": P(_compare, default=Compare(">=", 1)),
              "codes": P(_ints)},
    # Topology predicates over the culprit entities found by the other conditions.
    "topology": {"predicate": P(_enum("share_switch", "share_rack", "share_pool", "wrong_nic",
                                      "other_project_on_switch", "other_project_on_pool"), True),
                 "min_entities": P(_number, default=1.0),
                 # For other_project_*: the other job counts only when one of its nodes on the shared
                 # switch or pool shows ``metric`` (its ``agg`` over ``window``) matching ``value``.
                 "metric": P(_metric), "agg": _AGG, "window": _WINDOW, "value": P(_compare)},
    # ---- step-aligned conditions (engine.evaluate.step_conditions): ranks compared on the same steps
    # Ranks whose own work per step exceeds their comparable peers' (same pipeline stage): stragglers.
    "step_outlier": {"measure": _MEASURE, "window": P(_duration, default=5.0), "steps": _STEPS,
                     "ratio": P(_compare, default=Compare(">", 1.1)), "zscore": P(_compare, default=Compare(">", 4.0)),
                     "persist": P(_number, default=0.6), "within": _WITHIN, "history": P(_number, default=20.0),
                     "steady_ratio": P(_number, default=3.0), "max_share": P(_number, default=0.5),
                     "min_ranks": P(_number, default=4.0), "level": P(_enum("rank"), default="rank")},
    # Which phase (compute, input, communication) of the culprit ranks' step is slow.
    "phase": {"phase": P(_enum("any", "compute", "input", "communication"), default="any"),
              "window": P(_duration, default=5.0), "steps": _STEPS},
    # One pipeline stage slower than the others on (nearly) every data-parallel replica.
    "stage_imbalance": {"measure": _MEASURE, "window": _WINDOW, "steps": _STEPS,
                        "ratio": P(_compare, default=Compare(">", 1.15)), "persist": P(_number, default=0.6),
                        "replica_share": P(_number, default=0.9), "min_replicas": P(_number, default=2.0)},
    # A different rank slow on each step (data or sequence-length imbalance): no single culprit.
    "rotation": {"measure": _MEASURE, "window": P(_duration, default=30.0), "steps": P(_number, default=10.0),
                 "ratio": P(_compare, default=Compare(">", 1.15)), "zscore": P(_compare, default=Compare(">", 6.0)),
                 "persist": P(_number, default=0.5), "max_share": P(_number, default=0.34),
                 "min_distinct": P(_number, default=3.0), "within": _WITHIN},
    # Slowdowns of the job's step time that recur with a regular period.
    "periodic": {"window": P(_duration, default=1800.0), "ratio": P(_compare, default=Compare(">", 1.15)),
                 "zscore": P(_compare, default=Compare(">", 5.0)),
                 "min_bursts": P(_number, default=3.0), "tolerance": P(_number, default=0.25)},
    # The cost: the step time were the culprits as fast as their peers, and the time lost per step.
    "what_if": {"measure": _MEASURE, "window": _WINDOW, "steps": _STEPS, "within": _WITHIN},
}
_LEAF_COMMON = {"type", "culprit", "scope", "name"}
_RULE_KEYS = {"apiVersion", "id", "title", "cause", "next_step", "severity", "confidence", "when", "for",
              "keep_firing_for", "group_by", "checks", "inhibits", "labels", "runbook_url", "layer", "culprit",
              "evidence", "description"}
_GROUP_LABELS = ("job", "node", "rank", "gpu", "switch", "rack", "pool", "project")
_LAYERS = ("data", "communication", "checkpoint", "compute", "availability")


def _fmt_path(path: Path_) -> str:
    out = ""
    for p in path:
        out += f"[{p}]" if isinstance(p, int) else (f".{p}" if out else str(p))
    return out


class _Ctx:
    def __init__(self, file: str, lines: dict[Path_, int]) -> None:
        self.file, self.lines = file, lines
        self.rule_id: str | None = None
        self.errors: list[RuleSchemaError] = []

    def err(self, path: Path_, message: str) -> None:
        self.errors.append(RuleSchemaError(self.file, line_of(self.lines, path), self.rule_id,
                                           _fmt_path(path), message))

    def bad(self, path: Path_, e: _Bad) -> None:
        self.err(path, f"must be {e.expected} (got {e.got!r})")

    def parse(self, path: Path_, v: Any, fn: Callable[[Any], Any], default: Any = None) -> Any:
        try:
            return fn(v)
        except _Bad as e:
            self.bad(path, e)
            return default


def _parse_node(ctx: _Ctx, v: Any, path: Path_, macros: dict[str, Any], depth: int = 0) -> Node | None:
    if depth > 20:
        ctx.err(path, "conditions nest too deeply (a macro that refers to itself?)")
        return None
    if not isinstance(v, dict):
        ctx.err(path, f"must be a condition mapping (got {v!r})")
        return None
    combinators = [k for k in ("all", "any", "not", "macro") if k in v]
    if combinators:
        if len(v) != 1:
            ctx.err(path, f"'{combinators[0]}' must stand alone in its mapping (got keys {sorted(v)})")
            return None
        k = combinators[0]
        if k == "macro":
            name = v[k]
            if name not in macros:
                ctx.err(path + (k,), f"must name a defined macro ({', '.join(sorted(macros)) or 'none defined'}) "
                                     f"(got {name!r})")
                return None
            return _parse_node(ctx, macros[name], path + (k,), macros, depth + 1)
        if k == "not":
            inner = _parse_node(ctx, v[k], path + (k,), macros, depth + 1)
            return Not(inner) if inner is not None else None
        items = v[k]
        if not isinstance(items, list) or not items:
            ctx.err(path + (k,), f"must be a non-empty list of conditions (got {items!r})")
            return None
        parsed = [_parse_node(ctx, it, path + (k, i), macros, depth + 1) for i, it in enumerate(items)]
        if any(p is None for p in parsed):
            return None
        return (AllOf if k == "all" else AnyOf)(tuple(parsed))  # type: ignore[arg-type]
    t = v.get("type")
    if t not in CONDITION_TYPES:
        ctx.err(path + ("type",), f"must be one of all, any, not, macro, or a condition type "
                                  f"({', '.join(CONDITION_TYPES)}) (got {t!r})")
        return None
    spec = CONDITION_TYPES[t]
    ok = True
    for key in v:
        if key not in spec and key not in _LEAF_COMMON:
            valid = ", ".join(sorted(set(spec) | _LEAF_COMMON))
            ctx.err(path + (key,), f"is not a parameter of '{t}' (valid: {valid})")
            ok = False
    params: dict[str, Any] = {}
    for key, p in spec.items():
        if key in v:
            before = len(ctx.errors)
            params[key] = ctx.parse(path + (key,), v[key], p.parse)
            ok = ok and len(ctx.errors) == before
        elif p.required:
            ctx.err(path + (key,), f"is required for '{t}'")
            ok = False
        else:
            params[key] = p.default
    if t == "peer_outlier" and not any(params.get(k) for k in ("ratio", "zscore")):
        ctx.err(path, "'peer_outlier' needs 'ratio' or 'zscore'")
        ok = False
    if t == "topology" and ok and (params.get("metric") is None) != (params.get("value") is None):
        ctx.err(path, "'topology' needs both 'metric' and 'value' (the other job's activity) or neither")
        ok = False
    for share in ("min_share", "max_share"):
        if ok and share in params and not 0 <= params[share] <= 1:
            ctx.err(path + (share,), f"must be a share between 0 and 1 (got {params[share]:g})")
            ok = False
    culprit = ctx.parse(path + ("culprit",), v.get("culprit", False), _bool, False)
    # The key is `scope`, not `on`: YAML 1.1 reads a bare `on` key as the boolean true.
    on = ctx.parse(path + ("scope",), v.get("scope", "job"), _enum("job", "culprit"), "job")
    name = ctx.parse(path + ("name",), v["name"], _string) if "name" in v else None
    if not ok:
        return None
    return Condition(t, params, bool(culprit), on, name, line_of(ctx.lines, path))


def parse_rule(data: Any, file: str, lines: dict[Path_, int], macros: dict[str, Any] | None = None,
               expected_id: str | None = None) -> tuple[Rule | None, list[RuleSchemaError]]:
    """Parse one rule document; return ``(rule or None, every error found)``.

    Called by the loader for each file; ``macros`` are named conditions shared by
    the rule set (from ``macros.yaml``); ``expected_id`` (from the file name)
    must match the rule's ``id``.
    """
    ctx = _Ctx(file, lines)
    macros = macros or {}
    if not isinstance(data, dict):
        ctx.err((), f"must be a mapping with a rule (got {type(data).__name__})")
        return None, ctx.errors
    rid = data.get("id")
    if isinstance(rid, str):
        ctx.rule_id = rid
    for key in data:
        if key not in _RULE_KEYS:
            ctx.err((key,), f"is not a rule key (valid: {', '.join(sorted(_RULE_KEYS))})")
    if data.get("apiVersion") != API_VERSION:
        ctx.err(("apiVersion",), f"must be '{API_VERSION}' (got {data.get('apiVersion')!r})")
    if not isinstance(rid, str) or not _ID.match(rid):
        ctx.err(("id",), f"must be a dotted id like 'network.straggler-retransmits' (got {rid!r})")
    elif expected_id and rid != expected_id:
        ctx.err(("id",), f"must match the file name '{expected_id}' (got {rid!r})")
    for key in ("title", "cause", "next_step"):
        if key not in data:
            ctx.err((key,), "is required (a Jinja2 template string)")
        else:
            ctx.parse((key,), data[key], _string)
    sev = ctx.parse(("severity",), data.get("severity", "warning"), _enum(*SEVERITIES), "warning")
    conf = ctx.parse(("confidence",), data.get("confidence", 0.7), _number, 0.7)
    if conf is not None and not 0 <= conf <= 1:
        ctx.err(("confidence",), f"must be between 0 and 1 (got {conf})")
    for_s = ctx.parse(("for",), data.get("for", "0s"), _duration, 0.0)
    kff = ctx.parse(("keep_firing_for",), data.get("keep_firing_for", "0s"), _duration, 0.0)
    group_by = ctx.parse(("group_by",), data.get("group_by", ["job"]), _strings, ("job",))
    for i, g in enumerate(group_by or ()):
        if g not in _GROUP_LABELS:
            ctx.err(("group_by", i), f"must be one of {', '.join(_GROUP_LABELS)} (got {g!r})")
    inhibits = ctx.parse(("inhibits",), data.get("inhibits", []), _strings, ())
    layer = ctx.parse(("layer",), data.get("layer", "compute"), _enum(*_LAYERS), "compute")
    labels = data.get("labels", {})
    if not isinstance(labels, dict) or not all(isinstance(k, str) and isinstance(x, str) for k, x in labels.items()):
        ctx.err(("labels",), f"must be a mapping of strings to strings (got {labels!r})")
        labels = {}
    runbook = ctx.parse(("runbook_url",), data["runbook_url"], _string) if "runbook_url" in data else None
    culprit_t = ctx.parse(("culprit",), data["culprit"], _string) if "culprit" in data else None
    when = None
    if "when" not in data:
        ctx.err(("when",), "is required (the condition that fires the rule)")
    else:
        when = _parse_node(ctx, data["when"], ("when",), macros)
    checks: list[Check] = []
    raw_checks = data.get("checks", [])
    if not isinstance(raw_checks, list):
        ctx.err(("checks",), f"must be a list of {{name, when}} (got {raw_checks!r})")
        raw_checks = []
    for i, c in enumerate(raw_checks):
        p = ("checks", i)
        if not isinstance(c, dict) or set(c) - {"name", "when"} or "name" not in c or "when" not in c:
            ctx.err(p, f"must be a mapping with exactly 'name' and 'when' (got {c!r})")
            continue
        node = _parse_node(ctx, c["when"], p + ("when",), macros)
        if node is not None:
            checks.append(Check(str(c["name"]), node))
    extra: list[Node] = []
    raw_ev = data.get("evidence", [])
    if not isinstance(raw_ev, list):
        ctx.err(("evidence",), f"must be a list of conditions (got {raw_ev!r})")
        raw_ev = []
    for i, c in enumerate(raw_ev):
        node = _parse_node(ctx, c, ("evidence", i), macros)
        if node is not None:
            extra.append(node)
    if ctx.errors or when is None:
        return None, ctx.errors
    return Rule(id=str(rid), file=file, title=data["title"], cause=data["cause"], next_step=data["next_step"],
                severity=sev, confidence=float(conf), when=when, for_s=for_s, keep_firing_for_s=kff,
                group_by=tuple(group_by), checks=tuple(checks), inhibits=tuple(inhibits),
                labels=dict(labels), runbook_url=runbook, layer=layer,
                inhibits_line=line_of(lines, ("inhibits",)), culprit=culprit_t,
                evidence=tuple(extra)), []


def leaves(node: Node) -> list[Condition]:
    """Return every leaf condition under ``node`` (depth first)."""
    if isinstance(node, Condition):
        return [node]
    if isinstance(node, Not):
        return leaves(node.item)
    return [c for it in node.items for c in leaves(it)]
