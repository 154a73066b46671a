"""The Kubernetes pod tracker, fed the recorded real pods with each field replaced by a value of another type.

Annotations and labels are anyone's strings; a pod the tracker cannot read, or a job whose placement breaks
the contract, must be skipped and said, never end the watcher (which stops every other job's placements).
"""

from __future__ import annotations

import copy
import json
from typing import Any

from whywait.engine.placement.k8s import PodTracker
from whywait.engine.placement.ownership import OwnershipFile

from tests.placement.conftest import FIX
from tests.support.hostile import retyped

PODS = json.loads((FIX / "k8s-pods-list.json").read_text())["items"]
WRONG: tuple[Any, ...] = (None, "x", -1, [], {}, True, 10**30, "\x00" * 3)


def test_every_field_of_a_real_pod_damaged_is_skipped_not_fatal() -> None:
    failures = []
    for pod in PODS[:6]:
        for what, damaged in retyped(pod, WRONG):
            tracker = PodTracker(OwnershipFile(FIX / "ownership.yaml"), "watcher", lambda: 1.0)
            try:
                tracker.resync([damaged, *PODS])
                tracker.handle("MODIFIED", damaged)
                tracker.handle("DELETED", damaged)
            except Exception as exc:  # noqa: BLE001 - any escape ends the watcher: the defect looked for
                failures.append(f"{what}: {type(exc).__name__}: {exc}")
    assert failures == []


def test_the_other_jobs_are_still_placed() -> None:
    def jobs(pods: list[Any]) -> tuple[set[str], int]:
        tracker = PodTracker(OwnershipFile(FIX / "ownership.yaml"), "watcher", lambda: 1.0)
        return {m["job"] for m in tracker.resync(pods)}, tracker.skipped

    bad = copy.deepcopy(PODS[0])
    bad["metadata"] = "not an object"
    others, _ = jobs(PODS[1:])
    assert others  # the recording has GPU jobs besides the first pod's
    assert jobs([bad, *PODS[1:]]) == (others, 1)
