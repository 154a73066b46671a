"""Kineto import on more real traces (see ``tests/fixtures/importers/ATTRIBUTION.md``): each figure checked
against one computed here from the raw events with microsecond masks, not the importer's interval arithmetic."""

from __future__ import annotations

import gzip
import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from whywait.engine.importers import ImportFormatError
from whywait.engine.importers.kineto import steps_from_trace

FIX = Path(__file__).resolve().parents[1] / "fixtures" / "importers"
BACKWARD = FIX / "hta" / "backward_thread.json.gz"
OLD = FIX / "kineto" / "gpu_metrics_input-trimmed.json.gz"


def _trace(path: Path) -> dict[str, Any]:
    return json.loads(gzip.open(path).read())


def _masks(events: list[dict[str, Any]], steps: dict[int, tuple[int, int]], *, launch_cat: str, kernel_cat: str,
           loader: str | None) -> dict[int, dict[str, float]]:
    """Per step: duration, compute (union of kernels launched inside it) and data-loader time, in seconds.

    ``launch_cat``/``kernel_cat`` are the trace's own category names, spelt as the trace spells them.
    """
    x = [e for e in events if e.get("ph") == "X"]
    launch = {e["args"]["correlation"]: e["ts"] for e in x if e.get("cat") == launch_cat}
    out = {}
    for n, (s0, s1) in steps.items():
        ks = [e for e in x if e.get("cat") == kernel_cat and s0 <= launch.get(e["args"]["correlation"], -1) <= s1]
        lo = min([s0] + [k["ts"] for k in ks])
        hi = max([s1] + [k["ts"] + k["dur"] for k in ks]) + 1
        comp = np.zeros(hi - lo, bool)
        for k in ks:
            comp[k["ts"] - lo:k["ts"] + k["dur"] - lo] = True
        data = np.zeros(hi - lo, bool)
        for e in x:
            if loader is not None and e["name"].startswith(loader):
                a, b = max(e["ts"], s0), min(e["ts"] + e["dur"], s1)
                data[a - lo:max(a, b) - lo] = True
        out[n] = {"duration_s": (s1 - s0) / 1e6, "compute_s": comp.sum() / 1e6, "data_wait_s": data.sum() / 1e6,
                  "end": s1 / 1e6, "kernels": len(ks)}
    return out


def test_a_kernel_launched_from_the_autograd_thread_counts_in_the_main_threads_step() -> None:
    raw = _trace(BACKWARD)
    ev = raw["traceEvents"]
    step = next(e for e in ev if e["name"].startswith("ProfilerStep#"))
    (launch,) = [e for e in ev if e["cat"] == "cuda_runtime"]
    assert launch["tid"] != step["tid"]  # the backward pass's launch is on another thread than the step
    want = _masks(ev, {552: (step["ts"], step["ts"] + step["dur"])}, launch_cat="cuda_runtime",
                  kernel_cat="kernel", loader=None)[552]
    assert want["kernels"] == 1
    (got,) = steps_from_trace(BACKWARD)
    assert (got.rank, got.step) == (raw["distributedInfo"]["rank"], 552)
    assert got.duration_s == pytest.approx(want["duration_s"], abs=1e-6)
    assert got.end == pytest.approx(want["end"], abs=1e-6)
    assert got.compute_s is not None and got.compute_s > 0
    assert got.compute_s == pytest.approx(want["compute_s"], abs=1e-6)
    assert got.comm_s == 0.0 and got.data_wait_s is None  # no NCCL kernel; no data-loader span: unknown


def _with_steps(tmp_path: Path, cuts: list[int]) -> tuple[Path, dict[int, tuple[int, int]]]:
    """The real PyTorch 1.8 trace with ``ProfilerStep#N`` spans added, in its own ``Operator`` category.

    The trace was profiled without a schedule, so it has no step of its own: the spans are the one thing
    added, cut at ``cuts`` (µs), and written the way PyTorch 1.8 wrote them (``tid`` a string).
    """
    raw = _trace(OLD)
    main = next(e for e in raw["traceEvents"] if e.get("cat") == "Operator")
    steps = {n + 1: (a, b) for n, (a, b) in enumerate(zip(cuts[:-1], cuts[1:], strict=True))}
    raw["traceEvents"] += [{"ph": "X", "cat": "Operator", "name": f"ProfilerStep#{n}", "pid": main["pid"],
                            "tid": main["tid"], "ts": a, "dur": b - a, "args": {"Device": main["pid"]}}
                           for n, (a, b) in steps.items()]
    path = tmp_path / "worker0.pt.trace.json"
    path.write_text(json.dumps(raw))
    return path, steps


