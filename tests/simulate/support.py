"""Helpers that slice simulator output by kind, node, rank and time."""

from __future__ import annotations

import statistics
from typing import Any, Iterable

START = 1_764_442_800.0

Msgs = list[tuple[str, dict[str, Any]]]


def of_kind(msgs: Msgs, kind: str, lo: float = -1, hi: float = 1e12) -> list[dict[str, Any]]:
    """Messages of ``kind`` whose event time is in (START+lo, START+hi]."""
    return [m for _, m in msgs if m["kind"] == kind and START + lo < m["time"] <= START + hi]


def net_field(msgs: Msgs, field: str, node: str, lo: float, hi: float) -> list[float]:
    return [m[field] for m in of_kind(msgs, "net", lo, hi) if m["node"] == node]


def steps(msgs: Msgs, lo: float, hi: float, job: str | None = None) -> list[dict[str, Any]]:
    """Every step record completed in (lo, hi], without checkpoint steps."""
    return [s for m in of_kind(msgs, "steps", lo, hi) if job is None or m["job"] == job
            for s in m["steps"] if "checkpoint_s" not in s]


def mean(xs: Iterable[float]) -> float:
    return statistics.fmean(list(xs))


def by_rank(recs: list[dict[str, Any]], field: str) -> dict[int, float]:
    """Each rank's median of ``field``: the median, since healthy runs have hiccups and GC pauses."""
    out: dict[int, list[float]] = {}
    for s in recs:
        out.setdefault(s["rank"], []).append(s[field])
    return {r: statistics.median(v) for r, v in out.items()}


def gpu_samples(msgs: Msgs, node: str, gpu: int, lo: float, hi: float) -> list[dict[str, Any]]:
    return [g for m in of_kind(msgs, "gpu", lo, hi) if m["node"] == node for g in m["gpus"] if g["gpu"] == gpu]
