"""Kineto import of trace shapes the other tests do not cover, each built from the real fixtures' own events (see
``tests/fixtures/importers/ATTRIBUTION.md``) and checked against figures computed here from the raw events with
microsecond masks: MTIA's device categories, several ranks merged under one pid, ``nccl:coalesced`` groups,
rewritten files (keys sorted, ids and times as strings), two traces concatenated, and the memory one import takes."""

from __future__ import annotations

import copy
import gzip
import json
import subprocess
import sys
import tracemalloc
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from whywait.engine.importers import ImportFormatError
from whywait.engine.importers.kineto import is_kineto, load_trace, steps_from_trace

HTA = Path(__file__).resolve().parents[1] / "fixtures" / "importers" / "hta"
RANK0, RANK1, NCCL = HTA / "sampled_rank-0.json.gz", HTA / "sampled_rank-1.json.gz", HTA / "nccl_data.json.gz"


def _raw(path: Path) -> dict[str, Any]:
    return json.loads(gzip.open(path).read())


def _write(path: Path, raw: Any, **dump: Any) -> Path:
    path.write_text(json.dumps(raw, **dump))
    return path


def _records(path: Path, **kw: Any) -> list[dict[str, Any]]:
    return [s.record() for s in steps_from_trace(path, **kw)]


def _cli(*argv: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "whywait", "import", *argv], capture_output=True, text=True,
                          timeout=120)


# ---- MTIA -----------------------------------------------------------------------------------------------------------

def _as_mtia(raw: dict[str, Any]) -> dict[str, Any]:
    """The trace as Kineto writes an MTIA run's: device events in ``mtia_ccp_events``, launches in ``mtia_runtime``
    named as HTA's symbol table knows MTIA's kernel launch (``runFunction - job_prep_and_submit_for_execution``)."""
    out = copy.deepcopy(raw)
    for e in out["traceEvents"]:
        if e.get("cat") == "kernel":
            e["cat"] = "mtia_ccp_events"
        elif e.get("cat") == "cuda_runtime":
            e["cat"] = "mtia_runtime"
            if "Launch" in e["name"]:
                e["name"] = "runFunction - job_prep_and_submit_for_execution"
    return out


def test_mtia_device_events_count_as_gpu_kernels_do_and_its_dma_as_memory(tmp_path: Path) -> None:
    raw = _raw(RANK0)
    want = _records(RANK0)
    assert all(r["compute_s"] > 0.05 for r in want)
    mtia = _as_mtia(raw)
    assert not [e for e in mtia["traceEvents"] if e.get("cat") in ("kernel", "cuda_runtime")]
    assert _records(_write(tmp_path / "rank-0.json", mtia)) == want
    # MTIA's memory transfers are device events named dma_request (HTA): launched inside the steps and lasting
    # them out, they would swamp compute if they were read as kernels
    launches = [e for e in mtia["traceEvents"] if e.get("cat") == "mtia_runtime" and "correlation" in e["args"]]
    step = next(e for e in mtia["traceEvents"] if e.get("name") == "ProfilerStep#551")
    for n, launch in enumerate(launches[:2]):
        mtia["traceEvents"].append({"ph": "X", "cat": "mtia_ccp_events", "name": "dma_request", "pid": 0,
                                    "tid": 9, "ts": step["ts"], "dur": step["dur"] * 2,
                                    "args": {"correlation": launch["args"]["correlation"], "n": n}})
    assert _records(_write(tmp_path / "rank-0.json", mtia)) == want
    # Kineto versions that alias MTIA_CCP_EVENTS to CONCURRENT_KERNEL and MTIA_RUNTIME to RUNTIME write "kernel"
    # and "runtime": read as any accelerator's
    for e in mtia["traceEvents"]:
        e["cat"] = {"mtia_ccp_events": "kernel", "mtia_runtime": "runtime"}.get(e.get("cat"), e.get("cat"))
    assert _records(_write(tmp_path / "rank-0.json", mtia)) == want


# ---- several ranks under one pid ------------------------------------------------------------------------------------

