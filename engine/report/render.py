"""The report as text: the summary, the Markdown file and the self-contained HTML file.

Called by :class:`whywait.engine.report.Report`.  Both files tell the same story in the same order:
summary, timeline, each incident (when it fired, changed and resolved; evidence; path;
other jobs on the same switch or pool; what was checked and found clean), and what the
replay skipped.  The HTML inlines its PNG and CSS, so it opens offline and can be mailed.
"""

from __future__ import annotations

import base64
import html as _html
from typing import TYPE_CHECKING, Sequence

if TYPE_CHECKING:
    from whywait.engine.report import IncidentView, ReportData


def _utc(t: float) -> str:
    from whywait.engine.report import utc

    return utc(t)


def _cost(v: IncidentView) -> str:
    c = v.cost
    if not c or c.get("gpu_hours_lost") is None:
        return "cost unknown (no step times for the job before and during the incident)"
    parts = [f"{c['gpu_hours_lost']:.2f} GPU-hours lost"]
    if c.get("slowdown_pct") is not None:
        parts.append(_slowdown(float(c["slowdown_pct"])))
    if c.get("step_s") is not None and c.get("whatif_step_s") is not None:
        parts.append(f"{c['step_s']:.3g} s per step instead of {c['whatif_step_s']:.3g} s")
    text = ", ".join(parts) + ("" if v.cost_source == "rule" else f" ({v.cost_source})")
    if v.shared_with and v.counted is not None:
        others = ", ".join(f"#{n}" for n in v.shared_with)
        text += (f"; {v.counted:.2f} of it counted in the total: {others} of the same job overlapped it, and the "
                 "job's time lost then is counted once, shared among them")
    return text


def _slowdown(pct: float) -> str:
    """``steps 45% slower``; never "-1% slower" or "0% slower" (a figure at or below zero, or rounding to it)."""
    if pct >= 0.5:
        return f"steps {pct:.0f}% slower"
    if pct > 0:
        return "steps under 1% slower"
    if pct > -0.5:
        return "steps no slower"
    return f"steps no slower ({-pct:.0f}% faster)"


def summary(data: ReportData) -> list[str]:
    """One line per incident, then the totals: what was slow, when, why, what it cost, who owns it."""
    w = data.window
    cut = [f"**Interrupted** (Ctrl-C) {_interrupted(data)}: this report covers only part of the window "
           f"({_utc(w.since)} – {_utc(w.until)}), and its costs stop where the reading did."
           ] if data.interrupted else []
    if not data.incidents:
        until = data.read_to if data.interrupted and data.read_to is not None else w.until
        return [*cut, f"No incident between {_utc(w.since)} and {_utc(max(until, w.since))}: every rule stayed quiet "
                      f"over {data.messages:,} messages."]
    out = cut
    for v in data.incidents:
        ranks = f", rank{'s' if len(v.ranks) > 1 else ''} {_ranks(v.ranks)}" if v.ranks else ""
        state = f"until {_utc(v.end)}" if v.resolved else f"still going at {_utc(v.end)} (when the data read ended)"
        out.append(f"#{v.number} **{v.job or v.culprit}** was slowed from {_utc(v.start)} {state}: "
                   f"{v.cause} Where: {v.culprit}{ranks}. Cost: {_cost(v)}. "
                   f"Owner: {v.owner}{' ' + v.channel if v.channel else ''}.")
    lost = sum(v.counted or 0.0 for v in data.incidents)
    own = sum(float((v.cost or {}).get("gpu_hours_lost") or 0.0) for v in data.incidents)
    shared = any(v.shared_with for v in data.incidents)
    out.append(f"In all: {len(data.incidents)} incident(s), {lost:.2f} GPU-hours lost"
               + (f" (costs shared: incidents of one job overlapped, and the job's time lost then is counted once; "
                  f"their own figures add up to {own:.2f})" if shared else "") + ".")
    return out


