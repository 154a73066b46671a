"""``whywait simulate``: run the cluster simulator and publish its telemetry to Kafka (or print it).

``register(parser)`` adds the flags, ``run(args)`` does the work and returns the
exit status; ``whywait.engine.cli`` calls them.  The generator is pure
(:class:`~whywait.simulate.sim.Simulation`); this module only paces it, writes the
topology and ground-truth files, and publishes.  Kafka (aiokafka) and the broker
lookup are imported only when publishing, so ``--dry-run`` needs neither.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import signal
import sys
import time
from typing import Any, Iterable, Iterator, TextIO

from whywait.agents.events import encode, message_key
from whywait.simulate.errors import SimulationError


def register(parser: argparse.ArgumentParser) -> None:
    """Add the ``simulate`` flags to ``parser``."""
    parser.add_argument("--nodes", type=int, default=None, help="nodes in the simulated cluster (default 16)")
    parser.add_argument("--gpus-per-node", type=int, default=None, help="GPUs per node (default 8)")
    parser.add_argument("--duration", type=float, default=None, metavar="S",
                        help="seconds of event time to simulate (default 600)")
    parser.add_argument("--interval", type=float, default=None, metavar="S",
                        help="sampling interval in seconds (default 1)")
    parser.add_argument("--fault", action="append", default=[], metavar="NAME:TARGET@START-END[,k=v]",
                        help="inject a fault, e.g. nic-packet-loss:node-07@120-400 (repeatable)")
    parser.add_argument("--list-faults", action="store_true", help="list the fault library and exit")
    parser.add_argument("--scenario", metavar="FILE", help="scenario YAML (cluster, jobs, faults); flags override")
    parser.add_argument("--seed", type=int, default=None, help="random seed (default 0, or the scenario's)")
    parser.add_argument("--speed", type=float, default=1.0, metavar="X",
                        help="event time runs X times faster than the wall clock; 0 = as fast as possible "
                             "(default 1: real time)")
    parser.add_argument("--start-time", type=float, default=None, metavar="UNIX_S",
                        help="event-time origin (default: now)")
    parser.add_argument("--topology-out", metavar="FILE", help="write the cluster topology (with jobs) as YAML")
    parser.add_argument("--truth-out", metavar="FILE", help="write the injected faults' ground truth as JSON")
    parser.add_argument("--bootstrap", metavar="HOST:PORT",
                        help="Kafka bootstrap servers (default: $WHYWAIT_KAFKA_BOOTSTRAP or the local broker)")
    parser.add_argument("--dry-run", action="store_true", help="print messages as JSON lines instead of publishing")


def build_simulation(args: argparse.Namespace) -> Any:
    """Build the :class:`Simulation` the flags (and scenario file) describe; pure, used by ``run`` and tests."""
    from whywait.simulate.cluster import make_cluster, make_job
    from whywait.simulate.faults import parse_fault_spec
    from whywait.simulate.scenario import load_scenario
    from whywait.simulate.sim import Simulation

    start = args.start_time if args.start_time is not None else time.time()
    if args.scenario:
        sc = load_scenario(args.scenario)
        if args.nodes is not None or args.gpus_per_node is not None:
            raise SimulationError("--nodes/--gpus-per-node cannot be combined with --scenario "
                                  "(set them in the scenario's cluster section)")
        topo, jobs, faults = sc.topology, sc.jobs, list(sc.faults)
        seed = sc.seed if args.seed is None else args.seed
        duration = sc.duration_s if args.duration is None else args.duration
        interval = sc.interval_s if args.interval is None else args.interval
    else:
        topo = make_cluster(nodes=16 if args.nodes is None else args.nodes,
                            gpus_per_node=8 if args.gpus_per_node is None else args.gpus_per_node)
        jobs = [make_job(topo)]
        faults = []
        seed = args.seed or 0
        duration = 600.0 if args.duration is None else args.duration
        interval = 1.0 if args.interval is None else args.interval
    faults += [parse_fault_spec(f) for f in args.fault]
    return Simulation(topo, jobs, faults, start_time=start, duration_s=duration, interval_s=interval, seed=seed)


def run(args: argparse.Namespace) -> int:
    """Run ``whywait simulate``; returns the exit status.  Raises WhywaitError subclasses for one-line errors."""
    from whywait.engine.errors import ConfigError

    if args.list_faults:
        from whywait.simulate.faults import FAULTS
        for name, cls in FAULTS.items():
            params = ", ".join(f"{k}={v:g}" for k, v in cls.PARAMS.items()) or "-"
            print(f"{name:24} target={cls.target_kind:18} culprit={cls.culprit_kind:7} cause={cls.cause}  "
                  f"params: {params}")
        return 0
    if args.speed < 0:
        raise ConfigError(f"--speed must be ≥ 0 (got {args.speed:g})")
    from whywait.engine.commands.outputs import check_outputs

    check_outputs([(args.topology_out, "--topology-out"), (args.truth_out, "--truth-out")])
    try:
        sim = build_simulation(args)
    except SimulationError as exc:
        raise ConfigError(str(exc)) from None
    if args.topology_out:
        sim.topology.to_yaml(args.topology_out)
    # The schedule is known up front; a few faults (checkpoint-stall) learn their exact window while running,
    # so the file is written now for early readers and rewritten once the run is over.
    _write_truth([g.to_dict() for g in sim.ground_truth()], args.truth_out)
    if args.dry_run:
        rc = _print(_paced(_with_progress(sim.messages(), sim, args.speed), sim.start_time, args.speed),
                    sys.stdout)
        truth = [g.to_dict() for g in sim.ground_truth()]
    else:
        from whywait.engine.localkafka.broker import resolve_bootstrap  # lazy: the broker helper is engine-side

        bootstrap = resolve_bootstrap(flag=args.bootstrap)
        source = _GeneratorProcess(sim) if _can_fork() else _InlineSource(sim)
        # SIGTERM (a service manager, `timeout`, the demo) must run the cleanup below like Ctrl-C
        # does, or the generator child is left orphaned.
        previous = signal.signal(signal.SIGTERM, _exit_on_signal)
        try:
            rc = asyncio.run(_publish(source, bootstrap, sim, args.speed))
        finally:
            source.close()
            signal.signal(signal.SIGTERM, previous)
        truth = source.truth
    _write_truth(truth, args.truth_out)
    return rc


def _write_truth(truth: list[dict[str, Any]], path: str | None) -> None:
    """Write the ground truth as a JSON list, atomically (a reader never sees half a file)."""
    if not path:
        return
    import os

    tmp = f"{path}.tmp"
    with open(tmp, "w") as fh:
        json.dump(truth, fh, indent=2)
        fh.write("\n")
    os.replace(tmp, path)


# One encoded message: (topic, key, value, event time).
Encoded = tuple[str, bytes, bytes, float]
CHUNK = 2000


def _encoded_chunks(sim: Any) -> Iterator[list[Encoded]]:
    """Generate, encode and key the simulation's messages, ``CHUNK`` at a time."""
    buf: list[Encoded] = []
    for topic, msg in sim.messages():
        buf.append((topic, message_key(msg), encode(msg), msg["time"]))
        if len(buf) >= CHUNK:
            yield buf
            buf = []
    if buf:
        yield buf


