"""``whywait notify``: see a message before it is sent, or send one.

``whywait notify render FILE`` prints, for a diagnosis (the JSON written to the
diagnoses topic, ``Diagnosis.to_dict``; a JSON list is rendered as one grouped
message; JSON lines, as ``whywait replay --json`` writes, one message per line),
the Block Kit payload ``chat.postMessage`` would get and the plain-text preview,
so a rule author sees the message before anyone receives it.

``whywait notify send FILE`` delivers it through the configured notifier (Slack
when ``SLACK_BOT_TOKEN`` is set, else the console), to check a Slack setup.  The
silences in force apply to it as they do to the engine's notifications (read from
Kafka: ``$WHYWAIT_KAFKA_BOOTSTRAP`` or the local broker; without one it says so and
sends).  It exits 0 when everything was delivered or held by a silence (which it
names), 1 when a receiver refused a delivery, 3 when a receiver could not be reached
within ``--timeout`` (nothing is kept for later: it says so once).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

from whywait.engine.errors import ConfigError

from whywait import jsonl

if TYPE_CHECKING:
    from whywait.engine.notify.silences import SilenceStore


def register(p: argparse.ArgumentParser) -> None:
    sub = p.add_subparsers(dest="notify_command", metavar="ACTION", required=True)
    r = sub.add_parser("render", help="print the Block Kit JSON and the plain-text preview of a diagnosis")
    r.add_argument("file", help="diagnosis JSON file (or '-' for stdin); a list is rendered as one group, JSON lines "
                                "(replay --json) one message per line")
    r.add_argument("--format", choices=("both", "json", "text"), default="both", help="what to print (both)")
    r.add_argument("--dashboard-url", help="dashboard link template (default: $WHYWAIT_DASHBOARD_URL)")
    s = sub.add_parser("send", help="deliver a diagnosis through the configured notifier (silences apply)",
                       description="Deliver a diagnosis through the configured notifier; the silences in force "
                                   "apply.  Exit 0: delivered, or held by a silence (named); 1: a receiver refused "
                                   "it; 3: a receiver could not be reached within --timeout.")
    s.add_argument("file", help="diagnosis JSON file or JSON lines (or '-' for stdin)")
    s.add_argument("--timeout", type=float, default=30.0, help="seconds to wait for delivery (30)")


def load_messages(path: str) -> list[list[Any]]:
    """The messages a file holds, each as the diagnoses it groups.

    A JSON document is one message: one ``Diagnosis.to_dict`` object, or a list of them rendered as
    one group.  JSON lines (what ``whywait replay --json`` writes) are one message per line, each an
    object or a list.  Every problem names the file and line (and the list index).
    """
    try:
        raw = sys.stdin.read() if path == "-" else Path(path).read_text(encoding="utf-8")
    except OSError as exc:
        raise ConfigError(f"{path}: cannot read ({exc.strerror or exc})") from None
    except UnicodeDecodeError:
        raise ConfigError(f"{path}: cannot read (not UTF-8 text)") from None
    try:
        docs = [(path, jsonl.loads(raw))]
    except json.JSONDecodeError as exc:
        if exc.msg != "Extra data":
            raise ConfigError(f"{path}:{exc.lineno}: not JSON ({exc.msg})") from None
        docs = []  # more than one document: JSON lines
        for n, line in enumerate(raw.splitlines(), 1):
            if not line.strip():
                continue
            try:
                docs.append((f"{path}:{n}", jsonl.loads(line)))
            except json.JSONDecodeError as exc:
                raise ConfigError(f"{path}:{n}: not JSON ({exc.msg}); expected one diagnosis a line") from None
    groups = [_diagnoses(where, data) for where, data in docs]
    if not groups:
        raise ConfigError(f"{path}: no diagnosis in it")
    return groups


def load_diagnoses(path: str) -> list[Any]:
    """Every diagnosis ``path`` holds (see :func:`load_messages`), in order."""
    return [d for group in load_messages(path) for d in group]


def _diagnoses(where: str, data: Any) -> list[Any]:
    from whywait.engine.diagnosis import Diagnosis, DiagnosisFormatError

    items = data if isinstance(data, list) else [data]
    out = []
    for i, item in enumerate(items):
        at = where + (f"[{i}]" if isinstance(data, list) else "")
        if not isinstance(item, dict):
            raise ConfigError(f"{at}: a diagnosis must be a JSON object (got {type(item).__name__})")
        try:
            out.append(Diagnosis.from_dict(item))
        except (TypeError, DiagnosisFormatError) as exc:
            raise ConfigError(f"{at}: not a diagnosis ({exc})") from None
    if not out:
        raise ConfigError(f"{where}: no diagnosis in it")
    return out


def run(args: argparse.Namespace) -> int:
    import os

    from whywait.engine.notify.render import MessageContext, fallback_text, merge, plain_text, render_blocks

    messages = load_messages(args.file)
    if args.notify_command == "send":
        return _send([d for group in messages for d in group], args.timeout)

    from whywait.engine.notify.pipeline import PipelineConfig, group_key, incident_id, routed_channel
    from whywait.engine.notify.receivers.slack import SlackSettings, check_dashboard_template

    template = args.dashboard_url or os.environ.get("WHYWAIT_DASHBOARD_URL") or None
    if template:
        check_dashboard_template(template)
    pipeline, slack = PipelineConfig(), SlackSettings()
    for i, diagnoses in enumerate(messages):
        if i:
            print()
        d = merge(diagnoses)
        ctx = MessageContext(key=incident_id(group_key(d, pipeline.group_by)), mention=slack.mentions.get(d.severity),
                             members=len(diagnoses), dashboard_url_template=template)
        if args.format in ("both", "json"):
            payload = {"channel": routed_channel(d, pipeline), "text": fallback_text(d, ctx),
                       "blocks": render_blocks(d, ctx)}
            print(json.dumps(payload, indent=2, ensure_ascii=False))
        if args.format == "both":
            print()
        if args.format in ("both", "text"):
            sys.stdout.write(plain_text(d, dashboard_url_template=template))
    return 0


def _silences() -> SilenceStore | None:
    """The silences in force, from the silences topic (as ``whywait silence list`` reads it); None, said on
    stderr, when no broker answers: a check of a receiver's setup must not need Kafka."""
    from whywait.engine.commands import silence_cmd
    from whywait.engine.errors import BrokerUnavailable
    from whywait.engine.localkafka.broker import probe, resolve_bootstrap

    try:
        bootstrap = resolve_bootstrap()
        if not probe(bootstrap, timeout=2.0):
            raise BrokerUnavailable(bootstrap, "no answer to ApiVersions")
        return silence_cmd.open_store(bootstrap)
    except BrokerUnavailable as exc:
        print(f"silences not checked: {exc}", file=sys.stderr)
        return None


