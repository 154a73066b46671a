"""What a scheduler says about a job, and the placement message built from it."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Mapping, Sequence

from whywait.agents.events import ContractError, envelope, validate
from whywait.engine.errors import EngineError


class PlacementError(EngineError):
    """A scheduler's output or a placement file cannot be turned into a placement (one line: what and where)."""


@dataclass(frozen=True)
class Owner:
    """Who a job belongs to; ``known`` is False when no ownership rule matched (the default channel)."""

    project: str
    team: str
    channel: str | None
    known: bool = True


@dataclass(frozen=True)
class JobFacts:
    """One job as its scheduler describes it.

    ``nodes`` lists ``(node, gpu indexes)`` in rank order: ranks are numbered node by node,
    GPU by GPU (``torchrun``/``srun`` order) unless ``ranks`` gives them explicitly as
    ``(rank, node, gpu)``.  ``account`` is the Slurm account or the Kubernetes namespace;
    ``labels`` the pod labels (Kubernetes) or empty.
    """

    job: str
    source: str
    nodes: tuple[tuple[str, tuple[int, ...]], ...] = ()
    user: str | None = None
    account: str | None = None
    labels: Mapping[str, str] = field(default_factory=dict)
    ranks: tuple[tuple[int, str, int], ...] = ()
    finished: bool = False
    name: str | None = None  # the name its users know it by (Slurm's --job-name), when the id is not that

    def rank_list(self) -> list[dict[str, Any]]:
        """The ranks as the contract's ``PlacedRank`` records."""
        if self.ranks:
            return [{"rank": r, "node": n, "gpu": g} for r, n, g in sorted(self.ranks)]
        out: list[dict[str, Any]] = []
        for node, gpus in self.nodes:
            for g in gpus:
                out.append({"rank": len(out), "node": node, "gpu": g})
        return out


def placement_message(facts: JobFacts, owner: Owner, now: float, producer: str,
                      extra_ranks: Sequence[Mapping[str, Any]] = ()) -> dict[str, Any]:
    """Build and validate the ``placement`` message for ``facts`` owned by ``owner`` at event time ``now``.

    ``producer`` is the envelope's ``node`` (the host running the hook or watcher).
    Raises :class:`PlacementError` when the result breaks the contract (a job with no GPUs).
    """
    ranks = list(extra_ranks) or facts.rank_list()
    if not ranks and not facts.finished:
        raise PlacementError(f"job {facts.job}: no GPU is allocated to it, so there is no rank to place")
    body: dict[str, Any] = {"job": facts.job, "project": owner.project, "team": owner.team,
                            "state": "finished" if facts.finished else "running", "ranks": ranks,
                            "source": facts.source}
    if owner.channel:
        body["slack_channel"] = owner.channel
    if facts.user:
        body["user"] = facts.user
    if facts.account:
        body["account"] = facts.account
    if facts.name and facts.name != facts.job:
        body["name"] = facts.name[:200]
    msg = envelope("placement", producer, now, **body)
    try:
        return validate(msg)
    except ContractError as exc:
        raise PlacementError(f"job {facts.job}: the placement breaks the contract: {exc}") from None
