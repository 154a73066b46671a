"""PyTorch profiler (Kineto) traces → contract ``steps`` records, with the step split and event time kept.

Called by ``whywait import`` for a Chrome-trace JSON file (``.json`` or ``.json.gz``) that
``torch.profiler`` wrote for one rank: the object form (``{"traceEvents": [...]}``) or the Trace
Event Format's array form (the events alone, its closing ``]`` optional).  A trace cut short, in either form,
inside an event or inside its gzip stream (a tracer killed as it wrote, a copy not finished), is read up to
its last whole event, with a note naming that event (``_parse``); one cut before any whole event, or before
any step, is refused saying "truncated?".  The steps of a cut trace keep their duration and leave their phases
out, unknown, with a note: any step may have lost kernels after the cut (Kineto writes the device's events after
the host's, in no time order), and phases read from the events before it are made up (zero compute).  Spans are complete
(``"ph": "X"``) events, or ``B``/``E`` pairs as other tracers write them: per (pid, tid), in time order,
an ``E`` closes the latest open ``B`` of its name (the latest open one when it has no name); a ``B``
never closed or an ``E`` with nothing to close is counted in the import notes and ignored.  Async
``b``/``e`` events are not spans of a thread and are not read.

One trace is one rank's: ``ProfilerStep`` spans in more than one process (pid) mean several ranks'
traces merged into one file (concatenated, or written by a tool that combines them), and the import
stops with one line naming the file and the pids, asking for one trace per rank.  It is not split:
nothing in the trace says which rank each pid is (``distributedInfo`` is one per file), and the
correlation ids that tie a kernel to its launch are counted per process, so two processes' collide.
Ranks merged under one pid (containers reuse pids) are stopped the same way when the trace shows it:
two ``process_name`` values for one pid, one step number with two spans, or two steps that overlap
(``_Names``, ``_steps_merged``); two JSON documents one after the other are said to be that.  One
process driving several GPUs (one ``ProfilerStep`` series, kernels on several devices) is one
rank's trace and is read.  How each figure is read from the trace:

- a step is a host-side ``ProfilerStep#N`` span (category ``user_annotation``, ``cpu_op`` or
  ``python_function``; ``Operator`` in PyTorch 1.8/1.9 traces, whose ``Runtime`` and ``Kernel``
  categories are read as ``cuda_runtime`` and ``kernel``; a ``gpu_user_annotation`` copy is not a
  step); ``duration_s`` is its length, its end is the
  message's event time (``ts`` is wall-clock microseconds, plus ``baseTimeNanoseconds``
  when newer Kineto versions write times relative to it);
- a GPU kernel belongs to the step whose CPU span contains its launch (the runtime or driver
  call, ``cudaLaunchKernel``, ``cuLaunchKernel``, ``hipLaunchKernel`` and the like, with the same
  ``correlation``, on whichever thread: the autograd thread launches the backward pass), because
  kernels run after the CPU has moved on;
- ``compute_s`` is the union of the step's non-NCCL kernels; ``comm_s`` the union of its
  NCCL kernels minus the time they overlap compute (the contract counts only
  communication *not* overlapped with compute); it is split into ``pipeline_wait_s``
  (send and receive kernels) and ``collective_s`` (every other NCCL kernel).  A kernel's op is,
  first, that of the ``nccl:`` annotation around its launch on the launching thread (recent PyTorch
  writes a point-to-point op with its peers, ``nccl:send 1->0``); else the kernel's own
  ``Collective name`` arg; else that of the innermost ``record_param_comms`` span around its launch
  on that thread, whose ``Collective name`` arg ProcessGroupNCCL sets to ``send``/``recv`` for
  point-to-point and ``allreduce``, ``_allgather_base``, ``all_to_all``, ... for collectives
  (pytorch/pytorch ``torch/csrc/distributed/c10d/ProcessGroupNCCL.cpp``, ``RECORD_PARAM_COMMS_DATA``
  in ``send``/``recv``, commit 0007e752; the arg names are ``kCommsName = "Collective name"``,
  ``kProcessGroupName = "Process Group Name"``, ``kProcessGroupDesc = "Process Group Description"`` in
  ``torch/csrc/profiler/util.h``, commit 035290b7; Kineto copies them onto the NCCL kernel, as HTA's
  ``nccl_data.json.gz`` shows).  The process group's name and description are not used: they name
  groups (``default_pg``), not what kind of traffic they carry.  ``nccl:coalesced`` is no op: it wraps
  the launch of a group of ops issued together, whose own spans closed before it; the group is what
  those ops were (``_deferred_ops``), so coalesced pipeline send/recv pairs are pipeline wait, and each
  kernel is counted once, in one phase;
- ``data_wait_s`` is the union of data-loader spans (``enumerate(DataLoader)...``,
  ``## data_load ##``) inside the step.  A trace without any such span leaves the phase
  out: unknown, not zero.  Likewise a trace with no GPU kernel at all (a CPU-only profile) leaves
  the GPU phases out;
- the rank is ``--rank`` (said in a note when the trace's ``distributedInfo.rank``, or else its file name,
  says another), else ``distributedInfo.rank``, else a ``rank-N`` in the file name (said in a note), else
  the import stops and asks for ``--rank``.

Memory copies and sets count as neither compute nor communication.  Device work is read from the
``kernel`` category and from MTIA's ``mtia_ccp_events`` (``_KERNEL_CATS``; MTIA's ``dma_request``
transfers are memory), launched through any runtime (``cuda_runtime``, ``mtia_runtime``, XPU,
privateuse1: ``_LAUNCH_CATS``).  No real MTIA trace was at hand (HTA's
``tests/data/mtia_trace_single_rank`` is gzip, which the code search used here cannot read), so the
MTIA reading follows Kineto's and HTA's source, and MTIA's collectives, whose kernels are not named
``nccl``, count as compute.  A trace whose device work is all in other categories reads as a CPU-only
profile: its GPU phases unknown, not zero.

Ids and times written as strings (``"ts": "1682725898082228"``, ``"correlation": "5"``) read as the
numbers they spell.  The file is read once and held once while it is parsed (``load_trace``).
"""

