"""The postmortem report: what was slow, from when to when, why, what it cost, and who owns it.

Called by ``whywait replay --report DIR`` (and ``--plot``, ``--slack-thread``) after the
replay: :func:`build_report` makes a second pass over the window's messages to gather
the series to plot (:mod:`whywait.engine.report.sampler`, bounded memory), then
:class:`Report` writes a self-contained HTML file (images inlined, opens offline), a
Markdown file that pastes into a postmortem document, and the PNGs.

Cost: a diagnosis's ``cost`` (GPU-hours lost, slowdown) is used when the rule gave one;
otherwise it is estimated from the job's step times (median during the incident
against the median before it) and said to be an estimate.
"""

from __future__ import annotations

import math
import statistics
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Iterable, Sequence

from whywait.engine.replay import ReplayResult, Span, Window
from whywait.engine.report.sampler import Grid, Sampler

# Evidence metrics that are not a per-entity time series worth plotting.
_NOT_PLOTTED = ("job.", "topology", "check", "step.")


@dataclass
class IncidentView:
    """One incident as the report tells it."""

    number: int
    rule_id: str
    severity: str
    title: str
    cause: str
    job: str | None
    culprit: str
    ranks: tuple[int, ...]
    start: float
    end: float
    resolved: bool
    fired_at: float
    changes: list[tuple[float, str]]
    owner: str
    channel: str | None
    path: tuple[str, ...]
    clean: tuple[str, ...]
    next_step: str
    evidence: list[dict[str, Any]]
    evidence_series: list[tuple[str, str]]
    cost: dict[str, float] | None
    cost_source: str  # "rule", "estimated from step times" or "unknown"
    neighbours: list[str] = field(default_factory=list)
    slack_link: str | None = None  # the live incident's Slack thread, when it was posted
    # The same figures at the incident's last update (its resolution, or the last change), by (metric, entity),
    # and when: the cost is the last update's, so the evidence beside it must not be only the first's.
    evidence_last: dict[tuple[str, str], dict[str, Any]] = field(default_factory=dict)
    last_at: float | None = None
    last_status: str = ""  # "resolved", "firing", or "data-end" (the closing figures of one still open)
    # What the totals count of ``cost["gpu_hours_lost"]`` (its own figure, as the rule gave it): less where
    # incidents of the same job overlapped it, whose lost time is counted once (``costs``), and the numbers of those.
    counted: float | None = None
    shared_with: tuple[int, ...] = ()
    # The names the rule may have put into its title, cause and next step (job, culprit, owner, entities, labels):
    # the report escapes them there (``render.md_text``).
    names: tuple[str, ...] = ()


@dataclass
class ReportData:
    """Everything the report shows, gathered from the replay and the second pass."""

    window: Window
    grid: Grid
    sampler: Sampler
    incidents: list[IncidentView]
    jobs: list[str]
    straggler_ranks: dict[str, set[int]]
    skipped: dict[str, int]
    messages: int
    # Ctrl-C stopped the replay: the report covers the window only up to ``read_to`` (the last event time read).
    interrupted: bool = False
    read_to: float | None = None

    def split(self, job: str) -> dict[str, list[float]]:
        """The median rank's data/compute/comm time per bucket (phases nobody reported are left out)."""
        out: dict[str, list[float]] = {}
        for f, name in (("step.data_wait_s", "data"), ("step.compute_s", "compute"), ("step.comm_s", "comm")):
            ents = [e for e in self.sampler.entities(f) if e.rsplit(":", 1)[0] == job]
            if not ents:
                continue
            cols = zip(*(self.sampler.means(f, e) or [] for e in ents), strict=True)
            out[name] = [_median(c) for c in cols]
        return out

    def job_step(self, job: str) -> list[float]:
        ents = [e for e in self.sampler.entities("step.duration_s") if e.rsplit(":", 1)[0] == job]
        cols = zip(*(self.sampler.means("step.duration_s", e) or [] for e in ents), strict=True)
        return [_median(c) for c in cols]


def _median(vals: Iterable[float]) -> float:
    v = [x for x in vals if not math.isnan(x)]
    return statistics.median(v) if v else math.nan


