"""Readers of what a cluster already has, each turned into *facts* for :mod:`whywait.topology.reconcile` to merge.

A reader does not build a :class:`~whywait.topology.model.Topology`: it says what one source
knows (a fabric dump knows cables and GUIDs but not GPUs; an NCCL XML knows PCIe
locality but not host names; the agent knows sysfs names, GUIDs and PCI addresses),
and where in the file it said it, so that a conflict between two sources can name
both.  :data:`FORMATS` is the registry ``whywait topology import FORMAT FILE...``
dispatches on.

Readers never stop at the first bad line: an unknown or malformed line is reported as
``file:line: why`` in :attr:`SourceFacts.skipped` and skipped.  A file that cannot be
read at all, or holds nothing of its format, raises :class:`TopologyError`.

Pure: standard library and PyYAML only.
"""

from __future__ import annotations

import itertools
import json
import re
from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Mapping

from whywait.topology.errors import TopologyError
from whywait.topology.loaders import (
    _IB_NODE,
    _IB_SWITCH_PORT,
    _NO_SWITCH,
    IbCable,
    NcclLocality,
    expand_hostlist,
    ib_dump_format,
    ib_fabric,
    load_nccl_topology,
    parse_ib_links,
    slurm_lines,
)
from whywait.topology.model import MAX_GPUS_PER_NODE, TIERS, natural_key, normalise_guid, normalise_pci

from whywait import jsonl
from whywait.jsonl import json_records


@dataclass
class NicFacts:
    """One adapter as one source sees it.  ``gpus`` is None when the source does not know locality."""

    name: str
    where: str  # "file:line" of the statement
    leaf: str | None = None
    gpus: tuple[int, ...] | None = None
    guids: set[str] = field(default_factory=set)
    pci: str | None = None
    aliases: set[str] = field(default_factory=set)


@dataclass
class HostFacts:
    """One host as one source sees it.

    ``gpus`` is None when the source does not say how many GPUs the host has (a
    fabric dump, topology.conf): only a source that says so gives a host GPUs.
    ``leaf`` is a host-level switch (topology.conf, Kubernetes labels) for sources
    that do not name NICs.
    """

    name: str
    where: str
    gpus: tuple[int, ...] | None = None
    gpu_pci: dict[int, str] = field(default_factory=dict)
    nics: list[NicFacts] = field(default_factory=list)
    rack: str | None = None
    leaf: str | None = None
    node_type: str | None = None


@dataclass
class SwitchFacts:
    """A switch, its tier (None: let the wiring decide) and the switches it connects up to."""

    id: str
    where: str
    tier: str | None = None
    uplinks: set[str] = field(default_factory=set)


@dataclass
class SourceFacts:
    """Everything one file said: hosts, switches, racks, and the lines it skipped (``file:line: why``)."""

    source: str
    format: str
    hosts: dict[str, HostFacts] = field(default_factory=dict)
    switches: dict[str, SwitchFacts] = field(default_factory=dict)
    racks: dict[str, str] = field(default_factory=dict)  # rack -> where
    skipped: list[str] = field(default_factory=list)
    unmatched: list[str] = field(default_factory=list)  # ``file:line: what`` the model has no place for


def _read_text(path: str | Path) -> str:
    try:
        return Path(path).read_text(errors="replace")
    except OSError as exc:
        raise TopologyError(f"{path}: cannot read: {exc.strerror or exc}", source=str(path)) from None


def _read_json(path: str | Path) -> tuple[str, object]:
    """The text of a JSON file and what it holds; bad JSON is a :class:`TopologyError` naming its line."""
    text = _read_text(path)
    try:
        return text, jsonl.loads(text)
    except json.JSONDecodeError as exc:
        raise TopologyError(f"{path}:{exc.lineno}: not valid JSON: {exc.msg}", source=str(path)) from None


def split_host_arg(arg: str) -> tuple[str | None, str]:
    """``HOST=PATH`` → (HOST, PATH); a bare PATH → (None, PATH).  For per-host formats (NCCL, nvidia-smi)."""
    host, sep, path = arg.partition("=")
    if sep and host and "/" not in host:
        return host, path
    return None, arg


# ---------------------------------------------------------------------------------------------- ibnetdiscover

