"""Compiled decoding: typed events from the one contract, agreeing with the reference checker on every input."""

from __future__ import annotations

import json
from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from whywait.agents.events import (
    EVENT_TYPES,
    TOPIC_GPU,
    TOPIC_STEPS,
    TOPICS,
    ContractError,
    Event,
    as_dict,
    decode,
    encode,
    envelope,
    validate,
)


def gpu_msg(**extra: Any) -> dict[str, Any]:
    g = {"gpu": 0, "mem_used_bytes": 1, "mem_total_bytes": 2, "temp_c": 60.5, "power_w": 300,
         "sm_clock_mhz": 1410, "throttle_reasons": []}
    return envelope("gpu", "node-01", 1764442800.0, gpus=[{**g, **extra}])


def test_decode_returns_typed_objects_with_a_mapping_view() -> None:
    ev = decode(encode(gpu_msg(xid=[79, 79])), TOPIC_GPU)
    assert isinstance(ev, EVENT_TYPES["gpu"]) and type(ev).__name__ == "GpuReport"
    g = ev.gpus[0]  # type: ignore[attr-defined]
    assert type(g).__name__ == "GpuSample" and g.temp_c == 60.5 and g.xid == [79, 79]
    assert ev["kind"] == "gpu" and ev["node"] == "node-01" and ev.get("job") is None and "job" not in ev
    # An optional field that was not sent is absent (unknown), not zero.
    assert g.util_pct is None and "util_pct" not in g and g.get("util_pct", "absent") == "absent"
    assert "util_pct" not in dict(g) and dict(g)["gpu"] == 0
    assert ev == gpu_msg(xid=[79, 79])  # equal to the dict it was encoded from
    assert json.loads(encode(ev)) == json.loads(encode(gpu_msg(xid=[79, 79])))


def test_keyword_field_names_keep_their_contract_name_in_the_view() -> None:
    msg = envelope("hw", "node-01", 1.7e9, pcie=[{"class": "gpu", "device": "0000:01:00.0", "gpu": 0, "width": 16,
                                                  "width_max": 16, "gen": 4, "gen_max": 4}])
    validate(msg)
    ev = decode(encode(msg))
    assert ev["pcie"][0]["class"] == "gpu" and "class" in ev["pcie"][0]


def test_v1_messages_decode() -> None:
    msg = {**envelope("steps", "node-01", 1.7e9, job="j",
                      steps=[{"rank": 0, "step": 1, "duration_s": 1.0, "comm_s": 0.2}]), "schema": 1}
    assert decode(encode(msg), TOPIC_STEPS)["schema"] == 1


def test_refusals_name_the_field_path_as_before() -> None:
    raw = encode(gpu_msg(temp_c=5000))
    try:
        decode(raw, TOPIC_GPU)
    except ContractError as exc:
        assert str(exc) == "gpus[0].temp_c: must be within -273.15..1000 °C (got 5000)"
    else:
        raise AssertionError("out of bounds accepted")


def test_extension_fields_are_allowed_and_not_kept() -> None:
    ev = decode(encode({**gpu_msg(), "site_rack_label": "r12"}), TOPIC_GPU)
    assert "site_rack_label" not in ev


# ---- the compiled decoder and the reference checker agree on every input --------------------------

scalars = st.one_of(st.none(), st.booleans(), st.integers(min_value=-(2 ** 70), max_value=2 ** 70),
                    st.floats(allow_nan=True, allow_infinity=True), st.text(max_size=8),
                    st.sampled_from(["", "x" * 300, "node-01", "start", "\ud800"]))


def _mutations(msg: dict[str, Any]) -> st.SearchStrategy[dict[str, Any]]:
    """``msg`` with one field (at any depth) replaced by an arbitrary value or removed."""
    paths: list[tuple[Any, ...]] = []

    def walk(v: Any, path: tuple[Any, ...]) -> None:
        if isinstance(v, dict):
            for k, x in v.items():
                paths.append((*path, k))
                walk(x, (*path, k))
        elif isinstance(v, list):
            for i, x in enumerate(v):
                paths.append((*path, i))
                walk(x, (*path, i))

    walk(msg, ())

    def apply(path: tuple[Any, ...], value: Any, drop: bool) -> dict[str, Any]:
        out = json.loads(json.dumps(msg))
        cur = out
        for p in path[:-1]:
            cur = cur[p]
        if drop and isinstance(cur, dict):
            del cur[path[-1]]
        else:
            cur[path[-1]] = value
        return out  # type: ignore[no-any-return]

    return st.builds(apply, st.sampled_from(paths), scalars | st.lists(scalars, max_size=3), st.booleans())


SAMPLES = [
    gpu_msg(util_pct=50.0, xid=[48], ecc_uncorrected=0),
    envelope("steps", "node-01", 1.7e9, job="j", sender_uid=1000,
             steps=[{"rank": 0, "step": 1, "duration_s": 1.0, "comm_s": 0.2, "data_wait_s": 0.1}]),
    envelope("host", "node-01", 1.7e9, cpu_busy_pct=10.0, cpu_iowait_pct=1.0, mem_used_bytes=1,
             mem_total_bytes=2),
    envelope("placement", "sched", 1.7e9, job="j", project="p", team="t", state="running",
             ranks=[{"rank": 0, "node": "node-01", "gpu": 0}]),
]


@settings(max_examples=400, suppress_health_check=[HealthCheck.too_slow])
@given(st.sampled_from(SAMPLES).flatmap(_mutations), st.sampled_from([None, *(t.name for t in TOPICS)]))
def test_compiled_decoder_accepts_exactly_what_the_contract_accepts(msg: dict[str, Any], topic: str | None) -> None:
    raw = json.dumps(msg, allow_nan=True).encode()
    try:
        validate(json.loads(raw), topic)
        expected: str | None = None
    except ContractError as exc:
        expected = str(exc)
    try:
        ev = decode(raw, topic)
        got: str | None = None
    except ContractError as exc:
        got = str(exc)
    assert got == expected
    if got is None:
        assert isinstance(ev, Event)
        assert as_dict(ev) == _no_nulls(json.loads(raw))  # a null is an absent field


def _no_nulls(v: Any) -> Any:
    if isinstance(v, dict):
        return {k: _no_nulls(x) for k, x in v.items() if x is not None}
    if isinstance(v, list):
        return [_no_nulls(x) for x in v]
    return v
