from __future__ import annotations

import asyncio
import json
import logging
import os
import socket
import subprocess
import sys
from typing import Any

import pytest
from whywait.agents.agent import Agent, TrainingInbox, bind_training_socket
from whywait.agents.collectors import AgentConfigError, HostCollector, NetworkCollector, StorageCollector
from whywait.agents.events import validate
from whywait.agents.publisher import MemoryPublisher
from whywait.agents.training import DEFAULT_SOCKET, SOCKET_ENV, Reporter

T0 = 1_764_442_800.0


def step(job: str, rank: int, n: int, **kw: object) -> bytes:
    d = {"v": 1, "type": "step", "job": job, "rank": rank, "pid": 4242, "time": T0, "step": n, "duration_s": 1.0,
         "data_wait_s": 0.5, "compute_s": 0.4, "comm_s": 0.1, "checkpoint_s": 0.0, **kw}
    return json.dumps(d).encode()


def test_inbox_batches_steps_per_job_and_counts_malformed() -> None:
    inbox = TrainingInbox("node-01")
    for n in range(3):
        inbox.feed(step("job-a", 0, n))
    inbox.feed(step("job-b", 5, 9, node="node-01"))
    for bad in (b"not json", b"[1]", step("job-a", 0, -1), step("", 0, 1), step("job-a", 0, 1, compute_s="x"),
                json.dumps({"type": "hello", "job": "j", "rank": 0}).encode()):
        inbox.feed(bad)
    msgs = inbox.take_steps(T0 + 1)
    assert [m["job"] for m in msgs] == ["job-a", "job-b"] and len(msgs[0]["steps"]) == 3
    for m in msgs:
        validate(m, "whywait.steps.v1")
    assert msgs[1]["steps"][0]["node"] == "node-01" and msgs[0]["steps"][0]["ended_at"] == T0
    assert inbox.malformed == 6 and inbox.received == 10 and inbox.pids == {4242}
    assert inbox.take_steps(T0 + 2) == []


def test_inbox_checkpoint_messages_keep_event_time() -> None:
    inbox = TrainingInbox("node-01")
    inbox.feed(json.dumps({"type": "checkpoint", "job": "j", "rank": 1, "time": T0, "checkpoint_id": "c1",
                           "phase": "end", "bytes": 10, "duration_s": 2.5, "path": "/ckpt"}).encode())
    (msg,) = inbox.take_checkpoints()
    validate(msg, "whywait.checkpoints.v1")
    assert msg["time"] == T0 and msg["bytes"] == 10 and msg["path"] == "/ckpt"


def test_bind_replaces_a_stale_socket_but_not_a_live_one(tmp_path: "os.PathLike[str]") -> None:
    path = os.path.join(str(tmp_path), "run", "agent.sock")
    first = bind_training_socket(path)
    with pytest.raises(AgentConfigError, match="already listening"):
        bind_training_socket(path)
    first.close()  # the agent died; its socket file stays
    assert os.path.exists(path)
    bind_training_socket(path).close()


def live_collectors() -> list:
    return [NetworkCollector("/", include_virtual=True), StorageCollector("/"), HostCollector("/")]


async def test_agent_rounds_publish_every_kind_and_the_training_steps(tmp_path: "os.PathLike[str]") -> None:
    sock = os.path.join(str(tmp_path), "agent.sock")
    pub = MemoryPublisher()
    agent = Agent("node-01", live_collectors(), pub, interval=0.3, socket_path=sock)
    rep = Reporter("job-7", rank=2, sock=sock)

    async def train() -> None:
        # The agent binds its socket once its publisher has started: on a loaded machine that can take
        # longer than any fixed pause, and datagrams sent before it are dropped (by design, not a failure).
        for _ in range(500):
            if os.path.exists(sock):
                break
            await asyncio.sleep(0.01)
        for n in range(5):
            with rep.step(n):
                with rep.compute():
                    pass
            await asyncio.sleep(0.05)
        rep.checkpoint_end(1 << 30, "/ckpt/5", checkpoint_id=rep.checkpoint_start("/ckpt/5"))

    await asyncio.gather(agent.run(rounds=3), train())
    assert pub.invalid == 0 and rep.dropped == 0
    kinds = [m["kind"] for _, _, m in pub.messages]
    assert kinds.count("host") == 3 and kinds.count("net") == 3 and kinds.count("storage") == 3
    assert kinds.count("agent_health") == 3
    steps = [s for m in pub.of_kind("steps") for s in m["steps"]]
    assert [s["step"] for s in steps] == [0, 1, 2, 3, 4] and all(s["rank"] == 2 for s in steps)
    assert [m["phase"] for m in pub.of_kind("checkpoint")] == ["start", "end"]
    assert all(k == "job-7" for t, k, _ in pub.messages if t in ("whywait.steps.v1", "whywait.checkpoints.v1"))
    health = pub.of_kind("agent_health")[-1]
    assert health["samples"] == 9 and health["collector_errors"] == 0 and health["training_datagrams"] == 7
    host = pub.of_kind("host")[-1]
    assert host["loader_pids"] == [os.getpid()]  # the reporter's PID reached the host collector
    assert not os.path.exists(sock)


