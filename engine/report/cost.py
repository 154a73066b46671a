"""Estimating what waiting cost when a rule gave no figure, without counting the same time twice.

Called by the report and the digest for incidents whose diagnosis carries no ``cost``.  An
incident's estimate is the job's lost fraction (``1 - step time before / step time during``)
× the GPUs the job holds × the incident's duration.  When several incidents of one job overlap,
the job was slowed once, not once per incident: each stretch of time is shared equally among
the incidents open during it, so the estimates add up to the job's loss.
"""

from __future__ import annotations


def shared_gpu_hours(incidents: list[tuple[float, float, float]], gpus: float) -> list[float]:
    """GPU-hours lost per incident, given ``(start, end, lost fraction)`` each; overlaps shared equally."""
    edges = sorted({t for s, e, _ in incidents for t in (s, e)})
    out = [0.0] * len(incidents)
    for a, b in zip(edges, edges[1:], strict=False):
        open_ = [i for i, (s, e, _) in enumerate(incidents) if s <= a and b <= e]
        for i in open_:
            out[i] += incidents[i][2] * gpus * (b - a) / 3600.0 / len(open_)
    return out
