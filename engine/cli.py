"""The ``whywait`` command.

Each subcommand lives in its own module with two functions, ``register(parser)``
(adds its arguments) and ``run(args) -> int`` (does the work, returns the exit
status).  :data:`COMMANDS` is the explicit registry of them; modules are imported
only when their subcommand runs, so ``whywait agent`` on a node never imports
faust or slack_sdk.

Errors that a user can act on (an unreachable broker, a bad rule file) derive
from :class:`whywait.errors.WhywaitError` and are printed as one line, never as a
traceback, with the exit status of their class (:data:`whywait.errors.EXIT_CODES`,
listed by ``whywait --help``).  A closed stdout (``whywait rules metrics | head``)
ends the command quietly; anything else is a bug, reported in one line too
(``-v`` shows its traceback).
"""

from __future__ import annotations

import argparse
import difflib
import importlib
import logging
import os
import sys
from typing import NoReturn, Sequence

from whywait.errors import (
    EXIT_BROKEN_PIPE,
    EXIT_CODES,
    EXIT_INTERNAL,
    EXIT_INTERRUPTED,
    EXIT_USAGE,
    WhywaitError,
)

# name -> (module under the `whywait` package, one-line help).  Order is the order `whywait --help` lists them.
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
    "bench": ("engine.commands.bench_cmd", "measure the engine and replay against raw Kafka consume+decode"),
    "eval": ("engine.commands.eval_cmd", "measure the rules' accuracy on a labelled suite of simulated faults"),
    "events": ("engine.commands.events_cmd", "print the event contract, or check messages against it"),
    "topology": ("engine.commands.topology_cmd", "import the cluster from fabric dumps, Slurm, NCCL, k8s; check, show, "
                                                 "path, diff"),
    "placement": ("engine.commands.placement_cmd", "publish which job runs where: Slurm prolog/epilog, Kubernetes "
                                                   "watcher, or a file"),
    "agent": ("agents.cli", "run the node agent: collect GPU, network, storage, host and training timings"),
}


class _CommandParser(argparse.ArgumentParser):
    """The parser of a command and of its actions (``whywait topology path``).

    argparse hands the arguments a subcommand does not know up to the top-level parser, which
    then prints ``whywait``'s usage: the user sees every command instead of the one they typed.
    Here the subcommand's own parser refuses them, with its own usage.  Nested actions inherit
    the class (``add_subparsers`` defaults to the parent's).
    """

    def error(self, message: str) -> NoReturn:  # type: ignore[override]
        """One line, exit 2: what is wrong, the option meant when a flag is misspelt, and where help is.

        argparse's own error prints the command's whole usage first (eight lines for ``replay``), and
        the one line that says what is wrong comes last.
        """
        if message.startswith("unrecognized arguments:"):
            known = [o for o in self._option_string_actions if o.startswith("--")]
            near = {w: m[0] for w in message.split(":", 1)[1].split() if w.startswith("-")
                    and (m := difflib.get_close_matches(w.split("=", 1)[0], known, n=1, cutoff=0.75))}
            if near:
                message += " (did you mean " + ", ".join(f"{m}" for m in dict.fromkeys(near.values())) + "?)"
        elif "invalid choice: '" in message and "(choose from " in message:
            given = message.split("invalid choice: '", 1)[1].split("'", 1)[0]
            choices = [c.strip(" '") for c in message.split("(choose from ", 1)[1].rstrip(")").split(",")]
            near_choice = difflib.get_close_matches(given, choices, n=1, cutoff=0.6)
            if near_choice:
                message = message.split(" (choose from ", 1)[0] + f" (did you mean {near_choice[0]!r}?)"
        self.exit(2, f"{self.prog}: {message}; `{self.prog} --help` lists the options\n")

    def parse_known_args(self, args: Sequence[str] | None = None,  # type: ignore[override]
                         namespace: argparse.Namespace | None = None) -> tuple[argparse.Namespace, list[str]]:
        ns, extras = super().parse_known_args(args, namespace)
        if extras:
            self.error(f"unrecognized arguments: {' '.join(extras)}")
        return ns, extras


def _epilog() -> str:
    codes = "\n".join(f"  {code:>3}  {what}" for code, what in EXIT_CODES.items())
    return f"exit status:\n{codes}\n\nRun `whywait COMMAND --help` for a command's options."


