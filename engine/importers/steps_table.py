"""A plain per-rank step table (CSV or JSON lines) → contract ``steps`` records, event time kept.

Called by ``whywait import`` for sites without the SDK, or to backfill history.  One row
per rank per step::

    time,job,rank,step,duration_s,data_wait_s,compute_s,comm_s,node
    2026-11-29T14:00:01.250Z,llama-70b,0,1200,1.25,0.02,0.91,0.32,node-03

``time`` (also ``ended_at``) is when the step ended: Unix seconds or ISO 8601 (UTC when no
zone is given).  ``job`` and ``node`` may come from ``--job``/``--node`` instead.  The
phases (``data_wait_s``, ``compute_s``, ``comm_s``, ``collective_s``, ``pipeline_wait_s``,
``checkpoint_s``) are optional: an empty cell is unknown, not zero.

Tables written by other tools name columns their own way, so the usual other names are read too
(``iteration`` is ``step``, ``global_rank`` is ``rank``, ``step_time``, ``iter_time`` and ``batch_time``
are ``duration_s``, ``hostname`` is ``node``, ``timestamp`` is ``time``; and the phases as training
loggers name them: ``data_time``, ``dataloader_time`` or ``data_load_time`` is ``data_wait_s``,
``fwd_bwd_time``, ``compute_time`` or ``forward_backward`` is ``compute_s``, ``allreduce_time``,
``comm_time``, ``communication_time`` or ``sync_time`` is ``comm_s``: :data:`_ALIASES`), compared without
case or punctuation ("Step Time (ms)"), and a ``_s``, ``_ms``, ``_us`` or ``_ns`` suffix gives the unit
(``duration_ms``, ``step_time_ms``, ``data_time_ms``, ``fwd_bwd_time_s``, ``time_ms``).  A column that
times something else or only part of a phase (``forward_time``, ``backward_time``, ``optimizer_time``) is
no phase and is left out, with the note below.  A CSV's other columns (a
logger's loss, learning rate, tokens/s) are left out and said so in a note; one that reads like a
misspelt field (``duraton_s``) is refused, naming the field, for a lost phase would go unnoticed.
A time without a zone is UTC (a logger writing local time must say its offset: ``+02:00``).  Any problem is one
line naming the file, the line and the column.  The file is UTF-8 (a leading byte-order mark, as
spreadsheets write, is skipped); other bytes are refused with their line and byte offset.

The cells are separated by ``,``, a tab, ``;`` or ``|``: whichever the header holds most of (outside
quotes), so a TSV or a table a spreadsheet saved with ``;`` reads as a CSV does.  A ``;``-separated
table with a decimal comma (``0,8``) is refused at its cell, for ``1,250`` could be either number.

Every row is checked against the contract as it is read, so a value the engine would refuse is one line
naming the row, not the message it became: a ``duration_s`` or phase outside ``0..1e+08 s``, a phase
longer than its step allows (at most 1.5 × ``duration_s`` + 1 s), a time outside ``0..1e+11 s`` since 1970.
A numeric ``time`` over ``1e+11`` s (the year 5138) cannot be seconds; one that reads as milliseconds,
microseconds or nanoseconds since 1970 (``1796400000000``) is read in that unit, with a note, when
the column's first numeric time is in it too: the unit is the column's, and a row in another one is
refused naming both lines.  (Name the column ``time_ms`` to say so and have no note.)

A rank's place in the job's parallel layout may be given too, for the placement ``whywait import --project``
publishes (the stage rules compare a rank with its own pipeline stage, so a last stage slower by design, as the
one that computes the loss is, is not taken for stragglers): ``pp`` (``pp_rank``, ``pipeline_stage``,
``pipeline_rank``; 0 = the first stage), ``dp`` (``dp_rank``, ``data_parallel_rank``: the data-parallel replica)
and ``tp`` (``tp_rank``, ``tensor_parallel_rank``).  A bare ``stage`` or ``replica`` is not read as one (a loop's
"train" stage, a Kubernetes replica index): it is left out with the note; rename it.  Each is a whole number from
0, refused at its cell otherwise (a bare ``tp`` that counts something else, a classifier's true positives, is
told to be renamed).  A rank keeps its coordinates for the whole run: a rank whose ``pp`` changes
between rows (of one file or two) is refused naming both lines; an empty cell is unknown, and the rank's other
rows give it.  Every rank has a coordinate or none does: a job where some ranks have a ``pp`` and others have
none is refused in one line naming both sets of ranks (half a layout would put the ranks without one in a stage
of their own, and a table of several runs pasted together reads the same way), unless ``--layout`` gives them.

``whywait import --layout pp=4,dp=2,tp=8`` (also ``cp``) gives every rank its coordinates from its global rank,
for tables and profiler traces that carry none, in Megatron-LM's default order (tp fastest, then cp, dp, pp
slowest: rank = tp_rank + tp·(cp_rank + cp·(dp_rank + dp·pp_rank)); :func:`layout_coords`).  Every rank must
lie below the product of the sizes (a table may hold fewer ranks, with a note); a rank outside it is one line
naming the sizes and the ranks.  A column and ``--layout`` that disagree on a rank are refused naming the rank and
its line; where they agree, either may be given.  Only the coordinates given reach the placement (``--layout
pp=4,dp=2`` gives no ``tp``).

One row per rank per step (and job): a row repeated exactly (a logger that wrote it twice, two exports
pasted together) is dropped and counted in a note; two rows of one step of one rank that differ are
refused naming both lines.
"""

