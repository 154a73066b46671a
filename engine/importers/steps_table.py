"""A plain per-rank step table (CSV or JSON lines) → contract ``steps`` records, event time kept.

Called by ``whywait import`` for sites without the SDK, or to backfill history.  One row
per rank per step::

    time,job,rank,step,duration_s,data_wait_s,compute_s,comm_s,node
    2026-11-29T14:00:01.250Z,llama-70b,0,1200,1.25,0.02,0.91,0.32,node-03

``time`` (also ``ended_at``) is when the step ended: Unix seconds or ISO 8601 (UTC when no
zone is given).  ``job`` and ``node`` may come from ``--job``/``--node`` instead.  The
phases (``data_wait_s``, ``compute_s``, ``comm_s``, ``collective_s``, ``pipeline_wait_s``,
``checkpoint_s``) are optional: an empty cell is unknown, not zero.  Any problem is one
line naming the file, the line and the column.  The file is UTF-8 (a leading byte-order mark, as
spreadsheets write, is skipped); other bytes are refused with their line and byte offset.
"""

from __future__ import annotations

import csv
import json
import math
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Iterator

from whywait.agents.events import FIELD_BOUNDS, NOT_IN_NAMES
from whywait.engine.importers import ImportFormatError

from whywait import jsonl

PHASES = ("data_wait_s", "compute_s", "comm_s", "collective_s", "pipeline_wait_s", "checkpoint_s")
KNOWN = {"time", "ended_at", "job", "rank", "step", "duration_s", "node", *PHASES}


def _short(v: Any) -> str:
    text = repr(v)
    return text if len(text) <= 60 else text[:40] + f"... ({len(text)} chars)"


def _few(names: set[str], most: int = 5) -> str:
    """Up to ``most`` of ``names``, each shortened, and how many more: a header that is not one
    (a binary file, a JSON document) must not print hundreds of kilobytes as one error line."""
    shown = [n if len(n) <= 40 else n[:30] + f"... ({len(n)} chars)" for n in sorted(names)[:most]]
    more = len(names) - len(shown)
    return ", ".join(shown) + (f" and {more:,} more" if more else "")


def _time(v: Any, where: str) -> float:
    try:
        if isinstance(v, (int, float)) and not isinstance(v, bool):
            t = float(v)
        else:
            s = str(v).strip()
            try:
                t = float(s)
            except ValueError:
                dt = datetime.fromisoformat(s.replace("Z", "+00:00"))
                t = (dt if dt.tzinfo else dt.replace(tzinfo=timezone.utc)).timestamp()
    except (ValueError, OverflowError, OSError):  # OverflowError: an integer of 400 digits
        raise ImportFormatError(f"{where}: time must be Unix seconds or ISO 8601 (got {_short(v)})") from None
    if not math.isfinite(t):
        raise ImportFormatError(f"{where}: time must be Unix seconds or ISO 8601 (got {_short(v)})")
    return t


def _num(v: Any, where: str, integer: bool = False, most: float = math.inf) -> float | int | None:
    if v is None or (isinstance(v, str) and not v.strip()):
        return None
    try:
        if isinstance(v, bool):
            raise TypeError
        x = float(v)
    except OverflowError:  # an integer too big for a float
        raise ImportFormatError(f"{where}: must be at most {most:.0f} (got {_short(v)})" if most < math.inf
                                else f"{where}: must be a finite number >= 0 (got {_short(v)})") from None
    except (TypeError, ValueError):
        raise ImportFormatError(f"{where}: must be a number (got {_short(v)})") from None
    if not math.isfinite(x) or x < 0:
        raise ImportFormatError(f"{where}: must be a finite number >= 0 (got {_short(v)})")
    if x > most:
        raise ImportFormatError(f"{where}: must be at most {most:.0f} (got {_short(v)})")
    if integer:
        if x != int(x):
            raise ImportFormatError(f"{where}: must be a whole number (got {_short(v)})")
        return int(x)
    return x


