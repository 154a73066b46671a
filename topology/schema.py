"""The topology YAML format (``docs/topology.md``): strict parsing with every problem reported at once.

Called through :meth:`whywait.topology.model.Topology.from_yaml` / ``from_dict``.  Each
problem names the file, the line (for YAML files), the key path, and what was
expected against what was found::

    topo.yaml:14: nodes[2].nics[0].leaf: expected a switch of tier 'leaf' (got 'leaf-09')
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Mapping

import yaml
from whywait.topology.errors import TopologyError
from whywait.topology.model import (
    MAX_GPUS_PER_NODE,
    TIERS,
    Nic,
    Topology,
    normalise_guid,
    normalise_pci,
    short_name,
)

from whywait import yamlio
from whywait.errors import YamlError

FORMAT = 1

_TOP_KEYS = {"format", "name", "racks", "switches", "storage_pools", "nodes", "jobs", "unmatched"}
_RACK_KEYS = {"id"}
_SWITCH_KEYS = {"id", "tier", "uplinks", "rack"}
_POOL_KEYS = {"id", "type"}
_NODE_KEYS = {"id", "aliases", "rack", "type", "gpus", "gpu_pci", "nics", "mounts"}
_NIC_KEYS = {"name", "leaf", "gpus", "aliases", "guids", "pci"}
_MOUNT_KEYS = {"pool", "device"}
_JOB_KEYS = {"job", "project", "team", "channel", "ranks"}
_RANK_KEYS = {"rank", "node", "gpu"}


class _Problems:
    """Collects problems with their location; raises them together."""

    def __init__(self, source: str, lines: Mapping[str, int]) -> None:
        self.source = source
        self.lines = lines
        self.items: list[tuple[int, str]] = []

    def add(self, path: str, expected: str, got: Any = None, *, raw: str | None = None) -> None:
        line = self.lines.get(path)
        # Fall back to the nearest enclosing key that has a line (a missing key has none of its own).
        probe = path
        while line is None and probe:
            probe = probe.rsplit(".", 1)[0] if "." in probe else (probe.rsplit("[", 1)[0] if "[" in probe else "")
            line = self.lines.get(probe)
        where = f"{self.source}:{line}" if line else self.source
        text = raw if raw is not None else f"expected {expected} (got {got!r})"
        self.items.append((line or 0, f"{where}: {path}: {text}" if path else f"{where}: {text}"))

    def raise_if_any(self) -> None:
        if self.items:
            # In file order, whatever order the checks ran in (uplinks are checked after all switches).
            ordered = [text for _, text in sorted(self.items, key=lambda item: item[0])]
            raise TopologyError(ordered, source=self.source)


def _str(v: Any) -> bool:
    return isinstance(v, str) and bool(v)


def _int(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _check_keys(obj: Any, allowed: set[str], required: set[str], path: str, p: _Problems) -> bool:
    if not isinstance(obj, dict):
        p.add(path, "a mapping", obj)
        return False
    for k in obj:
        if k not in allowed:
            p.add(f"{path}.{k}", "", raw=f"unknown key (valid: {', '.join(sorted(allowed))})")
    for k in sorted(required):
        if k not in obj:
            p.add(f"{path}.{k}", "", raw="is required")
    return True


def _list(data: Mapping[str, Any], key: str, p: _Problems) -> list[Any]:
    v = data.get(key, [])
    if v is None:
        return []
    if not isinstance(v, list):
        p.add(key, "a list", v)
        return []
    return v


def parse_topology(data: Any, source: str = "<dict>", lines: Mapping[str, int] | None = None) -> Topology:
    """Build a :class:`Topology` from the documented mapping, or raise every problem in one TopologyError."""
    p = _Problems(source, lines or {})
    if not isinstance(data, dict):
        p.add("", "", raw=f"expected a mapping at the top level (got {type(data).__name__})")
        p.raise_if_any()
    for k in data:
        if k not in _TOP_KEYS:
            p.add(str(k), "", raw=f"unknown key (valid: {', '.join(sorted(_TOP_KEYS))})")
    fmt = data.get("format", FORMAT)
    if fmt != FORMAT:
        p.add("format", f"{FORMAT}", fmt)
    name = data.get("name", "")
    if name and not _str(name):
        p.add("name", "a string", name)
    topo = Topology(name if _str(name) else "")
    ids: dict[str, str] = {}  # id -> path of its declaration, to report duplicates

    def declare(ident: Any, path: str) -> bool:
        if ident is None:
            return False  # reported as "is required" already
        if not _str(ident):
            p.add(path, "a non-empty string id", ident)
            return False
        if ident in ids:
            p.add(path, "", raw=f"duplicate id {ident!r} (first declared at {ids[ident]})")
            return False
        ids[ident] = path
        return True

    racks: set[str] = set()
    for i, r in enumerate(_list(data, "racks", p)):
        path = f"racks[{i}]"
        if _check_keys(r, _RACK_KEYS, {"id"}, path, p) and declare(r.get("id"), f"{path}.id"):
            topo.add_rack(r["id"])
            racks.add(r["id"])

    switches: dict[str, str] = {}
    refused_switches: set[str] = set()  # declared, but refused for a problem of their own (already reported)
    pending_uplinks: list[tuple[str, str, str]] = []
    for i, s in enumerate(_list(data, "switches", p)):
        path = f"switches[{i}]"
        if not _check_keys(s, _SWITCH_KEYS, {"id", "tier"}, path, p):
            continue
        declared = ok = declare(s.get("id"), f"{path}.id")
        tier = s.get("tier")
        if "tier" in s and tier not in TIERS:
            p.add(f"{path}.tier", "one of " + ", ".join(TIERS), tier)
            ok = False
        rack = s.get("rack")
        if rack is not None and rack not in racks:
            p.add(f"{path}.rack", "a rack declared under 'racks'", rack)
            rack = None
        ups = s.get("uplinks", []) or []
        if not isinstance(ups, list):
            p.add(f"{path}.uplinks", "a list of switch ids", ups)
            ups = []
        if ok and "tier" in s:
            topo.add_switch(s["id"], tier, (), rack)
            switches[s["id"]] = tier
            for j, u in enumerate(ups):
                pending_uplinks.append((s["id"], u, f"{path}.uplinks[{j}]"))
        elif declared:
            refused_switches.add(s["id"])
    for sw, up, path in pending_uplinks:
        if up in refused_switches:
            continue  # its own problem is reported; "not declared" would be a second, wrong one
        if up not in switches:
            p.add(path, "a switch declared under 'switches'", up)
        elif TIERS.index(switches[up]) <= TIERS.index(switches[sw]):
            p.add(path, f"a switch of a tier above {switches[sw]!r}", f"{up} ({switches[up]})")
        else:
            topo.add_uplink(sw, up)

    pools: set[str] = set()
    for i, s in enumerate(_list(data, "storage_pools", p)):
        path = f"storage_pools[{i}]"
        if _check_keys(s, _POOL_KEYS, {"id"}, path, p) and declare(s.get("id"), f"{path}.id"):
            type_ = s.get("type", "nfs")
            if not _str(type_):
                p.add(f"{path}.type", "a string such as 'nfs' or 'lustre'", type_)
                type_ = "nfs"
            topo.add_pool(s["id"], type_)
            pools.add(s["id"])

    refused_nodes: set[str] = set()  # declared, but refused for a problem of their own (already reported)
    node_list = _list(data, "nodes", p)
    # Every host's name and short name (folded as DNS names are) -> (host, where declared), for the aliases:
    # an alias is never another host's name or short name, wherever in the file that host is declared.
    host_keys: dict[str, tuple[str, str, str]] = {}
    for i, n in enumerate(node_list):
        ident = n.get("id") if isinstance(n, dict) else None
        if isinstance(ident, str) and ident:
            for key, what in ((ident.rstrip(".").lower(), "name"), (short_name(ident).lower(), "short name")):
                host_keys.setdefault(key, (ident, f"nodes[{i}].id", what))
    alias_keys: dict[str, tuple[str, str]] = {}  # a folded alias -> (its host, the path it is declared at)

    def where(path: str) -> str:
        line = p.lines.get(path)
        return f"{path}, line {line}" if line else path

    for i, n in enumerate(node_list):
        path = f"nodes[{i}]"
        if not _check_keys(n, _NODE_KEYS, {"id"}, path, p):
            continue
        declared = ok = declare(n.get("id"), f"{path}.id")
        host = n.get("id") if _str(n.get("id")) else "?"
        aliases_raw = n.get("aliases", []) or []
        node_aliases: list[str] = []
        if not isinstance(aliases_raw, list) or not all(_str(a) for a in aliases_raw):
            p.add(f"{path}.aliases", "a list of the host's other names (strings)", aliases_raw)
            ok, aliases_raw = False, []
        for j, a in enumerate(aliases_raw):
            apath = f"{path}.aliases[{j}]"
            key = a.rstrip(".").lower()
            other = host_keys.get(key)
            clash: str | None = None
            if other is not None and other[0] == host:
                clash = f"alias {a!r} of node {host!r} is that node's own {other[2]}"
            elif other is not None:
                clash = f"alias {a!r} of node {host!r} is the {other[2]} of node {other[0]!r} ({where(other[1])})"
            elif key in alias_keys:
                first = alias_keys[key]
                clash = (f"alias {a!r} of node {host!r} is already an alias of node {first[0]!r} "
                         f"({where(first[1])})")
            elif a in ids:
                clash = f"alias {a!r} of node {host!r} is already an id ({where(ids[a])})"
            if clash is not None:
                p.add(apath, "", raw=f"{clash}: an alias is unique in the topology")
                ok = False
            else:
                alias_keys[key] = (host, apath)
                node_aliases.append(a)
        rack = n.get("rack")
        if rack is not None and rack not in racks:
            p.add(f"{path}.rack", "a rack declared under 'racks'", rack)
            ok = False
        gpus_raw = n.get("gpus", 0)
        gpus: tuple[int, ...] = ()
        if _int(gpus_raw) and 0 <= gpus_raw <= MAX_GPUS_PER_NODE:
            gpus = tuple(range(gpus_raw))
        elif isinstance(gpus_raw, list) and len(gpus_raw) <= MAX_GPUS_PER_NODE \
                and all(_int(g) and g >= 0 for g in gpus_raw) and len(set(gpus_raw)) == len(gpus_raw):
            gpus = tuple(gpus_raw)
        else:
            p.add(f"{path}.gpus", f"a GPU count or a list of distinct GPU indexes (at most {MAX_GPUS_PER_NODE})",
                  gpus_raw)
            ok = False
        nics: list[Nic] = []
        nic_list = n.get("nics", []) or []
        if not isinstance(nic_list, list):
            p.add(f"{path}.nics", "a list", nic_list)
            nic_list = []
        seen_nics: set[str] = set()
        for j, c in enumerate(nic_list):
            cpath = f"{path}.nics[{j}]"
            if not _check_keys(c, _NIC_KEYS, {"name"}, cpath, p):
                ok = False
                continue
            cname = c.get("name")
            if not _str(cname) or cname in seen_nics:
                p.add(f"{cpath}.name", "a NIC name unique on the node", cname)
                ok = False
                continue
            seen_nics.add(cname)
            leaf = c.get("leaf")
            if leaf is not None and leaf in refused_switches:
                ok = False  # the switch's own problem is reported already
            elif leaf is not None and switches.get(leaf) != "leaf":
                p.add(f"{cpath}.leaf", "a switch of tier 'leaf' declared under 'switches'", leaf)
                ok = False
            served = c.get("gpus", []) or []
            if not isinstance(served, list) or not all(_int(g) and g in gpus for g in served):
                p.add(f"{cpath}.gpus", f"a list of this node's GPU indexes {list(gpus)}", served)
                ok = False
                continue
            aliases = c.get("aliases", []) or []
            if not isinstance(aliases, list) or not all(_str(a) for a in aliases):
                p.add(f"{cpath}.aliases", "a list of other names of this NIC", aliases)
                ok, aliases = False, []
            guids_raw = c.get("guids", []) or []
            guids = [normalise_guid(g) if isinstance(g, str) else None for g in guids_raw] \
                if isinstance(guids_raw, list) else [None]
            if None in guids:
                p.add(f"{cpath}.guids", "a list of 64-bit GUIDs such as '0xe09d7303008594c4'", guids_raw)
                ok, guids = False, []
            pci_raw = c.get("pci")
            pci = normalise_pci(pci_raw) if isinstance(pci_raw, str) else None
            if pci_raw is not None and pci is None:
                p.add(f"{cpath}.pci", "a PCI bus id such as '0000:83:00.0'", pci_raw)
                ok = False
            nics.append(Nic(str(n.get("id")), cname, leaf, tuple(served), tuple(g for g in guids if g),
                            pci, tuple(aliases)))
        node_type = n.get("type")
        if node_type is not None and not _str(node_type):
            p.add(f"{path}.type", "a node type name such as 'dgx-h100'", node_type)
            ok, node_type = False, None
        gpu_pci: dict[int, str] = {}
        gpu_pci_raw = n.get("gpu_pci", {}) or {}
        if not isinstance(gpu_pci_raw, dict):
            p.add(f"{path}.gpu_pci", "a mapping of GPU index to PCI bus id", gpu_pci_raw)
            ok = False
        else:
            for g, bus in gpu_pci_raw.items():
                norm = normalise_pci(bus) if isinstance(bus, str) else None
                if not _int(g) or g not in gpus or norm is None:
                    p.add(f"{path}.gpu_pci.{g}", f"one of this node's GPU indexes {list(gpus)} mapped to a PCI "
                          "bus id such as '0000:83:00.0'", bus)
                    ok = False
                else:
                    gpu_pci[g] = norm
        mounts: dict[str, str] = {}
        mount_list = n.get("mounts", []) or []
        if not isinstance(mount_list, list):
            p.add(f"{path}.mounts", "a list", mount_list)
            mount_list = []
        for j, m in enumerate(mount_list):
            mpath = f"{path}.mounts[{j}]"
            if not _check_keys(m, _MOUNT_KEYS, {"pool"}, mpath, p):
                ok = False
                continue
            if m.get("pool") not in pools:
                p.add(f"{mpath}.pool", "a pool declared under 'storage_pools'", m.get("pool"))
                ok = False
                continue
            dev = m.get("device", f"{topo.pool_type(m['pool'])}:/{m['pool']}")
            if not _str(dev):
                p.add(f"{mpath}.device", "a device or mount name such as 'nfs:/scratch'", dev)
                ok = False
                continue
            mounts[m["pool"]] = dev
        if ok:
            topo.add_node(n["id"], gpus, nics, rack, mounts, gpu_pci, node_type, node_aliases)
        elif declared:
            refused_nodes.add(n["id"])

    unmatched = _list(data, "unmatched", p)
    for i, u in enumerate(unmatched):
        if not _str(u):
            p.add(f"unmatched[{i}]", "a line saying what an import could not match", u)
    topo.unmatched = tuple(u for u in unmatched if _str(u))

    for i, j in enumerate(_list(data, "jobs", p)):
        path = f"jobs[{i}]"
        if not _check_keys(j, _JOB_KEYS, {"job", "project", "team", "ranks"}, path, p):
            continue
        ok = all(k in j for k in ("job", "project", "team"))  # a missing one is reported as "is required"
        for k in ("job", "project", "team"):
            if k in j and not _str(j[k]):
                p.add(f"{path}.{k}", "a non-empty string", j[k])
                ok = False
        channel = j.get("channel")
        if channel is not None and not _str(channel):
            p.add(f"{path}.channel", "a Slack channel such as '#ml-infra'", channel)
            ok = False
        ranks: dict[int, tuple[str, int]] = {}
        rank_list = j.get("ranks", [])
        if not isinstance(rank_list, list):
            p.add(f"{path}.ranks", "a list", rank_list)
            continue
        for k, r in enumerate(rank_list):
            rpath = f"{path}.ranks[{k}]"
            if not _check_keys(r, _RANK_KEYS, _RANK_KEYS, rpath, p):
                ok = False
                continue
            node, gpu, rank = r.get("node"), r.get("gpu"), r.get("rank")
            if isinstance(node, str) and node not in refused_nodes and topo.match_node(node).how == "alias":
                node = topo.match_node(node).node  # a host's alias is that host
            if not _int(rank) or rank in ranks:
                p.add(f"{rpath}.rank", "a rank number unique in the job", rank)
                ok = False
            elif node in refused_nodes:
                ok = False  # the node's own problem is reported: it is declared, not a second problem here
            elif node not in topo.nodes():
                p.add(f"{rpath}.node", "a node declared under 'nodes'", node)
                ok = False
            elif gpu not in topo.gpus_of(node):
                p.add(f"{rpath}.gpu", f"one of {node}'s GPU indexes {list(topo.gpus_of(node))}", gpu)
                ok = False
            else:
                ranks[rank] = (node, gpu)
        if ok:
            topo.place_job(j["job"], j["project"], j["team"], channel, ranks)
    p.raise_if_any()
    return topo


# libyaml when PyYAML has it: a 10,000-GPU cluster file is written in a fraction of the pure-Python time.
_Dumper: Any = getattr(yaml, "CSafeDumper", yaml.SafeDumper)


def line_map(text: str) -> dict[str, int]:
    """Map each key path of a YAML document (``nodes[2].nics[0].leaf``) to its 1-based line; {} if it is bad."""
    try:
        return yamlio.dotted(yamlio.loads(text).lines)
    except YamlError:
        return {}


def parse_yaml_with_lines(text: str, source: str = "<string>") -> tuple[Any, dict[str, int]]:
    """Parse ``text`` once into (data, line map) with :mod:`whywait.yamlio` (duplicate keys refused).

    Raises :class:`TopologyError` naming ``source`` and the line; called by every topology reader of YAML.
    """
    try:
        doc = yamlio.loads(text, source)
    except YamlError as exc:
        raise TopologyError(str(exc), source=source) from None
    return doc.data, yamlio.dotted(doc.lines)


def dump_yaml(data: Any) -> str:
    """Write ``data`` as block YAML in key order (libyaml when available)."""
    return str(yaml.dump(data, Dumper=_Dumper, sort_keys=False, width=120, default_flow_style=False,
                         allow_unicode=True))


def load_yaml(path: str | Path) -> Topology:
    """Read and parse a topology YAML file; every problem names ``path`` and its line."""
    source = str(path)
    try:
        doc = yamlio.load(path)
    except YamlError as exc:
        raise TopologyError(str(exc), source=source) from None
    return parse_topology(doc.data, source, yamlio.dotted(doc.lines))
