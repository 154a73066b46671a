"""whywait.engine.localkafka without a broker: properties, cluster ids, the state file, fetch and start errors."""

from __future__ import annotations

import os
import socket
import stat
import subprocess
import uuid
from pathlib import Path

import pytest
from whywait.engine.cli import main
from whywait.engine.errors import BrokerUnavailable, ConfigError
from whywait.engine.localkafka import broker as lb


@pytest.fixture
def cache(tmp_path, monkeypatch):
    """An empty cache folder, and no WHYWAIT_KAFKA_BOOTSTRAP."""
    monkeypatch.delenv(lb.BOOTSTRAP_ENV, raising=False)
    monkeypatch.setenv(lb.CACHE_ENV, str(tmp_path / "cache"))
    return tmp_path / "cache"


def _parse(text: str) -> dict[str, str]:
    return dict(line.split("=", 1) for line in text.splitlines() if line and not line.startswith("#"))


def test_server_properties_single_node_kraft(tmp_path):
    props = _parse(lb.render_properties(lb.server_properties(19092, 19093, tmp_path / "data")))
    assert props["process.roles"] == "broker,controller"
    assert props["node.id"] == "1"
    assert props["controller.quorum.voters"] == "1@127.0.0.1:19093"
    assert props["listeners"] == "PLAINTEXT://127.0.0.1:19092,CONTROLLER://127.0.0.1:19093"
    assert props["advertised.listeners"] == "PLAINTEXT://127.0.0.1:19092"
    assert props["controller.listener.names"] == "CONTROLLER"
    assert props["log.dirs"] == str(tmp_path / "data")
    assert props["auto.create.topics.enable"] == "true"
    assert props["group.initial.rebalance.delay.ms"] == "0"
    assert props["num.partitions"] == "1"
    for key in ("offsets.topic.replication.factor", "transaction.state.log.replication.factor",
                "transaction.state.log.min.isr", "share.coordinator.state.topic.replication.factor",
                "default.replication.factor"):
        assert props[key] == "1", key


def test_cluster_id_is_kafka_shaped_and_never_an_option(monkeypatch):
    cid = lb.new_cluster_id()
    assert len(cid) == 22 and set(cid) <= set("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_")
    # 0xf8 encodes to a leading '-': the first such uuid is skipped.
    ids = iter([uuid.UUID(bytes=b"\xf8" + b"\0" * 15), uuid.UUID(bytes=b"\x01" * 16)])
    monkeypatch.setattr(lb.uuid, "uuid4", lambda: next(ids))
    assert lb.new_cluster_id() == "AQEBAQEBAQEBAQEBAQEBAQ"


def test_free_port_is_bindable():
    port = lb.free_port()
    with socket.socket() as s:
        s.bind(("127.0.0.1", port))


def test_state_file_round_trip(cache):
    assert lb.read_state() is None
    path = lb.write_state({"pid": 123, "port": 9092, "data_dir": "/x"})
    assert path == cache / "broker.json"
    assert lb.read_state() == {"pid": 123, "port": 9092, "data_dir": "/x"}
    lb.clear_state()
    lb.clear_state()  # idempotent
    assert lb.read_state() is None


def test_corrupt_state_file_is_ignored(cache):
    cache.mkdir(parents=True)
    (cache / "broker.json").write_text("{not json")
    assert lb.read_state() is None
    (cache / "broker.json").write_text('{"port": 1}')
    assert lb.read_state() is None


def test_stale_state_is_removed(cache):
    dead = subprocess.Popen(["true"])
    dead.wait()
    lb.write_state({"pid": dead.pid, "port": 9092})
    assert lb.running_state() is None
    assert not lb.state_file().exists()
    # A live process that is not a Kafka broker (pid reuse) is not taken for one.
    lb.write_state({"pid": os.getpid(), "port": 9092})
    assert lb.running_state() is None


