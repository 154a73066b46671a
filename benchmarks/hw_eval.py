"""Measure the fail-slow hardware rules on simulated faults, apart from the rest of ``whywait eval``.

    .venv/bin/python benchmarks/hw_eval.py            # every hardware class on three cluster shapes
    .venv/bin/python benchmarks/hw_eval.py --quick    # one shape, one seed
    .venv/bin/python benchmarks/hw_eval.py -v         # list every miss and false diagnosis

Each scenario is a Simulation of ``whywait.simulate.eval``'s cluster shapes with one fault of
``whywait.simulate.hardware.HW_FAULTS`` and the ``hw`` messages the agent would send (the
simulator emits them), fed to the production evaluator with every shipped rule.
Scoring follows ``simulate/eval.py``: a diagnosis detects a fault when it is for the fault's job, fires
between its start and 30 s after its end and names its cause; precision counts every first
announcement of an incident of the class's cause; root-cause accuracy asks that the first diagnosis
about the job during the fault has the right cause and culprit.  Fault-free time (the lead-in of
every scenario and dedicated fault-free runs, with ``hw`` messages) counts every diagnosis.
"""

from __future__ import annotations

import argparse
import copy
import random
import statistics
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from whywait.simulate.hardware import HW_FAULTS  # noqa: E402
from whywait.simulate.scenario import parse_scenario  # noqa: E402
from whywait.simulate.sim import Simulation  # noqa: E402
from whywait.simulate.eval import GRACE_S, SHAPES, START, _incidents, culprit_matches  # noqa: E402
from whywait.engine.evaluate.evaluator import Evaluator  # noqa: E402
from whywait.engine.rules.loader import load_rules  # noqa: E402

GPU_CLASSES = {"pcie-downgrade", "gpu-nvml-hang"}
# Severity drawn per scenario, milder and harsher than the defaults, so thresholds are judged on both.
SEVERITY: dict[str, dict[str, tuple[float, float]]] = {
    "pcie-downgrade": {"tail_s": (0.04, 0.15)},
    "nic-speed-low": {"fraction": (0.25, 0.75), "tail_s": (0.04, 0.12)},
    "cooling-degraded": {"compute_mult": (1.08, 1.25), "inlet_c": (30.0, 42.0)},
    "psu-failed": {"compute_mult": (1.08, 1.2)},
    "kernel-mce": {"compute_mult": (1.08, 1.2), "every_s": (5.0, 30.0)},
    "rdma-gid-missing": {"tail_s": (0.08, 0.3)},
}


# A hardware fault on one node while a fault the simulator already knows hits another node of the job.
PAIRS = (("pcie-downgrade", "nic-packet-loss"), ("kernel-mce", "gpu-thermal"),
         ("cooling-degraded", "storage-client-slow"), ("nic-speed-low", "gpu-power"),
         ("rdma-gid-missing", "cpu-bound-loader"))


