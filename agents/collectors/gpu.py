"""GPUs through NVML (the ``nvidia-ml-py`` package, imported as ``pynvml``).

NVML is initialised once and its device handles reused; nothing runs
``nvidia-smi``.  XID errors come from NVML's event API: an event set registered
for ``nvmlEventTypeXidCriticalError`` on every GPU is drained without waiting
(timeout 0) each interval, so a repeated XID is reported once per occurrence.

Counters (volatile ECC, PCIe replays, NVLink errors) become per-interval
counts.  A query a GPU does not support (``NVMLError_NotSupported``: no NVLink
on an L40S, no utilisation under MIG) is remembered and not asked again.

**NVML's own health is a signal.**  A GPU that is failing often shows first as
NVML calls that take seconds or never return (``nvidia-smi`` hangs), or fail
with ``Unknown Error``.  Every call is timed and its failures counted per GPU
(:meth:`NvmlCollector.take_health`, published on the ``hw`` topic), and the
agent never hangs on one: initialisation, the XID drain and each GPU's sample
run in worker threads under a deadline (``call_timeout_s``).  A GPU whose
sample misses the deadline is reported unresponsive and left out of the
``gpu`` message; it is not asked again until the stuck call returns (a
blocked C call cannot be interrupted; its thread is the watchdog's probe).

Each sample also carries the PCIe link the GPU negotiated against its maximum
(``nvmlDeviceGetCurrPcieLinkWidth``/``Generation`` and their ``Max``).

Tests pass a module-like fake as ``nvml``; the real library is imported only
when none is given.
"""

from __future__ import annotations

import concurrent.futures as cf
import math
import threading
import time
from typing import Any

from whywait.agents.collectors.base import COUNTER_MAX, Collector, CollectorOff, failure_key, log
from whywait.agents.collectors.fit import field_ok, name_ok
from whywait.agents.rates import RateTracker

# Clock-event (throttle) reason bits, as in nvml.h, and the names events.py documents.
THROTTLE_REASONS: tuple[tuple[int, str], ...] = (
    (0x0001, "gpu_idle"),
    (0x0002, "applications_clocks_setting"),
    (0x0004, "sw_power_cap"),
    (0x0008, "hw_slowdown"),
    (0x0010, "sync_boost"),
    (0x0020, "sw_thermal_slowdown"),
    (0x0040, "hw_thermal_slowdown"),
    (0x0080, "hw_power_brake_slowdown"),
    (0x0100, "display_clock_setting"),
)

# NVML constants, spelled out so a fake needs only the functions.
_TEMPERATURE_GPU = 0
_CLOCK_SM = 1
_MEMORY_ERROR_CORRECTED = 0
_MEMORY_ERROR_UNCORRECTED = 1
_VOLATILE_ECC = 0
_PCIE_TX_BYTES = 0
_PCIE_RX_BYTES = 1
_XID_CRITICAL = 0x0000000000000008
_NVLINK_MAX_LINKS = 18
_MAX_GPUS = 1024  # the contract's longest list: a count past it is NVML's garbage, not GPUs
_NVLINK_ERRORS = (0, 1, 2, 3)  # DL_REPLAY, DL_RECOVERY, DL_CRC_FLIT, DL_CRC_DATA


def decode_throttle(mask: int) -> list[str]:
    """Clock-event reason bitmask → the contract's names, in bit order."""
    return [name for bit, name in THROTTLE_REASONS if mask & bit]