def read_ibnetdiscover(path: str | Path) -> SourceFacts:
    """Facts of an ``ibnetdiscover`` dump: switches (tiered by wiring), hosts and their HCAs with GUIDs.

    A host is the first word of its HCA's node description (``"a08-p1-dgx-04-c01 mlx5_5"``), or
    the whole description when it is one word (``"atlas133"``: its NICs are ``HCA-1``, ``HCA-2``,
    … in node-GUID order, see :func:`~whywait.topology.loaders.hca_nic_names`); each HCA keeps its
    node GUID (``H-<guid>``) and the port GUIDs its switch lines show.  HCAs that name no host
    (SHARP aggregation nodes, ``"MT4129 ConnectX7 ..."``) are listed in ``skipped``.  Switches are
    named by :func:`~whywait.topology.loaders.switch_ids` and tiered by
    :func:`~whywait.topology.loaders.switch_tiers`; a cable the model cannot hold (two switches of
    one tier, a host on a spine) goes to ``unmatched``.  The dump says nothing about GPUs.

    ``ibnetdiscover -p`` and ``iblinkinfo`` output (default or ``-l``) are read too, by their layout
    (:func:`~whywait.topology.loaders.parse_ib_links`): operators have one or the other, and telling
    them apart is the reader's job, not theirs.
    """
    source = str(path)
    facts = SourceFacts(source, "ibnetdiscover")
    switches: dict[str, tuple[str, int]] = {}  # guid -> (description, line)
    hcas: dict[str, tuple[str, int]] = {}
    cables: list[IbCable] = []
    current: str | None = None
    lines = _read_text(path).splitlines()
    fmt = ib_dump_format(lines)
    if fmt != "ibnetdiscover":  # `ibnetdiscover -p` or iblinkinfo, whichever name it was given under
        dump = parse_ib_links(lines, source, fmt)
        facts.format = fmt
        switches, hcas, cables, lines = dump.switches, dump.hcas, dump.cables, []
        facts.skipped += [f"{p}; skipped" for p in dump.problems]
    for lineno, raw in enumerate(lines, 1):
        line = raw.strip()
        if not line:
            current = None
            continue
        if line.startswith("#") or "=" in line.split()[0]:
            continue
        m = _IB_NODE.match(line)
        if m:
            if m.group("type") == "Switch":
                current = m.group("id")
                switches[current] = (m.group("desc"), lineno)
            else:
                current = None  # a Ca's port lines repeat links already seen from the switch side
                hcas.setdefault(m.group("id"), (m.group("desc"), lineno))
            continue
        if line.startswith("[") and current is None:
            continue  # a Ca's (or router's) port line
        p = _IB_SWITCH_PORT.match(line) if line.startswith("[") else None
        if p is None:
            facts.skipped.append(f"{source}:{lineno}: not an ibnetdiscover node or port line, skipped "
                                 f"(got {line[:60]!r})")
            continue
        peer = p.group("peer")
        cables.append(IbCable(current, int(p.group("port")), peer, int(p.group("peer_port")),  # type: ignore[arg-type]
                              lineno, p.group("pguid")))
        if peer.startswith("H-") and p.group("desc") and peer not in hcas:
            hcas[peer] = (p.group("desc"), lineno)
    if not switches:
        raise TopologyError(f"{source}: {_NO_SWITCH[fmt]}", source=source)
    undescribed = [(c.line, c.peer) for c in cables if c.peer.startswith("S-") and c.peer not in switches]
    if undescribed:  # the dump was cut before that switch's block: its tier and links are unknown
        lineno, peer = min(undescribed)
        raise TopologyError(f"{source}:{lineno}: port links to switch {peer}, which the dump does not describe "
                            "(truncated?)", source=source)
    fabric = ib_fabric({sw: d for sw, (d, _line) in switches.items()}, {g: d for g, (d, _line) in hcas.items()},
                       cables)
    for guid, (desc, lineno) in hcas.items():
        if guid not in fabric.hcas:
            facts.skipped.append(f"{source}:{lineno}: HCA {guid} ({desc.strip()!r}) names no host, skipped")
    ids = fabric.ids
    for sw, (_desc, lineno) in switches.items():
        facts.switches[ids[sw]] = SwitchFacts(ids[sw], f"{source}:{lineno}", fabric.tier[sw],
                                              {ids[p] for p in fabric.uplinks[sw]})
    for guid, (host, nic) in sorted(fabric.hcas.items(), key=lambda kv: natural_key(kv[1][0] + " " + kv[1][1])):
        lineno = hcas[guid][1]
        h = facts.hosts.setdefault(host, HostFacts(host, f"{source}:{lineno}"))
        guids = {g for g in (normalise_guid(guid), *map(normalise_guid, sorted(fabric.port_guids.get(guid, ())))) if g}
        leaf = ids[fabric.leaf[guid]] if guid in fabric.leaf else None
        h.nics.append(NicFacts(nic, f"{source}:{lineno}", leaf, None, guids))
    facts.unmatched = [f"{source}:{line}: {what}" for line, what in fabric.unmatched]
    return facts


# ---------------------------------------------------------------------------------------------- Slurm

