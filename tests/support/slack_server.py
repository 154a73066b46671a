"""A local Slack Web API server for tests: the real protocol, on loopback.

No Slack workspace is reachable from the test machines, so the notifier is tested
against this server instead.  It speaks the Web API as ``slack_sdk.WebClient``
sends it: ``POST {base}/api/<method>`` with ``Authorization: Bearer <token>`` and a
JSON, form-encoded or multipart body; replies are JSON ``{"ok": true, ...}`` or
``{"ok": false, "error": "..."}`` with HTTP 200, as Slack does, except rate limits
(HTTP 429 with ``Retry-After``) and the outage mode (HTTP 503, or the port closed).

Methods: ``auth.test``, ``chat.postMessage`` (``thread_ts`` replies),
``chat.update``, ``conversations.list``, ``conversations.replies``, and the three
steps of ``files_upload_v2``: ``files.getUploadURLExternal`` (hands out an upload URL
on this server, ``/upload/<file id>``), the upload itself (raw bytes POSTed there),
and ``files.completeUploadExternal`` (shares the files into a channel or thread as
a message whose ``files`` lists them); anything else answers ``unknown_method``.

Use it as a context manager (the ``slack_server`` fixture in
``tests/notify/conftest.py`` wraps it)::

    with SlackServer(channels=["#ml-infra", "#whywait"], token="xoxb-test") as s:
        client = WebClient(token="xoxb-test", base_url=s.url)
        ...
        assert [m.text for m in s.roots("#ml-infra")] == [...]

Every request is recorded in :attr:`SlackServer.calls` (method, channel, ts,
thread_ts, text, blocks, monotonic and wall time, result) for assertions.
"""

from __future__ import annotations

import email.parser
import email.policy
import json
import threading
import time
from contextlib import contextmanager
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, Iterable, Iterator, Literal
from urllib.parse import parse_qsl, urlsplit

OutageMode = Literal["refuse", "503"]


@dataclass
class SlackCall:
    """One request as the server saw it (recorded whether it succeeded or not)."""

    method: str
    params: dict[str, Any]
    status: int  # HTTP status answered
    ok: bool
    error: str | None
    time: float  # time.monotonic() at receipt
    wall_time: float  # time.time() at receipt
    channel: str | None = None  # channel id, once resolved (None if unknown)
    ts: str | None = None  # the message's ts (posted or updated)
    thread_ts: str | None = None
    text: str | None = None
    blocks: list[dict[str, Any]] | None = None
    auth: str | None = None  # the bearer token sent (tests assert it is never elsewhere)


@dataclass
class SlackFile:
    """A file announced by ``files.getUploadURLExternal``, its bytes once uploaded, and where it was shared."""

    id: str
    filename: str
    length: int
    content: bytes | None = None
    title: str | None = None
    channel: str | None = None
    thread_ts: str | None = None


@dataclass
class SlackMessage:
    """A message as it currently stands in a channel (edits applied)."""

    channel: str  # channel id
    ts: str
    text: str
    blocks: list[dict[str, Any]] | None
    thread_ts: str | None = None  # set on thread replies
    edits: list[dict[str, Any]] = field(default_factory=list)  # earlier versions, oldest first
    posted_at: float = 0.0  # monotonic
    files: list[str] = field(default_factory=list)  # ids of files shared with this message

    @property
    def all_text(self) -> str:
        """Text and every text found in the blocks, joined: what a reader sees."""
        return "\n".join([self.text or "", *_block_texts(self.blocks or [])])


#: Slack's limits on a message's blocks: 50 blocks, 3,000 characters of text in a section (both documented), and
#: about 13,000 characters in all, refused as ``msg_blocks_too_long`` (slackapi/bolt-js#2509).
MAX_BLOCKS, MAX_SECTION_CHARS, MAX_BLOCK_CHARS = 50, 3000, 13_000


def _block_limits(blocks: list[Any]) -> str | None:
    """The error Slack answers for ``blocks`` past its limits, or None."""
    if len(blocks) > MAX_BLOCKS:
        return "invalid_blocks"
    for b in blocks:
        t = b.get("text") if isinstance(b, dict) else None
        if isinstance(b, dict) and b.get("type") == "section" and isinstance(t, dict) \
                and len(str(t.get("text", ""))) > MAX_SECTION_CHARS:
            return "invalid_blocks"
    if sum(len(t) for t in _block_texts(blocks)) > MAX_BLOCK_CHARS:
        return "msg_blocks_too_long"
    return None


