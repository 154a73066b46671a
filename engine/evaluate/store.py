"""In-memory, event-time metric store fed by contract messages.

The evaluator calls :meth:`MetricStore.ingest` for every decoded message and
queries windows of it on each evaluation tick.  State is bounded by
``retention_s`` of event time.  Nothing here knows Kafka: the same store serves
the live engine, ``whywait rules test`` and replays.

Entity keys are plain strings so they serialise compactly:
rank ``"<job>:<rank>"``, GPU ``"<node>/gpu<i>"``, NIC ``"<node>/<nic>"``,
node ``"<node>"``, job ``"<job>"``.
"""

from __future__ import annotations

import bisect
import math
import statistics
from collections import defaultdict
from typing import Any, Iterable, Sequence

from whywait.engine.evaluate.steps import StepRec, StepTable

THERMAL = {"hw_thermal_slowdown", "sw_thermal_slowdown"}
POWER = {"sw_power_cap", "hw_power_brake_slowdown"}
_AGES = frozenset({"checkpoint.open_s", "step.since_last_s", "node.since_last_s"})
_JOB_FIELDS = ("duration_s", "data_wait_s", "compute_s", "comm_s", "collective_s", "pipeline_wait_s",
               "checkpoint_s")


class Series:
    """Time-ordered ``(t, value)`` points; appends are O(1) when in order, late points are inserted."""

    __slots__ = ("t", "v")

    def __init__(self) -> None:
        self.t: list[float] = []
        self.v: list[float] = []

    def add(self, t: float, v: float) -> None:
        if not self.t or t >= self.t[-1]:
            self.t.append(t)
            self.v.append(v)
        else:  # a late message: keep the series sorted
            i = bisect.bisect_right(self.t, t)
            self.t.insert(i, t)
            self.v.insert(i, v)

    def window(self, t0: float, t1: float) -> tuple[Sequence[float], Sequence[float]]:
        """Return the points with ``t0 < t <= t1`` as ``(times, values)``."""
        i = bisect.bisect_right(self.t, t0)
        j = bisect.bisect_right(self.t, t1)
        return self.t[i:j], self.v[i:j]

    def trim(self, before: float) -> None:
        i = bisect.bisect_left(self.t, before)
        if i:
            del self.t[:i]
            del self.v[:i]

    def last(self) -> float | None:
        return self.t[-1] if self.t else None


def aggregate(agg: str, times: Sequence[float], values: Sequence[float]) -> float | None:
    """Reduce a window's points with ``agg``; None when the window is empty."""
    if not values:
        return None
    if agg == "avg":
        return math.fsum(values) / len(values)
    if agg == "max":
        return max(values)
    if agg == "min":
        return min(values)
    if agg == "sum":
        return math.fsum(values)
    if agg == "count":
        return float(len(values))
    if agg == "last":
        return values[-1]
    if agg == "median":
        return statistics.median(values)
    if agg in ("p90", "p95", "p99"):
        q = int(agg[1:]) / 100
        s = sorted(values)
        return s[min(len(s) - 1, int(math.ceil(q * len(s))) - 1)]
    if agg in ("rate", "delta"):
        if len(values) < 2:
            return 0.0
        d = values[-1] - values[0]
        if agg == "delta":
            return d
        dt = times[-1] - times[0]
        return d / dt if dt > 0 else 0.0
    raise ValueError(f"unknown aggregation {agg!r}")