def _slurm_tree(facts: SourceFacts, leaf_nodes: Mapping[str, tuple[list[str], str]],
                children: Mapping[str, tuple[list[str], str]], blocks: Mapping[str, tuple[list[str], str]]) -> None:
    """Fill ``facts`` from a Slurm tree (switch → nodes / switches) and blocks (read as racks)."""
    known = set(leaf_nodes) | set(children)
    parent: dict[str, set[str]] = defaultdict(set)
    for sw, (kids, where) in children.items():
        for k in kids:
            if k not in known:
                facts.skipped.append(f"{where}: switch {sw!r} names {k!r} under Switches, which no switch defines; "
                                     "skipped")
                continue
            parent[k].add(sw)
    depth: dict[str, int] = {sw: 0 for sw in leaf_nodes}
    frontier = list(leaf_nodes)
    for _ in range(len(known) + 1):  # bounded: a cycle in a malformed file must not loop forever
        nxt = []
        for sw in frontier:
            for p in parent[sw]:
                if depth.get(p, -1) < depth[sw] + 1:
                    depth[p] = depth[sw] + 1
                    nxt.append(p)
        frontier = nxt
    for sw in known:
        where = (leaf_nodes.get(sw) or children[sw])[1]
        facts.switches[sw] = SwitchFacts(sw, where, TIERS[min(depth.get(sw, 0), 2)], set(parent[sw]))
    for block, (nodes, where) in blocks.items():
        facts.racks[block] = where
        for n in nodes:
            h = facts.hosts.setdefault(n, HostFacts(n, where))
            h.rack = block
    for leaf, (nodes, where) in leaf_nodes.items():
        for n in nodes:
            h = facts.hosts.setdefault(n, HostFacts(n, where))
            if h.leaf is not None and h.leaf != leaf:
                facts.skipped.append(f"{where}: node {n!r} is under {h.leaf!r} ({h.where}) and under {leaf!r}; "
                                     f"kept {h.leaf!r}")
                continue
            h.leaf, h.where = leaf, where


def read_slurm_conf(path: str | Path) -> SourceFacts:
    """Facts of a Slurm ``topology.conf``: tree lines (``SwitchName= Nodes=|Switches=``) and blocks (racks)."""
    source = str(path)
    facts = SourceFacts(source, "slurm-conf")
    leaf_nodes: dict[str, tuple[list[str], str]] = {}
    children: dict[str, tuple[list[str], str]] = {}
    blocks: dict[str, tuple[list[str], str]] = {}
    for lineno, line in slurm_lines(_read_text(path).splitlines()):
        where = f"{source}:{lineno}"
        fields: dict[str, str] = {}
        bad = [tok for tok in line.split() if "=" not in tok]
        if bad:
            facts.skipped.append(f"{where}: expected KEY=VALUE (got {bad[0]!r}); line skipped")
            continue
        for tok in line.split():
            k, _, v = tok.partition("=")
            fields[k.lower()] = v
        try:
            hosts = {k: expand_hostlist(fields[k]) for k in ("nodes", "switches") if k in fields}
        except ValueError as exc:
            facts.skipped.append(f"{where}: {exc}; line skipped")
            continue
        if "switchname" in fields:
            sw = fields["switchname"]
            if "nodes" not in fields and "switches" not in fields:
                facts.skipped.append(f"{where}: SwitchName={sw}: expected Nodes= or Switches=; line skipped")
            if "nodes" in fields:
                leaf_nodes[sw] = (hosts["nodes"], where)
            if "switches" in fields:
                children[sw] = (hosts["switches"], where)
        elif "blockname" in fields:
            if "nodes" not in fields:
                facts.skipped.append(f"{where}: BlockName={fields['blockname']}: expected Nodes=; line skipped")
            else:
                blocks[fields["blockname"]] = (hosts["nodes"], where)
        elif not set(fields) <= {"blocksizes", "linkspeed"}:
            facts.skipped.append(f"{where}: expected SwitchName=, BlockName= or BlockSizes= (got {line[:60]!r}); "
                                 "line skipped")
    if not leaf_nodes and not children and not blocks:
        raise TopologyError(f"{source}: expected SwitchName= or BlockName= lines (found none)", source=source)
    _slurm_tree(facts, leaf_nodes, children, blocks)
    return facts


