"""Loaders of real fabric-topology formats into :class:`~whywait.topology.model.Topology`.

* :func:`load_ibnetdiscover` — the text dump of ``ibnetdiscover`` (InfiniBand
  fabric discovery; what NVIDIA topograph consumes): switches with their ports,
  and the host channel adapters (HCAs) cabled to them.  Switch tiers are derived
  from the wiring (:func:`switch_tiers`: host-bearing switches are leaves unless they
  sit above other leaves, as a spine carrying storage hosts does; one hop above the
  leaves is spine, further is core).
* :func:`load_slurm_topology` — Slurm ``topology.conf`` in the tree form
  (``SwitchName=... Switches=...|Nodes=...``) and the block form
  (``BlockName=... Nodes=...``, read as racks), as topograph writes them.
* :func:`load_nccl_topology` — an NCCL topology XML (``NCCL_TOPO_FILE``), read
  for its GPU ↔ NIC PCIe locality, which a fabric dump lacks; :func:`add_nccl_node`
  adds a host built from it.

Every loader raises :class:`~whywait.topology.errors.TopologyError` naming the file and
line of anything it cannot read.  Pure: stdlib and networkx only.
"""

from __future__ import annotations

import re
import xml.etree.ElementTree as ET
from collections import Counter, defaultdict
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Mapping, Sequence

from whywait.topology.errors import TopologyError
from whywait.topology.model import TIERS, Nic, Topology, natural_key

from whywait.textfiles import read_text

# ---------------------------------------------------------------------------------------------- ibnetdiscover

_IB_NODE = re.compile(r'^(?P<type>Switch|Ca)\s+(?P<ports>\d+)\s+"(?P<id>[SH]-[0-9a-fA-F]+)"\s*#\s*"(?P<desc>[^"]*)"')
_IB_SWITCH_PORT = re.compile(
    r'^\[(?P<port>\d+)\]\s+"(?P<peer>[SH]-[0-9a-fA-F]+)"\[(?P<peer_port>\d+)\](?:\((?P<pguid>[0-9a-fA-F]+)\))?\s*'
    r'(?:#\s*"(?P<desc>[^"]*)")?')
_HOST_DESC = re.compile(r"^(?P<host>\S+)\s+(?P<nic>(?:mlx\d+_\d+|HCA-\d+|ib\d+|[a-z]+\d+[a-z0-9_/.-]*))$")
# One-word descriptions that are no host's name: an unset hostname, or an adapter's own name alone.
_NO_HOST_WORD = re.compile(r"^(?:localhost(?:\.localdomain)?|\(none\)|\(null\)|mlx\d+_\d+|HCA-\d+)$", re.IGNORECASE)


@dataclass
class LoadReport:
    """What a loader kept and what it skipped (and why), for ``whywait topology check``-style output."""

    source: str
    switches: int = 0
    nodes: int = 0
    nics: int = 0
    skipped: list[str] = field(default_factory=list)


def switch_name(desc: str, fallback: str) -> str:
    """Readable switch id from an IB node description.

    ``MF0;A09-P1-IBLEAF-04-04:MQM9701/U1`` → ``A09-P1-IBLEAF-04-04``; ``fallback`` when it is empty.
    """
    name = desc.split(";", 1)[-1].split(":", 1)[0].strip()
    return name or fallback


def switch_ids(descs: Mapping[str, str]) -> dict[str, str]:
    """Each switch's id (``S-<guid>`` → readable id), unique and independent of the order of the dump.

    The id is :func:`switch_name` of its description; when several switches share that name
    (a generic ``"SwitchIB Mellanox Technologies"``, the ASICs of one director chassis) every one
    of them is ``"<name> (S-<guid>)"``, so that no switch gets the bare name by the luck of its GUID.
    """
    readable = {sw: switch_name(desc, sw) for sw, desc in descs.items()}
    shared = Counter(readable.values())
    return {sw: name if shared[name] == 1 else f"{name} ({sw})" for sw, name in readable.items()}


