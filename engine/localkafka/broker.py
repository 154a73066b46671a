"""A real Apache Kafka broker on 127.0.0.1, run from the jars on Maven Central.

No Docker, no tarball: :func:`fetch_jars` has Maven copy ``kafka_2.13`` and its
runtime dependencies (``pom.xml`` next to this file) into a cache folder once;
:class:`LocalBroker` writes a single-node KRaft ``server.properties`` (one process
is both broker and controller), formats the storage with Kafka's ``StorageTool``
and runs ``java kafka.Kafka``.  Readiness is checked with the Kafka protocol itself
(ApiVersions, then a Metadata request that must list the broker), not a log grep.

A *detached* broker (``whywait kafka start``, :func:`ensure_broker`) records itself
in ``<cache>/broker.json`` so that other processes can find it
(:func:`resolve_bootstrap`), report on it and stop it.  A non-detached broker (the
pytest fixture) writes no state and dies with the process that started it.

The cache folder is ``$WHYWAIT_CACHE`` or ``~/.cache/whywait``.  Pure stdlib.
"""

from __future__ import annotations

import base64
import contextlib
import hashlib
import json
import os
import shutil
import signal
import socket
import struct
import subprocess
import sys
import time
import uuid
from pathlib import Path
from typing import Any, Iterator

from whywait.engine.errors import BrokerUnavailable, ConfigError, EngineError

from whywait.bootstrap import BootstrapError
from whywait.bootstrap import check_bootstrap as _check_bootstrap
from whywait.errors import EXIT_UNAVAILABLE

KAFKA_VERSION = "4.1.1"
BOOTSTRAP_ENV = "WHYWAIT_KAFKA_BOOTSTRAP"
CACHE_ENV = "WHYWAIT_CACHE"
HOST = "127.0.0.1"

_HERE = Path(__file__).resolve().parent
POM = _HERE / "pom.xml"
LOG4J2_CONFIG = _HERE / "log4j2.properties"
_MARKER = ".fetched"

# Measured on 2 cores (JDK 17): SerialGC + C1-only compilation start the broker
# faster than the default G1 + C2 and keep its RSS lower; a 1-node dev broker needs neither.
JVM_FLAGS = (
    "-Xmx512m",
    "-Xms64m",
    "-XX:+UseSerialGC",
    "-XX:TieredStopAtLevel=1",
    "-Xss512k",
    "-Djava.awt.headless=true",
)


class BrokerAlreadyRunning(ConfigError):
    """``whywait kafka start`` asked for a port or data folder the running local broker does not have (exit 2)."""


class BrokerStartError(EngineError):
    """The local broker could not be formatted or did not come up; the message holds its log's tail."""

    exit_code = EXIT_UNAVAILABLE


# --------------------------------------------------------------------------- cache + jars


def default_cache_dir() -> Path:
    """``$WHYWAIT_CACHE`` or ``~/.cache/whywait``."""
    env = os.environ.get(CACHE_ENV)
    return Path(env).expanduser() if env else Path.home() / ".cache" / "whywait"


def _cache(cache_dir: Path | str | None) -> Path:
    return Path(cache_dir).expanduser() if cache_dir is not None else default_cache_dir()


def libs_dir(cache_dir: Path | str | None = None) -> Path:
    """Where the Kafka jars live: ``<cache>/kafka-<version>/libs``."""
    return _cache(cache_dir) / f"kafka-{KAFKA_VERSION}" / "libs"


def _pom_digest() -> str:
    return hashlib.sha256(POM.read_bytes()).hexdigest()


def jars_fetched(cache_dir: Path | str | None = None) -> bool:
    """True when a previous :func:`fetch_jars` completed with the current ``pom.xml``."""
    marker = libs_dir(cache_dir).parent / _MARKER
    try:
        return marker.read_text().strip() == _pom_digest()
    except OSError:
        return False


