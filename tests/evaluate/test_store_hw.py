"""MetricStore._ingest_hw: the hw topic's lists become the metrics the hardware rules read."""

from __future__ import annotations

import pytest
from whywait.agents.events import envelope, validate
from whywait.engine.evaluate.store import MetricStore

T = 1_764_442_800.0


def ingest(**body: object) -> MetricStore:
    s = MetricStore()
    s.ingest(validate(envelope("hw", "n1", T, **body)))
    return s


def last(s: MetricStore, metric: str, entity: str) -> float | None:
    return s.value(metric, entity, "last", T, 5.0)


def test_pcie_links_give_ratios_per_gpu_and_per_nic_port() -> None:
    s = ingest(pcie=[
        {"device": "0000:18:00.0", "class": "gpu", "gpu": 2, "width": 8, "width_max": 16, "gen": 5, "gen_max": 5,
         "aer_correctable": 3, "tx_bytes_per_s": 1e9, "rx_bytes_per_s": 2e9},
        {"device": "0000:1a:00.0", "class": "nic", "nics": ["mlx5_0/1", "ibp26s0"], "width": 16, "width_max": 16,
         "gen": 4, "gen_max": 5},
        {"device": "0000:01:00.0", "class": "nvme", "width": 4, "width_max": 4, "gen": 3, "gen_max": 4}])
    assert last(s, "gpu.pcie_width_ratio", "n1/gpu2") == 0.5
    assert last(s, "gpu.pcie_bandwidth_ratio", "n1/gpu2") == pytest.approx(0.5)
    assert last(s, "gpu.pcie_aer_errors", "n1/gpu2") == 3.0
    assert last(s, "gpu.pcie_bytes_per_s", "n1/gpu2") == 3e9
    assert last(s, "gpu.pcie_lost", "n1/gpu2") == 0.0
    # Gen4 of Gen5 is half the per-lane rate: half the bandwidth at full width
    assert last(s, "nic.pcie_bandwidth_ratio", "n1/mlx5_0/1") == pytest.approx(15.754 / 31.508)
    assert {"n1/mlx5_0/1", "n1/ibp26s0"} <= s.nics["n1"]
    assert last(s, "node.pcie_links_degraded", "n1") == 2.0  # the NIC and the NVMe drive; GPUs count apart


def test_port_speed_compares_ports_of_one_model_and_finds_missing_gids() -> None:
    s = ingest(ports=[
        {"nic": "mlx5_0/1", "speed_mbps": 400000.0, "link_layer": "InfiniBand", "model": "15b3:1021", "rdma": True,
         "link_up": True, "gids": 1},
        {"nic": "mlx5_1/1", "speed_mbps": 200000.0, "link_layer": "InfiniBand", "model": "15b3:1021", "rdma": True,
         "link_up": True, "gids": 1},
        {"nic": "bond0/1", "speed_mbps": 200000.0, "link_layer": "Ethernet", "model": "15b3:1021", "rdma": True,
         "link_up": True, "gids": 2, "roce_v2_gids": 0},
        {"nic": "eno1", "speed_mbps": 1000.0, "link_layer": "Ethernet", "model": "14e4:165f", "rdma": False,
         "link_up": True, "speed_max_mbps": 10000.0, "speed_common_max_mbps": 10000.0}])
    assert last(s, "nic.speed_common_ratio", "n1/eno1") == 0.1  # both ends could do 10G: it negotiated down
    assert last(s, "nic.speed_common_ratio", "n1/mlx5_0/1") is None  # IB: no such figure
    assert last(s, "nic.speed_ratio", "n1/mlx5_1/1") == 0.5
    assert last(s, "nic.speed_ratio", "n1/eno1") == 1.0  # a management port is compared with its own kind only
    assert last(s, "net.port_speed_ratio", "n1") == 0.5
    assert last(s, "net.rdma_min_gbps", "n1") == 200.0
    assert last(s, "nic.gid_missing", "n1/bond0/1") == 1.0 and last(s, "nic.gid_missing", "n1/mlx5_0/1") == 0.0
    assert last(s, "net.gids_missing", "n1") == 1.0


def test_kernel_classes_are_counted_and_routine_ones_kept_out_of_hw_errors() -> None:
    ev = [{"seq": i, "class": c, "level": 4, "message": "x"} for i, c in
          enumerate(["mce", "mce", "pcie_aer", "xid", "fs_readonly", "hung_task", "oom"])]
    s = ingest(kernel=ev)
    assert last(s, "kernel.mce", "n1") == 2.0 and last(s, "kernel.pcie_aer", "n1") == 1.0
    assert last(s, "kernel.hw_errors", "n1") == 3.0  # mce ×2 and fs_readonly; not AER, XID, hung task, OOM
    assert last(s, "kernel.io_error", "n1") == 0.0  # an empty class is a zero, not a gap


def test_bmc_sensors_count_failures_and_keep_the_hottest_inlet() -> None:
    s = ingest(bmc=[
        {"name": "Fan 1", "type": "fan", "health": "critical", "reading": 0.0, "unit": "RPM"},
        {"name": "Fan 2", "type": "fan", "health": "ok", "reading": 9000.0, "unit": "RPM"},
        {"name": "Inlet A", "type": "temperature", "health": "ok", "context": "inlet", "reading": 24.0},
        {"name": "Inlet B", "type": "temperature", "health": "warning", "context": "inlet", "reading": 36.0},
        {"name": "PSU 1", "type": "psu", "health": "unknown"},
        {"name": "Power Redundancy", "type": "redundancy", "health": "warning"},
        {"name": "System Input Power", "type": "power", "health": "ok", "reading": 344.0}])
    assert last(s, "bmc.fans_failed", "n1") == 1.0 and last(s, "bmc.psus_failed", "n1") == 0.0
    assert last(s, "bmc.redundancy_lost", "n1") == 1.0 and last(s, "bmc.temps_over_threshold", "n1") == 1.0
    assert last(s, "bmc.inlet_temp_c", "n1") == 36.0 and last(s, "bmc.power_w", "n1") == 344.0


def test_nvml_health_and_absent_lists() -> None:
    s = ingest(nvml=[{"gpu": 0, "responsive": False, "latency_ms": 2500.0, "calls": 0, "errors": 0, "timeouts": 1}])
    assert last(s, "gpu.nvml_unresponsive", "n1/gpu0") == 1.0 and last(s, "gpu.nvml_timeouts", "n1/gpu0") == 1.0
    assert last(s, "kernel.hw_errors", "n1") is None  # an absent list says nothing
    assert "n1" not in s.node_last  # hw is not a periodic report: it does not mark the node as seen
