"""The wire contract between node agents (or any user's producer) and the engine.

This module is the single source of truth for ``docs/events.md``: the topics, the
key of each, every field with its unit, and the schema version.  ``whywait events
doc`` regenerates the document from the tables below and a test asserts that the
committed file matches, so the code and the public document cannot drift apart.

Every message is one JSON object (UTF-8) with this envelope::

    {"schema": 1, "kind": "gpu", "time": 1764442800.0, "node": "node-03", ...body}

``time`` is *event time*: the producer's wall clock when it took the sample, in
Unix seconds (UTC, float).  The engine orders and windows by it, never by the
time the message arrived.  Messages are batched: one message per node per source
per sampling interval (default 1 s), carrying a list of records (one per GPU, per
NIC, per block device, per rank).

Counters travel as per-interval *rates* (the agent turns counters into rates,
handling wrap-around and resets), so a consumer never has to keep the previous
sample to make sense of a message.

This module imports only the standard library and msgspec (the compiled decoder): it
is shared by the agents (which must stay small) and the engine.
"""

from __future__ import annotations

import json
import keyword
import math
import operator
import re
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Annotated, Any, ClassVar, Literal, Union

import msgspec
from whywait.agents.errors import AgentError

SCHEMA_VERSION = 2
# Versions this engine reads.  Version 2 only adds optional fields (parallel coordinates on a
# placement, an optional step split, communication split into collectives and pipeline waits),
# so every version-1 message is also a valid version-2 message.
SUPPORTED_SCHEMAS: frozenset[int] = frozenset({1, 2})

# Topics are dotted and versioned; a breaking change to a body bumps the suffix.
TOPIC_GPU = "whywait.gpu.v1"
TOPIC_NET = "whywait.net.v1"
TOPIC_STORAGE = "whywait.storage.v1"
TOPIC_HOST = "whywait.host.v1"
TOPIC_STEPS = "whywait.steps.v1"
TOPIC_CHECKPOINTS = "whywait.checkpoints.v1"
TOPIC_PLACEMENT = "whywait.placement.v1"
TOPIC_AGENT_HEALTH = "whywait.agent-health.v1"
TOPIC_HW = "whywait.hw.v1"
TOPIC_DIAGNOSES = "whywait.diagnoses.v1"
TOPIC_DEADLETTER = "whywait.deadletter.v1"

# Input topics the engine consumes, in the order the document lists them.
INPUT_TOPICS: tuple[str, ...] = (
    TOPIC_PLACEMENT,
    TOPIC_STEPS,
    TOPIC_CHECKPOINTS,
    TOPIC_GPU,
    TOPIC_NET,
    TOPIC_STORAGE,
    TOPIC_HOST,
    TOPIC_HW,
    TOPIC_AGENT_HEALTH,
)


class ContractError(AgentError, ValueError):
    """A message breaks the event contract.

    Raised by :func:`decode` and :func:`validate`.  ``path`` is the dotted key path
    inside the message (``gpus[2].temp_c``); the string form is one line naming
    the path, what was expected and what was found, ready for the dead-letter
    topic's ``reason`` field.
    """

    def __init__(self, message: str, path: str = "") -> None:
        self.path = path
        super().__init__(f"{path}: {message}" if path else message)


_NUM = (int, float)
# The largest message the engine reads (Kafka's default max.message.bytes is about 1 MiB; a
# placement of 131,072 ranks is about 8 MiB of JSON).
MAX_MESSAGE_BYTES = 16 << 20


@dataclass(frozen=True)
class Rollup:
    """A node-level metric made from one field over every entry of a list: their ``max`` or their ``sum``."""

    metric: str
    how: str  # "max" (emitted when any entry has the field) or "sum" (absent entries count 0)
    doc: str


@dataclass(frozen=True)
class Measure:
    """Declares a field a measurement: the engine stores it as a metric that rules can name.

    ``metric`` is stored per entity of the field's record (``Record.entity``: a GPU, a NIC, a
    block device or mount, a rank), or per node for a field of a node topic's body; ``rollups`` add
    node-level metrics over a list's entries.  ``unit`` overrides the field's unit for the metric
    (``bool`` for a boolean, stored as 1/0).  ``each``: a list of integers stored one point per
    entry (XID codes).  ``whywait rules metrics`` lists them; nothing else needs to name them.
    """

    metric: str | None
    doc: str
    unit: str = ""
    rollups: tuple[Rollup, ...] = ()
    each: bool = False


@dataclass(frozen=True)
class Field:
    """One field of a record: its JSON name, type, unit and meaning (and, when measured, its metric)."""

    name: str
    type: str  # "number", "integer", "string", "boolean", "list[string]", "list[integer]", or a record name
    unit: str
    doc: str
    required: bool = True
    measure: Measure | None = None
    # A string field that takes one of a few words (a job's ``state``): any other word is refused.
    choices: tuple[str, ...] = ()


# What a list entry is, for the engine: the entity kinds a record's entries can be, each keyed by one
# field of the entry (``Record.entity_key``) and qualified by the message's node (or job, for ranks).
ENTITIES = ("gpu", "nic", "device", "rank")


@dataclass(frozen=True)
class Record:
    """A named group of fields; a topic's body is one, and lists hold others.

    ``entity``/``entity_key``: for a list's records, which entity one entry describes (one of
    :data:`ENTITIES`) and the field naming it; measured fields are stored per that entity.
    ``check``: what no field's type can say, across the record's fields once each is valid.  It reads
    the fields as attributes and raises :class:`ContractError` with the path inside the record; the
    compiled decoder runs it as the record's ``__post_init__``, :func:`validate` on a dict.
    """

    name: str
    fields: tuple[Field, ...]
    doc: str = ""
    entity: str = ""
    entity_key: str = ""
    check: Callable[[Any], None] | None = None


@dataclass(frozen=True)
class Topic:
    """A Kafka topic of the contract: its name, key, ``kind`` tag and body."""

    name: str
    kind: str
    key: str
    body: Record
    doc: str
    compacted: bool = False
    lists: Mapping[str, Record] = field(default_factory=dict)
    # Sent by every node (or job) every interval: the engine's watermark waits for each such input.
    periodic: bool = False


def F(name: str, type_: str, unit: str, doc: str, required: bool = True, measure: Measure | None = None,
      choices: tuple[str, ...] = ()) -> Field:
    return Field(name, type_, unit, doc, required, measure, choices)


def M(metric: str | None, doc: str, unit: str = "", *rollups: Rollup, each: bool = False) -> Measure:
    """Shorthand for a :class:`Measure` in the tables below."""
    return Measure(metric, doc, unit, tuple(rollups), each)


def measured(topics: tuple[Topic, ...] | None = None) -> list[tuple[Topic, str | None, Record, Field, Measure]]:
    """Every measured field: ``(topic, list field or None for the body, record, field, measure)``.

    Read by the engine to build its metric catalogue and its ingest plan (``whywait.engine.rules.metrics``,
    ``whywait.engine.evaluate.store``); ``topics`` defaults to :data:`TOPICS`.
    """
    out: list[tuple[Topic, str | None, Record, Field, Measure]] = []
    for t in TOPICS if topics is None else topics:
        for f in t.body.fields:
            if f.measure is not None:
                out.append((t, None, t.body, f, f.measure))
        for list_name, rec in t.lists.items():
            for f in rec.fields:
                if f.measure is not None:
                    out.append((t, list_name, rec, f, f.measure))
    return out


