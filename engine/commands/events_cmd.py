"""``whywait events``: print the event contract, or check a file of messages against it.

``whywait events doc`` prints the generated part of ``docs/events.md``;
``whywait events check FILE`` validates JSON lines (a producer author's check)
and prints one line per bad message with its line number and reason.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path


def register(p: argparse.ArgumentParser) -> None:
    sub = p.add_subparsers(dest="action", metavar="ACTION")
    sub.add_parser("doc", help="print the contract's field tables as Markdown")
    c = sub.add_parser("check", help="validate a file of JSON-lines messages against the contract")
    c.add_argument("file", type=Path, help="JSON lines; '-' for standard input")


def run(args: argparse.Namespace) -> int:
    from whywait.agents.events import ContractError, decode, render_markdown

    if args.action in (None, "doc"):
        print(render_markdown())
        return 0
    fh = sys.stdin if str(args.file) == "-" else args.file.open()
    bad = total = 0
    for i, line in enumerate(fh, 1):
        if not line.strip():
            continue
        total += 1
        try:
            decode(line)
        except ContractError as exc:
            bad += 1
            print(f"{args.file}:{i}: {exc}")
    print(f"{total - bad} valid, {bad} invalid", file=sys.stderr)
    return 1 if bad else 0
