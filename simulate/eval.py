"""Measured accuracy: run a labelled suite of simulated scenarios through the evaluator and score it.

Called by ``whywait eval`` (``whywait.engine.commands.eval_cmd``).  Pure: no Kafka, no
Slack.  Each :class:`EvalScenario` is a simulator scenario (the
``whywait.simulate.scenario`` format) whose faults carry ground truth
(:class:`whywait.simulate.faults.GroundTruth`); :func:`run_scenario` feeds its
messages to a fresh :class:`~whywait.engine.evaluate.evaluator.Evaluator`, exactly as
the live engine would, and :func:`score` matches the diagnoses to the truth.

Matching.  A rule says which fault cause it explains with its ``labels.cause``
(``network.packet-loss``, ``storage.pool-slow``...), the same dotted cause the
simulator writes in ``GroundTruth.cause``; the scorer holds no table of rule
ids.  A firing diagnosis (its first announcement per incident) *detects* a
truth when it is for the truth's job, fires between the fault's start and
``GRACE_S`` after its end, and names the truth's cause.  Its *culprit is
right* when the entities it names (culprit, grouping labels, evidence) contain
the truth's culprit at the truth's ``culprit_kind``: the node; the GPU
(``node-03/gpu2``); the rank (its rank label, or its GPU); the switch, pool or
other job (as topology evidence); the job itself; for the straggler classes,
exactly the straggler ranks (``ranks``), the pipeline stage (label ``stage``,
no node blamed) or no culprit at all (a rotating straggler, a periodic
slowdown).  Several classes share a cause (``straggler.unknown-cause`` names
four), so diagnoses are matched to truths by job, cause and window, never by a
cause-to-class table.

The fail-slow hardware classes (:data:`HW_CLASSES`: PCIe downgrade, NIC speed, cooling, power, machine
checks, an unresponsive GPU, a missing RoCE GID) are found through the ``hw`` report the simulator sends
per node like a real agent; a cooling or power fault can only be confirmed at the BMC's next read (every
30 s), so their latency includes that wait.

Per fault class:

- recall: truths detected / truths;
- precision: diagnoses that detect a truth of the class / those plus the
  diagnoses with the class's cause that detect no truth (during another fault
  or during no fault);
- root-cause accuracy: truths whose first diagnosis for the job (within the
  fault's window) has the right cause, the right culprit and the right phase
  (label ``phase``: compute, input or communication; a periodic slowdown's
  ``period_s`` within 15%) / truths.  An incident a later one took over (a rule's
  ``supersedes``: the first spells of a periodic slowdown, told as a slowdown of the whole job before
  a period could be seen) counts as part of the incident that took it over, neither as a diagnosis
  of its own nor as the first thing said: the evaluator re-announces it resolved and labelled
  ``superseded_by``, so what stays with the user is the later story;
- latency: fault start → the first diagnosis that detects it, in event seconds
  and in the job's steps; *on time* within max(10 s, 5 healthy steps);
- cost: the incident's last (resolved) diagnosis's ``cost["gpu_hours_lost"]``
  against the simulator's truth (each step laid out with and without the
  fault); right within 20%.  The straggler classes must give it.

Fault-free time is every dedicated fault-free scenario (plain, mixed hardware,
half the ranks slower since the start, 30-60 s steps, pipelines, hiccups and GC
pauses, 0.1 s steps, duration-only producers) plus the stretch of each faulty
scenario before its first fault (after ``WARMUP_S``); every diagnosis in it is
counted.
"""

from __future__ import annotations

import copy
import math
import random
import statistics
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterable, Sequence

from whywait.engine.diagnosis import Diagnosis

GRACE_S = 30.0  # a diagnosis this long after a fault's end still belongs to it (keep_firing_for, lag)
WARMUP_S = 0.0  # the evaluator needs no warm-up to be judged: a diagnosis at any time counts
START = 1_764_442_800.0

# Each fault class and how a scenario targets it: fn(rng, shape) -> (target, params).
# Stragglers of unknown cause and the patterns a job's parallel structure shows (issue 8): no hardware
# signature, only the step split and which ranks, stages or times are slow.
STRAGGLER_CLASSES = ("straggler-compute", "straggler-input", "multi-straggler", "transient-straggler",
                     "stage-imbalance", "rotating-straggler", "periodic-slowdown")
# The fail-slow hardware classes (issue 14, simulate/hardware.py): a node or one GPU slowed without
# stopping, which only its ``hw`` report (PCIe links, ports, BMC sensors, kernel log, NVML health) explains.
HW_CLASSES = ("pcie-downgrade", "nic-speed-low", "cooling-degraded", "psu-failed", "kernel-mce", "gpu-nvml-hang",
              "rdma-gid-missing")
_HW_GPU_CLASSES = {"pcie-downgrade", "gpu-nvml-hang"}  # targeted at one GPU (node:gpuN); the rest at a node
FAULT_CLASSES = ("nic-packet-loss", "link-flap", "wrong-nic", "uplink-oversubscribed", "contention",
                 "storage-slow", "storage-client-slow", "cpu-bound-loader", "checkpoint-growth",
                 "checkpoint-stall", "checkpoint-failed", "gpu-thermal", "gpu-power", "gpu-ecc-xid",
                 "whole-job-slow", "rank-silent", "node-down") + STRAGGLER_CLASSES + HW_CLASSES
# Classes whose diagnosis must carry a cost (Diagnosis.cost["gpu_hours_lost"]) to be right on cost: every
# class, wherever the truth lost anything (an incident that says nothing of its cost is a miss on cost).
COST_CLASSES = FAULT_CLASSES
_CHECKPOINT_CLASSES = {"checkpoint-growth", "checkpoint-stall", "checkpoint-failed"}
# Classes whose first evidence can only come with a checkpoint save: their latency from the fault's
# start includes the wait for the next save (up to the checkpoint interval), whatever the rule does.
CHECKPOINT_BOUND = ("checkpoint-growth", "checkpoint-failed")
# Per class, the parameters drawn for each scenario (uniform in [lo, hi]).
_SEVERITY: dict[str, dict[str, tuple[float, float]]] = {
    "nic-packet-loss": {"retrans_per_s": (400.0, 1500.0), "slowdown": (0.4, 1.0)},
    "link-flap": {"period_s": (10.0, 30.0), "down_s": (1.0, 3.0)},
    "wrong-nic": {"comm_mult": (1.3, 1.6)},
    "uplink-oversubscribed": {"comm_mult": (1.5, 2.0), "xmit_wait_per_s": (2e6, 6e6)},
    "contention": {"slowdown": (0.5, 1.0)},
    "storage-slow": {"latency_mult": (8.0, 25.0), "data_wait_s": (0.25, 0.5)},
    "storage-client-slow": {"latency_mult": (8.0, 30.0), "data_wait_s": (0.3, 0.7)},
    "cpu-bound-loader": {"data_wait_s": (0.25, 0.6)},
    "checkpoint-growth": {"growth": (1.25, 1.5)},
    "checkpoint-failed": {"after_s": (2.0, 8.0)},
    "gpu-thermal": {"compute_mult": (1.3, 1.7)},
    "gpu-power": {"compute_mult": (1.15, 1.35)},
    "whole-job-slow": {"compute_mult": (1.3, 1.6)},
    "straggler-compute": {"compute_mult": (1.2, 2.5)},
    "transient-straggler": {"compute_mult": (1.3, 2.5)},
    "straggler-input": {"slowdown": (0.3, 1.0)},
    "multi-straggler": {"compute_mult": (1.3, 2.0)},
    "stage-imbalance": {"compute_mult": (1.25, 1.8)},
    "rotating-straggler": {"compute_mult": (1.4, 2.0)},
    "periodic-slowdown": {"compute_mult": (1.4, 2.0)},
    # Fail-slow hardware: milder and harsher than the simulator's defaults (pcie-downgrade's width is drawn
    # from 4 and 8 in _fault, kernel-mce's every_s rounded to whole seconds; gpu-nvml-hang has no severity).
    "pcie-downgrade": {"tail_s": (0.04, 0.15)},
    "nic-speed-low": {"fraction": (0.25, 0.75), "tail_s": (0.04, 0.12)},
    "cooling-degraded": {"compute_mult": (1.08, 1.25), "inlet_c": (30.0, 42.0)},
    "psu-failed": {"compute_mult": (1.08, 1.2)},
    "kernel-mce": {"compute_mult": (1.08, 1.2), "every_s": (5.0, 30.0)},
    "rdma-gid-missing": {"tail_s": (0.08, 0.3)},
}


