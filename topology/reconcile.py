"""Merge what several sources say about a cluster into one topology, and say what does not fit.

One adapter has several names: ``HCA-1`` in the fabric dump, ``mlx5_0`` to the agent,
a PCI address in NCCL's XML.  :func:`merge` gives each adapter one identity by what the
sources share, most trusted first: a GUID (node or port), then the PCI bus id, then a
name or alias.  The first name a source cabled to a switch stays the NIC's name; the
others become aliases, so the engine can match an agent's ``mlx5_0/1`` to ``HCA-1``
(:meth:`~whywait.topology.model.Topology.resolve_nic`).

A host gets GPUs only from a source that says it has them (NCCL XML, ``nvidia-smi
topo -m``, Kubernetes capacity, the agent) or from a node type declared for it
(:class:`NodeType`: "every ``*-dgx-*`` host is an ND H100 v5, whose locality is this
NCCL XML").  Nothing is guessed: a host no source gives GPUs has none and is listed
as such.

Two sources that disagree (a node under two switches, two GPU counts, one NIC with two
PCI addresses) is a *conflict* naming both sources; what one source says that no other
can be matched with is *unmatched*, kept in the cluster file and listed by
:func:`findings`, ``whywait topology check``/``show`` and :func:`startup_warnings`.

Pure: standard library, networkx and PyYAML.
"""

from __future__ import annotations

import fnmatch
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Mapping, Sequence

from whywait.topology.errors import TopologyError
from whywait.topology.loaders import NcclLocality, load_nccl_topology
from whywait.topology.model import TIERS, Nic, Topology, natural_key, node_name_groups, normalise_pci
from whywait.topology.sources import SourceFacts

from whywait.textfiles import read_text

# Host names that a misconfigured node description gives many machines at once.
GENERIC_HOSTNAMES = frozenset({"localhost", "localhost.localdomain", "ubuntu", "debian", "rhel", "centos",
                               "rocky", "linux", "node", "host", "(none)"})
DEFAULT_UPLINK_NIC = "ib0"  # the NIC a host gets when a source names its switch but no NIC (topology.conf)


# ---------------------------------------------------------------------------------------------- node types

@dataclass(frozen=True)
class NodeType:
    """A declared machine type: which hosts it covers and what they hold.

    ``match``: glob patterns on host names; ``gpus``: the count; ``locality``: GPU ↔
    NIC PCIe locality from an NCCL XML; ``nic_names``: how the sources name the XML's
    NICs (``HCA-1: mlx5_0``), for fabrics whose node descriptions do not use kernel names.
    """

    name: str
    match: tuple[str, ...]
    where: str
    gpus: int | None = None
    locality: NcclLocality | None = None
    nic_names: Mapping[str, str] = field(default_factory=dict)

    def covers(self, host: str) -> bool:
        """Whether ``host`` is of this type."""
        return any(fnmatch.fnmatchcase(host, pat) for pat in self.match)


_TYPE_KEYS = {"name", "match", "gpus", "nccl", "nic_names"}


def load_aliases(path: str | Path) -> dict[str, list[str]]:
    """The hosts' declared other names, for :func:`merge`'s ``aliases``: from a cluster file written before (its
    nodes' ``aliases``; a re-import keeps what was added by hand) or from ``aliases: {host: [name, ...]}``.

    Called by ``whywait topology import --aliases FILE``.  Every problem is one ``file:line`` line.
    """
    from whywait.topology.schema import parse_yaml_with_lines

    source = str(path)
    text = read_text(path, lambda line: TopologyError(line, source=source))
    data, lines = parse_yaml_with_lines(text, source)
    problems: list[str] = []

    def bad(key: str, what: str) -> None:
        problems.append(f"{source}:{lines.get(key, 1)}: {key}: {what}")

    out: dict[str, list[str]] = {}
    if isinstance(data, dict) and isinstance(data.get("nodes"), list):  # a cluster file
        for i, n in enumerate(data["nodes"]):
            if isinstance(n, dict) and isinstance(n.get("id"), str) and n.get("aliases") is not None:
                names = n["aliases"]
                if not isinstance(names, list) or not all(isinstance(a, str) and a.strip() for a in names):
                    bad(f"nodes[{i}].aliases", f"expected a list of names (got {names!r})")
                else:
                    out[n["id"]] = list(names)
    elif isinstance(data, dict) and set(data) == {"aliases"} and isinstance(data["aliases"], dict):
        for host, names in data["aliases"].items():
            if not isinstance(host, str) or not isinstance(names, list) or \
                    not all(isinstance(a, str) and a.strip() for a in names):
                bad(f"aliases.{host}", f"expected a host's name and a list of names (got {names!r})")
            else:
                out[host] = list(names)
    else:
        raise TopologyError(f"{source}:1: expected a cluster file (with 'nodes') or one key 'aliases' mapping each "
                            "host to a list of its other names", source=source)
    if problems:
        raise TopologyError("\n".join(problems) if len(problems) == 1 else
                            f"{len(problems)} problems in {source}:\n  " + "\n  ".join(problems), source=source)
    return out