from __future__ import annotations

import csv
import difflib
import json
import math
import re
from collections import Counter
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Iterable, Iterator

from whywait.agents.events import FIELD_BOUNDS, NOT_IN_NAMES, PHASE_SLACK, UNIT_BOUNDS
from whywait.engine.importers import ImportFormatError, number_runs

from whywait import jsonl

PHASES = ("data_wait_s", "compute_s", "comm_s", "collective_s", "pipeline_wait_s", "checkpoint_s")
# A rank's coordinates in the job's parallel layout, as the placement contract names them (PLACED_RANK).
COORDS = ("pp", "dp", "tp")
KNOWN = {"time", "ended_at", "job", "rank", "step", "duration_s", "node", *PHASES, *COORDS}

# Other names real tables give these columns (training loggers, spreadsheets, other tools), and the
# units a name's suffix states.  A header is compared after lower-casing it and turning every run of
# other characters into one "_" ("Step Time (ms)" is step_time_ms).  Only names that cannot mean
# anything else are taken: ``local_rank`` is not the global rank, and ``ts`` has no unit.
_ALIASES: dict[str, tuple[str, ...]] = {
    "time": ("timestamp", "end_time", "ended", "end", "time_s", "timestamp_s", "wall_time"),
    "job": ("job_id", "job_name", "jobid"),
    "rank": ("global_rank", "rank_id", "world_rank"),
    "step": ("iteration", "iter", "global_step", "step_id", "step_num", "step_number"),
    "duration_s": ("duration", "step_time", "step_time_s", "step_duration", "iter_time", "iteration_time",
                   "elapsed", "elapsed_s", "step_s", "batch_time"),
    "node": ("host", "hostname", "host_name", "node_name", "nodename"),
    # The phases as training loggers time them (mmengine's and timm's ``data_time``, a loop's ``fwd_bwd_time``
    # and ``allreduce_time``).  A time of the forward or the backward pass alone is no phase: left out.
    "data_wait_s": ("data_wait", "data_time", "dataloader_time", "data_load_time", "data_loading_time",
                    "dataloading_time"),
    "compute_s": ("compute", "compute_time", "fwd_bwd_time", "fwd_bwd", "forward_backward",
                  "forward_backward_time"),
    "comm_s": ("comm", "comm_time", "communication_time", "allreduce_time", "all_reduce_time", "sync_time"),
    # The rank's coordinates, as Megatron-LM (get_pipeline_model_parallel_rank, ...) and loggers name them.  A bare
    # ``stage`` is not taken (a loop's "train"/"eval" stage, Lightning's "fit"), nor a bare ``replica`` (a
    # Kubernetes job's replica index or type): those are left out with the note, and may be renamed ``pp``, ``dp``.
    "pp": ("pp_rank", "pp_stage", "pipeline_stage", "pipeline_rank", "pipeline_parallel_rank",
           "pipeline_model_parallel_rank"),
    "dp": ("dp_rank", "data_parallel_rank", "dp_replica", "data_parallel_replica"),
    "tp": ("tp_rank", "tensor_parallel_rank", "tensor_model_parallel_rank"),
}
# A name's last word, when it is one of these, is its unit (``data_time_ms``, ``fwd_bwd_time_s``).
_UNITS = {"s": 1.0, "ms": 1e-3, "us": 1e-6, "ns": 1e-9}
# Columns loggers write that are spelt like a field but are another thing (not typos): left out.
_OTHER_FIELDS = frozenset({"local_rank", "node_rank", "world_size", "local_world_size", "group_rank",
                           "micro_step", "start_time", "step_start", "iter_start"})
