"""The simulator's exception tree.

::

    SimulationError (ValueError)   a scenario, fault spec or cluster parameter is wrong
                                   (the message names the file or flag, the key path, expected vs got)

``agents`` must not import ``engine``; ``whywait simulate`` turns this into
``whywait.engine.errors.ConfigError`` so it prints as one line.
"""

from __future__ import annotations


class SimulationError(ValueError):
    """A scenario file, ``--fault`` spec or cluster parameter cannot be used as given."""
