"""The postmortem's figures: matplotlib, real UTC timestamps, incident labels that never overlap.

Called by :class:`whywait.engine.report.Report`.  :func:`timeline_figure` draws, on one shared UTC
axis: each job's own work per step per rank (compute plus input wait; its step time when it reports
no phases) with the straggler ranks highlighted, the job's data/compute/communication split, and for
every incident its culprit's evidence against the median of its peers, with the incidents shaded and
labelled.  Labels are placed by measuring their rendered boxes (:func:`place_labels`), so three
incidents close together stack instead of printing over each other.

Many incidents go on several pages of :data:`PAGE_INCIDENTS` each (:func:`pages`), every page on the
same UTC axis.  One figure for all of them grew with three panels an incident: 120 incidents drew a
12 MB PNG of 360 panels in 223 s (label placement and layout grow faster than the panels), which no
one could read and the HTML inlined whole.
"""

from __future__ import annotations

import math
import statistics
from datetime import datetime, timezone
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from whywait.engine.report import ReportData

COLORS = ["tab:orange", "tab:purple", "tab:green", "tab:brown", "tab:pink", "tab:olive", "tab:cyan"]


def _utc(ts: list[float]) -> list[datetime]:
    return [datetime.fromtimestamp(t, timezone.utc) for t in ts]


def _nanmedian(vals: list[float]) -> float:
    v = [x for x in vals if not math.isnan(x)]
    return statistics.median(v) if v else math.nan


PAGE_INCIDENTS = 8
PAGE_JOBS = 8  # step panels drawn for a window without incidents: its largest jobs (a cluster may run hundreds)


def jobs_on(data: ReportData, incidents: list[Any]) -> tuple[list[str], int]:
    """The jobs whose step panels a page draws, and how many jobs there were to choose from.

    A page with incidents draws their jobs (so each page reads on its own); a window without incidents
    draws its :data:`PAGE_JOBS` largest jobs by ranks, not every job of the cluster.
    """
    if data.incidents:
        jobs = list(dict.fromkeys(inc.job for _, inc in incidents if inc.job and inc.job in data.jobs))
        return jobs, len(jobs)
    ranks: dict[str, int] = {}
    for e in data.sampler.entities("step.duration_s"):
        job = e.rsplit(":", 1)[0]
        ranks[job] = ranks.get(job, 0) + 1
    jobs = sorted(data.jobs, key=lambda j: (-ranks.get(j, 0), j))
    return jobs[:PAGE_JOBS], len(jobs)


def pages(data: ReportData) -> int:
    """How many timeline figures the report draws: one per :data:`PAGE_INCIDENTS` incidents, at least one."""
    return max(1, math.ceil(len(data.incidents) / PAGE_INCIDENTS))


