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
import logging
import os
import socket
import time
from pathlib import Path
from typing import Any

from whywait.engine.commands.gc_tuning import batch_gc
from whywait.engine.errors import ConfigError, TopologyError

from whywait import jsonl

log = logging.getLogger("whywait.engine")


def default_rules_dir() -> Path:
    """``$WHYWAIT_RULES``, else ``./rules``, else the shipped rules.

    The shipped rules are ``whywait/rules`` in an installed wheel (package data) and ``rules/`` in a checkout;
    both are two folders up from this file.
    """
    env = os.environ.get("WHYWAIT_RULES")
    if env:
        return Path(env)
    here = Path("rules")
    return here if here.is_dir() else Path(__file__).resolve().parents[2] / "rules"


def default_rule_paths() -> list[Path]:
    """The rules the engine loads without ``--rules``: :func:`default_rules_dir`, plus ``$WHYWAIT_SITE_RULES``.

    A site keeps its own rules in a folder of its own (mounted into the container, say) and gets the shipped
    ones too; both are watched for hot reload.
    """
    site = os.environ.get("WHYWAIT_SITE_RULES")
    return [default_rules_dir(), *([Path(site)] if site else [])]


def register(p: argparse.ArgumentParser) -> None:
    p.add_argument("--bootstrap", help="Kafka bootstrap servers (default: WHYWAIT_KAFKA_BOOTSTRAP, "
                                       "else the local broker started by `whywait kafka start`)")
    p.add_argument("--rules", action="append", type=Path,
                   help="rule file or folder (repeatable; default: ./rules or the shipped rules, "
                        "plus $WHYWAIT_SITE_RULES)")
    p.add_argument("--topology", type=Path, default=os.environ.get("WHYWAIT_TOPOLOGY"),
                   help="topology YAML (default: WHYWAIT_TOPOLOGY); jobs are placed from the placement topic")
    p.add_argument("--group", default="whywait-engine", help="consumer group id (default: whywait-engine)")
    p.add_argument("--latest", action="store_true", help="start from the newest messages, not the oldest")
    p.add_argument("--not-before", type=float, metavar="UNIX_TIME",
                   help="skip messages whose event time is older (replays, demos sharing topics)")
    p.add_argument("--no-restore", action="store_true",
                   help="ignore the checkpointed incident state and the notifier's message map (a fresh run)")
    p.add_argument("--max-clock-skew", default=os.environ.get("WHYWAIT_MAX_CLOCK_SKEW", "300"), metavar="SECONDS",
                   help="refuse (dead-letter) messages whose event time is this far ahead of the engine's clock; "
                        "'off' for simulations stamped in the future (default: WHYWAIT_MAX_CLOCK_SKEW, else 300)")
    p.add_argument("--warmup", type=float, default=None, metavar="SECONDS",
                   help="after a restart, hold restored incidents open this much event time before they may "
                        "resolve (default: each rule's longest window + baseline + for)")
    p.add_argument("--metrics-addr", default=None, metavar="HOST:PORT",
                   help="serve Prometheus /metrics, /healthz and /readyz here, e.g. 0.0.0.0:9464 "
                        "(default: $WHYWAIT_METRICS_ADDR, else off)")
    p.add_argument("--partitions", type=int, default=None, metavar="N",
                   help="partitions of the input topics (created or grown at start): N workers started with "
                        "the same --group share the work; size it 2-4x the most workers you will run "
                        "(default: $WHYWAIT_PARTITIONS, else 1; see docs/architecture.md, scale-out)")
    p.add_argument("--replication", type=int, default=None, metavar="R",
                   help="replication factor of the topics this engine creates (default: $WHYWAIT_REPLICATION, "
                        "else 1; 3 on a 3-broker cluster)")
    p.add_argument("--restore-window", type=float, default=None, metavar="SECONDS",
                   help="event time re-read from a partition a worker takes over, before it evaluates it "
                        "(default: the metric store's retention, 900)")
    p.add_argument("--align", type=float, default=None, metavar="SECONDS",
                   help="read no input partition more than this far (event time) ahead of the slowest one with "
                        "unread records, so a backlog cannot fill memory; 0: off (default: $WHYWAIT_ALIGN_S, else 30)")
    p.add_argument("--instance-id", default=os.environ.get("WHYWAIT_ENGINE_INSTANCE"),
                   help="static consumer-group member id, so a restarted engine takes its partitions back at "
                        "once (default: WHYWAIT_ENGINE_INSTANCE, else GROUP@HOSTNAME; 'none' for a dynamic member)")


