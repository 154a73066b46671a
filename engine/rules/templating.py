"""The one sandboxed Jinja2 environment for rule text (title, cause, next step, check names).

Rule files are edited by many people; the sandbox keeps a template from reaching
Python internals.  The loader checks every template with this environment at
load time (:func:`problems`: syntax, filters, tests and names, so a bad one is
refused with its file) and the evaluator renders with it (:func:`render`).

A template that fails while rendering (a division by a zero baseline, a loop
that would not end) must not stop a diagnosis: :func:`render` never raises for
it.  It returns the template's own text with a short note, counts the failure
in :data:`RENDER_ERRORS` (logged once per rule and field, with the rule's file
and line), and hands it to any :func:`capture_render_errors` block, which is how
``whywait rules test`` reports it.  Rendering is bounded: every loop iteration
and call draws on a per-render budget of :data:`MAX_STEPS`, no value grows past
:data:`MAX_VALUE_CHARS`, and the text is cut at :data:`MAX_OUTPUT_CHARS`.
"""

from __future__ import annotations

import contextlib
import contextvars
import functools
import logging
import math
import re
from collections import Counter
from dataclasses import dataclass
from datetime import datetime, timezone
from typing import Any, Callable, Generator, Iterator, cast

import jinja2
from jinja2 import nodes
from jinja2.runtime import Context, Macro
from jinja2.sandbox import SandboxedEnvironment, SecurityError
from jinja2.visitor import NodeTransformer

from whywait.errors import WhywaitError

log = logging.getLogger(__name__)


def _num(v: Any, digits: int = 1) -> str:
    """Format a number with thousands separators; anything else as text (missing → '?')."""
    if isinstance(v, bool):
        return str(v)
    if isinstance(v, (int, float)) and math.isfinite(v):
        return f"{v:,.{digits}f}"
    if isinstance(v, jinja2.Undefined) or v is None:
        return "?"
    return str(v)


def _ranges(values: Any) -> str:
    """Format integers compactly: ``[48, 49, 50, 52]`` → ``48–50, 52``."""
    nums = sorted({int(v) for v in values or ()})
    parts: list[str] = []
    i = 0
    while i < len(nums):
        j = i
        while j + 1 < len(nums) and nums[j + 1] == nums[j] + 1:
            j += 1
        parts.append(str(nums[i]) if i == j else f"{nums[i]}–{nums[j]}")
        i = j + 1
    return ", ".join(parts)


# What a rule's title, cause, next step and check names may use; the evaluator fills them
# (engine.evaluate.evaluator and the topology predicates' facts).  `whywait rules check`
# refuses a template naming anything else, so a typo is caught before it reaches a pager.
TEMPLATE_VARS: dict[str, str] = {
    "job": "the job id", "job_name": "the job's name as its users know it (Slurm's --job-name), or None",
    "unseen_nodes": "the culprit's nodes that never sent telemetry (steps only): their hardware was not checked",
    "job_unseen_nodes": "the job's nodes that never sent telemetry (steps only), for a finding with no culprit",
    "project": "its owning project", "team": "its owning team",
    "channel": "the team's Slack channel", "culprit": "the culprit node(s), or None",
    "node": "the first culprit node", "nodes": "every culprit node", "rank": "the first culprit rank",
    "ranks": "every rank on the culprit nodes", "culprit_ranks": "the culprit ranks themselves",
    "n_ranks": "the job's world size", "switch": "the culprit's leaf switch (or the shared switch)",
    "rack": "the culprit's rack (or the shared rack)", "pool": "the shared storage pool",
    "pools": "the culprit nodes' storage pools", "ev": "evidence by metric name: ev['m'].value / .baseline",
    "evidence": "every Evidence", "path": "the topology path", "labels": "the incident's labels",
    "gpu": "the GPU(s) in question (wrong NIC)", "gpus": "their indexes", "expected_nic": "the GPU's local NIC",
    "actual_nic": "the NIC carrying its traffic", "nic_node": "the node of that NIC",
    "other_job": "another project's job on the same switch or pool", "other_project": "its project",
    "other_team": "its team", "shared": "the switch or pool they share",
    "other_node": "the other job's busiest node there", "other_value": "that node's figure",
    "changed_at": "when a change_point condition found the level shift (event time; see the clock filter)",
    "stragglers": "step_outlier: each straggler's rank, node, gpu, stage, replica, ratio and history_ratio",
    "straggler_ratio": "step_outlier: the slowest straggler's work over its peers'",
    "n_stragglers": "step_outlier: how many ranks it names", "aligned_steps": "steps compared",
    "steady": "step_outlier: a straggler has no history before the window (slow since it was first seen)",
    "phase": "the slow phase: compute, input, communication, or step (split unknown)",
    "phase_field": "the step field of that phase", "phase_value": "the culprits' median of it",
    "phase_baseline": "their peers' median of it",
    "stage": "stage_imbalance: the slow pipeline stage", "n_stages": "pipeline stages",
    "n_replicas": "data-parallel replicas", "imbalance": "stage_imbalance: the stage's work over the others'",
    "stage_before": "stage_imbalance: that ratio on the steps before it was first seen (None: under 10 of them)",
    "slow_share": "rotation: share of steps with a slow rank", "distinct_ranks": "rotation: ranks taking turns",
    "rotation_ratio": "rotation: the slow rank's typical ratio",
    "steady_since": "rotation: the first step of a past as uneven as the window (none: a change)",
    "period_s": "periodic: the period", "burst_s": "periodic: how long each slowdown lasts",
    "bursts": "periodic: slowdowns seen", "periodic_ratio": "periodic: step time in a slowdown over normal",
    "step_s": "what_if: the job's step time now", "whatif_step_s": "what_if: its step time without the culprit",
    "slowdown_pct": "what_if: how much slower, %", "step_losses": "what_if: (end, step time, seconds lost) per step",
    "cost": "the incident's cost: step_s, whatif_step_s, slowdown_pct, gpus, gpu_hours_lost",
    "incident_since": "when the incident began (event time)",
}


