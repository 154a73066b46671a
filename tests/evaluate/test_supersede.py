"""``supersedes``: a rule that can only see its pattern in hindsight takes over the incidents of the
rules it supersedes that its own evidence covers (a periodic slowdown's first spells, told as a
slowdown of the whole job before any period could be seen)."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Iterator

import pytest
from whywait.agents.events import envelope
from whywait.engine.evaluate.evaluator import Evaluator
from whywait.engine.rules.loader import RuleLoadError, load_rules
from whywait.simulate.cluster import make_cluster
from whywait.simulate.eval import _incident_spans, _superseded

T0 = 1_800_000_000.0
EARLY = """\
apiVersion: whywait/v1
id: host.test-early
title: "{{ job }} busy"
cause: "{{ job }} looks busy."
next_step: look
group_by: [job]
when: {type: threshold, metric: host.cpu_busy_pct, window: 1s, value: "> 90"}
"""
LATE = """\
apiVersion: whywait/v1
id: host.test-late
title: "{{{{ job }}}} has the real story"
cause: "the real story"
next_step: look
group_by: [job]
for: {for_s}s
supersedes: [host.test-early]
when: {{type: threshold, metric: net.tcp_retrans_segs_per_s, window: 1s, value: "> 100"}}
"""


def stream(busy: range, retrans_from: int, until: int = 60) -> Iterator[dict[str, Any]]:
    yield envelope("placement", "sched", T0, job="job-a", project="p", team="t", state="running",
                   ranks=[{"rank": 0, "node": "node-01", "gpu": 0}, {"rank": 1, "node": "node-02", "gpu": 0}])
    for s in range(1, until):
        t = T0 + s
        for n in ("node-01", "node-02"):
            yield envelope("net", n, t, interval_s=1.0, nics=[], tcp_out_segs_per_s=1e4,
                           tcp_retrans_segs_per_s=500.0 if (n == "node-01" and s >= retrans_from) else 1.0)
            yield envelope("host", n, t, cpu_busy_pct=99.0 if s in busy else 20.0,
                           cpu_iowait_pct=0.0, mem_used_bytes=1, mem_total_bytes=2)


def run(tmp_path: Path, busy: range, retrans_from: int, for_s: int) -> list[Any]:
    (tmp_path / "host.test-early.yaml").write_text(EARLY)
    (tmp_path / "host.test-late.yaml").write_text(LATE.format(for_s=for_s))
    ev = Evaluator(load_rules([tmp_path]), make_cluster(nodes=2, gpus_per_node=1))
    out = []
    for m in stream(busy, retrans_from):
        out += ev.ingest(m)
    return out


def test_a_resolved_incident_the_later_one_covers_is_reannounced_as_taken_over(tmp_path: Path) -> None:
    # early: busy 11-14 (fires, resolves); late: holds from 12 on, fires after its 20 s `for`
    out = run(tmp_path, range(11, 15), retrans_from=12, for_s=20)
    seq = [(d.rule_id, d.status, d.labels.get("superseded_by")) for d in out]
    late_at = seq.index(("host.test-late", "firing", None))
    assert seq[:2] == [("host.test-early", "firing", None), ("host.test-early", "resolved", None)]
    taken = [d for d in out[:late_at + 1] if d.labels.get("superseded_by")]
    assert len(taken) == 1 and taken[0].rule_id == "host.test-early" and taken[0].status == "resolved"
    assert taken[0].labels["superseded_by_fingerprint"] == out[late_at].fingerprint
    assert "Taken over by a later finding: job-a has the real story" in taken[0].cause
    # the scorer folds it into the superseding incident
    spans = _incident_spans([d.to_dict() for d in out])
    assert [a["rule_id"] for a, b in spans if not _superseded(b)] == ["host.test-late"]


def test_an_open_incident_is_closed_as_taken_over_and_stays_muted(tmp_path: Path) -> None:
    out = run(tmp_path, range(11, 50), retrans_from=12, for_s=20)
    early = [(d.status, d.labels.get("superseded_by")) for d in out if d.rule_id == "host.test-early"]
    assert early == [("firing", None), ("resolved", "host.test-late")]


def test_an_incident_that_began_before_the_later_ones_evidence_is_left_alone(tmp_path: Path) -> None:
    out = run(tmp_path, range(3, 6), retrans_from=30, for_s=5)
    assert not any(d.labels.get("superseded_by") for d in out)
    assert [d.rule_id for d in out if d.status == "firing"] == ["host.test-early", "host.test-late"]


def test_supersedes_must_name_another_loaded_rule(tmp_path: Path) -> None:
    (tmp_path / "host.test-late.yaml").write_text(LATE.format(for_s=1).replace("[host.test-early]", "[host.nope]"))
    with pytest.raises(RuleLoadError, match=r"supersedes\[0\].*must name another loaded rule"):
        load_rules([tmp_path])


def test_a_muted_superseding_incident_takes_nothing_over(tmp_path: Path) -> None:
    (tmp_path / "host.test-root.yaml").write_text(LATE.replace("id: host.test-late", "id: host.test-root").replace(
        "supersedes: [host.test-early]", "inhibits: [host.test-late]").format(for_s=0))
    out = run(tmp_path, range(11, 15), retrans_from=12, for_s=20)
    assert not any(d.labels.get("superseded_by") for d in out)
    assert [d.rule_id for d in out if d.status == "firing"] == ["host.test-early", "host.test-root"]
