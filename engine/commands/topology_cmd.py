"""``whywait topology``: build the cluster file from what the cluster already has, and inspect it.

- ``import FORMAT FILE... [FORMAT FILE...] -o cluster.yaml [--types node-types.yaml]``: read
  every source (:data:`whywait.topology.sources.FORMATS`), merge them by GUID, PCI id and name
  (:mod:`whywait.topology.reconcile`), write one cluster YAML.  Lines a reader could not use are
  printed with their file and line; conflicts between sources (a node under two switches)
  are printed naming both, and nothing is written.  Exit 2 on conflicts.
- ``check FILE...``: load each cluster file (every schema error with its file:line), then list
  what it lacks (hosts without a switch, NICs without GPUs, GPUs without a NIC, unmatched
  facts) with the line of the host.  Exit 1 on errors, or on gaps with ``--strict``; exit 2 when a
  file cannot be read at all (missing, a folder), as for any wrong argument.  Hosts without GPUs are
  no gap (a login node has none) but are counted on a line of their own, here and after ``import``.
- ``show [FILE]``: counts per kind and tier, then the same gaps, and the hosts without GPUs.
- ``path [FILE] A B``: the hops between two GPUs (``node-03/gpu2`` or ``"node-03 gpu 2"``) or nodes.
- ``diff OLD NEW``: what changed.  Exit 1 when something did, like ``diff``.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections import Counter
from pathlib import Path
from typing import Any

from whywait.engine.errors import ConfigError


def register(p: argparse.ArgumentParser) -> None:
    from whywait.topology.sources import FORMATS

    sub = p.add_subparsers(dest="action", metavar="ACTION", required=True)
    formats = "\n".join(f"  {name:14} {help_}" for name, (_, help_) in FORMATS.items())
    i = sub.add_parser("import", help="merge real sources into one cluster YAML",
                       formatter_class=argparse.RawDescriptionHelpFormatter,
                       description="Merge sources into one cluster YAML.  Each FORMAT is followed by its files; "
                                   "per-host formats take HOST=FILE.\n\nformats:\n" + formats)
    i.add_argument("sources", nargs="+", metavar="FORMAT FILE...", help="a format name, then its files; repeat")
    i.add_argument("-o", "--output", type=Path, help="write the cluster YAML here (default: stdout)")
    i.add_argument("--types", type=Path, help="node types YAML: which hosts are which machine (GPUs, NCCL XML)")
    i.add_argument("--name", default="", help="the cluster's name")
    i.add_argument("--aliases", type=Path, metavar="FILE",
                   help="the hosts' other names to keep (an agent's hostname, a cloud name): a cluster file "
                        "written before (its nodes' aliases) or 'aliases: {host: [name, ...]}'")
    c = sub.add_parser("check", help="lint cluster files: schema errors with file:line, then what they lack")
    c.add_argument("files", nargs="+", type=Path)
    c.add_argument("--strict", action="store_true", help="exit 1 when a file lacks something, not only on errors")
    s = sub.add_parser("show", help="counts per kind and tier, hosts without GPUs, NICs without GPUs...")
    s.add_argument("file", nargs="?", type=Path, default=os.environ.get("WHYWAIT_TOPOLOGY"),
                   help="cluster YAML (default: WHYWAIT_TOPOLOGY)")
    s.add_argument("--all", action="store_true", help="list every entry, not the first few of each kind")
    pa = sub.add_parser("path", help="the hops between two GPUs ('node-07/gpu3') or nodes",
                        usage="whywait topology path [-h] [--topology FILE] [FILE] A B",
                        description="The hops between two GPUs or nodes, as traffic goes: "
                                    "whywait topology path cluster.yaml node-03/gpu2 node-17")
    pa.add_argument("ends", nargs="+", metavar="[FILE] A B",
                    help="the cluster YAML (or --topology FILE, or WHYWAIT_TOPOLOGY), then the two ends")
    pa.add_argument("--topology", type=Path, default=None, metavar="FILE",
                    help="cluster YAML (default: WHYWAIT_TOPOLOGY)")
    pa.epilog = ("A and B: a node ('node-17'), or a GPU as 'node-03/gpu2' or 'node-03 gpu 2' "
                 "(one argument: quote the form with spaces).")
    d = sub.add_parser("diff", help="what changed between two cluster files")
    d.add_argument("old", type=Path)
    d.add_argument("new", type=Path)


def _load(path: Path | None) -> Any:
    from whywait.topology.model import Topology

    if path is None:
        raise ConfigError("no cluster file: pass FILE (or --topology FILE), or set WHYWAIT_TOPOLOGY")
    if not path.exists():
        raise ConfigError(f"cluster file {path} does not exist")
    return Topology.from_yaml(path)  # a TopologyError prints as one line per problem


def parse_source_args(tokens: list[str]) -> list[tuple[str, list[str]]]:
    """``["ibnetdiscover", "a.out", "nccl", "h=x.xml"]`` → ``[("ibnetdiscover", ["a.out"]), ("nccl", ["h=x.xml"])]``.

    A token naming a format starts a group (write ``./agent`` for a file called ``agent``).
    """
    from whywait.topology.sources import FORMATS

    groups: list[tuple[str, list[str]]] = []
    for tok in tokens:
        if tok in FORMATS:
            groups.append((tok, []))
        elif not groups:
            raise ConfigError(f"expected a format before {tok!r} (valid: {', '.join(FORMATS)})")
        else:
            groups[-1][1].append(tok)
    for fmt, files in groups:
        if not files:
            raise ConfigError(f"format {fmt!r} is given no file")
    return groups


def _listing(items: list[str], everything: bool, limit: int = 8) -> str:
    if everything or len(items) <= limit:
        return ", ".join(items)
    return ", ".join(items[:limit]) + f", … ({len(items)} in all; --all lists them)"


def _import(args: argparse.Namespace) -> int:
    from whywait.engine.commands.outputs import check_output
    from whywait.topology.reconcile import findings, load_aliases, load_node_types, merge
    from whywait.topology.schema import dump_yaml
    from whywait.topology.sources import read_source

    check_output(args.output, "--output")
    groups = parse_source_args(args.sources)
    types = load_node_types(args.types) if args.types else []
    facts = [read_source(fmt, f) for fmt, files in groups for f in files]
    res = merge(facts, types, args.name, aliases=load_aliases(args.aliases) if args.aliases else None)
    for f in facts:
        unheld = f"; {len(f.unmatched)} unmatched, kept in the cluster file" if f.unmatched else ""
        print(f"{f.source}: {f.format}: {len(f.hosts)} host(s), {len(f.switches)} switch(es), "
              f"{len(f.skipped)} line(s) skipped{unheld}", file=sys.stderr)
    shown = res.warnings if args.verbose else res.warnings[:20]
    for w in shown:
        print(f"warning: {w}", file=sys.stderr)
    if len(shown) < len(res.warnings):
        print(f"warning: … {len(res.warnings) - len(shown)} more (-v lists them all)", file=sys.stderr)
    if res.conflicts:
        for c in res.conflicts:
            print(f"conflict: {c}", file=sys.stderr)
        print(f"{len(res.conflicts)} conflict(s) between sources; nothing written", file=sys.stderr)
        return 2
    topo = res.topology
    text = dump_yaml(topo.to_dict(include_jobs=False))
    if args.output:
        args.output.write_text(text)
    else:
        sys.stdout.write(text)
    gpus = sum(len(topo.gpus_of(n)) for n in topo.nodes())
    found = findings(topo)
    where = str(args.output) if args.output else "cluster"
    print(f"{'wrote ' + where if args.output else where}: {len(topo.nodes())} host(s), {gpus} GPU(s), "
          f"{len(topo.switches())} switch(es); {found.problems()} gap(s) (`whywait topology show` lists them)",
          file=sys.stderr)
    _say_non_gpu_hosts(where, found.non_gpu_hosts, len(topo.nodes()))
    return 0


def _say_non_gpu_hosts(where: str, hosts: list[str], total: int) -> None:
    """One line for the hosts no source gave GPUs, beside the gap count, which leaves them out (a login or
    storage host has none by right, but 122 of 122 means the GPUs' source is missing)."""
    if hosts:
        print(f"{where}: {len(hosts)} of {total} host(s) without GPUs: no source says they have any (for GPU hosts "
              "add one that does: nccl, nvidia-smi, k8s-nodes, agent, or --types)", file=sys.stderr)


def _gap_lines(topo: Any, lines: dict[str, int], source: str) -> list[str]:
    """Each gap of ``topo`` as ``file:line: what``, the line being its host's in the cluster file."""
    from whywait.topology.reconcile import Findings, findings

    index = {d["id"]: i for i, d in enumerate(topo.to_dict(include_jobs=False)["nodes"])}
    f = findings(topo)
    out = []
    for attr, what, problem in Findings.KINDS:
        if not problem:
            continue
        for item in getattr(f, attr):
            if attr == "unmatched":
                n = next((k for k, u in enumerate(topo.unmatched) if u == item), 0)
                out.append(f"{source}:{lines.get(f'unmatched[{n}]', 1)}: unmatched: {item}")
                continue
            attrs = topo.graph.nodes[item] if item in topo.graph else {}
            host = attrs.get("node", item)
            key = f"nodes[{index.get(host, -1)}]"
            if attrs.get("kind") == "nic":  # point at the NIC's own entry, or the host's GPUs
                key += f".nics[{[n.name for n in topo.nics_of(host)].index(attrs['name'])}]"
            elif attrs.get("kind") == "gpu":
                key += ".gpus"
            line = lines.get(key, lines.get(f"nodes[{index.get(host, -1)}]", 1))
            out.append(f"{source}:{line}: {item}: {what.split(' (')[0].replace('(s)', '')}")
    return out


def _check(args: argparse.Namespace) -> int:
    from whywait.topology.errors import TopologyError as TopoErr
    from whywait.topology.model import Topology
    from whywait.topology.reconcile import findings
    from whywait.topology.schema import line_map

    for path in args.files:  # a file that cannot be read is a wrong argument (exit 2), not a finding (exit 1)
        try:
            path.open("rb").close()
        except OSError as exc:
            raise ConfigError(f"{path}: cannot read: {exc.strerror or exc}") from None
    errors = gaps = 0
    for path in args.files:
        try:
            topo = Topology.from_yaml(path)
        except TopoErr as exc:
            for p in exc.problems:
                print(p)
            errors += len(exc.problems)
            continue
        found = _gap_lines(topo, line_map(path.read_text()), str(path))
        for g in found:
            print(g)
        gaps += len(found)
        print(f"{path}: {len(topo.nodes())} host(s) OK" + (f", {len(found)} gap(s)" if found else ""),
              file=sys.stderr)
        _say_non_gpu_hosts(str(path), findings(topo).non_gpu_hosts, len(topo.nodes()))
    return 1 if errors or (args.strict and gaps) else 0


def _show(args: argparse.Namespace) -> int:
    from whywait.topology.reconcile import Findings, findings

    topo = _load(args.file)
    kinds = Counter(a["kind"] for _, a in topo.graph.nodes(data=True))
    print(f"cluster {topo.name or args.file}")
    for kind in ("rack", "switch", "node", "gpu", "nic", "pool"):
        extra = ""
        if kind == "switch":
            extra = " (" + ", ".join(f"{len(topo.switches(t))} {t}" for t in ("leaf", "spine", "core")
                                     if topo.switches(t)) + ")"
        elif kind == "node":
            types = Counter(topo.node_type_of(n) or "untyped" for n in topo.nodes())
            extra = " (" + ", ".join(f"{c} {t}" for t, c in sorted(types.items())) + ")"
        plural = "switches" if kind == "switch" else kind + "s"
        print(f"  {plural:9} {kinds.get(kind, 0):6}{extra if kinds.get(kind) else ''}")
    if topo.jobs():
        print(f"  {'jobs':9} {len(topo.jobs()):6}")
    f = findings(topo)
    for attr, what, _ in Findings.KINDS:
        items = getattr(f, attr)
        print(f"{len(items)} {what}" + (f": {_listing(items, args.all)}" if items else ""))
    return 0


def _path(args: argparse.Namespace) -> int:
    ends = list(args.ends)
    if len(ends) == 3:
        if args.topology is not None:
            raise ConfigError(f"topology path: the cluster file is given twice (--topology {args.topology} and "
                              f"{ends[0]}); give FILE A B, or --topology FILE A B")
        path: Path | None = Path(ends.pop(0))
    elif len(ends) == 2:
        env = os.environ.get("WHYWAIT_TOPOLOGY")
        path = args.topology or (Path(env) if env else None)
    else:
        raise ConfigError(f"topology path takes [FILE] A B: two ends, after the cluster file unless --topology "
                          f"or WHYWAIT_TOPOLOGY names it (got {len(ends)} argument(s): {' '.join(ends)})")
    topo = _load(path)
    hops = topo.path_between(*ends)
    print(" -> ".join(hops))
    return 0


def _diff(args: argparse.Namespace) -> int:
    from whywait.topology.reconcile import diff

    lines = diff(_load(args.old), _load(args.new))
    for line in lines:
        print(line)
    print(f"{len(lines)} change(s)" if lines else "no change", file=sys.stderr)
    return 1 if lines else 0


def run(args: argparse.Namespace) -> int:
    return {"import": _import, "check": _check, "show": _show, "path": _path, "diff": _diff}[args.action](args)
