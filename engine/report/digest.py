"""The useful-GPU-time digest: per project and job, GPU-hours used and GPU-hours lost to waiting, by cause.

Called by ``whywait digest``, which feeds it the placements, step timings and diagnoses of
a period (usually a week).  GPU availability is not GPU productivity: a job that holds 128
GPUs for a week "uses" 21,504 GPU-hours whatever it does; the digest shows how many of
those went to waiting, and on what.

- **Used:** the GPUs a job holds (its placement; a fractional ``gpu_share`` counts as
  such) × the time it reported steps (each step's duration, so gaps where the job was
  down are not counted).
- **Lost:** per incident, the diagnosis's ``cost.gpu_hours_lost`` when the rule gave one
  (the last update's, which covers the whole incident); otherwise estimated from the job's
  step times: median during the incident against the median in the 15 minutes before it.
  Only the part of it inside the period counts, and incidents of one job that overlap count
  the job's lost time once (``whywait.engine.report.costs``), as the replay's report does.
- **Cause:** the rule's domain (``network.*``, ``storage.*``, ...), see :data:`CAUSES`, or the rule's own
  (:data:`RULE_CAUSES`: a whole-job slowdown is no straggler).

Pure: no Kafka, no Slack.  Memory is per job (one median per minute of the period).
"""

from __future__ import annotations

import statistics
from collections import Counter, defaultdict
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from whywait.engine.notify.format import SECTION_LIMIT, truncate

# Rule-id prefix -> the cause the digest reports.  Only the straggler rules themselves are "stragglers of unknown
# cause" (they name a slow rank no hardware rule explains); the job's other symptoms are causes of their own, since
# a slowdown of the whole job is by definition no straggler.  A prefix not listed (a site's own rules) is "other".
CAUSES: dict[str, str] = {
    "network": "network", "topology": "network", "storage": "storage", "data": "input pipeline",
    "checkpoint": "checkpoints", "gpu": "GPU health", "hardware": "hardware faults", "contention": "contention",
    "straggler": "stragglers of unknown cause",
}
# Rule ids whose cause is not their domain's.
RULE_CAUSES: dict[str, str] = {
    "job.straggler": "stragglers of unknown cause", "job.rotating-straggler": "stragglers of unknown cause",
    "job.slow-since-start": "ranks slower since the start",
    "job.whole-job-slow": "whole job slower, no straggler", "job.stage-imbalance": "pipeline stage imbalance",
    "job.periodic-slowdown": "periodic slowdowns", "job.rank-silent": "silent or hung ranks",
    "job.node-clock-skew": "clock skew", "job.node-down": "nodes down",
    "job.node-unseen": "nodes whywait could not see", "job.stalled": "whole job stalled",
}
UNKNOWN = "stragglers of unknown cause"
OTHER = "other causes"
_LEAD_S = 900.0
# A week of a real cluster holds hundreds of jobs per project (sweeps, evaluations, short runs).  Slack takes at
# most 50 blocks and 3,000 characters a section per message, and refuses (``msg_blocks_too_long``) at about
# 13,000 characters in all; a chart of hundreds of bars is unreadable.  So each project shows its jobs that
# lost the most, and one line sums the rest; ``--json`` keeps every job.
TOP_JOBS = 10
TOP_BARS = 25


def cause_of(rule_id: str) -> str:
    """The digest's cause for a rule id: its own (:data:`RULE_CAUSES`), else its domain's, else "other causes"."""
    got = RULE_CAUSES.get(rule_id)
    if got is not None:
        return got
    domain = rule_id.split(".", 1)[0]
    if domain == "job":  # a job-level rule not listed: what the job shows, not a straggler unless it says so
        return UNKNOWN if "straggler" in rule_id else OTHER
    return CAUSES.get(domain, OTHER)


@dataclass
class JobUse:
    """One job's figures over the period."""

    job: str
    project: str = "?"
    team: str = "?"
    channel: str | None = None
    gpus: float = 0.0
    world: int = 0
    rank_seconds: dict[int, float] = field(default_factory=lambda: defaultdict(float))
    minute_steps: dict[int, list[float]] = field(default_factory=lambda: defaultdict(list))
    lost: dict[str, float] = field(default_factory=lambda: defaultdict(float))
    incidents: list[dict[str, Any]] = field(default_factory=list)

    @property
    def gpu_hours_used(self) -> float:
        """GPU-hours: each rank's share of a GPU × the time it spent in steps."""
        if not self.rank_seconds:
            return 0.0
        per_rank_gpu = self.gpus / self.world if self.world else 1.0  # no placement seen: a GPU per rank
        return sum(s * per_rank_gpu for s in self.rank_seconds.values()) / 3600.0


