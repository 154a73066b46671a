"""Watching whywait itself: the ``/metrics``, ``/healthz`` and ``/readyz`` server, JSON logs, the agent's metrics.

The server and the log formatter are shared by ``whywait agent`` and ``whywait engine``; they live here, in the
lowest package both may import (the agent must never import the engine).  The engine's own metric definitions are
in :mod:`whywait.engine.observe.metrics`; the agent's are :class:`AgentCollector` below.

Metrics are read from the counters the agent already keeps (publisher ``sent``/``dropped``, collector ``errors``)
when Prometheus scrapes, through a custom collector: nothing is added to the sampling path but one clock read per
collector per round.
"""

from __future__ import annotations

import json
import logging
import os
import socket
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, Callable, Iterable

from prometheus_client import CollectorRegistry, exposition
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector
from whywait.agents.errors import AgentConfigError

METRICS_ADDR_ENV = "WHYWAIT_METRICS_ADDR"


class MetricsAddrError(AgentConfigError):
    """``--metrics-addr`` / ``$WHYWAIT_METRICS_ADDR`` is not ``HOST:PORT``, or the port cannot be bound."""


def parse_addr(raw: str, what: str = "--metrics-addr", bare: str = "0.0.0.0") -> tuple[str, int]:
    """``HOST:PORT`` (``:PORT`` means the host ``bare``, every interface by default; ``[::1]:PORT`` an IPv6
    host) as ``(host, port)``.

    Raises :class:`MetricsAddrError` with a one-line reason naming ``what`` for anything else.
    """
    text = raw.strip()
    host, sep, port = text.rpartition(":")
    if not sep or not port.isdigit() or not 0 <= int(port) <= 65535:
        raise MetricsAddrError(f"{what} must be HOST:PORT like 127.0.0.1:9464 or :9464 (got {raw!r})")
    host = host.strip("[]") or bare
    return host, int(port)


def metrics_addr(flag: str | None) -> tuple[str, int] | None:
    """The address to serve on: ``flag``, else ``$WHYWAIT_METRICS_ADDR``; None when neither is set or it is 'off'."""
    raw = flag if flag is not None else os.environ.get(METRICS_ADDR_ENV)
    if raw is None or raw.strip().lower() in ("", "off", "none"):
        return None
    return parse_addr(raw, "--metrics-addr" if flag is not None else f"${METRICS_ADDR_ENV}")


def check_addr_free(addr: tuple[str, int]) -> None:
    """Raise :class:`MetricsAddrError` now if ``addr`` cannot be bound (a port taken, an address not ours).

    Called by ``whywait engine`` before it connects to Kafka, reads placements and restores state, so a
    taken port is said in a second, not after that work.  It binds as :class:`ObserveServer` will
    (``SO_REUSEADDR``, as ``http.server`` sets it) and lets go; the server binds again when it starts.
    """
    family = socket.AF_INET6 if ":" in addr[0] else socket.AF_INET
    try:
        with socket.socket(family, socket.SOCK_STREAM) as s:
            s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            s.bind(addr)
    except OSError as exc:
        raise MetricsAddrError(f"cannot serve metrics on {addr[0]}:{addr[1]}: {exc.strerror or exc}") from None


Readiness = Callable[[], "str | None"]  # None: ready; else the one-line reason it is not


