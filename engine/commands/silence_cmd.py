"""``whywait silence add|list|expire``: manage the silences the notification pipeline applies (to every receiver).

Silences live in the compacted Kafka topic ``whywait.silences.v1``; the engine
follows it, so a silence added here applies within a second.  The broker is
``--bootstrap``, else ``$WHYWAIT_KAFKA_BOOTSTRAP``, else the local broker.

    whywait silence add --match job=llm-70b --for 2h --comment "maintenance" --by alice
    whywait silence list [--all]
    whywait silence expire 3f2a9c1b0d4e

A matcher must name a field or label a diagnosis carries (``jbo=x`` is refused, listing the valid
names, unless ``--force``), a ``rule_id`` pattern must match a rule's id (``rule_id=network.straggler-retransmit``
is refused with a did-you-mean, unless ``--force``): the names and ids are those of the rules the engine loads
(``./rules`` or the shipped ones, ``$WHYWAIT_RULES``, plus ``$WHYWAIT_SITE_RULES``) and of ``--rules PATH`` (a
site folder the engine is given another way), and ``--for`` needs a unit and lasts more than 0s and at most a year
(365d); everything is checked before anything is written.  A malformed silence, or an id that names
no silence, exits 2 (input); an unreachable broker exits 3.  ``list`` and ``expire`` take any silence
already stored, one set for longer by an older version too.
"""

from __future__ import annotations

import argparse
import difflib
import fnmatch
import getpass
import re
import time
from pathlib import Path
from typing import TYPE_CHECKING, Callable

from whywait.engine.errors import ConfigError
from whywait.engine.notify.silences import MAX_SILENCE_S, MAX_SILENCE_TEXT

if TYPE_CHECKING:
    from whywait.engine.notify.silences import SilenceStore
    from whywait.engine.rules.loader import RuleSet


def register(p: argparse.ArgumentParser) -> None:
    p.add_argument("--bootstrap", help="Kafka bootstrap (default: $WHYWAIT_KAFKA_BOOTSTRAP or the local broker)")
    sub = p.add_subparsers(dest="silence_command", metavar="ACTION", required=True)
    a = sub.add_parser("add", help="mute matching incidents for a while")
    a.add_argument("--match", "-m", action="append", required=True, metavar="NAME=PATTERN",
                   help="label or field (rule_id, job, culprit, severity, team, group...) and a glob; repeatable")
    a.add_argument("--for", dest="duration", default="1h",
                   help=f"how long, with a unit: 30m, 4h, 2d; more than 0s and at most {MAX_SILENCE_TEXT}, a year (1h)")
    # `--for -2h` reaches --for (to be refused in one line) rather than being taken for an unknown option, as
    # Python 3.13's argparse does by itself; argparse has no public switch for it.
    if hasattr(a, "_negative_number_matcher"):
        a._negative_number_matcher = re.compile(r"^-\.?\d")
    a.add_argument("--rules", action="append", type=_rules_arg, default=[], metavar="PATH",
                   help="more rules whose ids and labels a matcher may name, beside the engine's (./rules or the "
                        "shipped ones, plus $WHYWAIT_SITE_RULES): a site folder (repeatable)")
    a.add_argument("--force", action="store_true",
                   help="accept a matcher name no diagnosis carries, or a rule_id no loaded rule has (a label or "
                        "rule only your own rules set)")
    a.add_argument("--comment", default="", help="why")
    a.add_argument("--by", default=None, help="who (default: your login name)")
    ls = sub.add_parser("list", help="show the silences in force")
    ls.add_argument("--all", action="store_true", help="include expired ones")
    e = sub.add_parser("expire", help="end a silence now")
    e.add_argument("id", help="the silence id (from `whywait silence list`)")


def _rules_arg(text: str) -> Path:
    from whywait.engine.commands.rules_cmd import rules_path_arg

    return rules_path_arg(text)


def _open_kafka_store(bootstrap: str | None) -> SilenceStore:
    from whywait.engine.localkafka.broker import resolve_bootstrap
    from whywait.engine.notify.silences import KafkaSilenceStore

    return KafkaSilenceStore(resolve_bootstrap(flag=bootstrap), follow=False)


# Tests replace this to run the command against an in-memory store.
open_store: Callable[[str | None], SilenceStore] = _open_kafka_store


def _rules(rule_paths: list[Path] | None = None, more: list[Path] | None = None) -> RuleSet | None:
    """The rules under ``rule_paths`` (default: those the engine loads without ``--rules``) and ``more`` after
    them (``--rules``: a site folder overriding shipped rules is loaded after them); None when the default rules
    do not load (broken rules are the engine's and ``rules check``'s to report).  Rules named with ``--rules``
    that do not load raise :class:`SilenceError`: the user asked for them."""
    from whywait.engine.commands.engine_cmd import default_rule_paths
    from whywait.engine.errors import RuleError
    from whywait.engine.notify.silences import SilenceError
    from whywait.engine.rules.loader import load_rules

    try:
        return load_rules([*(rule_paths if rule_paths is not None else default_rule_paths()), *(more or [])])
    except RuleError as exc:
        if more:
            # Named on this command line: a folder that does not load would leave every check undone, silently.
            first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
            raise SilenceError(f"--rules: the rules do not load: {first}") from None
        return None