from __future__ import annotations

import gzip
import itertools
import json
import math
import re
import zlib
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from whywait.agents.events import FIELD_BOUNDS, RANK_MAX
from whywait.engine.importers import ImportFormatError, number_runs

_STEP = re.compile(r"^ProfilerStep#([0-9]+)$")
_STEP_MAX = int(FIELD_BOUNDS["step"][1])
_LOADER = re.compile(r"dataloader|data_load|data loading", re.IGNORECASE)
_PIPELINE_OPS = frozenset({"send", "recv", "_send", "_recv", "batch_isend_irecv", "isend", "irecv"})
# Event categories, compared in lower case: PyTorch 1.8 and 1.9 wrote ``Operator``, ``Runtime`` and ``Kernel``
# where later versions write ``cpu_op``, ``cuda_runtime`` and ``kernel``.  A kernel's launch is any host
# runtime or driver call with its ``correlation``: ``cuda_runtime``/``cuda_driver``, and the same for XPU,
# MTIA and out-of-tree (``privateuse1``) devices.
_HOST_CATS = frozenset({"cpu_op", "user_annotation", "python_function", "operator"})
# Device work: ``kernel`` (CUDA, ROCm, XPU, privateuse1; PyTorch 1.8's ``Kernel``; and MTIA with Kineto versions
# that alias ``MTIA_CCP_EVENTS`` to ``CONCURRENT_KERNEL``), and ``mtia_ccp_events``, what earlier Kineto versions
# call the MTIA device's events (libkineto ``ActivityType.cpp``: ``{"mtia_ccp_events", MTIA_CCP_EVENTS}``; PyTorch's
# ``deviceTypeFromActivity`` maps it to ``DeviceType::MTIA`` as ``CONCURRENT_KERNEL`` to ``CUDA``; HTA's
# ``KERNEL_CATEGORY_PATTERN`` reads it as GPU kernels).
_KERNEL_CATS = frozenset({"kernel", "mtia_ccp_events"})
# MTIA's memory transfers are device events named ``dma_request`` (HTA PR #200, "memory events in MTIA are
# represented by dma_request", and HTA's ``MemoryKernelGroupingPattern`` ``^dma``): memory, so neither compute nor
# communication, as CUDA's ``gpu_memcpy`` is.  ``^dma`` alone is only trusted in the MTIA category.
_MTIA_MEMORY = re.compile(r"^dma")
_MEMORY_KERNEL = re.compile(r"^dma_request")
# Not what an NCCL kernel does: ``coalesced`` names a group of ops (see ``_deferred_ops``), ``wait`` the wait on one
# (``record_param_comms`` "wait" in the 2-rank DDP fixture), and "" nothing.
_NOT_AN_OP = frozenset({"", "coalesced", "wait"})
_LAUNCH_CATS = re.compile(r"^(?:runtime|[a-z0-9]+_(?:runtime|driver))$")
_EPOCH_US = 1e15  # microseconds since 1970 later than 2001: wall-clock timestamps
_TS_MAX_US = 1e17  # about the year 5000: any later ts or longer dur is garbage, not a time


@dataclass(frozen=True)
class KinetoStep:
    """One rank's step as read from a trace (times in Unix seconds)."""

    rank: int
    step: int
    start: float
    end: float
    duration_s: float
    compute_s: float | None  # None: the trace holds no GPU kernel at all (a CPU-only profile): unknown
    comm_s: float | None
    collective_s: float | None
    pipeline_wait_s: float | None
    data_wait_s: float | None
    ts: float | None = None  # the step span's own ``ts`` in the trace (µs), to name it in an error

    def record(self) -> dict[str, Any]:
        """The contract's StepTiming record for this step (an unknown phase is left out)."""
        r: dict[str, Any] = {"rank": self.rank, "step": self.step, "duration_s": round(self.duration_s, 6),
                             "ended_at": self.end}
        for name in ("compute_s", "comm_s", "collective_s", "pipeline_wait_s", "data_wait_s"):
            v = getattr(self, name)
            if v is not None:
                r[name] = round(v, 6)
        return r


# The largest trace read, decompressed (``whywait import --max-trace-mib``).  Parsing holds several
# times this in memory; a 2 GiB trace is a very long profile, and a small .gz that inflates past
# it (a decompression bomb) is refused before it fills the machine's memory.
TRACE_MAX_BYTES = 2 << 30


def _read_capped(path: Path, cap: int, cut: list[str] | None = None) -> bytes | bytearray:
    """The file's bytes, gunzipped when it is gzip, refused once they pass ``cap``.

    A gzip file inflates into one buffer that is returned as it is (a ``bytes`` copy of it would hold the
    trace twice at the peak); the gzip trailer's size (ISIZE, the length modulo 2**32) sizes nothing, for
    a hostile file can lie in it, so the cap is checked as the data inflates.  A gzip file cut short (a copy
    not finished) gives what inflated before the cut, said in ``cut``, so its whole events can still be read.
    """
    with path.open("rb") as fh:
        gz = fh.read(2) == b"\x1f\x8b"
    if not gz:
        if path.stat().st_size > cap:
            raise ImportFormatError(f"{path}: over {cap / 2**20:,.0f} MiB: a trace this large cannot be parsed "
                                    "here (profile fewer steps, or raise --max-trace-mib)")
        return path.read_bytes()
    out = bytearray()
    with gzip.open(path, "rb") as g:  # read in chunks: the size is known only as it inflates
        while True:
            try:
                # read1: one read of the compressed file at a time, so a cut loses nothing inflated before it
                chunk = g.read1(1 << 22)
            except EOFError:
                if not out:
                    raise
                if cut is not None:
                    cut.append("the gzip stream ends early")
                break
            if not chunk:
                break
            out += chunk
            if len(out) > cap:
                raise ImportFormatError(f"{path}: inflates past {cap / 2**20:,.0f} MiB (a decompression bomb, or "
                                        "a trace too large to parse here: profile fewer steps, or raise "
                                        "--max-trace-mib)")
    return out