class MetricStore:
    """Every metric of :mod:`whywait.engine.rules.metrics`, per entity, over the last ``retention_s``."""

    def __init__(self, retention_s: float = 900.0) -> None:
        self.retention_s = retention_s
        self.series: dict[tuple[str, str], Series] = {}
        self.node_last: dict[str, float] = {}
        self.rank_last: dict[str, float] = {}
        self.nics: dict[str, set[str]] = defaultdict(set)  # node -> NIC entity keys seen
        self.nic_gpus: dict[str, tuple[int, ...]] = {}  # NIC entity key -> GPUs it serves
        self.open_checkpoints: dict[tuple[str, str], float] = {}  # (job, checkpoint id) -> start time
        # job -> checkpoint id -> [start, end or None]: ages are judged at the evaluation time, which
        # trails the newest message by the lateness, so a save that ended "later" was still open then.
        self.checkpoint_spans: dict[str, dict[str, list[float | None]]] = defaultdict(dict)
        self.node_seen: dict[str, Series] = {}  # node -> times it reported (any periodic kind)
        # Job-level metrics are the median over ranks per second of event time: steps land in
        # per-second buckets that are closed (reduced to their median) once the watermark passes.
        self._buckets: dict[tuple[str, str], dict[int, list[float]]] = defaultdict(dict)
        self.max_time = float("-inf")
        # job -> its last steps, rank by rank, for the step-aligned conditions (engine.evaluate.steps)
        self.step_tables: dict[str, StepTable] = {}
        # Job-level series are one point per job per second: keeping an hour of them costs little and
        # lets a periodic slowdown (every few minutes) show several periods.
        self.job_retention_s = max(retention_s, 3600.0)

    # ---- writing ----------------------------------------------------------------------------------

    def put(self, metric: str, entity: str, t: float, v: float) -> None:
        s = self.series.get((metric, entity))
        if s is None:
            s = self.series[(metric, entity)] = Series()
        s.add(t, v)

    def ingest(self, msg: dict[str, Any]) -> float:
        """Add one validated contract message; return its event time."""
        t = float(msg["time"])
        if t > self.max_time:
            self.max_time = t
        kind = msg["kind"]
        node = msg["node"]
        if kind in ("gpu", "net", "storage", "host"):
            self.node_last[node] = max(t, self.node_last.get(node, t))
            seen = self.node_seen.get(node)
            if seen is None:
                seen = self.node_seen[node] = Series()
            if not seen.t or seen.t[-1] != t:
                seen.add(t, 1.0)
        handler = getattr(self, f"_ingest_{kind}", None)
        if handler is not None:
            handler(msg, t, node)
        return t

    def _ingest_gpu(self, msg: dict[str, Any], t: float, node: str) -> None:
        put = self.put
        for g in msg["gpus"]:
            e = f"{node}/gpu{g['gpu']}"
            if g.get("util_pct") is not None:  # absent on MIG instances
                put("gpu.util_pct", e, t, g["util_pct"])
            if g.get("mem_util_pct") is not None:
                put("gpu.mem_util_pct", e, t, g["mem_util_pct"])
            put("gpu.temp_c", e, t, g["temp_c"])
            put("gpu.power_w", e, t, g["power_w"])
            put("gpu.sm_clock_mhz", e, t, g["sm_clock_mhz"])
            if g.get("sm_clock_max_mhz"):
                put("gpu.sm_clock_ratio", e, t, g["sm_clock_mhz"] / g["sm_clock_max_mhz"])
            if g.get("power_limit_w"):
                put("gpu.power_ratio", e, t, g["power_w"] / g["power_limit_w"])
            reasons = set(g.get("throttle_reasons") or ())
            put("gpu.thermal_throttle", e, t, 1.0 if reasons & THERMAL else 0.0)
            put("gpu.power_throttle", e, t, 1.0 if reasons & POWER else 0.0)
            for f in ("ecc_uncorrected", "ecc_corrected", "pcie_replay", "nvlink_errors"):
                if g.get(f) is not None:
                    put(f"gpu.{f}", e, t, float(g[f]))
            if g.get("remapped_rows_pending") is not None:
                put("gpu.remapped_rows_pending", e, t, 1.0 if g["remapped_rows_pending"] else 0.0)
            for code in g.get("xid") or ():  # one point per occurrence: a repeated XID counts twice
                put("gpu.xid", e, t, float(code))

    def _ingest_net(self, msg: dict[str, Any], t: float, node: str) -> None:
        put = self.put
        retrans, out = msg["tcp_retrans_segs_per_s"], msg["tcp_out_segs_per_s"]
        put("net.tcp_retrans_segs_per_s", node, t, retrans)
        put("net.tcp_out_segs_per_s", node, t, out)
        put("net.tcp_retrans_ratio", node, t, retrans / out if out > 0 else 0.0)
        if msg.get("tcp_timeouts_per_s") is not None:
            put("net.tcp_timeouts_per_s", node, t, msg["tcp_timeouts_per_s"])
        sums = dict.fromkeys(("rx_drops_per_s", "tx_drops_per_s", "rx_errors_per_s", "tx_errors_per_s",
                              "rx_bytes_per_s", "tx_bytes_per_s", "carrier_changes", "symbol_errors",
                              "xmit_wait_per_s"), 0.0)
        down = 0
        tx: list[float] = []
        for n in msg["nics"]:
            e = f"{node}/{n['nic']}"
            self.nics[node].add(e)
            if n.get("gpus"):
                self.nic_gpus[e] = tuple(n["gpus"])
            for f in sums:
                if n.get(f) is not None:
                    sums[f] += n[f]
            for f in ("rx_bytes_per_s", "tx_bytes_per_s", "rx_drops_per_s", "tx_drops_per_s", "rx_errors_per_s",
                      "xmit_wait_per_s"):
                if n.get(f) is not None:
                    put(f"nic.{f}", e, t, n[f])
            put("nic.link_up", e, t, 1.0 if n["link_up"] else 0.0)
            down += 0 if n["link_up"] else 1
            tx.append(n["tx_bytes_per_s"])
        for f, v in sums.items():
            put(f"net.{f}", node, t, v)
        put("net.links_down", node, t, float(down))
        mean_tx = sum(tx) / len(tx) if tx else 0.0
        put("net.tx_imbalance", node, t, max(tx) / mean_tx if mean_tx > 0 else 1.0)

    def _ingest_storage(self, msg: dict[str, Any], t: float, node: str) -> None:
        devs = msg["devices"]
        put = self.put
        if devs:
            put("storage.read_latency_ms", node, t, max(d["read_latency_ms"] for d in devs))
            put("storage.write_latency_ms", node, t, max(d["write_latency_ms"] for d in devs))
            put("storage.read_iops", node, t, sum(d["read_iops"] for d in devs))
            put("storage.write_iops", node, t, sum(d["write_iops"] for d in devs))
            put("storage.read_bytes_per_s", node, t, sum(d["read_bytes_per_s"] for d in devs))
            put("storage.write_bytes_per_s", node, t, sum(d["write_bytes_per_s"] for d in devs))
            put("storage.queue_depth", node, t, max(d["queue_depth"] for d in devs))
            utils = [d["util_pct"] for d in devs if d.get("util_pct") is not None]
            if utils:
                put("storage.util_pct", node, t, max(utils))
        if msg.get("io_pressure_some_avg10") is not None:
            put("storage.io_pressure", node, t, msg["io_pressure_some_avg10"])

    def _ingest_host(self, msg: dict[str, Any], t: float, node: str) -> None:
        put = self.put
        put("host.cpu_busy_pct", node, t, msg["cpu_busy_pct"])
        put("host.cpu_iowait_pct", node, t, msg["cpu_iowait_pct"])
        if msg["mem_total_bytes"]:
            put("host.mem_used_pct", node, t, 100.0 * msg["mem_used_bytes"] / msg["mem_total_bytes"])
        for src, dst in (("cpu_steal_pct", "host.cpu_steal_pct"), ("cpu_pressure_some_avg10", "host.cpu_pressure"),
                         ("mem_pressure_some_avg10", "host.mem_pressure"), ("loader_cpu_pct", "host.loader_cpu_pct")):
            if msg.get(src) is not None:
                put(dst, node, t, msg[src])

    def _ingest_hw(self, msg: dict[str, Any], t: float, node: str) -> None:
        """Hardware health (the ``hw`` topic): each list present sets its metrics; an absent list says nothing."""
        put = self.put
        # Per-lane PCIe rate in Gb/s after encoding, by generation (Gen1-2: 8b/10b; Gen3-5: 128b/130b;
        # Gen6 FLIT): a link's bandwidth is width × this.  Kept here so this method stays self-contained.
        lane = {1: 2.0, 2: 4.0, 3: 7.877, 4: 15.754, 5: 31.508, 6: 60.5}

        def _lane_gbps(gen: int) -> float:
            return lane.get(gen, 0.0)

        kernel_classes = ("mce", "pcie_aer", "pcie_aer_uncorrected", "xid", "gpu_lost", "nic_fw", "hung_task",
                          "soft_lockup", "fs_readonly", "fs_error", "io_error", "oom")
        # Hardware classes for kernel.hw_errors; corrected AER (routine in small numbers), XIDs (the GPU
        # rules read them from NVML), hung tasks, lockups and OOM (symptoms, not hardware) stay out.
        kernel_hw = ("mce", "pcie_aer_uncorrected", "gpu_lost", "nic_fw", "fs_readonly", "fs_error", "io_error")
        degraded = 0
        for link in msg.get("pcie") or ():
            lost = link["width"] == 0
            ratios = (link["width"] / link["width_max"] if link["width_max"] else 1.0,
                      link["gen"] / link["gen_max"] if link["gen_max"] else 1.0,
                      _lane_gbps(link["gen"]) * link["width"] / (_lane_gbps(link["gen_max"]) * link["width_max"])
                      if link["width_max"] and _lane_gbps(link["gen_max"]) else 1.0)
            if link["class"] == "gpu" and link.get("gpu") is not None:
                e = f"{node}/gpu{link['gpu']}"
                for name, v in zip(("gpu.pcie_width_ratio", "gpu.pcie_gen_ratio", "gpu.pcie_bandwidth_ratio"),
                                   ratios, strict=True):
                    put(name, e, t, v)
                put("gpu.pcie_width", e, t, float(link["width"]))
                put("gpu.pcie_gen", e, t, float(link["gen"]))
                put("gpu.pcie_lost", e, t, 1.0 if lost else 0.0)
                aer = sum(link.get(f) or 0 for f in ("aer_correctable", "aer_nonfatal", "aer_fatal"))
                put("gpu.pcie_aer_errors", e, t, float(aer))
                if link.get("tx_bytes_per_s") is not None or link.get("rx_bytes_per_s") is not None:
                    put("gpu.pcie_bytes_per_s", e, t,
                        float((link.get("tx_bytes_per_s") or 0.0) + (link.get("rx_bytes_per_s") or 0.0)))
                continue
            if lost or ratios[0] < 1.0 or ratios[1] < 1.0:
                degraded += 1
            for nic in link.get("nics") or ():
                e = f"{node}/{nic}"
                self.nics[node].add(e)
                for name, v in zip(("nic.pcie_width_ratio", "nic.pcie_gen_ratio", "nic.pcie_bandwidth_ratio"),
                                   ratios, strict=True):
                    put(name, e, t, v)
                put("nic.pcie_lost", e, t, 1.0 if lost else 0.0)
        if msg.get("pcie") is not None:
            put("node.pcie_links_degraded", node, t, float(degraded))
        ports = msg.get("ports")
        if ports is not None:
            # Ports of one adapter model and link layer should negotiate one speed: compare each with the
            # fastest of its kind on the node (sysfs does not say what a port supports).
            fastest: dict[tuple[str, str], float] = {}
            for p in ports:
                if p.get("speed_mbps"):
                    k = (p.get("model") or "", p.get("link_layer") or "")
                    fastest[k] = max(fastest.get(k, 0.0), p["speed_mbps"])
            worst, rdma_min, missing = 1.0, None, 0
            for p in ports:
                e = f"{node}/{p['nic']}"
                self.nics[node].add(e)
                speed = p.get("speed_mbps")
                if speed:
                    put("nic.speed_gbps", e, t, speed / 1000.0)
                    top = fastest[(p.get("model") or "", p.get("link_layer") or "")]
                    put("nic.speed_ratio", e, t, speed / top)
                    worst = min(worst, speed / top)
                    if p.get("speed_common_max_mbps"):
                        put("nic.speed_common_ratio", e, t, speed / p["speed_common_max_mbps"])
                    if p.get("rdma") and p["link_up"]:
                        rdma_min = speed / 1000.0 if rdma_min is None else min(rdma_min, speed / 1000.0)
                if p.get("rdma") and p.get("gids") is not None:
                    gone = p["link_up"] and (p["gids"] == 0 or (p.get("link_layer") == "Ethernet"
                                                                and not p.get("roce_v2_gids")))
                    put("nic.gid_missing", e, t, 1.0 if gone else 0.0)
                    missing += gone
            put("net.port_speed_ratio", node, t, worst)
            put("net.gids_missing", node, t, float(missing))
            if rdma_min is not None:
                put("net.rdma_min_gbps", node, t, rdma_min)
        kernel = msg.get("kernel")
        if kernel is not None:
            counts = dict.fromkeys(kernel_classes, 0.0)
            for ev in kernel:
                if ev["class"] in counts:
                    counts[ev["class"]] += 1.0
            for cls, n in counts.items():
                put(f"kernel.{cls}", node, t, n)
            put("kernel.hw_errors", node, t, sum(counts[c] for c in kernel_hw))
        bmc = msg.get("bmc")
        if bmc is not None:
            bad = {"fan": 0.0, "psu": 0.0, "redundancy": 0.0}
            hot = 0.0
            inlet: list[float] = []
            exhaust: list[float] = []
            power = 0.0
            for sns in bmc:
                kind, ok = sns["type"], sns["health"] in ("ok", "unknown")
                if kind in bad and not ok:
                    bad[kind] += 1.0
                if kind == "temperature":
                    hot += 0.0 if ok else 1.0
                    if sns.get("reading") is not None:
                        if sns.get("context") == "inlet":
                            inlet.append(sns["reading"])
                        elif sns.get("context") == "exhaust":
                            exhaust.append(sns["reading"])
                if kind == "power" and sns.get("reading") is not None:
                    power += sns["reading"]
            put("bmc.fans_failed", node, t, bad["fan"])
            put("bmc.psus_failed", node, t, bad["psu"])
            put("bmc.redundancy_lost", node, t, bad["redundancy"])
            put("bmc.temps_over_threshold", node, t, hot)
            if inlet:
                put("bmc.inlet_temp_c", node, t, max(inlet))
            if exhaust:
                put("bmc.exhaust_temp_c", node, t, max(exhaust))
            if power:
                put("bmc.power_w", node, t, power)
        for h in msg.get("nvml") or ():
            e = f"{node}/gpu{h['gpu']}"
            put("gpu.nvml_unresponsive", e, t, 0.0 if h["responsive"] else 1.0)
            put("gpu.nvml_latency_ms", e, t, h["latency_ms"])
            put("gpu.nvml_errors", e, t, float(h["errors"]))
            put("gpu.nvml_timeouts", e, t, float(h["timeouts"]))

    def _ingest_steps(self, msg: dict[str, Any], t: float, node: str) -> None:
        job = msg["job"]
        put = self.put
        sec = int(t)
        table = self.step_tables.get(job)
        if table is None:
            table = self.step_tables[job] = StepTable()
        for s in msg["steps"]:
            e = f"{job}:{s['rank']}"
            self.rank_last[e] = max(t, self.rank_last.get(e, t))
            dur = s["duration_s"]
            if s.get("comm_s") is None and (s.get("collective_s") is not None or s.get("pipeline_wait_s") is not None):
                s = {**s, "comm_s": (s.get("collective_s") or 0.0) + (s.get("pipeline_wait_s") or 0.0)}
            ended = s.get("ended_at")
            # A step's own end time when the producer gives it (several steps per message), else the
            # message's time; never later than the message, so a bad clock cannot run ahead of it.
            t_end = min(float(ended), t) if ended is not None else t
            table.add(int(s["step"]), int(s["rank"]), StepRec(
                t_end, float(dur), *(None if s.get(f) is None else float(s[f]) for f in
                                     ("data_wait_s", "compute_s", "comm_s", "collective_s", "pipeline_wait_s",
                                      "checkpoint_s"))))
            for f in _JOB_FIELDS:
                v = s.get(f)
                if v is None:  # an absent phase is unknown, not zero: no point at all
                    continue
                put(f"step.{f}", e, t, v)
                self._buckets[(job, f)].setdefault(sec, []).append(v)
            if dur > 0:
                for f, share in (("data_wait_s", "data_wait_share"), ("comm_s", "comm_share"),
                                 ("compute_s", "compute_share")):
                    if s.get(f) is not None:
                        self._buckets[(job, share)].setdefault(sec, []).append(s[f] / dur)

    def _ingest_checkpoint(self, msg: dict[str, Any], t: float, node: str) -> None:
        job, cid, phase = msg["job"], msg["checkpoint_id"], msg["phase"]
        spans = self.checkpoint_spans[job]
        if phase == "start":
            self.open_checkpoints[(job, cid)] = t
            spans[cid] = [t, None]
            while len(spans) > 8:  # the recent saves are enough to judge what is open now
                del spans[next(iter(spans))]
            return
        start = self.open_checkpoints.pop((job, cid), None)
        if cid in spans:
            spans[cid][1] = t
        if phase == "end":
            dur = msg.get("duration_s")
            if dur is None and start is not None:
                dur = t - start
            if dur is not None:
                self.put("checkpoint.duration_s", job, t, float(dur))
        elif phase == "failed":
            self.put("checkpoint.failed", job, t, 1.0)

    # ---- time -------------------------------------------------------------------------------------

    def close_buckets(self, watermark: float) -> None:
        """Reduce every per-second job bucket that ends at or before ``watermark`` to its median."""
        for (job, f), buckets in self._buckets.items():
            done = [sec for sec in buckets if sec + 1 <= watermark]
            for sec in sorted(done):
                vals = buckets.pop(sec)
                name = f"job.{f}"
                self.put(name, job, sec + 1.0, statistics.median(vals))

    def trim(self, now: float) -> None:
        """Forget points older than the retention; called by the evaluator now and then."""
        cutoff = now - self.retention_s
        job_cutoff = now - self.job_retention_s
        for key, s in list(self.series.items()):
            s.trim(job_cutoff if key[0].startswith("job.") else cutoff)
            if not s.t:  # an entity gone for the whole retention (a finished job's ranks): forget it
                del self.series[key]
        for s in self.node_seen.values():
            s.trim(cutoff)
        for job, table in list(self.step_tables.items()):
            if table.newest_t < cutoff:  # a finished job: forget its steps
                del self.step_tables[job]

    # ---- reading ----------------------------------------------------------------------------------

    def window(self, metric: str, entity: str, t0: float, t1: float) -> tuple[Sequence[float], Sequence[float]]:
        """The points of ``metric`` for ``entity`` with ``t0 < t <= t1``.

        Ages (``checkpoint.open_s``, ``step.since_last_s``, ``node.since_last_s``) are not stored:
        they are one point computed at ``t1``.
        """
        if metric in _AGES:
            v = self.age(metric, entity, t1)
            return ((t1,), (v,)) if v is not None else ((), ())
        s = self.series.get((metric, entity))
        return s.window(t0, t1) if s is not None else ((), ())

    def age(self, metric: str, entity: str, now: float) -> float | None:
        """Seconds at ``now`` since the entity last reported, or since its oldest open checkpoint began."""
        if metric == "checkpoint.open_s":
            spans = self.checkpoint_spans.get(entity)
            starts = [s for s, e in (spans or {}).values() if s is not None and s <= now and (e is None or e > now)]
            return now - min(starts) if starts else None
        # The last report at or before ``now``: messages up to the lateness ahead are already stored.
        seen = self.series.get(("step.duration_s", entity)) if metric == "step.since_last_s" else \
            self.node_seen.get(entity)
        if seen is None or not seen.t:
            return None
        i = bisect.bisect_right(seen.t, now)
        if i == 0:
            return None
        return now - seen.t[i - 1]

    def span(self, metric: str, entity: str, now: float, window_s: float, min_points: int = 0) -> float:
        """The window length to use at ``now``: ``window_s``, or longer to hold the last ``min_points`` points.

        Lets a rule count its window in steps as well as seconds ("whichever is longer"): a job
        with 45 s steps has no step in most 5 s windows.
        """
        if min_points <= 0 or metric in _AGES:
            return window_s
        s = self.series.get((metric, entity))
        if s is None or not s.t:
            return window_s
        j = bisect.bisect_right(s.t, now)
        if j < min_points:
            return window_s if j == 0 else max(window_s, now - s.t[0] + 1e-6)
        return max(window_s, now - s.t[j - min_points] + 1e-6)

    def value(self, metric: str, entity: str, agg: str, now: float, window_s: float) -> float | None:
        """The ``agg`` of ``metric`` for ``entity`` over ``(now - window_s, now]``, or None if no data."""
        times, values = self.window(metric, entity, now - window_s, now)
        return aggregate(agg, times, values)

    def nic_entities(self, nodes: Iterable[str]) -> list[str]:
        return sorted(e for n in nodes for e in self.nics.get(n, ()))