def parse_skew(raw: str | None) -> float | None:
    """``--max-clock-skew``: seconds (> 0), or ``off``/``none``/``0`` for no limit."""
    text = (raw or "").strip().lower()
    if text in ("off", "none", "0", ""):
        return None
    try:
        val = float(text.rstrip("s"))
    except ValueError:
        raise ConfigError(f"--max-clock-skew must be seconds like 300 or 'off' (got {raw!r})") from None
    if not val > 0 or val != val or val == float("inf"):
        raise ConfigError(f"--max-clock-skew must be a positive number of seconds or 'off' (got {raw!r})")
    return val


def _count(flag: int | None, name: str, env: str) -> int:
    """``--partitions`` / ``--replication``: the flag, else the environment, else 1; refused below 1."""
    from whywait.engine.stream.topics import env_int

    if flag is None:
        return env_int(env, 1)
    if flag < 1:
        raise ConfigError(f"{name} must be a whole number >= 1 (got {flag})")
    return flag


def instance_id(raw: str | None, group: str) -> str | None:
    """The static member id: ``raw``, or ``GROUP@HOSTNAME``; None when ``raw`` is 'none'."""
    if raw and raw.strip().lower() == "none":
        return None
    return raw or f"{group}@{socket.gethostname()}"


def load_topology(path: Path | None) -> Any:
    """Load the topology file, wrapping its errors as one-line engine errors."""
    from whywait.topology.errors import TopologyError as TopoErr
    from whywait.topology.model import Topology

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
    from whywait.engine.stream.topics import TOPIC_ENGINE_STATE

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
                    try:
                        snap = jsonl.loads(msg.value) if msg.value else None
                    except ValueError as exc:  # not JSON: ignored like a checkpoint of another version
                        log.warning("ignoring an unreadable checkpoint at offset %d (%s)", msg.offset, exc)
                        snap = None
        return snap if isinstance(snap, dict) else None
    finally:
        await c.stop()


def fresh_state_store(bootstrap: str, topic: str | None = None) -> Any:
    """The notifier's Kafka state store, starting empty: ``--no-restore`` must not reopen the last run's messages."""
    from whywait.engine.notify.state import STATE_TOPIC, KafkaStateStore

    class FreshStateStore(KafkaStateStore):
        _stale: dict[str, dict[str, Any]] | None = None  # what the topic held at start

        def load(self) -> dict[str, dict[str, Any]]:
            table = super().load()  # starts the table: this run's writes still go to the compacted topic
            if self._stale is None:
                self._stale = table
            return {}

        def current(self, keys: list[str]) -> dict[str, dict[str, Any]]:
            # another worker's record of this run, yes (it is newer); the last run's, left as it was, no
            got = super().current(keys)
            return {k: r for k, r in got.items() if r != (self._stale or {}).get(k)}

    return FreshStateStore(bootstrap, topic=topic or STATE_TOPIC)


