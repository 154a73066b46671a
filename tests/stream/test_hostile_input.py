"""No input can crash or stall the processor: every bad message is dead-lettered with its reason.

Property-based (hypothesis) over the decoder, the store and the processor, plus every family of
:mod:`tests.support.hostile` through a real :class:`Processor` with the shipped rules.
"""

from __future__ import annotations

import hashlib
import json
import math
import time
from pathlib import Path
from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from whywait.agents import events
from whywait.agents.events import (
    _RECORDS,
    GENERIC_BOUND,
    LIST_MAX,
    TOPIC_HOST,
    TOPICS,
    UNIT_BOUNDS,
    ContractError,
    Field,
    decode,
    encode,
    envelope,
    topic_for_kind,
    validate,
)
from whywait.engine.evaluate.evaluator import Evaluator
from whywait.engine.evaluate.store import MetricStore
from whywait.engine.rules.loader import load_rules
from whywait.engine.stream.processor import DLQ_ORIGINAL_MAX, Processor, Record
from whywait.simulate.cluster import make_cluster

from tests.support.hostile import bad_messages, families

RULES = Path(__file__).resolve().parents[2] / "rules"
NODES = [f"node-{i:02d}" for i in range(1, 5)]
_RULESET = load_rules([RULES])


def proc() -> Processor:
    return Processor(Evaluator(_RULESET, make_cluster(nodes=4, gpus_per_node=1)))


# ---- the decoder -------------------------------------------------------------------------------

json_values = st.recursive(
    st.none() | st.booleans() | st.integers(min_value=-(10 ** 500), max_value=10 ** 500)
    | st.floats(allow_nan=True, allow_infinity=True) | st.text(max_size=50),
    lambda inner: st.lists(inner, max_size=5) | st.dictionaries(st.text(max_size=10), inner, max_size=6),
    max_leaves=30)


@given(st.binary(max_size=2000))
def test_decoder_raises_only_contract_errors_on_any_bytes(raw: bytes) -> None:
    try:
        decode(raw)
    except ContractError:
        pass


@given(json_values, st.sampled_from([t.name for t in TOPICS]))
def test_decoder_raises_only_contract_errors_on_any_json(value: Any, topic: str) -> None:
    raw = json.dumps(value, allow_nan=True).encode()
    try:
        decode(raw, topic)
    except ContractError as exc:
        assert "\n" not in str(exc) and len(str(exc)) < 2000  # one line, whatever came in


@given(st.dictionaries(st.sampled_from(["schema", "kind", "time", "node", "cpu_busy_pct", "cpu_iowait_pct",
                                        "mem_used_bytes", "mem_total_bytes"]), json_values))
def test_envelope_fields_of_any_value_never_escape_as_other_errors(msg: dict[str, Any]) -> None:
    try:
        validate(msg, TOPIC_HOST)
    except ContractError:
        pass


# ---- the store: any message the contract accepts is stored without error --------------------------


def _number(f: Field) -> st.SearchStrategy[Any]:
    lo, hi = events._bounds(f.unit, f.name)  # the field's own bounds where the contract gives them (ranks: int32)
    above = f.name in events.ABOVE_MIN  # (0, 1]: the lower bound itself is refused
    if f.type == "integer":
        return st.integers(min_value=max(int(lo) + above, -(2 ** 63)), max_value=min(int(hi), 2 ** 63 - 1))
    return st.floats(min_value=lo, max_value=hi, allow_nan=False, allow_infinity=False, exclude_min=above)


def _value(f: Field, node: str) -> st.SearchStrategy[Any]:
    if f.type in ("number", "integer"):
        return _number(f)
    if f.choices:
        return st.sampled_from(f.choices)
    if f.type == "string":
        return st.sampled_from([node, "eth0", "start", "end", "failed", "running", "x" * 256])
    if f.type == "boolean":
        return st.booleans()
    inner = f.type[5:-1]
    rec = _RECORDS.get(inner)
    if rec is not None:
        return st.lists(_record(rec, node), min_size=0, max_size=4)
    lo, hi = UNIT_BOUNDS.get(f.unit, GENERIC_BOUND)
    return st.lists(st.integers(min_value=int(lo), max_value=int(min(hi, 2 ** 31))) if inner == "integer"
                    else st.sampled_from(["hw_thermal_slowdown", "sw_power_cap", "gpu_idle"]), max_size=4)


def _record(rec: Any, node: str) -> st.SearchStrategy[dict[str, Any]]:
    req = {f.name: _value(f, node) for f in rec.fields if f.required}
    opt = {f.name: _value(f, node) for f in rec.fields if not f.required}
    return st.fixed_dictionaries(req, optional=opt).map(_phases_within_step)


def _phases_within_step(r: dict[str, Any]) -> dict[str, Any]:
    """A step's phases cut to what the contract allows (at most 1.5 x ``duration_s`` + 1 s each)."""
    if "duration_s" in r:
        cap = events.PHASE_SLACK[0] * r["duration_s"] + events.PHASE_SLACK[1]
        for name in events.STEP_PHASES:
            if name in r and r[name] > cap:
                r[name] = cap
    return r


