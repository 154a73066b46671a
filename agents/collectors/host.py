"""Host CPU, memory and pressure, and the CPU of the training job's data loaders.

Sources: ``/proc/stat`` (busy, iowait, steal), ``/proc/meminfo``,
``/proc/pressure/{cpu,memory}`` and, when the training job's PIDs are known,
the CPU time of their child processes (the data-loader workers) from
``/proc/<pid>/stat``.  Children are found through
``/proc/<pid>/task/*/children`` (``CONFIG_PROC_CHILDREN``) or, failing that, by
scanning every ``/proc/*/stat`` for its parent PID.
"""

from __future__ import annotations

import os
from typing import Any, Iterable

from whywait.agents.collectors.base import Collector, CollectorOff, parse_counter, parse_psi

_CLK_TCK = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100
_MAX_BYTES = 2 ** 63  # the contract's bound for a byte count


class HostCollector(Collector):
    """Samples ``/proc`` for a ``host`` message.

    ``pids`` are the training processes whose children's CPU is reported as
    ``loader_cpu_pct``; the agent adds the PIDs the training module reports.
    """

    name = "host"
    kind = "host"

    def __init__(self, root: str = "/", pids: Iterable[int] = ()) -> None:
        super().__init__(root)
        self.pids: set[int] = set(pids)
        self._prev_cpu: list[int] | None = None
        self._prev_loader: dict[int, int] = {}
        self._prev_mono: float | None = None
        self._children_via_task = True
        self._ncpu = 1

    # --- /proc/stat --------------------------------------------------------
    def _cpu(self) -> tuple[list[int], int]:
        text = self.read("/proc/stat")
        if text is None:
            raise CollectorOff(f"cannot read {self.path('/proc/stat')}")
        total: list[int] | None = None
        count = 0
        for line in text.splitlines():
            if not line.startswith("cpu"):
                continue
            fields = line.split()
            # Tick counters: 64-bit unsigned.  A line holding anything else (-1, 2**70, 1e400) is damaged.
            parsed = [parse_counter(v) for v in fields[1:11]]
            if any(v is None for v in parsed):
                self.errors += 1
                continue
            values = [v for v in parsed if v is not None]
            if fields[0] == "cpu":
                if len(values) < 4:
                    self.errors += 1
                    continue
                total = values + [0] * (10 - len(values))
            else:
                count += 1
        if total is None:
            raise CollectorOff(f"no readable 'cpu' line in {self.path('/proc/stat')}")
        return total, count

    def _meminfo(self) -> tuple[int, int] | None:
        """``(used, total)`` bytes from ``/proc/meminfo``; None (and ``meminfo`` off, said once) when it
        cannot be read or has no usable ``MemTotal``.

        The part is turned back on only once a usable ``MemTotal`` was read: a file that reads but stays
        damaged must not log "off" and "back on" every interval.
        """
        p = self.path("/proc/meminfo")
        try:
            with open(p, encoding="utf-8", errors="replace") as fh:
                text = fh.read()
        except OSError as exc:
            self.part_off("meminfo", f"cannot read {p}: {exc.strerror or exc}")
            return None
        kb: dict[str, int] = {}
        for line in text.splitlines():
            key, _, rest = line.partition(":")
            parts = rest.split()
            if not parts:
                continue
            v = parse_counter(parts[0])
            if v is None:
                self.errors += 1
            else:
                kb[key] = v
        total = kb.get("MemTotal", 0) * 1024
        if not 0 < total < _MAX_BYTES:  # absent, or no machine's memory (the contract's bytes bound)
            self.part_off("meminfo", f"no usable MemTotal in {p}")
            return None
        self.part_on("meminfo")
        avail = kb.get("MemAvailable")
        if avail is None:  # kernels before 3.14
            avail = kb.get("MemFree", 0) + kb.get("Buffers", 0) + kb.get("Cached", 0)
        return min(max(total - avail * 1024, 0), total), total

    # --- data-loader processes ---------------------------------------------
    def _proc_ticks(self, pid: int) -> tuple[int, int] | None:
        """``(ppid, utime+stime)`` of one process, None if it is gone or malformed."""
        try:
            with open(self.path(f"/proc/{pid}/stat"), encoding="utf-8", errors="replace") as fh:
                text = fh.read()
        except OSError:
            return None
        # The command name sits in parentheses and may hold spaces and ')'.
        rest = text[text.rfind(")") + 2:].split()
        if len(rest) < 13:
            self.errors += 1
            return None
        ppid, utime, stime = parse_counter(rest[1]), parse_counter(rest[11]), parse_counter(rest[12])
        if ppid is None or utime is None or stime is None:  # tick counters: no -1, no 2**70
            self.errors += 1
            return None
        return ppid, utime + stime

    def children(self, pid: int) -> set[int]:
        """Every descendant of ``pid`` (the loader workers and their helpers)."""
        found: set[int] = set()
        frontier = [pid]
        if self._children_via_task:
            while frontier:
                p = frontier.pop()
                try:
                    tasks = os.listdir(self.path(f"/proc/{p}/task"))
                except OSError:
                    continue
                for tid in tasks:
                    try:
                        with open(self.path(f"/proc/{p}/task/{tid}/children")) as fh:
                            kids = [int(k) for k in fh.read().split()]
                    except FileNotFoundError:
                        self._children_via_task = False  # no CONFIG_PROC_CHILDREN: scan instead
                        return self.children(pid)
                    except (OSError, ValueError):
                        continue
                    for k in kids:
                        if k not in found:
                            found.add(k)
                            frontier.append(k)
            return found
        parents: dict[int, list[int]] = {}
        try:
            entries = os.listdir(self.path("/proc"))
        except OSError:
            return found
        for name in entries:
            if not name.isdigit():
                continue
            info = self._proc_ticks(int(name))
            if info is not None:
                parents.setdefault(info[0], []).append(int(name))
        while frontier:
            for k in parents.get(frontier.pop(), ()):
                if k not in found:
                    found.add(k)
                    frontier.append(k)
        return found

    def _loader_cpu_pct(self, dt: float | None) -> float | None:
        if not self.pids:
            return None
        ticks: dict[int, int] = {}
        for pid in list(self.pids):
            if not os.path.exists(self.path(f"/proc/{pid}")):
                self.pids.discard(pid)  # the training process ended
                continue
            for child in self.children(pid):
                info = self._proc_ticks(child)
                if info is not None:
                    ticks[child] = info[1]
        used = 0
        for child, t in ticks.items():
            prev = self._prev_loader.get(child)
            if prev is not None and t >= prev:
                used += t - prev
        self._prev_loader = ticks
        if dt is None or dt <= 0:
            return None
        pct = 100.0 * used / _CLK_TCK / dt
        # No set of processes uses more than every core of the node: a damaged stat file's jump (10^21 ticks) is
        # no reading.  Twice the cores, not once: ticks are counted at 1/CLK_TCK and ``dt`` between two reads of
        # the clock, so processes busy on every core read a few percent over it (201% on 2 cores), and that
        # real reading was dropped.
        return pct if pct <= 200.0 * max(self._ncpu, os.cpu_count() or 1) else None

    # --- the sample --------------------------------------------------------
    def sample(self, now: float, mono: float) -> dict[str, Any] | None:
        cpu, count = self._cpu()
        self._ncpu = max(count, 1)
        prev, self._prev_cpu = self._prev_cpu, cpu
        dt = None if self._prev_mono is None else mono - self._prev_mono
        self._prev_mono = mono
        loader = self._loader_cpu_pct(dt)
        mem = self._meminfo()
        if prev is None or mem is None:
            return None
        # user nice system idle iowait irq softirq steal guest guest_nice; guest time is already in user.
        d = [max(c - p, 0) for c, p in zip(cpu, prev, strict=True)]
        total = sum(d[:8])
        if total <= 0:
            return None
        body: dict[str, Any] = {
            "cpu_busy_pct": round(100.0 * (total - d[3] - d[4]) / total, 3),
            "cpu_iowait_pct": round(100.0 * d[4] / total, 3),
            "cpu_steal_pct": round(100.0 * d[7] / total, 3),
            "mem_used_bytes": mem[0],
            "mem_total_bytes": mem[1],
        }
        if count:
            body["cpu_count"] = count
        psi_cpu = parse_psi(self.read("/proc/pressure/cpu", part="cpu pressure"))
        psi_mem = parse_psi(self.read("/proc/pressure/memory", part="memory pressure"))
        if "some_avg10" in psi_cpu:
            body["cpu_pressure_some_avg10"] = psi_cpu["some_avg10"]
        if "some_avg10" in psi_mem:
            body["mem_pressure_some_avg10"] = psi_mem["some_avg10"]
        if "full_avg10" in psi_mem:
            body["mem_pressure_full_avg10"] = psi_mem["full_avg10"]
        if loader is not None:
            body["loader_cpu_pct"] = round(loader, 3)
            body["loader_pids"] = sorted(self.pids)
        return body
