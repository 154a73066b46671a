"""The node's cooling and power as its BMC sees them: fans, temperatures, power supplies, redundancy.

Two ways in, chosen by the environment:

* **Redfish** (``WHYWAIT_BMC_URL=https://bmc-node07``): every chassis under
  ``/redfish/v1/Chassis``, its ``Thermal`` (temperatures, fans, fan
  redundancy) and ``Power`` (power supplies, their redundancy, consumption)
  resources.  Basic authentication with ``WHYWAIT_BMC_USERNAME`` and the
  password read from ``WHYWAIT_BMC_PASSWORD_FILE`` (never from a variable or a
  flag: they show in ``ps``).  The BMC's certificate is checked against
  ``WHYWAIT_BMC_CA_FILE`` when set, else the system's CAs;
  ``WHYWAIT_BMC_INSECURE=1`` skips the check (BMCs often have self-signed
  certificates; say so knowingly).  Plain ``http://`` works for an emulator.
* **IPMI in-band** (no URL, and ``/dev/ipmi0`` with ``ipmitool`` on the PATH):
  ``ipmitool sdr elist full``.

A BMC answers in seconds, not milliseconds, so polling runs in a background
thread every 30 s (``WHYWAIT_BMC_POLL_S``; BMCs are small computers, be kind), each request with a timeout;
the agent's round only picks up the last finished poll.

Thirty seconds is too late for the moment that matters: a fan fails, the node's GPUs clock down, its
ranks straggle, and the engine would name an unknown-cause straggler before the BMC says why.  So the
agent also asks for a read *at once* (:meth:`BmcSource.request`) when :class:`SlowdownWatch` sees its
own node slow down: a GPU's SM clock below 95% of its maximum or a clock-event reason such as a thermal
or power-brake slowdown, or its local ranks' own work per step 5% above their recent past (the median over the ranks).
Those reads are rate-limited (one a minute by default, ``WHYWAIT_BMC_ON_DEMAND_GAP_S``), so a node that
stays slow does not hammer its BMC.  Only the standard
library is used (the agent stays small): ``urllib`` speaks Redfish's JSON.
"""

from __future__ import annotations

import base64
import logging
import math
import os
import re
import shutil
import ssl
import statistics
import subprocess
import threading
import time
import urllib.error
import urllib.request
from typing import Any, Callable, Iterable, Mapping

from whywait.agents.collectors.fit import clean_name, clean_prose
from whywait.agents.errors import AgentError

from whywait import jsonl

log = logging.getLogger("whywait.agent")

URL_ENV = "WHYWAIT_BMC_URL"
USER_ENV = "WHYWAIT_BMC_USERNAME"
PASSWORD_FILE_ENV = "WHYWAIT_BMC_PASSWORD_FILE"
CA_ENV = "WHYWAIT_BMC_CA_FILE"
INSECURE_ENV = "WHYWAIT_BMC_INSECURE"
POLL_ENV = "WHYWAIT_BMC_POLL_S"
GAP_ENV = "WHYWAIT_BMC_ON_DEMAND_GAP_S"
ON_DEMAND_GAP_S = 60.0
TIMEOUT_S = 10.0
MAX_CHASSIS = 16

_HEALTH = {"ok": "ok", "warning": "warning", "critical": "critical"}
_CONTEXT = {"intake": "inlet", "room": "inlet", "exhaust": "exhaust", "cpu": "cpu", "gpu": "gpu",
            "accelerator": "gpu", "powersupply": "psu", "systemboard": "system", "backplane": "system",
            "memory": "memory", "storagedevice": "storage", "networkingdevice": "nic"}


class BmcError(AgentError):
    """A BMC request failed (connection, HTTP status, not JSON); the message says which URL and why."""


# --- Redfish ----------------------------------------------------------------------------------------

def _health(status: Any) -> str:
    h = status.get("Health") if isinstance(status, dict) else None
    return _HEALTH.get(str(h).lower(), "unknown") if h is not None else "unknown"


def _absent(item: Mapping[str, Any]) -> bool:
    st = item.get("Status")
    return isinstance(st, dict) and st.get("State") in ("Absent", "Disabled", "UnavailableOffline")