def _send(diagnoses: list[Any], timeout: float) -> int:
    from whywait.engine.errors import NotifyError
    from whywait.engine.notify import make_notifier

    silences = _silences()
    # In memory: the default outbox folder is the engine's, and its waiting items, which this
    # process has no incident state for, would be taken and dropped.
    extra: dict[str, Any] = {} if silences is None else {"silence_store": silences, "close_stores": True}
    try:
        notifier = make_notifier(outbox=False, **extra)
    except BaseException:
        if silences is not None:
            silences.close()
        raise
    ok = False
    stats: dict[str, Any] = {}
    held: dict[str, Any] = {}
    problems: dict[str, str] = {}
    dropped: dict[str, int] = {}
    try:
        for d in diagnoses:
            notifier.notify(d)
        ok = notifier.flush(timeout)
        stats = notifier.stats()
        held = notifier.silenced()
        if not ok:  # given up: said once below, not also as "lost" when the notifier closes
            problems = notifier.problems()
            dropped = notifier.discard_pending()
    finally:
        notifier.close(timeout=1.0 if ok else 0.0)  # --timeout was the wait
    # Each silenced incident was named in the notifier's log line (its silence, until when, by whom).
    if not ok:
        n = sum(dropped.values()) or int(stats.get("waiting", 0))
        why = "; ".join(problems.values()) or "the receivers did not finish in time"
        raise NotifyError(f"not delivered within {timeout:g}s: {why}; {n} delivery(ies) dropped", retryable=True)
    refused = int(stats.get("failed", 0)) + int(stats.get("given_up", 0))
    if refused:
        print(f"{refused} delivery(ies) refused, dropped (the errors above say why)", file=sys.stderr)
        return 1
    if held and not int(stats.get("sent", 0)):
        ids = ", ".join(dict.fromkeys(s.id for s in held.values()))
        first = next(iter(held.values())).id
        print(f"not sent: silenced by {ids} (`whywait silence expire {first}` ends it)", file=sys.stderr)
    else:
        print("delivered", file=sys.stderr)
    return 0
