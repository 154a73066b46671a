"""Scenario files: a cluster, its jobs and a fault schedule in one YAML document.

Loaded by ``whywait simulate --scenario FILE`` and by tests.  The format::

    seed: 7                      # optional, default 0
    duration_s: 600              # optional, default 600
    interval_s: 1                # optional, default 1
    cluster:                     # make_cluster() arguments; or `topology: topo.yaml` (relative to this file)
      nodes: 16
      gpus_per_node: 8
      nodes_per_leaf: 4
      spines: 2
      nics_per_node: 4
      pools: [scratch, datasets]
    jobs:                        # optional; default one job "train-llm" on every node
      - job: train-llm
        project: llm
        team: ml-platform
        channel: "#ml-platform"
        nodes: node-01..node-12  # a range, a list, or omitted for every node
        gpus_per_node: 8         # optional
        pool: scratch            # optional; any JobSpec field (compute_s, checkpoint_every_s...) may follow:
        step_s: 45               #   the healthy step time (phases scaled to it)
        pp: 4                    #   pipeline stages (tp: tensor-parallel group size; microbatches: per step)
        split: false             #   publish duration_s only
        slow_nodes: node-01..node-06  # GPUs slow_mult (default 1.2) times slower from the start
    faults:
      - fault: nic-packet-loss
        target: node-07
        start: 120               # seconds after the start
        end: 400
        params: {loss_pct: 2.0}  # optional, per fault class

Unknown keys are errors; every problem names the file and the key path.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml
from whywait.simulate.cluster import JobSpec, make_cluster, make_job
from whywait.simulate.errors import SimulationError
from whywait.simulate.faults import Fault, make_fault
from whywait.topology import Topology, TopologyError

_TOP = {"seed", "duration_s", "interval_s", "cluster", "topology", "jobs", "faults"}
_CLUSTER = {"nodes", "gpus_per_node", "nodes_per_leaf", "spines", "nics_per_node", "nodes_per_rack", "pools",
            "pool_type", "name"}
_JOB_OWN = {"job", "project", "team", "channel", "nodes", "gpus_per_node"}
_FAULT = {"fault", "target", "start", "end", "params"}


@dataclass
class Scenario:
    """A parsed scenario: the topology (jobs not yet placed), job specs, faults and run settings."""

    topology: Topology
    jobs: list[JobSpec]
    faults: list[Fault]
    seed: int = 0
    duration_s: float = 600.0
    interval_s: float = 1.0
    source: str = "<scenario>"
    extra: dict[str, Any] = field(default_factory=dict)


_RANGE = re.compile(r"^(?P<prefix>.*?)(?P<a>\d+)\.\.(?P=prefix)(?P<b>\d+)$")


def expand_nodes(spec: Any, where: str) -> list[str] | None:
    """Turn ``node-01..node-12`` or a list of ids into a list; None for "every node"."""
    if spec is None:
        return None
    if isinstance(spec, list) and all(isinstance(s, str) for s in spec):
        return list(spec)
    if isinstance(spec, str):
        m = _RANGE.match(spec)
        if m:
            a, b = m.group("a"), m.group("b")
            return [f"{m.group('prefix')}{i:0{len(a)}d}" for i in range(int(a), int(b) + 1)]
        return [spec]
    raise SimulationError(f"{where}: expected a node list or a range like node-01..node-08 (got {spec!r})")


def parse_scenario(data: Any, source: str = "<scenario>", base_dir: Path | None = None) -> Scenario:
    """Build a :class:`Scenario` from the mapping above; raises :class:`SimulationError` naming the key path."""
    if not isinstance(data, dict):
        raise SimulationError(f"{source}: expected a mapping at the top level (got {type(data).__name__})")
    unknown = set(data) - _TOP
    if unknown:
        raise SimulationError(f"{source}: unknown key(s) {', '.join(sorted(map(str, unknown)))} "
                              f"(valid: {', '.join(sorted(_TOP))})")
    if "cluster" in data and "topology" in data:
        raise SimulationError(f"{source}: give either 'cluster' or 'topology', not both")
    seed = data.get("seed", 0)
    if isinstance(seed, bool) or not isinstance(seed, int):
        raise SimulationError(f"{source}: seed: expected an integer (got {seed!r})")
    nums = {}
    for k, default in (("duration_s", 600.0), ("interval_s", 1.0)):
        v = data.get(k, default)
        if isinstance(v, bool) or not isinstance(v, (int, float)) or v <= 0:
            raise SimulationError(f"{source}: {k}: expected a positive number of seconds (got {v!r})")
        nums[k] = float(v)
    if "topology" in data:
        path = Path(str(data["topology"]))
        if base_dir is not None and not path.is_absolute():
            path = base_dir / path
        try:
            topo = Topology.from_yaml(path)
        except TopologyError as exc:
            raise SimulationError(f"{source}: topology: {exc}") from None
    else:
        cl = data.get("cluster") or {}
        if not isinstance(cl, dict):
            raise SimulationError(f"{source}: cluster: expected a mapping (got {cl!r})")
        bad = set(cl) - _CLUSTER
        if bad:
            raise SimulationError(f"{source}: cluster: unknown key(s) {', '.join(sorted(map(str, bad)))} "
                                  f"(valid: {', '.join(sorted(_CLUSTER))})")
        try:
            topo = make_cluster(**cl)
        except TypeError as exc:
            raise SimulationError(f"{source}: cluster: {exc}") from None
    jobs: list[JobSpec] = []
    job_list = data.get("jobs") or [{}]
    if not isinstance(job_list, list):
        raise SimulationError(f"{source}: jobs: expected a list (got {job_list!r})")
    for i, j in enumerate(job_list):
        where = f"{source}: jobs[{i}]"
        if not isinstance(j, dict):
            raise SimulationError(f"{where}: expected a mapping (got {j!r})")
        own = {k: j[k] for k in _JOB_OWN if k in j and k != "nodes"}
        behaviour = {k: v for k, v in j.items() if k not in _JOB_OWN}
        if "slow_nodes" in behaviour:
            behaviour["slow_nodes"] = tuple(expand_nodes(behaviour["slow_nodes"], f"{where}.slow_nodes") or ())
        try:
            jobs.append(make_job(topo, nodes=expand_nodes(j.get("nodes"), f"{where}.nodes"), **own, **behaviour))
        except SimulationError as exc:
            raise SimulationError(f"{where}: {exc}") from None
    faults: list[Fault] = []
    fault_list = data.get("faults") or []
    if not isinstance(fault_list, list):
        raise SimulationError(f"{source}: faults: expected a list (got {fault_list!r})")
    for i, f in enumerate(fault_list):
        where = f"{source}: faults[{i}]"
        if not isinstance(f, dict):
            raise SimulationError(f"{where}: expected a mapping (got {f!r})")
        bad = set(f) - _FAULT
        missing = {"fault", "target", "start", "end"} - set(f)
        if bad or missing:
            raise SimulationError(f"{where}: " + "; ".join(
                ([f"unknown key(s) {', '.join(sorted(map(str, bad)))} (valid: {', '.join(sorted(_FAULT))})"]
                 if bad else []) + ([f"missing {', '.join(sorted(missing))}"] if missing else [])))
        params = f.get("params") or {}
        if not isinstance(params, dict):
            raise SimulationError(f"{where}.params: expected a mapping (got {params!r})")
        try:
            faults.append(make_fault(str(f["fault"]), str(f["target"]), f["start"], f["end"], **params))
        except SimulationError as exc:
            raise SimulationError(f"{where}: {exc}") from None
    return Scenario(topo, jobs, faults, seed, nums["duration_s"], nums["interval_s"], source)


def load_scenario(path: str | Path) -> Scenario:
    """Read a scenario YAML file; problems name the file."""
    p = Path(path)
    try:
        data = yaml.safe_load(p.read_text())
    except OSError as exc:
        raise SimulationError(f"{path}: cannot read: {exc.strerror or exc}") from None
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        raise SimulationError(f"{path}{':' + str(mark.line + 1) if mark else ''}: not valid YAML: "
                              f"{getattr(exc, 'problem', None) or exc}") from None
    return parse_scenario(data, str(path), p.parent)
