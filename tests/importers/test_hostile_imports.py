"""Hostile files given to ``whywait import``: each problem is one line naming the file (and line or field),
never an internal error."""

from __future__ import annotations

import gzip
import json
import subprocess
import sys
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
from whywait.engine.importers import ImportFormatError
from whywait.engine.importers.kineto import steps_from_trace
from whywait.engine.importers.steps_table import read_steps

REPO = Path(__file__).resolve().parents[2]
T0 = 1_764_442_800_000_000.0  # µs since 1970


def trace(tmp_path: Path, events: list[dict[str, Any]] | None = None, **top: Any) -> Path:
    ev = [{"ph": "X", "cat": "user_annotation", "name": "ProfilerStep#1", "ts": T0, "dur": 1000}] \
        if events is None else events
    f = tmp_path / "rank.json"
    f.write_text(json.dumps({"distributedInfo": {"rank": 3}, **top, "traceEvents": ev}))
    return f


# ---- Kineto traces -------------------------------------------------------------------------------

@pytest.mark.parametrize("top, says", [
    ({"distributedInfo": "nope"}, "rank.json: distributedInfo: must be an object with a rank (got 'nope'): "
                                  "fix the trace or pass --rank"),
    ({"distributedInfo": {"rank": -3}}, "rank.json: distributedInfo.rank: must be a rank from 0 to 2147483647 "
                                        "(got -3)"),
    ({"distributedInfo": {"rank": True}}, "rank.json: distributedInfo.rank: must be a rank from 0 to "
                                          "2147483647 (got True)"),
    ({"distributedInfo": {"rank": 2 ** 40}}, "rank.json: distributedInfo.rank: must be a rank from 0 to "
                                             "2147483647 (got 1099511627776)"),
    ({"baseTimeNanoseconds": "soon"}, "rank.json: baseTimeNanoseconds: must be nanoseconds since 1970 "
                                      "(got 'soon')"),
])
def test_kineto_bad_header_fields_are_one_line(tmp_path: Path, top: dict[str, Any], says: str) -> None:
    with pytest.raises(ImportFormatError) as exc:
        steps_from_trace(trace(tmp_path, **top))
    assert str(exc.value).endswith(says) and "\n" not in str(exc.value)


def test_kineto_refuses_a_negative_rank_given_on_the_command_line(tmp_path: Path) -> None:
    with pytest.raises(ImportFormatError, match=r"rank.json: --rank: must be a rank from 0 to 2147483647 \(got -1\)"):
        steps_from_trace(trace(tmp_path), rank=-1)


@pytest.mark.parametrize("event, says", [
    ({"ph": "X", "cat": "cpu_op", "name": "ProfilerStep#1", "ts": T0, "dur": -5},
     "traceEvents[0]: ProfilerStep#1 has a negative dur (-5 µs)"),
    ({"ph": "X", "cat": "cpu_op", "name": "ProfilerStep#" + "9" * 5000, "ts": T0, "dur": 5},
     "traceEvents[0]: step number '" + "9" * 29 + "... (5002 chars) is over 9007199254740992"),
    ({"ph": "X", "cat": "cpu_op", "name": "x", "ts": 1e300, "dur": 5},
     "traceEvents[0]: ts and dur must be microseconds, finite and under 1e+17 (got ts 1e+300, dur 5)"),
])
def test_kineto_bad_events_name_the_event(tmp_path: Path, event: dict[str, Any], says: str) -> None:
    with pytest.raises(ImportFormatError) as exc:
        steps_from_trace(trace(tmp_path, [event]))
    assert str(exc.value).endswith("rank.json: " + says)


def test_kineto_odd_args_and_names_are_ignored_not_fatal(tmp_path: Path) -> None:
    ev = [{"ph": "X", "cat": "user_annotation", "name": "ProfilerStep#1", "ts": T0, "dur": 1000},
          {"ph": "X", "cat": "cuda_runtime", "name": "cudaLaunchKernel", "ts": T0 + 1, "dur": 1,
           "args": {"correlation": [1]}},
          {"ph": "X", "cat": "kernel", "name": "gemm", "ts": T0 + 2, "dur": 3, "args": ["correlation", 1]},
          {"ph": "X", "cat": ["kernel"], "name": {"n": 1}, "ts": T0 + 2, "dur": 3},
          {"ph": "X", "cat": "kernel", "name": "gemm", "ts": T0 + 2, "dur": -3, "args": {"correlation": 1}}]
    notes: Counter[str] = Counter()
    (s,) = steps_from_trace(trace(tmp_path, ev), notes=notes)
    assert (s.rank, s.step, s.compute_s) == (3, 1, 0.0)
    assert notes["rank.json: events with a negative duration (ignored)"] == 1