class NvmlCollector(Collector):
    """Samples every GPU for a ``gpu`` message.

    ``nvml`` is the NVML binding (``pynvml``) or a fake with the same
    functions.  Without a driver the collector turns itself off with one line,
    ``GPU collector off: <why>``, and the agent's other collectors run.
    """

    name = "gpu"
    kind = "gpu"

    def __init__(self, root: str = "/", nvml: Any = None, call_timeout_s: float = 2.0,
                 init_timeout_s: float = 30.0) -> None:
        super().__init__(root)
        self.call_timeout_s = call_timeout_s
        self._pool: cf.ThreadPoolExecutor | None = None
        self._stuck: dict[int, cf.Future[Any]] = {}  # GPU index (-1: the XID drain) -> the call still blocked
        self._started: dict[int, float] = {}  # GPU index -> when its last call was submitted (monotonic)
        self._health: dict[int, dict[str, Any]] = {}
        self._hlock = threading.Lock()
        self.pcie: dict[int, dict[str, Any]] = {}  # GPU index -> its last PCIe link fields
        self.rates = RateTracker()
        self.handles: list[Any] = []
        self.uuids: list[str | None] = []
        self.bus_ids: list[str | None] = []
        self._max_sm: list[float | None] = []
        self._nvlinks: list[list[int]] = []
        self._unsupported: set[tuple[int, str]] = set()
        self._events: Any = None
        self._inited = False
        self.nvml = nvml
        # nvmlInit itself can hang on a sick GPU (as `nvidia-smi` does): give it a deadline.
        box: dict[str, BaseException | None] = {}

        def init() -> None:
            try:
                self._init()
                box["exc"] = None
            except BaseException as exc:  # noqa: BLE001 - handed back to the constructor's thread
                box["exc"] = exc

        t = threading.Thread(target=init, name="whywait-nvml-init", daemon=True)
        t.start()
        t.join(init_timeout_s)
        if "exc" not in box:
            self.turn_off(f"NVML did not answer within {init_timeout_s:g} s (a GPU or the driver is hung)")
            return
        exc = box["exc"]
        if isinstance(exc, CollectorOff):
            self.turn_off(str(exc))
        elif isinstance(exc, Exception):
            # NVML answering what it never should (a handle call failing on a GPU fallen off the bus, a
            # type never seen) turns the GPU collector off with one line; the agent's other collectors run.
            self.turn_off(f"NVML did not start: {_why(exc)}")
        elif exc is not None:
            raise exc  # KeyboardInterrupt, SystemExit: not NVML's
        else:
            self._pool = cf.ThreadPoolExecutor(max_workers=len(self.handles) + 1,
                                               thread_name_prefix="whywait-nvml")

    def _init(self) -> None:
        if self.nvml is None:
            try:
                import pynvml  # noqa: PLC0415 - optional dependency, imported only on GPU nodes
            except ImportError:
                raise CollectorOff("nvidia-ml-py is not installed (pip install 'whywait[gpu]')") from None
            self.nvml = pynvml
        n = self.nvml
        try:
            n.nvmlInit()
        except Exception as exc:  # NVMLError_LibraryNotFound, DriverNotLoaded, NoPermission...
            raise CollectorOff(f"NVML did not start: {_why(exc)}") from None
        self._inited = True
        try:
            count = n.nvmlDeviceGetCount()
        except Exception as exc:
            raise CollectorOff(f"NVML could not count GPUs: {_why(exc)}") from None
        if count == 0:
            raise CollectorOff("NVML sees no GPUs")
        if isinstance(count, bool) or not isinstance(count, int) or not 0 < count <= _MAX_GPUS:
            raise CollectorOff(f"NVML reports {str(count)[:40]} GPUs (no node has that many)")
        for i in range(count):
            h = n.nvmlDeviceGetHandleByIndex(i)
            self.handles.append(h)
            self.uuids.append(_str(self._try(i, "uuid", n.nvmlDeviceGetUUID, h)))
            pci = self._try(i, "pci", n.nvmlDeviceGetPciInfo, h)
            self.bus_ids.append(_str(getattr(pci, "busId", None)) if pci is not None else None)
            mx = _num(self._try(i, "max_sm", n.nvmlDeviceGetMaxClockInfo, h, _CLOCK_SM), "sm_clock_max_mhz")
            self._max_sm.append(mx)
            links = []
            for link in range(int(getattr(n, "NVML_NVLINK_MAX_LINKS", _NVLINK_MAX_LINKS))):
                try:
                    if n.nvmlDeviceGetNvLinkState(h, link):
                        links.append(link)
                except Exception:
                    break  # NotSupported (no NVLink) or InvalidArgument (past the last link)
            self._nvlinks.append(links)
        try:
            self._events = n.nvmlEventSetCreate()
        except Exception as exc:
            self.part_off("xid", f"no NVML event set: {_why(exc)}")
            return
        registered = 0
        for i, h in enumerate(self.handles):
            try:
                n.nvmlDeviceRegisterEvents(h, _XID_CRITICAL, self._events)
                registered += 1
            except Exception as exc:
                self.part_off(f"xid gpu {i}", f"XID events not available: {_why(exc)}")
        if not registered:
            self.part_off("xid", "no GPU accepts XID event registration")

    def _try(self, i: int, what: str, fn: Any, *args: Any) -> Any:
        """Call an NVML query, timing it and remembering per GPU what it does not support."""
        if (i, what) in self._unsupported:
            return None
        t0 = time.perf_counter()
        try:
            return fn(*args)
        except Exception as exc:
            if "NotSupported" in type(exc).__name__ or "Not Supported" in str(exc):
                self._unsupported.add((i, what))
            else:
                self.errors += 1
                self._note(i, error=_why(exc))
            return None
        finally:
            self._note(i, ms=(time.perf_counter() - t0) * 1000.0)

    def _note(self, i: int, ms: float | None = None, error: str | None = None, timeout: bool = False) -> None:
        """Add one call's latency, failure or timeout to GPU ``i``'s health for this interval."""
        with self._hlock:
            h = self._health.setdefault(i, {"calls": 0, "errors": 0, "timeouts": 0, "latency_ms": 0.0})
            if ms is not None:
                h["calls"] += 1
                h["latency_ms"] = max(h["latency_ms"], ms)
            if error is not None:
                h["errors"] += 1
                h["error"] = error[:200]
            if timeout:
                h["timeouts"] += 1

    def take_health(self) -> list[dict[str, Any]]:
        """Per GPU since the last call: responsive, slowest call, calls, errors, timeouts (``NvmlHealth``).

        Called by the ``hw`` collector once per interval, after this collector sampled.
        """
        out = []
        with self._hlock:
            health, self._health = self._health, {}
        for i in range(len(self.handles)):
            h = health.get(i, {"calls": 0, "errors": 0, "timeouts": 0, "latency_ms": 0.0})
            rec: dict[str, Any] = {"gpu": i, "responsive": i not in self._stuck,
                                   "latency_ms": round(h["latency_ms"], 3), "calls": h["calls"],
                                   "errors": h["errors"], "timeouts": h["timeouts"]}
            if i in self._stuck:
                # The stuck call has been waiting all along: that is its latency so far.
                rec["latency_ms"] = max(rec["latency_ms"], round(self._stuck_ms(i), 3))
            if h.get("error"):
                rec["error"] = h["error"]
            out.append(rec)
        return out

    def _stuck_ms(self, i: int) -> float:
        started = self._started.get(i)
        return (time.monotonic() - started) * 1000.0 if started is not None and i in self._stuck else 0.0

    def _guarded(self, key: int, fn: Any, *args: Any) -> cf.Future[Any] | None:
        """Submit ``fn`` to the worker pool unless the previous call for ``key`` is still blocked."""
        old = self._stuck.get(key)
        if old is not None:
            if not old.done():
                return None
            del self._stuck[key]
            log.info("GPU collector: %s answers again", "the XID drain" if key < 0 else f"GPU {key}")
        assert self._pool is not None
        self._started[key] = time.monotonic()
        return self._pool.submit(fn, *args)

    def _xids(self) -> dict[int, list[int]]:
        """Drain the event set without waiting: every XID since the last call, by GPU index."""
        out: dict[int, list[int]] = {}
        if self._events is None:
            return out
        n = self.nvml
        for _ in range(10_000):  # bounded: a storm of events must not stall the agent
            try:
                data = n.nvmlEventSetWait_v2(self._events, 0)
            except Exception as exc:
                if "Timeout" not in type(exc).__name__ and "Timeout" not in str(exc):
                    self.errors += 1
                break
            if not (data.eventType & _XID_CRITICAL):
                continue
            try:
                idx = n.nvmlDeviceGetIndex(data.device)
            except Exception:
                idx = self._index_of(data.device)
            out.setdefault(idx, []).append(int(data.eventData))
        return out

    def _index_of(self, handle: Any) -> int:
        for i, h in enumerate(self.handles):
            if h is handle or h == handle:
                return i
        return -1

    def _gpu(self, i: int, h: Any, mono: float, xids: list[int]) -> dict[str, Any]:
        """One GPU's record.

        NVML's answers are not trusted blindly: a failing GPU answers 0xFFFFFFFF for its temperature or
        clock, and a binding may hand back NaN.  A value the contract would refuse is treated as one NVML
        could not give (the field goes to ``unavailable``, the GPU to ``gpus_incomplete``), a counter that
        no counter holds gives no count, so one bad answer never costs the GPU's other fields, nor the
        node's other GPUs.
        """
        n = self.nvml
        util = self._try(i, "util", n.nvmlDeviceGetUtilizationRates, h)
        mem = self._try(i, "mem", n.nvmlDeviceGetMemoryInfo, h)
        temp = self._try(i, "temp", n.nvmlDeviceGetTemperature, h, _TEMPERATURE_GPU)
        power = self._try(i, "power", n.nvmlDeviceGetPowerUsage, h)
        sm = self._try(i, "sm_clock", n.nvmlDeviceGetClockInfo, h, _CLOCK_SM)
        rec: dict[str, Any] = {"gpu": i}
        if self.uuids[i]:
            rec["uuid"] = self.uuids[i]
        if self.bus_ids[i]:
            rec["pci_bus_id"] = self.bus_ids[i]
        # Under MIG the whole-GPU utilisation is not available (nvidia-smi: [N/A]).
        rec["util_pct"] = _num(getattr(util, "gpu", None), "util_pct")
        rec["mem_util_pct"] = _num(getattr(util, "memory", None), "mem_util_pct")
        used, total = _int(getattr(mem, "used", None)), _int(getattr(mem, "total", None))
        if field_ok("gpu", "gpus", "mem_used_bytes", used) and field_ok("gpu", "gpus", "mem_total_bytes", total):
            rec["mem_used_bytes"] = used
            rec["mem_total_bytes"] = total
        else:
            mem = None
        rec["temp_c"] = _num(temp, "temp_c")
        rec["power_w"] = _num(power, "power_w", 1e-3)
        limit = _num(self._try(i, "power_limit", n.nvmlDeviceGetEnforcedPowerLimit, h), "power_limit_w", 1e-3)
        if limit is not None:
            rec["power_limit_w"] = limit
        rec["sm_clock_mhz"] = _num(sm, "sm_clock_mhz")
        if self._max_sm[i] is not None:
            rec["sm_clock_max_mhz"] = self._max_sm[i]
        reasons_fn = getattr(n, "nvmlDeviceGetCurrentClocksEventReasons", None) \
            or n.nvmlDeviceGetCurrentClocksThrottleReasons
        mask = _int(self._try(i, "throttle", reasons_fn, h))
        rec["throttle_reasons"] = decode_throttle(mask) if mask is not None else []
        u = self.rates.update
        for field, etype in (("ecc_corrected", _MEMORY_ERROR_CORRECTED),
                             ("ecc_uncorrected", _MEMORY_ERROR_UNCORRECTED)):
            v = self._try(i, field, n.nvmlDeviceGetTotalEccErrors, h, etype, _VOLATILE_ECC)
            if v is not None:
                d = u((i, field), _int(v), mono)  # type: ignore[arg-type]  # None: refused as no counter
                rec[field] = d.delta if field_ok("gpu", "gpus", field, d.delta) else 0
        rows = self._try(i, "remapped_rows", n.nvmlDeviceGetRemappedRows, h)
        if rows is not None:
            rec["remapped_rows_pending"] = bool(rows[2])
            rec["remapped_rows_failed"] = bool(rows[3])
        rec["xid"] = xids
        replay = self._try(i, "pcie_replay", n.nvmlDeviceGetPcieReplayCounter, h)
        if replay is not None:
            d = u((i, "pcie_replay"), _int(replay), mono)  # type: ignore[arg-type]
            rec["pcie_replay"] = d.delta if field_ok("gpu", "gpus", "pcie_replay", d.delta) else 0
        for field, counter in (("pcie_tx_bytes_per_s", _PCIE_TX_BYTES), ("pcie_rx_bytes_per_s", _PCIE_RX_BYTES)):
            kb = _int(self._try(i, field, n.nvmlDeviceGetPcieThroughput, h, counter))
            if kb is not None and field_ok("gpu", "gpus", field, kb * 1024):
                rec[field] = kb * 1024  # NVML reports KB/s over a 20 ms window
        pcie: dict[str, int] = {}
        for field, fname in (("pcie_link_gen", "nvmlDeviceGetCurrPcieLinkGeneration"),
                             ("pcie_link_gen_max", "nvmlDeviceGetMaxPcieLinkGeneration"),
                             ("pcie_link_width", "nvmlDeviceGetCurrPcieLinkWidth"),
                             ("pcie_link_width_max", "nvmlDeviceGetMaxPcieLinkWidth")):
            fn = getattr(n, fname, None)
            v = _int(self._try(i, field, fn, h)) if fn is not None else None
            if v is not None and v <= _PCIE_MAX[field]:  # 0xFFFFFFFF: NVML could not say
                pcie[field] = v
        rec.update(pcie)
        self.pcie[i] = {**pcie, **{k: rec[k] for k in ("pcie_tx_bytes_per_s", "pcie_rx_bytes_per_s") if k in rec}}
        if self._nvlinks[i]:
            total = 0
            for link in self._nvlinks[i]:
                for counter in _NVLINK_ERRORS:
                    v = self._try(i, f"nvlink{link}.{counter}", n.nvmlDeviceGetNvLinkErrorCounter, h, link, counter)
                    c = _int(v) if v is not None else 0
                    total = -1 if c is None or total < 0 else total + c  # one garbage answer: no count
            d = u((i, "nvlink"), total, mono)
            rec["nvlink_errors"] = d.delta if field_ok("gpu", "gpus", "nvlink_errors", d.delta) else 0
        missing = [k for k in ("util_pct", "mem_util_pct", "temp_c", "power_w", "sm_clock_mhz")
                   if rec.get(k) is None] + (["mem_used_bytes"] if mem is None else [])
        if missing:
            rec["unavailable"] = missing
            for k in missing:
                rec.pop(k, None)
        return rec

    def sample(self, now: float, mono: float) -> dict[str, Any] | None:
        deadline = time.monotonic() + self.call_timeout_s
        xfut = self._guarded(-1, self._xids)
        xids: dict[int, list[int]] = {}
        if xfut is not None:
            try:
                xids = xfut.result(timeout=max(0.0, deadline - time.monotonic()))
            except cf.TimeoutError:
                self._stuck[-1] = xfut
                log.warning("GPU collector: the XID drain did not return within %g s", self.call_timeout_s)
        futs = {i: self._guarded(i, self._gpu, i, h, mono, xids.get(i, [])) for i, h in enumerate(self.handles)}
        running = [f for f in futs.values() if f is not None]
        cf.wait(running, timeout=max(0.0, deadline - time.monotonic()))
        body: dict[str, Any] = {"gpus": []}
        for i, fut in futs.items():
            if fut is None:
                continue  # still stuck from an earlier interval
            if not fut.done():
                self._stuck[i] = fut
                self._note(i, timeout=True)
                log.warning("GPU collector: GPU %d did not answer NVML within %g s; skipping it until it does",
                            i, self.call_timeout_s)
                continue
            try:
                rec = fut.result()
            except Exception as exc:  # one GPU's sample failing (a bug, an answer of a type never seen)
                self.errors += 1  # must not cost the other GPUs' records: skip this one, say so once
                self._note(i, error=_why(exc))
                self.say_once(failure_key(exc), "GPU collector: GPU %d sample failed: %s (counted; logged once)",
                              i, _why(exc)[:300])
                continue
            if rec is None:
                continue
            # A GPU lacking a field the contract requires (utilisation under MIG) travels in
            # an extra list, so the message stays valid and its XIDs and ECC counts are kept.
            body.setdefault("gpus_incomplete" if "unavailable" in rec else "gpus", []).append(rec)
        if not body.get("gpus_incomplete"):
            body.pop("gpus_incomplete", None)
        return body

    def close(self) -> None:
        if self._pool is not None:
            self._pool.shutdown(wait=False, cancel_futures=True)  # a stuck call must not hold up exit
            self._pool = None
        if not self._inited or self._stuck:
            return
        try:
            if self._events is not None:
                self.nvml.nvmlEventSetFree(self._events)
            self.nvml.nvmlShutdown()
        except Exception:
            pass
        self._inited = False


