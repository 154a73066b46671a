"""What a collector may publish: the event contract's bounds, applied to a reading before it leaves the agent.

Why this exists: the machine's own files and libraries are not trustworthy input.  A damaged or hostile
``/proc`` or ``/sys`` file, a sick GPU whose NVML answers ``0xFFFFFFFF``, a BMC that reports ``NaN``,
a counter that jumps by 2^64 in a second: each yields a value the contract refuses (a 10^21 bytes/s
rate, a 4-billion-degree GPU, a name holding an escape sequence).  The publisher refuses such a message
*whole*, and logs it each time, so one bad field would cost the node's whole ``net`` (or ``gpu``, or
``hw``) message every interval, with a log line every second, for as long as the file stays bad.

The collectors check what they parse where they parse it (counters, speeds, names, see their modules);
:func:`fit` is the last pass, run on every body by :meth:`Collector.collect`, so nothing the contract
refuses ever reaches the publisher:

* an optional field whose value the contract would refuse is left out;
* a list entry (a NIC, a device, a GPU) whose required field the contract would refuse, or lacks, is
  left out, and the list's other entries stay;
* a top-level required field the contract would refuse drops the message (None);
* extension fields (the contract allows a producer's own fields) may not hold NaN or infinity (the
  message could not be encoded) nor a string the contract would refuse as a name;
* ``gpus_incomplete`` (the GPU collectors' list of GPUs lacking a required field) follows the
  ``gpus`` entries' field rules, without requiring anything.

Each problem is returned as one short line without its values or list positions (``nics[].speed_mbps:
must be within 0..1e+09``), so the collector can log each *distinct* problem once.

The rules are read from the contract's own tables (:mod:`whywait.agents.events`), never restated here.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from typing import Any

from whywait.agents import events as ev

_INT_LIMIT = 2 ** 63


@dataclass(frozen=True, slots=True)
class Rule:
    """One field's checks: its contract type and bounds (numbers), length and characters (strings)."""

    name: str
    type: str
    required: bool
    lo: float = 0.0
    hi: float = 0.0
    above_min: bool = False
    cap: int = ev.STRING_MAX
    bad: re.Pattern[str] = ev.NOT_IN_NAMES
    choices: tuple[str, ...] = ()
    inner: str = ""  # a list's item type


def _rule(f: ev.Field, required: bool = True) -> Rule:
    lo, hi = ev.FIELD_BOUNDS.get(f.name) or ev.UNIT_BOUNDS.get(f.unit, ev.GENERIC_BOUND)
    inner = f.type[5:-1] if f.type.startswith("list[") else ""
    if inner in ("number", "integer"):
        lo, hi = ev.UNIT_BOUNDS.get(f.unit, ev.GENERIC_BOUND)  # a list's items: the unit's bounds only
    return Rule(f.name, f.type, f.required and required, lo, hi, f.name in ev.ABOVE_MIN,
                ev.STRING_MAX_BY_FIELD.get(f.name, ev.STRING_MAX),
                ev.NOT_IN_PROSE if f.name in ev.PROSE_FIELDS else ev.NOT_IN_NAMES, f.choices, inner)


def _rules(rec: ev.Record, required: bool = True) -> dict[str, Rule]:
    return {f.name: _rule(f, required) for f in rec.fields}


@dataclass(frozen=True, slots=True)
class Plan:
    body: dict[str, Rule]
    lists: dict[str, dict[str, Rule]]


# Lists a collector adds beside the contract's own, and the contract list whose entries they follow
# (without requiring its required fields: a GPU there lacks one by definition).
_EXTRA_LISTS = {"gpu": {"gpus_incomplete": "gpus"}}


def _plan(kind: str) -> Plan | None:
    for t in ev.TOPICS:
        if t.kind == kind:
            lists = {name: _rules(rec) for name, rec in t.lists.items()}
            for extra, like in _EXTRA_LISTS.get(kind, {}).items():
                lists[extra] = _rules(t.lists[like], required=False)
            return Plan(_rules(t.body), lists)
    return None


_PLANS: dict[str, Plan | None] = {}


def number_ok(v: Any, lo: float, hi: float, integer: bool = False, above_min: bool = False) -> bool:
    """Whether ``v`` is a finite number (an int when ``integer``) within ``lo..hi`` (above ``lo``)."""
    if isinstance(v, bool):
        return False
    if isinstance(v, int):
        ok = -_INT_LIMIT <= v < _INT_LIMIT and lo <= v <= hi  # ints compared as ints: float(10**400) overflows
    elif isinstance(v, float) and not integer:
        ok = math.isfinite(v) and lo <= v <= hi
    else:
        return False
    return ok and not (above_min and v == lo)


def name_ok(v: Any, cap: int = ev.STRING_MAX, bad: re.Pattern[str] = ev.NOT_IN_NAMES) -> bool:
    """Whether ``v`` is a string the contract takes as a name: not empty, at most ``cap`` characters, no
    control character or unpaired surrogate."""
    return isinstance(v, str) and 0 < len(v) <= cap and bad.search(v) is None


def clean_name(v: Any, cap: int = ev.STRING_MAX) -> str | None:
    """``v`` as a name the contract takes: control characters and unpaired surrogates dropped, blanks around
    it stripped, cut to ``cap`` characters; None when nothing is left (or ``v`` is not text)."""
    if isinstance(v, bytes):
        v = v.decode("utf-8", "replace")
    if not isinstance(v, str):
        return None
    v = ev.NOT_IN_NAMES.sub("", v).strip()[:cap]
    return v or None