_SCALED = ("time", "ended_at", "duration_s", *PHASES)  # the columns a unit suffix may scale


def _normal(name: str) -> str:
    return "_".join(w for w in "".join(c if c.isalnum() else " " for c in name.lower()).split())


def _columns(names: Iterable[str], strict: bool = True, notes: Counter[str] | None = None,
             source: str = "") -> dict[str, tuple[str, float]]:
    """Each column's name → (the field it is, the factor to seconds): every known spelling of a field.

    Called once for a CSV header and once per distinct key set of JSON lines.  Raises
    :class:`ImportFormatError` (without a place: the caller adds it) for two columns that are one
    field ("iteration" and "step"), and, when ``strict`` (a CSV header), for a column that reads
    like a misspelt field; a CSV's other columns (a logger's loss, lr) are left out and counted in
    ``notes``, and JSON lines' other keys are left out, as they always were.
    """
    spelled = {a: f for f, al in _ALIASES.items() for a in al} | {k: k for k in KNOWN}
    out: dict[str, tuple[str, float]] = {}
    unknown: set[str] = set()
    for name in names:
        n = _normal(str(name))
        field, scale = spelled.get(n), 1.0
        if field is None:
            base, _, unit = n.rpartition("_")
            if unit in _UNITS:
                # "duration_ms", "step_time_ms", "data_wait_ms", "time_ms": the field, then the unit
                field = spelled.get(base) or spelled.get(base + "_s")
                scale = _UNITS[unit]
                if field not in _SCALED:
                    field = None
        if field is None:
            unknown.add(str(name))
        else:
            out[name] = (field, scale)
    if unknown and strict:
        # A logger's table holds more than timings (loss, lr, tokens/s): those are left out, and the import
        # says so.  A column that reads like a misspelt field ("duraton_s") is refused, naming the field,
        # for leaving it out would lose a phase without a word.
        bases = ("duration", "step_time", "time", *(f.removesuffix("_s") for f in PHASES))
        # Not the coordinates' names: a logger's other ranks (cp_rank, ep_rank, vpp_rank) read like a misspelt
        # tp_rank or pp_rank, and a coordinate left out costs no timing (the note names it).
        names = sorted(n for n, f in spelled.items() if f not in COORDS) + [f"{a}_{u}" for a in bases for u in _UNITS]
        typos = {u: near[0] for u in unknown if _normal(u) not in _OTHER_FIELDS
                 and (near := difflib.get_close_matches(_normal(u), names, n=1, cutoff=0.85))}
        if typos:
            raise ImportFormatError("unknown column(s) " + ", ".join(f"{u!r} (did you mean {t!r}?)"
                                                                       for u, t in sorted(typos.items())[:5])
                                    + f" (known: {', '.join(sorted(KNOWN))}, or their usual other names, "
                                    "with _ms/_us/_ns for other units)")
    if strict:
        # A header without the fields every row needs is no step table (or its names are not ones we know):
        # say which are missing, and what was there, at line 1 rather than "is required" at line 2.
        have = {"time" if f == "ended_at" else f for f, _ in out.values()}
        missing = [f for f in ("time", "rank", "step", "duration_s") if f not in have]
        if missing:
            raise ImportFormatError(f"no {', '.join(missing)} column{'s' if len(missing) > 1 else ''} (known names: "
                                    + "; ".join(f"{f}: {', '.join((f,) + _ALIASES.get(f, ())[:3])}" for f in missing)
                                    + ")" + (f"; other columns: {_few(unknown)}" if unknown else ""))
    if unknown and strict and notes is not None:
        notes[f"{source}{': ' if source else ''}column(s) {_few(unknown)} hold no step timing: left out"] += 1
    seen: dict[str, str] = {}
    for name, (field, _) in out.items():
        field = "time" if field == "ended_at" else field
        if field in seen:
            raise ImportFormatError(f"columns {seen[field]!r} and {name!r} are both {field}: keep one")
        seen[field] = name
    return out


def _canonical(row: dict[str, Any], cols: dict[str, tuple[str, float]]) -> dict[str, Any]:
    """``row`` under the contract's names, numbers in a unit other than seconds converted to seconds."""
    out: dict[str, Any] = {}
    for name, v in row.items():
        if name not in cols:
            continue  # a key of a JSON line that is no field
        field, scale = cols[name]
        if scale != 1.0 and v is not None and not isinstance(v, bool):
            try:
                v = float(v) * scale if not (isinstance(v, str) and not v.strip()) else v
            except (TypeError, ValueError, OverflowError):
                pass  # left as given: the field's own check names it
        out["time" if field == "ended_at" else field] = v
    return out


