from __future__ import annotations

import json
import os
import socket
import sys
import time
from typing import Iterator

import pytest
from whywait.agents.integrations import StepClock, hf_callback, lightning_callback
from whywait.agents.training import DEFAULT_SOCKET, SOCKET_ENV, Reporter, socket_path


@pytest.fixture()
def listener(tmp_path: "os.PathLike[str]") -> Iterator[tuple[str, socket.socket]]:
    path = os.path.join(str(tmp_path), "agent.sock")
    s = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    s.bind(path)
    s.settimeout(2.0)
    yield path, s
    s.close()


def recv(s: socket.socket) -> dict:
    return json.loads(s.recv(65536))


def test_step_with_phases_is_one_datagram(listener: tuple[str, socket.socket]) -> None:
    path, s = listener
    rep = Reporter("job-7", rank=3, node="node-01", sock=path)
    with rep.step(12):
        with rep.data_wait():
            time.sleep(0.02)
        with rep.compute():
            time.sleep(0.03)
        with rep.comm():
            time.sleep(0.01)
    d = recv(s)
    assert d["type"] == "step" and d["job"] == "job-7" and d["rank"] == 3 and d["step"] == 12
    assert d["node"] == "node-01" and d["pid"] == os.getpid() and d["v"] == 1
    assert 0.02 <= d["data_wait_s"] < 0.2 and 0.03 <= d["compute_s"] < 0.2 and 0.01 <= d["comm_s"] < 0.2
    assert d["checkpoint_s"] == 0.0
    assert d["duration_s"] >= d["data_wait_s"] + d["compute_s"] + d["comm_s"]
    assert rep.sent == 1 and rep.dropped == 0


def test_decorators(listener: tuple[str, socket.socket]) -> None:
    path, s = listener
    rep = Reporter("j", 0, sock=path)

    @rep.timed("data_wait")
    def next_batch() -> int:
        time.sleep(0.01)
        return 5

    @rep.timed_step
    def train_step(n: int) -> int:
        return next_batch() + n

    assert train_step(4) == 9
    d = recv(s)
    assert d["step"] == 4 and d["data_wait_s"] >= 0.01
    with pytest.raises(ValueError, match="phase must be one of"):
        rep.timed("optimizer")


def test_data_wait_before_the_step_counts_in_the_next_step(listener: tuple[str, socket.socket]) -> None:
    path, s = listener
    rep = Reporter("j", 0, sock=path)
    with rep.data_wait():  # the common loop shape: fetch, then step
        time.sleep(0.01)
    with rep.step(0):
        pass
    assert recv(s)["data_wait_s"] >= 0.01


def test_checkpoint_start_and_end(listener: tuple[str, socket.socket]) -> None:
    path, s = listener
    rep = Reporter("j", 2, sock=path)
    cid = rep.checkpoint_start("/ckpt/step-100")
    rep.checkpoint_end(bytes=123456, path="/ckpt/step-100")
    start, end = recv(s), recv(s)
    assert start["phase"] == "start" and start["checkpoint_id"] == cid and start["path"] == "/ckpt/step-100"
    assert end["phase"] == "end" and end["checkpoint_id"] == cid and end["bytes"] == 123456
    assert end["duration_s"] >= 0
    rep.checkpoint_start()
    rep.checkpoint_failed("disk full")
    recv(s)
    assert recv(s)["error"] == "disk full"


def test_no_agent_drops_and_counts_never_raises(tmp_path: "os.PathLike[str]") -> None:
    rep = Reporter("j", 0, sock=os.path.join(str(tmp_path), "nobody-here.sock"))
    t0 = time.perf_counter()
    for n in range(1000):
        with rep.step(n):
            with rep.compute():
                pass
    rep.checkpoint_end(1)
    elapsed = time.perf_counter() - t0
    assert rep.dropped == 1001 and rep.sent == 0
    assert elapsed < 2.0  # never blocks


def test_full_socket_buffer_drops_instead_of_blocking(listener: tuple[str, socket.socket]) -> None:
    path, _ = listener  # nobody reads: the receive buffer fills
    rep = Reporter("j", 0, sock=path)
    t0 = time.perf_counter()
    for n in range(20_000):
        with rep.step(n):
            pass
    assert time.perf_counter() - t0 < 10.0
    assert rep.dropped > 0 and rep.sent + rep.dropped == 20_000


def test_an_exception_in_the_step_still_reports_and_propagates(listener: tuple[str, socket.socket]) -> None:
    path, s = listener
    rep = Reporter("j", 0, sock=path)
    with pytest.raises(RuntimeError):
        with rep.step(1):
            raise RuntimeError("nan loss")
    assert recv(s)["step"] == 1


