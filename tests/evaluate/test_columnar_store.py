"""The columnar store answers as the list-per-series store did, and its memory does not grow with time kept."""

from __future__ import annotations

import math
import random

import numpy as np
import pytest
from whywait.engine.evaluate.store import COLUMNAR, MetricStore, Series, aggregate

T0 = 1_700_000_000.0
AGGS = ("avg", "min", "max", "sum", "count", "last", "median", "p90", "rate", "delta")


def _filled(seconds: int, entities: int, seed: int = 1, jitter: bool = False) -> tuple[MetricStore, dict[str, Series]]:
    """A store and, beside it, the exact list series of the same points (one per entity per second)."""
    rng = random.Random(seed)
    store, ref = MetricStore(), {}
    for e in range(entities):
        ref[f"n{e}/gpu0"] = Series()
    for sec in range(seconds):
        for e in range(entities):
            if rng.random() < 0.1:  # gaps: a missed sample
                continue
            t = T0 + sec + (rng.uniform(0.01, 0.99) if jitter else 0.0)
            v = rng.gauss(50, 10) if e else float(sec % 7)
            store.put("gpu.temp_c", f"n{e}/gpu0", t, v)
            ref[f"n{e}/gpu0"].add(t, v)
    return store, ref


def test_recent_windows_match_the_list_store_point_for_point() -> None:
    assert "gpu.temp_c" in COLUMNAR
    store, ref = _filled(200, 12)
    now = T0 + 199
    for w in (1.0, 5.0, 10.0, 60.0, 120.0):
        for e, s in ref.items():
            t, v = store.window("gpu.temp_c", e, now - w, now)
            rt, rv = s.window(now - w, now)
            assert list(t) == list(rt) and list(v) == pytest.approx(list(rv))
        for agg in AGGS:
            ents = list(ref)
            got = store.values("gpu.temp_c", ents, agg, now, w)
            for i, e in enumerate(ents):
                want = aggregate(agg, *ref[e].window(now - w, now))
                one = store.value("gpu.temp_c", e, agg, now, w)
                if want is None:
                    assert math.isnan(got[i]) and one is None
                else:
                    assert got[i] == pytest.approx(want, rel=1e-9, abs=1e-9), (agg, w, e)
                    assert one == pytest.approx(want, rel=1e-9, abs=1e-9)


def test_fractional_times_land_in_the_window_they_belong_to() -> None:
    """A point at 100.3 belongs to (91, 101] and not to (90, 100]: windows with whole-second ends keep their points."""
    store, ref = _filled(60, 4, jitter=True)
    now = T0 + 50
    for e, s in ref.items():
        _, rv = s.window(now - 10, now)
        assert list(store.window("gpu.temp_c", e, now - 10, now)[1]) == pytest.approx(list(rv))


def test_two_points_in_one_second_keep_their_sum_and_count() -> None:
    store = MetricStore()
    for v in (1.0, 2.0, 6.0):  # three steps of one rank in one message
        store.put("step.duration_s", "job:0", T0 + 0.5, v)
    assert store.value("step.duration_s", "job:0", "sum", T0 + 1, 5) == 9.0
    assert store.value("step.duration_s", "job:0", "count", T0 + 1, 5) == 3.0
    assert store.values("step.duration_s", ["job:0"], "avg", T0 + 1, 5)[0] == 3.0
    assert store.span("step.duration_s", "job:0", T0 + 30, 5, min_points=3) > 29


def test_memory_per_entity_does_not_grow_with_the_time_kept() -> None:
    a, _ = _filled(300, 64)
    b, _ = _filled(1800, 64)
    assert a.memory_bytes() == b.memory_bytes() > 0
    # and the long past is still there, downsampled: a 10-minute average over the buckets
    now = T0 + 1799
    want = np.mean([v for t, v in zip(*b.window("gpu.temp_c", "n3/gpu0", now - 120, now), strict=True)])
    got = b.value("gpu.temp_c", "n3/gpu0", "avg", now, 600)
    assert got is not None and abs(got - want) < 3.0  # the same gaussian around 50


def test_an_entity_silent_for_the_retention_is_forgotten_and_its_row_reused() -> None:
    store = MetricStore(retention_s=60)
    store.put("gpu.temp_c", "old/gpu0", T0, 1.0)
    store.put("gpu.temp_c", "new/gpu0", T0 + 100, 2.0)
    store.trim(T0 + 100)
    assert list(store.series) == [("gpu.temp_c", "new/gpu0")]
    store.put("gpu.temp_c", "newer/gpu0", T0 + 101, 3.0)
    assert store.window("gpu.temp_c", "newer/gpu0", T0, T0 + 101)[1] == [3.0]
    assert store.window("gpu.temp_c", "old/gpu0", T0 - 1, T0 + 101) == ((), ())


