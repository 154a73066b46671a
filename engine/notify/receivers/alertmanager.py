"""The Alertmanager receiver: each finding becomes an alert in the on-call setup a site already has.

``POST {url}/api/v2/alerts`` with one alert per finding of the incident (Alertmanager
does its own grouping, routing and silencing from there).  Each alert's labels are its
identity, so they hold only what does not change while it fires:

``alertname``
    the rule id (``network.straggler-retransmits``);
``job``, ``project``, ``team``
    the training job and its owner;
``node``
    the node the cause lies with (the finding's ``node`` label, else its culprit);
``severity``, ``cause``
    the rule's severity and its ``cause`` label (``network.packet-loss``);

plus the finding's other labels (names made valid for Alertmanager).  Annotations carry
what may change: ``summary`` (the title), ``description`` (the cause sentence),
``next_step``, ``runbook_url``, ``dashboard_url``, ``ranks``, ``incident`` (whywait's
incident id).  ``startsAt`` is when the condition began; a firing alert is sent with no
``endsAt``, so Alertmanager keeps it for its ``resolve_timeout`` (5m by default), and
the pipeline re-sends it every ``WHYWAIT_ALERTMANAGER_REFRESH`` (1m) while it fires; a
resolved finding is sent with ``endsAt`` = now, and so is a label set sent before that no
longer stands (a finding whose severity was raised).

Environment: ``WHYWAIT_ALERTMANAGER_URL`` (required; ``http://alertmanager:9093``, several
comma-separated for an HA cluster: each gets every alert), ``WHYWAIT_ALERTMANAGER_REFRESH``
(a duration, shorter than Alertmanager's ``resolve_timeout``), ``WHYWAIT_ALERTMANAGER_TIMEOUT``
(10s), ``WHYWAIT_DASHBOARD_URL``.
"""

from __future__ import annotations

import json
import re
import time
from typing import Any, Mapping

from whywait.engine.diagnosis import Diagnosis
from whywait.engine.errors import ConfigError
from whywait.engine.notify.format import dashboard_url, fmt_ranks
from whywait.engine.notify.pipeline.config import parse_duration
from whywait.engine.notify.pipeline.receiver import Announcement, Receipt, Receiver, ReceiverError
from whywait.engine.notify.receivers.http import check_url, post_json

_LABEL_NAME = re.compile(r"[^a-zA-Z0-9_]")


def label_name(name: str) -> str:
    """``name`` made a valid Alertmanager label name (``[a-zA-Z_][a-zA-Z0-9_]*``)."""
    out = _LABEL_NAME.sub("_", name) or "_"
    return "_" + out if out[0].isdigit() else out


def _iso(t: float) -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(t)) + f".{int((t % 1) * 1000):03d}Z"


