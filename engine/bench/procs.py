"""A child process's CPU-seconds and memory, read from the kernel (Linux ``/proc`` and ``wait4``).

Called by the harness around every run it times.  ``/proc/PID/stat`` gives CPU while the process
runs (the engine is sampled when it starts consuming and when it has caught up); ``wait4`` gives
the exact totals and the peak RSS of a process that has exited (raw consume, replay).
"""

from __future__ import annotations

import os
import subprocess
import time
from dataclasses import dataclass

_TICK = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100


@dataclass(frozen=True)
class Usage:
    """CPU-seconds (user + system) and peak resident memory (bytes) of one process."""

    cpu_s: float
    peak_rss: int


def cpu_seconds(pid: int) -> float:
    """User + system CPU-seconds ``pid`` has used so far (its threads included)."""
    with open(f"/proc/{pid}/stat", "rb") as fh:
        # The command name (field 2) may hold spaces: count fields after its closing parenthesis.
        fields = fh.read().rsplit(b")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / _TICK


def rss_bytes(pid: int) -> tuple[int, int]:
    """``(current, peak)`` resident memory of ``pid`` in bytes (VmRSS, VmHWM)."""
    cur = peak = 0
    with open(f"/proc/{pid}/status") as fh:
        for line in fh:
            if line.startswith("VmRSS:"):
                cur = int(line.split()[1]) * 1024
            elif line.startswith("VmHWM:"):
                peak = int(line.split()[1]) * 1024
    return cur, peak


def wait_usage(proc: subprocess.Popen[bytes], timeout_s: float | None = None) -> tuple[int, Usage]:
    """Wait for ``proc`` and return its exit status and exact resource usage (``wait4``).

    Past ``timeout_s`` the process is killed and :class:`subprocess.TimeoutExpired` raised.
    """
    deadline = None if timeout_s is None else time.monotonic() + timeout_s
    while True:
        # Popen.wait would reap the child and lose its rusage: poll with wait4 itself.
        pid, status, ru = os.wait4(proc.pid, os.WNOHANG)
        if pid:
            proc.returncode = os.waitstatus_to_exitcode(status)
            return proc.returncode, Usage(ru.ru_utime + ru.ru_stime, ru.ru_maxrss * 1024)
        if deadline is not None and time.monotonic() > deadline:
            proc.kill()
            proc.wait()
            raise subprocess.TimeoutExpired(proc.args, timeout_s or 0.0)
        time.sleep(0.05)


def load_average() -> float:
    """The one-minute load average (what else ran on the machine while measuring)."""
    return os.getloadavg()[0]
