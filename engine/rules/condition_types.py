"""Condition types: one typed, frozen class per YAML ``type:``, registered once with its evaluation.

A condition type is a frozen dataclass whose fields *are* its YAML schema.  A field's annotation
says what its key takes (:data:`Duration`, :data:`Comparison`, :data:`MetricName`, :data:`Number`,
:data:`Share`, :data:`Codes`, or a ``Literal`` of words); a default makes the key optional, no
default makes it required; ``| None`` with a ``None`` default makes it optional with no value.
The YAML key is the field name without a trailing underscore (``for_`` reads ``for:``).  Its
evaluation is registered with it, beside it, by :func:`condition`::

    @dataclass(frozen=True)
    class TrendCondition(ConditionParams):
        '''Successive values growing: each of the last ``count`` points larger than the one before.'''

        metric: MetricName = param(doc="the metric")
        count: Number = param(3.0, "the last `count` points (so `count + 1` values) must each grow")

    @condition("trend", TrendCondition)
    def _trend(c: Condition, ctx: Ctx) -> Result: ...

:data:`CONDITIONS` is the one registry: the rule schema (:mod:`whywait.engine.rules.schema`), the
generated condition tables of ``docs/rules.md``, ``whywait rules conditions`` and the evaluator
all read it, so they cannot disagree.  The classes live beside their evaluation in
``whywait.engine.evaluate``; :func:`condition_types` imports those modules (listed in
:data:`EVALUATION_MODULES`, an explicit list, not a scan) the first time the registry is read.
"""

from __future__ import annotations

import dataclasses
import importlib
import keyword
import re
import types
import typing
from dataclasses import dataclass
from typing import Annotated, Any, Callable, ClassVar, Collection, Literal, TypeVar, Union

from whywait.engine.errors import RuleError
from whywait.engine.rules.metrics import METRICS

from whywait.durations import EXPECTED as DURATION_EXPECTED
from whywait.durations import format_duration
from whywait.durations import parse_duration as parse_duration_
from whywait.errors import DurationError

# ---- field kinds: how a YAML value is read ---------------------------------------------------------

_COMPARE = re.compile(r"^\s*(>=|<=|==|!=|>|<)\s*(-?\d+(?:\.\d+)?(?:[eE][-+]?\d+)?)\s*$")
OPS: dict[str, Callable[[float, float], bool]] = {
    ">": lambda a, b: a > b, ">=": lambda a, b: a >= b, "<": lambda a, b: a < b,
    "<=": lambda a, b: a <= b, "==": lambda a, b: a == b, "!=": lambda a, b: a != b,
}
AGGS = ("avg", "min", "max", "sum", "count", "last", "median", "p90", "p95", "p99", "rate", "delta")


class Bad(RuleError):
    """A value a kind refuses: what was expected and what was given (the schema turns it into a
    :class:`~whywait.engine.rules.schema.RuleSchemaError` with file:line before a user sees it)."""

    def __init__(self, expected: str, got: Any) -> None:
        super().__init__(expected)
        self.expected, self.got = expected, got


@dataclass(frozen=True)
class Compare:
    """A comparison such as ``> 10``: ``op`` applied as ``value op threshold``."""

    op: str
    value: float

    def __call__(self, x: float) -> bool:
        return OPS[self.op](x, self.value)

    def __str__(self) -> str:
        return f"{self.op} {self.value:g}"

    def halfway(self, x: float, origin: float = 1.0) -> bool:
        """Whether ``x`` lies at least half-way from ``origin`` to the threshold, on the threshold's side.

        Called for a finding that held on the tick before: the hysteresis it keeps.  A ratio compared
        ``> 1.2`` still holds at 1.1, one compared ``< 0.5`` at 0.75; any other comparison is itself.
        """
        mid = origin + (self.value - origin) / 2
        if self.op in (">", ">="):
            return x >= mid
        if self.op in ("<", "<="):
            return x <= mid
        return self(x)