def _over(reading: float | None, item: Mapping[str, Any], health: str) -> str:
    """Escalate ``health`` by the thresholds the BMC publishes (some never update ``Status.Health``)."""
    if reading is None:
        return health
    for key, level in (("UpperThresholdFatal", "critical"), ("UpperThresholdCritical", "critical"),
                       ("UpperThresholdNonCritical", "warning")):
        t = item.get(key)
        if isinstance(t, (int, float)) and reading >= t:
            return level if health in ("ok", "unknown") or level == "critical" else health
    return health


def _under(reading: float | None, item: Mapping[str, Any], health: str) -> str:
    if reading is None:
        return health
    for key, level in (("LowerThresholdFatal", "critical"), ("LowerThresholdCritical", "critical"),
                       ("LowerThresholdNonCritical", "warning")):
        t = item.get(key)
        if isinstance(t, (int, float)) and reading <= t and not (key == "LowerThresholdFatal" and t == 0
                                                                  and reading > 0):
            return level if health in ("ok", "unknown") or level == "critical" else health
    return health


def _sensor(name: str, type_: str, health: str, reading: float | None = None, unit: str | None = None,
            context: str | None = None, note: str | None = None) -> dict[str, Any]:
    """One sensor record.  The BMC's words are its own (a name with an escape sequence, 5000 characters, an
    unpaired surrogate): names and notes are cleaned to what the contract takes, and a name with nothing
    left is the sensor's type, so one odd sensor does not cost the message."""
    rec: dict[str, Any] = {"name": clean_name(name) or type_, "type": type_, "health": health}
    if context:
        rec["context"] = context
    if reading is not None:
        rec["reading"] = float(reading)
    if unit:
        rec["unit"] = unit
    note = clean_prose(note)
    if note:
        rec["note"] = note
    return rec


_READING_MAX = 1e15  # no fan, temperature, voltage or power reads more: a larger number is the BMC's garbage


def _num(v: Any) -> float | None:
    """A BMC's reading as a float; None unless a finite number of a size a sensor can read (JSON's ``1e400``
    parses as infinity, a 400-digit integer does not fit a float at all)."""
    if not isinstance(v, (int, float)) or isinstance(v, bool):
        return None
    if isinstance(v, int) and abs(v) > _READING_MAX:
        return None
    f = float(v)
    return f if math.isfinite(f) and abs(f) <= _READING_MAX else None


def _members(doc: Mapping[str, Any], key: str) -> list[Any]:
    """``doc[key]`` when it is a list (a BMC's document may hold anything where a list belongs)."""
    v = doc.get(key)
    return v if isinstance(v, list) else []


def parse_thermal(doc: Mapping[str, Any], prefix: str = "") -> list[dict[str, Any]]:
    """A Redfish ``Thermal`` resource → temperature, fan and fan-redundancy sensors."""
    out = []
    for t in _members(doc, "Temperatures"):
        if not isinstance(t, dict) or _absent(t):
            continue
        reading = _num(t.get("ReadingCelsius"))
        ctx = _CONTEXT.get(str(t.get("PhysicalContext", "")).lower())
        name = str(t.get("Name") or t.get("MemberId") or "temperature")
        if ctx is None and re.search(r"inlet|intake|ambient", name, re.I):
            ctx = "inlet"
        elif ctx is None and re.search(r"exhaust|outlet", name, re.I):
            ctx = "exhaust"
        health = _over(reading, t, _health(t.get("Status")))
        out.append(_sensor(prefix + name, "temperature", health, reading, "°C", ctx))
    for f in _members(doc, "Fans"):
        if not isinstance(f, dict) or _absent(f):
            continue
        reading = _num(f.get("Reading", f.get("ReadingRPM")))
        units = str(f.get("ReadingUnits") or ("RPM" if "ReadingRPM" in f else ""))
        unit = {"RPM": "RPM", "Percent": "%"}.get(units)
        health = _under(reading, f, _health(f.get("Status")))
        name = str(f.get("Name") or f.get("FanName") or f.get("MemberId") or "fan")
        out.append(_sensor(prefix + name, "fan", health, reading, unit, "system",
                           None if health == "ok" else f"Status.Health {_health(f.get('Status'))}"))
    out += _redundancy(doc, prefix)
    return out


