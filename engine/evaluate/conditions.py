"""Evaluating condition trees against the store, for one job at one event time.

Called by the evaluator on every tick, once per (rule, running job).  Each leaf
type is one typed, frozen parameters class (its fields are its YAML keys) and the
function that evaluates it, registered together with ``@condition`` in
:data:`whywait.engine.rules.condition_types.CONDITIONS`; a leaf returns a :class:`Result`
naming the entities that matched and the evidence for each.  Leaves marked ``culprit: true`` set the
culprit entities that later leaves with ``on: culprit``, clean checks, topology
predicates and the topology path refer to: put them first in an ``all``.
"""

from __future__ import annotations

import math
import statistics
from dataclasses import dataclass, field
from dataclasses import fields as dataclass_fields
from typing import Any, Iterable, Iterator, Literal, Protocol, Sequence, TypeVar

import numpy as np
from whywait.engine.diagnosis import Evidence
from whywait.engine.evaluate.steps import row_median
from whywait.engine.evaluate.store import MetricStore
from whywait.engine.rules.condition_types import (
    CONDITIONS,
    Agg,
    Codes,
    Compare,
    Comparison,
    ConditionParams,
    Duration,
    MetricName,
    Number,
    Share,
    condition,
    param,
)
from whywait.engine.rules.metrics import METRICS
from whywait.engine.rules.schema import AllOf, AnyOf, Condition, Node, Not, leaves


class JobView(Protocol):
    """What the evaluator needs of a placed job (``whywait.topology.model.JobInfo`` provides it)."""

    job: str
    project: str
    team: str
    channel: str | None
    ranks: dict[int, tuple[str, int]]


@dataclass
class Ctx:
    """Everything one evaluation of one rule for one job can see."""

    store: MetricStore
    now: float
    job: JobView
    topology: Any
    rule_id: str
    state: dict[tuple[Any, ...], Any]  # per-condition memory (frozen baselines), owned by the evaluator
    culprits: list[str] = field(default_factory=list)
    culprit_level: str | None = None
    facts: dict[str, Any] = field(default_factory=dict)  # extra template context (e.g. the other job)
    # The job's entities per level, shared by every rule's Ctx for one job in one tick (the evaluator
    # passes one dict per job per tick): a 10k-GPU job's list is built once, not once per condition.
    entity_cache: dict[str, list[str]] = field(default_factory=dict)

    # ---- entity helpers ----------------------------------------------------------------------------

    def nodes(self) -> list[str]:
        """The job's nodes, sorted (a new list: callers may change it)."""
        return list(_placed(self.job, "nodes", lambda: sorted({n for n, _ in self.job.ranks.values()})))

    def node_of(self, entity: str) -> str:
        """Map any entity key of this job to its node."""
        if entity == self.job.job:
            return entity
        if entity.startswith(self.job.job + ":"):
            return self.job.ranks[int(entity.rsplit(":", 1)[1])][0]
        return entity.split("/", 1)[0]

    def culprit_nodes(self) -> list[str]:
        return sorted({self.node_of(e) for e in self.culprits})

    def entities(self, level: str, on: str = "job") -> list[str]:
        """The job's entities at ``level``; with ``on == "culprit"``, only the culprit's.

        At the culprit's own level that is the culprit entities themselves; between ranks and
        GPUs it follows the placement (a culprit GPU's rank, a culprit rank's GPU); at any other
        level it is the entities on the culprit's nodes.
        """
        job = self.job
        if on == "culprit" and self.culprits:
            lvl = self.culprit_level
            if lvl == level and level != "job":
                return list(self.culprits)
            if (lvl, level) in (("gpu", "rank"), ("rank", "gpu")):
                placed = self._placed()
                if level == "rank":
                    return [f"{job.job}:{r}" for r in placed if f"{placed[r][0]}/gpu{placed[r][1]}" in self.culprits]
                return sorted({f"{placed[int(e.rsplit(':', 1)[1])][0]}/gpu{placed[int(e.rsplit(':', 1)[1])][1]}"
                               for e in self.culprits if e.startswith(job.job + ":")})
        if on != "culprit":
            hit = self.entity_cache.get(level)
            if hit is None:
                hit = self.entity_cache[level] = self._entities(level, None)
            return list(hit)
        return self._entities(level, set(self.culprit_nodes()))

    def _entities(self, level: str, only: set[str] | None) -> list[str]:
        job = self.job
        if level == "job":
            return [job.job]
        if level == "rank":
            if only is None:  # the placement's alone: kept while it lasts (callers get a copy)
                return list(_placed(job, "rank", lambda: [f"{job.job}:{r}" for r, _ in sorted(job.ranks.items())]))
            return [f"{job.job}:{r}" for r, (n, _) in sorted(job.ranks.items()) if n in only]
        if level == "gpu":
            if only is None:
                return list(_placed(job, "gpu", lambda: sorted({f"{n}/gpu{g}" for n, g in job.ranks.values()})))
            return sorted({f"{n}/gpu{g}" for n, g in job.ranks.values() if n in only})
        nodes = [n for n in self.nodes() if only is None or n in only]
        if level == "node":
            return nodes
        if level in ("nic", "device"):  # the NICs, block devices and mounts the job's nodes reported
            return self.store.entities_at(level, nodes)
        raise ValueError(level)

    def _placed(self) -> dict[int, tuple[str, int]]:
        return dict(sorted(self.job.ranks.items()))

    def culprit_ranks(self) -> list[int]:
        """The job's ranks at the culprit: a rank itself, the rank on a GPU, or the ranks on a node."""
        job, out = self.job, set()
        for e in self.culprits:
            if e.startswith(job.job + ":"):
                out.add(int(e.rsplit(":", 1)[1]))
            elif "/gpu" in e:
                node, g = e.split("/gpu", 1)
                out.update(r for r, (n, gg) in job.ranks.items() if n == node and str(gg) == g)
            elif e != job.job and "/" not in e:
                out.update(r for r, (n, _) in job.ranks.items() if n == e)
        return sorted(out)