def _short(v: Any) -> str:
    text = repr(v)
    return text if len(text) <= 60 else text[:40] + f"... ({len(text)} chars)"


def _few(names: set[str], most: int = 5) -> str:
    """Up to ``most`` of ``names``, each shortened, and how many more: a header that is not one
    (a binary file, a JSON document) must not print hundreds of kilobytes as one error line."""
    shown = [n if len(n) <= 40 else n[:30] + f"... ({len(n)} chars)" for n in sorted(names)[:most]]
    more = len(names) - len(shown)
    return ", ".join(shown) + (f" and {more:,} more" if more else "")


def _time(v: Any, where: str) -> tuple[float, bool]:
    """The time in ``v`` (Unix seconds or ISO 8601), and whether it was written as a number."""
    numeric = True
    try:
        if isinstance(v, (int, float)) and not isinstance(v, bool):
            t = float(v)
        else:
            s = str(v).strip()
            try:
                t = float(s)
            except ValueError:
                numeric = False
                dt = datetime.fromisoformat(s.replace("Z", "+00:00"))
                t = (dt if dt.tzinfo else dt.replace(tzinfo=timezone.utc)).timestamp()
    except (ValueError, OverflowError, OSError):  # OverflowError: an integer of 400 digits
        raise ImportFormatError(f"{where}: time must be Unix seconds or ISO 8601 (got {_short(v)})") from None
    if not math.isfinite(t):
        raise ImportFormatError(f"{where}: time must be Unix seconds or ISO 8601 (got {_short(v)})")
    return t, numeric


# A time in seconds since 1970 is at most this (the contract's bound: the year 5138); a larger number is an
# epoch in a finer unit.  Each unit's range ends where the next begins, so a number reads as one unit only.
_EPOCH_MAX = UNIT_BOUNDS["s since epoch (UTC)"][1]
_EPOCH_UNITS = ((1e3, "milliseconds", "ms"), (1e6, "microseconds", "us"), (1e9, "nanoseconds", "ns"))


def _epoch_unit(t: float) -> tuple[float, str, str]:
    """The unit a numeric time reads in, by its size: ``(per second, word, suffix)``; seconds are ``(1, ...)``."""
    if t <= _EPOCH_MAX:
        return 1.0, "seconds", "s"
    for factor, word, suffix in _EPOCH_UNITS:
        if t / factor <= _EPOCH_MAX:
            return factor, word, suffix
    return 1.0, "seconds", "s"  # no unit makes it a time: refused as out of bounds


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


class _Header:
    """The columns a row came from: each field's column name and factor to seconds, and the cell separator."""

    __slots__ = ("names", "sep")

    def __init__(self, cols: dict[str, tuple[str, float]], sep: str = "") -> None:
        self.names = {("time" if f == "ended_at" else f): (name, scale) for name, (f, scale) in cols.items()}
        self.sep = sep  # "" for JSON lines

    def column(self, field: str) -> str:
        """``column duration_s``, or ``column 'Step Time (ms)' (duration_s)`` when the table names it otherwise."""
        name = self.names.get(field, (field, 1.0))[0]
        shown = name if re.fullmatch(r"[A-Za-z0-9_.-]+", name) else _short(name)
        return f"column {shown}" if name == field else f"column {shown} ({field})"


_SEPARATORS = (",", "\t", ";", "|")


def _separator(header: str) -> str:
    """The cell separator a header line uses: the one of :data:`_SEPARATORS` it holds most of, outside quotes
    (a comma when it holds none: a table of one column)."""
    bare = re.sub(r'"[^"]*"', "", header)
    counts = [(bare.count(d), -i, d) for i, d in enumerate(_SEPARATORS)]
    n, _, sep = max(counts)
    return sep if n else ","


def _rows(path: Path, notes: Counter[str] | None = None) -> Iterator[tuple[int, dict[str, Any], _Header]]:
    try:
        yield from _parsed_rows(path, notes)
    except UnicodeDecodeError:
        raise _not_utf8(path) from None