def slack_threads(records: Iterable[dict[str, Any]], workspace_url: str = "https://slack.com") -> dict[str, str]:
    """Fingerprint -> link to the Slack message the live notifier posted for it.

    ``records`` are the notifier's incident records (``whywait.engine.notify.pipeline.incidents.Incident.to_dict``,
    as kept in its state topic); each lists the fingerprints it showed and its root message.
    """
    out: dict[str, str] = {}
    for rec in records:
        cid, ts = rec.get("channel_id"), rec.get("ts")
        if not cid or not ts:
            continue
        link = f"{workspace_url.rstrip('/')}/archives/{cid}/p{str(ts).replace('.', '')}"
        for fp in rec.get("members") or {}:
            out[fp] = link
    return out


def build_report(res: ReplayResult, spans: list[Span], messages: Iterable[dict[str, Any]], window: Window,
                 topology: Any, threads: dict[str, str] | None = None) -> Report:
    """Gather the report's series in a second pass over ``messages``; return the :class:`Report`.

    ``threads`` (from :func:`slack_threads`) links each incident to its live Slack thread.
    """
    spans = [s for s in spans if s.end >= window.since]
    metrics: set[str] = set()
    for s in spans:
        for e in s.first.evidence:
            if not e.metric.startswith(_NOT_PLOTTED):
                metrics.add(e.metric)
    jobs = sorted({s.first.job for s in spans if s.first.job})
    t0 = window.read_from if not spans else min(window.since, min(s.start for s in spans) - 60)
    t1 = window.until
    if res.start is not None and res.end is not None and res.end >= res.start:
        # The axis spans the data read, not the whole window asked for: a 7 s trace replayed with the default
        # 15-minute lead was a sliver at the plot's right edge.  Every incident stays in view.
        pad = max(30.0, 0.05 * (res.end - res.start))
        lo, hi = max(t0, res.start - pad), min(t1, res.end + pad)
        if spans:
            lo, hi = min(lo, min(s.start for s in spans) - 60), max(hi, min(t1, max(s.end for s in spans) + 60))
        if hi - lo >= 4.0:
            t0, t1 = lo, hi
    grid = Grid(t0, t1)
    sampler = Sampler(grid, metrics, set(jobs))
    every_job = not jobs  # no incident: show every job's step times
    for m in messages:
        if every_job and m["kind"] == "steps":
            sampler.jobs.add(m["job"])
        sampler.ingest(m)
    if not jobs:
        jobs = sorted(sampler.jobs)
    views = [_view(k, s, sampler, grid, topology) for k, s in enumerate(spans, start=1)]
    for v, s in zip(views, spans, strict=True):
        v.slack_link = (threads or {}).get(s.first.fingerprint)
    straggler: dict[str, set[int]] = {}
    for v in views:
        if v.job and v.ranks and len(v.ranks) < 64:
            straggler.setdefault(v.job, set()).update(v.ranks)
    data = ReportData(window, grid, sampler, views, jobs, straggler, dict(res.skipped), res.messages,
                      interrupted=res.interrupted, read_to=res.end)
    _estimate_costs(data)
    _count_costs(data)
    return Report(data)


def _changes(updates: Sequence[Any]) -> list[tuple[float, str]]:
    """What each firing update changed against the one before it: severity, culprit, ranks, title, the entities
    its evidence names; an update that changed only figures is left out (a list of identical "Changed" lines
    said nothing)."""
    out: list[tuple[float, str]] = []
    prev = updates[0] if updates else None
    for u in updates[1:]:
        if u.status != "firing" or prev is None:
            continue
        said = []
        if u.severity != prev.severity:
            said.append(f"severity {prev.severity} → {u.severity}")
        if (u.culprit or "") != (prev.culprit or ""):
            said.append(f"culprit {prev.culprit or 'none'} → {u.culprit or 'none'}")
        if tuple(u.ranks or ()) != tuple(prev.ranks or ()):
            said.append(f"ranks {_ranks_text(prev.ranks)} → {_ranks_text(u.ranks)}")
        if u.title != prev.title and not said:
            said.append(f"now: {u.title}")
        before = {e.entity for e in prev.evidence if e.metric != "check"}
        now = {e.entity for e in u.evidence if e.metric != "check"}
        if now - before:
            said.append("the evidence now also names " + ", ".join(sorted(now - before)[:5]))
        if before - now:
            said.append("no longer " + ", ".join(sorted(before - now)[:5]))
        if said:
            out.append((u.detected_at, "; ".join(said)))
        prev = u
    return out


