"""Bad input of every kind, for the fuzz tests (unit, property-based and live through the broker).

:func:`bad_messages` returns ``(topic, raw bytes, kind)`` triples; every one of them must end on the
dead-letter topic with a reason.  ``kind`` names the family, so a failing test says which family
got through.  The families follow what a hostile or broken producer has been seen to send:
malformed JSON, wrong types, NaN and infinities, integers too big for a float, values outside any
physical bound, hostile and enormous strings, oversized lists and messages, deep nesting, event
times far in the future or the past, wrong topics, unknown schema versions, unknown nodes.
"""

from __future__ import annotations

import copy
import json
import random
from typing import Any, Callable, Iterator

from whywait.agents.events import TOPIC_GPU, TOPIC_HOST, TOPIC_NET, TOPIC_PLACEMENT, TOPIC_STEPS, TOPIC_STORAGE

HOSTILE = ["<!here>", "<!channel> *bold* `code`", "\u202eevil\u202c", "\x00\x01\x1b[31m", "${jndi:ldap://x}",
           "'; DROP TABLE jobs; --", "{{ 7*7 }}", "\ud7ff\ue000" * 3, "../../etc/passwd", "<script>x</script>"]


def _host(node: str, t: float, **over: Any) -> dict[str, Any]:
    return {"schema": 2, "kind": "host", "time": t, "node": node, "cpu_busy_pct": 50.0, "cpu_iowait_pct": 1.0,
            "mem_used_bytes": 1 << 30, "mem_total_bytes": 1 << 34, **over}


def _gpu(node: str, t: float, **over: Any) -> dict[str, Any]:
    g = {"gpu": 0, "mem_used_bytes": 1 << 30, "mem_total_bytes": 80 << 30, "temp_c": 60.0, "power_w": 300.0,
         "sm_clock_mhz": 1980.0, "throttle_reasons": [], **over}
    return {"schema": 2, "kind": "gpu", "time": t, "node": node, "gpus": [g]}


def _steps(node: str, t: float, job: str = "j", **over: Any) -> dict[str, Any]:
    return {"schema": 2, "kind": "steps", "time": t, "node": node, "job": job,
            "steps": [{"rank": 0, "step": 1, "duration_s": 1.0, **over}]}


def _j(obj: Any) -> bytes:
    return json.dumps(obj, allow_nan=True).encode()


