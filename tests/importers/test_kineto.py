"""Kineto (PyTorch profiler) import on real traces: the step count and the split, checked against figures
computed here independently from the raw trace (microsecond masks, not interval arithmetic)."""

from __future__ import annotations

import gzip
import json
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from whywait.agents.events import envelope, validate
from whywait.engine.importers import ImportFormatError
from whywait.engine.importers.kineto import steps_from_trace

REPO = Path(__file__).resolve().parents[2]
HTA = REPO / "tests" / "fixtures" / "importers" / "hta"


def independent(path: Path) -> dict[int, dict[str, float]]:
    """Per step: duration, compute, non-overlapped NCCL time and data-loader time, from boolean µs masks."""
    trace = json.loads(gzip.open(path).read())
    ev = [e for e in trace["traceEvents"] if e.get("ph") == "X"]
    steps = {int(e["name"].split("#")[1]): (e["ts"], e["ts"] + e["dur"]) for e in ev
             if re.fullmatch(r"ProfilerStep#\d+", e["name"]) and e.get("cat") != "gpu_user_annotation"}
    launch = {e["args"]["correlation"]: e["ts"] for e in ev if e.get("cat") == "cuda_runtime"
              and "correlation" in e.get("args", {})}
    out = {}
    for n, (s0, s1) in steps.items():
        ks = [e for e in ev if e.get("cat") == "kernel" and s0 <= launch.get(e["args"].get("correlation"), -1) <= s1]
        lo = int(min([s0] + [k["ts"] for k in ks]))
        hi = int(max([s1] + [k["ts"] + k["dur"] for k in ks])) + 2
        comp = np.zeros(hi - lo, bool)
        comm = np.zeros(hi - lo, bool)
        for k in ks:
            m = comm if "nccl" in k["name"].lower() else comp
            m[int(k["ts"]) - lo:int(k["ts"] + k["dur"]) - lo] = True
        data = np.zeros(hi - lo, bool)
        for e in ev:
            if e.get("cat") == "user_annotation" and e["name"] == "## data_load ##":
                a, b = max(e["ts"], s0), min(e["ts"] + e["dur"], s1)
                if a < b:
                    data[int(a) - lo:int(b) - lo] = True
        out[n] = {"duration_s": (s1 - s0) / 1e6, "compute_s": comp.sum() / 1e6,
                  "comm_s": (comm & ~comp).sum() / 1e6, "data_wait_s": data.sum() / 1e6, "end": s1 / 1e6}
    return out


@pytest.mark.parametrize("name, rank", [("sampled_rank-0.json.gz", 0), ("sampled_rank-1.json.gz", 1)])
def test_real_trace_steps_and_split_match_the_trace(name: str, rank: int) -> None:
    want = independent(HTA / name)
    got = steps_from_trace(HTA / name)
    assert [s.step for s in got] == sorted(want) == [551, 552]
    for s in got:
        w = want[s.step]
        assert s.rank == rank
        assert s.duration_s == pytest.approx(w["duration_s"], abs=1e-6)
        # µs masks round kernel edges to whole microseconds: a few µs per kernel at most
        assert s.compute_s == pytest.approx(w["compute_s"], abs=2e-3, rel=0.01)
        assert s.comm_s == pytest.approx(w["comm_s"], abs=2e-3, rel=0.01)
        assert s.data_wait_s == pytest.approx(w["data_wait_s"], abs=1e-4)
        assert s.compute_s is not None and s.comm_s is not None
        assert s.compute_s > 0.05 and s.comm_s > 0.05  # both phases really present in this job
        assert s.end == pytest.approx(w["end"], abs=1e-6)  # event time kept: wall clock of the step's end
        assert 1_682_000_000 < s.end < 1_683_000_000  # 2023-04-29, when the trace was taken