def run_cli(*args: str, env: dict | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "whywait.agents.cli", *args], capture_output=True, text=True,
                          timeout=60,
                          env={**os.environ, **(env or {})})


def test_once_print_is_one_round_of_valid_json_without_kafka() -> None:
    code = ("import sys; from whywait.agents.cli import main; rc = main(['--once', '--print', '--interval', '0.2', "
            "'--node', 'n1']); assert 'aiokafka' not in sys.modules, 'imported aiokafka'; sys.exit(rc)")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60,
                          env={**os.environ, "WHYWAIT_KAFKA_BOOTSTRAP": ""})
    assert proc.returncode == 0, proc.stderr
    # JSON lines, as --print writes every round: the topic and key beside the message
    lines = [json.loads(line) for line in proc.stdout.splitlines()]
    msgs = [{k: v for k, v in m.items() if k not in ("topic", "key")} for m in lines]
    for line, m in zip(lines, msgs, strict=True):
        validate(m, line["topic"])
        assert line["key"] == "n1"
    assert {m["kind"] for m in msgs} >= {"net", "storage", "host", "agent_health"}
    assert all(m["node"] == "n1" for m in msgs)


def test_once_print_and_print_write_one_format_that_the_readers_take(tmp_path) -> None:
    """What `--once --print` saves, `events check` and `topology import agent` read (they took no lines of
    its former JSON array), and `--print --rounds N` writes the same lines."""
    from whywait.engine.cli import main

    once = run_cli("--once", "--print", "--interval", "0.2", "--node", "n1", "--collectors", "network,host")
    rounds = run_cli("--print", "--rounds", "1", "--interval", "0.2", "--node", "n1", "--collectors", "network,host",
                     "--socket", "none")
    assert once.returncode == 0 and rounds.returncode == 0, once.stderr + rounds.stderr
    shape = [sorted(json.loads(line)) for line in once.stdout.splitlines()]
    assert shape and shape == [sorted(json.loads(line)) for line in rounds.stdout.splitlines()][-len(shape):]
    saved = tmp_path / "seen.jsonl"
    saved.write_text(once.stdout)
    assert main(["events", "check", str(saved)]) == 0
    assert main(["topology", "import", "agent", str(saved), "-o", str(tmp_path / "c.yaml")]) == 0
    assert "id: n1" in (tmp_path / "c.yaml").read_text()


def test_cli_without_kafka_says_so_in_one_line() -> None:
    proc = run_cli("--rounds", "1", env={"WHYWAIT_KAFKA_BOOTSTRAP": ""})
    assert proc.returncode == 2
    assert proc.stderr.strip().splitlines()[-1].startswith("whywait agent: no Kafka to publish to: pass --bootstrap")


def test_cli_unknown_collector_lists_the_valid_ones() -> None:
    proc = run_cli("--once", "--print", "--collectors", "host,gpus")
    assert proc.returncode == 2
    assert "unknown collector 'gpus' (valid: gpu, dcgm, network, storage, host, hw)" in proc.stderr


def test_cli_dcgm_needs_a_url() -> None:
    proc = run_cli("--once", "--print", "--collectors", "dcgm")
    assert proc.returncode == 2 and "needs --dcgm-url" in proc.stderr