def _parsed_rows(path: Path, notes: Counter[str] | None = None) -> Iterator[tuple[int, dict[str, Any], _Header]]:
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
            known: dict[tuple[str, ...], tuple[dict[str, tuple[str, float]], _Header]] = {}
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
                keys = tuple(row)
                got = known.get(keys)
                if got is None:
                    try:
                        cols = _columns(keys, strict=False)
                    except ImportFormatError as exc:
                        raise ImportFormatError(f"{path}:{no}: {exc}") from None
                    got = (cols, _Header(cols))
                    if len(known) < 64:  # a few key sets in practice; a file of ever-new keys is not cached
                        known[keys] = got
                yield no, _canonical(row, got[0]), got[1]
        else:
            # The separator from the header line: a TSV, or a table a spreadsheet saved with ";" (a locale whose
            # decimal mark is the comma), reads as a CSV does.
            sep = _separator(fh.readline(1 << 16))
            fh.seek(0)
            reader = csv.DictReader(fh, delimiter=sep)
            try:
                if not reader.fieldnames:
                    raise ImportFormatError(f"{path}: no rows: the table is empty")
                try:
                    cols = _columns(reader.fieldnames, notes=notes, source=path.name)
                except ImportFormatError as exc:
                    raise ImportFormatError(f"{path}:1: {exc}") from None
                head = _Header(cols, sep)
                if sep in (";", "|") and notes is not None:
                    notes[f"{path.name}: cells separated by {sep!r} (read as such)"] += 1
                for row in reader:
                    if any(str(c).strip() for c in row.get(None) or ()):  # more cells than the header has columns
                        raise ImportFormatError(f"{path}:{reader.line_num}: {len(row[None]) + len(cols)} cells, "
                                                f"and the header names {len(cols)} columns")
                    yield reader.line_num, _canonical(row, cols), head
            except csv.Error as exc:  # a NUL byte, a field over the csv module's size limit
                raise ImportFormatError(f"{path}:{max(reader.line_num, 1)}: not a CSV row ({exc})") from None


def read_steps(path: Path, job: str | None = None, node: str | None = None,
               notes: Counter[str] | None = None) -> Iterator[tuple[str, str, dict[str, Any]]]:
    """Yield ``(job, node, StepTiming record)`` per row, with ``ended_at`` set to the row's time.

    ``notes`` counts what was left out (a logger's other columns, rows repeated exactly).  A table with no
    row at all (empty, or a header alone) raises :class:`ImportFormatError`: importing nothing must not look
    like success.  :func:`read_step_rows` gives each row's line too.
    """
    for _, j, n, rec in read_step_rows(path, job, node, notes):
        yield j, n, rec


_DECIMAL_COMMA = re.compile(r"\s*[-+]?[0-9]*,[0-9]+\s*")
_SECONDS = UNIT_BOUNDS["s"]


def _cell(row: dict[str, Any], f: str, where: str, head: _Header, integer: bool = False) -> float | int | None:
    """The number in ``row``'s ``f`` (None when empty), checked against the contract's bounds for it."""
    v = row.get(f)
    if head.sep == ";" and isinstance(v, str) and _DECIMAL_COMMA.fullmatch(v):
        raise ImportFormatError(f"{where}: {head.column(f)}: {v.strip()!r} has a decimal comma (the table is "
                                "';'-separated, as spreadsheets save it where the comma is the decimal mark): "
                                "save it with decimal points")
    x = _num(v, f"{where}: {f}", integer, FIELD_BOUNDS[f][1] if f in FIELD_BOUNDS else math.inf)
    if x is not None and f not in FIELD_BOUNDS and not _SECONDS[0] <= x <= _SECONDS[1]:
        raise ImportFormatError(f"{where}: {head.column(f)}: {x:g} s is outside {_SECONDS[0]:g}..{_SECONDS[1]:g} s")
    return x


def utc_text(t: float) -> str:
    """``t`` (Unix seconds) as UTC ISO 8601 with as many fractional digits as it needs, to the microsecond
    (``2026-12-04T16:00:00.25Z``); seconds since 1970 when it is past what a date can hold."""
    try:
        dt = datetime.fromtimestamp(t, timezone.utc)
    except (OverflowError, OSError, ValueError):
        return f"{t!r} s since 1970"
    frac = f"{dt.microsecond / 1e6:.6f}"[1:].rstrip("0").rstrip(".")
    return dt.strftime("%Y-%m-%dT%H:%M:%S") + frac + "Z"


def _differs(a: tuple[str, dict[str, Any]], b: tuple[str, dict[str, Any]]) -> str:
    """What differs between two rows of one step (node, record): ``duration_s 0.8 there, 0.9 here``.

    Each value in full (a time as UTC to the microsecond, a number to 12 digits, or as it reads back exactly when
    that is what differs): with ``%g`` two times a second apart both printed ``1.7964e+09``.
    """
    (na, ra), (nb, rb) = a, b
    out = [f"node {_short(na)} there, {_short(nb)} here"] if na != nb else []
    for f in ("ended_at", "duration_s", *PHASES):
        if ra.get(f) != rb.get(f):
            if f == "ended_at" and utc_text(ra[f]) != utc_text(rb[f]):
                there, here = utc_text(ra[f]), utc_text(rb[f])
            else:
                # 12 digits hide a unit's conversion noise (497.87 ms read 0.49787000000000003 s); two values that
                # differ only past them are shown in full
                there, here = ("-" if r.get(f) is None else f"{r[f]:.12g}" for r in (ra, rb))
                if there == here:
                    there, here = (repr(r[f]) for r in (ra, rb))
            out.append(f"{'time' if f == 'ended_at' else f} {there} there, {here} here")
    return "; ".join(out[:3])