def fetch_jars(cache_dir: Path | str | None = None, *, quiet: bool = False) -> Path:
    """Copy Kafka and its runtime dependencies from Maven Central into the cache; return the libs folder.

    Runs ``mvn dependency:copy-dependencies`` once; a marker file holding the pom's
    digest makes later calls free (and a changed pom refetches into a clean folder).
    Raises :class:`ConfigError` when ``mvn`` is missing or fails.
    """
    libs = libs_dir(cache_dir)
    if jars_fetched(cache_dir):
        return libs
    mvn = shutil.which("mvn")
    if mvn is None:
        raise ConfigError("`mvn` (Apache Maven) is not on PATH: install it to fetch the Kafka jars, "
                          f"or set {BOOTSTRAP_ENV} to an existing broker")
    if not quiet:
        print(f"whywait: fetching Apache Kafka {KAFKA_VERSION} jars from Maven Central into {libs} "
              "(once, ~10 s)...", file=sys.stderr, flush=True)
    if libs.exists():
        shutil.rmtree(libs)
    libs.mkdir(parents=True)
    cmd = [mvn, "-q", "-B", "-f", str(POM), "dependency:copy-dependencies",
           f"-DoutputDirectory={libs}", "-DincludeScope=runtime"]
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
    except subprocess.TimeoutExpired:
        raise ConfigError("`mvn dependency:copy-dependencies` for the Kafka jars took over 10 minutes") from None
    if proc.returncode != 0 or not any(libs.glob("kafka_2.13-*.jar")):
        lines = [ln.strip() for ln in (proc.stdout + proc.stderr).splitlines() if ln.strip()]
        detail = next((ln for ln in lines if "ERROR" in ln), lines[-1] if lines else f"exit {proc.returncode}")
        raise ConfigError(f"fetching the Kafka jars with Maven failed: {detail[:300]}")
    (libs.parent / _MARKER).write_text(_pom_digest() + "\n")
    return libs


def _java() -> str:
    java_home = os.environ.get("JAVA_HOME")
    if java_home and (Path(java_home) / "bin" / "java").exists():
        return str(Path(java_home) / "bin" / "java")
    java = shutil.which("java")
    if java is None:
        raise ConfigError("`java` (17 or newer) is not on PATH: install a JDK to run the local Kafka broker, "
                          f"or set {BOOTSTRAP_ENV} to an existing broker")
    return java


# --------------------------------------------------------------------------- ports, properties


def ephemeral_range() -> tuple[int, int]:
    """The kernel's range for outgoing connections' source ports (Linux: ``ip_local_port_range``)."""
    try:
        lo, hi = (int(x) for x in Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[:2])
        return lo, hi
    except (OSError, ValueError):
        return 32768, 60999  # Linux's default


def in_ephemeral_range(port: int) -> bool:
    """Whether a client's source port may equal ``port``: a client connecting to a *stopped* server on
    such a port can connect to itself (TCP simultaneous open) and take its own request for an answer."""
    lo, hi = ephemeral_range()
    return lo <= port <= hi