def hca_host(desc: str) -> tuple[str, str | None] | None:
    """The host (and the NIC name, when it gives one) an HCA's node description names; None if no host.

    ``"a08-p1-dgx-04-c01 mlx5_5"`` → ``("a08-p1-dgx-04-c01", "mlx5_5")``; a one-word description
    ``"atlas133"`` → ``("atlas133", None)`` (see :func:`hca_nic_names`); ``"MT4129 ConnectX7 Mellanox
    Technologies"``, ``"Mellanox Technologies Aggregation Node"``, ``"localhost"`` or ``""`` → None.
    """
    d = desc.strip()
    m = _HOST_DESC.match(d)
    if m:
        return m.group("host"), m.group("nic")
    if d and len(d.split()) == 1 and not _NO_HOST_WORD.match(d):
        return d, None
    return None


def _guid_key(guid: str) -> tuple[int, str]:
    try:
        return int(guid.split("-", 1)[-1], 16), guid
    except ValueError:
        return -1, guid


def hca_nic_names(named: Mapping[str, tuple[str, str | None]]) -> dict[str, tuple[str, str]]:
    """HCA (``H-<guid>``) → (host, NIC name), the names unique on each host and independent of dump order.

    An HCA whose description names its adapter (``"node-1 mlx5_0"``) alone on its host keeps that
    name.  HCAs whose description is the bare host name (``"atlas133"``) are ``HCA-1``, ``HCA-2``, …
    and HCAs of one host that share a description (``"node-1 mlx5_0"`` twice) are ``mlx5_0-1``,
    ``mlx5_0-2``, …, numbered in node-GUID order and skipping a name the host already has.
    """
    by_host: dict[str, list[tuple[str, str | None]]] = defaultdict(list)
    for guid, (host, nic) in named.items():
        by_host[host].append((guid, nic))
    out: dict[str, tuple[str, str]] = {}
    for host, items in by_host.items():
        count = Counter(nic for _guid, nic in items)
        taken = {nic for nic, n in count.items() if nic is not None and n == 1}
        groups: dict[str | None, list[str]] = defaultdict(list)
        for guid, nic in items:
            if nic is not None and count[nic] == 1:
                out[guid] = (host, nic)
            else:
                groups[nic].append(guid)
        for nic in sorted(groups, key=lambda n: (n is not None, n or "")):
            k = 0
            for guid in sorted(groups[nic], key=_guid_key):
                k += 1
                while (f"HCA-{k}" if nic is None else f"{nic}-{k}") in taken:
                    k += 1
                name = f"HCA-{k}" if nic is None else f"{nic}-{k}"
                taken.add(name)
                out[guid] = (host, name)
    return out


def switch_tiers(switches: Sequence[str], neighbours: Mapping[str, Mapping[str, int]],
                 host_cables: Mapping[str, int], ca_cables: Mapping[str, int]) -> dict[str, str]:
    """Tier of each switch from the wiring alone: ``leaf``, ``spine`` or ``core``.

    ``neighbours[s]`` counts the cables from switch ``s`` to each other switch; ``host_cables[s]``
    the cables to HCAs that name a host, ``ca_cables[s]`` those to any HCA.

    1. Leaves start as the switches with a host cabled to them (none: those with any HCA).
    2. A starting leaf is really a spine that carries a few hosts (storage, login nodes) when it is
       cabled more to switches than to HCAs, to at least two leaves, and at least half of its switch
       cables go to leaves (a spine of a 3-tier fabric sends half down, half up).  Such switches
       are taken one at a time, the one with the most leaf neighbours first, each time against the
       leaves left: so a spine goes before the leaves under it, which then no longer see two leaf
       neighbours.
    3. The rest by hop distance from the leaves: one hop is a spine, two or more a core switch
       (a 2-tier fat tree has no core; a lone switch is a leaf).  A switch no leaf reaches is core.
    """
    leaves = {s for s in switches if host_cables.get(s)} or {s for s in switches if ca_cables.get(s)}
    if not leaves:
        return {s: "leaf" for s in switches}
    while True:
        best: tuple[int, int, str] | None = None
        for s in leaves:
            peers = neighbours.get(s, {})
            k = sum(1 for p in peers if p in leaves)
            cabled = sum(peers.values())
            down = sum(n for p, n in peers.items() if p in leaves)
            if k >= 2 and 2 * down >= cabled > ca_cables.get(s, 0):
                key = (k, cabled, s)
                if best is None or key > best:
                    best = key
        if best is None:
            break
        leaves.discard(best[2])
    dist = {s: 0 for s in leaves}
    frontier = sorted(leaves)
    while frontier:
        nxt = []
        for s in frontier:
            for p in sorted(neighbours.get(s, {})):
                if p not in dist:
                    dist[p] = dist[s] + 1
                    nxt.append(p)
        frontier = nxt
    return {s: TIERS[min(dist[s], 2)] if s in dist else "core" for s in switches}