def parse_duration(v: Any) -> float:
    """``'60s'`` → 60.0 in the one duration syntax (:mod:`whywait.durations`); raise :class:`Bad` otherwise
    (bare numbers too: a rule says its unit)."""
    try:
        return parse_duration_(v)
    except DurationError:
        raise Bad(DURATION_EXPECTED, v) from None


def parse_number(v: Any) -> float:
    if isinstance(v, bool) or not isinstance(v, (int, float)):
        raise Bad("a number", v)
    return float(v)


def parse_share(v: Any) -> float:
    x = parse_number(v)
    if not 0 <= x <= 1:
        raise Bad("a share between 0 and 1", v)
    return x


def parse_compare(v: Any) -> Compare:
    m = _COMPARE.match(v) if isinstance(v, str) else None
    if not m:
        raise Bad("a comparison like '> 10'", v)
    return Compare(m.group(1), float(m.group(2)))


def parse_metric(v: Any) -> str:
    if not isinstance(v, str) or v not in METRICS:
        import difflib

        # a misspelt name is the usual cause: name the metric meant, as the CLI does for a misspelt option
        near = difflib.get_close_matches(v, list(METRICS), n=1, cutoff=0.8) if isinstance(v, str) else []
        raise Bad(f"a known metric (see `whywait rules metrics`{'; did you mean ' + near[0] + '?' if near else ''})",
                  v)
    return v


def parse_ints(v: Any) -> tuple[int, ...]:
    if not isinstance(v, list) or not all(isinstance(x, int) and not isinstance(x, bool) for x in v):
        raise Bad("a list of integers", v)
    return tuple(v)


def enum(*choices: str) -> Callable[[Any], str]:
    """A parser accepting exactly one of ``choices``."""
    def parse(v: Any) -> str:
        if v not in choices:
            raise Bad("one of " + ", ".join(choices), v)
        return str(v)
    return parse


@dataclass(frozen=True)
class Kind:
    """What a parameter takes: a short name for the docs and the parser that reads and checks it."""

    text: str
    parse: Callable[[Any], Any]


# ---- bounds: what the engine can honour ------------------------------------------------------------------
# A value past these is refused by the schema at its file and line (`whywait rules check`, and every load of
# the rules), never left to a tick that reads a window nothing fills or a run-out that never ends.

#: Event time the metric store keeps of per-entity telemetry (ranks, GPUs, nodes, NICs, devices) and
#: occurrences: :class:`whywait.engine.evaluate.store.MetricStore`'s default ``retention_s``.
RETENTION_S = 900.0
#: Event time it keeps of job-level series (``MetricStore.job_retention_s``): the longest history of all.
JOB_RETENTION_S = 3600.0
#: Steps a job's step table keeps (``engine.evaluate.steps.StepTable``): what a count of steps can reach.
STEPS_KEPT = 600
#: The shortest window: ticks come once a second of event time, and so does telemetry.
MIN_WINDOW_S = 1.0


def duration_text(s: float) -> str:
    """``900`` -> ``15m``, ``3600`` -> ``1h``, ``0.5`` -> ``500ms``: how a bound is written in a message."""
    return format_duration(s)


def parse_window(v: Any) -> float:
    """A condition's duration (``window``, ``baseline``, an absence's ``for``): from 1s to the longest history
    the engine keeps (:data:`JOB_RETENTION_S`); what a metric's own retention allows more is checked by
    :func:`bound_problems`."""
    s = parse_duration(v)
    if not MIN_WINDOW_S <= s <= JOB_RETENTION_S:
        raise Bad(f"a duration from {duration_text(MIN_WINDOW_S)} (a tick's second) to "
                  f"{duration_text(JOB_RETENTION_S)} (the longest history the metric store keeps)", v)
    return s