def load_node_types(path: str | Path) -> list[NodeType]:
    """Read a node-types YAML (``node_types: [{name, match, gpus, nccl, nic_names}]``).

    Every problem is reported together, each with ``file:line`` and its key path;
    an ``nccl:`` path is relative to the types file.
    """
    from whywait.topology.schema import parse_yaml_with_lines

    source = str(path)
    text = read_text(path, lambda line: TopologyError(line, source=source))
    data, lines = parse_yaml_with_lines(text, source)
    problems: list[str] = []

    def bad(key: str, what: str) -> None:
        probe = key
        while probe and probe not in lines:
            probe = probe.rsplit(".", 1)[0] if "." in probe else ""
        problems.append(f"{source}:{lines.get(probe, 1)}: {key}: {what}")

    if not isinstance(data, dict) or set(data) != {"node_types"} or not isinstance(data["node_types"], list):
        raise TopologyError(f"{source}:1: expected one key 'node_types' holding a list", source=source)
    out: list[NodeType] = []
    for i, t in enumerate(data["node_types"]):
        key = f"node_types[{i}]"
        if not isinstance(t, dict):
            bad(key, f"expected a mapping (got {t!r})")
            continue
        for k in t:
            if k not in _TYPE_KEYS:
                bad(f"{key}.{k}", f"unknown key (valid: {', '.join(sorted(_TYPE_KEYS))})")
        name, match = t.get("name"), t.get("match")
        if not isinstance(name, str) or not name:
            bad(f"{key}.name", f"expected a type name such as 'dgx-h100' (got {name!r})")
        if isinstance(match, str):
            match = [match]
        if not isinstance(match, list) or not match or not all(isinstance(m, str) and m for m in match):
            bad(f"{key}.match", f"expected a host-name glob or a list of them, such as '*-dgx-*' (got {match!r})")
            match = []
        gpus = t.get("gpus")
        if gpus is not None and (not isinstance(gpus, int) or isinstance(gpus, bool) or gpus < 0):
            bad(f"{key}.gpus", f"expected a GPU count (got {gpus!r})")
            gpus = None
        loc = None
        if t.get("nccl") is not None:
            nccl = Path(path).parent / str(t["nccl"])
            try:
                loc = load_nccl_topology(nccl)
            except TopologyError as exc:
                bad(f"{key}.nccl", str(exc))
        names = t.get("nic_names") or {}
        if not isinstance(names, dict) or not all(isinstance(k, str) and isinstance(v, str)
                                                  for k, v in names.items()):
            bad(f"{key}.nic_names", f"expected a mapping of a source's NIC name to the NCCL XML's (got {names!r})")
            names = {}
        elif loc is not None:
            for k, v in names.items():
                if v not in loc.nics:
                    bad(f"{key}.nic_names.{k}", f"expected one of the NCCL XML's NICs {sorted(loc.nics)} (got {v!r})")
        if loc is not None and gpus is not None and gpus != len(loc.gpus):
            bad(f"{key}.gpus", f"the NCCL XML has {len(loc.gpus)} GPUs (got {gpus})")
        if gpus is None and loc is not None:
            gpus = len(loc.gpus)
        if isinstance(name, str) and name and match:
            out.append(NodeType(name, tuple(match), f"{source}:{lines.get(key, 1)}", gpus, loc, dict(names)))
    if problems:
        raise TopologyError(problems, source=source)
    return out


