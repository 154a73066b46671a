"""docker-compose.yml: two engine workers on a three-node KRaft Kafka, checked by reading the file.

There is no Docker engine on the test machines (and `docker compose config` needs the plugin), so the
file is parsed here and its wiring checked: what a broken edit would break at `docker compose up`.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml

COMPOSE = Path(__file__).resolve().parents[2] / "docker-compose.yml"


def services() -> dict[str, Any]:
    data = yaml.safe_load(COMPOSE.read_text())  # resolves the x-* anchors and << merges
    return dict(data["services"])


def test_three_kraft_nodes_form_one_quorum() -> None:
    s = services()
    brokers = {k: v for k, v in s.items() if v.get("image", "").startswith("apache/kafka")}
    assert len(brokers) == 3
    ids = {str(v["environment"]["KAFKA_NODE_ID"]) for v in brokers.values()}
    assert ids == {"1", "2", "3"}
    voters = {v["environment"]["KAFKA_CONTROLLER_QUORUM_VOTERS"] for v in brokers.values()}
    assert len(voters) == 1
    quorum = dict(x.split("@") for x in voters.pop().split(","))
    for name, b in brokers.items():
        env = b["environment"]
        assert quorum[str(env["KAFKA_NODE_ID"])] == f"{b['hostname']}:9093", name
        assert "controller" in env["KAFKA_PROCESS_ROLES"] and "broker" in env["KAFKA_PROCESS_ROLES"]
        assert f"PLAINTEXT://{b['hostname']}:9092" in env["KAFKA_ADVERTISED_LISTENERS"]
    assert len({b["environment"]["CLUSTER_ID"] for b in brokers.values()}) == 1
    host_ports = [p.split(":")[0] for b in brokers.values() for p in b["ports"]]
    assert len(set(host_ports)) == 3
    assert all(int(b["environment"]["KAFKA_OFFSETS_TOPIC_REPLICATION_FACTOR"]) == 3 for b in brokers.values())


def test_two_engine_workers_share_a_group_with_replicated_topics() -> None:
    s = services()
    engines = {k: v for k, v in s.items() if "whywait engine" in " ".join(v.get("entrypoint") or [])}
    assert len(engines) == 2
    members = set()
    for e in engines.values():
        env = e["environment"]
        assert set(env["WHYWAIT_KAFKA_BOOTSTRAP"].split(",")) == {"kafka-1:9092", "kafka-2:9092", "kafka-3:9092"}
        assert int(env["WHYWAIT_REPLICATION"]) == 3
        assert int(env["WHYWAIT_PARTITIONS"]) >= 2 * len(engines)
        members.add(env["WHYWAIT_ENGINE_INSTANCE"])
        assert env["WHYWAIT_TOPOLOGY"]
    assert len(members) == 2  # one static member id each, or the second would fence the first
    ports = [p.split(":")[0] for e in engines.values() for p in e["ports"]]
    assert len(set(ports)) == 2
    # topics are created (replicated, partitioned, compacted) before anything publishes
    assert "ensure_topics" in " ".join(s["topics"]["entrypoint"])
    for name in ("simulator", *engines):
        assert s[name]["depends_on"]["topics"]["condition"] == "service_completed_successfully"


def test_topics_service_sets_what_the_engine_reads() -> None:
    """The one-shot topics service and the workers agree on partitions and replication."""
    s = services()
    env = s["topics"]["environment"]
    for name in ("engine-1", "engine-2"):
        for key in ("WHYWAIT_PARTITIONS", "WHYWAIT_REPLICATION", "WHYWAIT_KAFKA_BOOTSTRAP"):
            assert s[name]["environment"][key] == env[key]
