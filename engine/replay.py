"""Replaying recorded telemetry for a postmortem: the same evaluator, offline, with a timeline plot.

Called by ``whywait replay``.  :func:`replay` is pure (messages in, diagnoses
out); :func:`plot_timeline` draws what an on-call engineer wants to look at:
each job's step time, the evidence metrics of every diagnosis for the culprit
against the job's other entities, and the incidents as shaded spans.
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterable

from engine.diagnosis import Diagnosis
from engine.evaluate.evaluator import Evaluator
from engine.evaluate.store import MetricStore
from engine.rules.loader import RuleSet


@dataclass
class ReplayResult:
    """Diagnoses in order, the evaluator (its store holds the whole window), and counts."""

    diagnoses: list[Diagnosis]
    evaluator: Evaluator
    messages: int
    start: float | None
    end: float | None
    skipped: dict[str, int] = field(default_factory=dict)


def replay(messages: Iterable[dict[str, Any]], rules: RuleSet, topology: Any, retention_s: float = 7 * 86400,
           progress: Any = None) -> ReplayResult:
    """Feed decoded messages (in event-time order) to a fresh evaluator; return what it concluded.

    ``retention_s`` is large so that the store keeps the whole window for plotting.
    ``progress`` is an optional tqdm-like object updated per message.
    """
    ev = Evaluator(rules, topology, store=MetricStore(retention_s=retention_s))
    out: list[Diagnosis] = []
    n = 0
    start = end = None
    for m in messages:
        n += 1
        t = m["time"]
        start = t if start is None else min(start, t)
        end = t if end is None else max(end, t)
        out += ev.ingest(m)
        if progress is not None:
            progress.update(1)
    if end is not None:
        out += ev.advance(end + 3600)  # close every window; incidents still holding at the end stay open
    return ReplayResult(out, ev, n, start, end)


def incidents(diags: list[Diagnosis], end: float | None) -> list[tuple[Diagnosis, float, float]]:
    """Pair each incident's first firing with its resolution: ``(first firing, start, end)``."""
    first: dict[str, Diagnosis] = {}
    spans: list[tuple[Diagnosis, float, float]] = []
    for d in diags:
        if d.status == "firing":
            first.setdefault(d.fingerprint, d)
        elif d.fingerprint in first:
            f = first.pop(d.fingerprint)
            spans.append((f, f.starts_at, d.ends_at or d.detected_at))
    for f in first.values():
        spans.append((f, f.starts_at, end or f.detected_at))
    return sorted(spans, key=lambda s: s[1])


def plot_timeline(result: ReplayResult, path: Path, max_metrics: int = 3) -> Path:
    """Write a PNG timeline: job step time, evidence metrics (culprit vs the job's median), incident spans."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    store = result.evaluator.store
    t0 = result.start or 0.0
    spans = incidents(result.diagnoses, result.end)
    metrics: list[tuple[str, str]] = []  # (metric, culprit entity)
    for d, _, _ in spans:
        for e in d.evidence:
            if e.metric.startswith(("job.", "topology", "check")) or (e.metric, e.entity) in metrics:
                continue
            metrics.append((e.metric, e.entity))
    metrics = metrics[:max_metrics]
    jobs = sorted({k[1] for k in store.series if k[0] == "job.duration_s"})
    fig, axes = plt.subplots(1 + len(metrics), 1, figsize=(11, 2.6 * (1 + len(metrics))), sharex=True,
                             squeeze=False)
    ax0 = axes[0][0]
    for job in jobs:
        s = store.series[("job.duration_s", job)]
        ax0.plot([t - t0 for t in s.t], s.v, label=f"{job} median step time", lw=1)
    ax0.set_ylabel("step time (s)")
    ax0.legend(loc="upper left", fontsize=8)
    for i, (metric, entity) in enumerate(metrics, start=1):
        ax = axes[i][0]
        culprit = store.series.get((metric, entity))
        if culprit is not None:
            ax.plot([t - t0 for t in culprit.t], culprit.v, color="tab:red", lw=1.2, label=f"{entity}")
        peers = [v for (m, e), v in store.series.items() if m == metric and e != entity]
        if peers:
            grid = sorted({round(t) for p in peers for t in p.t})
            by_t: dict[int, list[float]] = {}
            for p in peers:
                for t, v in zip(p.t, p.v, strict=True):
                    by_t.setdefault(round(t), []).append(v)
            ax.plot([t - t0 for t in grid], [statistics.median(by_t[t]) for t in grid], color="tab:gray", lw=1,
                    label="median of the others")
        ax.set_ylabel(metric, fontsize=8)
        ax.legend(loc="upper left", fontsize=8)
    colors = ["tab:orange", "tab:purple", "tab:green", "tab:brown", "tab:pink"]
    for k, (d, a, b) in enumerate(spans):
        for row in axes:
            row[0].axvspan(a - t0, b - t0, color=colors[k % len(colors)], alpha=0.15)
        ax0.annotate(f"{d.rule_id}: {d.culprit or d.job}", xy=(a - t0, 1.0), xycoords=("data", "axes fraction"),
                     fontsize=7, va="bottom", rotation=0, color=colors[k % len(colors)])
    axes[-1][0].set_xlabel("seconds from the start of the replay (event time)")
    fig.suptitle("whywait replay: where the waiting began", fontsize=11)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path
