"""Condition types that read the job's own step timings, aligned by step number.

Each is a typed parameters class registered with its function by ``@condition`` in
:data:`whywait.engine.rules.condition_types.CONDITIONS`.  Each is called once per tick per
(rule, job), like every leaf, and returns a :class:`Result`.  They fill
``ctx.facts`` for the rule's templates and for the cost figure:

- ``step_outlier``: ranks slower than the comparable ranks (their pipeline stage
  on the other replicas) on the same steps; a culprit leaf that names rank(s).
  With no hardware signature this is the straggler of unknown cause.
- ``phase``: which part of the culprits' step is slow: compute, input or communication.
- ``stage_imbalance``: one pipeline stage slower than the others on every replica.
- ``rotation``: a different slow rank each step (input or sequence-length imbalance).
- ``periodic``: slowdowns that recur with a regular period.
- ``what_if``: the step time were the culprits as fast as their peers, and the
  seconds lost per step since the incident began (the evaluator turns those into
  GPU-hours).

See :mod:`whywait.engine.evaluate.steps` for why the split, not the step time, and for the
robust statistics.
"""

from __future__ import annotations

import math
import statistics
import warnings
from collections import Counter
from dataclasses import dataclass
from types import MappingProxyType
from typing import Any, Callable, Literal, Mapping, Sequence

import numpy as np
from whywait.engine.diagnosis import Evidence
from whywait.engine.evaluate.conditions import Ctx, Result, compare_all
from whywait.engine.evaluate.steps import (
    PHASE_NAMES,
    FrozenRow,
    JudgedRanks,
    StepRec,
    column_medians,
    column_of,
    groups_key,
    groups_of,
    judge_window,
    kept_stat,
    known,
    lower_quartile,
    per_coords,
    phase_excess,
    rank_matrix,
    row_end,
    row_median,
    select,
    sequential_onset,
    slow_turns,
    spread_lines,
    step_loss,
)
from whywait.engine.rules.condition_types import (
    Compare,
    Comparison,
    ConditionParams,
    Duration,
    Number,
    Share,
    condition,
    param,
)
from whywait.engine.rules.schema import Condition

Steps = Sequence[tuple[int, Mapping[int, StepRec]]]
Measure = Literal["work", "duration_s", "compute_s", "data_wait_s", "comm_s"]
Within = Literal["stage", "job"]
_MEASURE_DOC = "`work` (compute plus input wait), or one field of the step: `duration_s`, `compute_s`, ..."
_WITHIN_DOC = "`stage`: compare with the same pipeline stage on the other replicas; `job`: with every rank"
# How many steps before the window count as a rank's history (bounded: the table keeps ~600).
_HISTORY_MAX = 60
# How many steps before its window the rotation's sequential test counts slow turns on: the job's own
# rate of them is only counted, and 60 steps leave it uncertain enough to cost a hiccupy job about
# three more slow turns before a rotation is shown (the table keeps ~600).
_PAST_TURNS_MAX = 240
# How far past its own usual wander (robust z against its own history) a rank's step must be to count
# as grown: 3 spreads, i.e. about 1 step in 700 of a steady rank by chance.
_OWN_Z = 3.0
# A straggler of steps longer than its window is judged on this many of the latest steps.
_LONG_STEPS = 3
# How many steps before its window a rotation with no "before" (uneven from the job's first steps) must
# have been as uneven as the window to be told as one: a long past, so a busy stretch is not enough.
_STEADY_PAST = 30
# The fewest slow points (seconds, or steps when steps are longer) a periodic slowdown's burst holds.
_BURST_POINTS = 3


def _coords(ctx: Ctx) -> Any:
    return getattr(ctx.job, "coords", None) or _NO_COORDS


_NO_COORDS: Mapping[int, Mapping[str, float]] = MappingProxyType({})  # one object: what is kept per coords finds it


def _window(c: Condition, ctx: Ctx) -> tuple[Steps, Steps] | None:
    table = ctx.store.step_tables.get(ctx.job.job)
    if table is None:
        return None
    done = table.complete(ctx.now)
    p = c.params
    win, hist = select(done, ctx.now, p["window"], int(p["steps"]))
    if len(win) < int(p["steps"]):
        return None
    return win, hist[-_HISTORY_MAX:]


def _long_steps(win: Steps, hist: Steps, window_s: float) -> bool:
    """Whether the job's usual step is at least as long as the window itself.

    Usual: the lower quartile of the latest steps (the window and up to 20 steps before it).
    Slowdowns and hiccups only ever lengthen steps, so the short ones are the job's own pace.  Not
    the window's median: a slowdown of the whole job, or a few hiccups, stretch a 3 s step past a
    5 s window, and judging a rank on its last three steps then let one hiccup and one unlucky step
    make a straggler.
    """
    rows = [*hist[-20:], *win]
    return lower_quartile([_median_duration(row) for _, row in rows]) >= window_s


def _median_duration(row: Mapping[int, Any]) -> float:
    """The median step time of one step's ranks, kept on the step (a sort of 10,240 floats at 10,240 ranks)."""
    return float(kept_stat(row, _DUR_MEDIAN, lambda: row_median(row)))


_DUR_MEDIAN = ("median", "duration_s")


def _ent(ctx: Ctx, rank: int) -> str:
    return f"{ctx.job.job}:{rank}"


def _where(ctx: Ctx, rank: int) -> dict[str, Any]:
    node, gpu = ctx.job.ranks.get(rank, ("?", -1))
    coords = _coords(ctx)
    co = coords.get(rank) or {}
    # A stage or replica is worth naming only when the job has more than one of them.
    stages = {c.get("pp") for c in coords.values()}
    replicas = {c.get("dp") for c in coords.values()}
    return {"rank": rank, "node": node, "gpu": gpu, "stage": co.get("pp") if len(stages) > 1 else None,
            "replica": co.get("dp") if len(replicas) > 1 else None}


@dataclass(frozen=True, kw_only=True)
class StepOutlierCondition(ConditionParams):
    """Ranks whose own work per step exceeds their comparable peers' (same pipeline stage): stragglers."""

    measure: Measure = param("work", _MEASURE_DOC)
    window: Duration = param(5.0, "the last `window` or the last `steps` steps, whichever is longer")
    steps: Number = param(5.0, "see `window`")
    ratio: Comparison = param(Compare(">", 1.1), "median over the window of the rank's per-step ratio to its "
                                                 "group's lower quartile")
    zscore: Comparison = param(Compare(">", 4.0), "that ratio against the step's noise (the fast group's MAD "
                                                  "scaled to a standard deviation, floored at 0.02)")
    persist: Number = param(0.6, "the rank was over `ratio` on at least this share of the steps")
    within: Within = param("stage", _WITHIN_DOC)
    history: Number = param(20.0, "steps before the window needed to judge the rank against its own past")
    steady_ratio: Number = param(3.0, "below this, a rank must also have slowed by `ratio` against its own history")
    max_share: Share = param(0.5, "more than this share flagged: no straggler (the reference itself is in doubt)")
    min_ranks: Number = param(4.0, "fewer ranks with data: no judgement")
    onset: Literal["during", "from-start"] = param(
        "during", "`during`: ranks that became slower than their peers; `from-start`: only those the default "
                  "leaves out as slower hardware, slower by under `steady_ratio` since their history began")
    mates_ratio: Comparison | None = param(
        None, "with `onset: from-start`: a lower `ratio` for a rank whose node-mates (two or more, judged, the same "
              "GPU share) are all fast: GPUs of one node are one model, so slower hardware cannot explain it")
    level: Literal["rank"] = param("rank", "the culprit's level: always `rank`")


