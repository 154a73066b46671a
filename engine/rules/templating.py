"""The one sandboxed Jinja2 environment for rule text (title, cause, next step, check names).

Rule files are edited by many people; the sandbox keeps a template from reaching
Python internals.  The loader checks every template with this environment at
load time (:func:`problems`: syntax, filters, tests and names, so a bad one is
refused with its file) and the evaluator renders with it.
"""

from __future__ import annotations

import functools
import logging
import math
from dataclasses import dataclass
from datetime import datetime, timezone
from typing import Any

import jinja2
from jinja2 import nodes
from jinja2.sandbox import SandboxedEnvironment

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
    "job": "the job id", "project": "its owning project", "team": "its owning team",
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


_MAX_NOTED = 10_000  # origins kept: far more than a rule set has templates


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


env = SandboxedEnvironment(undefined=jinja2.ChainableUndefined, autoescape=False, trim_blocks=True)
env.filters["num"] = _num
env.filters["ranges"] = _ranges
env.filters["clock"] = lambda t: (datetime.fromtimestamp(t, timezone.utc).strftime("%H:%M:%S UTC")
                                  if isinstance(t, (int, float)) else "?")


@functools.lru_cache(maxsize=1024)
def _compiled(template: str) -> jinja2.Template:
    # Compiling is ~100x the cost of rendering, and the evaluator renders every tick an incident fires.
    return env.from_string(template)


def render(template: str, ctx: dict[str, Any]) -> str:
    """Render ``template`` with ``ctx``; a template error is logged and the raw template returned."""
    try:
        return _compiled(template).render(**ctx).strip()
    except jinja2.TemplateError as exc:  # a template bug must not stop the diagnosis
        log.warning("template failed: %s", exc)
        return template