def read_slurm_yaml(path: str | Path) -> SourceFacts:
    """Facts of a Slurm ``topology.yaml`` (Slurm 25.05+): the cluster-default (else first) topology.

    The documented shape is a list of topologies, each ``topology: NAME`` with one of
    ``tree: {switches: [{switch, children | nodes}]}``, ``block: {blocks: [{block, nodes}]}``
    or ``flat: true``.
    """
    from whywait.topology.schema import parse_yaml_with_lines

    source = str(path)
    text = _read_text(path)
    data, lines = parse_yaml_with_lines(text, source)
    facts = SourceFacts(source, "slurm-yaml")
    if not isinstance(data, list) or not all(isinstance(t, dict) for t in data):
        raise TopologyError(f"{source}:1: expected a list of topologies ('- topology: NAME') "
                            f"(got {type(data).__name__})", source=source)
    pick = next((i for i, t in enumerate(data) if t.get("cluster_default") is True), 0 if data else None)
    if pick is None:
        raise TopologyError(f"{source}: expected at least one topology (found none)", source=source)

    def where(key: str) -> str:
        return f"{source}:{lines.get(key, 1)}"

    topo = data[pick]
    leaf_nodes: dict[str, tuple[list[str], str]] = {}
    children: dict[str, tuple[list[str], str]] = {}
    blocks: dict[str, tuple[list[str], str]] = {}
    for i, sw in enumerate(((topo.get("tree") or {}).get("switches") or [])):
        key = f"[{pick}].tree.switches[{i}]"
        if not isinstance(sw, dict) or not isinstance(sw.get("switch"), str):
            facts.skipped.append(f"{where(key)}: expected a mapping with 'switch:' (got {sw!r}); skipped")
            continue
        try:
            if isinstance(sw.get("nodes"), str):
                leaf_nodes[sw["switch"]] = (expand_hostlist(sw["nodes"]), where(key))
            if isinstance(sw.get("children"), str):
                children[sw["switch"]] = (expand_hostlist(sw["children"]), where(key))
        except ValueError as exc:
            facts.skipped.append(f"{where(key)}: {exc}; skipped")
            continue
        if not isinstance(sw.get("nodes"), str) and not isinstance(sw.get("children"), str):
            facts.skipped.append(f"{where(key)}: switch {sw['switch']!r}: expected 'nodes:' or 'children:' "
                                 "as a hostlist string; skipped")
    for i, b in enumerate(((topo.get("block") or {}).get("blocks") or [])):
        key = f"[{pick}].block.blocks[{i}]"
        if not isinstance(b, dict) or not isinstance(b.get("block"), str) or not isinstance(b.get("nodes"), str):
            facts.skipped.append(f"{where(key)}: expected 'block:' and 'nodes:' (got {b!r}); skipped")
            continue
        try:
            blocks[b["block"]] = (expand_hostlist(b["nodes"]), where(key))
        except ValueError as exc:
            facts.skipped.append(f"{where(key)}: {exc}; skipped")
    if not leaf_nodes and not children and not blocks:
        raise TopologyError(f"{where(f'[{pick}]')}: topology {topo.get('topology')!r} has no tree switches or "
                            "blocks (a flat topology says nothing whywait can use)", source=source)
    _slurm_tree(facts, leaf_nodes, children, blocks)
    return facts


# ---------------------------------------------------------------------------------------------- NCCL XML

def nccl_host_facts(host: str, loc: NcclLocality, where: str) -> HostFacts:
    """A host's GPUs (with PCI bus ids) and NICs (with PCI bus ids and served GPUs) from NCCL locality."""
    h = HostFacts(host, where, tuple(sorted(loc.gpus)), {g: normalise_pci(b) or b for g, b in loc.gpus.items()})
    for name, bus in loc.nics.items():
        h.nics.append(NicFacts(name, where, None, loc.nic_gpus[name], set(), (normalise_pci(bus) or bus) or None))
    return h


def read_nccl(arg: str) -> SourceFacts:
    """``HOST=topo.xml``: one host's GPU ↔ NIC locality from an NCCL topology XML.

    For many hosts of one machine type, declare a node type with ``nccl:`` instead
    (see :mod:`whywait.topology.reconcile`).
    """
    host, path = split_host_arg(arg)
    if host is None:
        raise TopologyError(f"{path}: an NCCL XML describes one machine, not a cluster: give it as HOST={path}, "
                            "or declare a node type with 'nccl: " + path + "' (--types FILE)", source=path)
    facts = SourceFacts(path, "nccl")
    loc = load_nccl_topology(path)
    facts.hosts[host] = nccl_host_facts(host, loc, f"{path}:1")
    facts.skipped += loc.skipped
    return facts


# ---------------------------------------------------------------------------------------------- nvidia-smi

_ANSI = re.compile(r"\x1b\[[0-9;]*[A-Za-z]")
_RELATION = ("PIX", "PXB", "PHB", "NODE", "SYS")  # closest first
#: The header words after the device columns: "CPU Affinity", "NUMA Affinity", "GPU NUMA ID".
_SMI_TAIL = frozenset({"CPU", "NUMA", "Affinity"})


