"""The report as text: the summary, the Markdown file and the self-contained HTML file.

Called by :class:`whywait.engine.report.Report`.  Both files tell the same story in the same order:
summary, timeline, each incident (when it fired, changed and resolved; evidence; path;
other jobs on the same switch or pool; what was checked and found clean), and what the
replay skipped.  The HTML inlines its PNG and CSS, so it opens offline and can be mailed.
"""

from __future__ import annotations

import base64
import html as _html
import re
from typing import TYPE_CHECKING, Any, Sequence

if TYPE_CHECKING:
    from whywait.engine.report import IncidentView, ReportData


def _utc(t: float) -> str:
    from whywait.engine.report import utc

    return utc(t)


# ---- Markdown escaping ------------------------------------------------------------------------------------------
# Names come from whoever runs a job (job, project, team, node names of an imported table): a `|` broke the evidence
# table, raw HTML reached the Markdown, and the HTML made code and bold of a name's backticks and asterisks.  Every
# name is written escaped (what CommonMark and GFM read literally); rule texts keep their own code spans.
_SPECIAL = frozenset("\\`*_[]<>|&~")
_NUL = "\x00"


def esc(s: object) -> str:
    """``s`` as literal Markdown text: its metacharacters backslash-escaped, on one line."""
    t = " ".join(str(s).replace(_NUL, "").splitlines())
    out = []
    for k, c in enumerate(t):
        if c == "_" and 0 < k < len(t) - 1 and t[k - 1].isalnum() and t[k + 1].isalnum():
            out.append(c)  # train_llm: an underscore inside a word emphasises nothing
        elif c in _SPECIAL:
            out.append("\\" + c)
        else:
            out.append(c)
    return "".join(out)


def md_text(s: str, names: Sequence[str] = ()) -> str:
    """A rule's rendered text (a title, a cause, a next step) as Markdown: literal, but for its own code spans.

    ``names`` (the incident's job, culprit, owner, entities) are what the rule put into the text: they are
    taken out before the code spans are found (a backtick in a job name must not open one), then written
    back escaped, or verbatim inside a code span (fenced with enough backticks to hold them).
    """
    t = " ".join(str(s).replace(_NUL, "").splitlines())
    found = sorted({n for n in names if n and _NUL not in n}, key=len, reverse=True)
    if found:
        t = re.sub("|".join(map(re.escape, found)), lambda m: f"{_NUL}{found.index(m.group(0))}{_NUL}", t)

    def back(part: str, raw: bool) -> str:
        pieces = re.split(f"{_NUL}([0-9]+){_NUL}", part)  # text, name number, text, ...
        return "".join((found[int(x)] if k % 2 else x) if raw else esc(found[int(x)] if k % 2 else x)
                       for k, x in enumerate(pieces))

    out = []
    for k, part in enumerate(re.split(r"`([^`]*)`", t)):
        if k % 2 == 0:
            out.append(back(part, False))
            continue
        code = back(part, True)
        fence = "`" * (max((len(r) for r in re.findall("`+", code)), default=0) + 1)
        pad = " " if "`" in code or code.startswith(" ") else ""
        out.append(f"{fence}{pad}{code}{pad}{fence}")
    return "".join(out)


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


# An incident that began this close to the first event time read may have been under way before it.
EARLY_S = 15.0
# A rank's own history the step rules compare it with (job.straggler's `history: 8`): fewer steps per rank and
# a quiet report says little of stragglers.
FEW_STEPS = 8


