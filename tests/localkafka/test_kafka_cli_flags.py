"""Flags a user gives are applied or refused, never silently ignored: ``kafka start`` with a broker already
running, and a malformed ``--bootstrap`` / ``WHYWAIT_KAFKA_BOOTSTRAP``.

Before: ``whywait kafka start --port 19342`` with a broker on 19341 printed ``WHYWAIT_KAFKA_BOOTSTRAP=127.0.0.1:19341``
and exited 0; ``--bootstrap 'not a host:abc'`` was reported as "Kafka at not a host:abc is unreachable" (exit 3).
"""

from __future__ import annotations

from pathlib import Path

import pytest
from whywait.engine.cli import main
from whywait.engine.errors import ConfigError
from whywait.engine.localkafka import broker as lb


@pytest.fixture
def cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.delenv(lb.BOOTSTRAP_ENV, raising=False)
    monkeypatch.setenv(lb.CACHE_ENV, str(tmp_path / "cache"))
    return tmp_path / "cache"


@pytest.fixture
def running(cache: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> lb.LocalBroker:
    """A detached broker on 19341 as ``kafka start`` finds it (its state file, answering); none can be started."""
    b = lb.LocalBroker(cache, detached=True)
    b.pid, b.port, b.broker_dir = 4242, 19341, (tmp_path / "data").resolve()
    monkeypatch.setattr(lb.LocalBroker, "from_state", classmethod(lambda cls, cache_dir=None: b))
    monkeypatch.setattr(lb, "probe", lambda bootstrap, timeout=2.0: bootstrap == "127.0.0.1:19341")

    def no_start(*args: object) -> str:
        raise AssertionError("a second broker was started")

    monkeypatch.setattr(lb.LocalBroker, "_start", no_start)
    return b


def test_start_without_flags_uses_the_running_broker_and_says_so(running: lb.LocalBroker,
                                                                 capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["kafka", "start"]) == 0
    out, err = capsys.readouterr()
    assert out == "WHYWAIT_KAFKA_BOOTSTRAP=127.0.0.1:19341\n"  # what `eval "$(whywait kafka start)"` reads
    assert "already running (pid 4242" in err and "using it, not starting another" in err


def test_start_with_the_running_broker_s_own_port_and_folder_uses_it(running: lb.LocalBroker,
                                                                    capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["kafka", "start", "--port", "19341", "--data-dir", str(running.broker_dir)]) == 0
    assert capsys.readouterr().out == "WHYWAIT_KAFKA_BOOTSTRAP=127.0.0.1:19341\n"


@pytest.mark.parametrize("flags, named", [
    (["--port", "19342"], "--port 19342"),
    (["--data-dir", "{tmp}/elsewhere"], "--data-dir {tmp}/elsewhere"),
    (["--port", "19342", "--data-dir", "{tmp}/elsewhere"], "--port 19342 and --data-dir {tmp}/elsewhere"),
])
def test_start_asking_for_another_port_or_folder_is_refused(running: lb.LocalBroker, tmp_path: Path,
                                                            capsys: pytest.CaptureFixture[str], flags: list[str],
                                                            named: str) -> None:
    flags = [f.format(tmp=tmp_path) for f in flags]
    assert main(["kafka", "start", *flags]) == 2
    out, err = capsys.readouterr()
    assert out == ""  # nothing for eval to pick up: the broker asked for is not there
    assert err.count("\n") == 1, err
    assert named.format(tmp=tmp_path) in err and "already running, at 127.0.0.1:19341" in err
    assert "`whywait kafka stop`" in err


@pytest.mark.parametrize("value, wrong", [
    ("not a host:abc", "the host 'not a host' is not a host name or address (it has a space) and the port 'abc' "
                       "is not a number"),
    ("127.0.0.1", "'127.0.0.1' has no port"),
    ("kafka:", "the port is missing"),
    (":9092", "the host is missing"),
    ("kafka:0", "the port 0 is outside 1-65535"),
    ("kafka:65536", "the port 65536 is outside 1-65535"),
    ("kafka:+9092", "the port '+9092' is not a number"),
    ("kafka:9092,,kafka-2:9092", "entry 2 is empty"),
    ("kafka:9092,kafka-2", "entry 2 ('kafka-2') has no port"),
    ("::1:9092", "has a ':' (an IPv6 address goes in brackets: [::1]:9092)"),
    ("[::g]:9092", "the host '[::g]' is not an IPv6 address in brackets"),
    ("kafka_1/x:9092", "(it has '/')"),
    ("-kafka:9092", "(it has a '.' or '-' at an end)"),
    ("", "is empty"),
])
def test_a_malformed_bootstrap_says_which_part_is_wrong(value: str, wrong: str) -> None:
    with pytest.raises(ConfigError) as err:
        lb.check_bootstrap(value, "--bootstrap")
    msg = str(err.value)
    assert msg.startswith(f"--bootstrap {value!r}: ") and wrong in msg, msg
    assert "HOST:PORT[,HOST:PORT...]" in msg and "unreachable" not in msg and "\n" not in msg


@pytest.mark.parametrize("value, clean", [
    ("127.0.0.1:9092", "127.0.0.1:9092"),
    ("kafka-0.kafka.svc.cluster.local:9092, kafka-1:19092", "kafka-0.kafka.svc.cluster.local:9092,kafka-1:19092"),
    ("broker.example.:9092", "broker.example.:9092"),
    ("[::1]:9092", "[::1]:9092"),
    ("k_1:65535", "k_1:65535"),
])
def test_a_good_bootstrap_passes_with_its_spaces_trimmed(value: str, clean: str) -> None:
    assert lb.check_bootstrap(value) == clean


def test_resolve_bootstrap_checks_the_flag_then_the_variable_and_names_where_it_came_from(
        cache: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    assert lb.resolve_bootstrap(flag="kafka:9092") == "kafka:9092"
    with pytest.raises(ConfigError, match=r"^--bootstrap 'kafka:x': "):
        lb.resolve_bootstrap(flag="kafka:x")
    monkeypatch.setenv(lb.BOOTSTRAP_ENV, "kafka:x")
    with pytest.raises(ConfigError, match=rf"^{lb.BOOTSTRAP_ENV} 'kafka:x': .*the port 'x' is not a number"):
        lb.resolve_bootstrap()
    with pytest.raises(ConfigError, match=rf"^{lb.BOOTSTRAP_ENV} 'kafka:x'"):
        lb.ensure_broker()
    assert lb.resolve_bootstrap(flag="other:9092") == "other:9092"  # the flag wins over the variable


def _topology(tmp_path: Path) -> Path:
    from whywait.simulate.cluster import make_cluster
    from whywait.topology.model import Topology

    path = tmp_path / "topology.yaml"
    Topology.from_dict(make_cluster(nodes=2).to_dict()).to_yaml(path)
    return path


def test_the_engine_says_a_malformed_bootstrap_is_malformed_not_unreachable(
        cache: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    topo = str(_topology(tmp_path))
    assert main(["engine", "--topology", topo, "--bootstrap", "not a host:abc"]) == 2
    err = capsys.readouterr().err
    assert "--bootstrap 'not a host:abc'" in err and "the port 'abc' is not a number" in err, err
    assert "unreachable" not in err
    monkeypatch.setenv(lb.BOOTSTRAP_ENV, "kafka:99999")
    assert main(["engine", "--topology", topo]) == 2
    err = capsys.readouterr().err
    assert f"{lb.BOOTSTRAP_ENV} 'kafka:99999'" in err and "the port 99999 is outside 1-65535" in err, err
