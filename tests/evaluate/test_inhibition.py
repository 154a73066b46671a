"""Topology-aware inhibition: a leaf-switch diagnosis mutes node diagnoses beneath it, whichever job."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Iterator

from whywait.agents.events import envelope
from whywait.engine.evaluate.evaluator import Evaluator
from whywait.engine.rules.loader import load_rules
from whywait.simulate.cluster import make_cluster

T0 = 1_800_000_000.0
LEAF = """\
apiVersion: whywait/v1
id: network.test-leaf
title: leaf {{ switch }} congested
culprit: "{{ switch }}"
cause: "{{ switch }} congested"
next_step: look at {{ switch }}
group_by: [switch]
inhibits: [host.test-node]
when: {type: threshold, metric: net.tcp_retrans_segs_per_s, window: 3s, value: "> 100", culprit: true}
"""
NODE = """\
apiVersion: whywait/v1
id: host.test-node
title: "{{ node }} busy"
cause: "{{ node }} busy"
next_step: look at {{ node }}
group_by: [job, node]
when: {type: threshold, metric: host.cpu_busy_pct, window: 3s, value: "> 90", culprit: true}
"""


def stream(congested: bool, busy_node: str) -> Iterator[dict[str, Any]]:
    # jobs a and b under leaf-01 (nodes 1-2 and 3-4), job c under leaf-02 (nodes 5-6)
    for j, nodes in (("job-a", ["node-01", "node-02"]), ("job-b", ["node-03", "node-04"]),
                     ("job-c", ["node-05", "node-06"])):
        yield envelope("placement", "sched", T0, job=j, project=f"p-{j}", team="t", state="running",
                       ranks=[{"rank": i, "node": n, "gpu": 0} for i, n in enumerate(nodes)])
    for s in range(1, 40):
        t = T0 + s
        for n in ("node-01", "node-02", "node-03", "node-04", "node-05", "node-06"):
            retrans = 500.0 if (congested and n == "node-01" and s > 10) else 1.0
            yield envelope("net", n, t, interval_s=1.0, nics=[], tcp_retrans_segs_per_s=retrans,
                           tcp_out_segs_per_s=1e4)
            yield envelope("host", n, t, cpu_busy_pct=99.0 if (n == busy_node and s > 10) else 20.0,
                           cpu_iowait_pct=0.0, mem_used_bytes=1, mem_total_bytes=2)


def run(tmp_path: Path, congested: bool, busy_node: str = "node-03") -> list[str]:
    (tmp_path / "network.test-leaf.yaml").write_text(LEAF)
    (tmp_path / "host.test-node.yaml").write_text(NODE)
    ev = Evaluator(load_rules([tmp_path]), make_cluster(nodes=8, gpus_per_node=1, nodes_per_leaf=4))
    out = []
    for m in stream(congested, busy_node):
        out += [f"{d.rule_id}:{d.job}:{d.culprit}" for d in ev.ingest(m) if d.status == "firing"]
    return out


def test_leaf_diagnosis_mutes_another_jobs_node_diagnosis_under_it(tmp_path: Path) -> None:
    assert run(tmp_path, congested=True) == ["network.test-leaf:job-a:leaf-01"]


def test_without_the_leaf_diagnosis_the_node_one_is_announced(tmp_path: Path) -> None:
    assert run(tmp_path, congested=False) == ["host.test-node:job-b:node-03"]


def test_a_node_under_another_leaf_is_not_muted(tmp_path: Path) -> None:
    got = run(tmp_path, congested=True, busy_node="node-05")  # job c, under leaf-02
    assert sorted(got) == ["host.test-node:job-c:node-05", "network.test-leaf:job-a:leaf-01"]