def _interrupted(data: ReportData) -> str:
    """``after 71,254 messages, at event time 2026-12-04 16:01:04 UTC``: where an interrupted replay stopped."""
    if not data.messages or data.read_to is None:
        return "before any message was read"
    return f"after {data.messages:,} messages, at event time {_utc(data.read_to)}"


def _ranks(ranks: tuple[int, ...]) -> str:
    if not ranks:
        return ""
    if list(ranks) == list(range(ranks[0], ranks[0] + len(ranks))) and len(ranks) > 2:
        return f"{ranks[0]}–{ranks[-1]}"
    return ", ".join(map(str, ranks[:16])) + (" …" if len(ranks) > 16 else "")


def _incident_md(v: IncidentView) -> list[str]:
    out = [f"### #{v.number} {v.title}", "",
           f"- **Rule:** `{v.rule_id}` ({v.severity})",
           f"- **Began:** {_utc(v.start)}; **fired:** {_utc(v.fired_at)}; "
           + (f"**resolved:** {_utc(v.end)}" if v.resolved else f"**still firing** at {_utc(v.end)}")]
    for t, what in v.changes:
        out.append(f"- **Changed** at {_utc(t)}: {what}")
    out.append(f"- **Slack thread:** {v.slack_link}" if v.slack_link else "- **Slack thread:** not posted live "
               "(or the notifier's record of it has expired)")
    out += [f"- **Cause:** {v.cause}",
            f"- **Culprit:** {v.culprit}" + (f", rank{'s' if len(v.ranks) > 1 else ''} {_ranks(v.ranks)}"
                                              if v.ranks else ""),
            f"- **Cost:** {_cost(v)}",
            f"- **Owner:** {v.owner}" + (f", {v.channel}" if v.channel else ""),
            f"- **Topology path:** {' → '.join(v.path) or 'unknown'}",
            "- **Other jobs on the same switch or storage pool:** " + ("; ".join(v.neighbours) or "none"),
            "- **Checked and found clean:** " + ("; ".join(v.clean) or "nothing checked by this rule")]
    if v.next_step:
        out.append(f"- **Next step:** {v.next_step}")
    def fig(x: float | None, unit: str = "") -> str:
        return "" if x is None else f"{x:.4g}{' ' + unit if unit else ''}"

    if not v.evidence_last or v.last_at is None:
        out += ["", "| evidence | entity | value | baseline | threshold |", "|---|---|---|---|---|"]
        for e in v.evidence:
            out.append(f"| `{e['metric']}` | {e['entity']} | {fig(e['value'], e['unit'])} | {fig(e['baseline'])} "
                       f"| {e['threshold']} |")
        return out + [""]
    # The cost above is the last update's: show the figures then beside those it fired on.
    then = {"resolved": f"at its resolution ({_hms(v.last_at)})", "data-end": f"when the data ended ({_hms(v.end)})"
            }.get(v.last_status, f"at its last update ({_hms(v.last_at)})")
    out += ["", f"| evidence | entity | when it fired ({_hms(v.fired_at)}) | baseline | {then} "
            "| baseline | threshold |", "|---|---|---|---|---|---|---|"]
    for e in v.evidence:
        end = v.evidence_last.get((e["metric"], e["entity"]), {})
        out.append(f"| `{e['metric']}` | {e['entity']} | {fig(e['value'], e['unit'])} | {fig(e['baseline'])} "
                   f"| {fig(end.get('value'), e['unit'])} | {fig(end.get('baseline'))} | {e['threshold']} |")
    return out + [""]


def _hms(t: float) -> str:
    """A time of day in UTC (the report's window says the date)."""
    from datetime import datetime, timezone

    return datetime.fromtimestamp(t, timezone.utc).strftime("%H:%M:%S UTC")