def test_relative_timestamps_use_base_time_and_missing_loader_is_unknown() -> None:
    got = steps_from_trace(HTA / "nccl_data.json.gz")
    assert [s.step for s in got] == [4, 5, 6]
    # the trace's own log says it was taken on 2024-05-22 17:15:22 local time (PDT): 00:15:22 UTC next day
    assert 1_716_423_322 <= got[0].start < 1_716_423_323
    assert all(s.data_wait_s is None for s in got)  # no data-loader spans: unknown, not zero
    assert all("data_wait_s" not in s.record() for s in got)
    assert all((s.collective_s or 0) > 0 and s.pipeline_wait_s == 0 for s in got)  # all-reduce/broadcast only


def test_whywait_import_writes_valid_steps_with_event_time(tmp_path: Path) -> None:
    out = tmp_path / "steps.jsonl"
    r = subprocess.run([sys.executable, "-m", "whywait", "import", str(HTA / "sampled_rank-0.json.gz"),
                        str(HTA / "sampled_rank-1.json.gz"), "--job", "hta-128", "--node", "host-a",
                        "--project", "ads", "--team", "ranking", "-o", str(out)],
                       capture_output=True, text=True, cwd=REPO, timeout=120)
    assert r.returncode == 0, r.stderr
    msgs = [validate(json.loads(line)) for line in out.read_text().splitlines()]
    assert msgs[0]["kind"] == "placement" and [x["rank"] for x in msgs[0]["ranks"]] == [0, 1]
    # the job ends just after its last step (else it stayed placed in every later replay)
    assert msgs[-1]["kind"] == "placement" and msgs[-1]["state"] == "finished" and msgs[-1]["ranks"] == []
    steps = [s for m in msgs[1:-1] for s in m["steps"]]
    assert len(steps) == 4 and {(s["rank"], s["step"]) for s in steps} == {(0, 551), (0, 552), (1, 551), (1, 552)}
    assert all(m["time"] == m["steps"][0]["ended_at"] for m in msgs[1:-1])
    assert [m["time"] for m in msgs[1:]] == sorted(m["time"] for m in msgs[1:])
    assert 0 < msgs[-1]["time"] - msgs[-2]["time"] < 0.01
    # two sampled ranks of a 128-rank job: placed as the 2 GPUs they are, and said to be 2 of 128 (a tester's
    # postmortem had costs 64x too low with no word of it)
    assert "the traces say the job has 128 ranks (distributedInfo.world_size) and 2 were imported" in r.stdout


def test_bad_traces_are_one_line(tmp_path: Path) -> None:
    bad = tmp_path / "t.json"
    bad.write_text('{"traceEvents": [{"ph": "X", "name": "aten::mm", "cat": "cpu_op", "ts": 1, "dur": 2}]}')
    # no step is said first, with or without a rank: no --rank would make it importable
    for rank in (None, 0):
        with pytest.raises(ImportFormatError, match="no ProfilerStep#N spans"):
            steps_from_trace(bad, rank=rank)
    bad.write_text('{"traceEvents": [{"ph": "X", "name": "ProfilerStep#1", "cat": "user_annotation", '
                   '"ts": 1764442800000000, "dur": 2}]}')
    with pytest.raises(ImportFormatError, match="t.json: the trace does not say its rank"):
        steps_from_trace(bad)
    bad.write_text("{oops")
    with pytest.raises(ImportFormatError, match="t.json: not a JSON trace"):
        steps_from_trace(bad)