def read_nvidia_smi_topo(arg: str) -> SourceFacts:
    """``HOST=FILE``: the output of ``nvidia-smi topo -m`` (or a capture file holding it).

    Gives the host's GPUs and, where the matrix has NIC columns, the NICs (named by
    its ``NIC Legend``, or by the column itself as drivers before the legend
    printed ``mlx5_0``) and their locality: a NIC serves the GPUs it reaches
    through PCIe switches (``PIX``/``PXB``); a GPU with no such NIC is served by
    its closest NICs short of ``SYS`` (``PHB``, else ``NODE``).  Cells may be
    separated by tabs (as printed) or spaces (as copied from a terminal).  The
    header's ANSI underline is ignored.  A row that is neither a GPU nor a NIC is
    reported and skipped.
    """
    host, path = split_host_arg(arg)
    if host is None:
        raise TopologyError(f"{path}: nvidia-smi topo -m does not name its host: give it as HOST={path}",
                            source=path)
    facts = SourceFacts(path, "nvidia-smi")
    lines = [_ANSI.sub("", raw) for raw in _read_text(path).splitlines()]
    start = next((i for i, line in enumerate(lines) if line.strip() == "# $ nvidia-smi topo -m"), None)
    if start is not None:  # a capture file: the section runs to the next banner
        start += 1
        while start < len(lines) and lines[start].startswith("#"):
            start += 1
    else:
        start = 0
    header: list[str] | None = None  # the device columns (GPUn, NICn, or an older driver's mlx5_0...)
    rows: dict[str, tuple[list[str], int]] = {}
    legend: dict[str, str] = {}
    in_legend = False
    for i in range(start, len(lines)):
        line, lineno = lines[i], i + 1
        if start and line.startswith("####"):
            break
        # Cells are split on any whitespace: the driver writes tabs, but a matrix copied from a terminal (an
        # issue, a runbook) has spaces, and no device cell holds a space ("CPU Affinity" is past the devices).
        cells = line.split()
        if not cells:
            continue
        if line.strip().startswith("Legend:") or line.strip().startswith("NIC Legend:"):
            in_legend = True
            continue
        m = re.match(r"\s*(NIC\d+)\s*:\s*(\S+)", line)
        if in_legend:
            if m:
                legend[m.group(1)] = m.group(2)
            continue
        if header is None and cells[0] == "GPU0" and (len(cells) == 1 or cells[1] != "X"):
            header = list(itertools.takewhile(lambda c: c not in _SMI_TAIL, cells))
            continue
        if header is not None and cells[0] in header:
            rows[cells[0]] = (cells[1:len(header) + 1], lineno)
            continue
        facts.skipped.append(f"{path}:{lineno}: not a row of the topo -m matrix, skipped (got {line.strip()[:60]!r})")
    if header is None:
        raise TopologyError(f"{path}: expected the 'nvidia-smi topo -m' matrix (no header row with GPU0 found)",
                            source=path)
    gpu_cols = [c for c in header if re.fullmatch(r"GPU\d+", c)]
    # NICn columns (named by the NIC Legend); drivers before the legend named the column by the device itself.
    nic_cols = [c for c in header if c not in gpu_cols]
    gpus = tuple(int(c[3:]) for c in gpu_cols)
    h = HostFacts(host, f"{path}:{rows[gpu_cols[0]][1] if gpu_cols and gpu_cols[0] in rows else 1}", gpus)
    def relation(nic: str, gpu: str) -> str:
        row = rows.get(nic, ([], 0))[0]
        idx = header.index(gpu)
        rel = row[idx] if idx < len(row) else ""
        if not rel and gpu in rows:  # no row for the NIC: read its column in the GPU's row
            grow, idx = rows[gpu][0], header.index(nic)
            rel = grow[idx] if idx < len(grow) else ""
        return rel

    served: dict[str, list[int]] = {nic: [] for nic in nic_cols}
    for g in gpu_cols:
        rel = {nic: relation(nic, g) for nic in nic_cols}
        # The NICs behind the GPU's PCIe switches; a GPU with none is served by its closest NICs short of SYS
        # (same host bridge, same NUMA node), as NCCL falls back to the NICs of the GPU's CPU.
        for level in (("PIX", "PXB"), ("PHB",), ("NODE",)):
            near = [nic for nic in nic_cols if rel[nic] in level]
            if near:
                for nic in near:
                    served[nic].append(int(g[3:]))
                break
    for nic in nic_cols:
        lineno = rows.get(nic, ([], 0))[1]
        h.nics.append(NicFacts(legend.get(nic, nic), f"{path}:{lineno or 1}", None, tuple(served[nic])))
    facts.hosts[host] = h
    return facts


# ---------------------------------------------------------------------------------------------- Kubernetes

# Labels that name a node's switches: NVIDIA topograph's, then the upcoming Kubernetes ones.
K8S_SWITCH_LABELS: dict[str, tuple[str, ...]] = {
    "leaf": ("network.topology.nvidia.com/leaf", "network.topology.kubernetes.io/accelerator"),
    "spine": ("network.topology.nvidia.com/spine", "network.topology.kubernetes.io/block"),
    "core": ("network.topology.nvidia.com/core", "network.topology.kubernetes.io/datacenter"),
}
K8S_RACK_LABELS = ("topology.kubernetes.io/rack", "rack")