# What is derived from a job's placement alone (its rank and GPU entity names, its nodes), by placement: a
# JobInfo is immutable and a new placement brings a new ``ranks`` mapping, so its identity says when to build
# again.  The kept entry holds the mapping, so its id is not reused while kept.  At 1,024 ranks the lists
# cost more to build than most conditions cost to evaluate, on every tick.
_PLACED: dict[tuple[int, str, str], tuple[Any, list[str]]] = {}


def _placed(job: JobView, what: str, build: Any) -> list[str]:
    """``build()`` for ``job``'s placement and ``what``, kept while the placement lasts; callers must not change it."""
    key = (id(job.ranks), job.job, what)
    kept = _PLACED.get(key)
    if kept is not None and kept[0] is job.ranks:
        return kept[1]
    out: list[str] = build()
    if len(_PLACED) >= 256:  # bounded: jobs come and go
        _PLACED.clear()
    _PLACED[key] = (job.ranks, out)
    return out


@dataclass
class Result:
    """The outcome of a condition: whether it holds, which entities matched, and why."""

    holds: bool
    entities: list[str] = field(default_factory=list)
    evidence: list[Evidence] = field(default_factory=list)


C = TypeVar("C", bound=ConditionParams)


def _params(c: Condition, cls: type[C]) -> C:
    """``c``'s parameters as their registered class (the schema built them from it)."""
    assert isinstance(c.params, cls), (c.type, type(c.params))
    return c.params


def _ev(c: Condition, metric: str, entity: str, value: float, baseline: float | None, threshold: str,
        window: float | None, note: str = "") -> Evidence:
    return Evidence(metric=metric, entity=entity, value=round(value, 6), unit=METRICS[metric].unit if metric in
                    METRICS else "", baseline=None if baseline is None else round(baseline, 6),
                    threshold=threshold, window_s=window, note=note or (c.name or ""))


@dataclass(frozen=True, kw_only=True)
class ThresholdCondition(ConditionParams):
    """A metric's windowed aggregate against a fixed value, per entity.

    ``min_entities``/``min_share``: how many (or what share) of the job's entities must match, so a
    rule can say "the whole pool is slow" (most nodes) rather than "one node is slow"."""

    metric: MetricName = param(doc="the metric (see `whywait rules metrics`); its level sets the entities judged")
    agg: Agg = param("avg", "how the window's points are reduced (see Aggregations)")
    window: Duration = param(10.0, "the window the aggregate covers: `(now - window, now]`")
    value: Comparison = param(doc='comparison of the aggregate, e.g. `"> 95"`')
    min_entities: Number = param(1.0, "at least this many of the job's entities must match")
    min_share: Share = param(0.0, "at least this share of the job's entities at that level must match")
    steps: Number = param(0.0, "the window holds at least each entity's last N points (steps, for rank metrics)")


@condition("threshold", ThresholdCondition)
def _threshold(c: Condition, ctx: Ctx) -> Result:
    p = _params(c, ThresholdCondition)
    level = METRICS[p.metric].level
    res = Result(False)
    ents = ctx.entities(level, c.on)
    if (not p.steps and p.agg != "count" and not compare_all(p.value, _ZERO)[0]
            and ctx.store.zero_in(p.metric, ctx.now, p.window)):
        return res  # every aggregate is 0 or missing, and 0 does not pass
    vals = _aggregates(ctx, p.metric, ents, p.agg, p.window, p.steps)
    with np.errstate(invalid="ignore"):
        hits = np.nonzero(~np.isnan(vals) & compare_all(p.value, vals))[0]
    for i in hits:
        e, v = ents[i], float(vals[i])
        res.entities.append(e)
        res.evidence.append(_ev(c, p.metric, e, v, None, f"{p.agg} {p.value}", p.window))
    n = len(res.entities)
    res.holds = n >= max(1.0, p.min_entities) and (not ents or n / len(ents) >= p.min_share)
    return res


_ZERO = np.zeros(1)


def compare_all(cmp: Compare, x: np.ndarray) -> np.ndarray:
    """A comparison applied to every element of ``x`` (its operators work elementwise on arrays).

    Called by the vectorised conditions here and in :mod:`.step_conditions`; returns a bool array.
    """
    f: Any = cmp
    return np.asarray(f(x), bool)


def _aggregates(ctx: Ctx, metric: str, ents: Sequence[str], agg: str, window: float, steps: float) -> np.ndarray:
    """Each entity's ``agg`` of ``metric`` over the window (NaN: no data), for all of them at once.

    With ``steps``, each entity's window is stretched to hold its last N points, so the windows differ
    and are read one by one.
    """
    if steps:
        return np.array([np.nan if v is None else v for v in (
            ctx.store.value(metric, e, agg, ctx.now, ctx.store.span(metric, e, ctx.now, window, int(steps)))
            for e in ents)], np.float64)
    return ctx.store.values(metric, ents, agg, ctx.now, window)


@dataclass(frozen=True, kw_only=True)
class PeerOutlierCondition(ConditionParams):
    """An entity against its job's peers: ratio to the peers' median and robust z-score."""

    metric: MetricName = param(doc="the metric (see `whywait rules metrics`); its level sets the entities judged")
    agg: Agg = param("avg", "how the window's points are reduced (see Aggregations)")
    window: Duration = param(10.0, "the window the aggregate covers: `(now - window, now]`")
    ratio: Comparison | None = param(None, "comparison of value ÷ peers' median (at least one of `ratio`, "
                                                 "`zscore`)")
    zscore: Comparison | None = param(None, "comparison of the robust z-score (value − median) ÷ (1.4826 × MAD), "
                                            "MAD floored at 2 % of the median")
    min_value: Comparison | None = param(None, "the entity's own value must also pass this (ignore outliers among "
                                               "tiny numbers)")
    min_peers: Number = param(3.0, "fewer peers with data: the condition does not hold")
    direction: Literal["high", "low"] = param("high", "`low`: the entity is below its peers (ratio is median ÷ "
                                                      "value)")
    peers: Literal["all", "same_name"] = param(
        "all", "`all`: every entity of the job at the metric's level; `same_name`: only those of the same name "
               "on the job's other nodes (the same mount point, the same NIC port)")
    steps: Number = param(0.0, "the window holds at least each entity's last N points (steps, for rank metrics)")

    def check(self) -> str | None:
        return None if self.ratio or self.zscore else "'peer_outlier' needs 'ratio' or 'zscore'"