@pytest.mark.parametrize("raw, says", [
    (b'{"traceEvents": [' + b"[" * 5000 + b"]" * 5000 + b"]}", "rank.json: not a JSON trace (nested too deeply)"),
    (b"\x1f\x8b\x08\x00\x00\x00\x00\x00\x00\x03garbage", "rank.json: not a JSON trace"),
])
def test_kineto_unreadable_files_are_one_line(tmp_path: Path, raw: bytes, says: str) -> None:
    f = tmp_path / "rank.json"
    f.write_bytes(raw)
    with pytest.raises(ImportFormatError) as exc:
        steps_from_trace(f, rank=0)
    assert says in str(exc.value)


# ---- step tables ---------------------------------------------------------------------------------

HEADER = b"time,job,rank,step,duration_s\n"


@pytest.mark.parametrize("name, raw, says", [
    ("steps.csv", HEADER + b"1,j,0,1,1\n1,j\xff,0,2,1\n",
     "steps.csv:3: not UTF-8 (byte 0xff at byte offset 43): save the table as UTF-8"),
    ("steps.csv", "time,job,rank,step,duration_s\n1,jé,0,1,1\n".encode("latin-1"),
     "steps.csv:2: not UTF-8 (byte 0xe9 at byte offset 33): save the table as UTF-8"),
    ("steps.csv", "time,job,rank,step,duration_s\n1,j,0,1,1\n".encode("utf-16"),
     "steps.csv:1: not UTF-8 (byte 0xff at byte offset 0): save the table as UTF-8"),
    ("steps.jsonl", b'{"time": 1, "job": "j\xc3", "rank": 0, "step": 1, "duration_s": 1}\n',
     "steps.jsonl:1: not UTF-8 (byte 0xc3 at byte offset 21): save the table as UTF-8"),
    ("steps.csv", HEADER + b"1,j\x00,0,1,1\n", "steps.csv:2: job: must not hold control characters (got 'j\\x00')"),
    ("steps.jsonl", b'{"time": 1, "job": "j", "rank": 1' + b"0" * 400 + b', "step": 1, "duration_s": 1}\n',
     "steps.jsonl:1: rank: must be at most 2147483647 (got 1000000000000000000000000000000000000000... (401 chars))"),
    ("steps.jsonl", b'{"time": 1, "job": "j", "rank": true, "step": 1, "duration_s": 1}\n',
     "steps.jsonl:1: rank: must be a number (got True)"),
    ("steps.jsonl", b'{"time": 1, "job": "j", "rank": 0, "step": 1e17, "duration_s": 1}\n',
     "steps.jsonl:1: step: must be at most 9007199254740992 (got 1e+17)"),
    ("steps.jsonl", b'{"time": 1' + b"0" * 400 + b', "job": "j", "rank": 0, "step": 1, "duration_s": 1}\n',
     "steps.jsonl:1: time: time must be Unix seconds or ISO 8601"),
    ("steps.jsonl", b'{"a":' * 5000 + b"1" + b"}" * 5000 + b"\n", "steps.jsonl:1: not valid JSON (nested too deeply)"),
])
def test_step_tables_bad_bytes_are_one_line_with_file_and_line(tmp_path: Path, name: str, raw: bytes,
                                                               says: str) -> None:
    f = tmp_path / name
    f.write_bytes(raw)
    with pytest.raises(ImportFormatError) as exc:
        list(read_steps(f, node="n"))
    assert says in str(exc.value) and "\n" not in str(exc.value)


def test_a_spreadsheet_bom_is_skipped(tmp_path: Path) -> None:
    f = tmp_path / "steps.csv"
    f.write_bytes(b"\xef\xbb\xbf" + HEADER + b"1,j,0,1,1\n")
    assert [r[2]["rank"] for r in read_steps(f, node="n")] == [0]


@pytest.mark.parametrize("fmt", ["steps", "auto"])
def test_import_of_non_utf8_is_one_line_not_an_internal_error(tmp_path: Path, fmt: str) -> None:
    f = tmp_path / "steps.csv"
    f.write_bytes(HEADER + b"1,caf\xe9,0,1,1\n")
    r = subprocess.run([sys.executable, "-m", "whywait", "import", "--format", fmt, "--node", "n",
                        "-o", str(tmp_path / "out.jsonl"), str(f)],
                       capture_output=True, text=True, cwd=REPO, timeout=120)
    assert r.returncode != 0
    assert r.stderr.strip().splitlines() == [
        f"whywait import: {f}:2: not UTF-8 (byte 0xe9 at byte offset 35): save the table as UTF-8"]


