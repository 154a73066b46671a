"""The topology package's exception tree.

::

    TopologyError (ValueError)   a topology source is malformed, or a call names an unknown entity
    └── UnknownEntityError       a query or a placement names a node, GPU, switch, pool or job
                                 the topology does not hold

``topology`` must not import ``engine``; the engine catches :class:`TopologyError`
and wraps it in ``whywait.engine.errors.TopologyError`` so the CLI prints it as one line.
"""

from __future__ import annotations

from typing import Sequence


class TopologyError(ValueError):
    """A topology cannot be built from its source, or a call names something it lacks.

    ``problems`` holds one complete line per problem, each naming the source, the
    line when known, the key path, and what was expected against what was found::

        topo.yaml:14: nodes[2].nics[0].leaf: expected a switch of tier 'leaf' (got 'leaf-09')

    All the problems of one file are reported together: the string form is the
    single problem, or a count followed by every problem on its own line.
    """

    def __init__(self, problems: Sequence[str] | str, source: str = "") -> None:
        self.source = source
        self.problems: tuple[str, ...] = (problems,) if isinstance(problems, str) else tuple(problems)
        if len(self.problems) == 1:
            text = self.problems[0]
        else:
            where = f" in {source}" if source else ""
            text = f"{len(self.problems)} problems{where}:\n" + "\n".join(f"  {p}" for p in self.problems)
        super().__init__(text)


class UnknownEntityError(TopologyError):
    """A query or placement names an entity (node, GPU, switch, pool, job) the topology lacks.

    ``kind`` is what was looked up (``node``, ``switch``...), ``name`` the missing id.
    """

    def __init__(self, kind: str, name: str, hint: str = "") -> None:
        self.kind = kind
        self.name = name
        super().__init__(f"unknown {kind} {name!r}{' (' + hint + ')' if hint else ''}", source="topology")