_PLURAL = {"leaf": "leaves", "spine": "spines", "core": "core switches"}


@dataclass(frozen=True)
class IbCable:
    """One switch port's cable as a dump line shows it; ``peer_guid`` is the port GUID an HCA's port shows."""

    switch: str
    port: int
    peer: str
    peer_port: int
    line: int
    peer_guid: str | None = None


@dataclass
class IbFabric:
    """What :func:`ib_fabric` made of a dump: GUID ids throughout, readable ids in ``ids``."""

    ids: dict[str, str]  # S-guid -> switch id
    tier: dict[str, str]  # S-guid -> tier
    uplinks: dict[str, set[str]]  # S-guid -> S-guids of the higher-tier switches it is cabled to
    hcas: dict[str, tuple[str, str]]  # H-guid -> (host, NIC name)
    leaf: dict[str, str]  # H-guid -> S-guid of the leaf its NIC is cabled to
    port_guids: dict[str, set[str]]  # H-guid -> the port GUIDs its cables show
    unmatched: list[tuple[int, str]]  # (line, what): cables the model has no place for


def ib_fabric(switches: Mapping[str, str], hcas: Mapping[str, str], cables: Sequence[IbCable]) -> IbFabric:
    """Switch ids and tiers, uplinks, hosts and NICs from an ``ibnetdiscover`` dump's nodes and cables.

    ``switches`` and ``hcas`` map ``S-``/``H-<guid>`` to node descriptions; ``cables`` are the
    switches' port lines (a cable between two switches is listed from both ends, and counted once).
    Every switch-to-switch cable becomes an uplink, unless both ends are of one tier (the model
    links a switch only up to a higher tier): those, and an HCA cabled to a switch that is no leaf
    (the model cables a NIC to a leaf only), are returned in ``unmatched`` instead of dropped.
    """
    ids = switch_ids(switches)
    named = {guid: h for guid, desc in hcas.items() if (h := hca_host(desc)) is not None}
    nic_names = hca_nic_names(named)
    between: dict[frozenset[tuple[str, int]], IbCable] = {}
    to_hca: dict[tuple[str, int], IbCable] = {}
    for c in cables:
        if c.peer.startswith("S-"):
            key = frozenset({(c.switch, c.port), (c.peer, c.peer_port)})
            if key not in between or c.line < between[key].line:
                between[key] = c
        else:
            to_hca.setdefault((c.switch, c.port), c)
    neighbours: dict[str, Counter[str]] = defaultdict(Counter)
    for c in between.values():
        neighbours[c.switch][c.peer] += 1
        neighbours[c.peer][c.switch] += 1
    ca_cables = Counter(c.switch for c in to_hca.values())
    host_cables = Counter(c.switch for c in to_hca.values() if c.peer in nic_names)
    tier = switch_tiers(list(switches), neighbours, host_cables, ca_cables)
    rank = {t: i for i, t in enumerate(TIERS)}
    uplinks: dict[str, set[str]] = {sw: set() for sw in switches}
    same_tier: dict[tuple[str, str], list[IbCable]] = defaultdict(list)
    for c in between.values():
        a, b = c.switch, c.peer
        if rank[tier[a]] < rank[tier[b]]:
            uplinks[a].add(b)
        elif rank[tier[b]] < rank[tier[a]]:
            uplinks[b].add(a)
        else:
            lo, hi = sorted((a, b), key=lambda s: natural_key(ids[s]))
            same_tier[(lo, hi)].append(c)
    unmatched: list[tuple[int, str]] = []
    for (a, b), cs in same_tier.items():
        ends = ", ".join(f"{ids[c.switch]}[{c.port}]-{ids[c.peer]}[{c.peer_port}]"
                         for c in sorted(cs, key=lambda c: c.line))
        unmatched.append((min(c.line for c in cs),
                          f"switches {ids[a]} and {ids[b]} are both {_PLURAL[tier[a]]} and cabled together ({len(cs)} "
                          f"cable(s): {ends}); the model links a switch only up to a higher tier, so these cables "
                          "are not in the topology"))
    by_hca: dict[str, list[IbCable]] = defaultdict(list)
    port_guids: dict[str, set[str]] = defaultdict(set)
    for c in to_hca.values():
        by_hca[c.peer].append(c)
        if c.peer_guid:
            port_guids[c.peer].add(c.peer_guid)
    leaf: dict[str, str] = {}
    for guid, cs in by_hca.items():
        if guid not in nic_names:
            continue
        host, nic = nic_names[guid]
        cs.sort(key=lambda c: (tier[c.switch] != "leaf", c.peer_port, c.line))
        first = cs[0]
        if tier[first.switch] == "leaf":
            leaf[guid] = first.switch
        else:
            unmatched.append((first.line, f"{host} NIC {nic} ({guid}) is cabled to {ids[first.switch]} port "
                                          f"{first.port}, which the wiring makes a {tier[first.switch]}; the model "
                                          "cables a NIC to a leaf only, so the NIC has no leaf"))
        for c in cs[1:]:
            if c.switch != first.switch:
                unmatched.append((c.line, f"{host} NIC {nic} ({guid}) port {c.peer_port} is also cabled to "
                                          f"{ids[c.switch]} port {c.port}; the model gives a NIC one switch, "
                                          f"{ids[first.switch]}"))
    unmatched.sort()
    return IbFabric(ids, tier, uplinks, nic_names, leaf, dict(port_guids), unmatched)