# ---------------------------------------------------------------------------------------------- merge

@dataclass
class _Val:
    value: Any
    where: str


@dataclass
class _MNic:
    name: str
    where: str
    aliases: set[str] = field(default_factory=set)
    guids: set[str] = field(default_factory=set)
    pci: _Val | None = None
    leaf: _Val | None = None
    gpus: _Val | None = None

    def names(self) -> set[str]:
        return {self.name, *self.aliases}


@dataclass
class _MHost:
    name: str
    where: str
    gpus: _Val | None = None
    gpu_pci: dict[int, _Val] = field(default_factory=dict)
    rack: _Val | None = None
    leaf: _Val | None = None
    nics: list[_MNic] = field(default_factory=list)
    node_type: str | None = None
    names: dict[str, str] = field(default_factory=dict)  # every name a source gives the host -> where first
    aliases: list[str] = field(default_factory=list)  # declared other names (``aliases``), in order


@dataclass
class MergeResult:
    """What :func:`merge` built: the topology, the conflicts (errors) and the notes (warnings)."""

    topology: Topology
    conflicts: list[str] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)


def _set(target: Any, attr: str, value: Any, where: str, what: str, conflicts: list[str]) -> None:
    """Set ``target.attr`` to ``value`` (said at ``where``), or record a conflict naming both sources."""
    cur: _Val | None = getattr(target, attr)
    if cur is None:
        setattr(target, attr, _Val(value, where))
    elif cur.value != value:
        conflicts.append(f"{what}: {cur.value!r} ({cur.where}) but {value!r} ({where})")


def _match_nic(host: _MHost, guids: set[str], pci: str | None, names: set[str]) -> _MNic | None:
    for test in (lambda n: bool(guids & n.guids), lambda n: pci is not None and n.pci is not None
                 and n.pci.value == pci, lambda n: bool(names & n.names())):
        found = [n for n in host.nics if test(n)]
        if found:
            return found[0]
    return None