def read_k8s_nodes(path: str | Path) -> SourceFacts:
    """Facts of ``kubectl get nodes -o json``: each node's GPUs and its switches from labels.

    GPUs: ``status.capacity["nvidia.com/gpu"]``, else the GPU feature discovery label
    ``nvidia.com/gpu.count``; a node with neither has none.  Switches: the
    topology labels of :data:`K8S_SWITCH_LABELS` (leaf, spine, core).
    """
    source = str(path)
    text, data = _read_json(path)
    items = data.get("items") if isinstance(data, dict) else None
    if not isinstance(items, list):
        raise TopologyError(f"{source}: expected a Kubernetes list ('kind: List' or 'NodeList' with 'items') "
                            f"(got {type(data).__name__})", source=source)
    facts = SourceFacts(source, "k8s-nodes")
    name_lines = {m.group(1): text.count("\n", 0, m.start()) + 1
                  for m in re.finditer(r'"name"\s*:\s*"([^"]+)"', text)}
    for i, item in enumerate(items):
        meta = item.get("metadata") if isinstance(item, dict) else None
        name = meta.get("name") if isinstance(meta, dict) else None
        if not isinstance(name, str) or item.get("kind", "Node") != "Node":
            facts.skipped.append(f"{source}: items[{i}]: not a Node with metadata.name, skipped")
            continue
        where = f"{source}:{name_lines.get(name, 1)}"
        labels = (meta or {}).get("labels") or {}
        cap = ((item.get("status") or {}).get("capacity") or {}).get("nvidia.com/gpu", labels.get(
            "nvidia.com/gpu.count"))
        h = HostFacts(name, where)
        if cap is not None:
            try:
                count = int(cap)
                if not 0 <= count <= MAX_GPUS_PER_NODE:
                    raise ValueError(f"more than {MAX_GPUS_PER_NODE}")
                h.gpus = tuple(range(count))
            except (TypeError, ValueError):
                facts.skipped.append(f"{where}: node {name!r}: nvidia.com/gpu capacity must be a count "
                                     f"(got {cap!r}); GPUs not taken")
        chain: list[str] = []
        for tier in TIERS:
            sw = next((labels[k] for k in K8S_SWITCH_LABELS[tier] if labels.get(k)), None)
            if sw:
                chain.append(sw)
                prev = facts.switches.get(sw)
                if prev is None:
                    facts.switches[sw] = SwitchFacts(sw, where, tier)
        for lower, upper in zip(chain, chain[1:], strict=False):
            facts.switches[lower].uplinks.add(upper)
        h.leaf = chain[0] if chain and facts.switches[chain[0]].tier == "leaf" else None
        h.rack = next((labels[k] for k in K8S_RACK_LABELS if labels.get(k)), None)
        if h.rack:
            facts.racks.setdefault(h.rack, where)
        facts.hosts[name] = h
    return facts


# ---------------------------------------------------------------------------------------------- NVIDIA NetQ

#: NetQ ``device_type`` values that are switches; every other device with a link is a host
#: (``discovered_via_lldp``: a server NetQ knows from its switches' LLDP neighbours).
_NETQ_SWITCH_TYPES = frozenset({"switch", "router"})


def _netq_graph(data: object, source: str) -> tuple[list[object], list[object]] | None:
    """A NetQ topology graph's ``nodes`` and ``links`` (the API's list of one graph, or the graph); None if not one."""
    graph = data[0] if isinstance(data, list) and len(data) == 1 else data
    if isinstance(graph, dict) and isinstance(graph.get("nodes"), list) and isinstance(graph.get("links"), list):
        return graph["nodes"], graph["links"]
    return None


