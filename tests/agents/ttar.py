"""A tiny extractor for ``ttar`` text archives (the node_exporter and procfs fixture format).

Entries, separated by ``# ttar - - -`` lines::

    Directory: sys/class        Path: sys/file          Path: sys/link
    Mode: 755                   Lines: 2                SymlinkTo: ../target
                                <2 lines of content>
                                Mode: 644
"""

from __future__ import annotations

import os


def extract(archive: str, dest: str) -> str:
    """Unpack ``archive`` under ``dest``; returns ``dest``."""
    with open(archive, encoding="utf-8", errors="surrogateescape") as fh:
        lines = fh.read().split("\n")
    i = 0
    symlinks: list[tuple[str, str]] = []
    while i < len(lines):
        line = lines[i]
        i += 1
        if line.startswith("Directory: "):
            os.makedirs(os.path.join(dest, line[len("Directory: "):]), exist_ok=True)
        elif line.startswith("Path: "):
            path = os.path.join(dest, line[len("Path: "):])
            nxt = lines[i]
            i += 1
            if nxt.startswith("SymlinkTo: "):
                symlinks.append((path, nxt[len("SymlinkTo: "):]))
                continue
            if not nxt.startswith("Lines: "):
                raise ValueError(f"{archive}:{i}: expected 'Lines:' or 'SymlinkTo:' (got {nxt!r})")
            words = nxt.split()
            n = int(words[1])
            body = lines[i:i + n]
            i += n
            text = "\n".join(body).replace("NULLBYTE", "\0") + ("" if "NoNewline" in words else "\n" if n else "")
            os.makedirs(os.path.dirname(path), exist_ok=True)
            with open(path, "w", encoding="utf-8", errors="surrogateescape") as out:
                out.write(text)
    for path, target in symlinks:  # after the files, so a link's target exists
        os.makedirs(os.path.dirname(path), exist_ok=True)
        if not os.path.lexists(path):
            os.symlink(target.rstrip("/") or "/", path)
    return dest
