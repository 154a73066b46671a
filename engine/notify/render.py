"""Render a :class:`~whywait.engine.diagnosis.Diagnosis` for Slack (Block Kit) and for a terminal (plain text).

Called by the notifiers each time a message is posted or edited, and by
``whywait notify render``.  Pure: no I/O, no slack_sdk.

Every string that comes from events, labels, rule text or job names passes through
:func:`escape_mrkdwn` before it is placed in a Slack text, so a job named
``<!channel>`` shows as that text and pings nobody.  Only the mention this module
adds itself (``MessageContext.mention``, from the routing configuration) is raw.

The layout is meant for a phone: the first section says what is slow, why, and who
owns it; the evidence is a short preformatted table; the rest (path, clean checks,
next step, links, buttons) follows in that order.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from whywait.engine.diagnosis import Diagnosis, Evidence
from whywait.engine.notify.format import (  # noqa: F401
    SECTION_LIMIT,
    dashboard_url,
    fmt_duration,
    fmt_number,
    fmt_ranks,
    fmt_time,
    merge,
    truncate,
)
from whywait.engine.notify.pipeline.core import (
    ACTION_ACK,
    ACTION_SILENCE_1H,
    ACTION_SILENCE_4H,
    ACTION_SILENCE_RESOLVED,
    ACTION_TIMELINE,
)

STATUS_EMOJI = {"firing": ":red_circle:", "resolved": ":large_green_circle:"}
SEVERITY_EMOJI = {"critical": ":rotating_light:", "warning": ":warning:", "info": ":information_source:"}

# action_id of each button; the interactivity endpoint dispatches on these.
ACTIONS = (ACTION_ACK, ACTION_SILENCE_1H, ACTION_SILENCE_4H, ACTION_SILENCE_RESOLVED, ACTION_TIMELINE)

MAX_EVIDENCE_ROWS = 8
_FALLBACK_LIMIT = 3000

TEMPLATES_DIR = Path(__file__).resolve().parent.parent / "templates"


def escape_mrkdwn(text: object) -> str:
    """Escape ``&``, ``<`` and ``>`` as Slack requires for any text it should not interpret.

    Called on every value that does not come from whywait itself (job names,
    labels, entities, rule text), so ``<!channel>`` or ``<@U123>`` cannot ping.
    """
    return str(text).replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")


def _code(text: object) -> str:
    """Inline code span of untrusted text (backticks inside would end the span)."""
    return "`" + escape_mrkdwn(str(text).replace("`", "'")) + "`"


def _link(url: str | None, label: str) -> str | None:
    """A mrkdwn link, or None unless ``url`` is http(s); ``|`` and ``>`` would break the syntax."""
    if not url or not url.lower().startswith(("http://", "https://")):
        return None
    safe = escape_mrkdwn(url.replace("|", "%7C"))
    return f"<{safe}|{label}>"


@dataclass(frozen=True)
class MessageContext:
    """What the notifier knows beyond the diagnosis: incident key, mention, ack, silence.

    ``key`` (the incident's short id) is put into the buttons' values (None: no buttons);
    ``mention`` is a Slack mention such as ``<!here>`` from the routing configuration
    (trusted, not escaped).
    """

    key: str | None = None
    mention: str | None = None
    members: int = 1  # diagnoses grouped into this message
    acked_by: str | None = None
    acked_at: float | None = None
    silenced_by: str | None = None
    silenced_until: float | None = None  # None with silenced_by set: until resolved
    now: float | None = None
    dashboard_url_template: str | None = None


def _headline(d: Diagnosis, ctx: MessageContext) -> str:
    status = "RESOLVED" if d.status == "resolved" else "FIRING"
    first = f"{STATUS_EMOJI[d.status]} *{status}* · {SEVERITY_EMOJI.get(d.severity, '')} {d.severity}"
    if ctx.mention and d.status == "firing":
        first = f"{ctx.mention} {first}"
    lines = [first, f"*{escape_mrkdwn(d.title)}*"]
    if d.cause:
        lines.append(f"*Where the waiting begins:* {escape_mrkdwn(d.cause)}")
    if d.owner is not None:
        lines.append(f"*Owner:* {escape_mrkdwn(d.owner.project)} · team {escape_mrkdwn(d.owner.team)}")
    return "\n".join(lines)


def _facts(d: Diagnosis, ctx: MessageContext) -> list[str]:
    facts = []
    if d.job:
        name = d.labels.get("job_name")
        facts.append(f"job {_code(d.job)}" + (f" ({escape_mrkdwn(name)})" if name else ""))
    if d.ranks:
        facts.append(f"rank{'s' if len(d.ranks) > 1 else ''} {fmt_ranks(d.ranks)}")
    if d.culprit:
        facts.append(f"culprit {_code(d.culprit)}")
    facts.append(f"confidence {round(100 * d.confidence)}%")
    since = f"since {fmt_time(d.starts_at)}"
    if d.status == "resolved" and d.ends_at is not None:
        since = f"{fmt_time(d.starts_at)} → {fmt_time(d.ends_at)} ({fmt_duration(d.ends_at - d.starts_at)})"
    elif ctx.now is not None:
        since += f" ({fmt_duration(ctx.now - d.starts_at)})"
    facts.append(since)
    if ctx.members > 1:
        facts.append(f"{ctx.members} findings grouped")
    return facts


def evidence_table(evidence: tuple[Evidence, ...], *, escape: bool = True, limit: int = MAX_EVIDENCE_ROWS) -> str:
    """The evidence as a narrow preformatted table (about 40 columns, for a phone): one header
    line per metric with its rule, then one line per entity, value against baseline::

        tcp_retrans_segs_per_s  (> 3x peers' median)
          node-07   412 /s  vs 3.1 /s
    """
    e = escape_mrkdwn if escape else str
    groups = _capped_groups(evidence, limit)
    shown = [ev for rows in groups.values() for ev in rows]
    ent_w = min(18, max((len(str(ev.entity)) for ev in shown), default=0))
    val_w = max((len(fmt_number(ev.value) + (f" {ev.unit}" if ev.unit else "")) for ev in shown), default=0)
    lines: list[str] = []
    for metric, rows in groups.items():
        rules = {ev.threshold for ev in rows if ev.threshold}
        lines.append(metric + (f"  ({rules.pop()})" if len(rules) == 1 else ""))
        for ev in rows:
            unit = f" {ev.unit}" if ev.unit else ""
            base = f"  vs {fmt_number(ev.baseline)}{unit}" if ev.baseline is not None else ""
            rule = f"  ({ev.threshold})" if len(rules) > 1 and ev.threshold else ""
            lines.append(f"  {str(ev.entity):<{ent_w}}  {(fmt_number(ev.value) + unit):>{val_w}}{base}{rule}".rstrip())
    hidden: dict[str, int] = {}
    for ev in evidence:
        hidden[ev.metric] = hidden.get(ev.metric, 0) + 1
    for metric, rows in groups.items():
        hidden[metric] -= len(rows)
    cut = {m: n for m, n in hidden.items() if n > 0}
    if cut:
        # Name what was left out: "and 4 more" under a list of nodes read as four more nodes.
        what = ", ".join(f"{m} ({n})" if len(cut) > 1 else m for m, n in cut.items())
        lines.append(f"… and {sum(cut.values())} more row(s) of {what}")
    return e("\n".join(lines).replace("```", "'''"))


def _capped_groups(evidence: tuple[Evidence, ...], limit: int) -> dict[str, list[Evidence]]:
    """At most ``limit`` rows of ``evidence``, grouped by metric in order of first appearance, shared so that
    every metric shows before any shows a second row (then round the metrics again, and so on).

    Called by :func:`evidence_table`.  Taking the first ``limit`` rows let a list of eight nodes push the
    evidence that explains the cause (the job's own phase times, the topology) out of the message.
    """
    groups: dict[str, list[Evidence]] = {}
    for ev in evidence:
        groups.setdefault(ev.metric, []).append(ev)
    take = dict.fromkeys(groups, 0)
    budget = limit
    while budget > 0:
        moved = False
        for metric, rows in groups.items():
            if budget and take[metric] < len(rows):
                take[metric] += 1
                budget -= 1
                moved = True
        if not moved:
            break
    return {m: rows[:take[m]] for m, rows in groups.items() if take[m]}


def _status_line(d: Diagnosis, ctx: MessageContext) -> str | None:
    parts = []
    if ctx.acked_by:
        at = f" at {fmt_time(ctx.acked_at)}" if ctx.acked_at is not None else ""
        parts.append(f":eyes: Acknowledged by {escape_mrkdwn(ctx.acked_by)}{at}")
    if ctx.silenced_by and d.status == "firing":
        until = "until resolved" if ctx.silenced_until is None else f"until {fmt_time(ctx.silenced_until)}"
        parts.append(f":no_bell: Silenced {until} by {escape_mrkdwn(ctx.silenced_by)}")
    if d.status == "resolved":
        ended = d.ends_at if d.ends_at is not None else ctx.now
        if ended is not None:
            parts.append(f":white_check_mark: Resolved at {fmt_time(ended)} after {fmt_duration(ended - d.starts_at)}")
    return " · ".join(parts) or None


def _button(text: str, action_id: str, value: str, style: str | None = None) -> dict[str, Any]:
    b: dict[str, Any] = {"type": "button", "text": {"type": "plain_text", "text": text, "emoji": True},
                         "action_id": action_id, "value": value}
    if style:
        b["style"] = style
    return b


def render_blocks(d: Diagnosis, ctx: MessageContext | None = None) -> list[dict[str, Any]]:
    """Return the Block Kit blocks of the message for ``d`` (the root message of its incident)."""
    ctx = ctx or MessageContext()
    blocks: list[dict[str, Any]] = [
        {"type": "section", "text": {"type": "mrkdwn", "text": truncate(_headline(d, ctx), SECTION_LIMIT)}},
        {"type": "context",
         "elements": [{"type": "mrkdwn", "text": truncate(" · ".join(_facts(d, ctx)), SECTION_LIMIT)}]},
    ]
    if d.evidence:
        table = truncate(evidence_table(d.evidence), SECTION_LIMIT - 30)
        blocks.append({"type": "section", "text": {"type": "mrkdwn", "text": f"*Evidence*\n```{table}```"}})
    if d.topology_path:
        path = " → ".join(_code(p) for p in d.topology_path)
        blocks.append({"type": "section", "text": {"type": "mrkdwn", "text": truncate(f"*Path:* {path}",
                                                                                        SECTION_LIMIT)}})
    if d.clean_checks:
        checks = "  ".join(f":white_check_mark: {escape_mrkdwn(c)}" for c in d.clean_checks)
        text = truncate(f"*Checked and clean:* {checks}", SECTION_LIMIT)
        blocks.append({"type": "section", "text": {"type": "mrkdwn", "text": text}})
    if d.next_step and d.status == "firing":
        blocks.append({"type": "section", "text": {"type": "mrkdwn", "text": truncate(
            f"*Next step:* {escape_mrkdwn(d.next_step)}", SECTION_LIMIT)}})
    links = [lk for lk in (_link(d.runbook_url, "Runbook"),
                           _link(dashboard_url(ctx.dashboard_url_template, d, ctx.now), "Dashboard")) if lk]
    status = _status_line(d, ctx)
    context = [*links, *([status] if status else []),
               f"rule {_code(d.rule_id)}"]
    blocks.append({"type": "context", "elements": [{"type": "mrkdwn", "text": " · ".join(context)}]})
    if ctx.key is not None:
        key = ctx.key[:2000]
        if d.status == "firing":
            elements = [
                _button("Acknowledge", ACTION_ACK, key, "primary"),
                _button("Silence 1h", ACTION_SILENCE_1H, key),
                _button("Silence 4h", ACTION_SILENCE_4H, key),
                _button("Silence until resolved", ACTION_SILENCE_RESOLVED, key),
                _button("Show timeline", ACTION_TIMELINE, key),
            ]
        else:
            elements = [_button("Show timeline", ACTION_TIMELINE, key)]
        blocks.append({"type": "actions", "block_id": "whywait.actions", "elements": elements})
    return blocks


def fallback_text(d: Diagnosis, ctx: MessageContext | None = None) -> str:
    """The message's top-level ``text``: what notifications and screen readers show."""
    ctx = ctx or MessageContext()
    status = "RESOLVED" if d.status == "resolved" else f"FIRING ({d.severity})"
    owner = f" · {escape_mrkdwn(d.owner.team)}" if d.owner else ""
    mention = f"{ctx.mention} " if ctx.mention and d.status == "firing" else ""
    return truncate(f"{mention}{status}: {escape_mrkdwn(d.title)}{owner}", _FALLBACK_LIMIT)


def plain_text(d: Diagnosis, *, dashboard_url_template: str | None = None, now: float | None = None) -> str:
    """The plain-text preview of the message (what the console notifier prints); nothing escaped."""
    from jinja2 import Environment, FileSystemLoader, StrictUndefined

    env = Environment(loader=FileSystemLoader(str(TEMPLATES_DIR)), undefined=StrictUndefined,
                      keep_trailing_newline=False, trim_blocks=True, lstrip_blocks=True, autoescape=False)
    tpl = env.get_template("notify_plain.txt.j2")
    ended = d.ends_at if d.ends_at is not None else now
    return tpl.render(
        d=d,
        status="RESOLVED" if d.status == "resolved" else "FIRING",
        ranks=fmt_ranks(d.ranks),
        since=fmt_time(d.starts_at),
        resolved=(f"resolved at {fmt_time(ended)} after {fmt_duration(ended - d.starts_at)}"
                  if d.status == "resolved" and ended is not None else ""),
        evidence=evidence_table(d.evidence, escape=False) if d.evidence else "",
        path=" -> ".join(d.topology_path),
        dashboard=dashboard_url(dashboard_url_template, d, now) or "",
    ).rstrip() + "\n"
