"""``whywait placement``: publish which job runs where, from what the scheduler already knows.

- ``slurm --prolog|--epilog``: for ``PrologSlurmctld``/``EpilogSlurmctld``.  Reads the job's
  environment and ``scontrol show job -d --json $SLURM_JOB_ID``, publishes its ranks, nodes,
  GPU indexes, user and account (``--epilog``: that it finished).  Exits 0 even when it
  fails (unless ``--strict``): a failing prolog would drain the node; the error is printed.
- ``k8s``: watches pods that request ``nvidia.com/gpu`` with the official client; publishes a
  job when its pods are bound, again when they move (a restart on another node), and
  ``finished`` when its last GPU pod ends.
- ``publish FILE|-``: JSON or YAML placements for every other scheduler.

Owners come from ``--ownership`` (``WHYWAIT_OWNERSHIP``), hot-reloaded; a job no rule
matches goes to ``--default-channel`` with team "no owner known".  Messages go to Kafka
through the agent's spooling publisher, so a broker outage delays a placement instead of
losing it (the next run sends what is spooled); ``--print`` writes them to stdout instead.
"""

from __future__ import annotations

import argparse
import asyncio
import fcntl
import logging
import os
import socket
import subprocess
import sys
import threading
import time
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Iterator

from whywait.agents.events import TOPIC_PLACEMENT
from whywait.engine.errors import ConfigError, WhywaitError

from whywait.errors import EXIT_UNAVAILABLE
from whywait.textfiles import read_text

log = logging.getLogger("whywait.placement")
# Seconds a Slurm hook waits for another run to finish with the shared spool before going on without its lock.
SPOOL_LOCK_WAIT_S = 20.0
SYSTEM_SPOOL = "/var/spool/whywait/placement"


def _default_spool() -> Path:
    """``$WHYWAIT_PLACEMENT_SPOOL``, else the system spool when it can be made and written, else ~/.cache."""
    from whywait.paths import state_folder

    return Path(state_folder("WHYWAIT_PLACEMENT_SPOOL", SYSTEM_SPOOL, "placement-spool"))


def _common(p: argparse.ArgumentParser) -> None:
    p.add_argument("--ownership", type=Path, default=os.environ.get("WHYWAIT_OWNERSHIP"),
                   help="ownership YAML: accounts/namespaces/labels → project, team, channel "
                        "(default: WHYWAIT_OWNERSHIP)")
    p.add_argument("--default-channel", default=os.environ.get("WHYWAIT_DEFAULT_CHANNEL"),
                   help="channel for jobs with no known owner when the ownership file sets none")
    p.add_argument("--bootstrap", help="Kafka bootstrap servers (default: WHYWAIT_KAFKA_BOOTSTRAP or the local "
                                       "broker)")
    p.add_argument("--topic", default=TOPIC_PLACEMENT, help=f"placement topic (default: {TOPIC_PLACEMENT})")
    p.add_argument("--spool", type=Path, default=None,
                   help="where placements wait while Kafka is unreachable (default $WHYWAIT_PLACEMENT_SPOOL, else "
                        f"{SYSTEM_SPOOL} when writable, else ~/.cache/whywait/placement-spool: Slurm's hooks run "
                        "as SlurmUser, often with no home)")
    p.add_argument("--print", action="store_true", help="print the messages instead of publishing them")


