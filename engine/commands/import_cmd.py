"""``whywait import``: put recorded or foreign timing data into the topics, event time kept.

Formats (``--format``, detected from the content when left out):

``bundle``  an ``incident.whywait`` from ``whywait export``: every message back into its topic
            (e.g. on a staging cluster), byte for byte;
``kineto``  PyTorch profiler traces, one file per rank (``whywait.engine.importers.kineto``);
``steps``   a per-rank step table, CSV or JSON lines (``whywait.engine.importers.steps_table``).

Timing imports become ``steps`` messages (one per rank per step, at the step's end); with
``--project`` and ``--team`` a placement is published too, so the engine evaluates the job: ``running`` a
second before its first step, and ``finished`` just after its last (:func:`finished_at`), so a replay of the
imported window sees the job run to its end and a later replay (or the live engine) does not place it.
The placement's ranks carry their pipeline stage, data-parallel replica and tensor-parallel rank (``pp``,
``dp``, ``tp``) when a table's columns give them or ``--layout pp=4,dp=2,tp=8`` does (Megatron-LM's rank
order: :func:`whywait.engine.importers.steps_table.rank_coords`), so a rank is compared with its own stage.
``-o FILE`` writes the messages as JSON lines instead of publishing (check them with
``whywait events check FILE``).  Every message is validated against the contract first: a bundle's
values with the engine's own decoder (:func:`whywait.agents.events.decode`), those that break it
skipped and counted, as the engine would dead-letter them.  A timing file's values are checked as they are
read, so an error names the row (``steps.csv:502: column duration_s: ...``) or the step event
(``rank-0.json: ProfilerStep#12 (ts ... µs): ...``), never a message number the user never saw.  The same
step of the same rank in two files is refused naming both.  Profiler traces of one job that cover
different steps are cut to the steps every rank's trace holds, with a note (:func:`aligned`).  A zip (or a
file named ``*.whywait``) is a bundle even when it is cut short: the bundle reader says it is truncated.
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import json
import math
import time
from collections import Counter
from pathlib import Path
from typing import Any, Iterator

from whywait.engine.importers import ImportFormatError, number_runs

FORMATS = ("auto", "bundle", "kineto", "steps")


def register(p: argparse.ArgumentParser) -> None:
    p.add_argument("files", nargs="+", type=Path, help="bundle, profiler traces or step tables")
    p.add_argument("--format", choices=FORMATS, default="auto", help="input format (default: from the content)")
    p.add_argument("--job", help="job id for timing imports (or a `job` column)")
    p.add_argument("--node", help="node the ranks ran on (or a `node` column)")
    p.add_argument("--rank", type=int, help="rank of a profiler trace (else its distributedInfo.rank, else a "
                   "rank-N in its file name); a note says when the trace says another")
    p.add_argument("--max-trace-mib", type=int, default=2048, metavar="MIB",
                   help="largest profiler trace read, decompressed (default 2048: parsing needs several times it)")
    p.add_argument("--layout", metavar="SIZES",
                   help="the job's parallel layout, as pp=4,dp=2,tp=8 (also cp): each rank's pipeline stage, "
                   "data-parallel replica and tensor-parallel rank from its global rank, in Megatron-LM's default "
                   "order (tp fastest, then cp, dp, pp slowest), for the placement (with --project): a straggler is "
                   "compared with its own stage, and a slower last stage (the loss) is no straggler; a table's pp, "
                   "dp, tp columns that disagree are refused")
    p.add_argument("--project", help="publish a placement for the job: its project")
    p.add_argument("--team", help="... its team")
    p.add_argument("--channel", help="... its team's Slack channel")
    p.add_argument("-o", "--output", type=Path, help="write JSON lines here instead of publishing; a name ending "
                   ".whywait writes a bundle that `whywait replay --input` reads with no broker")
    p.add_argument("--bootstrap", help="Kafka bootstrap (default: WHYWAIT_KAFKA_BOOTSTRAP or the local broker)")
    p.epilog = ("Step tables: columns time, rank, step, duration_s and the optional phases data_wait_s, compute_s, "
                "comm_s, collective_s, pipeline_wait_s, checkpoint_s, also under the names loggers give them "
                "(timestamp, iteration, global_rank, hostname; step_time, iter_time, batch_time; data_time, "
                "dataloader_time, data_load_time; fwd_bwd_time, compute_time, forward_backward; allreduce_time, "
                "comm_time, communication_time, sync_time), a _s, _ms, _us or _ns suffix giving the unit; "
                "cells separated by ',', tab, ';' or '|' (from the header); one row per rank per step "
                "(a row repeated exactly is dropped with a note, two that differ are refused naming both lines); "
                "a step that ends before its rank's step before it, or more than a day from now, is noted (more than "
                "a year from now is refused); a "
                "numeric time too large for seconds since 1970 is read as milliseconds (or us, ns) when the whole "
                "column is in that unit, with a note (name the column time_ms to say so).  Every value is checked "
                "as it is read: an error names the file, line and column.  A profiler trace cut short (a tracer "
                "killed mid-run, a copy not finished) is read up to its last whole event, with a note.  "
                "Traces of one job that cover different steps keep the steps every rank's trace holds, with a note.  "
                "Optional columns pp (pp_rank, pipeline_stage, pipeline_rank), dp (dp_rank, data_parallel_rank) and "
                "tp (tp_rank, tensor_parallel_rank) give each rank's coordinates for the placement: whole numbers from "
                "0, one value per rank (blank cells are unknown), every rank or none (or --layout for all).")


_ZIP_MAGIC = b"PK\x03\x04"  # a zip archive's first bytes: a bundle, whole or cut short


def detect(path: Path) -> str:
    """The format of ``path`` from its content.

    A file named ``*.whywait``, or any zip archive, is a bundle (profiler traces and step tables are never zips):
    one cut short has lost the table of contents at its end and opens as no zip at all, and the bundle reader
    says it is truncated, rather than the step-table reader saying its bytes are "not UTF-8".
    """
    from whywait.engine.importers import ImportFormatError
    from whywait.engine.importers.bundle import is_bundle
    from whywait.engine.importers.kineto import is_kineto

    if is_bundle(path) or path.suffix == ".whywait":
        return "bundle"
    try:
        with path.open("rb") as fh:
            if fh.read(len(_ZIP_MAGIC)) == _ZIP_MAGIC:
                return "bundle"
    except OSError:
        pass  # said by the reader the format leads to
    head = b""
    try:
        with path.open("rb") as fh:
            head = fh.read(8)
    except OSError:
        pass  # said by the reader the format leads to
    packed = next((what for magic, what in _PACKED if head.startswith(magic)), None)
    if packed is not None:
        # Read as a table, a bzip2 or xz file said "not UTF-8 ... save the table as UTF-8".
        raise ImportFormatError(f"{path}: {packed}-compressed, which import does not read: decompress it first "
                                "(gzip is read as it is)")
    if path.name.lower().endswith((".gz", ".gzip")) and head and head[:2] != b"\x1f\x8b":
        raise ImportFormatError(f"{path}: named .gz but not gzip (it starts {head[:4]!r}): a file cut or "
                                "corrupted in the copy, or compressed otherwise")
    if is_kineto(path):
        return "kineto"
    if head.lstrip(b"\xef\xbb\xbf \t\r\n")[:1] in (b"{", b"["):
        # A step table is text in cells; JSON that is no profiler trace was given as one by mistake.
        raise ImportFormatError(f"{path}: JSON, but not a profiler trace (no traceEvents) nor a step table (a CSV "
                                "with a header row): nothing to import")
    return "steps"


# The compressed formats a user may hand in by mistake: (magic bytes, name).
_PACKED = ((b"BZh", "bzip2"), (b"\xfd7zXZ\x00", "xz"), (b"\x28\xb5\x2f\xfd", "zstd"))


def timing_messages(args: argparse.Namespace, files: list[tuple[Path, str]],
                    notes: Counter[str] | None = None) -> list[dict[str, Any]]:
    """Contract messages (the ``running`` placements first, then steps and ``finished`` placements in event-time
    order) from timing files.

    ``notes`` counts what the importers could not attribute (printed by ``run``).
    """
    from whywait.agents.events import ContractError, envelope, validate
    from whywait.engine.importers import ImportFormatError
    from whywait.engine.importers.kineto import steps_from_trace
    from whywait.engine.importers.steps_table import Coords, parse_layout, rank_coords, read_step_rows

    traces = [path for path, fmt in files if fmt == "kineto"]
    cap_mib = getattr(args, "max_trace_mib", 2048)
    if cap_mib < 1:
        raise ImportFormatError(f"--max-trace-mib must be at least 1 (got {cap_mib})")
    if args.rank is not None and len(traces) > 1:
        # one --rank for several traces would give every one of them the same rank
        raise ImportFormatError(f"--rank names the rank of one profiler trace, and {len(traces)} were given: "
                                "import them one at a time")
    layout = getattr(args, "layout", None)
    sizes = parse_layout(layout) if layout else None  # said before any file is read: a typo costs no wait
    coords: Coords = {}  # (job, rank) -> the coordinates the tables' columns gave, across all files
    rows: list[tuple[str, str, dict[str, Any]]] = []
    where: dict[int, str] = {}  # id(record) -> where it was read: a table's file:line, a trace's step event
    # (job, rank, step) -> the file that gave it: (its index, where in it, its format)
    seen: dict[tuple[str, int, int], tuple[int, str, str]] = {}
    traced: set[int] = set()  # id(record) of the steps read from profiler traces
    world: list[int] = []  # the job's size, as each trace's distributedInfo.world_size says it
    for i, (path, fmt) in enumerate(files):
        got: list[tuple[str, str, dict[str, Any]]] = []
        if fmt == "kineto":
            if not args.job or not args.node:
                missing = [w for w in ("job", "node") if not getattr(args, w)]
                lacks = " or its ".join(missing)
                raise ImportFormatError(f"{path}: a profiler trace does not name its {lacks}: pass "
                                        + " and ".join(f"--{w}" for w in missing))
            for s in steps_from_trace(path, args.rank, notes, cap_mib << 20, world):
                got.append((args.job, args.node, s.record()))
                traced.add(id(got[-1][2]))
                where[id(got[-1][2])] = f"{path}: ProfilerStep#{s.step}" + (
                    f" (ts {s.ts:.0f} µs)" if s.ts is not None else "")
        else:
            for no, job, node, rec in read_step_rows(path, args.job, args.node, notes, coords):
                got.append((job, node, rec))
                where[id(rec)] = f"{path}:{no}"
        for job, _, rec in got:
            # The same step of the same rank twice is one file given twice, or two ranks' files that
            # both claim one rank: either way the job's peer comparison would be wrong, so say which.
            here = where[id(rec)]
            first = seen.setdefault((job, rec["rank"], rec["step"]), (i, here, fmt))
            if first[0] != i:
                what = {"kineto": "the same trace twice, or two traces that claim one rank",
                        "steps": "the same table twice, or two tables that give one rank's steps"}
                raise ImportFormatError(f"{here}: job {job} rank {rec['rank']} step {rec['step']} is also in "
                                        f"{first[1]}: " + (what[fmt] if first[2] == fmt else
                                                           "one run's steps from both a trace and a table") +
                                        "; import each rank's steps once")
        rows += got
    rows = aligned(rows, traced, notes)
    traced_ranks = {rec["rank"] for _, _, rec in rows if id(rec) in traced}
    if world and notes is not None and max(world) > len(traced_ranks):
        # Two sampled ranks of a 128-rank job were placed as a 2-GPU job with no word: every cost 64x too low.
        notes[f"the traces say the job has {max(world)} ranks (distributedInfo.world_size) and {len(traced_ranks)} "
              f"were imported: only those are placed, so a cost counts their {len(traced_ranks)} GPU(s), not the "
              "job's (import every rank's trace, or the job's step table, for the whole job)"] += 1
    read = list(rows)  # in read order, for check_times: the first row it names is the first in the files
    rows.sort(key=lambda r: (r[2]["ended_at"], r[0], r[2]["rank"], r[2]["step"]))
    out: list[dict[str, Any]] = []
    ends: list[dict[str, Any]] = []  # each job's `finished` placement, just after its last step
    if sizes and not (args.project or args.team) and notes is not None:
        notes["--layout gives the ranks' coordinates to the placement, which needs --project and --team: "
              "left unused"] += 1
    if args.project or args.team:
        if not (args.project and args.team):
            raise ImportFormatError("a placement needs both --project and --team")
        jobs: dict[str, dict[int, str]] = {}
        for job, node, rec in rows:
            jobs.setdefault(job, {})[rec["rank"]] = node
        for job, ranks in sorted(jobs.items()):
            # The ranks' pp/dp/tp, from the tables' columns and --layout: the stage rules compare a rank with
            # its own pipeline stage, so a last stage slower by design (it computes the loss) is no straggler.
            where_in = rank_coords(job, ranks, coords, sizes, notes)
            placed: list[dict[str, Any]] = []
            for node in sorted(set(ranks.values())):
                # GPU index unknown from timings alone: the rank's order among its node's ranks.
                for gpu, r in enumerate(sorted(r for r, n in ranks.items() if n == node)):
                    placed.append({"rank": r, "node": node, "gpu": gpu, **where_in[r]})
            first = min(rec["ended_at"] for j, _, rec in rows if j == job)
            body = {"job": job, "project": args.project, "team": args.team, "state": "running",
                    "ranks": sorted(placed, key=lambda x: x["rank"]), "source": "file"}
            if args.channel:
                body["slack_channel"] = args.channel
            out.append(envelope("placement", "whywait-import", first - 1.0, **body))
            # The job ran only as long as its steps: without its end, every later replay (and the live engine)
            # kept it placed for ever, its nodes "learnt" or "unknown" in windows that hold nothing of it.
            last = max(rec["ended_at"] for j, _, rec in rows if j == job)
            ends.append(envelope("placement", "whywait-import", finished_at(last),
                                 **{**body, "state": "finished", "ranks": []}))
    for m in out + ends:  # the placements: built from the arguments and the ranks, not from a line
        try:
            validate(m)
        except ContractError as exc:
            raise ImportFormatError(f"the placement of job {m.get('job')}: {exc}") from None
    for job, node, rec in rows:
        m = envelope("steps", node, rec["ended_at"], job=job, steps=[rec])
        try:
            validate(m)
        except ContractError as exc:
            # The importers check every value as they read it; what is left (a name too long for the contract)
            # is said at the line or event it came from, not at a message number the reader never saw.
            raise ImportFormatError(f"{where[id(rec)]}: {str(exc).replace('steps[0].', '')}") from None
        out.append(m)
    check_times(read, where, notes)  # after the contract's own checks: a value it refuses is said as it says it
    if ends:  # in event-time order with the steps, each after its job's last step
        out += ends
        out.sort(key=lambda m: (m["time"], m["kind"] != "placement" or m["state"] == "finished"))
    return out


def aligned(rows: list[tuple[str, str, dict[str, Any]]], traced: set[int],
            notes: Counter[str] | None) -> list[tuple[str, str, dict[str, Any]]]:
    """``rows`` with each job's profiler-trace steps cut to the steps every one of its traced ranks has.

    A profiler captures a window of steps on each rank, and the windows need not match (a schedule started at
    another step, a rank whose trace was cut short, traces of two runs of the profiler): a rank whose trace ends
    earlier is not stuck, its capture was shorter, yet the replay, seeing its steps stop, said it was
    (``job.rank-silent``), and compared ranks over steps only some of them have.  So the steps kept are those
    every traced rank of the job has (by step number), and one note names the ranks and steps left out; ranks
    that share no step at all are refused, for nothing of them could be compared.  A step table's rows
    (``traced`` holds the ``id`` of each trace's records) are not cut: a rank missing from a table's step is
    what the table says.
    """
    from whywait.engine.importers import ImportFormatError

    by_job: dict[str, dict[int, set[int]]] = {}
    for job, _, rec in rows:
        if id(rec) in traced:
            by_job.setdefault(job, {}).setdefault(rec["rank"], set()).add(rec["step"])
    drop: set[tuple[str, int, int]] = set()
    for job, ranks in sorted(by_job.items()):
        every = set.intersection(*ranks.values())
        if all(steps == every for steps in ranks.values()):
            continue
        left: dict[tuple[int, ...], list[int]] = {}  # the steps left out -> the ranks they are left out of
        for rank, steps in sorted(ranks.items()):
            if steps - every:
                left.setdefault(tuple(sorted(steps - every)), []).append(rank)
        shown = "; ".join(f"rank{'s' if len(rs) > 1 else ''} {number_runs(rs)}: step{'s' if len(st) > 1 else ''} "
                          f"{number_runs(st)}" for st, rs in sorted(left.items(), key=lambda kv: kv[1])[:8])
        if not every:
            raise ImportFormatError(f"job {job}: the profiler traces share no step (" + "; ".join(
                f"rank {r}: steps {number_runs(sorted(st))}" for r, st in sorted(ranks.items())[:8])
                + "): import traces of one profiling window")
        for gone, rs in left.items():
            drop.update((job, r, s) for r in rs for s in gone)
        if notes is not None:
            notes[f"job {job}: the ranks' profiler traces cover different steps: kept step"
                  f"{'s' if len(every) > 1 else ''} {number_runs(sorted(every))}, which every rank's trace holds, "
                  f"and left out {shown} (a shorter capture is not a stuck rank)"] += 1
    if not drop:
        return rows
    return [r for r in rows if id(r[2]) not in traced or (r[0], r[2]["rank"], r[2]["step"]) not in drop]


FUTURE_NOTE_S = 86_400.0  # a step that ends more than this after now: a clock set wrong, said in a note
FUTURE_MAX_S = 365 * 86_400.0  # more than this: no step can end then (a unit mistake, a placeholder): refused


def check_times(rows: list[tuple[str, str, dict[str, Any]]], where: dict[int, str],
                notes: Counter[str] | None, now: float | None = None) -> None:
    """Say what is wrong with the steps' times that the contract lets through; ``rows`` in the order read.

    A step that ends before the step before it of its rank (a logger's clock stepped back, rows stamped
    from another clock) is said in a note naming the first such row: the replay reads steps in time order,
    so those steps come before the ones they followed.  A step that ends more than a day after ``now`` (the
    wall clock) is said in a note too (a clock set wrong); more than a year after it is refused, naming the
    row: no step has ended then, and a time like the year 5138 is a unit mistake or a placeholder.
    """
    from whywait.engine.importers import ImportFormatError
    from whywait.engine.importers.steps_table import utc_text

    now = time.time() if now is None else now
    ahead = [rec for _, _, rec in rows if rec["ended_at"] > now + FUTURE_NOTE_S]
    if ahead:
        first = ahead[0]
        t, away = first["ended_at"], first["ended_at"] - now
        if away > FUTURE_MAX_S:
            raise ImportFormatError(f"{where[id(first)]}: time {t:.0f} s since 1970 is {utc_text(t)}, "
                                    f"{away / FUTURE_MAX_S:,.0f} years from now: no step has ended then: surely a unit "
                                    "mistake (or a placeholder); fix the time")
        if notes is not None:
            more = f" ({len(ahead):,} rows like it)" if len(ahead) > 1 else ""
            notes[f"{where[id(first)]}: time {utc_text(t)} is {away / 86_400:,.1f} days after now "
                  f"({utc_text(round(now))}): a clock set wrong?{more}"] += 1
    by_rank: dict[tuple[str, int], list[tuple[int, int, dict[str, Any]]]] = {}
    for i, (job, _, rec) in enumerate(rows):
        by_rank.setdefault((job, rec["rank"]), []).append((rec["step"], i, rec))
    back: list[tuple[int, str, dict[str, Any], dict[str, Any]]] = []  # (read order, job, the row, the step before)
    for (job, _), steps in by_rank.items():
        steps.sort(key=lambda x: x[0])
        for (_, _, prev), (_, i, rec) in itertools.pairwise(steps):
            if rec["ended_at"] < prev["ended_at"]:
                back.append((i, job, rec, prev))
    if back and notes is not None:
        _, job, rec, prev = min(back, key=lambda x: x[0])
        more = f" ({len(back):,} rows like it)" if len(back) > 1 else ""
        notes[f"{where[id(rec)]}: time goes backwards: job {job} rank {rec['rank']} step {rec['step']} ends at "
              f"{utc_text(rec['ended_at'])}, {prev['ended_at'] - rec['ended_at']:,.3f} s before its step "
              f"{prev['step']} ({where[id(prev)]}) does; a clock that stepped back?{more}"] += 1


def finished_at(last: float) -> float:
    """When an imported job is said to have finished: just after its last step ended (``last``).

    After it, not at it: a replay whose window ends at the last step (the imported window) reads no
    ``finished`` placement and sees the job running to the end, as before; one that starts after it takes
    the ``finished`` as the job's latest placement before the window, so the job is not placed there.  A
    millisecond is past any rounding of the step's time, and no step of the job can be in between.
    """
    t = last + 1e-3
    return t if t > last else math.nextafter(last, math.inf)


def write_bundle(path: Path, msgs: list[dict[str, Any]], what: str) -> int:
    """Write imported messages to a bundle at ``path`` (``-o steps.whywait``); return the exit status.

    Called for an ``--output`` ending ``.whywait``: a step table or a trace replays with no broker at all
    (``whywait replay --input steps.whywait``), which JSON lines could not (``--input`` takes a bundle), so a
    postmortem of a table needed Kafka.  The bundle's window is the messages' event times; it holds no rules
    and no topology, so the replay uses the engine's rules and learns the nodes from the placements.
    """
    from whywait.agents.events import encode, topic_for_kind
    from whywait.engine.importers.bundle import BundleWriter

    if not msgs:
        raise ImportFormatError(f"{what}: nothing to write to {path}")
    if path.exists():
        # A bundle is often an export of an incident whose data has since aged out of the topics: never
        # overwritten by an import that named it by mistake.
        raise ImportFormatError(f"{path} exists: remove it or name another bundle (an exported incident cannot be "
                                "exported again once its data has aged out of the topics)")
    ordered = sorted(msgs, key=lambda m: m["time"])  # a bundle is in event-time order, as a replay reads it
    with BundleWriter(path, {"since": ordered[0]["time"] - 1.0, "until": ordered[-1]["time"] + 1.0,
                             "lead_s": 0.0}) as bw:
        for m in ordered:
            bw.add(topic_for_kind(m["kind"]), encode(m))
        bw.close(None, [])
    n = sum(bw.counts.values())
    print(f"wrote {n} message{'' if n == 1 else 's'} from {what} to the bundle {path} "
          f"(replay it with: whywait replay --input {path})")
    return 0


def run(args: argparse.Namespace) -> int:
    from whywait.agents.events import encode, topic_for_kind
    from whywait.engine.commands.outputs import check_output
    from whywait.engine.errors import ConfigError

    check_output(args.output, "--output")
    for f in args.files:  # said before detecting formats: a folder or a missing file is one clear line
        try:
            f.open("rb").close()
        except OSError as exc:
            raise ConfigError(f"{f}: cannot read: {exc.strerror or exc}") from None
    files = [(f, args.format if args.format != "auto" else detect(f)) for f in args.files]
    bundles = [f for f, fmt in files if fmt == "bundle"]
    if bundles and len(files) > 1:
        raise ConfigError("import one bundle at a time, without other files")
    items: Iterator[tuple[str, bytes]]
    skipped = Skipped()
    if bundles:
        from whywait.engine.importers.bundle import Bundle

        b = Bundle(bundles[0])
        b.verify()
        skipped.lines = b.skipped  # read as the events are
        items = contract_values(b.events(), skipped)
        what = f"bundle {bundles[0]}"
    else:
        notes: Counter[str] = Counter()
        msgs = timing_messages(args, files, notes)
        items = iter([(topic_for_kind(m["kind"]), encode(m)) for m in msgs])
        what = f"{len(files)} file(s)"
        for why, n in sorted(notes.items()):
            print(f"  note: {why}" if n == 1 else f"  note: {n} {why}")
    if args.output and args.output.suffix == ".whywait":
        if bundles:
            raise ConfigError(f"{bundles[0]} is a bundle already: replay it with whywait replay --input {bundles[0]}")
        return write_bundle(args.output, msgs, what)
    if args.output:
        n = 0
        with args.output.open("w") as fh:
            for _, raw in items:
                fh.write(raw.decode() + "\n")
                n += 1
        print(f"wrote {n} message{'' if n == 1 else 's'} from {what} to {args.output}")
        skipped.print()
        return 0
    from whywait.engine.localkafka.broker import resolve_bootstrap

    bootstrap = resolve_bootstrap(flag=args.bootstrap)
    n = asyncio.run(publish(bootstrap, items, skipped))
    print(f"published {n} message{'' if n == 1 else 's'} from {what} to {bootstrap}")
    skipped.print()
    return 0


class Skipped:
    """What an import left out, by reason, with the first example of each (printed after the count)."""

    def __init__(self) -> None:
        self.counts: Counter[str] = Counter()
        self.example: dict[str, str] = {}
        self.lines: Counter[str] = Counter()  # lines the bundle itself skipped (Bundle.skipped)

    def add(self, why: str, example: str) -> None:
        self.counts[why] += 1
        self.example.setdefault(why, example)

    def print(self) -> None:
        for why, n in sorted(self.counts.items()):
            print(f"  skipped {n} {why} (the first: {self.example[why]})")
        for why, n in sorted(self.lines.items()):
            print(f"  skipped {n}: {why}")


def contract_values(items: Iterator[tuple[str, bytes]], skipped: Skipped) -> Iterator[tuple[str, bytes]]:
    """The ``(topic, raw value)`` pairs whose value the engine would read from that topic; the rest counted.

    Checked with the engine's own decoder, so what is imported is what a consumer accepts, not dead letters.
    """
    from whywait.agents.events import ContractError, decode

    for topic, raw in items:
        try:
            decode(raw, topic)
        except ContractError as exc:
            skipped.add(f"message(s) of {topic} that break the event contract", str(exc)[:300])
            continue
        yield topic, raw


async def publish(bootstrap: str, items: Iterator[tuple[str, bytes]], skipped: Skipped | None = None) -> int:
    """Send ``(topic, raw value)`` pairs with their contract keys; return how many; one line if unreachable.

    A value whose key cannot be read (not JSON, no job or node) is skipped and counted in ``skipped``.
    """
    from aiokafka import AIOKafkaProducer
    from aiokafka.errors import KafkaError
    from whywait.agents.events import message_key
    from whywait.engine.errors import BrokerUnavailable
    from whywait.engine.localkafka.broker import probe

    if not probe(bootstrap, timeout=3.0):
        raise BrokerUnavailable(bootstrap, "nothing answers there")
    # The topics first, as the engine makes them (the placement topic compacted): a first import into a new
    # broker otherwise had them auto-created bare, and the next producer to a topic created that way could
    # meet NotLeaderForPartition while its leader was elected (a `simulate` right after an `import`).
    from whywait.engine.stream.topics import ensure_topics_async, wait_for_leaders

    await ensure_topics_async(bootstrap)
    p = AIOKafkaProducer(bootstrap_servers=bootstrap, acks="all", linger_ms=20)
    n = 0
    try:
        await p.start()
        await wait_for_leaders(p)
        for topic, raw in items:
            try:
                key = message_key(json.loads(raw))
            except (ValueError, RecursionError, KeyError, TypeError) as exc:
                if skipped is not None:
                    skipped.add(f"message(s) of {topic} without a readable key",
                                f"{type(exc).__name__}: {exc}"[:300])
                continue
            await p.send(topic, raw, key=key)
            n += 1
        await p.flush()
    except KafkaError as exc:
        raise BrokerUnavailable(bootstrap, type(exc).__name__) from None
    finally:
        await p.stop()
    return n