def load_ibnetdiscover(path: str | Path, gpus_per_node: int = 8,
                       nic_gpus: Mapping[str, Sequence[int]] | None = None,
                       rack_of: Callable[[str], str | None] | str | None = None,
                       name: str = "", report: LoadReport | None = None) -> Topology:
    """Load an ``ibnetdiscover`` dump: switches (tiered by wiring), hosts and their HCAs.

    A host is named by the first word of its HCA's node description
    (``"a08-p1-dgx-04-c01 mlx5_5"`` → host ``a08-p1-dgx-04-c01``, NIC ``mlx5_5``), or by the
    whole description when it is one word (``"atlas133"``; NICs named as :func:`hca_nic_names`
    says).  HCAs whose description names no host (``"MT4129 ConnectX7 ..."``, SHARP
    aggregation nodes) are skipped and listed in ``report.skipped``.  Switches are named by
    :func:`switch_ids` and tiered by :func:`switch_tiers`; a cable the model cannot hold (two
    switches of one tier, a host on a spine) is listed in the topology's ``unmatched`` and in
    ``report.skipped``, never dropped unsaid.  A host's NICs are sorted naturally; the first is
    primary.  Each host gets ``gpus_per_node`` GPUs; ``nic_gpus`` maps a NIC name to the GPUs it
    serves (from :func:`load_nccl_topology`, say), otherwise NICs serve none.  ``rack_of`` maps a
    host name to its rack: a callable, or a regex whose first group is the rack (``r"^(.*)-c\\d+$"``).
    """
    source = str(path)
    rep = report if report is not None else LoadReport(source)
    lines = read_text(path, lambda line: TopologyError(line, source=source)).splitlines()
    switches: dict[str, str] = {}  # guid id -> description
    hcas: dict[str, str] = {}  # guid id -> description
    cables: list[IbCable] = []
    current: str | None = None
    problems: list[str] = []
    for lineno, raw in enumerate(lines, 1):
        line = raw.strip()
        if not line or line.startswith("#") or "=" in line.split()[0]:
            if not line:
                current = None
            continue
        m = _IB_NODE.match(line)
        if m:
            if m.group("type") == "Switch":
                current = m.group("id")
                switches[current] = m.group("desc")
            else:
                current = None  # a Ca's port lines repeat links already seen from the switch side
                hcas[m.group("id")] = m.group("desc")
            continue
        if line.startswith("["):
            if current is None:
                if not line.startswith("[") or "(" not in line:
                    problems.append(f"{source}:{lineno}: port line outside a Switch or Ca block (got {line[:60]!r})")
                continue
            p = _IB_SWITCH_PORT.match(line)
            if p is None:
                problems.append(f"{source}:{lineno}: expected a port line '[N] \"S-|H-<guid>\"[M] # \"desc\"' "
                                f"(got {line[:60]!r})")
                continue
            peer = p.group("peer")
            cables.append(IbCable(current, int(p.group("port")), peer, int(p.group("peer_port")), lineno,
                                  p.group("pguid")))
            if peer.startswith("H-") and p.group("desc") and peer not in hcas:
                hcas[peer] = p.group("desc")
            continue
        if line.split()[0] in ("Switch", "Ca", "Rt"):
            problems.append(f"{source}:{lineno}: expected '{line.split()[0]} <ports> \"<guid>\" # \"<desc>\"' "
                            f"(got {line[:60]!r})")
    if problems:
        raise TopologyError(problems, source=source)
    if not switches:
        raise TopologyError(f"{source}: expected an ibnetdiscover dump with 'Switch' blocks (found none)",
                            source=source)
    undescribed = [(c.line, c.peer) for c in cables if c.peer.startswith("S-") and c.peer not in switches]
    if undescribed:  # cut before that switch's block (as :func:`~whywait.topology.sources.read_ibnetdiscover` says)
        lineno, peer = min(undescribed)
        raise TopologyError(f"{source}:{lineno}: port links to switch {peer}, which the dump does not describe "
                            "(truncated?)", source=source)

    fabric = ib_fabric(switches, hcas, cables)
    for guid, desc in hcas.items():
        if guid not in fabric.hcas:
            rep.skipped.append(f"HCA {guid} ({desc!r}): no host name in its description")
    host_nics: dict[str, dict[str, str | None]] = defaultdict(dict)  # host -> nic -> leaf guid
    for guid, (host, nic) in fabric.hcas.items():
        host_nics[host][nic] = fabric.leaf.get(guid)
    ids, tier = fabric.ids, fabric.tier

    topo = Topology(name or Path(path).stem)
    rack_fn = _rack_function(rack_of)
    racks: set[str] = set()
    order = {"core": 0, "spine": 1, "leaf": 2}
    for sw in sorted(switches, key=lambda s: (order[tier[s]], natural_key(ids[s]))):
        ups = sorted((ids[p] for p in fabric.uplinks[sw]), key=natural_key)
        topo.add_switch(ids[sw], tier[sw], ups)
        rep.switches += 1
    for host in sorted(host_nics, key=natural_key):
        rack = rack_fn(host) if rack_fn else None
        if rack is not None and rack not in racks:
            topo.add_rack(rack)
            racks.add(rack)
        nics = [Nic(host, nic, ids[leaf] if leaf else None, tuple((nic_gpus or {}).get(nic, ())))
                for nic, leaf in sorted(host_nics[host].items(), key=lambda kv: natural_key(kv[0]))]
        try:
            topo.add_node(host, gpus_per_node, nics, rack)
        except TopologyError as exc:
            raise TopologyError(f"{source}: host {host!r}: {exc}", source=source) from None
        rep.nodes += 1
        rep.nics += len(nics)
    topo.unmatched = tuple(f"{source}:{line}: {what}" for line, what in fabric.unmatched)
    rep.skipped.extend(topo.unmatched)
    return topo