def test_resolve_bootstrap_env_wins(cache, monkeypatch):
    monkeypatch.setenv(lb.BOOTSTRAP_ENV, "kafka:9092")
    assert lb.resolve_bootstrap() == "kafka:9092"
    assert lb.ensure_broker() == "kafka:9092"


def test_resolve_bootstrap_without_broker_is_one_line(cache):
    with pytest.raises(BrokerUnavailable) as err:
        lb.resolve_bootstrap()
    assert "\n" not in str(err.value)
    assert lb.BOOTSTRAP_ENV in str(err.value)


def test_probe_closed_port():
    assert lb.probe(f"127.0.0.1:{lb.free_port()}", timeout=0.5) is False


def test_fetch_without_mvn_is_a_config_error(cache, monkeypatch):
    monkeypatch.setattr(lb.shutil, "which", lambda name: None)
    with pytest.raises(ConfigError, match="mvn"):
        lb.fetch_jars()


def _fake_exe(folder: Path, name: str, script: str) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    exe = folder / name
    exe.write_text("#!/bin/sh\n" + script)
    exe.chmod(exe.stat().st_mode | stat.S_IEXEC)
    return exe


def test_fetch_failure_names_the_maven_error(cache, tmp_path, monkeypatch):
    _fake_exe(tmp_path / "bin", "mvn", 'echo "[ERROR] Could not resolve dependencies for project x"\nexit 1\n')
    monkeypatch.setenv("PATH", f"{tmp_path / 'bin'}:{os.environ['PATH']}")
    with pytest.raises(ConfigError, match="Could not resolve dependencies"):
        lb.fetch_jars(quiet=True)
    assert not lb.jars_fetched()


def test_fetch_runs_maven_once(cache, tmp_path, monkeypatch, capsys):
    calls = tmp_path / "calls"
    # A fake mvn that "copies" one jar into -DoutputDirectory=...
    _fake_exe(tmp_path / "bin", "mvn", f"""echo run >> {calls}
for a in "$@"; do case "$a" in -DoutputDirectory=*) d="${{a#-DoutputDirectory=}}";; esac; done
touch "$d/kafka_2.13-{lb.KAFKA_VERSION}.jar"
""")
    monkeypatch.setenv("PATH", f"{tmp_path / 'bin'}:{os.environ['PATH']}")
    libs = lb.fetch_jars()
    assert libs == cache / f"kafka-{lb.KAFKA_VERSION}" / "libs"
    assert (libs / f"kafka_2.13-{lb.KAFKA_VERSION}.jar").exists()
    assert "fetching Apache Kafka" in capsys.readouterr().err
    assert lb.fetch_jars() == libs
    assert calls.read_text().count("run") == 1
    # A changed pom invalidates the marker.
    (libs.parent / ".fetched").write_text("other-digest\n")
    assert not lb.jars_fetched()


def test_broker_that_exits_reports_its_log(cache, tmp_path, monkeypatch):
    libs = lb.libs_dir()
    libs.mkdir(parents=True)
    (libs.parent / ".fetched").write_text(lb._pom_digest())
    java = _fake_exe(tmp_path / "bin", "java", 'echo "Error: boom, port in use"\nexit 3\n')
    monkeypatch.setattr(lb, "_java", lambda: str(java))
    data = tmp_path / "broker"
    (data / "data").mkdir(parents=True)
    (data / "data" / "meta.properties").write_text("formatted\n")  # skip the format step
    broker = lb.LocalBroker()
    with pytest.raises(lb.BrokerStartError) as err:
        broker.start(data_dir=data, timeout=10)
    assert "status 3" in str(err.value) and "boom, port in use" in str(err.value)
    assert "\n" not in str(err.value)
    assert not broker.is_running()
    assert _parse((data / "server.properties").read_text())["listeners"].startswith("PLAINTEXT://127.0.0.1:")


