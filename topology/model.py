"""The cluster topology: racks, switches, hosts, GPUs, NICs, storage pools, and the jobs placed on them.

A :class:`Topology` wraps an ``nx.Graph`` whose vertices carry a ``kind``
attribute (:data:`KINDS`) and whose edges carry a ``link`` attribute
(:data:`LINKS`).  Vertex ids are the human-readable names that appear in a
topology path, so a path can be printed as it is:

===========  =======================  ===========================================
kind         id                       attributes
===========  =======================  ===========================================
``rack``     ``rack-02``
``switch``   ``leaf-02``              ``tier``: ``leaf``, ``spine`` or ``core``
``node``     ``node-07``              ``rack`` (or None)
``gpu``      ``node-07 gpu 4``        ``node``, ``index``
``nic``      ``node-07 mlx5_1``       ``node``, ``name``, ``leaf``, ``gpus`` (PCIe-local GPU indexes),
                                     ``guids``, ``pci``, ``aliases`` (its identity in other sources)
``pool``     ``scratch``              ``type`` (``nfs``, ``lustre``...)
===========  =======================  ===========================================

A host is often named differently by different sources: ``node01`` by Slurm,
``node01.cluster.local`` by Kubernetes, a fabric dump or an agent whose
``socket.gethostname()`` is the FQDN; or by names not related at all (``gpu-a1`` to the
scheduler, ``ip-10-0-1-5`` to the agent, ``node01-ib`` in the fabric), which the cluster file
declares as the host's ``aliases``.  :meth:`Topology.canonical_node` gives the topology's own
name for any of them when that is unambiguous (:class:`NodeNames`); placements and the
engine's telemetry path resolve every node name through it.

Jobs are not part of the graph: the engine places and removes them as placement
messages arrive (:meth:`Topology.place_job`, :meth:`Topology.apply_placement`).
Every mutation bumps :attr:`Topology.version`; the per-query caches are keyed on
it, so the engine may call any query once per window without paying twice.

This module imports only the standard library and networkx (never faust,
aiokafka, slack_sdk or pynvml).
"""

from __future__ import annotations

import difflib
import re
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from types import MappingProxyType
from typing import Any, Callable, Hashable, Iterable, Mapping, Sequence, TypeVar

import natsort
import networkx as nx
from whywait.topology.errors import TopologyError, UnknownEntityError

_T = TypeVar("_T")

KINDS: tuple[str, ...] = ("rack", "switch", "node", "gpu", "nic", "pool")
TIERS: tuple[str, ...] = ("leaf", "spine", "core")
#: The most GPUs one machine is read as having (the largest hold a few dozen).  A count beyond it is refused
#: where it is read (a cluster file's ``gpus: N``, a placement's, a pod's, Kubernetes capacity): numbering
#: GPUs 0..N-1 for a typo of 10**9 would take the process's memory.
MAX_GPUS_PER_NODE = 1024
LINKS: tuple[str, ...] = ("nic-leaf", "switch-uplink", "node-rack", "switch-rack", "gpu-node", "nic-node",
                          "mount")

# natsort's key, not a hand-rolled regex split: it also orders names that mix digits and signs, dots or
# unicode digits consistently, and it is maintained.  ``node-2`` sorts before ``node-10``.
_NATURAL = natsort.natsort_keygen()


def natural_key(name: str) -> tuple[Any, ...]:
    """Sort key that orders ``node-2`` before ``node-10``; used for every listing the topology returns."""
    return tuple(_NATURAL(name))


def _sorted(names: Iterable[str]) -> tuple[str, ...]:
    return tuple(sorted(names, key=natural_key))


# A GPU as users and labels write it: "node-07/gpu4", "node-07/gpu 4", "node-07 gpu4".
_GPU_SPELLING = re.compile(r"(\S+?)(?:/| )gpu ?(\d+)")


def gpu_id(node: str, gpu: int) -> str:
    """Return the graph id of GPU ``gpu`` on ``node`` (``"node-07 gpu 4"``)."""
    return f"{node} gpu {gpu}"


def nic_id(node: str, nic: str) -> str:
    """Return the graph id of NIC ``nic`` on ``node`` (``"node-07 mlx5_1"``)."""
    return f"{node} {nic}"


@dataclass(frozen=True)
class Nic:
    """One network adapter (or IB port) of a host.

    ``leaf`` is the leaf switch its cable goes to (None when the fabric is not
    described); ``gpus`` the GPU indexes it serves by PCIe locality (the GPUs
    whose traffic *should* leave through it).
    """

    node: str
    name: str
    leaf: str | None
    gpus: tuple[int, ...] = ()
    # The adapter's identity across sources: the same HCA is ``HCA-1`` in a fabric dump, ``mlx5_0`` to
    # the agent and a PCI address in NCCL's XML.  GUIDs (node and port, 16 lower-case hex digits) and
    # the PCI bus id are what they share; other names are aliases.  See :meth:`Topology.resolve_nic`.
    guids: tuple[str, ...] = ()
    pci: str | None = None
    aliases: tuple[str, ...] = ()

    @property
    def id(self) -> str:
        """The graph id, ``"<node> <name>"``."""
        return nic_id(self.node, self.name)


_GUID_HEX = re.compile(r"[^0-9a-f]")


def normalise_guid(guid: str) -> str | None:
    """``0xE09D7303008594C4``, ``e09d:7303:0085:94c4`` or ``H-e09d7303008594c4`` → ``e09d7303008594c4``.

    Returns None when the text holds no 64-bit GUID.  Called on every GUID a source gives, so that
    a fabric dump, sysfs and an NCCL XML compare equal.
    """
    text = guid.strip().lower()
    for prefix in ("h-", "s-", "0x"):
        if text.startswith(prefix):
            text = text[len(prefix):]
    digits = _GUID_HEX.sub("", text)
    if len(digits) != 16 or int(digits, 16) == 0:
        return None
    return digits


def normalise_pci(addr: str) -> str | None:
    """``00000000:83:00.0`` (NVML), ``0000:83:00.0`` or ``83:00.0`` → ``0000:83:00.0``; None if not a PCI address."""
    m = re.fullmatch(r"(?:([0-9a-fA-F]{1,8}):)?([0-9a-fA-F]{2}):([0-9a-fA-F]{2})\.([0-7])", addr.strip())
    if m is None:
        return None
    dom = int(m.group(1) or "0", 16)
    return f"{dom:04x}:{m.group(2).lower()}:{m.group(3).lower()}.{m.group(4)}"


# ---------------------------------------------------------------------------------------------- node names

_IPV4 = re.compile(r"\d{1,3}(?:\.\d{1,3}){3}")
# Distinct unknown names whose match (and suggestions) one topology remembers: telemetry names a few
# dozen hosts, but a producer can invent names without end, and the memo must not grow with them.
_NODE_MEMO_MAX = 4096
# Jobs whose newest placement time is kept after they finished (a late, older placement is then ignored).
_PLACED_AT_MAX = 20_000
# Distinct unknown names a topology looks for similar host names for (difflib: up to milliseconds each).
_SIMILAR_MAX = 256


def short_name(host: str) -> str:
    """A host name up to its first dot: ``node01.cluster.local`` → ``node01``.

    An IPv4 address is its own short name (``10.0.0.1`` is not host ``10``), and so is a name that
    starts with a dot.  A trailing dot (a rooted DNS name) is ignored.
    """
    name = host.rstrip(".")
    if _IPV4.fullmatch(name):
        return name
    return name.split(".", 1)[0] or name


