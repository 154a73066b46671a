"""Output paths a command writes, checked before the command does its work.

Why: ``whywait replay --report DIR`` or ``whywait export -o FILE`` can read for minutes before writing
anything.  A path in a folder that does not exist, on a read-only file system or under a file used to
end that work with an ``internal error`` traceback line, after the work was done and thrown away.  Each
command calls :func:`check_outputs` first, with its output flags, and a bad one is refused at once in
one line naming the flag, the path and why (exit 2).

The check *tries* what the command will do (create the folder; open the file for writing) instead of
asking ``os.access``: run as root, ``os.access`` says yes to ``/proc`` and to read-only mounts alike.
A file that did not exist is removed again, so a command refused later leaves nothing behind; a folder
for a report is created and kept (the command would create it anyway).
"""

from __future__ import annotations

import errno
import os
import tempfile
from pathlib import Path
from typing import Iterable

from whywait.engine.errors import ConfigError

__all__ = ["check_output", "check_outputs", "image_formats"]


def _why(err: OSError) -> str:
    return err.strerror or (errno.errorcode.get(err.errno, "") if err.errno else "") or type(err).__name__


def image_formats() -> list[str]:
    """The file suffixes (without the dot, lower case) matplotlib can write a figure as."""
    from matplotlib.backend_bases import FigureCanvasBase

    return sorted(FigureCanvasBase.get_supported_filetypes())


def check_output(path: Path | str | None, flag: str, *, folder: bool = False, image: bool = False) -> None:
    """Refuse ``path`` (given as ``flag``) if the command could not write it; None (no output asked) passes.

    Called by a command before its work.  ``folder``: the command writes files into ``path`` (created
    with its parents, as the command would).  ``image``: matplotlib draws the file, in the format its
    suffix names (``--plot out.txt`` used to end the whole run in an internal error; a name without a
    suffix was written as ``out.png``, not the name given).  ``-`` is refused: these outputs are files,
    and stdout carries the command's summary.  Raises :class:`ConfigError` (exit 2) naming the flag,
    the path and the reason; returns None when the path can be written.
    """
    if path is None:
        return
    p = Path(path)
    where = f"{flag} {p}"
    if str(path) == "-":
        raise ConfigError(f"{where}: writing to stdout is not supported (the command's summary goes there): "
                          "name a file")
    if folder:
        if p.exists() and not p.is_dir():
            raise ConfigError(f"{where}: is a file, not a folder")
        try:
            p.mkdir(parents=True, exist_ok=True)
        except OSError as err:
            raise ConfigError(f"{where}: cannot create the folder ({_why(err)})") from None
        try:
            with tempfile.TemporaryFile(dir=p):
                pass
        except OSError as err:
            raise ConfigError(f"{where}: cannot write in this folder ({_why(err)})") from None
        return
    if p.is_dir():
        raise ConfigError(f"{where}: is a folder; name a file")
    parent = p.parent
    if not parent.is_dir():
        what = "is not a folder" if parent.exists() else "does not exist"
        raise ConfigError(f"{where}: its folder {parent} {what}")
    if image:
        formats = image_formats()
        suffix = p.suffix[1:].lower()
        if suffix not in formats:
            said = f"'.{suffix}' is not an image format matplotlib writes" if suffix else "it has no suffix"
            raise ConfigError(f"{where}: {said}: name a .png, .svg or .pdf file (or {', '.join(formats)})")
    existed = p.exists()
    try:
        # "a" keeps an existing file as it is (the command overwrites it later); "x" makes a new one
        with open(p, "ab" if existed else "xb"):
            pass
    except OSError as err:
        raise ConfigError(f"{where}: cannot write it ({_why(err)})") from None
    if not existed:
        try:
            os.unlink(p)
        except OSError:  # it could be made, so it will be made again; a leftover empty file is harmless
            pass


Output = tuple[Path | str | None, str]  # (path, the flag that gave it)


def check_outputs(outputs: Iterable[Output], folders: Iterable[Output] = (), images: Iterable[Output] = ()) -> None:
    """:func:`check_output` for each ``(path, flag)`` of ``folders``, then of ``outputs`` (files) and ``images``.

    The folders first: they are created as the command would create them, so ``--report DIR --plot
    DIR/x.png`` is not refused because DIR does not exist yet.
    """
    for path, flag in folders:
        check_output(path, flag, folder=True)
    for path, flag in outputs:
        check_output(path, flag)
    for path, flag in images:
        check_output(path, flag, image=True)