def clean_prose(v: Any, cap: int = ev.STRING_MAX) -> str | None:
    """Free text (a log line, a BMC's note) the contract takes: a control character shown as ``\\xNN``, as
    the kernel itself writes them in ``/dev/kmsg``, then cut to ``cap`` characters."""
    if not isinstance(v, str):
        return None
    v = ev.NOT_IN_PROSE.sub(lambda m: "\\x%02x" % ord(m.group()) if ord(m.group()) < 256 else "\ufffd", v)
    return v[:cap] or None


def _value_ok(r: Rule, v: Any) -> bool:
    t = r.type
    if t == "number" or t == "integer":
        return number_ok(v, r.lo, r.hi, t == "integer", r.above_min)
    if t == "string":
        return name_ok(v, r.cap, r.bad) and (not r.choices or v in r.choices)
    if t == "boolean":
        return isinstance(v, bool)
    return True  # lists: checked item by item by the caller


def _item_ok(r: Rule, v: Any) -> bool:
    if r.inner in ("number", "integer"):
        return number_ok(v, r.lo, r.hi, r.inner == "integer")
    if r.inner == "string":
        return name_ok(v)
    return True


def _extension_ok(v: Any) -> bool:
    if isinstance(v, float):
        return math.isfinite(v)
    if isinstance(v, int) and not isinstance(v, bool):
        return -_INT_LIMIT <= v < _INT_LIMIT
    if isinstance(v, str):
        return name_ok(v)
    if isinstance(v, list):
        return len(v) <= ev.LIST_MAX and all(_extension_ok(x) for x in v if not isinstance(x, (dict, list)))
    return True


def _why(r: Rule) -> str:
    if r.type in ("number", "integer"):
        return f"must be a finite {r.type} within {r.lo:g}..{r.hi:g}"
    if r.type == "string":
        what = "text" if r.bad is ev.NOT_IN_PROSE else "a name"
        return f"must be {what} of at most {r.cap} characters without control characters"
    return f"must be a {r.type}"


def field_ok(kind: str, list_name: str | None, field: str, value: Any) -> bool:
    """Whether the contract takes ``value`` for ``field`` of ``kind``'s body (``list_name`` None) or of an
    entry of its list ``list_name``; a field the contract does not name is taken when it is finite.

    For a collector that would rather mark one field unavailable (a GPU's temperature NVML answers as
    4294967295) than have :func:`fit` leave out the whole entry it is required in.
    """
    if kind not in _PLANS:
        _PLANS[kind] = _plan(kind)
    plan = _PLANS[kind]
    if plan is None:
        return _extension_ok(value)
    rules = plan.body if list_name is None else plan.lists.get(list_name, {})
    r = rules.get(field)
    return _extension_ok(value) if r is None else value is not None and _value_ok(r, value)


def _fields(obj: dict[str, Any], rules: dict[str, Rule], path: str, lists: dict[str, dict[str, Rule]],
            problems: list[str]) -> bool:
    """Check (and trim) one record in place; False when a required field is missing or refused."""
    whole = True
    for key in list(obj):
        v = obj[key]
        r = rules.get(key)
        if r is None:  # the producer's own field
            if key in lists and isinstance(v, list):
                _list(obj, key, lists[key], path, problems)
            elif not _extension_ok(v):
                problems.append(f"{path}{key}: a NaN, infinity, oversized number or unreadable name")
                del obj[key]
            continue
        if v is None and not r.required:
            del obj[key]  # an optional field left out, as the contract allows
            continue
        why: str | None = None
        if v is None:
            why = "is required"
        elif r.type.startswith("list[") and isinstance(v, list):
            if key in lists:
                _list(obj, key, lists[key], path, problems)
            else:
                kept = [x for x in v if _item_ok(r, x)]
                if len(kept) != len(v):
                    problems.append(f"{path}{key}[]: each must be a valid {r.inner}")
                    obj[key] = kept
            continue
        elif r.type.startswith("list["):
            why = "must be a list"
        elif not _value_ok(r, v):
            why = _why(r)
        if why is not None:  # a required field spoils the record; an optional one is dropped
            problems.append(f"{path}{key}: {why}")
            if r.required:
                whole = False
            else:
                del obj[key]
    for key, r in rules.items():
        if r.required and key not in obj:
            whole = False
            problems.append(f"{path}{key}: is required")
    return whole


def _list(obj: dict[str, Any], key: str, rules: dict[str, Rule], path: str, problems: list[str]) -> None:
    kept = []
    for item in obj[key]:
        if not isinstance(item, dict):
            problems.append(f"{path}{key}[]: must be an object")
            continue
        item = dict(item)
        if _fields(item, rules, f"{path}{key}[].", {}, problems):
            kept.append(item)
    cap = ev.LIST_MAX_BY_FIELD.get(key, ev.LIST_MAX)
    if len(kept) > cap:
        problems.append(f"{path}{key}: more than {cap} entries")
        kept = kept[:cap]
    obj[key] = kept


def fit(kind: str, body: dict[str, Any]) -> tuple[dict[str, Any] | None, list[str]]:
    """``body`` trimmed to what the contract accepts for ``kind``, and the problems found (see the module
    docstring).  The body is copied where it changes; None when it cannot be published at all."""
    if kind not in _PLANS:
        _PLANS[kind] = _plan(kind)
    plan = _PLANS[kind]
    if plan is None:
        return body, []
    problems: list[str] = []
    out = dict(body)
    whole = _fields(out, plan.body, "", plan.lists, problems)
    return (out if whole else None), problems