#: Loop iterations and calls one render may make: a rule's text loops over evidence or ranks, never further.
MAX_STEPS = 100_000
#: The longest string or list (characters, or items) a template may build on its way to its text.
MAX_VALUE_CHARS = 100_000
#: The most characters a render may write, all blocks and macros together.
MAX_WRITTEN_CHARS = 10 * MAX_VALUE_CHARS
#: The longest text kept; the rest is cut, with a note, and counted as a failure.
MAX_OUTPUT_CHARS = 20_000
_MAX_INT_BITS = 4096  # `**` and `*` on integers: 10**18 takes 60 bits
_MAX_NOTED = 10_000  # origins and error kinds kept: far more than a rule set has templates


class TemplateLimitError(SecurityError, WhywaitError):
    """A template went past one of the bounds above while rendering.

    A jinja2 ``TemplateError`` so the renderer's own handling catches it, and a :class:`WhywaitError` so a
    CLI that lets it through prints its one line rather than a traceback.
    """


# ---- where templates come from, and what failed -------------------------------------------------------------


@dataclass(frozen=True)
class TemplateOrigin:
    """Where a template stands: its rule, its key (``title``, ``checks[0].name``) and its file and line."""

    rule_id: str
    field: str
    file: str = ""
    line: int = 0

    def __str__(self) -> str:
        where = f"{self.file}:{self.line}: " if self.file else ""
        return f"{where}rule '{self.rule_id}': '{self.field}' template"


@dataclass(frozen=True)
class RenderError:
    """One template that failed while rendering: where it stands (when known), its text, the error in one line."""

    template: str
    error: str  # "ZeroDivisionError: division by zero"
    origin: TemplateOrigin | None = None

    @property
    def key(self) -> tuple[str, str]:
        """What failures are counted by: the rule and field, or the template's text when they are unknown."""
        return (self.origin.rule_id, self.origin.field) if self.origin else ("", self.template[:200])

    def __str__(self) -> str:
        what = str(self.origin) if self.origin else f"template {_short(self.template)}"
        return f"{what} failed to render: {self.error}"


class RenderErrors:
    """Every render failure since the process started, counted per rule and field (:data:`RENDER_ERRORS`).

    ``total`` counts every failed render; ``counts`` and ``last`` are by :attr:`RenderError.key` (the first
    :data:`_MAX_NOTED` kinds).  The engine may export these; :func:`capture_render_errors` is for one run.
    """

    def __init__(self) -> None:
        self.total = 0
        self.counts: Counter[tuple[str, str]] = Counter()
        self.last: dict[tuple[str, str], RenderError] = {}

    def add(self, err: RenderError) -> bool:
        """Count ``err``; return whether it is the first failure of its rule and field."""
        self.total += 1
        key = err.key
        first = key not in self.counts
        if first and len(self.counts) >= _MAX_NOTED:
            return False
        self.counts[key] += 1
        self.last[key] = err
        return first

    def errors(self) -> list[RenderError]:
        """The last failure of each rule and field, in the order they first failed."""
        return list(self.last.values())

    def clear(self) -> None:
        self.total = 0
        self.counts.clear()
        self.last.clear()


