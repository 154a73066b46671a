"""The simulator's exception tree.

::

    whywait.errors.WhywaitError
    └── SimulationError (also a ValueError)   a scenario, fault spec or cluster parameter is wrong
                                              (the message names the file and line or flag, the key path,
                                              expected vs got)

The CLI prints it as one line (exit 2), like every :class:`whywait.errors.WhywaitError`.
"""

from __future__ import annotations

from whywait.errors import WhywaitError


class SimulationError(WhywaitError, ValueError):
    """A scenario file, ``--fault`` spec or cluster parameter cannot be used as given."""