class Digest:
    """Accumulates a period's messages and diagnoses; renders rows, Block Kit and a bar chart."""

    def __init__(self, since: float, until: float, projects: frozenset[str] = frozenset()) -> None:
        self.since, self.until = since, until
        self.projects = projects  # only these projects' rows (all when empty): table, JSON, Block Kit, chart
        self.jobs: dict[str, JobUse] = {}
        self.last_diag: dict[str, dict[str, Any]] = {}  # fingerprint -> latest diagnosis (dict)
        self.skipped: Counter[str] = Counter()  # what the reader could not use, and why
        self.notes: list[str] = []  # what the reader wants said beside the table (a topic missing)

    def _job(self, job: str) -> JobUse:
        j = self.jobs.get(job)
        if j is None:
            j = self.jobs[job] = JobUse(job)
        return j

    def add(self, msg: dict[str, Any]) -> None:
        """Add one contract message (placements and steps count; the rest is ignored)."""
        if msg["kind"] == "placement":
            j = self._job(msg["job"])
            j.project, j.team, j.channel = msg["project"], msg["team"], msg.get("slack_channel")
            j.gpus = sum(float(r.get("gpu_share", 1.0)) for r in msg["ranks"])
            j.world = len(msg["ranks"])
        elif msg["kind"] == "steps" and self.since <= msg["time"] <= self.until:
            j = self._job(msg["job"])
            for s in msg["steps"]:
                j.rank_seconds[s["rank"]] += s["duration_s"]
                j.minute_steps[int(msg["time"] // 60)].append(s["duration_s"])

    def add_diagnosis(self, d: dict[str, Any]) -> None:
        """Add one diagnosis as published on the diagnoses topic (firing or resolved).

        Raises :class:`~whywait.engine.diagnosis.DiagnosisFormatError` (a ``ValueError``) for a dict that
        is not a diagnosis, here rather than in :meth:`finish`, where one bad record would end the digest.
        """
        from whywait.engine.diagnosis import Diagnosis

        d = Diagnosis.from_dict(d).to_dict()
        if not (self.since - 86400 <= d["detected_at"] <= self.until):
            return
        self.last_diag[d["fingerprint"]] = d

    def finish(self) -> None:
        """Attribute each incident's loss in the period to its job and cause; called once, after every add.

        Only incidents that overlap ``[since, until]`` count, and only the part of their loss that lies in it
        (one that ended the day before the period counts nothing).  Each incident's own figure (the rule's,
        else estimated from step times) is kept in ``gpu_hours_lost``; the job's loss counts overlapping
        incidents of one job once (``whywait.engine.report.costs``: the job was slowed once, not once per
        rule that saw it), and ``gpu_hours_counted`` is each incident's share of that in the period.
        """
        from whywait.engine.report.costs import Loss, counted_losses, loss_span

        costed: list[tuple[JobUse, dict[str, Any]]] = []
        spans: dict[int, tuple[float, float]] = {}  # id(incident) -> where its loss lies
        for d in sorted(self.last_diag.values(), key=lambda d: (d["starts_at"], d["fingerprint"])):
            if not d.get("job"):
                continue
            end = d.get("ends_at") or self.until
            if end < self.since or d["starts_at"] > self.until:
                continue  # not in the period at all
            j = self._job(d["job"])
            inc = {"rule_id": d["rule_id"], "cause": cause_of(d["rule_id"]), "culprit": d.get("culprit"),
                   "title": d.get("title", ""), "starts_at": d["starts_at"], "ends_at": end, "gpu_hours_lost": None,
                   "gpu_hours_counted": None, "how": "rule"}
            j.incidents.append(inc)
            spans[id(inc)] = loss_span(d.get("cost"), d["starts_at"], end)  # where its loss lies, if the rule said
            if d.get("cost") and d["cost"].get("gpu_hours_lost") is not None:
                inc["gpu_hours_lost"] = float(d["cost"]["gpu_hours_lost"])
            else:
                frac = self._lost_fraction(j, d["starts_at"], end)
                inc["how"] = "estimated from step times" if frac is not None else "unknown"
                if frac is None:
                    continue
                inc["gpu_hours_lost"] = round(frac * (j.gpus or 1.0) * max(0.0, end - d["starts_at"]) / 3600.0, 4)
            costed.append((j, inc))
        counted = counted_losses([Loss(j.job, *spans[id(i)], i["gpu_hours_lost"]) for j, i in costed],
                                 self.since, self.until)
        for (j, inc), h in zip(costed, counted, strict=True):
            inc["gpu_hours_counted"] = round(h, 4)
            j.lost[inc["cause"]] += h
        for j in self.jobs.values():
            j.incidents.sort(key=lambda i: (-(i["gpu_hours_counted"] or 0.0), -(i["gpu_hours_lost"] or 0.0)))

    def _lost_fraction(self, j: JobUse, start: float, end: float) -> float | None:
        """``1 - before / during`` of the job's median step time; None without steps on both sides."""
        before = [v for m, vs in j.minute_steps.items() if start - _LEAD_S <= m * 60 < start for v in vs]
        during = [v for m, vs in j.minute_steps.items() if start <= m * 60 <= end for v in vs]
        if not before or not during:
            return None
        base, now = statistics.median(before), statistics.median(during)
        return max(0.0, 1.0 - base / now) if now > 0 else 0.0

    def rows(self) -> list[dict[str, Any]]:
        """Per project and job (of ``projects`` when given): GPU-hours used and lost by cause, biggest loss first."""
        out = []
        for j in self.jobs.values():
            if not j.rank_seconds and not j.lost:
                continue
            if self.projects and j.project not in self.projects:
                continue
            out.append({"project": j.project, "team": j.team, "channel": j.channel, "job": j.job,
                        "gpu_hours_used": round(j.gpu_hours_used, 3),
                        "gpu_hours_lost": round(sum(j.lost.values()), 3),
                        "lost_by_cause": {k: round(v, 3) for k, v in sorted(j.lost.items()) if v > 0},
                        "top_incidents": j.incidents[:3]})
        return sorted(out, key=lambda r: (r["project"], -r["gpu_hours_lost"], r["job"]))

    def projects_seen(self) -> list[str]:
        """Every project with a row in the period, whatever ``projects`` keeps: what a filter could name."""
        return sorted({j.project for j in self.jobs.values() if j.rank_seconds or j.lost})

    def blocks(self, project: str | None = None) -> list[dict[str, Any]]:
        """Slack Block Kit for the digest (one team's projects with ``project``)."""
        from datetime import datetime, timezone

        def day(t: float) -> str:
            return datetime.fromtimestamp(t, timezone.utc).strftime("%Y-%m-%d")

        rows = [r for r in self.rows() if project is None or r["project"] == project]
        blocks: list[dict[str, Any]] = [{"type": "header", "text": {"type": "plain_text", "text":
                                         f"Useful GPU time, {day(self.since)} – {day(self.until)}"}}]
        by_project: dict[str, list[dict[str, Any]]] = defaultdict(list)
        for r in rows:  # already by project, the biggest loss first
            by_project[r["project"]].append(r)
        for proj, prows in by_project.items():
            blocks += self._job_sections(prows[:TOP_JOBS], day)
            rest = prows[TOP_JOBS:]
            if rest:
                used, lost = sum(r["gpu_hours_used"] for r in rest), sum(r["gpu_hours_lost"] for r in rest)
                blocks.append({"type": "context", "elements": [{"type": "mrkdwn", "text": truncate(
                    f"…and {len(rest)} more job(s) of {proj}: {used:,.1f} GPU-hours used, {lost:,.1f} lost "
                    f"(`whywait digest --project {proj} --json FILE` lists every one)", SECTION_LIMIT)}]})
        if not rows:
            blocks.append({"type": "section", "text": {"type": "mrkdwn", "text": "No job reported steps."}})
        return blocks

    @staticmethod
    def _job_sections(rows: list[dict[str, Any]], day: Any) -> list[dict[str, Any]]:
        blocks: list[dict[str, Any]] = []
        for r in rows:
            used, lost = r["gpu_hours_used"], r["gpu_hours_lost"]
            pct = f" ({100 * lost / used:.1f}% of it)" if used > 0 else ""
            causes = ", ".join(f"{c} {v:.1f}" for c, v in sorted(r["lost_by_cause"].items(), key=lambda x: -x[1]))
            text = (f"*{r['project']} / {r['job']}*: {used:,.1f} GPU-hours used, *{lost:,.1f} lost to waiting*{pct}"
                    + (f"\nby cause: {causes}" if causes else ""))
            for i in r["top_incidents"]:
                g, c = i["gpu_hours_lost"], i.get("gpu_hours_counted")
                text += (f"\n• {day(i['starts_at'])} {i['rule_id']} on {i['culprit'] or r['job']}: "
                         + ("cost unknown" if g is None else f"{g:.2f} GPU-h" if c is None or abs(c - g) < 0.005
                            else f"{c:.2f} GPU-h counted ({g:.2f} by itself: shared with overlapping incidents "
                                 "or partly outside the period)"))
            # a long job name or culprit list: cut, never refused
            blocks.append({"type": "section", "text": {"type": "mrkdwn", "text": truncate(text, SECTION_LIMIT)}})
        return blocks

    def plot(self, path: Path) -> Path:
        """A horizontal bar chart: per job, GPU-hours used (productive) and lost by cause, stacked."""
        from whywait.plotting import pyplot

        plt = pyplot()

        rows = sorted(self.rows(), key=lambda r: -r["gpu_hours_lost"])
        if len(rows) > TOP_BARS:  # the jobs that lost the most, and one bar for the rest
            rest = rows[TOP_BARS - 1:]
            lost_by: Counter[str] = Counter()
            for r in rest:
                lost_by.update(r["lost_by_cause"])
            rows = rows[:TOP_BARS - 1] + [{
                "project": f"{len(rest)} other jobs", "job": "together",
                "gpu_hours_used": sum(r["gpu_hours_used"] for r in rest),
                "gpu_hours_lost": sum(r["gpu_hours_lost"] for r in rest), "lost_by_cause": dict(lost_by)}]
        causes = sorted({c for r in rows for c in r["lost_by_cause"]})
        fig, ax = plt.subplots(figsize=(10, 1.5 + 0.5 * max(len(rows), 1)))
        # a long project or job name would squeeze the bars to nothing: cut, as Slack's sections are
        labels = [truncate(f"{r['project']} / {r['job']}", 48) for r in rows]
        left = [max(r["gpu_hours_used"] - r["gpu_hours_lost"], 0.0) for r in rows]
        ax.barh(labels, left, color="tab:green", label="productive")
        for k, c in enumerate(causes):
            vals = [r["lost_by_cause"].get(c, 0.0) for r in rows]
            ax.barh(labels, vals, left=left, label=f"lost: {c}", color=plt.cm.tab10((k + 1) % 10))
            left = [a + b for a, b in zip(left, vals, strict=True)]
        ax.set_xlabel("GPU-hours")
        ax.invert_yaxis()
        ax.legend(loc="lower right", fontsize=7)
        fig.tight_layout()
        fig.savefig(path, dpi=100)
        plt.close(fig)
        return path


def messages(blocks: list[dict[str, Any]], max_blocks: int = 50, max_chars: int = 12_000) -> list[list[dict[str, Any]]]:
    """Split ``blocks`` into Slack messages: at most ``max_blocks`` blocks and ``max_chars`` characters of text each.

    Called by ``whywait digest --post`` for each channel: the first message is posted, the others go into its
    thread.  A channel that several projects name gets every project's sections, which can pass the limits
    (50 blocks; about 13,000 characters, where Slack answers ``msg_blocks_too_long``) even with each project
    trimmed to :data:`TOP_JOBS`.
    """
    def size(b: dict[str, Any]) -> int:
        t = b.get("text")
        if isinstance(t, dict):
            return len(t.get("text", ""))
        return sum(len(e.get("text", "")) for e in b.get("elements", ()))

    out: list[list[dict[str, Any]]] = []
    cur: list[dict[str, Any]] = []
    chars = 0
    for b in blocks:
        n = size(b)
        if cur and (len(cur) >= max_blocks or chars + n > max_chars):
            out.append(cur)
            cur, chars = [], 0
        cur.append(b)
        chars += n
    if cur:
        out.append(cur)
    return out
