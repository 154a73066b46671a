from __future__ import annotations

import os
import shutil
import time

import pytest
from whywait.agents.collectors.storage import StorageCollector
from whywait.agents.events import TOPIC_STORAGE, envelope, validate

from tests.agents.conftest import fixture_path

T0 = 1_764_442_800.0


def check(body: dict | None) -> dict:
    assert body is not None
    validate(envelope("storage", "node-01", T0, **body), TOPIC_STORAGE)
    return body


def bump_disk(path: str, name: str, deltas: dict[int, int]) -> None:
    """Add ``deltas`` (column index after the name → increase) to device ``name``'s line."""
    out = []
    for line in open(path).read().splitlines():
        f = line.split()
        if len(f) > 2 and f[2] == name:
            for k, d in deltas.items():
                f[3 + k] = str(int(f[3 + k]) + d)
            line = " ".join(f)
        out.append(line)
    open(path, "w").write("\n".join(out) + "\n")


@pytest.fixture()
def disk_root(tmp_path: "os.PathLike[str]") -> str:
    """node_exporter's /proc/diskstats (14, 18 and 20 columns) alone in a root."""
    root = str(tmp_path)
    os.makedirs(os.path.join(root, "proc"))
    shutil.copy(fixture_path("node_exporter", "proc", "diskstats"), os.path.join(root, "proc", "diskstats"))
    return root


def test_every_diskstats_layout(disk_root: str) -> None:
    c = StorageCollector(disk_root)
    assert c.collect(T0, 0.0) is None
    p = os.path.join(disk_root, "proc/diskstats")
    # reads, sectors read, ms reading, writes, sectors written, ms writing, ms doing I/O, weighted ms
    bump_disk(p, "sda", {0: 100, 2: 2048, 3: 500, 4: 50, 6: 1024, 7: 100, 9: 400, 10: 1200})  # 14 columns
    bump_disk(p, "sdb", {0: 10, 3: 30})                                                    # 18 columns
    bump_disk(p, "sdc", {4: 8, 7: 80})                                                     # 20 columns
    devs = {d["device"]: d for d in check(c.collect(T0 + 1, 1.0))["devices"]}
    assert c.errors == 0
    assert {"sda", "sdb", "sdc", "vda", "nvme0n1", "mmcblk0", "dm-0"} <= set(devs)
    assert not {"sda1", "nvme0n1p1", "mmcblk0p1", "loop0", "ram0", "sr0", "fd0", "vda1"} & set(devs)
    sda = devs["sda"]
    assert sda["read_iops"] == 100.0 and sda["read_bytes_per_s"] == 2048 * 512.0
    assert sda["read_latency_ms"] == 5.0 and sda["write_latency_ms"] == 2.0
    assert sda["write_bytes_per_s"] == 1024 * 512.0 and sda["util_pct"] == 40.0 and sda["queue_depth"] == 1.2
    assert devs["sdb"]["read_latency_ms"] == 3.0 and devs["sdc"]["write_latency_ms"] == 10.0


def test_procfs_diskstats_with_sys_block(procfs_root: str) -> None:
    c = StorageCollector(procfs_root)
    c.collect(T0, 0.0)
    body = check(c.collect(T0 + 1, 1.0))
    names = {d["device"] for d in body["devices"]}
    assert {"sda", "sdb", "sdc", "dm-0", "dm-1"} <= names and "sda1" not in names
    assert body["io_pressure_some_avg10"] == 0.1 and body["io_pressure_full_avg10"] == 0.2


def test_malformed_diskstats_lines_are_skipped_and_counted(disk_root: str) -> None:
    p = os.path.join(disk_root, "proc/diskstats")
    with open(p, "a") as fh:
        fh.write("   8  64 sde 1 2 3\n   8  80 sdf 1 2 x 4 5 6 7 8 9 10 11\n")
    c = StorageCollector(disk_root)
    c.collect(T0, 0.0)
    body = check(c.collect(T0 + 1, 1.0))
    assert c.errors == 4 and "sda" in {d["device"] for d in body["devices"]}