def test_kernels_outside_every_step_are_counted_not_dropped_silently(tmp_path: Path) -> None:
    from collections import Counter

    t0 = 1_764_442_800_000_000.0  # µs
    ev = [{"ph": "X", "cat": "user_annotation", "name": "ProfilerStep#1", "ts": t0, "dur": 1000},
          {"ph": "X", "cat": "cuda_runtime", "name": "cudaLaunchKernel", "ts": t0 + 10, "dur": 5,
           "args": {"correlation": 1}},
          {"ph": "X", "cat": "kernel", "name": "gemm", "ts": t0 + 20, "dur": 300, "args": {"correlation": 1}},
          {"ph": "X", "cat": "cuda_runtime", "name": "cudaLaunchKernel", "ts": t0 + 5000, "dur": 5,
           "args": {"correlation": 2}},
          {"ph": "X", "cat": "kernel", "name": "ncclKernel_AllReduce", "ts": t0 + 5010, "dur": 50,
           "args": {"correlation": 2}}]
    f = tmp_path / "t.json"
    f.write_text(json.dumps({"distributedInfo": {"rank": 3}, "traceEvents": ev}))
    notes: Counter[str] = Counter()
    (s,) = steps_from_trace(f, notes=notes)
    assert (s.rank, s.step, s.compute_s, s.comm_s) == (3, 1, 0.0003, 0.0)
    assert notes == {"t.json: GPU kernels launched outside every ProfilerStep (not attributed)": 1}


def _trace(events: list[dict[str, object]], rank: int | None = 3) -> dict[str, object]:
    out: dict[str, object] = {"traceEvents": events}
    if rank is not None:
        out["distributedInfo"] = {"rank": rank}
    return out


T0 = 1_764_442_800_000_000.0  # µs, 2025-11-29


def test_a_trace_without_a_rank_takes_the_one_its_file_name_gives(tmp_path: Path) -> None:
    from collections import Counter

    real = json.loads(gzip.open(HTA / "sampled_rank-1.json.gz").read())
    del real["distributedInfo"]
    f = tmp_path / "rank-34.Jul_15_10_52_41.1074.pt.trace.json"
    f.write_text(json.dumps(real))
    notes: Counter[str] = Counter()
    got = steps_from_trace(f, notes=notes)
    assert {s.rank for s in got} == {34} and [s.step for s in got] == [551, 552]
    assert notes[f"{f.name}: no distributedInfo.rank: rank 34 taken from the file name"] == 1
    for name in ("inference_rank_1.json", "rank0.json", "job.rank_7.json"):
        (tmp_path / name).write_text(json.dumps(real))
        assert {s.rank for s in steps_from_trace(tmp_path / name)} == {int(re.findall(r"\d+", name)[0])}
    for name in ("crank3.json", "ranks2.json", "rank-1-of-rank-2.json", "trace.json"):
        (tmp_path / name).write_text(json.dumps(real))
        with pytest.raises(ImportFormatError, match=f"{re.escape(name)}: the trace does not say its rank"):
            steps_from_trace(tmp_path / name)
    # the trace's own rank wins over its name
    (tmp_path / "rank-9.json").write_text(json.dumps({**real, "distributedInfo": {"rank": 2}}))
    assert {s.rank for s in steps_from_trace(tmp_path / "rank-9.json")} == {2}


def test_a_cpu_only_profile_leaves_the_gpu_phases_unknown_not_zero(tmp_path: Path) -> None:
    from collections import Counter

    # the real trace with every GPU event taken out, as torch.profiler writes it without ProfilerActivity.CUDA
    real = json.loads(gzip.open(HTA / "sampled_rank-0.json.gz").read())
    real["traceEvents"] = [e for e in real["traceEvents"]
                           if e.get("cat") not in ("kernel", "gpu_memcpy", "gpu_memset", "gpu_user_annotation")]
    f = tmp_path / "cpu.json"
    f.write_text(json.dumps(real))
    notes: Counter[str] = Counter()
    got = steps_from_trace(f, notes=notes)
    assert [s.step for s in got] == [551, 552]
    for s in got:
        assert (s.compute_s, s.comm_s, s.collective_s, s.pipeline_wait_s) == (None, None, None, None)
        rec = s.record()
        assert not {"compute_s", "comm_s", "collective_s", "pipeline_wait_s"} & set(rec)
        assert rec["data_wait_s"] == pytest.approx(independent(HTA / "sampled_rank-0.json.gz")[s.step]["data_wait_s"],
                                                   abs=1e-4)
        validate(envelope("steps", "n", s.end, job="j", steps=[rec]))
    assert any("CPU-only profile" in k for k in notes)


