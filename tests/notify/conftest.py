"""Fixtures for the notifier tests: the local Slack server and diagnoses at fixed times."""

from __future__ import annotations

import dataclasses
from typing import Any, Callable, Iterator

import pytest
from whywait.engine.diagnosis import Diagnosis, Evidence, Owner

from tests.support.slack_server import SlackServer

TOKEN = "xoxb-test-0000"
T0 = 1_750_000_000.0  # 2025-06-15 15:06:40 UTC


@pytest.fixture
def slack_server() -> Iterator[SlackServer]:
    """A local Slack Web API server with #ml-infra, #vision and #whywait; token :data:`TOKEN`."""
    with SlackServer(channels=["#ml-infra", "#vision", "#whywait", "#incidents"], token=TOKEN) as s:
        yield s


@pytest.fixture
def make_diagnosis() -> Callable[..., Diagnosis]:
    """Factory: a firing straggler diagnosis at :data:`T0`; keyword arguments override fields."""

    def make(**kw: Any) -> Diagnosis:
        rank = kw.pop("rank", 12)
        node = kw.pop("node", "node-07")
        job = kw.get("job", "llm-70b")
        base = Diagnosis(
            rule_id="network.straggler-retransmits",
            fingerprint=f"network.straggler-retransmits|job={job}|node={node}",
            status="firing",
            severity="warning",
            title=f"Rank {rank} of llm-70b is the straggler: packet loss on {node}",
            cause=f"{node}'s NIC drops packets; TCP retransmits 412/s against the peers' 3.1/s",
            job="llm-70b",
            owner=Owner(project="llm-pretrain", team="ml-infra", channel="#ml-infra"),
            starts_at=T0,
            detected_at=T0 + 30,
            labels={"job": "llm-70b", "node": node, "switch": "leaf-3"},
            evidence=(
                Evidence("tcp_retrans_segs_per_s", node, 412.0, "/s", 3.1, "> 3x peers' median", 60),
                Evidence("step_time_s", f"rank {rank}", 2.41, "s", 1.2, "> 1.5x peers' median", 60),
            ),
            topology_path=(f"rank {rank}", node, f"{node}/eth0", "leaf-3", "spine-1"),
            clean_checks=("GPU clocks", "storage latency", "host CPU"),
            confidence=0.87,
            next_step=f"Drain {node} and check its NIC and cable",
            culprit=node,
            ranks=(rank,),
            runbook_url="https://runbooks.example/network/straggler-retransmits",
        )
        return dataclasses.replace(base, **kw)

    return make


FAST = dict(group_wait=0.2, group_interval=0.3, repeat_interval=3600.0, rate_per_channel=50.0,
            retry_backoff=(0.05, 0.2), request_timeout=5.0)


@pytest.fixture
def make_notifier(slack_server: SlackServer, tmp_path: Any) -> Iterator[Callable[..., Any]]:
    """Factory: a SlackNotifier on :func:`slack_server` with fast timings (overridable by keyword);
    ``state_store``, ``silence_store``, ``clock`` and ``token`` pass through.  Closed at teardown."""
    from whywait.engine.notify.config import SlackConfig
    from whywait.engine.notify.slack import SlackNotifier

    made: list[SlackNotifier] = []

    def make(*, token: str = TOKEN, state_store: Any = None, silence_store: Any = None, **overrides: Any) -> Any:
        kw = {**FAST, "api_url": slack_server.url, "outbox_dir": tmp_path / "outbox",
              "default_channel": "#whywait", **overrides}
        n = SlackNotifier(token, SlackConfig(**kw), state_store=state_store, silence_store=silence_store)
        made.append(n)
        return n

    yield make
    for n in made:
        n.close(timeout=2)
