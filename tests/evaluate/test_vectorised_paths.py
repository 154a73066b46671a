"""The fast paths of ingest and of the step judgement give exactly what the plain per-item loops gave.

Ingest reads list entries column by column and stores them per list (``MetricStore.put_many``); the
step judgement takes medians over steps x ranks with numpy and keeps each step's statistics.  Each
test here runs the fast path beside a plain reference written the obvious way (the code these paths
replaced) and asks for equal results to the last bit, not approximately: a diagnosis must not move.
"""

from __future__ import annotations

import random
import statistics
from typing import Any

import msgspec
import numpy as np
import pytest
from whywait.agents.events import columns, decode, encode, envelope
from whywait.engine.evaluate import steps as steps_module
from whywait.engine.evaluate.steps import (
    _HOT_ROWS,
    FrozenRow,
    RankJudgement,
    StepRec,
    StepRow,
    StepTable,
    column_medians,
    column_of,
    fast_sigma,
    judge_ranks,
    known,
    lower_quartile,
    rank_matrix,
    row_end,
    row_median,
    slow_turns,
    spread_lines,
)
from whywait.engine.evaluate.store import MetricStore

T0 = 1_764_442_800.0


# ---- the step judgement -----------------------------------------------------------------------------

def _reference_judge(window: Any, history: Any, groups: Any, measure: str, ratio_thr: float, min_history: int,
                     min_group: int = 2, z_thr: float = 4.0) -> list[RankJudgement]:
    """``judge_ranks`` as a loop over ranks with ``statistics.median`` (the implementation it replaced)."""
    out: list[RankJudgement] = []
    for g, members in groups.items():
        if len(members) < min_group:
            continue
        per_rank: dict[int, list[float]] = {r: [] for r in members}
        at: dict[int, dict[int, float]] = {r: {} for r in members}
        zs: dict[int, list[float]] = {r: [] for r in members}
        slow_steps: dict[int, list[int]] = {r: [] for r in members}
        refs: list[float] = []
        values: dict[int, list[float]] = {r: [] for r in members}
        for i, (_, row) in enumerate(window):
            vals = {r: row[r].get(measure) for r in members if r in row}
            known = {r: v for r, v in vals.items() if v is not None}
            if len(known) < min_group:
                continue
            ref = lower_quartile(list(known.values()))
            if ref <= 0:
                continue
            refs.append(ref)
            ratios = {r: v / ref for r, v in known.items()}
            centre = statistics.median(ratios.values())
            fast = [x for x in ratios.values() if x <= centre]
            fmed = statistics.median(fast)
            scale = max(fast_sigma(fast, fmed), 0.02)
            for r, x in ratios.items():
                per_rank[r].append(x)
                at[r][i] = x
                values[r].append(known[r])
                z = (x - fmed) / scale
                zs[r].append(z)
                if x >= ratio_thr and z >= z_thr:
                    slow_steps[r].append(i)
        hist: dict[int, list[float]] = {r: [] for r in members}
        for _, row in history:
            known = {r: v for r in members if r in row and (v := row[r].get(measure)) is not None}
            if len(known) < min_group:
                continue
            ref = lower_quartile(list(known.values()))
            if ref > 0:
                for r, v in known.items():
                    hist[r].append(v / ref)
        meds = {r: statistics.median(x) for r, x in per_rank.items() if x}
        if len(meds) < min_group:
            continue
        ref_med = statistics.median(refs) if refs else 0.0
        for r, m in meds.items():
            h = hist[r]
            h_med = statistics.median(h) if len(h) >= min_history and h else None
            h_spread = 1.4826 * statistics.median(abs(x - h_med) for x in h) if h_med is not None else None
            out.append(RankJudgement(
                rank=r, group=g, ratio=m, slow_share=len(slow_steps[r]) / len(per_rank[r]),
                z=statistics.median(zs[r]), history_ratio=h_med,
                value=statistics.median(values[r]), reference=ref_med, slow_at=frozenset(slow_steps[r]),
                history_spread=h_spread, ratios=tuple(per_rank[r]), ratio_at=at[r]))
    return out


