"""The engine's exception tree.

::

    WhywaitError                 anything a user can act on; the CLI prints it as one line
    ├── ConfigError              bad command-line or environment configuration
    ├── BrokerUnavailable        Kafka did not answer (bootstrap named)
    ├── RuleError                a rule file is malformed (engine.rules.schema.RuleSchemaError)
    ├── TopologyError            a topology file is malformed or names an unknown entity
    └── NotifyError              a notifier failed; ``retryable`` says whether to try again

``whywait.agents.events.ContractError`` is separate on purpose: the agents package must
not import the engine.
"""

from __future__ import annotations


class WhywaitError(Exception):
    """Root of every error whywait reports to a user as one line."""


class ConfigError(WhywaitError):
    """Configuration (flags, environment variables, files) is missing or wrong."""


class BrokerUnavailable(WhywaitError):
    """The Kafka cluster at ``bootstrap`` could not be reached."""

    def __init__(self, bootstrap: str, detail: str = "") -> None:
        self.bootstrap = bootstrap
        super().__init__(f"Kafka at {bootstrap} is unreachable{': ' + detail if detail else ''} "
                         "(start one with `whywait kafka start` or set WHYWAIT_KAFKA_BOOTSTRAP)")


class RuleError(WhywaitError):
    """A rule file cannot be loaded; the message names the file and line."""


class TopologyError(WhywaitError):
    """A topology file cannot be loaded, or a query names an unknown entity."""


class NotifyError(WhywaitError):
    """A notification could not be delivered; ``retryable`` tells the caller whether to retry."""

    def __init__(self, message: str, retryable: bool) -> None:
        self.retryable = retryable
        super().__init__(message)
