"""``whywait kafka {fetch,start,stop,status}``: the local Apache Kafka broker.

``start`` runs the broker detached (it outlives the command) and prints
``WHYWAIT_KAFKA_BOOTSTRAP=127.0.0.1:PORT`` so that ``eval "$(whywait kafka start)"``
points the other commands at it; they also find it without the variable, through
the state file.  ``status`` exits 0 when a broker is running and answering, 1 if not.

``start`` while a broker runs uses that one (the demo and a second ``make test`` rely on it) and says so on
stderr; asked for a ``--port`` or ``--data-dir`` the running one does not have, it refuses (exit 2) rather
than hand back a broker other than the one asked for.
"""

from __future__ import annotations

import argparse
import os
import sys

from whywait.engine.errors import ConfigError
from whywait.engine.localkafka import broker as lb


def register(parser: argparse.ArgumentParser) -> None:
    """Add the ``fetch|start|stop|status`` subcommands to ``parser``."""
    parser.add_argument("--cache-dir", default=None,
                        help=f"jars and broker state (default ${lb.CACHE_ENV} or ~/.cache/whywait)")
    sub = parser.add_subparsers(dest="kafka_command", metavar="ACTION")
    sub.add_parser("fetch", help=f"download the Kafka {lb.KAFKA_VERSION} jars from Maven Central (once)")
    start = sub.add_parser("start", help="start a detached single-node broker on 127.0.0.1 (or use the running one; "
                                         "a --port or --data-dir it does not have is refused: `kafka stop` first)")
    start.add_argument("--port", type=int, default=None,
                       help="client port (default: the last broker's when free, else a free one below the "
                            "ephemeral range)")
    start.add_argument("--data-dir", default=None,
                       help="broker folder, reused if formatted (default <cache>/broker, wiped on start)")
    start.add_argument("--timeout", type=float, default=60.0, help="seconds to wait for it to answer (default 60)")
    stop = sub.add_parser("stop", help="stop the detached broker")
    stop.add_argument("--timeout", type=float, default=20.0, help="seconds before SIGKILL (default 20)")
    sub.add_parser("status", help="show the detached broker; exit 1 if none is running")
    parser.set_defaults(_kafka_help=parser.format_help)


def run(args: argparse.Namespace) -> int:
    """Run one ``whywait kafka`` action; errors are :class:`whywait.engine.errors.WhywaitError` one-liners."""
    cache = args.cache_dir
    action = args.kafka_command
    if action == "fetch":
        print(lb.fetch_jars(cache))
        return 0
    if action == "start":
        if args.port is not None and not 0 < args.port < 65536:
            raise ConfigError(f"--port must be 1-65535 (got {args.port})")
        if args.port is not None and lb.in_ephemeral_range(args.port):
            lo, hi = lb.ephemeral_range()
            print(f"whywait kafka: warning: port {args.port} is in the ephemeral range {lo}-{hi}; while the broker "
                  "is down a client may connect to itself there. A port below "
                  f"{lo} avoids it.", file=sys.stderr)
        broker = lb.LocalBroker(cache, detached=True)
        bootstrap = broker.start(port=args.port, data_dir=args.data_dir, timeout=args.timeout)
        if broker.reused:  # on stderr: stdout stays the one line `eval "$(whywait kafka start)"` reads
            print(f"whywait kafka: a local broker was already running (pid {broker.pid}, data {broker.broker_dir}): "
                  "using it, not starting another", file=sys.stderr)
        print(f"{lb.BOOTSTRAP_ENV}={bootstrap}")
        return 0
    if action == "stop":
        if lb.stop_detached(cache, timeout=args.timeout):
            print("stopped the local Kafka broker; `whywait kafka start` begins with empty topics unless it is given "
                  "--data-dir DIR (a folder it reuses, keeping the topics from one start to the next)")
        else:
            print("no local Kafka broker is running")
        return 0
    if action == "status":
        return _status(cache)
    help_ = getattr(args, "_kafka_help", None)
    print(help_() if help_ else "usage: whywait kafka {fetch,start,stop,status}", file=sys.stderr)
    return 2


def _status(cache: str | None) -> int:
    env = os.environ.get(lb.BOOTSTRAP_ENV, "").strip()
    state = lb.running_state(cache)
    jars = "fetched" if lb.jars_fetched(cache) else "not fetched (`whywait kafka fetch`)"
    print(f"kafka {lb.KAFKA_VERSION} jars: {jars} ({lb.libs_dir(cache)})")
    if env:
        print(f"{lb.BOOTSTRAP_ENV}={env} (set in the environment; it takes precedence)")
    if state is None:
        print("local broker: not running")
        return 1
    bootstrap = f"{lb.HOST}:{int(state['port'])}"
    answering = lb.probe(bootstrap)
    print(f"local broker: {'running' if answering else 'NOT ANSWERING'}, pid {state['pid']}, "
          f"{lb.BOOTSTRAP_ENV}={bootstrap}, data {state.get('data_dir')}")
    return 0 if answering else 1