@condition("peer_outlier", PeerOutlierCondition)
def _peer_outlier(c: Condition, ctx: Ctx) -> Result:
    p = _params(c, PeerOutlierCondition)
    level = METRICS[p.metric].level
    ents = ctx.entities(level)  # peers are always the whole job, even when judging only the culprit
    arr = _aggregates(ctx, p.metric, ents, p.agg, p.window, p.steps)
    # Peer groups: the whole level, or (same_name) the entities of one name across the job's nodes,
    # so a node's /scratch mount is judged against the other nodes' /scratch, not against /home.
    has = np.nonzero(~np.isnan(arr))[0]
    groups: dict[str, Any] = {}
    if p.peers == "same_name":
        for i in has.tolist():
            e = ents[i]
            groups.setdefault(e.split("/", 1)[1] if "/" in e else "", []).append(i)
    elif len(has):
        groups[""] = has  # one group, the entities with data in their order (as the loop above builds it)
    only = set(ctx.entities(level, c.on)) if c.on == "culprit" else None
    res = Result(False)
    for name, idx in sorted(groups.items()):
        if len(idx) >= p.min_peers + 1:
            against = f"the median of {name} on the job's nodes" if name else "the job median"
            sel = np.asarray(idx, np.int64)
            _judge_peers(c, p, ents, sel, arr[sel], only, res, against)
    res.holds = bool(res.entities)
    return res


def _judge_peers(c: Condition, p: PeerOutlierCondition, all_ents: list[str], idx: np.ndarray, vals: np.ndarray,
                 only: set[str] | None, res: Result, against: str) -> None:
    """Add to ``res`` the entities of one peer group that stand out from the group's median (vectorised).

    ``vals`` are the group's values, ``idx`` where its entities are in ``all_ents``."""
    med = float(np.median(vals))
    mad = float(np.median(np.abs(vals - med)))
    # A floor on the spread: identical peers (MAD 0) must not turn a 1% wobble into an infinite z-score.
    scale = max(1.4826 * mad, 0.02 * abs(med), 1e-9)
    with np.errstate(divide="ignore", invalid="ignore"):
        if p.direction == "low":
            ratio = np.where(vals > 0, med / np.where(vals > 0, vals, 1.0), math.inf)
            z = (med - vals) / scale
        else:
            ratio = vals / med if med > 0 else np.where(vals > 0, math.inf, 1.0)
            z = (vals - med) / scale
        ok = np.ones(len(vals), bool)
        if p.ratio is not None:
            ok &= compare_all(p.ratio, ratio)
        if p.zscore is not None:
            ok &= compare_all(p.zscore, z)
        if p.min_value is not None:
            ok &= compare_all(p.min_value, vals)
    thr = " and ".join(x for x in (f"ratio {p.ratio}" if p.ratio else "",
                                   f"robust z {p.zscore}" if p.zscore else "") if x)
    for i in np.nonzero(ok)[0]:
        e = all_ents[idx[i]]
        if only is not None and e not in only:
            continue
        r, zz, v = float(ratio[i]), float(z[i]), float(vals[i])
        res.entities.append(e)
        note = f"{r:.1f}x {against}, robust z {zz:.1f}" if math.isfinite(r) else f"robust z {zz:.1f}"
        res.evidence.append(_ev(c, p.metric, e, v, med, thr, p.window, note))


@dataclass(frozen=True, kw_only=True)
class SelfHistoryCondition(ConditionParams):
    """An entity against its own past: the recent window over a baseline window before it.

    While the entity is anomalous its baseline is frozen, so a long fault does not become its own
    baseline and resolve itself."""

    metric: MetricName = param(doc="the metric (see `whywait rules metrics`); its level sets the entities judged")
    agg: Agg = param("avg", "how the window's points are reduced (see Aggregations)")
    window: Duration = param(10.0, "the window the aggregate covers: `(now - window, now]`")
    baseline: Duration = param(300.0, "the window before the recent one; its median is the baseline")
    ratio: Comparison = param(doc="comparison of recent ÷ baseline")
    min_value: Comparison | None = param(None, "the recent value must also pass this")
    min_baseline_points: Number = param(10.0, "fewer points in the baseline: no judgement")
    steps: Number = param(0.0, "the recent window holds at least the last N points (steps)")
    baseline_steps: Number = param(0.0, "when set, the baseline is the N points before the recent window, "
                                        "however long ago")
    min_share: Share = param(0.0, "hold only when at least this share of the job's entities grew (\"every rank "
                                  "slowed\"; 0: any one)")


