from __future__ import annotations

import os
import shutil
import subprocess
import sys
import time

import pytest
from whywait.agents.collectors.host import _CLK_TCK, HostCollector
from whywait.agents.events import TOPIC_HOST, envelope, validate

T0 = 1_764_442_800.0


def check(body: dict | None) -> dict:
    assert body is not None
    validate(envelope("host", "node-01", T0, **body), TOPIC_HOST)
    return body


@pytest.fixture()
def proc_root(procfs_root: str, tmp_path: "os.PathLike[str]") -> str:
    """procfs's /proc/stat, meminfo and pressure files in a writable root."""
    root = str(tmp_path)
    os.makedirs(os.path.join(root, "proc"))
    for name in ("stat", "meminfo", "pressure"):
        src = os.path.join(procfs_root, "proc", name)
        (shutil.copytree if os.path.isdir(src) else shutil.copy)(src, os.path.join(root, "proc", name))
    return root


def bump_cpu(root: str, user: int, iowait: int, steal: int, idle: int) -> None:
    p = os.path.join(root, "proc/stat")
    lines = open(p).read().splitlines()
    f = lines[0].split()
    assert f[0] == "cpu"
    for k, d in ((1, user), (5, iowait), (8, steal), (4, idle)):
        f[k] = str(int(f[k]) + d)
    lines[0] = " ".join(f)
    open(p, "w").write("\n".join(lines) + "\n")


def test_cpu_memory_and_pressure_from_procfs(proc_root: str) -> None:
    c = HostCollector(proc_root)
    assert c.collect(T0, 0.0) is None
    bump_cpu(proc_root, user=600, iowait=200, steal=100, idle=100)
    body = check(c.collect(T0 + 1, 1.0))
    assert body["cpu_busy_pct"] == 70.0 and body["cpu_iowait_pct"] == 20.0 and body["cpu_steal_pct"] == 10.0
    assert body["cpu_count"] == 8
    assert body["mem_total_bytes"] == 15666184 * 1024
    assert body["cpu_pressure_some_avg10"] == 0.1 and body["mem_pressure_full_avg10"] == 0.2
    assert "loader_cpu_pct" not in body


def test_meminfo_without_memavailable(proc_root: str) -> None:
    p = os.path.join(proc_root, "proc/meminfo")
    open(p, "w").write("MemTotal: 1000 kB\nMemFree: 100 kB\nBuffers: 50 kB\nCached: 250 kB\nbad line\n")
    c = HostCollector(proc_root)
    c.collect(T0, 0.0)
    bump_cpu(proc_root, 1, 0, 0, 1)
    body = check(c.collect(T0 + 1, 1.0))
    assert body["mem_used_bytes"] == 600 * 1024 and body["mem_total_bytes"] == 1000 * 1024


def test_malformed_stat_line_is_skipped_and_counted(proc_root: str) -> None:
    with open(os.path.join(proc_root, "proc/stat"), "a") as fh:
        fh.write("cpu9 1 2 x 4\n")
    c = HostCollector(proc_root)
    c.collect(T0, 0.0)
    assert c.errors == 1 and c.enabled


def test_no_proc_stat_turns_the_collector_off(tmp_path: "os.PathLike[str]") -> None:
    c = HostCollector(str(tmp_path))
    assert c.collect(T0, 0.0) is None and not c.enabled and "/proc/stat" in (c.off_reason or "")


STAT = "{pid} (python3 worker) S {ppid} 7446 5392 34835 7446 4218880 32533 309516 26 82 {utime} {stime} " \
       "158 99 20 0 1 0 82375 56274944 1981 18446744073709551615 4194304 6294284 140736914091744 " \
       "0 0 0 0 12288 1870679807 0 0 0 17"


def write_proc(root: str, pid: int, ppid: int, ticks: int, children: list[int] | None) -> None:
    d = os.path.join(root, "proc", str(pid))
    os.makedirs(os.path.join(d, "task", str(pid)), exist_ok=True)
    open(os.path.join(d, "stat"), "w").write(STAT.format(pid=pid, ppid=ppid, utime=ticks, stime=ticks // 2) + "\n")
    if children is not None:
        open(os.path.join(d, "task", str(pid), "children"), "w").write(" ".join(map(str, children)) + " \n")


@pytest.mark.parametrize("via_children_file", [True, False])
def test_loader_cpu_from_children_of_the_training_pid(proc_root: str, via_children_file: bool) -> None:
    def tree(t: int) -> None:
        kids = via_children_file
        write_proc(proc_root, 100, 1, 10_000, [101, 102] if kids else None)
        write_proc(proc_root, 101, 100, t, [103] if kids else None)
        write_proc(proc_root, 102, 100, t, [] if kids else None)
        write_proc(proc_root, 103, 101, t, [] if kids else None)   # a worker's own helper
        write_proc(proc_root, 200, 1, 5 * t, [] if kids else None)  # not ours

    tree(1000)
    c = HostCollector(proc_root, pids=[100])
    c.collect(T0, 0.0)
    tree(1000 + 2 * _CLK_TCK)  # each process used 2 s user + 1 s system over 2 s
    bump_cpu(proc_root, 1, 0, 0, 1)
    body = check(c.collect(T0 + 2, 2.0))
    assert body["loader_cpu_pct"] == pytest.approx(3 * 150.0) and body["loader_pids"] == [100]
    assert c.children(100) == {101, 102, 103}


def test_live_on_this_machine_with_busy_loader_children() -> None:
    code = ("import multiprocessing as mp, time\n"
            "def spin():\n    t = time.time()\n    while time.time() - t < 5: pass\n"
            "if __name__ == '__main__':\n    ps = [mp.Process(target=spin) for _ in range(2)]\n"
            "    [p.start() for p in ps]; [p.join() for p in ps]\n")
    trainer = subprocess.Popen([sys.executable, "-c", code])
    try:
        time.sleep(0.5)
        c = HostCollector("/", pids=[trainer.pid])
        c.collect()
        time.sleep(1.0)
        body = check(c.collect())
        assert body["cpu_count"] >= 1 and 0 <= body["cpu_busy_pct"] <= 100
        assert body["loader_cpu_pct"] > 20.0  # two spinning workers, on however busy a machine
    finally:
        trainer.kill()
        trainer.wait()