def markdown(data: ReportData, png_names: str | Sequence[str]) -> str:
    """The report as Markdown, referring to the timeline PNGs next to it (one name, or each page's in order)."""
    from whywait.engine.report.plots import PAGE_INCIDENTS

    names = [png_names] if isinstance(png_names, str) else list(png_names)
    w = data.window
    out = [f"# Postmortem: {', '.join(data.jobs) or 'the cluster'}, {_utc(w.since)} – {_utc(w.until)}"
           + (" (interrupted: partial)" if data.interrupted else ""), "",
           "## Summary", ""]
    out += [f"- {line}" for line in summary(data)]
    out += ["", "## Timeline (UTC)", ""]
    n = len(data.incidents)
    for page, name in enumerate(names):
        if len(names) > 1:
            a, b = page * PAGE_INCIDENTS + 1, min(n, (page + 1) * PAGE_INCIDENTS)
            out += [f"Incidents #{a}–#{b}: their jobs' steps and their evidence:", ""]
        out += [f"![timeline]({name})", ""]
    if data.incidents:
        out += ["## Incidents", ""]
        for v in data.incidents:
            out += _incident_md(v)
    out += ["## What the replay read", "", f"- {data.messages:,} messages"]
    if data.interrupted:
        out.append(f"- **interrupted** (Ctrl-C) {_interrupted(data)}: the rest of the window, to {_utc(w.until)}, "
                   "was not read")
    out += [f"- skipped {n}: {why}" for why, n in sorted(data.skipped.items())] or ["- nothing skipped"]
    return "\n".join(out) + "\n"


_CSS = """body{font-family:system-ui,sans-serif;max-width:1100px;margin:2em auto;color:#222}
h1{font-size:1.4em}h2{border-bottom:1px solid #ccc}table{border-collapse:collapse}
td,th{border:1px solid #ccc;padding:2px 6px;font-size:.9em}code{background:#f3f3f3}img{max-width:100%}"""


def html(data: ReportData, pngs: bytes | Sequence[bytes]) -> str:
    """The report as one HTML file with the timeline PNGs inlined (opens offline)."""
    import re

    pngs = [pngs] if isinstance(pngs, bytes) else list(pngs)
    md = markdown(data, [f"timeline-{i + 1}.png" for i in range(len(pngs))])
    imgs = iter("data:image/png;base64," + base64.b64encode(p).decode() for p in pngs)
    body: list[str] = []
    table: list[str] = []

    def inline(s: str) -> str:
        s = _html.escape(s)
        s = re.sub(r"\*\*(.+?)\*\*", r"<b>\1</b>", s)
        s = re.sub(r"(https://[^\s<]+)", r'<a href="\1">\1</a>', s)
        return re.sub(r"`(.+?)`", r"<code>\1</code>", s)

    def flush_table() -> None:
        if table:
            rows = [r.strip("|").split("|") for r in table if not set(r) <= set("|-")]
            body.append("<table>" + "".join(
                "<tr>" + "".join(f"<{'th' if i == 0 else 'td'}>{inline(c.strip())}</{'th' if i == 0 else 'td'}>"
                                 for c in r) + "</tr>" for i, r in enumerate(rows)) + "</table>")
            table.clear()

    for line in md.splitlines():
        if line.startswith("|"):
            table.append(line)
            continue
        flush_table()
        if line.startswith("!["):
            body.append(f'<img alt="timeline" src="{next(imgs)}">')
        elif line.startswith("#"):
            level = len(line) - len(line.lstrip("#"))
            body.append(f"<h{level}>{inline(line[level:].strip())}</h{level}>")
        elif line.startswith("- "):
            body.append(f"<li>{inline(line[2:])}</li>")
        elif line:
            body.append(f"<p>{inline(line)}</p>")
    flush_table()
    title = _html.escape(md.splitlines()[0].lstrip("# "))
    return (f"<!doctype html><html><head><meta charset=utf-8><title>{title}</title><style>{_CSS}</style></head>"
            "<body>\n" + "\n".join(body) + "\n</body></html>\n")