def merge(sources: Sequence[SourceFacts], types: Sequence[NodeType] = (), name: str = "",
          aliases: Mapping[str, Sequence[str]] | None = None) -> MergeResult:
    """Merge the facts of several sources (and declared node types) into one :class:`Topology`.

    Sources that cable NICs to switches (fabric dumps) are taken first, whatever the
    order given, so that their names become the NICs' names.  ``aliases`` maps a host
    to its declared other names (a cluster file's ``aliases``: ``Topology.aliases_of``):
    the merged host keeps them, and a host a source names by one of them is that host
    (the scheduler's ``gpu-a1`` and the agent's ``ip-10-0-1-5``), under the declaring
    name.  Raises nothing for disagreements: they are returned as ``conflicts`` (the
    caller decides; ``whywait topology import`` refuses to write a file with any).
    """
    res = MergeResult(Topology(name))
    conflicts, warnings = res.conflicts, res.warnings
    unmatched: list[str] = []
    ordered = sorted(sources, key=lambda s: 0 if any(n.leaf for h in s.hosts.values() for n in h.nics) else 1)
    for s in sources:
        warnings.extend(s.skipped)
        unmatched.extend(s.unmatched)  # what a source saw but the model has no place for (a leaf-leaf cable)

    switches: dict[str, tuple[str | None, str, set[str]]] = {}
    for s in ordered:
        for sf in s.switches.values():
            if sf.id in switches:
                tier, where, ups = switches[sf.id]
                if tier and sf.tier and tier != sf.tier:
                    conflicts.append(f"switch {sf.id!r}: tier {tier!r} ({where}) but {sf.tier!r} ({sf.where})")
                ups |= sf.uplinks
                switches[sf.id] = (tier or sf.tier, where, ups)
            else:
                switches[sf.id] = (sf.tier, sf.where, set(sf.uplinks))
    racks: dict[str, str] = {}
    for s in ordered:
        for r, where in s.racks.items():
            racks.setdefault(r, where)

    # One machine, several names: ``node01`` in topology.conf, ``node01.cluster.local`` in a fabric dump's node
    # descriptions.  Names one of which is the other's short name are one host, named as the first source
    # (cabling sources first) names it; a short name two full names share is neither (kept apart, unmatched).
    host_of, apart = node_name_groups([hf.name for s in ordered for hf in s.hosts.values()])
    # Declared aliases: a host a source names by another host's alias is that host (with all the names of its
    # group); the declaring host is named as the sources name it (its group's name) where they do.
    declared: dict[str, list[str]] = {}  # the merged host's name -> its aliases
    alias_host: dict[str, str] = {}  # a folded alias -> the merged host's name
    for owner, names in (aliases or {}).items():
        merged = host_of.get(owner, owner)
        for a in names:
            key = a.rstrip(".").lower()
            if key in alias_host and alias_host[key] != merged:
                conflicts.append(f"alias {a!r} is declared for node {alias_host[key]!r} and node {merged!r}")
                continue
            alias_host[key] = merged
            if a not in declared.setdefault(merged, []):
                declared[merged].append(a)
    if alias_host:
        group_names = {g.rstrip(".").lower(): g for g in host_of.values()}
        for key, merged in alias_host.items():
            group = group_names.get(key)
            if group is not None and group != merged:
                host_of = {n: merged if h == group else h for n, h in host_of.items()}
        apart = [(bare, full) for bare, full in apart if host_of.get(bare) == bare]
    hosts: dict[str, _MHost] = {}
    fabric_hosts: set[str] = set()  # hosts whose NICs a cabling source listed: others' extra NICs are unmatched
    for s in ordered:
        for hf in s.hosts.values():
            name = host_of[hf.name]
            h = hosts.setdefault(name, _MHost(name, hf.where))
            h.names.setdefault(hf.name, hf.where)
            what = f"node {name!r}"
            if hf.gpus is not None:
                _set(h, "gpus", hf.gpus, hf.where, f"{what}: GPUs", conflicts)
            for g, bus in hf.gpu_pci.items():
                cur = h.gpu_pci.get(g)
                if cur is None:
                    h.gpu_pci[g] = _Val(bus, hf.where)
                elif cur.value != bus:
                    conflicts.append(f"{what}: GPU {g}'s PCI bus id {cur.value!r} ({cur.where}) but {bus!r} "
                                     f"({hf.where})")
            if hf.rack is not None:
                _set(h, "rack", hf.rack, hf.where, f"{what}: rack", conflicts)
            if hf.leaf is not None:
                _set(h, "leaf", hf.leaf, hf.where, f"{what} is under two switches", conflicts)
            cabling = any(n.leaf for n in hf.nics)
            for nf in hf.nics:
                m = _match_nic(h, nf.guids, nf.pci, {nf.name, *nf.aliases})
                if m is None:
                    if h.name in fabric_hosts and not cabling:
                        ids = ", ".join(sorted(nf.guids)) or nf.pci or "no GUID or PCI id"
                        unmatched.append(f"{nf.where}: {h.name} NIC {nf.name} ({ids}) matches no NIC the fabric "
                                         "shows on that host; not added")
                        continue
                    m = _MNic(nf.name, nf.where)
                    h.nics.append(m)
                nic_what = f"{what} NIC {m.name!r}"
                if nf.name != m.name:
                    m.aliases.add(nf.name)
                m.aliases |= nf.aliases - {m.name}
                m.guids |= nf.guids
                if nf.pci is not None:
                    _set(m, "pci", nf.pci, nf.where, f"{nic_what}: PCI bus id", conflicts)
                if nf.leaf is not None:
                    _set(m, "leaf", nf.leaf, nf.where, f"{nic_what} is under two switches", conflicts)
                if nf.gpus is not None:
                    _set(m, "gpus", nf.gpus, nf.where, f"{nic_what}: GPUs it serves", conflicts)
            if cabling:
                fabric_hosts.add(h.name)

    for merged, names in declared.items():
        holder = hosts.get(merged)
        if holder is None:
            warnings.append(f"aliases {', '.join(names)} are declared for node {merged!r}, which no source names; "
                            "not kept")
            continue
        holder.aliases = [a for a in names if a != holder.name]
    renamed = [h for h in hosts.values() if len([n for n in h.names if n not in h.aliases]) > 1]
    if renamed:
        shown = [f"{h.name} (also {', '.join(n for n in h.names if n != h.name and n not in h.aliases)})"
                 for h in sorted(renamed, key=lambda h: natural_key(h.name))]
        warnings.append(f"{len(renamed)} host(s) named differently by the sources (a short name and a full one, or "
                        f"in another case) are one host each, under the first source's name: {_names(shown, 4)}")
    for bare, full in apart:
        unmatched.append(f"{hosts[bare].where}: node {bare!r} could be any of {', '.join(full)} (they share its "
                         "short name); kept as a host of its own: name it in full in this source")
    for h in hosts.values():
        t = next((t for t in types if any(t.covers(n) for n in h.names)), None)
        if t is None:
            continue
        h.node_type = t.name
        if t.gpus is not None:
            _set(h, "gpus", tuple(range(t.gpus)), t.where, f"node {h.name!r}: GPUs (node type {t.name!r})",
                 conflicts)
        loc = t.locality
        if loc is None:
            continue
        for g, bus in loc.gpus.items():
            h.gpu_pci.setdefault(g, _Val(normalise_pci(bus) or bus, t.where))
        by_pci = {normalise_pci(b) or b: n for n, b in loc.nics.items() if b}  # a CPU's NIC has no bus id
        for m in h.nics:
            xml_name = next((t.nic_names[n] for n in sorted(m.names()) if n in t.nic_names), None) \
                or (by_pci.get(m.pci.value) if m.pci else None) \
                or next((n for n in sorted(m.names()) if n in loc.nics), None)
            if xml_name is None:
                continue
            bus = normalise_pci(loc.nics[xml_name]) or loc.nics[xml_name]
            if m.pci is None and bus:
                m.pci = _Val(bus, t.where)
            if m.gpus is None:
                m.gpus = _Val(loc.nic_gpus[xml_name], t.where)

    # Uplinks must exist before use: every switch first, then the wiring.
    topo = res.topology
    for r in sorted(racks, key=natural_key):
        topo.add_rack(r)
    tiers = {sw: (tier or "leaf") for sw, (tier, _, _) in switches.items()}
    for sw in sorted(switches, key=lambda s: (-TIERS.index(tiers[s]), natural_key(s))):
        topo.add_switch(sw, tiers[sw])
    for sw, (_, where, ups) in switches.items():
        for up in sorted(ups, key=natural_key):
            if up not in tiers:
                warnings.append(f"{where}: switch {sw!r} names uplink {up!r}, which no source declares; skipped")
            elif TIERS.index(tiers[up]) <= TIERS.index(tiers[sw]):
                conflicts.append(f"switch {sw!r} ({where}): uplink {up!r} is a {tiers[up]}, not above a {tiers[sw]}")
            else:
                topo.add_uplink(sw, up)
    for h in sorted(hosts.values(), key=lambda h: natural_key(h.name)):
        gpus: tuple[int, ...] = tuple(h.gpus.value) if h.gpus else ()
        if h.gpu_pci and not h.gpus:
            unmatched.append(f"{h.gpu_pci[min(h.gpu_pci)].where}: {h.name}: GPU PCI ids are known but no source "
                             "says how many GPUs the host has; GPUs not added")
        nics: list[Nic] = []
        for m in h.nics:
            served = tuple(m.gpus.value) if m.gpus else ()
            extra = [g for g in served if g not in gpus]
            if extra:
                conflicts.append(f"node {h.name!r} NIC {m.name!r}: serves GPU(s) {extra} ({m.gpus.where}), which "  # type: ignore[union-attr]
                                 f"the host lacks (GPUs: {list(gpus)}{', ' + h.gpus.where if h.gpus else ''})")
                served = tuple(g for g in served if g in gpus)
            leaf = m.leaf.value if m.leaf else None
            if leaf is not None and leaf not in tiers:
                conflicts.append(f"node {h.name!r} NIC {m.name!r}: leaf {leaf!r} ({m.leaf.where}) is no switch")  # type: ignore[union-attr]
                leaf = None
            nics.append(Nic(h.name, m.name, leaf, served, tuple(sorted(m.guids)), m.pci.value if m.pci else None,
                            tuple(sorted(m.aliases, key=natural_key))))
        if h.leaf is not None:
            nic_leaves = {n.leaf for n in nics if n.leaf}
            if h.leaf.value not in tiers:
                conflicts.append(f"node {h.name!r}: switch {h.leaf.value!r} ({h.leaf.where}) is not declared")
            elif nic_leaves and h.leaf.value not in nic_leaves:
                wheres = sorted({m.leaf.where for m in h.nics if m.leaf})
                conflicts.append(f"node {h.name!r} is under two switches: {h.leaf.value!r} ({h.leaf.where}) but "
                                 f"{', '.join(sorted(nic_leaves))} ({', '.join(wheres)})")
            elif not nics:
                nics.append(Nic(h.name, DEFAULT_UPLINK_NIC, h.leaf.value, gpus))
            elif not nic_leaves:
                # The host's NICs come from a source that does not cable them (the agent) and its switch from one
                # that names no NIC (topology.conf): the switch was dropped, and with it the host's paths and its
                # shared-switch contention.  It goes on the NICs that serve GPUs (all of them when none says).
                fabric = [n for n in nics if n.gpus] or nics
                nics = [replace(n, leaf=h.leaf.value) if n in fabric else n for n in nics]
                warnings.append(f"node {h.name!r}: no source cables its NIC(s) {', '.join(n.name for n in fabric)}; "
                                f"put under {h.leaf.value!r} as {h.leaf.where} says")
        nics.sort(key=lambda n: natural_key(n.name))
        rack = h.rack.value if h.rack else None
        if rack is not None and rack not in racks:
            topo.add_rack(rack)
            racks[rack] = h.rack.where  # type: ignore[union-attr]
        try:
            topo.add_node(h.name, gpus, nics, rack, None,
                          {g: v.value for g, v in h.gpu_pci.items() if g in gpus}, h.node_type, h.aliases)
        except TopologyError as exc:
            conflicts.append(f"{h.where}: {exc}")
    topo.unmatched = tuple(unmatched)
    return res


