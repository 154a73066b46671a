"""The webhook receiver: a JSON POST of every announcement, for anything the other receivers don't cover.

The payload (``version`` 1; documented in ``docs/notify.md``)::

    {"version": "1", "kind": "post" | "update" | "reply",
     "incident": {"id", "key", "status", "route", "rule_id", "severity", "title", "cause", "job",
                  "culprit", "ranks", "starts_at", "ends_at", "resolved_at", "acked_by",
                  "silenced_by", "runbook_url", "dashboard_url", "owner": {"project", "team", "channel"}},
     "lines": [{"kind", "text"}, ...],       # a reply's news ("reply" only; empty otherwise)
     "text": "...",                          # the same lines as plain text
     "findings": [Diagnosis.to_dict(), ...], # every finding of the incident, firing and resolved
     "sent_at": 1750000000.0}

Times are Unix seconds.  With a secret (``WHYWAIT_WEBHOOK_SECRET`` or ``_FILE``) every
request carries ``X-Whywait-Timestamp: <unix seconds>`` and ``X-Whywait-Signature:
sha256=<hex>``, the HMAC-SHA256 of ``"{timestamp}.{body}"`` with the secret; check it
(constant-time) and refuse timestamps older than a few minutes.  ``X-Whywait-Delivery``
is ``{incident id}:{kind}:{queued_at}`` (when the delivery was queued), the same on every retry,
for de-duplicating them.

Environment: ``WHYWAIT_WEBHOOK_URL`` (required), ``WHYWAIT_WEBHOOK_SECRET`` /
``WHYWAIT_WEBHOOK_SECRET_FILE``, ``WHYWAIT_WEBHOOK_TIMEOUT`` (10s), ``WHYWAIT_DASHBOARD_URL``.
"""

from __future__ import annotations

import hashlib
import hmac
import json
from typing import Any, Mapping

from whywait.engine.errors import ConfigError
from whywait.engine.notify.format import dashboard_url
from whywait.engine.notify.pipeline.config import parse_duration
from whywait.engine.notify.pipeline.receiver import Announcement, Receipt, Receiver
from whywait.engine.notify.receivers.http import check_url, post_json
from whywait.engine.notify.secrets import Secret, read_secret

SIGNATURE_HEADER = "X-Whywait-Signature"
TIMESTAMP_HEADER = "X-Whywait-Timestamp"


def signature(secret: Secret | str, timestamp: str, body: bytes) -> str:
    """The ``X-Whywait-Signature`` value for ``body`` sent at ``timestamp``: ``sha256=<hex>``."""
    key = (secret.reveal() if isinstance(secret, Secret) else secret).encode()
    return "sha256=" + hmac.new(key, timestamp.encode() + b"." + body, hashlib.sha256).hexdigest()


def payload(ann: Announcement, dashboard_url_template: str | None = None) -> dict[str, Any]:
    """The JSON document posted for ``ann`` (see the module docstring)."""
    v = ann.view
    return {
        "version": "1",
        "kind": ann.kind,
        "incident": {
            "id": ann.incident_id, "key": ann.key, "status": ann.status, "route": ann.route,
            "rule_id": v.rule_id, "severity": v.severity, "title": v.title, "cause": v.cause, "job": v.job,
            "culprit": v.culprit, "ranks": list(v.ranks), "starts_at": v.starts_at, "ends_at": v.ends_at,
            "resolved_at": ann.resolved_at, "acked_by": ann.acked_by, "silenced_by": ann.silenced_by,
            "runbook_url": v.runbook_url, "dashboard_url": dashboard_url(dashboard_url_template, v, ann.now),
            "owner": None if v.owner is None else
            {"project": v.owner.project, "team": v.owner.team, "channel": v.owner.channel},
        },
        "lines": [{"kind": line.kind, "text": line.text} for line in ann.lines],
        "text": ann.text,
        "findings": [d.to_dict() for d in ann.findings],
        "sent_at": ann.now,
    }


class WebhookReceiver(Receiver):
    """POSTs :func:`payload` to one URL, signed when a secret is set."""

    name = "webhook"

    def __init__(self, url: str, *, secret: Secret | str | None = None, timeout: float = 10.0,
                 dashboard_url_template: str | None = None) -> None:
        self.url = check_url(url, "WHYWAIT_WEBHOOK_URL")
        self._secret = Secret(secret) if isinstance(secret, str) else secret
        self.timeout = timeout
        self.dashboard_url_template = dashboard_url_template

    @classmethod
    def from_env(cls, env: Mapping[str, str]) -> WebhookReceiver:
        """From the variables in the module docstring."""
        url = env.get("WHYWAIT_WEBHOOK_URL", "").strip()
        if not url:
            raise ConfigError("the webhook receiver needs WHYWAIT_WEBHOOK_URL")
        timeout = parse_duration(env["WHYWAIT_WEBHOOK_TIMEOUT"], "WHYWAIT_WEBHOOK_TIMEOUT") \
            if env.get("WHYWAIT_WEBHOOK_TIMEOUT") else 10.0
        return cls(url, secret=read_secret("WHYWAIT_WEBHOOK_SECRET", env), timeout=timeout,
                   dashboard_url_template=env.get("WHYWAIT_DASHBOARD_URL") or None)

    def send(self, announcement: Announcement) -> Receipt:
        """POST the payload; the receipt names where it went."""
        ann = announcement
        body = json.dumps(payload(ann, self.dashboard_url_template), separators=(",", ":")).encode()
        # The outbox item's time, not this attempt's: a retry repeats the id, so the receiving side can
        # de-duplicate a delivery it took whose answer was lost.
        queued = ann.now if ann.queued_at is None else ann.queued_at
        headers = {"X-Whywait-Delivery": f"{ann.incident_id}:{ann.kind}:{queued:.3f}"}
        if self._secret is not None:
            ts = str(int(ann.now))
            headers[TIMESTAMP_HEADER] = ts
            headers[SIGNATURE_HEADER] = signature(self._secret, ts, body)
        post_json(self.url, body, headers=headers, timeout=self.timeout, who=f"webhook {self.url}")
        return {"url": self.url}  # stable: an unchanged receipt costs no state write