class _InlineSource:
    """Encoded chunks generated in this process (where ``fork`` is unavailable)."""

    def __init__(self, sim: Any) -> None:
        self.sim = sim
        self._it = _encoded_chunks(sim)
        self.truth: list[dict[str, Any]] = []

    async def next_chunk(self) -> list[Encoded] | None:
        chunk = next(self._it, None)
        if chunk is None:
            self.truth = [g.to_dict() for g in self.sim.ground_truth()]
        return chunk

    def close(self) -> None:
        pass


def _exit_on_signal(signum: int, frame: Any) -> None:
    raise SystemExit(128 + signum)


def _die_with_parent() -> None:
    """In the generator child: ask Linux to SIGTERM it when its parent dies, even by ``kill -9``."""
    try:
        import ctypes

        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(1, signal.SIGTERM, 0, 0, 0)  # PR_SET_PDEATHSIG
    except (OSError, AttributeError):  # not Linux: the parent's cleanup is the only guard
        pass


def _can_fork() -> bool:
    import multiprocessing as mp

    return "fork" in mp.get_all_start_methods()


def _generate_into(sim: Any, queue: Any) -> None:
    """Child process body: push encoded chunks, then ``("truth", [...])``, or ``("error", text)``."""
    parent = os.getppid()
    _die_with_parent()
    signal.signal(signal.SIGTERM, signal.SIG_DFL)  # the parent's handler is not the child's
    if os.getppid() != parent:  # the parent died before the request took effect
        return
    try:
        for chunk in _encoded_chunks(sim):
            queue.put(chunk)
        queue.put(("truth", [g.to_dict() for g in sim.ground_truth()]))
    except BaseException as exc:  # noqa: BLE001 - reported to the parent, which raises it as one line
        queue.put(("error", f"{type(exc).__name__}: {exc}"))


