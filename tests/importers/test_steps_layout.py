"""A pipeline-parallel job's layout, from a step table's ``pp``/``dp``/``tp`` columns or ``--layout``, in its placement.

``whywait import`` published ranks with a node and a GPU only, so the stage rules could not compare a rank with
its own pipeline stage, and ``job.stage-imbalance`` never saw a stage.  Now the placement's ranks carry the
coordinates the table's columns or ``import --layout pp=4,dp=2`` (Megatron-LM's rank order) give them.
"""

from __future__ import annotations

import argparse
import json
import random
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
from whywait.agents.events import validate
from whywait.engine.importers import ImportFormatError
from whywait.engine.importers.steps_table import (
    Coords,
    layout_coords,
    parse_layout,
    rank_coords,
    read_step_rows,
    read_steps,
)

from tests.replay.test_slow_since_start import REPO, START


def _args(**kw: Any) -> argparse.Namespace:
    """``whywait import``'s arguments, as ``timing_messages`` reads them."""
    base = {"job": None, "node": None, "rank": None, "project": "llm", "team": "ml", "channel": None, "layout": None}
    return argparse.Namespace(**{**base, **kw})


def _placed(tmp_path: Path, text: str, notes: Counter[str] | None = None, **kw: Any) -> list[dict[str, Any]]:
    """The ranks of the ``running`` placement imported from a table holding ``text``."""
    from whywait.engine.commands.import_cmd import timing_messages

    f = tmp_path / "steps.csv"
    f.write_text(text)
    msgs = timing_messages(_args(**kw), [(f, "steps")], notes)
    [running] = [m for m in msgs if m["kind"] == "placement" and m["state"] == "running"]
    validate(running)
    return list(running["ranks"])


def _table(header: str, coords: dict[int, str], steps: int = 2) -> str:
    """A table of 4 ranks on one node: ``coords[rank]`` is the text of its coordinate cells."""
    rows = [f"time,job,rank,step,duration_s,node,{header}"]
    for step in range(1, steps + 1):
        rows += [f"{START + step:.1f},j,{r},{step},1.0,n1,{coords[r]}" for r in range(4)]
    return "\n".join(rows) + "\n"


# -- the columns ----------------------------------------------------------------------------------------------


def test_the_tables_pp_dp_tp_columns_go_into_the_placement(tmp_path: Path) -> None:
    ranks = _placed(tmp_path, _table("pp,dp,tp", {0: "0,0,0", 1: "0,1,0", 2: "1,0,0", 3: "1,1,0"}))
    assert ranks == [{"rank": 0, "node": "n1", "gpu": 0, "pp": 0, "dp": 0, "tp": 0},
                     {"rank": 1, "node": "n1", "gpu": 1, "pp": 0, "dp": 1, "tp": 0},
                     {"rank": 2, "node": "n1", "gpu": 2, "pp": 1, "dp": 0, "tp": 0},
                     {"rank": 3, "node": "n1", "gpu": 3, "pp": 1, "dp": 1, "tp": 0}]


def test_a_table_without_coordinates_places_its_ranks_as_before(tmp_path: Path) -> None:
    text = "time,job,rank,step,duration_s,node\n" + "".join(f"{START},j,{r},1,1.0,n1\n" for r in range(2))
    assert _placed(tmp_path, text) == [{"rank": 0, "node": "n1", "gpu": 0}, {"rank": 1, "node": "n1", "gpu": 1}]


@pytest.mark.parametrize("header", [
    "pp_rank,dp_rank,tp_rank",
    "Pipeline Stage,Data Parallel Rank,Tensor Parallel Rank",
    "pipeline_rank,dp_replica,tensor_model_parallel_rank",
    "pipeline_model_parallel_rank,data_parallel_rank,tp",
    "PP-Stage,DP,TP_Rank",
])
def test_the_coordinates_other_names_are_read(tmp_path: Path, header: str) -> None:
    ranks = _placed(tmp_path, _table(header, {0: "0,0,1", 1: "0,1,1", 2: "1,0,1", 3: "1,1,1"}))
    assert [(r["pp"], r["dp"], r["tp"]) for r in ranks] == [(0, 0, 1), (0, 1, 1), (1, 0, 1), (1, 1, 1)]


