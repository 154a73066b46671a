"""Files of JSON messages: JSON lines (what ``--print`` and the topics hold), or one JSON array of them.

Read by ``whywait events check`` and ``whywait topology import agent``, so a file saved from any of
whywait's outputs, or a hand-made list, is accepted without converting it first.  :func:`loads` is
``json.loads`` for input whywait did not write (files, records, HTTP bodies): nesting deeper than the
parser's stack is a ``JSONDecodeError`` like any other bad JSON, not a ``RecursionError`` that no
``except ValueError`` catches.
"""

from __future__ import annotations

import itertools
import json
import re
from typing import Any, Iterable, Iterator

_SPACE = re.compile(r"\s*")


def loads(text: str | bytes | bytearray) -> Any:
    """``json.loads(text)``; JSON nested past the parser's stack raises ``json.JSONDecodeError`` (a ``ValueError``)."""
    try:
        return json.loads(text)
    except RecursionError:
        doc = text if isinstance(text, str) else ""  # JSONDecodeError counts lines in a str only
        raise json.JSONDecodeError("nested too deeply", doc, 0) from None


def json_records(lines: Iterable[str]) -> Iterator[tuple[int, str]]:
    """``(line number, JSON text)`` of each message in ``lines`` (a text file, read lazily).

    JSON lines give each non-blank line.  A file that is one JSON array (``[{...}, {...}]``, pretty-printed
    or not) gives each element's text instead, numbered by the line it starts on.  Blank lines are skipped;
    a line that is not JSON is given as it is, for the caller to report with its line number.
    """
    it = iter(lines)
    head: list[str] = []
    for line in it:
        head.append(line)
        if line.strip():
            break
    if not head or not head[-1].lstrip().startswith("["):
        yield from _lines(head, it)
        return
    head.extend(it)  # an array is parsed whole: read the rest
    text = "".join(head)
    try:
        whole = json.loads(text)
    except (json.JSONDecodeError, RecursionError):  # nested past the parser's stack: not an array of messages
        whole = None
    if not isinstance(whole, list):  # JSON lines whose first line happens to be an array
        yield from _lines(head, iter(()))
        return
    yield from _elements(text)


def _lines(head: list[str], rest: Iterator[str]) -> Iterator[tuple[int, str]]:
    for n, line in enumerate(itertools.chain(head, rest), 1):
        if line.strip():
            yield n, line


def _skip(text: str, i: int) -> int:
    """The index of the first character at or after ``i`` that is not white space."""
    m = _SPACE.match(text, i)
    return m.end() if m else i


def _elements(text: str) -> Iterator[tuple[int, str]]:
    """The elements of the JSON array ``text`` (known to parse), each as its own text, with its line."""
    decoder = json.JSONDecoder()
    i = _skip(text, text.index("[") + 1)
    line, counted = 1, 0
    while text[i] != "]":
        _, end = decoder.raw_decode(text, i)
        line += text.count("\n", counted, i)
        counted = i
        yield line, text[i:end]
        i = _skip(text, end)
        if text[i] == ",":
            i = _skip(text, i + 1)
