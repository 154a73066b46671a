"""The HTTP endpoint Slack calls when someone presses a button on a whywait message.

Slack signs each request: ``X-Slack-Signature: v0=<hex HMAC-SHA256>`` over
``v0:{X-Slack-Request-Timestamp}:{raw body}`` with the app's signing secret.
:func:`verify_signature` checks it with slack_sdk's ``SignatureVerifier``
(constant-time) and that the timestamp is within five minutes, so a captured
request cannot be replayed later; :class:`ReplayGuard` refuses the same request
(its signature, or an action's ``action_ts``) seen again within those five
minutes.  Anything else is answered 401 and logged without its body; a missing,
malformed or negative ``Content-Length`` is answered 400, one over 1 MiB 413.

The buttons (action ids in ``whywait.engine.notify.render``): Acknowledge, Silence 1h,
Silence 4h, Silence until resolved, Show timeline.  Each is handed to the
notifier's ``handle_action(action_id, incident_key, user)``; the endpoint answers
200 at once (Slack wants an answer within 3 s) and the notifier's worker edits
the message or replies in its thread.

Serve it with :class:`InteractivityServer` (stdlib, a thread), or use
:func:`handle_request` from another HTTP framework.
"""

from __future__ import annotations

import json
import logging
import os
import threading
import time
from collections import OrderedDict
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, Mapping, Protocol
from urllib.parse import parse_qs

from slack_sdk.signature import SignatureVerifier
from whywait.engine.errors import ConfigError, NotifyError
from whywait.engine.notify.render import ACTIONS
from whywait.engine.notify.secrets import Secret, read_secret

log = logging.getLogger(__name__)

MAX_AGE_S = 300.0
MAX_BODY = 1 << 20


class InvalidSignature(NotifyError):
    """A request did not come from Slack (bad or missing signature, or too old); never retryable."""

    def __init__(self, message: str) -> None:
        super().__init__(message, retryable=False)


class ActionHandler(Protocol):
    def handle_action(self, action_id: str, key: str, user: str) -> str: ...


class _FixedClock:
    """slack_sdk's verifier asks its clock for the time; this one answers ``now`` (tests pass their own)."""

    def __init__(self, now: float) -> None:
        self._now = now

    def now(self) -> float:
        return self._now


def _verifier(secret: Secret | str, now: float) -> SignatureVerifier:
    return SignatureVerifier(secret.reveal() if isinstance(secret, Secret) else secret,
                             clock=_FixedClock(now))  # type: ignore[arg-type]


def sign(secret: Secret | str, timestamp: str, body: bytes) -> str:
    """The ``X-Slack-Signature`` value Slack would send (tests use it to sign requests)."""
    sig = _verifier(secret, time.time()).generate_signature(timestamp=timestamp, body=body)
    assert sig is not None
    return sig


class ReplayGuard:
    """Remembers the requests applied in the last ``window_s`` seconds and refuses them a second time.

    A request is the same when its signature is (the same bytes, re-sent), or when one of its
    actions carries an ``action_ts`` already applied (the same button press, re-signed).  Bounded:
    at most ``max_entries`` are kept, the oldest forgotten first.  Thread-safe (the server is threaded).
    """

    def __init__(self, window_s: float = MAX_AGE_S, max_entries: int = 100_000) -> None:
        self.window_s = window_s
        self.max_entries = max_entries
        self._seen: OrderedDict[str, float] = OrderedDict()
        self._lock = threading.Lock()
        self.rejected = 0

    def check_and_remember(self, keys: list[str], now: float) -> str | None:
        """Return the first key seen within the window (a replay), or None after remembering them all."""
        with self._lock:
            while self._seen and (next(iter(self._seen.values())) < now - self.window_s
                                  or len(self._seen) > self.max_entries):
                self._seen.popitem(last=False)
            for k in keys:
                if k in self._seen:
                    self.rejected += 1
                    return k
            for k in keys:
                self._seen[k] = now
            return None


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
    try:
        ok = _verifier(secret, now).is_valid(body=body, timestamp=timestamp, signature=signature)
    except UnicodeDecodeError:  # slack_sdk hashes the body as text; Slack's bodies are always UTF-8
        ok = False
    if not ok:
        raise InvalidSignature("signature mismatch")


def parse_content_length(raw: str | None) -> int | None:
    """``Content-Length`` as a byte count, or None when it is missing, not a number, or negative."""
    if raw is None or not raw.strip().isdigit():  # rejects "-1", "abc", "1e3", " ", "+5"
        return None
    return int(raw.strip())


def handle_request(handler: ActionHandler, secret: Secret | str, headers: Mapping[str, str], body: bytes, *,
                   now: float | None = None, replays: ReplayGuard | None = None) -> tuple[int, dict[str, Any]]:
    """Verify and apply one interactivity request; return (HTTP status, JSON answer).

    With ``replays`` (the server always passes its own), a request already applied within the
    signature window is refused with 401.
    """
    h = {k.lower(): v for k, v in headers.items()}
    now = time.time() if now is None else now
    try:
        verify_signature(secret, h.get("x-slack-request-timestamp"), body, h.get("x-slack-signature"), now=now)
    except InvalidSignature as exc:
        log.warning("rejected a Slack interactivity request: %s", exc)
        return 401, {"ok": False, "error": str(exc)}
    try:
        form = parse_qs(body.decode("utf-8"), strict_parsing=False)
        payload = json.loads(form["payload"][0])
        if not isinstance(payload, dict):
            raise ValueError("not an object")
    except (UnicodeDecodeError, KeyError, IndexError, ValueError, RecursionError):
        return 400, {"ok": False, "error": "expected a form field 'payload' holding JSON"}
    if replays is not None:
        keys = ["sig:" + str(h.get("x-slack-signature"))]
        keys += [f"action:{a.get('action_ts')}:{a.get('action_id')}:{a.get('value')}"
                 for a in payload.get("actions") or [] if isinstance(a, dict) and a.get("action_ts")]
        seen = replays.check_and_remember(keys, now)
        if seen is not None:
            log.warning("rejected a replayed Slack interactivity request (%s seen within %.0fs)",
                        "same signature" if seen.startswith("sig:") else "same action_ts", replays.window_s)
            return 401, {"ok": False, "error": "replayed request"}
    if payload.get("type") != "block_actions":
        return 200, {"ok": True, "ignored": payload.get("type")}
    user_obj = payload.get("user") or {}
    if not isinstance(user_obj, dict):
        user_obj = {}
    user = str(user_obj.get("username") or user_obj.get("name") or user_obj.get("id") or "someone")
    answers = []
    for action in payload.get("actions") or []:
        if not isinstance(action, dict):
            continue
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
        self.replays = ReplayGuard()
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
                length = parse_content_length(self.headers.get("Content-Length"))
                if length is None:
                    self.close_connection = True  # the body's end is unknown: never read this connection on
                    self._answer(400, {"ok": False, "error": "Content-Length must be a non-negative integer"})
                    return
                if length > MAX_BODY:
                    self.close_connection = True
                    self._answer(413, {"ok": False, "error": "too large"})
                    return
                body = self.rfile.read(length)
                try:
                    status, answer = handle_request(outer.handler, outer._secret, dict(self.headers.items()), body,
                                                    replays=outer.replays)
                except Exception:  # noqa: BLE001 - one bad request never takes the endpoint down
                    log.exception("Slack interactivity request failed")
                    status, answer = 500, {"ok": False, "error": "internal error"}
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