def load_trace(path: Path, max_bytes: int = TRACE_MAX_BYTES, notes: Counter[str] | None = None) -> dict[str, Any]:
    """Read a (possibly gzipped) Chrome-trace JSON file; raise :class:`ImportFormatError` naming it.

    ``max_bytes`` caps the trace's size once decompressed.  The file is read once: its bytes are decoded to
    text and dropped before the JSON is parsed, so the peak holds the text and the parsed events, not also
    the bytes (``json.loads`` of bytes would decode a copy while the caller still held them).  A trace cut
    short (``_parse``) is read up to its last whole event, said in ``notes``.
    """
    data, cut = _load(path, max_bytes)
    if cut and notes is not None:
        notes[cut] += 1
    return data


def _load(path: Path, max_bytes: int) -> tuple[dict[str, Any], str]:
    """:func:`load_trace`'s trace, and a note saying where it was cut short ("" when it is whole)."""
    cut: list[str] = []
    try:
        raw = _read_capped(path, max_bytes, cut)
        encoding = json.detect_encoding(raw)
        try:
            text = raw.decode(encoding, "surrogatepass")
        except UnicodeDecodeError as exc:
            if exc.reason != "unexpected end of data":
                raise
            text = raw[:exc.start].decode(encoding, "surrogatepass")  # a cut inside a character: see _parse
        del raw  # the bytes go before the parse: see the docstring
        data, cut_at = _parse(text)
    except FileNotFoundError:
        raise ImportFormatError(f"{path}: no such file") from None
    except json.JSONDecodeError as exc:
        if cut or _ends_early(exc):
            raise ImportFormatError(f"{path}: not a JSON trace ({exc.msg}: line {exc.lineno} column {exc.colno}): "
                                    f"truncated? {cut[0] if cut else 'the JSON breaks at the end of the file'}, and "
                                    "no whole event before that could be read") from None
        raise ImportFormatError(f"{path}: {_json_error(exc)}") from None
    except (OSError, ValueError, EOFError, zlib.error) as exc:  # ValueError: not UTF-8 (a UnicodeDecodeError)
        raise ImportFormatError(f"{path}: not a JSON trace ({exc})") from None
    except RecursionError:
        raise ImportFormatError(f"{path}: not a JSON trace (nested too deeply)") from None
    if isinstance(data, list):  # the Trace Event Format's array form: the events alone
        if not all(isinstance(e, dict) for e in data):
            raise ImportFormatError(f"{path}: not a profiler trace (a JSON array, but not of event objects)")
        data = {"traceEvents": data}
    if not isinstance(data, dict) or not isinstance(data.get("traceEvents"), list):
        raise ImportFormatError(f"{path}: not a PyTorch profiler trace (no traceEvents list)")
    if cut_at is None and not cut:
        return data, ""
    n = len(data["traceEvents"])
    why = cut[0] if cut else "the file ends inside an event"
    return data, (f"{path.name}: the trace is cut short ({why}, as a tracer killed mid-run or a copy not finished "
                  f"leaves it): read up to event {n:,} (traceEvents[{n - 1}]), the whole events before the cut; "
                  "a step whose span came after it is missing")


def _json_error(exc: json.JSONDecodeError) -> str:
    """What is wrong with a file that is not one JSON document, in words.

    Two traces written one after the other (``cat rank-0.json rank-1.json > all.json``) are valid JSON up to
    the end of the first: ``json`` calls the rest "Extra data".  Said as what it most likely is, for the
    question is then which rank's trace to import, not how to repair the JSON.
    """
    if exc.msg == "Extra data" and exc.doc[exc.pos:exc.pos + 1] in ("{", "["):
        return (f"more than one JSON document (a second one starts at line {exc.lineno} column {exc.colno}): "
                "traces written one after another; import one trace per rank")
    return f"not a JSON trace ({exc})"


def _parse(text: str) -> tuple[Any, int | None]:
    """The trace's JSON, and where it was cut (None: it is whole); a trace cut short is read up to its cut.

    The Trace Event Format lets the array form end without its ``]`` (a tracer killed mid-run
    still leaves a readable trace), so such a file is completed, after any trailing comma,
    rather than refused.  A trace cut inside an event (a tracer killed as it wrote one, a copy or
    download not finished), in either form (``{"traceEvents": [...`` is what Kineto writes as it goes), is read
    up to its last whole event (``_cut_events``).  Anything else that is not JSON, including a file that is
    broken before its end, raises ``ValueError`` as ``json.loads`` does, or :class:`ImportFormatError`
    for a file that ends too early to hold one whole event.
    """
    try:
        return json.loads(text), None
    except json.JSONDecodeError as exc:
        body = text.lstrip()
        if body.startswith("["):
            tail = body.rstrip().rstrip(",")
            try:
                return json.loads(tail + "]"), None
            except ValueError:
                pass
        got = _cut_events(text, exc)
        if got is None:
            raise
        return got
    except ValueError:
        raise


# How many places a cut trace is tried closed at (each try parses the whole text once): the last whole event's
# closing brace comes within a few of the cut (braces inside the cut event's args, or its kernel's name).
_CUT_TRIES = 16
_SPACE = re.compile(r"\s*")
_EVENT_END = re.compile(r"\s*(?:$|,|\])")  # what follows an event's closing brace: the next, the cut, the end


def _ends_early(exc: json.JSONDecodeError) -> bool:
    """Whether the JSON broke at the end of its text, as a file cut short does: an unterminated string runs to
    it, and any other break (a value, a comma, a name expected) is within a few characters of it."""
    if exc.msg == "Extra data":
        return False
    end = len(exc.doc)
    while end > exc.pos and exc.doc[end - 1].isspace():  # not rstrip(): that copies a trace of gigabytes
        end -= 1
    return exc.msg.startswith("Unterminated string") or end - exc.pos <= 16


