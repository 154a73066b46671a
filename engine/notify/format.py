"""Sink-neutral formatting of diagnoses: numbers, durations, times, rank lists, dashboard links,
and :func:`merge` (one diagnosis standing for a group).

Used by the pipeline (its reply lines and timeline) and by every receiver; knows no sink.
"""

from __future__ import annotations

import math
import time
from dataclasses import replace
from typing import Any
from urllib.parse import quote

from whywait.engine.diagnosis import Diagnosis

#: Slack allows 3,000 characters of text in a section; a little is kept back for what is added around it.
SECTION_LIMIT = 2900


def truncate(text: str, limit: int) -> str:
    """``text`` cut to ``limit`` characters, the last one an ellipsis when it was cut (Slack refuses longer)."""
    return text if len(text) <= limit else text[: limit - 1] + "…"


def fmt_number(v: float | None) -> str:
    """A measured value short enough for a phone: ``412``, ``3.1``, ``0.0042``, ``12,345``."""
    if v is None:
        return "–"
    if isinstance(v, float) and (math.isnan(v) or math.isinf(v)):
        return str(v)
    a = abs(v)
    if a >= 1000:
        return f"{v:,.0f}"
    if a >= 100 or float(v).is_integer():
        return f"{v:.0f}"
    return f"{v:.3g}"


def fmt_duration(seconds: float) -> str:
    """``45s``, ``4m 10s``, ``2h 5m``, ``3d 4h``."""
    s = max(0, int(round(seconds)))
    if s < 60:
        return f"{s}s"
    m, s = divmod(s, 60)
    if m < 60:
        return f"{m}m {s}s" if s else f"{m}m"
    h, m = divmod(m, 60)
    if h < 24:
        return f"{h}h {m}m" if m else f"{h}h"
    d, h = divmod(h, 24)
    return f"{d}d {h}h" if h else f"{d}d"


# The calendar's range: what strftime writes as a four-digit year.  Outside it (a silence set for a billion days,
# stored by a version that did not bound it) gmtime overflows or gives a year no one means.
_FIRST_TIME = -62135596800.0  # 0001-01-01 00:00:00 UTC
_LAST_TIME = 253402300799.0  # 9999-12-31 23:59:59 UTC


def fmt_time(t: float) -> str:
    """Event time as ``2025-06-01 12:03:04 UTC``; outside years 1 to 9999 ``after 9999-12-31 (8.64e+24)``
    (never an ``OverflowError``)."""
    if not t <= _LAST_TIME:  # NaN too
        return f"after 9999-12-31 ({t:.3g})"
    if t < _FIRST_TIME:
        return f"before 0001-01-01 ({t:.3g})"
    try:
        return time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime(t))
    except (OverflowError, OSError, ValueError):  # a platform with a narrower time_t
        return f"{t:.3g} (beyond this platform's clock)"


def fmt_ranks(ranks: tuple[int, ...], limit: int = 12) -> str:
    """``3, 7, 12`` or ``0–7, 9`` (runs collapsed), cut after ``limit`` items."""
    if not ranks:
        return ""
    rs = sorted(set(ranks))
    runs: list[str] = []
    start = prev = rs[0]
    for r in [*rs[1:], None]:
        if r is not None and r == prev + 1:
            prev = r
            continue
        runs.append(f"{start}" if start == prev else (f"{start}, {prev}" if prev == start + 1 else f"{start}–{prev}"))
        if r is not None:
            start = prev = r
    if len(runs) > limit:
        return ", ".join(runs[:limit]) + f", … ({len(rs)} ranks)"
    return ", ".join(runs)


def dashboard_url(template: str | None, d: Diagnosis, now: float | None = None) -> str | None:
    """Fill the configured dashboard URL template for ``d``; None when there is no template.

    Fields: ``{job}``, ``{rule_id}``, ``{fingerprint}``, ``{culprit}``, ``{severity}``,
    ``{starts_at}`` (epoch s), ``{from_ms}`` / ``{to_ms}`` (15 min either side, ms)
    and ``{labels[NAME]}``; values are URL-quoted.
    """
    if not template:
        return None
    end = d.ends_at if d.ends_at is not None else (now if now is not None else d.detected_at)
    q = lambda v: quote(str(v if v is not None else ""), safe="")  # noqa: E731
    fields: dict[str, Any] = {
        "job": q(d.job), "rule_id": q(d.rule_id), "fingerprint": q(d.fingerprint), "culprit": q(d.culprit),
        "severity": q(d.severity), "starts_at": int(d.starts_at),
        "from_ms": int((d.starts_at - 900) * 1000), "to_ms": int((max(end, d.starts_at) + 900) * 1000),
        "labels": _QuotedLabels(d.labels),
    }
    return template.format_map(fields)


class _QuotedLabels(dict):  # type: ignore[type-arg]
    def __init__(self, labels: dict[str, str]) -> None:
        super().__init__({k: quote(str(v), safe="") for k, v in labels.items()})

    def __missing__(self, key: str) -> str:
        return ""


def merge(diagnoses: list[Diagnosis]) -> Diagnosis:
    """One diagnosis standing for a group (several findings of one rule in one job):
    the lead finding's text, with the ranks, evidence and culprits of all of them.

    The lead is the most severe, then most confident, then earliest.  Firing if any
    member still fires; resolved (ending at the last end) when all have cleared.
    """
    if not diagnoses:
        raise ValueError("merge() needs at least one diagnosis")
    if len(diagnoses) == 1:
        return diagnoses[0]
    order = {"critical": 0, "warning": 1, "info": 2}
    lead = sorted(diagnoses, key=lambda x: (order.get(x.severity, 3), -x.confidence, x.starts_at))[0]
    firing = [x for x in diagnoses if x.status == "firing"]
    ranks = tuple(sorted({r for x in diagnoses for r in x.ranks}))
    seen: set[tuple[str, str]] = set()
    evidence = []
    for x in [lead, *[y for y in diagnoses if y is not lead]]:
        for ev in x.evidence:
            if (ev.metric, ev.entity) not in seen:
                seen.add((ev.metric, ev.entity))
                evidence.append(ev)
    culprits = sorted({x.culprit for x in diagnoses if x.culprit})
    culprit = culprits[0] if len(culprits) == 1 else (", ".join(culprits) if culprits else None)
    title = lead.title
    if len(culprits) > 1:
        title = f"{lead.title} (+{len(culprits) - 1} more: {', '.join(c for c in culprits if c != lead.culprit)})"
    ends = [x.ends_at for x in diagnoses if x.ends_at is not None]
    return replace(
        lead,
        status="firing" if firing else "resolved",
        severity=min((x.severity for x in diagnoses), key=lambda s: order.get(s, 3)),
        title=title,
        ranks=ranks,
        evidence=tuple(evidence),
        culprit=culprit,
        starts_at=min(x.starts_at for x in diagnoses),
        detected_at=min(x.detected_at for x in diagnoses),
        ends_at=None if firing else (max(ends) if ends else None),
        confidence=max(x.confidence for x in diagnoses),
    )
