"""GPU-hours lost, counted once: the losses of one job's incidents that overlap in time are combined, not added.

Called by the report (its "In all" total, and each incident's share of it) and by the digest (each job's loss
by cause, in its period).  Each incident's own figure, the rule's ``cost.gpu_hours_lost`` or the estimate from
step times, is what the job lost while it was open, as if it were the only incident.  Several rules that see one
slow node (retransmits, a link flap, a PCIe link, the job's step times) each count the same lost seconds of the
job: adding their figures counted that time two or three times over, up to more than the job ever used.  One
second of a job's time is lost at most once:

- each incident's loss is spread evenly over its span ``[start, end]`` (a rate: GPU-hours per second);
- where several incidents of one job are open at once, the job's loss there is the largest of their rates (the
  worst of the explanations, not their sum), shared among them in proportion to their rates;
- alone, an incident keeps its own rate, so an incident that overlaps nothing keeps its whole figure.

Incidents of different jobs never share.  An incident without duration (``end <= start``) keeps its figure
whole, when it lies in the period.  With a period ``[lo, hi]`` only the loss inside it is counted (the digest
of a week counts the part of an incident that lies in that week).  Pure: no I/O.
"""

from __future__ import annotations

import math
from typing import Hashable, NamedTuple, Sequence


def loss_span(cost: dict[str, float] | None, start: float, end: float) -> tuple[float, float]:
    """Where an incident's loss lies: the cost's ``lost_from``..``lost_until`` (the first and last step that lost
    time, which the evaluator gives), else the incident's own span ``start``..``end``.

    Why: a stage imbalance open for a whole run lost its time on the steps before a straggler began, the
    straggler on the steps after; spread over the whole run, the two looked like one loss and the report's
    total said 0.29 GPU-hours of their 0.40.
    """
    a, b = (cost or {}).get("lost_from"), (cost or {}).get("lost_until")
    if a is None or b is None or not b > a:
        return start, end
    return float(a), float(b)


class Loss(NamedTuple):
    """One incident's own loss: its job (incidents of one job share), its span, its GPU-hours."""

    job: Hashable
    start: float
    end: float
    gpu_hours: float


def counted_losses(losses: Sequence[Loss], lo: float = -math.inf, hi: float = math.inf) -> list[float]:
    """Each incident's share of its job's loss, overlaps counted once (see the module), within ``[lo, hi]``.

    Returns one figure per item of ``losses``, in order; the figures of one job add up to what the job
    lost (no more than its worst incident's rate at any time).  A figure that is not a positive number
    counts nothing.
    """
    out = [0.0] * len(losses)
    by_job: dict[Hashable, list[int]] = {}
    for i, x in enumerate(losses):
        if not (math.isfinite(x.gpu_hours) and x.gpu_hours > 0):
            continue
        if not x.end > x.start:  # a point in time: nothing to spread, nothing it could share
            if lo <= x.start <= hi:
                out[i] = x.gpu_hours
            continue
        by_job.setdefault(x.job, []).append(i)
    for idx in by_job.values():
        rate = {i: losses[i].gpu_hours / (losses[i].end - losses[i].start) for i in idx}
        # the spans clipped to the period; what lies outside it counts nothing
        clipped = {i: (max(losses[i].start, lo), min(losses[i].end, hi)) for i in idx}
        clipped = {i: ab for i, ab in clipped.items() if ab[0] < ab[1]}
        starts = sorted(clipped, key=lambda i: clipped[i][0])
        edges = sorted({t for ab in clipped.values() for t in ab})
        open_: set[int] = set()
        k = 0
        for a, b in zip(edges, edges[1:], strict=False):
            open_ = {i for i in open_ if clipped[i][1] > a}
            while k < len(starts) and clipped[starts[k]][0] <= a:
                open_.add(starts[k])
                k += 1
            if not open_:
                continue
            total = sum(rate[i] for i in open_)
            lost = max(rate[i] for i in open_) * (b - a)
            for i in open_:
                out[i] += lost * rate[i] / total
    return out
