"""Simulated hw reports and fail-slow faults (agents/simulate/hardware.py)."""

from __future__ import annotations

from agents.events import validate
from agents.simulate.hardware import HW_FAULTS, GpuNvmlHang, PcieDowngrade, with_hw
from agents.simulate.scenario import parse_scenario
from agents.simulate.sim import Simulation


def _sim(faults: list) -> Simulation:
    sc = parse_scenario({"seed": 3, "duration_s": 60, "cluster": {"nodes": 4}})
    return Simulation(sc.topology, sc.jobs, faults, start_time=1_764_442_800.0, duration_s=60, seed=3)


def test_healthy_reports_follow_the_agents_cadence_and_pass_the_contract() -> None:
    hw = [m for _, m in with_hw(_sim([])) if m["kind"] == "hw"]
    assert len(hw) == 4 * 60  # one per node per interval: NVML health and the kernel log
    for m in hw:
        validate(m)
    n1 = [m for m in hw if m["node"] == "node-01"]
    assert [i for i, m in enumerate(n1) if "pcie" in m] == [0, 10, 20, 30, 40, 50]
    assert [i for i, m in enumerate(n1) if "bmc" in m] == [0, 30]
    assert all(link["width"] == 16 for m in n1 if "pcie" in m for link in m["pcie"])


def test_a_pcie_downgrade_shows_only_on_its_gpu_during_the_fault_with_truth() -> None:
    f = PcieDowngrade("node-02:gpu3", 20, 40, width=4)
    sim = _sim([f])
    msgs = [m for _, m in with_hw(sim, [f]) if m["kind"] == "hw" and "pcie" in m]
    narrow = {(m["node"], round(m["time"] - sim.start_time), link["gpu"])
              for m in msgs for link in m["pcie"] if link["width"] < 16}
    assert narrow == {("node-02", 21, 3), ("node-02", 31, 3)}
    (truth,) = sim.ground_truth()
    assert truth.cause == "hardware.pcie-downgraded" and truth.culprit == "node-02 gpu 3"


def test_an_nvml_hang_marks_the_gpu_unresponsive_and_stalls_the_job() -> None:
    f = GpuNvmlHang("node-01:gpu0", 20, 40)
    sim = _sim([f])
    msgs = [m for _, m in with_hw(sim, [f])]
    dead = [m["time"] - sim.start_time for m in msgs if m["kind"] == "hw"
            for h in m["nvml"] if not h["responsive"]]
    assert min(dead) == 21 and max(dead) == 40
    steps_during = [m for m in msgs if m["kind"] == "steps" and 25 <= m["time"] - sim.start_time <= 40]
    assert steps_during == []
    assert set(HW_FAULTS) == {"pcie-downgrade", "nic-speed-low", "cooling-degraded", "psu-failed", "kernel-mce",
                              "gpu-nvml-hang", "rdma-gid-missing"}
