"""Getting recorded or foreign timing data in: whywait bundles, PyTorch-profiler traces, step CSV/JSONL.

Each importer turns a file into contract messages (``whywait.agents.events``) with their event
time kept, so ``whywait import`` can publish them to the topics and ``whywait replay``
can read them.  :data:`FORMATS` is the registry ``whywait import --format`` chooses from;
:func:`detect` picks one from a file's content when no format is given.

Errors are :class:`ImportFormatError` (a :class:`whywait.engine.errors.ConfigError`): one line
naming the file, the line or event, and what is wrong.
"""

from __future__ import annotations

from whywait.engine.errors import ConfigError


class ImportFormatError(ConfigError):
    """A file to import is unreadable or breaks its format; the message names file and line."""