# ---------------------------------------------------------------------------------------------- findings

@dataclass
class Findings:
    """What a cluster file lacks, for ``check``, ``show`` and the engine's start.

    Each list holds graph ids (hosts, ``"host gpu 3"``, ``"host HCA-1"``).
    """

    non_gpu_hosts: list[str] = field(default_factory=list)
    hosts_without_switch: list[str] = field(default_factory=list)
    nics_without_gpus: list[str] = field(default_factory=list)
    gpus_without_nic: list[str] = field(default_factory=list)
    generic_names: list[str] = field(default_factory=list)
    unmatched: list[str] = field(default_factory=list)

    # (attribute, what it means, whether it is a problem rather than a fact worth knowing)
    KINDS = (
        ("hosts_without_switch", "host(s) without a switch (no NIC cabled to a leaf)", True),
        ("nics_without_gpus", "NIC(s) without GPUs on GPU hosts (PCIe locality unknown: topology.wrong-nic "
                              "cannot judge them)", True),
        ("gpus_without_nic", "GPU(s) without a NIC (no NIC of their host serves them)", True),
        ("generic_names", "host(s) with a generic name (an unset node description?)", True),
        ("unmatched", "source fact(s) the import could not match", True),
        ("non_gpu_hosts", "host(s) without GPUs (no source says they have any)", False),
    )

    def problems(self) -> int:
        """How many entries are problems (non-GPU hosts are a fact, not a problem)."""
        return sum(len(getattr(self, k)) for k, _, problem in self.KINDS if problem)