def _cut_events(text: str, exc: json.JSONDecodeError) -> tuple[Any, int] | None:
    """A trace cut short read up to its last whole event: ``(the JSON, the offset of the cut)``; None when the
    JSON breaks before the file's end (a damaged file, not a cut one), or no close of it parses.

    The parser failed at the end of the file (an unterminated string runs to it; anything else is within a few
    characters of it), so everything before the event the cut is in is whole JSON: the events array is closed
    (``]``, and ``}`` for the object form) after each ``}`` that ends an event (followed by a comma, or by the
    cut), from the last, until the result parses.  It then holds the whole events before the cut.
    """
    if not _ends_early(exc):
        return None
    start = _SPACE.match(text)
    first = text[start.end():start.end() + 1] if start else ""
    closer = {"[": "]", "{": "]}"}.get(first, "")
    if not closer:
        return None
    at = exc.pos
    for _ in range(_CUT_TRIES):
        at = text.rfind("}", 0, at)
        if at < 0:
            return None
        if not _EVENT_END.match(text, at + 1):
            continue  # a brace inside a string (a kernel's name), not the end of an event
        try:  # a copy of the text: only for a trace that is cut, and a few times at most
            data = json.loads(text[:at + 1] + closer)
        except ValueError:
            continue
        events = data if isinstance(data, list) else data.get("traceEvents") if isinstance(data, dict) else None
        if not isinstance(events, list) or not events:
            return None
        return data, at + 1
    return None


# Keys only a profiler trace has at its top (Kineto's ``ChromeTraceLogger`` writes them before ``traceEvents``).
# Looked for anywhere in the head, not just first: a trace rewritten with its keys sorted starts with Kineto's
# ``INFO`` log lines, and one with a large ``distributedInfo`` (a ``pg_config`` per process group) can hold its
# ``traceEvents`` and ``schemaVersion`` keys far from its start.
_TRACE_KEYS = re.compile(rb'"(?:traceEvents|schemaVersion|deviceProperties|distributedInfo|baseTimeNanoseconds)"'
                         rb'\s*:')
_HEAD_BYTES = 1 << 16


def is_kineto(path: Path) -> bool:
    """Whether ``path`` looks like a Kineto trace (cheap check of its first bytes)."""
    try:
        with path.open("rb") as fh:  # two bytes tell gzip; the whole file is read once, by load_trace
            gz = fh.read(2) == b"\x1f\x8b"
        with (gzip.open(path, "rb") if gz else path.open("rb")) as fh:
            head = fh.read(_HEAD_BYTES)
    except (OSError, EOFError, zlib.error):
        return False
    head = head.removeprefix(b"\xef\xbb\xbf")
    if b"traceEvents" in head or b"schemaVersion" in head or (head.lstrip().startswith(b"{")
                                                              and _TRACE_KEYS.search(head)):
        return True
    # the array form: a list of event objects, each with a phase ("ph")
    return re.match(rb'\s*\[\s*\{', head) is not None and b'"ph"' in head


def _short(value: object) -> str:
    text = repr(value)
    return text if len(text) <= 40 else text[:30] + f"... ({len(text)} chars)"


# A rank in a trace's file name: ``rank-3.Jul_15_10_52_41.1074.pt.trace.json.gz``, ``rank_3.json``,
# ``inference_rank_1.json.gz``, ``rank0.json``; the word must stand alone (not ``crank3``, ``ranks2``).
_FILE_RANK = re.compile(r"(?:^|[^a-z0-9])rank[-_]?([0-9]{1,7})(?![0-9])", re.IGNORECASE)


def _rank(path: Path, data: dict[str, Any], given: int | None, notes: Counter[str] | None = None) -> int:
    """The rank of the trace: ``given`` (``--rank``), else ``distributedInfo.rank``, else its file name's; checked.

    An explicit ``--rank`` wins (the user named this file's rank), with a note in ``notes`` when the trace's own
    ``distributedInfo.rank`` (or, without one, its file name) says another.

    The file name is the last resort because a trace without ``distributedInfo`` (an inference run, a
    profiler started before ``init_process_group``) is often saved as ``rank-N...``; ``notes`` says so
    when it is used, for a name can lie where the trace cannot.
    """
    rank: Any = given
    if given is not None:
        where = "--rank"
        # The flag is the user's word for this file, so it wins; but a trace that says otherwise is worth a line
        # (a --rank meant for another file, or a trace written by another rank than its name says).
        info = data.get("distributedInfo")
        own = info.get("rank") if isinstance(info, dict) else None
        said = "distributedInfo.rank"
        if own is None:
            named = _FILE_RANK.findall(path.name)
            own, said = (int(named[0]), "its file name") if len(set(named)) == 1 else (None, "")
        if notes is not None and own is not None and own != given and not isinstance(own, bool):
            notes[f"{path.name}: --rank {given} used, though {said} says rank {_short(own)}"] += 1
    else:
        info = data.get("distributedInfo")
        if info is not None and not isinstance(info, dict):
            raise ImportFormatError(f"{path}: distributedInfo: must be an object with a rank (got "
                                    f"{_short(info)}): fix the trace or pass --rank")
        rank = (info or {}).get("rank")
        where = "distributedInfo.rank"
        if rank is None:
            named = _FILE_RANK.findall(path.name)
            if len(set(named)) != 1:
                raise ImportFormatError(f"{path}: the trace does not say its rank (no distributedInfo.rank, "
                                        "and no single rank-N in the file name): pass --rank")
            rank, where = int(named[0]), "the file name"
            if notes is not None:
                notes[f"{path.name}: no distributedInfo.rank: rank {rank} taken from the file name"] += 1
    if isinstance(rank, bool) or not isinstance(rank, int) or not 0 <= rank <= RANK_MAX:
        raise ImportFormatError(f"{path}: {where}: must be a rank from 0 to {RANK_MAX} (got {_short(rank)})")
    return rank


def _union(iv: list[tuple[float, float]]) -> list[tuple[float, float]]:
    out: list[tuple[float, float]] = []
    for a, b in sorted(iv):
        if out and a <= out[-1][1]:
            if b > out[-1][1]:
                out[-1] = (out[-1][0], b)
        else:
            out.append((a, b))
    return out