@condition("self_history", SelfHistoryCondition)
def _self_history(c: Condition, ctx: Ctx) -> Result:
    p = _params(c, SelfHistoryCondition)
    level = METRICS[p.metric].level
    res = Result(False)
    b = p.baseline
    ents = ctx.entities(level, c.on)
    judged = 0
    recent = _aggregates(ctx, p.metric, ents, p.agg, p.window, p.steps)
    for i in np.nonzero(~np.isnan(recent))[0]:
        e, v = ents[i], float(recent[i])
        w = ctx.store.span(p.metric, e, ctx.now, p.window, int(p.steps))
        key = (ctx.rule_id, c.line, e)
        frozen = ctx.state.get(key)
        if frozen is not None:
            base = frozen
        else:
            if p.baseline_steps:  # the baseline_steps points before the window, however long ago
                _, values = ctx.store.window(p.metric, e, ctx.now - w - b, ctx.now - w)
                values = values[-int(p.baseline_steps):]
            else:
                _, values = ctx.store.window(p.metric, e, ctx.now - w - b, ctx.now - w)
            if len(values) < p.min_baseline_points:
                continue
            base = statistics.median(values)
        judged += 1
        ratio = v / base if base > 0 else (math.inf if v > 0 else 1.0)
        ok = (p.ratio(ratio) or (frozen is not None and p.ratio.halfway(ratio))) and (
            p.min_value is None or p.min_value(v))
        if ok:
            # Freeze the baseline while the entity is anomalous, so a long fault does not become
            # its own baseline and resolve itself; and keep it while the entity stays half-way there
            # (above): one tick under the ratio dropped it, the slow window became the baseline, and a
            # job held 20% slower by a straggler to the end of its table was "resolved" after a minute.
            ctx.state[key] = base
            res.entities.append(e)
            res.evidence.append(_ev(c, p.metric, e, v, base, f"ratio to own baseline {p.ratio}", w,
                                    f"{ratio:.2f}x its own median of the previous "
                                    + (f"{int(p.baseline_steps)} steps" if p.baseline_steps else f"{b:g}s")))
        else:
            ctx.state.pop(key, None)
    # With min_share, enough of the job's entities must have grown ("every rank slowed", not one).
    res.holds = bool(res.entities) and (not p.min_share or
                                        (judged > 0 and len(res.entities) >= p.min_share * len(ents)))
    return res


@dataclass(frozen=True, kw_only=True)
class TrendCondition(ConditionParams):
    """Successive values growing: each of the last ``count`` points larger than the one before."""

    metric: MetricName = param(doc="the metric (see `whywait rules metrics`); its level sets the entities judged")
    count: Number = param(3.0, "the last `count` points (so `count + 1` values) must each grow")
    growth: Comparison = param(Compare(">", 1.0), "comparison of each value ÷ the one before")
    window: Duration = param(3600.0, "how far back to look for the values")


@condition("trend", TrendCondition)
def _trend(c: Condition, ctx: Ctx) -> Result:
    p = _params(c, TrendCondition)
    level = METRICS[p.metric].level
    n = int(p.count)
    res = Result(False)
    for e in ctx.entities(level, c.on):
        _, values = ctx.store.window(p.metric, e, ctx.now - p.window, ctx.now)
        if len(values) < n + 1:
            continue
        tail = values[-(n + 1):]
        if all(b > 0 and p.growth(a / b) for b, a in zip(tail, tail[1:], strict=False)):
            res.entities.append(e)
            res.evidence.append(_ev(c, p.metric, e, tail[-1], tail[0], f"each of {n} growing {p.growth}",
                                    p.window, "successive values: " + ", ".join(f"{x:.3g}" for x in tail)))
    res.holds = bool(res.entities)
    return res


def change_point(times: Sequence[float], values: Sequence[float], min_segment: int
                 ) -> tuple[float, float, float, float] | None:
    """The most likely single level shift: ``(score, time, mean before, mean after)``, or None.

    The score is Welch's t statistic between the two sides of the best split, computed for
    every split in O(n) with prefix sums after clipping outliers; a window with fewer than two
    segments' worth of points has no split.
    """
    n = len(values)
    if n < 2 * min_segment:
        return None
    # Clip to the 2nd..98th percentile first: one checkpoint's 10-second step would otherwise
    # inflate its side's variance and hide a real shift.  A shift of more than 2% of the window
    # survives the clipping.
    ordered = sorted(values)
    lo, hi = ordered[int(0.02 * (n - 1))], ordered[int(0.98 * (n - 1))]
    values = [min(max(v, lo), hi) for v in values]
    s1 = [0.0]
    s2 = [0.0]
    for v in values:
        s1.append(s1[-1] + v)
        s2.append(s2[-1] + v * v)
    best: tuple[float, float, float, float] | None = None
    for k in range(min_segment, n - min_segment + 1):
        nl, nr = k, n - k
        ml, mr = s1[k] / nl, (s1[n] - s1[k]) / nr
        vl = max(s2[k] / nl - ml * ml, 0.0)
        vr = max((s2[n] - s2[k]) / nr - mr * mr, 0.0)
        # a floor on the spread, as for peer_outlier: two flat segments must not give an infinite score
        se = math.sqrt(vl / nl + vr / nr) or 1e-9
        se = max(se, 0.01 * max(abs(ml), abs(mr)) / math.sqrt(min(nl, nr)))
        score = abs(mr - ml) / se
        if best is None or score > best[0]:
            best = (score, times[k], ml, mr)
    return best


@dataclass(frozen=True, kw_only=True)
class ChangePointCondition(ConditionParams):
    """A level shift inside the window, and when it happened.

    The split that best separates "before" from "after" (a two-sample t statistic over every split
    point), with the shift's size as a ratio."""

    metric: MetricName = param(doc="the metric (see `whywait rules metrics`); its level sets the entities judged")
    window: Duration = param(120.0, "where to look for the shift")
    score: Comparison = param(Compare(">", 6.0), "comparison of the split's Welch t statistic")
    ratio: Comparison = param(doc="comparison of the mean after ÷ the mean before the best split")
    min_segment: Number = param(10.0, "points each side of a split needs")


@condition("change_point", ChangePointCondition)
def _change_point(c: Condition, ctx: Ctx) -> Result:
    p = _params(c, ChangePointCondition)
    level = METRICS[p.metric].level
    res = Result(False)
    for e in ctx.entities(level, c.on):
        times, values = ctx.store.window(p.metric, e, ctx.now - p.window, ctx.now)
        cp = change_point(times, values, int(p.min_segment))
        if cp is None:
            continue
        score, at, before, after = cp
        ratio = after / before if before > 0 else (math.inf if after > 0 else 1.0)
        if p.score(score) and p.ratio(ratio):
            res.entities.append(e)
            ctx.facts.setdefault("changed_at", at)
            res.evidence.append(_ev(c, p.metric, e, after, before, f"level shift {p.ratio}", p.window,
                                    f"shifted {ratio:.2f}x at {ctx.now - at:.0f}s before now (score {score:.0f})"))
    res.holds = bool(res.entities)
    return res


