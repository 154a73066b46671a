from __future__ import annotations

import logging
import subprocess
import sys

import pytest
from whywait.agents.collectors.gpu import NvmlCollector, decode_throttle
from whywait.agents.events import TOPIC_GPU, envelope, validate

from tests.agents.conftest import fixture_path
from tests.agents.fake_nvml import FakeNvml, NVMLError_LibraryNotFound, load_capture

H100 = "linux-x86_64__nvidia-h100-80gb-hbm3__590.48.01.txt"
H200 = "linux-x86_64__nvidia-h200__590.48.01.txt"
H200_MIG = "linux-x86_64__nvidia-h200-mig__590.48.01.txt"
L40S = "linux-x86_64__nvidia-l40s__595.80.txt"


def capture(name: str):  # noqa: ANN201
    return load_capture(fixture_path("nvidia-smi", name))


def sample(c: NvmlCollector, mono: float) -> dict:
    body = c.collect(1_764_442_800.0 + mono, mono)
    assert body is not None
    validate(envelope("gpu", "node-01", 1_764_442_800.0 + mono, **body), TOPIC_GPU)
    return body


def test_h100_under_load_matches_the_capture() -> None:
    fake = FakeNvml([capture(H100)])
    fake.row = 1  # the capture taken under gpu-burn
    c = NvmlCollector(nvml=fake)
    g = sample(c, 0.0)["gpus"][0]
    assert g["gpu"] == 0 and g["uuid"] == "GPU-00000000-0000-0000-0000-000000000000"
    assert g["util_pct"] == 100.0 and g["mem_util_pct"] == 11.0
    assert g["mem_used_bytes"] == 19818 << 20 and g["mem_total_bytes"] == 81559 << 20
    assert g["temp_c"] == 59.0 and g["power_w"] == 631.95 and g["power_limit_w"] == 700.0
    assert g["sm_clock_mhz"] == 1980.0 and g["sm_clock_max_mhz"] == 1980.0
    assert g["throttle_reasons"] == []
    assert g["pcie_tx_bytes_per_s"] == 3092 * 1024 and g["pcie_rx_bytes_per_s"] == 6346 * 1024
    assert g["remapped_rows_pending"] is False
    assert g["nvlink_errors"] == 0 and g["xid"] == []
    assert g["pci_bus_id"] == "00000000:00:09.0"


def test_idle_h100_reports_gpu_idle_clock_event() -> None:
    fake = FakeNvml([capture(H100)])
    g = sample(NvmlCollector(nvml=fake), 0.0)["gpus"][0]
    assert g["throttle_reasons"] == ["gpu_idle"] and g["sm_clock_mhz"] == 345.0


def test_throttle_reasons_decode_to_contract_names() -> None:
    assert decode_throttle(0x4 | 0x40 | 0x80) == ["sw_power_cap", "hw_thermal_slowdown", "hw_power_brake_slowdown"]
    assert decode_throttle(0) == []
    fake = FakeNvml([capture(H200)])
    fake.reasons[0] = 0x8 | 0x20
    assert sample(NvmlCollector(nvml=fake), 0.0)["gpus"][0]["throttle_reasons"] == ["hw_slowdown",
                                                                                     "sw_thermal_slowdown"]


def test_repeated_xid_is_seen_twice_and_only_once() -> None:
    fake = FakeNvml([capture(H100), capture(H200)])
    c = NvmlCollector(nvml=fake)
    assert fake.registered == [0, 1]
    fake.inject_xid(1, 79)
    fake.inject_xid(1, 79)
    fake.inject_xid(0, 48)
    gpus = sample(c, 1.0)["gpus"]
    assert gpus[1]["xid"] == [79, 79] and gpus[0]["xid"] == [48]
    assert [g["xid"] for g in sample(c, 2.0)["gpus"]] == [[], []]


def test_ecc_nvlink_and_replay_are_interval_deltas() -> None:
    fake = FakeNvml([capture(H100)])
    c = NvmlCollector(nvml=fake)
    first = sample(c, 0.0)["gpus"][0]
    assert first["ecc_corrected"] == 0 and first["pcie_replay"] == 0  # no interval yet: nothing counted
    fake.ecc[0][0] += 3
    fake.ecc[0][1] += 1
    fake.nvlink_errors[0] += 5
    g = sample(c, 1.0)["gpus"][0]
    assert (g["ecc_corrected"], g["ecc_uncorrected"], g["nvlink_errors"]) == (3, 1, 5)
    g = sample(c, 2.0)["gpus"][0]
    assert (g["ecc_corrected"], g["ecc_uncorrected"], g["nvlink_errors"]) == (0, 0, 0)


def test_nvml_initialised_once_and_handles_reused() -> None:
    fake = FakeNvml([capture(H100), capture(L40S)])
    c = NvmlCollector(nvml=fake)
    for t in range(5):
        sample(c, float(t))
    assert fake.init_calls == 1 and fake.handle_calls == 2


def test_l40s_has_no_nvlink_field() -> None:
    g = sample(NvmlCollector(nvml=FakeNvml([capture(L40S)])), 0.0)["gpus"][0]
    assert "nvlink_errors" not in g and g["power_limit_w"] == 350.0


def test_mig_gpu_without_utilisation_travels_apart_and_keeps_xids() -> None:
    fake = FakeNvml([capture(H200_MIG), capture(H200)])
    fake.row = 1
    c = NvmlCollector(nvml=fake)
    fake.inject_xid(0, 94)
    body = sample(c, 0.0)
    assert [g["gpu"] for g in body["gpus"]] == [1]
    mig = body["gpus_incomplete"][0]
    assert mig["unavailable"] == ["util_pct", "mem_util_pct"]
    assert mig["xid"] == [94] and mig["mem_used_bytes"] == 16959 << 20 and "remapped_rows_pending" not in mig