GPU_SAMPLE = Record("GpuSample", (
    F("gpu", "integer", "index", "GPU index on the node (NVML/nvidia-smi order)."),
    F("uuid", "string", "", "GPU UUID, `GPU-...`.", required=False),
    F("util_pct", "number", "%", "GPU (SM) utilisation over the interval (absent on MIG, where NVML has none).",
      required=False,
      measure=M("gpu.util_pct", "GPU utilisation")),
    F("mem_util_pct", "number", "%", "Memory-controller utilisation over the interval (absent on MIG).",
      required=False,
      measure=M("gpu.mem_util_pct", "memory-controller utilisation")),
    F("mem_used_bytes", "integer", "bytes", "Framebuffer memory in use."),
    F("mem_total_bytes", "integer", "bytes", "Framebuffer memory in total."),
    F("temp_c", "number", "°C", "GPU core temperature.",
      measure=M("gpu.temp_c", "GPU temperature")),
    F("power_w", "number", "W", "Power draw.",
      measure=M("gpu.power_w", "power draw")),
    F("power_limit_w", "number", "W", "Enforced power limit.", required=False),
    F("sm_clock_mhz", "number", "MHz", "Current SM clock.",
      measure=M("gpu.sm_clock_mhz", "SM clock")),
    F("sm_clock_max_mhz", "number", "MHz", "Maximum SM clock.", required=False),
    F("throttle_reasons", "list[string]", "names",
      "Active clock-event reasons: `sw_power_cap`, `hw_slowdown`, `hw_thermal_slowdown`, "
      "`hw_power_brake_slowdown`, `sw_thermal_slowdown`, `sync_boost`, `gpu_idle`, `applications_clocks_setting`, "
      "`display_clock_setting`. Empty when the GPU runs at full clocks."),
    F("ecc_corrected", "integer", "count", "Volatile corrected ECC errors during the interval.", required=False,
      measure=M("gpu.ecc_corrected", "corrected ECC errors")),
    F("ecc_uncorrected", "integer", "count", "Volatile uncorrected ECC errors during the interval.", required=False,
      measure=M("gpu.ecc_uncorrected", "uncorrected ECC errors")),
    F("remapped_rows_pending", "boolean", "", "A row remap is pending (needs a GPU reset).", required=False,
      measure=M("gpu.remapped_rows_pending", "a row remap is pending", "bool")),
    F("xid", "list[integer]", "XID codes",
      "XID errors seen during the interval, one entry per occurrence (a repeated XID appears twice).",
      required=False,
      measure=M("gpu.xid", "XID errors (one per occurrence)", "count", each=True)),
    F("pcie_replay", "integer", "count", "PCIe replays during the interval.", required=False,
      measure=M("gpu.pcie_replay", "PCIe replays")),
    F("nvlink_errors", "integer", "count", "NVLink CRC/replay/recovery errors during the interval.",
      required=False,
      measure=M("gpu.nvlink_errors", "NVLink errors")),
    F("pci_bus_id", "string", "", "The GPU's PCI address as NVML gives it (`00000000:83:00.0`).", required=False),
    F("pcie_tx_bytes_per_s", "number", "bytes/s", "PCIe transmit throughput (NVML, a 20 ms window).",
      required=False),
    F("pcie_rx_bytes_per_s", "number", "bytes/s", "PCIe receive throughput (NVML, a 20 ms window).",
      required=False),
    F("pcie_link_gen", "integer", "generation", "Current PCIe link generation (drops at idle by design).",
      required=False),
    F("pcie_link_gen_max", "integer", "generation", "Maximum PCIe link generation of the GPU in this slot.",
      required=False),
    F("pcie_link_width", "integer", "lanes", "Current PCIe link width.", required=False),
    F("pcie_link_width_max", "integer", "lanes", "Maximum PCIe link width.", required=False),
), "One GPU's sample for the interval.", entity="gpu", entity_key="gpu")

NIC_COUNTERS = Record("NicCounters", (
    F("nic", "string", "", "Interface or HCA port name (`eth0`, `mlx5_0/1`)."),
    F("rx_bytes_per_s", "number", "bytes/s", "Received bytes.",
      measure=M("nic.rx_bytes_per_s", "received bytes", "",
              Rollup("net.rx_bytes_per_s", "sum", "received bytes, all NICs"))),
    F("tx_bytes_per_s", "number", "bytes/s", "Transmitted bytes.",
      measure=M("nic.tx_bytes_per_s", "transmitted bytes", "",
              Rollup("net.tx_bytes_per_s", "sum", "transmitted bytes, all NICs"))),
    F("rx_packets_per_s", "number", "packets/s", "Received packets."),
    F("tx_packets_per_s", "number", "packets/s", "Transmitted packets."),
    F("rx_errors_per_s", "number", "errors/s", "Receive errors (IB: `port_rcv_errors`).",
      measure=M("nic.rx_errors_per_s", "receive errors", "",
              Rollup("net.rx_errors_per_s", "sum", "receive errors, all NICs"))),
    F("tx_errors_per_s", "number", "errors/s", "Transmit errors.",
      measure=M(None, "", "", Rollup("net.tx_errors_per_s", "sum", "transmit errors, all NICs"))),
    F("rx_drops_per_s", "number", "packets/s", "Receive drops.",
      measure=M("nic.rx_drops_per_s", "receive drops", "",
              Rollup("net.rx_drops_per_s", "sum", "receive drops, all NICs"))),
    F("tx_drops_per_s", "number", "packets/s", "Transmit drops (IB: `port_xmit_discards`).",
      measure=M("nic.tx_drops_per_s", "transmit drops", "",
              Rollup("net.tx_drops_per_s", "sum", "transmit drops, all NICs"))),
    F("link_up", "boolean", "", "Operational state is up.",
      measure=M("nic.link_up", "link is up", "bool")),
    F("speed_mbps", "number", "Mbit/s", "Negotiated link speed.", required=False),
    F("carrier_changes", "integer", "count", "Link flaps during the interval (IB: `link_downed`).",
      required=False,
      measure=M(None, "", "", Rollup("net.carrier_changes", "sum", "link flaps, all NICs"))),
    F("symbol_errors", "integer", "count", "IB physical symbol errors during the interval.", required=False,
      measure=M(None, "", "", Rollup("net.symbol_errors", "sum", "IB symbol errors, all ports"))),
    F("xmit_wait_per_s", "number", "ticks/s", "IB `port_xmit_wait`: time the port had data but no credits.",
      required=False,
      measure=M("nic.xmit_wait_per_s", "IB transmit wait", "",
              Rollup("net.xmit_wait_per_s", "sum", "IB transmit wait, all ports"))),
    F("gpus", "list[integer]", "indexes", "GPUs this adapter serves (PCIe locality).", required=False),
    F("node_guid", "string", "", "IB/RoCE adapter's node GUID, `0x` and 16 hex digits (sysfs `node_guid`): "
      "matches the adapter to a fabric dump whatever either calls it.", required=False),
    F("port_guid", "string", "", "This port's GUID, `0x` and 16 hex digits (low half of `gids/0`).",
      required=False),
    F("pci_bus_id", "string", "", "The adapter's PCI address, `0000:83:00.0`: matches it to NCCL's topology "
      "and nvidia-smi.", required=False),
), "One network interface's rates for the interval.", entity="nic", entity_key="nic")

DISK_STATS = Record("DiskStats", (
    F("device", "string", "", "Block device or mount (`nvme0n1`, `nfs:/scratch`)."),
    F("pool", "string", "", "Storage pool this device belongs to (topology id).", required=False),
    F("read_iops", "number", "ops/s", "Completed reads.",
      measure=M("storage.device.read_iops", "reads", "", Rollup("storage.read_iops", "sum", "reads, all devices"))),
    F("write_iops", "number", "ops/s", "Completed writes.",
      measure=M("storage.device.write_iops", "writes", "", Rollup("storage.write_iops", "sum", "writes, all devices"))),
    F("read_bytes_per_s", "number", "bytes/s", "Bytes read.",
      measure=M("storage.device.read_bytes_per_s", "bytes read", "",
              Rollup("storage.read_bytes_per_s", "sum", "bytes read, all devices"))),
    F("write_bytes_per_s", "number", "bytes/s", "Bytes written.",
      measure=M("storage.device.write_bytes_per_s", "bytes written", "",
              Rollup("storage.write_bytes_per_s", "sum", "bytes written, all devices"))),
    F("read_latency_ms", "number", "ms", "Average time per completed read.",
      measure=M("storage.device.read_latency_ms", "average time per completed read", "",
              Rollup("storage.read_latency_ms", "max", "slowest device's read latency"))),
    F("write_latency_ms", "number", "ms", "Average time per completed write.",
      measure=M("storage.device.write_latency_ms", "average time per completed write", "",
              Rollup("storage.write_latency_ms", "max", "slowest device's write latency"))),
    F("queue_depth", "number", "requests", "Average requests in flight.",
      measure=M("storage.device.queue_depth", "average requests in flight", "",
              Rollup("storage.queue_depth", "max", "deepest device queue"))),
    F("util_pct", "number", "%", "Share of the interval the device was busy.", required=False,
      measure=M("storage.device.util_pct", "share of the interval the device was busy", "",
              Rollup("storage.util_pct", "max", "busiest device's utilisation"))),
    F("read_rtt_ms", "number", "ms", "NFS mounts: average RPC round trip per READ (network and server; "
      "`read_latency_ms` adds the client's own queueing).", required=False,
      measure=M("storage.device.read_rtt_ms", "NFS mounts: RPC round trip per read")),
    F("write_rtt_ms", "number", "ms", "NFS mounts: average RPC round trip per WRITE.", required=False,
      measure=M("storage.device.write_rtt_ms", "NFS mounts: RPC round trip per write")),
    F("nfs_errors", "integer", "count", "NFS mounts: RPCs that failed during the interval (kernel 5.3+).",
      required=False, measure=M("storage.device.nfs_errors", "NFS mounts: failed RPCs")),
    F("nfs_timeouts", "integer", "count", "NFS mounts: RPC major timeouts during the interval.", required=False,
      measure=M("storage.device.nfs_timeouts", "NFS mounts: RPC major timeouts")),
    F("nfs_retransmissions", "integer", "count", "NFS mounts: RPC retransmissions during the interval.",
      required=False, measure=M("storage.device.nfs_retransmissions", "NFS mounts: RPC retransmissions")),
    F("metadata_ops_per_s", "number", "ops/s", "Lustre mounts: metadata operations (open, close, getattr, ...).",
      required=False, measure=M("storage.device.metadata_ops_per_s", "Lustre mounts: metadata operations")),
    F("metadata_latency_ms", "number", "ms", "Lustre mounts: average time per metadata operation.",
      required=False, measure=M("storage.device.metadata_latency_ms", "Lustre mounts: time per metadata operation"))
), "One block device's (or network mount's) figures for the interval.", entity="device",
   entity_key="device")

