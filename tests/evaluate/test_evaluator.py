"""The pure evaluator, driven by synthetic events at fixed times (no Kafka, no clock)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from typing import Any, Iterator

import pytest
from whywait.agents.events import envelope
from whywait.engine.evaluate.evaluator import Evaluator
from whywait.engine.rules.loader import load_rules
from whywait.simulate.cluster import make_cluster

T0 = 1_800_000_000.0
NODES = ["node-01", "node-02", "node-03", "node-04"]
RULE = """\
apiVersion: whywait/v1
id: network.test-straggler
title: "{{ job }} waits on {{ node }}"
cause: >-
  {{ node }} retransmits {{ ev['net.tcp_retrans_segs_per_s'].value | num }}/s
  vs {{ ev['net.tcp_retrans_segs_per_s'].baseline | num }}
next_step: "check {{ switch }}"
for: @FOR@
keep_firing_for: @KFF@
group_by: [job, node]
when:
  all:
    - type: peer_outlier
      metric: net.tcp_retrans_segs_per_s
      window: 3s
      ratio: "> 10"
      min_value: "> 20"
      culprit: true
    - type: self_history
      metric: job.comm_s
      agg: median
      window: 3s
      baseline: 60s
      ratio: "> 1.3"
checks:
  - name: "CPU fine on {{ node }}"
    when: {type: threshold, metric: host.cpu_busy_pct, value: "> 95", scope: culprit}
"""


def rules_dir(tmp_path: Path, for_: str = "2s", kff: str = "0s", extra: dict[str, str] | None = None) -> Path:
    d = tmp_path / "rules"
    d.mkdir(exist_ok=True)
    (d / "network.test-straggler.yaml").write_text(RULE.replace("@FOR@", for_).replace("@KFF@", kff))
    for name, text in (extra or {}).items():
        (d / name).write_text(text)
    return d


def stream(seconds: int, bad_node: str | None = None, fault: tuple[int, int] = (0, 0),
           cpu_busy: float = 40.0, faults: tuple[tuple[int, int], ...] = ()) -> Iterator[dict[str, Any]]:
    """Four nodes, one GPU and one rank each; ``bad_node`` retransmits during ``fault`` (and ``faults``)."""
    windows = (fault, *faults)
    ranks = [{"rank": i, "node": n, "gpu": 0} for i, n in enumerate(NODES)]
    yield envelope("placement", "scheduler", T0, job="job-a", project="proj", team="team-a",
                   slack_channel="#team-a", state="running", ranks=ranks)
    for s in range(1, seconds + 1):
        t = T0 + s
        in_fault = any(a <= s < b for a, b in windows)
        for i, n in enumerate(NODES):
            retrans = 500.0 if (n == bad_node and in_fault) else 1.0 + (i % 2)
            yield envelope("net", n, t, interval_s=1.0, nics=[], tcp_retrans_segs_per_s=retrans,
                           tcp_out_segs_per_s=20000.0)
            yield envelope("host", n, t, cpu_busy_pct=cpu_busy, cpu_iowait_pct=0.0, mem_used_bytes=1,
                           mem_total_bytes=2)
            comm = 0.6 if in_fault else 0.2 + 0.01 * i
            yield envelope("steps", n, t, job="job-a", steps=[{"rank": i, "step": s, "duration_s": 0.8 + comm,
                                                              "data_wait_s": 0.01, "compute_s": 0.6, "comm_s": comm}])


def run(ev: Evaluator, msgs: Iterator[dict[str, Any]]) -> list[Any]:
    out = []
    for m in msgs:
        out += ev.ingest(m)
    return out


@pytest.fixture
def topo() -> Any:
    return make_cluster(nodes=4, gpus_per_node=1)


def test_fires_on_the_culprit_after_for_and_resolves(tmp_path: Path, topo: Any) -> None:
    ev = Evaluator(load_rules([rules_dir(tmp_path)]), topo)
    diags = run(ev, stream(140, "node-03", (80, 110)))
    firing = [d for d in diags if d.status == "firing"]
    resolved = [d for d in diags if d.status == "resolved"]
    assert len(firing) == 1 and len(resolved) == 1
    d = firing[0]
    assert d.culprit == "node-03" and d.ranks == (2,) and d.job == "job-a"
    assert d.owner is not None and d.owner.channel == "#team-a"
    assert T0 + 80 <= d.starts_at and d.detected_at - d.starts_at >= 2.0  # `for: 2s` held first
    assert d.detected_at - (T0 + 80) <= 6
    assert d.cause == "node-03 retransmits 500.0/s vs 2.0"
    assert d.clean_checks == ("CPU fine on node-03",)
    assert d.topology_path[0] == "job job-a rank 2" and "node-03" in d.topology_path
    assert resolved[0].ends_at is not None and T0 + 110 <= resolved[0].ends_at <= T0 + 115


def test_nothing_without_a_fault(tmp_path: Path, topo: Any) -> None:
    ev = Evaluator(load_rules([rules_dir(tmp_path)]), topo)
    assert run(ev, stream(200)) == []


def test_keep_firing_for_bridges_a_gap(tmp_path: Path, topo: Any) -> None:
    ev = Evaluator(load_rules([rules_dir(tmp_path, kff="30s")]), topo)
    # a second burst 10 s after the first ends: with keep_firing_for 30s it is the same incident
    diags = run(ev, stream(200, "node-03", (80, 110), faults=((120, 140),)))
    assert [d.status for d in diags] == ["firing", "resolved"]
    assert diags[1].ends_at >= T0 + 140 + 29


def test_failed_check_lowers_confidence(tmp_path: Path, topo: Any) -> None:
    ev = Evaluator(load_rules([rules_dir(tmp_path)]), topo)
    d = next(d for d in run(ev, stream(140, "node-03", (80, 110), cpu_busy=99.0)) if d.status == "firing")
    assert d.clean_checks == () and d.confidence == pytest.approx(0.55)
    assert any(e.note == "also seen: CPU fine on node-03" for e in d.evidence)


INHIBITOR = """\
apiVersion: whywait/v1
id: network.test-root
title: root cause
cause: the job's comm grew
next_step: look
inhibits: [network.test-straggler]
when:
  type: self_history
  metric: job.comm_s
  window: 3s
  baseline: 60s
  ratio: "> 1.3"