@condition("step_outlier", StepOutlierCondition)
def _step_outlier(c: Condition, ctx: Ctx) -> Result:
    """Ranks whose own work per step exceeds their comparable peers' on most aligned steps.

    A rank is a straggler when, over the window, the median of its per-step ratio to its group's
    lower quartile passes ``ratio``, its robust z against the fast group passes ``zscore``, and it
    was over ``ratio`` on at least ``persist`` of the steps (one hiccup is not a straggler).  When the
    rank has history (steps before the window) its ratio must also have grown by ``ratio`` against
    that history, unless it exceeds ``steady_ratio``: a rank that was always 20% slower (an older
    GPU) is heterogeneity, not a new fault.  The history ratio is frozen while the rank is flagged,
    so a long fault never becomes its own baseline.  More than ``max_share`` of the ranks flagged is
    not a straggler: the reference itself is then in doubt.
    """
    p = c.params
    got = _window(c, ctx)
    if got is None:
        return Result(False)
    win, hist = got
    # Steps each longer than the whole window (8 s, 45 s steps): no hiccup lasts a step that long, so the
    # latest _LONG_STEPS of them are evidence enough, and waiting for more would cost minutes.
    if len(win) > _LONG_STEPS and _long_steps(win, hist, p["window"]):
        hist = [*hist, *win[:-_LONG_STEPS]][-_HISTORY_MAX:]
        win = win[-_LONG_STEPS:]
    seen = set().union(*(row.keys() for _, row in win))
    ranks = [r for r in ctx.job.ranks if r in seen]
    groups = groups_of(ranks, _coords(ctx), p["within"])
    thr = p["ratio"].value
    judged = judge_window(win, hist, groups, p["measure"], thr, int(p["history"]), z_thr=p["zscore"].value)
    if len(judged) < int(p["min_ranks"]):
        return Result(False)
    # A rank grew against its own past only if it grew by more than the job's other ranks did on the same
    # steps, past how widely their growth varies.  Ratios are to the group's lower quartile, which drops
    # when batches become uneven on every rank; and then every rank's 5-step median wanders by a tenth or
    # more.  Without this, an older GPU's ranks "grew" by half the moment batches became uneven, and were
    # told as stragglers.  (With even batches the others' growth is 1 +- 2%, and a straggler's is far out.)
    growth_z = _growth_z(judged)
    flagged = []
    is_ratio, is_z, persist = p["ratio"], p["zscore"], p["persist"]
    prefix = (ctx.rule_id, c.line, ctx.job.job)
    # Only a rank passing the first tests, or one flagged before (its frozen past in the state), is looked
    # at: all ranks are screened at once, in the judgement's order, and the rest skipped as the loop did.
    ok_all = compare_all(is_ratio, judged.ratio) & compare_all(is_z, judged.z) & (judged.slow_share >= persist)
    if p["onset"] == "from-start":
        if p["mates_ratio"] is not None:
            mates = p["mates_ratio"]
            maybe = (~ok_all & compare_all(mates, judged.ratio) & compare_all(is_z, judged.z)
                     & _fast_mates(ctx, judged, mates))
            ok_all = ok_all.copy()
            for i in np.nonzero(maybe)[0].tolist():  # a few at most: over `mates_ratio` on `persist` of the steps
                rs = judged.judgement(i).ratios
                ok_all[i] = bool(rs) and sum(1 for x in rs if mates(x)) >= persist * len(rs)
        flagged = _slow_since_start(judged, ok_all, thr, p["steady_ratio"], ctx.state, prefix)
    for i in [] if p["onset"] == "from-start" else _looked_at(judged, ok_all, _held_ranks(ctx.state, prefix)):
        j = judged.judgement(i)
        key = (*prefix, j.rank)
        ok = bool(ok_all[i])
        if not ok and key not in ctx.state:
            continue  # nothing to judge and nothing to forget (what _looked_at screens out)
        # Frozen while flagged, as two numbers (the engine's snapshot keeps numeric state only).
        base = ctx.state.get(key, j.history_ratio)
        spread = ctx.state.get(key + ("spread",), j.history_spread) if key in ctx.state else j.history_spread
        if ok and j.ratio < p["steady_ratio"]:
            # Modestly slower: a fault only if it grew against its own past.  Without a past (the job,
            # or the rank, just started) it may be a slower GPU model: wait for history.
            ok = base is not None and (p["ratio"](j.ratio / base) if base > 0 else True)
            if ok and base is not None and spread is not None:
                # ...and grew past its own step-to-step wander, on most steps: a rank always 2x slower
                # wanders by +-10% (its 5-step median with it), which is no new fault.
                bar = max(base * thr, base + _OWN_Z * spread)
                ok = sum(1 for x in j.ratios if x > bar) >= p["persist"] * len(j.ratios)
            if ok and base is not None:
                # 3 spreads of the others' growth, as for its own wander (_OWN_Z): growth is a ratio of two
                # noisy ratios, so at `zscore` (4) a 1.15x straggler on 4% jitter was missed.
                z = growth_z(j, base)
                ok = z is None or z >= _OWN_Z
        if not ok and key in ctx.state and base is not None and base > 0 and is_ratio.halfway(j.ratio / base):
            # Held (flagged before) and still well above its frozen past, half-way to the ratio that flagged
            # it: one noisy tick is no recovery.  Dropping the frozen past there made the slow window the
            # rank's new past, so a 1.3x straggler on +-10% noise was "resolved" 45 s after it fired and
            # never told again while it stayed slow to the end.  It recovers when it comes back near it.
            ok = True
        if ok:
            if base is not None:
                ctx.state[key] = base
                if spread is not None:
                    ctx.state[key + ("spread",)] = spread
            flagged.append((j, base))
        else:
            ctx.state.pop(key, None)
            ctx.state.pop(key + ("spread",), None)
    if flagged:
        # On the steps a flagged rank was not slow, was another rank slow instead?  Then the job's
        # slow rank rotates (uneven batches) and a rank slow on most steps by chance is no
        # straggler; only a rank slow on every step still is.
        # A rank slower than the fast ones on every step since its history began (an older GPU) is
        # not "another rank slow instead": only a rank slow against its own past is.
        mine = {j.rank for j, _ in flagged}
        theirs = judged.newly_slow_steps(mine)
        foreign = sum(1 for i in range(len(win))
                      if not any(i in j.slow_at for j, _ in flagged) and i in theirs)
        if foreign >= 0.25 * len(win):
            flagged = [(j, b) for j, b in flagged if j.slow_share >= 1.0]
    if not flagged or len(flagged) > p["max_share"] * len(judged):
        return Result(False)
    res = Result(True)
    stragglers = []
    for j, base in sorted(flagged, key=lambda x: -x[0].ratio):
        e = _ent(ctx, j.rank)
        res.entities.append(e)
        since = "since its history began" if base is None or base >= thr else f"{base:.2f}x before"
        res.evidence.append(Evidence(
            "step.work_s" if p["measure"] == "work" else f"step.{p['measure']}", e, round(j.value, 6), "s",
            round(j.reference, 6), f"ratio {p['ratio']} on {p['persist']:.0%} of {len(win)} aligned steps", None,
            f"{j.ratio:.2f}x the {'stage' if j.group else 'job'}'s fast ranks, robust z {j.z:.1f}, "
            f"slow on {j.slow_share:.0%} of steps ({since})"))
        stragglers.append({**_where(ctx, j.rank), "ratio": round(j.ratio, 3),
                           "history_ratio": None if base is None else round(base, 3)})
    res.entities.sort(key=lambda e: int(e.rsplit(":", 1)[1]))
    ctx.facts.update(stragglers=stragglers, straggler_ratio=stragglers[0]["ratio"], n_stragglers=len(stragglers),
                     aligned_steps=len(win), steady=any(s["history_ratio"] is None for s in stragglers))
    _set_phase(ctx, win, [j.rank for j, _ in flagged], ranks)
    return res


def _excess_over_peers(row: Mapping[int, StepRec], top: int, phase: str) -> float | None:
    """Rank ``top``'s ``phase`` over the median of the step's other ranks (None when either is unknown);
    kept on the step, as the rotation asks it for every slow turn of its window on every tick."""
    def compute() -> float | None:
        rec = row.get(top)
        mine = rec.get(phase) if rec is not None else None
        peers = known(row, None, phase, skip=top)
        return mine - statistics.median(peers) if mine is not None and peers else None

    return kept_stat(row, ("excess", phase, top), compute)  # type: ignore[no-any-return]


def _slow_since_start(judged: JudgedRanks, ok: np.ndarray, thr: float, steady_ratio: float,
                      state: dict[tuple[Any, ...], Any], prefix: tuple[Any, ...]) -> list[tuple[Any, None]]:
    """The ranks ``step_outlier`` with ``onset: from-start`` flags: past its first tests (``ok``) now, and at
    the first window whywait judged them in, under ``steady_ratio`` (over it the default flags them), and not
    grown against their recent past (a rank that slowed is the default's finding).

    The default leaves these out: a rank slower from its first step may run on a slower GPU model, one
    clocked or power-capped lower, or one faulty since the job started, and whywait cannot tell which.
    Every rank still waits for it in each collective, so what it costs is real; ``job.slow-since-start``
    says so at a lower severity.  The ranks slow at the job's first judgement are kept in ``state`` under
    ``prefix + (rank,)``: the recent past alone would not do, for a straggler of an hour has an hour of
    slow steps before every window.
    """
    marker = (*prefix, "judged")
    ranks = judged.rank
    if marker not in state:
        # The job's first judgement: the ranks slow now are the ones slow since whywait first saw them.
        # A rank first judged later (it joined late) is not marked: it may have slowed since.
        state[marker] = 1.0
        for i in np.nonzero(ok)[0].tolist():
            state[(*prefix, int(ranks[i]))] = 1.0
    out: list[tuple[Any, None]] = []
    for i in np.nonzero(ok)[0].tolist():
        if (*prefix, int(ranks[i])) not in state:
            continue
        j = judged.judgement(i)
        base = j.history_ratio
        if j.ratio >= steady_ratio or (base is not None and j.ratio / base > thr):
            continue
        out.append((j, None))
    return out


def _fast_mates(ctx: Ctx, judged: JudgedRanks, mates_ratio: Any) -> np.ndarray:
    """Per judged rank, whether two or more other ranks on its node, with the same GPU share, were judged and
    all stand under half-way to ``mates_ratio`` (``step_outlier``'s ``mates_ratio``).

    Why: ``job.slow-since-start`` needs a rank 1.4x slower, for GPUs of one model differ by clocks and power
    caps, and a job may mix models.  A tester's rank 30% slower than its seven node-mates from the first step,
    a quarter of the job's time lost, was told nothing.  A node holds one GPU model, so against its own
    node-mates that excuse is gone.
    """
    ranks = judged.rank.tolist()
    ratio = dict(zip(ranks, judged.ratio.tolist(), strict=True))
    coords = _coords(ctx)
    share = {r: float((coords.get(r) or {}).get("gpu_share", 1.0)) for r in ranks}
    by_node: dict[str, list[int]] = {}
    for r in ranks:
        by_node.setdefault(ctx.job.ranks.get(r, ("?", -1))[0], []).append(r)
    out = np.zeros(len(ranks), bool)
    for i, r in enumerate(ranks):
        mates = [m for m in by_node[ctx.job.ranks.get(r, ("?", -1))[0]] if m != r and share[m] == share[r]]
        out[i] = len(mates) >= 2 and not any(mates_ratio.halfway(ratio[m]) for m in mates)
    return out


def _looked_at(judged: JudgedRanks, ok: np.ndarray, held: set[int]) -> list[int]:
    """The judged ranks (indices) ``step_outlier`` must look at: those passing its first tests (``ok``) and those
    it flagged before (``held``), in order; the rest neither flag nor have a flag to forget."""
    mask = ok | np.isin(judged.rank, list(held)) if held else ok
    return np.nonzero(mask)[0].tolist()


def _held_ranks(state: Mapping[tuple[Any, ...], Any], prefix: tuple[Any, ...]) -> set[int]:
    """The ranks whose past ratio ``step_outlier`` keeps frozen under ``prefix`` (rule, line, job): flagged before."""
    n = len(prefix) + 1
    return {k[-1] for k in state if len(k) == n and k[:-1] == prefix}


