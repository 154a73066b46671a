"""``whywait agent``: run the node agent.

::

    whywait agent --node gpu-node-07 --bootstrap kafka:9092
    whywait agent --once --print              # one round as JSON lines, no Kafka needed
    whywait agent --dcgm-url http://localhost:9400/metrics --collectors dcgm,network,storage,host

The Kafka bootstrap comes from ``--bootstrap`` or ``$WHYWAIT_KAFKA_BOOTSTRAP``.
This module imports neither the engine nor faust: the node agent stays small.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import math
import os
import signal
import socket
import sys
import time
from typing import Any

from whywait.agents.collectors import COLLECTORS, AgentConfigError, AgentError, Collector, collector_class
from whywait.agents.collectors.dcgm import DcgmCollector, check_url
from whywait.agents.collectors.gpu import NvmlCollector
from whywait.agents.collectors.hardware import STATE_ENV, HardwareCollector, state_dir
from whywait.agents.training import DEFAULT_SOCKET, SOCKET_ENV

from whywait.errors import EXIT_INTERRUPTED

BOOTSTRAP_ENV = "WHYWAIT_KAFKA_BOOTSTRAP"
DEFAULT_COLLECTORS = "gpu,network,storage,host,hw"
MIN_INTERVAL_S = 0.05  # below it the fixed schedule runs rounds back to back: a busy loop

log = logging.getLogger("whywait.agent")


def register(parser: argparse.ArgumentParser) -> None:
    """Add ``whywait agent``'s arguments to ``parser``."""
    parser.add_argument("--node", default=socket.gethostname(), help="node id (default: the host name)")
    parser.add_argument("--interval", type=float, default=1.0, help="seconds between samples (default 1)")
    parser.add_argument("--collectors", default=None,
                        help=f"comma-separated, from {', '.join(COLLECTORS)} (default {DEFAULT_COLLECTORS}; "
                             "with --dcgm-url, dcgm replaces gpu)")
    parser.add_argument("--dcgm-url", default=None, help="a dcgm-exporter /metrics URL to read GPUs from")
    parser.add_argument("--root", default="/", help="prefix for /proc and /sys (a host mounted into a container)")
    parser.add_argument("--pid", type=int, action="append", default=[],
                        help="a training process whose data-loader children to watch (repeatable)")
    parser.add_argument("--socket", default=None,
                        help=f"training-timings socket (default ${SOCKET_ENV} or {DEFAULT_SOCKET}; "
                             "'none' to disable; with --print or --once, only this flag opens one)")
    parser.add_argument("--socket-group", default=os.environ.get("WHYWAIT_AGENT_SOCKET_GROUP"),
                        help="group allowed to send training timings (the socket is mode 0660; default "
                             "$WHYWAIT_AGENT_SOCKET_GROUP, else 'whywait' if it exists, else the agent's group)")
    parser.add_argument("--bootstrap", default=None, help=f"Kafka bootstrap servers (default ${BOOTSTRAP_ENV})")
    parser.add_argument("--state-dir", default=None,
                        help=f"the agent's one folder on disk: the kernel log's place, and the spool unless "
                             f"--spool-dir (default ${STATE_ENV}, else /var/lib/whywait when writable, "
                             "else ~/.cache/whywait)")
    parser.add_argument("--spool-dir", default=None, help="on-disk spool for an unreachable Kafka "
                                                          "(default <state dir>/spool)")
    parser.add_argument("--spool-max-mb", type=float, default=64.0, help="spool bound in MiB (default 64)")
    parser.add_argument("--once", action="store_true", help="sample one interval, publish or print it, exit")
    parser.add_argument("--print", dest="print_", action="store_true",
                        help="print messages as JSON lines instead of publishing to Kafka")
    parser.add_argument("--rounds", type=int, default=None, help="stop after this many intervals")
    parser.add_argument("--metrics-addr", default=None, metavar="HOST:PORT",
                        help="serve Prometheus /metrics, /healthz and /readyz here "
                             "(default: $WHYWAIT_METRICS_ADDR, else off)")


