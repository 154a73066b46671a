"""The rule model: typed, frozen rules parsed strictly from YAML.

Called by :mod:`whywait.engine.rules.loader` for each rule file.  Every problem in a file
is collected and reported together, each naming the file, the line, the rule id,
the key path, and what was expected against what was found::

    rules/network/straggler-retransmits.yaml:12: rule 'network.straggler-retransmits':
        'when.all[1].window' must be a duration like '60s' (got 60)

A condition node is either a combinator (``all``, ``any``, ``not``, ``macro``)
or a leaf with a ``type:`` from :data:`whywait.engine.rules.condition_types.CONDITIONS`, the one
registry of condition types: each a typed, frozen class whose fields are the leaf's keys,
registered with its evaluation (which lives in ``whywait.engine.evaluate``).
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any, Callable

from whywait.engine.diagnosis import SEVERITIES
from whywait.engine.errors import RuleError
from whywait.engine.rules.condition_types import (
    AGGS,
    OPS,
    Bad,
    Compare,
    ConditionParams,
    bound_problems,
    condition_types,
    duration_text,
    enum,
    parse_duration,
    parse_number,
)

from whywait.yamlio import KeyPath as Path_
from whywait.yamlio import line_of

__all__ = ["AGGS", "OPS", "Compare", "API_VERSION", "SEVERITIES", "RuleSchemaError", "Condition", "AllOf", "AnyOf",
           "Not", "Node", "Check", "Rule", "parse_rule", "leaves"]

API_VERSION = "whywait/v1"
_ID = re.compile(r"^[a-z0-9][a-z0-9-]*(\.[a-z0-9][a-z0-9-]*)+$")


class RuleSchemaError(RuleError, ValueError):
    """One problem in one rule file, with its location (a :class:`RuleError`; a ``ValueError`` for old callers)."""

    def __init__(self, file: str, line: int, rule_id: str | None, path: str, message: str) -> None:
        self.file, self.line, self.rule_id, self.path, self.message = file, line, rule_id, path, message
        where = f"rule '{rule_id}': " if rule_id else ""
        key = f"'{path}' " if path else ""
        super().__init__(f"{file}:{line}: {where}{key}{message}" if line else f"{file}: {where}{key}{message}")


@dataclass(frozen=True)
class Condition:
    """A leaf condition: its ``type`` and its validated parameters."""

    type: str
    params: ConditionParams  # the type's typed, frozen parameters (engine.rules.condition_types)
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
    # Evaluated only on the ticks at a multiple of this much event time (0: every tick): a rule over slow
    # signals (a PCIe link's width, a NIC's speed) need not be judged every second.  Between evaluations
    # its incidents stay as they were (see Evaluator.tick).
    every_s: float = 0.0
    group_by: tuple[str, ...] = ("job",)
    checks: tuple[Check, ...] = ()
    # Conditions evaluated after `when` only to add their figures to the evidence (never gate firing):
    # a cause can then quote, say, the culprit's packet drops when there are any.
    evidence: tuple[Node, ...] = ()
    inhibits: tuple[str, ...] = ()
    # Rules whose incidents for the same job this rule takes over when it fires (and inhibits while it
    # does): a pattern that can only be seen in hindsight (a period needs three spells) re-labels the
    # incidents its own evidence covers, which a rule firing on one spell opened before it could know.
    supersedes: tuple[str, ...] = ()
    labels: dict[str, str] = field(default_factory=dict)
    runbook_url: str | None = None
    layer: str = "compute"  # data | communication | checkpoint | compute | availability
    inhibits_line: int = 0  # where `inhibits` stands, for the loader's cross-rule errors
    supersedes_line: int = 0
    culprit: str | None = None  # a template naming the culprit when it is not a node (switch, pool, job)


# ---- rule-level field kinds (a leaf's parameters are read by engine.rules.condition_types) --------

_Bad = Bad
_duration = parse_duration
_number = parse_number
_enum = enum


def _string(v: Any) -> str:
    if not isinstance(v, str) or not v:
        raise _Bad("a non-empty string", v)
    return v


def _bool(v: Any) -> bool:
    if not isinstance(v, bool):
        raise _Bad("true or false", v)
    return v


# The longest evaluation interval a rule may ask for: past it a fault would go unseen for minutes.
EVERY_MAX_S = 60.0


def _every(v: Any) -> float:
    """A rule's evaluation interval: a duration of whole seconds, from 1s to :data:`EVERY_MAX_S`.

    Whole seconds, because ticks come once per second of event time and a rule is evaluated on the
    ticks at a multiple of it (``now % every == 0``).
    """
    s = parse_duration(v)
    if not (1.0 <= s <= EVERY_MAX_S and float(s).is_integer()):
        raise _Bad(f"a duration of whole seconds from 1s to {EVERY_MAX_S:g}s", v)
    return s


# The longest `for` and `keep_firing_for`.  The shipped rules hold 0-4 s and keep firing 20 s-5 min; an hour
# is twelve times the longest.  A condition that must hold over an hour before it is told has cost a training job
# more than the diagnosis saves, and an incident kept firing an hour after its cause ended misleads whoever is
# paged.  The bound also keeps `rules test`, which runs each case on by `for` + `keep_firing_for`, to minutes.
FOR_MAX_S = 3600.0


def _for(v: Any) -> float:
    """A rule's ``for`` or ``keep_firing_for``: a duration from 0s to :data:`FOR_MAX_S`."""
    s = parse_duration(v)
    if not 0.0 <= s <= FOR_MAX_S:
        raise _Bad(f"a duration from 0s to {duration_text(FOR_MAX_S)}", v)
    return s


