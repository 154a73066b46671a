"""The metrics a rule may name, the level each lives at, and its unit.

The evaluator's store (``whywait.engine.evaluate.store``) derives every one of these from
contract messages; the rule schema refuses any other name, listing the valid
ones.  A metric's *level* decides which entities a condition compares: a job's
ranks, its GPUs, its nodes, the NICs of its nodes, or the job as a whole.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

Level = Literal["rank", "gpu", "node", "nic", "job"]


@dataclass(frozen=True)
class Metric:
    """A metric's name, level and unit."""

    name: str
    level: Level
    unit: str
    doc: str


def _m(level: Level, unit: str, *names_docs: tuple[str, str]) -> list[Metric]:
    return [Metric(n, level, unit, d) for n, d in names_docs]


_ALL: list[Metric] = [
    # Per rank, from StepTiming.
    *_m("rank", "s",
        ("step.duration_s", "a rank's step wall time"),
        ("step.data_wait_s", "a rank's time waiting on the input pipeline"),
        ("step.compute_s", "a rank's compute time"),
        ("step.comm_s", "a rank's exposed communication (all-reduce wait) time"),
        ("step.checkpoint_s", "a rank's time inside checkpoint saves"),
        ("step.collective_s", "a rank's exposed time in collectives (v2 producers)"),
        ("step.pipeline_wait_s", "a rank's time waiting on pipeline send/recv and bubbles (v2 producers)"),
        ("step.work_s", "a rank's own time per step: compute plus input wait (step-aligned conditions)")),
    *_m("rank", "s", ("step.since_last_s", "seconds since the rank last reported a step (absence)")),
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
    *_m("gpu", "%", ("gpu.util_pct", "GPU utilisation"), ("gpu.mem_util_pct", "memory-controller utilisation")),
    *_m("gpu", "°C", ("gpu.temp_c", "GPU temperature")),
    *_m("gpu", "W", ("gpu.power_w", "power draw")),
    *_m("gpu", "MHz", ("gpu.sm_clock_mhz", "SM clock")),
    *_m("gpu", "ratio", ("gpu.sm_clock_ratio", "SM clock over its maximum"),
        ("gpu.power_ratio", "power draw over its limit")),
    *_m("gpu", "bool", ("gpu.thermal_throttle", "a thermal clock-event reason is active"),
        ("gpu.power_throttle", "a power clock-event reason is active"),
        ("gpu.remapped_rows_pending", "a row remap is pending")),
    *_m("gpu", "count", ("gpu.ecc_uncorrected", "uncorrected ECC errors"),
        ("gpu.ecc_corrected", "corrected ECC errors"), ("gpu.xid", "XID errors (one per occurrence)"),
        ("gpu.pcie_replay", "PCIe replays"), ("gpu.nvlink_errors", "NVLink errors")),
    # Per node: network.
    *_m("node", "segments/s", ("net.tcp_retrans_segs_per_s", "TCP segments retransmitted"),
        ("net.tcp_out_segs_per_s", "TCP segments sent")),
    *_m("node", "ratio", ("net.tcp_retrans_ratio", "retransmitted over sent TCP segments")),
    *_m("node", "events/s", ("net.tcp_timeouts_per_s", "TCP retransmission timeouts")),
    *_m("node", "packets/s", ("net.rx_drops_per_s", "receive drops, all NICs"),
        ("net.tx_drops_per_s", "transmit drops, all NICs")),
    *_m("node", "errors/s", ("net.rx_errors_per_s", "receive errors, all NICs"),
        ("net.tx_errors_per_s", "transmit errors, all NICs")),
    *_m("node", "count", ("net.carrier_changes", "link flaps, all NICs"),
        ("net.symbol_errors", "IB symbol errors, all ports"), ("net.links_down", "NICs whose link is down")),
    *_m("node", "ticks/s", ("net.xmit_wait_per_s", "IB transmit wait, all ports")),
    *_m("node", "bytes/s", ("net.rx_bytes_per_s", "received bytes, all NICs"),
        ("net.tx_bytes_per_s", "transmitted bytes, all NICs")),
    *_m("node", "ratio", ("net.tx_imbalance", "busiest NIC's transmit over the mean of the node's NICs")),
    # Per NIC.
    *_m("nic", "bytes/s", ("nic.rx_bytes_per_s", "received bytes"), ("nic.tx_bytes_per_s", "transmitted bytes")),
    *_m("nic", "packets/s", ("nic.rx_drops_per_s", "receive drops"), ("nic.tx_drops_per_s", "transmit drops")),
    *_m("nic", "errors/s", ("nic.rx_errors_per_s", "receive errors")),
    *_m("nic", "ticks/s", ("nic.xmit_wait_per_s", "IB transmit wait")),
    *_m("nic", "bool", ("nic.link_up", "link is up")),
    # Per node: storage (worst or summed device) and host.
    *_m("node", "ms", ("storage.read_latency_ms", "slowest device's read latency"),
        ("storage.write_latency_ms", "slowest device's write latency")),
    *_m("node", "ops/s", ("storage.read_iops", "reads, all devices"), ("storage.write_iops", "writes, all devices")),
    *_m("node", "bytes/s", ("storage.read_bytes_per_s", "bytes read, all devices"),
        ("storage.write_bytes_per_s", "bytes written, all devices")),
    *_m("node", "requests", ("storage.queue_depth", "deepest device queue")),
    *_m("node", "%", ("storage.util_pct", "busiest device's utilisation"),
        ("storage.io_pressure", "PSI io some avg10")),
    *_m("node", "%", ("host.cpu_busy_pct", "CPU busy"), ("host.cpu_iowait_pct", "CPU iowait"),
        ("host.cpu_steal_pct", "CPU steal"), ("host.mem_used_pct", "memory in use"),
        ("host.cpu_pressure", "PSI cpu some avg10"), ("host.mem_pressure", "PSI memory some avg10"),
        ("host.loader_cpu_pct", "data-loader CPU, % of one core")),
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

METRICS: dict[str, Metric] = {m.name: m for m in _ALL}