Duration = Annotated[float, Kind("duration", parse_window)]
Number = Annotated[float, Kind("number", parse_number)]
Share = Annotated[float, Kind("share (0–1)", parse_share)]
Comparison = Annotated[Compare, Kind("comparison", parse_compare)]
MetricName = Annotated[str, Kind("metric", parse_metric)]
Codes = Annotated[tuple[int, ...], Kind("list of integers", parse_ints)]
Agg = Annotated[str, Kind("aggregation", enum(*AGGS))]


#: Parameters that count points or steps (whole numbers, from 1 to the bound; a parameter whose default is 0,
#: "off", may also be 0), and why each bound.
COUNTS: dict[str, tuple[int, str]] = {
    "steps": (STEPS_KEPT, f"a job's step table keeps its last {STEPS_KEPT} steps"),
    "baseline_steps": (STEPS_KEPT, f"a job's step table keeps its last {STEPS_KEPT} steps"),
    "history": (STEPS_KEPT, f"a job's step table keeps its last {STEPS_KEPT} steps"),
    "count": (STEPS_KEPT, f"at most {STEPS_KEPT} points are judged"),
    "min_segment": (STEPS_KEPT // 2, f"both sides of a split must fit in {STEPS_KEPT} points"),
    "min_baseline_points": (int(JOB_RETENTION_S), f"a baseline holds at most one point a second of the "
                                                  f"{duration_text(JOB_RETENTION_S)} kept"),
    "levels": (16, "each level doubles the size of turn judged; past 16 none is ever seen"),
}


def param(default: Any = dataclasses.MISSING, doc: str = "") -> Any:
    """A condition parameter: its default (none: required) and one line for the docs."""
    return dataclasses.field(default=default, metadata={"doc": doc})


# ---- the base class and the registry ---------------------------------------------------------------


@dataclass(frozen=True)
class ParamSpec:
    """One parameter as the schema and the docs see it (derived from a dataclass field)."""

    key: str  # the YAML key
    attr: str  # the attribute on the params object
    kind: Kind
    required: bool
    default: Any
    doc: str


class ConditionParams:
    """Base of every condition type's parameters: a frozen dataclass, one field per YAML key.

    Subclasses may override :meth:`check` for rules that span several keys.  Reading a
    parameter is an attribute read (``p.window``); ``p["window"]`` also works, so evaluation
    bodies written against the older dict of parameters keep reading the same values.
    """

    type_name: ClassVar[str] = ""

    def check(self) -> str | None:
        """Return what is wrong across keys (one phrase), or None; called once after every key parsed."""
        return None

    def __getitem__(self, key: str) -> Any:
        try:
            return getattr(self, key + "_" if keyword.iskeyword(key) else key)
        except AttributeError:
            raise KeyError(key) from None

    def entity_level(self) -> str | None:
        """The level of the entities this condition matches (from its metric or ``level``), or None."""
        metric = getattr(self, "metric", None)
        if metric is not None:
            return METRICS[metric].level
        level = getattr(self, "level", None)
        return level if isinstance(level, str) else None

    def recent_s(self) -> float:
        """The longest recent window this condition reads: its ``window`` or ``for`` (baselines left out)."""
        spans = [getattr(self, "window", None), getattr(self, "for_", None)]
        return max((float(x) for x in spans if isinstance(x, (int, float))), default=0.0)


def kept_s(metric: str) -> float:
    """Event time the metric store keeps of ``metric``: :data:`JOB_RETENTION_S` at job level, else
    :data:`RETENTION_S`."""
    return JOB_RETENTION_S if METRICS[metric].level == "job" else RETENTION_S


def bound_problems(ct: ConditionType, params: ConditionParams, given: Collection[str]) -> list[tuple[str, str]]:
    """``(key, what is wrong)`` for each parameter of ``params`` the rule gives (``given``: their attribute names)
    past its bound (see :data:`COUNTS`), and for a given window (or baseline) that with the other reaches back
    further than the store keeps of a metric the condition names.  A type's own defaults are not judged: a
    `trend`'s hour, meant for job-level series, reads what there is of a GPU's.

    Called by the schema after every key parsed; the durations' own range is checked as each is parsed.
    """
    out: list[tuple[str, str]] = []
    for s in ct.specs:
        v = getattr(params, s.attr)
        if s.key in COUNTS and s.kind.text == "number" and v is not None and s.attr in given:
            top, why = COUNTS[s.key]
            low = 0 if s.default == 0 else 1
            if not (float(v).is_integer() and low <= v <= top):
                out.append((s.key, f"must be a whole number from {low} to {top}: {why} (got {v:g})"))
    metrics = [getattr(params, s.attr) for s in ct.specs if s.kind.text == "metric"]
    metrics = [m for m in metrics if isinstance(m, str) and m in METRICS]
    window = getattr(params, "window", None)
    if metrics and isinstance(window, float) and ({"window", "baseline"} & set(given)):
        m = min(metrics, key=kept_s)
        kept = kept_s(m)
        baseline = getattr(params, "baseline", None)
        reach = window + (baseline if isinstance(baseline, float) else 0.0)
        if reach > kept:
            key, what = (("baseline", f"plus 'window' reaches back {duration_text(reach)}")
                         if isinstance(baseline, float) and window <= kept else ("window", "reaches back "
                                                                                 f"{duration_text(reach)}"))
            out.append((key, f"{what}, but the metric store keeps only {duration_text(kept)} of {m} "
                             f"({METRICS[m].level} level), so the window is never filled: at most "
                             f"{duration_text(kept)} in all"))
    return out


P = TypeVar("P", bound=ConditionParams)


@dataclass(frozen=True)
class ConditionType:
    """A registered condition type: its YAML name, its parameters class and its evaluation."""

    name: str
    params: type[ConditionParams]
    evaluate: Callable[[Any, Any], Any]  # (Condition, engine.evaluate.conditions.Ctx) -> Result
    specs: tuple[ParamSpec, ...]
    doc: str

    def spec(self, key: str) -> ParamSpec | None:
        return next((s for s in self.specs if s.key == key), None)


CONDITIONS: dict[str, ConditionType] = {}
"""The one registry of leaf condition types, in registration (and documentation) order."""

# The modules whose ``@condition`` registrations fill :data:`CONDITIONS`: explicit, not scanned.
EVALUATION_MODULES = ("whywait.engine.evaluate.conditions", "whywait.engine.evaluate.step_conditions")


def condition_types() -> dict[str, ConditionType]:
    """Return the registry, importing the evaluation modules first (once); called by the schema and CLI."""
    for m in EVALUATION_MODULES:
        importlib.import_module(m)
    return CONDITIONS


def _kind_of(hint: Any) -> tuple[Kind, bool]:
    """The :class:`Kind` of an annotation and whether it admits None."""
    optional = False
    if typing.get_origin(hint) in (Union, types.UnionType):
        args = [a for a in typing.get_args(hint) if a is not type(None)]
        optional = len(args) < len(typing.get_args(hint))
        if len(args) != 1:
            raise TypeError(f"a parameter may be one kind or None (got {hint!r})")
        hint = args[0]
    if typing.get_origin(hint) is Annotated:
        kind = next((m for m in hint.__metadata__ if isinstance(m, Kind)), None)
        if kind is not None:
            return kind, optional
    if typing.get_origin(hint) is Literal:
        words = tuple(str(a) for a in typing.get_args(hint))
        return Kind(" | ".join(words), enum(*words)), optional
    raise TypeError(f"no parameter kind for annotation {hint!r}: use Duration, Number, Share, Comparison, "
                    "MetricName, Codes or a Literal of words")


def _specs(cls: type[ConditionParams]) -> tuple[ParamSpec, ...]:
    hints = typing.get_type_hints(cls, include_extras=True)
    out = []
    for f in dataclasses.fields(cls):  # type: ignore[arg-type]
        kind, optional = _kind_of(hints[f.name])
        required = f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING
        if f.default is None and not optional:
            raise TypeError(f"{cls.__name__}.{f.name}: a None default needs '| None' in its annotation")
        out.append(ParamSpec(f.name.rstrip("_"), f.name, kind, required, None if required else f.default,
                             f.metadata.get("doc", "")))
    return tuple(out)


def condition(name: str, params: type[P]) -> Callable[[Callable[[Any, Any], Any]], Callable[[Any, Any], Any]]:
    """Register ``params`` as condition type ``name`` with the decorated function as its evaluation.

    Called at import of the evaluation modules.  Refuses a second registration of a name, a
    params class that is not a frozen dataclass of :class:`ConditionParams`, and a field whose
    annotation has no kind, so a condition type that the schema could not read never registers.
    """
    def register(fn: Callable[[Any, Any], Any]) -> Callable[[Any, Any], Any]:
        if name in CONDITIONS:
            raise TypeError(f"condition type {name!r} registered twice")
        if not (isinstance(params, type) and issubclass(params, ConditionParams)
                and dataclasses.is_dataclass(params) and params.__dataclass_params__.frozen):
            raise TypeError(f"{params!r} must be a frozen dataclass of ConditionParams")
        specs = _specs(params)  # raises before anything is registered
        params.type_name = name
        doc = " ".join((params.__doc__ or "").strip().split("\n\n")[0].split())
        CONDITIONS[name] = ConditionType(name, params, fn, specs, doc)
        return fn
    return register


def default_text(s: ParamSpec) -> str:
    """A parameter's default as a rule author writes it: ``10s``, ``"> 1.1"``, ``avg``, or required / —."""
    if s.required:
        return "required"
    v = s.default
    if v is None:
        return "—"
    if s.kind.text == "duration":
        return _duration_text(float(v))
    if isinstance(v, Compare):
        return f'"{v}"'
    if isinstance(v, float):
        return f"{v:g}"
    return str(v)


def _duration_text(s: float) -> str:
    for unit, n in (("h", 3600), ("m", 60), ("s", 1)):
        if s >= n and s % n == 0:
            return f"{s / n:g}{unit}"
    return f"{s * 1000:g}ms"


# ---- the generated documentation ---------------------------------------------------------------------

_DOC_BEGIN = "<!-- generated from the condition registry: {name} (whywait rules conditions --docs FILE) -->"
_DOC_END = "<!-- end generated: {name} -->"


def render_table(ct: ConditionType) -> str:
    """The parameter table of one condition type, as ``docs/rules.md`` shows it."""
    rows = ["| param | takes | default | meaning |", "|---|---|---|---|"]
    for s in ct.specs:
        kind = s.kind.text if " | " not in s.kind.text else ", ".join(f"`{w}`" for w in s.kind.text.split(" | "))
        default = default_text(s)
        default = default if s.required or s.default is None else f"`{default.strip(chr(34))}`"
        rows.append(f"| `{s.key}` | {kind} | {default} | {s.doc} |")
    return "\n".join(rows)


def update_docs(text: str) -> str:
    """Return ``text`` with every generated condition table replaced by the registry's.

    Called by ``whywait rules conditions --docs FILE`` and by the test that keeps ``docs/rules.md``
    in step with the registry.  Raises :class:`ValueError` naming a registered type whose table
    markers are missing, or markers naming no registered type, so neither side can drift.
    """
    types_ = condition_types()
    for name, ct in types_.items():
        begin, end = _DOC_BEGIN.format(name=name), _DOC_END.format(name=name)
        i, j = text.find(begin), text.find(end)
        if i < 0 or j < i:
            raise ValueError(f"no generated table for condition type '{name}' (add the lines {begin!r} and "
                             f"{end!r} where it belongs)")
        text = text[:i] + begin + "\n\n" + render_table(ct) + "\n\n" + text[j:]
    for m in re.finditer(r"<!-- generated from the condition registry: (\S+) ", text):
        if m.group(1) not in types_:
            raise ValueError(f"a generated table names '{m.group(1)}', which is not a registered condition type")
    return text