def _length(iv: list[tuple[float, float]]) -> float:
    return sum(b - a for a, b in iv)


def _minus(a: list[tuple[float, float]], b: list[tuple[float, float]]) -> float:
    """Length of union ``a`` not covered by union ``b`` (both merged)."""
    return _length(a) - _length(_intersect(a, b))


def _intersect(a: list[tuple[float, float]], b: list[tuple[float, float]]) -> list[tuple[float, float]]:
    out: list[tuple[float, float]] = []
    i = j = 0
    while i < len(a) and j < len(b):
        lo, hi = max(a[i][0], b[j][0]), min(a[i][1], b[j][1])
        if lo < hi:
            out.append((lo, hi))
        if a[i][1] < b[j][1]:
            i += 1
        else:
            j += 1
    return out


def steps_from_trace(path: Path, rank: int | None = None, notes: Counter[str] | None = None,
                     max_bytes: int = TRACE_MAX_BYTES, world: list[int] | None = None) -> list[KinetoStep]:
    """Every ``ProfilerStep`` of the trace at ``path`` with its split; ``rank`` overrides the trace's own.

    ``notes`` counts what could not be attributed (kernels launched outside every step, or whose
    launch is not in the trace), so the caller can say so instead of dropping it silently.  ``world``, when
    given, gets the job's size as the trace says it (``distributedInfo.world_size``), for the caller to say
    when fewer ranks than that were imported.
    """
    notes = Counter() if notes is None else notes
    data, cut = _load(path, max_bytes)
    if cut:
        notes[cut] += 1
    info = data.get("distributedInfo")
    size = info.get("world_size") if isinstance(info, dict) else None
    if world is not None and isinstance(size, int) and not isinstance(size, bool) and 1 < size <= RANK_MAX + 1:
        world.append(size)
    events = data["traceEvents"]
    rank_error: ImportFormatError | None = None
    the_rank = -1
    try:
        the_rank = _rank(path, data, rank, notes)
    except ImportFormatError as exc:  # said after the loop, unless the trace merges several ranks' (said first)
        rank_error = exc
    base_ns = data.get("baseTimeNanoseconds", 0)
    if isinstance(base_ns, bool) or not isinstance(base_ns, (int, float)) or not math.isfinite(base_ns) \
            or not 0 <= base_ns < 1e22:
        raise ImportFormatError(f"{path}: baseTimeNanoseconds: must be nanoseconds since 1970 (got "
                                f"{_short(base_ns)})")
    base_us = float(base_ns) / 1000.0
    spans: dict[int, tuple[float, float]] = {}
    step_pids: set[str] = set()
    step_twice: tuple[int, float, float] | None = None  # a step number met again with another span: (n, ts, ts)
    names = _Names()
    marker = ""  # Kineto's "Iteration Start: PyTorch Profiler" instant event, if the trace has one
    launches: dict[Any, tuple[float, tuple[str, str]]] = {}
    annotations: dict[tuple[str, str], list[tuple[float, float, str]]] = {}
    comms: dict[tuple[str, str], list[tuple[float, float, str]]] = {}
    loaders: list[tuple[float, float]] = []
    kernels: list[tuple[Any, float, float, str, str]] = []
    for i, e in itertools.chain(enumerate(events), _begin_end_spans(path, events, notes)):
        if not isinstance(e, dict):
            continue
        if e.get("ph") == "M":
            names.add(e)
            continue
        if e.get("ph") != "X":
            if e.get("ph") in ("i", "I") and isinstance(e.get("name"), str) and e["name"].startswith("Iteration Start"):
                marker = e["name"]
            continue
        try:
            ts, dur = float(e["ts"]), float(e.get("dur", 0.0))
        except (KeyError, TypeError, ValueError, OverflowError):
            raise ImportFormatError(f"{path}: traceEvents[{i}]: a complete event needs numeric ts and dur") from None
        if not (abs(ts) < _TS_MAX_US and abs(dur) < _TS_MAX_US):  # also NaN
            raise ImportFormatError(f"{path}: traceEvents[{i}]: ts and dur must be microseconds, finite and under "
                                    f"{_TS_MAX_US:g} (got ts {ts:g}, dur {dur:g})")
        name, cat = e.get("name", ""), e.get("cat", "")
        name, cat = (name if isinstance(name, str) else ""), (cat.lower() if isinstance(cat, str) else "")
        if dur < 0:
            if _STEP.match(name):
                raise ImportFormatError(f"{path}: traceEvents[{i}]: {name} has a negative dur ({dur:g} µs)")
            notes[f"{path.name}: events with a negative duration (ignored)"] += 1
            continue
        args = e.get("args")
        args = args if isinstance(args, dict) else {}
        corr = _correlation(args.get("correlation"))
        if cat in _HOST_CATS:
            m = _STEP.match(name)
            if m:
                if len(m.group(1)) > len(str(_STEP_MAX)) or int(m.group(1)) > _STEP_MAX:
                    raise ImportFormatError(f"{path}: traceEvents[{i}]: step number {_short(m.group(1))} is "
                                            f"over {_STEP_MAX}")
                first = spans.setdefault(int(m.group(1)), (ts, ts + dur))
                if step_twice is None and max(abs(first[0] - ts), abs(first[1] - ts - dur)) > 1.0:
                    step_twice = (int(m.group(1)), first[0], ts)
                step_pids.add(_thread(e)[0])
            elif name.startswith("nccl:"):  # ProcessGroupNCCL names a p2p op "nccl:send 1->0", "nccl:recv 0<-1"
                op = (name[5:].split() or [""])[0]
                if op != "coalesced":  # a group of ops, not one: see _deferred_ops
                    annotations.setdefault(_thread(e), []).append((ts, ts + dur, op))
            elif name == "record_param_comms":
                comms.setdefault(_thread(e), []).append((ts, ts + dur, _collective(args)))
            elif _LOADER.search(name):
                loaders.append((ts, ts + dur))
        elif corr is not None and _LAUNCH_CATS.match(cat):
            launches[corr] = (ts, _thread(e))
        elif cat in _KERNEL_CATS:
            if _MEMORY_KERNEL.match(name) or (cat == "mtia_ccp_events" and _MTIA_MEMORY.match(name)):
                continue  # a memory transfer: neither compute nor communication
            kernels.append((corr, ts, ts + dur, name, _collective(args)))
    if len(step_pids) > 1:
        pids = sorted(step_pids, key=lambda p: (len(p), p))
        shown = ", ".join(pids[:5]) + (f" and {len(pids) - 5} more" if len(pids) > 5 else "")
        raise ImportFormatError(f"{path}: ProfilerStep spans in {len(pids)} processes (pids {shown}): the trace "
                                "merges several ranks' traces; import one trace per rank")
    merged = names.merged(step_pids) or _steps_merged(spans, step_twice)
    if merged:
        raise ImportFormatError(f"{path}: {merged}: the trace merges several ranks' traces under one pid; "
                                "import one trace per rank")
    if not spans:
        # Said before a missing rank: a trace with no step (an empty one, a profile with no schedule) cannot be
        # imported whatever its rank, and asking for --rank first sent the user to fix the wrong thing.
        # Kineto marks where each of its trace spans began ("Iteration Start: PyTorch Profiler", ChromeTraceLogger::
        # addIterationMarker): one marker per profile, not per step, so it cannot stand in for the steps.
        why = (f" (its {_short(marker)} marks where the profile began, not a step; a trace taken on demand, "
               "as dynolog does, has none)") if marker else ""
        if cut:
            raise ImportFormatError(f"{path}: no ProfilerStep#N spans in the {len(events):,} event"
                                    f"{'' if len(events) == 1 else 's'} before the trace was cut short: truncated? "
                                    "(was the trace, the copy or the download cut short?)")
        empty = " (its traceEvents list is empty: the profiler recorded nothing)" if not events else ""
        raise ImportFormatError(f"{path}: no ProfilerStep#N spans{why or empty}: profile with "
                                "torch.profiler.schedule and call prof.step() each iteration")
    if rank_error is not None:
        raise rank_error
    if min(s for s, _ in spans.values()) + base_us < _EPOCH_US:
        raise ImportFormatError(f"{path}: timestamps are not wall-clock (ts {min(s for s, _ in spans.values()):.0f} "
                                "µs and no baseTimeNanoseconds), so event time cannot be kept")
    order = sorted(spans.items(), key=lambda kv: kv[1][0])
    starts = [s for _, (s, _) in order]
    per: dict[int, dict[str, list[tuple[float, float]]]] = {n: {"comp": [], "coll": [], "pipe": []} for n in spans}

    import bisect

    nccl_launches = [launches[k[0]] for k in kernels if "nccl" in k[3].lower() and k[0] in launches]
    comm_ops = _annotation_of(annotations, nccl_launches)
    param_ops = _annotation_of(comms, nccl_launches, innermost=True)
    deferred = _deferred_ops([annotations, comms], nccl_launches)
    for corr, a, b, name, kernel_op in kernels:
        if corr not in launches:
            notes[f"{path.name}: GPU kernels whose launch is not in the trace (not attributed)"] += 1
            continue
        launch, thread = launches[corr]
        k = bisect.bisect_right(starts, launch) - 1
        if k < 0 or launch > order[k][1][1]:
            notes[f"{path.name}: GPU kernels launched outside every ProfilerStep (not attributed)"] += 1
            continue
        step, (s0, s1) = order[k]
        if "nccl" in name.lower():
            op = _op(comm_ops.get((thread, launch))) or _op(kernel_op) or _op(param_ops.get((thread, launch))) \
                or deferred.get((thread, launch), "")
            per[step]["pipe" if op.lower() in _PIPELINE_OPS else "coll"].append((a, b))
        else:
            per[step]["comp"].append((a, b))
    # A trace without a single GPU kernel is a CPU-only profile (a CPU job, or a profiler run without
    # ProfilerActivity.CUDA): its steps' GPU phases are unknown, not zero.
    gpu_known = bool(kernels)
    if not gpu_known:
        notes[f"{path.name}: no GPU kernels in the trace " + ("before the cut" if cut else "(CPU-only profile)")
              + ": compute and communication unknown"] += 1
    has_loader = bool(loaders)
    # A trace cut short has lost events of any step, not only of the last: Kineto writes the host's events first,
    # then the device's, in the order its buffers came back (one thread's launches after another's, not in time
    # order), so a step read whole on the host can have lost kernels after the cut, and its phases read from what
    # happened to come before it (zero compute, and the rank read as the fastest: a straggler lost).  Every step
    # read keeps its duration (its host span is whole) and leaves its phases out: unknown, not zero.
    # A cut among the metadata Kineto writes after every activity (process and thread names) has lost none.
    part = {step for step, _ in order} if cut and not _activities_whole(events) else set()
    if part:
        n = len(part)
        notes[f"{path.name}: the trace is cut short, so any of its steps may have lost events after the cut: the "
              f"{n} step{'s' if n > 1 else ''} read ({_step_ranges(sorted(part))}) keep{'' if n > 1 else 's'} "
              f"{'their' if n > 1 else 'its'} duration and leave{'' if n > 1 else 's'} out "
              f"{'their' if n > 1 else 'its'} phases (unknown, not zero)"] += 1
    out: list[KinetoStep] = []
    for step, (s0, s1) in order:
        if step in part:
            out.append(KinetoStep(rank=the_rank, step=step, start=(s0 + base_us) / 1e6, end=(s1 + base_us) / 1e6,
                                  duration_s=(s1 - s0) / 1e6, compute_s=None, comm_s=None, collective_s=None,
                                  pipeline_wait_s=None, data_wait_s=None, ts=s0))
            continue
        comp = _union(per[step]["comp"])
        coll, pipe = _union(per[step]["coll"]), _union(per[step]["pipe"])
        comm = _union(coll + pipe)
        data_wait = None
        if has_loader:
            data_wait = _length(_union([(max(a, s0), min(b, s1)) for a, b in loaders if a < s1 and b > s0])) / 1e6
        out.append(KinetoStep(rank=the_rank, step=step, start=(s0 + base_us) / 1e6, end=(s1 + base_us) / 1e6,
                              duration_s=(s1 - s0) / 1e6,
                              compute_s=_length(comp) / 1e6 if gpu_known else None,
                              comm_s=_minus(comm, comp) / 1e6 if gpu_known else None,
                              collective_s=_minus(coll, comp) / 1e6 if gpu_known else None,
                              pipeline_wait_s=_minus(pipe, comp) / 1e6 if gpu_known else None,
                              data_wait_s=data_wait, ts=s0))
    return out