# A phase is timed apart from its step (by another clock, or summed over overlapping kernels), so it
# may run a little past the step; by more than half the step and a second it cannot have been measured.
STEP_PHASES = ("data_wait_s", "compute_s", "comm_s", "collective_s", "pipeline_wait_s", "checkpoint_s")
PHASE_SLACK = (1.5, 1.0)


def _check_step_phases(s: Any, _mul: float = PHASE_SLACK[0], _add: float = PHASE_SLACK[1]) -> None:
    """StepTiming: no phase longer than ``PHASE_SLACK`` allows over the step's ``duration_s``."""
    lim = s.duration_s * _mul + _add  # the slack as locals: this runs for every record of every step batch
    # One expression, no loop (the hot path).
    if ((s.data_wait_s or 0.0) <= lim and (s.compute_s or 0.0) <= lim and (s.comm_s or 0.0) <= lim
            and (s.collective_s or 0.0) <= lim and (s.pipeline_wait_s or 0.0) <= lim
            and (s.checkpoint_s or 0.0) <= lim):
        return
    for name in STEP_PHASES:
        v = getattr(s, name)
        if v is not None and v > lim:
            raise ContractError(f"must be at most {PHASE_SLACK[0]:g} × duration_s + {PHASE_SLACK[1]:g} s "
                                f"({lim:g} s here), a phase cannot outlast its step (got {v:g})", name)


def _check_placed_ranks(p: Any) -> None:
    """Placement: each rank placed once; no rank at all only once the job has finished."""
    ranks = p.ranks
    if not ranks:
        if p.state == "running":
            raise ContractError("must name at least one rank while the job is running", "ranks")
        return
    rank_of = operator.attrgetter("rank") if isinstance(ranks[0], Event) else operator.itemgetter("rank")
    if len(set(map(rank_of, ranks))) == len(ranks):
        return
    first: dict[int, int] = {}
    for i, r in enumerate(map(rank_of, ranks)):
        if r in first:
            raise ContractError(f"rank {r} is placed twice (ranks[{first[r]}] and ranks[{i}])", f"ranks[{i}].rank")
        first[r] = i


STEP_TIMING = Record("StepTiming", (
    F("rank", "integer", "", "Global rank in the job (0 to 2^31 − 1)."),
    F("step", "integer", "", "Training step number (monotonic per rank; 0 to 2^53)."),
    F("duration_s", "number", "s", "Wall time of the whole step.",
      measure=M("step.duration_s", "a rank's step wall time")),
    F("data_wait_s", "number", "s", "Time waiting on the input pipeline. Optional since v2: a producer that "
      "knows only the step time leaves the split out, and an absent phase is *unknown*, not zero.",
      required=False,
      measure=M("step.data_wait_s", "a rank's time waiting on the input pipeline")),
    F("compute_s", "number", "s", "Forward and backward compute (optional since v2).", required=False,
      measure=M("step.compute_s", "a rank's compute time")),
    F("comm_s", "number", "s", "Communication not overlapped with compute: collectives plus pipeline waits "
      "(optional since v2; when only `collective_s`/`pipeline_wait_s` are given, their sum).", required=False,
      measure=M("step.comm_s", "a rank's exposed communication (all-reduce wait) time")),
    F("collective_s", "number", "s", "Of `comm_s`, time in collectives (all-reduce, all-gather, "
      "reduce-scatter) not overlapped with compute (v2).", required=False,
      measure=M("step.collective_s", "a rank's exposed time in collectives (v2 producers)")),
    F("pipeline_wait_s", "number", "s", "Of `comm_s`, time waiting on pipeline send/recv and bubbles (v2).",
      required=False,
      measure=M("step.pipeline_wait_s", "a rank's time waiting on pipeline send/recv and bubbles (v2 producers)")),
    F("checkpoint_s", "number", "s", "Time inside checkpoint saves during the step.", required=False,
      measure=M("step.checkpoint_s", "a rank's time inside checkpoint saves")),
    F("node", "string", "", "Node the rank runs on (for producers that batch several nodes).",
      required=False),
    F("ended_at", "number", "s since epoch (UTC)", "When this step ended (the envelope `time` is the batch's).",
      required=False),
), "One completed training step of one rank. No phase may exceed 1.5 × `duration_s` + 1 s (a phase is timed "
   "apart from its step, so a little more than the step is allowed; more cannot have been measured).",
   entity="rank", entity_key="rank", check=_check_step_phases)

PLACED_RANK = Record("PlacedRank", (
    F("rank", "integer", "", "Global rank (0 to 2^31 − 1)."),
    F("node", "string", "", "Node id."),
    F("gpu", "integer", "index", "GPU index on that node."),
    F("dp", "integer", "index", "Data-parallel replica this rank belongs to (v2).", required=False),
    F("pp", "integer", "index", "Pipeline stage of this rank, 0 = first (v2).", required=False),
    F("tp", "integer", "index", "Tensor-parallel group this rank belongs to (v2).", required=False),
    F("cp", "integer", "index", "Context-parallel group (v2).", required=False),
    F("ep", "integer", "index", "Expert-parallel group (v2).", required=False),
    F("gpu_share", "number", "fraction", "Share of the GPU this rank has, in (0, 1] (MIG, MPS, time "
      "slicing); 1 when absent (v2).", required=False),
), "Where one rank runs, and (v2) its coordinates in the job's parallel layout.")

PCIE_LINK = Record("PcieLink", (
    F("device", "string", "", "PCI address, `0000:83:00.0`."),
    F("class", "string", "", "`gpu`, `nic` or `nvme`."),
    F("gpu", "integer", "index", "GPU index on the node, for a GPU.", required=False),
    F("nics", "list[string]", "names", "Interfaces and IB ports this adapter backs (`eth0`, `mlx5_0/1`), "
      "named as in `NicCounters.nic`.", required=False),
    F("width", "integer", "lanes", "Negotiated link width (`current_link_width`)."),
    F("width_max", "integer", "lanes", "Widest link the device and slot allow (`max_link_width`)."),
    F("gen", "integer", "generation", "Negotiated link generation (from `current_link_speed`: 2.5 GT/s = 1, "
      "5 = 2, 8 = 3, 16 = 4, 32 = 5, 64 = 6)."),
    F("gen_max", "integer", "generation", "Highest generation the device and slot allow (`max_link_speed`)."),
    F("aer_correctable", "integer", "count", "PCIe AER correctable errors during the interval "
      "(`aer_dev_correctable` TOTAL_ERR_COR).", required=False),
    F("aer_nonfatal", "integer", "count", "AER uncorrectable non-fatal errors during the interval.",
      required=False),
    F("aer_fatal", "integer", "count", "AER uncorrectable fatal errors during the interval.", required=False),
    F("tx_bytes_per_s", "number", "bytes/s", "Throughput the GPU sends over the link now (NVML; GPUs only).",
      required=False),
    F("rx_bytes_per_s", "number", "bytes/s", "Throughput the GPU receives over the link now (NVML; GPUs only).",
      required=False),
), "One PCIe device's link: what it negotiated against what it can do. A GPU whose x16 link trained at x8, or "
   "a Gen5 link at Gen3, moves half the data per second or less.")

