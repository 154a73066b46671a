"""The metrics a rule may name, the level each lives at, and its unit: one catalogue.

Most metrics are *declared* in the event contract (``agents/events.py``): a field with a
``measure=`` is stored per entity of its record (a GPU, a NIC, a block device or mount, a
rank) or per node, plus the node roll-ups it declares.  :func:`catalogue` reads those
declarations, so a field declared there is stored by :class:`whywait.engine.evaluate.store.MetricStore`,
listed by ``whywait rules metrics`` and accepted by the rule schema without touching this file.

The rest (:data:`DERIVED`) are computed by the store from several fields or from state (a
ratio, a throttle reason, a job's median over its ranks, an age); each is declared here and
computed in the store's derivation for its topic.  A metric's *level* decides which entities a
condition compares: a job's ranks, its GPUs, its nodes, their NICs or block devices and mounts,
or the job as a whole.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal, cast

from whywait.agents import events

Level = Literal["rank", "gpu", "node", "nic", "device", "job"]


@dataclass(frozen=True)
class Metric:
    """A metric's name, level and unit; ``occurrences``: one point per event, its code as the value (XIDs)."""

    name: str
    level: Level
    unit: str
    doc: str
    occurrences: bool = False


def _m(level: Level, unit: str, *names_docs: tuple[str, str]) -> list[Metric]:
    return [Metric(n, level, unit, d) for n, d in names_docs]


def catalogue(topics: tuple[events.Topic, ...] | None = None) -> dict[str, Metric]:
    """The metrics the contract's ``measure=`` declarations make (``topics`` defaults to the contract's)."""
    out: dict[str, Metric] = {}

    def add(m: Metric) -> None:
        if m.name in out:
            raise ValueError(f"metric {m.name!r} declared twice in the event contract")
        out[m.name] = m

    for topic, list_name, rec, f, meas in events.measured(topics):
        level = rec.entity if list_name is not None else ("node" if topic.key == "node id" else "job")
        if meas.metric is not None:
            add(Metric(meas.metric, cast(Level, level), meas.unit or f.unit, meas.doc, meas.each))
        for r in meas.rollups:
            add(Metric(r.metric, "node", meas.unit or f.unit, r.doc))
    return out