def _activities_whole(events: list[Any]) -> bool:
    """Whether a cut trace holds metadata (``"ph": "M"``) after its last activity: Kineto writes the process and
    thread names after every activity, so a cut among them lost no step's events."""
    for e in reversed(events):
        if isinstance(e, dict):
            if e.get("ph") == "M":
                return True
            if e.get("ph") in ("X", "B", "E", "i", "I") and e.get("cat") != "Trace":
                return False
    return False


def _step_ranges(steps: list[int]) -> str:
    """``ProfilerStep#551-553, #560`` for ``[551, 552, 553, 560]`` (the first six runs)."""
    return "ProfilerStep#" + number_runs(steps, sep=", #")


def _op(op: str | None) -> str:
    """``op`` when it names what an NCCL kernel does, else "" (see ``_NOT_AN_OP``)."""
    return op if op and op.lower() not in _NOT_AN_OP else ""


def _deferred_ops(sources: list[dict[tuple[str, str], list[tuple[float, float, str]]]],
                  launches: list[tuple[float, tuple[str, str]]]) -> dict[tuple[tuple[str, str], float], str]:
    """For each NCCL launch (time, thread), the op of the group it ends, when it ends one ("" otherwise absent).

    ProcessGroupNCCL issues the ops of a coalesced group (``batch_isend_irecv``, ``_coalescing_manager``: the
    pipeline-parallel send/recv pairs, or several all-gathers) inside ``ncclGroupStart``/``ncclGroupEnd``: each
    op's ``record_param_comms`` span (and, in older versions that gave each grouped op a Work, its ``nccl:send
    0->1`` annotation, whose RecordFunction ends as soon as the op is queued) closes without a launch, and the
    group's kernel is launched at ``ncclGroupEnd``, in ``endCoalescing`` (pytorch/pytorch ``ProcessGroupNCCL.cpp``).
    There newer versions open a ``nccl:coalesced`` annotation first (``initWork(..., "nccl:coalesced", ...)``
    before ``groupEnd()``) and older ones after, so the launch is inside ``nccl:coalesced`` or inside nothing.
    ``nccl:coalesced`` says only that ops were grouped, not which, and its span (a Work's RecordFunction) can
    outlast the launch and cover later ones on its thread: it is no op of its own (it is not read as an
    annotation at all), and the group's ops are those whose spans on the launching thread started after the
    thread's previous NCCL launch and ended before this one.  All point-to-point: the group is pipeline
    traffic; any collective: a collective.  Each span is visited once (both lists sorted), so this is
    n log n as ``_annotation_of`` is.
    """
    by_thread: dict[tuple[str, str], set[float]] = {}
    for ts, thread in launches:
        by_thread.setdefault(thread, set()).add(ts)
    out: dict[tuple[tuple[str, str], float], str] = {}
    for thread, times in by_thread.items():
        spans = sorted(s for src in sources for s in src.get(thread, []))
        i = 0
        for launch in sorted(times):
            issued: list[str] = []
            # the spans that started since the previous launch (earlier ones were that launch's to take)
            while i < len(spans) and spans[i][0] < launch:
                _, end, op = spans[i]
                i += 1
                if end <= launch and _op(op):
                    issued.append(op)
            if issued:
                out[thread, launch] = next((o for o in issued if o.lower() not in _PIPELINE_OPS), issued[0])
    return out


