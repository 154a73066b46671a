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
    3. A starting leaf is really a core switch that carries a few hosts (a subnet manager or UFM
       host cabled to a core director) when it is cabled more to switches than to HCAs and its
       switches join groups of spines that no leaf joins.  Leaves are taken most hosts first; each
       one's switches join one group (a pod: a leaf is cabled to the spines of its own pod only, in
       a 2-tier fabric to every spine).  A switch whose switches already belong to two or more
       groups spans pods, which only a switch above the spines does.  Without this step such a
       core is a leaf, its spines look like its uplinks and every other core looks like a spine's.
    4. The rest by hop distance from the leaves: one hop is a spine, two or more a core switch
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
    leaves -= _cores_carrying_hosts(leaves, neighbours, ca_cables)
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


def _cores_carrying_hosts(leaves: set[str], neighbours: Mapping[str, Mapping[str, int]],
                          ca_cables: Mapping[str, int]) -> set[str]:
    """The starting leaves that are core switches carrying a few hosts (step 3 of :func:`switch_tiers`)."""
    group: dict[str, str] = {}  # switch -> a representative of its group of spines (union-find)

    def root(s: str) -> str:
        while group[s] != s:
            group[s] = group[group[s]]
            s = group[s]
        return s

    cores: set[str] = set()
    for s in sorted(leaves, key=lambda s: (-ca_cables.get(s, 0), s)):
        peers = sorted(p for p in neighbours.get(s, {}) if p not in leaves)
        seen = {root(p) for p in peers if p in group}
        if len(seen) >= 2 and sum(neighbours[s].values()) > ca_cables.get(s, 0):
            cores.add(s)
            continue
        for p in peers:
            group.setdefault(p, p)
        for p in peers[1:]:
            group[root(p)] = root(peers[0])
    return cores  # never every leaf: the first one taken sees no group yet


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


# The other shapes of the same facts operators have at hand: ``ibnetdiscover -p`` (one line per port) and
# ``iblinkinfo`` (its default form, a header per node then its ports, and ``-l``, one line per port).
_IB_PORTS_LINE = re.compile(
    r"^(?P<type>SW|CA|RT)\s+(?P<lid>\d+)\s+(?P<port>\d+)\s+(?P<guid>0x[0-9a-fA-F]+)\s+(?P<width>\S+)\s+(?P<speed>\S+)"
    r"(?:\s+-\s+(?P<ptype>SW|CA|RT)\s+(?P<plid>\d+)\s+(?P<pport>\d+)\s+(?P<pguid>0x[0-9a-fA-F]+)\s+"
    r"\(\s*'(?P<desc>[^']*)'\s+-\s+'(?P<pdesc>[^']*)'\s*\)|\s+(?![\s-])'?(?P<odesc>.*?)'?)\s*$")
_LINK_HEADER = re.compile(r"^(?P<type>Switch|CA|Router):\s+(?:(?P<guid>0x[0-9a-fA-F]+)\s+)?(?P<desc>.*):\s*$")
_LINK_PORT = re.compile(
    r'^\s*(?:(?P<guid>0x[0-9a-fA-F]+)\s+(?:"(?P<ldesc>[^"]*)"\s+)?)?(?P<lid>\d+)\s+(?P<port>\d+)\[[^\]]*\]\s*'
    r"==\((?P<link>[^)]*)\)(?:\s*\([^)]*\))?==>\s*"
    r'(?:(?:(?P<pguid>0x[0-9a-fA-F]+)\s+)?(?P<plid>\d+)\s+(?P<pport>\d+)\[[^\]]*\]\s+"(?P<pdesc>[^"]*)"'
    r'|\[[^\]]*\]\s+""|"Port not available")')


@dataclass
class _LinkPort:
    """One iblinkinfo port line: its node's type (None with ``-l``), header line, GUID, description."""

    line: int
    type: str | None
    header: int | None
    guid: str | None
    desc: str
    match: re.Match[str]
    switch: bool = False
    node: str | None = None  # S-/H-<guid> once known


@dataclass
class IbDump:
    """A fabric's switches, HCAs and cables as one of the InfiniBand tools printed them (:func:`parse_ib_links`).

    ``switches`` and ``hcas`` map ``S-``/``H-<guid>`` to (node description, line); ``problems`` are
    ``file:line: why`` for lines that could not be read, each line said once.
    """

    format: str
    switches: dict[str, tuple[str, int]] = field(default_factory=dict)
    hcas: dict[str, tuple[str, int]] = field(default_factory=dict)
    cables: list[IbCable] = field(default_factory=list)
    problems: list[str] = field(default_factory=list)