def build_collectors(names: list[str], root: str = "/", dcgm_url: str | None = None,
                     pids: list[int] | None = None, node: str | None = None,
                     state: str | None = None, look: bool = False) -> list[Collector]:
    """Instantiate the named collectors; GPU bus ids from NVML feed the network collector's locality.

    ``state`` is the agent's state folder (``--state-dir``): the ``hw`` collector keeps the kernel log's
    place in it; None takes :func:`whywait.agents.collectors.hardware.state_dir`'s default.  ``look``
    (``--once --print``): the kernel log is read from that place, but the place is not moved, so the
    records a stopped agent has not published yet are still its own when it starts again.
    """
    out: list[Collector] = []
    gpu_bus_ids: list[str] | None = None
    gpu: NvmlCollector | None = None
    for name in names:
        cls = collector_class(name)
        if cls is NvmlCollector:
            gpu = NvmlCollector(root)
            c: Collector = gpu
            if c.enabled:
                gpu_bus_ids = [b for b in c.bus_ids if b]  # type: ignore[attr-defined]
        elif cls is HardwareCollector:
            # The GPU collector (built first) times NVML per GPU; the hw message publishes that health.
            c = HardwareCollector(root, gpu=gpu, gpu_bus_ids=gpu_bus_ids,
                                  state_path=os.path.join(state, "kmsg.state") if state else None,
                                  keep_place=not look)
        elif cls is DcgmCollector:
            if not dcgm_url:
                raise AgentConfigError("collector 'dcgm' needs --dcgm-url (the dcgm-exporter's /metrics URL)")
            c = DcgmCollector(check_url(dcgm_url), root=root)
        elif name == "network":
            c = cls(root, gpu_bus_ids=gpu_bus_ids)  # type: ignore[call-arg]
        elif name == "host":
            c = cls(root, pids=pids or [])  # type: ignore[call-arg]
        else:
            c = cls(root)
        out.append(c)
    return out


def _names(args: argparse.Namespace) -> list[str]:
    raw = args.collectors
    if raw is None:
        raw = DEFAULT_COLLECTORS.replace("gpu", "dcgm") if args.dcgm_url else DEFAULT_COLLECTORS
    names = [n.strip() for n in raw.split(",") if n.strip()]
    if not names:
        raise AgentConfigError("--collectors names none (valid: " + ", ".join(COLLECTORS) + ")")
    for n in names:
        collector_class(n)
    if "gpu" in names and "dcgm" in names:
        # Both publish the node's gpu message: the engine would get every GPU twice a second.
        raise AgentConfigError("--collectors names both gpu and dcgm, which report the same GPUs: keep one "
                               "(dcgm to read an existing dcgm-exporter, gpu to read NVML)")
    names = list(dict.fromkeys(names))  # `gpu,gpu` is one collector, not two publishing the same readings
    # Network locality and the hw collector want the GPU collector, so it starts first (and hw last).
    return sorted(names, key=lambda n: 0 if n == "gpu" else 2 if n == "hw" else 1)


def _state_dir(args: argparse.Namespace) -> str:
    """The agent's state folder: ``--state-dir``, else ``$WHYWAIT_STATE_DIR``, else the default.

    One folder for everything the agent writes, so that an agent run as an ordinary user with
    ``--state-dir`` (or only ``--spool-dir``) writes nowhere else.
    """
    if getattr(args, "state_dir", None):
        return str(args.state_dir)
    if getattr(args, "spool_dir", None) and not os.environ.get(STATE_ENV):
        # Only the spool named: the kernel log's place goes into it (the spool reads only its
        # `<seq>.spool` files), not into /var/lib/whywait.
        return str(args.spool_dir)
    return state_dir()


def _spool_dir(args: argparse.Namespace) -> str:
    return str(args.spool_dir) if args.spool_dir else os.path.join(_state_dir(args), "spool")


def _spool_flag(args: argparse.Namespace) -> str:
    """The flag that chose the spool folder, for the messages about it."""
    return "--spool-dir" if args.spool_dir else "--state-dir or --spool-dir"


def check_args(args: argparse.Namespace) -> None:
    """Refuse numbers that cannot work, in one line naming the flag (exit 2), before anything starts."""
    mb = args.spool_max_mb
    if not (math.isfinite(mb) and mb > 0):
        raise AgentConfigError(f"--spool-max-mb must be a positive number of MiB, like 64 (got {mb:g})")
    if args.rounds is not None and args.rounds < 1:
        raise AgentConfigError(f"--rounds must be 1 or more (got {args.rounds})")
    iv = args.interval
    if not (math.isfinite(iv) and iv >= MIN_INTERVAL_S):
        raise AgentConfigError(f"--interval must be at least {MIN_INTERVAL_S:g} seconds (got {iv:g})")
    if args.dcgm_url is not None:
        check_url(args.dcgm_url)


