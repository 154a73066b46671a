"""What the evaluator concludes: a :class:`Diagnosis`, which knows nothing about Slack.

A diagnosis is produced by ``whywait.engine.evaluate`` when a rule fires (``status ==
"firing"``) and again when it clears (``status == "resolved"``).  It is published
to the diagnoses topic as JSON (:meth:`Diagnosis.to_dict`) and handed to the
notifiers, which render it however their sink wants.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field
from typing import Any, Literal, get_args

from whywait.errors import WhywaitError

Status = Literal["firing", "resolved"]
Severity = Literal["info", "warning", "critical"]
#: the one severity list, lowest first: rule files, notify settings and routing all read it
SEVERITIES: tuple[Severity, ...] = get_args(Severity)


class DiagnosisFormatError(WhywaitError, ValueError):
    """A dict read back (a diagnoses topic, ``notify render``'s file, a snapshot) is not a diagnosis.

    Raised by :meth:`Diagnosis.from_dict`; the message names the field (``evidence[0].value``) and what
    it must be, so a caller can put its own file, line or offset in front.
    """


#: The latest event time a diagnosis may carry (the year 5138): ``datetime.fromtimestamp`` and
#: ``strftime`` in the renderers fail on larger ones, so such a value is refused when read.
_MAX_TIME = 1e11
_STR, _OPT_STR, _NUM, _OPT_NUM, _TIME, _OPT_TIME = "str", "str?", "num", "num?", "time", "time?"
_EVIDENCE_FIELDS = {"metric": _STR, "entity": _STR, "value": _NUM, "unit": _STR, "baseline": _OPT_NUM,
                    "threshold": _STR, "window_s": _OPT_NUM, "note": _STR}
_DIAGNOSIS_FIELDS = {"rule_id": _STR, "fingerprint": _STR, "title": _STR, "cause": _STR, "job": _OPT_STR,
                     "starts_at": _TIME, "detected_at": _TIME, "ends_at": _OPT_TIME, "confidence": _NUM,
                     "next_step": _STR, "culprit": _OPT_STR, "runbook_url": _OPT_STR, "text": _STR}


def _check_value(where: str, v: Any, kind: str) -> None:
    """Raise :class:`DiagnosisFormatError` unless ``v`` is of ``kind`` (one of the ``_STR`` ... constants)."""
    optional = kind.endswith("?")
    if optional and v is None:
        return
    kind = kind.rstrip("?")
    if kind == _STR:
        ok, what = isinstance(v, str), "a string"
    elif kind == _NUM:
        ok, what = isinstance(v, (int, float)) and not isinstance(v, bool), "a number"
    else:
        ok = isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v) and abs(v) < _MAX_TIME
        what = "a Unix time in seconds"
    if not ok:
        raise DiagnosisFormatError(f"{where} must be {what}{' or null' if optional else ''} (got {_shown(v)})")


def _shown(v: Any) -> str:
    text = repr(v)
    return text if len(text) <= 40 else text[:37] + "..."


def _check_dict(d: Any) -> None:
    """The checks :meth:`Diagnosis.from_dict` makes before it builds anything; see its docstring."""
    if not isinstance(d, dict):
        raise DiagnosisFormatError(f"a diagnosis must be an object (got {type(d).__name__})")
    for name in ("rule_id", "fingerprint", "status", "severity", "title", "cause", "starts_at", "detected_at"):
        if name not in d:
            raise DiagnosisFormatError(f"{name} is missing")
    for name, kind in _DIAGNOSIS_FIELDS.items():
        if name in d:
            _check_value(name, d[name], kind)
    if "confidence" in d and not 0.0 <= d["confidence"] <= 1.0:
        raise DiagnosisFormatError(f"confidence must be from 0 to 1 (got {_shown(d['confidence'])})")
    if d["status"] not in get_args(Status):
        raise DiagnosisFormatError(f"status must be one of {', '.join(get_args(Status))} (got {_shown(d['status'])})")
    if d["severity"] not in SEVERITIES:
        raise DiagnosisFormatError(f"severity must be one of {', '.join(SEVERITIES)} (got {_shown(d['severity'])})")
    labels = d.get("labels", {})
    if not isinstance(labels, dict) or not all(isinstance(k, str) and isinstance(v, str) for k, v in labels.items()):
        raise DiagnosisFormatError(f"labels must be an object of strings (got {_shown(labels)})")
    owner = d.get("owner")
    if owner:
        if not isinstance(owner, dict):
            raise DiagnosisFormatError(f"owner must be an object or null (got {_shown(owner)})")
        for name, kind in (("project", _STR), ("team", _STR), ("channel", _OPT_STR)):
            if name not in owner and kind == _STR:
                raise DiagnosisFormatError(f"owner.{name} is missing")
            _check_value(f"owner.{name}", owner.get(name), kind)
    for name, kind in (("topology_path", _STR), ("clean_checks", _STR), ("ranks", "int")):
        items = d.get(name, ())
        if not isinstance(items, (list, tuple)):
            raise DiagnosisFormatError(f"{name} must be a list (got {_shown(items)})")
        for i, v in enumerate(items):
            if kind == "int":
                if not isinstance(v, int) or isinstance(v, bool):
                    raise DiagnosisFormatError(f"{name}[{i}] must be a whole number (got {_shown(v)})")
            else:
                _check_value(f"{name}[{i}]", v, kind)
    evidence = d.get("evidence", ())
    if not isinstance(evidence, (list, tuple)):
        raise DiagnosisFormatError(f"evidence must be a list (got {_shown(evidence)})")
    for i, e in enumerate(evidence):
        if not isinstance(e, dict):
            raise DiagnosisFormatError(f"evidence[{i}] must be an object (got {_shown(e)})")
        for name in ("metric", "entity", "value"):
            if name not in e:
                raise DiagnosisFormatError(f"evidence[{i}].{name} is missing")
        for name, v in e.items():
            if name in _EVIDENCE_FIELDS:
                _check_value(f"evidence[{i}].{name}", v, _EVIDENCE_FIELDS[name])
    cost = d.get("cost")
    if cost is not None and not (isinstance(cost, dict) and all(
            isinstance(k, str) and (v is None or (isinstance(v, (int, float)) and not isinstance(v, bool)))
            for k, v in cost.items())):
        raise DiagnosisFormatError(f"cost must be an object of numbers or null (got {_shown(cost)})")


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
        """Rebuild a diagnosis from :meth:`to_dict` output (read back from Kafka, a file or a snapshot).

        Fields a newer engine added are ignored (forward compatibility of the diagnoses topic).  A dict
        that is not a diagnosis (a field missing, or of the wrong type) raises
        :class:`DiagnosisFormatError` naming the field: the renderers would otherwise fail deep inside,
        on whichever value they touched first.
        """
        _check_dict(d)
        known = set(cls.__dataclass_fields__)
        d = {k: v for k, v in d.items() if k in known}
        ev_known = set(Evidence.__dataclass_fields__)
        d["evidence"] = tuple(Evidence(**{k: v for k, v in e.items() if k in ev_known}) for e in d.get("evidence", ()))
        owner = d.get("owner")
        d["owner"] = Owner(owner["project"], owner["team"], owner.get("channel")) if owner else None
        for k in ("topology_path", "clean_checks", "ranks"):
            d[k] = tuple(d.get(k, ()))
        return cls(**d)
