"""Rendering: Block Kit readable on a phone, everything from outside escaped; the plain-text preview."""

from __future__ import annotations

import dataclasses
import json

from whywait.engine.diagnosis import Evidence
from whywait.engine.notify.render import (
    MessageContext,
    dashboard_url,
    escape_mrkdwn,
    evidence_table,
    fallback_text,
    fmt_duration,
    fmt_number,
    fmt_ranks,
    merge,
    plain_text,
    render_blocks,
)


def test_escape_mrkdwn() -> None:
    assert escape_mrkdwn("<!channel> & <@U1>") == "&lt;!channel&gt; &amp; &lt;@U1&gt;"
    assert escape_mrkdwn("a&amp;b") == "a&amp;amp;b"  # escaped once, exactly


def test_blocks_headline_evidence_path_checks_next_links_buttons(make_diagnosis) -> None:
    d = make_diagnosis()
    blocks = render_blocks(d, MessageContext(key="abc", dashboard_url_template="https://grafana/d/x?var-job={job}"))
    types = [b["type"] for b in blocks]
    assert types == ["section", "context", "section", "section", "section", "section", "context", "actions"]
    head = blocks[0]["text"]["text"]
    assert head.splitlines()[0] == ":red_circle: *FIRING* · :warning: warning"
    assert "*Rank 12 of llm-70b is the straggler: packet loss on node-07*" in head
    assert "*Owner:* llm-pretrain · team ml-infra" in head
    table = blocks[2]["text"]["text"]
    assert table.startswith("*Evidence*\n```tcp_retrans_segs_per_s  (&gt; 3x peers' median)\n"
                            "  node-07  412 /s  vs 3.1 /s")
    assert "→ `leaf-3` →" in blocks[3]["text"]["text"]
    assert ":white_check_mark: GPU clocks" in blocks[4]["text"]["text"]
    assert blocks[5]["text"]["text"].startswith("*Next step:* Drain node-07")
    links = blocks[6]["elements"][0]["text"]
    assert "<https://runbooks.example/network/straggler-retransmits|Runbook>" in links
    assert "<https://grafana/d/x?var-job=llm-70b|Dashboard>" in links
    assert [e["action_id"] for e in blocks[7]["elements"]] == [
        "whywait.ack", "whywait.silence.1h", "whywait.silence.4h", "whywait.silence.until-resolved",
        "whywait.timeline"]
    assert all(e["value"] == "abc" for e in blocks[7]["elements"])
    assert all(len(b["text"]["text"]) <= 3000 for b in blocks if b["type"] == "section")


def test_resolved_message_has_no_next_step_and_only_timeline_button(make_diagnosis) -> None:
    d = make_diagnosis(status="resolved", ends_at=make_diagnosis().starts_at + 3725)
    blocks = render_blocks(d, MessageContext(key="k"))
    text = json.dumps(blocks)
    assert "Next step" not in text and "Resolved at" in text and "after 1h 2m" in text
    assert [e["action_id"] for e in blocks[-1]["elements"]] == ["whywait.timeline"]
    assert fallback_text(d).startswith("RESOLVED: ")


def test_no_key_no_buttons_and_unsafe_links_dropped(make_diagnosis) -> None:
    d = make_diagnosis(runbook_url="javascript:alert(1)")
    blocks = render_blocks(d)
    assert blocks[-1]["type"] == "context" and "Runbook" not in json.dumps(blocks)


def test_mention_only_where_configured_and_only_while_firing(make_diagnosis) -> None:
    d = make_diagnosis(severity="critical")
    assert render_blocks(d, MessageContext(mention="<!here>"))[0]["text"]["text"].startswith("<!here> ")
    assert fallback_text(d, MessageContext(mention="<!here>")).startswith("<!here> FIRING (critical)")
    r = dataclasses.replace(d, status="resolved")
    assert "<!here>" not in fallback_text(r, MessageContext(mention="<!here>"))


def test_evidence_table_is_narrow_and_capped() -> None:
    ev = tuple(Evidence("latency_ms", f"node-{i}", float(i), "ms", 1.0, "> 2x peers") for i in range(12))
    table = evidence_table(ev, escape=False)
    lines = table.splitlines()
    assert lines[0] == "latency_ms  (> 2x peers)" and lines[1] == "  node-0  0 ms  vs 1 ms"
    assert len(lines) == 1 + 8 + 1 and lines[-1] == "… and 4 more row(s) of latency_ms"
    assert max(len(x) for x in lines) <= 40


def test_formatting_helpers() -> None:
    assert [fmt_number(v) for v in (412.3, 3.14159, 0.00421, 12345.6, 7.0, None)] == \
        ["412", "3.14", "0.00421", "12,346", "7", "–"]
    assert [fmt_duration(s) for s in (5, 65, 3600, 3720, 90000)] == ["5s", "1m 5s", "1h", "1h 2m", "1d 1h"]
    assert fmt_ranks((0, 1, 2, 3, 7, 9, 10)) == "0–3, 7, 9, 10"


def test_dashboard_template_quotes_values(make_diagnosis) -> None:
    d = make_diagnosis(job="a b&c")
    url = dashboard_url("https://g/d?job={job}&sw={labels[switch]}&x={labels[nope]}&from={from_ms}", d)
    assert url == f"https://g/d?job=a%20b%26c&sw=leaf-3&x=&from={int((d.starts_at - 900) * 1000)}"


def test_merge_groups_findings(make_diagnosis) -> None:
    a = make_diagnosis(rank=1, node="node-01", confidence=0.6)
    b = make_diagnosis(rank=2, node="node-02", severity="critical", confidence=0.9)
    m = merge([a, b])
    assert m.severity == "critical" and m.ranks == (1, 2) and m.culprit == "node-01, node-02"
    assert m.title.startswith("Rank 2 of llm-70b") and "(+1 more: node-01)" in m.title
    assert {e.entity for e in m.evidence} == {"node-01", "node-02", "rank 1", "rank 2"}
    assert merge([dataclasses.replace(a, status="resolved"), b]).status == "firing"


def test_plain_text_preview_unescaped(make_diagnosis) -> None:
    d = make_diagnosis(job="<!channel>")
    text = plain_text(d, dashboard_url_template="https://g/{job}")
    assert text.startswith("[FIRING · warning] Rank 12 of llm-70b is the straggler")
    assert "Job: <!channel> · ranks 12 · culprit node-07" in text
    assert "Dashboard: https://g/%3C%21channel%3E" in text
    assert "Evidence:\n  tcp_retrans_segs_per_s" in text
    assert "Path: rank 12 -> node-07 -> node-07/eth0 -> leaf-3 -> spine-1" in text


def test_evidence_table_shows_every_metric_before_a_long_list_of_nodes() -> None:
    """The tester's pool alert listed 8 nodes' latencies, then "… and 4 more": the job's own data-wait and
    step-time evidence, the cause's, read as four more nodes."""
    nodes = tuple(Evidence("storage.read_latency_ms", f"node-{i:02d}", 40.0 + i, "ms", 2.0, "> 15") for i in range(8))
    job = (Evidence("job.data_wait_s", "train-llm", 0.4, "s", 0.02, "> 1.3x own"),
           Evidence("job.step_s", "train-llm", 1.2, "s", 0.8, ""))
    lines = evidence_table(nodes + job, escape=False).splitlines()
    assert "job.data_wait_s  (> 1.3x own)" in lines and "job.step_s" in lines
    assert sum(1 for x in lines if x.startswith("  node-")) == 6
    assert lines[-1] == "… and 2 more row(s) of storage.read_latency_ms"
