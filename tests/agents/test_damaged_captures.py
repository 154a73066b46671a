"""The node agent's parsers against real captures damaged in systematic ways.

Every file a collector reads from the machine is taken from a real capture (``tests/fixtures/agents``, see
its ATTRIBUTION.md) and damaged deterministically: truncated at every line boundary and in the middle of
lines, emptied, a line duplicated, numbers replaced by values no counter can hold (``1e400``, ``2**70``,
``-1``, ``NaN``), bytes that are not UTF-8, control characters, very long lines, and the file missing,
a directory in its place or unreadable (permission denied).  The contract for every case:

* the collector never lets an exception out of its sample (``sample failed`` is a bug's log line);
* whatever it returns is a message the event contract accepts (``validate``, ``encode`` without NaN or
  infinity, and the compiled ``decode``), so the publisher never has to refuse it;
* a damaged file costs at most a couple of log lines, once: a file that stays bad logs nothing more
  round after round;
* once the file is whole again the collector reports again (one bad read does not turn it off).

No randomness: every damage is enumerated, so a failure names the file and the damage that caused it.
"""

from __future__ import annotations

import asyncio
import builtins
import errno
import json
import logging
import math
import os
import re
import shutil
from dataclasses import dataclass, field
from types import SimpleNamespace
from typing import Any, Callable, Iterator

import pytest
from whywait.agents.agent import Agent, TrainingInbox
from whywait.agents.collectors.base import Collector
from whywait.agents.collectors.bmc import parse_power, parse_sdr, parse_thermal
from whywait.agents.collectors.dcgm import DcgmCollector
from whywait.agents.collectors.gpu import NvmlCollector
from whywait.agents.collectors.hardware import HardwareCollector
from whywait.agents.collectors.host import HostCollector
from whywait.agents.collectors.kmsg import KmsgSource
from whywait.agents.collectors.network import NetworkCollector
from whywait.agents.collectors.pcie import PcieSource
from whywait.agents.collectors.ports import PortSource
from whywait.agents.collectors.storage import StorageCollector
from whywait.agents.events import (
    TOPIC_CHECKPOINTS,
    TOPIC_STEPS,
    ContractError,
    decode,
    encode,
    envelope,
    topic_for_kind,
    validate,
)
from whywait.agents.publisher import MemoryPublisher

from tests.agents.conftest import fixture_path
from tests.agents.fake_nvml import FakeNvml, load_capture

T0 = 1_764_442_800.0
NODE = "node-01"

# ---- the damages ------------------------------------------------------------------------------------

HOSTILE_NUMBERS = ("1e400", str(2 ** 70), "-1", "NaN", "-inf", str(2 ** 64), "9" * 400, "1.2.3")
_NUMBER = re.compile(rb"(?<![\w.])-?\d+(?:\.\d+)?(?![\w])")
# Not a file's content: what stands where the file should be.
MISSING, DIRECTORY, DENIED = "<missing>", "<directory>", "<permission denied>"
SPECIAL = (MISSING, DIRECTORY, DENIED)