def _bindable(host: str, port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        try:
            s.bind((host, port))
        except OSError:
            return False
    return not _listening(host, port)


def free_port(host: str = HOST) -> int:
    """A TCP port on ``host`` that nothing uses right now, below the ephemeral range when one is free there.

    Outside the ephemeral range no client socket can ever be given the same port as its source,
    so a client retrying while the broker is down can never connect to itself.
    """
    import random

    lo, _ = ephemeral_range()
    if lo > 10_000:
        rng = random.Random()
        for _ in range(200):
            port = rng.randint(10_000, lo - 1)
            if _bindable(host, port):
                return port
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        return int(s.getsockname()[1])


def _self_connected(sock: socket.socket) -> bool:
    try:
        return bool(sock.getsockname() == sock.getpeername())
    except OSError:
        return False


def new_cluster_id() -> str:
    """A Kafka cluster id: a random UUID, base64url without padding (what ``kafka-storage random-uuid`` prints).

    Like Kafka's ``Uuid.randomUuid()`` it never starts with ``-``, which the storage
    tool's argument parser would take for an option.
    """
    while True:
        cid = base64.urlsafe_b64encode(uuid.uuid4().bytes).rstrip(b"=").decode()
        if not cid.startswith("-"):
            return cid


def server_properties(port: int, controller_port: int, log_dir: Path | str, node_id: int = 1) -> dict[str, str]:
    """The broker+controller configuration of a single-node KRaft cluster on 127.0.0.1."""
    return {
        "process.roles": "broker,controller",
        "node.id": str(node_id),
        "controller.quorum.voters": f"{node_id}@{HOST}:{controller_port}",
        "listeners": f"PLAINTEXT://{HOST}:{port},CONTROLLER://{HOST}:{controller_port}",
        "advertised.listeners": f"PLAINTEXT://{HOST}:{port}",
        "controller.listener.names": "CONTROLLER",
        "inter.broker.listener.name": "PLAINTEXT",
        "listener.security.protocol.map": "PLAINTEXT:PLAINTEXT,CONTROLLER:PLAINTEXT",
        "log.dirs": str(log_dir),
        "num.partitions": "1",
        "default.replication.factor": "1",
        "min.insync.replicas": "1",
        "auto.create.topics.enable": "true",
        "delete.topic.enable": "true",
        "offsets.topic.replication.factor": "1",
        "offsets.topic.num.partitions": "1",
        "transaction.state.log.replication.factor": "1",
        "transaction.state.log.min.isr": "1",
        "transaction.state.log.num.partitions": "1",
        "share.coordinator.state.topic.replication.factor": "1",
        "share.coordinator.state.topic.min.isr": "1",
        "group.initial.rebalance.delay.ms": "0",
        # A dev broker: small segments and indexes, no fsync pressure, prompt compaction.
        "log.segment.bytes": str(16 * 1024 * 1024),
        "log.index.size.max.bytes": str(1024 * 1024),
        "log.cleaner.dedupe.buffer.size": str(4 * 1024 * 1024),
        "num.network.threads": "2",
        "num.io.threads": "2",
        "num.recovery.threads.per.data.dir": "1",
    }


def render_properties(props: dict[str, str]) -> str:
    """``key=value`` lines, in order, with a header comment."""
    lines = ["# written by whywait (engine/localkafka/broker.py); single-node KRaft broker+controller"]
    lines += [f"{k}={v}" for k, v in props.items()]
    return "\n".join(lines) + "\n"


# --------------------------------------------------------------------------- Kafka protocol probe


def _request(sock: socket.socket, api_key: int, version: int, correlation_id: int, body: bytes) -> bytes:
    client_id = b"whywait-probe"
    header = struct.pack(">hhih", api_key, version, correlation_id, len(client_id)) + client_id
    payload = header + body
    sock.sendall(struct.pack(">i", len(payload)) + payload)
    size = struct.unpack(">i", _recv_exact(sock, 4))[0]
    data = _recv_exact(sock, size)
    if struct.unpack(">i", data[:4])[0] != correlation_id:
        raise OSError("Kafka answered with a mismatched correlation id")
    return data[4:]


def _recv_exact(sock: socket.socket, n: int) -> bytes:
    buf = bytearray()
    while len(buf) < n:
        chunk = sock.recv(n - len(buf))
        if not chunk:
            raise OSError("connection closed by the broker")
        buf += chunk
    return bytes(buf)


def probe(bootstrap: str, timeout: float = 2.0) -> bool:
    """True when a server of ``bootstrap`` speaks Kafka and its metadata lists at least one broker.

    ``bootstrap`` is ``host:port`` or a comma-separated list of them (the first that
    answers counts).  Sends ApiVersions v0 (answered by every Kafka version) and
    Metadata v4 for no topics; the broker only lists itself once it has registered
    with the controller, i.e. once topics can be created.
    """
    return probe_error(bootstrap, timeout) is None


def probe_error(bootstrap: str, timeout: float = 2.0) -> str | None:
    """None when :func:`probe` would be true, else why not, in a few words (the first server's reason).

    Asked every few seconds by the running engine (``engine.stream.app.BrokerWatch``), which says it in its
    warning that the broker is unreachable.
    """
    first: str | None = None
    for server in (s.strip() for s in bootstrap.split(",")):
        if not server:
            continue
        why = _probe_one(server, timeout)
        if why is None:  # the first that answers counts
            return None
        first = first or why
    return first or "no server named"


def _probe_one(server: str, timeout: float) -> str | None:
    host, _, port = server.rpartition(":")
    host = host.strip("[]") or HOST
    try:
        with socket.create_connection((host, int(port)), timeout=timeout) as sock:
            if _self_connected(sock):  # nothing listens: the kernel joined our socket to itself
                return "connection refused"
            sock.settimeout(timeout)
            body = _request(sock, 18, 0, 1, b"")  # ApiVersions v0
            if struct.unpack(">h", body[:2])[0] != 0:
                return "it refused the ApiVersions request"
            # Metadata v4: topics = [] (none), allow_auto_topic_creation = false
            body = _request(sock, 3, 4, 2, struct.pack(">ib", 0, 0))
            # throttle_time_ms int32, then the brokers array's length
            if struct.unpack(">i", body[4:8])[0] > 0:
                return None
            return "it lists no broker yet (starting, or its controller is gone)"
    except ConnectionRefusedError:
        return "connection refused"
    except socket.gaierror:
        return f"host {host!r} not found"
    except (socket.timeout, TimeoutError):
        return f"no answer within {timeout:g}s"
    except (OSError, ValueError, struct.error) as exc:
        return (getattr(exc, "strerror", None) or str(exc) or type(exc).__name__)[:120]


# --------------------------------------------------------------------------- bootstrap strings

def check_bootstrap(value: str, source: str = "--bootstrap") -> str:
    """``value`` checked as Kafka bootstrap servers (:func:`whywait.bootstrap.check_bootstrap`), as a
    :class:`ConfigError` (exit 2) naming ``source`` and the part that is wrong, never a broker "unreachable" later."""
    try:
        return _check_bootstrap(value, source)
    except BootstrapError as exc:
        raise ConfigError(str(exc)) from None


# --------------------------------------------------------------------------- processes + state


def _pid_is_broker(pid: int) -> bool:
    """True when ``pid`` is alive (not a zombie) and, where /proc can tell, runs ``kafka.Kafka``."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    proc = Path(f"/proc/{pid}")
    if not proc.exists():
        return True  # no procfs: trust the signal check
    try:
        if ") Z" in (proc / "stat").read_text():
            return False
        return b"kafka.Kafka" in (proc / "cmdline").read_bytes()
    except OSError:
        return False


def state_file(cache_dir: Path | str | None = None) -> Path:
    """``<cache>/broker.json``: the detached broker's pid, port and folders."""
    return _cache(cache_dir) / "broker.json"


def read_state(cache_dir: Path | str | None = None) -> dict[str, Any] | None:
    """The recorded detached broker, or None when there is no (readable) state file."""
    try:
        state = json.loads(state_file(cache_dir).read_text())
    except (OSError, ValueError):
        return None
    if not isinstance(state, dict) or not {"pid", "port"} <= state.keys():
        return None
    return state


def write_state(state: dict[str, Any], cache_dir: Path | str | None = None) -> Path:
    """Write the state file atomically."""
    path = state_file(cache_dir)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".json.tmp")
    tmp.write_text(json.dumps(state, indent=2) + "\n")
    tmp.replace(path)
    return path