def test_no_library_turns_collector_off_with_one_line(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, "whywait.agent")
    c = NvmlCollector(nvml=FakeNvml([], fail_init=NVMLError_LibraryNotFound("NVML Shared Library Not Found")))
    assert not c.enabled and c.collect() is None and c.collect() is None
    lines = [r.getMessage() for r in caplog.records]
    assert lines == ["GPU collector off: NVML did not start: NVMLError_LibraryNotFound: NVML Shared Library Not Found"]


def test_real_pynvml_on_this_gpu_less_machine_raises_library_not_found() -> None:
    import pynvml

    try:
        pynvml.nvmlInit()
    except pynvml.NVMLError_LibraryNotFound:
        pass
    else:  # pragma: no cover - a machine with a driver
        pynvml.nvmlShutdown()
        pytest.skip("this machine has an NVIDIA driver")
    c = NvmlCollector()
    assert not c.enabled and "NVMLError_LibraryNotFound" in (c.off_reason or "")
    assert c.collect() is None


def test_agent_without_driver_runs_the_other_collectors() -> None:
    proc = subprocess.run([sys.executable, "-m", "whywait.agents.cli", "--once", "--print", "--interval", "0.2",
                           "--node", "n1"], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    if "GPU collector off" not in proc.stderr:  # pragma: no cover - a machine with a driver
        pytest.skip("this machine has an NVIDIA driver")
    assert proc.stderr.count("GPU collector off: ") == 1
    assert '"kind":"host"' in proc.stdout and '"kind":"net"' in proc.stdout


# --- PCIe link and NVML health (issue 14) -----------------------------------------------------------

def test_pcie_link_comes_from_the_capture_and_a_retrained_link_shows() -> None:
    fake = FakeNvml([capture(H100), capture(L40S)])
    c = NvmlCollector(nvml=fake)
    gpus = sample(c, 0.0)["gpus"]
    assert {k: gpus[0][k] for k in ("pcie_link_gen", "pcie_link_gen_max", "pcie_link_width",
                                    "pcie_link_width_max")} == {"pcie_link_gen": 5, "pcie_link_gen_max": 5,
                                                                "pcie_link_width": 16, "pcie_link_width_max": 16}
    assert gpus[1]["pcie_link_gen"] == 4  # the L40S capture is a Gen4 card
    fake.pcie_override[0] = {"width": 8}   # the link retrained at x8
    assert sample(c, 1.0)["gpus"][0]["pcie_link_width"] == 8
    assert c.pcie[0]["pcie_link_width"] == 8 and c.pcie[0]["pcie_link_width_max"] == 16


def test_health_counts_calls_and_failures_per_gpu() -> None:
    fake = FakeNvml([capture(H100), capture(H200)])
    c = NvmlCollector(nvml=fake)
    c.take_health()  # what initialisation cost
    sample(c, 0.0)
    h = c.take_health()
    assert [x["gpu"] for x in h] == [0, 1] and all(x["responsive"] for x in h)
    assert all(x["calls"] >= 15 and x["errors"] == 0 and x["timeouts"] == 0 for x in h)
    assert all(0.0 <= x["latency_ms"] < 1000.0 for x in h)
    fake.fail[1] = fake.NVMLError("Unknown Error")
    sample(c, 1.0)
    h = c.take_health()
    assert h[0]["errors"] == 0
    assert h[1]["errors"] >= 5 and h[1]["error"] == "NVMLError: Unknown Error" and h[1]["responsive"]


def test_a_gpu_that_hangs_nvml_is_reported_and_never_hangs_the_agent() -> None:
    import threading
    import time

    fake = FakeNvml([capture(H100), capture(H200)])
    c = NvmlCollector(nvml=fake, call_timeout_s=0.3)
    sample(c, 0.0)
    c.take_health()
    gate = threading.Event()
    fake.hang[1] = gate
    t0 = time.monotonic()
    body = sample(c, 1.0)
    assert time.monotonic() - t0 < 2.0, "the sample waited on the hung GPU"
    assert [g["gpu"] for g in body["gpus"]] == [0]
    h = c.take_health()
    # about the 300 ms timeout: the wait and the clock read around it are scheduled apart on a loaded machine
    assert h[1]["responsive"] is False and h[1]["timeouts"] == 1 and h[1]["latency_ms"] >= 250.0
    assert h[0]["responsive"] is True
    # Still stuck: not asked again, still reported unresponsive, the other GPU still sampled.
    body = sample(c, 2.0)
    assert [g["gpu"] for g in body["gpus"]] == [0]
    assert c.take_health()[1]["responsive"] is False
    gate.set()  # the stuck call returns: the GPU answers again
    time.sleep(0.1)
    del fake.hang[1]
    body = sample(c, 3.0)
    assert [g["gpu"] for g in body["gpus"]] == [0, 1]
    assert c.take_health()[1]["responsive"] is True
    c.close()


def test_nvml_init_that_never_returns_turns_the_collector_off(caplog: pytest.LogCaptureFixture) -> None:
    import threading

    class HungInit(FakeNvml):
        def nvmlInit(self) -> None:  # noqa: N802
            threading.Event().wait(5)

    with caplog.at_level(logging.WARNING, logger="whywait.agent"):
        c = NvmlCollector(nvml=HungInit([capture(H100)]), init_timeout_s=0.2)
    assert not c.enabled and "did not answer within 0.2 s" in (c.off_reason or "")
    assert c.collect(0.0, 0.0) is None
