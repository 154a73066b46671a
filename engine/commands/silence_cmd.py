"""``whywait silence add|list|expire``: manage the silences the Slack notifier applies.

Silences live in the compacted Kafka topic ``whywait.silences.v1``; the engine
follows it, so a silence added here applies within a second.  The broker is
``--bootstrap``, else ``$WHYWAIT_KAFKA_BOOTSTRAP``, else the local broker.

    whywait silence add --match job=llm-70b --for 2h --comment "maintenance" --by alice
    whywait silence list [--all]
    whywait silence expire 3f2a9c1b0d4e
"""

from __future__ import annotations

import argparse
import getpass
import time
from typing import TYPE_CHECKING, Callable

from whywait.engine.errors import ConfigError

if TYPE_CHECKING:
    from whywait.engine.notify.silences import SilenceStore


def register(p: argparse.ArgumentParser) -> None:
    p.add_argument("--bootstrap", help="Kafka bootstrap (default: $WHYWAIT_KAFKA_BOOTSTRAP or the local broker)")
    sub = p.add_subparsers(dest="silence_command", metavar="ACTION", required=True)
    a = sub.add_parser("add", help="mute matching incidents for a while")
    a.add_argument("--match", "-m", action="append", required=True, metavar="NAME=PATTERN",
                   help="label or field (rule_id, job, culprit, severity, team, group...) and a glob; repeatable")
    a.add_argument("--for", dest="duration", default="1h", help="how long, e.g. 30m, 4h, 2d (1h)")
    a.add_argument("--comment", default="", help="why")
    a.add_argument("--by", default=None, help="who (default: your login name)")
    ls = sub.add_parser("list", help="show the silences in force")
    ls.add_argument("--all", action="store_true", help="include expired ones")
    e = sub.add_parser("expire", help="end a silence now")
    e.add_argument("id", help="the silence id (from `whywait silence list`)")


def _open_kafka_store(bootstrap: str | None) -> SilenceStore:
    from whywait.engine.localkafka.broker import resolve_bootstrap
    from whywait.engine.notify.silences import KafkaSilenceStore

    return KafkaSilenceStore(bootstrap or resolve_bootstrap(), follow=False)


# Tests replace this to run the command against an in-memory store.
open_store: Callable[[str | None], SilenceStore] = _open_kafka_store


def _when(t: float | None) -> str:
    return "until resolved" if t is None else time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime(t))


def run(args: argparse.Namespace) -> int:
    from whywait.engine.notify.config import parse_duration
    from whywait.engine.notify.silences import Silence, parse_matchers

    silence: Silence | None = None
    if args.silence_command == "add":
        matchers = parse_matchers(args.match)
        duration = parse_duration(args.duration, "--for")
        if duration <= 0:
            raise ConfigError(f"--for must be longer than 0s (got {args.duration!r})")
        silence = Silence.new(matchers, duration=duration, created_by=args.by or getpass.getuser(),
                              comment=args.comment)
    store = open_store(args.bootstrap)
    try:
        if silence is not None:
            store.add(silence)
            print(f"{silence.id}  until {_when(silence.ends_at)}  "
                  + " ".join(f"{k}={v}" for k, v in silence.matchers.items()))
            return 0
        if args.silence_command == "expire":
            ended = store.expire(args.id, by=getpass.getuser())
            print(f"{ended.id}  ended {_when(ended.ends_at)}")
            return 0
        now = time.time()
        items = store.all() if args.all else store.active(now)
        if not items:
            print("no silences" + ("" if args.all else " in force"))
            return 0
        print(f"{'ID':<13} {'UNTIL':<24} {'BY':<12} MATCHERS / COMMENT")
        for s in items:
            state = "" if s.active(now) else " (expired)"
            shown = " ".join(f"{k}={v}" for k, v in s.matchers.items())
            comment = f"  # {s.comment}" if s.comment else ""
            print(f"{s.id:<13} {_when(s.ends_at) + state:<24} {s.created_by:<12} {shown}{comment}")
        return 0
    finally:
        store.close()