def bump_nfs_op(path: str, mount: str, op: str, deltas: dict[int, int]) -> None:
    out, inside = [], False
    for line in open(path).read().splitlines():
        if line.startswith("device "):
            inside = f" mounted on {mount} " in line
        elif inside and line.strip().startswith(op + ":"):
            head, rest = line.split(":", 1)
            v = [int(x) for x in rest.split()]
            for k, d in deltas.items():
                v[k] += d
            line = head + ": " + " ".join(map(str, v))
        out.append(line)
    open(path, "w").write("\n".join(out) + "\n")


def test_nfs_per_op_round_trips_and_errors(tmp_path: "os.PathLike[str]") -> None:
    root = str(tmp_path)
    os.makedirs(os.path.join(root, "proc/10"))
    p = os.path.join(root, "proc/10/mountstats")
    shutil.copy(fixture_path("node_exporter", "proc", "10", "mountstats"), p)
    c = StorageCollector(root, pid=10)
    assert c.collect(T0, 0.0) is None
    # READ: ops, trans, timeouts, sent, received, queue ms, rtt ms, execute ms
    bump_nfs_op(p, "/mnt/nfs/test", "READ", {0: 20, 1: 22, 2: 1, 4: 20 << 20, 6: 400, 7: 500})
    devs = {d["device"]: d for d in check(c.collect(T0 + 2, 2.0))["devices"]}
    assert set(devs) == {"nfs:/mnt/nfs/test", "nfs:/mnt/nfs/test-dupe"}
    n = devs["nfs:/mnt/nfs/test"]
    assert n["read_iops"] == 10.0 and n["read_bytes_per_s"] == float(10 << 20)
    assert n["read_rtt_ms"] == 20.0 and n["read_latency_ms"] == 25.0
    assert n["nfs_timeouts"] == 1 and n["nfs_retransmissions"] == 2 and n["queue_depth"] == 0.25


def test_no_nfs_and_no_lustre_turn_only_those_parts_off(disk_root: str) -> None:
    c = StorageCollector(disk_root, pid=424242)
    c.collect(T0, 0.0)
    assert c.enabled and "nfs" in c.parts_off and "lustre" in c.parts_off


def llite_stats(root: str, extra: dict[str, tuple[int, int]] | None = None) -> str:
    """The llite section of lustrefs-exporter's capture as a client stats file, optionally with more samples."""
    text = open(fixture_path("lustre", "llite_client.txt")).read()
    section = text.split("llite.ai400x2-ff47bce9ca35d800.stats=\n", 1)[1]
    lines = []
    for line in section.splitlines():
        f = line.split()
        if f and extra and f[0] in extra and len(f) > 6:
            n, s = extra[f[0]]
            f[1] = str(int(f[1]) + n)
            f[6] = str(int(f[6]) + s)
            line = " ".join(f)
        lines.append(line)
    if extra:
        for name, (n, s) in extra.items():
            if not any(line.split()[:1] == [name] for line in lines):
                unit = "bytes" if name.endswith("_bytes") else "usecs"
                lines.append(f"{name} {n} samples [{unit}] 1 {s} {s} {s * s}")
    d = os.path.join(root, "sys/kernel/debug/lustre/llite/ai400x2-ff47bce9ca35d800")
    os.makedirs(d, exist_ok=True)
    open(os.path.join(d, "stats"), "w").write("\n".join(lines) + "\n")
    return d


def test_lustre_client_stats(tmp_path: "os.PathLike[str]") -> None:
    root = str(tmp_path)
    llite_stats(root, {"read_bytes": (0, 0)})
    c = StorageCollector(root)
    c.collect(T0, 0.0)
    llite_stats(root, {"read_bytes": (50, 50 << 20), "read": (50, 100_000), "open": (1000, 2_000_000)})
    dev = check(c.collect(T0 + 1, 1.0))["devices"][0]
    assert dev["device"] == "lustre:ai400x2-ff47bce9ca35d800"
    assert dev["read_iops"] == 50.0 and dev["read_bytes_per_s"] == float(50 << 20)
    assert dev["read_latency_ms"] == 2.0
    assert dev["metadata_ops_per_s"] == 1000.0 and dev["metadata_latency_ms"] == 2.0


def test_live_on_this_machine() -> None:
    c = StorageCollector("/")
    c.collect()
    time.sleep(0.2)
    body = check(c.collect())
    assert c.enabled and all(d["read_iops"] >= 0 and d["write_iops"] >= 0 for d in body["devices"])