class _GeneratorProcess:
    """Encoded chunks generated in a forked child, so generation and publishing use two cores.

    Generating and JSON-encoding cost about as much CPU as aiokafka's send path;
    splitting them is what lets one ``whywait simulate`` push over 20k messages/s.
    The queue holds a few chunks, so the child never runs far ahead of a paced run.
    """

    def __init__(self, sim: Any) -> None:
        import multiprocessing as mp

        ctx = mp.get_context("fork")
        self.queue = ctx.Queue(maxsize=8)
        self.proc = ctx.Process(target=_generate_into, args=(sim, self.queue), daemon=True,
                                name="whywait-simulate-generator")
        self.proc.start()
        self.truth: list[dict[str, Any]] = []

    def _get(self) -> Any:
        # A bounded wait, so the executor thread never outlives a stopping parent by more than 0.2 s.
        import queue

        while True:
            try:
                return self.queue.get(timeout=0.2)
            except queue.Empty:
                if not self.proc.is_alive():
                    try:  # what it wrote just before it ended may still be in the pipe
                        return self.queue.get(timeout=1.0)
                    except queue.Empty:
                        raise SimulationError("the generator process ended unexpectedly") from None

    async def next_chunk(self) -> list[Encoded] | None:
        item = await asyncio.get_running_loop().run_in_executor(None, self._get)
        if isinstance(item, tuple):
            tag, payload = item
            if tag == "error":
                raise SimulationError(f"the generator failed: {payload}")
            self.truth = payload
            return None
        return item

    def close(self) -> None:
        if self.proc.is_alive():
            self.proc.terminate()
        self.proc.join(timeout=5)


def _paced(messages: Iterable[tuple[str, dict[str, Any]]], origin: float, speed: float
           ) -> Iterator[tuple[str, dict[str, Any]]]:
    """Hold each message back until its event time, scaled by ``speed``, has come on the wall clock."""
    if speed == 0:
        yield from messages
        return
    wall0 = time.monotonic()
    for topic, msg in messages:
        delay = wall0 + (msg["time"] - origin) / speed - time.monotonic()
        if delay > 0:
            time.sleep(delay)
        yield topic, msg


def _with_progress(messages: Iterator[tuple[str, dict[str, Any]]], sim: Any, speed: float
                   ) -> Iterator[tuple[str, dict[str, Any]]]:
    """Show a tqdm bar (event seconds done) on stderr unless running in real time."""
    bar = _progress_bar(sim, speed)
    if bar is None:
        yield from messages
        return
    with bar:
        done = 0
        for topic, msg in messages:
            now = int(msg["time"] - sim.start_time)
            if now > done:
                bar.update(now - done)
                done = now
            yield topic, msg


def _progress_bar(sim: Any, speed: float) -> Any:
    """A tqdm bar over event seconds on stderr, or None in real time or when stderr is not a terminal."""
    if speed == 1.0 or not sys.stderr.isatty():
        return None
    from tqdm import tqdm

    return tqdm(total=round(sim.duration_s), unit="s", desc="event time", file=sys.stderr, leave=False,
                disable=None)  # None: a bar on a terminal, nothing in logs


def _print(messages: Iterable[tuple[str, dict[str, Any]]], out: TextIO) -> int:
    write = out.write
    try:
        for _, msg in messages:
            write(encode(msg).decode())
            write("\n")
        out.flush()
    except BrokenPipeError:  # `| head` closed the pipe: not an error
        return 0
    return 0


class _CachedPartitioner:
    """aiokafka's default partitioning (murmur2 of the key, as the Java client), memoised per key.

    The simulator sends tens of thousands of messages over a few dozen keys (node
    and job ids); aiokafka's pure-Python murmur2 was the publisher's hottest call.
    """

    def __init__(self) -> None:
        self._index: dict[bytes, int] = {}

    def __call__(self, key: bytes | None, all_partitions: list[int], available: list[int]) -> int:
        if key is None:
            import random

            return random.choice(available or all_partitions)
        h = self._index.get(key)
        if h is None:
            from aiokafka.partitioner import murmur2

            h = self._index[key] = murmur2(key) & 0x7FFFFFFF
        return all_partitions[h % len(all_partitions)]