def timeline_figure(data: ReportData, page: int = 0) -> tuple[Any, list[Any]]:
    """Build timeline figure ``page`` (not saved); return it and its incident label artists.

    Page 0 holds the first :data:`PAGE_INCIDENTS` incidents, each later page the next ones: the step panels
    of their jobs (:func:`jobs_on`), then each incident's evidence.  Every page spans the same UTC window,
    and shades and labels its own incidents (numbered as in the report).
    """
    import matplotlib.dates as mdates

    from whywait.plotting import pyplot

    plt = pyplot()

    times = _utc(data.grid.times())
    first = page * PAGE_INCIDENTS
    mine = list(enumerate(data.incidents))[first:first + PAGE_INCIDENTS]
    panels: list[tuple[str, Any]] = []
    jobs, n_jobs = jobs_on(data, mine)
    for job in jobs:
        panels.append(("steps", job))
        if any(data.split(job).values()):
            panels.append(("split", job))
    for k, inc in mine:
        for metric, entity in inc.evidence_series:
            panels.append(("evidence", (k, metric, entity)))
    panels = panels or [("empty", None)]
    fig, axes = plt.subplots(len(panels), 1, figsize=(12, 1.2 + 2.3 * len(panels)), sharex=True, squeeze=False)
    for ax_row, (kind, what) in zip(axes, panels, strict=True):
        ax = ax_row[0]
        if kind == "steps":
            _steps_panel(ax, data, what, times)
        elif kind == "split":
            split = data.split(what)
            # A step longer than a bucket holds its split over the buckets it spanned (as the step panel does);
            # buckets no step spanned, or where a phase was not reported, are left out, not drawn as 0.
            src = spanned(data.grid.times(), data.job_step(what), data.grid.width)
            split = {k: [math.nan if j is None else v[j] for j in src] for k, v in split.items()}
            keep = [i for i in range(len(times)) if not any(math.isnan(split[k][i]) for k in split)]
            ys = [[split[k][i] for i in keep] for k in split]
            ax.stackplot([times[i] for i in keep], *ys, labels=[f"{k} (median rank)" for k in split],
                         colors=["tab:blue", "tab:green", "tab:red"][:len(ys)], alpha=0.7)
            ax.set_ylabel(f"{what}\nstep split (s)", fontsize=8)
            ax.legend(loc="upper left", fontsize=7, ncols=3)
        elif kind == "evidence":
            k, metric, entity = what
            culprit = data.sampler.means(metric, entity) or []
            peers = [data.sampler.means(metric, e) or [] for e in data.sampler.entities(metric) if e != entity]
            col = COLORS[k % len(COLORS)]
            if culprit:
                _line(ax, times, culprit, color="tab:red", lw=1.3, label=f"{entity} (culprit)")
            if peers:
                med = [_nanmedian(list(col_)) for col_ in zip(*peers, strict=True)]
                _line(ax, times, med, color="tab:gray", lw=1, label=f"median of {len(peers)} peers")
            ax.set_ylabel(f"#{k + 1} {metric}", fontsize=8, color=col)
            ax.legend(loc="upper left", fontsize=7)
        else:
            ax.text(0.5, 0.5, "no data in the window", ha="center", va="center", transform=ax.transAxes)
        ax.grid(alpha=0.3)
    for k, inc in mine:
        a, b = _utc([inc.start, inc.end])
        for row in axes:
            row[0].axvspan(a, b, color=COLORS[k % len(COLORS)], alpha=0.15)
    last = axes[-1][0]
    last.xaxis.set_major_formatter(mdates.DateFormatter("%H:%M:%S", tz=timezone.utc))
    day = datetime.fromtimestamp(data.window.since, timezone.utc).strftime("%Y-%m-%d")
    of = pages(data)
    which = f" · incidents #{mine[0][0] + 1}–#{mine[-1][0] + 1} of {len(data.incidents)}" if of > 1 and mine else ""
    if not data.incidents and n_jobs > len(jobs):
        which += f" · the {len(jobs)} largest of {n_jobs} jobs"
    last.set_xlabel(f"UTC, {day} (event time){which}")
    last.set_xlim(times[0], times[-1]) if times else None
    fig.tight_layout()
    labels = [(f"#{k + 1} {inc.rule_id}: {inc.culprit}", inc.start, COLORS[k % len(COLORS)]) for k, inc in mine]
    return fig, place_labels(fig, axes[0][0], labels)


def spanned(centres: list[float], durations: list[float], width: float) -> list[int | None]:
    """For each bucket, the bucket whose step spanned it (itself when a step ended in it); None where none ran.

    Called for the step panels.  A bucket holds the steps that *ended* in it, so a 12 s step in 2 s buckets
    left the five buckets before its end empty, and a line drawn through the points made it a ramp that
    began at the previous step: as if the job had slowed gradually.  With this the step is drawn as what
    it was, 12 s long over its own 12 s.  A bucket no step spanned (before the job's first step, or while
    it hung) keeps None: a gap in the line.  ``durations`` are step times per bucket (NaN: none ended).
    """
    out: list[int | None] = [None] * len(durations)
    nxt: int | None = None  # the next bucket in which a step ended
    for i in range(len(durations) - 1, -1, -1):
        if not math.isnan(durations[i]):
            out[i] = nxt = i
        elif nxt is not None and centres[nxt] - durations[nxt] < centres[i] + width / 2:
            out[i] = nxt
        else:
            nxt = None  # a bucket no step spanned: the ones before it are not spanned by a later step either
    return out


def covered(centres: list[float], durations: list[float], width: float) -> list[float]:
    """Each bucket's step time, a step's also over the buckets it spanned (:func:`spanned`); NaN where none ran."""
    return [math.nan if j is None else durations[j] for j in spanned(centres, durations, width)]


def rank_work(sampler: Any, rank: str, centres: list[float], width: float) -> tuple[list[float], bool]:
    """One rank's series for the step panel, bucket by bucket over the time each step ran (:func:`covered`):
    its own work per step (compute plus input wait) when the job reports phases, else its step time; and
    whether it is the work.

    Called by the step panel.  Why the work: in a synchronous job every rank's step takes as long as the
    slowest (all leave the collective together), so the straggler's step time is everyone's and the panel
    drew it on top of the others; its own work is what stands out (what the straggler rules compare).
    """
    durations = sampler.means("step.duration_s", rank) or []
    compute = sampler.means("step.compute_s", rank)
    if compute is None or len(compute) != len(durations):
        return covered(centres, durations, width), False
    waits = sampler.means("step.data_wait_s", rank) or [math.nan] * len(compute)
    work = [c + (0.0 if math.isnan(w) else w) for c, w in zip(compute, waits, strict=True)]
    return [math.nan if j is None else work[j] for j in spanned(centres, durations, width)], True