def test_ages_are_vectorised_and_match_age() -> None:
    store = MetricStore()
    for r in range(6):
        for sec in range(0, 40 - 5 * r):
            store.put("step.duration_s", f"job:{r}", T0 + sec, 1.0)
    ents = [f"job:{r}" for r in range(7)]
    ages = store.ages("step.since_last_s", ents, T0 + 30)
    for e, a in zip(ents, ages, strict=True):
        one = store.age("step.since_last_s", e, T0 + 30)
        assert (one is None and math.isnan(a)) or one == a


def test_points_far_ahead_of_the_clock_wait_and_do_not_push_the_window_out() -> None:
    """A backlog can hand over minutes of one metric before the seconds being evaluated: the window read at
    the clock still holds every point (they would otherwise overwrite its slots of the 128 s fine ring)."""
    store = MetricStore()
    store.clock = T0 + 10
    for sec in range(300):  # 300 s of one GPU's temperature, read before the clock moved
        store.put("gpu.temp_c", "n0/gpu0", T0 + sec, float(sec))
    t, v = store.window("gpu.temp_c", "n0/gpu0", T0 + 5, T0 + 10)
    assert list(v) == [6.0, 7.0, 8.0, 9.0, 10.0]
    store.close_buckets(T0 + 250)  # the clock reaches them: applied then
    t, v = store.window("gpu.temp_c", "n0/gpu0", T0 + 245, T0 + 250)
    assert list(v) == [246.0, 247.0, 248.0, 249.0, 250.0]
    assert store.overruns == 0
    # without a clock (after the run, or a store fed without ticks) everything is applied at once
    store.flush(everything=True)
    assert store.window("gpu.temp_c", "n0/gpu0", T0 + 295, T0 + 299)[1] == [296.0, 297.0, 298.0, 299.0]


# ---- rings sized to what the rules read (MetricStore.set_spans) --------------------------------------


def _sized(spans: dict[str, float] | None, seconds: int = 400, entities: int = 6, seed: int = 3) -> MetricStore:
    rng = random.Random(seed)
    store = MetricStore()
    store.set_spans(spans)
    for sec in range(seconds):
        store.clock = T0 + sec  # as the evaluator's ticks move it
        for e in range(entities):
            if rng.random() < 0.1:
                continue
            store.put("gpu.temp_c", f"n{e}/gpu0", T0 + sec + rng.uniform(0.0, 0.99), rng.gauss(60, 5))
    return store


def test_a_column_read_over_short_windows_keeps_a_short_ring_and_answers_as_a_full_one() -> None:
    full, short = _sized(None), _sized({"gpu.temp_c": 10.0})
    col = short.column("gpu.temp_c")
    assert (col.fine, col.coarse) == (64, False)  # 10 s read + 32 s margin -> 64 slots, no buckets
    assert (full.column("gpu.temp_c").fine, full.column("gpu.temp_c").coarse) == (128, True)
    assert short.memory_bytes() < full.memory_bytes() / 2
    ents = [f"n{e}/gpu0" for e in range(6)]
    now = T0 + 399
    for w in (1.0, 5.0, 10.0, 30.0):
        for agg in AGGS:
            a, b = full.values("gpu.temp_c", ents, agg, now, w), short.values("gpu.temp_c", ents, agg, now, w)
            assert np.array_equal(a, b, equal_nan=True), (agg, w)


def test_a_read_past_a_short_ring_widens_it_and_keeps_what_it_held(caplog: pytest.LogCaptureFixture) -> None:
    full, short = _sized(None), _sized({"gpu.temp_c": 10.0})
    ents = [f"n{e}/gpu0" for e in range(6)]
    now = T0 + 399
    got = short.values("gpu.temp_c", ents, "avg", now, 60.0)  # 60 s: more than 64 slots hold with the margin
    assert "read over 60s, longer than its ring" in caplog.text
    col = short.column("gpu.temp_c")
    assert (col.fine, col.coarse) == (128, False)
    # the 64 s the short ring held are all there: a window within them answers as the full store does
    assert np.array_equal(got, full.values("gpu.temp_c", ents, "avg", now, 60.0), equal_nan=True)
    # past the fine ring: a coarse ring is made, filled from the fine slots it had
    short.values("gpu.temp_c", ents, "avg", now, 600.0)
    assert col.coarse
    for e in ents:
        t_full, v_full = full.window("gpu.temp_c", e, now - 200, now)
        t_short, v_short = short.window("gpu.temp_c", e, now - 200, now)
        # the newest 128 s are exact; older buckets only hold what the 64 s ring had
        assert list(t_short)[-100:] == list(t_full)[-100:]
        assert list(v_short)[-100:] == pytest.approx(list(v_full)[-100:])


