"""``whywait digest``: per project and job, GPU-hours used and lost to waiting by cause, over a period.

Reads the placements, step timings and diagnoses of the period from Kafka
(``whywait.engine.report.digest`` does the sums), prints a table, and writes Block Kit
(``--blocks``), JSON (``--json``) and a PNG bar chart (``--plot``).  ``--post`` sends
each team its own projects' digest in its channel (the placement's ``slack_channel``),
with the chart, e.g. weekly from cron: ``whywait digest --since 7d --post``.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import re
import time
from pathlib import Path
from typing import Any

from whywait import jsonl


def register(p: argparse.ArgumentParser) -> None:
    from whywait.engine.commands.replay_cmd import allow_relative_times

    allow_relative_times(p)
    p.add_argument("--since", default="7d", help="start of the period: 7d, -7d, ISO 8601 or Unix s (default 7d)")
    p.add_argument("--until", help="end of the period (default: now; +1h: ahead of now)")
    p.add_argument("--project", action="append", default=[], help="only these projects (repeatable)")
    p.add_argument("--bootstrap", help="Kafka bootstrap (default: WHYWAIT_KAFKA_BOOTSTRAP or the local broker)")
    p.add_argument("--json", type=Path, metavar="FILE", help="write the rows as JSON to FILE (a file: '-' is "
                                                              "refused, the table is printed on stdout)")
    p.add_argument("--blocks", type=Path, help="write the Slack Block Kit JSON")
    p.add_argument("--plot", type=Path, metavar="IMAGE", help="write the bar chart (its format by the suffix: .png, "
                                                              ".svg, .pdf, ...)")
    p.add_argument("--post", action="store_true", help="post each team's digest to its channel (SLACK_BOT_TOKEN)")


async def read_period(bootstrap: str, since: float, until: float, digest: Any) -> None:
    """Feed ``digest`` the placements, steps and diagnoses with event time in ``[since, until]``."""
    from aiokafka import AIOKafkaConsumer, TopicPartition
    from aiokafka.errors import KafkaError
    from whywait.agents.events import TOPIC_DIAGNOSES, TOPIC_PLACEMENT, TOPIC_STEPS, ContractError, decode
    from whywait.engine.errors import BrokerUnavailable, ConfigError
    from whywait.engine.localkafka.broker import probe

    if not probe(bootstrap, timeout=3.0):
        raise BrokerUnavailable(bootstrap, "nothing answers there")
    c = AIOKafkaConsumer(bootstrap_servers=bootstrap, enable_auto_commit=False, group_id=None,
                         auto_offset_reset="earliest")
    try:
        await asyncio.wait_for(c.start(), 20)
        topics = await c.topics()
        # Those that exist are read (no diagnoses topic before an engine has run: no incidents); none is one line.
        wanted = [t for t in (TOPIC_PLACEMENT, TOPIC_STEPS, TOPIC_DIAGNOSES) if t in topics]
        if not wanted:
            raise ConfigError(f"topic(s) {TOPIC_PLACEMENT}, {TOPIC_STEPS}, {TOPIC_DIAGNOSES} not found on {bootstrap}")
        for t in sorted({TOPIC_PLACEMENT, TOPIC_STEPS, TOPIC_DIAGNOSES} - set(wanted)):
            digest.notes.append(f"topic {t} not on {bootstrap}: nothing read from it")
        tps = [TopicPartition(t, p) for t in wanted for p in sorted(c.partitions_for_topic(t) or {0})]
        c.assign(tps)
        ends = await c.end_offsets(tps)
        starts = await c.offsets_for_times({tp: max(0, int((since - 86400) * 1000)) for tp in tps})
        # Explicit seeks, never seek_to_beginning: see replay_cmd.seek_to_log_start (a background reset
        # to "latest" could land after it and put a placement partition at its end, unread).
        from whywait.engine.commands.replay_cmd import seek_to_log_start

        await seek_to_log_start(c, [tp for tp in tps if tp.topic == TOPIC_PLACEMENT or starts.get(tp) is None])
        for tp in tps:
            off = starts.get(tp)
            if not (tp.topic == TOPIC_PLACEMENT or off is None):
                c.seek(tp, off.offset)
        pending = {tp for tp in tps if await c.position(tp) < ends[tp]}
        while pending:
            batch = await c.getmany(*pending, timeout_ms=2000, max_records=5000)
            if not batch:
                break
            for tp, recs in batch.items():
                for r in recs:
                    if r.value is None or r.offset >= ends[tp]:
                        continue
                    if tp.topic == TOPIC_DIAGNOSES:
                        try:
                            digest.add_diagnosis(jsonl.loads(r.value))
                        except (ValueError, KeyError, TypeError):
                            digest.skipped[f"unreadable diagnosis on {tp.topic}"] += 1
                        continue
                    try:
                        digest.add(decode(r.value, tp.topic))
                    except ContractError:
                        digest.skipped[f"contract break on {tp.topic}"] += 1
                if await c.position(tp) >= ends[tp]:
                    pending.discard(tp)
    except (KafkaError, OSError, asyncio.TimeoutError) as exc:
        raise BrokerUnavailable(bootstrap, type(exc).__name__) from None
    finally:
        await c.stop()


def run(args: argparse.Namespace) -> int:
    from whywait.engine.commands.outputs import check_outputs
    from whywait.engine.commands.replay_cmd import _fmt, parse_time
    from whywait.engine.errors import ConfigError
    from whywait.engine.localkafka.broker import resolve_bootstrap
    from whywait.engine.report.digest import Digest

    if args.post:  # refused now, not after the period was read and the table printed
        slack_token()
    now = time.time()
    # "7d" means the last seven days, as "-7d" does
    since_arg = "-" + args.since if re.fullmatch(r"\d+(\.\d+)?[smhdw]", args.since.strip()) else args.since
    since = parse_time(since_arg, now, "--since")
    until = parse_time(args.until, now, "--until") if args.until else now
    if until <= since:
        raise ConfigError(f"--until ({_fmt(until)}) must be after --since ({_fmt(since)})")
    check_outputs([(args.json, "--json"), (args.blocks, "--blocks")], images=[(args.plot, "--plot")])
    digest = Digest(since, until, projects=frozenset(args.project))
    asyncio.run(read_period(resolve_bootstrap(flag=args.bootstrap), since, until, digest))
    digest.finish()
    rows = digest.rows()
    print(f"useful GPU time from {_fmt(since)} to {_fmt(until)} UTC")
    print(f"  {'project / job':40} {'used GPU-h':>12} {'lost GPU-h':>12}  lost by cause")
    for r in rows:
        causes = ", ".join(f"{c} {v:.2f}" for c, v in sorted(r["lost_by_cause"].items(), key=lambda x: -x[1]))
        print(f"  {r['project'] + ' / ' + r['job']:40} {r['gpu_hours_used']:12.2f} {r['gpu_hours_lost']:12.2f}"
              f"  {causes or '-'}")
    for why, n in sorted(digest.skipped.items()):
        print(f"  skipped {n}: {why}")
    for note in digest.notes:
        print(f"  note: {note}")
    for project in sorted(set(args.project) - {r["project"] for r in rows}):
        print(f"  note: --project {project}: no job of it in the period (projects: {_few(digest.projects_seen())})")
    if args.json:
        args.json.write_text(json.dumps(rows, indent=2, sort_keys=True) + "\n")
    if args.blocks:
        args.blocks.write_text(json.dumps(digest.blocks(), indent=2) + "\n")
    if args.plot:
        digest.plot(args.plot)
        print(f"chart: {args.plot}")
    if args.post:
        post(digest, rows)
    return 0


def post(digest: Any, rows: list[dict[str, Any]]) -> None:
    """Send each channel the digest of the projects that name it, with the chart."""
    import os
    import tempfile

    from slack_sdk import WebClient
    from slack_sdk.errors import SlackApiError, SlackClientError
    from whywait.engine.errors import NotifyError
    from whywait.engine.report.digest import messages

    client = WebClient(token=slack_token().reveal(),
                       base_url=os.environ.get("WHYWAIT_SLACK_API_URL") or WebClient.BASE_URL)
    by_channel: dict[str, set[str]] = {}
    for r in rows:
        ch = r["channel"] or os.environ.get("WHYWAIT_SLACK_CHANNEL")
        if ch:
            by_channel.setdefault(ch, set()).add(r["project"])
    with tempfile.TemporaryDirectory() as tmp:
        png = digest.plot(Path(tmp) / "digest.png")
        try:
            for ch, projects in sorted(by_channel.items()):
                blocks = [b for i, p in enumerate(sorted(projects)) for b in digest.blocks(p)[(1 if i else 0):]]
                first, *more = messages(blocks)
                resp = client.chat_postMessage(channel=ch, text="Useful GPU time digest", blocks=first)
                for rest in more:  # what passes one message's limits goes into its thread
                    client.chat_postMessage(channel=resp["channel"], thread_ts=resp["ts"],
                                            text="Useful GPU time digest (continued)", blocks=rest)
                client.files_upload_v2(channel=resp["channel"], thread_ts=resp["ts"], file=str(png),
                                       filename="digest.png", title="GPU-hours used and lost by cause")
                print(f"posted to {ch}" + (f" ({1 + len(more)} messages)" if more else ""))
        except SlackApiError as exc:
            raise NotifyError(f"Slack refused the digest: {exc.response.get('error')}", retryable=False) from None
        except (SlackClientError, OSError) as exc:  # as `replay --slack-thread` says it: one line, not a bug
            raise NotifyError(f"Slack unreachable: {exc}", retryable=True) from None


def slack_token() -> Any:
    """The bot token ``--post`` needs; a ConfigError (one line, exit 2) when it is not set."""
    from whywait.engine.errors import ConfigError
    from whywait.engine.notify.secrets import read_secret

    token = read_secret("SLACK_BOT_TOKEN")
    if token is None:
        raise ConfigError("--post needs SLACK_BOT_TOKEN (or SLACK_BOT_TOKEN_FILE)")
    return token


def _few(names: list[str], n: int = 5) -> str:
    if not names:
        return "none with steps or incidents"
    return ", ".join(names[:n]) + (f" and {len(names) - n} more" if len(names) > n else "")
