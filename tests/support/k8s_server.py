"""A local HTTP server that replays a recorded Kubernetes pod list and watch stream.

The official ``kubernetes`` client is pointed at it (``Configuration.host``) and talks to it
as to an API server: ``GET /api/v1/pods`` answers the recorded ``PodList``;
``GET /api/v1/pods?watch=true&resourceVersion=N`` streams the recorded ``WatchEvent`` lines
newer than N, one JSON object a line, then closes (as a server does when
``timeoutSeconds`` passes).  Requests are recorded in :attr:`K8sReplayServer.requests`.
"""

from __future__ import annotations

import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, urlparse


class K8sReplayServer:
    """Serve ``list_file`` and ``watch_file``; use as a context manager, ``url`` is the API server."""

    def __init__(self, list_file: Path, watch_file: Path) -> None:
        self.pod_list = json.loads(Path(list_file).read_text())
        self.events = [json.loads(line) for line in Path(watch_file).read_text().splitlines() if line.strip()]
        self.requests: list[str] = []
        server = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.0"  # a close-delimited body, as a streamed watch ends

            def log_message(self, *args: Any) -> None:
                pass

            def do_GET(self) -> None:  # noqa: N802 - http.server's name
                url = urlparse(self.path)
                q = parse_qs(url.query)
                server.requests.append(self.path)
                if url.path != "/api/v1/pods":
                    self.send_response(404)
                    self.end_headers()
                    return
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.end_headers()
                if q.get("watch", ["false"])[0].lower() in ("true", "1"):
                    since = int(q.get("resourceVersion", ["0"])[0] or 0)
                    for ev in server.events:
                        if int(ev["object"]["metadata"]["resourceVersion"]) > since:
                            self.wfile.write(json.dumps(ev).encode() + b"\n")
                            self.wfile.flush()
                else:
                    self.wfile.write(json.dumps(server.pod_list).encode())

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}"
        self._thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)

    def __enter__(self) -> K8sReplayServer:
        self._thread.start()
        return self

    def __exit__(self, *exc: Any) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()