def test_socket_path_precedence(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(SOCKET_ENV, raising=False)
    assert socket_path() == DEFAULT_SOCKET == "/run/whywait/agent.sock"
    monkeypatch.setenv(SOCKET_ENV, "/tmp/x.sock")
    assert socket_path() == "/tmp/x.sock" and socket_path("/y.sock") == "/y.sock"


def test_training_module_imports_stdlib_only() -> None:
    import subprocess

    code = ("import sys; import whywait.agents.training, whywait.agents.integrations; "
            "bad = [m for m in sys.modules if m.removeprefix('whywait.').split('.')[0] in "
            "('torch', 'aiokafka', 'kafka', 'faust', 'engine', 'slack_sdk', 'lightning', 'transformers', 'pynvml')]; "
            "print(bad)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"


def test_step_clock_times_from_framework_hooks(listener: tuple[str, socket.socket]) -> None:
    path, s = listener
    clock = StepClock(Reporter("j", 0, sock=path))
    clock.begin(0)
    time.sleep(0.01)
    clock.end()
    time.sleep(0.02)  # the loader fetching the next batch
    clock.begin(1)
    clock.end()
    first, second = recv(s), recv(s)
    assert first["compute_s"] >= 0.01 and first["data_wait_s"] == 0.0
    assert second["step"] == 1 and second["data_wait_s"] >= 0.02


def test_adapters_say_what_is_missing() -> None:
    rep = Reporter("j", 0, sock="/nonexistent/agent.sock")
    for factory, lib in ((lightning_callback, "lightning"), (hf_callback, "transformers")):
        try:
            cb = factory(rep)
        except ImportError as exc:
            assert lib in str(exc)
        else:  # pragma: no cover - the library is installed here
            assert hasattr(cb, "clock")


def test_the_reporter_names_the_job_as_the_scheduler_hook_publishes_it(monkeypatch: pytest.MonkeyPatch) -> None:
    from whywait.agents.training import job_id_from_env, rank_from_env
    from whywait.engine.placement.slurm import facts_from_env

    slurm = {"SLURM_JOB_ID": "777", "SLURM_PROCID": "5", "SLURM_JOB_NODELIST": "node-01"}
    assert job_id_from_env(slurm) == facts_from_env(slurm, False).job == "slurm-777"
    array = {**slurm, "SLURM_ARRAY_JOB_ID": "700", "SLURM_ARRAY_TASK_ID": "0"}
    assert job_id_from_env(array) == facts_from_env(array, False).job == "slurm-700_0"
    assert job_id_from_env({**slurm, "WHYWAIT_JOB": "ml/llama-run7"}) == "ml/llama-run7"  # said outright wins
    assert job_id_from_env({}) is None
    assert rank_from_env(slurm) == 5 and rank_from_env({**slurm, "RANK": "12"}) == 12 and rank_from_env({}) is None
    for k in ("WHYWAIT_JOB", "SLURM_ARRAY_JOB_ID", "SLURM_ARRAY_TASK_ID", "RANK"):
        monkeypatch.delenv(k, raising=False)
    monkeypatch.setenv("SLURM_JOB_ID", "778")
    monkeypatch.setenv("SLURM_PROCID", "3")
    rep = Reporter(sock="/nonexistent/agent.sock")
    assert (rep.job, rep.rank) == ("slurm-778", 3)
    monkeypatch.delenv("SLURM_JOB_ID")
    with pytest.raises(ValueError, match="no job id: pass job=..., or set WHYWAIT_JOB"):
        Reporter(rank=0)
    monkeypatch.delenv("SLURM_PROCID")
    with pytest.raises(ValueError, match="no rank"):
        Reporter("j")


def test_a_job_id_the_agent_would_refuse_is_said_when_the_reporter_is_made() -> None:
    # Reporter(job='x' * 300) sent every step, the agent refused each, and Reporter.dropped stayed 0.
    from whywait.agents import events, training

    assert training.JOB_MAX == events.STRING_MAX
    assert training._NOT_IN_NAMES.pattern == events.NOT_IN_NAMES.pattern
    for bad in ("x" * 300, "job\n7", ""):
        with pytest.raises(ValueError, match="would be refused by the agent"):
            Reporter(bad, 0, sock="/nonexistent/agent.sock")
    assert Reporter("x" * 256, 0, sock="/nonexistent/agent.sock").job == "x" * 256