KERNEL_EVENT = Record("KernelEvent", (
    F("seq", "integer", "", "The kernel log's sequence number (`/dev/kmsg`), unique per boot."),
    F("class", "string", "", "`mce` (machine check, EDAC), `pcie_aer` (corrected), `pcie_aer_uncorrected`, "
      "`xid`, `gpu_lost` (fallen off the bus), `nic_fw` (NIC firmware or health), `hung_task`, `soft_lockup`, "
      "`fs_readonly`, `fs_error`, `io_error`, `oom`."),
    F("level", "integer", "syslog level", "0 (emerg) to 7 (debug)."),
    F("message", "string", "", "The log line (at most 300 characters)."),
    F("device", "string", "", "The PCI address or block device the line names, when it names one.",
      required=False),
    F("code", "integer", "", "The XID code, for `xid`.", required=False),
    F("logged_at", "number", "s since epoch (UTC)", "When the kernel logged it (boot time + its timestamp).",
      required=False),
), "A hardware or system error the kernel logged during the interval, one per line that matched.")

BMC_SENSOR = Record("BmcSensor", (
    F("name", "string", "", "The BMC's sensor name (`Fan Block 1`, `Chassis Intake Temp`)."),
    F("type", "string", "", "`fan`, `temperature`, `psu`, `redundancy`, `power` or `voltage`."),
    F("context", "string", "", "Where it sits: `inlet`, `exhaust`, `cpu`, `gpu`, `psu`, `system`...",
      required=False),
    F("reading", "number", "", "The reading, in `unit`.", required=False),
    F("unit", "string", "", "`RPM`, `%`, `°C`, `W` or `V`.", required=False),
    F("health", "string", "", "`ok`, `warning`, `critical` or `unknown` (Redfish `Status.Health`; "
      "ipmitool's status and event text)."),
    F("note", "string", "", "The BMC's own words when it is not ok (`Failure detected`, `Non-Redundant`).",
      required=False),
), "One BMC sensor (Redfish or `ipmitool sdr`).")

NVML_HEALTH = Record("NvmlHealth", (
    F("gpu", "integer", "index", "GPU index."),
    F("responsive", "boolean", "", "False once an NVML call on this GPU timed out (the GPU is then skipped "
      "until a probe answers)."),
    F("latency_ms", "number", "ms", "The slowest NVML call on this GPU during the interval."),
    F("calls", "integer", "count", "NVML calls on this GPU during the interval."),
    F("errors", "integer", "count", "Calls that failed (other than not-supported) during the interval."),
    F("timeouts", "integer", "count", "Calls that did not return within the deadline during the interval."),
    F("error", "string", "", "The last failure, in NVML's words.", required=False),
), "How NVML answered for one GPU: a GPU that makes NVML slow or fail is itself failing.")

NIC_PORT = Record("NicPort", (
    F("nic", "string", "", "Interface or IB port (`eth0`, `mlx5_0/1`), as in `NicCounters.nic`."),
    F("speed_mbps", "number", "Mbit/s", "Negotiated speed (absent while the link is down).", required=False),
    F("speed_max_mbps", "number", "Mbit/s", "The fastest mode the port supports (Ethernet, from the driver).",
      required=False),
    F("speed_common_max_mbps", "number", "Mbit/s", "The fastest mode both the port and its link partner "
      "support (Ethernet with auto-negotiation): a port below it negotiated down.", required=False),
    F("link_layer", "string", "", "`Ethernet` or `InfiniBand`.", required=False),
    F("model", "string", "", "The adapter's PCI `vendor:device` (`15b3:1021`): ports of one model should "
      "negotiate one speed.", required=False),
    F("rdma", "boolean", "", "The port belongs to an RDMA device (InfiniBand or RoCE): a data rail.",
      required=False),
    F("link_up", "boolean", "", "Operational state is up."),
    F("gids", "integer", "count", "Valid (non-zero) entries among the first 16 of the port's RDMA GID table.",
      required=False),
    F("roce_v2_gids", "integer", "count", "Of `gids`, RoCE v2 entries (Ethernet RDMA ports).", required=False),
), "One network port's negotiated speed and RDMA GID table.")

# Set by the node agent on the timings it relays (from the training socket's peer credentials), so the
# engine can refuse timings sent for a job by someone other than the job's user.
_SENDER = (
    F("sender_uid", "integer", "", "Unix uid of the process that handed the node agent these timings (from the "
      "socket's credentials); the engine checks it against the placement's `user`.", required=False),
    F("sender_user", "string", "", "That uid's user name, when the node can name it.", required=False),
)

