"""Read a user's text file (or stdin) as UTF-8, with a one-line error naming the file.

Called wherever whywait reads a file a person wrote or a tool dumped (ownership YAML, scontrol JSON,
placement files, node-type files, secrets).  ``Path.read_text`` raises ``UnicodeDecodeError`` on a
stray Latin-1 byte, which no ``except OSError`` catches: the CLI then reported an internal error.
Here both become the caller's own error class, so the line says which file and which byte.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Callable

__all__ = ["read_text"]


def read_text(path: str | Path, error: Callable[[str], Exception]) -> str:
    """The UTF-8 text of ``path`` (``"-"``: stdin); raises ``error("<path>: cannot read: <why>")`` when it can't.

    ``error`` builds the caller's exception from that one line, e.g. ``ConfigError`` or
    ``lambda m: TopologyError(m, source=str(path))``.
    """
    source = "<stdin>" if str(path) == "-" else str(path)
    try:
        if str(path) != "-":
            return Path(path).read_bytes().decode("utf-8")
        buffer = getattr(sys.stdin, "buffer", None)  # None: stdin replaced by a text stream (tests, embedding)
        return buffer.read().decode("utf-8") if buffer is not None else sys.stdin.read()
    except UnicodeDecodeError as exc:
        raise error(f"{source}: cannot read: not UTF-8 text (byte {exc.start})") from None
    except OSError as exc:
        raise error(f"{source}: cannot read: {exc.strerror or exc}") from None
