"""The ``whywait`` command.

Each subcommand lives in its own module with two functions, ``register(parser)``
(adds its arguments) and ``run(args) -> int`` (does the work, returns the exit
status).  :data:`COMMANDS` is the explicit registry of them; modules are imported
only when their subcommand runs, so ``whywait agent`` on a node never imports
faust or slack_sdk.

Errors that a user can act on (an unreachable broker, a bad rule file) derive
from :class:`engine.errors.WhywaitError` and are printed as one line, never as a
traceback; exit status 2.
"""

from __future__ import annotations

import argparse
import importlib
import logging
import sys
from typing import Sequence

# name -> (module, one-line help).  Order is the order `whywait --help` lists them.
COMMANDS: dict[str, tuple[str, str]] = {
    "demo": ("engine.commands.demo", "start a local Kafka, simulate a 16-node job with a fault, print the alert"),
    "simulate": ("simulate.cli", "simulate a cluster and its jobs, publishing telemetry to Kafka"),
    "engine": ("engine.commands.engine_cmd", "consume telemetry, evaluate the rules, publish and notify"),
    "kafka": ("engine.localkafka.cli", "fetch, start, stop or inspect the local Kafka broker"),
    "rules": ("engine.commands.rules_cmd", "check rule files, run rule tests, list metrics"),
    "notify": ("engine.commands.notify_cmd", "render a diagnosis as its Slack message, or send it"),
    "silence": ("engine.commands.silence_cmd", "add, list or expire silences"),
    "replay": ("engine.commands.replay_cmd", "re-run the rules over recorded topics or a bundle: postmortem, backtest"),
    "export": ("engine.commands.export_cmd", "cut an incident's events, topology and rules into one bundle file"),
    "import": ("engine.commands.import_cmd", "put a bundle, profiler traces or step tables into the topics"),
    "digest": ("engine.commands.digest_cmd", "GPU-hours used and lost to waiting, by cause, per project and job"),
    "eval": ("engine.commands.eval_cmd", "measure the rules' accuracy on a labelled suite of simulated faults"),
    "events": ("engine.commands.events_cmd", "print the event contract, or check messages against it"),
    "topology": ("engine.commands.topology_cmd", "import the cluster from fabric dumps, Slurm, NCCL, k8s; check, show, "
                                                 "path, diff"),
    "placement": ("engine.commands.placement_cmd", "publish which job runs where: Slurm prolog/epilog, Kubernetes "
                                                   "watcher, or a file"),
    "agent": ("agents.cli", "run the node agent: collect GPU, network, storage, host and training timings"),
}


def build_parser(command: str | None = None) -> argparse.ArgumentParser:
    """Return the top-level parser; only ``command``'s module is imported and registered."""
    parser = argparse.ArgumentParser(prog="whywait", description="Where does the waiting begin, and why?")
    parser.add_argument("-v", "--verbose", action="store_true", help="debug logging")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for name, (module, help_) in COMMANDS.items():
        p = sub.add_parser(name, help=help_, description=help_)
        if name == command:
            mod = importlib.import_module(module)
            mod.register(p)
            p.set_defaults(_run=mod.run)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``whywait`` console script; returns the exit status."""
    from whywait.engine.errors import WhywaitError

    argv = list(sys.argv[1:] if argv is None else argv)
    command = next((a for a in argv if not a.startswith("-")), None)
    parser = build_parser(command)
    args = parser.parse_args(argv)
    logging.basicConfig(
        level=logging.DEBUG if args.verbose else logging.INFO,
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
    )
    # aiokafka and faust log a traceback per retry when a broker is down; we say it once ourselves.
    for noisy in ("aiokafka", "kafka"):
        logging.getLogger(noisy).setLevel(logging.CRITICAL if not args.verbose else logging.DEBUG)
    for noisy in ("faust", "mode"):  # their errors (a worker that cannot start) must still show
        logging.getLogger(noisy).setLevel(logging.ERROR if not args.verbose else logging.DEBUG)
    if not getattr(args, "_run", None):
        parser.print_help()
        return 2
    try:
        return int(args._run(args) or 0)
    except WhywaitError as exc:
        print(f"whywait {args.command}: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