"""


def test_root_cause_inhibits_its_symptom(tmp_path: Path, topo: Any) -> None:
    ev = Evaluator(load_rules([rules_dir(tmp_path, extra={"network.test-root.yaml": INHIBITOR})]), topo)
    diags = run(ev, stream(140, "node-03", (80, 110)))
    assert {d.rule_id for d in diags} == {"network.test-root"}


def test_snapshot_restore_does_not_refire(tmp_path: Path, topo: Any) -> None:
    rules = load_rules([rules_dir(tmp_path)])
    ev = Evaluator(rules, topo)
    msgs = list(stream(140, "node-03", (80, 110)))
    cut = next(i for i, m in enumerate(msgs) if m["time"] >= T0 + 95)
    first = run(ev, iter(msgs[:cut]))
    assert [d.status for d in first] == ["firing"]
    ev2 = Evaluator(rules, make_cluster(nodes=4, gpus_per_node=1))
    ev2.restore(ev.snapshot())
    # the restarted engine re-reads from its committed offset; history is rebuilt, no second firing
    rest = run(ev2, iter([msgs[0]] + msgs[cut - 400:]))
    assert [d.status for d in rest] == ["resolved"]


def test_late_messages_within_lateness_still_count(tmp_path: Path, topo: Any) -> None:
    ev = Evaluator(load_rules([rules_dir(tmp_path)]), topo)
    msgs = list(stream(140, "node-03", (80, 110)))
    # deliver node-03's net samples one second late (out of order), within the 2 s lateness
    late = sorted(msgs, key=lambda m: m["time"] + (1.0 if m["node"] == "node-03" and m["kind"] == "net" else 0))
    firing = [d for d in run(ev, iter(late)) if d.status == "firing"]
    assert firing and firing[0].culprit == "node-03"


def test_pure_core_imports_no_io_libraries() -> None:
    code = ("import sys, engine.evaluate.evaluator, engine.rules.loader, topology.model, agents.events;"
            "bad = [m for m in ('faust', 'aiokafka', 'slack_sdk', 'pynvml', 'kafka') if m in sys.modules];"
            "print(bad); sys.exit(1 if bad else 0)")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert r.returncode == 0, r.stdout + r.stderr


def test_store_forgets_entities_gone_for_the_whole_retention() -> None:
    from whywait.engine.evaluate.store import MetricStore

    st = MetricStore(retention_s=60)
    st.put("step.duration_s", "old-job:0", 100.0, 1.0)
    st.put("step.duration_s", "job:0", 200.0, 1.0)
    st.trim(200.0)
    assert list(st.series) == [("step.duration_s", "job:0")]
