"""Block devices, NFS mounts, Lustre clients and I/O pressure.

Sources:

* ``/proc/diskstats``: every kernel's layout (14 fields before 4.18, 18 with the
  discard columns, 20 with the flush columns).  Whole devices only: partitions,
  ``loop``, ``ram`` and ``zram`` are left out (their I/O is already in the disk).
* ``/proc/<pid>/mountstats`` (``self`` by default): one record per NFS mount,
  from the ``READ``/``WRITE`` per-op lines (ops, bytes, round trip, execute
  time, errors), named ``nfs:<mount point>``.
* Lustre ``llite`` stats (``/sys/kernel/debug/lustre/llite/*/stats`` or
  ``/proc/fs/lustre/llite/*/stats``), named ``lustre:<instance>``.
* ``/proc/pressure/io``.
"""

from __future__ import annotations

import glob
import os
import re
from typing import Any

from whywait.agents.collectors.base import Collector, CollectorOff, parse_counter, parse_psi
from whywait.agents.events import UNIT_BOUNDS
from whywait.agents.rates import RateTracker

_SKIP_DEV = re.compile(r"^(loop|ram|zram|fd|sr)\d+$")
_PARTITION = re.compile(r"^((sd|hd|vd|xvd)[a-z]+\d+|(nvme\d+n\d+|mmcblk\d+|md\d+)p\d+)$")
_SECTOR = 512
# The highest rates the contract takes (ops/s, bytes/s; sectors are 512 bytes).  A counter that jumps
# further in one interval (a damaged file, then the whole one again) gives no rate that interval.
_MAX_OPS = UNIT_BOUNDS["ops/s"][1]
_MAX_SECTORS = UNIT_BOUNDS["bytes/s"][1] / _SECTOR
_LUSTRE_GLOBS = ("/sys/kernel/debug/lustre/llite/*/stats", "/proc/fs/lustre/llite/*/stats")
# Lustre metadata operations whose latency a data loader opening many small files feels.
_LUSTRE_META = ("open", "close", "getattr", "statfs", "readdir", "setattr", "inode_permission")