@dataclass(frozen=True, kw_only=True)
class AbsenceCondition(ConditionParams):
    """An entity that stops reporting while its job runs.

    At the node level a node of the job that has never reported counts as silent too, once telemetry has
    come in from the cluster for ``for`` (no agent there, or one publishing under another name)."""

    level: Literal["rank", "node"] = param(doc="what falls silent: a rank (its steps) or a node (its telemetry; "
                                               "a node that never reported counts once the cluster's telemetry "
                                               "has come in for `for`)")
    for_: Duration = param(doc="silent at least this long")
    max_share: Share = param(1.0, "hold only while at most this share of the job's reporting entities is silent")
    min_share: Share = param(0.0, "hold only while at least this share of the job's reporting entities is silent "
                                  "(`0.9` of its ranks: the job has stopped)")
    steps: Number = param(0.0, "for ranks: silent at least this many of the job's typical step times too, "
                               "whichever is longer (a job of 45 s steps is silent between its steps)")


@condition("absence", AbsenceCondition)
def _absence(c: Condition, ctx: Ctx) -> Result:
    p = _params(c, AbsenceCondition)
    metric = "step.since_last_s" if p.level == "rank" else "node.since_last_s"
    res = Result(False)
    if ctx.now > ctx.store.max_time + 1.0 or (p.level == "node" and _data_ended(ctx)):
        # Past the newest input of all (a replay's or a rule test's last ticks, run on so incidents may
        # resolve), or all but a node or two stopped at once: entities are silent because the data
        # ended, which says nothing of any one.
        return res
    ents = ctx.entities(p.level, c.on)
    ages = ctx.store.ages(metric, ents, ctx.now)  # NaN: never reported (the job may still be starting)
    known = int(np.count_nonzero(~np.isnan(ages)))
    for_s = p.for_
    if p.steps > 0 and p.level == "rank":
        for_s = max(for_s, p.steps * _typical_step_s(ctx))
    with np.errstate(invalid="ignore"):
        silent = np.nonzero(ages >= for_s)[0]
    # Share of the entities that have reported at all, by their reports' times: a whole job pausing (a
    # checkpoint) is not one rank falling silent, nor is every node but one whose clock runs ahead.
    quiet = len(silent)
    if p.level == "rank" and 0 < quiet < known:
        silent = _behind(ctx, ents, silent, for_s)
    never = _never_reported(ctx, ages, for_s) if p.level == "node" and known < len(ents) else None
    if never is not None:
        quiet += len(never[0])
        known += len(never[0])
        silent = np.concatenate([silent, never[0]]).astype(np.int64)
        ages[never[0]] = never[1]
    res.entities = [ents[i] for i in silent]
    res.holds = bool(res.entities) and p.min_share * known <= quiet <= p.max_share * max(known, 1)
    if res.holds:
        gone = set() if never is None else set(never[0].tolist())
        res.evidence = [_ev(c, metric, ents[i], float(ages[i]), None, f">= {for_s:g}s", None,
                            "never reported; telemetry has come in for this long" if i in gone
                            else "no report since")
                        for i in silent]
    return res


def _data_ended(ctx: Ctx) -> bool:
    """Whether the cluster's telemetry has ended at ``ctx.now``, rather than some nodes gone dark.

    Judged on the nodes that reported in the last 5 s: the data has ended when fewer than half of the
    nodes ever seen did and fewer than ``max(2, 10%)`` of them did.  The end of a replay or a rule test
    leaves no node reporting, or only one whose clock runs ahead (``job.node-clock-skew``), still
    stamping later times.  A rack that loses power, or a job all of whose agents lose Kafka, leaves
    the rest of the cluster reporting: the nodes that went dark are then judged, however many they are.
    (The share alone, the test until session 24, hid a whole 16-node job going dark on a 24-node cluster:
    no diagnosis at all.)  Half suffices on a cluster of a few nodes, where 2 would be all of them.
    """
    hit, known = ctx.store.reporting(ctx.now - 5.0, ctx.now)
    return 2 * hit < known and hit < max(2, math.ceil(0.1 * known))


def _typical_step_s(ctx: Ctx) -> float:
    """The job's typical step time: the median over its last (up to) 10 steps of each step's median
    duration over its ranks; 0 before it has reported one."""
    table = ctx.store.step_tables.get(ctx.job.job)
    if table is None or not table.steps:
        return 0.0
    rows = list(table.steps.values())[-10:]
    return float(statistics.median(row_median(r) for r in rows))


def _never_reported(ctx: Ctx, ages: np.ndarray, for_s: float) -> tuple[np.ndarray, float] | None:
    """The job's nodes that have never reported, once telemetry has come in for ``for_s``.

    A node with no agent (never installed, or publishing under another name than the placement's) has
    no age: without this it is never silent, and whywait is blind on it without saying so.  Judged
    against the first node report the engine received from anywhere in the cluster, so an engine
    that just started (agents reporting one by one) does not call them unseen, while a single-node
    job, or a job none of whose nodes has an agent, is told.  Returns the indices and the span
    telemetry has come in for.
    """
    missing = np.nonzero(np.isnan(ages))[0]
    first = ctx.store.telemetry_since()
    if not len(missing) or first is None:
        return None
    span = ctx.now - first
    return (missing, span) if span >= for_s else None