@dataclass(frozen=True)
class NodeMatch:
    """Which host of the topology a name from another source means (:meth:`Topology.match_node`).

    ``node`` is the topology's own name for it, or None.  ``how``: ``exact``; ``alias`` (one of the
    host's declared ``aliases``); ``case`` (the same name, or an alias, in other letters' case, as DNS
    names are); ``short`` (one name is the other's short name, an alias's as a host's:
    ``node01`` and ``node01.cluster.local``); empty when nothing matched.  ``ambiguous`` lists the
    hosts that share the name's short name when there are several (``node01.a`` and ``node01.b``
    for ``node01``): the name is then none of them, since it could be either.
    """

    node: str | None
    how: str = ""
    ambiguous: tuple[str, ...] = ()


class NodeNames:
    """An index of host names that says which host a name given by another source means.

    One machine is ``node01`` to Slurm, ``node01.cluster.local`` to Kubernetes or in a fabric dump's
    node description, and either to an agent (``socket.gethostname()`` is the FQDN on some
    distributions).  A name matches a host when it is the host's name, the same name in another
    case, or when one of the two is the other's short name and no other host has that short name.
    Two full names never match each other (``node01.a`` is not ``node01.b``).  A host's ``aliases``
    (``alias -> host``: names a source gives it that are not related by domain, ``ip-10-0-1-5`` for
    ``gpu-a1``) match exactly as its own name does.  Built by :class:`Topology` when its hosts change.
    """

    def __init__(self, hosts: Iterable[str], aliases: Mapping[str, str] | None = None) -> None:
        self.hosts = frozenset(hosts)
        self.aliases: Mapping[str, str] = dict(aliases or {})
        self._lower: dict[str, list[str]] = {}
        self._short: dict[str, list[str]] = {}
        # the host of every name the index knows (its own, its aliases): what the short-name rules compare
        self._names: dict[str, str] = {h: h for h in self.hosts}
        self._names.update((a, h) for a, h in self.aliases.items() if h in self.hosts)
        # for :meth:`similar`, built at its first call: lower-case names, the same without padding zeros, pieces
        self._keys: dict[str, list[str]] | None = None
        self._unpadded: dict[str, list[str]] = {}
        self._grams: dict[str, list[str]] | None = None
        # keys -> the names (a host's or an alias) that have them; one host per name, in natural order
        self._short_names: dict[str, list[str]] = {}
        for n in _sorted(self._names):
            host = self._names[n]
            _add_once(self._lower.setdefault(n.rstrip(".").lower(), []), host)
            _add_once(self._short.setdefault(short_name(n).lower(), []), host)
            self._short_names.setdefault(short_name(n).lower(), []).append(n)

    def match(self, name: str) -> NodeMatch:
        """The host ``name`` means (see the class), or why none."""
        if name in self.hosts:
            return NodeMatch(name, "exact")
        if name in self.aliases and self.aliases[name] in self.hosts:
            return NodeMatch(self.aliases[name], "alias")
        key = name.rstrip(".").lower()
        same = self._lower.get(key)
        if same:
            return NodeMatch(same[0], "case") if len(same) == 1 else NodeMatch(None, "", tuple(same))
        short = short_name(key)
        found = self._short.get(short, ())
        # A short name may be any host of that short name; a full one only the host named short (two full
        # names of one short name are two domains' hosts).
        if short != key and not any(short_name(n).lower() == n.rstrip(".").lower()
                                    for n in self._short_names.get(short, ())):
            return NodeMatch(None)
        if len(found) == 1:
            return NodeMatch(found[0], "short")
        return NodeMatch(None, "", tuple(found))

    def similar(self, name: str, n: int = 3) -> tuple[str, ...]:
        """Up to ``n`` hosts whose name (or short name) is close to ``name``'s, closest first.

        A name equal but for the zeros its numbers are padded with (``node-7`` for ``node-07``) comes
        first; then difflib's ratio (at least 0.6), ties in natural order.  Of a large cluster's names only
        the few sharing the most three-letter pieces with ``name`` are compared, so that a name costs
        milliseconds, not a second, with 10,000 hosts.
        """
        if self._keys is None:
            self._keys = {}
            for known, h in self._names.items():
                for k in {known.rstrip(".").lower(), short_name(known).lower()}:
                    _add_once(self._keys.setdefault(k, []), h)
            self._unpadded = {}
            for k, hosts in self._keys.items():
                self._unpadded.setdefault(_unpad(k), []).extend(hosts)
        key = name.rstrip(".").lower()
        probes = tuple(dict.fromkeys((key, short_name(key))))
        scored: dict[str, tuple[float, tuple[Any, ...]]] = {}

        def note(hosts: Iterable[str], score: float) -> None:
            for h in hosts:
                if h not in scored or scored[h][0] < score:
                    scored[h] = (score, natural_key(h))

        matcher = difflib.SequenceMatcher()
        for probe in probes:
            note(self._unpadded.get(_unpad(probe), ()), 2.0)
            matcher.set_seq2(probe)
            for k in self._candidates(probe):
                matcher.set_seq1(k)
                if matcher.real_quick_ratio() >= 0.6 and matcher.quick_ratio() >= 0.6:
                    score = matcher.ratio()
                    if score >= 0.6:
                        note(self._keys[k], score)
        return tuple(sorted(scored, key=lambda h: (-scored[h][0], scored[h][1])))[:n]

    def _candidates(self, probe: str, limit: int = 200) -> Iterable[str]:
        """The names :meth:`similar` compares with ``probe``: all of a small cluster's, else the ``limit``
        that share the most three-letter pieces with it (an index built at the first call)."""
        assert self._keys is not None
        if len(self._keys) <= limit:
            return self._keys
        if self._grams is None:
            self._grams = {}
            for k in self._keys:
                for g in _trigrams(k):
                    self._grams.setdefault(g, []).append(k)
        shared: Counter[str] = Counter()
        for g in _trigrams(probe):
            shared.update(self._grams.get(g, ()))
        return [k for k, _ in shared.most_common(limit)]


def _add_once(hosts: list[str], host: str) -> None:
    if host not in hosts:
        hosts.append(host)


def _trigrams(text: str) -> set[str]:
    padded = f"  {text} "
    return {padded[i:i + 3] for i in range(len(padded) - 2)}


_DIGITS = re.compile(r"\d+")


def _unpad(name: str) -> str:
    """``node-007`` → ``node-7``: a name with its numbers' padding zeros dropped."""
    return _DIGITS.sub(lambda m: str(int(m.group())), name)


def node_name_groups(names: Sequence[str]) -> tuple[dict[str, str], list[tuple[str, tuple[str, ...]]]]:
    """Which of ``names`` (from several sources, in the order of trust) are one host, and under which name.

    Names one of which is the other's short name (``node01``, ``node01.cluster.local``), or that
    differ in case only, are one host, named as the first of them in ``names``.  When two full
    names share a short name (``node01.a``, ``node01.b``) they are two hosts, and the bare short
    name is kept apart as a host of its own: it could be either.  Returns ``name -> host`` for every
    name, and ``(bare name, the full names it could be)`` for each name kept apart so.
    """
    groups: dict[str, list[str]] = {}
    for n in dict.fromkeys(names):
        groups.setdefault(short_name(n).lower(), []).append(n)
    out: dict[str, str] = {}
    apart: list[tuple[str, tuple[str, ...]]] = []
    for short, group in groups.items():
        full: dict[str, list[str]] = {}  # a full name in lower case -> its spellings, in order
        bare: list[str] = []
        for n in group:
            low = n.rstrip(".").lower()
            if low == short:
                bare.append(n)
            else:
                full.setdefault(low, []).append(n)
        if len(full) <= 1:
            for n in group:
                out[n] = group[0]
            continue
        for spellings in full.values():
            for n in spellings:
                out[n] = spellings[0]
        for n in bare:
            out[n] = bare[0]
        if bare:
            apart.append((bare[0], tuple(s[0] for s in full.values())))
    return out, apart