class AlertmanagerReceiver(Receiver):
    """Posts the incident's findings as alerts to one or more Alertmanagers."""

    name = "alertmanager"
    kinds = frozenset({"post", "update"})  # replies are news for people; the alert's state is all it needs

    def __init__(self, urls: str | list[str], *, refresh_interval: float = 60.0, timeout: float = 10.0,
                 dashboard_url_template: str | None = None) -> None:
        raw = [urls] if isinstance(urls, str) else list(urls)
        self.urls = [check_url(u, "WHYWAIT_ALERTMANAGER_URL") for item in raw for u in item.split(",") if u.strip()]
        if not self.urls:
            raise ConfigError("WHYWAIT_ALERTMANAGER_URL must name at least one Alertmanager (got nothing)")
        if refresh_interval <= 0:
            raise ConfigError(f"WHYWAIT_ALERTMANAGER_REFRESH must be > 0 (got {refresh_interval})")
        self.refresh_interval = refresh_interval
        self.timeout = timeout
        self.dashboard_url_template = dashboard_url_template

    @classmethod
    def from_env(cls, env: Mapping[str, str]) -> AlertmanagerReceiver:
        """From the variables in the module docstring."""
        url = env.get("WHYWAIT_ALERTMANAGER_URL", "").strip()
        if not url:
            raise ConfigError("the alertmanager receiver needs WHYWAIT_ALERTMANAGER_URL "
                              "(like http://alertmanager:9093)")
        kw: dict[str, Any] = {"dashboard_url_template": env.get("WHYWAIT_DASHBOARD_URL") or None}
        if env.get("WHYWAIT_ALERTMANAGER_REFRESH"):
            kw["refresh_interval"] = parse_duration(env["WHYWAIT_ALERTMANAGER_REFRESH"], "WHYWAIT_ALERTMANAGER_REFRESH")
        if env.get("WHYWAIT_ALERTMANAGER_TIMEOUT"):
            kw["timeout"] = parse_duration(env["WHYWAIT_ALERTMANAGER_TIMEOUT"], "WHYWAIT_ALERTMANAGER_TIMEOUT")
        return cls(url, **kw)

    def alert(self, d: Diagnosis, ann: Announcement) -> dict[str, Any]:
        """The Alertmanager alert for finding ``d`` of ``ann``'s incident."""
        labels = {label_name(k): str(v) for k, v in d.labels.items() if str(v)}
        node = d.labels.get("node") or d.culprit
        labels.update({k: v for k, v in {
            "alertname": d.rule_id, "job": d.job or "", "project": d.owner.project if d.owner else "",
            "team": d.owner.team if d.owner else "", "node": node or "", "severity": d.severity,
            "cause": d.labels.get("cause", ""),
        }.items() if v})
        dash = dashboard_url(self.dashboard_url_template, d, ann.now)
        annotations = {k: v for k, v in {
            "summary": d.title, "description": d.cause, "next_step": d.next_step,
            "runbook_url": d.runbook_url or "", "dashboard_url": dash or "",
            "ranks": fmt_ranks(d.ranks), "incident": ann.incident_id,
        }.items() if v}
        # startsAt is event time; a simulation or a skewed clock may put it after now, which
        # Alertmanager refuses for a resolved alert (start after end).
        start = min(d.starts_at, ann.now)
        out: dict[str, Any] = {"labels": labels, "annotations": annotations, "startsAt": _iso(start)}
        if d.status == "resolved" or ann.status == "resolved":
            out["endsAt"] = _iso(max(ann.now, start))
        if dash:
            out["generatorURL"] = dash
        return out

    def send(self, announcement: Announcement) -> Receipt:
        """POST the incident's alerts to every configured Alertmanager.

        The receipt keeps the label sets sent firing: one that is no longer among them (a finding
        whose severity or cause label changed: a new identity for Alertmanager) is resolved explicitly
        rather than left to expire after ``resolve_timeout``."""
        ann = announcement
        alerts = [self.alert(d, ann) for d in ann.findings]
        current = {json.dumps(a["labels"], sort_keys=True) for a in alerts}
        now = _iso(ann.now)
        for old in (ann.receipt or {}).get("firing") or []:
            if isinstance(old, dict) and json.dumps(old, sort_keys=True) not in current:
                alerts.append({"labels": old, "startsAt": now, "endsAt": now})  # Alertmanager keeps its start
        body = json.dumps(alerts).encode()
        errors: list[ReceiverError] = []
        for url in self.urls:
            try:
                post_json(f"{url}/api/v2/alerts", body, timeout=self.timeout, who=f"Alertmanager {url}")
            except ReceiverError as exc:
                errors.append(exc)
        if len(errors) == len(self.urls):  # one Alertmanager of a cluster that takes it is enough
            first = errors[0]
            raise ReceiverError(str(first) + (f" (and {len(errors) - 1} more)" if len(errors) > 1 else ""),
                                retryable=any(e.retryable for e in errors), retry_after=first.retry_after,
                                rate_limited=first.rate_limited)
        return {"firing": [a["labels"] for a in alerts if "endsAt" not in a], "status": ann.status}
