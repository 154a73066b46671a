"""Kineto import of trace variants built from the real fixtures' own events (see their ``ATTRIBUTION.md``):
Begin/End pairs instead of complete events, several ranks' traces merged into one file, and NCCL kernels known as
send/recv only by ``record_param_comms`` or the kernel's own ``Collective name``."""

from __future__ import annotations

import copy
import gzip
import json
import subprocess
import sys
from collections import Counter
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from whywait.engine.importers import ImportFormatError
from whywait.engine.importers.kineto import steps_from_trace

HTA = Path(__file__).resolve().parents[1] / "fixtures" / "importers" / "hta"
RANK0, RANK1, NCCL = HTA / "sampled_rank-0.json.gz", HTA / "sampled_rank-1.json.gz", HTA / "nccl_data.json.gz"


def _raw(path: Path) -> dict[str, Any]:
    return json.loads(gzip.open(path).read())


def _write(path: Path, raw: Any) -> Path:
    path.write_text(json.dumps(raw))
    return path


def _begin_end(events: list[dict[str, Any]], *, end_names: bool) -> list[dict[str, Any]]:
    """The events with every complete (``X``) event of non-zero length written as a ``B``/``E`` pair.

    Per (pid, tid) in the order a tracer writes them: by time, an end before a begin at the same instant, the
    inner of two spans closed first and opened last.  ``end_names``: whether each ``E`` repeats its name (the
    Trace Event Format lets it leave the name out and close the innermost open span).
    """
    out = [e for e in events if e.get("ph") != "X" or not e.get("dur")]
    pairs = []
    for i, e in enumerate(events):
        if e.get("ph") == "X" and e.get("dur"):
            t0, t1 = e["ts"], e["ts"] + e["dur"]
            b = {k: v for k, v in e.items() if k != "dur"} | {"ph": "B"}
            end = {"ph": "E", "pid": e.get("pid"), "tid": e.get("tid"), "ts": t1} | (
                {"name": e["name"]} if end_names else {})
            pairs += [((str(e.get("pid")), str(e.get("tid"))), (t0, 1, -t1, i), b),
                      ((str(e.get("pid")), str(e.get("tid"))), (t1, 0, -t0, -i), end)]
    pairs.sort(key=lambda p: (p[0], p[1]))
    return out + [e for _, _, e in pairs]


@pytest.mark.parametrize("end_names", [True, False])
def test_begin_end_pairs_read_as_the_complete_events_they_replace(tmp_path: Path, end_names: bool) -> None:
    raw = _raw(RANK0)
    want = [s.record() for s in steps_from_trace(RANK0)]
    be = _begin_end(raw["traceEvents"], end_names=end_names)
    assert not [e for e in be if e.get("ph") == "X" and "ProfilerStep" in e["name"]]  # the steps are B/E only
    assert sum(e.get("ph") == "B" for e in be) > 4000
    f = _write(tmp_path / "rank-0.json", raw | {"traceEvents": be})
    notes: Counter[str] = Counter()
    assert [s.record() for s in steps_from_trace(f, notes=notes)] == want
    assert not notes

    # an unclosed begin (a ProfilerStep too) and an end that closes nothing are counted, not fatal; async b/e are
    # not thread spans and are not read
    last = max(e["ts"] for e in be)
    be += [{"ph": "B", "cat": "user_annotation", "name": "ProfilerStep#999", "pid": 4037, "tid": 4037, "ts": last + 1},
           {"ph": "E", "name": "## forward ##", "pid": 4037, "tid": 4037, "ts": 1},
           {"ph": "b", "cat": "user_annotation", "name": "ProfilerStep#998", "id": 1, "pid": 4037, "tid": 4037,
            "ts": last + 2},
           {"ph": "e", "cat": "user_annotation", "name": "ProfilerStep#998", "id": 1, "pid": 4037, "tid": 4037,
            "ts": last + 9}]
    f = _write(tmp_path / "rank-0.json", raw | {"traceEvents": be})
    notes.clear()
    assert [s.record() for s in steps_from_trace(f, notes=notes)] == want
    assert notes == {"rank-0.json: begin (B) events with no matching end (ignored)": 1,
                     "rank-0.json: end (E) events with no matching begin (ignored)": 1}