def parse_power(doc: Mapping[str, Any], prefix: str = "") -> list[dict[str, Any]]:
    """A Redfish ``Power`` resource → power-supply, power-redundancy and consumption sensors."""
    out = []
    for p in _members(doc, "PowerSupplies"):
        if not isinstance(p, dict):
            continue
        name = str(p.get("Name") or p.get("MemberId") or "power supply")
        if _absent(p):
            # An empty bay is not a failure by itself; a lost redundancy says whether it matters.
            continue
        health = _health(p.get("Status"))
        out.append(_sensor(prefix + name, "psu", health, _num(p.get("LastPowerOutputWatts")), "W", "psu",
                           None if health == "ok" else f"Status.Health {health.capitalize()}"))
    for c in _members(doc, "PowerControl"):
        if isinstance(c, dict) and _num(c.get("PowerConsumedWatts")) is not None:
            out.append(_sensor(prefix + str(c.get("Name") or "power"), "power", _health(c.get("Status")),
                               _num(c.get("PowerConsumedWatts")), "W", "system"))
    out += _redundancy(doc, prefix)
    return out


def _redundancy(doc: Mapping[str, Any], prefix: str) -> list[dict[str, Any]]:
    out = []
    for r in _members(doc, "Redundancy"):
        if not isinstance(r, dict) or _absent(r):
            continue
        health = _health(r.get("Status"))
        mode = r.get("Mode")
        out.append(_sensor(prefix + str(r.get("Name") or "redundancy"), "redundancy", health, context="system",
                           note=None if health == "ok" else f"redundancy {mode or ''} {health}".replace("  ", " ")))
    return out


class RedfishClient:
    """GETs Redfish resources as JSON with basic auth, a timeout and the configured TLS check."""

    def __init__(self, base_url: str, username: str | None = None, password: str | None = None,
                 ca_file: str | None = None, insecure: bool = False, timeout: float = TIMEOUT_S) -> None:
        self.base = base_url.rstrip("/")
        self.timeout = timeout
        self.headers = {"Accept": "application/json", "OData-Version": "4.0"}
        if username is not None:
            token = base64.b64encode(f"{username}:{password or ''}".encode()).decode()
            self.headers["Authorization"] = f"Basic {token}"
        self.context: ssl.SSLContext | None = None
        if self.base.startswith("https://"):
            self.context = ssl.create_default_context(cafile=ca_file)
            if insecure:
                self.context.check_hostname = False
                self.context.verify_mode = ssl.CERT_NONE

    def get(self, path: str) -> dict[str, Any]:
        """GET ``path`` (``/redfish/v1/...``) → the decoded object; :class:`BmcError` on any failure."""
        url = self.base + path
        req = urllib.request.Request(url, headers=self.headers)
        try:
            with urllib.request.urlopen(req, timeout=self.timeout, context=self.context) as resp:
                body = resp.read(4 << 20)  # bounded: a BMC page is kilobytes
        except urllib.error.HTTPError as exc:
            raise BmcError(f"GET {url}: HTTP {exc.code} {exc.reason}") from None
        except (urllib.error.URLError, OSError) as exc:
            raise BmcError(f"GET {url}: {getattr(exc, 'reason', exc)}") from None
        try:
            doc = jsonl.loads(body)
        except ValueError:
            raise BmcError(f"GET {url}: not JSON") from None
        if not isinstance(doc, dict):
            raise BmcError(f"GET {url}: not a JSON object")
        return doc

    def sensors(self) -> list[dict[str, Any]]:
        """Every chassis's thermal and power sensors."""
        coll = self.get("/redfish/v1/Chassis")
        ids = [m.get("@odata.id") for m in _members(coll, "Members") if isinstance(m, dict)]
        members: list[str] = [m for m in ids if isinstance(m, str)][:MAX_CHASSIS]
        out: list[dict[str, Any]] = []
        for m in members:
            chassis = self.get(m)
            prefix = f"{chassis.get('Id', m.rsplit('/', 1)[-1])}: " if len(members) > 1 else ""
            for key, parse in (("Thermal", parse_thermal), ("Power", parse_power)):
                link = chassis.get(key)
                if isinstance(link, dict) and isinstance(link.get("@odata.id"), str):
                    out += parse(self.get(link["@odata.id"]), prefix)
        return out