def clear_state(cache_dir: Path | str | None = None) -> None:
    """Remove the state file (if any)."""
    with contextlib.suppress(FileNotFoundError):
        state_file(cache_dir).unlink()


def running_state(cache_dir: Path | str | None = None) -> dict[str, Any] | None:
    """The state of the detached broker if its process is alive, else None (a stale file is removed)."""
    state = read_state(cache_dir)
    if state is None:
        return None
    if not _pid_is_broker(int(state["pid"])):
        clear_state(cache_dir)
        return None
    return state


@contextlib.contextmanager
def _locked(cache_dir: Path | str | None) -> Iterator[None]:
    """Serialise detached starts/stops across processes (``<cache>/broker.lock``)."""
    import fcntl

    path = _cache(cache_dir) / "broker.lock"
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "w") as fh:
        fcntl.flock(fh, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(fh, fcntl.LOCK_UN)


def _listening(host: str, port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.settimeout(0.5)
        return s.connect_ex((host, port)) == 0 and not _self_connected(s)


def last_ports_file(cache_dir: Path | str | None = None) -> Path:
    """``<cache>/broker-ports.json``: the ports the last detached broker used (kept after it stops)."""
    return _cache(cache_dir) / "broker-ports.json"


def last_ports(cache_dir: Path | str | None = None) -> tuple[int, int] | None:
    """The client and controller ports of the last detached broker, or None."""
    try:
        d = json.loads(last_ports_file(cache_dir).read_text())
        return int(d["port"]), int(d["controller_port"])
    except (OSError, ValueError, KeyError, TypeError):
        return None


def _tail(path: Path, n: int = 5) -> str:
    try:
        lines = [ln.strip() for ln in path.read_text(errors="replace").splitlines() if ln.strip()]
    except OSError:
        return "(no log)"
    return " | ".join(lines[-n:]) or "(empty log)"


def _wait_gone(pid: int, popen: subprocess.Popen[bytes] | None, timeout: float) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if popen is not None:
            if popen.poll() is not None:
                return True
        elif not _pid_is_broker(pid):
            return True
        time.sleep(0.1)
    return False


def _set_parent_death_signal() -> None:  # pragma: no cover - runs in the child
    """Linux: SIGTERM the broker when the process that started it dies (non-detached brokers)."""
    try:
        import ctypes

        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG
    except Exception:
        pass


# --------------------------------------------------------------------------- the broker


class LocalBroker:
    """One single-node KRaft Kafka broker process on 127.0.0.1.

    ``detached=True`` (the CLI and :func:`ensure_broker`): the broker outlives this
    process and is recorded in ``<cache>/broker.json``.  ``detached=False`` (tests):
    no state file, and on Linux the broker gets SIGTERM when its parent dies.
    """

    def __init__(self, cache_dir: Path | str | None = None, *, detached: bool = False,
                 jvm_flags: tuple[str, ...] = JVM_FLAGS) -> None:
        self.cache_dir = _cache(cache_dir)
        self.detached = detached
        self.jvm_flags = jvm_flags
        self.port: int | None = None
        self.controller_port: int | None = None
        self.broker_dir: Path | None = None
        self.pid: int | None = None
        self._popen: subprocess.Popen[bytes] | None = None
        self.reused = False  # start() found this (detached) broker running and returned it

    @property
    def bootstrap(self) -> str:
        if self.port is None:
            raise BrokerUnavailable(f"{HOST}:?", "the local broker has not been started")
        return f"{HOST}:{self.port}"

    @classmethod
    def from_state(cls, cache_dir: Path | str | None = None) -> "LocalBroker | None":
        """The detached broker recorded in the state file, if its process is alive."""
        state = running_state(cache_dir)
        if state is None:
            return None
        broker = cls(cache_dir, detached=True)
        broker.pid = int(state["pid"])
        broker.port = int(state["port"])
        broker.controller_port = state.get("controller_port")
        broker.broker_dir = Path(state["data_dir"]) if state.get("data_dir") else None
        return broker

    def differs_from(self, port: int | None, data_dir: Path | str | None) -> str | None:
        """What of ``port`` and ``data_dir`` (None: any) this broker was not started with, as the flags that ask
        for it (``--port 19342``), or None when it matches them."""
        wrong = []
        if port is not None and port != self.port:
            wrong.append(f"--port {port}")
        if data_dir is not None and (self.broker_dir is None
                                     or Path(data_dir).expanduser().resolve() != Path(self.broker_dir).resolve()):
            wrong.append(f"--data-dir {data_dir}")
        return " and ".join(wrong) or None

    def is_running(self) -> bool:
        if self.pid is None:
            return False
        if self._popen is not None:
            return self._popen.poll() is None
        return _pid_is_broker(self.pid)

    def start(self, port: int | None = None, data_dir: Path | str | None = None, *,
              timeout: float = 60.0, quiet: bool = False) -> str:
        """Start the broker and wait until it answers; return its bootstrap ``127.0.0.1:PORT``.

        ``data_dir`` holds ``server.properties``, the logs and the Kafka data (``data/``);
        it defaults to ``<cache>/broker``, which is wiped first.  An explicit
        ``data_dir`` that was formatted before is reused as it is.  Detached: when the
        recorded broker is already running and answering, its bootstrap is returned and :attr:`reused` is set; a
        ``port`` or ``data_dir`` it was not started with is :class:`BrokerAlreadyRunning` (exit 2) instead, not
        silently ignored.
        """
        if self.detached:
            with _locked(self.cache_dir):
                running = LocalBroker.from_state(self.cache_dir)
                if running is not None and probe(running.bootstrap):
                    clash = running.differs_from(port, data_dir)
                    if clash:
                        raise BrokerAlreadyRunning(
                            f"{clash}: a local Kafka broker is already running, at {running.bootstrap} with data in "
                            f"{running.broker_dir} (pid {running.pid}); stop it first (`whywait kafka stop`) to "
                            "start one so, or leave the flag out to use the running one")
                    self.__dict__.update({k: v for k, v in running.__dict__.items() if k != "detached"})
                    self.reused = True
                    return running.bootstrap
                if running is not None:  # alive but not answering: replace it
                    running.stop()
                return self._start(port, data_dir, timeout, quiet)
        return self._start(port, data_dir, timeout, quiet)

    def _start(self, port: int | None, data_dir: Path | str | None, timeout: float, quiet: bool) -> str:
        if self.is_running():
            return self.bootstrap
        if port and _listening(HOST, port):
            raise BrokerStartError(f"port {port} on {HOST} is already in use; pick another or omit it")
        libs = fetch_jars(self.cache_dir, quiet=quiet)
        java = _java()
        if data_dir is None:
            broker_dir = self.cache_dir / "broker"
            shutil.rmtree(broker_dir, ignore_errors=True)
        else:
            broker_dir = Path(data_dir).expanduser().resolve()
        broker_dir.mkdir(parents=True, exist_ok=True)
        log_dir = broker_dir / "data"
        # A restarted detached broker keeps its ports when they are free, so clients that
        # are still running (an engine, agents retrying) find it again at the same address.
        last = last_ports(self.cache_dir) if self.detached else None
        if port is None and last is not None and all(_bindable(HOST, p) for p in last):
            port, self.controller_port = last
        else:
            self.controller_port = None
        self.port = port or free_port()
        while self.controller_port is None or self.controller_port == self.port:
            self.controller_port = free_port()
        self.broker_dir = broker_dir
        props_file = broker_dir / "server.properties"
        props_file.write_text(render_properties(server_properties(self.port, self.controller_port, log_dir)))

        classpath = str(libs / "*")
        log_props = [f"-Dkafka.logs.dir={broker_dir}", f"-Dlog4j2.configurationFile={LOG4J2_CONFIG}"]
        if not (log_dir / "meta.properties").exists():
            fmt = subprocess.run(
                [java, "-Xmx256m", "-XX:+UseSerialGC", "-XX:TieredStopAtLevel=1", *log_props, "-cp", classpath,
                 "kafka.tools.StorageTool", "format", "-t", new_cluster_id(), "-c", str(props_file)],
                capture_output=True, text=True, timeout=120,
            )
            if fmt.returncode != 0:
                out = " | ".join(ln for ln in (fmt.stdout + fmt.stderr).splitlines()[-3:] if ln.strip())
                raise BrokerStartError(f"formatting the Kafka storage in {log_dir} failed: {out}")

        out_log = broker_dir / "broker.log"
        with open(out_log, "ab") as log_fh:
            self._popen = subprocess.Popen(
                [java, *self.jvm_flags, *log_props, "-cp", classpath, "kafka.Kafka", str(props_file)],
                stdin=subprocess.DEVNULL, stdout=log_fh, stderr=subprocess.STDOUT, cwd=broker_dir,
                start_new_session=True,
                preexec_fn=None if self.detached else _set_parent_death_signal,
            )
        self.pid = self._popen.pid
        if self.detached:
            last_ports_file(self.cache_dir).write_text(
                json.dumps({"port": self.port, "controller_port": self.controller_port}) + "\n")
            write_state({"pid": self.pid, "port": self.port, "controller_port": self.controller_port,
                         "bootstrap": self.bootstrap, "data_dir": str(broker_dir),
                         "kafka_version": KAFKA_VERSION, "started_at": time.time()}, self.cache_dir)
        self._wait_ready(timeout, out_log)
        return self.bootstrap

    def _wait_ready(self, timeout: float, out_log: Path) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if probe(self.bootstrap, timeout=1.0):
                return
            if not self.is_running():
                code = self._popen.poll() if self._popen is not None else "?"
                self._forget()
                raise BrokerStartError(f"the Kafka broker exited (status {code}) while starting: "
                                       f"{self._log_tail(out_log)}")
            time.sleep(0.1)
        self.stop()
        raise BrokerStartError(f"the Kafka broker at {HOST}:{self.port} did not answer within {timeout:.0f} s: "
                               f"{self._log_tail(out_log)}")

    def _log_tail(self, out_log: Path) -> str:
        server_log = out_log.with_name("kafka-server.log")
        parts = [_tail(out_log, 3)] if out_log.exists() and out_log.stat().st_size else []
        if server_log.exists():
            parts.append(_tail(server_log, 3))
        return " | ".join(parts) or f"(see {out_log})"

    def stop(self, timeout: float = 20.0) -> bool:
        """SIGTERM (a controlled shutdown), then SIGKILL after ``timeout`` s; True when a process was stopped."""
        if self.pid is None:
            return False
        pid, popen = self.pid, self._popen
        if not self.is_running():
            self._forget()
            return False
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGTERM)
        if not _wait_gone(pid, popen, timeout):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
            _wait_gone(pid, popen, 5.0)
        self._forget()
        return True

    def _forget(self) -> None:
        if self.detached:
            state = read_state(self.cache_dir)
            if state is not None and int(state["pid"]) == self.pid:
                clear_state(self.cache_dir)
        self.pid = None
        self._popen = None

    def __enter__(self) -> "LocalBroker":
        if self.pid is None:
            self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


# --------------------------------------------------------------------------- entry points


def resolve_bootstrap(cache_dir: Path | str | None = None, *, flag: str | None = None) -> str:
    """``flag`` (a command's ``--bootstrap``) if given, else ``$WHYWAIT_KAFKA_BOOTSTRAP`` if set, else the running
    local broker's; else :class:`BrokerUnavailable`.

    The one place a bootstrap string is checked (:func:`check_bootstrap`): a malformed one is a
    :class:`ConfigError` naming the flag or the variable and the part that is wrong.
    """
    if flag:
        return check_bootstrap(flag, "--bootstrap")
    env = os.environ.get(BOOTSTRAP_ENV, "").strip()
    if env:
        return check_bootstrap(env, BOOTSTRAP_ENV)
    state = running_state(cache_dir)
    if state is None:
        raise BrokerUnavailable(f"{HOST} (local broker)", f"no local broker is running and {BOOTSTRAP_ENV} is unset")
    bootstrap = f"{HOST}:{int(state['port'])}"
    if not probe(bootstrap):
        raise BrokerUnavailable(bootstrap, f"the local broker (pid {state['pid']}) is not answering")
    return bootstrap


def ensure_broker(cache_dir: Path | str | None = None, *, timeout: float = 60.0, quiet: bool = False) -> str:
    """``$WHYWAIT_KAFKA_BOOTSTRAP`` if set; else the running local broker; else fetch and start one (detached)."""
    env = os.environ.get(BOOTSTRAP_ENV, "").strip()
    if env:
        return check_bootstrap(env, BOOTSTRAP_ENV)
    return LocalBroker(cache_dir, detached=True).start(timeout=timeout, quiet=quiet)


def stop_detached(cache_dir: Path | str | None = None, timeout: float = 20.0) -> bool:
    """Stop the broker recorded in the state file; True when one was running."""
    with _locked(cache_dir):
        broker = LocalBroker.from_state(cache_dir)
        if broker is None:
            clear_state(cache_dir)
            return False
        return broker.stop(timeout)