def _correlation(v: object) -> int | str | None:
    """A ``correlation`` arg as a key that a launch and its kernel share: ``5``, ``5.0`` and ``"5"`` alike.

    Some exporters write ids as strings or floats; a list, an object or a bool cannot key the launches.
    """
    if isinstance(v, bool):
        return None
    if isinstance(v, int):
        return v
    if isinstance(v, float):
        return int(v) if v.is_integer() else None
    if isinstance(v, str):
        t = v.strip()
        return int(t) if t.isascii() and t.isdigit() and len(t) < 20 else t
    return None


class _Names:
    """The names a trace's metadata (``"ph": "M"``) events give each process.

    Kineto names every process it saw once (``process_name``: the host process's name, on its own pid and on
    each of its devices' pids).  One pid with two names is two processes' events under one pid: several ranks'
    traces merged after their pids were reused (each container's trainer can have the same pid; HTA's 128-rank
    job names its processes ``pyper:trainer:0:0``, ``pyper:trainer:0:1``).  Thread names tell nothing: PyTorch
    renames its threads as it runs, and the 2-rank DDP fixture names one thread both
    ``thread 2919752 (pt_main_thread)`` and ``thread 2919752 (pt_autograd_0)``.
    """

    def __init__(self) -> None:
        self.processes: dict[str, list[str]] = {}

    def add(self, e: dict[str, Any]) -> None:
        args = e.get("args")
        name = args.get("name") if isinstance(args, dict) else None
        if e.get("name") != "process_name" or not isinstance(name, str):
            return
        seen = self.processes.setdefault(_thread(e)[0], [])
        if name not in seen:
            seen.append(name)

    def merged(self, first: set[str]) -> str:
        """What shows two processes' events under one pid ("" when nothing does); pids in ``first`` are named
        first (the host process's: its devices' pids carry its name too)."""
        for pid, names in sorted(self.processes.items(), key=lambda kv: (kv[0] not in first, len(kv[0]), kv[0])):
            if len(names) > 1:
                return f"pid {pid} has {len(names)} process names ({_names(names)})"
        return ""