def _block_texts(node: Any) -> Iterator[str]:
    if isinstance(node, dict):
        for k, v in node.items():
            if k == "text" and isinstance(v, str):
                yield v
            else:
                yield from _block_texts(v)
    elif isinstance(node, list):
        for v in node:
            yield from _block_texts(v)


class _ThreadingServer(ThreadingHTTPServer):
    daemon_threads = True
    allow_reuse_address = True


class SlackServer:
    """A Slack Web API server on 127.0.0.1, started by ``with`` or :meth:`start`.

    ``channels`` are names (``"#ml-infra"`` or ``"ml-infra"``); each gets an id
    (``C0000001``...) that the API returns, as Slack does.  ``token`` is the one
    bot token accepted.
    """

    def __init__(
        self,
        channels: Iterable[str] = ("#whywait",),
        token: str = "xoxb-test",
        *,
        host: str = "127.0.0.1",
        port: int = 0,
        team: str = "whywait-test",
        bot_user: str = "whywait",
    ) -> None:
        self.token = token
        self.host = host
        self.port = port
        self.team = team
        self.bot_user = bot_user
        self._lock = threading.RLock()
        self._channels: dict[str, str] = {}  # id -> name (without '#')
        for name in channels:
            self.add_channel(name)
        self.calls: list[SlackCall] = []
        self.messages: dict[str, SlackMessage] = {}  # ts -> message
        self._last_ts = 0.0
        self._rate_limits: dict[str | None, float] = {}  # channel id (None: all) -> messages per second
        self._last_post: dict[str, float] = {}  # channel id -> monotonic time of last accepted post
        self._forced_429: list[int] = []  # Retry-After seconds of queued forced 429s
        self._outage: OutageMode | None = None
        self._server: _ThreadingServer | None = None
        self._thread: threading.Thread | None = None
        self.files: dict[str, SlackFile] = {}  # file id -> file (files_upload_v2)

    # ---- lifecycle -------------------------------------------------------------------------

    @property
    def url(self) -> str:
        """The base URL for ``WebClient(base_url=...)``, ending in ``/api/``."""
        return f"http://{self.host}:{self.port}/api/"

    def start(self) -> SlackServer:
        """Bind (port 0 picks a free one, then kept across outages) and serve in a thread."""
        server = _ThreadingServer((self.host, self.port), self._handler_class())
        self.port = server.server_address[1]
        self._server = server
        self._thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05},
                                        name=f"slack-server-{self.port}", daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        """Stop serving and close the listening socket."""
        server, self._server = self._server, None
        if server is not None:
            server.shutdown()
            server.server_close()
        if self._thread is not None:
            self._thread.join(timeout=5)
            self._thread = None

    def __enter__(self) -> SlackServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    # ---- switches for tests ----------------------------------------------------------------

    def add_channel(self, name: str) -> str:
        """Create a channel (if new) and return its id."""
        name = name.lstrip("#")
        with self._lock:
            for cid, n in self._channels.items():
                if n == name:
                    return cid
            cid = f"C{len(self._channels) + 1:07d}"
            self._channels[cid] = name
            return cid

    def channel_id(self, channel: str) -> str | None:
        """The id of a channel given by id, ``#name`` or ``name``; None if there is none."""
        with self._lock:
            if channel in self._channels:
                return channel
            name = channel.lstrip("#")
            return next((cid for cid, n in self._channels.items() if n == name), None)

    def rate_limit(self, per_s: float | None = 1.0, channel: str | None = None) -> None:
        """Answer 429 to a post into ``channel`` (None: every channel) arriving sooner than
        ``1/per_s`` after the last accepted one, as Slack does (~1 message/s/channel).
        ``per_s=None`` removes the limit."""
        key = None if channel is None else self.channel_id(channel)
        with self._lock:
            if per_s is None:
                self._rate_limits.pop(key, None)
            else:
                self._rate_limits[key] = per_s

    def force_429(self, count: int = 1, retry_after: int = 1) -> None:
        """Answer the next ``count`` requests (any method) with 429 and ``Retry-After``."""
        with self._lock:
            self._forced_429.extend([retry_after] * count)

    def outage(self, mode: OutageMode | None = "refuse") -> None:
        """Start an outage: ``"refuse"`` closes the port (connection refused), ``"503"``
        answers every request with HTTP 503.  ``None`` ends it (same port as before)."""
        with self._lock:
            previous, self._outage = self._outage, mode
        if previous == "refuse" and mode != "refuse":
            self.start()
        elif mode == "refuse" and previous != "refuse":
            self.stop()

    @contextmanager
    def down(self, mode: OutageMode = "refuse") -> Iterator[None]:
        """``with server.down():`` an outage for the duration of the block."""
        self.outage(mode)
        try:
            yield
        finally:
            self.outage(None)

    # ---- views for assertions --------------------------------------------------------------

    def calls_to(self, method: str, *, ok: bool | None = True) -> list[SlackCall]:
        """Recorded calls of ``method`` (only successful ones unless ``ok`` says otherwise)."""
        with self._lock:
            return [c for c in self.calls if c.method == method and (ok is None or c.ok == ok)]

    def posts(self, channel: str | None = None) -> list[SlackCall]:
        """Successful ``chat.postMessage`` calls, optionally into one channel, in arrival order."""
        cid = None if channel is None else self.channel_id(channel)
        return [c for c in self.calls_to("chat.postMessage") if cid is None or c.channel == cid]

    def roots(self, channel: str | None = None) -> list[SlackMessage]:
        """Top-level messages (not thread replies) as they stand now, oldest first."""
        cid = None if channel is None else self.channel_id(channel)
        with self._lock:
            return [m for m in self.messages.values()
                    if m.thread_ts is None and (cid is None or m.channel == cid)]

    def thread(self, ts: str) -> list[SlackMessage]:
        """Replies in the thread of root message ``ts``, oldest first."""
        with self._lock:
            return [m for m in self.messages.values() if m.thread_ts == ts]

    @staticmethod
    def max_posts_per_window(calls: list[SlackCall], window_s: float = 1.0) -> int:
        """The most calls that arrived within any ``window_s`` (half-open) window."""
        times = sorted(c.time for c in calls)
        best, j = 0, 0
        for i, t in enumerate(times):
            while times[j] <= t - window_s:
                j += 1
            best = max(best, i - j + 1)
        return best

    # ---- the protocol ----------------------------------------------------------------------

    def _next_ts(self) -> str:
        now = max(time.time(), self._last_ts + 1e-6)
        self._last_ts = now
        return f"{now:.6f}"

    def _handle(self, method: str, params: dict[str, Any], auth: str | None) -> tuple[int, dict[str, Any],
                                                                                     dict[str, str]]:
        """Return (HTTP status, JSON body, extra headers) and record the call."""
        now_m, now_w = time.monotonic(), time.time()
        call = SlackCall(method=method, params=params, status=200, ok=False, error=None, time=now_m,
                         wall_time=now_w, auth=auth)
        with self._lock:
            self.calls.append(call)
            status, body, headers = self._dispatch(call, params, auth, now_m)
            call.status, call.ok, call.error = status, bool(body.get("ok")), body.get("error")
        return status, body, headers

    def _dispatch(self, call: SlackCall, params: dict[str, Any], auth: str | None,
                  now: float) -> tuple[int, dict[str, Any], dict[str, str]]:
        if self._outage == "503":
            return 503, {"ok": False, "error": "service_unavailable"}, {}
        if self._forced_429:
            retry_after = self._forced_429.pop(0)
            return 429, {"ok": False, "error": "ratelimited"}, {"Retry-After": str(retry_after)}
        token = auth or params.get("token")
        if not token:
            return 200, {"ok": False, "error": "not_authed"}, {}
        if token != self.token:
            return 200, {"ok": False, "error": "invalid_auth"}, {}

        method = call.method
        if method == "auth.test":
            return 200, {"ok": True, "url": f"https://{self.team}.slack.com/", "team": self.team,
                         "user": self.bot_user, "team_id": "T0000001", "user_id": "U0000001",
                         "bot_id": "B0000001", "is_enterprise_install": False}, {}
        if method == "conversations.list":
            # paged as Slack pages it: ``limit`` channels a call, an opaque ``next_cursor`` until the last page
            chans = [{"id": cid, "name": n, "is_channel": True, "is_member": True, "is_archived": False}
                     for cid, n in self._channels.items()]
            start = int(params.get("cursor") or 0)
            limit = int(params.get("limit") or 100)
            page = chans[start:start + limit]
            nxt = str(start + limit) if start + limit < len(chans) else ""
            return 200, {"ok": True, "channels": page, "response_metadata": {"next_cursor": nxt}}, {}
        if method in ("chat.postMessage", "chat.update", "conversations.replies"):
            return self._chat(call, params, now)
        if method in ("files.getUploadURLExternal", "files.completeUploadExternal"):
            return self._files(call, params, now)
        return 200, {"ok": False, "error": "unknown_method"}, {}

    def _files(self, call: SlackCall, params: dict[str, Any], now: float) -> tuple[int, dict[str, Any],
                                                                                  dict[str, str]]:
        """The API steps of ``files_upload_v2`` (the upload itself is :meth:`_upload`)."""
        if call.method == "files.getUploadURLExternal":
            try:
                length = int(params.get("length", ""))
            except ValueError:
                return 200, {"ok": False, "error": "invalid_arguments"}, {}
            if not params.get("filename"):
                return 200, {"ok": False, "error": "invalid_arguments"}, {}
            fid = f"F{len(self.files) + 1:07d}"
            self.files[fid] = SlackFile(fid, str(params["filename"]), length)
            return 200, {"ok": True, "upload_url": f"http://{self.host}:{self.port}/upload/{fid}",
                         "file_id": fid}, {}
        try:
            items = params.get("files")
            items = json.loads(items) if isinstance(items, str) else items
        except json.JSONDecodeError:
            return 200, {"ok": False, "error": "invalid_arguments"}, {}
        if not isinstance(items, list) or not items:
            return 200, {"ok": False, "error": "invalid_arguments"}, {}
        files = [self.files.get(str(i.get("id"))) for i in items if isinstance(i, dict)]
        if any(f is None or f.content is None for f in files) or len(files) != len(items):
            return 200, {"ok": False, "error": "file_not_found"}, {}
        channel = params.get("channel_id") or params.get("channels")
        cid = self.channel_id(str(channel)) if channel else None
        if channel and cid is None:
            return 200, {"ok": False, "error": "channel_not_found"}, {}
        thread_ts = str(params["thread_ts"]) if params.get("thread_ts") else None
        if thread_ts is not None:
            parent = self.messages.get(thread_ts)
            if parent is None or parent.channel != cid:
                return 200, {"ok": False, "error": "invalid_thread_ts"}, {}
        for f, item in zip(files, items, strict=True):
            assert f is not None
            f.title, f.channel, f.thread_ts = item.get("title") or f.filename, cid, thread_ts
        if cid is not None:  # sharing posts a message carrying the files (and the initial comment)
            ts = self._next_ts()
            text = str(params.get("initial_comment") or "")
            self.messages[ts] = SlackMessage(channel=cid, ts=ts, text=text, blocks=None, thread_ts=thread_ts,
                                             posted_at=now, files=[f.id for f in files if f is not None])
            call.channel, call.ts, call.thread_ts, call.text = cid, ts, thread_ts, text
        return 200, {"ok": True, "files": [{"id": f.id, "title": f.title, "name": f.filename}
                                           for f in files if f is not None]}, {}

    def _upload(self, fid: str, raw: bytes) -> tuple[int, dict[str, Any]]:
        """Step 2 of ``files_upload_v2``: the file's bytes POSTed to the URL this server handed out."""
        with self._lock:
            f = self.files.get(fid)
            if f is None:
                return 404, {"ok": False, "error": "file_not_found"}
            if len(raw) != f.length:
                return 400, {"ok": False, "error": "length_mismatch"}
            f.content = raw
            return 200, {"ok": True}

    def _chat(self, call: SlackCall, params: dict[str, Any], now: float) -> tuple[int, dict[str, Any],
                                                                                 dict[str, str]]:
        method = call.method
        channel = params.get("channel")
        if not channel:
            return 200, {"ok": False, "error": "channel_not_found"}, {}
        cid = self.channel_id(str(channel))
        if cid is None:
            return 200, {"ok": False, "error": "channel_not_found"}, {}
        call.channel = cid
        blocks = params.get("blocks")
        if isinstance(blocks, str):
            try:
                blocks = json.loads(blocks)
            except json.JSONDecodeError:
                return 200, {"ok": False, "error": "invalid_blocks_format"}, {}
        if blocks is not None and not isinstance(blocks, list):
            return 200, {"ok": False, "error": "invalid_blocks_format"}, {}
        if blocks:
            refused = _block_limits(blocks)
            if refused:
                return 200, {"ok": False, "error": refused}, {}
        text = params.get("text")
        call.text, call.blocks = text, blocks

        if method == "conversations.replies":
            ts = str(params.get("ts", ""))
            root = self.messages.get(ts)
            if root is None or root.channel != cid:
                return 200, {"ok": False, "error": "thread_not_found"}, {}
            msgs = [root, *self.thread(ts)]
            return 200, {"ok": True, "messages": [self._as_json(m) for m in msgs], "has_more": False}, {}

        if method == "chat.postMessage":
            if not text and not blocks:
                return 200, {"ok": False, "error": "no_text"}, {}
            limit = self._rate_limits.get(cid, self._rate_limits.get(None))
            if limit is not None:
                last = self._last_post.get(cid)
                gap = 1.0 / limit
                if last is not None and now - last < gap:
                    return 429, {"ok": False, "error": "ratelimited"}, {"Retry-After": str(max(1, round(gap)))}
            thread_ts = params.get("thread_ts") or None
            if thread_ts is not None:
                thread_ts = str(thread_ts)
                parent = self.messages.get(thread_ts)
                if parent is None or parent.channel != cid:
                    return 200, {"ok": False, "error": "thread_not_found"}, {}
                if parent.thread_ts is not None:  # replying to a reply lands in the same thread
                    thread_ts = parent.thread_ts
            ts = self._next_ts()
            msg = SlackMessage(channel=cid, ts=ts, text=text or "", blocks=blocks, thread_ts=thread_ts,
                               posted_at=now)
            self.messages[ts] = msg
            self._last_post[cid] = now
            call.ts, call.thread_ts = ts, thread_ts
            return 200, {"ok": True, "channel": cid, "ts": ts, "message": self._as_json(msg)}, {}

        # chat.update
        ts = str(params.get("ts", ""))
        call.ts = ts
        old = self.messages.get(ts)
        if old is None or old.channel != cid:
            return 200, {"ok": False, "error": "message_not_found"}, {}
        if not text and not blocks:
            return 200, {"ok": False, "error": "no_text"}, {}
        old.edits.append({"text": old.text, "blocks": old.blocks})
        old.text = text if text is not None else old.text
        old.blocks = blocks if blocks is not None else old.blocks
        call.thread_ts = old.thread_ts
        return 200, {"ok": True, "channel": cid, "ts": ts, "text": old.text, "message": self._as_json(old)}, {}

    @staticmethod
    def _as_json(m: SlackMessage) -> dict[str, Any]:
        d: dict[str, Any] = {"type": "message", "user": "U0000001", "bot_id": "B0000001", "ts": m.ts,
                             "text": m.text}
        if m.blocks is not None:
            d["blocks"] = m.blocks
        if m.thread_ts is not None:
            d["thread_ts"] = m.thread_ts
        if m.edits:
            d["edited"] = {"user": "U0000001", "ts": m.ts}
        return d

    def _handler_class(self) -> type[BaseHTTPRequestHandler]:
        server = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 - quiet
                pass

            def _serve(self) -> None:
                parts = urlsplit(self.path)
                length = int(self.headers.get("Content-Length") or 0)
                raw = self.rfile.read(length) if length else b""
                if parts.path.startswith("/upload/"):
                    status, body = server._upload(parts.path[len("/upload/"):], raw)
                    self._reply(status, body, {})
                    return
                if not parts.path.startswith("/api/"):
                    self._reply(404, {"ok": False, "error": "not_found"}, {})
                    return
                method = parts.path[len("/api/"):]
                params: dict[str, Any] = dict(parse_qsl(parts.query))
                try:
                    params.update(_parse_body(self.headers.get("Content-Type", ""), raw))
                except ValueError:
                    self._reply(200, {"ok": False, "error": "invalid_json"}, {})
                    return
                authz = self.headers.get("Authorization", "")
                auth = authz[len("Bearer "):] if authz.startswith("Bearer ") else None
                status, body, headers = server._handle(method, params, auth)
                self._reply(status, body, headers)

            def _reply(self, status: int, body: dict[str, Any], headers: dict[str, str]) -> None:
                data = json.dumps(body).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json; charset=utf-8")
                self.send_header("Content-Length", str(len(data)))
                for k, v in headers.items():
                    self.send_header(k, v)
                self.end_headers()
                self.wfile.write(data)

            do_POST = _serve
            do_GET = _serve

        return Handler


def _parse_body(content_type: str, raw: bytes) -> dict[str, Any]:
    """Decode a JSON, form-encoded or multipart request body into a dict."""
    if not raw:
        return {}
    ctype = content_type.split(";")[0].strip().lower()
    if ctype == "application/json":
        try:
            body = json.loads(raw.decode("utf-8"))
        except (UnicodeDecodeError, json.JSONDecodeError) as exc:
            raise ValueError("invalid_json") from exc
        if not isinstance(body, dict):
            raise ValueError("invalid_json")
        return body
    if ctype == "multipart/form-data":
        msg = email.parser.BytesParser(policy=email.policy.HTTP).parsebytes(
            b"Content-Type: " + content_type.encode() + b"\r\n\r\n" + raw)
        out: dict[str, Any] = {}
        for part in msg.iter_parts():
            name = part.get_param("name", header="content-disposition")
            if name:
                payload = part.get_payload(decode=True)
                out[str(name)] = payload.decode("utf-8", "replace") if isinstance(payload, bytes) else ""
        return out
    return dict(parse_qsl(raw.decode("utf-8"), keep_blank_values=True))