def _check_spool_writable(folder: str, flag: str) -> None:
    """Create the spool folder and write a file in it now: an unwritable spool said at start, naming the flag,
    not at the first round (or, worse, mid-outage)."""
    import tempfile  # noqa: PLC0415

    try:
        os.makedirs(folder, exist_ok=True)
        with tempfile.NamedTemporaryFile(dir=folder, prefix=".probe-"):
            pass
    except OSError as exc:
        raise AgentConfigError(f"cannot write the spool folder {folder}: {exc.strerror or exc} "
                               f"(choose another with {flag})") from None


def make_publisher(args: argparse.Namespace) -> Any:
    """``--print`` → JSON lines on stdout; otherwise Kafka (bootstrap required)."""
    if args.print_:
        from whywait.agents.publisher import PrintPublisher  # noqa: PLC0415

        return PrintPublisher()
    bootstrap = args.bootstrap or os.environ.get(BOOTSTRAP_ENV, "").strip()
    if not bootstrap:
        raise AgentConfigError(f"no Kafka to publish to: pass --bootstrap HOST:PORT or set {BOOTSTRAP_ENV} "
                               "(or use --print)")
    from whywait.bootstrap import BootstrapError, check_bootstrap  # noqa: PLC0415

    try:  # a typo in the address is said as such, not as a broker that never answers (the spool would fill)
        bootstrap = check_bootstrap(bootstrap, "--bootstrap" if args.bootstrap else BOOTSTRAP_ENV)
    except BootstrapError as exc:
        raise AgentConfigError(str(exc)) from None
    from whywait.agents.publisher import KafkaPublisher  # noqa: PLC0415 - aiokafka only when publishing

    spool, flag = _spool_dir(args), _spool_flag(args)
    _check_spool_writable(spool, flag)
    return KafkaPublisher(bootstrap, spool, int(args.spool_max_mb * (1 << 20)), logger=log, spool_flag=flag,
                          bound_flag="--spool-max-mb")


def _socket_path(args: argparse.Namespace) -> str | None:
    if args.socket == "none":
        return None
    if (args.once or args.print_) and not args.socket:
        # A one-off look, or a printing agent, must not take over a running agent's socket (nor fail
        # without root to create /run/whywait): only an explicit --socket opens one.
        return None
    return args.socket or os.environ.get(SOCKET_ENV) or DEFAULT_SOCKET


def run(args: argparse.Namespace) -> int:
    """Run the agent; returns the exit status (2 for a configuration error, said in one line)."""
    from whywait.agents.agent import Agent  # noqa: PLC0415
    from whywait.agents.observe import metrics_addr  # noqa: PLC0415

    try:
        addr = metrics_addr(getattr(args, "metrics_addr", None))  # a bad address is said before collectors start
        check_args(args)
        names = _names(args)
        if args.once and args.print_:
            from whywait.agents.publisher import MemoryPublisher  # noqa: PLC0415

            collectors = build_collectors(names, args.root, args.dcgm_url, args.pid, args.node, _state_dir(args),
                                          look=True)
            return _once_print(Agent(args.node, collectors, MemoryPublisher(), args.interval))
        publisher = make_publisher(args)  # configuration errors before any collector starts
        collectors = build_collectors(names, args.root, args.dcgm_url, args.pid, args.node, _state_dir(args))
        agent = Agent(args.node, collectors, publisher, args.interval, _socket_path(args),
                      socket_group=args.socket_group,
                      socket_required=bool(args.socket) and args.socket != "none")
        server = _metrics_server(agent, addr)
        try:
            return asyncio.run(_run(agent, 1 if args.once else args.rounds))
        finally:
            if server is not None:
                server.stop()
    except AgentError as exc:
        print(f"whywait agent: {exc}", file=sys.stderr)
        return exc.exit_code  # whywait.errors.EXIT_CODES: 2 for a wrong flag, 3 for a missing service


