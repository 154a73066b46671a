"""The cluster simulator: synthetic clusters, jobs and faults, with ground truth.

* :mod:`whywait.simulate.cluster` — :func:`make_cluster`, :func:`make_job`
* :mod:`whywait.simulate.sim` — :class:`Simulation`, a pure, seeded generator of contract messages
* :mod:`whywait.simulate.faults` — the fault registry :data:`FAULTS` and :class:`GroundTruth`
* :mod:`whywait.simulate.hardware` — the ``hw`` reports and the fail-slow hardware faults (in :data:`FAULTS`)
* :mod:`whywait.simulate.scenario` — scenario YAML files
* :mod:`whywait.simulate.cli` — ``whywait simulate`` (the only part that touches Kafka)

Unlike the node agent, the simulator depends on :mod:`topology`: it builds the
cluster it simulates.  It never imports :mod:`engine` outside the CLI's ``run``.
"""

from __future__ import annotations

from whywait.simulate.cluster import JobSpec, make_cluster, make_job
from whywait.simulate.errors import SimulationError
from whywait.simulate.faults import FAULTS, Fault, GroundTruth, make_fault, parse_fault_spec
from whywait.simulate.hardware import HW_FAULTS  # registers the fail-slow hardware faults in FAULTS
from whywait.simulate.scenario import Scenario, load_scenario, parse_scenario
from whywait.simulate.sim import Simulation

__all__ = ["FAULTS", "Fault", "GroundTruth", "HW_FAULTS", "JobSpec", "Scenario", "Simulation", "SimulationError",
           "load_scenario", "make_cluster", "make_fault", "make_job", "parse_fault_spec", "parse_scenario"]
