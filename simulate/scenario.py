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

Unknown keys are errors; every problem names the file and the key path.  A rule test's scenario is
also bounded (:data:`RULE_TEST_LIMITS`: a day of event time, 20,000 nodes, and the work they add up to),
and checked by building its simulation (:func:`check_simulation`), so a fault naming no node is
refused at its line before anything runs.
"""

from __future__ import annotations

import copy
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Mapping

from whywait.simulate.cluster import JobSpec, make_cluster, make_job
from whywait.simulate.errors import SimulationError
from whywait.simulate.faults import Fault, make_fault
from whywait.topology import Topology, TopologyError

from whywait import yamlio
from whywait.errors import YamlError

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


@dataclass(frozen=True)
class ScenarioLimits:
    """How much simulation a scenario may ask for; :func:`parse_scenario` refuses more, at the key's line.

    ``whywait simulate`` takes any size (a soak test may run for days); a rule test is a unit test, so
    ``rules check`` and ``rules test`` hold its scenarios to :data:`RULE_TEST_LIMITS`.
    """

    max_duration_s: float = 86_400.0  # event time
    max_samples: int = 86_400  # duration_s / interval_s: the ticks every node reports on
    max_nodes: int = 20_000
    max_per_node: int = 256  # gpus_per_node, nics_per_node; and pools, spines
    max_node_samples: int = 2_000_000  # nodes × samples: about five minutes of simulation
    max_rank_steps: int = 20_000_000  # per job, ranks × healthy steps in duration_s: about as long


#: The bounds of a rule test's scenario: generous for a rule's cases, never an afternoon's run or gigabytes.
RULE_TEST_LIMITS = ScenarioLimits()


class _Where:
    """``file:line: key.path`` for a key of a scenario that stands at ``prefix`` in its document."""

    def __init__(self, source: str, lines: Mapping[yamlio.KeyPath, int] | None, prefix: yamlio.KeyPath) -> None:
        self.source, self.lines, self.prefix = source, lines, prefix

    def loc(self, *path: Any) -> str:
        """``source:line`` of ``path`` inside the scenario (just ``source`` without a line map)."""
        return self.source if self.lines is None else f"{self.source}:{yamlio.line_of(self.lines, self.prefix + path)}"

    def at(self, *path: Any) -> str:
        """``source:line: path`` for a problem at ``path`` inside the scenario."""
        where = yamlio.format_path(self.prefix + path)
        return f"{self.loc(*path)}: {where}" if where else self.loc(*path)


_RANGE = re.compile(r"^(?P<prefix>.*?)(?P<a>\d+)\.\.(?P=prefix)(?P<b>\d+)$")


def expand_nodes(spec: Any, where: str, cluster_size: int | None = None) -> list[str] | None:
    """Turn ``node-01..node-12`` or a list of ids into a list; None for "every node".

    With ``cluster_size``, a range far longer than the cluster (and than 10,000) is refused before it is
    spelled out; a shorter one is left for the caller to name its first unknown node.
    """
    if spec is None:
        return None
    if isinstance(spec, list) and all(isinstance(s, str) for s in spec):
        return list(spec)
    if isinstance(spec, str):
        m = _RANGE.match(spec)
        if m:
            a, b = m.group("a"), m.group("b")
            n = int(b) - int(a) + 1
            if cluster_size is not None and n > max(cluster_size, 10_000):
                raise SimulationError(f"{where}: {spec} names {n:,} nodes; the cluster has {cluster_size:,}")
            return [f"{m.group('prefix')}{i:0{len(a)}d}" for i in range(int(a), int(b) + 1)]
        return [spec]
    raise SimulationError(f"{where}: expected a node list or a range like node-01..node-08 (got {spec!r})")


def parse_scenario(data: Any, source: str = "<scenario>", base_dir: Path | None = None,
                   lines: Mapping[yamlio.KeyPath, int] | None = None, prefix: yamlio.KeyPath = (),
                   limits: ScenarioLimits | None = None) -> Scenario:
    """Build a :class:`Scenario` from the mapping above; raises :class:`SimulationError` naming the key path.

    ``lines`` (from :func:`whywait.yamlio.load`) puts the line in each message (``s.yaml:12: faults[0]: ...``);
    ``prefix`` is where ``data`` stands inside that document (a rule test's ``cases[2].scenario``);
    ``limits`` bounds its size, each bound checked before the work it would cost (see :class:`ScenarioLimits`).
    """
    w = _Where(source, lines, prefix)
    loc, at = w.loc, w.at

    if not isinstance(data, dict):
        raise SimulationError(f"{at()}: expected a mapping at the top level (got {type(data).__name__})")
    unknown = set(data) - _TOP
    if unknown:
        names = sorted(map(str, unknown))
        inside = f"{yamlio.format_path(prefix)}: " if prefix else ""
        raise SimulationError(f"{loc(names[0])}: {inside}unknown key(s) {', '.join(names)} "
                              f"(valid: {', '.join(sorted(_TOP))})")
    if "cluster" in data and "topology" in data:
        raise SimulationError(f"{at('topology')}: give either 'cluster' or 'topology', not both")
    seed = data.get("seed", 0)
    if isinstance(seed, bool) or not isinstance(seed, int):
        raise SimulationError(f"{at('seed')}: expected an integer (got {seed!r})")
    nums = {}
    for k, default in (("duration_s", 600.0), ("interval_s", 1.0)):
        v = data.get(k, default)
        if isinstance(v, bool) or not isinstance(v, (int, float)) or v <= 0:
            raise SimulationError(f"{at(k)}: expected a positive number of seconds (got {v!r})")
        nums[k] = float(v)
    if limits is not None:
        if nums["duration_s"] > limits.max_duration_s:
            raise SimulationError(f"{at('duration_s')}: must be at most {limits.max_duration_s:,.0f} s (one day) "
                                  f"of event time in a rule test (got {data['duration_s']!r})")
        samples = nums["duration_s"] / nums["interval_s"]
        if samples > limits.max_samples:
            raise SimulationError(f"{at('interval_s' if 'interval_s' in data else 'duration_s')}: "
                                  f"duration_s / interval_s is {samples:,.0f} samples; a rule test simulates at "
                                  f"most {limits.max_samples:,} (a longer interval_s or a shorter duration_s)")
    if "topology" in data:
        path = Path(str(data["topology"]))
        if base_dir is not None and not path.is_absolute():
            path = base_dir / path
        try:
            topo = Topology.from_yaml(path)
        except TopologyError as exc:
            raise SimulationError(f"{at('topology')}: {exc}") from None
    else:
        cl = data.get("cluster") or {}
        if not isinstance(cl, dict):
            raise SimulationError(f"{at('cluster')}: expected a mapping (got {cl!r})")
        bad = set(cl) - _CLUSTER
        if bad:
            names = sorted(map(str, bad))
            raise SimulationError(f"{loc('cluster', names[0])}: {yamlio.format_path(prefix + ('cluster',))}: "
                                  f"unknown key(s) {', '.join(names)} "
                                  f"(valid: {', '.join(sorted(_CLUSTER))})")
        if limits is not None:
            _check_cluster_size(cl, limits, w)
        try:
            topo = make_cluster(**cl)
        except (TypeError, SimulationError) as exc:
            raise SimulationError(f"{at('cluster')}: {str(exc).removeprefix('cluster: ')}") from None
    n_nodes = len(topo.nodes())
    if limits is not None:
        key = "topology" if "topology" in data else "cluster"
        if n_nodes > limits.max_nodes:
            raise SimulationError(f"{at(key)}: must have at most {limits.max_nodes:,} nodes in a rule test "
                                  f"(got {n_nodes:,})")
        work = n_nodes * nums["duration_s"] / nums["interval_s"]
        if work > limits.max_node_samples:
            raise SimulationError(f"{at('duration_s' if 'duration_s' in data else key)}: {n_nodes:,} nodes for "
                                  f"{nums['duration_s'] / nums['interval_s']:,.0f} samples is {work:,.0f} "
                                  f"node-samples; a rule test simulates at most {limits.max_node_samples:,} "
                                  "(fewer nodes or a shorter duration_s)")
    jobs: list[JobSpec] = []
    job_list = data.get("jobs") or [{}]
    if not isinstance(job_list, list):
        raise SimulationError(f"{at('jobs')}: expected a list (got {job_list!r})")
    for i, j in enumerate(job_list):
        where = at("jobs", i)
        if not isinstance(j, dict):
            raise SimulationError(f"{where}: expected a mapping (got {j!r})")
        own = {k: j[k] for k in _JOB_OWN if k in j and k != "nodes"}
        behaviour = {k: v for k, v in j.items() if k not in _JOB_OWN}
        if "slow_nodes" in behaviour:
            behaviour["slow_nodes"] = tuple(expand_nodes(behaviour["slow_nodes"], f"{where}.slow_nodes", n_nodes)
                                            or ())
        job_nodes = expand_nodes(j.get("nodes"), f"{where}.nodes", n_nodes)  # its errors say where already
        try:
            jobs.append(make_job(topo, nodes=job_nodes, **own, **behaviour))
        except SimulationError as exc:
            raise SimulationError(f"{where}: {exc}") from None
        if limits is not None:
            spec = jobs[-1]
            steps = nums["duration_s"] / spec.base_step_s
            if len(spec.ranks) * steps > limits.max_rank_steps:
                raise SimulationError(f"{where if 'jobs' in data else at()}: job {spec.job!r}: {len(spec.ranks):,} "
                                      f"ranks for {steps:,.0f} steps of {spec.base_step_s:.3g} s; a rule test "
                                      f"simulates at most {limits.max_rank_steps:,} rank-steps per job")
    faults: list[Fault] = []
    fault_list = data.get("faults") or []
    if not isinstance(fault_list, list):
        raise SimulationError(f"{at('faults')}: expected a list (got {fault_list!r})")
    for i, f in enumerate(fault_list):
        where = at("faults", i)
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


def _check_cluster_size(cl: dict[str, Any], limits: ScenarioLimits, w: _Where) -> None:
    """Refuse a ``cluster:`` too big for ``limits`` before :func:`make_cluster` builds it."""
    bounds = {"nodes": limits.max_nodes, "gpus_per_node": limits.max_per_node,
              "nics_per_node": limits.max_per_node, "spines": limits.max_per_node}
    for k, most in bounds.items():
        v = cl.get(k)
        if isinstance(v, int) and not isinstance(v, bool) and v > most:
            raise SimulationError(f"{w.at('cluster', k)}: must be at most {most:,} in a rule test (got {v!r})")
    pools = cl.get("pools")
    if isinstance(pools, (list, tuple)) and len(pools) > limits.max_per_node:
        raise SimulationError(f"{w.at('cluster', 'pools')}: must list at most {limits.max_per_node:,} pools in a "
                              f"rule test (got {len(pools):,})")


def check_simulation(sc: Scenario, data: Any, source: str = "<scenario>",
                     lines: Mapping[yamlio.KeyPath, int] | None = None, prefix: yamlio.KeyPath = ()) -> None:
    """Build ``sc``'s simulation on copies, so what only a simulation finds is refused at its line.

    A fault naming a node, job, switch or pool the cluster lacks, or starting after the end, and jobs
    sharing a GPU, are found when the simulation binds them (before it runs).  Called by ``rules check``
    and ``rules test`` for every scenario before any case runs; ``data`` is the mapping ``sc`` came from.
    Raises :class:`SimulationError` at the fault's (or the jobs') line.
    """
    from whywait.simulate.sim import Simulation

    def trial(faults: list[Fault]) -> None:
        Simulation(copy.deepcopy(sc.topology), sc.jobs, copy.deepcopy(faults), duration_s=sc.duration_s,
                   interval_s=sc.interval_s, seed=sc.seed)

    w = _Where(source, lines, prefix)
    try:
        trial(sc.faults)
        return
    except SimulationError as exc:
        problem = str(exc)
    has = data if isinstance(data, dict) else {}
    try:
        trial([])
    except SimulationError as exc:
        raise SimulationError(f"{w.at('jobs') if 'jobs' in has else w.at()}: {exc}") from None
    for i, f in enumerate(sc.faults):
        try:
            trial([f])
        except SimulationError as exc:
            raise SimulationError(f"{w.at('faults', i)}: {exc}") from None
    raise SimulationError(f"{w.at('faults') if 'faults' in has else w.at()}: {problem}")


def load_scenario(path: str | Path) -> Scenario:
    """Read a scenario YAML file; problems name the file and line."""
    p = Path(path)
    try:
        doc = yamlio.load(p)
    except YamlError as exc:
        raise SimulationError(str(exc)) from None
    return parse_scenario(doc.data, str(path), p.parent, doc.lines)