def too_little(job: str, counts: Sequence[int], world: int, bold: bool = True) -> str | None:
    """The note for a job whose quiet says little: fewer than :data:`FEW_STEPS` steps per rank (the median of
    ``counts``, the steps each reporting rank sent), or fewer than half of the ``world`` ranks its placement names
    reporting (a profiler trace of 2 of 128 ranks); None when neither.

    Called by the report (:func:`summary`) and by ``whywait replay``'s console lines, for a window with no incident.
    """
    if not counts:
        return None
    ns = sorted(counts)
    median = ns[len(ns) // 2]
    few = median < FEW_STEPS
    part = 0 < world and len(ns) < world / 2
    if not (few or part):
        return None
    what = []
    if few:
        what.append(f"{median} step{'s' if median != 1 else ''} per rank (a rank is compared with its peers on at "
                    f"least 5 aligned steps, and with {FEW_STEPS} of its own before them to tell a new straggler "
                    "from slower hardware)")
    if part:
        what.append(f"{len(ns)} of its {world} ranks reporting")
    name = f"**{esc(job)}**" if bold else job
    return f"Too little to judge {name}: {' and '.join(what)}, so its quiet says little of stragglers."


def _too_little(data: ReportData) -> list[str]:
    """What a quiet report could not judge (:func:`too_little`), job by job."""
    counts = getattr(data.sampler, "step_counts", {})
    per_job: dict[str, list[int]] = {}
    for rank, n in counts.items():
        per_job.setdefault(rank.rsplit(":", 1)[0], []).append(n)
    out = []
    for job in sorted(per_job):
        placed = data.sampler.placements.get(job) or {}
        note = too_little(job, per_job[job], len(placed.get("ranks") or ()))
        if note:
            out.append(note)
    return out


def summary(data: ReportData) -> list[str]:
    """One line per incident, then the totals: what was slow, when, why, what it cost, who owns it."""
    w = data.window
    cut = [f"**Interrupted** (Ctrl-C) {_interrupted(data)}: this report covers only part of the window "
           f"({_utc(w.since)} – {_utc(w.until)}), and its costs stop where the reading did."
           ] if data.interrupted else []
    if not data.incidents:
        until = data.read_to if data.interrupted and data.read_to is not None else w.until
        return [*cut, f"No incident between {_utc(w.since)} and {_utc(max(until, w.since))}: every rule stayed quiet "
                      f"over {data.messages:,} messages.", *_too_little(data)]
    out = cut
    for v in data.incidents:
        ranks = f", rank{'s' if len(v.ranks) > 1 else ''} {_ranks(v.ranks)}" if v.ranks else ""
        state = f"until {_utc(v.end)}" if v.resolved else f"still going at {_utc(v.end)} (when the data read ended)"
        # Held from the first seconds read: it may have begun before them (with --lead 0s, or a bundle cut there).
        early = (" It held from the first seconds read, so it may have begun before them: its start and its cost "
                 "begin there (a longer --lead reads further back)." if v.start - w.read_from < EARLY_S else "")
        out.append(f"#{v.number} **{esc(v.job or v.culprit)}** was slowed from {_utc(v.start)} {state}: "
                   f"{md_text(v.cause, v.names)} Where: {esc(v.culprit)}{ranks}. Cost: {_cost(v)}. "
                   f"Owner: {esc(v.owner)}{' ' + esc(v.channel) if v.channel else ''}.{early}")
    lost = sum(v.counted or 0.0 for v in data.incidents)
    own = sum(float((v.cost or {}).get("gpu_hours_lost") or 0.0) for v in data.incidents)
    # Said only when overlapping counted less: two incidents open together whose losses lay on different steps
    # (a stage imbalance, then a straggler) add up, and "costs shared ... add up to 0.40" beside 0.40 said nothing.
    shared = any(v.shared_with for v in data.incidents) and f"{own:.2f}" != f"{lost:.2f}"
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
    out = [f"### #{v.number} {md_text(v.title, v.names)}", "",
           f"- **Rule:** `{v.rule_id}` ({v.severity})",
           f"- **Began:** {_utc(v.start)}; **fired:** {_utc(v.fired_at)}; "
           + (f"**resolved:** {_utc(v.end)}" if v.resolved else f"**still firing** at {_utc(v.end)}")]
    for t, what in v.changes:
        out.append(f"- **Changed** at {_utc(t)}: {md_text(what, v.names)}")
    out.append(f"- **Slack thread:** {v.slack_link}" if v.slack_link else "- **Slack thread:** not posted live "
               "(or the notifier's record of it has expired)")
    out += [f"- **Cause:** {md_text(v.cause, v.names)}",
            f"- **Culprit:** {esc(v.culprit)}" + (f", rank{'s' if len(v.ranks) > 1 else ''} {_ranks(v.ranks)}"
                                                   if v.ranks else ""),
            f"- **Cost:** {_cost(v)}",
            f"- **Owner:** {esc(v.owner)}" + (f", {esc(v.channel)}" if v.channel else ""),
            f"- **Topology path:** {' → '.join(esc(p) for p in v.path) or 'unknown'}",
            "- **Other jobs on the same switch or storage pool:** " + ("; ".join(map(esc, v.neighbours)) or "none"),
            "- **Checked and found clean:** " + ("; ".join(md_text(c, v.names) for c in v.clean)
                                                 or "nothing checked by this rule")]
    if v.next_step:
        out.append(f"- **Next step:** {md_text(v.next_step, v.names)}")
    def fig(x: float | None, unit: str = "") -> str:
        return "" if x is None else f"{x:.4g}{' ' + esc(unit) if unit else ''}"

    if not v.evidence_last or v.last_at is None:
        out += ["", "| evidence | entity | value | baseline | threshold |", "|---|---|---|---|---|"]
        for e in v.evidence:
            out.append(f"| {_metric(e)} | {esc(e['entity'])} | {fig(e['value'], e['unit'])} "
                       f"| {fig(e['baseline'])} | {esc(e['threshold'] or '')} |")
        return out + [""]
    # The cost above is the last update's: show the figures then beside those it fired on.
    then = {"resolved": f"at its resolution ({_hms(v.last_at)})", "data-end": f"when the data ended ({_hms(v.end)})"
            }.get(v.last_status, f"at its last update ({_hms(v.last_at)})")
    out += ["", f"| evidence | entity | when it fired ({_hms(v.fired_at)}) | baseline | {then} "
            "| baseline | threshold |", "|---|---|---|---|---|---|---|"]
    for e in v.evidence:
        end = v.evidence_last.get((e["metric"], e["entity"]), {})
        out.append(f"| {_metric(e)} | {esc(e['entity'])} | {fig(e['value'], e['unit'])} "
                   f"| {fig(e['baseline'])} | {fig(end.get('value'), e['unit'])} | {fig(end.get('baseline'))} "
                   f"| {esc(e['threshold'] or '')} |")
    return out + [""]


def _metric(e: dict[str, Any]) -> str:
    """An evidence row's metric as code, for a table cell: a ``|`` there would end the cell (GFM), even in code."""
    return md_text("`" + str(e["metric"]).replace("|", "¦").replace("`", "'") + "`")


def _hms(t: float) -> str:
    """A time of day in UTC (the report's window says the date)."""
    from datetime import datetime, timezone

    return datetime.fromtimestamp(t, timezone.utc).strftime("%H:%M:%S UTC")


def markdown(data: ReportData, png_names: str | Sequence[str]) -> str:
    """The report as Markdown, referring to the timeline PNGs next to it (one name, or each page's in order)."""
    from whywait.engine.report.plots import PAGE_INCIDENTS

    names = [png_names] if isinstance(png_names, str) else list(png_names)
    w = data.window
    out = [f"# Postmortem: {', '.join(map(esc, data.jobs)) or 'the cluster'}, {_utc(w.since)} – {_utc(w.until)}"
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
    out += [f"- skipped {n}: {esc(why)}" for why, n in sorted(data.skipped.items())] or ["- nothing skipped"]
    return "\n".join(out) + "\n"


_CSS = """body{font-family:system-ui,sans-serif;max-width:1100px;margin:2em auto;color:#222}
h1{font-size:1.4em}h2{border-bottom:1px solid #ccc}table{border-collapse:collapse}
td,th{border:1px solid #ccc;padding:2px 6px;font-size:.9em}code{background:#f3f3f3}img{max-width:100%}"""


def _tokens(s: str) -> list[tuple[str, str]]:
    """The inline Markdown this report writes, read back: ("text", literal), ("code", literal), ("bold", "").

    Backslash escapes give their character (so a name is never read as Markdown), a code span is fenced by
    a run of backticks and closed by a run of the same length, ``**`` toggles bold (an unpaired last one is
    literal).  Used by the HTML file and the Slack post, which render the same Markdown.
    """
    out: list[tuple[str, str]] = []
    buf: list[str] = []

    def flush() -> None:
        if buf:
            out.append(("text", "".join(buf)))
            buf.clear()

    i, n = 0, len(s)
    while i < n:
        c = s[i]
        if c == "\\" and i + 1 < n and s[i + 1] in _PUNCT:
            buf.append(s[i + 1])
            i += 2
        elif c == "`":
            j = i
            while j < n and s[j] == "`":
                j += 1
            m = re.compile(f"(?<!`){'`' * (j - i)}(?!`)").search(s, j)
            if m is None:
                buf.append(s[i:j])
                i = j
                continue
            code = s[j:m.start()]
            if len(code) >= 2 and code[0] == code[-1] == " " and code.strip(" "):
                code = code[1:-1]
            flush()
            out.append(("code", code))
            i = m.end()
        elif s.startswith("**", i):
            flush()
            out.append(("bold", ""))
            i += 2
        else:
            buf.append(c)
            i += 1
    flush()
    bolds = [k for k, t in enumerate(out) if t[0] == "bold"]
    if len(bolds) % 2:
        out[bolds[-1]] = ("text", "**")
    return out


_PUNCT = frozenset("!\"#$%&'()*+,-./:;<=>?@[\\]^_`{|}~")


def _cells(row: str) -> list[str]:
    """A table row's cells: split at each ``|`` that is not backslash-escaped."""
    cells, cur, i = [], [], 0
    row = row.strip()
    row = row[1:] if row.startswith("|") else row
    while i < len(row):
        if row[i] == "\\" and i + 1 < len(row):
            cur.append(row[i:i + 2])
            i += 2
            continue
        if row[i] == "|":
            cells.append("".join(cur))
            cur = []
        else:
            cur.append(row[i])
        i += 1
    if "".join(cur).strip():
        cells.append("".join(cur))
    return cells


def plain(s: str) -> str:
    """Inline Markdown as the text it shows (a title, a Slack line's literal parts)."""
    return "".join(v if k != "bold" else "" for k, v in _tokens(s))


def html(data: ReportData, pngs: bytes | Sequence[bytes]) -> str:
    """The report as one HTML file with the timeline PNGs inlined (opens offline).

    Rendered from the Markdown (:func:`_tokens`), so both say the same; every name stays literal text.
    """
    pngs = [pngs] if isinstance(pngs, bytes) else list(pngs)
    md = markdown(data, [f"timeline-{i + 1}.png" for i in range(len(pngs))])
    imgs = iter("data:image/png;base64," + base64.b64encode(p).decode() for p in pngs)
    body: list[str] = []
    table: list[str] = []

    def inline(s: str) -> str:
        out, bold = [], False
        for kind, v in _tokens(s):
            if kind == "bold":
                out.append("</b>" if bold else "<b>")
                bold = not bold
            elif kind == "code":
                out.append(f"<code>{_html.escape(v)}</code>")
            else:
                out.append(re.sub(r"(https://[^\s<>&\"']+)", r'<a href="\1">\1</a>', _html.escape(v)))
        return "".join(out)

    def flush_table() -> None:
        if table:
            rows = [_cells(r) for r in table if not set(r) <= set("|-")]
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
    title = _html.escape(plain(md.splitlines()[0].lstrip("# ")))
    return (f"<!doctype html><html><head><meta charset=utf-8><title>{title}</title><style>{_CSS}</style></head>"
            "<body>\n" + "\n".join(body) + "\n</body></html>\n")