# --- ipmitool ----------------------------------------------------------------------------------------

_READING = re.compile(r"^\s*(-?[\d.]+)\s*(RPM|percent|degrees C|Watts|Volts)\b", re.I)
_UNIT = {"rpm": "RPM", "percent": "%", "degrees c": "°C", "watts": "W", "volts": "V"}
_BAD_EVENT = re.compile(r"Failure detected|Non-Redundant|Redundancy Lost|Redundancy Degraded|Power Supply AC lost"
                        r"|Predictive failure|Fully Degraded|Configuration error", re.I)


def parse_sdr(text: str) -> list[dict[str, Any]]:
    """``ipmitool sdr elist full`` output → fan, temperature, power-supply, redundancy and power sensors.

    Columns: ``name | id | status | entity | reading or events``.  Status ``ns`` (no reading) is
    skipped; ``cr``/``nr`` are critical, ``nc`` a warning; an ``ok`` sensor whose events say
    ``Failure detected`` or ``Non-Redundant`` is degraded all the same (the BMC reports the
    sensor readable, not the hardware healthy).
    """
    out = []
    for line in text.splitlines():
        cols = [c.strip() for c in line.split("|")]
        if len(cols) < 5:
            continue
        name, _sid, status, entity, rest = cols[:5]
        if status == "ns" or not name:
            continue
        ent = entity.split(".")[0]
        low = name.lower()
        m = _READING.match(rest)
        reading = _num(_float(m.group(1))) if m else None
        unit = _UNIT.get(m.group(2).lower()) if m else None
        events = rest[m.end():].strip(" ,") if m else rest
        if "redundan" in events.lower() or re.search(r"redundan|power supplies$|^fans$", low):
            type_ = "redundancy"
        elif ent == "10" or re.search(r"power supply|\bpsu|^ps\d", low):
            type_ = "psu" if "meter" not in low else "power"
        elif ent in ("29", "30") or "fan" in low:
            type_ = "fan"
        elif unit == "°C" or "temp" in low:
            type_ = "temperature"
        elif unit == "W":
            type_ = "power"
        else:
            continue
        health = {"ok": "ok", "nc": "warning", "cr": "critical", "nr": "critical"}.get(status, "unknown")
        bad = _BAD_EVENT.search(events)
        if bad and health == "ok":
            health = "critical" if type_ == "psu" else "warning"
        ctx = None
        if type_ == "temperature":
            if ent in ("55", "64") or re.search(r"inlet|intake|ambient", low):
                ctx = "inlet"
            elif re.search(r"exhaust|outlet", low):
                ctx = "exhaust"
            elif ent in ("3", "65"):
                ctx = "cpu"
        out.append(_sensor(name, type_, health, reading, unit, ctx or ("psu" if type_ == "psu" else None),
                           bad.group(0) if bad else None))
    return out


def _float(text: str) -> float | None:
    try:
        return float(text)
    except ValueError:  # "1.2.3"
        return None


def run_ipmitool(timeout: float = TIMEOUT_S) -> str:
    """``ipmitool sdr elist full`` in-band; :class:`BmcError` when it fails or times out."""
    try:
        res = subprocess.run(["ipmitool", "sdr", "elist", "full"], capture_output=True, text=True,
                             timeout=timeout, check=False)
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise BmcError(f"ipmitool sdr: {exc}") from None
    if res.returncode != 0:
        raise BmcError(f"ipmitool sdr: exit {res.returncode}: {res.stderr.strip()[:200]}")
    return res.stdout


# --- the source --------------------------------------------------------------------------------------