def _fast_gzip() -> None:
    """Make aiokafka's gzip use compression level 1 instead of its hard-wired 9.

    aiokafka offers no compression-level option and level 9 compresses this JSON
    at ~16 MB/s (≈14k messages/s, below the 20k/s the simulator must push); level
    1 runs ~7x faster for a ratio of ~7x instead of ~10x.  The batch format is
    unchanged (any gzip level decodes the same); if aiokafka's internals move,
    this silently does nothing and level 9 stays.
    """
    import functools

    try:
        from aiokafka import codec
        from aiokafka.record import default_records, legacy_records
        fast = functools.partial(codec.gzip_encode, compresslevel=1)
        for mod in (default_records, legacy_records):
            if hasattr(mod, "gzip_encode"):
                mod.gzip_encode = fast  # type: ignore[attr-defined]
        from aiokafka.record._crecords import default_records as c_default
        from aiokafka.record._crecords import legacy_records as c_legacy
        for mod in (c_default, c_legacy):
            if hasattr(mod, "gzip_encode"):
                mod.gzip_encode = fast
    except ImportError:  # pragma: no cover - no C extension, or a newer layout
        pass


async def _publish(source: Any, bootstrap: str, sim: Any, speed: float = 0.0) -> int:
    """Send every message (key per the contract) with an idempotent gzip producer; batch, then flush.

    Sends are not awaited one by one: each ``send`` only queues the message and
    returns a future; the futures are checked once per chunk and at the end, so
    a broker error still surfaces (as :class:`BrokerUnavailable`).  With
    ``speed`` > 0 each message waits for its event time scaled to the wall clock.
    """
    from aiokafka import AIOKafkaProducer
    from aiokafka.errors import KafkaConnectionError, KafkaError
    from whywait.engine.errors import BrokerUnavailable
    from whywait.engine.stream.topics import ensure_topics_async, wait_for_leaders

    _fast_gzip()
    # The topics first, as the engine makes them: auto-created ones (a fresh broker after an `import`) met
    # NotLeaderForPartition while their leaders were elected, and the simulation stopped half published.
    await ensure_topics_async(bootstrap)
    producer = AIOKafkaProducer(bootstrap_servers=bootstrap, acks="all", enable_idempotence=True,
                                compression_type="gzip", linger_ms=20, max_batch_size=1 << 20,
                                request_timeout_ms=30000, partitioner=_CachedPartitioner())
    try:
        await producer.start()
        await wait_for_leaders(producer)
    except (KafkaConnectionError, KafkaError, OSError) as exc:
        await producer.stop()
        raise BrokerUnavailable(bootstrap, str(exc) or type(exc).__name__) from None
    sent = 0
    origin = sim.start_time
    bar = _progress_bar(sim, speed)
    done = 0
    started = time.monotonic()
    try:
        pending: list[asyncio.Future[Any]] = []
        while (chunk := await source.next_chunk()) is not None:
            for topic, key, value, t in chunk:
                if speed:
                    # Sleep on the event loop, not in the generator, so the producer keeps sending meanwhile.
                    delay = started + (t - origin) / speed - time.monotonic()
                    if delay > 0:
                        await asyncio.sleep(delay)
                pending.append(await producer.send(topic, value, key=key))
            sent += len(chunk)
            if bar is not None and int(chunk[-1][3] - origin) > done:
                bar.update(int(chunk[-1][3] - origin) - done)
                done = int(chunk[-1][3] - origin)
            if len(pending) >= 10 * CHUNK:
                await asyncio.gather(*pending)
                pending.clear()
        await producer.flush()
        if pending:
            await asyncio.gather(*pending)
    except KafkaError as exc:
        raise BrokerUnavailable(bootstrap, str(exc) or type(exc).__name__) from None
    finally:
        if bar is not None:
            bar.close()
        await producer.stop()
    elapsed = max(time.monotonic() - started, 1e-9)
    print(f"whywait simulate: published {sent} messages to {bootstrap} in {elapsed:.1f}s "
          f"({sent / elapsed:,.0f}/s)", file=sys.stderr)
    return 0