def _growth_z(judged: JudgedRanks) -> Callable[[Any, float], float | None]:
    """A function giving a rank's growth against its own past as a robust z among the job's ranks.

    On each window step, every rank with a past grew by (that step's ratio / its past ratio); the
    step's typical growth is their median and its noise their spread (1.4826 x MAD of growth over the
    typical, floored at 0.02): :meth:`JudgedRanks.growth_noise`.  A rank's z is the median over the steps
    of (its growth over the typical - 1) / the step's noise, its growth taken against ``base`` (its frozen
    past ratio while flagged).  Judged step by step, so a step where batches were uneven on every rank
    (wide noise) counts for little and a step of ordinary jitter for much.  None with fewer than 4 ranks
    with a past.  Called by ``step_outlier`` for a rank about to be flagged (the steps' noise computed on
    first use, once per evaluation).
    """
    cache: dict[int, tuple[float, float]] = {}
    built: list[bool] = []

    def z(j: Any, base: float) -> float | None:
        if not built:
            built.append(True)
            cache.update(judged.growth_noise())
        if not cache or not base or base <= 0:
            return None
        zs = [(x / (base * cache[i][0]) - 1.0) / cache[i][1] for i, x in j.ratio_at.items() if i in cache]
        return statistics.median(zs) if zs else None

    return z


def _set_phase(ctx: Ctx, win: Steps, culprits: list[int], ranks: list[int]) -> list[Evidence]:
    """Name the slow phase of ``culprits`` (facts ``phase``, ``phase_field``); return its evidence."""
    peers = [r for r in ranks if r not in culprits]
    ex = phase_excess(win, culprits, peers, ("compute_s", "data_wait_s"))
    best = max(ex.items(), key=lambda kv: kv[1][0] - kv[1][1], default=None)
    if best is None or best[1][0] - best[1][1] <= 0:
        ctx.facts.setdefault("phase", "step")  # the producer sent the step time only: the phase is unknown
        ctx.facts.setdefault("phase_field", "duration_s")
        return []
    ctx.facts["phase"] = PHASE_NAMES[best[0]]
    ctx.facts["phase_field"] = best[0]
    ctx.facts["phase_value"], ctx.facts["phase_baseline"] = best[1]
    return [Evidence(f"step.{f}", _ent(ctx, culprits[0]) if len(culprits) == 1 else ctx.job.job, round(m, 6), "s",
                     round(t, 6), "", None, f"{PHASE_NAMES[f]}: culprit(s) {m:.3g} s against peers {t:.3g} s")
            for f, (m, t) in sorted(ex.items())]


@dataclass(frozen=True, kw_only=True)
class PhaseCondition(ConditionParams):
    """Which phase (compute, input, communication) of the culprit ranks' step is slow."""

    phase: Literal["any", "compute", "input", "communication"] = param(
        "any", "holds when this phase grew (`any`: whichever did)")
    window: Duration = param(5.0, "the same window as `step_outlier`, so the figures agree")
    steps: Number = param(5.0, "see `window`")


@condition("phase", PhaseCondition)
def _phase(c: Condition, ctx: Ctx) -> Result:
    """Which phase of the culprit ranks' step is slow, against their peers on the same steps.

    Holds when the phase named by ``phase`` (``any``: whichever is slowest) is the one that grew; the
    evidence gives every known phase, culprits against peers.
    """
    got = _window(c, ctx)
    culprits = [int(e.rsplit(":", 1)[1]) for e in ctx.culprits if e.startswith(ctx.job.job + ":")]
    if got is None or not culprits:
        return Result(False)
    win, _ = got
    ranks = sorted(ctx.job.ranks)
    ev = _set_phase(ctx, win, culprits, ranks)
    want = c.params["phase"]
    holds = bool(ev) and (want == "any" or ctx.facts.get("phase") == want)
    return Result(holds, [], ev if holds else [])


_LAYOUTS: dict[int, tuple[Any, Any, Any]] = {}  # _layout's, by coordinates object (see per_coords)


def _layout(coords: Mapping[int, Mapping[str, Any]]) -> dict[int, dict[int, list[int]]]:
    """A job's pipeline layout, ``replica -> stage -> ranks``, from its ranks' coordinates (kept per
    coordinates object: the stage rules ask on every tick)."""
    def build() -> dict[int, dict[int, list[int]]]:
        layout: dict[int, dict[int, list[int]]] = {}
        for r, co in coords.items():
            if co.get("pp") is not None:
                layout.setdefault(int(co.get("dp", 0) or 0), {}).setdefault(int(co["pp"]), []).append(int(r))
        return layout

    return per_coords(_LAYOUTS, None, coords, build)  # type: ignore[no-any-return]


@dataclass(frozen=True, kw_only=True)
class StageImbalanceCondition(ConditionParams):
    """One pipeline stage slower than the others on (nearly) every data-parallel replica."""

    measure: Measure = param("work", _MEASURE_DOC)
    window: Duration = param(10.0, "the last `window` or the last `steps` steps, whichever is longer")
    steps: Number = param(5.0, "see `window`")
    ratio: Comparison = param(Compare(">", 1.15), "a stage's work ÷ the median of the replica's other stages")
    persist: Number = param(0.6, "... on at least this share of the steps")
    replica_share: Number = param(0.9, "the same stage is over `ratio` on at least this share of replicas")
    min_replicas: Number = param(2.0, "fewer replicas: no judgement")


@condition("stage_imbalance", StageImbalanceCondition)
def _stage_imbalance(c: Condition, ctx: Ctx) -> Result:
    """One pipeline stage does more work than the others on (nearly) every data-parallel replica.

    Per aligned step and replica, each stage's work against the median of the replica's other stages.
    The imbalance holds when one stage is over ``ratio`` on at least ``replica_share`` of the replicas,
    on at least ``persist`` of the steps.  A node fault slows one replica only, so it never makes a
    stage slow on every replica, nor hides the bottleneck on the replica it slows.
    """
    p = c.params
    got = _window(c, ctx)
    coords = _coords(ctx)
    if got is None or not coords:
        return Result(False)
    win, _ = got
    layout = _layout(coords)
    stages = {s for st in layout.values() for s in st}
    if len(stages) < 2:
        return Result(False)
    # What one step says is kept on the step for the ticks it stays in the window.  Keyed by this
    # condition and the job's coordinates; the kept value holds the coordinates, so their id is not reused.
    row_key = ("stage_imbalance", ctx.rule_id, c.line, id(coords))

    def imbalanced(row: Mapping[int, StepRec]) -> tuple[int, float] | None:
        """The stage slowest on (nearly) every replica in this step, and its median ratio; None if none."""
        return kept_stat(row, row_key, lambda: (coords, _imbalanced(row)))[1]  # type: ignore[no-any-return]

    def _imbalanced(row: Mapping[int, StepRec]) -> tuple[int, float] | None:
        slowest: Counter[int] = Counter()
        step_ratios: dict[int, list[float]] = {}
        n_rep = 0
        for st in layout.values():
            got_ratios = _stage_ratios(row, st, p["measure"])
            if got_ratios is None:
                continue
            n_rep += 1
            # Every stage over `ratio` against the replica's other stages counts on it, not only its slowest:
            # a straggler on another stage of one replica made that stage the replica's slowest, the
            # bottleneck then led on 3 replicas of 4, under `replica_share`, and the imbalance "resolved"
            # while it went on.  (The median of the other stages is robust to that one slow stage.)
            for top, r in got_ratios.items():
                if p["ratio"](r):
                    slowest[top] += 1
                    step_ratios.setdefault(top, []).append(r)
        if n_rep < int(p["min_replicas"]) or not slowest:
            return None
        stage, n = slowest.most_common(1)[0]
        return (stage, statistics.median(step_ratios[stage])) if n >= p["replica_share"] * n_rep else None

    hits: Counter[int] = Counter()
    ratios: dict[int, list[float]] = {}
    for _, row in win:
        got_step = imbalanced(row)
        if got_step is not None:
            hits[got_step[0]] += 1
            ratios.setdefault(got_step[0], []).append(got_step[1])
    if not hits:
        return Result(False)
    stage, n = hits.most_common(1)[0]
    if n < p["persist"] * len(win):
        return Result(False)
    ratio = statistics.median(ratios[stage])

    def loss(row: Mapping[int, StepRec]) -> tuple[float, float] | None:
        # Were the stage as fast as its peers, the pipeline would run at their pace: the step
        # shrinks by the stage's ratio.
        got_step = imbalanced(row)
        if got_step is None or got_step[0] != stage:
            return None
        dur = row_median(row)
        paced = _pipeline_loss(row, layout, stage)
        if paced is not None:
            return dur, max(0.0, min(dur, paced))
        # Without the full split: only the pipelined part of the step runs at the bottleneck's pace
        # (the data-parallel collective after it does not shrink), by the stage's ratio.
        coll = known(row, None, "collective_s")
        pipe = dur - (statistics.median(coll) if coll else 0.0)
        return dur, max(0.0, pipe) * (1 - 1 / got_step[1])

    ctx.facts.update(stage=stage, n_stages=len(stages), n_replicas=len(layout), imbalance=round(ratio, 3),
                     loss_fn=loss, aligned_steps=len(win),
                     stage_before=_stage_before(ctx, c.line, stage, got[1], layout, p["measure"]))
    ev = Evidence("step.work_s", ctx.job.job, round(ratio, 4), "ratio", 1.0,
                  f"ratio {p['ratio']} on {p['replica_share']:.0%} of replicas", None,
                  f"stage {stage} does {ratio:.2f}x the work of the other stages on {n} of {len(win)} steps, "
                  f"on every replica")
    return Result(True, [ctx.job.job], [ev])


def _stage_ratios(row: Mapping[int, StepRec], stages: Mapping[int, list[int]], measure: str) -> dict[int, float] | None:
    """One replica's stages in one step: each stage's work (the median of its ranks') over the median of the
    replica's other stages (a stage whose others did nothing is left out); None under two stages reported."""
    w = {s: statistics.median(v) for s, rs in stages.items() if (v := known(row, rs, measure))}
    if len(w) < 2:
        return None
    out = {}
    for top, mine in w.items():
        others = statistics.median(v for s, v in w.items() if s != top)
        if others > 0:
            out[top] = mine / others
    return out