def run(rules: Any, shape_name: str, cls: str | None, seed: int, duration: float | None = None,
        other: str | None = None) -> tuple[list[dict[str, Any]], list[dict[str, Any]], dict[str, Any], float, int]:
    """One scenario: (truths, diagnoses, placements, fault start or end of run, messages).

    ``other`` adds a fault of the simulator's own library (``whywait.simulate.faults.FAULTS``) on another
    of the job's nodes, starting 5 s later.
    """
    from whywait.simulate.faults import FAULTS

    rng = random.Random(f"{cls}:{shape_name}:{seed}")
    shape = SHAPES[shape_name]
    start = float(rng.randint(90, 130))
    end = start + float(rng.randint(60, 90))
    spec = {"seed": rng.randrange(10_000), "duration_s": duration or end + 20.0, "cluster": dict(shape.cluster),
            "jobs": shape.jobs(checkpoint_every_s=float(rng.randint(100, 200)))}
    parsed = parse_scenario(copy.deepcopy(spec), source=f"{cls}/{shape_name}/{seed}")
    faults = []
    if cls is not None:
        node = rng.choice(shape.victim_nodes)
        target = f"{node}:gpu{rng.randrange(shape.gpus_per_node)}" if cls in GPU_CLASSES else node
        params = {k: round(rng.uniform(lo, hi), 3) for k, (lo, hi) in SEVERITY.get(cls, {}).items()}
        if cls == "pcie-downgrade":
            params["width"] = float(rng.choice([4, 8]))
        if "every_s" in params:
            params["every_s"] = float(int(params["every_s"]))
        faults = [HW_FAULTS[cls](target, start, end, **params)]
        if other is not None:
            node2 = rng.choice([n for n in shape.victim_nodes if n != node])
            gpu_fault = other.startswith("gpu-")
            faults.append(FAULTS[other](f"{node2}:gpu{rng.randrange(shape.gpus_per_node)}" if gpu_fault else node2,
                                        start + 5, end))
    topo = copy.deepcopy(parsed.topology)
    sim = Simulation(parsed.topology, parsed.jobs, faults, start_time=START, duration_s=parsed.duration_s,
                     interval_s=parsed.interval_s, seed=parsed.seed)
    ev = Evaluator(rules, topo)
    diags = []
    n = 0
    for _topic, msg in sim.messages():
        diags += ev.ingest(msg)
        n += 1
    diags += ev.advance(ev.store.max_time)
    truths = [g.to_dict() for g in sim.ground_truth()] if faults else []
    first = START + (start if faults else parsed.duration_s)
    return truths, [d.to_dict() for d in diags], {j.spec.job: dict(j.spec.ranks) for j in sim.jobs}, first, n


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--quick", action="store_true")
    p.add_argument("-v", "--verbose", action="store_true")
    p.add_argument("--fault-free-s", type=float, default=1800.0)
    args = p.parse_args(argv)
    rules = load_rules([ROOT / "rules"])
    shapes = [("8n", 0)] if args.quick else [("8n", 0), ("8n", 1), ("8n", 2), ("12n-4gpu", 0), ("12n-4gpu", 1),
                                             ("24n", 0), ("shared", 0), ("shared", 1)]
    causes = {c.cause for c in HW_FAULTS.values()}
    t0 = time.perf_counter()
    rows = []
    false_free: list[str] = []
    free_s = 0.0
    msgs = 0
    for cls, fcls in HW_FAULTS.items():
        truths_n = detected = rca = true_d = false_d = 0
        lat: list[float] = []
        notes: list[str] = []
        for shape, seed in shapes:
            truths, diags, placements, first, n = run(rules, shape, cls, seed)
            msgs += n
            free_s += first - START
            incidents = _incidents(diags)
            false_free += [f"{cls}/{shape}/{seed}: {d['rule_id']} {d['culprit']} +{d['detected_at'] - START:.0f}s"
                           for d in incidents if d["detected_at"] < first]
            for d in incidents:
                cause = (d.get("labels") or {}).get("cause")
                if cause != fcls.cause:
                    continue
                if any(t["job"] == d["job"] and t["start"] <= d["detected_at"] <= t["end"] + GRACE_S for t in truths):
                    true_d += 1
                else:
                    false_d += 1
                    notes.append(f"false: {shape}/{seed} {d['rule_id']} {d['culprit']}")
            for t in (t for t in truths if t.get("job")):
                truths_n += 1
                mine = [d for d in incidents if d["job"] == t["job"]
                        and t["start"] <= d["detected_at"] <= t["end"] + GRACE_S]
                right = [d for d in mine if (d.get("labels") or {}).get("cause") == t["cause"]]
                if not right:
                    notes.append(f"miss: {shape}/{seed} {t['culprit']}: saw "
                                 + (", ".join(d["rule_id"] for d in mine) or "nothing"))
                    continue
                detected += 1
                lat.append(right[0]["detected_at"] - t["start"])
                if (mine[0].get("labels") or {}).get("cause") == t["cause"] and \
                        culprit_matches(mine[0], t, placements.get(t["job"], {})):
                    rca += 1
                else:
                    notes.append(f"rca: {shape}/{seed} first {mine[0]['rule_id']} {mine[0]['culprit']} "
                                 f"{mine[0].get('labels')}; truth {t['culprit']}")
        rows.append((cls, truths_n, true_d / max(1, true_d + false_d), detected / max(1, truths_n),
                     rca / max(1, truths_n), statistics.median(lat) if lat else None, max(lat) if lat else None,
                     notes))
    pair_rows = []
    for a, b in PAIRS[:1] if args.quick else PAIRS:
        truths, diags, placements, first, n = run(rules, "8n", a, 7, other=b)
        msgs += n
        free_s += first - START
        incidents = _incidents(diags)
        for t in truths:
            mine = [d for d in incidents
                    if d["job"] == t["job"] and t["start"] <= d["detected_at"] <= t["end"] + GRACE_S]
            right = [d for d in mine if (d.get("labels") or {}).get("cause") == t["cause"]]
            named = bool(right) and any(culprit_matches(d, t, placements.get(t["job"], {})) for d in right)
            pair_rows.append((f"{a}+{b}", t["fault"], bool(right), named,
                              right[0]["detected_at"] - t["start"] if right else None))
    for k in range(1 if args.quick else 2):
        truths, diags, _placements, first, n = run(rules, "8n" if k == 0 else "shared", None, 100 + k,
                                                   duration=args.fault_free_s / (1 if args.quick else 2))
        msgs += n
        free_s += first - START
        false_free += [f"fault-free/{k}: {d['rule_id']} {d['culprit']} +{d['detected_at'] - START:.0f}s"
                       for d in _incidents(diags)]
    print(f"{'fault class':<18} {'n':>3} {'prec':>5} {'recall':>6} {'RCA':>5} {'lat p50':>8} {'lat max':>8}")
    print("-" * 60)
    for cls, n, prec, rec, rc, p50, mx, _ in rows:
        print(f"{cls:<18} {n:>3} {prec:>5.2f} {rec:>6.2f} {rc:>5.2f} {p50 or 0:>7.1f}s {mx or 0:>7.1f}s")
    print("-" * 60)
    for pair, fault, found, named, latency in pair_rows:
        print(f"pair {pair:<38} {fault:<20} {'detected' if found else 'MISSED':<9} "
              f"{'culprit named' if named else 'culprit WRONG' if found else '':<14} "
              f"{'' if latency is None else f'{latency:.0f} s'}")
    hw_false = [f for f in false_free if f.split(": ", 1)[1].startswith("hardware.")]
    print(f"diagnoses during {free_s / 3600:.2f} h of fault-free simulated time: {len(false_free)} "
          f"({len(hw_false)} from hardware.* rules); causes scored: {', '.join(sorted(causes))}")
    print(f"{msgs:,} messages, {time.perf_counter() - t0:.0f} s")
    if args.verbose:
        for row in rows:
            for note in row[-1]:
                print(f"  {row[0]}: {note}")
        for f in false_free:
            print(f"  fault-free: {f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