def test_a_trace_that_merges_two_ranks_is_refused_and_one_process_driving_two_gpus_is_not(tmp_path: Path) -> None:
    r0, r1 = _raw(RANK0), _raw(RANK1)
    pids = {e["pid"] for r in (r0, r1) for e in r["traceEvents"] if "ProfilerStep" in str(e.get("name"))}
    assert pids == {4037, 4045}  # each rank's ProfilerStep#551 and #552 in its own process
    merged = _write(tmp_path / "rank-0.json", r0 | {"traceEvents": r0["traceEvents"] + r1["traceEvents"]})
    why = r"rank-0\.json: ProfilerStep spans in 2 processes \(pids 4037, 4045\): .*import one trace per rank"
    with pytest.raises(ImportFormatError, match=why):
        steps_from_trace(merged)
    with pytest.raises(ImportFormatError, match=why):  # --rank cannot split it either
        steps_from_trace(merged, rank=0)
    # concatenated as arrays (no distributedInfo): still the merge that is named, not a missing rank
    cat = _write(tmp_path / "traces.json", r0["traceEvents"] + r1["traceEvents"])
    with pytest.raises(ImportFormatError, match="ProfilerStep spans in 2 processes"):
        steps_from_trace(cat)
    run = subprocess.run([sys.executable, "-m", "whywait", "import", str(merged), "--job", "j", "--node", "n",
                          "-o", str(tmp_path / "out.jsonl")], capture_output=True, text=True, timeout=120)
    assert run.returncode != 0 and "Traceback" not in run.stderr
    assert len(run.stderr.strip().splitlines()) == 1 and "pids 4037, 4045" in run.stderr

    # one process, one ProfilerStep series, kernels on two GPUs (device pids 0 and 1): one rank's trace
    kernels = [e for e in r0["traceEvents"] if e.get("cat") == "kernel"]
    for k in kernels[::2]:
        k["pid"], k["args"]["device"] = 1, 1
    assert {k["pid"] for k in kernels} == {0, 1}
    two = _write(tmp_path / "rank-0.json", r0)
    assert [s.record() for s in steps_from_trace(two)] == [s.record() for s in steps_from_trace(RANK0)]


def _split(events: list[dict[str, Any]], pipe_corr: set[int]) -> dict[int, tuple[float, float]]:
    """Per step: (pipeline, collective) NCCL time not overlapped by compute, from µs masks; ``pipe_corr`` are the
    correlations of the send/recv kernels."""
    x = [e for e in events if e.get("ph") == "X"]
    steps = {int(e["name"].split("#")[1]): (e["ts"], e["ts"] + e["dur"]) for e in x
             if e["name"].startswith("ProfilerStep#") and e.get("cat") == "user_annotation"}
    launch = {e["args"]["correlation"]: e["ts"] for e in x if e.get("cat") == "cuda_runtime"
              and "correlation" in e.get("args", {})}
    out = {}
    for n, (s0, s1) in steps.items():
        ks = [e for e in x if e.get("cat") == "kernel" and s0 <= launch.get(e["args"].get("correlation"), -1) <= s1]
        lo, hi = int(min(k["ts"] for k in ks)), int(max(k["ts"] + k["dur"] for k in ks)) + 2
        comp, pipe, coll = (np.zeros(hi - lo, bool) for _ in range(3))
        for k in ks:
            m = comp if "nccl" not in k["name"].lower() else pipe if k["args"]["correlation"] in pipe_corr else coll
            m[int(k["ts"]) - lo:int(k["ts"] + k["dur"]) - lo] = True
        out[n] = ((pipe & ~comp).sum() / 1e6, (coll & ~comp).sum() / 1e6)
    return out


