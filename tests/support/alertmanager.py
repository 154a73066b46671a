"""A real Prometheus Alertmanager for tests: built once from its Go module, cached, started per test.

:func:`alertmanager_binary` returns the cached binary
(``$WHYWAIT_CACHE/alertmanager/v0.28.1/alertmanager``, ``~/.cache/whywait/...`` by
default, like the Kafka jars), building it first when it is missing::

    GOFLAGS=-mod=mod GOBIN=<tmp> go install github.com/prometheus/alertmanager/cmd/alertmanager@v0.28.1

(about a minute with a cold module cache; v0.35.0 does not build from the module,
its UI assets are not in it).  Concurrent test processes build it once (a file lock).
Without Go the caller skips with :data:`NO_GO`; a build that fails is an error.

:class:`Alertmanager` runs it on a free loopback port with clustering off and a
config whose one receiver is a webhook to a :class:`NotificationSink` in the test, so
a test can see both what the API holds (``GET /api/v2/alerts``) and what Alertmanager
itself notified (firing, then resolved)::

    with NotificationSink() as sink, Alertmanager(sink.url, workdir=tmp_path) as am:
        ...; am.alerts(); sink.wait_for(lambda n: n["status"] == "resolved")
"""

from __future__ import annotations

import json
import socket
import subprocess
import threading
import time
import urllib.parse
import urllib.request
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any, Callable

from tests.support import gobuild

VERSION = "v0.28.1"
MODULE = "github.com/prometheus/alertmanager/cmd/alertmanager"
NO_GO = "Go is not installed (needed once to build Alertmanager " + VERSION + " for the receiver tests)"


go_available = gobuild.go_available  # the tests' skip condition


def cache_dir() -> Path:
    """Where the binary is kept: ``$WHYWAIT_CACHE/alertmanager/VERSION`` (``~/.cache/whywait`` by default)."""
    return gobuild.cache_dir("alertmanager", VERSION)


def alertmanager_binary(*, timeout: float = 900.0) -> Path:
    """The cached Alertmanager binary, built now if missing (:func:`tests.support.gobuild.go_install`)."""
    return gobuild.go_install(MODULE, VERSION, "alertmanager", timeout=timeout, no_go=NO_GO)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class NotificationSink:
    """A loopback HTTP server collecting Alertmanager's webhook notifications (JSON bodies)."""

    def __init__(self) -> None:
        self.notifications: list[dict[str, Any]] = []
        self._cond = threading.Condition()
        sink = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 - quiet
                pass

            def do_POST(self) -> None:  # noqa: N802 - http.server's naming
                body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
                with sink._cond:
                    sink.notifications.append(json.loads(body))
                    sink._cond.notify_all()
                self.send_response(200)
                self.send_header("Content-Length", "0")
                self.end_headers()

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._server.daemon_threads = True
        self.url = f"http://127.0.0.1:{self._server.server_address[1]}/hook"
        self._thread = threading.Thread(target=self._server.serve_forever, kwargs={"poll_interval": 0.1},
                                        daemon=True)

    def wait_for(self, pred: Callable[[dict[str, Any]], bool], timeout: float = 20.0) -> dict[str, Any]:
        """The first notification matching ``pred``, waiting up to ``timeout`` seconds for it."""
        deadline = time.monotonic() + timeout
        with self._cond:
            while True:
                for n in self.notifications:
                    if pred(n):
                        return n
                left = deadline - time.monotonic()
                if left <= 0:
                    raise AssertionError(f"no matching Alertmanager notification within {timeout}s; "
                                         f"got {json.dumps(self.notifications)[:2000]}")
                self._cond.wait(left)

    def __enter__(self) -> NotificationSink:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._server.shutdown()
        self._server.server_close()


CONFIG = """\
global:
  resolve_timeout: 5m
route:
  receiver: sink
  group_by: [alertname, job]
  group_wait: 0s
  group_interval: 1s
  repeat_interval: 1h
receivers:
  - name: sink
    webhook_configs:
      - url: {url}
        send_resolved: true
"""


class Alertmanager:
    """One Alertmanager process on a free port, notifying ``webhook_url``; a context manager."""

    def __init__(self, webhook_url: str, *, workdir: Path) -> None:
        self.binary = alertmanager_binary()
        self.workdir = Path(workdir)
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self._webhook_url = webhook_url
        self._proc: subprocess.Popen[bytes] | None = None

    def start(self, timeout: float = 30.0) -> Alertmanager:
        self.workdir.mkdir(parents=True, exist_ok=True)
        config = self.workdir / "alertmanager.yml"
        config.write_text(CONFIG.format(url=self._webhook_url))
        log = open(self.workdir / "alertmanager.log", "wb")  # noqa: SIM115 - the process holds it
        self._proc = subprocess.Popen(
            [str(self.binary), f"--config.file={config}", f"--storage.path={self.workdir / 'data'}",
             f"--web.listen-address=127.0.0.1:{self.port}", "--cluster.listen-address=", "--log.level=warn"],
            stdout=log, stderr=subprocess.STDOUT)
        log.close()
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self._proc.poll() is not None:
                raise RuntimeError(f"Alertmanager exited ({self._proc.returncode}): "
                                   + (self.workdir / "alertmanager.log").read_text()[-2000:])
            try:
                with urllib.request.urlopen(f"{self.url}/-/ready", timeout=1) as r:
                    if r.status == 200:
                        return self
            except OSError:
                time.sleep(0.1)
        self.stop()
        raise RuntimeError(f"Alertmanager not ready on {self.url} within {timeout}s")

    def alerts(self, **filters: str) -> list[dict[str, Any]]:
        """``GET /api/v2/alerts`` (active alerts; resolved ones are no longer listed)."""
        matchers = [urllib.parse.quote(k + '="' + v + '"') for k, v in filters.items()]
        q = "&".join("filter=" + m for m in matchers)
        with urllib.request.urlopen(f"{self.url}/api/v2/alerts" + (f"?{q}" if q else ""), timeout=5) as r:
            out: list[dict[str, Any]] = json.loads(r.read())
            return out

    def wait_alerts(self, pred: Callable[[list[dict[str, Any]]], bool], timeout: float = 15.0) -> list[dict[str, Any]]:
        """Poll :meth:`alerts` until ``pred`` holds; the alerts then (an AssertionError after ``timeout``)."""
        deadline = time.monotonic() + timeout
        while True:
            got = self.alerts()
            if pred(got):
                return got
            if time.monotonic() > deadline:
                raise AssertionError(f"Alertmanager's alerts never matched within {timeout}s: {got}")
            time.sleep(0.2)

    def stop(self) -> None:
        if self._proc is not None and self._proc.poll() is None:
            self._proc.terminate()
            try:
                self._proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self._proc.kill()
                self._proc.wait()
        self._proc = None

    def __enter__(self) -> Alertmanager:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
