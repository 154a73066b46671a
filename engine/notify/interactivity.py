"""The HTTP endpoint Slack calls when someone presses a button on a whywait message.

Slack signs each request: ``X-Slack-Signature: v0=<hex HMAC-SHA256>`` over
``v0:{X-Slack-Request-Timestamp}:{raw body}`` with the app's signing secret.
:func:`verify_signature` checks it (constant-time) and that the timestamp is
within five minutes, so a captured request cannot be replayed later; anything
else is answered 401 and logged without its body.

The buttons (action ids in ``engine.notify.render``): Acknowledge, Silence 1h,
Silence 4h, Silence until resolved, Show timeline.  Each is handed to the
notifier's ``handle_action(action_id, incident_key, user)``; the endpoint answers
200 at once (Slack wants an answer within 3 s) and the notifier's worker edits
the message or replies in its thread.

Serve it with :class:`InteractivityServer` (stdlib, a thread), or use
:func:`handle_request` from another HTTP framework.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import logging
import os
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, Mapping, Protocol
from urllib.parse import parse_qs

from engine.errors import ConfigError, NotifyError
from engine.notify.render import ACTIONS
from engine.notify.secrets import Secret, read_secret

log = logging.getLogger(__name__)

MAX_AGE_S = 300.0
MAX_BODY = 1 << 20


class InvalidSignature(NotifyError):
    """A request did not come from Slack (bad or missing signature, or too old); never retryable."""

    def __init__(self, message: str) -> None:
        super().__init__(message, retryable=False)


class ActionHandler(Protocol):
    def handle_action(self, action_id: str, key: str, user: str) -> str: ...


def sign(secret: Secret | str, timestamp: str, body: bytes) -> str:
    """The ``X-Slack-Signature`` value Slack would send (tests use it to sign requests)."""
    key = (secret.reveal() if isinstance(secret, Secret) else secret).encode()
    base = b"v0:" + timestamp.encode() + b":" + body
    return "v0=" + hmac.new(key, base, hashlib.sha256).hexdigest()


def verify_signature(secret: Secret | str, timestamp: str | None, body: bytes, signature: str | None, *,
                     now: float | None = None, max_age: float = MAX_AGE_S) -> None:
    """Return if the request is Slack's; raise :class:`InvalidSignature` saying why not."""
    if not timestamp or not signature:
        raise InvalidSignature("missing X-Slack-Signature or X-Slack-Request-Timestamp")
    try:
        ts = int(timestamp)
    except ValueError:
        raise InvalidSignature(f"X-Slack-Request-Timestamp is not a number (got {timestamp[:20]!r})") from None
    now = time.time() if now is None else now
    if abs(now - ts) > max_age:
        raise InvalidSignature(f"stale request: timestamp is {abs(now - ts):.0f}s away from now (limit {max_age:.0f}s)")
    if not hmac.compare_digest(sign(secret, timestamp, body), signature):
        raise InvalidSignature("signature mismatch")


def handle_request(handler: ActionHandler, secret: Secret | str, headers: Mapping[str, str], body: bytes, *,
                   now: float | None = None) -> tuple[int, dict[str, Any]]:
    """Verify and apply one interactivity request; return (HTTP status, JSON answer)."""
    h = {k.lower(): v for k, v in headers.items()}
    try:
        verify_signature(secret, h.get("x-slack-request-timestamp"), body, h.get("x-slack-signature"), now=now)
    except InvalidSignature as exc:
        log.warning("rejected a Slack interactivity request: %s", exc)
        return 401, {"ok": False, "error": str(exc)}
    try:
        form = parse_qs(body.decode("utf-8"), strict_parsing=False)
        payload = json.loads(form["payload"][0])
    except (UnicodeDecodeError, KeyError, IndexError, json.JSONDecodeError):
        return 400, {"ok": False, "error": "expected a form field 'payload' holding JSON"}
    if payload.get("type") != "block_actions":
        return 200, {"ok": True, "ignored": payload.get("type")}
    user_obj = payload.get("user") or {}
    user = str(user_obj.get("username") or user_obj.get("name") or user_obj.get("id") or "someone")
    answers = []
    for action in payload.get("actions") or []:
        action_id, key = action.get("action_id"), action.get("value")
        if action_id not in ACTIONS or not isinstance(key, str):
            continue
        try:
            answers.append(handler.handle_action(action_id, key, user))
        except NotifyError as exc:
            log.warning("Slack action %s on %s failed: %s", action_id, key, exc)
            answers.append(str(exc))
    log.info("Slack action(s) by %s: %s", user, "; ".join(answers) or "none")
    return 200, {"ok": True, "text": " ".join(answers)}


class InteractivityServer:
    """Serves :func:`handle_request` at ``path`` on ``host:port`` (port 0: a free one) in a thread."""

    def __init__(self, handler: ActionHandler, signing_secret: Secret | str, *, host: str = "127.0.0.1",
                 port: int = 0, path: str = "/slack/actions") -> None:
        self.handler = handler
        self._secret = signing_secret if isinstance(signing_secret, Secret) else Secret(signing_secret)
        self.host, self.port, self.path = host, port, path
        self._server: ThreadingHTTPServer | None = None
        self._thread: threading.Thread | None = None

    @classmethod
    def from_env(cls, handler: ActionHandler, env: Mapping[str, str] | None = None) -> InteractivityServer | None:
        """From ``SLACK_SIGNING_SECRET`` (or ``_FILE``) and ``WHYWAIT_SLACK_ACTIONS_ADDR``
        (``host:port``, default ``127.0.0.1:3000``); None when no signing secret is set."""
        env = os.environ if env is None else env
        secret = read_secret("SLACK_SIGNING_SECRET", env)
        if secret is None:
            return None
        addr = env.get("WHYWAIT_SLACK_ACTIONS_ADDR") or "127.0.0.1:3000"
        host, _, port = addr.rpartition(":")
        try:
            return cls(handler, secret, host=host or "127.0.0.1", port=int(port))
        except ValueError:
            raise ConfigError(f"WHYWAIT_SLACK_ACTIONS_ADDR must look like 127.0.0.1:3000 (got {addr!r})") from None

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}{self.path}"

    def start(self) -> InteractivityServer:
        outer = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 - our own logging
                pass

            def do_POST(self) -> None:  # noqa: N802 - http.server's naming
                if self.path.split("?")[0] != outer.path:
                    self._answer(404, {"ok": False, "error": "not_found"})
                    return
                length = int(self.headers.get("Content-Length") or 0)
                if length > MAX_BODY:
                    self._answer(413, {"ok": False, "error": "too large"})
                    return
                body = self.rfile.read(length)
                status, answer = handle_request(outer.handler, outer._secret, dict(self.headers.items()), body)
                self._answer(status, answer)

            def _answer(self, status: int, answer: dict[str, Any]) -> None:
                data = json.dumps(answer).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

        try:
            server = ThreadingHTTPServer((self.host, self.port), Handler)
        except OSError as exc:
            raise ConfigError(f"cannot listen for Slack actions on {self.host}:{self.port}: "
                              f"{exc.strerror or exc}") from None
        server.daemon_threads = True
        self.port = server.server_address[1]
        self._server = server
        self._thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.1},
                                        name="slack-actions", daemon=True)
        self._thread.start()
        log.info("listening for Slack button presses at %s", self.url)
        return self

    def stop(self) -> None:
        server, self._server = self._server, None
        if server is not None:
            server.shutdown()
            server.server_close()
        if self._thread is not None:
            self._thread.join(timeout=5)

    def __enter__(self) -> InteractivityServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