TOPICS: tuple[Topic, ...] = (
    Topic(TOPIC_PLACEMENT, "placement", "job id", Record("Placement", (
        F("job", "string", "", "Job id."),
        F("project", "string", "", "Owning project."),
        F("team", "string", "", "Owning team."),
        F("slack_channel", "string", "", "The team's channel, `#name`.", required=False),
        F("state", "string", "", "`running` or `finished`.", choices=("running", "finished")),
        F("ranks", "list[PlacedRank]", "", "Every rank's node and GPU, each rank once (none only once the job "
          "has finished)."),
        F("user", "string", "", "User the job runs as (Slurm `UserId`, pod's service account) (v2).",
          required=False),
        F("account", "string", "", "Scheduler account or Kubernetes namespace (v2).", required=False),
        F("source", "string", "", "Who published this placement: `slurm`, `k8s`, `file`, `simulator` (v2).",
          required=False),
        F("name", "string", "", "The job's name as its users know it, when the id is not (Slurm's `--job-name` "
          "for `slurm-777`); alerts show it beside the id (v2).", required=False),
    ), check=_check_placed_ranks), "Which job runs where and who owns it. Compacted: the latest message per job wins. "
        "`node` in the envelope is the producer (the scheduler hook or simulator).",
        compacted=True, lists={"ranks": PLACED_RANK}),
    Topic(TOPIC_STEPS, "steps", "job id", Record("StepBatch", (
        F("job", "string", "", "Job id."),
        F("steps", "list[StepTiming]", "", "Steps completed on this node during the interval."),
        *_SENDER,
    )), "Per-rank training-step timings, batched per node per interval.", lists={"steps": STEP_TIMING},
        periodic=True),
    Topic(TOPIC_CHECKPOINTS, "checkpoint", "job id", Record("CheckpointEvent", (
        F("job", "string", "", "Job id."),
        F("rank", "integer", "", "Rank writing the checkpoint."),
        F("checkpoint_id", "string", "", "Identifies one save across its start and end."),
        F("phase", "string", "", "`start`, `end` or `failed`.", choices=("start", "end", "failed")),
        F("bytes", "integer", "bytes", "Bytes written (on `end`).", required=False),
        F("duration_s", "number", "s", "Save duration (on `end` and `failed`).", required=False),
        F("path", "string", "", "Destination path.", required=False),
        F("error", "string", "", "Why it failed (on `failed`).", required=False),
        *_SENDER,
    )), "A checkpoint save starting, ending or failing (one message per phase)."),
    Topic(TOPIC_GPU, "gpu", "node id", Record("GpuReport", (
        F("gpus", "list[GpuSample]", "", "One sample per GPU."),
    )), "Per-GPU samples of one node for the interval.", lists={"gpus": GPU_SAMPLE}, periodic=True),
    Topic(TOPIC_NET, "net", "node id", Record("NetReport", (
        F("interval_s", "number", "s", "Length of the interval the rates cover (more than 0)."),
        F("nics", "list[NicCounters]", "", "One entry per interface or IB port."),
        F("tcp_retrans_segs_per_s", "number", "segments/s", "TCP segments retransmitted (`RetransSegs`).",
          measure=M("net.tcp_retrans_segs_per_s", "TCP segments retransmitted")),
        F("tcp_out_segs_per_s", "number", "segments/s", "TCP segments sent (`OutSegs`).",
          measure=M("net.tcp_out_segs_per_s", "TCP segments sent")),
        F("tcp_timeouts_per_s", "number", "events/s", "TCP retransmission timeouts (`TCPTimeouts`).",
          required=False,
          measure=M("net.tcp_timeouts_per_s", "TCP retransmission timeouts")),
    )), "Per-NIC rates and node-wide TCP counters for the interval.", lists={"nics": NIC_COUNTERS},
        periodic=True),
    Topic(TOPIC_STORAGE, "storage", "node id", Record("StorageReport", (
        F("interval_s", "number", "s", "Length of the interval the rates cover (more than 0)."),
        F("devices", "list[DiskStats]", "", "One entry per block device or network mount."),
        F("io_pressure_some_avg10", "number", "%", "PSI `io some avg10`.", required=False,
          measure=M("storage.io_pressure", "PSI io some avg10")),
    )), "Per-device storage figures for the interval.", lists={"devices": DISK_STATS}, periodic=True),
    Topic(TOPIC_HOST, "host", "node id", Record("HostSample", (
        F("cpu_busy_pct", "number", "%", "CPU busy (not idle, not iowait) across all cores.",
          measure=M("host.cpu_busy_pct", "CPU busy")),
        F("cpu_iowait_pct", "number", "%", "CPU time in iowait.",
          measure=M("host.cpu_iowait_pct", "CPU iowait")),
        F("cpu_steal_pct", "number", "%", "CPU time stolen by the hypervisor.", required=False,
          measure=M("host.cpu_steal_pct", "CPU steal")),
        F("cpu_count", "integer", "cores", "Online logical CPUs.", required=False),
        F("mem_used_bytes", "integer", "bytes", "Memory in use (total − available)."),
        F("mem_total_bytes", "integer", "bytes", "Memory in total."),
        F("cpu_pressure_some_avg10", "number", "%", "PSI `cpu some avg10`.", required=False,
          measure=M("host.cpu_pressure", "PSI cpu some avg10")),
        F("mem_pressure_some_avg10", "number", "%", "PSI `memory some avg10`.", required=False,
          measure=M("host.mem_pressure", "PSI memory some avg10")),
        F("mem_pressure_full_avg10", "number", "%", "PSI `memory full avg10`.", required=False),
        F("loader_cpu_pct", "number", "% of one core",
          "CPU used by the training job's data-loader processes.", required=False,
          measure=M("host.loader_cpu_pct", "data-loader CPU, % of one core", "%")),
    )), "Host CPU and memory pressure for the interval.", periodic=True),
    Topic(TOPIC_HW, "hw", "node id", Record("HwReport", (
        F("pcie", "list[PcieLink]", "", "Every GPU's, NIC's and NVMe drive's PCIe link.", required=False),
        F("ports", "list[NicPort]", "", "Every physical network port's speed and GID table.", required=False),
        F("kernel", "list[KernelEvent]", "", "Hardware and system errors the kernel logged.", required=False),
        F("bmc", "list[BmcSensor]", "", "Fans, temperatures, power supplies and redundancy from the BMC.",
          required=False),
        F("nvml", "list[NvmlHealth]", "", "NVML's latency and failures per GPU.", required=False),
    )), "The node's hardware health: the fail-slow faults that slow a node without stopping it. Each list is "
        "sent when its source ran during the interval (PCIe and ports every 10 s, the BMC every 30 s, the "
        "kernel log and NVML every interval); an absent list says nothing, an empty one says all clear.",
        lists={"pcie": PCIE_LINK, "ports": NIC_PORT, "kernel": KERNEL_EVENT, "bmc": BMC_SENSOR,
               "nvml": NVML_HEALTH}),
    Topic(TOPIC_AGENT_HEALTH, "agent_health", "node id", Record("AgentHealth", (
        F("samples", "integer", "count", "Samples taken since start."),
        F("sent", "integer", "count", "Messages acknowledged by Kafka since start."),
        F("spooled", "integer", "count", "Messages waiting in the on-disk spool now."),
        F("dropped", "integer", "count", "Messages dropped past the spool bound since start."),
        F("collector_errors", "integer", "count", "Collector errors since start."),
        # Declared, so the compiled decoder keeps them (it drops what the contract does not name).
        F("invalid", "integer", "count", "Messages the agent refused to publish (they broke the contract) since start.",
          required=False),
        F("training_datagrams", "integer", "count", "Step datagrams received from training processes since start.",
          required=False),
        F("training_malformed", "integer", "count", "Step datagrams that did not parse since start.", required=False),
        F("training_dropped", "integer", "count", "Step datagrams dropped past the inbox bound since start.",
          required=False),
        F("training_rejected", "integer", "count", "Step datagrams refused because the sender does not own the job "
          "(or named another node) since start.", required=False),
        F("instance", "string", "", "This agent process: its host's boot id and its pid, `<boot id>/<pid>`. Two "
          "instances taking turns under one node name are two hosts publishing as one (a cloned machine).",
          required=False),
    )), "The agent's own health, once per interval."),
)

_TOPIC_BY_KIND = {t.kind: t for t in TOPICS}
#: Kinds whose envelope ``node`` is the measured node (steps, checkpoints and placements are keyed by job):
#: the engine refuses them from a node its topology does not hold.
NODE_KINDS = frozenset(t.kind for t in TOPICS if t.key == "node id")
_TOPIC_BY_NAME = {t.name: t for t in TOPICS}
_RECORDS = {r.name: r for t in TOPICS for r in (t.body, *t.lists.values())}

ENVELOPE: tuple[Field, ...] = (
    F("schema", "integer", "", f"Schema version; this document describes version {SCHEMA_VERSION} "
      "(version-1 messages stay valid: version 2 only adds optional fields)."),
    F("kind", "string", "", "Which body follows: " + ", ".join(f"`{t.kind}`" for t in TOPICS) + "."),
    F("time", "number", "s since epoch (UTC)", "Event time: when the producer took the sample."),
    F("node", "string", "", "The producing node (host name or topology id)."),
)


def topic_for_kind(kind: str) -> str:
    """Return the topic a message of ``kind`` is published to."""
    try:
        return _TOPIC_BY_KIND[kind].name
    except KeyError:
        raise ContractError(f"unknown kind {kind!r} (valid: {', '.join(sorted(_TOPIC_BY_KIND))})",
                            "kind") from None


def kind_for_topic(topic: str) -> str | None:
    """Return the ``kind`` carried by ``topic``, or None for a topic outside the contract."""
    t = _TOPIC_BY_NAME.get(topic)
    return t.kind if t else None


# Physical bounds per unit: a value outside them cannot have been measured, so the message is refused
# (dead-lettered) rather than allowed to reach the store, where a 10**400 byte count or a
# one-trillion percent would overflow arithmetic or poison a baseline.  Units not listed here get
# the generic bound below; a field that wants a tighter one adds its unit here.
UNIT_BOUNDS: dict[str, tuple[float, float]] = {
    "%": (0.0, 100.0),
    "% of one core": (0.0, 1e6),
    "fraction": (0.0, 1.0),
    "°C": (-273.15, 1000.0),
    "W": (0.0, 1e6),
    "MHz": (0.0, 1e6),
    "bytes": (0.0, 2.0 ** 63),
    "bytes/s": (0.0, 1e14),
    "packets/s": (0.0, 1e12),
    "errors/s": (0.0, 1e12),
    "segments/s": (0.0, 1e12),
    "events/s": (0.0, 1e12),
    "ticks/s": (0.0, 1e12),
    "ops/s": (0.0, 1e12),
    "Mbit/s": (0.0, 1e9),
    "ms": (0.0, 1e9),
    "s": (0.0, 1e8),
    "s since epoch (UTC)": (0.0, 1e11),
    "count": (0.0, 1e15),
    "requests": (0.0, 1e12),
    "cores": (0.0, 1e7),
    "index": (0.0, 1e7),
    "indexes": (0.0, 1e7),
    "XID codes": (0.0, 1e6),
    "syslog level": (0.0, 7.0),
}
# Any number without a unit bound (ranks, step numbers, producer extensions): finite, and an
# integer that fits in 64 bits, so float() and the store's arithmetic can never overflow.
GENERIC_BOUND = (-(2.0 ** 63), 2.0 ** 63)
# Strings are identifiers or short prose; a 20,000-character job name is an attack or a bug, and
# would be copied into every diagnosis, log line and Slack message.
STRING_MAX = 256
STRING_MAX_BY_FIELD: dict[str, int] = {"error": 2000, "path": 4096}
# Lists: no node has more than a few hundred GPUs, NICs or devices; a placement names every rank of
# one job (the largest runs today are ~100k GPUs); a batch holds one interval's steps of one node.
LIST_MAX = 1024
LIST_MAX_BY_FIELD: dict[str, int] = {"ranks": 131_072, "steps": 20_000}
_INT_LIMIT = 2 ** 63
# Fields whose bound is tighter than their unit's, whatever record holds them.  A rank is stored in a
# 32-bit column of the engine's step tables (``FrozenRow``): a larger one would fail there and take
# the job's other ranks with it, so it is refused here.  Step numbers stay exact as floats (readers
# of diagnoses in JavaScript, numpy).  A uid is an unsigned 32-bit number.
RANK_MAX = 2 ** 31 - 1
FIELD_BOUNDS: dict[str, tuple[float, float]] = {
    "rank": (0, RANK_MAX),
    "step": (0, 2 ** 53),
    "sender_uid": (0, 2 ** 32 - 1),
}
# Fields whose lower bound is itself refused: a GPU share of 0 (the docs say (0, 1]), rates over an
# interval of 0 s.
ABOVE_MIN: frozenset[str] = frozenset({"gpu_share", "interval_s"})
# Free-text fields (a log line, a tool's error): tab, line feed and carriage return are allowed there.
# Every other string is a name or an id, copied into keys, log lines and Slack messages, and holds no
# control character at all (C0, U+0000-U+001F, or C1, U+0080-U+009F; DEL is allowed: it neither breaks
# a line nor moves a terminal's cursor, and finding it would cost the decoder another scan of every
# message).  No string holds an unpaired surrogate (``"\ud800"``): it has no UTF-8 form.
PROSE_FIELDS: frozenset[str] = frozenset({"error", "message", "note"})
# What a name or id (and prose) must not hold; the importers check names with it too, to name the line.
NOT_IN_NAMES = re.compile("[\x00-\x1f\x80-\x9f\ud800-\udfff]")
NOT_IN_PROSE = re.compile("[\x00-\x08\x0b\x0c\x0e-\x1f\x80-\x9f\ud800-\udfff]")