class StorageCollector(Collector):
    """Samples block devices, NFS and Lustre mounts for a ``storage`` message.

    ``pid`` names whose ``/proc/<pid>/mountstats`` to read (mount namespaces
    differ; the agent's own is right when it runs in the host's namespace).
    """

    name = "storage"
    kind = "storage"

    def __init__(self, root: str = "/", pid: str | int = "self") -> None:
        super().__init__(root)
        self.pid = pid
        self.rates = RateTracker()
        self._prev_mono: float | None = None
        try:  # unreadable (permission denied) is as absent: partitions are then told by their names
            self._sys_block: set[str] | None = set(os.listdir(self.path("/sys/block")))
        except OSError:
            self._sys_block = None

    # --- /proc/diskstats ---------------------------------------------------
    def _whole_disk(self, name: str) -> bool:
        if _SKIP_DEV.match(name):
            return False
        if self._sys_block is not None:
            return name in self._sys_block
        return not _PARTITION.match(name)

    def _diskstats(self, mono: float, dt: float | None) -> list[dict[str, Any]]:
        text = self.read("/proc/diskstats", part="diskstats")
        if text is None:
            return []
        out = []
        for line in text.splitlines():
            f = line.split()
            if not f:
                continue
            if len(f) not in (14, 18, 20):
                self.errors += 1
                continue
            name = f[2]
            parsed = [parse_counter(x) for x in f[3:14]]  # 64-bit unsigned counters: no -1, no 2**70
            if any(x is None for x in parsed):
                self.errors += 1
                continue
            v = [x for x in parsed if x is not None]
            if not self._whole_disk(name):
                continue
            u = self.rates.update
            reads = u((name, "reads"), v[0], mono, max_rate=_MAX_OPS)
            rsect = u((name, "rsect"), v[2], mono, max_rate=_MAX_SECTORS)
            rms = u((name, "rms"), v[3], mono)
            writes = u((name, "writes"), v[4], mono, max_rate=_MAX_OPS)
            wsect = u((name, "wsect"), v[6], mono, max_rate=_MAX_SECTORS)
            wms = u((name, "wms"), v[7], mono)
            busy = u((name, "io_ms"), v[9], mono)
            weighted = u((name, "weighted_ms"), v[10], mono)
            if dt is None or not reads.ok:
                continue
            out.append({
                "device": name,
                "read_iops": _r(reads.per_s),
                "write_iops": _r(writes.per_s),
                "read_bytes_per_s": _r((rsect.per_s or 0.0) * _SECTOR),
                "write_bytes_per_s": _r((wsect.per_s or 0.0) * _SECTOR),
                "read_latency_ms": _ratio(rms.delta, reads.delta),
                "write_latency_ms": _ratio(wms.delta, writes.delta),
                "queue_depth": _r((weighted.delta or 0) / (dt * 1000.0)),
                "util_pct": _r(min(100.0, (busy.delta or 0) / (dt * 10.0))),
                "in_flight": v[8],
            })
        return out

    # --- NFS ---------------------------------------------------------------
    def _nfs(self, mono: float, dt: float | None) -> list[dict[str, Any]]:
        text = self.read(f"/proc/{self.pid}/mountstats", part="nfs")
        if text is None:
            return []
        mounts: dict[str, dict[str, list[int]]] = {}
        current: dict[str, list[int]] | None = None
        for line in text.splitlines():
            if line.startswith("device "):
                m = re.match(r"device (\S+) mounted on (\S+) with fstype (nfs\d?)\b", line)
                current = None
                if m:
                    current = {}
                    mounts[m.group(2)] = current  # a later mount on the same point hides the earlier
                continue
            if current is None:
                continue
            op, sep, rest = line.strip().partition(":")
            if not sep or op not in ("READ", "WRITE", "bytes") and not op.isupper():
                continue
            values = [parse_counter(x) for x in rest.split()]  # counters: no -1, no 2**70
            if any(x is None for x in values):
                self.errors += 1
                continue
            current[op] = [x for x in values if x is not None]
        out = []
        for mnt, ops in mounts.items():
            rec = self._nfs_mount(mnt, ops, mono, dt)
            if rec is not None:
                out.append(rec)
        return out

    def _nfs_mount(self, mnt: str, ops: dict[str, list[int]], mono: float, dt: float | None) -> dict[str, Any] | None:
        # Per-op fields: ops, transmissions, major timeouts, bytes sent, bytes received,
        # queue time (ms), round-trip time (ms), execute time (ms)[, errors (kernel 5.3+)].
        key = f"nfs:{mnt}"
        u = self.rates.update
        d: dict[str, Any] = {}
        for op in ("READ", "WRITE"):
            f = ops.get(op, [])
            if len(f) < 8:
                f = (f + [0] * 8)[:8]
            # ops (0) and bytes (3, 4) bounded by the contract's rates; the rest only feed per-op averages.
            d[op] = [u((key, op, i), f[i], mono, max_rate=_MAX_SECTORS * _SECTOR if i in (3, 4) else
                       _MAX_OPS if i == 0 else None) for i in range(8)]
        totals = [0] * 4  # execute ms, errors, timeouts, retransmissions across every op
        for op, f in ops.items():
            if op == "bytes" or len(f) < 8:
                continue
            totals[0] += f[7]
            totals[1] += f[8] if len(f) > 8 else 0
            totals[2] += f[2]
            totals[3] += max(f[1] - f[0], 0)
        tot = [u((key, "total", i), v, mono) for i, v in enumerate(totals)]
        rd, wr = d["READ"], d["WRITE"]
        if dt is None or not rd[0].ok:
            return None
        return {
            "device": key,
            "read_iops": _r(rd[0].per_s),
            "write_iops": _r(wr[0].per_s),
            "read_bytes_per_s": _r(rd[4].per_s),
            "write_bytes_per_s": _r(wr[3].per_s),
            "read_latency_ms": _ratio(rd[7].delta, rd[0].delta),
            "write_latency_ms": _ratio(wr[7].delta, wr[0].delta),
            "read_rtt_ms": _ratio(rd[6].delta, rd[0].delta),
            "write_rtt_ms": _ratio(wr[6].delta, wr[0].delta),
            "queue_depth": _r((tot[0].delta or 0) / (dt * 1000.0)),
            "nfs_errors": tot[1].delta or 0,
            "nfs_timeouts": tot[2].delta or 0,
            "nfs_retransmissions": tot[3].delta or 0,
        }

    # --- Lustre ------------------------------------------------------------
    def _lustre(self, mono: float, dt: float | None) -> list[dict[str, Any]]:
        paths: list[str] = []
        for pattern in _LUSTRE_GLOBS:
            paths.extend(glob.glob(self.path(pattern)))
        if not paths:
            self.part_off("lustre", "no Lustre client (no llite stats)")
            return []
        out = []
        for p in sorted(paths):
            instance = os.path.basename(os.path.dirname(p))
            try:
                with open(p, encoding="utf-8", errors="replace") as fh:
                    text = fh.read()
            except OSError as exc:
                self.part_off(f"lustre {instance}", f"cannot read {p}: {exc.strerror or exc}")
                continue
            rec = self._lustre_stats(f"lustre:{instance}", text, mono, dt)
            if rec is not None:
                out.append(rec)
        return out

    def _lustre_stats(self, key: str, text: str, mono: float, dt: float | None) -> dict[str, Any] | None:
        # "<name> <samples> samples [<unit>] [<min> <max> <sum> [<sumsq>]]"
        stats: dict[str, tuple[int, int]] = {}
        for line in text.splitlines():
            f = line.split()
            if len(f) < 3 or f[2] != "samples":
                continue
            n, total = parse_counter(f[1]), parse_counter(f[6]) if len(f) > 6 else 0
            if n is None or total is None:  # counters: no -1, no 2**70
                self.errors += 1
                continue
            stats[f[0]] = (n, total)
        u = self.rates.update

        def pair(name: str) -> tuple[Any, Any]:
            n, s = stats.get(name, (0, 0))
            top = _MAX_SECTORS * _SECTOR if name.endswith("_bytes") else None
            return u((key, name, "n"), n, mono, max_rate=_MAX_OPS), u((key, name, "sum"), s, mono, max_rate=top)

        rb_n, rb_sum = pair("read_bytes")
        wb_n, wb_sum = pair("write_bytes")
        r_n, r_us = pair("read")      # Lustre 2.15+: read/write latency in usecs
        w_n, w_us = pair("write")
        meta_n = meta_us = 0
        for op in _LUSTRE_META:
            n, s = stats.get(op, (0, 0))
            meta_n += n
            meta_us += s
        m_n = u((key, "meta", "n"), meta_n, mono, max_rate=_MAX_OPS)
        m_us = u((key, "meta", "sum"), meta_us, mono)
        if dt is None or not rb_n.ok:
            return None
        return {
            "device": key,
            "read_iops": _r(rb_n.per_s),
            "write_iops": _r(wb_n.per_s),
            "read_bytes_per_s": _r(rb_sum.per_s),
            "write_bytes_per_s": _r(wb_sum.per_s),
            "read_latency_ms": _ratio(r_us.delta, r_n.delta, 1e-3),
            "write_latency_ms": _ratio(w_us.delta, w_n.delta, 1e-3),
            "queue_depth": _r(((r_us.delta or 0) + (w_us.delta or 0) + (m_us.delta or 0)) / (dt * 1e6)),
            "metadata_ops_per_s": _r(m_n.per_s),
            "metadata_latency_ms": _ratio(m_us.delta, m_n.delta, 1e-3),
        }

    # --- the sample --------------------------------------------------------
    def sample(self, now: float, mono: float) -> dict[str, Any] | None:
        dt = None if self._prev_mono is None else mono - self._prev_mono
        self._prev_mono = mono
        devices = self._diskstats(mono, dt) + self._nfs(mono, dt) + self._lustre(mono, dt)
        psi = parse_psi(self.read("/proc/pressure/io", part="io pressure"))
        self.rates.forget_missing()
        if len(self.parts_off) >= 2 and "diskstats" in self.parts_off and "nfs" in self.parts_off \
                and "lustre" in self.parts_off:
            raise CollectorOff("no /proc/diskstats, no NFS mountstats and no Lustre client")
        if dt is None:
            return None
        body: dict[str, Any] = {"interval_s": round(dt, 6), "devices": devices}
        if "some_avg10" in psi:
            body["io_pressure_some_avg10"] = psi["some_avg10"]
        if "full_avg10" in psi:
            body["io_pressure_full_avg10"] = psi["full_avg10"]
        return body


def _r(x: float | None) -> float:
    return 0.0 if x is None else round(x, 3)


def _ratio(num: int | None, den: int | None, scale: float = 1.0) -> float:
    """Average per operation (ms); 0 when nothing completed in the interval."""
    if not num or not den:
        return 0.0
    return round(num * scale / den, 3)