def _stage_before(ctx: Ctx, line: int, stage: int, hist: Steps, layout: dict[int, dict[int, list[int]]],
                  measure: str) -> float | None:
    """The bottleneck ``stage``'s work against the other stages' (median over replicas and steps) on the steps
    before the imbalance was first seen, frozen while it holds (None with fewer than 10 such steps).

    Why: a stage whose layers got slower at step 150 (a bad change in them) was told "how the model is
    partitioned ... rebalance the pipeline" from the first seconds, the wrong cause and the wrong fix; with
    what the stage did before, the text tells a stage that slowed from one that always was the bottleneck.
    Kept as two numbers under the condition's key (the engine's snapshot keeps numeric state only); a stage
    that stops being the bottleneck (the condition no longer holds on a tick) is judged afresh next time.
    """
    key = ("stage_imbalance.before", ctx.rule_id, line, ctx.job.job)
    now_seen = ctx.now
    if ctx.state.get(key + ("stage",)) == stage and now_seen - ctx.state.get(key + ("at",), -math.inf) <= 2.0:
        was = ctx.state[key]
    else:
        per: list[float] = []
        for _, row in hist:
            ratios = [r[stage] for st in layout.values() if (r := _stage_ratios(row, st, measure)) and stage in r]
            if ratios:
                per.append(statistics.median(ratios))
        was = statistics.median(per) if len(per) >= 10 else -1.0
    ctx.state[key], ctx.state[key + ("stage",)], ctx.state[key + ("at",)] = was, stage, now_seen
    return None if was < 0 else round(was, 3)


def _pipeline_loss(row: Mapping[int, StepRec], layout: dict[int, dict[int, list[int]]], stage: int) -> float | None:
    """Seconds the step would be shorter were ``stage`` no slower than the job's next slowest stage.

    A pipeline moves each microbatch at the pace of its slowest rank (the slowest tensor-parallel
    rank of the slowest stage), and the all-reduce waits for the slowest replica: the pipelined
    time (from the last input to the last drain) scales with the slowest compute of ``stage``, and
    without the imbalance would scale with the slowest compute of the other stages (not their
    median: the next slowest stage sets the pace then).  Needs every rank's compute and pipeline
    wait; None without them.
    """
    present = [r for st in layout.values() for rs in st.values() for r in rs if r in row]
    comp, pipe, wait = (column_of(row, present, m) for m in ("compute_s", "pipeline_wait_s", "data_wait_s"))
    if not present or np.isnan(comp).any() or np.isnan(pipe).any():
        return None
    top = known(row, [r for st in layout.values() for r in st.get(stage, ())], "compute_s")
    rest = known(row, [r for st in layout.values() for s, rs in st.items() if s != stage for r in rs], "compute_s")
    if not top or not rest or max(top) <= 0:
        return None
    wait = np.nan_to_num(wait, nan=0.0)
    begin = float(wait.max())
    # A rank is ready for the all-reduce when its replica's pipeline drains: its waits plus its own work.
    ready = float((pipe + wait + comp).max())
    return max(0.0, ready - begin) * (1.0 - min(1.0, max(rest) / max(top)))


@dataclass(frozen=True, kw_only=True)
class ClockOffsetCondition(ConditionParams):
    """Nodes whose ranks end their steps out of line with the job's other ranks: a clock that is off."""

    steps: Number = param(3.0, "judged on the job's latest this many complete steps")
    offset: Comparison = param(Compare(">", 2.0), "seconds between the node's step ends and the job's (the median "
                                                  "over the node's ranks and those steps), early or late")
    step_times: Number = param(2.0, "... and more than this many of the job's median step times: what pipeline "
                                    "stages ending apart cannot explain")
    min_nodes: Number = param(3.0, "fewer nodes with ranks in the steps: no judgement (the job's majority sets "
                                   "the time)")
    level: Literal["node"] = param("node", "the culprit's level: always `node`")


@condition("clock_offset", ClockOffsetCondition)
def _clock_offset(c: Condition, ctx: Ctx) -> Result:
    """Nodes whose clocks are off, found from the job's own structure: a synchronous job's ranks end each
    step together (they leave the same collective), so a node whose ranks stamp the same steps seconds
    away from the others' ends has a clock that is off, whatever its telemetry says.

    Per step, each rank's end minus the median end over the step's ranks; per node, the median of that
    over its ranks and the latest ``steps`` steps.  Ranks whose producer sends no ``ended_at`` are left
    out: their step ends are when a batch was sent.  Why it matters: everything such a node sends is
    stamped as far off, so its telemetry no longer lines up with its peers' and its ranks look silent
    (their newest step seems seconds old) although they train on.
    """
    p = c.params
    table = ctx.store.step_tables.get(ctx.job.job)
    if table is None:
        return Result(False)
    done = table.complete(ctx.now)
    n = int(p["steps"])
    placed = ctx.job.ranks
    if len(done) < n or not placed:
        return Result(False)
    rows = done[-n:]
    ranks = sorted(r for r in placed if r not in table.unstamped)
    if not ranks:
        return Result(False)
    ends = np.vstack([column_of(row, ranks, "t") for _, row in rows])  # steps x ranks, NaN: not in the step
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)  # a step without a rank of a node: NaN, skipped
        dev = ends - np.nanmedian(ends, axis=1, keepdims=True)
    by_node: dict[str, list[int]] = {}
    for i, r in enumerate(ranks):
        by_node.setdefault(placed[r][0], []).append(i)
    offsets: dict[str, float] = {}
    for node, idx in by_node.items():
        vals = dev[:, idx]
        vals = vals[~np.isnan(vals)]
        if vals.size:
            offsets[node] = float(np.median(vals))
    if len(offsets) < int(p["min_nodes"]):
        return Result(False)
    step_s = statistics.median(_median_duration(row) for _, row in rows)
    floor = p["step_times"] * step_s
    off = {node: o for node, o in offsets.items() if p["offset"](abs(o)) and abs(o) > floor}
    if not off or len(off) * 2 >= len(offsets):
        return Result(False)  # half the nodes or more "off": the reference itself is in doubt
    ev = [Evidence("step.end_offset_s", node, round(o, 3), "s", 0.0,
                   f"|offset| {p['offset']} and > {p['step_times']:g} step times ({floor:.2f} s)", None,
                   f"{node}'s ranks end each step {abs(o):.1f} s {'before' if o < 0 else 'after'} the job's other "
                   "ranks")
          for node, o in sorted(off.items())]
    ctx.facts.update(aligned_steps=len(rows))
    return Result(True, sorted(off), ev)


@dataclass(frozen=True, kw_only=True)
class RotationCondition(ConditionParams):
    """A different rank slow on each step (data or sequence-length imbalance): no single culprit."""

    measure: Measure = param("work", _MEASURE_DOC)
    window: Duration = param(30.0, "the last `window` or the last `steps` steps, whichever is longer")
    steps: Number = param(10.0, "see `window`")
    ratio: Comparison = param(Compare(">", 1.15), "the step's slowest rank against the lower quartile")
    zscore: Comparison = param(Compare(">", 6.0), "... and against the fast group's spread")
    persist: Number = param(0.5, "share of steps that have such a slow rank")
    max_share: Share = param(0.34, "no rank is the slow one on more than this share of those steps")
    min_distinct: Number = param(3.0, "at least this many ranks take turns")
    within: Within = param("stage", _WITHIN_DOC)
    spread: Number = param(0.0, "also a slow turn: a step whose ranks' work is spread this many times wider than in "
                                "the job's own past (interquartile range, each rank over its usual level), its "
                                "slowest rank passing `ratio`: uneven batches on every rank rather than one heavy "
                                "one, where no rank stands out by `zscore` (0: off)")
    alpha: Number = param(0.0, "also hold on the latest steps alone when a sequential test (slow turns at rate "
                               "`persist` against the job's own past count of them) passes at this false-alarm "
                               "level: at most one false alarm per 1 / `alpha` new steps (0: off)")
    levels: Number = param(1.0, "the sequential test judges slow turns at this many sizes: past `ratio`'s excess, "
                                "then twice, four times... it, each against the job's own past count of turns that "
                                "large, `alpha` split evenly between them (1: one size, `ratio`)")


