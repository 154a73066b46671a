"""Measured accuracy: run a labelled suite of simulated scenarios through the evaluator and score it.

Called by ``whywait eval`` (``engine.commands.eval_cmd``).  Pure: no Kafka, no
Slack.  Each :class:`EvalScenario` is a simulator scenario (the
``agents.simulate.scenario`` format) whose faults carry ground truth
(:class:`agents.simulate.faults.GroundTruth`); :func:`run_scenario` feeds its
messages to a fresh :class:`~engine.evaluate.evaluator.Evaluator`, exactly as
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
other job (as topology evidence); the job itself.

Per fault class:

- recall: truths detected / truths;
- precision: diagnoses whose cause is the class's that detect a truth / all
  diagnoses whose cause is the class's (a diagnosis of the class during
  another fault, or during no fault, is a false positive);
- root-cause accuracy: truths whose first diagnosis for the job (within the
  fault's window) has the right cause and the right culprit / truths;
- latency: fault start → the first diagnosis that detects it, event time.

Fault-free time is every dedicated fault-free scenario plus the stretch of each
faulty scenario before its first fault (after ``WARMUP_S``); every diagnosis in
it is counted.
"""

from __future__ import annotations

import copy
import math
import random
import statistics
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterable, Sequence

from engine.diagnosis import Diagnosis

GRACE_S = 30.0  # a diagnosis this long after a fault's end still belongs to it (keep_firing_for, lag)
WARMUP_S = 0.0  # the evaluator needs no warm-up to be judged: a diagnosis at any time counts
START = 1_764_442_800.0

# Each fault class and how a scenario targets it: fn(rng, shape) -> (target, params).
FAULT_CLASSES = ("nic-packet-loss", "link-flap", "wrong-nic", "uplink-oversubscribed", "contention",
                 "storage-slow", "storage-client-slow", "cpu-bound-loader", "checkpoint-growth",
                 "checkpoint-stall", "checkpoint-failed", "gpu-thermal", "gpu-power", "gpu-ecc-xid",
                 "whole-job-slow", "rank-silent")
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
}


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
    if cls in ("nic-packet-loss", "link-flap", "storage-client-slow", "cpu-bound-loader"):
        target = node
    elif cls == "wrong-nic":
        target = node if rng.random() < 0.5 else f"{node}:gpu{rng.randrange(shape.gpus_per_node)}"
    elif cls in ("gpu-thermal", "gpu-power", "gpu-ecc-xid"):
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
    f: dict[str, Any] = {"fault": cls, "target": target, "start": start, "end": end}
    if params:
        f["params"] = params
    return f


def build_suite(quick: bool = False, seed: int = 0, classes: Iterable[str] | None = None,
                fault_free_s: float = 3600.0) -> list[EvalScenario]:
    """The labelled scenarios: every fault class on several cluster shapes and seeds, two faults at
    once, and fault-free time (``fault_free_s`` seconds in all, split over the shapes).

    ``quick`` keeps one shape and one seed per class, two pairs and ten fault-free minutes.
    ``classes`` limits the suite to those fault classes (and skips the fault-free part unless it
    is asked for as ``fault-free``).
    """
    wanted = set(classes) if classes else None
    rng = random.Random(seed)
    out: list[EvalScenario] = []
    per_class = [("8n", 0)] if quick else [("8n", 0), ("8n", 1), ("12n-4gpu", 0), ("12n-4gpu", 1),
                                           ("24n", 0), ("shared", 0), ("shared", 1)]
    for cls in FAULT_CLASSES:
        if wanted is not None and cls not in wanted:
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
        if wanted is not None and not ({a, b} & wanted):
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
    if wanted is None or "fault-free" in wanted:
        total = 600.0 if quick else fault_free_s
        shapes = ["8n"] if quick else ["8n", "shared"]
        for i, name in enumerate(shapes):
            shape = SHAPES[name]
            spec = {"seed": 1000 + seed + i, "duration_s": total / len(shapes), "cluster": dict(shape.cluster),
                    "jobs": shape.jobs(checkpoint_every_s=60.0)}
            out.append(EvalScenario(f"fault-free/{name}", (), spec))
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