def families(now: float, nodes: list[str]) -> dict[str, Callable[[random.Random], tuple[str, bytes]]]:
    """Family name -> a generator of one bad message (``rng`` picks the details)."""
    def node(r: random.Random) -> str:
        return r.choice(nodes)

    return {
        "malformed-json": lambda r: (TOPIC_HOST, r.choice([b"{nope", b"", b"{\"schema\": 2,", b"\xff\xfe\x00",
                                                            b"null", b"tru", b"{'a': 1}"])),
        "not-an-object": lambda r: (TOPIC_NET, r.choice([b"[]", b"42", b"\"host\"", b"[{\"kind\": \"net\"}]"])),
        "missing-fields": lambda r: (TOPIC_HOST, _j({"schema": 2, "kind": "host", "time": now, "node": node(r)})),
        "wrong-types": lambda r: (TOPIC_HOST, _j(_host(node(r), now, cpu_busy_pct=r.choice(["50", None, [], True])
                                                        or "x"))),
        "nan-infinity": lambda r: (TOPIC_GPU, _j(_gpu(node(r), now, temp_c=r.choice([float("nan"), float("inf"),
                                                                                      float("-inf")])))),
        "huge-int": lambda r: (TOPIC_HOST, _j(_host(node(r), now, mem_used_bytes=10 ** r.randint(20, 400)))),
        "huge-float": lambda r: (TOPIC_GPU, b'{"schema":2,"kind":"gpu","time":%f,"node":"%s","gpus":[{"gpu":0,'
                                 b'"mem_used_bytes":1,"mem_total_bytes":2,"temp_c":1e400,"power_w":1,'
                                 b'"sm_clock_mhz":1,"throttle_reasons":[]}]}' % (now, node(r).encode())),
        "out-of-bounds": lambda r: (TOPIC_GPU, _j(_gpu(node(r), now, **r.choice([
            {"temp_c": 5000.0}, {"power_w": -1.0}, {"mem_used_bytes": -5}, {"util_pct": 250.0},
            {"sm_clock_mhz": 1e12}])))),
        "hostile-strings": lambda r: (TOPIC_HOST, _j({**_host(node(r), now), "kind": r.choice(HOSTILE)})),
        "long-job-name": lambda r: (TOPIC_STEPS, _j(_steps(node(r), now, job="j" * r.randint(257, 20_000)))),
        "huge-list": lambda r: (TOPIC_GPU, _j({**_gpu(node(r), now), "gpus": _gpu(node(r), now)["gpus"] * 1500})),
        "deep-nesting": lambda r: (TOPIC_STORAGE, b"[" * r.randint(2000, 100_000) + b"]" * 10),
        "future-time": lambda r: (TOPIC_HOST, _j(_host(node(r), now + r.choice([86_400.0, 3.2e9, 1e10])))),
        "ancient-time": lambda r: (TOPIC_HOST, _j(_host(node(r), now - r.choice([86_400.0 * 30, 1e9, 3600.0])))),
        "bad-time": lambda r: (TOPIC_HOST, _j(_host(node(r), r.choice([1e15, -1.0, 1e300])))),
        "wrong-topic": lambda r: (TOPIC_NET, _j(_host(node(r), now))),
        "unknown-schema": lambda r: (TOPIC_HOST, _j({**_host(node(r), now), "schema": r.choice([0, 3, 99, "2"])})),
        "unknown-node": lambda r: (TOPIC_HOST, _j(_host(r.choice(HOSTILE) + str(r.randint(0, 10 ** 6)), now))),
        "unknown-placement-node": lambda r: (TOPIC_PLACEMENT, _j({
            "schema": 2, "kind": "placement", "time": now, "node": "sched", "job": f"ghost-{r.randint(0, 99)}",
            "project": "p", "team": "t", "state": "running", "ranks": [{"rank": 0, "node": "nowhere", "gpu": 0}]})),
        "negative-step": lambda r: (TOPIC_STEPS, _j(_steps(node(r), now, duration_s=-3.0))),
    }


def bad_messages(n: int, now: float, nodes: list[str], seed: int = 0) -> list[tuple[str, bytes, str]]:
    """``n`` bad messages, every family in turn, plus one oversized message (~600 kB) per 5,000."""
    r = random.Random(seed)
    fams = families(now, nodes)
    names = sorted(fams)
    out = []
    for i in range(n):
        name = names[i % len(names)]
        topic, raw = fams[name](r)
        out.append((topic, raw, name))
    for _ in range(max(1, n // 5000)):
        big = {**_host(nodes[0], now), "kind": "host", "note": "x" * 600_000, "cpu_busy_pct": "oops"}
        out.append((TOPIC_HOST, _j(big), "oversized"))
    return out


#: What a field of a real record is replaced by in :func:`retyped`: every JSON type, and numbers past any bound.
WRONG_TYPES: tuple[Any, ...] = (None, "x", -1, [], {}, True, 10**30, 1e308, "\x00" * 3)


def retyped(doc: Any, wrongs: tuple[Any, ...] = WRONG_TYPES,
            deleted: bool = False) -> Iterator[tuple[str, Any]]:
    """``(what, copy)``: ``doc`` with one field (at any depth) replaced by each of ``wrongs``, and with it deleted.

    Used by the tests that feed a real record (a diagnosis, a pod, scontrol's job) with each field of the
    wrong type: a reader must refuse the record in its own words, never fail on the field later.
    """
    def paths(o: Any, path: tuple[Any, ...] = ()) -> Iterator[tuple[Any, ...]]:
        items = o.items() if isinstance(o, dict) else enumerate(o) if isinstance(o, list) else ()
        for k, v in items:
            yield (*path, k)
            yield from paths(v, (*path, k))

    for path in list(paths(doc)):
        name = ".".join(map(str, path))
        for wrong in (*wrongs, _DELETE) if deleted else wrongs:
            out = copy.deepcopy(doc)
            parent = out
            for k in path[:-1]:
                parent = parent[k]
            if wrong is _DELETE:
                del parent[path[-1]]
                yield f"{name} deleted", out
            else:
                parent[path[-1]] = wrong
                yield f"{name} = {wrong!r}", out


_DELETE = object()