def _stride(n: int, most: int) -> range:
    return range(0, n, max(1, -(-n // most)))


def damages(data: bytes, *, json_text: bool = False) -> Iterator[tuple[str, bytes | str]]:
    """Every damage of ``data``, as ``(label, damaged bytes or a SPECIAL marker)``; deterministic."""
    lines = data.splitlines(keepends=True)
    yield "empty", b""
    ends = []
    pos = 0
    for ln in lines:
        pos += len(ln)
        ends.append(pos)
    for i, off in enumerate(ends[:-1]):
        yield f"cut after line {i + 1}", data[:off]
    starts = [0] + ends[:-1]
    for i in _stride(len(lines), 40):
        mid = starts[i] + max(1, len(lines[i].rstrip(b"\n")) // 2)
        yield f"cut at byte {mid} (line {i + 1})", data[:mid]
    for i in _stride(len(lines), 12):
        yield f"line {i + 1} twice", b"".join(lines[:i + 1] + [lines[i]] + lines[i + 1:])
    for h in HOSTILE_NUMBERS:
        yield f"every number -> {h[:12]}", _NUMBER.sub(h.encode(), data)
    numbered = [i for i, ln in enumerate(lines) if _NUMBER.search(ln)]
    for j in _stride(len(numbered), 10):
        i = numbered[j]
        for h in (str(2 ** 70), "-1"):
            yield f"line {i + 1} numbers -> {h[:12]}", \
                b"".join(lines[:i] + [_NUMBER.sub(h.encode(), lines[i])] + lines[i + 1:])
    yield "no trailing newline", data.rstrip(b"\n")
    yield "CRLF", data.replace(b"\n", b"\r\n")
    yield "NUL bytes", b"\0" * len(data)
    yield "very long line", data + b"9" * (1 << 20) + b"\n"
    yield "very long token", b"".join(b"x" * 4096 + ln for ln in lines[:64]) + b"".join(lines[64:])
    if json_text:  # keep it JSON: damage the strings' contents through escapes
        yield "control characters in strings", re.sub(rb'": "', rb'": "\\u001b[2J\\u0085', data)
        yield "unpaired surrogates in strings", re.sub(rb'": "', rb'": "\\ud800', data)
        yield "long strings", re.sub(rb'": "', b'": "' + b"y" * 5000, data)
        yield "deep nesting", b"[" * 100_000 + b"]" * 100_000
    else:
        yield "invalid UTF-8 leading", b"\xff\xfe" + data
        yield "invalid UTF-8 in every line", b"".join(
            ln[:len(ln) // 2] + b"\xc3\x28\x80" + ln[len(ln) // 2:] for ln in lines)
        yield "control characters in every line", b"".join(
            ln[:max(1, len(ln) // 3)] + b"\x1b[2J\x07\x00" + ln[max(1, len(ln) // 3):] for ln in lines)
        yield "C1 controls in every line", b"".join(
            ln[:max(1, len(ln) // 3)] + "\u0085\u009b".encode() + ln[max(1, len(ln) // 3):] for ln in lines)
    for s in SPECIAL:
        yield s, s


# ---- applying a damage to a file ------------------------------------------------------------------

_REAL_OPEN = builtins.open
_REAL_OS_OPEN = os.open


class Denied:
    """Makes reading the paths in :attr:`paths` fail with EACCES, as for an unprivileged agent (the tests
    may run as root, which ``chmod 000`` does not stop)."""

    paths: set[str] = set()

    @classmethod
    def install(cls, monkeypatch: pytest.MonkeyPatch) -> None:
        def check(path: Any) -> None:
            if cls.paths and isinstance(path, (str, bytes, os.PathLike)) \
                    and os.path.realpath(os.fsdecode(path)) in cls.paths:
                raise PermissionError(errno.EACCES, "Permission denied", os.fsdecode(path))

        def fake_open(file: Any, *a: Any, **k: Any) -> Any:
            check(file)
            return _REAL_OPEN(file, *a, **k)

        def fake_os_open(path: Any, *a: Any, **k: Any) -> int:
            check(path)
            return _REAL_OS_OPEN(path, *a, **k)

        cls.paths = set()
        monkeypatch.setattr(builtins, "open", fake_open)
        monkeypatch.setattr(os, "open", fake_os_open)


def put(path: str, content: bytes | str) -> None:
    """Make ``path`` hold ``content`` (bytes, or a SPECIAL marker)."""
    path = os.path.realpath(path)
    Denied.paths.discard(path)
    if os.path.isdir(path) and not os.path.islink(path):
        shutil.rmtree(path)
    elif os.path.lexists(path) and content == MISSING:
        os.unlink(path)
    if content == MISSING:
        return
    if content == DIRECTORY:
        if os.path.lexists(path):
            os.unlink(path)
        os.makedirs(path)
        return
    if content == DENIED:
        Denied.paths.add(path)
        return
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with _REAL_OPEN(path, "wb") as fh:
        fh.write(content)  # type: ignore[arg-type]


# ---- what the agent would publish -------------------------------------------------------------------

def contract_problem(kind: str, body: dict[str, Any]) -> str | None:
    """Why the publisher would refuse ``body`` (or None): the contract, NaN/infinity, the compiled decoder."""
    msg = envelope(kind, NODE, T0, **body)
    topic = topic_for_kind(kind)
    try:
        validate(msg, topic)
        decode(encode(msg), topic)
    except (ContractError, ValueError, TypeError, OverflowError) as exc:
        return f"{type(exc).__name__}: {str(exc)[:240]}"
    return None


class LogLines(logging.Handler):
    """The agent's log lines (INFO and up), kept for counting."""

    def __init__(self) -> None:
        super().__init__(logging.INFO)
        self.records: list[logging.LogRecord] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.records.append(record)

    def since(self, mark: int) -> list[str]:
        return [r.getMessage()[:200] for r in self.records[mark:]]


@pytest.fixture()
def agent_log() -> Iterator[LogLines]:
    logger = logging.getLogger("whywait.agent")
    h = LogLines()
    old = logger.level
    logger.setLevel(logging.INFO)
    logger.addHandler(h)
    yield h
    logger.removeHandler(h)
    logger.setLevel(old)


# ---- the rounds ---------------------------------------------------------------------------------------

@dataclass
class Scenario:
    """A collector over a root of real captures.

    ``files`` maps each file (relative to the root) to its content at round ``k``: counters advance, so the
    collector has rates to report.  ``make`` builds a fresh collector on the root.  ``mono_step`` spaces
    the rounds (the hw sources run every 10 s).
    """

    name: str
    kind: str
    root: str
    make: Callable[[str], Collector]
    files: dict[str, Callable[[int], bytes]]
    mono_step: float = 1.0
    targets: tuple[str, ...] = ()
    expect_body: bool = True  # a whole file again: the collector reports again
    problems: list[str] = field(default_factory=list)
    written: dict[str, bytes | str] = field(default_factory=dict)


# Rounds: primed whole, then the damage stays four rounds, then whole again.
SEQUENCE = ("good", "bad", "bad", "bad", "bad", "good", "good", "good")
STEADY = (3, 4)  # rounds in which a damage that stays must log nothing new


def write_round(sc: Scenario, k: int, target: str | None, damaged: bytes | str | None) -> None:
    for rel, good in sc.files.items():
        content = damaged if rel == target and damaged is not None else good(k)
        if sc.written.get(rel) != content:  # files that do not change are not written again (time)
            put(os.path.join(sc.root, rel), content)
            sc.written[rel] = content


def run_damage(sc: Scenario, target: str, label: str, damaged: bytes | str, log: LogLines,
               sequence: tuple[str, ...] = SEQUENCE) -> None:
    where = f"{sc.name}: {target}: {label}"
    write_round(sc, 0, None, None)
    c = sc.make(sc.root)
    body = None
    damaged_lines: list[str] = []
    try:
        for k, state in enumerate(sequence):
            write_round(sc, k, target, damaged if state == "bad" else None)
            mark = len(log.records)
            body = c.collect(T0 + k, k * sc.mono_step)
            lines = log.since(mark)
            failed = [m for m in lines if "sample failed" in m or " failed: " in m]
            if failed:
                sc.problems.append(f"{where}: round {k}: an exception escaped: {failed[0]}")
            if state == "bad":
                damaged_lines += lines
                if k in STEADY and lines:
                    sc.problems.append(f"{where}: round {k}: logs again while the damage stays: {lines[0]}")
            if body is not None:
                why = contract_problem(sc.kind, body)
                if why:
                    sc.problems.append(f"{where}: round {k}: not publishable: {why}")
        if len(damaged_lines) > 2:
            sc.problems.append(f"{where}: {len(damaged_lines)} log lines for one damage: {damaged_lines[:3]}")
        if sc.expect_body and (body is None or not c.enabled):
            sc.problems.append(f"{where}: no report once the file is whole again "
                               f"(off: {c.off_reason}; parts off: {c.parts_off})")
    finally:
        c.close()


def exercise(sc: Scenario, log: LogLines, json_text: bool = False, only: Callable[[str], bool] | None = None) \
        -> list[str]:
    for target in sc.targets:
        good = sc.files[target](1)
        for label, damaged in damages(good, json_text=json_text):
            if only is None or only(label):
                run_damage(sc, target, label, damaged, log)
    write_round(sc, 0, None, None)
    return sc.problems


def report(problems: list[str]) -> str:
    """The failure message: the first 40 problems (``DAMAGE_REPORT_LINES=n`` shows more)."""
    shown = int(os.environ.get("DAMAGE_REPORT_LINES", "40"))
    return f"{len(problems)} problems:\n" + "\n".join(problems[:shown])


# ---- helpers building the captures' rounds --------------------------------------------------------------

def read_bytes(path: str) -> bytes:
    with _REAL_OPEN(path, "rb") as fh:
        return fh.read()


def static(data: bytes) -> Callable[[int], bytes]:
    return lambda k: data


def bump_lines(data: bytes, match: Callable[[list[bytes]], bool], skip: int, step: int) -> Callable[[int], bytes]:
    """Round ``k``: every integer after the first ``skip`` tokens of the lines ``match`` accepts, plus k×step."""
    def at(k: int) -> bytes:
        out = []
        for ln in data.splitlines(keepends=True):
            toks = ln.split()
            if toks and match(toks):
                end = ln[len(ln.rstrip(b"\r\n")):]
                toks = toks[:skip] + [str(int(t) + k * step).encode() if t.isdigit() else t for t in toks[skip:]]
                ln = b" ".join(toks) + end
            out.append(ln)
        return b"".join(out)
    return at


def counter(base: int, step: int) -> Callable[[int], bytes]:
    return lambda k: f"{base + k * step}\n".encode()


def copy_files(src_root: str, dst_root: str, rels: list[str]) -> dict[str, Callable[[int], bytes]]:
    out = {}
    for rel in rels:
        out[rel] = static(read_bytes(os.path.join(src_root, rel)))
        put(os.path.join(dst_root, rel), out[rel](0))
    return out


# ---- host -------------------------------------------------------------------------------------------------

@pytest.fixture()
def host_scenario(procfs_root: str, tmp_path: Any, monkeypatch: pytest.MonkeyPatch) -> Scenario:
    Denied.install(monkeypatch)
    root = str(tmp_path / "host")
    files = copy_files(procfs_root, root, ["proc/meminfo", "proc/pressure/cpu", "proc/pressure/memory"])
    stat = read_bytes(os.path.join(procfs_root, "proc/stat"))
    files["proc/stat"] = bump_lines(stat, lambda t: t[0] == b"cpu", 1, 1000)
    pid_stat = read_bytes(os.path.join(procfs_root, "proc/26231/stat"))  # vim's, as a data-loader worker
    files["proc/100/stat"] = static(pid_stat)
    files["proc/100/task/100/children"] = static(b"101 \n")
    files["proc/101/stat"] = lambda k: pid_stat.replace(b" 1677 44 ", f" {1677 + 50 * k} 44 ".encode())
    files["proc/101/task/101/children"] = static(b"")
    return Scenario("host", "host", root, lambda r: HostCollector(r, pids=[100]), files,
                    targets=("proc/stat", "proc/meminfo", "proc/pressure/cpu", "proc/pressure/memory",
                             "proc/101/stat", "proc/100/task/100/children"))


def test_host_survives_damaged_proc(host_scenario: Scenario, agent_log: LogLines) -> None:
    assert not exercise(host_scenario, agent_log), report(host_scenario.problems)


# ---- network -----------------------------------------------------------------------------------------------

@pytest.fixture()
def eth_scenario(node_exporter_root: str, tmp_path: Any, monkeypatch: pytest.MonkeyPatch) -> Scenario:
    Denied.install(monkeypatch)
    root = str(tmp_path / "eth")
    os.makedirs(os.path.join(root, "sys/class/net"))
    os.makedirs(os.path.join(root, "proc/net"))
    dev = "sys/devices/pci0000:40/0000:40:01.3/0000:45:00.0"
    shutil.copytree(os.path.join(node_exporter_root, dev), os.path.join(root, dev), symlinks=True)
    os.symlink(f"../../../{dev}/net/ens10f0", os.path.join(root, "sys/class/net/ens10f0"))
    nd = f"{dev}/net/ens10f0"
    files: dict[str, Callable[[int], bytes]] = {}
    for stat, step in (("rx_bytes", 125_000_000), ("tx_bytes", 80_000_000), ("rx_packets", 0),
                       ("tx_packets", 0), ("rx_errors", 0), ("tx_dropped", 0)):
        base = int(read_bytes(os.path.join(root, nd, "statistics", stat)))
        files[f"{nd}/statistics/{stat}"] = counter(base, step)
    for name in ("carrier_changes", "operstate", "speed"):
        files[f"{nd}/{name}"] = static(read_bytes(os.path.join(root, nd, name)))
    snmp = read_bytes(os.path.join(node_exporter_root, "proc/net/snmp"))
    files["proc/net/snmp"] = bump_lines(snmp, lambda t: t[0] == b"Tcp:" and t[1].isdigit(), 1, 7)
    netstat = read_bytes(os.path.join(node_exporter_root, "proc/net/netstat"))
    files["proc/net/netstat"] = bump_lines(netstat, lambda t: t[0] == b"TcpExt:" and t[1].isdigit(), 1, 3)
    return Scenario("network (ethernet)", "net", root, lambda r: NetworkCollector(r), files,
                    targets=("proc/net/snmp", "proc/net/netstat", f"{nd}/statistics/rx_bytes",
                             f"{nd}/statistics/rx_errors", f"{nd}/carrier_changes", f"{nd}/operstate",
                             f"{nd}/speed"))


def test_network_survives_damaged_ethernet_and_tcp_counters(eth_scenario: Scenario, agent_log: LogLines) -> None:
    assert not exercise(eth_scenario, agent_log), report(eth_scenario.problems)


# What each counter the agent reads advances by per round (the rest stay: fewer files to write).
IB_COUNTERS = {"port_rcv_data": 10 ** 9, "port_xmit_data": 10 ** 9, "port_rcv_packets": 0,
               "port_xmit_packets": 0, "port_rcv_errors": 0, "port_xmit_discards": 0, "link_downed": 0,
               "symbol_error": 0, "port_xmit_wait": 1000, "port_xmit_constraint_errors": 0,
               "port_rcv_remote_physical_errors": 0}


IB_HW = ("out_of_buffer", "out_of_sequence", "local_ack_timeout_err", "packet_seq_err", "rnr_nak_retry_err",
         "roce_adp_retrans", "roce_slow_restart")


def ib_files(root: str, hcas: tuple[str, ...]) -> dict[str, Callable[[int], bytes]]:
    """A real H100 node's ports (gpud's capture), counters advancing each round."""
    src = fixture_path("gpud", "sys-class-infiniband-h100.0")
    files: dict[str, Callable[[int], bytes]] = {}
    for hca in hcas:
        for port in sorted(os.listdir(os.path.join(src, hca, "ports"))):
            pd = os.path.join(src, hca, "ports", port)
            rel = f"sys/class/infiniband/{hca}/ports/{port}"
            for name in ("state", "rate", "link_layer", "phys_state"):
                if os.path.exists(os.path.join(pd, name)):
                    files[f"{rel}/{name}"] = static(read_bytes(os.path.join(pd, name)))
            for sub in ("counters", "hw_counters"):
                for name in sorted(os.listdir(os.path.join(pd, sub))):
                    if name not in IB_COUNTERS and name not in IB_HW:
                        continue  # not read by the agent: left out of the rounds (time)
                    base = int(read_bytes(os.path.join(pd, sub, name)).strip() or b"0")
                    files[f"{rel}/{sub}/{name}"] = counter(base, IB_COUNTERS.get(name, 0))
    for rel, f in files.items():
        put(os.path.join(root, rel), f(0))
    return files


@pytest.fixture()
def ib_scenario(tmp_path: Any, monkeypatch: pytest.MonkeyPatch) -> Scenario:
    Denied.install(monkeypatch)
    root = str(tmp_path / "ib")
    files = ib_files(root, ("mlx5_0",))
    p = "sys/class/infiniband/mlx5_0/ports/1"
    return Scenario("network (infiniband)", "net", root, lambda r: NetworkCollector(r), files,
                    targets=(f"{p}/counters/port_rcv_data", f"{p}/counters/port_xmit_data",
                             f"{p}/counters/link_downed", f"{p}/counters/port_xmit_wait",
                             f"{p}/hw_counters/out_of_buffer", f"{p}/state", f"{p}/rate", f"{p}/link_layer"))


def test_network_survives_damaged_infiniband_counters(ib_scenario: Scenario, agent_log: LogLines) -> None:
    assert not exercise(ib_scenario, agent_log), report(ib_scenario.problems)


# ---- storage -----------------------------------------------------------------------------------------------

LUSTRE = "sys/kernel/debug/lustre/llite/ai400x2-ff47bce9ca35d800/stats"


@pytest.fixture()
def storage_scenario(procfs_root: str, tmp_path: Any, monkeypatch: pytest.MonkeyPatch) -> Scenario:
    Denied.install(monkeypatch)
    root = str(tmp_path / "storage")
    files = copy_files(procfs_root, root, ["proc/pressure/io"])
    disk = read_bytes(fixture_path("node_exporter", "proc", "diskstats"))
    files["proc/diskstats"] = bump_lines(disk, lambda t: True, 3, 10)
    ms = read_bytes(fixture_path("node_exporter", "proc", "10", "mountstats"))
    files["proc/10/mountstats"] = bump_lines(ms, lambda t: t[0] in (b"READ:", b"WRITE:", b"GETATTR:"), 1, 5)
    llite = read_bytes(fixture_path("lustre", "llite_client.txt"))
    files[LUSTRE] = bump_lines(llite, lambda t: len(t) > 2 and t[2] == b"samples", 1, 10)
    for rel, f in files.items():
        put(os.path.join(root, rel), f(0))
    return Scenario("storage", "storage", root, lambda r: StorageCollector(r, pid=10), files,
                    targets=("proc/diskstats", "proc/10/mountstats", LUSTRE, "proc/pressure/io"))


def test_storage_survives_damaged_diskstats_mountstats_and_lustre(storage_scenario: Scenario,
                                                                  agent_log: LogLines) -> None:
    assert not exercise(storage_scenario, agent_log), report(storage_scenario.problems)


# ---- hw: PCIe links and ports -------------------------------------------------------------------------------

@pytest.fixture()
def pcie_scenario(node_exporter_root: str, tmp_path: Any, monkeypatch: pytest.MonkeyPatch) -> Scenario:
    Denied.install(monkeypatch)
    root = str(tmp_path / "pcie")
    shutil.copytree(os.path.join(node_exporter_root, "sys"), os.path.join(root, "sys"), symlinks=True)
    dev = "sys/devices/pci0000:40/0000:40:01.3/0000:45:00.0"
    files: dict[str, Callable[[int], bytes]] = {}
    for name in ("class", "vendor", "current_link_width", "max_link_width", "current_link_speed",
                 "max_link_speed", "aer_dev_correctable", "aer_dev_nonfatal", "aer_dev_fatal"):
        data = read_bytes(os.path.join(root, dev, name))
        files[f"{dev}/{name}"] = bump_lines(data, lambda t: t[0] == b"TOTAL_ERR_COR", 1, 1) \
            if name == "aer_dev_correctable" else static(data)
    return Scenario("hw pcie", "hw", root, lambda r: HardwareCollector(r, sources=[PcieSource(r)]), files,
                    mono_step=11.0, targets=tuple(files))


def test_pcie_survives_damaged_sysfs(pcie_scenario: Scenario, agent_log: LogLines) -> None:
    assert not exercise(pcie_scenario, agent_log), report(pcie_scenario.problems)


@pytest.fixture()
def ports_scenario(node_exporter_root: str, tmp_path: Any, monkeypatch: pytest.MonkeyPatch) -> Scenario:
    Denied.install(monkeypatch)
    root = str(tmp_path / "ports")
    files = {k: v for k, v in ib_files(root, ("mlx5_0",)).items() if "counters" not in k}
    p = "sys/class/infiniband/mlx5_0/ports/1"
    for i, (gid, kind) in enumerate((("fe80:0000:0000:0000:a088:c203:0030:6ad6", "IB/RoCE v1"),
                                     ("0000:0000:0000:0000:0000:ffff:0a00:0001", "RoCE v2"))):
        files[f"{p}/gids/{i}"] = static(f"{gid}\n".encode())
        files[f"{p}/gid_attrs/types/{i}"] = static(f"{kind}\n".encode())
    # node_exporter's Ethernet port, with the class/net link a real sysfs has
    dev = "sys/devices/pci0000:40/0000:40:01.3/0000:45:00.0"
    shutil.copytree(os.path.join(node_exporter_root, dev), os.path.join(root, dev), symlinks=True)
    os.makedirs(os.path.join(root, "sys/class/net"))
    os.symlink(f"../../../{dev}/net/ens10f0", os.path.join(root, "sys/class/net/ens10f0"))
    for name in (f"{dev}/net/ens10f0/operstate", f"{dev}/net/ens10f0/speed", f"{dev}/vendor", f"{dev}/device"):
        files[name] = static(read_bytes(os.path.join(root, name)))
    return Scenario("hw ports", "hw", root, lambda r: HardwareCollector(r, sources=[PortSource(r)]), files,
                    mono_step=11.0, targets=(f"{p}/state", f"{p}/rate", f"{p}/link_layer", f"{p}/gids/0",
                                             f"{p}/gid_attrs/types/1", f"{dev}/net/ens10f0/operstate",
                                             f"{dev}/net/ens10f0/speed", f"{dev}/vendor"))


def test_ports_survive_damaged_sysfs(ports_scenario: Scenario, agent_log: LogLines) -> None:
    assert not exercise(ports_scenario, agent_log), report(ports_scenario.problems)


# ---- hw: the kernel log -------------------------------------------------------------------------------------

def kmsg_records(first_seq: int) -> bytes:
    """Real error lines (kernel-lines.txt) as /dev/kmsg records, numbered from ``first_seq``."""
    lines = read_bytes(fixture_path("kmsg", "kernel-lines.txt")).decode().splitlines()
    out = []
    for i, ln in enumerate(lines):
        msg = re.sub(r"^\[[^\]]*\]\s*", "", ln)
        out.append(f"3,{first_seq + i},{(849 + i) * 1_000_000},-;{msg}\n")
    return "".join(out).encode()


def kmsg_root(tmp_path: Any) -> str:
    root = str(tmp_path / "kmsg")
    put(os.path.join(root, "dev", "kmsg"), read_bytes(fixture_path("kmsg", "kmsg.1.log")) + b"\n")
    put(os.path.join(root, "proc", "sys", "kernel", "random", "boot_id"), b"0a5d0e2c-7c11-4b9f-a1a6-6ed3e1f0c0de\n")
    put(os.path.join(root, "proc", "stat"), b"cpu 1 2 3 4\nbtime 1764400000\n")
    return root


def test_kmsg_survives_damaged_records(tmp_path: Any, agent_log: LogLines) -> None:
    """New records arrive damaged (a torn write, a hostile line); whole ones after them are still read."""
    problems: list[str] = []
    good = kmsg_records(5000)
    for label, damaged in damages(good):
        if damaged in SPECIAL:
            continue
        root = kmsg_root(tmp_path / str(len(problems)) / re.sub(r"\W", "_", label))
        src = KmsgSource(root, os.path.join(root, "kmsg.state"))
        c = HardwareCollector(root, sources=[src])
        c.collect(T0, 0.0)
        seq = 6000
        for k, state in enumerate(("bad", "bad", "good")):
            with _REAL_OPEN(src.path, "ab") as fh:
                fh.write(b"\n" + (damaged if state == "bad" else kmsg_records(seq)))  # type: ignore[operator]
            seq += 100
            mark = len(agent_log.records)
            body = c.collect(T0 + k + 1, k + 1.0)
            if body is not None and (why := contract_problem("hw", body)):
                problems.append(f"kmsg: {label}: round {k}: not publishable: {why}")
            if lines := agent_log.since(mark):
                problems.append(f"kmsg: {label}: round {k}: logs {lines[0]}")
            if state == "good" and not (body and body.get("kernel")):
                problems.append(f"kmsg: {label}: whole records after the damage are not reported")
        c.close()
    assert not problems, report(problems)


@pytest.mark.parametrize("rel", ["state", "proc/stat", "proc/sys/kernel/random/boot_id"])
def test_kmsg_survives_damaged_state_boot_id_and_btime(rel: str, tmp_path: Any, agent_log: LogLines,
                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    Denied.install(monkeypatch)
    problems: list[str] = []
    base = kmsg_root(tmp_path / "base")
    state_good = json.dumps({"boot_id": "0a5d0e2c-7c11-4b9f-a1a6-6ed3e1f0c0de", "seq": 3990}).encode()
    good = state_good if rel == "state" else read_bytes(os.path.join(base, rel))
    for n, (label, damaged) in enumerate(damages(good, json_text=rel == "state")):
        root = kmsg_root(tmp_path / str(n))
        state = os.path.join(root, "state")
        put(os.path.join(root, rel), damaged)
        mark = len(agent_log.records)
        src = KmsgSource(root, state)
        c = HardwareCollector(root, sources=[src])
        for k in range(3):
            with _REAL_OPEN(src.path, "ab") as fh:
                fh.write(kmsg_records(5000 + 100 * k))
            body = c.collect(T0 + k, float(k))
            if body is not None and (why := contract_problem("hw", body)):
                problems.append(f"kmsg {rel}: {label}: round {k}: not publishable: {why}")
        lines = [m for m in agent_log.since(mark) if "nvml off" not in m]  # no GPU collector in this test
        if len(lines) > 1:
            problems.append(f"kmsg {rel}: {label}: {lines}")
        c.close()
        Denied.paths.clear()
    assert not problems, report(problems)


# ---- hw: the BMC ---------------------------------------------------------------------------------------------

def bmc_problems(label: str, sensors: list[dict[str, Any]]) -> list[str]:
    why = contract_problem("hw", {"bmc": sensors})
    return [f"{label}: not publishable: {why}"] if why else []


def test_ipmitool_sdr_survives_damage() -> None:
    problems: list[str] = []
    good = read_bytes(fixture_path("ipmitool", "proliant-dl360-sdr-elist-full.txt"))
    for label, damaged in damages(good):
        if damaged in SPECIAL:
            continue  # ipmitool's output is text in memory, never a file the agent opens
        try:
            sensors = parse_sdr(damaged.decode("utf-8", "replace"))  # type: ignore[union-attr]
        except Exception as exc:  # noqa: BLE001 - what the test is looking for
            problems.append(f"ipmitool sdr: {label}: {type(exc).__name__}: {exc}")
            continue
        problems += bmc_problems(f"ipmitool sdr: {label}", sensors)
    assert not problems, report(problems)


@pytest.mark.parametrize("resource,parse", [("Thermal", parse_thermal), ("Power", parse_power)])
def test_redfish_resources_survive_damage(resource: str, parse: Callable[..., Any]) -> None:
    problems: list[str] = []
    good = read_bytes(fixture_path("redfish", "public-rackmount1", "Chassis", "1U", resource, "index.json"))
    for label, damaged in damages(good, json_text=True):
        if damaged in SPECIAL:
            continue
        try:
            doc = json.loads(damaged)
        except (ValueError, RecursionError):
            continue  # the client refuses it as "not JSON" (one line per distinct error, in BmcSource.poll)
        if not isinstance(doc, dict):
            continue
        try:
            sensors = parse(doc)
        except Exception as exc:  # noqa: BLE001
            problems.append(f"redfish {resource}: {label}: {type(exc).__name__}: {exc}")
            continue
        problems += bmc_problems(f"redfish {resource}: {label}", sensors)
    # A list where an object belongs, a number where a list belongs: the document is still JSON.
    doc = json.loads(good)
    for key in list(doc):
        for odd in (5, "x", None, {"a": 1}, [1, "x", None, [2]], 2 ** 70, float("nan")):
            try:
                sensors = parse({**doc, key: odd})
            except Exception as exc:  # noqa: BLE001
                problems.append(f"redfish {resource}: {key} -> {odd!r}: {type(exc).__name__}: {exc}")
                continue
            problems += bmc_problems(f"redfish {resource}: {key} -> {odd!r}", sensors)
    assert not problems, report(problems)


# ---- dcgm-exporter ---------------------------------------------------------------------------------------

def test_dcgm_survives_a_damaged_scrape(agent_log: LogLines) -> None:
    problems: list[str] = []
    good = read_bytes(fixture_path("dcgm", "dcgm-exporter-L4-kops.prom"))
    for label, damaged in damages(good):
        if damaged in SPECIAL:
            continue  # a scrape is text over HTTP; a failed scrape is tested in test_dcgm.py
        c = DcgmCollector("http://dcgm-exporter:9400/metrics")
        texts = {"good": good.decode(), "bad": damaged.decode("utf-8", "replace")}  # type: ignore[union-attr]
        lines: list[str] = []
        body = None
        for k, state in enumerate(SEQUENCE):
            c.fetch = lambda s=state, t=texts: t[s]  # type: ignore[method-assign,misc]
            mark = len(agent_log.records)
            body = c.collect(T0 + k, float(k))
            lines += agent_log.since(mark)
            if body is not None and (why := contract_problem("gpu", body)):
                problems.append(f"dcgm: {label}: round {k}: not publishable: {why}")
        if len(lines) > 1:  # the scrape is one source: one line for its damage at most
            problems.append(f"dcgm: {label}: logs {lines[:2]}")
        if not body or not (body.get("gpus") or body.get("gpus_incomplete")):
            problems.append(f"dcgm: {label}: no GPU once the scrape is whole again")
    assert not problems, report(problems)


# ---- NVML ---------------------------------------------------------------------------------------------------

NVML_HOSTILE: tuple[Any, ...] = (0xFFFFFFFF, 2 ** 64 - 1, 2 ** 70, -1, float("nan"), float("inf"))
NVML_CALLS = ("nvmlDeviceGetUtilizationRates", "nvmlDeviceGetMemoryInfo", "nvmlDeviceGetTemperature",
              "nvmlDeviceGetPowerUsage", "nvmlDeviceGetEnforcedPowerLimit", "nvmlDeviceGetClockInfo",
              "nvmlDeviceGetMaxClockInfo", "nvmlDeviceGetCurrentClocksEventReasons", "nvmlDeviceGetTotalEccErrors",
              "nvmlDeviceGetPcieReplayCounter", "nvmlDeviceGetPcieThroughput", "nvmlDeviceGetNvLinkErrorCounter",
              "nvmlDeviceGetCurrPcieLinkGeneration", "nvmlDeviceGetMaxPcieLinkWidth", "nvmlDeviceGetUUID",
              "nvmlDeviceGetPciInfo")


def hostile_answer(call: str, v: Any) -> Any:
    if call == "nvmlDeviceGetUtilizationRates":
        return SimpleNamespace(gpu=v, memory=v)
    if call == "nvmlDeviceGetMemoryInfo":
        return SimpleNamespace(used=v, total=v, free=0)
    if call == "nvmlDeviceGetUUID":
        return "GPU-\x1b[2J" + "f" * 300 if isinstance(v, float) else f"GPU-{v}\x00"
    if call == "nvmlDeviceGetPciInfo":
        return SimpleNamespace(busId=b"\xff\xfe0000:\x85" + str(v).encode())
    return v


def test_nvml_survives_hostile_answers(agent_log: LogLines) -> None:
    problems: list[str] = []
    cap = load_capture(fixture_path("nvidia-smi", "linux-x86_64__nvidia-h100-80gb-hbm3__590.48.01.txt"))
    for call in NVML_CALLS:
        for v in NVML_HOSTILE:
            label = f"nvml: {call} -> {v!r}"
            fake = FakeNvml([cap, cap])
            real = getattr(fake, call)
            at_init = call in ("nvmlDeviceGetMaxClockInfo", "nvmlDeviceGetUUID", "nvmlDeviceGetPciInfo")
            hostile = {"on": at_init}

            def answer(*a: Any, _real: Any = real, _call: str = call, _v: Any = v, _on: dict = hostile) -> Any:
                if _on["on"] and getattr(a[0] if a else None, "index", 1) == 0:  # GPU 0 goes bad, GPU 1 stays whole
                    return hostile_answer(_call, _v)
                return _real(*a)

            setattr(fake, call, answer)
            try:
                c = NvmlCollector(nvml=fake, call_timeout_s=5.0)
            except Exception as exc:  # noqa: BLE001 - the agent would not start
                problems.append(f"{label}: the collector cannot be built: {type(exc).__name__}: {exc}")
                continue
            lines: list[str] = []
            for k in range(5):
                hostile["on"] = at_init or k in (1, 2)
                mark = len(agent_log.records)
                body = c.collect(T0 + k, float(k))
                lines += agent_log.since(mark)
                if body is not None and (why := contract_problem("gpu", body)):
                    problems.append(f"{label}: round {k}: not publishable: {why}")
                if body is None or not any(g.get("gpu") == 1 for g in body.get("gpus", [])):
                    problems.append(f"{label}: round {k}: the whole GPU 1 is missing")
            if len(lines) > 1:
                problems.append(f"{label}: logs {lines[:3]}")
            c.close()
    assert not problems, report(problems)


@pytest.mark.parametrize("count", [2 ** 70, -1, float("nan"), "2", None])
def test_nvml_gpu_count_no_node_has_turns_the_collector_off_in_one_line(count: Any, agent_log: LogLines) -> None:
    fake = FakeNvml([load_capture(fixture_path("nvidia-smi", "linux-x86_64__nvidia-l40s__595.80.txt"))])
    fake.nvmlDeviceGetCount = lambda: count  # type: ignore[method-assign]
    c = NvmlCollector(nvml=fake)
    assert not c.enabled and "GPUs" in (c.off_reason or "")
    assert c.collect(T0, 0.0) is None and len(agent_log.records) == 1


def test_nvml_failing_while_it_starts_turns_the_collector_off_in_one_line(agent_log: LogLines) -> None:
    """A GPU fallen off the bus fails ``nvmlDeviceGetHandleByIndex``: the agent must still start."""
    fake = FakeNvml([load_capture(fixture_path("nvidia-smi", "linux-x86_64__nvidia-l40s__595.80.txt"))])

    def lost(i: int) -> Any:
        raise RuntimeError("GPU is lost")

    fake.nvmlDeviceGetHandleByIndex = lost  # type: ignore[method-assign]
    c = NvmlCollector(nvml=fake)
    assert not c.enabled and "GPU is lost" in (c.off_reason or "")
    assert len(agent_log.records) == 1


def test_kmsg_state_that_is_a_fifo_does_not_block_the_start(tmp_path: Any) -> None:
    import threading

    root = kmsg_root(tmp_path)
    state = os.path.join(root, "kmsg.state")
    os.mkfifo(state)
    src = KmsgSource(root, state)
    t = threading.Thread(target=src.available, daemon=True)
    t.start()
    t.join(5.0)
    assert not t.is_alive(), "opening the state file blocked"
    src.close()


# ---- the training socket --------------------------------------------------------------------------------------

STEP = {"v": 1, "type": "step", "job": "llama-70b-run7", "rank": 3, "pid": 4242, "time": T0 + 0.5, "step": 120,
        "duration_s": 1.25, "data_wait_s": 0.05, "compute_s": 0.9, "comm_s": 0.25, "checkpoint_s": 0.0}
CHECKPOINT = {"v": 1, "type": "checkpoint", "job": "llama-70b-run7", "rank": 3, "pid": 4242, "time": T0 + 0.7,
              "checkpoint_id": "llama-70b-run7-r3-0123456789ab", "phase": "end", "bytes": 141_733_920_768,
              "duration_s": 41.5, "path": "/lustre/ckpt/llama-70b-run7/step-120"}


def test_training_datagrams_survive_damage() -> None:
    """A hostile datagram is dropped (counted as malformed) and never takes the job's whole batch with it."""
    problems: list[str] = []
    for shape in (STEP, CHECKPOINT):
        good = json.dumps(shape, separators=(",", ":")).encode()
        cases = list(damages(good, json_text=True))
        cases += [(f"cut at byte {i}", good[:i]) for i in range(len(good))]
        cases += [(f"{k} -> {h[:20]!r}", json.dumps({**shape, k: h}).encode().replace(b'"@@', b"").replace(b'@@"', b""))
                  for k in shape for h in ("@@1e400@@", f"@@{2 ** 70}@@", "@@-1@@", "@@NaN@@", "@@-Infinity@@",
                                           "\u001b[2J", "\ud800", "x" * 5000, "@@[[[[1]]]]@@", "@@null@@")]
        if shape is STEP:  # a phase the contract says no step can hold (1.5 x duration_s + 1 s at most)
            cases += [(f"{k} past its step", json.dumps({**shape, k: 60.0}).encode())
                      for k in ("data_wait_s", "compute_s", "comm_s", "checkpoint_s")]
        for label, damaged in cases:
            if damaged in SPECIAL:
                continue
            inbox = TrainingInbox(NODE)
            whole = {**STEP, "rank": 0, "step": 7}
            inbox.feed(json.dumps(whole).encode(), uid=1000, pid=4242)
            try:
                inbox.feed(damaged, uid=1000, pid=4242)  # type: ignore[arg-type]
            except Exception as exc:  # noqa: BLE001
                problems.append(f"training {shape['type']}: {label}: {type(exc).__name__}: {exc}")
                continue
            batches = inbox.take_steps(T0 + 1)
            for msg in batches:
                try:
                    validate(msg, TOPIC_STEPS)
                    decode(encode(msg), TOPIC_STEPS)
                except (ContractError, ValueError) as exc:
                    problems.append(f"training {shape['type']}: {label}: steps not publishable: {exc}")
            if not any(s["rank"] == 0 for m in batches for s in m["steps"]):
                problems.append(f"training {shape['type']}: {label}: the whole datagram's step is lost")
            for msg in inbox.take_checkpoints():
                try:
                    validate(msg, TOPIC_CHECKPOINTS)
                    decode(encode(msg), TOPIC_CHECKPOINTS)
                except (ContractError, ValueError) as exc:
                    problems.append(f"training {shape['type']}: {label}: checkpoint not publishable: {exc}")
    assert not problems, report(problems)


# ---- the agent: one bad file does not stop the others ------------------------------------------------------------

def test_one_bad_file_does_not_stop_the_other_collectors(host_scenario: Scenario, agent_log: LogLines) -> None:
    sc = host_scenario
    write_round(sc, 0, None, None)
    disk = read_bytes(fixture_path("node_exporter", "proc", "diskstats"))
    bumped = bump_lines(disk, lambda t: True, 3, 10)
    put(os.path.join(sc.root, "proc/diskstats"), bumped(0))
    pub = MemoryPublisher()
    agent = Agent(NODE, [HostCollector(sc.root), StorageCollector(sc.root)], pub, interval=1.0)
    agent.prime()
    for k in range(1, 7):
        write_round(sc, k, "proc/stat", DIRECTORY if k >= 2 else None)  # /proc/stat unreadable from round 2
        put(os.path.join(sc.root, "proc/diskstats"), bumped(k))
        asyncio.run(agent.run_round())
    kinds = [m["kind"] for _, _, m in pub.messages]
    assert kinds.count("storage") == 6 and kinds.count("agent_health") == 6
    assert pub.invalid == 0
    assert all(math.isfinite(m["time"]) for _, _, m in pub.messages)
    assert len([r for r in agent_log.records if "/proc/stat" in r.getMessage()]) == 1