def ib_dump_format(lines: Sequence[str]) -> str:
    """``"ibnetdiscover"`` (the default dump), ``"ibnetdiscover -p"`` or ``"iblinkinfo"``, by the first lines.

    Operators paste whichever they have under one name; the loaders read any of the three.
    """
    for raw in lines[:200]:
        line = raw.strip()
        if _IB_PORTS_LINE.match(line):
            return "ibnetdiscover -p"
        if _LINK_HEADER.match(line) or "==(" in line:
            return "iblinkinfo"
        if _IB_NODE.match(line):
            return "ibnetdiscover"
    return "ibnetdiscover"


#: What a dump of each format without a single switch is told (a file of another format, or a cut one).
_NO_SWITCH = {
    "ibnetdiscover": "expected an ibnetdiscover dump with 'Switch' blocks (found none)",
    "ibnetdiscover -p": "expected 'ibnetdiscover -p' lines of switch ports ('SW ...', or a CA cabled to one; "
                        "found none)",
    "iblinkinfo": "expected iblinkinfo output with a switch ('Switch:' headers, or ports cabled to one; found none)",
}


def _guid_id(kind: str, guid: str) -> str:
    return f"{kind}-{int(guid, 16):016x}"


def parse_ib_links(lines: Sequence[str], source: str, fmt: str) -> IbDump:
    """The switches, HCAs and cables of an ``ibnetdiscover -p`` or ``iblinkinfo`` output (``fmt``).

    ``ibnetdiscover -p`` names both ends of each port by node GUID and type (``SW``/``CA``): each
    cable is read from either end, so a dump cut to the CA lines (``grep CA``) still cables the hosts.
    ``iblinkinfo`` names a switch by its GUID in its ``Switch:`` header and each cable's far end by
    LID: a far end whose LID is a switch's is that switch, any other an HCA port (its port GUID where
    the dump lists that CA; ``H-lid<N>`` when ``--switches-only`` hid it).  ``-l`` prints no node
    types: a GUID on more than one line, or on a port above 2, is a switch.  Down ports and ports with
    no far end are skipped silently, as they are no cable; a line that is none of these is a problem.
    """
    dump = IbDump(fmt)
    if fmt == "ibnetdiscover -p":
        for lineno, raw in enumerate(lines, 1):
            line = raw.strip()
            if not line or line.startswith("#"):
                continue
            m = _IB_PORTS_LINE.match(line)
            if m is None:
                dump.problems.append(f"{source}:{lineno}: expected an 'ibnetdiscover -p' port line 'SW|CA <lid> "
                                     f"<port> 0x<guid> <width> <speed> - ...' (got {line[:60]!r})")
                continue
            kind = "S" if m.group("type") == "SW" else "H" if m.group("type") == "CA" else None
            if kind is None:
                continue  # a router: no host, no switch of the tree
            me = _guid_id(kind, m.group("guid"))
            nodes = dump.switches if kind == "S" else dump.hcas
            desc = (m.group("desc") if m.group("ptype") else m.group("odesc")) or ""
            nodes.setdefault(me, (desc.strip(), lineno))
            if not m.group("ptype") or m.group("ptype") == "RT":
                continue
            pkind = "S" if m.group("ptype") == "SW" else "H"
            peer = _guid_id(pkind, m.group("pguid"))
            (dump.switches if pkind == "S" else dump.hcas).setdefault(peer, (m.group("pdesc").strip(), lineno))
            if kind == "S":
                dump.cables.append(IbCable(me, int(m.group("port")), peer, int(m.group("pport")), lineno))
            elif pkind == "S":
                dump.cables.append(IbCable(peer, int(m.group("pport")), me, int(m.group("port")), lineno))
        return dump
    # iblinkinfo: first every port line with its node (from the header above it, or its own GUID with -l).
    ports: list[_LinkPort] = []
    header: tuple[int, str, str | None, str] | None = None  # (line, type, GUID, description)
    for lineno, raw in enumerate(lines, 1):
        line = raw.rstrip()
        if not line.strip() or line.lstrip().startswith("#"):
            continue
        h = _LINK_HEADER.match(line.strip())
        if h:
            header = (lineno, h.group("type"), h.group("guid"), h.group("desc").strip())
            continue
        m = _LINK_PORT.match(line)
        if m is None:
            dump.problems.append(f"{source}:{lineno}: expected an iblinkinfo port line '<lid> <port>[ ] ==( ... )==> "
                                 f"<lid> <port>[ ] \"<desc>\"' or a 'Switch:'/'CA:' header (got {line.strip()[:60]!r})")
        elif m.group("ldesc") is not None:  # -l: the node is on the line itself
            ports.append(_LinkPort(lineno, None, None, m.group("guid"), m.group("ldesc").strip(), m))
        elif header is None:
            dump.problems.append(f"{source}:{lineno}: port line before any 'Switch:' or 'CA:' header "
                                 f"(got {line.strip()[:60]!r})")
        else:
            ports.append(_LinkPort(lineno, header[1], header[0], header[2] if header[1] == "Switch"
                                   else m.group("guid"), header[3], m))
    on_lines = Counter(lp.guid.lower() for lp in ports if lp.type is None and lp.guid)
    switch_lid: dict[int, str] = {}
    ca_lid: dict[int, tuple[str, str]] = {}  # LID -> (H-id, port GUID)
    header_ca: dict[int, str] = {}  # a CA header's line -> its H-id (from its first port's GUID)
    last_ca: tuple[str, str, set[int]] | None = None  # -l: (H-id, description, ports) of the CA on the lines above
    for lp in ports:
        port = int(lp.match.group("port"))
        if lp.guid is None:
            dump.problems.append(f"{source}:{lp.line}: port line without its GUID "
                                 f"(got {lp.match.group(0).strip()[:60]!r})")
            continue
        lp.switch = (lp.type == "Switch") if lp.type is not None else (on_lines[lp.guid.lower()] > 1 or port > 2)
        if lp.type == "Router":
            continue
        if lp.switch:
            lp.node = _guid_id("S", lp.guid)
            dump.switches.setdefault(lp.node, (lp.desc, lp.line))
            switch_lid[int(lp.match.group("lid"))] = lp.node
            continue
        if lp.header is not None:  # one CA header, one HCA, however many ports it lists
            lp.node = header_ca.setdefault(lp.header, _guid_id("H", lp.guid))
        elif last_ca is not None and last_ca[1] == lp.desc and port not in last_ca[2]:
            lp.node = last_ca[0]  # -l: the next port of the HCA on the line above
        else:
            lp.node = _guid_id("H", lp.guid)
        dump.hcas.setdefault(lp.node, (lp.desc, lp.line))
        ca_lid[int(lp.match.group("lid"))] = (lp.node, f"{int(lp.guid, 16):016x}")
        last_ca = (lp.node, lp.desc, (last_ca[2] if last_ca and last_ca[0] == lp.node else set()) | {port})
    # Then each cable: the far end by its GUID where -l prints it, else by its LID.
    ca_port = {g: h for h, g in ca_lid.values()}
    for lp in ports:
        m = lp.match
        if lp.node is None or m.group("plid") is None:
            continue  # a router's port, a port down or with no far end: no cable
        plid, pport, pdesc = int(m.group("plid")), int(m.group("pport")), m.group("pdesc").strip()
        pg = f"{int(m.group('pguid'), 16):016x}" if m.group("pguid") else None
        peer_guid: str | None = None
        if pg is not None and f"S-{pg}" in dump.switches:
            peer = f"S-{pg}"
        elif pg is not None and pg in ca_port:
            peer, peer_guid = ca_port[pg], pg
        elif pg is not None:  # a far end the output does not list (--cas-only, --switches-only)
            peer = f"S-{pg}" if not lp.switch else f"H-{pg}"
            peer_guid = None if not lp.switch else pg
            (dump.switches if not lp.switch else dump.hcas).setdefault(peer, (pdesc, lp.line))
        elif plid in switch_lid:
            peer = switch_lid[plid]
        elif plid in ca_lid:
            peer, peer_guid = ca_lid[plid]
        else:  # --switches-only: an HCA port known by its LID alone
            peer = f"H-lid{plid}"
            dump.hcas.setdefault(peer, (pdesc, lp.line))
            ca_lid[plid] = (peer, "")
        if lp.switch:
            dump.cables.append(IbCable(lp.node, int(m.group("port")), peer, pport, lp.line, peer_guid or None))
        elif peer.startswith("S-"):
            dump.cables.append(IbCable(peer, pport, lp.node, int(m.group("port")), lp.line,
                                       f"{int(lp.guid, 16):016x}" if lp.guid else None))
    return dump


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
    fmt = ib_dump_format(lines)
    if fmt != "ibnetdiscover":  # `ibnetdiscover -p` or iblinkinfo: the same facts, another layout
        dump = parse_ib_links(lines, source, fmt)
        switches = {g: d for g, (d, _line) in dump.switches.items()}
        hcas = {g: d for g, (d, _line) in dump.hcas.items()}
        cables, problems, lines = dump.cables, dump.problems, []
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
        raise TopologyError(f"{source}: {_NO_SWITCH[fmt]}", source=source)
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

    Keeps the width of zero-padded ranges (``gpu[001-010,015]``) and expands every bracket group of a
    name (``rack[1-2]-node[01-04]``: eight names, rack by rack), as Slurm does.  Raises ``ValueError``
    saying what is wrong (unbalanced brackets, a range that is no numbers, one that runs backwards or
    names more than :data:`MAX_HOSTLIST` hosts); callers add the file and line.
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
        out.extend(_expand_name(part, expr))
        if len(out) > MAX_HOSTLIST:
            raise ValueError(f"hostlist {expr!r} names more than {MAX_HOSTLIST} hosts")
    return out


