"""Getting recorded or foreign timing data in: whywait bundles, PyTorch-profiler traces, step CSV/JSONL.

Each importer turns a file into contract messages (``whywait.agents.events``) with their event
time kept, so ``whywait import`` can publish them to the topics and ``whywait replay``
can read them.  :data:`FORMATS` is the registry ``whywait import --format`` chooses from;
:func:`detect` picks one from a file's content when no format is given.

Errors are :class:`ImportFormatError` (a :class:`whywait.engine.errors.ConfigError`): one line
naming the file, the line or event, and what is wrong.
"""

from __future__ import annotations

from typing import Iterable

from whywait.engine.errors import ConfigError


class ImportFormatError(ConfigError):
    """A file to import is unreadable or breaks its format; the message names file and line."""


def number_runs(ns: Iterable[int], sep: str = ", ", most: int = 6) -> str:
    """Sorted numbers as runs: ``[551, 552, 553, 560]`` as ``551-553, 560`` (the first ``most`` runs, joined by
    ``sep``, and how many more).  Called by the importers' notes on steps and ranks."""
    runs: list[list[int]] = []
    for n in ns:
        if runs and n == runs[-1][1] + 1:
            runs[-1][1] = n
        else:
            runs.append([n, n])
    text = sep.join(f"{a}" if a == b else f"{a}-{b}" for a, b in runs[:most])
    return text + (f" and {len(runs) - most} more runs" if len(runs) > most else "")