def matchable_names(rule_paths: list[Path] | None = None, more: list[Path] | None = None,
                    rules: RuleSet | None = None) -> set[str]:
    """The names a silence can match on: the incident's fields, the labels the evaluator gives a culprit,
    and every label the rules set (``rules``, else those :func:`_rules` loads from ``rule_paths`` and ``more``)."""
    from whywait.engine.notify.silences import MATCH_FIELDS
    from whywait.engine.rules.schema import GROUP_LABELS

    names = {*MATCH_FIELDS, *GROUP_LABELS, "superseded_by"}
    rules = rules if rules is not None else _rules(rule_paths, more)
    if rules is None:  # the fixed names still hold
        return names
    return names | {k for r in rules.rules.values() for k in r.labels}


def check_names(matchers: dict[str, str], more: list[Path] | None = None) -> None:
    """Refuse a matcher name no diagnosis carries (``jbo=x`` would silence nothing, silently), and a ``rule_id``
    pattern no loaded rule's id matches (``rule_id=network.straggler-retransmit``, an ``s`` short, was stored and
    matched nothing).  ``more``: rules beside the engine's (``--rules``), whose labels and ids count too."""
    from whywait.engine.notify.silences import MATCH_FIELDS, SilenceError

    unknown = [k for k in matchers if k not in MATCH_FIELDS]
    if not unknown and "rule_id" not in matchers and not more:  # the usual case needs no rule loading
        return
    rules = _rules(None, more)
    valid = matchable_names(rules=rules)
    unknown = [k for k in unknown if k not in valid]
    if unknown:
        k = unknown[0]
        raise SilenceError(f"-m {k}={matchers[k]}: unknown name {k!r}: no diagnosis carries it, so the silence would "
                           f"match nothing (valid: {', '.join(sorted(valid))}; --rules PATH to count a site "
                           f"folder's labels; --force if your own rules set it)")
    pattern = matchers.get("rule_id")
    if pattern is None or rules is None:
        return
    ids = sorted({*rules.rules, *rules.disabled})  # a disabled rule is known: it may be enabled again
    if not any(fnmatch.fnmatchcase(i, pattern) for i in ids):
        near = difflib.get_close_matches(pattern, ids, n=1)
        hint = f"did you mean {near[0]!r}? " if near else ""
        raise SilenceError(f"-m rule_id={pattern}: no loaded rule's id matches it, so the silence would match "
                           f"nothing; {hint}(--rules PATH to count a site folder's rules; --force if the engine "
                           "loads rules this command does not)")


def _duration(text: str) -> float:
    """Seconds of ``--for``: a unit is required (``--for 2`` is more likely 2 hours than 2 seconds), more than 0s
    and at most :data:`MAX_SILENCE_S` (a year)."""
    from whywait.durations import parse_duration
    from whywait.errors import DurationError

    if text.strip().startswith("-"):
        raise ConfigError(f"--for must be a positive duration like 30m, 4h or 2d (got {text!r})")
    try:
        seconds = parse_duration(text, "--for")
    except DurationError:
        hint = ""
        if re.fullmatch(r"\d+(?:\.\d+)?", text.strip()):
            n = text.strip()
            hint = f"; a bare number has no unit: write {n}h, {n}m or {n}s"
        raise ConfigError(f"--for must be a duration like 30m, 4h or 2d (got {text!r}){hint}") from None
    if not seconds > 0:
        raise ConfigError(f"--for must be longer than 0s (got {text!r})")
    if not seconds <= MAX_SILENCE_S:  # an infinite sum of digits too
        raise ConfigError(f"--for must be at most {MAX_SILENCE_TEXT} (a year; got {text!r}); "
                          "add a new silence when this one ends")
    return seconds


def _when(t: float | None) -> str:
    from whywait.engine.notify.format import fmt_time

    return "until resolved" if t is None else fmt_time(t)


def run(args: argparse.Namespace) -> int:
    from whywait.engine.notify.silences import Silence, parse_matchers

    silence: Silence | None = None
    if args.silence_command == "add":
        matchers = parse_matchers(args.match)
        if not args.force:
            check_names(matchers, getattr(args, "rules", None))
        duration = _duration(args.duration)
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
        rows = [(s.id, _when(s.ends_at) + ("" if s.active(now) else " (expired)"), s.created_by,
                 " ".join(f"{k}={v}" for k, v in s.matchers.items()) + (f"  # {s.comment}" if s.comment else ""))
                for s in items]
        # each column as wide as its widest cell: an expired or unbounded end ran the BY column out of line
        w_id, w_until, w_by = (max(len(h), *(len(r[i]) for r in rows)) for i, h in enumerate(("ID", "UNTIL", "BY")))
        print(f"{'ID':<{w_id}} {'UNTIL':<{w_until}} {'BY':<{w_by}} MATCHERS / COMMENT")
        for sid, until, by, rest in rows:
            print(f"{sid:<{w_id}} {until:<{w_until}} {by:<{w_by}} {rest}")
        return 0
    finally:
        store.close()