def test_cli_refuses_two_collectors_of_the_same_gpus_and_runs_a_repeated_one_once() -> None:
    proc = run_cli("--once", "--print", "--collectors", "gpu,dcgm", "--dcgm-url", "http://127.0.0.1:9/metrics")
    assert proc.returncode == 2 and "names both gpu and dcgm, which report the same GPUs" in proc.stderr
    assert len(proc.stderr.strip().splitlines()) == 1
    proc = run_cli("--once", "--print", "--node", "n1", "--collectors", "host,host")
    assert proc.returncode == 0, proc.stderr
    assert [json.loads(line)["kind"] for line in proc.stdout.splitlines() if line.strip()].count("host") == 1


def test_cli_registers_into_a_parent_parser() -> None:
    import argparse

    from whywait.agents import cli

    parser = argparse.ArgumentParser()
    cli.register(parser)
    args = parser.parse_args(["--node", "x", "--interval", "2", "--bootstrap", "k:9092", "--spool-dir", "/tmp/s",
                              "--once", "--print", "--collectors", "gpu,network", "--dcgm-url", "http://h/metrics"])
    assert (args.node, args.interval, args.bootstrap, args.once, args.print_) == ("x", 2.0, "k:9092", True, True)


def test_agents_package_stays_small() -> None:
    """The node agent imports only the stdlib, aiokafka and pynvml: never the engine, faust or slack_sdk."""
    code = ("import sys, whywait.agents.agent, whywait.agents.cli, whywait.agents.publisher, whywait.agents.training, "
            "whywait.agents.collectors, whywait.agents.integrations, whywait.agents.rates\n"
            "bad = sorted({m.removeprefix('whywait.').split('.')[0] for m in sys.modules} & "
            "{'engine', 'faust', 'slack_sdk', 'topology', "
            "'jinja2', 'networkx', 'yaml', 'mode'})\nprint(bad)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"


def test_socket_probe_does_not_steal_a_running_agents_socket(tmp_path: "os.PathLike[str]") -> None:
    path = os.path.join(str(tmp_path), "agent.sock")
    live = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    live.bind(path)
    try:
        proc = run_cli("--rounds", "1", "--print", "--interval", "0.1", "--socket", path)
        assert proc.returncode == 2 and "already listening" in proc.stderr
    finally:
        live.close()


@pytest.mark.parametrize("argv, opened", [
    ([], DEFAULT_SOCKET), (["--print"], None), (["--once"], None), (["--socket", "none"], None),
    (["--print", "--socket", "/tmp/a.sock"], "/tmp/a.sock"),
])
def test_only_a_publishing_agent_opens_the_default_socket(monkeypatch: pytest.MonkeyPatch, argv: list[str],
                                                          opened: str | None) -> None:
    """`agent --print` listened on /run/whywait/agent.sock, taking it from a running agent."""
    import argparse

    from whywait.agents import cli

    monkeypatch.delenv(SOCKET_ENV, raising=False)
    parser = argparse.ArgumentParser()
    cli.register(parser)
    assert cli._socket_path(parser.parse_args(argv)) == opened


@pytest.mark.parametrize("flags, says", [
    (["--spool-max-mb", "nan"], "--spool-max-mb must be a positive number"),
    (["--spool-max-mb", "inf"], "--spool-max-mb must be a positive number"),
    (["--spool-max-mb", "-5"], "--spool-max-mb must be a positive number"),
    (["--rounds", "0"], "--rounds must be 1 or more (got 0)"),
    (["--rounds", "-3"], "--rounds must be 1 or more (got -3)"),
    (["--interval", "1e-9"], "--interval must be at least 0.05 seconds"),
    (["--dcgm-url", "notaurl", "--collectors", "dcgm"], "--dcgm-url must be a dcgm-exporter URL"),
])
def test_cli_refuses_numbers_and_urls_that_cannot_work_in_one_line(tmp_path: Any, flags: list[str],
                                                                   says: str) -> None:
    # nan/inf were an internal error (exit 70), -5 a silent 4 KiB spool, --rounds 0 a run that did nothing,
    # --interval 1e-9 a busy loop, a malformed --dcgm-url an INFO line every round.
    proc = run_cli("--bootstrap", "127.0.0.1:9", "--spool-dir", str(tmp_path / "spool"), "--socket", "none",
                   *flags)
    assert proc.returncode == 2, proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("whywait agent: ") and says in lines[0], proc.stderr


def test_cli_an_unwritable_spool_folder_is_said_at_start_naming_the_flag(tmp_path: Any) -> None:
    spool = tmp_path / "file"
    spool.write_text("not a folder")
    proc = run_cli("--bootstrap", "127.0.0.1:9", "--spool-dir", str(spool), "--socket", "none", "--once")
    assert proc.returncode == 2
    line = proc.stderr.strip().splitlines()[-1]
    assert line.startswith(f"whywait agent: cannot write the spool folder {spool}") and "--spool-dir" in line


def test_cli_an_explicit_socket_that_cannot_be_bound_is_a_start_up_error(tmp_path: Any) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("")
    sock = blocker / "agent.sock"  # its folder is a file: never bindable, root or not
    proc = run_cli("--print", "--rounds", "1", "--collectors", "host", "--socket", str(sock))
    assert proc.returncode == 2, proc.stderr
    line = proc.stderr.strip().splitlines()[-1]
    assert line.startswith(f"whywait agent: --socket: cannot bind {sock}")


async def test_a_default_socket_that_cannot_be_bound_shows_in_health_and_metrics(tmp_path: Any) -> None:
    from prometheus_client import generate_latest
    from whywait.agents.observe import agent_registry

    blocker = tmp_path / "file"
    blocker.write_text("")
    pub = MemoryPublisher()
    agent = Agent("n1", [HostCollector("/")], pub, interval=0.05, socket_path=str(blocker / "agent.sock"))
    await agent.run(rounds=1)
    health = pub.of_kind("agent_health")[-1]
    assert "cannot bind" in health["sources_off"]["training.socket"]
    text = generate_latest(agent_registry(agent)).decode()
    assert "whywait_agent_training_socket_up 0.0" in text


async def test_training_datagram_counts_are_on_metrics_and_refusals_logged_once_per_job_and_reason(
        tmp_path: Any, caplog: pytest.LogCaptureFixture) -> None:
    from prometheus_client import generate_latest
    from whywait.agents.observe import agent_registry

    agent = Agent("n1", [HostCollector("/")], MemoryPublisher(), interval=0.05)
    inbox = agent.inbox
    bad_job = json.dumps({"type": "step", "job": "x" * 300, "rank": 1, "step": 1, "duration_s": 1.0}).encode()
    bad_rank = json.dumps({"type": "step", "job": "j1", "rank": -1, "step": 1, "duration_s": 1.0}).encode()
    with caplog.at_level(logging.WARNING, logger="whywait.agent"):
        for _ in range(5):
            inbox.feed(bad_job)
            inbox.feed(bad_rank)
            inbox.feed(b"not json")
        inbox.feed(json.dumps({"type": "step", "job": "j2", "rank": 0, "step": 1, "duration_s": 1.0}).encode(),
                   uid=1234, pid=1)
        for _ in range(3):
            inbox.feed(json.dumps({"type": "step", "job": "j2", "rank": 1, "step": 1, "duration_s": 1.0}).encode(),
                       uid=4321, pid=2)
    said = [r.getMessage() for r in caplog.records]
    assert len(said) == 4, said  # one per job and reason
    assert any("job name the contract refuses" in s for s in said) and any("rank" in s for s in said)
    assert any("not JSON" in s for s in said) and any("uid 4321" in s and "'j2'" in s for s in said)
    text = generate_latest(agent_registry(agent)).decode()
    assert 'whywait_agent_training_datagrams_total{outcome="malformed"} 15.0' in text
    assert 'whywait_agent_training_datagrams_total{outcome="rejected"} 3.0' in text
    assert 'whywait_agent_training_datagrams_total{outcome="received"} 19.0' in text


def test_ctrl_c_exits_130_and_sigterm_0(tmp_path: Any) -> None:
    # The README's exit codes say 130 for Ctrl-C; the agent exited 0 for both. SIGTERM (systemd, Kubernetes)
    # stays a clean stop.
    import signal as sig

    for s, want in ((sig.SIGINT, 130), (sig.SIGTERM, 0)):
        p = subprocess.Popen([sys.executable, "-m", "whywait", "agent", "--print", "--collectors", "host",
                              "--socket", "none", "--state-dir", str(tmp_path)],
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        assert p.stdout is not None
        p.stdout.readline()  # it runs
        p.send_signal(s)
        _, err = p.communicate(timeout=30)
        assert p.returncode == want, (s, p.returncode, err)