@condition("rotation", RotationCondition)
def _rotation(c: Condition, ctx: Ctx) -> Result:
    """A different rank is the slow one each step: imbalance in the data, not in any one rank.

    Per aligned step, the slowest rank of its group against the group's lower quartile (ratio) and
    against the fast ranks' spread (robust z).  Holds when at least ``persist`` of the steps have
    such a slow rank, no rank is it on more than ``max_share`` of them, and at least
    ``min_distinct`` ranks take turns.
    """
    p = c.params
    got = _window(c, ctx)
    if got is None:
        return Result(False)
    win, hist = got
    ranks, group_cols, ranks_key = _rotation_layout(ctx, p["within"])
    slow: list[tuple[int, int, float]] = []  # (step index, rank, ratio)
    excess = {"compute_s": 0.0, "data_wait_s": 0.0}
    # Each rank against its own usual level first: a rank that is always slower (an older GPU) is
    # heterogeneity, and must not be "the slow one" on every step it happens to top.
    mat = rank_matrix(win, ranks, p["measure"])
    usual_v = column_medians(mat)

    # Uneven batches on every rank (unpacked sequence lengths) make no rank stand out by `zscore`: the
    # slowest of 64 ranks drawn with a 25% spread is only ~2.4 spreads up.  What shows is the spread
    # itself, several times the job's own jitter: judged against the job's past level (kept, like p0,
    # while the rotation lasts, or it would become its own past), with `top_excess` the past's usual
    # slowest-over-median, what an even step still loses to the noise (the cost's what-if).
    spread_f = float(p["spread"])
    skey = ("rotation.spread0", ctx.rule_id, c.line, ctx.job.job)
    level: float | None = None
    top_excess = 0.0
    past: dict[str, np.ndarray] = {}  # the past's matrix and each rank's usual level in it, built when asked

    def past_mat() -> np.ndarray:
        if "mat" not in past:
            past["mat"] = rank_matrix(hist, ranks, p["measure"])
        return past["mat"]

    def past_usual() -> np.ndarray:
        # Steps outside the window are taken over each rank's usual level in the past: over the window's
        # (eight uneven draws each), the past's even steps looked twice as spread as they were, and were
        # counted as the slow turns the rotation had to rise above.  (Only asked for with 10+ past steps.)
        if "usual" not in past:
            past["usual"] = column_medians(past_mat())
        return past["usual"]

    if spread_f > 0 and len(hist) >= 10:
        if skey in ctx.state:
            level, top_excess = float(ctx.state[skey]), float(ctx.state.get(skey + ("top",), 0.0))
        else:
            # The past's level, judged again only when a step joins it (numbers only: the engine's snapshot).
            ckey = ("rotation.spread_at", *skey[1:])
            at = (float(hist[-1][0]), float(len(hist)))
            if (ctx.state.get(ckey), ctx.state.get(ckey + ("n",))) == at:
                got_level = ctx.state.get(ckey + ("level",))
                level = None if got_level is None or got_level < 0 else float(got_level)
                top_excess = float(ctx.state.get(ckey + ("top",), 0.0))
            else:
                h_usual = past_usual()
                h_mat = past["mat"]
                h_disp = spread_lines(h_mat, h_usual, group_cols)[0]
                h_disp = h_disp[~np.isnan(h_disp)]
                if len(h_disp) >= 10:
                    # The lower quartile of the past's spreads, not their median: a long-step job has few
                    # steps of past, and by the time ten are there a rotation that began early fills part.
                    level = float(np.percentile(h_disp, 25.0))
                    # Each step's slowest rank over its median, kept on the step: only new steps are read.
                    tkey = ("rotation.top", p["measure"], ranks_key)
                    tops = np.array([kept_stat(row, tkey, lambda i=i: _top_excess(h_mat[i]))
                                     for i, (_, row) in enumerate(hist)], np.float64)
                    tops = tops[np.isfinite(tops)]
                    top_excess = float(np.median(tops)) if len(tops) else 0.0
                ctx.state[ckey], ctx.state[ckey + ("n",)] = at
                ctx.state[ckey + ("level",)] = -1.0 if level is None else level
                ctx.state[ckey + ("top",)] = top_excess

    def turns_of(m: np.ndarray, spread: tuple[np.ndarray, np.ndarray, np.ndarray] | None
                 ) -> list[tuple[float, int, bool] | None]:
        """Per line of ``m``: ``(ratio, rank, by spread)`` of its slow turn, or None; ``spread`` is
        :func:`spread_lines` of ``m`` (None when the spread test is off or has no level)."""
        out: list[tuple[float, int, bool] | None] = [
            None if g is None else (g[0], ranks[g[1]], False)
            for g in slow_turns(m, usual_v, group_cols, p["ratio"], p["zscore"])]
        if spread is not None and level:
            disp, q, col = spread
            for i in range(len(out)):
                if out[i] is None and disp[i] > spread_f * level and p["ratio"](float(q[i])):
                    out[i] = (float(q[i]), ranks[int(col[i])], True)
        return out

    def turns(rows: Steps) -> list[tuple[float, int, bool] | None]:
        """Each step's slow rank and its ratio, when one rank stands out or the ranks are spread wide;
        else None.  For steps outside the window (the past the sequential test counts, the cost's steps):
        all of them at once, each line judged as it would be alone."""
        def judge(some: Steps) -> list[tuple[float, int, bool] | None]:
            m = rank_matrix(some, ranks, p["measure"])
            return turns_of(m, spread_lines(m, past_usual(), group_cols) if level else None)

        return _at_once(rows, judge) if rows else []

    def turn(row: Mapping[int, StepRec]) -> tuple[float, int, bool] | None:
        return turns([(0, row)])[0]

    win_spread = spread_lines(mat, usual_v, group_cols) if level else None
    for i, got_turn in enumerate(turns_of(mat, win_spread)):
        if got_turn is None:
            continue
        q, top = got_turn[0], got_turn[1]
        row = win[i][1]
        slow.append((i, top, q))
        for f in excess:
            got_excess = _excess_over_peers(row, top, f)
            if got_excess is not None:
                excess[f] += got_excess
    share = len(slow) / len(win)
    # The share before the rotation began, kept while the rotation lasts: a rotation longer than the
    # history (60 steps) would otherwise become its own past and end the incident while it goes on.
    key = ("rotation.p0", ctx.rule_id, c.line, ctx.job.job)
    got_seq = _rotation_sequential(p, {i: q for i, _, q in slow}, win, key, ctx,
                                   lambda rows: [0.0 if t is None else t[0] for t in turns(rows)])
    seq = got_seq[0] if got_seq is not None else None
    judged = len(win)
    if seq is not None:
        # The latest steps alone are evidence enough: judge the turns (and say the share) on them.
        slow = [x for x in slow if x[0] >= len(win) - seq]
        judged = seq
        share = len(slow) / seq
    elif share < p["persist"]:
        ctx.state.pop(key, None)
        for k in range(1, _levels(p)):
            ctx.state.pop(key + (k,), None)
        ctx.state.pop(skey, None)
        ctx.state.pop(skey + ("top",), None)
        return Result(False)
    # Against the job's own past: a large job has a slow turn on some steps anyway (GC pauses, hiccups
    # on random ranks).  The window's share must stand well above the share before it (4 binomial
    # standard errors), so a busy stretch of hiccups is not a rotation.
    p0 = ctx.state.get(key)
    if p0 is None and got_seq is not None:
        p0 = got_seq[1]
    elif p0 is None and len(hist) >= 10:
        p0 = sum(1 for t in turns(hist) if t is not None) / len(hist)
    if p0 is None:
        # No past to hold the window against (fewer than 10 steps before it): a job whose ranks
        # hiccup on most steps looks like a rotation from its first steps on.
        return Result(False)
    # A rotation from the job's first steps has no "before" to stand out from: its past is as uneven
    # as its window.  It is still one, and costs as much: held on its level instead, when the window
    # and a long past (_STEADY_PAST steps or more) both have a slow turn on at least ``persist`` of
    # their steps.  Hiccups on random ranks touch a third of a large job's steps at most; 80% of 38
    # steps is past any such rate by many standard errors.
    steady = (seq is None and share >= p["persist"] and p0 >= p["persist"] and ctx.state.get(key) is None
              and len(hist) >= _STEADY_PAST)
    if seq is None and not steady and share - p0 < 4.0 * math.sqrt(max(p0 * (1 - p0), 0.01) / len(win)):
        return Result(False)
    if not steady:
        ctx.state[key] = p0
        if got_seq is not None:
            # Each size's past rate, kept like p0 (numbers only: the engine's snapshot keeps them).
            for k, rate_k in enumerate(got_seq[2][1:], start=1):
                ctx.state.setdefault(key + (k,), rate_k)
        if level is not None:
            ctx.state[skey] = level
            ctx.state[skey + ("top",)] = top_excess
    who = Counter(r for _, r, _ in slow)
    if who.most_common(1)[0][1] > p["max_share"] * len(slow) or len(who) < int(p["min_distinct"]):
        return Result(False)
    # Uneven batches land anywhere in the job; slow turns kept within one or two nodes are those
    # nodes' problem (a slow disk serving each of its ranks in turn), not the data's.
    nodes = {ctx.job.ranks[r][0] for r in who if r in ctx.job.ranks}
    if len(nodes) < min(int(p["min_distinct"]), len(set(n for n, _ in ctx.job.ranks.values()))):
        return Result(False)
    phase = max(excess, key=lambda f: excess[f])
    ratio = statistics.median(q for _, _, q in slow)
    # Uneven batches everywhere (the window's ranks spread wide on most steps), not one heavy batch a step:
    # then even the second slowest rank was slowed, and the top-two gap would undercount.
    uneven = False
    if win_spread is not None and level:
        w_disp = win_spread[0][~np.isnan(win_spread[0])]
        uneven = len(w_disp) > 0 and float(np.median(w_disp)) > spread_f * level

    def loss(row: Mapping[int, StepRec]) -> tuple[float, float] | None:
        # Were the slow rank of the step as fast as the others, the step would end when the next
        # slowest rank's work was done.  Only a step with a slow turn (the same test as above: ratio
        # and robust z) loses anything: the slowest of 192 ranks is 1.15x the lower quartile by chance
        # alone, and charging those steps' top-two gap before and after the rotation (the walk back,
        # keep_firing_for) overstated a 73 s rotation's cost by a quarter.
        if not uneven and turn(row) is None:
            return None
        vals = sorted(known(row, None, p["measure"]))
        if len(vals) < 4:
            return None
        dur = row_median(row)
        if uneven:
            # Uneven batches everywhere: with even ones each rank would do its usual work, and the step
            # would end when the slowest of those did (the median rank's, plus the usual noise's top).
            # Every step counts, turn or no turn: one whose slowest draw stayed under the bar lost less,
            # not nothing.
            return dur, max(0.0, min(dur, vals[-1] - statistics.median(vals) * (1.0 + top_excess)))
        return dur, max(0.0, min(dur, vals[-1] - vals[-2]))

    ctx.facts.update(phase=PHASE_NAMES[phase] if excess[phase] > 0 else "step", phase_field=phase,
                     slow_share=round(share, 3), distinct_ranks=len(who), rotation_ratio=round(ratio, 3),
                     loss_fn=loss, aligned_steps=judged, steady_since=hist[0][0] if steady else None)
    ev = Evidence("step.work_s", ctx.job.job, round(ratio, 4), "ratio", 1.0, f"ratio {p['ratio']}", None,
                  f"{len(who)} different ranks were the slow one on {len(slow)} of {judged} steps; "
                  f"none on more than {who.most_common(1)[0][1]}")
    return Result(True, [ctx.job.job], [ev])


# The rotation's ranks and each group's columns among them, per job: (ranks object, coords, layout).
_Layout = tuple[list[int], list[np.ndarray], tuple[Any, ...]]
_ROTATION_LAYOUTS: dict[tuple[str, str], tuple[Any, Any, _Layout]] = {}