def _strings(v: Any) -> tuple[str, ...]:
    if not isinstance(v, list) or not all(isinstance(x, str) and x for x in v):
        raise _Bad("a list of strings", v)
    return tuple(v)


_LEAF_COMMON = {"type", "culprit", "scope", "name"}
_RULE_KEYS = {"apiVersion", "id", "title", "cause", "next_step", "severity", "confidence", "when", "for",
              "keep_firing_for", "every", "group_by", "checks", "inhibits", "supersedes", "labels", "runbook_url",
              "layer", "culprit", "evidence", "description"}
# The labels the evaluator gives an incident from its culprit (what `group_by` may name, and a silence match).
GROUP_LABELS = ("job", "node", "rank", "gpu", "switch", "rack", "pool", "project")
_LAYERS = ("data", "communication", "checkpoint", "compute", "availability")


def _fmt_path(path: Path_) -> str:
    out = ""
    for p in path:
        out += f"[{p}]" if isinstance(p, int) else (f".{p}" if out else str(p))
    return out


class _Ctx:
    def __init__(self, file: str, lines: dict[Path_, int],
                 macro_lines: dict[str, tuple[str, dict[Path_, int]]] | None = None) -> None:
        self.file, self.lines = file, lines
        self.rule_id: str | None = None
        self.errors: list[RuleSchemaError] = []
        self.paths: list[Path_] = []  # each error's key path, as a tuple (for moving it into its macro's file)
        self.macro_lines = macro_lines or {}

    def err(self, path: Path_, message: str) -> None:
        self.errors.append(RuleSchemaError(self.file, line_of(self.lines, path), self.rule_id,
                                           _fmt_path(path), message))
        self.paths.append(path)

    def to_macro(self, since: int, at: Path_, name: str) -> None:
        """Place the errors from ``since`` on that lie inside macro ``name`` (used at ``at``) in the macros file.

        A value of the macro's own is wrong wherever it is used: the error names the macros file's line and the
        macro's key path, once (the loader drops the same error from the other rules using it), not the rule.
        """
        if name not in self.macro_lines:
            return
        file, lines = self.macro_lines[name]
        for i in range(since, len(self.errors)):
            p, e = self.paths[i], self.errors[i]
            if len(p) > len(at) and p[:len(at)] == at and e.file == self.file:
                where = ("macros", name) + tuple(p[len(at):])
                self.errors[i] = RuleSchemaError(file, line_of(lines, where), None, _fmt_path(where), e.message)
                self.paths[i] = where

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
                # With none at all, the usual slip is a sub-folder loaded without the macros.yaml above it.
                have = (', '.join(sorted(macros)) if macros else
                        "none defined: load the folder holding macros.yaml too, e.g. --rules rules")
                ctx.err(path + (k,), f"must name a defined macro ({have}) (got {name!r})")
                return None
            before = len(ctx.errors)
            node = _parse_node(ctx, macros[name], path + (k,), macros, depth + 1)
            ctx.to_macro(before, path + (k,), name)
            return node
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
    types_ = condition_types()
    t = v.get("type")
    if t not in types_:
        ctx.err(path + ("type",), f"must be one of all, any, not, macro, or a condition type "
                                  f"({', '.join(types_)}) (got {t!r})")
        return None
    ct = types_[t]
    ok = True
    for key in v:
        if ct.spec(key) is None and key not in _LEAF_COMMON:
            valid = ", ".join(sorted({s.key for s in ct.specs} | _LEAF_COMMON))
            ctx.err(path + (key,), f"is not a parameter of '{t}' (valid: {valid})")
            ok = False
    values: dict[str, Any] = {}
    for spec in ct.specs:
        if spec.key in v:
            before = len(ctx.errors)
            values[spec.attr] = ctx.parse(path + (spec.key,), v[spec.key], spec.kind.parse)
            ok = ok and len(ctx.errors) == before
        elif spec.required:
            ctx.err(path + (spec.key,), f"is required for '{t}'")
            ok = False
    params: ConditionParams | None = None
    if ok:
        params = ct.params(**values)
        problem = params.check()
        if problem:
            ctx.err(path, problem)
            ok = False
        for key, message in bound_problems(ct, params, values):
            ctx.err(path + (key,), message)
            ok = False
    culprit = ctx.parse(path + ("culprit",), v.get("culprit", False), _bool, False)
    # The key is `scope`, not `on`: YAML 1.1 reads a bare `on` key as the boolean true.
    on = ctx.parse(path + ("scope",), v.get("scope", "job"), _enum("job", "culprit"), "job")
    name = ctx.parse(path + ("name",), v["name"], _string) if "name" in v else None
    if not ok or params is None:
        return None
    return Condition(t, params, bool(culprit), on, name, line_of(ctx.lines, path))


