"""Hardware and system errors from the kernel log, read as structured records from ``/dev/kmsg``.

``/dev/kmsg`` hands out one record per ``read()``::

    4,3965,206764310,-;pcieport 0000:00:1b.4: AER: Corrected error received: 0000:00:1b.4
     SUBSYSTEM=pci                     (continuation lines: key=value, ignored)

``<syslog priority>,<sequence>,<microseconds since boot>,<flags>;<message>``.
The sequence number is unique per boot, so the reader

* remembers the last sequence it handled, with the boot id
  (``/proc/sys/kernel/random/boot_id``), in a small state file: after an agent
  restart it reports only records past that number, never one twice; after a
  reboot it reports the new boot's records from the start;
* on its very first run (no state) it reads past what the ring buffer already
  holds without reporting it: old errors are not news;
* reads at most :data:`MAX_RECORDS` records per interval (the rest waits for the
  next) and reports at most :data:`MAX_EVENTS` matching lines;
* counts records the kernel overwrote before they were read (``EPIPE``) in
  :attr:`KmsgSource.lost`.

Only lines that match a known hardware or system error are reported
(:func:`classify`): machine checks and EDAC, PCIe AER, NVIDIA XIDs and GPUs
fallen off the bus, NIC firmware and health errors, hung tasks and lockups,
file systems turning read-only, I/O errors, the OOM killer.

The reader also takes a regular file in ``/dev/kmsg`` format (one record per
line), which is what the tests feed it.
"""

from __future__ import annotations

import errno
import json
import logging
import os
import re
import stat
from typing import Any

from whywait.agents.collectors.base import read_text as _read
from whywait.agents.collectors.fit import clean_prose

log = logging.getLogger("whywait.agent")

MAX_RECORDS = 2000   # per interval: a log storm must not hold up the agent's round
MAX_EVENTS = 200     # matching lines reported per interval
MAX_MESSAGE = 300    # characters of each line kept
MAX_LINE = 4096      # characters of a record searched (the kernel's are shorter than 1024)
PRIME_BATCHES = 100  # at most 200,000 records skipped at first start (a 16 MiB ring buffer holds fewer)
_INT63 = 2 ** 63  # sequence numbers and timestamps: what the contract (a signed 64-bit integer) takes
_EPOCH_MAX = 1e11  # the contract's bound for a wall-clock time

_PCI = re.compile(r"\b([0-9a-f]{4}:[0-9a-f]{2}:[0-9a-f]{2}\.[0-7])\b", re.I)
_NVRM_PCI = re.compile(r"PCI:([0-9a-f]{4}:[0-9a-f]{2}:[0-9a-f]{2})\b", re.I)
_BLOCK = re.compile(r"(?:\(device ([\w.-]+)\)|\bdev ([\w.-]+)|EXT4-fs \(([\w.-]+)\)|XFS \(([\w.-]+)\))")
_XID = re.compile(r"NVRM: Xid \([^)]*\): (\d+)")

# (class, pattern), first match wins.  Each pattern is written against real kernel lines (see
# tests/fixtures/agents/kmsg/ATTRIBUTION.md) and meant to match one line per error, not every
# line of a multi-line report.
_RULES: tuple[tuple[str, re.Pattern[str]], ...] = tuple((c, re.compile(p)) for c, p in (
    ("xid", r"NVRM: Xid \("),
    ("gpu_lost", r"NVRM: .*(?:fallen off the bus|GPU is lost|RmInitAdapter failed)"),
    ("mce", r"\[Hardware Error\]: (?:CPU \d+: Machine Check|Machine check events logged)"
            r"|EDAC \S+: \d+ (?:CE|UE) |HANDLING MCE MEMORY ERROR"),
    ("pcie_aer_uncorrected", r"PCIe Bus Error: severity=Uncorrect"),
    ("pcie_aer", r"PCIe Bus Error: severity=Correct"),
    ("nic_fw", r"mlx5_core .*(?:health compromised|Health issue observed|firmware internal error|"
               r"[Ff]irmware reset|FW fatal|No done completion|insufficient power on the PCIe slot)"),
    ("hung_task", r"INFO: task \S.* blocked for more than \d+ seconds"),
    ("soft_lockup", r"BUG: soft lockup|Watchdog detected hard LOCKUP"),
    ("fs_readonly", r"Remounting filesystem read-only|remounted? read-only|[Ff]ilesystem has been shut down"),
    ("fs_error", r"EXT4-fs error|Aborting journal on device|XFS \([\w.-]+\): .*(?:[Cc]orruption|I/O error)"
                 r"|BTRFS (?:error|critical)"),
    ("io_error", r"(?:blk_update_request|critical medium error|Buffer I/O error on dev|I/O error, dev \w+)"),
    ("oom", r"Out of memory: Killed process|oom-kill:"),
))
_ANY = re.compile(r"NVRM|Hardware Error|EDAC|MCE|PCIe Bus Error|mlx5_core|blocked for more than|lockup|LOCKUP"
                  r"|read-only|shut down|EXT4-fs|Aborting journal|XFS|BTRFS|I/O error|medium error|Out of memory"
                  r"|oom-kill")