def _rotation_layout(ctx: Ctx, within: str) -> _Layout:
    """The job's ranks (sorted), per comparable group its members' columns among them, and a key naming
    the ranks (:func:`groups_key`, for what is kept on a step); kept while the placement lasts (its ranks
    and coordinates objects), as the rotation asks on every tick."""
    job, coords = ctx.job, _coords(ctx)
    key = (job.job, within)
    kept = _ROTATION_LAYOUTS.get(key)
    if kept is not None and kept[0] is job.ranks and kept[1] is coords:
        return kept[2]
    ranks = sorted(job.ranks)
    col = {r: i for i, r in enumerate(ranks)}
    group_cols = [np.asarray([col[r] for r in members if r in col], np.int64)
                  for members in groups_of(ranks, coords, within).values()]
    out = (ranks, group_cols, groups_key({"": ranks}))
    if len(_ROTATION_LAYOUTS) >= 256:  # bounded: jobs come and go
        _ROTATION_LAYOUTS.clear()
    _ROTATION_LAYOUTS[key] = (job.ranks, coords, out)
    return out


def _at_once(rows: Steps, judge: Callable[[Steps], list[Any]]) -> list[Any]:
    """``judge(rows)``: steps judged as one matrix, each line as it would be alone (every statistic of
    :func:`slow_turns` and :func:`spread_lines` is per line).  A seam: the test that turns the rotation's
    shortcuts off judges them one by one, as before."""
    return judge(rows)


def _top_excess(line: np.ndarray) -> float:
    """One step's slowest rank over its median rank, less 1 (NaN without values): the very float the past's
    matrix gave for that step's line (``nanmedian`` takes the same path for a line as for its matrix)."""
    with np.errstate(all="ignore"), warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        return float(np.nanmax(line) / np.nanmedian(line[None, :], axis=1)[0] - 1.0)


def _levels(p: Any) -> int:
    """How many sizes of slow turn the rotation's sequential test judges (its ``levels``, at least 1)."""
    return max(1, int(p["levels"]))


def _rotation_sequential(p: Any, slow_at: dict[int, float], win: Steps, key: tuple[Any, ...], ctx: Ctx,
                         turn_ratios: Callable[[Steps], list[float]]
                         ) -> tuple[int, float, list[float]] | None:
    """How many of the window's latest steps a sequential test finds a rotation on, the past rate of
    slow turns (of any size) it was judged against, and each size's past rate; None when it finds none.

    Called by ``rotation`` on each evaluation with the window's steps that had a slow turn and their
    ratios (``slow_at``: index into ``win`` -> ratio).  The test (:func:`sequential_onset`) weighs slow
    turns at rate ``persist`` against the job's own past count of them: on up to
    :data:`_PAST_TURNS_MAX` complete steps before the window, or the counts kept from before the
    rotation began (state ``key``), so a long rotation does not become its own past.  Each past step is
    judged once (its ratio cached by step number), so a new step costs one step's judgement;
    ``turn_ratios`` judges the steps not seen yet all at once (0.0 for a step without a slow turn).

    With ``levels`` > 1 the test runs once per size of turn: past ``ratio``'s excess, twice it, four
    times it..., each size's flags against the past's count of turns at least that large, at
    ``alpha / levels`` each, so the chance that any of them alarms falsely stays at most ``alpha``
    (Bonferroni).  Why: a large job's past is full of *small* turns (a GC pause on one of 192 ranks
    adds 20-30% to a step), which made a turn on a seventh of its steps ordinary and held the test to
    nine steps; the heavy batches of a rotation mostly stand above them, where the past has a turn on
    one step in thirty, and four or five such turns in a row are as unlikely as nine small ones.
    Turns of one size only pay the split: about half a step more at four sizes.  The run returned is
    the longest any size found (the change point's earliest estimate).
    """
    alpha = float(p["alpha"])
    rate = float(p["persist"])
    if alpha <= 0:
        return None
    n_levels = _levels(p)
    alpha_k = alpha / n_levels
    table = ctx.store.step_tables.get(ctx.job.job)
    first = win[0][0]
    past = [(s, row) for s, row in table.complete(ctx.now) if s < first][-_PAST_TURNS_MAX:] if table else []
    if len(past) < 10:
        return None
    # Even a clean past (no slow turn on any step before) would not make this many turns enough:
    # skip judging the past.
    if sequential_onset([True] * len(slow_at), 0, len(past), rate, alpha_k) is None:
        return None
    # Each size's bar on a turn's ratio; the first is any turn (every turn passed `ratio` already).
    base = float(p["ratio"].value)
    bars = [0.0] + [1.0 + (base - 1.0) * 2.0 ** k for k in range(1, n_levels)]
    kept = ctx.state.get(key)
    if kept is not None:
        rates = [float(kept)] + [float(ctx.state.get(key + (k,), kept)) for k in range(1, n_levels)]
        hits = [round(r * len(past)) for r in rates]
    else:
        ckey = ("rotation.turns", *key[1:])
        seen: dict[int, float] = ctx.state.get(ckey) or {}
        new = [(s, row) for s, row in past if s not in seen]
        fresh = dict(zip((s for s, _ in new), map(float, turn_ratios(new)), strict=True))
        now_seen = {s: seen[s] if s in seen else fresh[s] for s, _ in past}
        ctx.state[ckey] = now_seen  # only the past steps kept: bounded by _PAST_TURNS_MAX
        hits = [sum(1 for q in now_seen.values() if q > bar) for bar in bars]
    best: int | None = None
    for k, bar in enumerate(bars):
        flags = [slow_at.get(i, 0.0) > bar for i in range(len(win))]
        run = sequential_onset(flags, hits[k], len(past), rate, alpha_k)
        if run is not None and (best is None or run > best):
            best = run
    return None if best is None else (best, hits[0] / len(past), [h / len(past) for h in hits])


@dataclass(frozen=True, kw_only=True)
class PeriodicCondition(ConditionParams):
    """Slowdowns of the job's step time that recur with a regular period."""

    window: Duration = param(1800.0, "how far back to look for bursts (reads `job.duration_s`)")
    ratio: Comparison = param(Compare(">", 1.15), "a point is slow at this multiple of the window's median step "
                                                  "time")
    zscore: Comparison = param(Compare(">", 5.0), "... and this far above it in robust z")
    min_bursts: Number = param(3.0, "at least this many bursts")
    tolerance: Number = param(0.25, "the start-to-start intervals agree with their mean and with each other "
                                    "within this share of the period")


@condition("periodic", PeriodicCondition)
def _periodic(c: Condition, ctx: Ctx) -> Result:
    """The job's step time rises in bursts that recur with a regular period.

    Reads ``job.duration_s`` over ``window`` (seconds with a checkpoint save left out: a save is
    periodic by design and has its own rules).  Bursts are runs of points over ``ratio`` times the
    window's median; at least ``min_bursts`` of them whose start-to-start intervals agree within
    ``tolerance`` make a period.  Holds while the latest burst is no older than 1.5 periods.
    """
    p = c.params
    job = ctx.job.job
    times, values = ctx.store.window("job.duration_s", job, ctx.now - p["window"], ctx.now)
    if len(values) < 20:
        return Result(False)
    # A checkpoint save is periodic by design and has its own rules: seconds with save time are left
    # out.  (Taking the save's time off the step instead kept a 40 s-step job's slow spell that
    # overlapped a save, but the seconds around saves then made periods of their own.)
    ck_t, ck = ctx.store.window("job.checkpoint_s", job, ctx.now - p["window"], ctx.now)
    saving = {t: v for t, v in zip(ck_t, ck, strict=True) if v > 0}
    pts = [(t, v) for t, v in zip(times, values, strict=True) if t not in saving]
    # ...but a save inside a slowdown hides the rest of it.  Such a point, its save's time taken off,
    # may extend a burst that began outside the save (never start one: the seconds around saves are
    # noisy, and taking the save off everywhere made periods of their own).
    masked = [(t, v - saving[t]) for t, v in zip(times, values, strict=True) if t in saving]
    if len(pts) < 20:
        return Result(False)
    # The normal step time is the lower quartile: a job slow for a long stretch (a fault, a rotation)
    # must not pull the baseline up and break that stretch into "bursts" around it.
    base = lower_quartile([v for _, v in pts])
    if base <= 0:
        return Result(False)
    centre = statistics.median(v for _, v in pts)
    normal = [v for _, v in pts if v <= centre]
    spread = max(1.4826 * statistics.median(abs(v - base) for v in normal), 0.02 * base)
    gap = statistics.median(b[0] - a[0] for a, b in zip(pts, pts[1:], strict=False))
    raw: list[list[tuple[float, float]]] = []
    for t, v in pts:
        if p["ratio"](v / base) and p["zscore"]((v - base) / spread):
            if raw and t - raw[-1][-1][0] <= 2.5 * gap:
                raw[-1].append((t, v))
            else:
                raw.append([(t, v)])
    if not raw:
        return Result(False)
    for b in raw:
        for t, v in masked:
            if b[-1][0] < t <= b[-1][0] + 2.5 * gap and p["ratio"](v / base) and p["zscore"]((v - base) / spread):
                b.append((t, v))
    # One slowdown can dip under the threshold for a moment: runs closer than a typical run's
    # length are one burst.  A burst of one point is a hiccup (a GC pause, one slow step), not a
    # slowdown, however regular.
    typical = statistics.median(b[-1][0] - b[0][0] for b in raw)
    bursts: list[list[tuple[float, float]]] = []
    for b in raw:
        if bursts and b[0][0] - bursts[-1][-1][0] <= max(3 * gap, typical):
            bursts[-1].extend(b)
        else:
            bursts.append(list(b))
    # A slowdown is sustained: at least 3 slow points, and slow on most of its span.  Random hiccups
    # (a GC pause here, a slow step there) make 2-point "bursts" that can line up by chance.
    # When a point stands for several seconds of training (long steps), a sub-second hiccup cannot
    # slow it by the ratio: two such points are a slowdown.
    need = _BURST_POINTS if gap < 2.0 else 2

    def sustained(b: list[tuple[float, float]]) -> bool:
        span = sum(1 for t, _ in pts if b[0][0] <= t <= b[-1][0])
        return len(b) >= need and len(b) >= 0.6 * span
    bursts = [b for b in bursts if sustained(b)]
    if len(bursts) < int(p["min_bursts"]):
        return Result(False)
    lengths = [b[-1][0] - b[0][0] + gap for b in bursts]
    # The same thing recurring lasts about as long each time.  A burst still going on (slow at the
    # latest point) has lasted *at least* its length so far: held only to be no longer than 3x the
    # shortest finished one, so the third spell is confirmed as it begins, not once it is a third
    # as long as the others (which cost 10-20 s of a 20-30 s spell).
    ongoing = bursts[-1][-1][0] >= pts[-1][0]
    done = lengths[:-1] if ongoing else lengths
    if max(done) > 3 * min(done) or (ongoing and lengths[-1] > 3 * min(done)):
        return Result(False)
    # On, then off: between two bursts the job runs at its normal pace for at least as long as a burst
    # lasts.  One long slowdown with dips in it is split into bursts with short gaps, not a period.
    quiet = [b[0][0] - a[-1][0] - gap for a, b in zip(bursts, bursts[1:], strict=False)]
    if min(quiet) < statistics.median(lengths):
        return Result(False)
    # ...and normal means normal: a long slowdown that hovers about the threshold dips under it now and
    # then, but its dips are still slow (half the ratio's excess or more).
    normal_bar = base * (1.0 + 0.5 * (p["ratio"].value - 1.0))
    for a, b in zip(bursts, bursts[1:], strict=False):
        between = [v for t, v in pts if a[-1][0] < t < b[0][0]]
        if between and statistics.median(between) > normal_bar:
            return Result(False)
    starts = [b[0][0] for b in bursts]
    gaps = [b - a for a, b in zip(starts, starts[1:], strict=False)]
    # The span over the count, not one interval: each burst's start is jittered by a step or two.
    period = (starts[-1] - starts[0]) / (len(starts) - 1)
    if period < 4 * gap or any(abs(g - period) > p["tolerance"] * period for g in gaps):
        return Result(False)
    # ...and against each other: with three bursts each interval is within a quarter of their mean
    # when one is 117 s and the other 74 s (random bursts in a job that hiccups).  A schedule repeats
    # to within the tolerance, give or take the points' own spacing at either end.
    if max(gaps) - min(gaps) > p["tolerance"] * period + 2 * gap:
        return Result(False)
    if ctx.now - bursts[-1][-1][0] > 1.5 * period:
        return Result(False)
    burst_s = statistics.median(lengths)
    slow = statistics.median(v / base for b in bursts for _, v in b)
    losses = [(t, v, max(v, 1.0) * (1 - base / v)) for b in bursts for t, v in b]
    ctx.facts.update(period_s=round(period), burst_s=round(burst_s, 1), bursts=len(bursts),
                     periodic_ratio=round(slow, 3), step_losses=losses, phase=ctx.facts.get("phase", "step"))
    ev = Evidence("job.duration_s", job, round(base * slow, 6), "s", round(base, 6), f"ratio {p['ratio']}",
                  p["window"], f"{len(bursts)} slowdowns of ~{burst_s:.0f}s, every {period:.0f}s "
                  f"(intervals {', '.join(f'{g:.0f}' for g in gaps)} s)")
    return Result(True, [job], [ev])


