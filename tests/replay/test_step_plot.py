"""The step panels draw a long step over the time it ran, not as a ramp from the step before it."""

from __future__ import annotations

import math

from whywait.engine.report.plots import covered, spanned

NAN = math.nan


def centres(n: int, width: float = 2.0) -> list[float]:
    return [100.0 + (i + 0.5) * width for i in range(n)]


def test_a_twelve_second_step_spans_the_buckets_before_its_end() -> None:
    # 2 s buckets: 1 s steps end in every bucket, then one 12 s step ends in bucket 9 (its start, 107, is in bucket 3)
    d = [1.0, 1.0, 1.0, NAN, NAN, NAN, NAN, NAN, NAN, 12.0, 1.0]
    assert spanned(centres(len(d)), d, 2.0) == [0, 1, 2, 9, 9, 9, 9, 9, 9, 9, 10]
    assert covered(centres(len(d)), d, 2.0) == [1.0, 1.0, 1.0, 12.0, 12.0, 12.0, 12.0, 12.0, 12.0, 12.0, 1.0]


def test_a_bucket_no_step_ran_in_stays_a_gap() -> None:
    # before the first step; a hang (buckets 4-6) that the next, 3 s step does not explain; after the last step
    d = [NAN, NAN, 1.0, 1.0, NAN, NAN, NAN, 3.0, 1.0, NAN]
    got = spanned(centres(len(d)), d, 2.0)
    assert got == [None, None, 2, 3, None, None, 7, 7, 8, None]
    ys = covered(centres(len(d)), d, 2.0)
    assert [math.isnan(y) for y in ys] == [True, True, False, False, True, True, False, False, False, True]


def test_short_steps_are_left_as_they_are() -> None:
    d = [0.8, 0.9, 0.85, 0.8]
    assert covered(centres(4), d, 2.0) == d
    assert covered([], [], 2.0) == []


def test_a_hang_is_binned_over_the_time_it_took_not_averaged_into_its_last_bucket() -> None:
    # A tester's table: step 200 lasts 600 s on every rank, then 0.82 s steps again.  Averaged into the bucket
    # where it ended with the short steps after it, it was drawn ~200 s high and ~200 s long.
    from whywait.engine.report.sampler import Grid, Sampler

    g = Grid(0.0, 1200.0, n=600)  # 2 s buckets
    s = Sampler(g, set(), {"j"})
    t = 100.0
    for _ in range(10):  # short steps before
        t += 0.82
        s.put("step.duration_s", "j:0", t, 0.82)
    t += 600.0
    s.put("step.duration_s", "j:0", t, 600.0)
    s.put("step.comm_s", "j:0", t, 599.2)  # the phase of that step spans it too
    for _ in range(5):
        t += 0.82
        s.put("step.duration_s", "j:0", t, 0.82)
    means = s.means("step.duration_s", "j:0")
    assert means is not None
    inside = [m for i, m in enumerate(means) if 112 <= g.t0 + i * g.width and g.t0 + (i + 1) * g.width <= 708]
    assert len(inside) >= 290 and all(m == 600.0 for m in inside), inside[:3]
    assert means[int(50 // 2)] == 0.0 or math.isnan(means[int(50 // 2)])  # before the job: nothing
    assert means[int(101 // 2)] < 1.0  # the short steps stay short
    comm = s.means("step.comm_s", "j:0")
    assert comm is not None and comm[int(400 // 2)] == 599.2


def test_a_name_no_installed_font_holds_draws_without_a_warning_on_stderr(tmp_path, recwarn) -> None:  # type: ignore[no-untyped-def]
    # A project named '项目-ü 🚀': matplotlib printed "UserWarning: Glyph 39033 missing from font(s) DejaVu Sans"
    # three times into the command's output.
    from whywait.plotting import FONT_FALLBACK, pyplot

    plt = pyplot()
    assert plt.rcParams["font.sans-serif"][: len(FONT_FALLBACK)] == FONT_FALLBACK
    fig, ax = plt.subplots()
    ax.set_title("项目-ü 🚀 job")
    fig.tight_layout()
    fig.savefig(tmp_path / "x.png")
    plt.close(fig)
    assert not [w for w in recwarn if "Glyph" in str(w.message) or "findfont" in str(w.message)]


def test_the_panel_draws_each_ranks_own_work_where_the_job_reports_phases() -> None:
    """A synchronous job's ranks all report the slowest one's step time: drawn as step time, the straggler of a
    tester's step table lay on top of the others.  Its own work (compute plus input wait) stands out."""
    from whywait.engine.report.plots import rank_work
    from whywait.engine.report.sampler import Grid, Sampler

    g = Grid(0.0, 20.0, n=10)  # 2 s buckets
    s = Sampler(g, set(), {"j", "d"})
    t = 0.0
    for _ in range(10):
        t += 1.05
        for rank, compute in ((0, 0.62), (5, 0.93)):
            s.put("step.duration_s", f"j:{rank}", t, 1.05)
            s.put("step.data_wait_s", f"j:{rank}", t, 0.015)
            s.put("step.compute_s", f"j:{rank}", t, compute)
            s.put("step.comm_s", f"j:{rank}", t, 1.05 - 0.015 - compute)
        s.put("step.duration_s", "d:0", t, 1.05)  # a job that reports durations only
    c = g.times()
    fast, as_work = rank_work(s, "j:0", c, g.width)
    slow, _ = rank_work(s, "j:5", c, g.width)
    assert as_work and abs(fast[1] - 0.635) < 1e-9 and abs(slow[1] - 0.945) < 1e-9
    only, as_work = rank_work(s, "d:0", c, g.width)
    assert not as_work and abs(only[1] - 1.05) < 1e-9