def test_pipeline_and_collective_kernels_follow_their_annotation_in_any_nesting(tmp_path: Path) -> None:
    """Each NCCL kernel goes by the earliest-starting ``nccl:`` annotation around its launch, checked against a
    brute-force scan on thousands of overlapping, nested and disjoint annotations."""
    import random

    from whywait.engine.importers.kineto import _PIPELINE_OPS, _annotation_of

    rnd = random.Random(7)
    ops = ["send", "recv", "all_reduce", "broadcast", "batch_isend_irecv", "all_gather"]
    ann = []
    for _ in range(3000):
        a = rnd.uniform(0, 1e5)
        ann.append((a, a + rnd.choice([1.0, 30.0, 400.0, 5e3]), rnd.choice(ops)))
    edges = [a for a, _, _ in ann[:50]] + [b for _, b, _ in ann[:50]]  # launches exactly on a start or an end
    launches = [rnd.uniform(-10, 1.1e5) for _ in range(3000)] + edges
    th = ("1", "1")  # one thread: annotations are looked up on the launch's own thread
    got = {t: op for (_, t), op in _annotation_of({th: ann}, [(t, th) for t in launches]).items()}
    srt = sorted(ann)
    for t in launches:
        assert got[t] == next((n for (x, y, n) in srt if x <= t <= y), "")
    assert sum(got[t] in _PIPELINE_OPS for t in launches) > 100  # both kinds really occur

    # and through a whole trace: a send kernel is pipeline wait, an all-reduce inside no send is collective
    ev = [{"ph": "X", "cat": "user_annotation", "name": "ProfilerStep#1", "ts": T0, "dur": 10_000},
          {"ph": "X", "cat": "user_annotation", "name": "nccl:send", "ts": T0 + 100, "dur": 50},
          {"ph": "X", "cat": "user_annotation", "name": "nccl:all_reduce", "ts": T0 + 1000, "dur": 50}]
    for i, (launch, run) in enumerate([(T0 + 120, T0 + 200), (T0 + 1010, T0 + 3000)]):
        ev += [{"ph": "X", "cat": "cuda_runtime", "name": "cudaLaunchKernel", "ts": launch, "dur": 5,
                "args": {"correlation": i}},
               {"ph": "X", "cat": "kernel", "name": "ncclDevKernel_Generic", "ts": run, "dur": 400,
                "args": {"correlation": i}}]
    f = tmp_path / "t.json"
    f.write_text(json.dumps(_trace(ev)))
    (s,) = steps_from_trace(f)
    assert (s.pipeline_wait_s, s.collective_s, s.compute_s) == (0.0004, 0.0004, 0.0)