def findings(topo: Topology) -> Findings:
    """List what ``topo`` lacks: hosts without GPUs or a switch, NICs without GPUs, GPUs without a NIC."""
    f = Findings(unmatched=list(topo.unmatched))
    for node in topo.nodes():
        gpus = topo.gpus_of(node)
        nics = topo.nics_of(node)
        if not gpus:
            f.non_gpu_hosts.append(node)
        if not any(n.leaf for n in nics):
            f.hosts_without_switch.append(node)
        if node.lower() in GENERIC_HOSTNAMES:
            f.generic_names.append(node)
        if gpus and nics:
            served = {g for n in nics for g in n.gpus}
            f.nics_without_gpus += [n.id for n in nics if not n.gpus]
            f.gpus_without_nic += [f"{node} gpu {g}" for g in gpus if g not in served]
    return f


def _names(items: Sequence[str], limit: int = 6) -> str:
    if len(items) <= limit:
        return ", ".join(items)
    return ", ".join(items[:limit]) + f", … ({len(items)} in all)"


def startup_warnings(topo: Topology) -> list[str]:
    """One line per kind of gap in ``topo``, for the engine to log when it starts (empty when none).

    Called by ``whywait engine`` after it loads the topology: a host the engine cannot
    place GPUs on, or a NIC it cannot judge, is said once, not discovered at 3 a.m.  The
    lines carry no prefix: the caller says where they come from (``topology: ...``).
    """
    f = findings(topo)
    out = []
    for attr, what, problem in Findings.KINDS:
        items = getattr(f, attr)
        if items and problem:
            out.append(f"{len(items)} {what}: {_names(items)}")
    return out


