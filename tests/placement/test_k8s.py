"""Kubernetes: the official client's watch API against a recorded pod list and watch stream."""

from __future__ import annotations

from typing import Any

from kubernetes import client
from whywait.engine.placement.k8s import PodTracker, pod_gpu_count, watch_pods
from whywait.engine.placement.ownership import OwnershipFile

from tests.placement.conftest import FIX
from tests.support.k8s_server import K8sReplayServer


def replay() -> tuple[list[dict[str, Any]], list[str]]:
    with K8sReplayServer(FIX / "k8s-pods-list.json", FIX / "k8s-pods-watch.jsonl") as srv:
        conf = client.Configuration()
        conf.host = srv.url
        api = client.CoreV1Api(client.ApiClient(conf))
        out: list[dict[str, Any]] = []
        watch_pods(api, PodTracker(OwnershipFile(FIX / "ownership.yaml"), "watcher", lambda: 1.0), out.append,
                   lambda: False, rounds=1)
        return out, srv.requests


def nodes(msg: dict[str, Any]) -> list[tuple[int, str]]:
    return sorted({(r["rank"] // 8 * 8, r["node"]) for r in msg["ranks"]})


def test_list_then_watch_from_its_resource_version() -> None:
    _, requests = replay()
    assert requests[0] == "/api/v1/pods"
    assert "watch=true" in requests[1] and "resourceVersion=1010" in requests[1]


def test_job_start_restart_on_another_node_and_end() -> None:
    msgs, _ = replay()
    train = [m for m in msgs if m["job"] == "llm/train-7b"]
    assert [m["state"] for m in train] == ["running"] * 4 + ["finished"]
    assert nodes(train[0]) == [(0, "a08-p1-dgx-04-c01"), (8, "a08-p1-dgx-04-c02")]
    assert nodes(train[1]) == [(0, "a08-p1-dgx-04-c01")]  # the worker failed
    # Recreated and bound to c03: its ranks 8-15 move there (a Pending pod without a node is not placed).
    assert nodes(train[2]) == [(0, "a08-p1-dgx-04-c01"), (8, "a08-p1-dgx-04-c03")]
    assert nodes(train[3]) == [(8, "a08-p1-dgx-04-c03")]  # the master finished first: the worker keeps 8-15
    first = train[0]
    assert (first["project"], first["team"], first["slack_channel"]) == ("llm", "pretraining", "#llm-pretrain")
    assert first["account"] == "llm" and first["user"] == "trainer" and first["source"] == "k8s"
    # The worker's indexes come from NVIDIA_VISIBLE_DEVICES, the master's from the annotation.
    assert [r["gpu"] for r in first["ranks"]] == list(range(8)) * 2


def test_gpu_pods_only_and_the_default_owner() -> None:
    msgs, _ = replay()
    assert {m["job"] for m in msgs} == {"llm/train-7b", "team-x/notebook-0"}  # coredns requests no GPU
    nb = next(m for m in msgs if m["job"] == "team-x/notebook-0")
    assert (nb["team"], nb["slack_channel"], nb["project"]) == ("no owner known", "#gpu-alerts", "team-x")


def test_gpu_count_from_limits_or_requests() -> None:
    pod = {"spec": {"containers": [{"resources": {"requests": {"nvidia.com/gpu": "2"}}},
                                   {"resources": {"limits": {"nvidia.com/gpu": 4}}}, {}]}}
    assert pod_gpu_count(pod) == 6
