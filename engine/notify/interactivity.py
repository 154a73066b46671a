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

Serve it with :class:`InteractivityServer` (aiohttp, installed with faust, on its own
loop in a thread), or use :func:`handle_request` from another HTTP framework.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import sys
import threading
import time
from collections import OrderedDict
from typing import Any, Mapping, Protocol
from urllib.parse import parse_qs

from aiohttp import web
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
        if not isinstance(action_id, str) or action_id not in ACTIONS or not isinstance(key, str):
            continue
        try:
            answers.append(handler.handle_action(action_id, key, user))
        except NotifyError as exc:
            log.warning("Slack action %s on %s failed: %s", action_id, key, exc)
            answers.append(str(exc))
    log.info("Slack action(s) by %s: %s", user, "; ".join(answers) or "none")
    return 200, {"ok": True, "text": " ".join(answers)}


class _OneLineLog(logging.LoggerAdapter):  # type: ignore[type-arg]
    """aiohttp logs each malformed request with a traceback at ERROR; on an endpoint anyone on the
    network can reach, that is noise anyone can make: one warning line instead."""

    def exception(self, msg: object, *args: object, exc_info: object = True, **kw: Any) -> None:
        err = sys.exc_info()[1]
        text = str(msg) % args if args else str(msg)
        self.logger.warning("%s: %s", text, str(err).replace("\n", " ")[:200] if err else "?")


class InteractivityServer:
    """Serves :func:`handle_request` at ``path`` on ``host:port`` (port 0: a free one).

    An aiohttp application on its own event loop in a daemon thread, so the engine (whose
    faust loop is its own) and tests start and stop it like a plain object.  aiohttp parses
    the HTTP; a request without a valid ``Content-Length`` is refused (400), one declaring more
    than 1 MiB is refused before its body is read (413).
    """

    def __init__(self, handler: ActionHandler, signing_secret: Secret | str, *, host: str = "127.0.0.1",
                 port: int = 0, path: str = "/slack/actions") -> None:
        self.handler = handler
        self._secret = signing_secret if isinstance(signing_secret, Secret) else Secret(signing_secret)
        self.host, self.port, self.path = host, port, path
        self.replays = ReplayGuard()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._runner: web.AppRunner | None = None
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
        # The --metrics-addr parser (ports in range, "[::1]:3000" unbracketed), but ":3000" stays on
        # 127.0.0.1, as it always did: the narrower default for an endpoint that acts on incidents.
        from whywait.agents.observe import MetricsAddrError, parse_addr

        try:
            host, port = parse_addr(addr, "WHYWAIT_SLACK_ACTIONS_ADDR", bare="127.0.0.1")
        except MetricsAddrError:
            raise ConfigError(f"WHYWAIT_SLACK_ACTIONS_ADDR must look like 127.0.0.1:3000 or [::1]:3000 "
                              f"(got {addr!r})") from None
        return cls(handler, secret, host=host, port=port)

    @property
    def url(self) -> str:
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"http://{host}:{self.port}{self.path}"

    async def _actions(self, request: web.Request) -> web.Response:
        """POST ``path``: read the body (bounded), verify and apply it off the loop."""
        if request.content_length is None:  # chunked or absent: the body's end is unknown
            return web.json_response({"ok": False, "error": "Content-Length must be a non-negative integer"},
                                     status=400, headers={"Connection": "close"})
        if request.content_length > MAX_BODY:
            return web.json_response({"ok": False, "error": "too large"}, status=413, headers={"Connection": "close"})
        body = await request.read()
        loop = asyncio.get_running_loop()
        try:
            # the handler takes the notifier's lock: never on the loop thread
            status, answer = await loop.run_in_executor(None, lambda: handle_request(
                self.handler, self._secret, dict(request.headers), body, replays=self.replays))
        except Exception:  # noqa: BLE001 - one bad request never takes the endpoint down
            log.exception("Slack interactivity request failed")
            status, answer = 500, {"ok": False, "error": "internal error"}
        return web.json_response(answer, status=status)

    async def _not_found(self, request: web.Request) -> web.Response:
        return web.json_response({"ok": False, "error": "not_found"}, status=404)

    def start(self) -> InteractivityServer:
        """Listen and serve in a background thread; a :class:`ConfigError` when the address is unusable."""
        app = web.Application(client_max_size=MAX_BODY)
        app.router.add_post(self.path, self._actions)
        app.router.add_route("*", "/{tail:.*}", self._not_found)
        loop = asyncio.new_event_loop()
        runner = web.AppRunner(app, access_log=None, handle_signals=False,
                               logger=_OneLineLog(logging.getLogger(__name__), {}))
        try:
            loop.run_until_complete(runner.setup())
            site = web.TCPSite(runner, self.host, self.port, reuse_address=True)
            loop.run_until_complete(site.start())
        except OSError as exc:
            loop.run_until_complete(runner.cleanup())
            loop.close()
            raise ConfigError(f"cannot listen for Slack actions on {self.host}:{self.port}: "
                              f"{exc.strerror or exc}") from None
        sockets = getattr(site._server, "sockets", None)  # the bound socket tells the port chosen for port 0
        if sockets:
            self.port = sockets[0].getsockname()[1]
        self._loop, self._runner = loop, runner
        self._thread = threading.Thread(target=loop.run_forever, name="slack-actions", daemon=True)
        self._thread.start()
        log.info("listening for Slack button presses at %s", self.url)
        return self

    def stop(self) -> None:
        """Stop serving and release the port."""
        loop, runner, self._loop, self._runner = self._loop, self._runner, None, None
        if loop is None or runner is None:
            return
        asyncio.run_coroutine_threadsafe(runner.cleanup(), loop).result(timeout=10)
        loop.call_soon_threadsafe(loop.stop)
        if self._thread is not None:
            self._thread.join(timeout=5)
        loop.close()

    def __enter__(self) -> InteractivityServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