def test_send_recv_known_by_record_param_comms_or_the_kernels_collective_name_is_pipeline_wait(tmp_path: Path) -> None:
    """The real 2-rank DDP trace's all-reduces, relabelled ``send``/``recv`` where each source says what the op is,
    with the ``nccl:`` annotations gone: first by ``record_param_comms``'s ``Collective name`` alone, then by the
    kernels' own (Kineto copies the CPU op's onto the kernel)."""
    raw = _raw(NCCL)
    ev = raw["traceEvents"]
    rpc = [e for e in ev if e.get("name") == "record_param_comms"]
    assert {e["args"].get("Collective name") for e in rpc} == {"allreduce", "broadcast", "wait"}
    assert {e["args"].get("Process Group Description") for e in rpc} == {"default_pg", None}  # "wait" has none
    nccl = [e for e in ev if e.get("cat") == "kernel" and "nccl" in e["name"].lower()]
    sends = {k["args"]["correlation"] for k in nccl if k["args"]["Collective name"] == "allreduce"}
    assert len(sends) == 15 and len(nccl) == 21  # and six broadcasts
    want = _split(ev, sends)
    assert all(p > 0.005 and c > 0 for p, c in want.values())
    unannotated = [e for e in ev if not str(e.get("name", "")).startswith("nccl:")]

    def check(events: list[dict[str, Any]], name: str) -> None:
        got = steps_from_trace(_write(tmp_path / name, raw | {"traceEvents": events}))
        assert [s.step for s in got] == sorted(want) == [4, 5, 6]
        for s in got:
            assert s.pipeline_wait_s == pytest.approx(want[s.step][0], abs=2e-5, rel=0.01)
            assert s.collective_s == pytest.approx(want[s.step][1], abs=2e-5, rel=0.01)

    # record_param_comms alone
    by_rpc = copy.deepcopy(unannotated)
    for e in by_rpc:
        if e.get("name") == "record_param_comms" and e["args"].get("Collective name") == "allreduce":
            e["args"]["Collective name"] = "send"
        elif e.get("cat") == "kernel":
            e["args"].pop("Collective name", None)
    check(by_rpc, "by_rpc.json")
    # the kernel's own Collective name alone
    by_kernel = [copy.deepcopy(e) for e in unannotated if e.get("name") != "record_param_comms"]
    for e in by_kernel:
        if e.get("cat") == "kernel" and e["args"].get("Collective name") == "allreduce":
            e["args"]["Collective name"] = "recv"
    check(by_kernel, "by_kernel.json")
    # with neither, every NCCL kernel is a collective, as before
    bare = [copy.deepcopy(e) for e in unannotated if e.get("name") != "record_param_comms"]
    for e in bare:
        e.get("args", {}).pop("Collective name", None)
    for s in steps_from_trace(_write(tmp_path / "bare.json", raw | {"traceEvents": bare})):
        assert s.pipeline_wait_s == 0 and s.collective_s == pytest.approx(sum(want[s.step]), abs=2e-4, rel=0.01)


def test_an_nccl_annotation_classifies_only_the_launches_on_its_own_thread(tmp_path: Path) -> None:
    """The DDP trace's all-reduces are launched from the autograd thread while the main thread is inside the step;
    a ``nccl:send`` on the main thread spanning the step is the main thread's (its broadcasts), not theirs."""
    raw = _raw(NCCL)
    ev = raw["traceEvents"]
    main = next(e for e in ev if e.get("name") == "ProfilerStep#5" and e.get("cat") == "user_annotation")
    ev.append({**main, "name": "nccl:send 0->1", "ts": main["ts"] + 1, "dur": main["dur"] - 2, "args": {}})
    bcast = {k["args"]["correlation"] for k in ev if k.get("cat") == "kernel" and
             k["args"].get("Collective name") == "broadcast"}
    want = _split(ev, bcast)
    got = {s.step: s for s in steps_from_trace(_write(tmp_path / "t.json", raw))}
    assert got[5].pipeline_wait_s == pytest.approx(want[5][0], abs=2e-5) and want[5][0] > 0
    assert got[5].collective_s == pytest.approx(want[5][1], abs=2e-4, rel=0.01) and want[5][1] > 0.005
    assert got[4].pipeline_wait_s == got[6].pipeline_wait_s == 0  # outside the annotation: collectives
