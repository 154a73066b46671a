"""What the evaluator concludes: a :class:`Diagnosis`, which knows nothing about Slack.

A diagnosis is produced by ``whywait.engine.evaluate`` when a rule fires (``status ==
"firing"``) and again when it clears (``status == "resolved"``).  It is published
to the diagnoses topic as JSON (:meth:`Diagnosis.to_dict`) and handed to the
notifiers, which render it however their sink wants.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any, Literal

Status = Literal["firing", "resolved"]
Severity = Literal["info", "warning", "critical"]


@dataclass(frozen=True)
class Evidence:
    """One measured fact behind a diagnosis: the value against its baseline and threshold."""

    metric: str  # e.g. "tcp_retrans_segs_per_s"
    entity: str  # e.g. "node-07" or "rank 12"
    value: float
    unit: str = ""
    baseline: float | None = None  # the peers' median (or the entity's own history)
    threshold: str = ""  # e.g. "> 3x peers' median"
    window_s: float | None = None
    note: str = ""


@dataclass(frozen=True)
class Owner:
    """Who owns the affected job, and where to tell them."""

    project: str
    team: str
    channel: str | None = None


@dataclass(frozen=True)
class Diagnosis:
    """An explained finding: cause, evidence, topology path, clean checks, owner.

    ``fingerprint`` identifies the incident across updates (the rule id and its
    grouping labels); ``starts_at`` is the event time the condition began to hold
    and ``detected_at`` the event time the rule fired (after its ``for``).
    """

    rule_id: str
    fingerprint: str
    status: Status
    severity: Severity
    title: str  # one line: what is slow and why
    cause: str  # one sentence: where the waiting begins and why
    job: str | None
    owner: Owner | None
    starts_at: float
    detected_at: float
    labels: dict[str, str] = field(default_factory=dict)
    evidence: tuple[Evidence, ...] = ()
    topology_path: tuple[str, ...] = ()
    clean_checks: tuple[str, ...] = ()
    confidence: float = 0.5
    next_step: str = ""
    culprit: str | None = None  # the entity the cause lies with (node, rank, switch, pool)
    ranks: tuple[int, ...] = ()
    ends_at: float | None = None
    runbook_url: str | None = None
    text: str = ""  # the rule's rendered explanation (Jinja2), plain text
    # What the waiting costs, when the rule can say (straggler and job-pattern rules): ``step_s``
    # (the job's step time now), ``whatif_step_s`` (its step time were the culprit as fast as its
    # peers), ``slowdown_pct``, ``gpus`` (GPUs the job holds) and ``gpu_hours_lost`` since the
    # incident began (on a resolved diagnosis: over the whole incident).  None when unknown.
    cost: dict[str, float] | None = None

    def to_dict(self) -> dict[str, Any]:
        """Return a JSON-ready dict (the value written to the diagnoses topic)."""
        return asdict(self)

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> Diagnosis:
        """Rebuild a diagnosis from :meth:`to_dict` output (e.g. read back from Kafka)."""
        # Ignore fields a newer engine added (forward compatibility of the diagnoses topic).
        known = set(cls.__dataclass_fields__)
        d = {k: v for k, v in d.items() if k in known}
        d["evidence"] = tuple(Evidence(**e) for e in d.get("evidence", ()))
        d["owner"] = Owner(**d["owner"]) if d.get("owner") else None
        for k in ("topology_path", "clean_checks", "ranks"):
            d[k] = tuple(d.get(k, ()))
        return cls(**d)
