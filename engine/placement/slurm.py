"""A Slurm job's placement from ``scontrol show job -d --json`` (or, lacking it, the prolog's environment).

The JSON is Slurm's ``data_parser`` job record (the same one ``squeue --json`` prints):
``jobs[].job_id``, ``user_name``, ``account``, ``job_state``, the node list
(``job_resources.allocated_nodes[].nodename`` up to 23.11, ``job_resources.nodes.allocation[].name``
from 24.05, else the ``nodes`` hostlist) and, per node in the same order, ``gres_detail``
(``"gpu:h100:8(IDX:0-7)"``).  Ranks are numbered node by node in that order, GPU by GPU,
which is how ``srun`` and ``torchrun`` number them.

Slurm runs ``PrologSlurmctld``/``EpilogSlurmctld`` once per job with ``SLURM_JOB_ID``,
``SLURM_JOB_USER``, ``SLURM_JOB_ACCOUNT`` and ``SLURM_JOB_NODELIST`` set; these are used
when the JSON lacks them.
"""

from __future__ import annotations

import json
import re
from typing import Any, Mapping

from whywait.agents.training import slurm_job_id
from whywait.engine.placement.model import JobFacts, PlacementError
from whywait.topology.loaders import expand_hostlist

from whywait import jsonl

_GRES_IDX = re.compile(r"(?:^|,)gpu(?::[^:(,]+)?:\d+\(IDX:([^)]*)\)")


def gpu_indexes(gres_detail: str) -> tuple[int, ...]:
    """``"gpu:h100:4(IDX:0-2,5)"`` → ``(0, 1, 2, 5)``; several GPU types are summed; none → ``()``."""
    out: list[int] = []
    for m in _GRES_IDX.finditer(gres_detail):
        for part in filter(None, m.group(1).split(",")):
            a, sep, b = part.partition("-")
            if not a.isdigit() or (sep and not b.isdigit()):
                raise PlacementError(f"gres_detail {gres_detail!r}: expected GPU indexes like 'IDX:0-3,5' "
                                     f"(got {part!r})")
            out.extend(range(int(a), int(b) + 1) if sep else [int(a)])
    return tuple(sorted(set(out)))


def _number(v: Any) -> Any:
    """Slurm ≥ 23.02 wraps numbers as ``{"set": true, "number": N}``."""
    if isinstance(v, dict) and "number" in v:
        return v["number"] if v.get("set", True) else None
    return v


def _job_nodes(job: Mapping[str, Any]) -> list[str]:
    res = job.get("job_resources") or {}
    alloc = res.get("allocated_nodes")
    if isinstance(alloc, list) and alloc:
        return [str(n.get("nodename")) for n in alloc if isinstance(n, dict) and n.get("nodename")]
    nodes = res.get("nodes")
    if isinstance(nodes, dict) and isinstance(nodes.get("allocation"), list) and nodes["allocation"]:
        return [str(n["name"]) for n in sorted(nodes["allocation"], key=lambda n: n.get("index", 0))
                if isinstance(n, dict) and n.get("name")]
    for hostlist in (nodes if isinstance(nodes, str) else None, job.get("nodes")):
        if isinstance(hostlist, str) and hostlist:
            return expand_hostlist(hostlist)
    return []


def facts_from_scontrol(text: str, job_id: str | None = None, env: Mapping[str, str] | None = None,
                        source: str = "scontrol", finished: bool = False) -> JobFacts:
    """The facts of job ``job_id`` (the only job when None) in ``scontrol show job -d --json`` output.

    ``env`` (the prolog's) fills in the user, account and job id when the JSON lacks
    them.  Raises :class:`PlacementError` naming ``source`` and what is missing, or, for
    output of a shape no Slurm version writes (a job that is not an object, a count where
    a list belongs), what was found where.
    """
    try:
        return _facts_from_scontrol(text, job_id, env or {}, source, finished)
    except (AttributeError, TypeError, KeyError, IndexError) as exc:  # typed access on a shape we do not know
        raise PlacementError(f"{source}: not scontrol's job JSON as this version reads it "
                             f"({type(exc).__name__}: {exc})") from None