def test_format_failure_is_one_line(cache, tmp_path, monkeypatch):
    libs = lb.libs_dir()
    libs.mkdir(parents=True)
    (libs.parent / ".fetched").write_text(lb._pom_digest())
    java = _fake_exe(tmp_path / "bin", "java", 'echo "bad config" >&2\nexit 1\n')
    monkeypatch.setattr(lb, "_java", lambda: str(java))
    with pytest.raises(lb.BrokerStartError, match="formatting the Kafka storage .* bad config"):
        lb.LocalBroker().start(data_dir=tmp_path / "broker")


def test_stop_without_start_is_a_no_op():
    assert lb.LocalBroker().stop() is False


def test_cli_status_without_broker(cache, capsys):
    assert main(["kafka", "status"]) == 1
    out = capsys.readouterr().out
    assert "not running" in out and "not fetched" in out


def test_cli_stop_without_broker(cache, capsys):
    assert main(["kafka", "stop"]) == 0
    assert "no local Kafka broker" in capsys.readouterr().out


def test_cli_fetch_error_is_one_line(cache, monkeypatch, capsys):
    monkeypatch.setattr(lb.shutil, "which", lambda name: None)
    assert main(["kafka", "fetch"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("whywait kafka: ") and "\n" not in err


def test_start_on_a_busy_port_is_refused(cache, tmp_path):
    libs = lb.libs_dir()
    libs.mkdir(parents=True)
    (libs.parent / ".fetched").write_text(lb._pom_digest())
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        with pytest.raises(lb.BrokerStartError, match=f"port {port} .* in use"):
            lb.LocalBroker().start(port=port, data_dir=tmp_path / "broker")


def test_probe_accepts_a_server_list_and_rejects_garbage():
    closed = f"127.0.0.1:{lb.free_port()}"
    assert lb.probe(f"{closed}, {closed}", timeout=0.5) is False
    assert lb.probe("not-a-bootstrap", timeout=0.5) is False
    assert lb.probe("", timeout=0.5) is False


def test_probe_talks_kafka_to_a_fake_broker():
    """A fake server answering ApiVersions, then Metadata with one broker: the probe's byte layout."""
    import struct
    import threading

    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen()
    port = server.getsockname()[1]
    seen = []

    def serve() -> None:
        conn, _ = server.accept()
        with conn:
            for body in (struct.pack(">h", 0) + b"\0" * 8, struct.pack(">ii", 0, 1) + b"\0" * 8):
                size = struct.unpack(">i", conn.recv(4))[0]
                req = conn.recv(size)
                api_key, version, corr = struct.unpack(">hhi", req[:8])
                seen.append((api_key, version))
                reply = struct.pack(">i", corr) + body
                conn.sendall(struct.pack(">i", len(reply)) + reply)

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    try:
        assert lb.probe(f"127.0.0.1:{lb.free_port()},127.0.0.1:{port}", timeout=2.0) is True
    finally:
        thread.join(5)
        server.close()
    assert seen == [(18, 0), (3, 4)]


def test_free_port_avoids_the_ephemeral_range():
    lo, _ = lb.ephemeral_range()
    ports = {lb.free_port() for _ in range(20)}
    assert all(not lb.in_ephemeral_range(p) for p in ports) or lo <= 10_000


def test_a_self_connected_socket_is_not_a_listener():
    port = lb.free_port()
    s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    try:
        s.bind(("127.0.0.1", port))
        s.connect(("127.0.0.1", port))  # TCP simultaneous open: the socket is connected to itself
        assert lb._self_connected(s)
    finally:
        s.close()


def test_last_ports_are_remembered_and_corrupt_files_ignored(cache):
    cache.mkdir(parents=True)
    assert lb.last_ports(cache) is None
    lb.last_ports_file(cache).write_text('{"port": 20001, "controller_port": 20002}')
    assert lb.last_ports(cache) == (20001, 20002)
    lb.last_ports_file(cache).write_text("{oops")
    assert lb.last_ports(cache) is None