def register(p: argparse.ArgumentParser) -> None:
    sub = p.add_subparsers(dest="action", metavar="ACTION", required=True)
    s = sub.add_parser("slurm", help="Slurm PrologSlurmctld/EpilogSlurmctld hook")
    when = s.add_mutually_exclusive_group(required=True)
    when.add_argument("--prolog", action="store_true", help="the job starts: publish its placement")
    when.add_argument("--epilog", action="store_true", help="the job ended: publish that it finished")
    s.add_argument("--job-id", help="the job (default: SLURM_JOB_ID)")
    s.add_argument("--scontrol-json", type=Path,
                   help="read this saved `scontrol show job -d --json` output instead of running scontrol")
    s.add_argument("--scontrol", default="scontrol", help="the scontrol command (default: scontrol)")
    s.add_argument("--strict", action="store_true", help="exit non-zero on failure (a failing prolog drains "
                                                         "the node: only for testing the hook)")
    _common(s)
    k = sub.add_parser("k8s", help="watch GPU pods with the Kubernetes API and publish their placements")
    k.add_argument("--kubeconfig", type=Path, help="kubeconfig file (default: in-cluster, else ~/.kube/config)")
    k.add_argument("--api-server", help="an API server URL without auth, e.g. `kubectl proxy`'s "
                                        "http://127.0.0.1:8001")
    k.add_argument("--label-selector", help="watch only pods with these labels")
    k.add_argument("--once", action="store_true", help="one list and one watch, then exit (tests, cron)")
    _common(k)
    f = sub.add_parser("publish", help="publish placements from a JSON or YAML file ('-': stdin)")
    f.add_argument("file", help="placement file, or '-' for stdin")
    _common(f)


def _ownership(args: argparse.Namespace, lenient: bool = False) -> Any:
    """The ownership file's rules.  ``lenient`` (the Slurm hook): a missing, unreadable or broken file is
    said on stderr and every job gets the default owner (team "no owner known", the default channel),
    so the job is still placed; otherwise it is an error."""
    from whywait.engine.placement.ownership import OwnershipFile

    try:
        if args.ownership is not None and not args.ownership.exists():
            raise ConfigError(f"ownership file {args.ownership} does not exist")
        return OwnershipFile(args.ownership, args.default_channel)
    except WhywaitError as exc:
        if not lenient:
            raise
        print(f"whywait placement: {exc}; placing the job with no owner known", file=sys.stderr)
        return OwnershipFile(None, args.default_channel)


def _publisher(args: argparse.Namespace) -> Any:
    from whywait.agents.publisher import KafkaPublisher, PrintPublisher

    class PlacementPublisher(KafkaPublisher):
        """Checks every message against the placement contract, whatever the topic is called (--topic)."""

        def check(self, topic: str, msg: dict[str, Any]) -> bool:
            return super().check(TOPIC_PLACEMENT, msg)

    if args.print:
        return PrintPublisher()
    from whywait.engine.localkafka.broker import resolve_bootstrap

    args.spool.mkdir(parents=True, exist_ok=True)
    return PlacementPublisher(resolve_bootstrap(flag=args.bootstrap), str(args.spool))


@contextmanager
def _spool_lock(folder: Path, wait_s: float = SPOOL_LOCK_WAIT_S) -> Iterator[bool]:
    """Hold the spool folder's lock (``.lock``, ``flock``) while one run drains it and sends; yield whether held.

    Slurm starts many jobs at once, so many prologs and epilogs share one spool.  Holding the lock keeps
    one job's placements in order (a spooled ``running`` is sent before its ``finished``, not after it)
    and each spooled message sent once.  A run that cannot have it within ``wait_s`` goes on without
    it, at worst sending a spooled message twice: a hook must never hang a job's start.
    """
    folder.mkdir(parents=True, exist_ok=True)
    deadline = time.monotonic() + wait_s
    with open(folder / ".lock", "a") as fh:
        held = False
        while not held:
            try:
                fcntl.flock(fh, fcntl.LOCK_EX | fcntl.LOCK_NB)
                held = True
            except OSError:
                if time.monotonic() >= deadline:
                    log.warning("placement: the spool %s stayed locked by another run for %.0f s; going on "
                                "without its lock", folder, wait_s)
                    break
                time.sleep(0.05)
        try:
            yield held
        finally:
            if held:
                fcntl.flock(fh, fcntl.LOCK_UN)


async def _send_all(args: argparse.Namespace, msgs: list[dict[str, Any]], timeout_s: float = 15.0) -> int:
    """Publish ``msgs``; return how many are still spooled (0 when all were delivered).

    Waits at most ``timeout_s`` for the broker, and no longer once it has failed to answer and the
    messages are spooled (a later run sends them): a prolog with the broker down takes about a second.
    """
    if args.print:
        return await _send(args, msgs, timeout_s)
    with _spool_lock(args.spool):
        return await _send(args, msgs, timeout_s)