def _same_pid(r0: dict[str, Any], r1: dict[str, Any], *, metadata: bool = True, steps_from: int = 551
              ) -> list[dict[str, Any]]:
    """Both ranks' events with rank 1's host pid (4045) reused as rank 0's (4037), as two containers' trainers can
    share a pid (the device pids, 0..7, are the same numbers in both already); ``metadata``: whether the process
    names are kept; ``steps_from``: the number rank 1's first step is given."""
    ev1 = copy.deepcopy(r1["traceEvents"])
    for e in ev1:
        if e.get("pid") == 4045:
            e["pid"] = 4037
        if e.get("tid") == 4045:
            e["tid"] = 4037
        name = str(e.get("name"))
        if name.startswith("ProfilerStep#"):
            e["name"] = f"ProfilerStep#{int(name[13:]) - 551 + steps_from}"
    return [e for e in r0["traceEvents"] + ev1 if metadata or e.get("ph") != "M"]


def test_two_ranks_under_one_pid_are_refused_naming_what_shows_it(tmp_path: Path) -> None:
    r0, r1 = _raw(RANK0), _raw(RANK1)
    merged = _same_pid(r0, r1)
    assert {e["pid"] for e in merged if "ProfilerStep" in str(e.get("name"))} == {4037}  # one process, by its pid
    # 1. the process names Kineto wrote for each rank differ
    f = _write(tmp_path / "rank-0.json", r0 | {"traceEvents": merged})
    why = (r"rank-0\.json: pid 4037 has 2 process names \('pyper:trainer:0:0', 'pyper:trainer:0:1'\): the trace "
           r"merges several ranks' traces under one pid; import one trace per rank")
    with pytest.raises(ImportFormatError, match=why):
        steps_from_trace(f)
    with pytest.raises(ImportFormatError, match=why):  # --rank cannot split it either
        steps_from_trace(f, rank=0)
    run = _cli(str(f), "--job", "j", "--node", "n", "-o", str(tmp_path / "out.jsonl"))
    assert run.returncode != 0 and "Traceback" not in run.stderr
    assert len(run.stderr.strip().splitlines()) == 1 and "pid 4037 has 2 process names" in run.stderr
    # 2. without the metadata: each step number twice, with two spans
    bare = _same_pid(r0, r1, metadata=False)
    s551 = [e["ts"] for e in bare if e.get("name") == "ProfilerStep#551" and e["cat"] == "user_annotation"]
    assert len(s551) == 2
    with pytest.raises(ImportFormatError, match=rf"rank-0\.json: ProfilerStep#551 twice \(at ts {s551[0]} and "
                                                rf"{s551[1]} µs\): the trace merges several ranks' traces"):
        steps_from_trace(_write(tmp_path / "rank-0.json", r0 | {"traceEvents": bare}))
    # 3. rank 1's steps numbered otherwise (profiled from another step): the two series overlap in time
    other = _same_pid(r0, r1, metadata=False, steps_from=651)
    with pytest.raises(ImportFormatError, match=r"rank-0\.json: ProfilerStep#551 and ProfilerStep#651 overlap "
                                                r"\(by \d+ µs\): the trace merges several ranks' traces under one pid"):
        steps_from_trace(_write(tmp_path / "rank-0.json", r0 | {"traceEvents": other}))


def test_one_rank_with_renamed_threads_and_devices_named_as_its_process_is_not_a_merge() -> None:
    """The DDP fixture names one thread twice (PyTorch renames its threads) and its GPUs' pids by its process name:
    neither is a second rank."""
    raw = _raw(NCCL)
    names: dict[tuple[Any, Any], set[str]] = {}
    for e in raw["traceEvents"]:
        if e.get("ph") == "M" and e["name"] == "thread_name":
            names.setdefault((e["pid"], e["tid"]), set()).add(e["args"]["name"])
    assert any(len(v) > 1 for v in names.values())
    assert [s.step for s in steps_from_trace(NCCL)] == [4, 5, 6]


