"""The agents package's exception tree (the node agent must not import the engine's).

::

    whywait.errors.WhywaitError
    └── AgentError              anything the agent reports to a user as one line
        ├── CollectorOff        a collector cannot run on this host (no driver, no file, no permission)
        ├── AgentConfigError    a flag or environment variable of ``whywait agent`` is missing or wrong
        ├── BmcError            agents.collectors.bmc: a BMC request failed (connection, status, not JSON)
        └── ContractError       agents.events: a message breaks the event contract (also a ValueError,
                                for producers outside the agent that catch that)
"""

from __future__ import annotations

from whywait.errors import EXIT_UNAVAILABLE, WhywaitError


class AgentError(WhywaitError):
    """Root of the agents package's errors; the CLI prints them as one line."""


class CollectorOff(AgentError):
    """A collector cannot run on this host (no driver, no file, no permission)."""

    exit_code = EXIT_UNAVAILABLE


class AgentConfigError(AgentError):
    """A flag or environment variable of ``whywait agent`` is missing or wrong."""
