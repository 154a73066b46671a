"""Benchmark: the notification pipeline's delivery rate and latency, and what a hanging receiver costs the others.

Three figures, each through real parts (a local HTTP endpoint for the webhook, the real
Alertmanager v0.28.1 from ``tests/support/alertmanager.py`` when Go or the cached binary
is there):

1. ``--incidents`` distinct incidents (one job each) notified at once, ``group_wait`` 0:
   wall time until every receiver took them all, and deliveries per second per receiver;
2. latency from ``notify()`` to the alert being listed by Alertmanager's ``GET /api/v2/alerts``
   (median and max of ``--probes`` incidents, one at a time);
3. the same burst to the webhook alone, and with a second receiver that accepts connections but
   never answers (a hung sink, 5 s timeout): the webhook's time must not grow.

Not a timed test::

    .venv/bin/python benchmarks/notify_bench.py [--incidents 500] [--probes 20]
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import socket
import statistics
import sys
import tempfile
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from whywait.engine.diagnosis import Diagnosis, Evidence, Owner  # noqa: E402
from whywait.engine.notify.pipeline import Pipeline, PipelineConfig  # noqa: E402
from whywait.engine.notify.pipeline.receiver import Receiver  # noqa: E402
from whywait.engine.notify.receivers.alertmanager import AlertmanagerReceiver  # noqa: E402
from whywait.engine.notify.receivers.webhook import WebhookReceiver  # noqa: E402

CFG = PipelineConfig(group_wait=0.0, group_interval=60.0, retry_backoff=(0.05, 0.5))


def diagnosis(i: int) -> Diagnosis:
    now = time.time()
    return Diagnosis(
        rule_id="network.straggler-retransmits", fingerprint=f"bench|job=job-{i}|node=node-{i % 64:02d}",
        status="firing", severity="warning", title=f"job-{i} waits on node-{i % 64:02d}: packet loss",
        cause="node drops packets", job=f"job-{i}", owner=Owner("llm", "ml-platform", "#ml-platform"),
        starts_at=now - 60, detected_at=now, labels={"job": f"job-{i}", "node": f"node-{i % 64:02d}",
                                                     "cause": "network.packet-loss"},
        evidence=(Evidence("net.tcp_retrans_segs_per_s", f"node-{i % 64:02d}", 900.0, "/s", 0.7),),
        culprit=f"node-{i % 64:02d}", ranks=(i % 8,))


class Sink:
    """A loopback endpoint answering 200 to every POST."""

    def __init__(self) -> None:
        class Handler(BaseHTTPRequestHandler):
            def log_message(self, format: str, *args: Any) -> None:  # noqa: A002
                pass

            def do_POST(self) -> None:  # noqa: N802
                self.rfile.read(int(self.headers.get("Content-Length") or 0))
                self.send_response(200)
                self.send_header("Content-Length", "0")
                self.end_headers()

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/hook"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()


def hung_endpoint() -> str:
    """A port that accepts connections and never answers."""
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    s.listen(1000)
    hung_endpoint.keep = s  # type: ignore[attr-defined]
    return f"http://127.0.0.1:{s.getsockname()[1]}/hook"


def burst(receivers: list[Receiver], n: int, timeout: float = 300.0) -> tuple[float, dict[str, Any]]:
    """Notify ``n`` incidents at once; seconds until the named receivers took them all, and the stats."""
    with tempfile.TemporaryDirectory() as tmp:
        p = Pipeline(receivers, dataclasses.replace(CFG, outbox_dir=Path(tmp) / "outbox"))
        t0 = time.monotonic()
        for i in range(n):
            p.notify(diagnosis(i))
        watched = [r.name for r in receivers if not r.name.startswith("hung")]
        while time.monotonic() - t0 < timeout:
            s = p.stats()["receivers"]
            if all(s[name]["posted"] >= n for name in watched):
                break
            time.sleep(0.01)
        took = time.monotonic() - t0
        stats = p.stats()
        p.close(timeout=0.5)
        return took, stats


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--incidents", type=int, default=500)
    ap.add_argument("--probes", type=int, default=20)
    args = ap.parse_args()
    sink = Sink()

    am = None
    try:
        from tests.support.alertmanager import Alertmanager, NotificationSink, alertmanager_binary

        alertmanager_binary()
        nsink = NotificationSink().__enter__()
        am = Alertmanager(nsink.url, workdir=Path(tempfile.mkdtemp(prefix="am-bench-"))).start()
    except (FileNotFoundError, RuntimeError) as exc:
        print(f"(no Alertmanager: {exc}; its figures are left out)")

    receivers: list[Receiver] = [WebhookReceiver(sink.url)]
    if am is not None:
        receivers.append(AlertmanagerReceiver(am.url))
    took, stats = burst(receivers, args.incidents)
    for name, s in stats["receivers"].items():
        print(f"burst of {args.incidents} incidents → {name}: all taken in {took:.2f} s "
              f"({s['posted'] / took:,.0f} deliveries/s), failed {s['failed']}, retried {s['retried']}")

    if am is not None:
        lat = []
        with Pipeline([AlertmanagerReceiver(am.url)], CFG) as p:
            for i in range(args.probes):
                d = diagnosis(100_000 + i)
                t0 = time.monotonic()
                p.notify(d)
                while not any(a["labels"].get("job") == d.job for a in am.alerts(job=d.job or "")):
                    time.sleep(0.002)
                lat.append((time.monotonic() - t0) * 1000)
        print(f"notify() → listed by Alertmanager: median {statistics.median(lat):.0f} ms, "
              f"max {max(lat):.0f} ms over {args.probes} incidents")
        am.stop()

    class Hung(WebhookReceiver):
        name = "hung"  # type: ignore[assignment]

    alone, _ = burst([WebhookReceiver(sink.url)], args.incidents)
    beside, s = burst([WebhookReceiver(sink.url), Hung(hung_endpoint(), timeout=5.0)], args.incidents)
    print(f"webhook alone: {alone:.2f} s; beside a hung receiver: {beside:.2f} s "
          f"(the hung one: {s['receivers']['hung']['posted']} taken, {s['receivers']['hung']['waiting']} waiting)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