@dataclass(frozen=True, kw_only=True)
class WhatIfCondition(ConditionParams):
    """The cost: the step time were the culprits as fast as their peers, and the time lost per step."""

    measure: Measure = param("work", _MEASURE_DOC)
    window: Duration = param(10.0, "the last `window` or the last `steps` steps, whichever is longer")
    steps: Number = param(5.0, "see `window`")
    within: Within = param("stage", _WITHIN_DOC)
    against: Literal["auto", "peers", "past"] = param(
        "auto", "`peers`: the culprits' own work over the slowest other rank's (a fault in their own compute or "
                "input); `past`: the step against the job's own steps before the incident (a fault in what every "
                "rank shares); `auto`: `peers` while the culprits' own work holds most recent steps back, else `past`")
    cost_of: Literal["steps", "saves"] = param(
        "steps", "`steps`: the training steps (and any stretch with no step at all); `saves`: each checkpoint save's "
                 "time over the job's quickest save before the incident")


@condition("what_if", WhatIfCondition)
def _what_if(c: Condition, ctx: Ctx) -> Result:
    """What the waiting costs: the step time were the culprits as fast as their peers.

    Uses the per-step losses a pattern leaf left in the facts (stage, rotation, periodic), or
    computes them for the culprit ranks (:func:`whywait.engine.evaluate.steps.step_loss`) over the complete
    steps since the incident began (``incident_since``, set by the evaluator).  Sets ``step_s``,
    ``whatif_step_s``, ``slowdown_pct`` and ``step_losses`` (which the evaluator sums into
    GPU-hours).  Never gates a rule: put it under ``evidence:``.
    """
    p = c.params
    losses = ctx.facts.get("step_losses")
    if losses is None and p["cost_of"] == "saves":
        losses = ctx.facts["step_losses"] = _save_losses(ctx)
    if losses is None:
        table = ctx.store.step_tables.get(ctx.job.job)
        if table is None:
            return Result(False)
        done = table.complete(ctx.now)
        fn: Any = ctx.facts.get("loss_fn")
        culprits = set(ctx.culprit_ranks())  # a rank itself, the rank on a GPU, the ranks on a node
        if fn is None and culprits and len(culprits) < len(ctx.job.ranks):
            groups = groups_of(ctx.job.ranks, _coords(ctx), p["within"])

            # What one step loses to these culprits is kept on the step: asked again on every tick it is recent.
            loss_key = ("step_loss", p["measure"], frozenset(culprits), groups_key(groups))

            def loss_of(row: Mapping[int, StepRec]) -> tuple[float, float]:
                return kept_stat(row, loss_key, lambda: step_loss(row, culprits, groups, p["measure"]))  # type: ignore[no-any-return]

            def peers(row: Mapping[int, StepRec]) -> tuple[float, float] | None:
                dur, lost = loss_of(row)
                return (dur, lost) if lost > 0.02 * _training_s(row) else None
            fn = peers
            # Is it the culprits' own work that holds the step back (a slow GPU, a starved loader)?
            # If not, the waiting is in what every rank shares (a lossy NIC slows every all-reduce,
            # a slow pool every read): the step is measured against the job's own past instead, less
            # whatever some rank's own work added on that step (a hiccup, a second fault elsewhere).
            # A rule that knows its fault is in the culprits' own work (a throttled GPU) says so
            # (`against: peers`): a culprit only 15% slower is not the slowest on every step, and on the
            # others the job's past would charge it another fault's time (a flapping link's stalls).
            recent = done[-max(int(p["steps"]), 1):]
            if len(groups) > 1:
                # A pipeline: the culprits hold a step back when they are its slowest rank of any stage
                # (:func:`step_loss`); what they add over the bottleneck stage may be under 2% of the step on
                # many steps, and the job's past would then take their own excess as "not this incident's".
                mine = sum(1 for _, row in recent if loss_of(row)[1] > 0)
            else:
                mine = sum(1 for _, row in recent if peers(row) is not None)
            if p["against"] == "past" or (p["against"] == "auto" and recent and mine < len(recent) / 2):
                fn = _against_own_past(ctx, done, groups, p["measure"]) or peers
        elif fn is None:
            groups = groups_of(ctx.job.ranks, _coords(ctx), p["within"])
            fn = _against_own_past(ctx, done, groups, p["measure"])
            if fn is None:
                return Result(False)
        losses = _losses(done, fn, ctx.facts.get("cost_until", -math.inf), int(p["steps"]),
                         since=ctx.facts.get("incident_since", ctx.now))
        if isinstance(fn, _OwnPast):
            # measured against the job's own past (no rank's own work to blame): a stretch with no
            # step at all is this incident's too.  Not a straggler's: its own slow work does not hang
            # the job, and a stall then is some other fault's (a flapping link's).
            losses += _stall(ctx, done)
        ctx.facts["step_losses"] = losses
    if not losses:
        return Result(False)
    recent = losses[-max(int(p["steps"]), 1):]
    step_s = statistics.median(d for _, d, _ in recent)
    whatif = statistics.median(d - lost for _, d, lost in recent)
    slowdown = 100.0 * (step_s / whatif - 1) if whatif > 0 else 0.0
    ctx.facts.update(step_s=round(step_s, 6), whatif_step_s=round(whatif, 6), slowdown_pct=round(slowdown, 1))
    # The label reads as the evidence line's heading: "job.step_s  (if the culprit were ...)", then "1.32 s vs 0.82 s".
    ev = Evidence("job.step_s", ctx.job.job, round(step_s, 6), "s", round(whatif, 6),
                  "if the culprit were as fast as its peers", None,
                  f"a step takes {step_s:.3g} s; {whatif:.3g} s were the culprit as fast as its peers "
                  f"({slowdown:.0f}% slower)")
    return Result(True, [], [ev])


def _straggle_s(row: Mapping[int, StepRec], groups: dict[str, list[int]], measure: str,
                key: tuple[Any, ...] | None = None) -> float:
    """Seconds the step's slowest rank's own work added on top of its group's typical work.

    In a synchronous job the step waits for its slowest rank: a hiccup, a GC pause or a starved
    loader lengthens it by that rank's work over the group's median.  Taken as the largest share over
    any group's median, times the largest group median (the pace-setting group's work); 0 when no
    group has four ranks with the measure.  Kept on the step under ``("straggle", measure, key)``, ``key``
    naming the groups (:func:`groups_key`, computed when not given).
    """
    key = ("straggle", measure, groups_key(groups) if key is None else key)
    return float(kept_stat(row, key, lambda: _straggle_of(row, groups, measure)))


def _straggle_of(row: Mapping[int, StepRec], groups: dict[str, list[int]], measure: str) -> float:
    most = mid_max = 0.0
    for members in groups.values():
        vals = known(row, members, measure)
        if len(vals) < 4:
            continue
        mid = statistics.median(vals)
        mid_max = max(mid_max, mid)
        if mid > 0:
            most = max(most, (max(vals) - mid) / mid)
    return most * mid_max