class BmcSource:
    """Polls the BMC in a background thread; :meth:`read` returns the last finished poll, once.

    ``fetch`` is the poll itself (a Redfish client's ``sensors``, or ipmitool's); without one it is
    chosen from the environment (see the module docstring) by :meth:`available`.
    """

    name = "bmc"
    every_s = 0.0  # the thread keeps its own pace (poll_s); the round just picks up results

    def __init__(self, root: str = "/", fetch: Callable[[], list[dict[str, Any]]] | None = None,
                 poll_s: float | None = None, env: Mapping[str, str] | None = None) -> None:
        self.root = root
        self.fetch = fetch
        self.env = os.environ if env is None else env
        self.poll_s = poll_s if poll_s is not None else 30.0
        self._bad_poll: str | None = None
        if poll_s is None and self.env.get(POLL_ENV):
            try:
                self.poll_s = float(self.env[POLL_ENV])
                if not 1.0 <= self.poll_s <= 3600.0:
                    raise ValueError
            except ValueError:
                self._bad_poll = f"{POLL_ENV} must be seconds between 1 and 3600 (got {self.env[POLL_ENV]!r})"
        self.gap_s = ON_DEMAND_GAP_S
        if self.env.get(GAP_ENV) and not self._bad_poll:
            try:
                self.gap_s = float(self.env[GAP_ENV])
                if not 1.0 <= self.gap_s <= 3600.0:
                    raise ValueError
            except ValueError:
                self._bad_poll = f"{GAP_ENV} must be seconds between 1 and 3600 (got {self.env[GAP_ENV]!r})"
        self.errors = 0
        self.on_demand = 0  # reads asked for by request(), for the tests and the agent's log
        self.last_error: str | None = None
        self.via = ""
        self._result: list[dict[str, Any]] | None = None
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._wake = threading.Event()  # set by request() or close(): the thread polls (or ends) at once
        self._last_demand = float("-inf")
        self._thread: threading.Thread | None = None

    def available(self) -> str | None:
        """Choose Redfish or ipmitool and start polling; else say why the source is off."""
        if self._bad_poll:
            return self._bad_poll
        if self.fetch is None:
            why = self._configure()
            if why:
                return why
        if self._thread is None:
            self._thread = threading.Thread(target=self._loop, name="whywait-bmc", daemon=True)
            self._thread.start()
        return None

    def _configure(self) -> str | None:
        url = self.env.get(URL_ENV)
        if url:
            pw = None
            pw_file = self.env.get(PASSWORD_FILE_ENV)
            if pw_file:
                try:
                    with open(pw_file, encoding="utf-8") as fh:
                        pw = fh.read().strip()
                except OSError as exc:
                    return f"cannot read {PASSWORD_FILE_ENV} {pw_file}: {exc.strerror or exc}"
            user = self.env.get(USER_ENV)
            if (user is None) != (pw is None):
                return f"{URL_ENV} is set but only one of {USER_ENV} and {PASSWORD_FILE_ENV}"
            try:
                client = RedfishClient(url, user, pw, self.env.get(CA_ENV) or None,
                                       self.env.get(INSECURE_ENV) == "1")
            except (OSError, ssl.SSLError) as exc:
                return f"cannot load {CA_ENV}: {exc}"
            self.fetch, self.via = client.sensors, f"Redfish at {url}"
            return None
        if os.path.exists(os.path.join(self.root, "dev", "ipmi0")) and shutil.which("ipmitool"):
            self.fetch, self.via = (lambda: parse_sdr(run_ipmitool())), "ipmitool sdr (in-band)"
            return None
        return f"no BMC: set {URL_ENV} (Redfish) or install ipmitool with /dev/ipmi0 present"

    def poll(self) -> None:
        """One poll: store the sensors, or count the failure and keep the last error's words."""
        assert self.fetch is not None
        try:
            sensors = self.fetch()
        except Exception as exc:  # a BMC that answers garbage must not kill the thread
            self.errors += 1
            if str(exc) != self.last_error:
                log.warning("bmc: %s", exc)
            self.last_error = str(exc)
            return
        self.last_error = None
        with self._lock:
            self._result = sensors

    def request(self, mono: float, why: str = "") -> bool:
        """Ask the polling thread to read the BMC now, not at its next turn.

        Called by the agent's round when :class:`SlowdownWatch` sees the node slow down.  Returns
        whether a read was asked for: False while the source is off or within ``gap_s`` of the last
        asked-for read (the regular polls go on regardless).
        """
        if self._thread is None or mono - self._last_demand < self.gap_s:
            return False
        self._last_demand = mono
        self.on_demand += 1
        log.info("bmc: reading now (%s)", why or "asked")
        self._wake.set()
        return True

    def _loop(self) -> None:
        while not self._stop.is_set():
            started = time.monotonic()
            self.poll()
            self._wake.wait(max(1.0, self.poll_s - (time.monotonic() - started)))
            self._wake.clear()

    uses_up = True  # a read takes the finished poll: the agent's priming call must not read

    def read(self, mono: float) -> list[dict[str, Any]] | None:
        """The sensors of the last poll that finished since the previous call, or None."""
        with self._lock:
            out, self._result = self._result, None
        return out

    def close(self) -> None:
        self._stop.set()
        self._wake.set()


