"""A fake NVML library object, shaped after real ``nvidia-smi`` captures.

:func:`load_capture` reads one ``nvidia_gpu_exporter`` capture file (H100,
H200, H200 with MIG, L40S): its ``--query-gpu`` CSV rows (one idle, one under
load), the ``-q`` PCIe replay and throughput lines, and the ``nvlink -s`` link
list.  :class:`FakeNvml` answers the ``pynvml`` functions the NVML collector
calls from those values; a field the capture shows as ``[N/A]`` raises
``NVMLError_NotSupported`` as the real library does.  Tests inject XID events
and ECC errors through :meth:`FakeNvml.inject_xid` and the ``ecc`` dict.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from types import SimpleNamespace
from typing import Any


class NVMLError(Exception):
    pass


class NVMLError_NotSupported(NVMLError):  # noqa: N801 - pynvml's spelling
    pass


class NVMLError_Timeout(NVMLError):  # noqa: N801
    pass


class NVMLError_LibraryNotFound(NVMLError):  # noqa: N801
    pass


@dataclass
class Capture:
    """What one capture file says about its single GPU."""

    name: str
    rows: list[dict[str, str]]            # --query-gpu rows: idle first, then under load
    replays: list[int] = field(default_factory=list)
    tx_kbs: list[int] = field(default_factory=list)
    rx_kbs: list[int] = field(default_factory=list)
    nvlinks: int = 0


def load_capture(path: str) -> Capture:
    lines = open(path, encoding="utf-8").read().splitlines()
    rows: list[dict[str, str]] = []
    cap = Capture(path.rsplit("/", 1)[-1], rows)
    for i, line in enumerate(lines):
        if line.startswith("# $ nvidia-smi --query-gpu"):
            j = i + 1
            while not lines[j].startswith("timestamp"):
                j += 1
            header = [h.strip().split(" ")[0] for h in lines[j].split(",")]
            rows.append(dict(zip(header, (v.strip() for v in lines[j + 1].split(",")), strict=True)))
        m = re.match(r"\s+Replays Since Reset\s+:\s+(\d+)", line)
        if m:
            cap.replays.append(int(m.group(1)))
        m = re.match(r"\s+(Tx|Rx) Throughput\s+:\s+(\d+) KB/s", line)
        if m:
            (cap.tx_kbs if m.group(1) == "Tx" else cap.rx_kbs).append(int(m.group(2)))
        if re.match(r"\s+Link \d+: [\d.]+ GB/s", line):
            cap.nvlinks += 1
    return cap


def _num(v: str) -> float:
    """``'631.95 W'`` → 631.95; ``[N/A]`` → NotSupported."""
    if v.startswith("[") or v in ("N/A", ""):
        raise NVMLError_NotSupported("Not Supported")
    return float(v.split()[0])


class FakeNvml:
    """Module-like stand-in for ``pynvml`` over one or more captured GPUs."""

    NVMLError = NVMLError
    NVMLError_NotSupported = NVMLError_NotSupported
    NVMLError_Timeout = NVMLError_Timeout

    def __init__(self, captures: list[Capture], fail_init: Exception | None = None) -> None:
        self.captures = captures
        self.row = 0                      # which --query-gpu row (0 idle, 1 load)
        self.fail_init = fail_init
        self.init_calls = 0
        self.handle_calls = 0
        self.events: list[tuple[int, int]] = []   # pending (gpu, xid)
        self.registered: list[int] = []
        self.ecc = {i: [0, 0] for i in range(len(captures))}  # corrected, uncorrected (volatile)
        self.nvlink_errors = {i: 0 for i in range(len(captures))}
        self.reasons: dict[int, int] = {}
        self.pcie_override: dict[int, dict[str, int]] = {}  # GPU -> {"width": 8, ...}: a retrained link
        self.hang: dict[int, Any] = {}   # GPU -> threading.Event: its calls block until the event is set
        self.fail: dict[int, Exception] = {}  # GPU -> the error its calls raise ("Unknown Error")

    # --- lifecycle ---------------------------------------------------------
    def nvmlInit(self) -> None:  # noqa: N802 - pynvml's names
        self.init_calls += 1
        if self.fail_init is not None:
            raise self.fail_init

    def nvmlShutdown(self) -> None:  # noqa: N802
        pass

    def nvmlDeviceGetCount(self) -> int:  # noqa: N802
        return len(self.captures)

    def nvmlDeviceGetHandleByIndex(self, i: int) -> Any:  # noqa: N802
        self.handle_calls += 1
        return SimpleNamespace(index=i)

    def nvmlDeviceGetIndex(self, h: Any) -> int:  # noqa: N802
        return h.index

    def _r(self, h: Any) -> dict[str, str]:
        if h.index in self.hang:
            self.hang[h.index].wait()   # a GPU that makes NVML block, as a hung GPU does
        if h.index in self.fail:
            raise self.fail[h.index]
        cap = self.captures[h.index]
        return cap.rows[min(self.row, len(cap.rows) - 1)]

    # --- identity ----------------------------------------------------------
    def nvmlDeviceGetUUID(self, h: Any) -> str:  # noqa: N802
        return self._r(h)["uuid"]

    def nvmlDeviceGetPciInfo(self, h: Any) -> Any:  # noqa: N802
        return SimpleNamespace(busId=self._r(h)["pci.bus_id"].encode())

    def nvmlDeviceGetMaxClockInfo(self, h: Any, clock: int) -> int:  # noqa: N802
        return int(_num(self._r(h)["clocks.max.sm"]))

    def nvmlDeviceGetNvLinkState(self, h: Any, link: int) -> int:  # noqa: N802
        n = self.captures[h.index].nvlinks
        if n == 0:
            raise NVMLError_NotSupported("Not Supported")
        if link >= n:
            raise NVMLError("Invalid Argument")
        return 1

    # --- samples -----------------------------------------------------------
    def nvmlDeviceGetUtilizationRates(self, h: Any) -> Any:  # noqa: N802
        r = self._r(h)
        return SimpleNamespace(gpu=int(_num(r["utilization.gpu"])), memory=int(_num(r["utilization.memory"])))

    def nvmlDeviceGetMemoryInfo(self, h: Any) -> Any:  # noqa: N802
        r = self._r(h)
        total = int(_num(r["memory.total"])) << 20
        used = int(_num(r["memory.used"])) << 20
        return SimpleNamespace(total=total, used=used, free=total - used)

    def nvmlDeviceGetTemperature(self, h: Any, sensor: int) -> int:  # noqa: N802
        return int(_num(self._r(h)["temperature.gpu"]))

    def nvmlDeviceGetPowerUsage(self, h: Any) -> int:  # noqa: N802
        return int(round(_num(self._r(h)["power.draw"]) * 1000))

    def nvmlDeviceGetEnforcedPowerLimit(self, h: Any) -> int:  # noqa: N802
        return int(round(_num(self._r(h)["enforced.power.limit"]) * 1000))

    def nvmlDeviceGetClockInfo(self, h: Any, clock: int) -> int:  # noqa: N802
        return int(_num(self._r(h)["clocks.current.sm"]))

    def nvmlDeviceGetCurrentClocksEventReasons(self, h: Any) -> int:  # noqa: N802
        if h.index in self.reasons:
            return self.reasons[h.index]
        return int(self._r(h)["clocks_event_reasons.active"], 16)

    def nvmlDeviceGetTotalEccErrors(self, h: Any, error_type: int, counter_type: int) -> int:  # noqa: N802
        r = self._r(h)
        base = r["ecc.errors.corrected.volatile.total" if error_type == 0 else "ecc.errors.uncorrected.volatile.total"]
        return int(_num(base)) + self.ecc[h.index][error_type]

    def nvmlDeviceGetRemappedRows(self, h: Any) -> tuple[int, int, int, int]:  # noqa: N802
        r = self._r(h)
        if r["remapped_rows.pending"].startswith("["):
            raise NVMLError_NotSupported("Not Supported")
        yes = {"Yes": 1, "No": 0}
        return (int(_num(r["remapped_rows.correctable"])), int(_num(r["remapped_rows.uncorrectable"])),
                yes[r["remapped_rows.pending"]], yes[r["remapped_rows.failure"]])

    def nvmlDeviceGetPcieReplayCounter(self, h: Any) -> int:  # noqa: N802
        cap = self.captures[h.index]
        return cap.replays[min(self.row, len(cap.replays) - 1)]

    def nvmlDeviceGetPcieThroughput(self, h: Any, counter: int) -> int:  # noqa: N802
        cap = self.captures[h.index]
        values = cap.tx_kbs if counter == 0 else cap.rx_kbs
        if not values:
            raise NVMLError_NotSupported("Not Supported")
        return values[min(self.row, len(values) - 1)]

    def nvmlDeviceGetNvLinkErrorCounter(self, h: Any, link: int, counter: int) -> int:  # noqa: N802
        return self.nvlink_errors[h.index] if link == 0 and counter == 0 else 0

    # --- PCIe link (the capture's pcie.link.* columns) ---------------------
    def _link(self, h: Any, key: str, column: str) -> int:
        v = self.pcie_override.get(h.index, {}).get(key)
        return v if v is not None else int(_num(self._r(h)[column]))

    def nvmlDeviceGetCurrPcieLinkGeneration(self, h: Any) -> int:  # noqa: N802
        return self._link(h, "gen", "pcie.link.gen.current")

    def nvmlDeviceGetMaxPcieLinkGeneration(self, h: Any) -> int:  # noqa: N802
        return self._link(h, "gen_max", "pcie.link.gen.max")

    def nvmlDeviceGetCurrPcieLinkWidth(self, h: Any) -> int:  # noqa: N802
        return self._link(h, "width", "pcie.link.width.current")

    def nvmlDeviceGetMaxPcieLinkWidth(self, h: Any) -> int:  # noqa: N802
        return self._link(h, "width_max", "pcie.link.width.max")

    # --- XID events --------------------------------------------------------
    def nvmlEventSetCreate(self) -> Any:  # noqa: N802
        return SimpleNamespace(kind="eventset")

    def nvmlDeviceRegisterEvents(self, h: Any, types: int, event_set: Any) -> None:  # noqa: N802
        self.registered.append(h.index)

    def nvmlEventSetWait_v2(self, event_set: Any, timeout_ms: int) -> Any:  # noqa: N802
        if not self.events:
            raise NVMLError_Timeout("Timeout")
        gpu, xid = self.events.pop(0)
        return SimpleNamespace(device=SimpleNamespace(index=gpu), eventType=0x8, eventData=xid,
                               gpuInstanceId=0xFFFFFFFF, computeInstanceId=0xFFFFFFFF)

    def nvmlEventSetFree(self, event_set: Any) -> None:  # noqa: N802
        pass

    def inject_xid(self, gpu: int, xid: int) -> None:
        self.events.append((gpu, xid))
