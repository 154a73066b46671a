"""The training socket's trust model, with real users, the real agent and the real broker.

Senders are child processes running as other users (so the test needs root, to switch users, and
skips without it).  The socket's group is ``nogroup``; uid 1000 (in that group) starts job
``train-a``; ``nobody`` (also in the group) then tries to report for ``train-a`` (refused: the
job is uid 1000's on this node) and for ``train-b`` (its own: accepted); uid 1001, outside the
group, cannot send at all.  What reaches Kafka is checked, and the engine's processor refuses the
timings whose sender is not the placement's user.
"""

from __future__ import annotations

import asyncio
import grp
import json
import os
import shutil
import stat
import tempfile
import uuid
from pathlib import Path
from typing import Any

import pytest
from whywait.agents.agent import Agent
from whywait.agents.collectors import HostCollector
from whywait.agents.events import (
    TOPIC_AGENT_HEALTH,
    TOPIC_PLACEMENT,
    TOPIC_STEPS,
    ContractError,
    decode,
    encode,
    envelope,
)
from whywait.agents.publisher import KafkaPublisher
from whywait.agents.training import Reporter

pytestmark = [pytest.mark.integration,
              pytest.mark.skipif(os.geteuid() != 0, reason="switching users needs root")]
REPO = Path(__file__).resolve().parents[2]

def send_as(uid: int, gid: int, job: str, rank: int, path: str, claim_node: str = "node-99") -> tuple[int, int]:
    """Report three steps of ``job``/``rank`` as ``uid``:``gid`` (a forked child that drops to that user);
    return (sent, dropped) as the sender's :class:`Reporter` counted them."""
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: become the other user, send with the real training module, report, exit
        try:
            os.close(r)
            os.setgroups([])
            os.setgid(gid)
            os.setuid(uid)
            rep = Reporter(job, rank, node=claim_node, sock=path)
            for n in range(3):
                with rep.step(n):
                    pass
            os.write(w, f"{rep.sent} {rep.dropped}".encode())
        finally:
            os._exit(0)
    os.close(w)
    with os.fdopen(r) as f:
        text = f.read()
    os.waitpid(pid, 0)
    sent, dropped = text.split()
    return int(sent), int(dropped)


async def consume(bootstrap: str, topics: list[str], node: str, want: dict[str, int],
                  timeout: float = 60.0) -> dict[str, list[dict[str, Any]]]:
    """The valid messages of ``node`` on ``topics`` until ``want`` counts are met (others' bad ones skipped)."""
    from aiokafka import AIOKafkaConsumer

    consumer = AIOKafkaConsumer(*topics, bootstrap_servers=bootstrap, auto_offset_reset="earliest",
                                enable_auto_commit=False, group_id=None)
    await consumer.start()
    got: dict[str, list[dict[str, Any]]] = {t: [] for t in topics}
    try:
        async with asyncio.timeout(timeout):
            while any(len(got[t]) < n for t, n in want.items()):
                for tp, batch in (await consumer.getmany(timeout_ms=500)).items():
                    for r in batch:
                        try:
                            msg = decode(r.value, tp.topic)
                        except ContractError:
                            continue  # another test's deliberately bad message on the shared topic
                        if msg["node"] == node:
                            got[tp.topic].append(dict(msg))
    finally:
        await consumer.stop()
    return got


@pytest.fixture()
def sockdir() -> Any:
    d = tempfile.mkdtemp(prefix="whywait-sock-")
    os.chmod(d, 0o755)  # other users must reach the socket (its own mode is what guards it)
    yield d
    shutil.rmtree(d, ignore_errors=True)


async def test_only_the_jobs_owner_reports_and_the_node_is_the_agents(kafka_bootstrap: str, sockdir: str,
                                                                      tmp_path: Any) -> None:
    nogroup = grp.getgrnam("nogroup").gr_gid
    node = f"sock-{uuid.uuid4().hex[:8]}"
    path = os.path.join(sockdir, "agent.sock")
    pub = KafkaPublisher(kafka_bootstrap, os.path.join(str(tmp_path), "spool"))
    agent = Agent(node, [HostCollector("/")], pub, interval=0.5, socket_path=path, socket_group="nogroup")
    stop = asyncio.Event()
    run = asyncio.create_task(agent.run(stop=stop))
    try:
        for _ in range(100):
            if os.path.exists(path):
                break
            await asyncio.sleep(0.05)
        st = os.stat(path)
        assert stat.S_IMODE(st.st_mode) == 0o660 and st.st_gid == nogroup

        job_a, job_b = f"train-a-{node}", f"train-b-{node}"
        assert await asyncio.to_thread(send_as, 1000, nogroup, job_a, 0, path) == (3, 0)
        await asyncio.sleep(0.3)  # uid 1000 owns job_a on this node from here on
        assert await asyncio.to_thread(send_as, 65534, nogroup, job_a, 1, path) == (3, 0)  # sent, then refused
        assert await asyncio.to_thread(send_as, 65534, nogroup, job_b, 0, path) == (3, 0)
        assert await asyncio.to_thread(send_as, 1001, 1001, job_a, 2, path) == (0, 3)  # not in the group
        await asyncio.sleep(1.5)
    finally:
        stop.set()
        await run
    assert agent.inbox.rejected == 3

    got = await consume(kafka_bootstrap, [TOPIC_STEPS, TOPIC_AGENT_HEALTH], node,
                        {TOPIC_STEPS: 2, TOPIC_AGENT_HEALTH: 1})
    steps = {m["job"]: m for m in got[TOPIC_STEPS]}
    a = [s for m in got[TOPIC_STEPS] if m["job"] == job_a for s in m["steps"]]
    assert {s["rank"] for s in a} == {0} and len(a) == 3  # nobody's rank 1 never left the node
    assert all(s["node"] == node for m in got[TOPIC_STEPS] for s in m["steps"])  # not the claimed node-99
    assert steps[job_a]["sender_uid"] == 1000 and steps[job_b]["sender_uid"] == 65534
    assert steps[job_b]["sender_user"] == "nobody"
    assert max(h["training_rejected"] for h in got[TOPIC_AGENT_HEALTH]) == 3

    # The engine checks the sender against the placement: job_b runs as alice, nobody sent its timings.
    from whywait.engine.evaluate.evaluator import Evaluator
    from whywait.engine.rules.loader import load_rules
    from whywait.engine.stream.processor import Processor, Record
    from whywait.simulate.cluster import make_cluster

    p = Processor(Evaluator(load_rules([REPO / "rules"]), make_cluster(nodes=2, gpus_per_node=1)))
    placement = envelope("placement", "slurm", steps[job_b]["time"] - 1, job=job_b, project="p", team="t",
                         state="running", user="alice", ranks=[{"rank": 0, "node": "node-01", "gpu": 0}])
    out = p.process([Record(TOPIC_PLACEMENT, encode(placement)), Record(TOPIC_STEPS, encode(steps[job_b]))])
    [(_, dl)] = out.dead_letters
    assert json.loads(dl)["category"] == "sender"
    assert "sent by user 'nobody', but its placement runs it as 'alice'" in json.loads(dl)["reason"]