# Each (job, rank)'s coordinates read so far: field -> (value, where it was first read: ``file:line``).
Coords = dict[tuple[str, int], dict[str, tuple[int, str]]]
_COORD_WORDS = {"pp": "pipeline stage", "dp": "data-parallel replica", "tp": "tensor-parallel rank",
                "cp": "context-parallel rank"}
_INDEX_MAX = UNIT_BOUNDS["index"][1]  # the contract's bound on a placement's index fields


def _read_coords(row: dict[str, Any], where: str, head: _Header, rank: int, have: dict[str, tuple[int, str]]) -> None:
    """Take ``row``'s coordinate cells (``pp``, ``dp``, ``tp``) into ``have``, its rank's coordinates so far.

    An empty cell is unknown (the rank's other rows may give it); a value that is no whole number from 0 is
    refused at its cell, and one that differs from what an earlier row of the rank said is refused naming both
    lines: a rank does not change stage in a run, so one of them belongs to another rank or another run.
    """
    for f in COORDS:
        if f not in row:
            continue
        # A bare "tp" or "dp" column that imported before (left out, with the note) may count something else
        # (a classifier's true positives): the refusal says how to have it left out again.
        bare = _normal(head.names.get(f, (f, 1.0))[0]) == f
        hint = f" (if column {f} is no {_COORD_WORDS[f]}, rename it)" if bare else ""
        try:
            v = _num(row.get(f), f"{where}: {head.column(f)}", integer=True, most=_INDEX_MAX)
        except ImportFormatError as exc:
            raise ImportFormatError(f"{exc}{hint}") from None
        if v is None:
            continue
        first = have.setdefault(f, (int(v), where))
        if first[0] != v:
            path = where.rpartition(":")[0]
            there = f"line {first[1].rpartition(':')[2]}" if first[1].rpartition(":")[0] == path else first[1]
            raise ImportFormatError(f"{where}: {head.column(f)}: rank {rank} is {f} {v} here and {f} {first[0]} on "
                                    f"{there}: a rank keeps one {_COORD_WORDS[f]} for the whole run{hint}")