def run(args: argparse.Namespace) -> int:
    import faust
    from whywait.agents.observe import check_addr_free, metrics_addr
    from whywait.engine.evaluate.evaluator import Evaluator
    from whywait.engine.localkafka.broker import probe, resolve_bootstrap
    from whywait.engine.notify import make_notifier, receiver_names
    from whywait.engine.rules.loader import load_rules
    from whywait.engine.rules.reload import RuleReloader
    from whywait.engine.stream.app import EngineConfig, bound_consumer_thread_stop, build_app, quiet_kafka_errors
    from whywait.engine.stream.processor import Processor
    from whywait.engine.stream.topics import engine_partitions

    addr = metrics_addr(getattr(args, "metrics_addr", None))  # a bad address is said before anything starts
    if addr is not None:
        check_addr_free(addr)  # and a taken port, before Kafka, placements and the restore
    rule_paths = args.rules or default_rule_paths()
    rules = load_rules(rule_paths)
    topology = load_topology(args.topology)
    from whywait.topology.reconcile import startup_warnings

    for line in startup_warnings(topology):  # gaps in the cluster file are said once, at start
        log.warning("topology: %s", line)
    # Every setting is checked before the broker is asked: a bad flag is said as such, not hidden behind
    # "the broker is unreachable" when both are wrong.
    skew = parse_skew(args.max_clock_skew)
    if args.warmup is not None and not (args.warmup >= 0 and args.warmup < float("inf")):
        raise ConfigError(f"--warmup must be a number of seconds >= 0 (got {args.warmup})")
    if args.restore_window is not None and not (0 <= args.restore_window < float("inf")):
        raise ConfigError(f"--restore-window must be a number of seconds >= 0 (got {args.restore_window})")
    align_s = args.align if args.align is not None else _env_float("WHYWAIT_ALIGN_S", 30.0)
    if not (0 <= align_s < float("inf")):
        raise ConfigError(f"--align must be a number of seconds >= 0 (got {align_s})")
    want_partitions = _count(args.partitions, "--partitions", "WHYWAIT_PARTITIONS")
    want_replication = _count(args.replication, "--replication", "WHYWAIT_REPLICATION")
    bootstrap = resolve_bootstrap(flag=args.bootstrap)  # a malformed one is said as such (exit 2)
    if not probe(bootstrap, timeout=5.0):
        from whywait.engine.errors import BrokerUnavailable

        raise BrokerUnavailable(bootstrap, "no answer to ApiVersions")
    # The engine's topics first: a --replication or --partitions the cluster cannot give is refused naming the flag,
    # before the notifier's stores create theirs (which it refused as "unreachable", exit 3).
    partitions = engine_partitions(bootstrap, want_partitions, want_replication)
    # Notifier state and silences live in compacted topics, so a restarted engine edits its messages.
    # --no-restore starts the notifier's message map empty too (silences, which are people's
    # decisions, are kept); it still writes, so the next restart resumes this run.
    extra: dict[str, Any] = {}
    if args.no_restore and receiver_names(os.environ) != ["console"]:
        extra = {"state_store": fresh_state_store(bootstrap), "close_stores": True}
    notifier = make_notifier(kafka_bootstrap=bootstrap, **extra)
    actions = None
    if hasattr(notifier, "handle_action"):
        from whywait.engine.notify.interactivity import InteractivityServer

        actions = InteractivityServer.from_env(notifier)  # None unless SLACK_SIGNING_SECRET is set
        if actions is not None:
            actions.start()
            log.info("Slack interactivity endpoint: %s", actions.url)
    if partitions > 1:
        from whywait.engine.stream.partitioning import OwnedTopology

        topology = OwnedTopology(topology, partitions)  # evaluates the jobs of its partitions only
        log.info("engine: partitioned pipeline on %d partition(s) of the repartition topic", partitions)
    def new_evaluator() -> Evaluator:
        return Evaluator(rules, topology, arrival_clock=time.monotonic, max_skew_s=skew, warmup_s=args.warmup)

    evaluator = new_evaluator()
    if not args.no_restore and partitions == 1:  # partitioned: per job, when its partition is assigned
        snap = asyncio.run(read_snapshot(bootstrap, args.group))
        if snap:
            try:
                evaluator.restore(snap)
            except (KeyError, TypeError, ValueError, AttributeError) as exc:  # another version's, or damaged
                log.warning("ignoring an unreadable checkpoint (%s: %s); starting without it",
                            type(exc).__name__, exc)
                # restore() may have taken part of it: start from a clean evaluator, not a half-restored one
                evaluator = new_evaluator()
            else:
                log.info("restored %d incident(s) from the last checkpoint", len(snap.get("incidents", ())))
    placed = 0
    from whywait.engine.stream.tables import read_placements

    for msg in asyncio.run(read_placements(bootstrap)):
        if args.not_before is not None and msg["time"] < args.not_before:
            continue
        try:
            evaluator.topology.apply_placement(msg)
            placed += 1
        except Exception as exc:  # noqa: BLE001 - unknown nodes (TopologyError) or a placement it cannot use
            log.warning("placement of job %s ignored: %s: %s", msg.get("job"), type(exc).__name__, exc)
    if placed:
        log.info("known jobs from the placement topic: %d", placed)
    log.info("engine: %d rule(s), %d node(s), Kafka %s, notifier %s", len(rules), len(topology.nodes()),
             bootstrap, type(notifier).__name__)
    if args.latest:
        from whywait.agents.events import INPUT_TOPICS
        from whywait.engine.stream.tables import start_group_at_latest
        from whywait.engine.stream.topics import TOPIC_BY_JOB

        started = asyncio.run(start_group_at_latest(
            bootstrap, args.group, [*INPUT_TOPICS, *([TOPIC_BY_JOB] if partitions > 1 else [])]))
        if started is not None:
            log.info("engine: group %s starts at the latest offsets of %d partition(s)", args.group, started)
    cfg = EngineConfig(bootstrap=bootstrap, group_id=args.group, from_beginning=not args.latest,
                       instance_id=instance_id(args.instance_id, args.group), partitions=partitions,
                       restore_window_s=args.restore_window, restore_state=not args.no_restore, align_s=align_s)
    processor = Processor(evaluator, not_before=args.not_before)
    server = None
    try:
        server, metrics, readiness = observe(processor, notifier, addr)  # a port already taken: one line
        quiet_kafka_errors()  # a broker gone as the worker stops: one line, not faust's threads' tracebacks
        bound_consumer_thread_stop(cfg.thread_stop_s)
        app = build_app(cfg, processor, notifier, RuleReloader(rule_paths), metrics, readiness)
        # Keep whywait's own logging (one line per event worth saying) and no terminal spinner.
        worker = faust.Worker(app, quiet=True, redirect_stdouts=False, override_logging=False)
        worker.spinner = None
        with batch_gc():  # what exists now lives as long as the engine: the collector need not re-walk it
            worker.execute_from_commandline()  # returns (or exits) when the worker stops: SIGTERM, SIGINT
    finally:
        if actions is not None:
            actions.stop()
        if server is not None:
            server.stop()
        notifier.close()
    return 0


def observe(processor: Any, notifier: Any, addr: tuple[str, int] | None) -> tuple[Any, Any, Any]:
    """Start the /metrics, /healthz and /readyz server on ``addr`` (from ``--metrics-addr`` or
    ``$WHYWAIT_METRICS_ADDR``); return ``(server, metrics, readiness)``, all None when ``addr`` is None.
    A port already taken is one line (exit 2)."""
    from whywait.agents.observe import ObserveServer
    from whywait.engine.observe.metrics import EngineMetrics, Readiness

    if addr is None:
        return None, None, None
    metrics = EngineMetrics().bind(processor, notifier)
    readiness = Readiness(processor)
    return ObserveServer(addr, metrics.registry, readiness).start(), metrics, readiness


def _env_float(name: str, default: float) -> float:
    """Seconds from the environment variable ``name`` (``default`` when unset); a bad value is a ConfigError."""
    raw = os.environ.get(name)
    if raw is None or not raw.strip():
        return default
    try:
        return float(raw)
    except ValueError:
        raise ConfigError(f"{name} must be a number of seconds (got {raw!r})") from None