def test_two_traces_written_one_after_another_are_one_line(tmp_path: Path) -> None:
    f = tmp_path / "all.json"
    f.write_bytes(gzip.open(RANK0).read() + b"\n" + gzip.open(RANK1).read())
    with pytest.raises(ImportFormatError) as exc:
        steps_from_trace(f)
    said = str(exc.value)
    assert said.startswith(f"{f}: more than one JSON document (a second one starts at line ")
    assert said.endswith("traces written one after another; import one trace per rank") and "\n" not in said
    run = _cli(str(f), "--format", "kineto", "--job", "j", "--node", "n", "-o", str(tmp_path / "o.jsonl"))
    assert run.returncode != 0 and "Traceback" not in run.stderr and len(run.stderr.strip().splitlines()) == 1
    assert "more than one JSON document" in run.stderr


# ---- nccl:coalesced -------------------------------------------------------------------------------------------------

def _split(events: list[dict[str, Any]], pipe_corr: set[int]) -> dict[int, tuple[float, float, float]]:
    """Per step: (pipeline, collective, all NCCL) time not overlapped by compute, from µs masks; ``pipe_corr`` are
    the correlations of the point-to-point kernels."""
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
        out[n] = ((pipe & ~comp).sum() / 1e6, (coll & ~comp).sum() / 1e6, ((pipe | coll) & ~comp).sum() / 1e6)
    return out


def _allreduce_launches(ev: list[dict[str, Any]]) -> list[tuple[dict[str, Any], dict[str, Any], dict[str, Any],
                                                                    dict[str, Any]]]:
    """For each all-reduce kernel of the DDP fixture: (kernel, its launch, the record_param_comms around the launch,
    the nccl:all_reduce annotation around it).  Nested so: c10d::allreduce_ > record_param_comms > nccl:all_reduce
    > cudaLaunchKernelExC, on the autograd thread."""
    launch = {e["args"]["correlation"]: e for e in ev if e.get("cat") == "cuda_runtime"
              and "correlation" in e.get("args", {})}
    out = []
    for k in ev:
        if k.get("cat") == "kernel" and k["args"].get("Collective name") == "allreduce":
            ln = launch[k["args"]["correlation"]]

            def around(name: str, ln: dict[str, Any] = ln) -> dict[str, Any]:
                (a,) = [e for e in ev if e.get("name") == name and e.get("tid") == ln["tid"]
                        and e["ts"] <= ln["ts"] <= e["ts"] + e["dur"]]
                return a
            out.append((k, ln, around("record_param_comms"), around("nccl:all_reduce")))
    return out


@pytest.mark.parametrize("pytorch", ["newer", "older"])
def test_a_coalesced_group_of_sends_is_pipeline_wait_and_counted_once(tmp_path: Path, pytorch: str) -> None:
    """The DDP fixture's all-reduces rewritten as ProcessGroupNCCL issues a coalesced group of sends (a pipeline
    stage's ``batch_isend_irecv``): each send's ``record_param_comms`` closes before the group's kernel is launched
    at ``ncclGroupEnd``, which newer PyTorch wraps in ``nccl:coalesced`` (opened before ``groupEnd``) and older
    PyTorch follows with it (opened after)."""
    raw = _raw(NCCL)
    ev = raw["traceEvents"]
    group = _allreduce_launches(ev)
    assert len(group) == 15
    for k, ln, rpc, ann in group:
        ann["name"] = "nccl:coalesced"
        if pytorch == "older":  # endCoalescing: groupEnd() (the launch), then initWork("nccl:coalesced")
            ann["ts"], ann["dur"] = ln["ts"] + ln["dur"] + 1, 5
        rpc["args"]["Collective name"] = "send"
        rpc["dur"] = ann["ts"] - rpc["ts"] - 1 if pytorch == "newer" else ln["ts"] - rpc["ts"] - 1
        k["args"].pop("Collective name")
    want = _split(ev, {k["args"]["correlation"] for k, *_ in group})
    assert all(p > 0.005 and c > 0 for p, c, _ in want.values())
    got = steps_from_trace(_write(tmp_path / "rank-0.json", raw))
    assert [s.step for s in got] == sorted(want) == [4, 5, 6]
    for s in got:
        p, c, both = want[s.step]
        assert s.pipeline_wait_s == pytest.approx(p, abs=2e-5, rel=0.01)
        assert s.collective_s == pytest.approx(c, abs=2e-4, rel=0.01)  # the broadcasts only
        assert s.comm_s == pytest.approx(both, abs=2e-4, rel=0.01)  # the group's time once, not again as a collective