def read_step_rows(path: Path, job: str | None = None, node: str | None = None,
                   notes: Counter[str] | None = None,
                   coords: Coords | None = None) -> Iterator[tuple[int, str, str, dict[str, Any]]]:
    """Yield ``(line, job, node, StepTiming record)`` per row (see :func:`read_steps`), each checked against
    the contract as it is read, so an error names its line; rows repeated exactly are dropped (counted in
    ``notes``), and two different rows of one (job, rank, step) are refused naming both lines.

    ``coords`` (when given) gathers each ``(job, rank)``'s coordinates from the ``pp``, ``dp`` and ``tp`` columns,
    with the line each was first read at; pass one mapping for all of a job's files so that a rank given two
    stages in two files is refused too.  :func:`rank_coords` turns it into the placement's coordinates.
    """
    coords = {} if coords is None else coords  # checked even when the caller keeps none: an error is the file's
    rows = 0
    clock: tuple[float, str, int, Any] | None = None  # the time column's unit: (per second, word, line, cell)
    seen: dict[tuple[str, int, int], tuple[int, str, dict[str, Any]]] = {}
    repeated = 0
    for no, row, head in _rows(path, notes):
        rows += 1
        where = f"{path}:{no}"
        t = row.get("time")
        if t in (None, ""):
            raise ImportFormatError(f"{where}: time: is required (when the step ended)")
        ended, numeric = _time(t, f"{where}: time")
        if numeric:
            factor, word, suffix = _epoch_unit(ended)
            name, scale = head.names.get("time", ("time", 1.0))
            if clock is None:
                clock = (factor, word, no, t)
                if factor != 1.0:
                    if scale != 1.0:  # the column names its unit, and the cells are in a finer one
                        raise ImportFormatError(f"{where}: {head.column('time')}: {ended:g} s since 1970 in the "
                                                f"unit the column names, over {_EPOCH_MAX:g} s: are its times in "
                                                "that unit?")
                    if notes is not None:
                        notes[f"{path.name}: column {name} holds {word} since 1970 (line {no}: {_short(t)}): read "
                              f"as {word}; name the column {name}_{suffix} to say so"] += 1
            elif factor != clock[0]:
                looks = f"looks like {word} since 1970" if factor != 1.0 else f"reads as {word}"
                raise ImportFormatError(f"{where}: {head.column('time')}: {_short(t)} {looks}, and line {clock[2]} "
                                        f"({_short(clock[3])}) holds {clock[1]}: one unit for the whole column")
            ended /= factor
        if not 0.0 <= ended <= _EPOCH_MAX:
            raise ImportFormatError(f"{where}: {head.column('time')}: {_short(t)} is outside 0..{_EPOCH_MAX:g} s "
                                    "since 1970")
        rec: dict[str, Any] = {"ended_at": ended}
        for f, integer in (("rank", True), ("step", True), ("duration_s", False)):
            v = _cell(row, f, where, head, integer)
            if v is None:
                raise ImportFormatError(f"{where}: {f}: is required")
            rec[f] = v
        # As the contract checks it (PHASE_SLACK): a phase is timed apart from its step, so a little over it is
        # allowed, and more cannot have been measured.
        most = rec["duration_s"] * PHASE_SLACK[0] + PHASE_SLACK[1]
        for f in PHASES:
            v = _cell(row, f, where, head)
            if v is not None:
                if v > most:
                    raise ImportFormatError(f"{where}: {head.column(f)}: {v:g} s is longer than its step allows "
                                            f"(duration_s {rec['duration_s']:g} s: at most {PHASE_SLACK[0]:g} × "
                                            f"duration_s + {PHASE_SLACK[1]:g} s, {most:g} s here)")
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
        j, n = str(j), str(n)
        # Before the repeat check: a row repeated but for its stage is a conflict, not a repeat.
        _read_coords(row, where, head, rec["rank"], coords.setdefault((j, rec["rank"]), {}))
        # One row per rank per step: a repeat of a row is dropped, two rows that disagree are refused.
        key = (j, rec["rank"], rec["step"])
        first = seen.get(key)
        if first is not None:
            if (first[1], first[2]) == (n, rec):
                repeated += 1
                continue
            raise ImportFormatError(f"{where}: job {j} rank {rec['rank']} step {rec['step']} is also on line "
                                    f"{first[0]}, with other values ({_differs((first[1], first[2]), (n, rec))}): "
                                    "one row per rank per step")
        seen[key] = (no, n, rec)
        yield no, j, n, rec
    if not rows:
        raise ImportFormatError(f"{path}: no rows: the table is empty" + (
            "" if path.stat().st_size == 0 else " but for its header"))
    if repeated and notes is not None:
        notes[f"{path.name}: {repeated} row{'s' if repeated > 1 else ''} repeated exactly (the same step of the "
              "same rank, every value equal): dropped"] += 1


# Megatron-LM's default rank order, fastest-varying first: ``initialize_model_parallel(order="tp-cp-ep-dp-pp")``
# builds ``RankGenerator(tp, ep=1, dp, pp, cp, order)`` for the model's (non-expert) groups, whose
# ``generate_masked_orthogonal_rank_groups`` gives global_rank = tp_rank + cp_rank*tp + dp_rank*tp*cp
# + pp_rank*tp*cp*dp (megatron/core/parallel_state.py).  ``ep`` is left out: it has a RankGenerator of its own
# (expert layers only) that splits the dp × cp ranks again, so it gives no rank a place of its own here.
LAYOUT_ORDER = ("tp", "cp", "dp", "pp")


def parse_layout(text: str) -> dict[str, int]:
    """The sizes in ``--layout`` text (``pp=4,dp=2,tp=8``), in the order given; called by ``whywait import``.

    Raises :class:`ImportFormatError` (one line) for a name other than ``tp``, ``cp``, ``dp``, ``pp``, a size that
    is no whole number from 1, a name given twice, or no size at all.
    """
    sizes: dict[str, int] = {}
    for part in (p.strip() for p in text.split(",")):
        if not part:
            continue
        name, eq, value = (x.strip() for x in part.partition("="))
        name = name.lower()
        if not eq:
            raise ImportFormatError(f"--layout {text!r}: {part!r} is not name=size (as in pp=4,dp=2,tp=8)")
        if name == "ep":
            raise ImportFormatError(f"--layout {text!r}: ep gives no rank a place of its own (Megatron-LM lays out "
                                    "experts within dp × cp): give tp, cp, dp and pp")
        if name not in LAYOUT_ORDER:
            raise ImportFormatError(f"--layout {text!r}: unknown size {name!r} (known: tp, cp, dp, pp)")
        if name in sizes:
            raise ImportFormatError(f"--layout {text!r}: {name} is given twice")
        if not value.isdigit() or int(value) < 1:
            raise ImportFormatError(f"--layout {text!r}: {name} must be a whole number from 1 (got {value!r})")
        sizes[name] = int(value)
    if not sizes:
        raise ImportFormatError(f"--layout {text!r}: no sizes (as in pp=4,dp=2,tp=8)")
    return sizes