def _rack_function(rack_of: Callable[[str], str | None] | str | None) -> Callable[[str], str | None] | None:
    if rack_of is None or callable(rack_of):
        return rack_of
    pattern = re.compile(rack_of)

    def by_regex(host: str) -> str | None:
        m = pattern.match(host)
        return m.group(1) if m else None
    return by_regex


# ---------------------------------------------------------------------------------------------- Slurm topology.conf

_HOSTLIST_PART = re.compile(r"([^,\[]+)(?:\[([^\]]+)\])?([^,\[]*)")


def expand_hostlist(expr: str) -> list[str]:
    """Expand a Slurm hostlist: ``srv[1101-1103,1105]`` → ``srv1101, srv1102, srv1103, srv1105``.

    Supports one bracket group per name (what topology.conf writers produce),
    keeping the width of zero-padded ranges.
    """
    out: list[str] = []
    depth = 0
    start = 0
    parts: list[str] = []
    for i, ch in enumerate(expr):
        if ch == "[":
            depth += 1
        elif ch == "]":
            depth -= 1
        elif ch == "," and depth == 0:
            parts.append(expr[start:i])
            start = i + 1
    parts.append(expr[start:])
    for part in filter(None, (p.strip() for p in parts)):
        m = re.fullmatch(r"([^\[]*)\[([^\]]+)\](.*)", part)
        if not m:
            out.append(part)
            continue
        prefix, body, suffix = m.groups()
        for rng in body.split(","):
            a, sep, b = rng.partition("-")
            if not sep:
                out.append(f"{prefix}{a}{suffix}")
                continue
            width = len(a) if a.startswith("0") else 0
            for i in range(int(a), int(b) + 1):
                out.append(f"{prefix}{i:0{width}d}{suffix}")
    return out