def test_import_refuses_one_rank_for_several_traces_and_a_trace_given_twice(tmp_path: Path) -> None:
    def imp(*argv: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([sys.executable, "-m", "whywait", "import", *argv, "--job", "j", "--node", "n",
                               "-o", str(tmp_path / "out.jsonl")], capture_output=True, text=True, cwd=REPO,
                              timeout=120)

    a, b = str(HTA / "sampled_rank-0.json.gz"), str(HTA / "sampled_rank-1.json.gz")
    r = imp(a, b, "--rank", "5")
    assert r.returncode == 2 and "--rank names the rank of one profiler trace, and 2 were given" in r.stderr
    assert len(r.stderr.strip().splitlines()) == 1
    r = imp(a, a)
    assert r.returncode == 2 and "job j rank 0 step 551 is also in" in r.stderr and "Traceback" not in r.stderr
    assert imp(a, "--rank", "5").returncode == 0  # one trace: --rank is its rank
    assert {json.loads(x)["steps"][0]["rank"] for x in (tmp_path / "out.jsonl").read_text().splitlines()} == {5}


def test_a_decompression_bomb_is_refused_before_it_fills_memory(tmp_path: Path) -> None:
    """A small .gz that inflates past the cap is one line, read in chunks: never inflated whole first."""
    import resource

    bomb = tmp_path / "rank-0.json.gz"
    with gzip.open(bomb, "wb", compresslevel=9) as g:  # 64 MiB of one byte: about 64 KiB on disk
        g.write(b'{"traceEvents": [' + b" " * (64 << 20))
    assert bomb.stat().st_size < 1 << 20
    rss0 = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    with pytest.raises(ImportFormatError, match=r"rank-0.json.gz: inflates past 16 MiB \(a decompression bomb"):
        steps_from_trace(bomb, max_bytes=16 << 20)
    assert resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - rss0 < 48 << 10  # KiB: it stopped near the cap
    big = tmp_path / "big.json"
    big.write_bytes(b" " * (17 << 20))
    with pytest.raises(ImportFormatError, match=r"big.json: over 16 MiB"):
        steps_from_trace(big, rank=0, max_bytes=16 << 20)
    # the real traces pass under a cap that holds them; through the CLI the cap is --max-trace-mib
    assert len(steps_from_trace(HTA / "nccl_data.json.gz", max_bytes=10 << 20)) == 3
    r = subprocess.run([sys.executable, "-m", "whywait", "import", str(bomb), "--job", "j", "--node", "n",
                        "--max-trace-mib", "16", "-o", str(tmp_path / "o.jsonl")], capture_output=True, text=True,
                       cwd=REPO, timeout=120)
    assert r.returncode == 2 and "inflates past 16 MiB" in r.stderr and "Traceback" not in r.stderr


def test_the_array_form_of_the_trace_format_imports_as_the_object_form_does(tmp_path: Path) -> None:
    """The Trace Event Format's array form (the events alone, as Chrome's tracer and other tools write
    them, the closing ``]`` optional) is the same trace: auto-detected, and the same steps come out.
    Before, it was taken for a CSV step table and refused with its whole first line as column names."""
    events = json.loads(gzip.open(HTA / "sampled_rank-0.json.gz").read())["traceEvents"]
    whole = tmp_path / "rank-0.trace.json"
    whole.write_text(json.dumps(events))
    cut = tmp_path / "rank-0.cut.json"  # a tracer killed before it closed the array: no "]", a trailing comma
    cut.write_text(json.dumps(events)[:-1] + ",\n")
    want = [s.record() for s in steps_from_trace(HTA / "sampled_rank-0.json.gz", rank=0)]
    assert [s.record() for s in steps_from_trace(whole)] == want  # rank from the file name
    assert [s.record() for s in steps_from_trace(cut)] == want
    out = tmp_path / "steps.jsonl"
    r = subprocess.run([sys.executable, "-m", "whywait", "import", str(whole), "--job", "j", "--node", "n",
                        "-o", str(out)], capture_output=True, text=True, cwd=REPO, timeout=120)
    assert r.returncode == 0, r.stderr
    assert [s for line in out.read_text().splitlines() for s in json.loads(line)["steps"]] == want
    # an array that is not a trace is still refused in one line, naming what it is
    odd = tmp_path / "odd.json"
    odd.write_text("[1, 2, 3")
    with pytest.raises(ImportFormatError, match=r"odd.json: not a profiler trace \(a JSON array, but not of event"):
        steps_from_trace(odd, rank=0)


def test_a_trace_without_job_or_node_names_the_flag_that_is_missing(tmp_path: Path) -> None:
    r = subprocess.run([sys.executable, "-m", "whywait", "import", str(HTA / "sampled_rank-0.json.gz"),
                        "--job", "j", "-o", str(tmp_path / "o.jsonl")], capture_output=True, text=True,
                       cwd=REPO, timeout=120)
    assert r.returncode == 2 and r.stderr.count("\n") == 1, r.stderr
    assert "pass --node" in r.stderr and "--job" not in r.stderr