def _bounds(unit: str, name: str) -> tuple[float, float]:
    """The bounds of a number: its field's own (:data:`FIELD_BOUNDS`), else its unit's, else the generic one."""
    got = FIELD_BOUNDS.get(name)
    return got if got is not None else UNIT_BOUNDS.get(unit, GENERIC_BOUND)


def _in_bounds(value: int | float, unit: str, name: str = "") -> bool:
    lo, hi = _bounds(unit, name)
    if isinstance(value, int):  # compare big ints as ints: float(10**400) raises OverflowError
        ok = -_INT_LIMIT <= value < _INT_LIMIT and lo <= value <= hi  # a signed 64-bit integer
    else:
        ok = math.isfinite(value) and lo <= value <= hi
    return ok and not (name in ABOVE_MIN and value == lo)


def _bound_text(unit: str, name: str = "") -> str:
    lo, hi = _bounds(unit, name)
    text = f"{lo}..{hi}" if name in FIELD_BOUNDS else f"{lo:g}..{hi:g}"  # a field's own bounds: exact integers
    return text + (f" {unit}" if unit else "") + (f", excluding {lo:g}" if name in ABOVE_MIN else "")


def _short(value: Any) -> str:
    """``repr`` of a refused value, cut so a reason stays one short line whatever was sent."""
    if isinstance(value, int) and not isinstance(value, bool) and abs(value) > 10 ** 30:
        return f"an integer of {len(str(abs(value)))} digits"
    try:
        text = repr(value)
    except RecursionError:  # a list nested hundreds deep where a scalar belongs
        return f"a {type(value).__name__} nested too deeply"
    return text if len(text) <= 80 else text[:60] + f"... ({len(text)} chars)"


def _check(value: Any, type_: str, path: str, errors: list[str], unit: str = "", name: str = "",
           choices: tuple[str, ...] = ()) -> None:
    if type_ == "number":
        if isinstance(value, bool) or not isinstance(value, _NUM) or \
                (isinstance(value, float) and not math.isfinite(value)):
            errors.append(f"{path}: must be a finite number (got {_short(value)})")
        elif not _in_bounds(value, unit, name):
            errors.append(f"{path}: must be within {_bound_text(unit, name)} (got {_short(value)})")
    elif type_ == "integer":
        if isinstance(value, bool) or not isinstance(value, int):
            errors.append(f"{path}: must be an integer (got {_short(value)})")
        elif not _in_bounds(value, unit, name):
            errors.append(f"{path}: must be within {_bound_text(unit, name)} (got {_short(value)})")
    elif type_ == "string":
        cap = STRING_MAX_BY_FIELD.get(name, STRING_MAX)
        if not isinstance(value, str) or not value:
            errors.append(f"{path}: must be a non-empty string (got {_short(value)})")
        elif len(value) > cap:
            errors.append(f"{path}: must be at most {cap} characters (got {len(value)})")
        elif choices and value not in choices:
            errors.append(f"{path}: must be one of {', '.join(map(repr, choices))} (got {_short(value)})")
        elif (NOT_IN_PROSE if name in PROSE_FIELDS else NOT_IN_NAMES).search(value):
            what = "control characters (but tab, line feed, carriage return)" if name in PROSE_FIELDS \
                else "control characters"
            errors.append(f"{path}: must not hold {what} or unpaired surrogates (got {_short(value)})")
    elif type_ == "boolean":
        if not isinstance(value, bool):
            errors.append(f"{path}: must be true or false (got {_short(value)})")
    elif type_.startswith("list["):
        inner = type_[5:-1]
        if not isinstance(value, list):
            errors.append(f"{path}: must be a list (got {type(value).__name__})")
            return
        cap = LIST_MAX_BY_FIELD.get(name, LIST_MAX)
        if len(value) > cap:
            errors.append(f"{path}: must hold at most {cap} entries (got {len(value)})")
            return
        rec = _RECORDS.get(inner)
        for i, item in enumerate(value):
            if len(errors) > 3:  # enough for the one-line reason; a 100k-entry list is not walked twice
                return
            if rec is not None:
                _check_record(item, rec, f"{path}[{i}]", errors)
            else:
                _check(item, inner, f"{path}[{i}]", errors, unit, "")
    else:  # pragma: no cover - a typo in the tables above
        raise AssertionError(type_)


def _check_record(obj: Any, rec: Record, path: str, errors: list[str]) -> None:
    if not isinstance(obj, dict):
        errors.append(f"{path}: must be an object ({rec.name}) (got {type(obj).__name__})")
        return
    before = len(errors)
    for f in rec.fields:
        if f.name in obj and obj[f.name] is not None:
            _check(obj[f.name], f.type, f"{path}.{f.name}" if path else f.name, errors, f.unit, f.name, f.choices)
        elif f.required:
            errors.append(f"{path + '.' if path else ''}{f.name}: is required ({f.type}, {f.unit or 'no unit'})")
    if rec.check is not None and len(errors) == before:  # across fields: only once each field is valid
        try:
            rec.check(_Fields(obj))
        except ContractError as exc:
            errors.append(f"{path}.{exc}" if path else str(exc))


class _Fields:
    """A dict's fields read as attributes (None when absent), for a :attr:`Record.check` in :func:`validate`."""

    __slots__ = ("_d",)

    def __init__(self, d: dict[str, Any]) -> None:
        self._d = d

    def __getattr__(self, name: str) -> Any:
        return self._d.get(name)


def validate(msg: Any, topic: str | None = None) -> dict[str, Any]:
    """Check one decoded message against the contract and return it.

    Called by the engine for every message it consumes, and by the agents'
    publisher before sending (so a producer bug is caught at the source).  When
    ``topic`` is given the message's ``kind`` must belong to it.  Unknown extra
    fields are allowed (producers may add their own); missing or mistyped ones
    raise :class:`ContractError` naming the first few problems on one line.
    """
    if not isinstance(msg, dict):
        raise ContractError(f"message must be a JSON object (got {type(msg).__name__})")
    errors: list[str] = []
    for f in ENVELOPE:
        if f.name not in msg:
            errors.append(f"{f.name}: is required ({f.type})")
        else:
            _check(msg[f.name], f.type, f.name, errors, f.unit, f.name)
    if errors:
        raise ContractError("; ".join(errors[:3]))
    if msg["schema"] not in SUPPORTED_SCHEMAS:
        raise ContractError(f"unsupported schema version {msg['schema']} (this engine reads "
                            f"{', '.join(map(str, sorted(SUPPORTED_SCHEMAS)))})", "schema")
    t = _TOPIC_BY_KIND.get(msg["kind"])
    if t is None:
        raise ContractError(f"unknown kind {msg['kind']!r} (valid: {', '.join(sorted(_TOPIC_BY_KIND))})", "kind")
    if topic is not None and topic != t.name:
        raise ContractError(f"kind {t.kind!r} belongs on {t.name}, not {topic}", "kind")
    _check_record(msg, t.body, "", errors)
    if errors:
        more = f" (+{len(errors) - 3} more)" if len(errors) > 3 else ""
        raise ContractError("; ".join(errors[:3]) + more)
    return msg