def test_a_pytorch_1_8_trace_reads_its_operator_runtime_and_kernel_categories(tmp_path: Path) -> None:
    raw = _trace(OLD)
    cats = {e.get("cat") for e in raw["traceEvents"]}
    assert {"Operator", "Runtime", "Kernel"} <= cats and not cats & {"cpu_op", "cuda_runtime", "kernel"}
    span = next(e for e in raw["traceEvents"] if e.get("cat") == "Trace")  # the profiling window
    t0, t1 = span["ts"], span["ts"] + span["dur"]
    path, steps = _with_steps(tmp_path, [t0, t0 + 5000, t1])
    want = _masks(_trace_of(path), steps, launch_cat="Runtime", kernel_cat="Kernel", loader="enumerate(DataLoader)")
    assert [w["kernels"] for w in want.values()] == [3, 5]  # both threads' launches land in step 2
    got = steps_from_trace(path, rank=0)
    assert [s.step for s in got] == [1, 2]
    for s in got:
        w = want[s.step]
        assert s.duration_s == pytest.approx(w["duration_s"], abs=1e-6)
        assert s.end == pytest.approx(w["end"], abs=1e-6)
        assert s.compute_s is not None and s.compute_s > 0
        assert s.compute_s == pytest.approx(w["compute_s"], abs=1e-6)
        assert s.data_wait_s == pytest.approx(w["data_wait_s"], abs=1e-6)
        assert s.comm_s == 0.0
    assert (got[0].data_wait_s or 0) > 0  # the DataLoader span (an ``Operator`` too) is read as input


def _trace_of(path: Path) -> list[dict[str, Any]]:
    return list(json.loads(path.read_text())["traceEvents"])


def test_the_real_old_trace_without_a_schedule_is_refused_in_one_line(tmp_path: Path) -> None:
    with pytest.raises(ImportFormatError, match="no ProfilerStep#N spans"):
        steps_from_trace(OLD, rank=0)
    run = subprocess.run([sys.executable, "-m", "whywait", "import", str(OLD), "--rank", "0", "--job", "j",
                          "--node", "n", "-o", str(tmp_path / "out.jsonl")], capture_output=True, text=True, timeout=60)
    assert run.returncode != 0 and "Traceback" not in run.stderr
    assert len(run.stderr.strip().splitlines()) == 1 and "ProfilerStep" in run.stderr


def test_a_send_annotation_that_names_its_peers_is_pipeline_wait_not_a_collective(tmp_path: Path) -> None:
    """ProcessGroupNCCL titles a point-to-point op with its peers (``c10::str("nccl:send ", rank_, "->", dstRank)``),
    so a pipeline-parallel trace has ``nccl:send 1->0`` and ``nccl:recv 0<-1``, never a bare ``nccl:send``; the
    importer took the whole ``send 1->0`` for the op and counted every pipeline transfer as a collective."""
    t0 = 1_700_000_000_000_000
    ev: list[dict[str, Any]] = [
        {"ph": "X", "cat": "user_annotation", "name": "ProfilerStep#3", "ts": t0, "dur": 10_000},
        {"ph": "X", "cat": "user_annotation", "name": "nccl:send 1->0", "ts": t0 + 100, "dur": 50},
        {"ph": "X", "cat": "user_annotation", "name": "nccl:recv 1<-2", "ts": t0 + 400, "dur": 50},
        {"ph": "X", "cat": "user_annotation", "name": "nccl:all_reduce", "ts": t0 + 1000, "dur": 50}]
    for i, (launch, run, dur) in enumerate([(t0 + 120, t0 + 200, 100), (t0 + 420, t0 + 500, 300),
                                            (t0 + 1010, t0 + 3000, 400)]):
        ev += [{"ph": "X", "cat": "cuda_runtime", "name": "cudaLaunchKernel", "ts": launch, "dur": 5,
                "args": {"correlation": i}},
               {"ph": "X", "cat": "kernel", "name": "ncclDevKernel_SendRecv", "ts": run, "dur": dur,
                "args": {"correlation": i}}]
    f = tmp_path / "rank-1.json"
    f.write_text(json.dumps({"traceEvents": ev}))
    (s,) = steps_from_trace(f)
    assert (s.pipeline_wait_s, s.collective_s, s.comm_s) == (0.0004, 0.0004, 0.0008)