def _metrics_server(agent: Any, addr: tuple[str, int] | None) -> Any:
    """Start the /metrics, /healthz and /readyz server on ``addr`` (``--metrics-addr``); None when off."""
    from whywait.agents.observe import ObserveServer, agent_registry  # noqa: PLC0415

    if addr is None:
        return None

    def ready() -> str | None:
        # Ready while the publisher reaches Kafka; a print publisher has no broker to wait for.
        if getattr(agent.publisher, "_connected", True):
            return None
        return f"Kafka unreachable; {agent.publisher.spooled} message(s) spooled"

    return ObserveServer(addr, agent_registry(agent), ready).start()


def _once_print(agent: Any) -> int:
    """``--once --print``: prime, wait one interval, print that interval's messages as JSON lines.

    The same lines as ``--print`` writes every round (:func:`whywait.agents.publisher.json_line`), so the
    output can be saved and handed to ``whywait events check`` or ``whywait topology import agent``.  A
    message that breaks the contract is still printed (this is a look at what the agent sees), and said.
    """
    from whywait.agents.events import TOPIC_AGENT_HEALTH, ContractError, message_key, validate  # noqa: PLC0415
    from whywait.agents.publisher import json_line  # noqa: PLC0415

    agent.prime()
    time.sleep(agent.interval)
    msgs = agent.collect()
    msgs.append((TOPIC_AGENT_HEALTH, agent.health(agent.clock())))
    for topic, m in msgs:
        try:
            validate(m, topic)
        except ContractError as exc:
            print(f"whywait agent: {m['kind']} message breaks the contract: {exc}", file=sys.stderr)
        sys.stdout.write(json_line(topic, message_key(m).decode(), m))
    for c in agent.collectors:
        c.close()
    return 0


async def _run(agent: Any, rounds: int | None) -> int:
    """Run the agent; the exit status.

    At the end the publisher gives the broker a few seconds to take what is queued (none when it has
    already failed to answer).  A run with an end (``--once``, ``--rounds``) exits 0 only when it took
    everything; otherwise it says how many messages wait in the spool and
    exits 3 (a smoke test that sent nothing must not pass).  A service stopped by SIGTERM says the same
    in its log and exits 0: being stopped during an outage is no failure of the service; Ctrl-C (SIGINT)
    exits 130, as every whywait command does.
    """
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    got: list[int] = []

    def on_signal(sig: int) -> None:
        got.append(sig)
        stop.set()

    for sig in (signal.SIGINT, signal.SIGTERM):
        try:
            loop.add_signal_handler(sig, on_signal, sig)
        except (NotImplementedError, RuntimeError):
            pass
    await agent.run(rounds=rounds, stop=stop)
    # Ctrl-C (SIGINT) exits 130, as every whywait command does; SIGTERM (systemd, Kubernetes) is a clean stop.
    interrupted = bool(got) and got[0] == signal.SIGINT
    left = agent.publisher.spooled
    if not left:
        return EXIT_INTERRUPTED if interrupted else 0
    where = getattr(getattr(agent.publisher, "spool", None), "dir", "the spool")
    line = f"{left} message(s) left in {where}; the next run sends them"
    why = getattr(agent.publisher, "last_error", None)
    if rounds is None:
        log.warning("%s%s", line, f" (Kafka: {why})" if why else "")
        return EXIT_INTERRUPTED if interrupted else 0
    print(f"whywait agent: {line}" + (f" (Kafka: {why})" if why else " (Kafka did not take them in time)"),
          file=sys.stderr)
    from whywait.errors import EXIT_UNAVAILABLE  # noqa: PLC0415

    return EXIT_UNAVAILABLE


def main(argv: list[str] | None = None) -> int:
    """``python -m whywait.agents.cli``: the agent without the ``whywait`` entry point."""
    parser = argparse.ArgumentParser(prog="whywait agent")
    parser.add_argument("-v", "--verbose", action="store_true")
    parser.add_argument("--log-format", choices=("text", "json"), default="text",
                        help="log lines as text (default) or JSON objects")
    register(parser)
    args = parser.parse_args(argv)
    from whywait.agents.observe import configure_logging  # noqa: PLC0415

    configure_logging(logging.DEBUG if args.verbose else logging.INFO, args.log_format)
    logging.getLogger("aiokafka").setLevel(logging.CRITICAL if not args.verbose else logging.DEBUG)
    return run(args)


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
