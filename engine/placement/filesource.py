"""Placements written by hand or by another scheduler: JSON or YAML, one job or a list of them.

Each job is either a complete ``placement`` message (``kind: placement``) or the short form::

    job: train-7b
    name: llama-7b pretraining   # optional: the name its users know it by, shown beside the id
    user: alice                  # optional
    account: llm                 # optional: a Slurm account, a namespace; decides the owner
    project: llm                 # optional: with team, overrides the ownership file
    team: pretraining
    channel: "#llm-pretrain"
    state: running               # or finished; default running
    nodes:                       # ranks numbered node by node, GPU by GPU...
      - {node: dgx-01, gpus: [0, 1, 2, 3, 4, 5, 6, 7]}
      - {node: dgx-02, gpus: 8}  # a count: GPUs 0-7, as in the topology file
    ranks:                       # ...or given one by one (with dp/pp/tp/... if known)
      - {rank: 0, node: dgx-01, gpu: 0, tp: 0}

Every problem names the file, the line and the job.
"""

from __future__ import annotations

import json
import time
from typing import Any, Mapping

from whywait.agents.events import ContractError, validate
from whywait.engine.placement.model import JobFacts, Owner, PlacementError, placement_message
from whywait.engine.placement.ownership import OwnershipFile
from whywait.topology.model import MAX_GPUS_PER_NODE

from whywait import jsonl, yamlio
from whywait.errors import YamlError

_SHORT = {"job", "name", "user", "account", "project", "team", "channel", "state", "nodes", "ranks"}


def _load(text: str, source: str) -> tuple[Any, dict[str, int]]:
    stripped = text.lstrip()
    if stripped.startswith(("{", "[")):
        try:
            return jsonl.loads(text), {}
        except json.JSONDecodeError as exc:
            raise PlacementError(f"{source}:{exc.lineno}: not valid JSON: {exc.msg}") from None
    try:
        doc = yamlio.loads(text, source)
    except YamlError as exc:
        raise PlacementError(str(exc)) from None
    return doc.data, yamlio.dotted(doc.lines)


def placements_from_text(text: str, source: str, ownership: OwnershipFile, producer: str,
                         now: float | None = None) -> list[dict[str, Any]]:
    """Parse every job in ``text`` into a validated placement; raise one error listing every problem."""
    data, lines = _load(text, source)
    items = data if isinstance(data, list) else [data]
    prefix = "" if not isinstance(data, list) else "[{}]"
    out: list[dict[str, Any]] = []
    problems: list[str] = []
    for i, item in enumerate(items):
        key = prefix.format(i)
        where = f"{source}:{lines.get(key, lines.get(f'{key}.job' if key else 'job', 1))}"
        try:
            out.append(_one(item, where, ownership, producer, time.time() if now is None else now))
        except PlacementError as exc:
            problems.append(str(exc))
    if problems:
        raise PlacementError(problems[0] if len(problems) == 1 else
                             f"{len(problems)} problems in {source}:\n  " + "\n  ".join(problems))
    return out


def _one(item: Any, where: str, ownership: OwnershipFile, producer: str, now: float) -> dict[str, Any]:
    if not isinstance(item, dict):
        raise PlacementError(f"{where}: expected a job mapping (got {type(item).__name__})")
    if item.get("kind") == "placement":
        try:
            return validate(item)
        except ContractError as exc:
            raise PlacementError(f"{where}: job {item.get('job')!r}: {exc}") from None
    job = item.get("job")
    if isinstance(job, int) and not isinstance(job, bool) and job >= 0:
        job = str(job)  # `job: 4312` is a scheduler's job id, written as YAML reads it
    if not isinstance(job, str) or not job:
        raise PlacementError(f"{where}: expected 'job' naming the job (got {job!r})")
    if job != job.strip():
        # a Reporter never sends spaces around its job id: this placement would match no step
        raise PlacementError(f"{where}: job {job!r} has spaces around it; the training's steps name it "
                             f"{job.strip()!r}")
    unknown = sorted(set(item) - _SHORT)
    if unknown:
        raise PlacementError(f"{where}: job {job!r}: unknown key {unknown[0]!r} (valid: {', '.join(sorted(_SHORT))})")
    for name in ("user", "account", "project", "team", "channel"):  # names: a number or a list here is a mistake
        if item.get(name) is not None and not isinstance(item[name], str):
            raise PlacementError(f"{where}: job {job!r}: {name} must be a string (got {item[name]!r:.40})")
    for name in ("nodes", "ranks"):
        if item.get(name) is not None and not isinstance(item[name], list):
            raise PlacementError(f"{where}: job {job!r}: {name} must be a list (got {item[name]!r:.40})")
    state = item.get("state", "running")
    if state not in ("running", "finished"):
        raise PlacementError(f"{where}: job {job!r}: state must be 'running' or 'finished' (got {state!r})")
    nodes: list[tuple[str, tuple[int, ...]]] = []
    for n in item.get("nodes") or []:
        gpus = n.get("gpus") if isinstance(n, dict) else None
        if isinstance(gpus, int) and not isinstance(gpus, bool) and 0 < gpus <= MAX_GPUS_PER_NODE:
            gpus = list(range(gpus))  # a count, as the topology file takes it: GPUs 0 to N-1
        if not isinstance(n, dict) or not isinstance(n.get("node"), str) or not isinstance(gpus, list) \
                or not all(isinstance(g, int) and not isinstance(g, bool) and g >= 0 for g in gpus):
            raise PlacementError(f"{where}: job {job!r}: each of 'nodes' must be {{node: NAME, gpus: [INDEX...]}} "
                                 f"or {{node: NAME, gpus: COUNT}} (got {n!r})")
        nodes.append((n["node"], tuple(gpus)))
    ranks = item.get("ranks") or []
    if nodes and ranks:
        raise PlacementError(f"{where}: job {job!r}: give 'nodes' or 'ranks', not both")
    owner: Owner
    if item.get("project") and item.get("team"):
        owner = Owner(str(item["project"]), str(item["team"]), item.get("channel"))
    else:
        owner = ownership.resolve(account=item.get("account"), user=item.get("user"))
        if item.get("channel"):
            owner = Owner(owner.project, owner.team, str(item["channel"]), owner.known)
    job_name = item.get("name")
    if job_name is not None and not isinstance(job_name, str):
        raise PlacementError(f"{where}: job {job!r}: 'name' must be text (got {job_name!r})")
    facts = JobFacts(job, "file", tuple(nodes), item.get("user"), item.get("account"), finished=state == "finished",
                     name=job_name)
    try:
        return placement_message(facts, owner, now, producer, extra_ranks=ranks if isinstance(ranks, list) else [])
    except PlacementError as exc:
        raise PlacementError(f"{where}: {exc}") from None


def owner_summary(msg: Mapping[str, Any]) -> str:
    """``"llm/pretraining #llm-pretrain"``, for the command's one line per published job."""
    return f"{msg['project']}/{msg['team']}" + (f" {msg['slack_channel']}" if msg.get("slack_channel") else "")