def run_scenario(rules: Any, sc: EvalScenario) -> ScenarioRun:
    """Simulate ``sc`` and feed every message to a fresh evaluator; return the truths and diagnoses."""
    import time

    from agents.simulate.scenario import parse_scenario
    from agents.simulate.sim import Simulation
    from engine.evaluate.evaluator import Evaluator

    t0 = time.perf_counter()
    parsed = parse_scenario(copy.deepcopy(sc.spec), source=sc.name)
    engine_topo = copy.deepcopy(parsed.topology)
    sim = Simulation(parsed.topology, parsed.jobs, parsed.faults, start_time=START, duration_s=parsed.duration_s,
                     interval_s=parsed.interval_s, seed=parsed.seed)
    ev = Evaluator(rules, engine_topo)
    diags: list[Diagnosis] = []
    starts: dict[str, list[float]] = {}
    n = 0
    for _topic, msg in sim.messages():
        diags += ev.ingest(msg)
        n += 1
        if msg["kind"] == "checkpoint" and msg["phase"] == "start":
            starts.setdefault(msg["job"], []).append(float(msg["time"]))
    diags += ev.advance(ev.store.max_time)  # the last ticks the lateness held back
    placements = {j.spec.job: dict(j.spec.ranks) for j in sim.jobs}
    return ScenarioRun(sc, [g.to_dict() for g in sim.ground_truth()], [d.to_dict() for d in diags], placements,
                       n, time.perf_counter() - t0, starts)


# ---- scoring ------------------------------------------------------------------------------------


def _class_of_cause() -> dict[str, str]:
    from agents.simulate.faults import FAULTS

    out = {cls.cause: name for name, cls in FAULTS.items()}
    out.update({"contention.network": "contention", "contention.storage": "contention"})
    return out


def named_entities(d: dict[str, Any]) -> set[str]:
    """Every entity a diagnosis names: its culprit(s), grouping labels and evidence entities."""
    out: set[str] = set()
    if d.get("culprit"):
        out.update(x.strip() for x in str(d["culprit"]).split(","))
    out.update(str(v) for k, v in (d.get("labels") or {}).items() if k in ("node", "gpu", "switch", "pool", "rank"))
    out.update(e["entity"] for e in d.get("evidence") or () if e.get("metric") == "topology")
    return out


def culprit_matches(d: dict[str, Any], truth: dict[str, Any], placement: dict[int, tuple[str, int]]) -> bool:
    """Whether diagnosis ``d`` names ``truth``'s culprit at its kind (see the module docstring)."""
    kind, culprit = truth["culprit_kind"], str(truth["culprit"])
    labels = d.get("labels") or {}
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


@dataclass
class ClassScore:
    """The figures of one fault class."""

    fault_class: str
    truths: int = 0
    detected: int = 0
    root_cause_ok: int = 0
    true_diagnoses: int = 0
    false_diagnoses: int = 0
    latencies: list[float] = field(default_factory=list)
    onset_latencies: list[float] = field(default_factory=list)  # from the first checkpoint in the fault
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

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d.update(recall=self.recall, precision=self.precision, f1=self.f1, root_cause_accuracy=self.rca,
                 latency_median_s=self.latency_median, latency_p90_s=self.latency_p90)
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
    continuous: ClassScore | None = None  # the overall figures without the checkpoint-bound classes

    def to_dict(self) -> dict[str, Any]:
        return {"classes": {k: v.to_dict() for k, v in self.classes.items()}, "overall": self.overall.to_dict(),
                "overall_not_checkpoint_bound": self.continuous.to_dict() if self.continuous else None,
                "fault_free_hours": self.fault_free_s / 3600, "fault_free_diagnoses": self.fault_free_diagnoses,
                "scenarios": self.scenarios, "messages": self.messages, "seconds": self.seconds}