# ---- typed events: compiled decoding ----------------------------------------------------------------
#
# The decoder's types are generated from the tables above (one declaration of the contract): one
# msgspec Struct per record, one per topic (its envelope and body, tagged by ``kind``), with the
# contract's bounds as msgspec constraints.  Decoding a message then parses, type-checks and
# bounds-checks it in one compiled pass, several times faster than ``json.loads`` plus the checks
# in Python, and returns a typed object instead of a dict.
#
# Why a mapping view rather than attribute access everywhere: the same consumers (the store, the
# evaluator, replay, export, the simulator, the report, user code) also receive plain dicts, from
# the simulator, from rule tests and from :func:`validate`'s callers.  An :class:`Event` reads like
# the dict it replaces (``msg["time"]``, ``msg.get("uuid")``, ``"job" in msg``, ``dict(msg)``), so
# every consumer keeps one code path for both; the hot path (the store) reads attributes through
# ``get`` on a slot, which costs about what a dict lookup does.  An optional field that was absent
# (or null) is absent from the view too: unknown is not zero.  Fields a producer adds beyond the
# contract are allowed and not kept (nothing in the engine reads them).

# Names a record field cannot have as a Struct attribute (a keyword, or a method of the view):
# the attribute gets a trailing underscore, the wire and the mapping view keep the contract's name.
_VIEW_METHODS = frozenset({"get", "keys", "items", "values", "kind"})


class Event(msgspec.Struct, frozen=True, kw_only=True, omit_defaults=True):
    """A decoded message or list entry: typed attributes, read as a read-only mapping of its contract fields.

    Built by :func:`decode`.  ``Record.name`` is the class name (``GpuReport``, ``GpuSample``); the
    mapping view's keys are the contract's field names whose value is present (and ``kind`` for a
    message).
    """

    # wire name -> attribute name, per generated class (set by _struct_for)
    _attr: ClassVar[dict[str, str]] = {}
    _kind: ClassVar[str | None] = None

    def __getitem__(self, key: str) -> Any:
        a = self._attr.get(key)
        if a is not None:
            v = getattr(self, a)
            if v is not None:
                return v
        elif key == "kind" and self._kind is not None:
            return self._kind
        raise KeyError(key)

    def get(self, key: str, default: Any = None) -> Any:
        a = self._attr.get(key)
        if a is not None:
            v = getattr(self, a)
            return default if v is None else v
        if key == "kind" and self._kind is not None:
            return self._kind
        return default

    def __contains__(self, key: object) -> bool:
        a = self._attr.get(key) if isinstance(key, str) else None
        if a is not None:
            return getattr(self, a) is not None
        return key == "kind" and self._kind is not None

    def keys(self) -> list[str]:  # type: ignore[override]
        out = ["kind"] if self._kind is not None else []
        out += [k for k, a in self._attr.items() if getattr(self, a) is not None]
        return out

    def __iter__(self) -> Iterator[str]:  # type: ignore[override]
        return iter(self.keys())

    def __len__(self) -> int:
        return len(self.keys())

    def items(self) -> list[tuple[str, Any]]:
        return [(k, self[k]) for k in self.keys()]

    def values(self) -> list[Any]:
        return [self[k] for k in self.keys()]

    def __eq__(self, other: object) -> bool:
        if isinstance(other, Event) and type(other) is not type(self):
            return False
        if isinstance(other, Mapping) or isinstance(other, Event):
            return bool(_plain(self) == _plain(other))
        return NotImplemented

    __hash__ = None  # type: ignore[assignment]


Mapping.register(Event)

# What :func:`decode` returns, as the type checker sees it: a read-only mapping of the contract's
# fields (at run time an :class:`Event` of the message's kind, whose attributes are typed too; the
# classes are generated from the tables, so no checker can name their attributes).
if TYPE_CHECKING:
    Message = Mapping[str, Any]
else:
    Message = Event


_GETTERS: dict[tuple[type, tuple[str, ...]], Callable[[Any], Any]] = {}


def columns(items: Sequence[Mapping[str, Any]], names: tuple[str, ...]) -> list[tuple[Any, ...]]:
    """The values of the fields ``names`` over a list's entries, one tuple per field (None: absent).

    Called by the metric store for each list of each message (GPUs, NICs, ranks): the typed entries
    of a decoded message are read by attribute in one C-level pass (no mapping lookup per field and
    entry); plain dicts, and lists mixing both (an entry renamed by the topology), by ``get``.
    ``names`` are the contract's field names, at least one.
    """
    if not items:
        return [() for _ in names]
    cls = type(items[0])
    if issubclass(cls, Event) and all(type(i) is cls for i in items):
        get = _GETTERS.get((cls, names))
        if get is None:
            attrs = [cls._attr.get(n, n) for n in names]
            one = operator.attrgetter(*attrs)
            get = _GETTERS[(cls, names)] = one if len(attrs) > 1 else (lambda x, _g=one: (_g(x),))
        rows = list(map(get, items))
    else:
        rows = [tuple(i.get(n) for n in names) for i in items]
    return list(zip(*rows, strict=True))


