"""``whywait notify``: see a message before it is sent, or send one.

``whywait notify render FILE`` prints, for a diagnosis (the JSON written to the
diagnoses topic, ``Diagnosis.to_dict``; a JSON list is rendered as one grouped
message), the Block Kit payload ``chat.postMessage`` would get and the plain-text
preview, so a rule author sees the message before anyone receives it.

``whywait notify send FILE`` delivers it through the configured notifier (Slack
when ``SLACK_BOT_TOKEN`` is set, else the console), to check a Slack setup.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

from whywait.engine.errors import ConfigError


def register(p: argparse.ArgumentParser) -> None:
    sub = p.add_subparsers(dest="notify_command", metavar="ACTION", required=True)
    r = sub.add_parser("render", help="print the Block Kit JSON and the plain-text preview of a diagnosis")
    r.add_argument("file", help="diagnosis JSON file (or '-' for stdin); a list is rendered as one group")
    r.add_argument("--format", choices=("both", "json", "text"), default="both", help="what to print (both)")
    r.add_argument("--dashboard-url", help="dashboard link template (default: $WHYWAIT_DASHBOARD_URL)")
    s = sub.add_parser("send", help="deliver a diagnosis through the configured notifier")
    s.add_argument("file", help="diagnosis JSON file (or '-' for stdin)")
    s.add_argument("--timeout", type=float, default=30.0, help="seconds to wait for delivery (30)")


def load_diagnoses(path: str) -> list[Any]:
    """Diagnoses from a JSON file holding one ``Diagnosis.to_dict`` object or a list of them."""
    from whywait.engine.diagnosis import Diagnosis

    try:
        raw = sys.stdin.read() if path == "-" else Path(path).read_text(encoding="utf-8")
    except OSError as exc:
        raise ConfigError(f"{path}: cannot read ({exc.strerror or exc})") from None
    try:
        data = json.loads(raw)
    except json.JSONDecodeError as exc:
        raise ConfigError(f"{path}:{exc.lineno}: not JSON ({exc.msg})") from None
    items = data if isinstance(data, list) else [data]
    out = []
    for i, item in enumerate(items):
        where = f"{path}" + (f"[{i}]" if isinstance(data, list) else "")
        if not isinstance(item, dict):
            raise ConfigError(f"{where}: a diagnosis must be a JSON object (got {type(item).__name__})")
        try:
            out.append(Diagnosis.from_dict(item))
        except TypeError as exc:
            raise ConfigError(f"{where}: not a diagnosis ({exc})") from None
    if not out:
        raise ConfigError(f"{path}: no diagnosis in it")
    return out


def run(args: argparse.Namespace) -> int:
    import os

    from whywait.engine.notify.render import MessageContext, fallback_text, merge, plain_text, render_blocks

    diagnoses = load_diagnoses(args.file)
    if args.notify_command == "send":
        from whywait.engine.notify import make_notifier

        with make_notifier() as notifier:
            for d in diagnoses:
                notifier.notify(d)
            ok = notifier.flush(args.timeout)
        print("delivered" if ok else f"not all delivered within {args.timeout:.0f}s", file=sys.stderr)
        return 0 if ok else 1

    from whywait.engine.notify.config import SlackConfig, _check_dashboard_template
    from whywait.engine.notify.lifecycle import group_key, incident_id, routed_channel

    template = args.dashboard_url or os.environ.get("WHYWAIT_DASHBOARD_URL") or None
    if template:
        _check_dashboard_template(template)
    d = merge(diagnoses)
    config = SlackConfig()
    ctx = MessageContext(key=incident_id(group_key(d, config.group_by)), mention=config.mentions.get(d.severity),
                         members=len(diagnoses), dashboard_url_template=template)
    if args.format in ("both", "json"):
        payload = {"channel": routed_channel(d, config), "text": fallback_text(d, ctx), "blocks": render_blocks(d, ctx)}
        print(json.dumps(payload, indent=2, ensure_ascii=False))
    if args.format == "both":
        print()
    if args.format in ("both", "text"):
        sys.stdout.write(plain_text(d, dashboard_url_template=template))
    return 0