def build_parser(command: str | None = None) -> argparse.ArgumentParser:
    """Return the top-level parser; only ``command``'s module is imported and registered."""
    from whywait import __version__

    parser = _CommandParser(prog="whywait", description="Where does the waiting begin, and why?",
                                     epilog=_epilog(), formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--version", action="version", version=f"whywait {__version__}")
    parser.add_argument("-v", "--verbose", action="store_true", help="debug logging, and tracebacks of internal errors")
    parser.add_argument("--log-format", choices=("text", "json"), default=os.environ.get("WHYWAIT_LOG_FORMAT", "text"),
                        help="log lines as text, or as one JSON object each: time, level, logger, message and the "
                             "call's extra fields (default: $WHYWAIT_LOG_FORMAT, else text)")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=_CommandParser)
    for name, (module, help_) in COMMANDS.items():
        p = sub.add_parser(name, help=help_, description=help_)
        if name == command:
            mod = importlib.import_module(f"whywait.{module}")
            mod.register(p)
            p.set_defaults(_run=mod.run)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``whywait`` console script; returns the exit status (see :data:`EXIT_CODES`)."""
    argv = list(sys.argv[1:] if argv is None else argv)
    try:
        code = _main(argv)
        sys.stdout.flush()  # a pipe closed early shows here, inside the handler, not at interpreter exit
        return code
    except BrokenPipeError:
        return _stdout_closed()


def _stdout_closed() -> int:
    """The reader of stdout went away (``| head``): stop quietly, as a C tool killed by SIGPIPE would.

    Python's documented way (the "Note on SIGPIPE" in the signal module): point stdout at /dev/null so the
    interpreter's final flush cannot raise again.  SIG_DFL for SIGPIPE would also kill the engine on a
    closed Kafka or Slack socket, which is why it is not used.
    """
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
    except (OSError, ValueError):  # stdout is not a real file (tests capture it): nothing left to flush
        pass
    return EXIT_BROKEN_PIPE


def _main(argv: list[str]) -> int:
    # The first word that is neither an option nor the value of ``--log-format VALUE`` names the command.
    command = next((a for i, a in enumerate(argv) if not a.startswith("-")
                    and (i == 0 or argv[i - 1] != "--log-format")), None)
    try:
        parser = build_parser(command)
    except WhywaitError as exc:  # a command module that cannot even register (a bad environment)
        print(f"whywait {command}: {exc}", file=sys.stderr)
        return exc.exit_code
    args = parser.parse_args(argv)
    from whywait.agents.observe import LOG_FORMATS, configure_logging

    if args.log_format not in LOG_FORMATS:  # from $WHYWAIT_LOG_FORMAT: argparse checks only the flag
        print(f"whywait: $WHYWAIT_LOG_FORMAT must be one of {', '.join(LOG_FORMATS)} (got {args.log_format!r})",
              file=sys.stderr)
        return EXIT_USAGE

    configure_logging(logging.DEBUG if args.verbose else logging.INFO, args.log_format)
    # aiokafka and faust log a traceback per retry when a broker is down, and slack_sdk an error line per failed
    # request when Slack is unreachable; we say it once ourselves.
    for noisy in ("aiokafka", "kafka", "slack_sdk"):
        logging.getLogger(noisy).setLevel(logging.CRITICAL if not args.verbose else logging.DEBUG)
    for noisy in ("faust", "mode"):  # their errors (a worker that cannot start) must still show
        logging.getLogger(noisy).setLevel(logging.ERROR if not args.verbose else logging.DEBUG)
    if not getattr(args, "_run", None):
        parser.print_help()
        return EXIT_USAGE
    try:
        return int(args._run(args) or 0)
    except WhywaitError as exc:
        print(f"whywait {args.command}: {exc}", file=sys.stderr)
        return exc.exit_code
    except KeyboardInterrupt:
        return EXIT_INTERRUPTED
    except BrokenPipeError:
        raise  # main() ends quietly
    except Exception as exc:  # noqa: BLE001 - the last line of defence: a bug still gets one line, not a traceback
        if args.verbose:
            logging.getLogger("whywait").exception("internal error")
        if isinstance(exc, OSError) and exc.filename is not None:
            # A file the system refused (a full disk, a folder removed meanwhile, a path no command checked):
            # the user's to fix, so it is said as such, with the path, and not reported as a bug.
            print(f"whywait {args.command}: {exc.filename}: {exc.strerror or exc}", file=sys.stderr)
            return EXIT_USAGE
        print(f"whywait {args.command}: internal error: {type(exc).__name__}: {exc} "
              "(a bug in whywait: run again with -v for the traceback, and please report it)", file=sys.stderr)
        return EXIT_INTERNAL


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