def read_netq(path: str | Path) -> SourceFacts:
    """Facts of an NVIDIA NetQ export: its topology graph (Ethernet / Spectrum-X fabrics), or its compute nodes.

    ``topologyGraph.json`` (``/api/netq/telemetry/v1/object/topologygraph``): devices grouped by
    tier, and links between them, each with the interface pairs it bundles.  Switches are tiered by
    wiring, as a fabric dump is (host-facing = leaf, above = spine, above that = core: NetQ's own
    ``tier`` numbers are its guess from the same wiring); every other device with a link is a host,
    each of its interfaces cabled to a switch a NIC on that leaf, named as the kernel names it
    (``ens4f0np0``), which is the name the agent reports.  ``computeNodes.json``
    (``/api/netq/.../computenodes``): each compute node's GPU count (``GpuIDList``).  Neither says
    more (no GUIDs, no PCI ids); what a reader cannot use is listed in ``skipped``.
    """
    source = str(path)
    text, data = _read_json(path)
    facts = SourceFacts(source, "netq")
    lines: dict[str, int] = {}
    for m in re.finditer(r'"(?:id|Name|name)"\s*:\s*"([^"]+)"', text):
        lines.setdefault(m.group(1), text.count("\n", 0, m.start()) + 1)

    def where(name: str) -> str:
        return f"{source}:{lines.get(name, 1)}"

    if isinstance(data, list) and data and all(isinstance(d, dict) and "GpuIDList" in d for d in data):
        for i, node in enumerate(data):
            name, gpus = node.get("Name"), node.get("GpuIDList")
            if not isinstance(name, str) or not name or not isinstance(gpus, list):
                facts.skipped.append(f"{source}: [{i}]: a compute node needs a Name and a GpuIDList, skipped")
                continue
            facts.hosts[name] = HostFacts(name, where(name), gpus=tuple(range(min(len(gpus), MAX_GPUS_PER_NODE))))
        return facts
    graph = _netq_graph(data, source)
    if graph is None:
        raise TopologyError(f"{source}: expected a NetQ topology graph (an object with 'nodes' and 'links', or a "
                            "list of one) or NetQ compute nodes (objects with 'GpuIDList')", source=source)
    nodes, links = graph
    devices: dict[str, tuple[str, bool]] = {}  # NetQ id -> (name, is a switch)
    stack = list(nodes)
    while stack:  # tier groups hold their devices in compounded_nodes (and may nest)
        n = stack.pop()
        if not isinstance(n, dict):
            continue
        stack += n.get("compounded_nodes") or []
        if n.get("node_type", "device") != "device":
            continue
        nid, name = n.get("id"), n.get("name") or n.get("id")
        if not isinstance(nid, str) or not isinstance(name, str) or not name:
            facts.skipped.append(f"{source}: a device without an id and a name, skipped (got {str(n)[:60]!r})")
            continue
        devices[nid] = (name, str(n.get("device_type", "")).lower() in _NETQ_SWITCH_TYPES)
    cables: list[tuple[str, str | None, str, str | None, str]] = []  # (node, interface, node, interface, where)
    for i, link in enumerate(links):
        if not isinstance(link, dict):
            facts.skipped.append(f"{source}: links[{i}]: not an object, skipped")
            continue
        pairs = [c.get("interfaces") for c in link.get("compounded_links") or [] if isinstance(c, dict)]
        if not pairs:  # a link without its interface pairs: the two devices only
            pairs = [link.get("interfaces") or [{"node": link.get("src")}, {"node": link.get("target")}]]
        for pair in pairs:
            ends = [e for e in pair if isinstance(e, dict)] if isinstance(pair, list) else []
            if len(ends) != 2 or not all(isinstance(e.get("node"), str) for e in ends):
                facts.skipped.append(f"{where(str(link.get('id', '')))}: links[{i}]: an interface pair without two "
                                     "nodes, skipped")
                continue
            unknown = [e["node"] for e in ends if e["node"] not in devices]
            if unknown:
                facts.skipped.append(f"{where(str(link.get('id', '')))}: links[{i}]: device {unknown[0]!r} is not "
                                     "among the graph's nodes, skipped")
                continue
            near, far = ends
            cables.append((near["node"], near.get("interface"), far["node"], far.get("interface"),
                           where(str(link.get("id", "")))))
    peers: dict[str, set[str]] = defaultdict(set)  # switch -> switches cabled to it
    host_ports: dict[str, dict[str | None, tuple[str, str]]] = defaultdict(dict)  # host -> nic -> (switch, where)
    for a, ia, b, ib, at in cables:
        (na, sa), (nb, sb) = devices[a], devices[b]
        if sa and sb:
            peers[a].add(b)
            peers[b].add(a)
        elif sa != sb:
            (host, nic), switch = ((b, ib), a) if sa else ((a, ia), b)
            host_ports[host].setdefault(nic if isinstance(nic, str) and nic else None, (switch, at))
        else:
            facts.skipped.append(f"{at}: a cable between two hosts ({na}, {nb}), skipped")
    leaves = {sw for ports in host_ports.values() for sw, _ in ports.values()}
    spines = {p for leaf in leaves for p in peers[leaf] if p not in leaves}
    tiers = {sw: "leaf" if sw in leaves else "spine" if sw in spines else "core"
             for sw, (_, is_switch) in devices.items() if is_switch}
    order = {t: k for k, t in enumerate(TIERS)}
    for sw, tier in tiers.items():
        name = devices[sw][0]
        ups = {devices[p][0] for p in peers[sw] if order[tiers[p]] > order[tier]}
        facts.switches[name] = SwitchFacts(name, where(sw), tier, ups)
    for host, ports in sorted(host_ports.items(), key=lambda kv: natural_key(devices[kv[0]][0])):
        name = devices[host][0]
        h = facts.hosts.setdefault(name, HostFacts(name, where(host)))
        for nic, (sw, at) in sorted(ports.items(), key=lambda kv: natural_key(kv[0] or "")):
            if nic is None:  # the cable's host end has no interface name: the host's switch, not a NIC's
                h.leaf = h.leaf or devices[sw][0]
                continue
            h.nics.append(NicFacts(nic, at, devices[sw][0]))
    if not facts.switches and not facts.hosts:
        raise TopologyError(f"{source}: a NetQ topology graph with no switch and no cabled host", source=source)
    return facts