def _ranks_text(ranks: Any) -> str:
    from whywait.engine.notify.format import fmt_ranks

    return fmt_ranks(tuple(ranks)) if ranks else "none"


def _view(k: int, s: Span, sampler: Sampler, grid: Grid, topology: Any) -> IncidentView:
    d, last, now = s.first, s.last, s.told
    series: list[tuple[str, str]] = []
    for e in d.evidence:
        if e.metric.startswith(_NOT_PLOTTED) or (e.metric, e.entity) in series:
            continue
        series.append((e.metric, e.entity))
    owner = f"{d.owner.team} (project {d.owner.project})" if d.owner else "unknown"
    changes = _changes(s.updates)
    cost = next((u.cost for u in reversed(s.updates) if u.cost), None)
    later = next((u for u in reversed(s.updates[1:]) if u.evidence), None)  # the resolution's, if it gave any
    names = {d.job, d.culprit, *(d.culprit or "").split(", "), *(now.culprit or "").split(", "), *d.labels.values(),
             *((d.owner.project, d.owner.team, d.owner.channel) if d.owner else ()),
             *(x for e in d.evidence for x in (e.entity, e.entity.rsplit(":", 1)[0]))}
    return IncidentView(
        # The incident as last told: its "lost N GPU-hours so far" is the cost shown beside it (detection's said
        # 0.00), and its culprit and ranks are the whole of them (an input stall on one node was first told of 3
        # of its 8 ranks, a second before the rest; the report kept the 3).  How it grew is in `changes`.
        number=k, rule_id=d.rule_id, severity=last.severity, title=now.title, cause=now.cause, job=d.job,
        culprit=now.culprit or d.job or "?", ranks=now.ranks, start=s.start, end=s.end, resolved=s.resolved,
        fired_at=d.detected_at, changes=changes, owner=owner, channel=d.owner.channel if d.owner else None,
        path=now.topology_path, clean=now.clean_checks, next_step=now.next_step,
        evidence=[{"metric": e.metric, "entity": e.entity, "value": e.value, "unit": e.unit,
                   "baseline": e.baseline, "threshold": e.threshold} for e in d.evidence if e.metric != "check"],
        evidence_series=series[:3], cost=cost, cost_source="rule" if cost else "unknown",
        neighbours=_neighbours(d, sampler, topology),
        evidence_last={} if later is None else {(e.metric, e.entity): {"value": e.value, "baseline": e.baseline}
                                                 for e in later.evidence if e.metric != "check"},
        names=tuple(sorted(str(n) for n in names if n)),
        last_at=None if later is None else later.detected_at,
        # an incident open when the data ended keeps its closing diagnosis (its cost is the latest): not a resolution
        last_status="" if later is None else later.status if s.resolved or later.status != "resolved" else "data-end")


def _neighbours(d: Any, sampler: Sampler, topology: Any) -> list[str]:
    """Other jobs whose ranks ran on the culprit's leaf switch or storage pool during the window."""
    nodes = [n for n in (d.culprit or "").replace(" ", "").split(",") if n in set(topology.nodes())]
    if not nodes:
        nodes = sorted({r["node"] for p in sampler.placements.values() if p["job"] == d.job
                        for r in p["ranks"]} & set(topology.nodes()))
    leaves = {topology.leaf_of(n) for n in nodes} - {None}
    pools = {p for n in nodes for p in topology.pools_of(n)}
    out: list[str] = []
    for job, p in sorted(sampler.placements.items()):
        if job == d.job:
            continue
        their = {r["node"] for r in p["ranks"]} & set(topology.nodes())
        shared = sorted({topology.leaf_of(n) for n in their} & leaves) + sorted(
            {q for n in their for q in topology.pools_of(n)} & pools)
        if shared:
            out.append(f"{job} (project {p['project']}, team {p['team']}) on {', '.join(shared)}")
    return out


