"""The root of every error whywait raises on purpose: :class:`WhywaitError`.

Each package derives its own subtree from it; the whole tree::

    WhywaitError                        whywait.errors: anything a user can act on
    ├── YamlError                       whywait.errors: a YAML file is not valid YAML, or has a duplicate key
    ├── DurationError                   whywait.errors: a value is not a duration like '90s' (also a ValueError)
    ├── BootstrapError                  whywait.bootstrap: a Kafka address is not HOST:PORT[,...] (also a ValueError)
    ├── AgentError                      agents.errors: the node agent
    │   ├── CollectorOff                a collector cannot run on this host
    │   ├── AgentConfigError            a flag or environment variable of `whywait agent` is wrong
    │   └── ContractError               agents.events: a message breaks the event contract (also a ValueError)
    ├── TopologyError                   topology.errors: a topology source is malformed (also a ValueError)
    │   └── UnknownEntityError          a query or placement names an entity the topology lacks
    ├── SimulationError                 simulate.errors: a scenario, fault spec or cluster is wrong
    └── EngineError                     engine.errors: the engine and the CLI's commands
        ├── ConfigError                 bad command-line or environment configuration
        ├── BrokerUnavailable           Kafka did not answer
        ├── RuleError                   a rule or rule-test file is malformed (RuleSchemaError, RuleTestError...)
        ├── NotifyError                 a notifier failed; `retryable` says whether to try again
        └── PlacementError              a placement (which job runs where) cannot be used

The CLI (:func:`whywait.engine.cli.main`) catches ``WhywaitError``, prints ``str(exc)`` as one line and exits with the
class's :attr:`~WhywaitError.exit_code`; :data:`EXIT_CODES` documents them (``whywait --help`` prints it).
"""

from __future__ import annotations

#: Exit codes of the ``whywait`` command, printed by ``whywait --help``.
EXIT_CODES: dict[int, str] = {
    0: "success",
    1: "a check or test found problems (rules check, rules test, events check ...)",
    2: "usage or input: a wrong flag, environment variable, token or file (rule, topology, scenario, YAML), or an id "
       "that names nothing (`silence expire ID`); `rules check` and `rules test`, whose findings are broken rules, "
       "say those with 1",
    3: "unavailable: Kafka, the local broker, Slack or another service could not be reached or started",
    70: "internal error: a bug in whywait (run with -v for the traceback, and please report it)",
    130: "interrupted (Ctrl-C)",
    141: "stdout was closed early (`whywait ... | head`); nothing is lost",
}

EXIT_USAGE = 2
EXIT_UNAVAILABLE = 3
EXIT_INTERNAL = 70
EXIT_INTERRUPTED = 130
EXIT_BROKEN_PIPE = 141  # 128 + SIGPIPE, what a C tool killed by SIGPIPE reports


class WhywaitError(Exception):
    """An error a user can act on; ``str()`` is the one line the CLI prints.

    Raised anywhere in whywait; caught by the CLI, which exits with :attr:`exit_code`.
    """

    #: the process exit code the CLI uses for this kind of error (see :data:`EXIT_CODES`)
    exit_code: int = EXIT_USAGE


class YamlError(WhywaitError):
    """A YAML file cannot be read: bad syntax, a duplicate key, a merge key or an unreadable file.

    Raised by :mod:`whywait.yamlio`.  ``source`` and ``line`` (1-based; 0 when unknown) locate it, and
    ``problem`` is the message without them, so a caller can re-raise it as its own package's error.
    """

    def __init__(self, source: str, line: int, problem: str) -> None:
        self.source, self.line, self.problem = source, line, problem
        super().__init__(f"{source}:{line}: {problem}" if line else f"{source}: {problem}")


class DurationError(WhywaitError, ValueError):
    """A value is not a duration; raised by :func:`whywait.durations.parse_duration`.

    ``expected`` and ``got`` let a schema phrase it as "must be <expected> (got <got>)".
    """

    def __init__(self, expected: str, got: object, what: str = "") -> None:
        self.expected, self.got, self.what = expected, got, what
        super().__init__(f"{what + ': ' if what else ''}must be {expected} (got {got!r})")