def load_slurm_topology(path: str | Path, gpus_per_node: int = 8, nic: str = "ib0",
                        name: str = "") -> Topology:
    """Load a Slurm ``topology.conf``: the tree form gives switches and leaves, the block form racks.

    Tree: ``SwitchName=S Nodes=<hostlist>`` makes a leaf; ``SwitchName=S
    Switches=<hostlist>`` makes S the uplink of those switches; tiers follow the
    depth (leaf, spine, then core).  Each node gets one NIC named ``nic``
    cabled to its leaf and ``gpus_per_node`` GPUs (Slurm does not describe PCIe
    locality).  Block: ``BlockName=B Nodes=<hostlist>`` makes rack B.  A
    ``# id=friendly`` comment line (as topograph writes) is kept as nothing more
    than a comment.  ``BlockSizes=`` and ``LinkSpeed=`` are accepted and ignored.
    """
    source = str(path)
    lines = read_text(path, lambda line: TopologyError(line, source=source)).splitlines()
    leaf_nodes: dict[str, list[str]] = {}
    children: dict[str, list[str]] = {}
    blocks: dict[str, list[str]] = {}
    problems: list[str] = []
    for lineno, raw in enumerate(lines, 1):
        line = raw.split("#", 1)[0].strip()
        if not line:
            continue
        fields: dict[str, str] = {}
        for tok in line.split():
            k, sep, v = tok.partition("=")
            if not sep:
                problems.append(f"{source}:{lineno}: expected KEY=VALUE (got {tok!r})")
                continue
            fields[k] = v
        if "SwitchName" in fields:
            sw = fields["SwitchName"]
            if "Nodes" in fields:
                leaf_nodes[sw] = expand_hostlist(fields["Nodes"])
            if "Switches" in fields:
                children[sw] = expand_hostlist(fields["Switches"])
            if "Nodes" not in fields and "Switches" not in fields:
                problems.append(f"{source}:{lineno}: SwitchName={sw}: expected Nodes= or Switches=")
        elif "BlockName" in fields:
            if "Nodes" not in fields:
                problems.append(f"{source}:{lineno}: BlockName={fields['BlockName']}: expected Nodes=")
            else:
                blocks[fields["BlockName"]] = expand_hostlist(fields["Nodes"])
        elif not set(fields) <= {"BlockSizes", "LinkSpeed"}:
            problems.append(f"{source}:{lineno}: expected SwitchName=, BlockName= or BlockSizes= "
                            f"(got {line[:60]!r})")
    known = set(leaf_nodes) | set(children)
    for sw, kids in children.items():
        for k in kids:
            if k not in known:
                problems.append(f"{source}: SwitchName={sw}: Switches= names {k!r}, which no SwitchName= line defines")
    if problems:
        raise TopologyError(problems, source=source)
    if not known and not blocks:
        raise TopologyError(f"{source}: expected SwitchName= or BlockName= lines (found none)", source=source)
    parent: dict[str, list[str]] = defaultdict(list)
    for sw, kids in children.items():
        for k in kids:
            parent[k].append(sw)
    # Depth above the leaves decides the tier; anything two or more levels up is core.
    depth: dict[str, int] = {sw: 0 for sw in leaf_nodes}
    frontier = list(leaf_nodes)
    while frontier:
        nxt = []
        for sw in frontier:
            for p in parent[sw]:
                if depth.get(p, -1) < depth[sw] + 1:
                    depth[p] = depth[sw] + 1
                    nxt.append(p)
        frontier = nxt
    tiers = ("leaf", "spine", "core")
    topo = Topology(name or Path(path).stem)
    for sw in sorted(depth, key=lambda s: (-depth[s], natural_key(s))):
        topo.add_switch(sw, tiers[min(depth[sw], 2)], sorted(parent[sw], key=natural_key))
    rack_of: dict[str, str] = {}
    for block in sorted(blocks, key=natural_key):
        topo.add_rack(block)
        for n in blocks[block]:
            rack_of[n] = block
    node_leaf: dict[str, str] = {}
    for leaf, nodes in leaf_nodes.items():
        for n in nodes:
            node_leaf.setdefault(n, leaf)
    for n in sorted(set(node_leaf) | set(rack_of), key=natural_key):
        leaf_of = node_leaf.get(n)
        nics = [Nic(n, nic, leaf_of, tuple(range(gpus_per_node)))] if leaf_of else []
        topo.add_node(n, gpus_per_node, nics, rack_of.get(n))
    return topo


