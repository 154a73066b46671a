"""The agents package's exception tree (the node agent must not import the engine's).

::

    AgentError              anything the agent reports to a user as one line
    ├── CollectorOff        a collector cannot run on this host (no driver, no file, no permission)
    └── AgentConfigError    a flag or environment variable of ``whywait agent`` is missing or wrong

``whywait.agents.events.ContractError`` (a message breaks the event contract) is a ``ValueError``
of its own: producers outside the agent raise it too.
"""

from __future__ import annotations


class AgentError(Exception):
    """Root of the agents package's errors; the CLI prints them as one line."""


class CollectorOff(AgentError):
    """A collector cannot run on this host (no driver, no file, no permission)."""


class AgentConfigError(AgentError):
    """A flag or environment variable of ``whywait agent`` is missing or wrong."""