# ---------------------------------------------------------------------------------------------- the agent

def read_agent(path: str | Path) -> SourceFacts:
    """Facts from the agent's own messages (JSON lines of ``net`` and ``gpu`` messages, as on the topics and
    as ``whywait agent --print`` writes them; one JSON array of them is read too).

    ``net``: each NIC's sysfs name, node/port GUID, PCI address and the GPUs it
    serves by PCIe locality; ``gpu``: the GPU indexes and, where the agent reports
    them, their PCI bus ids.  ``whywait agent --print`` prints such lines; so does a
    console consumer of the topics.  The latest message per node and kind wins.
    """
    source = str(path)
    facts = SourceFacts(source, "agent")
    seen = False
    for lineno, raw in json_records(_read_text(path).splitlines(keepends=True)):
        line = raw.strip()
        if line.startswith("#"):
            continue
        where = f"{source}:{lineno}"
        try:
            msg = jsonl.loads(line)
        except json.JSONDecodeError as exc:
            facts.skipped.append(f"{where}: not a JSON message ({exc.msg}), skipped")
            continue
        if not isinstance(msg, dict) or msg.get("kind") not in ("net", "gpu") or not isinstance(msg.get("node"),
                                                                                               str):
            if not (isinstance(msg, dict) and isinstance(msg.get("kind"), str)):
                facts.skipped.append(f"{where}: expected an agent message with 'kind' and 'node', skipped")
            continue  # other kinds (host, storage...) say nothing about topology
        seen = True
        node = msg["node"]
        h = facts.hosts.setdefault(node, HostFacts(node, where))
        if msg["kind"] == "gpu":
            gpus = [g for g in msg.get("gpus") or [] if isinstance(g, dict) and isinstance(g.get("gpu"), int)]
            h.gpus = tuple(sorted(g["gpu"] for g in gpus))
            h.gpu_pci = {g["gpu"]: p for g in gpus if (p := normalise_pci(str(g.get("pci_bus_id") or "")))}
            continue
        nics: dict[str, NicFacts] = {}
        for n in msg.get("nics") or []:
            if not isinstance(n, dict) or not isinstance(n.get("nic"), str):
                facts.skipped.append(f"{where}: a NIC without a 'nic' name, skipped")
                continue
            hca = n["nic"].split("/", 1)[0]  # one adapter per HCA; its ports share the node GUID and PCI
            nf = nics.setdefault(hca, NicFacts(hca, where))
            nf.aliases.add(n["nic"])
            for key in ("node_guid", "port_guid"):
                g = normalise_guid(str(n.get(key) or ""))
                if g:
                    nf.guids.add(g)
            nf.pci = normalise_pci(str(n.get("pci_bus_id") or "")) or nf.pci
            if n.get("gpus"):
                nf.gpus = tuple(sorted(set(nf.gpus or ()) | set(n["gpus"])))
        h.nics = list(nics.values())
        h.where = where
    if not seen:
        raise TopologyError(f"{source}: expected agent 'net' or 'gpu' messages, one JSON object a line or a JSON "
                            "array of them (found none)", source=source)
    return facts


# name -> (reader, one-line help).  A reader takes one FILE argument (``HOST=FILE`` for per-host formats).
FORMATS: dict[str, tuple[Callable[[str], SourceFacts], str]] = {
    "ibnetdiscover": (read_ibnetdiscover, "InfiniBand fabric dump (also 'ibnetdiscover -p' and iblinkinfo output): "
                                          "switches, hosts, HCAs and their GUIDs"),
    "slurm-conf": (read_slurm_conf, "Slurm topology.conf: switch tree (SwitchName=) and blocks (racks)"),
    "slurm-yaml": (read_slurm_yaml, "Slurm topology.yaml: the cluster-default tree or block topology"),
    "nccl": (read_nccl, "HOST=FILE: one host's NCCL topology XML (GPU and NIC PCI ids, locality)"),
    "nvidia-smi": (read_nvidia_smi_topo, "HOST=FILE: 'nvidia-smi topo -m' output (GPUs, NICs, locality)"),
    "k8s-nodes": (read_k8s_nodes, "kubectl get nodes -o json: GPU capacity and topology labels"),
    "agent": (read_agent, "JSON lines of agent net/gpu messages: sysfs names, GUIDs, PCI ids"),
    "netq": (read_netq, "NVIDIA NetQ topology graph (Ethernet fabric: switches, hosts, their cabled NICs) or its "
                        "compute nodes (GPU counts)"),
}


def read_source(fmt: str, arg: str) -> SourceFacts:
    """Read one FILE argument in format ``fmt``; an unknown format lists the valid ones."""
    try:
        reader = FORMATS[fmt][0]
    except KeyError:
        raise TopologyError(f"unknown format {fmt!r} (valid: {', '.join(FORMATS)})") from None
    return reader(arg)