async def _send(args: argparse.Namespace, msgs: list[dict[str, Any]], timeout_s: float) -> int:
    pub = _publisher(args)
    await pub.start()
    try:
        for m in msgs:
            await pub.send(args.topic, m["job"], m)
        deadline = time.monotonic() + timeout_s
        while not await pub.flush(timeout=0.2):
            if time.monotonic() >= deadline or getattr(pub, "unreachable", False):
                break
        return pub.spooled
    finally:
        await pub.close()


def _say(msgs: list[dict[str, Any]], spooled: int, args: argparse.Namespace) -> None:
    from whywait.engine.placement.filesource import owner_summary

    for m in msgs:
        nodes = {r["node"] for r in m["ranks"]}
        what = "finished" if m["state"] == "finished" else f"{len(m['ranks'])} rank(s) on {len(nodes)} node(s)"
        print(f"placement {m['job']}: {what}, owner {owner_summary(m)}", file=sys.stderr)
    if spooled:
        print(f"placement: Kafka unreachable, {spooled} message(s) kept in {args.spool}; the next run sends them",
              file=sys.stderr)


def _slurm(args: argparse.Namespace) -> int:
    from whywait.engine.placement.slurm import facts_from_env, facts_from_scontrol

    env = dict(os.environ)
    job_id = args.job_id or env.get("SLURM_JOB_ID")
    finished = bool(args.epilog)
    if args.scontrol_json is not None:
        text = read_text(args.scontrol_json, ConfigError)
        facts = facts_from_scontrol(text, job_id, env, str(args.scontrol_json), finished)
    elif finished:
        facts = facts_from_env({**env, **({"SLURM_JOB_ID": job_id} if job_id else {})}, True)
    else:
        if not job_id:
            raise ConfigError("SLURM_JOB_ID is not set: run as PrologSlurmctld, or give --job-id")
        cmd = [*args.scontrol.split(), "show", "job", "-d", "--json", str(job_id)]
        try:
            done = subprocess.run(cmd, capture_output=True, text=True, timeout=30, check=False)
        except (OSError, subprocess.TimeoutExpired) as exc:
            raise ConfigError(f"cannot run {' '.join(cmd)}: {exc}") from None
        if done.returncode != 0:
            raise ConfigError(f"{' '.join(cmd)} failed ({done.returncode}): {done.stderr.strip()[:200]}")
        facts = facts_from_scontrol(done.stdout, job_id, env, "scontrol", finished)
    owner = _ownership(args, lenient=not args.strict).resolve(account=facts.account, user=facts.user)
    from whywait.engine.placement.model import placement_message

    msg = placement_message(facts, owner, time.time(), socket.gethostname())
    spooled = asyncio.run(_send_all(args, [msg]))
    _say([msg], spooled, args)
    return 0


def _k8s(args: argparse.Namespace) -> int:
    from kubernetes import client, config
    from whywait.engine.placement.k8s import PodTracker

    if args.api_server:
        conf = client.Configuration()
        conf.host = args.api_server
        api = client.CoreV1Api(client.ApiClient(conf))
    else:
        try:
            if args.kubeconfig:
                config.load_kube_config(config_file=str(args.kubeconfig))
            else:
                try:
                    config.load_incluster_config()
                except config.ConfigException:
                    config.load_kube_config()
        except (config.ConfigException, OSError) as exc:
            raise ConfigError(f"no Kubernetes credentials: {exc} (give --kubeconfig or --api-server)") from None
        api = client.CoreV1Api()
    tracker = PodTracker(_ownership(args), socket.gethostname(), time.time)
    return asyncio.run(_k8s_loop(args, api, tracker))


class ServiceUnreachable(WhywaitError):
    """A service the command needs (the Kubernetes API) does not answer: exit 3, as for Kafka."""

    exit_code = EXIT_UNAVAILABLE