def _not_utf8(path: Path) -> ImportFormatError:
    """The error for a file that is not UTF-8: the line and byte offset of its first bad byte."""
    offset = 0
    with path.open("rb") as fh:
        for no, line in enumerate(fh, start=1):
            try:
                line.decode("utf-8-sig" if no == 1 else "utf-8")
            except UnicodeDecodeError as exc:
                at = offset + exc.start + (3 if no == 1 and line.startswith(b"\xef\xbb\xbf") else 0)
                return ImportFormatError(f"{path}:{no}: not UTF-8 (byte 0x{line[at - offset]:02x} at byte offset "
                                         f"{at}): save the table as UTF-8")
            offset += len(line)
    return ImportFormatError(f"{path}: not UTF-8")  # pragma: no cover - the text reader saw a bad byte


def _rows(path: Path) -> Iterator[tuple[int, dict[str, Any]]]:
    try:
        yield from _parsed_rows(path)
    except UnicodeDecodeError:
        raise _not_utf8(path) from None


def _parsed_rows(path: Path) -> Iterator[tuple[int, dict[str, Any]]]:
    try:
        fh = path.open(newline="", encoding="utf-8-sig")  # -sig: skips the byte-order mark spreadsheets write
    except OSError as exc:
        raise ImportFormatError(f"{path}: cannot read ({exc.strerror or exc})") from None
    with fh:
        first = fh.read(1)
        fh.seek(0)
        if first == "[":  # a JSON array is neither a CSV header nor JSON lines: say what was expected
            raise ImportFormatError(f"{path}:1: a JSON array, not a step table (CSV with a header, or one "
                                    "JSON object per line); a profiler trace's events are imported with "
                                    "--format kineto")
        if first == "{":
            for no, line in enumerate(fh, start=1):
                if not line.strip():
                    continue
                try:
                    row = jsonl.loads(line)
                except json.JSONDecodeError as exc:
                    raise ImportFormatError(f"{path}:{no}: not valid JSON ({exc.msg})") from None
                except RecursionError:
                    raise ImportFormatError(f"{path}:{no}: not valid JSON (nested too deeply)") from None
                if not isinstance(row, dict):
                    raise ImportFormatError(f"{path}:{no}: expected a JSON object per line")
                yield no, row
        else:
            reader = csv.DictReader(fh)
            try:
                unknown = set(reader.fieldnames or ()) - KNOWN
                if unknown:
                    raise ImportFormatError(f"{path}:1: unknown column(s) {_few(unknown)} "
                                            f"(known: {', '.join(sorted(KNOWN))})")
                for row in reader:
                    yield reader.line_num, row
            except csv.Error as exc:  # a NUL byte, a field over the csv module's size limit
                raise ImportFormatError(f"{path}:{max(reader.line_num, 1)}: not a CSV row ({exc})") from None


def read_steps(path: Path, job: str | None = None,
               node: str | None = None) -> Iterator[tuple[str, str, dict[str, Any]]]:
    """Yield ``(job, node, StepTiming record)`` per row, with ``ended_at`` set to the row's time."""
    for no, row in _rows(path):
        where = f"{path}:{no}"
        t = row.get("time", row.get("ended_at"))
        if t in (None, ""):
            raise ImportFormatError(f"{where}: time: is required (when the step ended)")
        rec: dict[str, Any] = {"ended_at": _time(t, f"{where}: time")}
        for f, integer in (("rank", True), ("step", True), ("duration_s", False)):
            v = _num(row.get(f), f"{where}: {f}", integer, FIELD_BOUNDS[f][1] if f in FIELD_BOUNDS else math.inf)
            if v is None:
                raise ImportFormatError(f"{where}: {f}: is required")
            rec[f] = v
        for f in PHASES:
            v = _num(row.get(f), f"{where}: {f}")
            if v is not None:
                rec[f] = v
        j = row.get("job") or job
        n = row.get("node") or node
        if not j:
            raise ImportFormatError(f"{where}: job: is required (a column, or --job)")
        if not n:
            raise ImportFormatError(f"{where}: node: is required (a column, or --node)")
        for what, name in (("job", j), ("node", n)):
            if isinstance(name, str) and NOT_IN_NAMES.search(name):
                raise ImportFormatError(f"{where}: {what}: must not hold control characters (got {_short(name)})")
        yield str(j), str(n), rec