def test_a_long_lived_coalesced_annotation_does_not_name_the_ops_launched_under_it(tmp_path: Path) -> None:
    """``nccl:coalesced`` lasts until its Work is freed, so it can cover later ops' launches on its thread: each is
    what its own annotation says (here, sends), and a launch under nothing else is what its own group held."""
    raw = _raw(NCCL)
    ev = raw["traceEvents"]
    group = _allreduce_launches(ev)
    tid = group[0][1]["tid"]
    first, last = min(e["ts"] for e in ev if e.get("ph") == "X"), max(e["ts"] for e in ev if e.get("ph") == "X")
    wrapper = {"ph": "X", "cat": "user_annotation", "name": "nccl:coalesced", "pid": group[0][1]["pid"], "tid": tid,
               "ts": first - 10, "dur": last - first + 20, "args": {}}
    want = {s.step: s.record() for s in steps_from_trace(NCCL)}
    # around nccl:all_reduce annotations: the all-reduces stay collectives
    got = {s.step: s.record() for s in steps_from_trace(_write(tmp_path / "a.json", raw | {
        "traceEvents": ev + [wrapper]}))}
    assert got == want
    # around nccl:send annotations: pipeline wait, though the wrapper began first
    for _, _, _, ann in group:
        ann["name"] = "nccl:send 0->1"
    split = _split(ev, {k["args"]["correlation"] for k, *_ in group})
    got2 = steps_from_trace(_write(tmp_path / "b.json", raw | {"traceEvents": ev + [wrapper]}))
    for s in got2:
        assert s.pipeline_wait_s is not None and s.pipeline_wait_s > 0.005
        assert s.pipeline_wait_s == pytest.approx(split[s.step][0], abs=2e-5, rel=0.01)


def test_a_wait_between_two_launches_is_not_an_op_of_the_group(tmp_path: Path) -> None:
    """c10d's ``wait`` has a ``record_param_comms`` span too (the DDP fixture's "wait"): it names no traffic, so a
    group of sends with a wait before its launch is still pipeline traffic."""
    raw = _raw(NCCL)
    ev = raw["traceEvents"]
    group = _allreduce_launches(ev)
    extra = []
    for k, _, rpc, ann in group:
        ann["name"] = "nccl:coalesced"
        rpc["args"]["Collective name"] = "send"
        rpc["dur"] = ann["ts"] - rpc["ts"] - 2
        k["args"].pop("Collective name")
        extra.append({**rpc, "ts": ann["ts"] - 1.5, "dur": 1, "args": {"Collective name": "wait"}})
    want = _split(ev, {k["args"]["correlation"] for k, *_ in group})
    for s in steps_from_trace(_write(tmp_path / "rank-0.json", raw | {"traceEvents": ev + extra})):
        assert s.pipeline_wait_s == pytest.approx(want[s.step][0], abs=2e-5, rel=0.01)


# ---- rewritten and foreign files ------------------------------------------------------------------------------------

