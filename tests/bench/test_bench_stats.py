"""The bench's statistics: medians and spreads, paired throughput ratios, percentiles, steady-state cores."""

from __future__ import annotations

import math

import pytest
from whywait.engine.bench.stats import cores_used, percentile, spread, throughput_ratios


def test_spread_is_the_median_and_the_farther_extreme() -> None:
    s = spread([10.0, 12.0, 9.0])
    assert (s.median, s.low, s.high, s.n) == (10.0, 9.0, 12.0, 3)
    assert s.rel == pytest.approx(0.2)  # 12 is 20 % above the median; 9 only 10 % below
    assert s.to_dict() == {"median": 10.0, "min": 9.0, "max": 12.0, "n": 3, "spread": pytest.approx(0.2)}


def test_spread_ignores_nan_and_says_nothing_for_no_data() -> None:
    assert spread([math.nan, 4.0]).median == 4.0
    empty = spread([])
    assert empty.n == 0 and math.isnan(empty.median) and math.isnan(empty.rel)
    assert math.isnan(spread([0.0, 0.0]).rel)  # no relative spread around a zero median


def test_throughput_ratio_is_raw_cpu_over_other_cpu_pairwise() -> None:
    # The same messages: twice the CPU-seconds is half the throughput.
    assert throughput_ratios([2.0, 4.0], [1.0, 1.0]) == [0.5, 0.25]
    r = throughput_ratios([0.0, 1.0], [1.0, 0.0])
    assert all(math.isnan(x) for x in r)  # an unmeasurable run gives no ratio, not infinity
    with pytest.raises(ValueError, match="paired"):
        throughput_ratios([1.0], [1.0, 2.0])


@pytest.mark.parametrize(("q", "want"), [(0, 1.0), (50, 2.5), (100, 4.0), (99, 3.97)])
def test_percentile_interpolates_between_ranks(q: float, want: float) -> None:
    assert percentile([4.0, 1.0, 3.0, 2.0], q) == pytest.approx(want)


def test_percentile_edges() -> None:
    assert percentile([7.0], 99) == 7.0
    assert math.isnan(percentile([], 50))
    with pytest.raises(ValueError):
        percentile([1.0], 101)


def test_cores_used_skips_the_warm_up_half() -> None:
    # 1 core for the first 10 s (start-up), then 0.5 core: steady state is 0.5.
    samples = [(float(t), float(t)) for t in range(0, 11)] + [(10 + t, 10 + 0.5 * t) for t in range(1, 11)]
    assert cores_used(samples) == pytest.approx(0.5)
    assert math.isnan(cores_used([(0.0, 0.0)]))


def test_the_bench_cluster_can_run_several_jobs_on_blocks_of_its_nodes(tmp_path) -> None:
    # The partitioned engine splits work between workers by job: --jobs gives more workers something to split.
    from whywait.engine.commands.bench_cmd import simulated_cluster

    msgs, w = simulated_cluster(8, 1.7e9, 10.0, tmp_path / "t.yaml", jobs=3)
    placed = {m["job"]: sorted({r["node"] for r in m["ranks"]}) for topic, m in msgs if m["kind"] == "placement"}
    assert sorted(placed) == ["train-00", "train-01", "train-02"]
    nodes = [n for ns in placed.values() for n in ns]
    assert len(nodes) == len(set(nodes)) == 8  # every node in exactly one job
    assert w.fault[0] in placed["train-01"]  # the faulty fifth node belongs to one of them
    one, _ = simulated_cluster(4, 1.7e9, 10.0, tmp_path / "u.yaml")
    assert {m["job"] for _, m in one if m["kind"] == "placement"} == {"train-llm"}


def test_the_table_keeps_every_header_whole_off_a_terminal(tmp_path, monkeypatch) -> None:
    """Piped into a file or a CI log, the figures table is printed at full width, not folded into 80 columns."""
    import json
    import subprocess
    import sys

    spread = {"median": 0.1, "spread": 0.05, "min": 0.1, "max": 0.1, "n": 3}
    run = {"cpu_s": spread, "wall_s": spread, "msgs_per_cpu_s": spread, "load": spread, "peak_rss_bytes": 2**27}
    result = {"config": {"reps": 3, "seconds": 60.0, "jobs": 1},
              "machine": {"cpus": 2, "load_at_start": 0.2, "load_at_end": 0.3},
              "sizes": [{"gpus": 1024, "messages": 44289, "raw": run, "engine": run, "replay": run,
                         "ratio_engine_raw": spread, "ratio_replay_raw": spread,
                         "latency_s": {"p50": 0.4, "p99": 0.4, "n": 1}}]}
    f = tmp_path / "r.json"
    f.write_text(json.dumps(result))
    env = {k: v for k, v in __import__("os").environ.items() if k != "COLUMNS"}
    out = subprocess.run([sys.executable, "-c", "import json,sys; from whywait.engine.bench.table import render; "
                          f"render(json.load(open({str(f)!r})))"], capture_output=True, text=True, env=env,
                         timeout=60, check=True).stdout
    for header in ("engine / raw", "replay / raw", "raw msgs/CPU-s", "peak RSS MiB raw/engine/replay"):
        assert header in out, out
    assert "44,289" in out and "…" not in out
