"""``whywait engine``: consume telemetry, evaluate the rules, publish diagnoses, notify.

Start-up order is chosen so that every mistake a user can make is one line and
happens before anything runs: the rules are loaded (a bad file stops here with
its file and line), then the topology, then the broker is probed (unreachable:
one line), then the notifier (a rejected Slack token stops here).  Only then does
the faust worker start.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import os
import time
from pathlib import Path
from typing import Any

from engine.errors import ConfigError, TopologyError

log = logging.getLogger("whywait.engine")


def default_rules_dir() -> Path:
    """``$WHYWAIT_RULES``, else ``./rules``, else the ``rules/`` folder of this checkout."""
    env = os.environ.get("WHYWAIT_RULES")
    if env:
        return Path(env)
    here = Path("rules")
    return here if here.is_dir() else Path(__file__).resolve().parents[2] / "rules"


def register(p: argparse.ArgumentParser) -> None:
    p.add_argument("--bootstrap", help="Kafka bootstrap servers (default: WHYWAIT_KAFKA_BOOTSTRAP, "
                                       "else the local broker started by `whywait kafka start`)")
    p.add_argument("--rules", action="append", type=Path,
                   help="rule file or folder (repeatable; default: ./rules)")
    p.add_argument("--topology", type=Path, default=os.environ.get("WHYWAIT_TOPOLOGY"),
                   help="topology YAML (default: WHYWAIT_TOPOLOGY); jobs are placed from the placement topic")
    p.add_argument("--group", default="whywait-engine", help="consumer group id (default: whywait-engine)")
    p.add_argument("--latest", action="store_true", help="start from the newest messages, not the oldest")
    p.add_argument("--not-before", type=float, metavar="UNIX_TIME",
                   help="skip messages whose event time is older (replays, demos sharing topics)")
    p.add_argument("--no-restore", action="store_true", help="ignore the checkpointed incident state")


def load_topology(path: Path | None) -> Any:
    """Load the topology file, wrapping its errors as one-line engine errors."""
    from topology.errors import TopologyError as TopoErr
    from topology.model import Topology

    if path is None:
        raise ConfigError("no topology: pass --topology FILE or set WHYWAIT_TOPOLOGY "
                          "(`whywait simulate --topology-out FILE` writes one)")
    try:
        return Topology.from_yaml(path)
    except FileNotFoundError:
        raise ConfigError(f"topology file {path} does not exist") from None
    except TopoErr as exc:
        raise TopologyError(str(exc)) from None


async def read_snapshot(bootstrap: str, group: str) -> dict[str, Any] | None:
    """Return the newest checkpointed evaluator snapshot for ``group``, or None."""
    from aiokafka import AIOKafkaConsumer, TopicPartition

    from engine.stream.topics import TOPIC_ENGINE_STATE

    c = AIOKafkaConsumer(bootstrap_servers=bootstrap, enable_auto_commit=False)
    await c.start()
    try:
        tp = TopicPartition(TOPIC_ENGINE_STATE, 0)
        c.assign([tp])
        await c.seek_to_beginning(tp)
        end = (await c.end_offsets([tp]))[tp]
        snap = None
        while end and await c.position(tp) < end:
            batch = await c.getmany(tp, timeout_ms=1000)
            for msg in batch.get(tp, []):
                if msg.key == group.encode():
                    snap = json.loads(msg.value) if msg.value else None
        return snap
    finally:
        await c.stop()


def run(args: argparse.Namespace) -> int:
    import faust

    from engine.evaluate.evaluator import Evaluator
    from engine.localkafka.broker import probe, resolve_bootstrap
    from engine.notify import make_notifier
    from engine.rules.loader import load_rules
    from engine.rules.reload import RuleReloader
    from engine.stream.app import EngineConfig, build_app
    from engine.stream.processor import Processor
    from engine.stream.topics import ensure_topics

    rule_paths = args.rules or [default_rules_dir()]
    rules = load_rules(rule_paths)
    topology = load_topology(args.topology)
    bootstrap = args.bootstrap or resolve_bootstrap()
    if not probe(bootstrap, timeout=5.0):
        from engine.errors import BrokerUnavailable

        raise BrokerUnavailable(bootstrap, "no answer to ApiVersions")
    # Notifier state and silences live in compacted topics, so a restarted engine edits its messages.
    notifier = make_notifier(kafka_bootstrap=bootstrap)
    actions = None
    if hasattr(notifier, "handle_action"):
        from engine.notify.interactivity import InteractivityServer

        actions = InteractivityServer.from_env(notifier)  # None unless SLACK_SIGNING_SECRET is set
        if actions is not None:
            actions.start()
            log.info("Slack interactivity endpoint: %s", actions.url)
    ensure_topics(bootstrap)
    evaluator = Evaluator(rules, topology, arrival_clock=time.monotonic)
    if not args.no_restore:
        snap = asyncio.run(read_snapshot(bootstrap, args.group))
        if snap:
            evaluator.restore(snap)
            log.info("restored %d incident(s) from the last checkpoint", len(snap.get("incidents", ())))
    log.info("engine: %d rule(s), %d node(s), Kafka %s, notifier %s", len(rules), len(topology.nodes()),
             bootstrap, type(notifier).__name__)
    cfg = EngineConfig(bootstrap=bootstrap, group_id=args.group, from_beginning=not args.latest)
    app = build_app(cfg, Processor(evaluator, not_before=args.not_before), notifier, RuleReloader(rule_paths))
    # Keep whywait's own logging (one line per event worth saying) and no terminal spinner.
    worker = faust.Worker(app, quiet=True, redirect_stdouts=False, override_logging=False)
    worker.spinner = None
    try:
        worker.execute_from_commandline()  # returns (or exits) when the worker stops: SIGTERM, SIGINT
    finally:
        if actions is not None:
            actions.stop()
        notifier.close()
    return 0