#: The most hosts one hostlist is expanded to: ``node[0-999999999]`` (a typo) must not take the process's memory.
MAX_HOSTLIST = 1_000_000


def _expand_name(part: str, expr: str) -> list[str]:
    m = re.fullmatch(r"([^\[\]]*)\[([^\[\]]*)\](.*)", part)
    if not m:
        if "[" in part or "]" in part:
            raise ValueError(f"hostlist {expr!r}: unbalanced brackets in {part!r}")
        return [part]
    prefix, body, rest = m.groups()
    tails = _expand_name(rest, expr) if rest else [""]
    out: list[str] = []
    for rng in body.split(","):
        a, sep, b = (x.strip() for x in rng.partition("-"))
        if not a.isdigit() or (sep and not b.isdigit()):
            raise ValueError(f"hostlist {expr!r}: expected N or N-M in [{body}] (got {rng.strip()!r})")
        if sep and int(b) < int(a):
            raise ValueError(f"hostlist {expr!r}: range {rng.strip()!r} runs backwards")
        if (int(b) - int(a) if sep else 0) * len(tails) > MAX_HOSTLIST:
            raise ValueError(f"hostlist {expr!r} names more than {MAX_HOSTLIST} hosts")
        width = len(a) if a.startswith("0") else 0
        for i in range(int(a), int(b if sep else a) + 1):
            out.extend(f"{prefix}{i:0{width}d}{tail}" for tail in tails)
    return out