valid_messages = st.sampled_from([t for t in TOPICS if t.kind != "placement"]).flatmap(
    lambda t: st.tuples(st.just(t.kind), _record(t.body, "node-01"),
                        st.floats(min_value=1.7e9, max_value=1.7e9 + 3600)))


@settings(max_examples=300, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(valid_messages, min_size=1, max_size=20))
def test_store_takes_any_valid_message(msgs: list[tuple[str, dict[str, Any], float]]) -> None:
    store = MetricStore()
    for kind, body, t in msgs:
        body.pop("kind", None)
        msg = validate(envelope(kind, "node-01", t, **body))
        assert store.ingest(msg) == t
    store.close_buckets(1.7e9 + 4000)
    for s in store.series.values():
        # Ratios of in-bound values may be huge (retransmits over a denormal segment rate: inf), never NaN.
        assert not any(math.isnan(v) for v in s.v)


# ---- the processor -------------------------------------------------------------------------------

records = st.lists(st.tuples(st.sampled_from([t.name for t in TOPICS]),
                             st.one_of(st.none(), st.binary(max_size=300),
                                       json_values.map(lambda v: json.dumps(v, allow_nan=True).encode()))),
                   max_size=30)


@settings(max_examples=150, suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture])
@given(records)
def test_processor_accounts_for_every_record(batch: list[tuple[str, bytes | None]]) -> None:
    p = proc()
    out = p.process([Record(topic, value, None, 0, i) for i, (topic, value) in enumerate(batch)])
    c = p.counts
    assert c["records"] == len(batch)
    assert c["messages"] + c["dead_letters"] + c["tombstones"] + c["skipped_before_start"] == len(batch)
    assert len(out.dead_letters) == c["dead_letters"] and c["dead_letters.internal"] == 0
    for _, value in out.dead_letters:
        assert json.loads(value)["reason"]


def test_every_family_of_bad_input_is_dead_lettered_with_a_reason() -> None:
    now = time.time()
    p = proc()
    warm = [encode(envelope("host", n, now - 30 + s, cpu_busy_pct=1.0, cpu_iowait_pct=0.0, mem_used_bytes=1,
                            mem_total_bytes=2)) for s in range(20) for n in NODES]
    p.process([Record(TOPIC_HOST, v) for v in warm])
    bad = bad_messages(len(families(now, NODES)) * 20, now, NODES, seed=3)
    t0 = time.perf_counter()
    out = p.process([Record(topic, raw, b"k", 0, i) for i, (topic, raw, _) in enumerate(bad)])
    assert time.perf_counter() - t0 < 30
    assert len(out.dead_letters) == len(bad), {k: v for k, v in p.counts.items() if k.startswith("dead")}
    assert p.counts["dead_letters.internal"] == 0
    for (_, raw, family), (_, dl) in zip(bad, out.dead_letters, strict=True):
        body = json.loads(dl)
        assert body["reason"], family
        assert len(dl) < 512 * 1024, family  # always fits the producer's 1 MiB request limit
        assert body["value_bytes"] == len(raw) and body["value_sha256"] == hashlib.sha256(raw).hexdigest()
    assert {json.loads(d)["category"] for _, d in out.dead_letters} >= {"contract", "too_far_ahead",
                                                                         "unknown_node", "topology"}


def test_oversized_bad_message_is_cut_with_its_checksum() -> None:
    raw = b'{"schema": 2, "note": "' + b"\x01" * 3_000_000 + b'"}'
    out = proc().process([Record(TOPIC_HOST, raw)])
    [(_, dl)] = out.dead_letters
    body = json.loads(dl)
    assert body["value_truncated"] and body["value_bytes"] == len(raw)
    assert len(body["value"].encode()) <= DLQ_ORIGINAL_MAX and len(dl) < 512 * 1024


def test_list_cap_is_enforced() -> None:
    msg = envelope("gpu", "node-01", 1.7e9, gpus=[{"gpu": 0}] * (LIST_MAX + 1))
    try:
        validate(msg)
    except ContractError as exc:
        assert f"must hold at most {LIST_MAX} entries" in str(exc)
    else:
        raise AssertionError("accepted")


def test_big_integers_are_refused_not_overflowing() -> None:
    msg = envelope("host", "node-01", 1.7e9, cpu_busy_pct=1.0, cpu_iowait_pct=0.0, mem_used_bytes=10 ** 400,
                   mem_total_bytes=2)
    try:
        validate(msg)
    except ContractError as exc:
        assert str(exc) == "mem_used_bytes: must be within 0..9.22337e+18 bytes (got an integer of 401 digits)"
    else:
        raise AssertionError("accepted")
    assert topic_for_kind("host") == TOPIC_HOST