def _behind(ctx: Ctx, ents: Sequence[str], silent: np.ndarray, for_s: float) -> np.ndarray:
    """Of the ranks whose last report looks old while others report, those the job has really left behind.

    A rank is silent when the job finished the step after its newest one at least ``for_s`` ago (by the
    step's median end over its ranks), not when its own last stamp is that old: a node whose clock is
    behind (``job.node-clock-skew``) stamps everything it sends seconds early, so its ranks' reports
    look old although they reported the job's newest step; a rank that stopped has not reported the
    steps its peers finished since.  Called for rank absences only while some ranks still report (a
    whole job that stops completing steps is judged on the times alone).
    """
    table = ctx.store.step_tables.get(ctx.job.job)
    if table is None or not table.newest_step:
        return silent
    newest = max(table.newest_step.values())
    keep = []
    for i in silent:
        _, _, rank = ents[i].rpartition(":")
        mine = table.newest_step.get(int(rank), -1) if rank.lstrip("-").isdigit() else -1
        if mine < 0:
            keep.append(i)  # never reported a step the table holds: as silent as its age says
            continue
        if mine >= newest:
            continue  # it reported the job's newest step: not behind, whatever its stamp
        # The job's next step after the rank's newest (a producer may report every Nth step only).
        after = table.steps.get(mine + 1) or next((row for s, row in table.steps.items() if s > mine), None)
        if after is None or ctx.now - row_median(after, "t") >= for_s:
            keep.append(i)  # the job finished its next step long enough ago
    return np.asarray(keep, np.int64)


@dataclass(frozen=True, kw_only=True)
class EventCondition(ConditionParams):
    """Discrete events (XID, uncorrectable ECC, link down, checkpoint failure) counted in a window."""

    metric: MetricName = param(doc="e.g. `gpu.xid`, `gpu.ecc_uncorrected`, `net.carrier_changes`, "
                                   "`checkpoint.failed`")
    window: Duration = param(10.0, "the window the aggregate covers: `(now - window, now]`")
    count: Comparison = param(Compare(">=", 1.0), "comparison of the number of events in the window")
    codes: Codes | None = param(None, "for a metric of occurrences (`gpu.xid`): only these codes, e.g. "
                                      "`[48, 79, 94, 95]`")


@condition("event", EventCondition)
def _event(c: Condition, ctx: Ctx) -> Result:
    p = _params(c, EventCondition)
    level = METRICS[p.metric].level
    res = Result(False)
    codes = set(p.codes) if p.codes else None
    ents = ctx.entities(level, c.on)
    # Counters carry a count per sample (summed over the window, for every entity at once); XID series
    # carry one point per occurrence with its code.
    occurrences = METRICS[p.metric].occurrences
    if not occurrences and ctx.store.zero_in(p.metric, ctx.now, p.window):
        return res  # no count above 0 anywhere in the window
    sums = None if occurrences else ctx.store.values(p.metric, ents, "sum", ctx.now, p.window)
    if sums is None:  # only the entities that ever had one can have one in the window
        seen = ctx.store.occurring(p.metric)
        idx: Any = [i for i, e in enumerate(ents) if e in seen] if seen else []
    else:
        idx = np.nonzero(sums > 0)[0]
    for i in idx:
        e = ents[i]
        if sums is None:
            _, values = ctx.store.window(p.metric, e, ctx.now - p.window, ctx.now)
            hits = [v for v in values if codes is None or int(v) in codes]
            n = float(len(hits))
        else:
            hits = []
            n = 0.0 if math.isnan(sums[i]) else float(sums[i])
        if n > 0 and p.count(n):
            res.entities.append(e)
            note = "codes " + ", ".join(str(int(h)) for h in hits) if hits else ""
            res.evidence.append(_ev(c, p.metric, e, n, None, f"count {p.count}", p.window, note))
    res.holds = bool(res.entities)
    return res


_NIC_LOW, _NIC_HIGH = 0.75, 1.25  # a NIC below 3/4 of its node's mean while another is above 5/4


@dataclass(frozen=True, kw_only=True)
class TopologyCondition(ConditionParams):
    """Topology predicates over the culprit entities found by the other conditions."""

    predicate: Literal["share_switch", "share_rack", "share_pool", "wrong_nic", "other_project_on_switch",
                       "other_project_on_pool"] = param(doc="see the predicates below")
    min_entities: Number = param(1.0, "at least this many culprit nodes")
    metric: MetricName | None = param(None, "for `other_project_on_*`: the other job counts only when one of its "
                                            "nodes there shows this metric (with `value`)")
    agg: Agg = param("avg", "how the window's points are reduced (see Aggregations)")
    window: Duration = param(10.0, "the window the aggregate covers: `(now - window, now]`")
    value: Comparison | None = param(None, "for `other_project_on_*`: the comparison the other job's `agg` of "
                                           "`metric` must pass")

    def check(self) -> str | None:
        if (self.metric is None) != (self.value is None):
            return "'topology' needs both 'metric' and 'value' (the other job's activity) or neither"
        return None


@condition("topology", TopologyCondition)
def _topology(c: Condition, ctx: Ctx) -> Result:
    p = _params(c, TopologyCondition)
    topo = ctx.topology
    pred = p.predicate
    # Culprits at job level (a checkpoint, the job itself) have no nodes: the job's own nodes stand in.
    nodes = ctx.culprit_nodes() if any(e != ctx.job.job for e in ctx.culprits) else ctx.nodes()
    nodes = [n for n in nodes if n != ctx.job.job]
    if len(nodes) < p.min_entities or topo is None:
        return Result(False)
    if pred in ("share_switch", "share_rack", "share_pool"):
        fn = {"share_switch": topo.common_switch, "share_rack": topo.common_rack,
              "share_pool": topo.common_pool}[pred]
        common = fn(nodes)
        if common is None:
            return Result(False)
        ctx.facts[pred.split("_")[1]] = common
        return Result(True, [common], [Evidence("topology", common, float(len(nodes)), "nodes",
                                                note=f"{len(nodes)} affected node(s) share {common}")])
    if pred == "wrong_nic":
        return _wrong_nic(c, ctx, nodes)
    return _other_project(c, ctx, nodes)


