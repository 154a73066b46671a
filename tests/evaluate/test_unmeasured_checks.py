"""A check is said "checked and clean" only when it was measured: a node whose agent runs without its GPU collector
(no NVML, the `[gpu]` extra missing) sent no GPU sample, and the straggler's message still said "GPU clocks and
temperature normal on node-02" (a new operator's pass, session 22): a team trusts what it was never shown."""

from __future__ import annotations

from pathlib import Path

import pytest
from whywait.engine.replay import replay
from whywait.engine.rules.loader import load_rules
from whywait.simulate.cluster import make_cluster, make_job
from whywait.simulate.faults import make_fault
from whywait.simulate.sim import Simulation
from whywait.topology.model import Topology

RULES = Path(__file__).resolve().parents[2] / "rules"
START = 1_700_000_000.0


@pytest.fixture(scope="module")
def straggler() -> list:
    topo = make_cluster(nodes=8)
    sim = Simulation(topo, [make_job(topo)], [make_fault("straggler-compute", "train-llm:12", 100, 170)],
                     start_time=START, duration_s=200, seed=1)
    return [m for _, m in sorted(sim.messages(), key=lambda tm: (tm[1]["time"], tm[1]["kind"] != "placement"))]


def _clean(msgs: list) -> tuple[str, ...]:
    res, _ = replay(iter(msgs), load_rules([RULES]), Topology.from_dict(make_cluster(nodes=8).to_dict()))
    d = next(d for d in res.diagnoses if d.rule_id == "job.straggler" and d.status == "firing")
    assert d.culprit and "node-02" in d.culprit, d.culprit
    return d.clean_checks


def test_a_gpu_check_is_clean_only_where_the_gpus_were_measured(straggler: list) -> None:
    measured = _clean(straggler)
    assert "GPU clocks and temperature normal on node-02" in measured  # the check holds its place when measured
    blind = _clean([m for m in straggler if not (m["kind"] == "gpu" and m["node"] == "node-02")])
    assert not any("GPU clocks" in c for c in blind), blind
    # the other checks were measured (the job's GPUs elsewhere, node-02's NIC and disks): still said
    assert set(blind) == set(measured) - {"GPU clocks and temperature normal on node-02"}, (blind, measured)
