"""The evaluator's store keeps only the metrics its rules read, and never loses one a condition reads."""

from __future__ import annotations

import logging
import re
from pathlib import Path

import pytest
from whywait.agents.events import envelope
from whywait.engine.evaluate.conditions import IMPLICIT_METRICS, rule_metrics
from whywait.engine.evaluate.evaluator import Evaluator
from whywait.engine.evaluate.store import _AGES, MetricStore
from whywait.engine.rules.loader import load_rules
from whywait.engine.rules.metrics import METRICS
from whywait.simulate.cluster import make_cluster

ROOT = Path(__file__).resolve().parents[2]
T0 = 1_764_442_800.0


def _gpu(node: str, t: float) -> dict[str, object]:
    return envelope("gpu", node, t, gpus=[
        {"gpu": g, "util_pct": 90.0, "mem_util_pct": 10.0 + g, "mem_used_bytes": 1, "mem_total_bytes": 2,
         "temp_c": 60.0 + g, "power_w": 500.0, "sm_clock_mhz": 1900.0, "throttle_reasons": [], "ecc_corrected": 3,
         "ecc_uncorrected": 0, "xid": []} for g in range(2)])


def test_metrics_named_in_condition_code_are_kept_whatever_the_rules_say() -> None:
    """Every catalogue metric quoted in the evaluation code is a read the rules do not show: it must be listed."""
    quoted: set[str] = set()
    for name in ("conditions.py", "step_conditions.py", "evaluator.py", "steps.py"):
        src = (ROOT / "engine" / "evaluate" / name).read_text()
        quoted |= {m for m in re.findall(r"""["']([a-z_]+\.[a-z_.]+)["']""", src) if m in METRICS}
    missing = quoted - IMPLICIT_METRICS - _AGES
    assert not missing, f"add to IMPLICIT_METRICS in engine/evaluate/conditions.py: {sorted(missing)}"


def test_rule_metrics_cover_when_evidence_and_checks() -> None:
    rules = load_rules([ROOT / "rules"])
    kept = rule_metrics(rules)
    assert IMPLICIT_METRICS <= kept
    assert {"gpu.temp_c", "net.tcp_retrans_segs_per_s", "gpu.xid"} <= kept
    assert "gpu.nvlink_errors" not in kept and "gpu.mem_util_pct" not in kept  # no shipped rule reads them


def test_a_store_keeps_what_it_is_told_and_a_read_of_anything_else_keeps_it_from_then_on(
        caplog: pytest.LogCaptureFixture) -> None:
    store = MetricStore()
    store.set_keep({"gpu.temp_c"})
    store.ingest(_gpu("n1", T0))
    assert store.value("gpu.temp_c", "n1/gpu1", "last", T0, 5) == 61.0
    with caplog.at_level(logging.WARNING):
        assert store.value("gpu.mem_util_pct", "n1/gpu1", "last", T0, 5) is None  # not kept: no data yet
    assert "gpu.mem_util_pct was read but not kept" in caplog.text
    store.ingest(_gpu("n1", T0 + 1))
    assert store.value("gpu.mem_util_pct", "n1/gpu1", "last", T0 + 1, 5) == 11.0
    store.set_keep(None)  # everything again
    store.ingest(_gpu("n1", T0 + 2))
    assert store.value("gpu.ecc_corrected", "n1/gpu0", "sum", T0 + 2, 5) == 3.0


def test_the_evaluator_keeps_what_its_rules_read_and_follows_a_reload(tmp_path: Path) -> None:
    topo = make_cluster(nodes=1, gpus_per_node=2)
    rules = load_rules([ROOT / "rules"])
    ev = Evaluator(rules, topo)
    ev.ingest(_gpu("node-01", T0))
    assert ev.store.keep == rule_metrics(rules)
    assert "gpu.mem_util_pct" not in ev.store.columns
    (tmp_path / "gpu.memory-busy.yaml").write_text(_MEM_RULE)
    reloaded = load_rules([tmp_path])  # the live engine swaps ``rules`` on a reload
    ev.rules = reloaded
    ev.ingest(_gpu("node-01", T0 + 1))
    assert ev.store.keep == rule_metrics(reloaded) and "gpu.mem_util_pct" in ev.store.keep
    ev.ingest(_gpu("node-01", T0 + 2))
    assert ev.store.value("gpu.mem_util_pct", "node-01/gpu1", "last", T0 + 2, 5) == 11.0


_MEM_RULE = """apiVersion: whywait/v1
id: gpu.memory-busy
layer: compute
severity: info
title: "{{ job }} keeps GPU memory busy"
cause: "memory"
next_step: "look"
when: {type: threshold, metric: gpu.mem_util_pct, window: 10s, value: "> 99"}
"""