def _incidents(diags: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The first firing announcement of each incident (a fingerprint until its resolution)."""
    open_: set[str] = set()
    out = []
    for d in diags:
        fp = d["fingerprint"]
        if d["status"] == "resolved":
            open_.discard(fp)
        elif fp not in open_:
            open_.add(fp)
            out.append(d)
    return out


def score(runs: Iterable[ScenarioRun]) -> Report:
    """Match every run's diagnoses to its ground truth; return the per-class report."""
    to_class = _class_of_cause()
    scores = {c: ClassScore(c) for c in FAULT_CLASSES}
    free_s = 0.0
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
        incidents = _incidents(run.diagnoses)
        for d in incidents:
            if d["detected_at"] < first_fault and d["detected_at"] >= START + WARMUP_S:
                free_diags.append(f"{sc.name}: {d['rule_id']} culprit {d['culprit']} "
                                  f"+{d['detected_at'] - START:.0f}s")
        # Each diagnosis: true when it detects some truth (right job, window and cause).
        for d in incidents:
            cause = (d.get("labels") or {}).get("cause", "")
            cls = to_class.get(cause)
            hit = any(t["job"] == d["job"] and t["cause"] == cause
                      and t["start"] <= d["detected_at"] <= t["end"] + GRACE_S for t in truths)
            if cls is None:
                continue
            if hit:
                scores[cls].true_diagnoses += 1
            else:
                scores[cls].false_diagnoses += 1
                scores[cls].wrong.append(f"{sc.name}: {d['rule_id']} culprit {d['culprit']} "
                                         f"+{d['detected_at'] - START:.0f}s")
        for t in truths:
            cls = t["fault"]
            s = scores[cls]
            s.truths += 1
            mine = [d for d in incidents
                    if d["job"] == t["job"] and t["start"] <= d["detected_at"] <= t["end"] + GRACE_S]
            right = [d for d in mine if (d.get("labels") or {}).get("cause") == t["cause"]]
            if not right:
                seen = ", ".join(f"{d['rule_id']}@+{d['detected_at'] - t['start']:.0f}s" for d in mine) or "nothing"
                s.misses.append(f"{sc.name}: {t['culprit']} — saw {seen}")
                continue
            s.detected += 1
            s.latencies.append(right[0]["detected_at"] - t["start"])
            if cls in CHECKPOINT_BOUND:
                onset = min((c for c in run.checkpoint_starts.get(t["job"], ()) if c >= t["start"]), default=None)
                if onset is not None:
                    s.onset_latencies.append(right[0]["detected_at"] - onset)
            # Root cause: the first thing said about this job during the fault is the right cause and
            # names the right culprit.  With two faults at once, the other truth's diagnosis is no error.
            others = {o["cause"] for o in truths if o is not t and o["job"] == t["job"]
                      and o["start"] <= right[0]["detected_at"]}
            first = next(d for d in mine if (d.get("labels") or {}).get("cause") not in others)
            ok = (first.get("labels") or {}).get("cause") == t["cause"] and \
                culprit_matches(first, t, run.placements.get(t["job"], {}))
            if ok:
                s.root_cause_ok += 1
            else:
                s.misses.append(f"{sc.name}: root cause — first said {first['rule_id']} culprit "
                                f"{first['culprit']} labels {first.get('labels')}; truth {t['culprit']}")
    overall = _total("overall", scores.values())
    continuous = _total("overall, not ckpt-bound", (v for k, v in scores.items() if k not in CHECKPOINT_BOUND))
    return Report({k: v for k, v in scores.items() if v.truths or v.false_diagnoses}, overall, free_s, free_diags,
                  n_sc, n_msg, secs, continuous)


def _total(name: str, scores: Iterable[ClassScore]) -> ClassScore:
    out = ClassScore(name)
    for s in scores:
        out.truths += s.truths
        out.detected += s.detected
        out.root_cause_ok += s.root_cause_ok
        out.true_diagnoses += s.true_diagnoses
        out.false_diagnoses += s.false_diagnoses
        out.latencies += s.latencies
    return out


# ---- presenting ---------------------------------------------------------------------------------


def _f(v: float | None, digits: int = 2) -> str:
    return "-" if v is None else f"{v:.{digits}f}"


def format_table(rep: Report) -> str:
    """The report as a plain-text table, one row per fault class, then the totals and targets."""
    head = f"{'fault class':24} {'n':>3} {'prec':>5} {'recall':>6} {'F1':>5} {'RCA':>5} {'lat p50':>7} {'lat p90':>7}"
    lines = [head, "-" * len(head)]
    totals = [rep.overall] + ([rep.continuous] if rep.continuous else [])
    for s in list(rep.classes.values()) + totals:
        if s is rep.overall:
            lines.append("-" * len(head))
        lines.append(f"{s.fault_class:24.24} {s.truths:>3} {_f(s.precision):>5} {_f(s.recall):>6} {_f(s.f1):>5} "
                     f"{_f(s.rca):>5} {_f(s.latency_median, 1) + 's' if s.latencies else '-':>7} "
                     f"{_f(s.latency_p90, 1) + 's' if s.latencies else '-':>7}")
    lines.append("")
    for name in CHECKPOINT_BOUND:
        c = rep.classes.get(name)
        if c is not None and c.onset_latencies:
            lines.append(f"{name}: detected {_f(statistics.median(c.onset_latencies), 1)} s (median), "
                         f"{_f(percentile(c.onset_latencies, 0.9), 1)} s (p90) after the fault's first checkpoint "
                         f"save began")
    lines.append(f"diagnoses during {rep.fault_free_s / 3600:.2f} h of fault-free simulated time: "
                 f"{len(rep.fault_free_diagnoses)}")
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
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

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
    from engine.rules.loader import load_rules

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
