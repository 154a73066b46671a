"""The topology a replay learns from placements when none is given (``whywait replay`` without --topology)."""

from __future__ import annotations

from typing import Any

from whywait.engine.replay import PlacedTopology


def placement(job: str, ranks: list[tuple[str, int]], state: str = "running") -> dict[str, Any]:
    return {"kind": "placement", "job": job, "project": "p", "team": "t", "state": state, "slack_channel": None,
            "ranks": [{"rank": i, "node": n, "gpu": g} for i, (n, g) in enumerate(ranks)]}


def test_nodes_and_gpus_are_learnt_from_the_placements_once() -> None:
    topo = PlacedTopology()
    topo.apply_placement(placement("a", [("n1", 0), ("n1", 1), ("n2", 0), ("n2", 1)]))
    assert topo.learnt == ["n1", "n2"] and topo.gpus_of("n1") == (0, 1)
    assert topo.job("a").world_size == 4 and topo.nics_of("n1") == ()
    # a second job on a known node and a new one; a known node keeps its GPUs
    topo.apply_placement(placement("b", [("n2", 0), ("n3", 3)]))
    assert topo.learnt == ["n1", "n2", "n3"] and topo.gpus_of("n3") == (3,)
    # a finished job is removed and adds nothing
    topo.apply_placement(placement("a", [("n9", 0)], state="finished"))
    assert not topo.has_job("a") and "n9" not in topo.nodes()


def test_a_gpu_a_known_node_was_not_given_is_refused_as_with_any_topology() -> None:
    import pytest
    from whywait.topology.errors import TopologyError

    topo = PlacedTopology()
    topo.apply_placement(placement("a", [("n1", 0)]))
    with pytest.raises(TopologyError):
        topo.apply_placement(placement("b", [("n1", 5)]))