# ---------------------------------------------------------------------------------------------- NCCL topology XML

_GPU_CLASS = "0x0302"  # 3D controller
_NIC_CLASSES = ("0x0207", "0x0200")  # InfiniBand, Ethernet


@dataclass(frozen=True)
class NcclLocality:
    """GPU ↔ NIC PCIe locality of one machine type, read from an NCCL topology XML.

    ``gpus``: GPU index → PCI bus id (indexes follow bus-id order, as with
    ``CUDA_DEVICE_ORDER=PCI_BUS_ID``); ``nics``: NIC name → bus id (``""`` for a
    NIC the XML puts under a CPU with no PCI device, such as a VM's ``eth0``);
    ``nic_gpus``: NIC name → the GPU indexes it serves; ``skipped``: what the XML
    holds that could not be used, each with its reason (said by the importer).
    """

    gpus: Mapping[int, str]
    nics: Mapping[str, str]
    nic_gpus: Mapping[str, tuple[int, ...]]
    skipped: tuple[str, ...] = ()


def load_nccl_topology(path: str | Path, nic_prefix: str = "mlx5_") -> NcclLocality:
    """Read GPU ↔ NIC locality from an NCCL topology XML (``<system><cpu><pci>...``).

    GPUs (class 0x0302) and NICs (0x0207 InfiniBand, 0x0200 Ethernet) under the
    same PCIe switch are local to each other.  When a switch holds as many NICs
    as GPUs they pair one to one in bus-id order (as NCCL pairs them);
    otherwise each NIC serves every GPU on its switch.  A GPU is also any PCI
    device holding a ``<gpu>`` element (a dump's, whatever its class).  NICs are
    named by their ``<nic><net name=...>`` where the XML says it (a dump, one NIC
    per net: a two-port adapter is two), else ``<nic_prefix><n>`` in bus-id
    order; a GPU behind no NIC's switch is served
    by the NICs of its CPU (NUMA node).  A ``<nic>`` directly under a ``<cpu>``
    (no PCI device: a VM's virtual NIC, ``<net name="eth0">``) is a NIC of that
    CPU named by its ``<net>``, with no bus id; one that cannot be named is listed
    in :attr:`NcclLocality.skipped`, never dropped silently.
    """
    source = str(path)
    try:
        root = ET.parse(path).getroot()
    except (OSError, ET.ParseError) as exc:
        raise TopologyError(f"{source}: not a readable NCCL topology XML: {exc}", source=source) from None
    if root.tag != "system":
        hint = (": an NCCL graph file (NCCL_GRAPH_FILE, ring and tree channels), not the topology file "
                "(NCCL_TOPO_FILE, or NCCL_TOPO_DUMP_FILE's output)") if root.tag == "graphs" else ""
        raise TopologyError(f"{source}: expected a <system> root element (got <{root.tag}>){hint}", source=source)
    # (gpu bus ids, nic bus ids) per PCIe switch, and per CPU for the fallback.
    groups: list[tuple[list[str], list[str]]] = []
    cpu_groups: list[tuple[list[str], list[str]]] = []

    def classify(el: ET.Element) -> str | None:
        cls = el.get("class", "")
        if cls.startswith(_GPU_CLASS) or el.find("gpu") is not None:  # a dump says <gpu dev=...> whatever the class
            return "gpu"
        if cls.startswith(_NIC_CLASSES) or el.find("nic") is not None:
            return "nic"
        return None

    skipped: list[str] = []
    cpu_nics: dict[str, str] = {}  # key in a CPU group → the NIC's name, for NICs with no PCI device
    for cpu in root.iter("cpu"):
        cg: tuple[list[str], list[str]] = ([], [])
        for nic in cpu.findall("nic"):
            nets = nic.findall("net") or [nic]
            for net in nets:
                name = net.get("name", "")
                if not name:
                    skipped.append(f"{source}: <nic> under <cpu numaid={cpu.get('numaid')!r}> has no <net name=...>: "
                                   "no name to match it by, skipped")
                    continue
                key = f"cpu:{name}"
                if key in cpu_nics:
                    skipped.append(f"{source}: <net name={name!r}> appears twice, the second skipped")
                    continue
                cpu_nics[key] = name
                cg[1].append(key)
        for sw in cpu.findall("pci"):
            leaves = [el for el in sw.iter("pci") if el is not sw]
            group: tuple[list[str], list[str]] = ([], [])
            for el in (leaves or [sw]):
                kind = classify(el)
                if kind == "gpu":
                    group[0].append(el.get("busid", ""))
                elif kind == "nic":
                    group[1].append(el.get("busid", ""))
            groups.append(group)
            cg[0].extend(group[0])
            cg[1].extend(group[1])
        cpu_groups.append(cg)
    all_gpus = sorted(b for g, _ in groups for b in g)
    all_nics = sorted(b for _, n in groups for b in n)
    if not all_gpus:
        raise TopologyError(f"{source}: expected GPUs (pci class 0x0302...) in the topology (found none)",
                            source=source)
    gpu_index = {b: i for i, b in enumerate(all_gpus)}
    # A dump (NCCL_TOPO_DUMP_FILE) names each NIC's ports: <pci><nic><net name="mlx5_7"/>; the names follow the
    # kernel's order, not the bus order (IBM's H100 VSI: mlx5_7 is on the lowest bus).  Unnamed NICs (a
    # hand-written NCCL_TOPO_FILE) are <nic_prefix><n> in bus order.
    net_names: dict[str, list[str]] = {}
    for el in root.iter("pci"):
        names = [n.get("name", "") for n in el.findall("nic/net")]
        if el.get("busid", "") in all_nics and names and all(names):
            net_names[el.get("busid", "")] = names
    taken = {n for names in net_names.values() for n in names}
    unnamed = iter(f"{nic_prefix}{i}" for i in range(len(all_nics) + len(taken)) if f"{nic_prefix}{i}" not in taken)
    nic_names = {b: net_names.get(b) or [next(unnamed)] for b in all_nics}
    nic_name = {b: names[0] for b, names in nic_names.items()}
    for key, name in list(cpu_nics.items()):
        if name in taken or name in nic_name.values():
            skipped.append(f"{source}: <net name={name!r}> under a <cpu> has the name of a PCI NIC, skipped")
            del cpu_nics[key]
            for _, nics in cpu_groups:
                if key in nics:
                    nics.remove(key)
        else:
            nic_name[key] = name
    served: dict[str, set[int]] = defaultdict(set)
    covered: set[int] = set()
    for gpus, nics in groups:
        if not nics or not gpus:
            continue
        gs, ns = sorted(gpus), sorted(nics)
        if len(gs) == len(ns):
            for g, n in zip(gs, ns, strict=True):
                for name in nic_names.get(n, [nic_name[n]]):
                    served[name].add(gpu_index[g])
        else:
            for n in ns:
                for name in nic_names.get(n, [nic_name[n]]):
                    served[name].update(gpu_index[g] for g in gs)
        covered.update(gpu_index[g] for g in gs)
    for gpus, nics in cpu_groups:
        for g in gpus:
            if gpu_index[g] not in covered:
                for n in nics:
                    for name in nic_names.get(n, [nic_name[n]]):
                        served[name].add(gpu_index[g])
    # A two-port adapter NCCL lists as two nets (mlx5_0, mlx5_1 on one bus id) is two NICs of one PCI device.
    bus_of = {**{name: b for b in all_nics for name in nic_names[b]}, **{name: "" for name in cpu_nics.values()}}
    return NcclLocality(
        gpus={i: b for b, i in gpu_index.items()},
        nics=bus_of,
        nic_gpus={n: tuple(sorted(served.get(n, ()))) for n in bus_of},
        skipped=tuple(skipped))


def add_nccl_node(topo: Topology, node: str, locality: NcclLocality, leaf: str | Mapping[str, str] | None = None,
                  rack: str | None = None, mounts: Mapping[str, str] | None = None) -> None:
    """Add host ``node`` with the GPUs and NICs of ``locality``; ``leaf`` is one leaf or NIC name → leaf."""
    nics = [Nic(node, n, leaf.get(n) if isinstance(leaf, Mapping) else leaf, locality.nic_gpus[n])
            for n in locality.nics]
    topo.add_node(node, sorted(locality.gpus), nics, rack, mounts)
