"""The root of every error whywait raises on purpose: :class:`WhywaitError`.

Each package derives its own tree from it (``whywait.agents.errors``, ``whywait.topology.errors``, ``whywait.engine.errors``).  The CLI
catches ``WhywaitError`` and prints ``str(exc)`` as one line, exiting with the class's :attr:`exit_code`;
anything else is a bug and keeps its traceback.
"""

from __future__ import annotations


class WhywaitError(Exception):
    """An error a user can act on; ``str()`` is the one line the CLI prints."""

    #: the process exit code the CLI uses for this kind of error
    exit_code: int = 1
