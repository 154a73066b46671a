"""GPUs from an existing dcgm-exporter's ``/metrics`` (Prometheus text format, read by ``prometheus_client``).

Sites that already run DCGM point the agent at its URL instead of loading NVML
a second time.  Field names map onto the same ``gpu`` record as NVML's:

============================================  =====================================
DCGM field                                    record field
============================================  =====================================
DCGM_FI_DEV_GPU_UTIL                          util_pct
DCGM_FI_DEV_MEM_COPY_UTIL                     mem_util_pct
DCGM_FI_DEV_FB_USED (+ FREE + RESERVED), MiB  mem_used_bytes, mem_total_bytes
DCGM_FI_DEV_GPU_TEMP                          temp_c
DCGM_FI_DEV_POWER_USAGE                       power_w
DCGM_FI_DEV_ENFORCED_POWER_LIMIT              power_limit_w
DCGM_FI_DEV_SM_CLOCK / _MAX_SM_CLOCK          sm_clock_mhz / sm_clock_max_mhz
DCGM_FI_DEV_CLOCK_THROTTLE_REASONS            throttle_reasons (or _CLOCKS_EVENT_REASONS)
DCGM_FI_DEV_ECC_SBE_VOL_TOTAL / _DBE_         ecc_corrected / ecc_uncorrected (deltas)
DCGM_FI_DEV_ROW_REMAP_PENDING                 remapped_rows_pending
DCGM_FI_DEV_XID_ERRORS                        xid (see below)
DCGM_FI_DEV_PCIE_REPLAY_COUNTER               pcie_replay (delta)
DCGM_FI_DEV_NVLINK_*_ERROR_COUNT_TOTAL        nvlink_errors (delta of the sum)
============================================  =====================================

``DCGM_FI_DEV_XID_ERRORS`` is a gauge holding the *last* XID, so a repeated XID
cannot be told from the same one seen again; a change of value is reported as
one occurrence.  NVML's event API (the ``gpu`` collector) does not have this
limit.  Label spellings ``Hostname``/``hostname`` and ``UUID``/``uuid`` are
both accepted.
"""

from __future__ import annotations

import logging
import math
import urllib.error
import urllib.parse
import urllib.request
from typing import Any, Iterable, Iterator

from prometheus_client.metrics_core import Metric
from prometheus_client.parser import text_string_to_metric_families
from whywait.agents.collectors.base import COUNTER_MAX, AgentConfigError, Collector, CollectorOff
from whywait.agents.collectors.fit import field_ok, name_ok
from whywait.agents.collectors.gpu import decode_throttle
from whywait.agents.rates import RateTracker

_MIB = 1 << 20
_NVLINK_ERRS = ("DCGM_FI_DEV_NVLINK_CRC_FLIT_ERROR_COUNT_TOTAL", "DCGM_FI_DEV_NVLINK_CRC_DATA_ERROR_COUNT_TOTAL",
                "DCGM_FI_DEV_NVLINK_REPLAY_ERROR_COUNT_TOTAL", "DCGM_FI_DEV_NVLINK_RECOVERY_ERROR_COUNT_TOTAL")


def parse_prometheus(text: str) -> tuple[list[tuple[str, dict[str, str], float]], int]:
    """Prometheus text exposition → ``([(name, labels, value)], malformed line count)``.

    Called on every scrape.  The parsing is ``prometheus_client``'s (escapes, timestamps, exposition rules);
    its parser gives up on the whole text at the first bad line, so only then are the lines parsed one by
    one, keeping every good sample and counting the bad ones (a half-broken exporter still reports).
    """
    lines = [ln for ln in text.splitlines() if ln.strip() and not ln.lstrip().startswith("#")]
    # prometheus_client names a counter's samples `<name>_total` even where the exporter wrote `<name>`
    # (dcgm-exporter's DCGM_FI_DEV_PCIE_REPLAY_COUNTER): keep the names the exporter wrote.
    written = {ln.split("{", 1)[0].split(None, 1)[0] for ln in lines}
    try:
        out = _samples(text_string_to_metric_families(text), written)
        bad = 0
    except ValueError:
        out = []
        bad = 0
        for line in lines:
            try:
                out += _samples(text_string_to_metric_families(line + "\n"), written)
            except ValueError:
                bad += 1
    # The exposition format allows NaN and ±Inf; no DCGM field measures one, and an exporter that reports
    # one (or 1e400, which parses as infinity) has nothing to say for that series: it is malformed.
    finite = [s for s in out if math.isfinite(s[2])]
    return finite, bad + len(out) - len(finite)


def _samples(families: Iterable[Metric], written: set[str]) -> list[tuple[str, dict[str, str], float]]:
    out = []
    for f in families:
        for s in f.samples:
            name = s.name
            if name not in written and name.endswith("_total") and name[: -len("_total")] in written:
                name = name[: -len("_total")]
            out.append((name, dict(s.labels), float(s.value)))
    return out