#: Every render failure of this process (see :class:`RenderErrors`).
RENDER_ERRORS = RenderErrors()
_CAPTURE: contextvars.ContextVar[list[RenderError] | None] = contextvars.ContextVar("whywait_render_capture",
                                                                                    default=None)
_ORIGINS: dict[str, TemplateOrigin] = {}  # template text -> where it was loaded from (the latest load)
_ORIGINS_BY_FIELD: dict[tuple[str, str], tuple[str, TemplateOrigin]] = {}  # (rule, field) -> (text, origin)


def note_origin(template: str, origin: TemplateOrigin) -> None:
    """Remember where ``template`` was loaded from, so a failure to render it names the rule's file and line.

    Called by the loader for every template of every rule it loads (a reload notes them again).
    """
    _ORIGINS.pop(template, None)  # the latest load goes last: the first to go when the table is full
    _ORIGINS[template] = origin
    field = (origin.rule_id, origin.field)
    _ORIGINS_BY_FIELD.pop(field, None)
    _ORIGINS_BY_FIELD[field] = (template, origin)
    if len(_ORIGINS) > _MAX_NOTED:
        del _ORIGINS[next(iter(_ORIGINS))]
    if len(_ORIGINS_BY_FIELD) > _MAX_NOTED:
        del _ORIGINS_BY_FIELD[next(iter(_ORIGINS_BY_FIELD))]


def _origin(template: str, rule_id: str | None, field: str | None) -> TemplateOrigin | None:
    if rule_id and field:
        noted = _ORIGINS_BY_FIELD.get((rule_id, field))
        if noted is not None and noted[0] == template:
            return noted[1]
        return TemplateOrigin(rule_id, field)
    return _ORIGINS.get(template)


@contextlib.contextmanager
def capture_render_errors() -> Iterator[list[RenderError]]:
    """Collect the render failures made inside the block (each rule and field once), e.g. a rule test's case.

    ::

        with capture_render_errors() as failed:
            ...  # evaluate
        problems = [str(e) for e in failed]  # "rules/x.yaml:14: rule 'x': 'title' template failed to render: ..."
    """
    errs: list[RenderError] = []
    token = _CAPTURE.set(errs)
    try:
        yield errs
    finally:
        _CAPTURE.reset(token)


def _short(text: str, n: int = 60) -> str:
    one = " ".join(text.split())
    return repr(one if len(one) <= n else one[: n - 1] + "…")


def _failed(template: str, rule_id: str | None, field: str | None, exc: BaseException) -> RenderError:
    """Count, log (once per rule and field) and capture a failure to render ``template``."""
    err = RenderError(template, f"{type(exc).__name__}: {exc}"[:300], _origin(template, rule_id, field))
    if RENDER_ERRORS.add(err):
        log.warning("%s (shown as written; later failures of it are only counted)", err)
    else:
        log.debug("%s", err)
    captured = _CAPTURE.get()
    if captured is not None and all(e.key != err.key for e in captured):
        captured.append(err)
    return err


# ---- the bounds, applied while rendering -----------------------------------------------------------------------


class _Budget:
    __slots__ = ("steps", "written")

    def __init__(self) -> None:
        self.steps = MAX_STEPS
        self.written = 0


_BUDGET: contextvars.ContextVar[_Budget | None] = contextvars.ContextVar("whywait_render_budget", default=None)


def _step() -> None:
    b = _BUDGET.get()
    if b is not None:
        b.steps -= 1
        if b.steps < 0:
            raise TemplateLimitError(f"more than {MAX_STEPS:,} loop iterations and calls")