def test_a_trace_whose_keys_come_in_another_order_is_detected_and_read(tmp_path: Path) -> None:
    """Rewritten with its keys sorted (``json.dump(..., sort_keys=True)``), a trace starts with Kineto's ``INFO``
    log lines, then ``baseTimeNanoseconds``, ``deviceProperties``, ``distributedInfo``; with one ``pg_config`` per
    process group its ``schemaVersion`` and ``traceEvents`` are far from the start.  The content, not the key order,
    says what it is."""
    raw = _raw(NCCL)
    pg = raw["distributedInfo"]["pg_config"][0]
    raw["distributedInfo"]["pg_config"] = [pg | {"pg_name": str(i), "ranks": list(range(64))} for i in range(400)]
    f = _write(tmp_path / "rank-0.json", raw, sort_keys=True)
    head = f.read_bytes()[:65536]
    assert head.startswith(b'{"INFO": ["INFO:2024-05-22')
    assert b"traceEvents" not in head and b"schemaVersion" not in head
    assert is_kineto(f)
    gz = tmp_path / "rank-0.Jul_15_10_52_41.1074.pt.trace.json.gz"  # what tensorboard_trace_handler(use_gzip) names
    gz.write_bytes(gzip.compress(f.read_bytes()))
    assert is_kineto(gz)
    assert _records(f) == _records(gz) == _records(NCCL)
    out = tmp_path / "out.jsonl"
    run = _cli(str(gz), "--job", "j", "--node", "n", "-o", str(out))  # --format left out: detected
    assert run.returncode == 0, run.stderr
    assert len(out.read_text().splitlines()) == 3


def test_ids_and_times_written_as_strings_read_as_numbers(tmp_path: Path) -> None:
    """Some exporters write every value as a string: times, pids, tids, device ids and correlation ids (a launch's
    ``5`` and its kernel's ``"5"`` are one id)."""
    raw = _raw(RANK0)
    want = _records(RANK0)
    for e in raw["traceEvents"]:
        for key in ("ts", "dur", "pid", "tid"):
            if key in e:
                e[key] = str(e[key])
        args = e.get("args", {})
        if e.get("cat") == "kernel":
            args["correlation"], args["device"] = str(args["correlation"]), str(args["device"])
    assert _records(_write(tmp_path / "rank-0.json", raw)) == want
    for e in raw["traceEvents"]:  # and as floats
        if e.get("cat") == "kernel":
            e["args"]["correlation"] = float(e["args"]["correlation"])
    assert _records(_write(tmp_path / "rank-0.json", raw)) == want


def test_a_trace_without_steps_says_its_iteration_marker_is_not_one(tmp_path: Path) -> None:
    """Kineto writes "Iteration Start: PyTorch Profiler" where its profile began (one marker, not one per step);
    a trace taken on demand (dynolog) has it and no ``ProfilerStep``."""
    raw = _raw(NCCL)
    raw["traceEvents"] = [e for e in raw["traceEvents"] if "ProfilerStep" not in str(e.get("name"))]
    with pytest.raises(ImportFormatError) as exc:
        steps_from_trace(_write(tmp_path / "rank-0.json", raw))
    assert str(exc.value) == (f"{tmp_path / 'rank-0.json'}: no ProfilerStep#N spans (its 'Iteration Start: PyTorch "
                              "Profiler' marks where the profile began, not a step; a trace taken on demand, as "
                              "dynolog does, has none): profile with torch.profiler.schedule and call prof.step() "
                              "each iteration")


def test_a_large_trace_is_held_once_while_it_is_parsed(tmp_path: Path) -> None:
    """Parsing holds the text and the events; the file's bytes (and, for gzip, a copy of them) go first."""
    ev = [{"ph": "X", "cat": "cpu_op", "name": "aten::mm", "pid": 1, "tid": 1, "ts": 1.7e15 + i, "dur": 1,
           "args": {"External id": i}} for i in range(60000)]
    body = json.dumps({"traceEvents": ev}).encode()
    del ev
    for f in (tmp_path / "big.json", tmp_path / "big.json.gz"):
        f.write_bytes(gzip.compress(body, 1) if f.suffix == ".gz" else body)
        tracemalloc.start()
        try:
            data = load_trace(f)
            kept, peak = tracemalloc.get_traced_memory()
        finally:
            tracemalloc.stop()
        assert len(data["traceEvents"]) == 60000
        # the events, plus the text while they were parsed: the bytes once more would be 2x
        assert peak - kept < 1.5 * len(body), (f.name, peak - kept, len(body))
        del data