class _OwnPast:
    """A per-step loss against the job's own step time before the incident (no rank to blame).

    The whole job is slower (a slow pool, a shared switch, a code change): a step loses what it
    takes over the job's steps before the incident began.  Both are taken less what the step's slowest
    rank's own work added over its group's median (:func:`_straggle_s`): a hiccup on a random rank of
    a 192-rank job, or a second fault elsewhere (a starved loader, a hot GPU), lengthens the step by one
    rank's work, and that is not this incident's time.  (Before, a step whose slowest rank was not the
    culprit was charged nothing at all: a large job has a hiccup somewhere on most steps, so the
    measure flipped tick to tick and a lossy NIC's cost came out 35-45% short.)

    Called as a function it answers only for a step past the job's own noise (walking back stops
    where the incident began); :meth:`signed` answers for every step, a quicker one with a negative
    loss, and counts the steps after the first tick: a slowdown of a few percent (a NIC on the wrong
    switch) hides under the noise step by step but not in their sum, and the noise sums to nothing.
    """

    def __init__(self, base: float, gate: float, groups: dict[str, list[int]], measure: str) -> None:
        self.base, self.gate, self.groups, self.measure = base, gate, groups, measure
        self.key = groups_key(groups)

    def own(self, row: Mapping[int, StepRec]) -> float:
        """The step's own time: a checkpoint save in it is the save's, and what the slowest rank's own
        work added is that rank's, not this incident's."""
        return _training_s(row) - _straggle_s(row, self.groups, self.measure, self.key)

    def signed(self, row: Mapping[int, StepRec]) -> tuple[float, float]:
        """``(step time, seconds lost)``, negative for a step quicker than the baseline."""
        return row_median(row), self.own(row) - self.base

    def __call__(self, row: Mapping[int, StepRec]) -> tuple[float, float] | None:
        dur, lost = self.signed(row)
        return (dur, lost) if lost > self.gate - self.base else None


def _against_own_past(ctx: Ctx, done: Steps, groups: dict[str, list[int]], measure: str) -> _OwnPast | None:
    """The :class:`_OwnPast` measure of this incident; None with fewer than 5 steps before it began.

    The baseline is kept per incident, so a long incident does not become its own baseline.
    """
    since = ctx.facts.get("incident_since", ctx.now)
    key = ("what_if.baseline", ctx.rule_id, ctx.job.job)
    base = ctx.state.get(key)
    if base is None or ctx.facts.get("cost_until", -math.inf) == -math.inf:
        # the history: steps that ended well before the incident began
        probe = _OwnPast(0.0, 0.0, groups, measure)
        before = [probe.own(row) for row in [row for _, row in done if row_end(row) < since - 10.0][-60:]]
        if len(before) < 5:
            return None
        base = statistics.median(before)
        # The job's own step-to-step noise: a step counts as slowed only past it, so walking back
        # stops where the incident began instead of counting jitter before it.
        ctx.state[key] = base
        ctx.state[key + ("noise",)] = 1.4826 * statistics.median(abs(b - base) for b in before)
    gate = base + max(4 * ctx.state.get(key + ("noise",), 0.0), 0.05 * base)
    return _OwnPast(base, gate, groups, measure)


def _stall(ctx: Ctx, done: Steps) -> list[tuple[float, float, float]]:
    """The time the job has made no step at all, as one entry ``(now, seconds since its last step,
    seconds lost since last counted)``; [] while steps come as usual.

    A hung collective (a failed GPU, a silent rank) or a save that never ends completes no step, so
    no step carries the loss: every GPU of the job waits from when the next step was due (the last
    step's end plus a usual step).  Checkpoint saves since then are excused (the job trains not at
    all meanwhile, by design), a save still running up to the job's usual save; with no save seen
    before, a running one is not judged.  Counted once past twice the usual step and 2 s (steps reach
    the engine in batches), and then from when the step was due.
    """
    if len(done) < 5:
        return []
    # Only as far as any input has come: a job waits only while the world goes on around it (its nodes
    # still report).  Past the end of every input (the end of a replayed window, an imported step table
    # that simply ends) nothing says the job hung rather than ended, and the evaluator's clock, moved on
    # to close the windows, charged every GPU of it for minutes it may not have run.
    now = min(ctx.now, ctx.store.max_time)
    last = row_end(done[-1][1])
    usual = statistics.median(_training_s(row) for _, row in done[-20:])
    excused = 0.0
    for start, end in (ctx.store.checkpoint_spans.get(ctx.job.job) or {}).values():
        if start is None:
            continue
        lo, hi = max(start, last), min(end if end is not None else now, now)
        if hi <= lo:
            continue
        if end is None or end > now:
            saves = ctx.store.window("checkpoint.duration_s", ctx.job.job, ctx.now - 3600.0, ctx.now)[1]
            if not saves:
                return []
            hi = min(hi, max(lo, start + statistics.median(saves)))
        excused += hi - lo
    quiet = now - last - excused
    if quiet <= 2 * usual + 2.0:
        return []
    lost = now - max(ctx.facts.get("cost_until", -math.inf), last + usual + excused)
    return [(now, quiet, lost)] if lost > 0 else []


def _save_losses(ctx: Ctx) -> list[tuple[float, float, float]]:
    """``(end, save time, seconds lost)`` for each checkpoint save the incident has not counted yet.

    A save blocks training on every rank: what it takes over the job's quickest save before the
    incident began (``checkpoint.duration_s`` over the hour before; saves vary less than they grow)
    is lost.  Read from the saves' end events, not from the steps: a rule that holds on the tick a
    save ends must count it then (the step that carries it is complete only later, and the rule may
    no longer hold).  The first time, every save back to the first one no more than 5% over that
    baseline counts (saves are minutes apart); later, only the saves after the last one counted, and
    one no longer than the baseline counts as nothing.
    """
    since = ctx.facts.get("incident_since", ctx.now)
    counted = ctx.facts.get("cost_until", -math.inf)
    key = ("what_if.save_baseline", ctx.rule_id, ctx.job.job)
    base = ctx.state.get(key) if counted != -math.inf else None
    if base is None:
        before = ctx.store.window("checkpoint.duration_s", ctx.job.job, since - 3600.0, since)[1]
        if not before:
            return []
        base = ctx.state[key] = min(before)
    times, values = ctx.store.window("checkpoint.duration_s", ctx.job.job, ctx.now - 3600.0, ctx.now)
    saves = [(t, v, v - base if v > 1.05 * base else 0.0) for t, v in zip(times, values, strict=True)]
    # A save still running past the baseline is lost time already (the job trains not at all
    # meanwhile): counted up to now, from where it should have ended, and never twice.
    running: list[tuple[float, float, float]] = []
    age = ctx.store.age("checkpoint.open_s", ctx.job.job, ctx.now)
    if age is not None and age > 1.05 * base:
        start = ctx.now - age
        done = [x for x in saves if x[0] > start]  # its own end, should it be in already
        if not done:
            running = [(ctx.now, age, ctx.now - max(start + base, counted))]
    if counted != -math.inf:
        # a save that ended after it was counted while running: only the part after that
        return [(t, v, min(lost, t - counted)) for t, v, lost in saves if t > counted] + \
            [x for x in running if x[2] > 0]
    out: list[tuple[float, float, float]] = []
    for x in reversed(saves):  # back to the first save that took no longer than usual
        if x[2] <= 0:
            break
        out.append(x)
    return out[::-1] + running


def _training_s(row: Mapping[int, StepRec]) -> float:
    """The step's time less any checkpoint save in it (median over the ranks), kept on the step: the cost
    figure asks it of the job's last 20 steps on every tick."""
    return float(kept_stat(row, _TRAINING_S, lambda: _training_of(row)))


_TRAINING_S = ("training_s",)


def _training_of(row: Mapping[int, StepRec]) -> float:
    if isinstance(row, FrozenRow):  # the same floats, a column at a time
        ck = row.cols.get("checkpoint_s")
        dur = row.cols["duration_s"]
        return float(statistics.median((dur - np.nan_to_num(ck, nan=0.0) if ck is not None else dur).tolist()))
    return statistics.median(r.duration_s - (r.checkpoint_s or 0.0) for r in row.values())


def _losses(done: Steps, fn: Any, counted: float, recent: int, max_miss: int = 4,
            since: float = math.inf) -> list[tuple[float, float, float]]:
    """``(end, step time, seconds lost)`` for the steps the incident has not counted yet.

    The first time (nothing counted) it walks back from the newest step while the pattern holds
    (``fn`` answers for a step; up to ``max_miss`` steps in a row without it), so the cost starts where
    the waiting began, not when the rule fired.  Later only the steps after ``counted`` (one that
    ``fn`` does not answer for as 0 s lost), plus the last ``recent`` steps for the current figures.

    The job's-past measure (:class:`_OwnPast`) walks back only to find where the waiting began, and
    then counts every step from there, or from ``since`` (when the incident's condition began to hold)
    if that is earlier, signed as it does later: a slowdown under the job's step-to-step noise (a NIC
    whose port runs at a quarter of its speed adds 3% to a step) passes no step's gate, and the walk
    back alone would give no cost at all, ever.
    """
    out: list[tuple[float, float, float]] = []
    if counted == -math.inf:
        misses = 0
        for _, row in reversed(done):
            got = fn(row)
            if got is None:
                misses += 1
                if misses > max_miss:
                    break
                continue
            misses = 0
            out.append((row_end(row), *got))
        out.reverse()
        if isinstance(fn, _OwnPast):
            start = min(out[0][0] if out else math.inf, since)
            return [(t, *fn.signed(row)) for _, row in done if (t := row_end(row)) >= start]
        return out
    signed = fn.signed if isinstance(fn, _OwnPast) else None  # its noise sums to nothing: every step counts
    for i, (_, row) in enumerate(done):
        t = row_end(row)
        if t > counted or i >= len(done) - recent:
            got = signed(row) if signed is not None and t > counted else fn(row)
            if got is not None and t > counted:
                # never more than the time since the last counted point: a step that ends a stall
                # spans it, and the stall is counted already (:func:`_stall`)
                out.append((t, got[0], min(got[1], t - counted)))
            elif got is not None:
                out.append((t, *got))
            elif t > counted:
                # Judged and not lost to this incident: counted as nothing, so that a later tick that
                # measures differently (against the job's past, once another fault is gone) does not
                # charge the incident for steps it was judged innocent of.
                out.append((t, row_median(row), 0.0))
    return out