_DMESG_PREFIX = re.compile(r"^(?:\[[^\]]*\]\s*)+")  # "[ 1773.436397] " or "[Sun Feb 23 16:24:18 2025] "


def classify(message: str) -> dict[str, Any] | None:
    """A kernel line → ``{"class", "device"?, "code"?}``, or None when it is no error whywait follows.

    Also takes ``dmesg`` output: a leading ``[timestamp]`` is ignored.
    """
    text = _DMESG_PREFIX.sub("", message)
    if not _ANY.search(text):
        return None
    for cls, rx in _RULES:
        if rx.search(text):
            out: dict[str, Any] = {"class": cls}
            m = _PCI.search(text)
            if m:
                out["device"] = m.group(1).lower()
            else:
                m = _NVRM_PCI.search(text)
                if m:
                    out["device"] = f"{m.group(1).lower()}.0"
                else:
                    b = _BLOCK.search(text)
                    if b:
                        out["device"] = next(g for g in b.groups() if g)
            if len(out.get("device", "")) > 64:  # no device is named so (a damaged line): name none
                del out["device"]
            if cls == "xid":
                x = _XID.search(text)
                if x and len(x.group(1)) < 10:  # XIDs are small numbers; a 400-digit one names none
                    out["code"] = int(x.group(1))
            return out
    return None


def parse_record(raw: str) -> tuple[int, int, int, str] | None:
    """One ``/dev/kmsg`` record → ``(level, seq, usec since boot, message)``; None when malformed.

    Priority, sequence and timestamp are non-negative and fit a signed 64-bit integer; a record with
    anything else (``-1``, ``2**70``) is malformed.  The bound matters beyond the contract: the reader
    skips every record at or below the last sequence it saw, so a single record claiming ``2**70`` would
    silence the kernel log until the next reboot (and, saved in the state file, across restarts).
    """
    head, sep, body = raw.partition(";")
    if not sep:
        return None
    fields = head.split(",")
    if len(fields) < 3 or not all(f.isascii() and f.isdigit() and len(f) < 20 for f in fields[:3]):
        return None
    prio, seq, usec = int(fields[0]), int(fields[1]), int(fields[2])
    if seq >= _INT63 or usec >= _INT63:
        return None
    # Continuation lines (" KEY=value") follow the first newline.  The kernel's records are at most about
    # a kilobyte; a longer line (a damaged file) is cut before the patterns search it.
    message = body.split("\n", 1)[0][:MAX_LINE]
    return prio & 7, seq, usec, message


