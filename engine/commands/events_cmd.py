"""``whywait events``: print the event contract, or check a file of messages against it.

``whywait events doc`` prints the generated part of ``docs/events.md``;
``whywait events check FILE`` validates JSON lines, or one JSON array of messages
(``whywait agent --print`` writes the former; a saved list is accepted too), a
producer author's check, and prints one line per bad message with its line number
and reason.
"""

from __future__ import annotations

import argparse
import sys
from contextlib import nullcontext
from pathlib import Path
from typing import Iterator

from whywait.engine.errors import ConfigError


def register(p: argparse.ArgumentParser) -> None:
    sub = p.add_subparsers(dest="action", metavar="ACTION")
    sub.add_parser("doc", help="print the contract's field tables as Markdown")
    c = sub.add_parser("check", help="validate a file of JSON-lines messages against the contract")
    c.add_argument("file", type=Path, help="JSON lines, or one JSON array of messages; '-' for standard input")


def run(args: argparse.Namespace) -> int:
    from whywait.agents.events import ContractError, decode, render_markdown

    if args.action in (None, "doc"):
        print(render_markdown())
        return 0
    from whywait.jsonl import json_records

    bad = total = 0
    for i, line in json_records(_lines(args.file)):
        total += 1
        try:
            decode(line)
        except ContractError as exc:
            bad += 1
            print(f"{args.file}:{i}: {exc}")
    if not total:  # "0 valid, 0 invalid", exit 0, read as a pass for an empty capture (an agent that wrote nothing)
        raise ConfigError(f"{args.file}: holds no message (an empty file, or blank lines only): nothing to check")
    print(f"{total - bad} valid, {bad} invalid", file=sys.stderr)
    return 1 if bad else 0


def _lines(path: Path) -> Iterator[str]:
    """The lines of ``path`` ('-': standard input); a file that cannot be read is a :class:`ConfigError`
    in one line (exit 2), as any input the user named wrongly."""
    try:
        with (nullcontext(sys.stdin) if str(path) == "-" else path.open(encoding="utf-8")) as fh:
            yield from fh
    except OSError as exc:  # missing, a folder, unreadable
        raise ConfigError(f"{path}: cannot read: {exc.strerror or exc}") from None
    except UnicodeDecodeError:
        raise ConfigError(f"{path}: cannot read: not UTF-8 text") from None