class ObserveServer:
    """``/metrics`` (the registry, text or OpenMetrics as asked), ``/healthz`` (200 while the process serves) and
    ``/readyz`` (200, or 503 with ``ready()``'s one-line reason) on one port, in a daemon thread.

    Started by the engine and agent commands after their configuration is checked; :attr:`port` is the bound port
    (useful with port 0).  A readiness check that raises answers 503 with the exception, never a traceback.
    """

    def __init__(self, addr: tuple[str, int], registry: CollectorRegistry, ready: Readiness | None = None) -> None:
        self.registry = registry
        self.ready = ready or (lambda: None)
        outer = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:  # noqa: N802 - the name http.server calls
                path = self.path.split("?", 1)[0]
                if path == "/metrics":
                    encoder, ctype = exposition.choose_encoder(self.headers.get("Accept", ""))
                    try:
                        body, status = encoder(outer.registry), 200
                    except Exception as exc:  # noqa: BLE001 - a collector's bug: a 500 naming it, not a traceback
                        body, status = f"metrics failed: {type(exc).__name__}: {exc}\n".encode(), 500
                        ctype = "text/plain; charset=utf-8"
                elif path == "/healthz":
                    body, ctype, status = b"ok\n", "text/plain; charset=utf-8", 200
                elif path == "/readyz":
                    try:
                        why = outer.ready()
                    except Exception as exc:  # noqa: BLE001 - a broken check is "not ready", said in one line
                        why = f"readiness check failed: {type(exc).__name__}: {exc}"
                    body = (f"not ready: {why}\n" if why else "ready\n").encode()
                    ctype, status = "text/plain; charset=utf-8", 503 if why else 200
                else:
                    body, ctype, status = b"not found: try /metrics, /healthz or /readyz\n", "text/plain", 404
                self.send_response(status)
                self.send_header("Content-Type", ctype)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 - scrapes are not log lines
                pass

        try:
            self._httpd = ThreadingHTTPServer(addr, Handler)
        except OSError as exc:
            raise MetricsAddrError(f"cannot serve metrics on {addr[0]}:{addr[1]}: {exc.strerror or exc}") from None
        self._httpd.daemon_threads = True
        self.host, self.port = self._httpd.server_address[:2]
        self._thread = threading.Thread(target=self._httpd.serve_forever, name="whywait-metrics", daemon=True)

    def start(self) -> ObserveServer:
        """Serve in the background; returns self."""
        self._thread.start()
        logging.getLogger("whywait.observe").info("metrics and health on http://%s:%d/metrics (/healthz, /readyz)",
                                                  self.host, self.port)
        return self

    def stop(self) -> None:
        """Stop serving and close the socket (called when the command ends)."""
        if self._thread.is_alive():  # shutdown() waits for serve_forever: never call it on a server not started
            self._httpd.shutdown()
        self._httpd.server_close()


# ---- JSON logs ------------------------------------------------------------------------------------------------

# Attributes every LogRecord has: anything else on a record was passed as ``extra=`` and is written as a field.
_STD_ATTRS = frozenset(vars(logging.LogRecord("", 0, "", 0, "", (), None))) | {"message", "asctime", "taskName"}


class JsonFormatter(logging.Formatter):
    """One JSON object per line: ``time`` (RFC 3339, UTC), ``level``, ``logger``, ``message``, the ``extra=``
    fields of the call, and ``exc`` (the traceback as text) when one is logged.  Set by ``--log-format json``."""

    def format(self, record: logging.LogRecord) -> str:
        out: dict[str, Any] = {
            "time": time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(record.created)) + f".{int(record.msecs):03d}Z",
            "level": record.levelname.lower(), "logger": record.name, "message": record.getMessage()}
        for k, v in vars(record).items():
            if k not in _STD_ATTRS and not k.startswith("_"):
                out[k] = v
        if record.exc_info:
            out["exc"] = self.formatException(record.exc_info)
        return json.dumps(out, default=str, ensure_ascii=False)


LOG_FORMATS = ("text", "json")
TEXT_FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"


def configure_logging(level: int, fmt: str = "text") -> None:
    """Set the root handler to ``fmt`` (``text`` or ``json``) at ``level``; called once by the CLI."""
    handler = logging.StreamHandler()
    handler.setFormatter(JsonFormatter() if fmt == "json" else logging.Formatter(TEXT_FORMAT))
    root = logging.getLogger()
    for h in list(root.handlers):
        root.removeHandler(h)
    root.addHandler(handler)
    root.setLevel(level)