def _size(value: Any, limit: int = MAX_VALUE_CHARS) -> int:
    """About how many characters ``value`` takes written out, counted no further than just past ``limit``.

    Containers are walked rather than written: a list holding another twice, thirty levels deep, is small in
    memory and endless as text.
    """
    if isinstance(value, str):
        return len(value)
    if not isinstance(value, (list, tuple, dict, set, frozenset)):
        return 1
    n = 0
    stack: list[Any] = [value]
    while stack and n <= limit:
        v = stack.pop()
        if isinstance(v, str):
            n += len(v)
        elif isinstance(v, (list, tuple, dict, set, frozenset)):
            n += 2 + len(v)
            if n <= limit:
                stack.extend(v)
                if isinstance(v, dict):
                    stack.extend(v.values())
        else:
            n += 1
    return n


def _bounded(value: Any, what: str) -> Any:
    if _size(value) > MAX_VALUE_CHARS:
        raise TemplateLimitError(f"{what} is over {MAX_VALUE_CHARS:,} characters")
    return value


def _check_args(args: Any, kwargs: dict[str, Any], what: str) -> None:
    """Refuse a width or count argument that would build more than :data:`MAX_VALUE_CHARS` (``center(10**9)``)."""
    for a in (*args, *kwargs.values()):
        if isinstance(a, int) and not isinstance(a, bool) and abs(a) > MAX_VALUE_CHARS:
            raise TemplateLimitError(f"{what}: argument {a} is over {MAX_VALUE_CHARS:,}")


_PERCENT_SPEC = re.compile(r"%(?:\([^)]*\))?[#0 +\-]*(\*|\d+)?(?:\.(\*|\d+))?")


def _check_format(fmt: Any, percent: bool) -> None:
    """Refuse a format string whose width or precision pads past the bound, or is taken from the arguments."""
    if not isinstance(fmt, str):
        return
    if percent:
        sizes = [g for m in _PERCENT_SPEC.finditer(fmt) for g in m.groups() if g]
    else:
        import string

        specs = [spec for _, name, spec, _ in string.Formatter().parse(fmt) if name is not None and spec]
        if any("{" in s for s in specs):
            raise TemplateLimitError("a format width taken from the arguments is not allowed")
        sizes = [d for s in specs for d in re.findall(r"\d+", s)]
    for s in sizes:
        if s == "*":
            raise TemplateLimitError("a format width taken from the arguments is not allowed")
        if len(s) > 9 or int(s) > MAX_VALUE_CHARS:
            raise TemplateLimitError(f"format width {s} is over {MAX_VALUE_CHARS:,}")


def _range(*args: Any) -> range:
    """``range()`` for templates: at most :data:`MAX_STEPS` numbers (the loop still counts each)."""
    rng = range(*args)
    try:
        n = len(rng)
    except OverflowError:
        n = MAX_STEPS + 1
    if n > MAX_STEPS:
        raise TemplateLimitError(f"range of {rng.start}..{rng.stop} is over {MAX_STEPS:,} numbers")
    return rng


def _finalize(value: Any) -> Any:
    """Every ``{{ ... }}`` output passes here (in macros and ``{% set %}`` blocks too): count what is written."""
    n = _size(value)
    if n > MAX_VALUE_CHARS:
        raise TemplateLimitError(f"an output is over {MAX_VALUE_CHARS:,} characters")
    b = _BUDGET.get()
    if b is not None:
        b.written += n
        if b.written > MAX_WRITTEN_CHARS:
            raise TemplateLimitError(f"wrote more than {MAX_WRITTEN_CHARS:,} characters")
    return value


_LOOP, _BOUND = "whywait_loop", "whywait_bounded"  # filters the compiler adds around loops and joins


@jinja2.pass_context  # a context filter is never run at compile time, so a constant loop is counted too
def _loop_filter(_ctx: Context, iterable: Any) -> Iterator[Any]:
    for item in iterable:
        _step()
        yield item


@jinja2.pass_context
def _bound_filter(_ctx: Context, value: Any) -> Any:
    return _bounded(value, "a joined text")


def _wrap(node: nodes.Expr | None, name: str, lineno: int) -> nodes.Filter:
    return nodes.Filter(node, name, [], [], None, None, lineno=lineno)


