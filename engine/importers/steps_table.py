"""A plain per-rank step table (CSV or JSON lines) → contract ``steps`` records, event time kept.

Called by ``whywait import`` for sites without the SDK, or to backfill history.  One row
per rank per step::

    time,job,rank,step,duration_s,data_wait_s,compute_s,comm_s,node
    2026-11-29T14:00:01.250Z,llama-70b,0,1200,1.25,0.02,0.91,0.32,node-03

``time`` (also ``ended_at``) is when the step ended: Unix seconds or ISO 8601 (UTC when no
zone is given).  ``job`` and ``node`` may come from ``--job``/``--node`` instead.  The
phases (``data_wait_s``, ``compute_s``, ``comm_s``, ``collective_s``, ``pipeline_wait_s``,
``checkpoint_s``) are optional: an empty cell is unknown, not zero.  Any problem is one
line naming the file, the line and the column.
"""

from __future__ import annotations

import csv
import json
import math
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Iterator

from whywait.engine.importers import ImportFormatError

PHASES = ("data_wait_s", "compute_s", "comm_s", "collective_s", "pipeline_wait_s", "checkpoint_s")
KNOWN = {"time", "ended_at", "job", "rank", "step", "duration_s", "node", *PHASES}


def _time(v: Any, where: str) -> float:
    if isinstance(v, (int, float)) and not isinstance(v, bool):
        return float(v)
    s = str(v).strip()
    try:
        return float(s)
    except ValueError:
        pass
    try:
        dt = datetime.fromisoformat(s.replace("Z", "+00:00"))
    except ValueError:
        raise ImportFormatError(f"{where}: time must be Unix seconds or ISO 8601 (got {v!r})") from None
    return (dt if dt.tzinfo else dt.replace(tzinfo=timezone.utc)).timestamp()


def _num(v: Any, where: str, integer: bool = False) -> float | int | None:
    if v is None or (isinstance(v, str) and not v.strip()):
        return None
    try:
        x = float(v)
    except (TypeError, ValueError):
        raise ImportFormatError(f"{where}: must be a number (got {v!r})") from None
    if not math.isfinite(x) or x < 0:
        raise ImportFormatError(f"{where}: must be a finite number >= 0 (got {v!r})")
    if integer:
        if x != int(x):
            raise ImportFormatError(f"{where}: must be a whole number (got {v!r})")
        return int(x)
    return x


def _rows(path: Path) -> Iterator[tuple[int, dict[str, Any]]]:
    try:
        fh = path.open(newline="", encoding="utf-8")
    except OSError as exc:
        raise ImportFormatError(f"{path}: cannot read ({exc.strerror or exc})") from None
    with fh:
        first = fh.read(1)
        fh.seek(0)
        if first == "{":
            for no, line in enumerate(fh, start=1):
                if not line.strip():
                    continue
                try:
                    row = json.loads(line)
                except json.JSONDecodeError as exc:
                    raise ImportFormatError(f"{path}:{no}: not valid JSON ({exc.msg})") from None
                if not isinstance(row, dict):
                    raise ImportFormatError(f"{path}:{no}: expected a JSON object per line")
                yield no, row
        else:
            reader = csv.DictReader(fh)
            unknown = set(reader.fieldnames or ()) - KNOWN
            if unknown:
                raise ImportFormatError(f"{path}:1: unknown column(s) {', '.join(sorted(unknown))} "
                                        f"(known: {', '.join(sorted(KNOWN))})")
            for row in reader:
                yield reader.line_num, row


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
            v = _num(row.get(f), f"{where}: {f}", integer)
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
        yield str(j), str(n), rec