def layout_text(sizes: dict[str, int]) -> str:
    """``pp=4 × dp=2 × tp=8 = 64 ranks``: the sizes as given and the ranks they make, for errors and notes."""
    return " × ".join(f"{k}={v}" for k, v in sizes.items()) + f" = {math.prod(sizes.values()):,} ranks"


def layout_coords(sizes: dict[str, int], rank: int) -> dict[str, int]:
    """``rank``'s coordinates in the layout ``sizes`` (those it names), in Megatron-LM's default order
    (:data:`LAYOUT_ORDER`: tp fastest, then cp, dp, pp slowest): with pp=4, dp=2, tp=8 rank 21 is tp 5 of
    replica 0 of stage 1.  Called per rank by :func:`rank_coords`."""
    out: dict[str, int] = {}
    stride = 1
    for name in LAYOUT_ORDER:
        size = sizes.get(name, 1)
        if name in sizes:
            out[name] = (rank // stride) % size
        stride *= size
    return out


def rank_coords(job: str, ranks: Iterable[int], given: Coords, sizes: dict[str, int] | None = None,
                notes: Counter[str] | None = None) -> dict[int, dict[str, int]]:
    """Each of ``job``'s ``ranks`` → its coordinates for the placement (``{"pp": 1, "dp": 0}``; empty when none).

    Called by ``whywait import`` once per job, after every file is read.  ``given`` holds what the tables' columns
    said (:func:`read_step_rows`), ``sizes`` the ``--layout``.  Raises :class:`ImportFormatError`, in one line,
    when a rank lies outside the layout (naming the sizes and the ranks), when a column disagrees with the layout
    (naming the rank and the line), and when some ranks have a coordinate and others none, without a layout to
    give it to them: the placement would say half a layout, and the stage rules compare ranks by stage.
    """
    ranks = sorted(set(ranks))
    layout: dict[int, dict[str, int]] = {}
    if sizes:
        total = math.prod(sizes.values())
        outside = [r for r in ranks if r >= total]
        if outside:
            n = ranks[-1] + 1
            hint = f": add dp={n // total}?" if "dp" not in sizes and n % total == 0 else ""
            raise ImportFormatError(f"--layout {layout_text(sizes)}, and job {job} has {len(ranks):,} ranks "
                                    f"({number_runs(ranks)}): rank{'s' if len(outside) > 1 else ''} "
                                    f"{number_runs(outside)} {'lie' if len(outside) > 1 else 'lies'} outside it{hint}")
        if len(ranks) < total and notes is not None:
            notes[f"job {job}: --layout {layout_text(sizes)}; the files hold {len(ranks):,} of them "
                  f"({number_runs(ranks)})"] += 1
        layout = {r: layout_coords(sizes, r) for r in ranks}
    for f in COORDS:
        have = [r for r in ranks if f in given.get((job, r), {})]
        if have and len(have) < len(ranks) and not (sizes and f in sizes):
            lack = [r for r in ranks if f not in given.get((job, r), {})]
            raise ImportFormatError(f"job {job}: rank{'s' if len(have) > 1 else ''} {number_runs(have)} "
                                    f"{'have' if len(have) > 1 else 'has'} a {f} ({_COORD_WORDS[f]}; "
                                    f"{given[(job, have[0])][f][1]}) and rank{'s' if len(lack) > 1 else ''} "
                                    f"{number_runs(lack)} none: give every rank's {f}, or none (--layout gives "
                                    "every rank its coordinates)")
    out: dict[int, dict[str, int]] = {}
    for r in ranks:
        co = dict(layout.get(r, {}))
        for f, (v, where) in given.get((job, r), {}).items():
            if f in co and co[f] != v:
                raise ImportFormatError(f"{where}: rank {r} is {f} {v} in the table, and --layout "
                                        f"{layout_text(sizes or {})} makes it {f} {co[f]}: which is right?")
            co[f] = v
        out[r] = {f: co[f] for f in ("pp", "dp", "tp", "cp") if f in co}
    return out