class KmsgSource:
    """Reads new records from ``<root>/dev/kmsg`` each interval; keeps its place in ``state_path``."""

    name = "kernel"
    every_s = 0.0  # every interval
    uses_up = True  # a read moves past what it returns: the agent's priming call must not read

    def __init__(self, root: str = "/", state_path: str | None = None, save: bool = True) -> None:
        self.root = root
        self.path = os.path.join(root, "dev", "kmsg")
        self.state_path = state_path
        # False: read from the saved place but never move it (`whywait agent --once --print`, a look that
        # must not take the records a stopped agent publishes when it starts again).
        self.save = save
        self.errors = 0
        self.lost = 0          # records overwritten before they were read
        self.skipped = 0       # matching lines past MAX_EVENTS
        self._fd: int | None = None
        self._is_file = False
        self._buf = b""
        self._boot_id = (_read(os.path.join(root, "proc", "sys", "kernel", "random", "boot_id")) or "").strip()
        self._btime = _btime(os.path.join(root, "proc", "stat"))
        self._last_seq: int | None = None
        self._primed = False

    def available(self) -> str | None:
        """None when ``/dev/kmsg`` can be opened; else why the source is off."""
        if self._fd is not None:
            return None
        try:
            self._fd = os.open(self.path, os.O_RDONLY | os.O_NONBLOCK)
        except OSError as exc:
            return f"cannot open {self.path}: {exc.strerror or exc}"
        self._is_file = stat.S_ISREG(os.fstat(self._fd).st_mode)
        self._load_state()
        if not self._primed:
            self._skip_history()
        return None

    def _skip_history(self) -> None:
        """First run: what the ring buffer holds is history.  Read past it once (a few thousand records,
        milliseconds) to learn its last sequence number, and save that, so a restart resumes there."""
        for _ in range(PRIME_BATCHES):
            batch = self._records()
            for raw in batch:
                rec = parse_record(raw)
                if rec is not None:
                    self._last_seq = rec[1]
            if len(batch) < MAX_RECORDS:
                break
        self._primed = True
        self._save_state()

    # --- state -------------------------------------------------------------
    def _load_state(self) -> None:
        if not self.state_path:
            return
        # A damaged state file (truncated, not JSON, nested ten thousand deep, a sequence no record has)
        # is no state: the reader starts as on its first run rather than failing the agent's start.
        try:
            fd = os.open(self.state_path, os.O_RDONLY | os.O_NONBLOCK)  # a FIFO put there must not block the start
            with os.fdopen(fd, "rb") as fh:
                if not stat.S_ISREG(os.fstat(fd).st_mode):
                    raise ValueError("not a regular file")
                st = json.loads(fh.read(4096).decode("utf-8", "replace"))
            seq = st.get("seq")
            if st.get("boot_id") == self._boot_id and isinstance(seq, int) and not isinstance(seq, bool) \
                    and 0 <= seq < _INT63:
                self._last_seq = seq
            self._primed = True  # a known boot resumes after its last record; a new boot reports from its start
        except (OSError, ValueError, AttributeError, TypeError, RecursionError):
            pass

    def _save_state(self) -> None:
        if not self.save or not self.state_path or self._last_seq is None:
            return
        tmp = self.state_path + ".tmp"
        try:
            os.makedirs(os.path.dirname(self.state_path) or ".", exist_ok=True)
            with open(tmp, "w", encoding="utf-8") as fh:
                json.dump({"boot_id": self._boot_id, "seq": self._last_seq}, fh)
            os.replace(tmp, self.state_path)
        except OSError as exc:
            self.errors += 1
            log.debug("kmsg state not saved to %s: %s", self.state_path, exc)

    # --- reading -----------------------------------------------------------
    def _records(self) -> list[str]:
        """Up to MAX_RECORDS raw records from the current position."""
        assert self._fd is not None
        out: list[str] = []
        if self._is_file:
            while len(out) < MAX_RECORDS:
                chunk = os.read(self._fd, 65536)
                if not chunk:
                    break
                self._buf += chunk
                *lines, self._buf = self._buf.split(b"\n")
                out += [ln.decode("utf-8", "replace") for ln in lines if ln and not ln.startswith(b" ")]
            return out
        while len(out) < MAX_RECORDS:
            try:
                chunk = os.read(self._fd, 8192)
            except BlockingIOError:
                break
            except OSError as exc:
                if exc.errno == errno.EPIPE:  # the kernel overwrote records we had not read yet
                    self.lost += 1
                    continue
                raise
            if not chunk:
                break
            out.append(chunk.decode("utf-8", "replace"))
        return out

    def read(self, mono: float) -> list[dict[str, Any]]:
        """The error lines logged since the last call (see the module docstring)."""
        events: list[dict[str, Any]] = []
        for raw in self._records():
            rec = parse_record(raw)
            if rec is None:
                self.errors += 1
                continue
            level, seq, usec, message = rec
            if self._last_seq is not None and seq <= self._last_seq:
                continue  # seen before a restart
            self._last_seq = seq
            found = classify(message)
            if found is None:
                continue
            if len(events) >= MAX_EVENTS:
                self.skipped += 1
                continue
            # A control character in the line (a file in /dev/kmsg format, a driver's raw bytes) is shown as
            # \xNN, as the kernel itself writes them, so the contract takes the message.
            text = clean_prose(message, MAX_MESSAGE) or "?"
            ev: dict[str, Any] = {"seq": seq, **found, "level": level, "message": text}
            if self._btime is not None:
                at = round(self._btime + usec / 1e6, 6)
                if 0 < at <= _EPOCH_MAX:
                    ev["logged_at"] = at
            events.append(ev)
        self._save_state()
        return events

    def close(self) -> None:
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None


def _btime(path: str) -> float | None:
    """The boot time (``btime`` in ``/proc/stat``), or None when absent or no time (``NaN``, ``1e400``, ``-1``)."""
    for line in (_read(path) or "").splitlines():
        if line.startswith("btime "):
            try:
                t = float(line.split()[1])
            except (IndexError, ValueError, OverflowError):
                return None
            return t if 0 < t <= _EPOCH_MAX else None
    return None