def _wrong_nic(c: Condition, ctx: Ctx, nodes: list[str]) -> Result:
    """A node whose PCIe-local NIC idles while another NIC of the node carries the traffic.

    For each node, the NICs' transmit rates over the window: one below 3/4 of the node's mean whose
    GPUs the job uses, another above 5/4 of it.  The facts name the GPUs, the NIC they should use
    (``expected_nic``) and the one that carries their traffic (``actual_nic``).
    """
    topo, store, w = ctx.topology, ctx.store, _params(c, TopologyCondition).window
    used = {(n, g) for n, g in ctx.job.ranks.values()}
    for node in nodes:
        tx: dict[str, float] = {}
        for e in store.nic_entities([node]):
            v = store.value("nic.tx_bytes_per_s", e, "avg", ctx.now, w)
            if v is not None:
                tx[e.split("/", 1)[1]] = v
        if len(tx) < 2:
            continue
        mean = sum(tx.values()) / len(tx)
        busiest = max(tx, key=lambda k: tx[k])
        if mean <= 0 or tx[busiest] < _NIC_HIGH * mean:
            continue
        # A NIC whose link went down is idle for another reason (network.link-flap explains it).
        starved = sorted(k for k, v in tx.items() if v < _NIC_LOW * mean
                         and (store.value("nic.link_up", f"{node}/{k}", "min", ctx.now, w) or 0.0) >= 1.0)
        gpus = sorted(g for n, g in used if n == node and topo.expected_nic(node, g) in starved)
        if not gpus:
            continue
        exp = ", ".join(starved)
        ctx.facts.update(gpu=f"{node} GPU{'s' if len(gpus) > 1 else ''} {_span(gpus)}", gpus=gpus,
                         expected_nic=exp, actual_nic=busiest, nic_node=node)
        ev = [Evidence("nic.tx_bytes_per_s", f"{node}/{k}", round(tx[k], 1), "bytes/s", round(mean, 1),
                       f"< {_NIC_LOW:g}x the node's NIC mean", w, f"local NIC of GPU(s) {_span(gpus)}, idle")
              for k in starved]
        ev.append(Evidence("nic.tx_bytes_per_s", f"{node}/{busiest}", round(tx[busiest], 1), "bytes/s",
                           round(mean, 1), f"> {_NIC_HIGH:g}x the node's NIC mean", w, "carries their traffic"))
        ev.append(Evidence("topology", node, float(len(gpus)), "GPUs",
                           note=f"traffic of {node} GPU(s) {_span(gpus)} leaves through {busiest}, expected {exp}"))
        return Result(True, [node], ev)
    return Result(False)


def _span(nums: list[int]) -> str:
    return f"{nums[0]}" if len(nums) == 1 else (f"{nums[0]}–{nums[-1]}" if nums == list(range(nums[0], nums[-1] + 1))
                                                else ", ".join(map(str, nums)))


def _other_project(c: Condition, ctx: Ctx, nodes: list[str]) -> Result:
    """other_project_on_switch / other_project_on_pool: contention from another project's job.

    With ``metric`` and ``value``, the other job counts only when one of its nodes on the shared
    switch or pool is busy that way (for example sending near line rate); its busiest node becomes
    evidence, and the facts name the job, its project and team, and the shared place.
    """
    p, topo = _params(c, TopologyCondition), ctx.topology
    where = "switch" if p.predicate.endswith("switch") else "pool"
    places: set[str] = set()
    for n in nodes:
        if where == "switch":
            leaf = topo.leaf_of(n)
            if leaf:
                places.add(leaf)
        else:
            places.update(topo.pools_of(n))
    for place in sorted(places):
        under = set(topo.nodes_under(place))
        for o in topo.other_jobs_sharing(ctx.job.job, place):
            if o.project == ctx.job.project:
                continue
            ev: list[Evidence] = []
            if p.metric is not None and p.value is not None:  # both or neither (the type's check)
                best: tuple[float, str] | None = None
                for n in sorted({n for n, _ in o.ranks.values()} & under):
                    v = ctx.store.value(p.metric, n, p.agg, ctx.now, p.window)
                    if v is not None and p.value(v) and (best is None or v > best[0]):
                        best = (v, n)
                if best is None:
                    continue
                ev.append(_ev(c, p.metric, best[1], best[0], None, f"{p.agg} {p.value}", p.window,
                              f"{o.job} ({o.project}) on {best[1]}"))
                ctx.facts.update(other_node=best[1], other_value=best[0])
            ctx.facts.update(other_job=o.job, other_project=o.project, other_team=o.team, shared=place)
            ev.insert(0, Evidence("topology", place, 1.0, "jobs",
                                  note=f"{o.job} of project {o.project} also uses {place}"))
            ev.append(Evidence("topology", o.job, 1.0, "job", note=f"{o.job} (project {o.project}, team {o.team})"))
            return Result(True, [place], ev)
    return Result(False)


# The step-aligned condition types live in their own module; it imports this one (for Ctx and
# Result), so it is imported here, after them, and its ``@condition`` registrations run then.
import whywait.engine.evaluate.step_conditions  # noqa: E402,F401

# Metrics the condition code reads by name, whatever the rules say (the evaluator keeps them stored along
# with every metric a loaded rule names; see MetricStore.set_keep): the wrong-NIC predicate's traffic and
# link state, the step conditions' job step and checkpoint series (step_conditions.py), and the column the
# store reads a rank's last report from; and the names step conditions give their evidence.
# tests/evaluate/test_kept_metrics.py checks this list against the metric names quoted in engine/evaluate.
IMPLICIT_METRICS = frozenset({"nic.tx_bytes_per_s", "nic.link_up", "job.duration_s", "job.checkpoint_s",
                              "checkpoint.duration_s",
                              "step.duration_s", "step.work_s", "job.step_s", "step.end_offset_s"})