def slurm_lines(lines: Sequence[str]) -> list[tuple[int, str]]:
    """(first line number, text) of each logical line of a Slurm config file, comments cut.

    Slurm's parser cuts ``#`` comments and joins a line ending in ``\\`` with the next (a long
    ``Nodes=`` list written over several lines); read line by line, the rest of such a list was a
    bad line and its first part a host named ``gpu[001-004,\\``.
    """
    out: list[tuple[int, str]] = []
    pending: tuple[int, str] | None = None
    for lineno, raw in enumerate(lines, 1):
        text = raw.split("#", 1)[0].rstrip()
        if pending is not None:
            lineno, text = pending[0], pending[1] + text.lstrip()
            pending = None
        if text.endswith("\\"):
            pending = (lineno, text[:-1])
            continue
        if text.strip():
            out.append((lineno, text.strip()))
    if pending is not None and pending[1].strip():
        out.append((pending[0], pending[1].strip()))
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
    for lineno, line in slurm_lines(lines):
        fields: dict[str, str] = {}
        for tok in line.split():
            k, sep, v = tok.partition("=")
            if not sep:
                problems.append(f"{source}:{lineno}: expected KEY=VALUE (got {tok!r})")
                continue
            fields[k.lower()] = v  # Slurm's keys are case-insensitive (switchname=, NODES=)
        try:
            if "switchname" in fields:
                sw = fields["switchname"]
                if "nodes" in fields:
                    leaf_nodes[sw] = expand_hostlist(fields["nodes"])
                if "switches" in fields:
                    children[sw] = expand_hostlist(fields["switches"])
                if "nodes" not in fields and "switches" not in fields:
                    problems.append(f"{source}:{lineno}: SwitchName={sw}: expected Nodes= or Switches=")
            elif "blockname" in fields:
                if "nodes" not in fields:
                    problems.append(f"{source}:{lineno}: BlockName={fields['blockname']}: expected Nodes=")
                else:
                    blocks[fields["blockname"]] = expand_hostlist(fields["nodes"])
        except ValueError as exc:
            problems.append(f"{source}:{lineno}: {exc}")
            continue
        if not {"switchname", "blockname"} & set(fields) and not set(fields) <= {"blocksizes", "linkspeed"}:
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
            # A dump nests bridges (cpu > root port > PCIe switch > devices): the switch a device hangs from is
            # its locality, not the root port, else every NIC under one root serves every GPU there.
            parent = {c: b for b in sw.iter("pci") for c in b.findall("pci")}
            under: dict[int, tuple[list[str], list[str]]] = defaultdict(lambda: ([], []))
            for el in (leaves or [sw]):
                kind = classify(el)
                if kind is not None:
                    bucket = under[id(parent.get(el, sw))]
                    (group[0] if kind == "gpu" else group[1]).append(el.get("busid", ""))
                    (bucket[0] if kind == "gpu" else bucket[1]).append(el.get("busid", ""))
            if len(under) > 1 and all(n for g, n in under.values() if g):
                groups.extend(under.values())  # every GPU's own switch holds a NIC: pair within switches
            else:
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