class _Bounds(NodeTransformer):
    """Counts every loop iteration and bounds every ``~`` join and ``{% set %}`` block of a template."""

    # generic_visit changes a node's fields in place (and returns the node)

    def visit_For(self, node: nodes.For) -> nodes.Node:
        self.generic_visit(node)
        node.iter = _wrap(cast(nodes.Expr, node.iter), _LOOP, node.lineno)
        return node

    def visit_Concat(self, node: nodes.Concat) -> nodes.Node:
        self.generic_visit(node)
        node.nodes = [_wrap(n, _BOUND, node.lineno) for n in node.nodes]
        return _wrap(node, _BOUND, node.lineno)

    def visit_AssignBlock(self, node: nodes.AssignBlock) -> nodes.Node:
        self.generic_visit(node)
        node.filter = _wrap(node.filter, _BOUND, node.lineno)
        return node


class RuleTextEnvironment(SandboxedEnvironment):
    """The sandbox, bounded: see :data:`MAX_STEPS`, :data:`MAX_VALUE_CHARS` and :data:`MAX_WRITTEN_CHARS`.

    Calls and loop iterations draw on the budget :func:`render` sets; the operators that can build big values
    (``*``, ``**``, ``+``, ``%``), calls, filters and outputs check the size of what they make.
    """

    intercepted_binops = frozenset({"*", "**", "+", "%"})

    def _generate(self, source: nodes.Template, name: str | None, filename: str | None,
                  defer_init: bool = False) -> str:
        # Jinja's documented hook between parsing and code generation: add the loop and join bounds.
        return super()._generate(_Bounds().visit(source), name, filename, defer_init)

    def call_binop(self, context: Context, operator: str, left: Any, right: Any) -> Any:
        ints = all(isinstance(v, int) and not isinstance(v, bool) for v in (left, right))
        if operator == "**" and ints and abs(left) > 1 and right > 0 \
                and right * math.log2(abs(left)) > _MAX_INT_BITS:
            raise TemplateLimitError(f"{left} ** {right} is too large")
        if operator == "*":
            if ints and left.bit_length() + right.bit_length() > _MAX_INT_BITS:
                raise TemplateLimitError("a product is too large")
            for seq, n in ((left, right), (right, left)):
                if isinstance(seq, (str, list, tuple)) and isinstance(n, int) and len(seq) * n > MAX_VALUE_CHARS:
                    raise TemplateLimitError(f"a repetition is over {MAX_VALUE_CHARS:,} characters")
        if operator == "%":
            _check_format(left, percent=True)
        out = self.binop_table[operator](left, right)
        return out if operator == "**" else _bounded(out, f"the result of {operator!r}")

    def wrap_str_format(self, value: Any) -> Callable[..., str] | None:
        wrapper = super().wrap_str_format(value)
        if wrapper is not None:
            _check_format(value.__self__, percent=False)
            wrapper.whywait_format = True  # type: ignore[attr-defined]
        return wrapper

    def call(__self, __context: Context, __obj: Any, *args: Any, **kwargs: Any) -> Any:  # noqa: N805
        _step()
        if not (isinstance(__obj, Macro) or __obj is _range or getattr(__obj, "whywait_format", False)):
            _check_args(args, kwargs, f"{getattr(__obj, '__name__', 'a call')}()")
        for a in (*args, *kwargs.values()):
            _bounded(a, "an argument")
        return _bounded(super().call(__context, __obj, *args, **kwargs), "a call's result")


def _guarded(name: str, f: Callable[..., Any]) -> Callable[..., Any]:
    """``f`` as a filter bounded like a call: its arguments and its result (``center(10**9)``, ``|join``)."""
    skip = 1 if getattr(f, "jinja_pass_arg", None) is None else 2  # the value, after any context argument

    @functools.wraps(f)  # keeps jinja_pass_arg
    def filter_(*args: Any, **kwargs: Any) -> Any:
        value = args[skip - 1] if len(args) >= skip else None
        if name == "format":
            _check_format(value, percent=True)
        else:
            _check_args(args[skip:], kwargs, f"filter {name!r}")
        _bounded(value, f"the value given to filter {name!r}")
        return _bounded(f(*args, **kwargs), f"filter {name!r}'s result")

    return filter_


env = RuleTextEnvironment(undefined=jinja2.ChainableUndefined, autoescape=False, trim_blocks=True,
                          finalize=_finalize)
env.globals["range"] = _range
env.filters["num"] = _num
env.filters["ranges"] = _ranges
env.filters["clock"] = lambda t: (datetime.fromtimestamp(t, timezone.utc).strftime("%H:%M:%S UTC")
                                  if isinstance(t, (int, float)) else "?")