@dataclass(frozen=True)
class Shape:
    """A cluster and its jobs: ``cluster`` is make_cluster()'s arguments, ``jobs`` the scenario's job list.

    The victim job is always ``train-llm``; ``other`` is another project's job that shares a leaf
    switch and the pool with it (None when the cluster runs one job).
    """

    name: str
    cluster: dict[str, Any]
    victim_nodes: tuple[str, ...]
    other_nodes: tuple[str, ...] = ()
    gpus_per_node: int = 8

    @property
    def nodes_per_leaf(self) -> int:
        return int(self.cluster.get("nodes_per_leaf", 4))

    def jobs(self, **behaviour: Any) -> list[dict[str, Any]]:
        jobs = [{"job": "train-llm", "project": "llm", "team": "ml-platform", "channel": "#ml-platform",
                 "nodes": list(self.victim_nodes), **behaviour}]
        if self.other_nodes:
            jobs.append({"job": "batch-etl", "project": "etl", "team": "data-eng", "channel": "#data-eng",
                         "nodes": list(self.other_nodes)})
        return jobs

    def leaf_of(self, node: str) -> str:
        i = int(node.rsplit("-", 1)[1]) - 1
        return f"leaf-{i // self.nodes_per_leaf + 1:02d}"


def _nodes(a: int, b: int) -> tuple[str, ...]:
    return tuple(f"node-{i:02d}" for i in range(a, b + 1))


SHAPES: dict[str, Shape] = {
    "8n": Shape("8n", {"nodes": 8, "nodes_per_leaf": 4}, _nodes(1, 8)),
    "12n-4gpu": Shape("12n-4gpu", {"nodes": 12, "gpus_per_node": 4, "nics_per_node": 2, "nodes_per_leaf": 4},
                      _nodes(1, 12), gpus_per_node=4),
    "24n": Shape("24n", {"nodes": 24, "nodes_per_leaf": 8, "nics_per_node": 8}, _nodes(1, 24)),
    # Another project's job shares leaf-02 and the pool with the victim: contention, and every other
    # fault with a bystander on the same switch.
    "shared": Shape("shared", {"nodes": 8, "nodes_per_leaf": 4}, _nodes(1, 6), _nodes(7, 8)),
    # Short (0.1 s) steps make many records: a small job keeps the suite quick.
    "4n": Shape("4n", {"nodes": 4, "nodes_per_leaf": 4}, _nodes(1, 4)),
}
# Pipeline layouts per shape for jobs with stages: (pp, tp); the rest of the world size is data parallel.
PIPELINES: dict[str, tuple[int, int]] = {"8n": (4, 8), "12n-4gpu": (4, 4), "24n": (4, 8), "shared": (2, 8),
                                         "4n": (2, 8)}
# Each straggler class runs on these (shape, variant, healthy step seconds or None for the default ~0.76 s):
# default and long steps, a short-step job, a big job, and one beside another project's job.
STRAGGLER_VARIANTS: tuple[tuple[str, int, float | None], ...] = (
    ("8n", 0, None), ("8n", 1, 3.0), ("12n-4gpu", 0, None), ("4n", 0, 0.1), ("24n", 0, None), ("shared", 0, 8.0),
    ("8n", 2, 40.0))
DEFAULT_STEP_S = 0.76  # the simulator's default healthy step (data wait + compute + all-reduce)


@dataclass(frozen=True)
class EvalScenario:
    """One labelled scenario: a name, the fault classes it injects (empty: fault-free) and its spec."""

    name: str
    classes: tuple[str, ...]
    spec: dict[str, Any]

    @property
    def fault_free(self) -> bool:
        return not self.classes


def _fault(cls: str, rng: random.Random, shape: Shape, start: float, end: float,
           avoid: set[str]) -> dict[str, Any]:
    """A fault of class ``cls`` on the victim job, on a node not in ``avoid`` (which it then joins)."""
    nodes = [n for n in shape.victim_nodes if n not in avoid] or list(shape.victim_nodes)
    node = rng.choice(nodes)
    params: dict[str, Any] = {}
    if cls in ("nic-packet-loss", "link-flap", "storage-client-slow", "cpu-bound-loader", "node-down") or \
            (cls in HW_CLASSES and cls not in _HW_GPU_CLASSES):
        target = node
    elif cls == "wrong-nic":
        target = node if rng.random() < 0.5 else f"{node}:gpu{rng.randrange(shape.gpus_per_node)}"
    elif cls in ("gpu-thermal", "gpu-power", "gpu-ecc-xid") or cls in _HW_GPU_CLASSES:
        target = f"{node}:gpu{rng.randrange(shape.gpus_per_node)}"
    elif cls == "rank-silent":
        rank = shape.victim_nodes.index(node) * shape.gpus_per_node + rng.randrange(shape.gpus_per_node)
        target = f"train-llm:{rank}"
        params = {"hang": float(rng.random() < 0.6)}
    elif cls == "uplink-oversubscribed":
        # A leaf with at least two of the job's nodes under it, so the job crosses its uplinks.
        leaves = sorted({shape.leaf_of(n) for n in shape.victim_nodes
                         if sum(shape.leaf_of(m) == shape.leaf_of(n) for m in shape.victim_nodes) >= 2})
        target = rng.choice(leaves)
        node = ""
    elif cls == "contention":
        resource = shape.leaf_of(shape.other_nodes[0]) if rng.random() < 0.5 else "scratch"
        target = f"batch-etl/{resource}"
        node = ""
    elif cls == "storage-slow":
        target, node = "scratch", ""
    else:  # job-level faults: checkpoint-*, whole-job-slow
        target, node = "train-llm", ""
    if node:
        avoid.add(node)
    # Severity varies around the simulator's defaults, so thresholds are judged on milder faults too.
    for k, (lo, hi) in _SEVERITY.get(cls, {}).items():
        params[k] = round(rng.uniform(lo, hi), 3)
    if cls == "pcie-downgrade":
        params["width"] = float(rng.choice([4, 8]))  # the widths a x16 link really trains down to
    if cls == "kernel-mce":
        params["every_s"] = float(int(params["every_s"]))  # the fault counts whole seconds between bursts
    f: dict[str, Any] = {"fault": cls, "target": target, "start": start, "end": end}
    if params:
        f["params"] = params
    return f