def _short(exc: BaseException) -> str:
    """urllib3's retry errors nest the cause in a paragraph: its last reason is what to say."""
    text = str(exc)
    reason = getattr(exc, "reason", None)
    return str(reason) if reason is not None else text[:300]


async def _k8s_loop(args: argparse.Namespace, api: Any, tracker: Any) -> int:
    from whywait.engine.placement.k8s import watch_pods

    pub = _publisher(args)
    await pub.start()
    loop = asyncio.get_running_loop()
    queue: asyncio.Queue[dict[str, Any]] = asyncio.Queue()
    stop = threading.Event()

    def publish(msg: dict[str, Any]) -> None:
        loop.call_soon_threadsafe(queue.put_nowait, msg)

    # The official client blocks: the watch runs in a thread and hands messages to this loop.
    watcher = loop.run_in_executor(None, lambda: watch_pods(api, tracker, publish, stop.is_set,
                                                            args.label_selector, rounds=1 if args.once else None))
    try:
        while True:
            getter: asyncio.Future[Any] = asyncio.ensure_future(queue.get())
            waiting: set[asyncio.Future[Any]] = {getter, watcher}
            done, _ = await asyncio.wait(waiting, return_when=asyncio.FIRST_COMPLETED)
            msgs = [getter.result()] if getter in done else []
            if getter not in done:
                getter.cancel()
            if watcher in done:
                while not queue.empty():
                    msgs.append(queue.get_nowait())
            for m in msgs:
                await pub.send(args.topic, m["job"], m)
            _say(msgs, 0, args)
            if watcher in done:
                watcher.result()  # a watch error surfaces here
                break
    except asyncio.CancelledError:
        stop.set()
    except Exception as exc:
        from kubernetes.client.exceptions import ApiException

        if isinstance(exc, ApiException):
            raise WhywaitError(f"Kubernetes API: {exc.status} {exc.reason}") from None
        if "MaxRetryError" in type(exc).__name__ or "Connection" in type(exc).__name__:
            raise ServiceUnreachable(f"Kubernetes API unreachable: {_short(exc)}") from None
        raise
    finally:
        stop.set()
        await pub.flush(timeout=15.0)
        await pub.close()
    print(f"placement k8s: {pub.sent} placement(s) {'printed' if args.print else 'published'}"
          + (f", {pub.spooled} kept in {args.spool} until Kafka answers" if pub.spooled else ""), file=sys.stderr)
    return 0


def _publish(args: argparse.Namespace) -> int:
    from whywait.engine.placement.filesource import placements_from_text

    text = read_text(args.file, ConfigError)
    source = "<stdin>" if args.file == "-" else args.file
    msgs = placements_from_text(text, source, _ownership(args), socket.gethostname())
    spooled = asyncio.run(_send_all(args, msgs))
    _say(msgs, spooled, args)
    return 0


def run(args: argparse.Namespace) -> int:
    logging.getLogger("kubernetes").setLevel(logging.WARNING)
    logging.getLogger("urllib3").setLevel(logging.ERROR)  # a retry warning per attempt: the failure is said once
    if args.spool is None and not args.print:  # a printing run writes nothing, not even a spool folder
        args.spool = _default_spool()
    if args.action == "slurm":
        try:
            return _slurm(args)
        except Exception as exc:  # noqa: BLE001 - whatever it is, a prolog must not hold or requeue the job
            if args.strict:
                raise
            # Slurm drains a node whose prolog fails: say what went wrong, never block the job.
            why = str(exc) if isinstance(exc, WhywaitError) else f"{type(exc).__name__}: {exc}"
            if isinstance(exc, OSError) and getattr(exc, "filename", None):
                why += f" (the placement spool is {args.spool}: --spool or WHYWAIT_PLACEMENT_SPOOL)"
            print(f"whywait placement slurm: {why} (the job runs; it is not placed)", file=sys.stderr)
            return 0
    if args.action == "k8s":
        return _k8s(args)
    return _publish(args)