def _why(exc: BaseException) -> str:
    text = str(exc) or type(exc).__name__
    return f"{type(exc).__name__}: {text}" if type(exc).__name__ not in text else text


def _str(v: Any) -> str | None:
    """A UUID or PCI bus id from NVML (bytes or str), or None unless it is a name the contract takes: a sick
    GPU or an odd binding may hand back bytes that are not UTF-8, or control characters.  An identity is
    not repaired (a cleaned-up UUID would name another GPU): it is left out."""
    if v is None:
        return None
    if isinstance(v, bytes):
        try:
            v = v.decode("utf-8")
        except UnicodeDecodeError:
            return None
    v = str(v).strip()
    return v if name_ok(v) else None


# PCIe generations and widths NVML can report; 0xFFFFFFFF (or anything past these) means it could not say.
_PCIE_MAX = {"pcie_link_gen": 16, "pcie_link_gen_max": 16, "pcie_link_width": 64, "pcie_link_width_max": 64}


def _int(v: Any) -> int | None:
    """An NVML integer as an unsigned 64-bit one; None for anything else (NaN, infinity, -1, 2**70, a bool)."""
    if isinstance(v, bool) or not isinstance(v, (int, float)):
        return None
    if isinstance(v, float) and not math.isfinite(v):
        return None
    return int(v) if 0 <= v <= COUNTER_MAX else None


def _num(v: Any, field: str, scale: float = 1.0) -> float | None:
    """An NVML number as the contract's ``field`` (times ``scale``, rounded), or None when NVML's answer is
    no value the contract takes for it (a failing GPU's 4294967295 °C, NaN)."""
    if isinstance(v, bool) or not isinstance(v, (int, float)):
        return None
    if isinstance(v, int) and abs(v) > COUNTER_MAX:
        return None
    x = float(v) * scale
    x = round(x, 3) if scale != 1.0 else x
    return x if field_ok("gpu", "gpus", field, x) else None