# ---- the agent's metrics ------------------------------------------------------------------------------------


class AgentCollector(Collector):
    """The agent's metrics, read from the agent when scraped.

    ``whywait_agent_collector_runs_total``, ``..._collector_seconds_total`` and ``..._collector_errors_total`` per
    collector; ``whywait_agent_messages_published_total`` and ``..._messages_failed_total{reason}`` (dropped past
    the buffer bound, or invalid against the contract); ``whywait_agent_buffered_messages`` (in memory and in the
    on-disk spool, waiting for Kafka); ``whywait_agent_collector_off`` (1 for a collector turned off, or whose only
    source cannot be read: a dcgm-exporter that does not answer); ``whywait_agent_training_datagrams_total{outcome}``
    (``received``, and the ``malformed``, ``rejected`` and ``dropped`` that were not published);
    ``whywait_agent_training_socket_up`` (when a training socket is configured: 0 when it could not be bound).
    """

    def __init__(self, agent: Any) -> None:
        self.agent = agent

    def collect(self) -> Iterable[Metric]:
        a = self.agent
        runs = CounterMetricFamily("whywait_agent_collector_runs", "Samples taken, per collector.",
                                   labels=["collector"])
        secs = CounterMetricFamily("whywait_agent_collector_seconds", "Time spent sampling, per collector.",
                                   labels=["collector"])
        errs = CounterMetricFamily("whywait_agent_collector_errors", "Failed reads and malformed lines skipped, "
                                   "per collector.", labels=["collector"])
        off = GaugeMetricFamily("whywait_agent_collector_off", "1 when the collector is turned off on this host.",
                                labels=["collector"])
        timing = dict(getattr(a, "collector_time", {}))
        for c in list(a.collectors):
            n, s = timing.get(c.name, (0, 0.0))
            runs.add_metric([c.name], n)
            secs.add_metric([c.name], s)
            errs.add_metric([c.name], c.errors)
            off.add_metric([c.name], 1 if getattr(c, "down", c.off_reason) else 0)
        p = a.publisher
        pub = CounterMetricFamily("whywait_agent_messages_published", "Messages handed to Kafka (or printed).")
        pub.add_metric([], p.sent)
        failed = CounterMetricFamily("whywait_agent_messages_failed", "Messages not published, by reason.",
                                     labels=["reason"])
        failed.add_metric(["dropped"], p.dropped_total)
        failed.add_metric(["invalid"], p.invalid)
        pending = getattr(p, "_pending", None)
        buf = GaugeMetricFamily("whywait_agent_buffered_messages", "Messages waiting for Kafka (memory and spool).")
        buf.add_metric([], pending() if callable(pending) else p.spooled)
        spool = GaugeMetricFamily("whywait_agent_spooled_messages", "Messages waiting in the on-disk spool.")
        spool.add_metric([], p.spooled)
        yield from (runs, secs, errs, off, pub, failed, buf, spool)
        inbox = getattr(a, "inbox", None)
        if inbox is not None:
            grams = CounterMetricFamily("whywait_agent_training_datagrams", "Training datagrams on the socket, "
                                        "by outcome (received counts all; the others were not published).",
                                        labels=["outcome"])
            for outcome in ("received", "malformed", "rejected", "dropped"):
                grams.add_metric([outcome], getattr(inbox, outcome, 0))
            yield grams
        if getattr(a, "socket_path", None):
            sock = GaugeMetricFamily("whywait_agent_training_socket_up", "1 while the training socket listens; 0 "
                                     "when it could not be bound (no step timings from this node).")
            sock.add_metric([], 1 if getattr(a, "_sock", None) is not None else 0)
            yield sock


def agent_registry(agent: Any) -> CollectorRegistry:
    """A registry holding the agent's metrics (called once by ``whywait agent --metrics-addr``)."""
    reg = CollectorRegistry()
    reg.register(AgentCollector(agent))
    return reg