def _plain(value: Any) -> Any:
    """``value`` with every mapping and list turned into plain dicts and lists (for comparisons)."""
    if isinstance(value, (Event, Mapping)):
        return {k: _plain(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_plain(v) for v in value]
    return value


def as_dict(msg: Mapping[str, Any]) -> dict[str, Any]:
    """A decoded :class:`Event` (or any message) as plain dicts and lists, e.g. to write it as JSON or YAML."""
    return _plain(msg)  # type: ignore[no-any-return]


def _bounded(type_: str, unit: str, name: str, choices: tuple[str, ...] = ()) -> Any:
    """The msgspec type of one contract type: the same checks :func:`_check` makes, compiled.

    All but one: msgspec has no constraint for the characters of a string, so :func:`decode` sends a
    message that could hold a control character or an unpaired surrogate to :func:`validate`.
    """
    if type_ in ("number", "integer"):
        lo, hi = _bounds(unit, name)
        if type_ == "integer":  # an integer: within the unit's bounds and a signed 64-bit one
            lo, hi = max(math.ceil(lo), -_INT_LIMIT), min(math.floor(hi), _INT_LIMIT - 1)
        meta = msgspec.Meta(gt=lo, le=hi) if name in ABOVE_MIN else msgspec.Meta(ge=lo, le=hi)
        num: Any = int if type_ == "integer" else float
        return Annotated[num, meta]
    if type_ == "string":
        if choices:
            return Literal[choices]
        return Annotated[str, msgspec.Meta(min_length=1, max_length=STRING_MAX_BY_FIELD.get(name, STRING_MAX))]
    if type_ == "boolean":
        return bool
    if type_.startswith("list["):
        inner = type_[5:-1]
        rec = _RECORDS.get(inner)
        item = _struct_for(rec) if rec is not None else _bounded(inner, unit, "")
        return Annotated[list[item], msgspec.Meta(max_length=LIST_MAX_BY_FIELD.get(name, LIST_MAX))]  # type: ignore[valid-type]
    raise AssertionError(type_)  # pragma: no cover - a typo in the tables above


_STRUCTS: dict[str, type[Event]] = {}


def _struct_for(rec: Record, head: tuple[Field, ...] = (), kind: str | None = None) -> type[Event]:
    """The Struct class of ``rec`` (with the envelope's fields ``head`` and the ``kind`` tag for a topic's body)."""
    if kind is None and rec.name in _STRUCTS:
        return _STRUCTS[rec.name]
    fields: list[tuple[str, Any] | tuple[str, Any, Any]] = []
    attr: dict[str, str] = {}
    for f in (*head, *(f for f in rec.fields if f.name not in {h.name for h in head})):
        if kind is not None and f.name == "kind":
            continue  # the tag
        name = f.name + "_" if keyword.iskeyword(f.name) or f.name in _VIEW_METHODS else f.name
        attr[f.name] = name
        t = _bounded(f.type, f.unit, f.name, f.choices)
        fields.append((name, t) if f.required else (name, t | None, None))  # type: ignore[operator]
    cls: type[Event] = msgspec.defstruct(  # type: ignore[assignment]
        rec.name, fields, bases=(Event,), kw_only=True, frozen=True, omit_defaults=True,
        rename={a: w for w, a in attr.items() if a != w} or None,
        tag_field="kind" if kind is not None else None, tag=kind if kind is not None else None,
        namespace={"_attr": attr, "_kind": kind, "__module__": __name__,
                   **({"__post_init__": rec.check} if rec.check is not None else {})})
    if kind is None:
        _STRUCTS[rec.name] = cls
    return cls


# One typed class per topic (its envelope and body); the decoder picks one by the ``kind`` tag.
EVENT_TYPES: dict[str, type[Event]] = {t.kind: _struct_for(t.body, ENVELOPE, t.kind) for t in TOPICS}
_TOPIC_OF_TYPE: dict[type[Event], str] = {EVENT_TYPES[t.kind]: t.name for t in TOPICS}
_EVENT_UNION: Any = Union[tuple(EVENT_TYPES.values())]  # noqa: UP007 - built at run time from the table
_DECODER: msgspec.json.Decoder[Any] = msgspec.json.Decoder(_EVENT_UNION)


def envelope(kind: str, node: str, time: float, **body: Any) -> dict[str, Any]:
    """Build a message: the envelope for ``kind`` plus ``body``.  Does not validate."""
    return {"schema": SCHEMA_VERSION, "kind": kind, "time": float(time), "node": node, **body}


def encode(msg: Mapping[str, Any]) -> bytes:
    """Serialise a message (a dict or a decoded :class:`Event`) for Kafka (compact JSON, UTF-8)."""
    if isinstance(msg, Event):
        return msgspec.json.encode(msg)
    # A dict may hold parts of decoded events (a list of ``StepTiming`` records taken from one): they
    # serialise as the plain objects they were decoded from.
    return json.dumps(msg, separators=(",", ":"), allow_nan=False, default=_builtin).encode()


def _builtin(obj: Any) -> Any:
    if isinstance(obj, msgspec.Struct):
        return msgspec.to_builtins(obj)
    raise TypeError(f"Object of type {type(obj).__name__} is not JSON serializable")


def decode(raw: bytes | str, topic: str | None = None) -> Message:
    """Parse and validate one Kafka value into its typed :class:`Event`; raise :class:`ContractError` on any problem.

    The compiled decoder (msgspec, generated from the tables above) parses and checks types and
    bounds in one pass.  Only when it refuses a message does the reference checker
    (:func:`validate`) run, so the reason on the dead-letter topic is the same one-line reason,
    naming the field path, whichever checker found the problem.
    """
    if len(raw) > MAX_MESSAGE_BYTES:
        raise ContractError(f"message is {len(raw)} bytes (limit {MAX_MESSAGE_BYTES})")
    try:
        ev = _DECODER.decode(raw)
    except (msgspec.ValidationError, msgspec.DecodeError):
        return _decode_slow(raw, topic)
    except RecursionError:  # {"x": [[[...]]]}: msgspec recurses even through fields it skips
        raise ContractError("not valid JSON: nested too deeply") from None
    if ev.schema not in SUPPORTED_SCHEMAS or (topic is not None and _TOPIC_OF_TYPE[type(ev)] != topic):
        return _decode_slow(raw, topic)  # the reference checker words the reason
    # msgspec cannot check a string's characters.  A C0 control or an unpaired surrogate can reach a
    # string only through an escape (JSON forbids them raw), a C1 control also raw (0xC2 0x80-0x9F in
    # UTF-8): two scans for a byte (an int: a plain memchr) clear nearly every message.
    if type(raw) is bytes:
        if (92 in raw and _ESCAPED.search(raw) is not None) or (194 in raw and _C1_RAW.search(raw) is not None):
            return _decode_slow(raw, topic)
    elif _SUSPECT_TEXT.search(raw) is not None:  # type: ignore[arg-type]
        return _decode_slow(raw, topic)
    return ev


# What may spell a C0 or C1 control or an unpaired surrogate in a JSON text: a short escape (``\n``) or
# a ``\u`` escape of one, or a C1 control raw.  It also matches harmless text (``\\n``, an escaped
# backslash before an ``n``): such a message is only checked the slow way.
_ESCAPED = re.compile(rb"\\(?:[bfnrt]|u(?:00[0189]|[dD][89a-fA-F]))")
_C1_RAW = re.compile(rb"\xc2[\x80-\x9f]")
_SUSPECT_TEXT = re.compile(r"\\(?:[bfnrt]|u(?:00[0189]|[dD][89a-fA-F]))|[\x00-\x1f\x80-\x9f\ud800-\udfff]")
_BOM = b"\xef\xbb\xbf"


def _decode_slow(raw: bytes | str, topic: str | None) -> Message:
    """The reference path: ``json.loads`` and :func:`validate` (raises with the reason), then the typed object.

    Reached for refused messages, and for those the compiled decoder cannot fully check (a string
    that may hold a control character).  Bytes must be UTF-8 without a byte-order mark, as the
    contract says: ``json.loads`` alone would also read UTF-16, UTF-32 and a BOM.
    """
    if isinstance(raw, (bytes, bytearray, memoryview)):
        raw = bytes(raw)
        if raw.startswith(_BOM):
            raise ContractError("not valid JSON: starts with a UTF-8 byte-order mark (the contract is UTF-8 "
                                "without one)")
        if raw[:2] in (b"\xff\xfe", b"\xfe\xff"):
            raise ContractError("not valid JSON: starts with a UTF-16 or UTF-32 byte-order mark (the contract "
                                "is UTF-8)")
        if 0 in raw:  # JSON text never holds a NUL byte; UTF-16 and UTF-32 text always does
            raise ContractError(f"not valid JSON: a NUL byte at offset {raw.index(0)} (UTF-16 or UTF-32? the "
                                "contract is UTF-8)")
        try:
            text = raw.decode("utf-8")
        except UnicodeDecodeError as exc:
            raise ContractError(f"not valid JSON: not UTF-8 (byte 0x{raw[exc.start]:02x} at offset "
                                f"{exc.start})") from None
    else:
        text = raw
    try:
        msg = json.loads(text)
    except ValueError as exc:
        raise ContractError(f"not valid JSON: {exc}") from None
    except RecursionError:  # [[[[...]]]] nested deeper than the parser's stack
        raise ContractError("not valid JSON: nested too deeply") from None
    validate(msg, topic)
    try:
        return msgspec.convert(msg, _EVENT_UNION)  # type: ignore[no-any-return]
    except msgspec.ValidationError as exc:  # pragma: no cover - validate() accepted what msgspec cannot hold
        raise ContractError(f"not decodable: {exc}") from None


def message_key(msg: Mapping[str, Any]) -> bytes:
    """Return the Kafka key the contract assigns to ``msg`` (job id or node id)."""
    t = _TOPIC_BY_KIND[msg["kind"]]
    return str(msg["job"] if t.key == "job id" else msg["node"]).encode()


def render_markdown() -> str:
    """Render the field tables of ``docs/events.md`` from the contract above."""
    out: list[str] = []
    out.append(f"Schema version: **{SCHEMA_VERSION}**.\n")
    out.append("### Envelope (every message)\n")
    out.append(_table(ENVELOPE))
    out.append("### Topics\n")
    out.append("| topic | key | `kind` | body | what |\n|---|---|---|---|---|")
    for t in TOPICS:
        out.append(f"| `{t.name}`{' (compacted)' if t.compacted else ''} | {t.key} | `{t.kind}` | "
                   f"{t.body.name} | {t.doc} |")
    out.append(f"| `{TOPIC_DIAGNOSES}` | fingerprint | — | Diagnosis | What the engine concluded "
               "(written by the engine; see below). |")
    out.append(f"| `{TOPIC_DEADLETTER}` | source topic | — | DeadLetter | Messages that broke this contract, "
               "with the reason (written by the engine). |")
    out.append("")
    for t in TOPICS:
        out.append(f"### {t.body.name} — `{t.name}`\n")
        out.append(_table(t.body.fields))
        for rec in t.lists.values():
            out.append(f"#### {rec.name}\n\n{rec.doc}\n")
            out.append(_table(rec.fields))
    return "\n".join(out)


def _table(fields: tuple[Field, ...]) -> str:
    rows = ["| field | type | unit | required | meaning |", "|---|---|---|---|---|"]
    for f in fields:
        rows.append(f"| `{f.name}` | {f.type} | {f.unit} | {'yes' if f.required else 'no'} | {f.doc} |")
    return "\n".join(rows) + "\n"
