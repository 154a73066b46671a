"""Benchmark: the node agent's CPU share and peak memory with every collector at 1 s.

Runs ``python -m whywait.agents.cli`` in a subprocess for ``--seconds`` (default 70;
the first ``--warmup`` seconds, imports and NVML start-up, are reported apart),
with the gpu, dcgm (a local HTTP server serving a real dcgm-exporter scrape),
network, storage, host and hw collectors (hw with its BMC source polling DMTF's
Redfish mockup from a local HTTP server, and the real ``/dev/kmsg``), the training socket fed by simulated
ranks, and ``--print`` to /dev/null (or ``--bootstrap`` for Kafka, a dead port
exercising the spool).  It reads the agent's ``/proc/<pid>/stat`` (utime+stime)
every second and ``VmHWM`` from ``/proc/<pid>/status`` at the end.

Targets: at most 1% of one core, at most 60 MiB peak RSS.  Not a timed test::

    .venv/bin/python benchmarks/agent_bench.py [--seconds 70] [--bootstrap 127.0.0.1:1]
"""

from __future__ import annotations

import argparse
import http.server
import json
import os
import statistics
import subprocess
import sys
import tempfile
import threading
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SCRAPE = os.path.join(ROOT, "tests", "fixtures", "agents", "dcgm", "dcgm-exporter-L4-kops.prom")
CLK_TCK = os.sysconf("SC_CLK_TCK")


def cpu_ticks(pid: int) -> int:
    with open(f"/proc/{pid}/stat") as fh:
        rest = fh.read().rsplit(")", 1)[1].split()
    return int(rest[11]) + int(rest[12])


def status_kib(pid: int, key: str) -> int:
    with open(f"/proc/{pid}/status") as fh:
        for line in fh:
            if line.startswith(key + ":"):
                return int(line.split()[1])
    return 0


def serve_scrape() -> tuple[http.server.ThreadingHTTPServer, str]:
    body = open(SCRAPE, "rb").read()

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:  # noqa: N802
            self.send_response(200)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args: object) -> None:
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server, f"http://127.0.0.1:{server.server_address[1]}/metrics"


REDFISH = os.path.join(ROOT, "tests", "fixtures", "agents", "redfish", "public-rackmount1")


def serve_redfish() -> tuple[http.server.ThreadingHTTPServer, str]:
    """DMTF's public-rackmount1 mockup as a BMC: ``/redfish/v1/X`` → ``X/index.json``."""

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:  # noqa: N802
            rel = self.path.removeprefix("/redfish/v1").strip("/")
            path = os.path.join(REDFISH, rel, "index.json")
            body = open(path, "rb").read() if os.path.isfile(path) else b""
            self.send_response(200 if body else 404)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args: object) -> None:
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server, f"http://127.0.0.1:{server.server_address[1]}"


def ranks(sock: str, n_ranks: int, steps_per_s: float, stop: threading.Event) -> None:
    sys.path.insert(0, ROOT)
    from whywait.agents.training import Reporter

    reps = [Reporter("bench-job", r, sock=sock) for r in range(n_ranks)]
    n = 0
    while not stop.wait(1.0 / steps_per_s):
        for rep in reps:
            with rep.step(n):
                with rep.compute():
                    pass
        n += 1


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seconds", type=float, default=70.0)
    ap.add_argument("--warmup", type=float, default=5.0)
    ap.add_argument("--ranks", type=int, default=8)
    ap.add_argument("--steps-per-s", type=float, default=2.0)
    ap.add_argument("--bootstrap", default=None, help="publish to Kafka here instead of --print")
    ap.add_argument("--json", action="store_true", help="print the figures as JSON")
    args = ap.parse_args()

    server, url = serve_scrape()
    bmc, bmc_url = serve_redfish()
    tmp = tempfile.mkdtemp(prefix="whywait-bench-")
    env = {**os.environ, "WHYWAIT_BMC_URL": bmc_url, "WHYWAIT_STATE_DIR": tmp}
    sock = os.path.join(tmp, "agent.sock")
    cmd = [sys.executable, "-m", "whywait.agents.cli", "--node", "bench-node", "--interval", "1",
           "--collectors", "gpu,dcgm,network,storage,host,hw", "--dcgm-url", url, "--socket", sock]
    cmd += ["--bootstrap", args.bootstrap, "--spool-dir", os.path.join(tmp, "spool")] if args.bootstrap \
        else ["--print"]
    devnull = open(os.devnull, "w")
    log = open(os.path.join(tmp, "agent.log"), "w")
    proc = subprocess.Popen(cmd, cwd=ROOT, stdout=devnull, stderr=log, env=env)
    stop = threading.Event()
    feeder = threading.Thread(target=ranks, args=(sock, args.ranks, args.steps_per_s, stop), daemon=True)
    try:
        t_start = time.monotonic()
        time.sleep(args.warmup)
        feeder.start()
        startup_ticks = cpu_ticks(proc.pid)
        samples: list[tuple[float, int]] = [(time.monotonic(), startup_ticks)]
        while time.monotonic() - t_start < args.seconds:
            time.sleep(1.0)
            if proc.poll() is not None:
                raise SystemExit(f"agent exited with {proc.returncode}; see {log.name}")
            samples.append((time.monotonic(), cpu_ticks(proc.pid)))
        hwm = status_kib(proc.pid, "VmHWM")
        rss = status_kib(proc.pid, "VmRSS")
    finally:
        stop.set()
        proc.terminate()
        proc.wait(10)
        server.shutdown()
    (t0, c0), (t1, c1) = samples[0], samples[-1]
    steady = 100.0 * (c1 - c0) / CLK_TCK / (t1 - t0)
    # Per-10 s windows: the spread of the CPU share over the run.
    windows = [100.0 * (samples[i + 10][1] - samples[i][1]) / CLK_TCK / (samples[i + 10][0] - samples[i][0])
               for i in range(0, len(samples) - 10, 10)]
    figures = {
        "command": " ".join(cmd[1:]),
        "measured_s": round(t1 - t0, 1),
        "startup_cpu_s": round(startup_ticks / CLK_TCK, 2),
        "cpu_pct_of_one_core": round(steady, 3),
        "cpu_pct_10s_windows": {"median": round(statistics.median(windows), 3), "min": round(min(windows), 3),
                                "max": round(max(windows), 3), "n": len(windows)} if windows else None,
        "peak_rss_mib": round(hwm / 1024, 1),
        "rss_at_end_mib": round(rss / 1024, 1),
        "datagrams_per_s": args.ranks * args.steps_per_s,
        "targets": {"cpu_pct_of_one_core": 1.0, "peak_rss_mib": 60},
    }
    if args.json:
        print(json.dumps(figures, indent=2))
    else:
        for k, v in figures.items():
            print(f"{k:24} {v}")
    ok = steady <= 1.0 and hwm / 1024 <= 60
    print("within targets" if ok else "OVER TARGET", file=sys.stderr)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