def check_url(url: str, flag: str = "--dcgm-url") -> str:
    """``url`` when it is an ``http(s)://HOST[:PORT]/...`` URL; else :class:`AgentConfigError` naming ``flag``.

    Called when the agent starts: a malformed URL was taken, and every scrape then failed quietly.
    """
    try:
        parts = urllib.parse.urlsplit(url.strip())
        parts.port  # noqa: B018 - raises ValueError for a port that is no number
    except ValueError:
        parts = None  # type: ignore[assignment]
    if parts is None or parts.scheme not in ("http", "https") or not parts.hostname:
        raise AgentConfigError(f"{flag} must be a dcgm-exporter URL like http://localhost:9400/metrics "
                               f"(got {url!r})")
    return url.strip()


def _label(labels: dict[str, str], *names: str) -> str | None:
    for n in names:
        if n in labels:
            return labels[n]
    return None


class DcgmCollector(Collector):
    """Scrapes a dcgm-exporter for a ``gpu`` message.

    ``hostname``, when given, keeps only series whose ``Hostname`` label
    matches (an exporter behind a shared service may serve several nodes).
    """

    name = "dcgm"
    kind = "gpu"

    def __init__(self, url: str, root: str = "/", timeout: float = 2.0, hostname: str | None = None) -> None:
        super().__init__(root)
        if not url:
            raise CollectorOff("no --dcgm-url given")
        self.url = url
        self.timeout = timeout
        self.hostname = hostname
        self.rates = RateTracker()
        self._last_xid: dict[str, int] = {}
        self.malformed = 0

    @property
    def down(self) -> bool:
        """Off, or the exporter cannot be scraped: either way no GPU is reported (``collector_off`` is 1)."""
        return self.off_reason is not None or "scrape" in self._off_parts

    def fetch(self) -> str:
        try:
            with urllib.request.urlopen(self.url, timeout=self.timeout) as resp:  # noqa: S310 - user's URL
                return resp.read().decode("utf-8", errors="replace")
        except (urllib.error.URLError, OSError, ValueError) as exc:
            raise _ScrapeFailed(f"cannot scrape {self.url}: {getattr(exc, 'reason', exc)}") from None

    def _by_gpu(self, samples: list[tuple[str, dict[str, str], float]]) -> Iterator[tuple[str, dict[str, Any]]]:
        gpus: dict[str, dict[str, Any]] = {}
        for name, labels, value in samples:
            if not name.startswith("DCGM_FI_"):
                continue
            host = _label(labels, "Hostname", "hostname")
            if self.hostname and host and host != self.hostname:
                continue
            gpu = _label(labels, "gpu", "GPU")
            if gpu is None or not (gpu.isascii() and gpu.isdigit() and len(gpu) < 8):
                continue  # not a GPU index (a damaged label's "-1", "2**70" or escape sequence): no GPU
            if "GPU_I_ID" in labels and labels["GPU_I_ID"] not in ("", None):
                continue  # per-MIG-instance series: the whole GPU's figures are on its own series
            g = gpus.setdefault(gpu, {"_labels": labels})
            g[name] = value
        yield from sorted(gpus.items(), key=lambda kv: (len(kv[0]), kv[0]))

    def sample(self, now: float, mono: float) -> dict[str, Any] | None:
        try:
            text = self.fetch()
        except _ScrapeFailed as exc:
            self.errors += 1
            # A warning: the exporter is the collector's only source, so no gpu message goes out.
            self.part_off("scrape", f"{exc} (no gpu messages until it answers)", level=logging.WARNING)
            return None
        self.part_on("scrape")
        samples, bad = parse_prometheus(text)
        self.errors += bad
        self.malformed += bad
        body: dict[str, Any] = {"gpus": []}
        for gpu, f in self._by_gpu(samples):
            rec = self._record(gpu, f, mono)
            body.setdefault("gpus_incomplete" if "unavailable" in rec else "gpus", []).append(rec)
        if not body.get("gpus_incomplete"):
            body.pop("gpus_incomplete", None)
        return body

    def _record(self, gpu: str, f: dict[str, Any], mono: float) -> dict[str, Any]:
        labels = f["_labels"]
        try:
            idx = int(gpu)
        except ValueError:
            idx = -1
        rec: dict[str, Any] = {"gpu": idx}
        # Labels are the exporter's words: one that is no name (an escape sequence, 5000 characters) is
        # left out rather than costing the GPU's record.
        uuid = _label(labels, "UUID", "uuid")
        if uuid and name_ok(uuid):
            rec["uuid"] = uuid
        if labels.get("pci_bus_id") and name_ok(labels["pci_bus_id"]):
            rec["pci_bus_id"] = labels["pci_bus_id"]
        host = _label(labels, "Hostname", "hostname")
        if host and name_ok(host):
            rec["hostname"] = host

        def ok(field: str, value: Any) -> bool:
            """A value the contract takes for the field; else the field is unavailable (listed below)."""
            return field_ok("gpu", "gpus", field, value)

        def put(field: str, dcgm: str, scale: float = 1.0) -> None:
            if dcgm in f and ok(field, v := round(f[dcgm] * scale, 3)):
                rec[field] = v

        def as_int(x: float) -> int | None:
            return int(x) if 0 <= x <= COUNTER_MAX else None  # a counter or a byte count: unsigned 64-bit

        put("util_pct", "DCGM_FI_DEV_GPU_UTIL")
        put("mem_util_pct", "DCGM_FI_DEV_MEM_COPY_UTIL")
        if "DCGM_FI_DEV_FB_USED" in f:
            used = as_int(f["DCGM_FI_DEV_FB_USED"] * _MIB)
            if ok("mem_used_bytes", used):
                rec["mem_used_bytes"] = used
            parts = [f.get(k) for k in ("DCGM_FI_DEV_FB_USED", "DCGM_FI_DEV_FB_FREE", "DCGM_FI_DEV_FB_RESERVED")]
            total = as_int(sum(p for p in parts if p is not None) * _MIB)
            if parts[1] is not None and ok("mem_total_bytes", total):
                rec["mem_total_bytes"] = total
        if "DCGM_FI_DEV_FB_TOTAL" in f:
            total = as_int(f["DCGM_FI_DEV_FB_TOTAL"] * _MIB)
            if ok("mem_total_bytes", total):
                rec["mem_total_bytes"] = total
        put("temp_c", "DCGM_FI_DEV_GPU_TEMP")
        put("power_w", "DCGM_FI_DEV_POWER_USAGE")
        put("power_limit_w", "DCGM_FI_DEV_ENFORCED_POWER_LIMIT")
        put("sm_clock_mhz", "DCGM_FI_DEV_SM_CLOCK")
        put("sm_clock_max_mhz", "DCGM_FI_DEV_MAX_SM_CLOCK")
        mask = f.get("DCGM_FI_DEV_CLOCKS_EVENT_REASONS", f.get("DCGM_FI_DEV_CLOCK_THROTTLE_REASONS"))
        m = as_int(mask) if mask is not None else None
        rec["throttle_reasons"] = decode_throttle(m) if m is not None else []
        u = self.rates.update
        key = rec.get("uuid") or gpu
        # Counters: RateTracker refuses what no counter holds (negative, 2**64 and more): no count then.
        for field, dcgm in (("ecc_corrected", "DCGM_FI_DEV_ECC_SBE_VOL_TOTAL"),
                            ("ecc_uncorrected", "DCGM_FI_DEV_ECC_DBE_VOL_TOTAL"),
                            ("pcie_replay", "DCGM_FI_DEV_PCIE_REPLAY_COUNTER")):
            if dcgm in f:
                d = u((key, field), as_int(f[dcgm]), mono)  # type: ignore[arg-type]
                rec[field] = d.delta if ok(field, d.delta) else 0
        nvl = [f[k] for k in _NVLINK_ERRS if k in f]
        if nvl:
            d = u((key, "nvlink"), as_int(sum(nvl)), mono)  # type: ignore[arg-type]
            rec["nvlink_errors"] = d.delta if ok("nvlink_errors", d.delta) else 0
        if "DCGM_FI_DEV_ROW_REMAP_PENDING" in f:
            rec["remapped_rows_pending"] = bool(f["DCGM_FI_DEV_ROW_REMAP_PENDING"])
        if "DCGM_FI_DEV_ROW_REMAP_FAILURE" in f:
            rec["remapped_rows_failed"] = bool(f["DCGM_FI_DEV_ROW_REMAP_FAILURE"])
        if "DCGM_FI_DEV_XID_ERRORS" in f:
            last = as_int(f["DCGM_FI_DEV_XID_ERRORS"])
            if last is not None and field_ok("gpu", "gpus", "xid", [last]) and last < 10 ** 6:  # an XID code
                prev = self._last_xid.get(key)
                self._last_xid[key] = last
                rec["xid"] = [last] if last and prev is not None and last != prev else []
        for k, field in (("DCGM_FI_PROF_PCIE_TX_BYTES", "pcie_tx_bytes_per_s"),
                         ("DCGM_FI_PROF_PCIE_RX_BYTES", "pcie_rx_bytes_per_s")):
            if k in f and ok(field, v := as_int(f[k])):
                rec[field] = v
        missing = [k for k in ("util_pct", "mem_util_pct", "mem_used_bytes", "mem_total_bytes", "temp_c",
                               "power_w", "sm_clock_mhz") if k not in rec]
        if missing:
            rec["unavailable"] = missing
        return rec


class _ScrapeFailed(Exception):
    """One scrape failed; the next interval tries again."""
