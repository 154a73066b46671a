"""Synthetic clusters and jobs for the simulator.

:func:`make_cluster` builds a leaf/spine :class:`~topology.Topology` with racks,
NICs local to GPU pairs and shared storage pools; :func:`make_job` describes a
synchronous data-parallel training job placed on some of its nodes.  Both are
pure and deterministic.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, Sequence

from whywait.simulate.errors import SimulationError
from whywait.topology import Nic, Topology


def _name(prefix: str, i: int, width: int) -> str:
    return f"{prefix}-{i:0{width}d}"


def make_cluster(nodes: int = 16, gpus_per_node: int = 8, nodes_per_leaf: int = 4, spines: int = 2,
                 nics_per_node: int = 4, nodes_per_rack: int | None = None,
                 pools: Sequence[str] = ("scratch",), pool_type: str = "nfs",
                 seed: int = 0, name: str = "sim") -> Topology:
    """Return a two-tier (leaf/spine) cluster topology.

    Node ``i`` sits under leaf ``i // nodes_per_leaf``; every leaf has an uplink to
    every spine (a fat tree).  Racks hold ``nodes_per_rack`` nodes (default: one
    leaf's worth) and their leaf.  Each node has ``nics_per_node`` NICs
    ``mlx5_0..``, each serving ``gpus_per_node / nics_per_node`` GPUs by PCIe
    locality, all cabled to the node's leaf, and mounts every pool in ``pools``
    as ``<pool_type>:/<pool>``.  ``seed`` is accepted for symmetry with the other
    generators: the layout itself is regular.
    """
    del seed
    if nodes < 1 or gpus_per_node < 1 or nodes_per_leaf < 1 or spines < 0 or nics_per_node < 1:
        raise SimulationError(f"cluster: nodes, gpus_per_node, nodes_per_leaf and nics_per_node must be ≥ 1, "
                              f"spines ≥ 0 (got nodes={nodes}, gpus_per_node={gpus_per_node}, "
                              f"nodes_per_leaf={nodes_per_leaf}, spines={spines}, nics_per_node={nics_per_node})")
    per_rack = nodes_per_rack or nodes_per_leaf
    n_leaves = -(-nodes // nodes_per_leaf)
    n_racks = -(-nodes // per_rack)
    w = max(2, len(str(max(nodes, n_leaves, n_racks, spines))))
    topo = Topology(name)
    for r in range(n_racks):
        topo.add_rack(_name("rack", r + 1, w))
    spine_ids = [_name("spine", s + 1, w) for s in range(spines)]
    for s in spine_ids:
        topo.add_switch(s, "spine")
    for leaf in range(n_leaves):
        first_node = leaf * nodes_per_leaf
        topo.add_switch(_name("leaf", leaf + 1, w), "leaf", spine_ids, _name("rack", first_node // per_rack + 1, w))
    for p in pools:
        topo.add_pool(p, pool_type)
    per_nic = max(1, gpus_per_node // nics_per_node)
    for i in range(nodes):
        node = _name("node", i + 1, w)
        leaf_id = _name("leaf", i // nodes_per_leaf + 1, w)
        nics = [Nic(node, f"mlx5_{k}", leaf_id,
                    tuple(g for g in range(gpus_per_node) if min(g // per_nic, nics_per_node - 1) == k))
                for k in range(nics_per_node)]
        topo.add_node(node, gpus_per_node, nics, _name("rack", i // per_rack + 1, w),
                      {p: f"{pool_type}:/{p}" for p in pools})
    return topo


@dataclass
class JobSpec:
    """A simulated synchronous training job: who owns it, where it runs, how it behaves.

    Times are the healthy per-step means (seconds) of one rank: ``data_wait_s``
    (input), ``compute_s`` (its own forward and backward work, all microbatches)
    and ``comm_s`` (the gradient all-reduce's transfer); ``jitter`` is the
    lognormal sigma of compute and collective times.  ``step_s``, when given,
    scales those three so the healthy step lasts ``step_s`` (0.1 s to minutes).
    ``pool`` is where it reads data and writes checkpoints.  Checkpoints are
    collective (every rank writes its shard; rank 0 reports start and end).

    Parallel layout (Megatron order: tensor-parallel fastest, then data-parallel,
    pipeline slowest): ``tp`` ranks per tensor-parallel group, ``pp`` pipeline
    stages, the rest data-parallel replicas; ``microbatches`` per step when
    ``pp`` > 1.  ``split`` False: the job publishes ``duration_s`` only (a
    producer that knows no phases).

    Realistic noise, present in fault-free runs: ``slow_nodes`` run on GPUs
    ``slow_mult`` times slower from the start (heterogeneous hardware);
    each rank-step has a ``hiccup_rate`` chance of one slow step (compute ×
    1.5-3.5) and a ``gc_rate`` chance of a ``gc_pause_s`` pause.
    """

    job: str
    project: str
    team: str
    channel: str | None
    ranks: dict[int, tuple[str, int]]
    pool: str | None = None
    compute_s: float = 0.62
    data_wait_s: float = 0.015
    comm_s: float = 0.12
    jitter: float = 0.04
    grad_bytes: float = 1.5e9
    read_bytes_per_step: float = 96e6
    checkpoint_every_s: float = 150.0
    checkpoint_bytes: float = 80e9
    checkpoint_write_bytes_per_s: float = 8e9
    loader_cpu_pct: float = 360.0
    step_s: float | None = None
    split: bool = True
    pp: int = 1
    tp: int = 1
    microbatches: int = 8
    slow_nodes: tuple[str, ...] = ()
    slow_mult: float = 1.2
    hiccup_rate: float = 0.0002
    gc_rate: float = 0.0005
    gc_pause_s: float = 0.15
    nodes: tuple[str, ...] = field(default=())

    def __post_init__(self) -> None:
        if not self.nodes:
            order: list[str] = []
            for r in sorted(self.ranks):
                if self.ranks[r][0] not in order:
                    order.append(self.ranks[r][0])
            self.nodes = tuple(order)
        self._check()
        if self.step_s is not None:
            # Scale the phases together, so a 45 s step keeps the shape of a 0.75 s one, and so the typical
            # step (which waits for the slowest of the ranks' jittered compute) lasts step_s.
            k = self.step_s / self.typical_step_s
            self.data_wait_s *= k
            self.compute_s *= k
            self.comm_s *= k
            self.gc_pause_s = min(self.gc_pause_s, 0.5 * self.step_s)

    def _check(self) -> None:
        """Refuse settings no job could have, naming the setting (called once, at construction)."""
        def fail(what: str) -> None:
            raise SimulationError(f"job {self.job!r}: {what}")

        for k in ("compute_s", "data_wait_s", "comm_s", "jitter", "slow_mult", "hiccup_rate", "gc_rate",
                  "gc_pause_s"):
            v = getattr(self, k)
            if isinstance(v, bool) or not isinstance(v, (int, float)) or v < 0:
                fail(f"{k} must be a number ≥ 0 (got {v!r})")
        if self.step_s is not None and (isinstance(self.step_s, bool) or not isinstance(self.step_s, (int, float))
                                        or self.step_s <= 0):
            fail(f"step_s must be a positive number of seconds (got {self.step_s!r})")
        if self.compute_s + self.data_wait_s + self.comm_s <= 0:
            fail("a step needs some time: compute_s, data_wait_s and comm_s are all 0")
        for k in ("hiccup_rate", "gc_rate"):
            if getattr(self, k) >= 1:
                fail(f"{k} is a probability per rank-step, < 1 (got {getattr(self, k)!r})")
        if not isinstance(self.split, bool):
            fail(f"split must be true or false (got {self.split!r})")
        for k in ("pp", "tp", "microbatches"):
            v = getattr(self, k)
            if isinstance(v, bool) or not isinstance(v, int) or v < 1:
                fail(f"{k} must be an integer ≥ 1 (got {v!r})")
        n = len(self.ranks)
        if n % (self.pp * self.tp):
            fail(f"{n} ranks do not split into pp={self.pp} stages of tp={self.tp} groups "
                 f"(pp × tp must divide the world size)")
        if isinstance(self.slow_nodes, str):
            self.slow_nodes = (self.slow_nodes,)
        self.slow_nodes = tuple(self.slow_nodes)
        unknown = [x for x in self.slow_nodes if x not in self.nodes]
        if unknown:
            fail(f"slow_nodes {', '.join(map(str, unknown))} are not among the job's nodes "
                 f"({self.nodes[0]} … {self.nodes[-1]})")

    @property
    def dp(self) -> int:
        """Data-parallel replicas: the world size over pp × tp."""
        return len(self.ranks) // (self.pp * self.tp)

    def coords(self, rank: int) -> dict[str, int]:
        """``rank``'s parallel coordinates ``{dp, pp, tp}`` (tp fastest, then dp, then pp)."""
        tp_i = rank % self.tp
        dp_i = (rank // self.tp) % self.dp
        return {"dp": dp_i, "pp": rank // (self.tp * self.dp), "tp": tp_i}

    @property
    def typical_step_s(self) -> float:
        """The healthy step a synchronous job typically takes: the collective waits for the slowest of
        the ranks that must meet, so compute counts at its expected maximum over them (a lognormal's
        ``exp(jitter x z_n)``, z_n the expected maximum of n standard normals)."""
        n = max(2, self.pp * self.tp if self.pp > 1 else len(self.ranks))
        ln = math.log(n)
        z = math.sqrt(2 * ln) - (math.log(ln) + math.log(4 * math.pi)) / (2 * math.sqrt(2 * ln)) if n > 2 else 0.56
        m = self.microbatches
        return self.data_wait_s + self.compute_s * math.exp(self.jitter * z) * (m + self.pp - 1) / m + self.comm_s

    @property
    def base_step_s(self) -> float:
        """The healthy step time: data wait + compute (with the pipeline's bubbles) + collective.

        With ``pp`` stages and ``m`` microbatches a stage's work takes (m + pp - 1) slots of one
        microbatch instead of m: the fill and drain of the pipeline.
        """
        m = self.microbatches
        return self.data_wait_s + self.compute_s * (m + self.pp - 1) / m + self.comm_s


def make_job(topology: Topology, job: str = "train-llm", project: str = "llm", team: str = "ml-platform",
             channel: str | None = "#ml-platform", nodes: Sequence[str] | None = None,
             gpus_per_node: int | None = None, **behaviour: Any) -> JobSpec:
    """Describe a job with one rank per GPU on ``nodes`` (default: every node), ranks in node order.

    ``gpus_per_node`` limits the GPUs used per node (the first ones); keyword
    ``behaviour`` overrides :class:`JobSpec` fields (``compute_s=0.9``...).  The
    job is not placed yet: :class:`~whywait.simulate.sim.Simulation` places it.
    """
    chosen = list(nodes) if nodes is not None else list(topology.nodes())
    ranks: dict[int, tuple[str, int]] = {}
    for n in chosen:
        if n not in topology.nodes():
            raise SimulationError(f"job {job!r}: unknown node {n!r} (cluster has {', '.join(topology.nodes())})")
        gpus = topology.gpus_of(n)
        for g in gpus[: gpus_per_node or len(gpus)]:
            ranks[len(ranks)] = (n, g)
    if not ranks:
        raise SimulationError(f"job {job!r}: no GPUs to place it on")
    pool: Any = behaviour.pop("pool", None)
    if pool is None:
        mounts = topology.mounts_of(chosen[0])  # declaration order: the first pool listed is the default
        pool = mounts[0].pool if mounts else None
    unknown = set(behaviour) - set(JobSpec.__dataclass_fields__)
    if unknown:
        valid = sorted(set(JobSpec.__dataclass_fields__) - {"job", "project", "team", "channel", "ranks", "nodes"})
        raise SimulationError(f"job {job!r}: unknown setting(s) {', '.join(sorted(unknown))} "
                              f"(valid: {', '.join(valid)})")
    return JobSpec(job, project, team, channel, ranks, pool=pool, **behaviour)  # type: ignore[arg-type]