def _straggler_scenario(cls: str, rng: random.Random, shape: Shape, step_s: float | None,
                        variant: int = 0) -> dict[str, Any]:
    """A scenario spec with one straggler-class fault on ``train-llm`` (issue 8's classes).

    Windows are long enough in *steps* for the job's step time (20+ steps, 12+ healthy steps
    before), a transient lasts 20-90 s (or 5-20 steps when steps are long), a periodic slowdown
    repeats 3-4 times; the run goes on after the fault so its incident can resolve (the resolved
    diagnosis carries the cost).  Some jobs run on mixed hardware (other nodes 10-30% slower since
    the start), so the straggler must be told from steady heterogeneity.
    """
    base = step_s or DEFAULT_STEP_S
    behaviour: dict[str, Any] = {"checkpoint_every_s": float(max(rng.randint(100, 200), 30 * base))}
    if step_s is not None:
        behaviour["step_s"] = step_s
    start = float(max(rng.randint(90, 130), math.ceil(12 * base)))
    length = float(max(rng.randint(60, 90), math.ceil(20 * base)))
    n_ranks = len(shape.victim_nodes) * shape.gpus_per_node
    params: dict[str, Any] = {k: round(rng.uniform(lo, hi), 3) for k, (lo, hi) in _SEVERITY.get(cls, {}).items()}
    culprit_nodes: set[str] = set()
    if cls in ("straggler-compute", "straggler-input", "transient-straggler"):
        rank = rng.randrange(n_ranks)
        target = f"train-llm:{rank}"
        culprit_nodes.add(shape.victim_nodes[rank // shape.gpus_per_node])
        if cls == "transient-straggler":
            length = float(rng.randint(5, 20)) * base if base >= 2.0 else float(rng.randint(20, 90))
    elif cls == "multi-straggler":
        nodes = rng.sample(range(len(shape.victim_nodes)), min(rng.randint(2, 4), len(shape.victim_nodes)))
        ranks = sorted(i * shape.gpus_per_node + rng.randrange(shape.gpus_per_node) for i in nodes)
        target = "train-llm:" + ",".join(map(str, ranks))
        culprit_nodes.update(shape.victim_nodes[i] for i in nodes)
    else:
        target = "train-llm"
        if cls == "stage-imbalance":
            pp, tp = PIPELINES[shape.name]
            behaviour.update(pp=pp, tp=tp, microbatches=rng.choice([8, 16]))
            params["stage"] = float(rng.choice([-1, rng.randrange(pp)]))
        elif cls in ("rotating-straggler", "periodic-slowdown"):
            params["input"] = float(variant % 2)  # both phases, alternately
            if cls == "rotating-straggler" and variant // 2 % 2 == 1:
                # Uneven batches on every rank rather than one heavy batch a step, in both phases: no rank
                # stands out, the spread across ranks does (real sequence-length imbalance looks like this).
                params["spread"] = round(rng.uniform(0.15, 0.3), 3)
        if cls == "periodic-slowdown":
            period = float(max(rng.randint(60, 150), math.ceil(8 * base)))
            slow = float(min(max(rng.randint(15, 30), math.ceil(3 * base)), period / 2))
            params.update(period_s=period, slow_s=slow)
            length = period * rng.choice([3.5, 4.0])
            if step_s is not None and step_s < 1:
                behaviour["split"] = False  # the whole job slows: the step time alone shows it
    # Mixed hardware on some jobs: nodes other than the culprit's, slower from the start.
    if rng.random() < 0.4 and cls not in ("stage-imbalance",):
        others = [n for n in shape.victim_nodes if n not in culprit_nodes]
        slow_mult = round(rng.uniform(1.1, 1.3), 3)
        behaviour.update(slow_nodes=sorted(rng.sample(others, max(1, len(others) // 4))), slow_mult=slow_mult)
        # A straggler no slower than the slow hardware would cost nothing: the slow nodes already set the
        # pace.  Real, but then there is nothing to find or to cost; keep the fault above them.
        if "compute_mult" in params and cls != "rotating-straggler":
            params["compute_mult"] = max(params["compute_mult"], round(slow_mult + 0.3, 3))
        if "slowdown" in params:
            params["slowdown"] = max(params["slowdown"], 0.5)
    end = start + length
    fault: dict[str, Any] = {"fault": cls, "target": target, "start": start, "end": end}
    if params:
        fault["params"] = params
    return {"seed": rng.randrange(10_000), "duration_s": end + float(max(45, math.ceil(6 * base))),
            "cluster": dict(shape.cluster), "jobs": shape.jobs(**behaviour), "faults": [fault]}


# Fault-free jobs for the false-alarm hours: what real clusters run without anything being wrong.
# name -> (shape, behaviour drawn from the rng).
FAULT_FREE_KINDS: dict[str, tuple[str, Callable[[random.Random], dict[str, Any]]]] = {
    "plain": ("8n", lambda r: {"checkpoint_every_s": 60.0}),
    "shared": ("shared", lambda r: {"checkpoint_every_s": 60.0}),
    "hetero": ("8n", lambda r: {"slow_nodes": sorted(r.sample(list(_nodes(1, 8)), 2)),
                                "slow_mult": round(r.uniform(1.1, 1.3), 3)}),
    "half-slow": ("8n", lambda r: {"slow_nodes": list(_nodes(1, 4)), "slow_mult": round(r.uniform(1.4, 2.0), 3)}),
    "long-step": ("8n", lambda r: {"step_s": float(r.randint(30, 60)), "checkpoint_every_s": 900.0}),
    "long-step-hetero": ("12n-4gpu", lambda r: {"step_s": float(r.randint(30, 60)), "checkpoint_every_s": 900.0,
                                                "slow_nodes": ["node-03", "node-09"], "slow_mult": 1.2}),
    "pipeline": ("8n", lambda r: {"pp": 4, "tp": 8, "microbatches": 8}),
    "pipeline-hetero": ("12n-4gpu", lambda r: {"pp": 4, "tp": 4, "microbatches": 16, "slow_nodes": ["node-05"],
                                               "slow_mult": 1.25}),
    "hiccups": ("12n-4gpu", lambda r: {"hiccup_rate": 0.002, "gc_rate": 0.004, "gc_pause_s": 0.3}),
    "short-step": ("4n", lambda r: {"step_s": 0.1, "checkpoint_every_s": 120.0}),
    "duration-only": ("8n", lambda r: {"split": False, "step_s": 2.0}),
}


# Pairs of a hardware class and an older class on two nodes of the job (benchmarks/hw_eval.py's).
HW_PAIRS = (("pcie-downgrade", "nic-packet-loss"), ("kernel-mce", "gpu-thermal"),
            ("cooling-degraded", "storage-client-slow"), ("nic-speed-low", "gpu-power"),
            ("rdma-gid-missing", "cpu-bound-loader"))


def _single_fault_spec(cls: str, rng: random.Random, shape: Shape) -> dict[str, Any]:
    """A scenario spec with one fault of ``cls`` on the victim job: 90-130 s of healthy lead-in, 60-90 s
    of fault, 20 s after it; checkpoints every 100-200 s, so one may fall in the fault."""
    start = float(rng.randint(90, 130))
    end = start + float(rng.randint(60, 90))
    behaviour: dict[str, Any] = {"checkpoint_every_s": float(rng.randint(100, 200))}
    fault = _fault(cls, rng, shape, start, end, set())
    return {"seed": rng.randrange(10_000), "duration_s": end + 20.0, "cluster": dict(shape.cluster),
            "jobs": shape.jobs(**behaviour), "faults": [fault]}


def build_suite(quick: bool = False, seed: int = 0, classes: Iterable[str] | None = None,
                fault_free_s: float | None = None) -> list[EvalScenario]:
    """The labelled scenarios: every fault class on several cluster shapes and seeds, two faults at
    once, and fault-free time (``fault_free_s`` seconds in all, split over :data:`FAULT_FREE_KINDS`;
    default four hours, ten minutes with ``quick``; 0 for none).

    ``quick`` keeps one shape and one seed per class and two pairs.  ``classes`` limits the suite to
    those fault classes: a pair runs only when both its classes are asked for (so no other class
    shows in the report), and the fault-free part only when it is asked for as ``fault-free``.
    """
    if fault_free_s is None:
        fault_free_s = 600.0 if quick else 4 * 3600.0
    wanted = set(classes) if classes else None
    rng = random.Random(seed)
    out: list[EvalScenario] = []
    per_class = [("8n", 0)] if quick else [("8n", 0), ("8n", 1), ("12n-4gpu", 0), ("12n-4gpu", 1),
                                           ("24n", 0), ("shared", 0), ("shared", 1)]
    for cls in FAULT_CLASSES:
        if wanted is not None and cls not in wanted:
            continue
        if cls in HW_CLASSES:
            # Its own stream too, for the same reason: the older scenarios stay as they were.
            hrng = random.Random(f"{seed}:{cls}")
            for shape_name, k in per_class:
                out.append(EvalScenario(f"{cls}/{shape_name}/{k}", (cls,),
                                        _single_fault_spec(cls, hrng, SHAPES[shape_name])))
            continue
        if cls in STRAGGLER_CLASSES:
            # Its own stream, so adding these classes left the older scenarios as they were.
            srng = random.Random(f"{seed}:{cls}")
            for i, (shape_name, k, step_s) in enumerate(STRAGGLER_VARIANTS[:1] if quick else STRAGGLER_VARIANTS):
                shape = SHAPES[shape_name]
                step = f"{step_s:g}s" if step_s else "default"
                out.append(EvalScenario(f"{cls}/{shape.name}-{step}/{k}", (cls,),
                                        _straggler_scenario(cls, srng, shape, step_s, i)))
            continue
        for shape_name, k in per_class:
            shape = SHAPES["shared" if cls == "contention" else shape_name]
            start = float(rng.randint(90, 130))
            end = start + float(rng.randint(60, 90))
            # Checkpoint faults need checkpoints in their window (growth: at least two after the
            # first slow one); elsewhere a checkpoint falls at a random phase, sometimes in a fault.
            every = 40.0 if cls in _CHECKPOINT_CLASSES else float(rng.randint(100, 200))
            if cls == "checkpoint-growth":
                start, end = float(rng.randint(60, 90)), start + 150.0
            behaviour: dict[str, Any] = {"checkpoint_every_s": every}
            fault = _fault(cls, rng, shape, start, end, set())
            spec = {"seed": rng.randrange(10_000), "duration_s": end + 20.0, "cluster": dict(shape.cluster),
                    "jobs": shape.jobs(**behaviour), "faults": [fault]}
            out.append(EvalScenario(f"{cls}/{shape.name}/{k}", (cls,), spec))
    pairs = [("nic-packet-loss", "cpu-bound-loader"), ("gpu-thermal", "storage-client-slow"),
             ("link-flap", "gpu-power"), ("storage-slow", "gpu-thermal"), ("wrong-nic", "cpu-bound-loader"),
             ("checkpoint-failed", "nic-packet-loss")]
    for i, (a, b) in enumerate(pairs[:2] if quick else pairs):
        if wanted is not None and not {a, b} <= wanted:
            continue
        shape = SHAPES["8n" if i % 2 == 0 else "shared"]
        start = float(rng.randint(90, 130))
        end = start + float(rng.randint(60, 90))
        avoid: set[str] = set()
        faults = [_fault(a, rng, shape, start, end, avoid), _fault(b, rng, shape, start + 5, end, avoid)]
        every = 40.0 if {a, b} & _CHECKPOINT_CLASSES else float(rng.randint(100, 200))
        spec = {"seed": rng.randrange(10_000), "duration_s": end + 20.0, "cluster": dict(shape.cluster),
                "jobs": shape.jobs(checkpoint_every_s=every), "faults": faults}
        out.append(EvalScenario(f"pair:{a}+{b}/{shape.name}", (a, b), spec))
    # A hardware fault on one node while a fault of another kind hits another node of the job, 5 s later:
    # each must be found, neither must mask the other.  Their own stream, like the classes.
    prng = random.Random(f"{seed}:hw-pairs")
    for a, b in HW_PAIRS[:1] if quick else HW_PAIRS:
        if wanted is not None and not {a, b} <= wanted:
            continue
        shape = SHAPES["8n"]
        start = float(prng.randint(90, 130))
        end = start + float(prng.randint(60, 90))
        avoid = set()
        faults = [_fault(a, prng, shape, start, end, avoid), _fault(b, prng, shape, start + 5, end, avoid)]
        spec = {"seed": prng.randrange(10_000), "duration_s": end + 20.0, "cluster": dict(shape.cluster),
                "jobs": shape.jobs(checkpoint_every_s=float(prng.randint(100, 200))), "faults": faults}
        out.append(EvalScenario(f"pair:{a}+{b}/{shape.name}", (a, b), spec))
    if (wanted is None or "fault-free" in wanted) and fault_free_s > 0:
        total = fault_free_s
        kinds = ["plain", "hetero", "pipeline"] if quick else list(FAULT_FREE_KINDS)
        frng = random.Random(f"{seed}:fault-free")
        for i, kind in enumerate(kinds):
            shape_name, behaviour = FAULT_FREE_KINDS[kind]
            shape = SHAPES[shape_name]
            spec = {"seed": 1000 + seed + i, "duration_s": total / len(kinds), "cluster": dict(shape.cluster),
                    "jobs": shape.jobs(**behaviour(frng))}
            out.append(EvalScenario(f"fault-free/{kind}/{shape_name}", (), spec))
    return out


# ---- running ------------------------------------------------------------------------------------


@dataclass
class ScenarioRun:
    """What one scenario produced: its ground truth, the diagnoses, and how much it cost."""

    scenario: EvalScenario
    truths: list[dict[str, Any]]
    diagnoses: list[dict[str, Any]]
    placements: dict[str, dict[int, tuple[str, int]]]
    messages: int = 0
    seconds: float = 0.0
    checkpoint_starts: dict[str, list[float]] = field(default_factory=dict)  # job -> save start times
    step_ends: dict[str, list[float]] = field(default_factory=dict)  # job -> when each of rank 0's steps ended


def run_scenario(rules: Any, sc: EvalScenario) -> ScenarioRun:
    """Simulate ``sc`` and feed every message to a fresh evaluator; return the truths and diagnoses."""
    import time

    from whywait.engine.evaluate.evaluator import Evaluator
    from whywait.simulate.scenario import parse_scenario
    from whywait.simulate.sim import Simulation

    t0 = time.perf_counter()
    parsed = parse_scenario(copy.deepcopy(sc.spec), source=sc.name)
    engine_topo = copy.deepcopy(parsed.topology)
    sim = Simulation(parsed.topology, parsed.jobs, parsed.faults, start_time=START, duration_s=parsed.duration_s,
                     interval_s=parsed.interval_s, seed=parsed.seed)
    ev = Evaluator(rules, engine_topo)
    diags: list[Diagnosis] = []
    starts: dict[str, list[float]] = {}
    ends: dict[str, list[float]] = {}
    n = 0
    for _topic, msg in sim.messages():
        diags += ev.ingest(msg)
        n += 1
        kind = msg["kind"]
        if kind == "checkpoint" and msg["phase"] == "start":
            starts.setdefault(msg["job"], []).append(float(msg["time"]))
        elif kind == "steps":
            ends.setdefault(msg["job"], []).extend(float(r.get("ended_at", msg["time"])) for r in msg["steps"]
                                                   if r["rank"] == 0)
    diags += ev.advance(ev.store.max_time)  # the last ticks the lateness held back
    # Incidents still open when the run ends: their latest state (the cost accumulated up to the last
    # tick) is what a reader of the live message would see now, so it is what the cost is scored on.
    diags += [inc.last for inc in ev.incidents.values() if inc.announced and inc.last is not None]
    placements = {j.spec.job: dict(j.spec.ranks) for j in sim.jobs}
    return ScenarioRun(sc, [g.to_dict() for g in sim.ground_truth()], [d.to_dict() for d in diags], placements,
                       n, time.perf_counter() - t0, starts, ends)


# ---- scoring ------------------------------------------------------------------------------------


def _classes_of_cause() -> dict[str, tuple[str, ...]]:
    """Each cause a rule may name -> the fault classes whose truth carries it (several may share one)."""
    from whywait.simulate.faults import FAULTS

    out: dict[str, list[str]] = {}
    for name, cls in FAULTS.items():
        if name in FAULT_CLASSES:
            out.setdefault(cls.cause, []).append(name)
    out.setdefault("contention.network", []).append("contention")
    out.setdefault("contention.storage", []).append("contention")
    return {k: tuple(v) for k, v in out.items()}


def named_entities(d: dict[str, Any]) -> set[str]:
    """Every entity a diagnosis names: its culprit(s), grouping labels and evidence entities."""
    out: set[str] = set()
    if d.get("culprit"):
        out.update(x.strip() for x in str(d["culprit"]).split(","))
    out.update(str(v) for k, v in (d.get("labels") or {}).items() if k in ("node", "gpu", "switch", "pool", "rank"))
    out.update(e["entity"] for e in d.get("evidence") or () if e.get("metric") == "topology")
    return out


def _culprit_nodes(d: dict[str, Any]) -> set[str]:
    return {x.strip() for x in str(d.get("culprit") or "").split(",") if x.strip()}


def culprit_matches(d: dict[str, Any], truth: dict[str, Any], placement: dict[int, tuple[str, int]]) -> bool:
    """Whether diagnosis ``d`` names ``truth``'s culprit at its kind (see the module docstring).

    Kinds the straggler classes add: ``ranks`` (the diagnosis's ``ranks`` are exactly the truth's;
    without ranks, its culprit nodes are exactly the truth's nodes), ``stage`` (label ``stage`` is
    the truth's stage and no node is blamed), ``none`` (no node is blamed).
    """
    kind, culprit = truth["culprit_kind"], str(truth["culprit"])
    labels = d.get("labels") or {}
    if kind == "ranks":
        if d.get("ranks"):
            return {int(r) for r in d["ranks"]} == {int(r) for r in truth.get("ranks") or ()}
        return _culprit_nodes(d) == {x.strip() for x in culprit.split(",")}
    if kind == "stage":
        stage = (truth.get("detail") or {}).get("stage", culprit.rsplit(" ", 1)[-1])
        return str(labels.get("stage", "")) == str(int(stage)) and not d.get("culprit")
    if kind == "none":
        return not d.get("culprit")
    if kind == "node":
        node = culprit.split()[0]  # "node-03" or "node-03 gpu 2" (wrong-nic on one GPU)
        return d.get("culprit") == node or (labels.get("node") == node and not d.get("culprit"))
    if kind == "gpu":
        node, _, g = culprit.partition(" gpu ")
        return labels.get("gpu") == f"{node}/gpu{g}"
    if kind == "rank":
        rank = int(culprit.rsplit(" ", 1)[1])
        if labels.get("rank") == str(rank):
            return True
        if rank in placement:
            node, gpu = placement[rank]
            return labels.get("gpu") == f"{node}/gpu{gpu}"
        return False
    if kind == "job" and truth.get("job") == culprit:  # the job itself is the culprit (no other entity)
        return d.get("job") == culprit
    return culprit in named_entities(d)


def explanation_matches(d: dict[str, Any], truth: dict[str, Any]) -> bool:
    """Whether what ``d`` says beyond its cause and culprit fits ``truth``: the slow phase and, for a
    periodic slowdown, the period.

    The straggler classes' rules must say the phase (label ``phase``; ``periodic-slowdown`` and
    ``stage-imbalance`` excepted, which say ``period_s`` and ``stage``); for the older classes a
    ``phase`` label, where a rule gives one, must be right.
    """
    labels = d.get("labels") or {}
    cls = truth["fault"]
    phase = truth.get("phase") or "none"
    if cls == "periodic-slowdown":
        try:
            said = float(labels.get("period_s", "nan"))
        except ValueError:
            return False
        period = float((truth.get("detail") or {}).get("period_s", 0.0))
        return abs(said - period) <= 0.15 * period
    if cls in STRAGGLER_CLASSES and cls != "stage-imbalance":
        return labels.get("phase") == phase
    return "phase" not in labels or labels["phase"] == phase


@dataclass
class ClassScore:
    """The figures of one fault class.

    Latency is counted in event seconds and in the job's steps (rank 0's steps that ended between the
    fault's start and the detection); a detection is *on time* within 10 s or 5 of the job's steps,
    whichever is longer (and never under 5 healthy steps).
    Cost: for each detected truth with a cost, the incidents' last (resolved) diagnoses' summed
    ``cost["gpu_hours_lost"]`` against the truth; right within 20 %.
    """

    fault_class: str
    truths: int = 0
    detected: int = 0
    root_cause_ok: int = 0
    true_diagnoses: int = 0
    false_diagnoses: int = 0
    latencies: list[float] = field(default_factory=list)
    latency_steps: list[int] = field(default_factory=list)
    on_time: int = 0
    onset_latencies: list[float] = field(default_factory=list)  # from the first checkpoint / the third spell
    second_spell_latencies: list[float] = field(default_factory=list)  # periodic: from its second spell
    cost_truths: int = 0
    cost_right: int = 0
    cost_errors: list[float] = field(default_factory=list)  # |estimate - truth| / truth, where estimated
    misses: list[str] = field(default_factory=list)
    wrong: list[str] = field(default_factory=list)

    @property
    def recall(self) -> float | None:
        return self.detected / self.truths if self.truths else None

    @property
    def precision(self) -> float | None:
        n = self.true_diagnoses + self.false_diagnoses
        return self.true_diagnoses / n if n else None

    @property
    def f1(self) -> float | None:
        p, r = self.precision, self.recall
        if p is None or r is None:
            return None
        return 2 * p * r / (p + r) if p + r else 0.0

    @property
    def rca(self) -> float | None:
        return self.root_cause_ok / self.truths if self.truths else None

    @property
    def latency_median(self) -> float | None:
        return statistics.median(self.latencies) if self.latencies else None

    @property
    def latency_p90(self) -> float | None:
        return percentile(self.latencies, 0.9)

    @property
    def latency_steps_median(self) -> float | None:
        return statistics.median(self.latency_steps) if self.latency_steps else None

    @property
    def on_time_share(self) -> float | None:
        return self.on_time / self.detected if self.detected else None

    @property
    def cost_share(self) -> float | None:
        return self.cost_right / self.cost_truths if self.cost_truths else None

    @property
    def cost_error_median(self) -> float | None:
        return statistics.median(self.cost_errors) if self.cost_errors else None

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d.update(recall=self.recall, precision=self.precision, f1=self.f1, root_cause_accuracy=self.rca,
                 latency_median_s=self.latency_median, latency_p90_s=self.latency_p90,
                 latency_median_steps=self.latency_steps_median, on_time_share=self.on_time_share,
                 cost_right_share=self.cost_share, cost_error_median=self.cost_error_median)
        return d


def percentile(xs: Sequence[float], q: float) -> float | None:
    """The ``q`` quantile by the nearest-rank method (None for no data)."""
    if not xs:
        return None
    s = sorted(xs)
    return s[min(len(s) - 1, max(0, int(math.ceil(q * len(s))) - 1))]


@dataclass
class Report:
    """The scored suite: per-class figures, totals, and the fault-free count."""

    classes: dict[str, ClassScore]
    overall: ClassScore
    fault_free_s: float
    fault_free_diagnoses: list[str]
    scenarios: int
    messages: int
    seconds: float
    continuous: ClassScore | None = None  # the older classes' figures without the checkpoint-bound ones
    fault_free_scenarios_s: float = 0.0  # the part of fault_free_s in dedicated fault-free scenarios

    def to_dict(self) -> dict[str, Any]:
        return {"classes": {k: v.to_dict() for k, v in self.classes.items()}, "overall": self.overall.to_dict(),
                "overall_not_checkpoint_bound": self.continuous.to_dict() if self.continuous else None,
                "fault_free_hours": self.fault_free_s / 3600,
                "fault_free_scenario_hours": self.fault_free_scenarios_s / 3600,
                "fault_free_diagnoses": self.fault_free_diagnoses,
                "scenarios": self.scenarios, "messages": self.messages, "seconds": self.seconds}


def _incident_spans(diags: list[dict[str, Any]]) -> list[tuple[dict[str, Any], dict[str, Any]]]:
    """Each incident as (its first firing announcement, its last diagnosis: the resolved one, or the
    latest update when the run ended first).  An incident is a fingerprint until its resolution."""
    open_: dict[str, list[dict[str, Any]]] = {}
    out: list[list[dict[str, Any]]] = []
    for d in diags:
        fp = d["fingerprint"]
        span = open_.get(fp)
        if span is None:
            if d["status"] == "resolved":
                # A later incident took this resolved one over (``supersedes``): its re-announcement
                # becomes the incident's last word.
                if _superseded(d):
                    for old in reversed(out):
                        if old[0]["fingerprint"] == fp and old[0]["starts_at"] == d["starts_at"]:
                            old[1] = d
                            break
                continue
            span = open_[fp] = [d, d]
            out.append(span)
        span[1] = d
        if d["status"] == "resolved":
            del open_[fp]
    return [(a, b) for a, b in out]


def _superseded(d: dict[str, Any]) -> bool:
    """Whether ``d`` closes an incident that a later incident took over (a rule's ``supersedes``)."""
    return bool((d.get("labels") or {}).get("superseded_by"))


def _incidents(diags: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The first firing announcement of each incident (a fingerprint until its resolution)."""
    return [first for first, _ in _incident_spans(diags)]


def _onset(cls: str, truth: dict[str, Any], run: ScenarioRun) -> float | None:
    """When a class's evidence can first be complete, for the classes bound to a later event: the first
    checkpoint save in the fault, or a periodic slowdown's third spell.

    One spell is no period, and neither is one interval: any two slowdowns are *some* time apart, and
    only a third on the same schedule shows there is one (the ``periodic`` condition checks the two
    intervals agree).  Before that the job has had two slow spells of half a minute, which the other
    rules tell or not on their own merits.  The table prints the latency from the second spell too.
    """
    if cls in CHECKPOINT_BOUND:
        return min((c for c in run.checkpoint_starts.get(truth["job"], ()) if c >= truth["start"]), default=None)
    if cls == "periodic-slowdown":
        spells = (truth.get("detail") or {}).get("spells") or []
        return START + float(spells[2]) if len(spells) > 2 else None
    return None


def score(runs: Iterable[ScenarioRun]) -> Report:
    """Match every run's diagnoses to its ground truth; return the per-class report.

    A diagnosis is matched to truths by job, cause and time window (several classes may share a
    cause, e.g. ``straggler.unknown-cause``): it is true for each class of a truth it detects; a
    diagnosis that detects none is false for the classes with its cause in that scenario's truths,
    or, when none there has it, for every class with that cause.
    """
    by_cause = _classes_of_cause()
    scores = {c: ClassScore(c) for c in FAULT_CLASSES}
    free_s = scenario_free_s = 0.0
    free_diags: list[str] = []
    n_sc = n_msg = 0
    secs = 0.0
    for run in runs:
        n_sc += 1
        n_msg += run.messages
        secs += run.seconds
        sc = run.scenario
        truths = [t for t in run.truths if t.get("job")]
        first_fault = min((t["start"] for t in run.truths), default=START + float(sc.spec["duration_s"]))
        free_s += max(0.0, first_fault - (START + WARMUP_S))
        if not run.truths:
            scenario_free_s += max(0.0, first_fault - (START + WARMUP_S))
        # An incident a later one took over (a periodic slowdown's first spells, told as a slowdown
        # of the whole job before any period could be seen) is scored as part of the one that took it
        # over: not as a diagnosis of its own, true or false, nor as the first thing said about the
        # fault.  What stays with the user is the superseding story: the evaluator re-announces the
        # earlier incident, resolved, labelled superseded_by and saying so in its cause.  The
        # superseding incident is still timed from its own first announcement.
        spans = [(a, b) for a, b in _incident_spans(run.diagnoses) if not _superseded(b)]
        incidents = [first for first, _ in spans]
        last_of = {id(first): last for first, last in spans}
        for d in incidents:
            if d["detected_at"] < first_fault and d["detected_at"] >= START + WARMUP_S:
                free_diags.append(f"{sc.name}: {d['rule_id']} culprit {d['culprit']} "
                                  f"+{d['detected_at'] - START:.0f}s")
        # Each diagnosis: true for the classes of the truths it detects (right job, window and cause).
        for d in incidents:
            cause = (d.get("labels") or {}).get("cause", "")
            if cause not in by_cause:
                continue
            hits = {t["fault"] for t in truths if t["job"] == d["job"] and t["cause"] == cause
                    and t["start"] <= d["detected_at"] <= t["end"] + GRACE_S}
            for cls in hits:
                scores[cls].true_diagnoses += 1
            if not hits:
                here = {t["fault"] for t in truths if t["cause"] == cause}
                for cls in here or set(by_cause[cause]):
                    scores[cls].false_diagnoses += 1
                    scores[cls].wrong.append(f"{sc.name}: {d['rule_id']} culprit {d['culprit']} "
                                             f"+{d['detected_at'] - START:.0f}s")
        ends = sorted(run.step_ends.get("train-llm", ()))
        for t in truths:
            cls = t["fault"]
            s = scores[cls]
            s.truths += 1
            mine = [d for d in incidents
                    if d["job"] == t["job"] and t["start"] <= d["detected_at"] <= t["end"] + GRACE_S]
            right = [d for d in mine if (d.get("labels") or {}).get("cause") == t["cause"]]
            if not right:
                seen = ", ".join(f"{d['rule_id']}@+{d['detected_at'] - t['start']:.0f}s" for d in mine) or "nothing"
                s.misses.append(f"{sc.name}: {t['culprit'] or t['fault']} — saw {seen}")
                continue
            s.detected += 1
            at = right[0]["detected_at"]
            s.latencies.append(at - t["start"])
            job_ends = sorted(run.step_ends.get(t["job"], ())) if t["job"] != "train-llm" else ends
            s.latency_steps.append(sum(1 for e in job_ends if t["start"] < e <= at))
            onset = _onset(cls, t, run)
            if onset is not None:
                s.onset_latencies.append(at - onset)
            spells = (t.get("detail") or {}).get("spells") or []
            if cls == "periodic-slowdown" and len(spells) > 1:
                s.second_spell_latencies.append(at - (START + float(spells[1])))
            # On time: within 10 s or 5 steps, whichever is longer, counting the job's own steps as it ran
            # them (a fault slows them: five steps of a rotation are longer than five healthy ones), and
            # never less than five healthy steps.
            since = onset if onset is not None else t["start"]
            healthy = t.get("whatif_step_s") or DEFAULT_STEP_S
            steps_since = sum(1 for e in job_ends if since < e <= at)
            if at - since <= max(10.0, 5 * healthy) or (job_ends and steps_since <= 5):
                s.on_time += 1
            # Root cause: the first thing said about this job during the fault is the right cause, names
            # the right culprit and the right phase.  With two faults at once, the other truth's
            # diagnosis is no error.
            others = {o["cause"] for o in truths if o is not t and o["job"] == t["job"] and o["start"] <= at}
            first = next(d for d in mine if (d.get("labels") or {}).get("cause") not in others)
            ok = (first.get("labels") or {}).get("cause") == t["cause"] and \
                culprit_matches(first, t, run.placements.get(t["job"], {})) and explanation_matches(first, t)
            if ok:
                s.root_cause_ok += 1
            else:
                s.misses.append(f"{sc.name}: root cause — first said {first['rule_id']} culprit "
                                f"{first['culprit']} ranks {list(first.get('ranks') or [])} labels "
                                f"{first.get('labels')}; truth {t['culprit'] or '-'} ranks {t.get('ranks')} "
                                f"phase {t.get('phase')}")
            # Cost: what the incidents that found it say they cost, at their end.
            lost = float(t.get("gpu_hours_lost") or 0.0)
            if lost > 0:
                costs = [(last_of[id(d)].get("cost") or {}).get("gpu_hours_lost") for d in right]
                given = [float(c) for c in costs if c is not None]
                if given or cls in COST_CLASSES:
                    s.cost_truths += 1
                if given:
                    signed = (sum(given) - lost) / lost  # below 0: the incident says less than was lost
                    err = abs(signed)
                    s.cost_errors.append(err)
                    if err <= 0.2:
                        s.cost_right += 1
                    else:
                        s.misses.append(f"{sc.name}: cost {sum(given):.4g} GPU-h, truth {lost:.4g} "
                                        f"({signed:+.0%})")
                elif cls in COST_CLASSES:
                    s.misses.append(f"{sc.name}: no cost given (truth {lost:.4g} GPU-h)")
    older = [k for k in FAULT_CLASSES if k not in STRAGGLER_CLASSES and k not in HW_CLASSES]
    overall = _total("overall", scores.values())
    continuous = _total("older, not ckpt-bound", (scores[k] for k in older if k not in CHECKPOINT_BOUND))
    return Report({k: v for k, v in scores.items() if v.truths or v.false_diagnoses}, overall, free_s, free_diags,
                  n_sc, n_msg, secs, continuous, scenario_free_s)


def _total(name: str, scores: Iterable[ClassScore]) -> ClassScore:
    out = ClassScore(name)
    for s in scores:
        out.truths += s.truths
        out.detected += s.detected
        out.root_cause_ok += s.root_cause_ok
        out.true_diagnoses += s.true_diagnoses
        out.false_diagnoses += s.false_diagnoses
        out.latencies += s.latencies
        out.latency_steps += s.latency_steps
        out.on_time += s.on_time
        out.cost_truths += s.cost_truths
        out.cost_right += s.cost_right
        out.cost_errors += s.cost_errors
    return out


# ---- presenting ---------------------------------------------------------------------------------


def _f(v: float | None, digits: int = 2) -> str:
    return "-" if v is None else f"{v:.{digits}f}"


def format_table(rep: Report) -> str:
    """The report as a plain-text table, one row per fault class, then the totals and targets."""
    head = (f"{'fault class':24} {'n':>3} {'prec':>5} {'recall':>6} {'F1':>5} {'RCA':>5} {'lat p50':>7} "
            f"{'lat p90':>7} {'steps':>5} {'ontime':>6} {'cost ok':>7} {'cost err':>8}")
    lines = [head, "-" * len(head)]
    totals = [rep.overall] + ([rep.continuous] if rep.continuous else [])
    for s in list(rep.classes.values()) + totals:
        if s is rep.overall:
            lines.append("-" * len(head))
        err = f"{100 * s.cost_error_median:.0f}%" if s.cost_error_median is not None else "-"
        lines.append(f"{s.fault_class:24.24} {s.truths:>3} {_f(s.precision):>5} {_f(s.recall):>6} {_f(s.f1):>5} "
                     f"{_f(s.rca):>5} {_f(s.latency_median, 1) + 's' if s.latencies else '-':>7} "
                     f"{_f(s.latency_p90, 1) + 's' if s.latencies else '-':>7} "
                     f"{_f(s.latency_steps_median, 0):>5} {_f(s.on_time_share):>6} {_f(s.cost_share):>7} "
                     f"{err:>8}")
    lines.append("")
    lines.append("steps: median steps from the fault's start to detection; ontime: share detected within "
                 "10 s or 5 of the job's steps, whichever is longer; cost ok: share of incidents whose GPU-hours "
                 "lost are within 20% of the truth; cost err: median error.")
    for name in CHECKPOINT_BOUND + ("periodic-slowdown",):
        c = rep.classes.get(name)
        if c is not None and c.onset_latencies:
            since = "the fault's first checkpoint save began" if name in CHECKPOINT_BOUND else \
                "its third slow spell began (two intervals that agree make a period)"
            lines.append(f"{name}: detected {_f(statistics.median(c.onset_latencies), 1)} s (median), "
                         f"{_f(percentile(c.onset_latencies, 0.9), 1)} s (p90) after {since}")
            if c.second_spell_latencies:
                lines.append(f"{name}: {_f(statistics.median(c.second_spell_latencies), 1)} s (median) after its "
                             "second spell began")
    lead_in = rep.fault_free_s - rep.fault_free_scenarios_s
    lines.append(f"diagnoses during {rep.fault_free_s / 3600:.2f} h of fault-free simulated time "
                 f"({rep.fault_free_scenarios_s / 3600:.2f} h in fault-free scenarios, {lead_in / 3600:.2f} h before "
                 f"the faults of the others): {len(rep.fault_free_diagnoses)}")
    lines.append(f"{rep.scenarios} scenarios, {rep.messages:,} messages, {rep.seconds:.0f} s of evaluation "
                 f"({rep.messages / max(rep.seconds, 1e-9):,.0f} msgs/s)")
    return "\n".join(lines)


def format_details(rep: Report) -> str:
    """The misses, false diagnoses and fault-free diagnoses, one per line (for tuning rules)."""
    out = []
    for s in rep.classes.values():
        out += [f"MISS  {s.fault_class}: {m}" for m in s.misses]
        out += [f"FALSE {s.fault_class}: {w}" for w in s.wrong]
    out += [f"FAULT-FREE {x}" for x in rep.fault_free_diagnoses]
    return "\n".join(out)


def plot(rep: Report, path: str | Path) -> None:
    """Write a PNG of per-class F1 and detection latency (median and p90); matplotlib, Agg backend."""
    from whywait.plotting import pyplot

    plt = pyplot()

    names = list(rep.classes)
    f1 = [rep.classes[n].f1 or 0.0 for n in names]
    med = [rep.classes[n].latency_median or 0.0 for n in names]
    p90 = [rep.classes[n].latency_p90 or 0.0 for n in names]
    fig, (a1, a2) = plt.subplots(1, 2, figsize=(13, 0.35 * len(names) + 1.8), sharey=True)
    y = list(range(len(names)))
    a1.barh(y, f1, color="#4c72b0")
    a1.axvline(0.95, color="#c44e52", ls="--", lw=1, label="target 0.95")
    a1.set_xlim(0, 1.05)
    a1.set_yticks(y, names)
    a1.invert_yaxis()
    a1.set_xlabel("F1")
    a1.legend(loc="lower left")
    a2.barh([i - 0.2 for i in y], med, height=0.4, color="#55a868", label="median")
    a2.barh([i + 0.2 for i in y], p90, height=0.4, color="#8172b2", label="p90")
    a2.axvline(10, color="#c44e52", ls="--", lw=1, label="targets 10 s / 15 s")
    a2.axvline(15, color="#c44e52", ls=":", lw=1)
    a2.set_xlabel("detection latency (s, event time)")
    a2.legend(loc="lower right")
    fig.suptitle(f"whywait eval: {rep.scenarios} scenarios, {rep.fault_free_s / 3600:.1f} h fault-free, "
                 f"{len(rep.fault_free_diagnoses)} fault-free diagnoses")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


# ---- driving ------------------------------------------------------------------------------------

_RULES: dict[tuple[str, ...], Any] = {}


def _run_in_worker(rule_paths: tuple[str, ...], sc: EvalScenario) -> ScenarioRun:
    from whywait.engine.rules.loader import load_rules

    rules = _RULES.get(rule_paths)
    if rules is None:
        rules = _RULES[rule_paths] = load_rules(rule_paths)
    return run_scenario(rules, sc)


def run_suite(rule_paths: Sequence[str | Path], suite: Sequence[EvalScenario], workers: int = 1,
              progress: Callable[[ScenarioRun], None] | None = None) -> list[ScenarioRun]:
    """Run every scenario (in ``workers`` processes when more than one); call ``progress`` after each."""
    paths = tuple(str(p) for p in rule_paths)
    runs: list[ScenarioRun] = []
    # The longest first, so the pool does not end waiting on one straggling scenario.
    order = sorted(suite, key=lambda s: -float(s.spec["duration_s"]) * len(s.spec.get("jobs") or [1]))
    if workers <= 1:
        for sc in order:
            r = _run_in_worker(paths, sc)
            runs.append(r)
            if progress:
                progress(r)
    else:
        from concurrent.futures import ProcessPoolExecutor, as_completed

        with ProcessPoolExecutor(max_workers=workers) as pool:
            futs = [pool.submit(_run_in_worker, paths, sc) for sc in order]
            for fut in as_completed(futs):
                r = fut.result()
                runs.append(r)
                if progress:
                    progress(r)
    index = {sc.name: i for i, sc in enumerate(suite)}
    runs.sort(key=lambda r: index[r.scenario.name])
    return runs