env.filters.update({k: _guarded(k, f) for k, f in env.filters.items()})
env.filters[_LOOP] = _loop_filter
env.filters[_BOUND] = _bound_filter


# ---- what the loader and the evaluator call ------------------------------------------------------------------


def problems(template: str) -> list[tuple[int, str]]:
    """What stops ``template`` from rendering, found without rendering it: ``(template line, message)`` pairs.

    Called by the loader for every template.  A syntax error is raised (``jinja2.TemplateSyntaxError``, which
    the loader places on its file line); an unknown filter or test (even one inside an ``{% if %}``, which Jinja
    would only notice when it runs), or an ``{% include %}``, ``{% import %}`` or ``{% extends %}`` (a rule's
    text stands alone), is returned.
    """
    import difflib

    ast = env.parse(template)
    out: list[tuple[int, str]] = []
    for kind, node_type, known in (("filter", nodes.Filter, env.filters), ("test", nodes.Test, env.tests)):
        for n in ast.find_all(node_type):
            if n.name not in known:
                near = difflib.get_close_matches(n.name, [k for k in known if not k.startswith("whywait_")], n=1)
                out.append((n.lineno, f"no {kind} named {n.name!r}" + (f"; did you mean {near[0]!r}?" if near else "")))
    for stmt in ast.find_all((nodes.Extends, nodes.Include, nodes.Import, nodes.FromImport)):
        out.append((stmt.lineno, f"{{% {type(stmt).__name__.lower()} %}} is not available in rule text "
                                 "(a rule's text stands alone)"))
    if not out:
        try:
            env.compile(template)
        except jinja2.TemplateSyntaxError as exc:  # TemplateAssertionError too: what the compiler refuses
            out.append((exc.lineno or 1, exc.message or str(exc)))
        except Exception as exc:  # noqa: BLE001 - whatever else the compiler raises is the template's fault
            out.append((1, f"does not compile: {type(exc).__name__}: {exc}"))
    return out


def undeclared(template: str) -> set[str]:
    """Names ``template`` reads that are neither in :data:`TEMPLATE_VARS` nor set inside it."""
    from jinja2 import meta

    return meta.find_undeclared_variables(env.parse(template)) - set(TEMPLATE_VARS)


@functools.lru_cache(maxsize=1024)
def _compiled(template: str) -> jinja2.Template:
    # Compiling is ~100x the cost of rendering, and the evaluator renders every tick an incident fires.
    return env.from_string(template)


def render(template: str, ctx: dict[str, Any], rule_id: str | None = None, field: str | None = None) -> str:
    """Render ``template`` with ``ctx``; never raises for what the template does.

    Called by the evaluator for each text of a diagnosis.  A template that fails (``1/0``, a zero baseline,
    a loop past :data:`MAX_STEPS`) gives its own text, stripped, followed by a note such as
    ``[template error: ZeroDivisionError in title]``; the failure is counted in :data:`RENDER_ERRORS`, logged
    once per rule and field, and captured by :func:`capture_render_errors`.  ``rule_id`` and ``field`` name the
    template in those reports (else the loader's note of where the text came from does).  A text longer than
    :data:`MAX_OUTPUT_CHARS` is cut, with a note, and counted the same way.
    """
    token = _BUDGET.set(_Budget())
    pieces: list[str] = []
    n = 0
    try:
        gen = cast("Generator[str, None, None]", _compiled(template).generate(**ctx))
        try:
            for piece in gen:
                pieces.append(piece)
                n += len(piece)
                if n > MAX_OUTPUT_CHARS:
                    break
        finally:
            gen.close()
    except Exception as exc:  # noqa: BLE001 - a template bug must not stop the diagnosis
        err = _failed(template, rule_id, field, exc)
        return f"{template.strip()} [template error: {err.error.split(':', 1)[0]}" \
               f"{f' in {err.origin.field}' if err.origin else ''}]"
    finally:
        _BUDGET.reset(token)
    text = "".join(pieces)
    if n > MAX_OUTPUT_CHARS:
        err = _failed(template, rule_id, field,
                      TemplateLimitError(f"the text is over {MAX_OUTPUT_CHARS:,} characters"))
        return f"{text[:MAX_OUTPUT_CHARS].strip()} … [template output cut at {MAX_OUTPUT_CHARS:,} characters" \
               f"{f' in {err.origin.field}' if err.origin else ''}]"
    return text.strip()