def test_import_of_a_kineto_trace_with_a_bad_rank_is_one_line(tmp_path: Path) -> None:
    f = tmp_path / "rank.json.gz"
    # one step, so the rank is what is wrong (a trace with no step says that first: no rank would help it)
    step = {"ph": "X", "cat": "user_annotation", "name": "ProfilerStep#1", "ts": T0, "dur": 1000.0, "pid": 1, "tid": 1}
    f.write_bytes(gzip.compress(json.dumps({"distributedInfo": "nope", "traceEvents": [step]}).encode()))
    r = subprocess.run([sys.executable, "-m", "whywait", "import", "--format", "kineto", "--job", "j",
                        "--node", "n", "-o", str(tmp_path / "out.jsonl"), str(f)],
                       capture_output=True, text=True, cwd=REPO, timeout=120)
    assert r.returncode != 0
    assert r.stderr.strip().splitlines() == [
        f"whywait import: {f}: distributedInfo: must be an object with a rank (got 'nope'): fix the trace or "
        "pass --rank"]


# ---- bundles -------------------------------------------------------------------------------------

def _host(**over: Any) -> bytes:
    m = {"schema": 1, "kind": "host", "time": T0 / 1e6 + 1, "node": "node-01", "cpu_busy_pct": 5.0,
         "cpu_iowait_pct": 0.0, "mem_used_bytes": 1, "mem_total_bytes": 2, **over}
    return json.dumps(m).encode()


def test_import_of_a_bundle_skips_and_counts_values_that_break_the_contract(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from whywait.engine.cli import main
    from whywait.engine.importers.bundle import BundleWriter

    b, out = tmp_path / "b.whywait", tmp_path / "out.jsonl"
    good = [_host(), _host(node="node-02")]
    with BundleWriter(b, {"since": T0 / 1e6, "until": T0 / 1e6 + 60, "lead_s": 0.0}) as bw:
        bw.add("whywait.host.v1", good[0])
        bw.add("whywait.host.v1", _host(cpu_busy_pct="busy"))  # a mistyped field
        bw.add("whywait.host.v1", b"[1, 2]")  # not a message at all
        bw.add("whywait.gpu.v1", _host(node="node-03"))  # a host message on another kind's topic
        bw.add("whywait.host.v1", good[1])
        bw.close(None, [])
    assert main(["import", str(b), "-o", str(out)]) == 0
    said = capsys.readouterr().out.splitlines()
    assert out.read_bytes().splitlines() == good
    assert said[0] == f"wrote 2 messages from bundle {b} to {out}"
    assert said[1].startswith("  skipped 1 message(s) of whywait.gpu.v1 that break the event contract (the first: ")
    assert said[2].startswith("  skipped 2 message(s) of whywait.host.v1 that break the event contract (the first: "
                              "cpu_busy_pct: ")
    assert len(said) == 3


def test_publish_skips_and_counts_a_value_whose_key_cannot_be_read(monkeypatch: pytest.MonkeyPatch) -> None:
    import asyncio

    import aiokafka
    from whywait.engine.commands import import_cmd
    from whywait.engine.localkafka import broker

    sent: list[tuple[str, bytes, bytes]] = []

    class Producer:
        def __init__(self, **_: Any) -> None:
            pass

        async def start(self) -> None:
            pass

        async def send(self, topic: str, raw: bytes, key: bytes) -> None:
            sent.append((topic, raw, key))

        async def flush(self) -> None:
            pass

        async def stop(self) -> None:
            pass

    async def nothing(*_: Any, **__: Any) -> None:
        return None

    from whywait.engine.stream import topics

    monkeypatch.setattr(broker, "probe", lambda *a, **k: True)
    monkeypatch.setattr(aiokafka, "AIOKafkaProducer", Producer)
    # the topics' creation and leaders are the broker's business, tested against a real one elsewhere
    monkeypatch.setattr(topics, "ensure_topics_async", nothing)
    monkeypatch.setattr(topics, "wait_for_leaders", nothing)
    skipped = import_cmd.Skipped()
    items = [("whywait.host.v1", _host()), ("whywait.host.v1", b"{not json"),
             ("whywait.host.v1", b"[" * 100_000 + b"]" * 100_000), ("whywait.host.v1", b'{"kind": "host"}')]
    assert asyncio.run(import_cmd.publish("x:1", iter(items), skipped)) == 1
    assert sent == [("whywait.host.v1", _host(), b"node-01")]
    assert skipped.counts == Counter({"message(s) of whywait.host.v1 without a readable key": 3})