# ---------------------------------------------------------------------------------------------- diff

def diff(old: Topology, new: Topology) -> list[str]:
    """Lines saying what changed from ``old`` to ``new``: ``+``/``-`` for added/removed, ``~`` for changed."""
    out: list[str] = []
    a, b = old.to_dict(include_jobs=False), new.to_dict(include_jobs=False)
    sa = {s["id"]: s for s in a["switches"]}
    sb = {s["id"]: s for s in b["switches"]}
    for s in sorted(sa.keys() - sb.keys(), key=natural_key):
        out.append(f"- switch {s} ({sa[s]['tier']})")
    for s in sorted(sb.keys() - sa.keys(), key=natural_key):
        out.append(f"+ switch {s} ({sb[s]['tier']})")
    for s in sorted(sa.keys() & sb.keys(), key=natural_key):
        if sa[s].get("tier") != sb[s].get("tier"):
            out.append(f"~ switch {s}: tier {sa[s]['tier']} -> {sb[s]['tier']}")
        ua, ub = set(sa[s].get("uplinks", ())), set(sb[s].get("uplinks", ()))
        if ua != ub:
            out.append(f"~ switch {s}: uplinks -{sorted(ua - ub)} +{sorted(ub - ua)}")
    na = {n["id"]: n for n in a["nodes"]}
    nb = {n["id"]: n for n in b["nodes"]}
    for n in sorted(na.keys() - nb.keys(), key=natural_key):
        out.append(f"- node {n} ({len(na[n]['gpus'])} GPUs)")
    for n in sorted(nb.keys() - na.keys(), key=natural_key):
        out.append(f"+ node {n} ({len(nb[n]['gpus'])} GPUs)")
    for n in sorted(na.keys() & nb.keys(), key=natural_key):
        x, y = na[n], nb[n]
        for key in ("rack", "type", "gpus", "gpu_pci"):
            if x.get(key) != y.get(key):
                out.append(f"~ node {n}: {key} {x.get(key)!r} -> {y.get(key)!r}")
        ca = {c["name"]: c for c in x["nics"]}
        cb = {c["name"]: c for c in y["nics"]}
        for c in sorted(ca.keys() - cb.keys(), key=natural_key):
            out.append(f"- nic {n} {c}")
        for c in sorted(cb.keys() - ca.keys(), key=natural_key):
            out.append(f"+ nic {n} {c}" + (f" on {cb[c]['leaf']}" if cb[c].get("leaf") else ""))
        for c in sorted(ca.keys() & cb.keys(), key=natural_key):
            for key in ("leaf", "gpus", "pci", "guids", "aliases"):
                if ca[c].get(key) != cb[c].get(key):
                    out.append(f"~ nic {n} {c}: {key} {ca[c].get(key)!r} -> {cb[c].get(key)!r}")
    ua, ub = set(a.get("unmatched", ())), set(b.get("unmatched", ()))
    out += [f"- unmatched {u}" for u in sorted(ua - ub)] + [f"+ unmatched {u}" for u in sorted(ub - ua)]
    return out
