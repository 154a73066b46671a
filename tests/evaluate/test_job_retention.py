"""Job-level metrics are kept for the job retention (an hour), by the metric catalogue's level, not by a ``job.``
prefix: the checkpoint metrics were cut at 15 minutes, so ``checkpoint.duration-growing`` (a 1 h window over the
job's saves) could never see three saves of a job that checkpoints every 30 minutes."""

from __future__ import annotations

import pytest
from whywait.engine.evaluate.store import _AGES, MetricStore
from whywait.engine.rules.metrics import METRICS


# (ages such as checkpoint.open_s are computed when read, not stored)
@pytest.mark.parametrize("metric", sorted(m.name for m in METRICS.values() if m.level == "job" and m.name not in _AGES))
def test_every_job_level_metric_is_kept_for_the_hour(metric: str) -> None:
    st = MetricStore()
    for t in (0.0, 1000.0, 2000.0):
        st.put(metric, "train", t, 60.0 + t / 100)
    st.trim(2100.0)
    assert list(st.window(metric, "train", -1.0, 2100.0)[0]) == [0.0, 1000.0, 2000.0]


def test_node_level_metrics_still_go_after_the_retention() -> None:
    st = MetricStore()
    for t in (0.0, 1000.0, 2000.0):
        st.put("host.cpu_busy_pct", "node-01", t, 50.0)
    st.trim(2100.0)
    assert list(st.window("host.cpu_busy_pct", "node-01", -1.0, 2100.0)[0]) == [2000.0]