@dataclass(frozen=True)
class Mount:
    """A host's mount of a storage pool: ``device`` is how the host's storage reports name it."""

    node: str
    pool: str
    device: str


@dataclass(frozen=True)
class JobInfo:
    """A placed job: who owns it and where each rank runs.

    ``ranks`` maps rank → ``(node, gpu)``; ``nodes`` lists the job's nodes in the
    order of their lowest rank.  Returned by :meth:`Topology.job` and friends;
    immutable, so callers may keep it across windows.
    """

    job: str
    project: str
    team: str
    channel: str | None
    ranks: Mapping[int, tuple[str, int]] = field(hash=False, compare=True)
    nodes: tuple[str, ...] = ()
    # rank -> its parallel coordinates (``dp``, ``pp``, ``tp``, ``cp``, ``ep``) where the placement
    # gives them, and its ``gpu_share`` when it has only part of a GPU.  Empty for v1 placements.
    coords: Mapping[int, Mapping[str, float]] = field(default_factory=dict, hash=False, compare=False)
    # The name its users know it by, when the id is not that (Slurm's --job-name for slurm-777); None if none.
    name: str | None = field(default=None, hash=False, compare=False)

    @property
    def world_size(self) -> int:
        """Number of ranks."""
        return len(self.ranks)


# The per-rank fields of a placement that place a rank in the job's parallel layout (agents.events).
PARALLEL_COORDS: tuple[str, ...] = ("dp", "pp", "tp", "cp", "ep", "gpu_share")


