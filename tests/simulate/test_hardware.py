"""Simulated hw reports and fail-slow faults (simulate/hardware.py)."""

from __future__ import annotations

import pytest
from whywait.agents.events import validate
from whywait.simulate.errors import SimulationError
from whywait.simulate.faults import FAULTS, register
from whywait.simulate.hardware import HW_FAULTS, GpuNvmlHang, PcieDowngrade
from whywait.simulate.scenario import parse_scenario
from whywait.simulate.sim import Simulation


def _sim(faults: list) -> Simulation:
    sc = parse_scenario({"seed": 3, "duration_s": 60, "cluster": {"nodes": 4}})
    return Simulation(sc.topology, sc.jobs, faults, start_time=1_764_442_800.0, duration_s=60, seed=3)


def test_healthy_reports_follow_the_agents_cadence_and_pass_the_contract() -> None:
    hw = [m for _, m in _sim([]).messages() if m["kind"] == "hw"]
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
    msgs = [m for _, m in sim.messages() if m["kind"] == "hw" and "pcie" in m]
    narrow = {(m["node"], round(m["time"] - sim.start_time), link["gpu"])
              for m in msgs for link in m["pcie"] if link["width"] < 16}
    assert narrow == {("node-02", 21, 3), ("node-02", 31, 3)}
    (truth,) = sim.ground_truth()
    assert truth.cause == "hardware.pcie-downgraded" and truth.culprit == "node-02 gpu 3"


def test_an_nvml_hang_marks_the_gpu_unresponsive_and_stalls_the_job() -> None:
    f = GpuNvmlHang("node-01:gpu0", 20, 40)
    sim = _sim([f])
    msgs = [m for _, m in sim.messages()]
    dead = [m["time"] - sim.start_time for m in msgs if m["kind"] == "hw"
            for h in m["nvml"] if not h["responsive"]]
    assert min(dead) == 21 and max(dead) == 40
    steps_during = [m for m in msgs if m["kind"] == "steps" and 25 <= m["time"] - sim.start_time <= 40]
    assert steps_during == []
    assert set(HW_FAULTS) == {"pcie-downgrade", "nic-speed-low", "cooling-degraded", "psu-failed", "kernel-mce",
                              "gpu-nvml-hang", "rdma-gid-missing"}


def test_the_hardware_faults_are_in_the_registry_and_work_from_a_scenario_file() -> None:
    assert {n: FAULTS[n] for n in HW_FAULTS} == HW_FAULTS
    sc = parse_scenario({"seed": 3, "duration_s": 60, "cluster": {"nodes": 4},
                         "faults": [{"fault": "psu-failed", "target": "node-03", "start": 10, "end": 50}]})
    sim = Simulation(sc.topology, sc.jobs, sc.faults, start_time=1_764_442_800.0, duration_s=60, seed=3)
    bmc = {(m["node"], round(m["time"] - sim.start_time)): {s["name"]: s["health"] for s in m["bmc"]}
           for _, m in sim.messages() if m["kind"] == "hw" and "bmc" in m}
    assert bmc[("node-03", 31)]["PSU 1"] == "critical" and bmc[("node-03", 31)]["Power Redundancy"] == "warning"
    assert bmc[("node-03", 1)]["PSU 1"] == "ok"  # before the fault
    assert all(v["PSU 1"] == "ok" for (node, _), v in bmc.items() if node != "node-03")
    (truth,) = sim.ground_truth()
    assert truth.cause == "hardware.cooling-power-degraded" and truth.culprit == "node-03"


def test_a_name_taken_by_another_fault_cannot_be_registered_twice() -> None:
    class Impostor(PcieDowngrade):
        pass

    with pytest.raises(SimulationError, match="already registered"):
        register(Impostor)
    register(PcieDowngrade)  # the same class again is harmless (a module imported twice)
    assert FAULTS["pcie-downgrade"] is PcieDowngrade


def test_a_node_whose_gpus_clock_down_reads_its_bmc_at_once_like_the_agent() -> None:
    sc = parse_scenario({"seed": 3, "duration_s": 90, "cluster": {"nodes": 4},
                         "faults": [{"fault": "cooling-degraded", "target": "node-02", "start": 40, "end": 80}]})
    sim = Simulation(sc.topology, sc.jobs, sc.faults, start_time=1_764_442_800.0, duration_s=90, seed=3)
    n2 = [m for _, m in sim.messages() if m["kind"] == "hw" and m["node"] == "node-02"]
    at = [i + 1 for i, m in enumerate(n2) if "bmc" in m]  # seconds from the start
    # the regular polls at 1, 31, 61; the fault's clocks drop at 41, the read lands in the next report, and
    # the next asked-for read waits a minute (rate-limited)
    assert at == [1, 31, 42, 61]
    fan = next(s for s in n2[41]["bmc"] if s["name"] == "Fan 1")
    assert fan["health"] == "critical"