def _steps_panel(ax: Any, data: ReportData, job: str, times: list[datetime]) -> None:
    ranks = data.sampler.entities("step.duration_s")
    ranks = [r for r in ranks if r.rsplit(":", 1)[0] == job]
    slow = data.straggler_ranks.get(job, set())
    centres, width = data.grid.times(), data.grid.width
    got = {r: rank_work(data.sampler, r, centres, width) for r in ranks}
    # The work only when every rank has it: a mix would compare one rank's work with another's step time.
    as_work = bool(got) and all(w for _, w in got.values())
    series = {r: s if as_work else covered(centres, data.sampler.means("step.duration_s", r) or [], width)
              for r, (s, _) in got.items()}
    series = {r: s for r, s in series.items() if len(s) == len(times)}
    others = [s for r, s in series.items() if int(r.rsplit(":", 1)[1]) not in slow]
    # "steps-mid": a bucket's value holds over the whole bucket, so a long step is a plateau and a gap a gap
    if others:
        cols = list(zip(*others, strict=True))
        lo = [_q(c, 0.1) for c in cols]
        hi = [_q(c, 0.9) for c in cols]
        ax.fill_between(times, lo, hi, step="mid", color="tab:blue", alpha=0.2, lw=0, label="other ranks, p10-p90")
        ax.plot(times, [_nanmedian(list(c)) for c in cols], drawstyle="steps-mid", color="tab:blue", lw=1,
                label="other ranks, median")
    shown = sorted(slow)[:8]
    for r in shown:
        s = series.get(f"{job}:{r}")
        if s:
            name = f"rank{'s' if len(slow) > 1 else ''} {', '.join(map(str, shown))}{' …' if len(slow) > 8 else ''}"
            ax.plot(times, s, drawstyle="steps-mid", color="tab:red", lw=1.2,
                    label=f"{name} (straggler)" if r == shown[0] else None)
    ax.set_ylabel(f"{job}\nown work per step (s)" if as_work else f"{job}\nstep time (s)", fontsize=8)
    if ax.get_legend_handles_labels()[0]:
        ax.legend(loc="upper left", fontsize=7)
    else:  # a job known from its placement or a diagnosis that sent no step timings in the window (hung, or off)
        ax.text(0.5, 0.5, "no step timings in the window", ha="center", va="center", transform=ax.transAxes)


def _line(ax: Any, times: list[datetime], ys: list[float], **kw: Any) -> None:
    """Plot the points that have a value, joined across empty buckets (evidence series; steps use :func:`covered`).

    Drawn as gaps, a sparse series (a job with 30 s steps reports ``job.comm_s`` twice a minute) would be
    isolated points with no line at all.
    """
    pts = [(t, y) for t, y in zip(times, ys, strict=True) if not math.isnan(y)]
    if pts:
        ax.plot([p[0] for p in pts], [p[1] for p in pts], **kw)


def _q(col: tuple[float, ...], q: float) -> float:
    v = sorted(x for x in col if not math.isnan(x))
    if not v:
        return math.nan
    return v[min(len(v) - 1, int(q * len(v)))]


def place_labels(fig: Any, ax: Any, labels: list[tuple[str, float, str]]) -> list[Any]:
    """Put each ``(text, event time, colour)`` label above ``ax`` at its time, stacking rows to avoid overlap.

    Each label is drawn, its window extent measured with the figure's renderer, and moved up one
    row while it intersects a label already placed.  Returns the text artists; the figure's top
    margin grows to fit the rows used.
    """
    fig.canvas.draw()
    renderer = fig.canvas.get_renderer()
    placed: list[Any] = []
    boxes: list[Any] = []
    row_pt = 7 * 1.35  # a 7-pt label's height, with spacing, in points
    x0, x1 = ax.get_xlim()
    rows_used = 0
    for text, t, color in sorted(labels, key=lambda x: x[1]):
        x = datetime.fromtimestamp(t, timezone.utc)
        import matplotlib.dates as mdates

        right = mdates.date2num(x) > x0 + 0.6 * (x1 - x0)  # late labels grow leftwards, inside the figure
        row = 0
        while True:
            art = ax.annotate(text, xy=(x, 1.0), xycoords=("data", "axes fraction"), xytext=(0, 3 + row * row_pt),
                              textcoords="offset points", fontsize=7, color=color, va="bottom",
                              ha="right" if right else "left", annotation_clip=False)
            bb = art.get_window_extent(renderer).expanded(1.02, 1.1)
            if not any(bb.overlaps(o) for o in boxes):
                break
            art.remove()
            row += 1
        boxes.append(bb)
        placed.append(art)
        rows_used = max(rows_used, row + 1)
    if rows_used:
        top_px = fig.get_figheight() * fig.dpi
        needed = (12 + rows_used * row_pt * fig.dpi / 72) / top_px
        fig.subplots_adjust(top=min(fig.subplotpars.top, 1.0 - needed))
    return placed