def _names(names: list[str]) -> str:
    return ", ".join(_short(n) for n in names[:3]) + (f" and {len(names) - 3} more" if len(names) > 3 else "")


def _steps_merged(spans: dict[int, tuple[float, float]], twice: tuple[int, float, float] | None) -> str:
    """What shows two step series in one process ("" when nothing does).

    One process's ``ProfilerStep`` spans are one series: ``prof.step()`` ends a step and starts the next, so no
    number comes twice and no two steps overlap.  A number twice with two spans, or two steps that overlap by
    more than a microsecond (the rounding of ``ts`` and ``dur``), is two ranks' steps.
    """
    if twice is not None:
        n, a, b = twice
        return f"ProfilerStep#{n} twice (at ts {a:.0f} and {b:.0f} µs)"
    order = sorted(spans.items(), key=lambda kv: kv[1][0])
    for (n0, (_, e0)), (n1, (s1, _)) in zip(order, order[1:], strict=False):
        if s1 < e0 - 1.0:
            return f"ProfilerStep#{n0} and ProfilerStep#{n1} overlap (by {e0 - s1:.0f} µs)"
    return ""


def _annotation_of(annotations: dict[tuple[str, str], list[tuple[float, float, str]]],
                   launches: list[tuple[float, tuple[str, str]]], innermost: bool = False
                   ) -> dict[tuple[tuple[str, str], float], str]:
    """For each launch (time, thread), the op of the annotation on its thread that contains it ("" if none).

    The earliest-starting containing annotation, or with ``innermost`` the latest-starting one.  One sweep per
    thread over both sorted lists with a heap of the open annotations (by start), so a trace with tens of
    thousands of collectives costs n log n, not one scan of every annotation per kernel.  An annotation that
    ended before the current launch has ended for every later one too, so it is popped for good when it
    reaches the top.
    """
    import heapq

    by_thread: dict[tuple[str, str], set[float]] = {}
    for ts, thread in launches:
        by_thread.setdefault(thread, set()).add(ts)
    out: dict[tuple[tuple[str, str], float], str] = {}
    sign = -1.0 if innermost else 1.0
    for thread, times in by_thread.items():
        spans = sorted(annotations.get(thread, []))
        open_: list[tuple[float, float, str]] = []  # (sign * start, end, op)
        i = 0
        for launch in sorted(times):
            while i < len(spans) and spans[i][0] <= launch:
                heapq.heappush(open_, (sign * spans[i][0], spans[i][1], spans[i][2]))
                i += 1
            while open_ and open_[0][1] < launch:
                heapq.heappop(open_)
            out[thread, launch] = open_[0][2] if open_ else ""
    return out


def _thread(e: dict[str, Any]) -> tuple[str, str]:
    """The event's (pid, tid) as text: PyTorch 1.8 wrote some tids as strings, later ones as numbers."""
    return (_ident(e.get("pid")), _ident(e.get("tid")))


def _ident(v: object) -> str:
    return str(v) if isinstance(v, (int, str)) and not isinstance(v, bool) else repr(v)


def _collective(args: dict[str, Any]) -> str:
    """The ``Collective name`` a ``record_param_comms`` span or an NCCL kernel carries ("" if none)."""
    name = args.get("Collective name")
    return name.strip().strip('"') if isinstance(name, str) else ""


def _begin_end_spans(path: Path, events: list[Any], notes: Counter[str]) -> list[tuple[int, dict[str, Any]]]:
    """The trace's ``B``/``E`` pairs as complete (``X``) events, each with the index of its ``B``.

    Per (pid, tid), in time order (file order among equal times), a ``B`` opens a span and an ``E`` closes the
    latest open one of its name (the latest open one whatever its name when the ``E`` has none, as the Trace
    Event Format allows); the ``E``'s args are merged into the ``B``'s.  A ``B`` never closed, or an ``E``
    with nothing to close, is counted in ``notes`` and ignored.  Async ``b``/``e`` events are not spans of a
    thread and are not read.
    """
    threads: dict[tuple[str, str], list[tuple[float, int, dict[str, Any]]]] = {}
    for i, e in enumerate(events):
        if not isinstance(e, dict) or e.get("ph") not in ("B", "E"):
            continue
        try:
            ts = float(e["ts"])
        except (KeyError, TypeError, ValueError, OverflowError):
            raise ImportFormatError(f"{path}: traceEvents[{i}]: a begin or end event needs a numeric ts") from None
        if not abs(ts) < _TS_MAX_US:  # also NaN
            raise ImportFormatError(f"{path}: traceEvents[{i}]: ts must be microseconds, finite and under "
                                    f"{_TS_MAX_US:g} (got {ts:g})")
        threads.setdefault(_thread(e), []).append((ts, i, e))
    out: list[tuple[int, dict[str, Any]]] = []
    unmatched_b = unmatched_e = 0
    for seq in threads.values():
        seq.sort(key=lambda t: (t[0], t[1]))
        stack: list[tuple[float, int, dict[str, Any]]] = []
        for ts, i, e in seq:
            if e["ph"] == "B":
                stack.append((ts, i, e))
                continue
            name = e.get("name")
            at = len(stack) - 1
            if isinstance(name, str) and name:
                while at >= 0 and stack[at][2].get("name") != name:
                    at -= 1
            if at < 0:
                unmatched_e += 1
                continue
            t0, j, b = stack.pop(at)
            args = b.get("args")
            args = dict(args) if isinstance(args, dict) else {}
            if isinstance(e.get("args"), dict):
                args.update(e["args"])
            out.append((j, {**b, "ph": "X", "ts": t0, "dur": ts - t0, "args": args}))
        unmatched_b += len(stack)
    if unmatched_b:
        notes[f"{path.name}: begin (B) events with no matching end (ignored)"] += unmatched_b
    if unmatched_e:
        notes[f"{path.name}: end (E) events with no matching begin (ignored)"] += unmatched_e
    out.sort(key=lambda t: t[0])
    return out