def _table(rng: random.Random, ranks: int, steps: int, split: bool, gaps: float) -> StepTable:
    """A job's steps with lognormal noise, a slow rank or two, missing ranks and missing phases."""
    tab = StepTable()
    slow = set(rng.sample(range(ranks), k=min(2, ranks)))
    order = list(range(ranks))
    for s in range(steps):
        rng.shuffle(order)  # ranks report in any order
        for r in order:
            if rng.random() < gaps:
                continue
            comp = 0.7 * rng.lognormvariate(0, 0.05) * (1.8 if r in slow and s > steps // 2 else 1.0)
            if rng.random() < 0.02:
                comp = 0.0  # an empty step: a zero reference must be skipped, as before
            t = T0 + s + rng.uniform(0, 0.3)
            if split:
                tab.add(s, r, StepRec(t, 1.2, data_wait_s=0.01 * rng.random(), compute_s=comp, comm_s=0.3))
            else:
                tab.add(s, r, StepRec(t, comp + 0.3))
    return tab


@pytest.mark.parametrize("seed", range(12))
def test_judge_ranks_equals_the_loop_over_ranks_to_the_bit(seed: int) -> None:
    rng = random.Random(seed)
    ranks = rng.choice((3, 8, 17, 64))
    tab = _table(rng, ranks, steps=rng.randint(3, 90), split=seed % 3 != 0, gaps=rng.choice((0.0, 0.05, 0.3)))
    done = [(s, row) for s, row in tab.steps.items()]
    cut = rng.randint(0, len(done))
    win, hist = done[cut:], done[:cut]
    members = list(range(ranks))
    groups = {"": members} if seed % 2 else {"0": members[::2], "1": members[1::2]}
    for measure in ("work", "duration_s", "compute_s", "checkpoint_s"):
        for min_history in (0, 5, 20):
            want = _reference_judge(win, hist, groups, measure, 1.1, min_history)
            for _ in range(2):  # the second time from the statistics kept on the steps
                got = judge_ranks(win, hist, groups, measure, 1.1, min_history)
                assert got == want
                for a, b in zip(got, want, strict=True):  # exact floats, and plain Python types
                    assert (type(a.ratio), type(a.z), type(a.value)) == (float, float, float)
                    assert list(a.ratio_at or {}) == list(b.ratio_at or {})


def _reference_turns(win: Any, ranks: list[int], groups: dict[str, list[int]], measure: str,
                     is_ratio: Any, is_z: Any) -> list[tuple[float, int] | None]:
    """The rotation's slow turn per step, as the per-step loop over groups it replaced computed it."""
    usual: dict[int, float] = {}
    for r in ranks:
        xs = [v for _, row in win if r in row and (v := row[r].get(measure)) is not None]
        if xs:
            usual[r] = statistics.median(xs)
    out: list[tuple[float, int] | None] = []
    for _, row in win:
        best: tuple[float, int] | None = None
        for members in groups.values():
            known = {r: v / usual[r] for r in members
                     if r in row and (v := row[r].get(measure)) is not None and usual.get(r)}
            if len(known) < 4:
                continue
            vals = sorted(known.values())
            ref = lower_quartile(vals)
            centre = statistics.median(vals)
            fast = [v for v in vals if v <= centre]
            fmed = statistics.median(fast)
            scale = max(1.4826 * statistics.median(abs(v - fmed) for v in fast), 0.02 * ref, 1e-9)
            top = max(known, key=lambda r: known[r])
            q, z = known[top] / ref if ref > 0 else 0.0, (known[top] - fmed) / scale
            if is_ratio(q) and is_z(z) and (best is None or q > best[0]):
                best = (q, top)
        out.append(best)
    return out


@pytest.mark.parametrize("seed", range(12))
def test_slow_turns_equal_the_loop_over_steps_to_the_bit(seed: int) -> None:
    rng = random.Random(100 + seed)
    ranks = rng.choice((3, 8, 17, 64))
    tab = _table(rng, ranks, steps=rng.randint(3, 60), split=seed % 3 != 0, gaps=rng.choice((0.0, 0.05, 0.3)))
    win = [(s, row) for s, row in tab.steps.items()]
    members = list(range(ranks))
    groups = {"": members} if seed % 2 else {"0": members[::2], "1": members[1::2]}
    col = {r: i for i, r in enumerate(members)}
    cols = [[col[r] for r in m] for m in groups.values()]
    for measure in ("work", "duration_s", "compute_s"):
        for thr_q, thr_z in ((1.0, 0.0), (1.05, 2.0), (1.15, 8.0)):
            def is_q(q: float, thr: float = thr_q) -> bool:
                return q > thr

            def is_z(z: float, thr: float = thr_z) -> bool:
                return z > thr
            want = _reference_turns(win, members, groups, measure, is_q, is_z)
            for _ in range(2):  # the second time from the lines kept on the steps
                mat = rank_matrix(win, members, measure)
                got = slow_turns(mat, column_medians(mat), cols, is_q, is_z)
                assert [None if g is None else (g[0], members[g[1]]) for g in got] == want
                assert all(g is None or (type(g[0]), type(g[1])) == (float, int) for g in got)


def test_slow_turns_with_ties_and_a_rank_that_never_reported() -> None:
    # Equal values (the first of equal maxima is the slow one, as max() picks), and a rank with no usual
    # level at all (never reported the measure: left out, not a NaN that poisons the group).
    rows = []
    for s in range(6):
        row = {r: StepRec(float(s), 1.0, compute_s=1.0, data_wait_s=0.0, comm_s=0.0) for r in range(6)}
        row[2 + s % 3] = StepRec(float(s), 1.0, compute_s=2.0, data_wait_s=0.0, comm_s=0.0)
        row[6] = StepRec(float(s), 1.0)  # no split: no compute_s
        rows.append((s, row))
    members = list(range(7))
    want = _reference_turns(rows, members, {"": members}, "compute_s", lambda q: q > 1.1, lambda z: z > 3)
    mat = rank_matrix(rows, members, "compute_s")
    got = slow_turns(mat, column_medians(mat), [members], lambda q: q > 1.1, lambda z: z > 3)
    assert [None if g is None else (g[0], g[1]) for g in got] == want
    assert [g[1] for g in want if g] == [2, 3, 4, 2, 3, 4]


def test_a_late_rank_renews_the_steps_statistics() -> None:
    tab = StepTable()
    for r in range(8):
        tab.add(0, r, StepRec(T0, 1.0, compute_s=1.0))
    rows = list(tab.steps.items())
    before = judge_ranks(rows, [], {"": list(range(9))}, "work", 1.1, 0)
    tab.add(0, 8, StepRec(T0 + 0.5, 3.0, compute_s=3.0))  # rank 8 reports late, and slow
    after = judge_ranks(rows, [], {"": list(range(9))}, "work", 1.1, 0)
    assert after == _reference_judge(rows, [], {"": list(range(9))}, "work", 1.1, 0)
    assert len(after) == len(before) + 1 and after[-1].ratio == 3.0


def test_complete_steps_follow_the_latest_rank_even_when_a_record_is_replaced() -> None:
    tab = StepTable()
    tab.add(0, 0, StepRec(T0 + 5, 1.0))
    tab.add(0, 1, StepRec(T0 + 1, 1.0))
    assert tab.complete(T0 + 4) == []
    tab.add(0, 0, StepRec(T0 + 2, 1.0))  # the same rank's record again, earlier (a corrected report)
    assert [s for s, _ in tab.complete(T0 + 4)] == [0]


def test_kept_step_statistics_are_bounded_per_job() -> None:
    tab = _table(random.Random(3), 16, steps=400, split=True, gaps=0.0)
    rows = list(tab.steps.items())
    judge_ranks(rows[-300:], [], {"": list(range(16))}, "work", 1.1, 0)
    held = sum(1 for _, row in rows if getattr(row, "stats", None))
    assert 0 < held <= 128


def _records(row: Any) -> dict[int, StepRec]:
    return dict(row.items())


@pytest.mark.parametrize("split", [True, False])
def test_steps_older_than_the_hot_ones_are_frozen_and_read_the_same(split: bool, monkeypatch: pytest.MonkeyPatch
                                                                     ) -> None:
    tab = _table(random.Random(11), 24, steps=_HOT_ROWS + 90, split=split, gaps=0.1)
    kinds = [type(row) for row in tab.steps.values()]
    assert kinds == [FrozenRow] * 90 + [StepRow] * _HOT_ROWS
    # the same records again (the same seed), in a table that freezes nothing: what it held before
    monkeypatch.setattr(steps_module, "_HOT_ROWS", 10**9)
    again = list(_table(random.Random(11), 24, steps=_HOT_ROWS + 90, split=split, gaps=0.1).steps.items())
    assert all(isinstance(row, StepRow) for _, row in again)
    copies = [(s, dict(sorted(_records(row).items()))) for s, row in again]
    for (_, row), (_, want) in zip(tab.steps.items(), copies, strict=True):
        if isinstance(row, FrozenRow):
            assert _records(row) == want and len(row) == len(want) and list(row) == sorted(want)
            assert row_end(row) == max(r.t for r in want.values())
            assert row_median(row) == statistics.median(r.duration_s for r in want.values())
            for measure in ("work", "duration_s", "compute_s", "data_wait_s", "comm_s"):
                got = row.of(range(26), measure)  # ranks 24 and 25 never reported
                ref = [np.nan if r not in want or want[r].get(measure) is None else want[r].get(measure)
                       for r in range(26)]
                np.testing.assert_array_equal(got, np.array(ref, np.float64))
                np.testing.assert_array_equal(column_of(row, range(26), measure), column_of(want, range(26), measure))
                assert known(row, None, measure, skip=3) == known(want, None, measure, skip=3)
                assert known(row, [5, 1, 25], measure) == known(want, [5, 1, 25], measure)
            assert 99 not in row and row.get(99) is None and "x" not in row
    rows = list(tab.steps.items())
    members = {"": list(range(24))}
    for measure in ("work", "duration_s"):
        judged = judge_ranks(rows[-60:], rows[:-60], members, measure, 1.1, 20)
        assert judged == _reference_judge(copies[-60:], copies[:-60], members, measure, 1.1, 20)
        np.testing.assert_array_equal(rank_matrix(rows, list(range(24)), measure),
                                      rank_matrix(copies, list(range(24)), measure))


def test_a_rank_reporting_a_frozen_step_late_is_put_in_place() -> None:
    tab = _table(random.Random(4), 8, steps=_HOT_ROWS + 5, split=True, gaps=0.0)
    judge_ranks(list(tab.steps.items())[:5], [], {"": list(range(9))}, "work", 1.1, 0)
    assert isinstance(tab.steps[0], FrozenRow) and tab.steps[0].stats  # judged frozen: its statistics kept
    tab.add(0, 8, StepRec(T0 + 9.0, 3.0, compute_s=3.0))  # rank 8 reports step 0 very late, and slow
    tab.add(0, 3, StepRec(T0 + 0.5, 1.5, compute_s=1.5, checkpoint_s=0.25))  # rank 3 corrects its report
    row = tab.steps[0]
    assert isinstance(row, FrozenRow) and row.stats is None and len(row) == 9 and row.t_max == T0 + 9.0
    assert row[8] == StepRec(T0 + 9.0, 3.0, compute_s=3.0)
    assert row[3] == StepRec(T0 + 0.5, 1.5, compute_s=1.5, checkpoint_s=0.25)
    assert row[2].checkpoint_s is None and row[2].comm_s == 0.3  # the others keep what they sent
    assert all(r is not row for r in tab._with_stats)
    rows = list(tab.steps.items())
    assert judge_ranks(rows, [], {"": list(range(9))}, "work", 1.1, 0)[-1].rank == 8


def test_a_frozen_step_takes_its_statistics_along_and_stays_bounded() -> None:
    tab = StepTable()
    for s in range(_HOT_ROWS + 200):
        for r in range(4):
            tab.add(s, r, StepRec(T0 + s, 1.0, compute_s=0.5 + 0.1 * r))
        judge_ranks(list(tab.steps.items())[-1:], [], {"": [0, 1, 2, 3]}, "work", 1.1, 0)
    held = [row for row in tab.steps.values() if row.stats]  # type: ignore[attr-defined]
    assert len(held) == 128 and all(isinstance(r, (StepRow, FrozenRow)) for r in held)
    assert set(map(id, held)) == set(map(id, tab._with_stats))


def test_frozen_steps_hold_a_fraction_of_the_records_memory() -> None:
    tab = _table(random.Random(2), 64, steps=_HOT_ROWS + 10, split=True, gaps=0.0)
    frozen = tab.steps[0]
    assert isinstance(frozen, FrozenRow)
    held = frozen.ranks.nbytes + sum(c.nbytes for c in frozen.cols.values())
    assert held == 64 * (4 + 8 * 5)  # t, duration and the three phases sent; the other three not kept


def test_step_rec_work_is_computed_once_and_read_by_get() -> None:
    r = StepRec(1.0, 2.0, data_wait_s=0.1, compute_s=1.2, comm_s=0.7)
    assert r.get("work") == 1.2 + 0.1 and r.get("comm_s") == 0.7 and r.get("checkpoint_s") is None
    assert r == StepRec(1.0, 2.0, data_wait_s=0.1, compute_s=1.2, comm_s=0.7)


# ---- ingest ------------------------------------------------------------------------------------------

def _messages(rng: random.Random, node: str, t: float) -> list[dict[str, Any]]:
    """One second of a node's telemetry, with optional fields present or not."""
    gpus = []
    for g in range(4):
        gpus.append({"gpu": g, "util_pct": rng.uniform(0, 100), "mem_util_pct": 50.0, "mem_used_bytes": 7 * 10**10,
                     "mem_total_bytes": 8 * 10**10, "temp_c": rng.uniform(40, 90), "power_w": rng.uniform(100, 700),
                     "sm_clock_mhz": 1900.0, "throttle_reasons": rng.choice(([], ["sw_power_cap"],
                                                                             ["hw_thermal_slowdown"])),
                     "ecc_corrected": rng.randint(0, 3), "ecc_uncorrected": 0, "xid": rng.choice(([], [79], [48, 48]))}
                    | ({"power_limit_w": 700.0, "sm_clock_max_mhz": 1980.0} if g % 2 else {}))
    nvml = [{"gpu": g, "responsive": g != 2, "latency_ms": 0.5 + g, "calls": 10, "errors": g, "timeouts": 0}
            for g in range(4)]
    pcie = [{"device": f"0000:1{g}:00.0", "class": "gpu", "gpu": g, "width": 16 if g else 8, "width_max": 16,
             "gen": 5, "gen_max": 5} | ({"aer_correctable": 2, "tx_bytes_per_s": 1e9} if g == 1 else {})
            for g in range(4)]
    pcie.append({"device": "0000:40:00.0", "class": "nic", "width": 8, "width_max": 16, "gen": 4, "gen_max": 5,
                 "nics": ["mlx5_0"]})
    steps = [{"rank": r, "step": int(t - T0), "duration_s": 1.0, "data_wait_s": 0.01, "compute_s": 0.6}
             | ({"comm_s": 0.39} if r % 3 else {"collective_s": 0.3} if r % 3 == 0 and r else {}) for r in range(4)]
    return [
        envelope("gpu", node, t, gpus=gpus),
        envelope("hw", node, t, kernel=[], nvml=nvml, pcie=pcie),
        envelope("steps", node, t, job="j", steps=steps),
    ]


def _dump(store: MetricStore, now: float) -> dict[tuple[str, str], tuple[list[float], list[float]]]:
    store.flush(everything=True)
    out = {}
    for key, s in store.series.items():
        t, v = s.window(now - 1000, now)
        out[key] = (list(t), list(v))
    return out


def test_typed_and_plain_messages_store_the_same_points() -> None:
    """A decoded message (typed entries, read by attribute) and the same message as plain dicts agree exactly."""
    rng = random.Random(5)
    msgs = [m for sec in range(20) for n in ("node-01", "node-02") for m in _messages(rng, n, T0 + sec)]
    typed, plain = MetricStore(), MetricStore()
    for m in msgs:
        ev = decode(encode(m))
        typed.ingest(ev)
        plain.ingest(msgspec.json.decode(encode(m)))  # plain dicts and lists
    a, b = _dump(typed, T0 + 20), _dump(plain, T0 + 20)
    assert a == b and len(a) > 100
    assert typed.step_tables["j"].steps.keys() == plain.step_tables["j"].steps.keys()
    for s in typed.step_tables["j"].steps:
        assert dict(typed.step_tables["j"].steps[s]) == dict(plain.step_tables["j"].steps[s])
    # comm_s derived from its parts where the producer sent only those
    assert ("step.comm_s", "j:0") not in a  # neither comm_s nor its parts: unknown
    assert a[("step.comm_s", "j:1")][1][0] == 0.39 and a[("step.comm_s", "j:3")][1][0] == 0.3


def test_a_list_mixing_typed_and_plain_entries_is_read_entry_by_entry() -> None:
    """The topology renames a NIC by replacing its entry with a dict: the list then mixes both kinds."""
    ev = decode(encode(envelope("gpu", "n", T0, gpus=[
        {"gpu": g, "util_pct": 1.0 + g, "mem_util_pct": 1.0, "mem_used_bytes": 1, "mem_total_bytes": 2, "temp_c": 50.0,
         "power_w": 100.0, "sm_clock_mhz": 1.0, "throttle_reasons": [], "ecc_corrected": 0, "ecc_uncorrected": 0,
         "xid": []} for g in range(3)])))
    gpus = list(ev["gpus"])
    gpus[1] = {**gpus[1], "gpu": 7}
    assert columns(gpus, ("gpu", "util_pct")) == [(0, 7, 2), (1.0, 2.0, 3.0)]
    assert columns([], ("gpu",)) == [()]


def test_rows_are_cached_per_list_and_renewed_when_rows_are_freed() -> None:
    store = MetricStore(retention_s=60)
    rng = random.Random(1)
    for sec in range(5):
        for m in _messages(rng, "node-01", T0 + sec):
            store.ingest(decode(encode(m)))
    assert store._ents  # the node's GPUs and ranks were resolved once
    for sec in range(200, 205):  # node-01 silent for the whole retention: its rows are freed...
        for m in _messages(rng, "node-02", T0 + sec):
            store.ingest(decode(encode(m)))
    store.trim(T0 + 205)
    assert "node-01/gpu0" not in store.levels["gpu"].index
    for m in _messages(rng, "node-01", T0 + 206):  # ...and it comes back: new rows, not the freed numbers
        store.ingest(decode(encode(m)))
    store.flush(everything=True)
    t, v = store.window("gpu.temp_c", "node-01/gpu0", T0 + 200, T0 + 206)
    assert list(t) == [T0 + 206] and list(store.window("gpu.temp_c", "node-02/gpu0", T0 + 205, T0 + 206)[0]) == []
    assert np.isfinite(v).all()


def _spread_reference(vals: np.ndarray, usual: np.ndarray, groups: list[list[int]]) -> tuple[list[float], list[float],
                                                                                          list[int]]:
    """spread_lines written the obvious way: NaN-aware numpy, one step at a time."""
    disp, ratio, col = [], [], []
    for line in vals:
        pooled: list[float] = []
        where: list[int] = []
        for members in groups:
            cols = [c for c in members if not np.isnan(usual[c]) and usual[c] != 0]
            if len(cols) < 4:
                continue
            x = np.array([line[c] / usual[c] for c in cols])
            med = np.nanmedian(x) if (~np.isnan(x)).any() else np.nan
            for c, v in zip(cols, x, strict=True):
                if not np.isnan(v) and med > 0:
                    pooled.append(v / med)
                    where.append(c)
        if len(pooled) < 4:
            disp.append(np.nan)
            ratio.append(np.nan)
            col.append(-1)
            continue
        q25, q75 = np.percentile(pooled, [25.0, 75.0])
        top = int(np.argmax(pooled))
        disp.append(q75 - q25)
        ratio.append(pooled[top] / q25)
        col.append(where[top])
    return disp, ratio, col


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_spread_lines_sorts_complete_steps_as_the_nan_aware_quantiles_do(seed: int) -> None:
    rng = np.random.default_rng(seed)
    vals = rng.lognormal(0.0, 0.2, size=(30, 24))
    vals[3, 5] = vals[7, 0] = vals[7, 11] = np.nan  # ranks that did not report a step
    vals[9, :] = np.nan  # a step nobody reported
    vals[12, 2:] = np.nan  # a step with two values only
    usual = np.nanmedian(vals, axis=0)
    usual[4] = np.nan  # a rank with no usual level
    groups = [list(range(0, 12)), list(range(12, 24)), [0, 1]]
    got = spread_lines(vals, usual, groups)
    want = _spread_reference(vals, usual, groups)
    np.testing.assert_allclose(got[0], want[0], rtol=1e-12, equal_nan=True)
    np.testing.assert_allclose(got[1], want[1], rtol=1e-12, equal_nan=True)
    assert got[2].tolist() == want[2]


def test_zero_in_sees_a_point_other_than_zero_until_it_leaves_the_window() -> None:
    store = MetricStore()
    assert store.zero_in("gpu.nvml_timeouts", 100.0, 60.0)  # never stored: nothing above 0 anywhere
    for t in range(1, 121):
        for g in range(4):
            store.put("gpu.nvml_timeouts", f"n1/gpu{g}", float(t), 3.0 if (t, g) == (50, 2) else 0.0)
    assert not store.zero_in("gpu.nvml_timeouts", 100.0, 60.0)  # (40, 100] holds the 3 at 50
    assert not store.zero_in("gpu.nvml_timeouts", 50.0, 1.0)  # (49, 50]
    assert store.zero_in("gpu.nvml_timeouts", 120.0, 70.0)  # (50, 120]: only zeros
    store.put("gpu.nvml_timeouts", "n1/gpu0", 121.0, float("nan"))  # unknown is not "zero"
    assert not store.zero_in("gpu.nvml_timeouts", 121.0, 10.0)


@pytest.mark.parametrize("fault", ["gpu-ecc-xid", "gpu-nvml-hang", "pcie-downgrade", "nic-speed-low"])
def test_skipping_windows_of_zeros_changes_no_diagnosis(fault: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """The threshold and event conditions skip reading a window that holds nothing but zeros
    (MetricStore.zero_in); with the skip turned off every shipped rule concludes the same."""
    from whywait.engine.rules.loader import load_rules
    from whywait.simulate.eval import build_suite, run_scenario

    rules = load_rules(["rules"])
    sc = next(s for s in build_suite(quick=True, classes=[fault]) if not s.fault_free)
    fast = run_scenario(rules, sc).diagnoses
    monkeypatch.setattr(MetricStore, "zero_in", lambda self, metric, now, window_s: False)
    slow = run_scenario(rules, sc).diagnoses
    assert fast == slow
    assert fast, f"{sc.name}: the scenario should give diagnoses to compare"