def _estimate_costs(data: ReportData) -> None:
    """Fill in the cost of incidents whose rule gave none, from the job's step times (see ``cost``).

    Each estimate is the incident's own, as if it were alone: what overlapping incidents share is
    :func:`_count_costs`'s business, as for the rules' own figures.
    """
    times = data.grid.times()
    for v in data.incidents:
        if v.cost is not None or not v.job:
            continue
        steps = data.job_step(v.job)
        before = [s for t, s in zip(times, steps, strict=True) if t < v.start and not math.isnan(s)]
        during = [s for t, s in zip(times, steps, strict=True) if v.start <= t <= v.end and not math.isnan(s)]
        if not before or not during:
            continue
        base, now = statistics.median(before), statistics.median(during)
        frac = max(0.0, 1.0 - base / now) if now > 0 else 0.0
        p = data.sampler.placements.get(v.job)
        gpus = sum(float(r.get("gpu_share", 1.0)) for r in p["ranks"]) if p else 0.0
        v.cost = {"step_s": round(now, 4), "whatif_step_s": round(base, 4),
                  "slowdown_pct": round(100.0 * (now / base - 1.0), 1) if base > 0 else 0.0,
                  "gpus": gpus, "gpu_hours_lost": round(frac * gpus * max(0.0, v.end - v.start) / 3600.0, 3)}
        v.cost_source = "estimated from step times"


def _count_costs(data: ReportData) -> None:
    """Set each incident's :attr:`IncidentView.counted`: its share of its job's loss, overlaps counted once."""
    from whywait.engine.report.costs import Loss, counted_losses, loss_span

    costed = [v for v in data.incidents if v.cost and v.cost.get("gpu_hours_lost") is not None]
    # an incident of no job shares with nothing: a key of its own
    got = counted_losses([Loss(v.job if v.job else ("", v.number), *loss_span(v.cost, v.start, v.end),
                               float(v.cost["gpu_hours_lost"])) for v in costed if v.cost])
    for v, n in zip(costed, got, strict=True):
        v.counted = n
        v.shared_with = tuple(o.number for o in costed if o is not v and v.job and o.job == v.job
                              and o.start < v.end and v.start < o.end)


def utc(t: float) -> str:
    """``2026-11-29 14:03:07 UTC``."""
    return datetime.fromtimestamp(t, timezone.utc).strftime("%Y-%m-%d %H:%M:%S UTC")


class Report:
    """The rendered postmortem; :meth:`write` puts it in a folder."""

    def __init__(self, data: ReportData) -> None:
        self.data = data

    def timeline_png(self, path: Path, page: int = 0) -> Path:
        """Draw timeline page ``page`` (0: the main one, with the jobs' step panels) to ``path`` (PNG); return it."""
        from whywait.engine.report.plots import timeline_figure

        from whywait.plotting import pyplot

        plt = pyplot()

        fig, _ = timeline_figure(self.data, page)
        fig.savefig(path, dpi=100)
        plt.close(fig)
        return path

    def timeline_pngs(self, folder: Path) -> list[Path]:
        """Draw every timeline page into ``folder`` (``timeline.png``, ``timeline-2.png``, ...); return them."""
        from whywait.engine.report.plots import pages

        return [self.timeline_png(folder / ("timeline.png" if p == 0 else f"timeline-{p + 1}.png"), p)
                for p in range(pages(self.data))]

    def summary_lines(self) -> list[str]:
        """The summary for someone who was not on call, one fact per line (Markdown)."""
        from whywait.engine.report.render import summary

        return summary(self.data)

    def write(self, folder: Path, keep: tuple[Path, ...] = ()) -> dict[str, Any]:
        """Write ``report.html``, ``report.md`` and the timeline PNGs into ``folder``; return their paths.

        ``keep``: files written by the same command (``--plot DIR/timeline-2.png``), never taken for stale pages.
        """
        import re

        from whywait.engine.report.render import html, markdown

        folder.mkdir(parents=True, exist_ok=True)
        pngs = self.timeline_pngs(folder)
        # A folder reused for a shorter report kept the pages of the longer one (timeline-3.png beside a report of
        # one page): the page files this writer names and did not write now are stale, and removed.  Nothing else.
        page = re.compile(r"timeline-[0-9]+\.png")
        for old in folder.iterdir():
            if page.fullmatch(old.name) and old not in pngs and old.is_file() and not old.is_symlink() \
                    and not any(old.resolve() == k.resolve() for k in keep):
                old.unlink()
        (folder / "report.md").write_text(markdown(self.data, [p.name for p in pngs]))
        (folder / "report.html").write_text(html(self.data, [p.read_bytes() for p in pngs]))
        return {"html": folder / "report.html", "md": folder / "report.md", "pngs": pngs}