def test_a_longer_span_grows_the_columns_already_made() -> None:
    store = _sized({"gpu.temp_c": 10.0}, seconds=100)
    before = store.values("gpu.temp_c", ["n1/gpu0"], "count", T0 + 99, 30.0)
    store.set_spans({"gpu.temp_c": 200.0})  # a rule reading 200 s was loaded
    col = store.column("gpu.temp_c")
    assert (col.fine, col.coarse) == (128, True)
    assert np.array_equal(before, store.values("gpu.temp_c", ["n1/gpu0"], "count", T0 + 99, 30.0))


def test_the_rules_spans_name_each_metric_s_longest_window_and_leave_step_counted_ones_unbounded() -> None:
    from pathlib import Path

    from whywait.engine.evaluate.conditions import IMPLICIT_METRICS
    from whywait.engine.evaluate.evaluator import rule_spans
    from whywait.engine.rules.loader import load_rules

    rules = load_rules([Path(__file__).resolve().parents[2] / "rules"])
    spans = rule_spans(rules)
    assert spans["gpu.thermal_throttle"] == 60.0  # gpu.thermal-throttle: a 60 s window
    assert spans["storage.write_latency_ms"] == 300.0  # a 300 s baseline counts as a window
    assert not IMPLICIT_METRICS & spans.keys()  # read by the engine's own code: full rings
    # self_history over steps (a job with 40 s steps reaches far back): no span, so full rings
    assert "step.duration_s" not in spans
    store = MetricStore()
    store.set_spans(spans)
    assert store.column("step.duration_s").fine == 256 and store.column("step.duration_s").coarse


def test_node_report_times_stay_sorted_compact_and_bounded() -> None:
    store = MetricStore(retention_s=60.0)
    for sec in (0, 1, 2, 4, 3, 3):  # a late report, and two kinds of one second
        store.ingest({"schema": 2, "kind": "host", "time": T0 + sec, "node": "n1", "cpu_busy_pct": 1.0,
                      "cpu_iowait_pct": 0.0, "mem_used_bytes": 1, "mem_total_bytes": 2})
    seen = store.node_seen["n1"]
    assert list(seen.t) == [T0, T0 + 1, T0 + 2, T0 + 3, T0 + 3, T0 + 4]
    assert seen.t.itemsize == 8  # an array of doubles, not a list of float objects
    assert store.age("node.since_last_s", "n1", T0 + 3.5) == pytest.approx(0.5)
    store.trim(T0 + 62.5)
    assert list(seen.t) == [T0 + 3, T0 + 3, T0 + 4]


@pytest.mark.parametrize("metric, ent", [("step.duration_s", "j:{}"), ("gpu.temp_c", "n{}/gpu0")])
def test_a_window_wider_than_the_ring_over_rows_that_stopped_long_ago_is_empty_not_an_error(
        metric: str, ent: str) -> None:
    # A finished job's ranks stopped at T0+100; an hour later a rule reads them over a window wider than the
    # ring, starting after their last point (a new job's data came in between).  The columns wrapped onto
    # themselves and the read raised IndexError (a replay printed the traceback three times).
    store = MetricStore()
    ents = [ent.format(i) for i in range(4)]
    for sec in range(101):
        for e in ents:
            store.put(metric, e, T0 + sec, 1.0 + sec / 100)
    fine = store.column(metric).fine
    now = T0 + 3600.0
    for window in (fine + 10.0, 3 * fine + 0.5):
        assert now - window > T0 + 100 - fine  # past the rows' fine rings' guard: the matrix is used
        for agg in AGGS:
            got = store.values(metric, ents, agg, now, window)
            assert np.isnan(got).all(), (agg, window)
    # the same rows read over a window that holds their points still answer
    assert store.values(metric, ents, "last", T0 + 100, 10.0) == pytest.approx([2.0] * 4)
