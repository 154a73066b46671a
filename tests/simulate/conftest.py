"""Shared, session-scoped simulation runs (generation is the slow part of these tests)."""

from __future__ import annotations

from typing import Any

import pytest
from whywait.simulate.cluster import make_cluster, make_job
from whywait.simulate.faults import Fault, make_fault
from whywait.simulate.sim import Simulation

START = 1_764_442_800.0


def run_sim(faults: list[Fault] | None = None, duration: float = 240.0, seed: int = 3, nodes: int = 16,
            jobs: Any = None, **cluster: Any) -> tuple[Simulation, list[tuple[str, dict[str, Any]]]]:
    """Run a fresh 16-node simulation and return it with all its messages."""
    topo = make_cluster(nodes=nodes, **cluster)
    specs = jobs(topo) if jobs else [make_job(topo)]
    sim = Simulation(topo, specs, faults or [], start_time=START, duration_s=duration, seed=seed)
    return sim, list(sim.messages())


@pytest.fixture(scope="session")
def healthy() -> tuple[Simulation, list[tuple[str, dict[str, Any]]]]:
    return run_sim()


@pytest.fixture(scope="session")
def packet_loss() -> tuple[Simulation, list[tuple[str, dict[str, Any]]]]:
    return run_sim([make_fault("nic-packet-loss", "node-07", 120, 200)])