# --- when to read the BMC at once ----------------------------------------------------------------------

# Not sw_power_cap: a busy GPU sits at its power limit all day, and that is no news from the BMC.
_SLOW_REASONS = frozenset({"hw_slowdown", "hw_thermal_slowdown", "hw_power_brake_slowdown", "sw_thermal_slowdown"})


class SlowdownWatch:
    """Tells the agent, from what it already has, that its own node just slowed down.

    Two signs, both local and cheap: a GPU record whose SM clock is below ``clock_ratio`` of its
    maximum or that carries a slowdown clock-event reason; or the node's ranks of a job whose own work
    per step (compute plus input wait, else the step time) over their last ``recent`` steps has a
    median ``growth`` times that of their previous ``history`` steps (the median over the ranks).
    Nothing here compares with other nodes: the engine does that.  A false alarm costs one BMC read,
    so the bar is low.  Pure and bounded (``max_ranks`` ranks, ``history + recent`` steps each);
    shared by the agent and the simulator.
    """

    def __init__(self, clock_ratio: float = 0.95, growth: float = 1.05, recent: int = 3, history: int = 30,
                 min_history: int = 10, max_ranks: int = 256) -> None:
        self.clock_ratio = clock_ratio
        self.growth = growth
        self.recent = recent
        self.history = history
        self.min_history = min_history
        self.max_ranks = max_ranks
        self._work: dict[tuple[str, int], list[float]] = {}

    def gpus(self, records: Iterable[Mapping[str, Any]]) -> str | None:
        """The reason to read the BMC now from one interval's GPU records, or None."""
        for g in records:
            reasons = _SLOW_REASONS.intersection(g.get("throttle_reasons") or ())
            if reasons:
                return f"GPU {g.get('gpu')}: {', '.join(sorted(reasons))}"
            clk, top = g.get("sm_clock_mhz"), g.get("sm_clock_max_mhz")
            busy = "gpu_idle" not in (g.get("throttle_reasons") or ())
            if busy and isinstance(clk, (int, float)) and isinstance(top, (int, float)) and top > 0 \
                    and clk < self.clock_ratio * top:
                return f"GPU {g.get('gpu')}: SM clock {clk:.0f} of {top:.0f} MHz"
        return None

    def steps(self, job: str, records: Iterable[Mapping[str, Any]]) -> str | None:
        """Add one job's new step records (``rank``, ``duration_s``, optional split); the reason to read
        the BMC now, or None.

        The sign is the node's, not one rank's: the median over the job's local ranks of (their last
        ``recent`` steps' median work against their own earlier steps').  Cooling and power slow every
        GPU of a node at once; one rank's noise or a one-GPU fault (whose cause the GPU's own report
        shows) is no reason to bother the BMC.
        """
        touched = False
        for rec in records:
            rank = rec.get("rank")
            if not isinstance(rank, int):
                continue
            c, d = rec.get("compute_s"), rec.get("duration_s")
            w = (c + (rec.get("data_wait_s") or 0.0)) if isinstance(c, (int, float)) else d
            if not isinstance(w, (int, float)) or w <= 0:
                continue
            key = (job, rank)
            buf = self._work.get(key)
            if buf is None:
                if len(self._work) >= self.max_ranks:
                    del self._work[next(iter(self._work))]  # the oldest rank seen: a finished job's
                buf = self._work[key] = []
            buf.append(float(w))
            del buf[:-(self.history + self.recent)]
            touched = True
        if not touched:
            return None
        growth = []
        for (j, _), buf in self._work.items():
            if j == job and len(buf) >= self.min_history + self.recent:
                past = statistics.median(buf[:-self.recent])
                if past > 0:
                    growth.append(statistics.median(buf[-self.recent:]) / past)
        if growth and statistics.median(growth) > self.growth:
            return f"{job}: the node's ranks work {statistics.median(growth):.2f}x longer per step than before"
        return None