def parse_rule(data: Any, file: str, lines: dict[Path_, int], macros: dict[str, Any] | None = None,
               expected_id: str | None = None,
               macro_lines: dict[str, tuple[str, dict[Path_, int]]] | None = None,
               ) -> tuple[Rule | None, list[RuleSchemaError]]:
    """Parse one rule document; return ``(rule or None, every error found)``.

    Called by the loader for each file; ``macros`` are named conditions shared by
    the rule set (from ``macros.yaml``); ``expected_id`` (from the file name)
    must match the rule's ``id``; ``macro_lines`` (macro name -> its file and that file's lines) places an
    error in a macro's own value at its line in the macros file.
    """
    ctx = _Ctx(file, lines, macro_lines)
    macros = macros or {}
    if not isinstance(data, dict):
        ctx.err((), f"must be a mapping with a rule (got {type(data).__name__})")
        return None, ctx.errors
    rid = data.get("id")
    if isinstance(rid, str):
        ctx.rule_id = rid
    if data and not any(k in _RULE_KEYS for k in data):
        # No key of a rule at all: another YAML file (a topology, a scenario) left in a rules folder.  One line,
        # not one per key and one per missing key (ten for a three-key topology file).
        keys = ", ".join(str(k) for k in list(data)[:5]) + (", ..." if len(data) > 5 else "")
        ctx.err((), f"not a rule file: none of its keys ({keys}) is a rule's; move it out of the rules folder")
        return None, ctx.errors
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
    for_s = ctx.parse(("for",), data.get("for", "0s"), _for, 0.0)
    kff = ctx.parse(("keep_firing_for",), data.get("keep_firing_for", "0s"), _for, 0.0)
    every = ctx.parse(("every",), data["every"], _every, 0.0) if "every" in data else 0.0
    group_by = ctx.parse(("group_by",), data.get("group_by", ["job"]), _strings, ("job",))
    for i, g in enumerate(group_by or ()):
        if g not in GROUP_LABELS:
            ctx.err(("group_by", i), f"must be one of {', '.join(GROUP_LABELS)} (got {g!r})")
    inhibits = ctx.parse(("inhibits",), data.get("inhibits", []), _strings, ())
    supersedes = ctx.parse(("supersedes",), data.get("supersedes", []), _strings, ())
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
                severity=sev, confidence=float(conf), when=when, for_s=for_s, keep_firing_for_s=kff, every_s=every,
                group_by=tuple(group_by), checks=tuple(checks), inhibits=tuple(inhibits),
                supersedes=tuple(supersedes), labels=dict(labels), runbook_url=runbook, layer=layer,
                inhibits_line=line_of(lines, ("inhibits",)), culprit=culprit_t,
                supersedes_line=line_of(lines, ("supersedes",)),
                evidence=tuple(extra)), []


def leaves(node: Node) -> list[Condition]:
    """Return every leaf condition under ``node`` (depth first)."""
    if isinstance(node, Condition):
        return [node]
    if isinstance(node, Not):
        return leaves(node.item)
    return [c for it in node.items for c in leaves(it)]
