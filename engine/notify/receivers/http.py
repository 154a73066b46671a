"""A JSON POST with the errors a receiver needs: shared by the HTTP receivers (Alertmanager, webhook).

Stdlib ``urllib``: the pipeline calls receivers from a worker thread, one delivery at a
time, so a blocking client with a timeout is all that is needed.
"""

from __future__ import annotations

import urllib.error
import urllib.request
from typing import Any, Mapping

from whywait.engine.errors import ConfigError
from whywait.engine.notify.pipeline.receiver import ReceiverError

from whywait import jsonl


def check_url(url: str, what: str) -> str:
    """``url`` if it is http(s)://host...; a :class:`ConfigError` naming ``what`` otherwise."""
    u = url.strip()
    if not u.lower().startswith(("http://", "https://")) or len(u.split("://", 1)[1].strip("/")) == 0:
        raise ConfigError(f"{what} must be an http(s) URL like 'http://alertmanager:9093' (got {url!r})")
    return u.rstrip("/")


def post_json(url: str, body: bytes, *, headers: Mapping[str, str] | None = None, timeout: float = 10.0,
              who: str = "the receiver") -> tuple[int, Any]:
    """POST ``body`` (JSON) to ``url``; return (status, decoded JSON answer or None).

    Raises :class:`ReceiverError`: retryable for connection errors, timeouts, 408, 429 (with
    ``Retry-After``) and 5xx; not retryable for other 4xx (the request itself is wrong).
    """
    req = urllib.request.Request(url, data=body, method="POST",
                                 headers={"Content-Type": "application/json", "User-Agent": "whywait",
                                          **dict(headers or {})})
    try:
        with urllib.request.urlopen(req, timeout=timeout) as resp:  # noqa: S310 - http(s) checked at config
            raw = resp.read(1 << 20)
            status = resp.status
    except urllib.error.HTTPError as exc:
        detail = exc.read(300).decode("utf-8", "replace").strip().replace("\n", " ")
        retry_after = None
        if exc.headers.get("Retry-After"):
            try:
                retry_after = float(exc.headers["Retry-After"])
            except ValueError:
                retry_after = None
        transient = exc.code in (408, 429) or exc.code >= 500
        raise ReceiverError(f"{who} answered HTTP {exc.code}{': ' + detail if detail else ''}",
                            retryable=transient, retry_after=retry_after, rate_limited=exc.code == 429) from None
    except (urllib.error.URLError, OSError) as exc:
        reason = getattr(exc, "reason", None) or exc
        raise ReceiverError(f"{who} unreachable ({reason})", retryable=True) from None
    try:
        return status, jsonl.loads(raw) if raw.strip() else None
    except ValueError:
        return status, None
