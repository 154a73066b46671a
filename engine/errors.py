"""The engine's exception tree (the engine and the ``whywait`` commands).

::

    whywait.errors.WhywaitError
    └── EngineError              anything the engine reports to a user as one line
        ├── ConfigError          bad command-line or environment configuration         (exit 2)
        ├── BrokerUnavailable    Kafka did not answer (bootstrap named)                 (exit 3)
        ├── RuleError            a rule or rule-test file is malformed                  (exit 2)
        │                        (engine.rules.schema.RuleSchemaError, engine.rules.loader.RuleLoadError,
        │                         simulate.ruletest.RuleTestError)
        ├── NotifyError          a notifier failed; ``retryable`` says whether to try again   (exit 3)
        ├── PlacementError       engine.placement.model: which job runs where cannot be used  (exit 2)
        └── BrokerStartError     engine.localkafka.broker: the local broker did not come up   (exit 3)

``TopologyError`` is the topology package's own (:mod:`whywait.topology.errors`), re-exported here so the engine
names it one way; ``WhywaitError`` is the root in :mod:`whywait.errors`.  The exit codes are listed in
:data:`whywait.errors.EXIT_CODES` (``whywait --help`` prints them).
"""

from __future__ import annotations

from whywait.topology.errors import TopologyError

from whywait.errors import EXIT_UNAVAILABLE, EXIT_USAGE, WhywaitError

__all__ = ["EngineError", "ConfigError", "BrokerUnavailable", "RuleError", "NotifyError", "TopologyError",
           "WhywaitError"]


class EngineError(WhywaitError):
    """Root of the engine's errors; the CLI prints them as one line."""


class ConfigError(EngineError):
    """Configuration (flags, environment variables, files) is missing or wrong."""


class BrokerUnavailable(EngineError):
    """The Kafka cluster at ``bootstrap`` could not be reached."""

    exit_code = EXIT_UNAVAILABLE

    def __init__(self, bootstrap: str, detail: str = "") -> None:
        import os

        self.bootstrap = bootstrap
        # Where the address came from decides the advice: a stale WHYWAIT_KAFKA_BOOTSTRAP (a broker since
        # stopped) is not fixed by setting it.
        env = os.environ.get("WHYWAIT_KAFKA_BOOTSTRAP")
        hint = ("WHYWAIT_KAFKA_BOOTSTRAP names it: is that broker still running? `whywait kafka start` starts a "
                "local one" if env and env.strip() == bootstrap.strip()
                else "start one with `whywait kafka start` or set WHYWAIT_KAFKA_BOOTSTRAP")
        super().__init__(f"Kafka at {bootstrap} is unreachable{': ' + detail if detail else ''} ({hint})")


class RuleError(EngineError):
    """A rule or rule-test file cannot be loaded; the message names the file and line."""


class NotifyError(EngineError):
    """A notification could not be delivered; ``retryable`` tells the caller whether to retry."""

    exit_code = EXIT_UNAVAILABLE

    def __init__(self, message: str, retryable: bool) -> None:
        self.retryable = retryable
        super().__init__(message)


class NotifyRefused(NotifyError):
    """The service answered, and refused what it was configured with (Slack rejecting the token at start).

    Not an outage: waiting will not help, the configuration must change, so it exits 2 (bad input),
    not 3 (unavailable).  Never retryable.
    """

    exit_code = EXIT_USAGE

    def __init__(self, message: str) -> None:
        super().__init__(message, retryable=False)