def test_json_lines_give_coordinates_too(tmp_path: Path) -> None:
    f = tmp_path / "steps.jsonl"
    f.write_text("".join(json.dumps({"time": START, "job": "j", "rank": r, "step": 1, "duration_s": 1.0,
                                     "node": "n1", "pp_rank": r // 2, "dp_rank": r % 2}) + "\n" for r in range(4)))
    coords: Coords = {}
    list(read_step_rows(f, coords=coords))
    assert rank_coords("j", range(4), coords) == {0: {"pp": 0, "dp": 0}, 1: {"pp": 0, "dp": 1},
                                                  2: {"pp": 1, "dp": 0}, 3: {"pp": 1, "dp": 1}}


@pytest.mark.parametrize("column", ["stage", "replica", "cp_rank", "ep_rank", "vpp_rank", "etp_rank"])
def test_names_that_may_mean_something_else_are_left_out_with_a_note_not_taken_nor_refused(
        tmp_path: Path, column: str) -> None:
    """A bare ``stage`` may be a loop's "train"/"eval", ``replica`` a Kubernetes replica index; ``cp_rank`` and
    ``ep_rank`` read like a misspelt ``tp_rank`` (the typo check refused them) but are other ranks."""
    notes: Counter[str] = Counter()
    ranks = _placed(tmp_path, _table(column, {0: "0", 1: "0", 2: "1", 3: "1"}), notes)
    assert all(set(r) == {"rank", "node", "gpu"} for r in ranks)
    assert any(column in n and "left out" in n for n in notes), notes


@pytest.mark.parametrize("cell, says", [
    ("-1", "steps.csv:2: column pp: must be a finite number >= 0 (got '-1')"),
    ("1.5", "steps.csv:2: column pp: must be a whole number (got '1.5')"),
    ("first", "steps.csv:2: column pp: must be a number (got 'first')"),
    ("99999999", "steps.csv:2: column pp: must be at most 10000000"),
])
def test_a_bad_coordinate_is_refused_at_its_cell(tmp_path: Path, cell: str, says: str) -> None:
    f = tmp_path / "steps.csv"
    f.write_text(f"time,job,rank,step,duration_s,node,pp\n{START},j,0,1,1.0,n1,{cell}\n")
    with pytest.raises(ImportFormatError) as e:
        list(read_steps(f))
    assert says in str(e.value)


def test_a_bad_coordinate_under_another_name_names_its_column_as_the_table_does(tmp_path: Path) -> None:
    f = tmp_path / "steps.jsonl"
    f.write_text(json.dumps({"time": START, "job": "j", "rank": 0, "step": 1, "duration_s": 1.0, "node": "n1",
                             "pp_rank": True}) + "\n")
    with pytest.raises(ImportFormatError, match=r"steps.jsonl:1: column pp_rank \(pp\): must be a number"):
        list(read_steps(f))


def test_a_rank_whose_stage_changes_between_rows_is_refused_naming_both_lines(tmp_path: Path) -> None:
    f = tmp_path / "steps.csv"
    f.write_text(f"time,job,rank,step,duration_s,node,pp\n{START},j,0,1,1.0,n1,0\n{START},j,1,1,1.0,n1,1\n"
                 f"{START + 1},j,0,2,1.0,n1,0\n{START + 1},j,1,2,1.0,n1,2\n")
    with pytest.raises(ImportFormatError) as e:
        list(read_steps(f))
    assert str(e.value) == (f"{f}:5: column pp: rank 1 is pp 2 here and pp 1 on line 3: a rank keeps one pipeline "
                            "stage for the whole run (if column pp is no pipeline stage, rename it)")
    f.write_text(f"time,job,rank,step,duration_s,node,pp_rank\n{START},j,1,1,1.0,n1,1\n{START + 1},j,1,2,1.0,n1,0\n")
    with pytest.raises(ImportFormatError) as e:
        list(read_steps(f))
    assert str(e.value) == (f"{f}:3: column pp_rank (pp): rank 1 is pp 0 here and pp 1 on line 2: a rank keeps one "
                            "pipeline stage for the whole run")


def test_a_bare_tp_column_of_something_else_says_how_to_have_it_left_out(tmp_path: Path) -> None:
    """A classifier's logger writes tp, fp, fn per step (true positives): those tables imported before, the
    column left out with the note; now it reads as the tensor-parallel rank, and the refusal says what to do."""
    f = tmp_path / "steps.csv"
    f.write_text(f"time,job,rank,step,duration_s,node,tp,fp\n{START},j,0,1,1.0,n1,17,3\n"
                 f"{START + 1},j,0,2,1.0,n1,0.5,2\n")
    with pytest.raises(ImportFormatError) as e:
        list(read_steps(f))
    assert str(e.value) == (f"{f}:3: column tp: must be a whole number (got '0.5') (if column tp is no "
                            "tensor-parallel rank, rename it)")


def test_a_rank_given_two_stages_in_two_tables_is_refused_naming_both(tmp_path: Path) -> None:
    from whywait.engine.commands.import_cmd import timing_messages

    a, b = tmp_path / "a.csv", tmp_path / "b.csv"
    a.write_text(f"time,job,rank,step,duration_s,node,dp\n{START},j,0,1,1.0,n1,0\n")
    b.write_text(f"time,job,rank,step,duration_s,node,dp\n{START + 1},j,0,2,1.0,n1,1\n")
    with pytest.raises(ImportFormatError) as e:
        timing_messages(_args(), [(a, "steps"), (b, "steps")])
    assert str(e.value) == (f"{b}:2: column dp: rank 0 is dp 1 here and dp 0 on {a}:2: a rank keeps one "
                            "data-parallel replica for the whole run (if column dp is no data-parallel replica, "
                            "rename it)")


def test_an_empty_coordinate_cell_is_unknown_and_the_ranks_other_rows_give_it(tmp_path: Path) -> None:
    ranks = _placed(tmp_path, f"time,job,rank,step,duration_s,node,pp\n{START},j,0,1,1.0,n1,\n{START},j,1,1,1.0,n1,1\n"
                              f"{START + 1},j,0,2,1.0,n1,0\n{START + 1},j,1,2,1.0,n1,\n")
    assert [r["pp"] for r in ranks] == [0, 1]


def test_a_job_where_some_ranks_have_a_stage_and_others_none_is_refused_in_one_line(tmp_path: Path) -> None:
    text = _table("pp", {0: "0", 1: "0", 2: "", 3: ""})
    with pytest.raises(ImportFormatError) as e:
        _placed(tmp_path, text)
    assert str(e.value) == (f"job j: ranks 0-1 have a pp (pipeline stage; {tmp_path / 'steps.csv'}:2) and ranks 2-3 "
                            "none: give every rank's pp, or none (--layout gives every rank its coordinates)")
    # --layout gives the others theirs, where it agrees with the column
    assert [r["pp"] for r in _placed(tmp_path, text, layout="pp=2,dp=2")] == [0, 0, 1, 1]


# -- --layout -------------------------------------------------------------------------------------------------


def test_layout_follows_megatron_lms_default_rank_order() -> None:
    """initialize_model_parallel's docstring (order tp-cp-ep-dp-pp): 16 GPUs, tp=2, pp=4 (so dp=2) make the
    data-parallel groups [g0, g2], [g1, g3], ..., the tensor groups [g0, g1], ..., the pipeline groups
    [g0, g4, g8, g12], [g1, g5, g9, g13], ...: a group's ranks differ in its coordinate only."""
    sizes = parse_layout("tp=2,pp=4,dp=2")
    co = {r: layout_coords(sizes, r) for r in range(16)}

    def same_but(k: str, a: int, b: int) -> bool:
        return co[a][k] != co[b][k] and all(co[a][x] == co[b][x] for x in co[a] if x != k)

    assert same_but("dp", 0, 2) and same_but("dp", 13, 15) and same_but("tp", 0, 1) and same_but("tp", 14, 15)
    assert all(same_but("pp", a, b) for a, b in [(0, 4), (4, 8), (8, 12), (1, 5), (9, 13)])
    assert [co[r]["pp"] for r in (0, 4, 8, 12)] == [0, 1, 2, 3]
    # rank = pp_rank*(dp*tp) + dp_rank*tp + tp_rank
    assert layout_coords(parse_layout("pp=4,dp=2,tp=8"), 3 * 16 + 1 * 8 + 5) == {"tp": 5, "dp": 1, "pp": 3}
    # cp between tp and dp; a size not given is 1 and no coordinate
    assert layout_coords(parse_layout("pp=2,cp=2,tp=2"), 6) == {"tp": 0, "cp": 1, "pp": 1}
    assert layout_coords(parse_layout("pp=4,dp=2"), 5) == {"dp": 1, "pp": 2}


@pytest.mark.parametrize("text, says", [
    ("pp=4,ep=2", "ep gives no rank a place of its own"),
    ("pp=0,dp=2", "pp must be a whole number from 1 (got '0')"),
    ("pp=four", "pp must be a whole number from 1 (got 'four')"),
    ("pp=4,pp=2", "pp is given twice"),
    ("pp4", "'pp4' is not name=size (as in pp=4,dp=2,tp=8)"),
    ("zz=2", "unknown size 'zz' (known: tp, cp, dp, pp)"),
    (",", "no sizes"),
])
def test_a_bad_layout_is_one_line(text: str, says: str) -> None:
    with pytest.raises(ImportFormatError) as e:
        parse_layout(text)
    assert str(e.value).startswith(f"--layout {text!r}: ") and says in str(e.value)


def test_the_layout_gives_every_rank_its_coordinates_and_only_those_given(tmp_path: Path) -> None:
    text = "time,job,rank,step,duration_s,node\n" + "".join(f"{START},j,{r},1,1.0,n{r // 4}\n" for r in range(8))
    ranks = _placed(tmp_path, text, layout=" PP=4, dp=2 ")
    assert [(r["rank"], r["pp"], r["dp"]) for r in ranks] == [(r, r // 2, r % 2) for r in range(8)]
    assert all("tp" not in r for r in ranks)
    assert [(r["pp"], r["dp"], r["tp"]) for r in _placed(tmp_path, text, layout="pp=2,dp=2,tp=2")][:4] == [
        (0, 0, 0), (0, 0, 1), (0, 1, 0), (0, 1, 1)]


def test_a_layout_that_does_not_hold_the_ranks_is_refused_naming_the_sizes_and_the_ranks(tmp_path: Path) -> None:
    text = "time,job,rank,step,duration_s,node\n" + "".join(f"{START},j,{r},1,1.0,n1\n" for r in range(8))
    with pytest.raises(ImportFormatError) as e:
        _placed(tmp_path, text, layout="pp=4,tp=1")
    assert str(e.value) == ("--layout pp=4 × tp=1 = 4 ranks, and job j has 8 ranks (0-7): ranks 4-7 lie outside it: "
                            "add dp=2?")
    with pytest.raises(ImportFormatError, match=r"= 6 ranks, and job j has 8 ranks \(0-7\): ranks 6-7 lie outside"):
        _placed(tmp_path, text, layout="pp=3,dp=2")


def test_a_layout_larger_than_the_ranks_in_the_files_is_noted(tmp_path: Path) -> None:
    """A table of some ranks only (the last stage's, which log the loss) keeps their coordinates."""
    notes: Counter[str] = Counter()
    text = "time,job,rank,step,duration_s,node\n" + "".join(f"{START},j,{r},1,1.0,n1\n" for r in (6, 7))
    ranks = _placed(tmp_path, text, notes, layout="pp=4,dp=2")
    assert [(r["pp"], r["dp"]) for r in ranks] == [(3, 0), (3, 1)]
    assert notes == Counter({"job j: --layout pp=4 × dp=2 = 8 ranks; the files hold 2 of them (6-7)": 1})


def test_a_column_and_the_layout_must_agree(tmp_path: Path) -> None:
    ok = _table("pp", {0: "0", 1: "0", 2: "1", 3: "1"})
    assert [r["pp"] for r in _placed(tmp_path, ok, layout="pp=2,dp=2")] == [0, 0, 1, 1]
    # a table that numbers stages the other way round (or another order of ranks) is no layout to guess at
    bad = _table("pp", {0: "0", 1: "1", 2: "0", 3: "1"})
    with pytest.raises(ImportFormatError) as e:
        _placed(tmp_path, bad, layout="pp=2,dp=2")
    assert str(e.value) == (f"{tmp_path / 'steps.csv'}:3: rank 1 is pp 1 in the table, and --layout pp=2 × dp=2 = 4 "
                            "ranks makes it pp 0: which is right?")


def test_a_layout_without_a_placement_is_said_to_be_unused(tmp_path: Path) -> None:
    from whywait.engine.commands.import_cmd import timing_messages

    f = tmp_path / "steps.csv"
    f.write_text(f"time,job,rank,step,duration_s,node\n{START},j,0,1,1.0,n1\n")
    notes: Counter[str] = Counter()
    msgs = timing_messages(_args(project=None, team=None, layout="pp=2"), [(f, "steps")], notes)
    assert [m["kind"] for m in msgs] == ["steps"]
    assert any(n.startswith("--layout gives the ranks' coordinates to the placement") for n in notes)


# -- end to end: a pipeline-parallel job's table, imported and replayed ------------------------------------------


def pipeline_table(path: Path, steps: int = 60, last: float = 1.3, slow_from: int | None = 30, seed: int = 7) -> None:
    """A 4-stage x 2-replica job (8 ranks, rank = 2 * stage + replica, as Megatron-LM lays out pp=4, dp=2) as a
    logger writes it: every rank ends a step together; the last stage, which computes the loss, works ``last``
    times as long as the others on every step (normal), and rank 3 (stage 1, replica 1) 1.6x its stage peer's
    from step ``slow_from`` on (None: never); the others wait for the slowest in the pipeline."""
    rng = random.Random(seed)
    t = START
    rows = ["time,job,rank,step,duration_s,data_wait_s,compute_s,comm_s,pipeline_wait_s,node"]
    for step in range(1, steps + 1):
        comp = {r: 0.60 * (1 + rng.gauss(0, 0.02)) * (last if r // 2 == 3 else 1.0)
                * (1.6 if r == 3 and slow_from is not None and step >= slow_from else 1.0) for r in range(8)}
        dur = max(comp.values()) + 0.11
        t += dur
        rows += [f"{t:.3f},pipe-job,{r},{step},{dur:.4f},0.010,{comp[r]:.4f},0.100,{dur - comp[r] - 0.11:.4f},"
                 f"node-{r // 4 + 1:02d}" for r in range(8)]
    path.write_text("\n".join(rows) + "\n")


def replayed(tmp_path: Path, *layout: str, **table: Any) -> list[tuple[str, tuple[int, ...], str]]:
    """The firing diagnoses ``(rule, ranks, title)`` of :func:`pipeline_table` (``table``: its arguments) imported
    with ``whywait import`` (``layout``: its ``--layout`` arguments) and replayed in process, as
    tests/replay/test_slow_since_start.py does."""
    from whywait.engine.cli import main
    from whywait.engine.replay import PlacedTopology, replay
    from whywait.engine.rules.loader import load_rules

    csv, out = tmp_path / "steps.csv", tmp_path / "steps.jsonl"
    pipeline_table(csv, **table)
    assert main(["import", str(csv), "--project", "llm", "--team", "ml", "-o", str(out), *layout]) == 0
    msgs = [json.loads(line) for line in out.read_text().splitlines()]
    res, _ = replay(msgs, load_rules([REPO / "rules"]), PlacedTopology())
    return [(d.rule_id, tuple(d.ranks), d.title) for d in res.diagnoses if d.status == "firing"]


def test_with_the_layout_the_straggler_is_told_and_the_slower_last_stage_is_no_straggler(tmp_path: Path) -> None:
    fired = replayed(tmp_path, "--layout", "pp=4,dp=2")
    stragglers = [f for f in fired if f[0] == "job.straggler"]
    assert stragglers and all(f[1] == (3,) for f in stragglers), fired
    assert not any({6, 7} & set(f[1]) for f in fired), fired  # the last stage is slower by design
    assert {f[0] for f in fired} == {"job.straggler", "job.stage-imbalance"}, fired
    assert any("pipeline stage 3 is the bottleneck on all 2 replicas" in f[2] for f in fired), fired


def test_without_the_layout_the_straggler_is_told_but_no_stage_is(tmp_path: Path) -> None:
    """What it does with no layout (not changed here): the last stage, 1.3x slower from the first step on, is
    taken for slower hardware and not named; rank 3 is the straggler; and the stage imbalance, which needs
    stages, is not told at all."""
    fired = replayed(tmp_path)
    assert {f[0] for f in fired} == {"job.straggler"} and all(f[1] == (3,) for f in fired), fired


def test_a_last_stage_half_as_slow_again_is_misread_without_the_layout_and_told_with_it(tmp_path: Path) -> None:
    """A last stage 1.5x slower (a large vocabulary's loss) is over job.slow-since-start's 1.4: without the
    layout (not changed here) its ranks are told as slow since their first step, a hardware doubt on a healthy
    job; with it they are compared with their own stage, and the stage is told as the pipeline's bottleneck."""
    without = replayed(tmp_path, last=1.5, slow_from=None)
    assert without and {(f[0], f[1]) for f in without} == {("job.slow-since-start", (6, 7))}, without
    (tmp_path / "with").mkdir()
    fired = replayed(tmp_path / "with", "--layout", "pp=4,dp=2", last=1.5, slow_from=None)
    assert fired and {(f[0], f[1]) for f in fired} == {("job.stage-imbalance", ())}, fired


def test_the_layout_places_profiler_traces_ranks_too(tmp_path: Path) -> None:
    """Traces carry no coordinates: ``--layout`` gives them (here a two-stage pipeline of one replica)."""
    from whywait.engine.commands.import_cmd import timing_messages

    hta = REPO / "tests" / "fixtures" / "importers" / "hta"
    files = [(hta / f"sampled_rank-{r}.json.gz", "kineto") for r in (0, 1)]
    msgs = timing_messages(_args(job="hta-128", node="host-a", layout="pp=2"), files, Counter())
    validate(msgs[0])
    assert msgs[0]["ranks"] == [{"rank": 0, "node": "host-a", "gpu": 0, "pp": 0},
                                {"rank": 1, "node": "host-a", "gpu": 1, "pp": 1}]