class Topology:
    """A cluster's physical topology plus the jobs currently placed on it.

    Build one with :meth:`from_yaml` / :meth:`from_dict`, a real-format loader
    (:mod:`whywait.topology.loaders`), or the ``add_*`` methods.  Queries raise
    :class:`UnknownEntityError` for ids the topology does not hold.
    """

    def __init__(self, name: str = "") -> None:
        self.name = name
        self.graph: nx.Graph = nx.Graph()
        self.version = 0
        self._hosts: dict[str, _Host] = {}
        self._switches: dict[str, str] = {}  # id -> tier
        self._uplinks: dict[str, list[str]] = {}
        self._switch_rack: dict[str, str | None] = {}
        self._racks: list[str] = []
        self._pools: dict[str, str] = {}  # id -> type
        self._jobs: dict[str, JobInfo] = {}
        # job -> event time of the newest placement applied (finished ones too, the newest _PLACED_AT_MAX):
        # an older one arriving later (a hook's spool sent after the job's epilog) must not place it again.
        self._placed_at: dict[str, float] = {}
        self._cache: dict[Any, Any] = {}
        # What the import could not match to anything (an agent's NIC the fabric does not show...),
        # kept in the cluster file so that `check`, `show` and the engine's start list it.
        self.unmatched: tuple[str, ...] = ()
        # Node names other sources use (see :class:`NodeNames`): the index is built when first needed after
        # the hosts change (not at every placement, which bumps the version); each distinct name that is not
        # a host's own is matched once (bounded: names can be invented).
        self._names: NodeNames | None = None
        self._aliases: dict[str, str] = {}  # a host's other name (``aliases`` in the cluster file) -> the host
        self._node_memo: dict[str, str | None] = {}
        self._unknown_memo: dict[str, str] = {}
        self._similar_left = _SIMILAR_MAX

    # ------------------------------------------------------------------ mutation

    def _bump(self) -> None:
        self.version += 1
        self._cache.clear()

    def _check_new(self, entity: str) -> None:
        if entity in self.graph:
            raise TopologyError(f"duplicate id {entity!r}: already a {self.graph.nodes[entity]['kind']}",
                                source="topology")
        if entity in self._aliases:
            raise TopologyError(f"duplicate id {entity!r}: already an alias of node {self._aliases[entity]!r}",
                                source="topology")

    def alias_clash(self, node: str, alias: str) -> str | None:
        """Why ``alias`` cannot be another name of host ``node`` (named so in the reason), or None when it can.

        An alias is unique in the topology: it is no id (a host's, a switch's...), no other host's short
        name and no other alias, in any letters' case.  Checked by :meth:`add_node` and by the cluster
        file's schema (which says where each host is declared).
        """
        key = alias.rstrip(".").lower()
        if not key:
            return f"alias {alias!r} of node {node!r} is not a host name"
        if alias in self.graph and self.graph.nodes[alias]["kind"] != "node":
            return f"alias {alias!r} of node {node!r} is already a {self.graph.nodes[alias]['kind']}'s id"
        for h in self._hosts:
            if h != node and key in (h.rstrip(".").lower(), short_name(h).lower()):
                what = "name" if key == h.rstrip(".").lower() else "short name"
                return f"alias {alias!r} of node {node!r} is the {what} of node {h!r}"
        for a, h in self._aliases.items():
            if a.rstrip(".").lower() == key:
                return f"alias {alias!r} of node {node!r} is already an alias of node {h!r}"
        if key in (node.rstrip(".").lower(), short_name(node).lower()):
            return f"alias {alias!r} of node {node!r} is that node's own name"
        return None

    def add_rack(self, rack: str) -> None:
        """Add a rack.  Called while building a topology; bumps :attr:`version`."""
        self._check_new(rack)
        self.graph.add_node(rack, kind="rack")
        self._racks.append(rack)
        self._bump()

    def add_switch(self, switch: str, tier: str = "leaf", uplinks: Sequence[str] = (),
                   rack: str | None = None) -> None:
        """Add a switch of ``tier`` (``leaf``/``spine``/``core``) wired to already-added ``uplinks``.

        Called while building a topology; bumps :attr:`version`.
        """
        if tier not in TIERS:
            raise TopologyError(f"switch {switch!r}: tier must be one of {', '.join(TIERS)} (got {tier!r})",
                                source="topology")
        self._check_new(switch)
        for up in uplinks:
            self._require(up, "switch")
        if rack is not None:
            self._require(rack, "rack")
        self.graph.add_node(switch, kind="switch", tier=tier)
        self._switches[switch] = tier
        self._uplinks[switch] = list(uplinks)
        self._switch_rack[switch] = rack
        for up in uplinks:
            self.graph.add_edge(switch, up, link="switch-uplink")
        if rack is not None:
            self.graph.add_edge(switch, rack, link="switch-rack")
        self._bump()

    def add_uplink(self, switch: str, uplink: str) -> None:
        """Wire ``switch`` to a higher-tier ``uplink`` after both exist (used by loaders); bumps the version."""
        self._require(switch, "switch")
        self._require(uplink, "switch")
        if uplink not in self._uplinks[switch]:
            self._uplinks[switch].append(uplink)
            self.graph.add_edge(switch, uplink, link="switch-uplink")
            self._bump()

    def add_pool(self, pool: str, type_: str = "nfs") -> None:
        """Add a storage pool (a file system many hosts mount).  Bumps :attr:`version`."""
        self._check_new(pool)
        self.graph.add_node(pool, kind="pool", type=type_)
        self._pools[pool] = type_
        self._bump()

    def add_node(self, node: str, gpus: int | Sequence[int] = 0, nics: Sequence[Nic | Mapping[str, Any]] = (),
                 rack: str | None = None, mounts: Mapping[str, str] | None = None,
                 gpu_pci: Mapping[int, str] | None = None, node_type: str | None = None,
                 aliases: Sequence[str] = ()) -> None:
        """Add a host with its GPUs, NICs (the first is the primary one) and pool mounts.

        ``gpus`` is a count (indexes 0..n-1) or the indexes; each NIC is a
        :class:`Nic` or a mapping with ``name``, ``leaf`` and ``gpus``;
        ``mounts`` maps pool id → device name; ``gpu_pci`` GPU index → PCI bus
        id; ``node_type`` the declared node type it was built from; ``aliases`` the host's
        other names, which resolve as its own (:meth:`canonical_node`; refused when one
        clashes: :meth:`alias_clash`).  Bumps :attr:`version`.
        """
        self._check_new(node)
        key = node.rstrip(".").lower()
        for a, h in self._aliases.items():
            if a.rstrip(".").lower() in (key, short_name(node).lower()):
                raise TopologyError(f"node {node!r}: its name (or short name) is already an alias of node {h!r}",
                                    source="topology")
        alias_list = tuple(dict.fromkeys(aliases))
        if len(alias_list) != len(aliases):
            raise TopologyError(f"node {node!r}: an alias is given twice ({list(aliases)})", source="topology")
        for a in alias_list:
            why = self.alias_clash(node, a)
            if why is not None:
                raise TopologyError(why, source="topology")
        folded = [a.rstrip(".").lower() for a in alias_list]
        if len(set(folded)) != len(folded):
            raise TopologyError(f"node {node!r}: an alias is given twice ({list(aliases)})", source="topology")
        indexes = tuple(range(gpus)) if isinstance(gpus, int) else tuple(gpus)
        for g in (gpu_pci or {}):
            if g not in indexes:
                raise TopologyError(f"node {node!r}: a PCI bus id is given for GPU {g}, which the node lacks "
                                    f"(GPUs: {list(indexes)})", source="topology")
        if rack is not None:
            self._require(rack, "rack")
        nic_objs: list[Nic] = []
        for n in nics:
            nic = n if isinstance(n, Nic) else Nic(node, str(n["name"]), n.get("leaf"),
                                                      tuple(n.get("gpus", ())), tuple(n.get("guids", ())),
                                                      n.get("pci"), tuple(n.get("aliases", ())))
            if nic.node != node:
                nic = Nic(node, nic.name, nic.leaf, nic.gpus, nic.guids, nic.pci, nic.aliases)
            if nic.leaf is not None:
                self._require(nic.leaf, "switch")
            for g in nic.gpus:
                if g not in indexes:
                    raise TopologyError(f"node {node!r}: NIC {nic.name!r} serves GPU {g}, which the node "
                                        f"lacks (GPUs: {list(indexes)})", source="topology")
            nic_objs.append(nic)
        for pool in (mounts or {}):
            self._require(pool, "pool")
        self.graph.add_node(node, kind="node", rack=rack)
        if rack is not None:
            self.graph.add_edge(node, rack, link="node-rack")
        for g in indexes:
            gid = gpu_id(node, g)
            self.graph.add_node(gid, kind="gpu", node=node, index=g)
            self.graph.add_edge(gid, node, link="gpu-node")
        for nic in nic_objs:
            self.graph.add_node(nic.id, kind="nic", node=node, name=nic.name, leaf=nic.leaf, gpus=nic.gpus,
                                guids=nic.guids, pci=nic.pci, aliases=nic.aliases)
            self.graph.add_edge(nic.id, node, link="nic-node")
            if nic.leaf is not None:
                self.graph.add_edge(nic.id, nic.leaf, link="nic-leaf")
        mount_objs = tuple(Mount(node, p, d) for p, d in (mounts or {}).items())
        for m in mount_objs:
            self.graph.add_edge(node, m.pool, link="mount", device=m.device)
        self._hosts[node] = _Host(node, rack, indexes, tuple(nic_objs), mount_objs, dict(gpu_pci or {}), node_type,
                                  alias_list)
        for a in alias_list:
            self._aliases[a] = node
        self._names = None
        self._node_memo.clear()
        self._unknown_memo.clear()
        self._similar_left = _SIMILAR_MAX
        self._bump()

    def place_job(self, job: str, project: str, team: str, channel: str | None,
                  ranks: Mapping[int, tuple[str, int]],
                  coords: Mapping[int, Mapping[str, float]] | None = None, name: str | None = None) -> JobInfo:
        """Place (or re-place) ``job``: ``ranks`` maps rank → ``(node, gpu)``.

        Called by the engine for each ``running`` placement message; replaces any
        earlier placement of the same job.  Every node and GPU must exist
        (:class:`UnknownEntityError` otherwise); a node may be named as another source names
        it (``node01.cluster.local`` for ``node01``: :meth:`canonical_node`), and the job is
        stored under the topology's names.  Bumps :attr:`version` and
        returns the stored :class:`JobInfo`.
        """
        clean: dict[int, tuple[str, int]] = {}
        for rank in sorted(ranks):
            given, gpu = ranks[rank]
            # The scheduler's name for the host may not be the topology's (node01 / node01.cluster.local)
            node = self.canonical_node(given)
            if node is None:
                raise UnknownEntityError("node", given, self.node_hint(given))
            host = self._hosts[node]
            if gpu not in host.gpus:
                raise UnknownEntityError("gpu", gpu_id(node, gpu),
                                         f"job {job!r} rank {rank}; {node} has GPUs {list(host.gpus)}")
            clean[int(rank)] = (node, int(gpu))
        order: list[str] = []
        for rank in sorted(clean):
            if clean[rank][0] not in order:
                order.append(clean[rank][0])
        info = JobInfo(job, project, team, channel, MappingProxyType(clean), tuple(order),
                       MappingProxyType({int(r): MappingProxyType(dict(c)) for r, c in (coords or {}).items()
                                         if c}), name or None)
        self._jobs[job] = info
        self._bump()
        return info

    def remove_job(self, job: str) -> JobInfo | None:
        """Forget ``job`` (a ``finished`` placement); returns what was removed, None if it was unknown."""
        info = self._jobs.pop(job, None)
        if info is not None:
            self._bump()
        return info

    def apply_placement(self, msg: Mapping[str, Any]) -> JobInfo | None:
        """Apply one decoded ``placement`` message (see ``whywait.agents.events``): place or remove its job.

        Returns the placed job, or None when the message finished one.  A placement older (by its event
        time) than one already applied for the job changes nothing: a spooled ``running`` sent after the
        job's ``finished`` would otherwise place a finished job again, for ever.
        """
        job, t = str(msg["job"]), msg.get("time")
        if isinstance(t, (int, float)) and not isinstance(t, bool):
            last = self._placed_at.get(job)
            if last is not None and t < last:
                return self._jobs.get(job)
            self._placed_at.pop(job, None)  # re-inserted last: the entries are oldest first
            self._placed_at[job] = float(t)
            if len(self._placed_at) > _PLACED_AT_MAX * 5 // 4:
                # Forget the oldest finished jobs (amortised); a running job's time is kept whatever its age.
                finished = [j for j in self._placed_at if j not in self._jobs]
                for j in finished[: len(self._placed_at) - _PLACED_AT_MAX]:
                    del self._placed_at[j]
        if msg.get("state") == "finished":
            self.remove_job(str(msg["job"]))
            return None
        ranks = {int(r["rank"]): (str(r["node"]), int(r["gpu"])) for r in msg["ranks"]}
        coords = {int(r["rank"]): {k: r[k] for k in PARALLEL_COORDS if r.get(k) is not None}
                  for r in msg["ranks"]}
        name = msg.get("name")
        return self.place_job(str(msg["job"]), str(msg["project"]), str(msg["team"]),
                              msg.get("slack_channel"), ranks, coords,
                              name if isinstance(name, str) and name != msg["job"] else None)

    # ------------------------------------------------------------------ lookups

    def _require(self, entity: str, kind: str) -> None:
        attrs = self.graph.nodes.get(entity)
        if attrs is None or attrs["kind"] != kind:
            raise UnknownEntityError(kind, entity, self._known_hint(kind))

    def _known_hint(self, kind: str) -> str:
        names = self.nodes() if kind == "node" else _sorted(n for n, a in self.graph.nodes(data=True)
                                                             if a["kind"] == kind)
        if not names:
            return f"the topology has no {kind}s"
        if len(names) <= 6:
            return "known: " + ", ".join(names)
        return f"known: {names[0]} … {names[-1]}, {len(names)} in all"

    def _host(self, node: str) -> _Host:
        try:
            return self._hosts[node]
        except KeyError:
            raise UnknownEntityError("node", node, self.node_hint(node, similar=False)) from None

    # ------------------------------------------------------------------ node names

    def node_names(self) -> NodeNames:
        """The index of the hosts' names (:class:`NodeNames`), rebuilt after the hosts change."""
        if self._names is None:
            self._names = NodeNames(self._hosts, self._aliases)
        return self._names

    def aliases_of(self, node: str) -> tuple[str, ...]:
        """The host's declared other names (``aliases`` in the cluster file), in the order given."""
        return self._host(node).aliases

    def match_node(self, name: str) -> NodeMatch:
        """Which host ``name`` means, and how it matched (:class:`NodeMatch`; rules in :class:`NodeNames`)."""
        return self.node_names().match(name)

    def canonical_node(self, name: str) -> str | None:
        """The topology's name of the host another source calls ``name`` (``node01.cluster.local`` → ``node01``),
        or None when it holds no such host, or more than one it could be.

        Called for the ``node`` of every telemetry message and every placed rank: the host's own name
        costs a dict lookup; another name is matched once and remembered (bounded).
        """
        if name in self._hosts:
            return name
        try:
            return self._node_memo[name]
        except KeyError:
            pass
        found = self.node_names().match(name).node
        if len(self._node_memo) >= _NODE_MEMO_MAX:
            self._node_memo.pop(next(iter(self._node_memo)))
        self._node_memo[name] = found
        return found

    def node_hint(self, name: str, similar: bool = True) -> str:
        """Why ``name`` names no host, for an error: the hosts it could be, or the hosts the topology holds and,
        with ``similar``, those whose names are close (difflib).  Remembered per name (bounded)."""
        if not similar:
            m = self.match_node(name)
            if not m.ambiguous and m.node is None:
                return self._known_hint("node")
        hint = self._unknown_memo.get(name)
        if hint is None:
            index = self.node_names()
            m = index.match(name)
            if m.ambiguous:
                hint = (f"it could be any of {', '.join(m.ambiguous[:6])}{', …' if len(m.ambiguous) > 6 else ''}, "
                        f"which share its short name {short_name(m.ambiguous[0])!r}")
            elif m.node is not None:
                hint = f"the topology calls it {m.node!r}"
            else:
                # A short list of known hosts names them all; a long one gets the names closest to the mistake,
                # for the first few hundred distinct names (each costs up to milliseconds: invented names in
                # bulk must not stall the engine).
                near: tuple[str, ...] = ()
                if len(index.hosts) > 6 and self._similar_left > 0:
                    self._similar_left -= 1
                    near = index.similar(name)
                hint = self._known_hint("node") + (f"; similar: {', '.join(near)}" if near else "")
            if len(self._unknown_memo) >= _NODE_MEMO_MAX:
                self._unknown_memo.pop(next(iter(self._unknown_memo)))
            self._unknown_memo[name] = hint
        return hint

    def unknown_node_reason(self, name: str) -> str:
        """The reason telemetry from ``name`` is refused, naming what the topology holds instead, and the fix.

        ``'node01.x' is not in the topology (similar names in the topology: node01, node02); give the agent
        the topology's name (whywait agent --node) or add the host to the topology``.  Called by the engine
        when it dead-letters such a message (and by replays, for their note).
        """
        return (f"{name[:80]!r} is not in the topology ({self.node_hint(name)}); give the agent the topology's "
                "name (whywait agent --node NAME) or add the host to the topology")

    def kind_of(self, entity: str) -> str | None:
        """Return the kind (:data:`KINDS`) of a graph id, or None when the topology lacks it."""
        attrs = self.graph.nodes.get(entity)
        return attrs["kind"] if attrs is not None else None

    def tier_of(self, switch: str) -> str:
        """Return ``leaf``, ``spine`` or ``core`` for ``switch``."""
        self._require(switch, "switch")
        return self._switches[switch]

    def _cached(self, key: Hashable, build: Callable[[], _T]) -> _T:
        """The value cached under ``key`` for this :attr:`version`, built by ``build`` the first time."""
        try:
            return self._cache[key]  # type: ignore[no-any-return]  # the cache holds what build() returned
        except KeyError:
            value = self._cache[key] = build()
            return value

    # ------------------------------------------------------------------ physical queries

    def nodes(self) -> tuple[str, ...]:
        """All hosts, naturally sorted."""
        return self._cached("nodes", lambda: _sorted(self._hosts))

    def racks(self) -> tuple[str, ...]:
        """All racks, naturally sorted."""
        return self._cached("racks", lambda: _sorted(self._racks))

    def switches(self, tier: str | None = None) -> tuple[str, ...]:
        """All switches, or those of ``tier``, naturally sorted."""
        return self._cached(("switches", tier), lambda: _sorted(
            s for s, t in self._switches.items() if tier is None or t == tier))

    def pools(self) -> tuple[str, ...]:
        """All storage pools, naturally sorted."""
        return self._cached("pools", lambda: _sorted(self._pools))

    def pool_type(self, pool: str) -> str:
        """The pool's file-system type (``nfs``, ``lustre``...)."""
        self._require(pool, "pool")
        return self._pools[pool]

    def gpus_of(self, node: str) -> tuple[int, ...]:
        """The node's GPU indexes."""
        return self._host(node).gpus

    def nics_of(self, node: str) -> tuple[Nic, ...]:
        """The node's NICs, primary first."""
        return self._host(node).nics

    def nic(self, node: str, name: str) -> Nic:
        """The node's NIC called ``name`` (``mlx5_1``)."""
        for n in self._host(node).nics:
            if n.name == name:
                return n
        raise UnknownEntityError("nic", nic_id(node, name),
                                 f"{node} has {', '.join(n.name for n in self._host(node).nics) or 'no NICs'}")

    def leaf_of(self, node: str) -> str | None:
        """The leaf switch of the node's primary NIC, or None when the node has no cabled NIC."""
        host = self._host(node)
        for n in host.nics:
            if n.leaf is not None:
                return n.leaf
        return None

    def leaves_of(self, node: str) -> tuple[str, ...]:
        """Every leaf switch any of the node's NICs is cabled to (rail-optimised fabrics have several)."""
        return self._cached(("leaves_of", node), lambda: _sorted(
            {n.leaf for n in self._host(node).nics if n.leaf is not None}))

    def uplinks_of(self, switch: str) -> tuple[str, ...]:
        """The switches ``switch`` connects up to."""
        self._require(switch, "switch")
        return _sorted(self._uplinks[switch])

    def spines_of(self, leaf: str) -> tuple[str, ...]:
        """The spine switches a leaf connects up to."""
        return tuple(s for s in self.uplinks_of(leaf) if self._switches[s] == "spine")

    def rack_of(self, node: str) -> str | None:
        """The node's rack, or None when racks are not described."""
        return self._host(node).rack

    def pools_of(self, node: str) -> tuple[str, ...]:
        """The storage pools the node mounts."""
        return _sorted(m.pool for m in self._host(node).mounts)

    def mounts_of(self, node: str) -> tuple[Mount, ...]:
        """The node's pool mounts, each with the device name its storage reports use."""
        return self._host(node).mounts

    def nodes_under(self, entity: str) -> tuple[str, ...]:
        """The hosts below a switch (through any NIC, at any depth), in a rack, or mounting a pool.

        Cached per :attr:`version`: the engine calls this per window.
        """
        return self._cached(("under", entity), lambda: self._nodes_under(entity))

    def _nodes_under(self, entity: str) -> tuple[str, ...]:
        kind = self.kind_of(entity)
        if kind == "rack":
            return _sorted(h.name for h in self._hosts.values() if h.rack == entity)
        if kind == "pool":
            return _sorted(h.name for h in self._hosts.values() if any(m.pool == entity for m in h.mounts))
        if kind != "switch":
            raise UnknownEntityError("switch", entity, self._known_hint("switch"))
        below = {entity}
        frontier = [entity]
        # Walk downwards: a switch is below another when it lists it as an uplink.
        downlinks: dict[str, list[str]] = self._cached("downlinks", self._downlinks)
        while frontier:
            s = frontier.pop()
            for d in downlinks.get(s, ()):
                if d not in below:
                    below.add(d)
                    frontier.append(d)
        return _sorted(h.name for h in self._hosts.values() if any(n.leaf in below for n in h.nics))

    def _downlinks(self) -> dict[str, list[str]]:
        down: dict[str, list[str]] = {}
        for s, ups in self._uplinks.items():
            for u in ups:
                down.setdefault(u, []).append(s)
        return down

    def expected_nic(self, node: str, gpu: int) -> str | None:
        """Name of the NIC that serves ``gpu`` by PCIe locality (its traffic should leave there), or None."""
        host = self._host(node)
        for n in host.nics:
            if gpu in n.gpus:
                return n.name
        return None

    def gpu_pci_of(self, node: str) -> Mapping[int, str]:
        """The node's GPU index → PCI bus id, where a source gave them (empty otherwise; read-only)."""
        return MappingProxyType(self._host(node).gpu_pci)

    def node_type_of(self, node: str) -> str | None:
        """The declared node type the host was built from (``dgx-h100``), or None."""
        return self._host(node).node_type

    def _nic_index(self, node: str) -> dict[str, Nic]:
        """Every key a source may name one of the node's NICs by → that NIC (names, aliases, GUIDs, PCI)."""
        def build() -> dict[str, Nic]:
            index: dict[str, Nic] = {}
            for n in self._host(node).nics:
                for key in (*n.guids, *((n.pci,) if n.pci else ()), *n.aliases, n.name):
                    index[key] = n  # the name last: it wins over another NIC's alias
            return index
        return self._cached(("nic_index", node), build)

    def resolve_nic(self, node: str, reported: str, guid: str | None = None, pci: str | None = None) -> Nic | None:
        """The topology NIC a source (an agent, a fabric dump) calls ``reported``, or None.

        Tried in order of trust: the GUID (node or port), the PCI bus id, then the name itself, its
        aliases, and the name without an IB port suffix (the agent reports ``mlx5_0/1``).  Called by
        the engine for each NIC of each ``net`` message (cached per :attr:`version`).
        """
        hit = self._resolve_ranked(node, reported, guid, pci)
        return hit[0] if hit is not None else None

    def _resolve_ranked(self, node: str, reported: str, guid: str | None, pci: str | None) -> tuple[Nic, int] | None:
        """:meth:`resolve_nic` with how it matched: 0 by GUID, 1 by PCI bus id, 2 by name or alias."""
        index = self._nic_index(node)
        for rank, key in enumerate((normalise_guid(guid) if guid else None, normalise_pci(pci) if pci else None,
                                    reported, reported.split("/", 1)[0])):
            if key and key in index:
                return index[key], min(rank, 2)
        return None

    def canonical_net(self, msg: Mapping[str, Any]) -> Mapping[str, Any]:
        """A ``net`` message whose NIC names are the topology's (an agent's ``mlx5_0/1`` → ``HCA-1``).

        Called by the evaluator before it stores a ``net`` message, so a rule that compares a NIC's
        traffic with :meth:`expected_nic` sees one name per adapter whatever source named it.  NICs
        the topology cannot match, and nodes it does not hold, keep their reported names; of two samples
        of one adapter (its netdev and its RDMA port) only one takes the adapter's name.  Returns
        ``msg`` itself when nothing changes (the usual case: copying a decoded message into a dict
        cost more than storing it), else a new dict; ``msg`` is never modified.
        """
        node = str(msg.get("node", ""))
        if node not in self._hosts or not msg.get("nics"):
            return msg
        given = msg["nics"]
        hits = [self._resolve_ranked(node, str(n["nic"]), n.get("port_guid") or n.get("node_guid"),
                                     n.get("pci_bus_id")) for n in given]
        # One sample per adapter.  A host reports an adapter twice, as its netdev (``ib0``, or the
        # RoCE ``ens1f0np1``) and as its RDMA port (``mlx5_0/1``), with one PCI address; renaming both
        # would store two points a second for one NIC and count a link that is down twice.  The
        # topology's name goes to the best-matched sample (GUID, then PCI, then name; a sample with a
        # GUID, the fabric port whose counters see RDMA traffic, before one without); another sample
        # of the adapter keeps its own name, or is left out when that name is the adapter's.
        best: dict[str, tuple[tuple[int, int, int], int]] = {}
        for i, hit in enumerate(hits):
            if hit is not None:
                n = given[i]
                rank = (hit[1], 0 if (n.get("port_guid") or n.get("node_guid")) else 1, i)
                if hit[0].name not in best or rank < best[hit[0].name][0]:
                    best[hit[0].name] = (rank, i)
        nics = []
        changed = False
        for i, (n, hit) in enumerate(zip(given, hits, strict=True)):
            if hit is None:
                nics.append(n)
            elif best[hit[0].name][1] == i:
                if hit[0].name != n["nic"]:
                    changed = True
                    nics.append({**n, "nic": hit[0].name})
                else:
                    nics.append(n)
            elif n["nic"] in best:
                changed = True  # the adapter's other view, under the adapter's own name: left out
            else:
                nics.append(n)
        return {**msg, "nics": nics} if changed else msg

    def canonical_gpu(self, msg: Mapping[str, Any]) -> Mapping[str, Any]:
        """A ``gpu`` message whose GPU indexes are the topology's, matched by PCI bus id where both have it.

        NVML numbers GPUs in its own order; NCCL's XML and ``CUDA_DEVICE_ORDER=PCI_BUS_ID`` in bus
        order.  When a sample carries ``pci_bus_id`` and the topology knows the node's GPU bus ids,
        the sample takes the index the topology gives that bus id.  Called by the evaluator before
        it stores a ``gpu`` message; anything unmatched keeps its index.  Returns ``msg`` itself when no
        index changes, else a new dict; ``msg`` is never modified.
        """
        node = str(msg.get("node", ""))
        host = self._hosts.get(node)
        if host is None or not host.gpu_pci or not msg.get("gpus"):
            return msg
        by_bus = self._cached(("gpu_by_bus", node), lambda: {b: g for g, b in host.gpu_pci.items()})
        gpus = []
        renamed = False
        for g in msg["gpus"]:
            bus = normalise_pci(str(g.get("pci_bus_id") or ""))
            idx = by_bus.get(bus) if bus else None
            if idx is not None and idx != g.get("gpu"):
                renamed = True
                gpus.append({**g, "gpu": idx})
            else:
                gpus.append(g)
        return {**msg, "gpus": gpus} if renamed else msg

    # ------------------------------------------------------------------ jobs

    def job(self, job: str) -> JobInfo:
        """The placed job ``job``."""
        try:
            return self._jobs[job]
        except KeyError:
            hint = f"placed: {', '.join(sorted(self._jobs))}" if self._jobs else "no job is placed"
            raise UnknownEntityError("job", job, hint) from None

    def has_job(self, job: str) -> bool:
        """Whether ``job`` is placed."""
        return job in self._jobs

    def jobs(self) -> tuple[JobInfo, ...]:
        """Every placed job, sorted by id."""
        return tuple(self._jobs[j] for j in sorted(self._jobs))

    def _by_node(self) -> dict[str, tuple[JobInfo, ...]]:
        out: dict[str, list[JobInfo]] = {}
        for j in sorted(self._jobs):
            for n in self._jobs[j].nodes:
                out.setdefault(n, []).append(self._jobs[j])
        return {n: tuple(v) for n, v in out.items()}

    def jobs_on_node(self, node: str) -> tuple[JobInfo, ...]:
        """The jobs with at least one rank on ``node``."""
        self._host(node)
        return self._cached("by_node", self._by_node).get(node, ())

    def _jobs_on(self, entity: str) -> tuple[JobInfo, ...]:
        by_node = self._cached("by_node", self._by_node)
        seen: dict[str, JobInfo] = {}
        for n in self.nodes_under(entity):
            for j in by_node.get(n, ()):
                seen.setdefault(j.job, j)
        return tuple(seen[j] for j in sorted(seen))

    def jobs_on_switch(self, switch: str) -> tuple[JobInfo, ...]:
        """The jobs with a rank on a host below ``switch``."""
        self._require(switch, "switch")
        return self._cached(("jobs_on", switch), lambda: self._jobs_on(switch))

    def jobs_on_pool(self, pool: str) -> tuple[JobInfo, ...]:
        """The jobs with a rank on a host that mounts ``pool``."""
        self._require(pool, "pool")
        return self._cached(("jobs_on", pool), lambda: self._jobs_on(pool))

    def jobs_on_rack(self, rack: str) -> tuple[JobInfo, ...]:
        """The jobs with a rank on a host in ``rack``."""
        self._require(rack, "rack")
        return self._cached(("jobs_on", rack), lambda: self._jobs_on(rack))

    def ranks_on(self, job: str, node: str) -> tuple[int, ...]:
        """The job's ranks on ``node``, ascending (empty when the job has none there)."""
        return self._cached(("ranks_on", job, node), lambda: tuple(
            r for r, (n, _) in sorted(self.job(job).ranks.items()) if n == node))

    def rank_on(self, job: str, node: str) -> int | None:
        """The job's lowest rank on ``node``, or None."""
        ranks = self.ranks_on(job, node)
        return ranks[0] if ranks else None

    def rank_of(self, job: str, node: str, gpu: int) -> int | None:
        """The job's rank on ``node``'s GPU ``gpu``, or None."""
        for r, where in self.job(job).ranks.items():
            if where == (node, gpu):
                return r
        return None

    def placement_of(self, job: str, rank: int) -> tuple[str, int]:
        """``(node, gpu)`` of the job's ``rank``."""
        try:
            return self.job(job).ranks[rank]
        except KeyError:
            raise UnknownEntityError("rank", f"{job} rank {rank}",
                                     f"world size {self.job(job).world_size}") from None

    # ------------------------------------------------------------------ paths and shared components

    def _spine_hop(self, leaf: str) -> str | None:
        spines = self.spines_of(leaf)
        if not spines:
            return None
        if len(spines) <= 3:
            return ", ".join(spines)
        return f"{spines[0]}, {spines[1]}, … ({len(spines)} spines)"

    def path_for_node(self, node: str) -> tuple[str, ...]:
        """Human-readable hops from the node up to its rack: node, primary NIC, leaf, spine(s), rack."""
        return self._cached(("path_node", node), lambda: self._path(node, None))

    def _path(self, node: str, nic_name: str | None) -> tuple[str, ...]:
        host = self._host(node)
        hops: list[str] = [node]
        nic = next((n for n in host.nics if n.name == nic_name), None) if nic_name else None
        if nic is None and host.nics:
            nic = next((n for n in host.nics if n.leaf is not None), host.nics[0])
        if nic is not None:
            hops.append(nic.id)
            if nic.leaf is not None:
                hops.append(nic.leaf)
                spine = self._spine_hop(nic.leaf)
                if spine:
                    hops.append(spine)
        if host.rack:
            hops.append(host.rack)
        return tuple(hops)

    def path_for_rank(self, job: str, rank: int) -> tuple[str, ...]:
        """Human-readable hops from a rank to its rack, through the NIC local to its GPU.

        ``("job train-llm rank 12", "node-07 gpu 4", "node-07", "node-07 mlx5_1", "leaf-02", "spine-01",
        "rack-02")``; a leaf with more than three spines shows as ``"spine-01, spine-02, … (8 spines)"``.
        """
        def build() -> tuple[str, ...]:
            node, gpu = self.placement_of(job, rank)
            return (f"job {job} rank {rank}", gpu_id(node, gpu)) + self._path(node, self.expected_nic(node, gpu))
        return self._cached(("path_rank", job, rank), build)

    def entity_id(self, text: str) -> str:
        """The graph id a user means by ``text``: the id itself, or a GPU written ``node-07/gpu4`` (the
        spelling of diagnoses' ``gpu`` label and of the README) for ``"node-07 gpu 4"``, with the node as
        any source names it (``node-07.cluster.local``: :meth:`canonical_node`).  Text that names
        nothing is returned unchanged, for the caller's own "unknown" error.
        """
        if text in self.graph:
            return text
        m = _GPU_SPELLING.fullmatch(text.strip())
        if m:
            node = self.canonical_node(m.group(1)) or m.group(1)
            if gpu_id(node, int(m.group(2))) in self.graph:
                return gpu_id(node, int(m.group(2)))
        return self.canonical_node(text) or text

    def path_between(self, a: str, b: str) -> tuple[str, ...]:
        """Graph ids from ``a`` to ``b`` (each a GPU, ``"node-07 gpu 4"`` or ``node-07/gpu4``, or a node),
        as traffic goes.

        A GPU leaves its node through its PCIe-local NIC (the primary NIC for a node, or a
        GPU no NIC serves); two NICs on one leaf meet there, otherwise the path climbs the
        switch tree by the fewest hops.  Two GPUs of one node meet at the node (NVLink or
        PCIe).  Called by ``whywait topology path``; raises :class:`UnknownEntityError`
        for an unknown id and :class:`TopologyError` when the fabric does not connect them.
        """
        a, b = self.entity_id(a), self.entity_id(b)

        def side(entity: str) -> tuple[list[str], str, Nic | None]:
            kind = self.kind_of(entity)
            if kind == "gpu":
                attrs = self.graph.nodes[entity]
                node, gpu = attrs["node"], attrs["index"]
                want = self.expected_nic(node, gpu)
                host = self._host(node)
                nic = next((n for n in host.nics if n.name == want), None) or next(
                    (n for n in host.nics if n.leaf is not None), None)
                return [entity, node], node, nic
            if kind == "node":
                host = self._host(entity)
                return [entity], entity, next((n for n in host.nics if n.leaf is not None), None)
            m = _GPU_SPELLING.fullmatch(entity.strip())
            if m and m.group(1) in self._hosts:  # the node is known, that GPU is not
                have = self.gpus_of(m.group(1))
                raise UnknownEntityError("gpu", entity, f"{m.group(1)} has GPUs {', '.join(map(str, have))}" if have
                                         else f"no source gave {m.group(1)} any GPUs")
            raise UnknownEntityError("gpu or node", entity, "a GPU is '<node>/gpu<index>' or '<node> gpu <index>'; "
                                     + self._known_hint("node"))

        hops_a, node_a, nic_a = side(a)
        hops_b, node_b, nic_b = side(b)
        if node_a == node_b:
            return tuple(hops_a + [h for h in reversed(hops_b) if h not in hops_a])
        if nic_a is None or nic_b is None or nic_a.leaf is None or nic_b.leaf is None:
            missing = node_a if nic_a is None or nic_a.leaf is None else node_b
            raise TopologyError(f"no path from {a!r} to {b!r}: {missing} has no NIC cabled to a switch",
                                source="topology")
        switches = self.graph.subgraph(self._switches)
        try:
            middle = nx.shortest_path(switches, nic_a.leaf, nic_b.leaf)
        except nx.NetworkXNoPath:
            raise TopologyError(f"no path from {a!r} to {b!r}: {nic_a.leaf} and {nic_b.leaf} are not connected",
                                source="topology") from None
        return tuple(hops_a + [nic_a.id] + list(middle) + [nic_b.id] + list(reversed(hops_b)))

    def common_switch(self, nodes: Iterable[str]) -> str | None:
        """The lowest switch every one of ``nodes`` sits below (via primary NICs), or None.

        A shared leaf wins over a shared spine, a spine over a core; ties go to
        the naturally first id.
        """
        nodes = list(nodes)
        if not nodes:
            return None
        leaves = {self.leaf_of(n) for n in nodes}
        if None in leaves:
            return None
        if len(leaves) == 1:
            return next(iter(leaves))
        level: set[str] = set(leaves)  # type: ignore[arg-type]
        for _ in TIERS[1:]:
            ups = [set(self._uplinks[s]) for s in level]
            # Each lower switch reaches the tier above through its own uplinks; the common one is in all.
            common = set.intersection(*ups) if ups else set()
            if common:
                return _sorted(common)[0]
            level = set().union(*ups)
            if not level:
                return None
        return None

    def common_rack(self, nodes: Iterable[str]) -> str | None:
        """The rack all ``nodes`` share, or None."""
        racks = {self.rack_of(n) for n in nodes}
        return racks.pop() if len(racks) == 1 else None

    def common_pool(self, nodes: Iterable[str]) -> str | None:
        """A storage pool every one of ``nodes`` mounts (naturally first if several), or None."""
        sets = [set(self.pools_of(n)) for n in nodes]
        common = set.intersection(*sets) if sets else set()
        return _sorted(common)[0] if common else None

    def other_jobs_sharing(self, job: str, entity: str, include_same_project: bool = False) -> list[JobInfo]:
        """Other jobs on the same switch, pool, rack or node as ``job``: candidates for contention.

        By default only jobs of *another* project are returned (the case a team
        cannot see for itself); ``include_same_project`` adds the team's own.
        """
        me = self.job(job)
        kind = self.kind_of(entity)
        if kind == "switch":
            found = self.jobs_on_switch(entity)
        elif kind == "pool":
            found = self.jobs_on_pool(entity)
        elif kind == "rack":
            found = self.jobs_on_rack(entity)
        elif kind == "node":
            found = self.jobs_on_node(entity)
        else:
            raise UnknownEntityError("switch or pool", entity, self._known_hint("switch"))
        return [j for j in found if j.job != job and (include_same_project or j.project != me.project)]

    # ------------------------------------------------------------------ serialisation

    @classmethod
    def from_dict(cls, data: Any, source: str = "<dict>", lines: Mapping[str, int] | None = None) -> Topology:
        """Build a topology from the documented mapping (``docs/topology.md``).

        Called by :meth:`from_yaml` and by tests.  Every problem is collected and
        raised together as one :class:`TopologyError` naming ``source``, the line
        (when ``lines`` maps key paths to lines) and the key path.
        """
        from whywait.topology.schema import parse_topology
        return parse_topology(data, source, lines or {})

    @classmethod
    def from_yaml(cls, path: str | Path) -> Topology:
        """Load a topology YAML file; raises :class:`TopologyError` naming the file, line and key path."""
        from whywait.topology.schema import load_yaml
        return load_yaml(path)

    def to_dict(self, include_jobs: bool = True) -> dict[str, Any]:
        """Return the documented mapping; :meth:`from_dict` of it rebuilds an equal topology."""
        out: dict[str, Any] = {"format": 1}
        if self.name:
            out["name"] = self.name
        out["racks"] = [{"id": r} for r in self._racks]
        # Uplinks must be declared before use: emit higher tiers first.
        out["switches"] = [
            {"id": s, "tier": self._switches[s],
             **({"uplinks": list(self._uplinks[s])} if self._uplinks[s] else {}),
             **({"rack": self._switch_rack[s]} if self._switch_rack[s] else {})}
            for tier in reversed(TIERS) for s in self._switches if self._switches[s] == tier]
        out["storage_pools"] = [{"id": p, "type": t} for p, t in self._pools.items()]
        nodes = []
        for h in self._hosts.values():
            d: dict[str, Any] = {"id": h.name}
            if h.aliases:
                d["aliases"] = list(h.aliases)
            if h.rack:
                d["rack"] = h.rack
            if h.node_type:
                d["type"] = h.node_type
            d["gpus"] = list(h.gpus)
            if h.gpu_pci:
                d["gpu_pci"] = {g: h.gpu_pci[g] for g in sorted(h.gpu_pci)}
            d["nics"] = [{"name": n.name, **({"leaf": n.leaf} if n.leaf else {}), "gpus": list(n.gpus),
                          **({"aliases": list(n.aliases)} if n.aliases else {}),
                          **({"guids": list(n.guids)} if n.guids else {}),
                          **({"pci": n.pci} if n.pci else {})}
                         for n in h.nics]
            if h.mounts:
                d["mounts"] = [{"pool": m.pool, "device": m.device} for m in h.mounts]
            nodes.append(d)
        out["nodes"] = nodes
        if self.unmatched:
            out["unmatched"] = list(self.unmatched)
        if include_jobs and self._jobs:
            out["jobs"] = [
                {"job": j.job, "project": j.project, "team": j.team,
                 **({"channel": j.channel} if j.channel else {}),
                 "ranks": [{"rank": r, "node": n, "gpu": g} for r, (n, g) in sorted(j.ranks.items())]}
                for j in self.jobs()]
        return out

    def to_yaml(self, path: str | Path, include_jobs: bool = True) -> None:
        """Write :meth:`to_dict` as YAML to ``path``."""
        from whywait.topology.schema import dump_yaml
        Path(path).write_text(dump_yaml(self.to_dict(include_jobs)))

    def __repr__(self) -> str:
        return (f"Topology({self.name or 'unnamed'}: {len(self._hosts)} nodes, {len(self._switches)} switches, "
                f"{len(self._racks)} racks, {len(self._pools)} pools, {len(self._jobs)} jobs, v{self.version})")


@dataclass(frozen=True)
class _Host:
    name: str
    rack: str | None
    gpus: tuple[int, ...]
    nics: tuple[Nic, ...]
    mounts: tuple[Mount, ...]
    gpu_pci: Mapping[int, str] = field(default_factory=dict)
    node_type: str | None = None
    aliases: tuple[str, ...] = ()


def node_name_in(topology: Any, node: str) -> str | None:
    """The name ``topology`` gives the host a message calls ``node`` (``node01.cluster.local`` → ``node01``, see
    :meth:`Topology.canonical_node`), or None when it holds no such host.

    Called per telemetry message by the stream processor and by replay, which must agree on what a known
    node is.  A topology that cannot say (None, or a stub without nodes) takes every name as it is.
    """
    canonical = getattr(topology, "canonical_node", None)
    if canonical is not None:
        return canonical(node)  # type: ignore[no-any-return]
    kind_of = getattr(topology, "kind_of", None)
    return node if kind_of is None or kind_of(node) == "node" else None