# Computed by the store from several fields or from its own state: declared here, computed in the
# derivation of their topic in engine/evaluate/store.py.
DERIVED: list[Metric] = [
    # Per rank.
    *_m("rank", "s",
        ("step.work_s", "a rank's own time per step: compute plus input wait (step-aligned conditions)")),
    *_m("rank", "s", ("step.since_last_s", "seconds since the rank last reported a step (absence)")),
    # Per node, from its ranks' step ends against the job's (the clock_offset condition's evidence).
    *_m("node", "s", ("step.end_offset_s", "seconds a node's ranks end their steps away from the job's other "
                                           "ranks (clock_offset)")),
    # Per job: the median over its ranks, per second of event time.
    *_m("job", "s",
        ("job.duration_s", "the job's median step time"),
        ("job.data_wait_s", "the job's median data wait per step"),
        ("job.compute_s", "the job's median compute per step"),
        ("job.comm_s", "the job's median communication wait per step"),
        ("job.checkpoint_s", "the job's median checkpoint time per step"),
        ("job.collective_s", "the job's median collective time per step"),
        ("job.pipeline_wait_s", "the job's median pipeline wait per step"),
        ("job.step_s", "the job's step time now, against its what-if step time (what_if condition)")),
    *_m("job", "ratio",
        ("job.data_wait_share", "share of step time spent waiting on data"),
        ("job.comm_share", "share of step time spent communicating"),
        ("job.compute_share", "share of step time spent computing")),
    *_m("job", "s", ("checkpoint.duration_s", "duration of each completed checkpoint save"),
        ("checkpoint.open_s", "age of the oldest checkpoint save still running")),
    *_m("job", "count", ("checkpoint.failed", "checkpoint saves that failed")),
    # Per GPU.
    *_m("gpu", "ratio", ("gpu.sm_clock_ratio", "SM clock over its maximum"),
        ("gpu.power_ratio", "power draw over its limit")),
    *_m("gpu", "bool", ("gpu.thermal_throttle", "a thermal clock-event reason is active"),
        ("gpu.power_throttle", "a power clock-event reason is active")),
    # Per node: network.
    *_m("node", "ratio", ("net.tcp_retrans_ratio", "retransmitted over sent TCP segments")),
    *_m("node", "count", ("net.links_down", "NICs whose link is down")),
    *_m("node", "ratio", ("net.tx_imbalance", "busiest NIC's transmit over the mean of the node's NICs")),
    *_m("node", "%", ("host.mem_used_pct", "memory in use")),
    *_m("node", "s", ("node.since_last_s", "seconds since the node last reported (absence)")),
    # Hardware health, from the hw topic (fail-slow faults).
    *_m("gpu", "ratio", ("gpu.pcie_width_ratio", "PCIe link width negotiated over the maximum"),
        ("gpu.pcie_gen_ratio", "PCIe link generation negotiated over the maximum (drops at idle by design)"),
        ("gpu.pcie_bandwidth_ratio", "PCIe link bandwidth now (width × per-lane rate) over at the maximum")),
    *_m("gpu", "lanes", ("gpu.pcie_width", "PCIe link width negotiated")),
    *_m("gpu", "generation", ("gpu.pcie_gen", "PCIe link generation negotiated")),
    *_m("gpu", "bool", ("gpu.pcie_lost", "the GPU vanished from the PCI bus (fallen off the bus)"),
        ("gpu.nvml_unresponsive", "an NVML call on the GPU timed out and has not returned")),
    *_m("gpu", "count", ("gpu.pcie_aer_errors", "PCIe AER errors on the GPU's link (corrected and not)"),
        ("gpu.nvml_errors", "NVML calls on the GPU that failed"),
        ("gpu.nvml_timeouts", "NVML calls on the GPU that did not return in time")),
    *_m("gpu", "ms", ("gpu.nvml_latency_ms", "the slowest NVML call on the GPU in the interval")),
    *_m("gpu", "bytes/s", ("gpu.pcie_bytes_per_s", "PCIe throughput of the GPU, both directions (NVML)")),
    *_m("nic", "ratio", ("nic.pcie_width_ratio", "the adapter's PCIe link width over its maximum"),
        ("nic.pcie_gen_ratio", "the adapter's PCIe link generation over its maximum"),
        ("nic.pcie_bandwidth_ratio", "the adapter's PCIe link bandwidth over at its maximum"),
        ("nic.speed_ratio", "negotiated speed over the fastest port of the same model and link layer on "
                            "the node"),
        ("nic.speed_common_ratio", "negotiated speed over the fastest mode both the port and its link partner "
                                   "support (Ethernet with auto-negotiation)")),
    *_m("nic", "Gb/s", ("nic.speed_gbps", "negotiated port speed")),
    *_m("nic", "bool", ("nic.gid_missing", "an RDMA port is up with no valid GID (or, on RoCE, no RoCE v2 GID)"),
        ("nic.pcie_lost", "the adapter vanished from the PCI bus")),
    *_m("node", "ratio", ("net.port_speed_ratio", "the slowest port's speed over the fastest of its model "
                                                  "on the node")),
    *_m("node", "Gb/s", ("net.rdma_min_gbps", "the slowest RDMA port that is up (a data rail)")),
    *_m("node", "count", ("net.gids_missing", "RDMA ports up with no usable GID"),
        ("node.pcie_links_degraded", "NVMe and NIC PCIe links below their maximum width or generation")),
    *_m("node", "count",
        ("kernel.mce", "machine checks and EDAC memory errors the kernel logged"),
        ("kernel.pcie_aer", "corrected PCIe AER errors the kernel logged"),
        ("kernel.pcie_aer_uncorrected", "uncorrected PCIe AER errors the kernel logged"),
        ("kernel.xid", "NVIDIA XID lines the kernel logged"),
        ("kernel.gpu_lost", "GPUs the driver reported fallen off the bus"),
        ("kernel.nic_fw", "NIC firmware or health errors the kernel logged"),
        ("kernel.hung_task", "tasks blocked for minutes (hung task warnings)"),
        ("kernel.soft_lockup", "CPU soft or hard lockups"),
        ("kernel.fs_readonly", "file systems turned read-only"),
        ("kernel.fs_error", "file-system errors"),
        ("kernel.io_error", "block-device I/O errors"),
        ("kernel.oom", "processes killed by the OOM killer"),
        ("kernel.hw_errors", "hardware errors of any class above except corrected AER, XID, hung tasks, "
                             "lockups and OOM")),
    *_m("node", "°C", ("bmc.inlet_temp_c", "hottest inlet (intake, ambient) temperature the BMC reads"),
        ("bmc.exhaust_temp_c", "hottest exhaust temperature the BMC reads")),
    *_m("node", "count", ("bmc.fans_failed", "fans the BMC reports not ok"),
        ("bmc.psus_failed", "power supplies the BMC reports not ok"),
        ("bmc.redundancy_lost", "fan or power redundancy groups the BMC reports not ok"),
        ("bmc.temps_over_threshold", "temperature sensors past their warning or critical threshold")),
    *_m("node", "W", ("bmc.power_w", "the node's power consumption the BMC reads")),
]

def _build() -> dict[str, Metric]:
    out = catalogue()
    for m in DERIVED:
        if m.name in out:
            raise ValueError(f"metric {m.name!r} is both declared in the event contract and derived")
        out[m.name] = m
    return out


METRICS: dict[str, Metric] = _build()
"""Every metric a rule may name: the contract's declarations, then the derived ones."""