def rule_leaves(rules: Iterable[Any]) -> Iterator[tuple[Any, frozenset[str]]]:
    """Each condition leaf of the rules (``when``, evidence and checks): its parameters and the metrics it names.

    Any parameter whose value is a metric name counts (``metric``, a baseline's metric, lists of them).
    Walked by :func:`rule_metrics` and the evaluator's ``rule_spans`` when the rule set changes.
    """
    for rule in rules:
        for node in (rule.when, *rule.evidence, *(c.when for c in rule.checks)):
            for leaf in leaves(node):
                params: Any = leaf.params  # a frozen dataclass of the condition's type
                names: set[str] = set()
                for f in dataclass_fields(params):
                    v = getattr(params, f.name)
                    names.update(x for x in (v if isinstance(v, (list, tuple, frozenset, set)) else (v,))
                                 if isinstance(x, str) and x in METRICS)
                yield params, frozenset(names)


def rule_metrics(rules: Iterable[Any]) -> frozenset[str]:
    """Every catalogue metric the rules' conditions name (``when``, evidence and checks), plus :data:`IMPLICIT_METRICS`.

    Called by the evaluator whenever its rule set changes: what the store must keep.
    """
    out = set(IMPLICIT_METRICS)
    for _, names in rule_leaves(rules):
        out |= names
    return frozenset(out)


# Past this much event time without any input, no leaf holds.  Live, the watermark never passes the
# newest input, so this only cuts short replays and rule tests that run the clock on after their
# last event (to let keep_firing_for run out), where every window is empty anyway.
QUIET_S = 120.0


def evaluate(node: Node, ctx: Ctx) -> Result:
    """Evaluate a condition tree; culprit leaves update ``ctx.culprits`` as a side effect."""
    if isinstance(node, Condition):
        if ctx.now - ctx.store.max_time > QUIET_S:
            return Result(False)
        r: Result = CONDITIONS[node.type].evaluate(node, ctx)  # typed loosely: engine.rules cannot name Ctx
        if r.holds and node.culprit and r.entities:
            ctx.culprits = list(r.entities)
            ctx.culprit_level = node.params.entity_level()
            ctx.facts["culprit_ranks"] = ctx.culprit_ranks()
        return r
    if isinstance(node, Not):
        inner = evaluate(node.item, ctx)
        return Result(not inner.holds)
    if isinstance(node, AllOf):
        out = Result(True)
        for item in node.items:
            if isinstance(item, Not) and ctx.culprits and _culprit_scoped(item.item):
                # "not X" about the culprit: X explains the culprits it holds on, and they are dropped;
                # the condition fails only when it explains them all (or cannot say which it explains).
                inner = evaluate(item.item, ctx)
                if inner.holds and not _drop_explained(ctx, inner.entities, out):
                    return Result(False)
                continue
            r = evaluate(item, ctx)
            if not r.holds:
                return Result(False)
            out.entities += r.entities
            out.evidence += r.evidence
        return out
    assert isinstance(node, AnyOf)
    out = Result(False)
    for item in node.items:
        r = evaluate(item, ctx)
        if r.holds:
            out.holds = True
            out.entities += r.entities
            out.evidence += r.evidence
    return out


def _culprit_scoped(node: Node) -> bool:
    """Whether every leaf of ``node`` looks at the culprit only (``scope: culprit``), with no negation inside."""
    if isinstance(node, Condition):
        return node.on == "culprit"
    if isinstance(node, Not):
        return False
    return bool(node.items) and all(_culprit_scoped(i) for i in node.items)


def _drop_explained(ctx: Ctx, found: Sequence[str], out: Result) -> bool:
    """Drop from the culprits those ``found`` (the entities a ``not``'s condition held on) explain.

    Called by :func:`evaluate` when a ``not`` about the culprit holds inside an ``all``.  Why not fail
    the whole rule, as a plain ``not`` does: a rule that names several culprits (the ranks a straggler
    condition flagged) would be silenced by a cause found on one of them, and the other, unexplained
    stragglers go unreported for as long as that cause lasts.  A GPU explains the rank on it (and a
    node-level culprit holding it); a node, NIC or device explains every culprit on its node.  Returns
    False (the rule fails) when every culprit is explained or none can be matched; else narrows
    ``ctx.culprits``, the straggler facts and ``out``'s entities and evidence to the others, and returns True.
    """
    job = ctx.job
    culprits = list(ctx.culprits)
    if job.job in found:
        return False

    def gpu_of(e: str) -> str | None:
        if "/gpu" in e:
            return e
        if e.startswith(job.job + ":"):
            placed = job.ranks.get(int(e.rsplit(":", 1)[1]))
            return f"{placed[0]}/gpu{placed[1]}" if placed else None
        return None

    gpus = {g for g in map(gpu_of, found) if g is not None}
    nodes = {ctx.node_of(e) for e in found if gpu_of(e) is None}
    gpu_nodes = {g.split("/", 1)[0] for g in gpus}
    explained = set()
    for c in culprits:
        g = gpu_of(c)
        if ctx.node_of(c) in nodes or (g in gpus if g is not None else ctx.node_of(c) in gpu_nodes):
            explained.add(c)
    keep = [c for c in culprits if c not in explained]
    if not explained or not keep:
        return False
    ctx.culprits = keep
    ctx.facts["culprit_ranks"] = ctx.culprit_ranks()
    left = set(keep)
    stragglers = ctx.facts.get("stragglers")
    if stragglers:
        kept = [s for s in stragglers if f"{job.job}:{s.get('rank')}" in left]
        if kept:
            ctx.facts.update(stragglers=kept, n_stragglers=len(kept), straggler_ratio=kept[0]["ratio"],
                             steady=any(s.get("history_ratio") is None for s in kept))
    out.entities = [e for e in out.entities if e not in explained]
    out.evidence = [ev for ev in out.evidence if ev.entity not in explained]
    return True