def _facts_from_scontrol(text: str, job_id: str | None, env: Mapping[str, str], source: str,
                         finished: bool) -> JobFacts:
    """:func:`facts_from_scontrol`'s reading, which assumes the shape Slurm writes."""
    try:
        data = jsonl.loads(text)
    except json.JSONDecodeError as exc:
        raise PlacementError(f"{source}:{exc.lineno}: not valid JSON: {exc.msg}") from None
    jobs = data.get("jobs") if isinstance(data, dict) else None
    if not isinstance(jobs, list) or not jobs:
        errors = data.get("errors") if isinstance(data, dict) else None
        raise PlacementError(f"{source}: expected 'jobs' holding the job"
                             + (f" (scontrol said: {errors})" if errors else ""))
    want = job_id or env.get("SLURM_JOB_ID")
    if want is not None:
        found = [j for j in jobs if str(j.get("job_id")) == str(want)]
        if not found:
            raise PlacementError(f"{source}: job {want} is not in the output (jobs: "
                                 f"{', '.join(str(j.get('job_id')) for j in jobs[:5])})")
        job = found[0]
    elif len(jobs) == 1:
        job = jobs[0]
    else:
        raise PlacementError(f"{source}: {len(jobs)} jobs in the output; say which (--job-id or SLURM_JOB_ID)")
    jid = str(job.get("job_id"))
    # An array task is known to users (and squeue) as ARRAYID_TASK.
    array_id, task = _number(job.get("array_job_id")), _number(job.get("array_task_id"))
    job_name = slurm_job_id(jid, array_id or None, task)
    nodes = _job_nodes(job)
    if not nodes:
        nodes = expand_hostlist(env.get("SLURM_JOB_NODELIST", ""))
    if not nodes and not finished:
        raise PlacementError(f"{source}: job {jid} has no nodes yet (state {job.get('job_state')})")
    details = job.get("gres_detail") or []
    per_node: list[tuple[str, tuple[int, ...]]] = []
    for i, node in enumerate(nodes):
        if i < len(details):
            gpus = gpu_indexes(str(details[i]))
        else:
            gpus = _gpus_from_tres(job)
        per_node.append((node, gpus))
    return JobFacts(job_name, "slurm", tuple(per_node),
                    user=job.get("user_name") or env.get("SLURM_JOB_USER"),
                    account=job.get("account") or env.get("SLURM_JOB_ACCOUNT"), finished=finished,
                    name=_name(job.get("name")) or _name(env.get("SLURM_JOB_NAME")))


def _gpus_from_tres(job: Mapping[str, Any]) -> tuple[int, ...]:
    """GPUs per node from ``tres_per_node`` (``gres:gpu:8``/``gres/gpu:8``) when ``gres_detail`` is absent."""
    m = re.search(r"gres[:/]gpu(?::[^:,]+)?:(\d+)", str(job.get("tres_per_node") or ""))
    return tuple(range(int(m.group(1)))) if m else ()


def facts_from_env(env: Mapping[str, str], finished: bool) -> JobFacts:
    """The facts the prolog/epilog environment alone gives (the epilog needs no more than the job id)."""
    jid = env.get("SLURM_JOB_ID")
    if not jid:
        raise PlacementError("SLURM_JOB_ID is not set: run this as Slurm's PrologSlurmctld/EpilogSlurmctld, "
                             "or give --job-id")
    job_name = slurm_job_id(jid, env.get("SLURM_ARRAY_JOB_ID"), env.get("SLURM_ARRAY_TASK_ID"))
    gpus = tuple(int(g) for g in env.get("SLURM_JOB_GPUS", "").split(",") if g.strip().isdigit())
    nodes = tuple((n, gpus) for n in expand_hostlist(env.get("SLURM_JOB_NODELIST", "")))
    return JobFacts(job_name, "slurm", nodes, env.get("SLURM_JOB_USER"), env.get("SLURM_JOB_ACCOUNT"),
                    finished=finished, name=_name(env.get("SLURM_JOB_NAME")))


def _name(v: Any) -> str | None:
    """A job name fit to show: printable, at most 200 characters; None for none (Slurm's default ``bash``
    of an interactive allocation is a name too, and shown)."""
    if not isinstance(v, str):
        return None
    clean = "".join(ch for ch in v if ch.isprintable()).strip()[:200]
    return clean or None
