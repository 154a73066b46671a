"""Hostile input against the contract: every malformed message is a ContractError with a precise reason.

Each case here was accepted, or escaped as another exception (RecursionError, OverflowError), before the
contract said what it says now.  The reasons are exact, as the dead-letter topic shows them.
"""

from __future__ import annotations

import json
import math
from typing import Any

import numpy as np
import pytest
from whywait.agents.events import (
    RANK_MAX,
    TOPIC_PLACEMENT,
    TOPIC_STEPS,
    ContractError,
    decode,
    encode,
    envelope,
    validate,
)
from whywait.engine.evaluate.steps import FrozenRow, StepRec, StepTable

T = 1_764_442_800.0


def placement(**over: Any) -> dict[str, Any]:
    body = {"job": "jA", "project": "p", "team": "t", "state": "running",
            "ranks": [{"rank": r, "node": "node-01", "gpu": r} for r in range(8)], **over}
    return envelope("placement", "sched", T, **body)


def steps(**over: Any) -> dict[str, Any]:
    return envelope("steps", "node-01", T, job="jA", steps=[{"rank": 0, "step": 10, "duration_s": 1.0, **over}])


def net(**over: Any) -> dict[str, Any]:
    return {**envelope("net", "node-01", T, interval_s=1.0, nics=[], tcp_retrans_segs_per_s=0.0,
                       tcp_out_segs_per_s=0.0), **over}


def reason(raw: bytes | str, topic: str | None = None) -> str:
    with pytest.raises(ContractError) as exc:
        decode(raw, topic)
    return str(exc.value)


# ---- A: numbers the store packs into fixed-width columns ------------------------------------------


def test_a_rank_beyond_the_store_rank_column_is_refused() -> None:
    big = placement(ranks=placement()["ranks"] + [{"rank": 2 ** 63 - 1, "node": "node-04", "gpu": 1}])
    assert reason(encode(big), TOPIC_PLACEMENT) == \
        "ranks[8].rank: must be within 0..2147483647 (got 9223372036854775807)"
    assert reason(encode(steps(rank=2 ** 31)), TOPIC_STEPS) == \
        "steps[0].rank: must be within 0..2147483647 (got 2147483648)"
    assert decode(encode(steps(rank=RANK_MAX)))["steps"][0]["rank"] == RANK_MAX


def test_the_contract_rank_bound_is_what_a_frozen_step_holds() -> None:
    assert RANK_MAX == np.iinfo(FrozenRow({}).ranks.dtype).max


def test_a_rank_the_store_cannot_hold_never_fails_the_job_other_ranks() -> None:
    """Defence in depth: a record that reached the table without the contract (a dict) is dropped."""
    table = StepTable()
    for step in range(40):  # enough steps that the oldest freeze into arrays
        for rank in (0, 1, 2 ** 63 - 1):
            table.add(step, rank, StepRec(T + step, 1.0, None, None, None, None, None, None))
    assert isinstance(table.steps[0], FrozenRow)
    assert sorted(table.steps[0]) == [0, 1] and table.ranks == {0, 1}


# ---- B: nesting deeper than any parser's stack ----------------------------------------------------

DEEP = [
    ("a list in an extension field", '{"schema":1,"kind":"host","time":%f,"node":"node-01","x":%s1%s}'
     % (T, "[" * 1000, "]" * 1000)),
    ("nested objects", '{"a":' * 1000 + "1" + "}" * 1000),
    ("a list at the top", "[" * 1000 + "]" * 1000),
    ("very deep", '{"schema":1,"x":' + "[" * 100_000 + "]" * 100_000 + "}"),
]


@pytest.mark.parametrize("raw", [r for _, r in DEEP], ids=[n for n, _ in DEEP])
@pytest.mark.parametrize("as_bytes", [True, False], ids=["bytes", "str"])
def test_b_deep_nesting_is_a_contract_error(raw: str, as_bytes: bool) -> None:
    assert reason(raw.encode() if as_bytes else raw) == "not valid JSON: nested too deeply"


def test_b_a_deep_value_where_a_scalar_belongs_is_named_not_a_recursion_error() -> None:
    deep: Any = 1
    for _ in range(5000):
        deep = [deep]
    with pytest.raises(ContractError, match=r"^node: must be a non-empty string \(got a list nested too deeply\)"):
        validate({**steps(), "node": deep})


# ---- C: what the documents rule out ---------------------------------------------------------------

REFUSED = [
    ("zombie state", placement(state="zombie"), "state: must be one of 'running', 'finished' (got 'zombie')"),
    ("gpu_share 0", placement(ranks=[{"rank": 0, "node": "n", "gpu": 0, "gpu_share": 0}]),
     "ranks[0].gpu_share: must be within 0..1 fraction, excluding 0 (got 0)"),
    ("rank on two nodes", placement(ranks=[{"rank": 0, "node": "n1", "gpu": 0}, {"rank": 1, "node": "n1", "gpu": 1},
                                           {"rank": 0, "node": "n2", "gpu": 0}]),
     "ranks[2].rank: rank 0 is placed twice (ranks[0] and ranks[2])"),
    ("running on no rank", placement(ranks=[]), "ranks: must name at least one rank while the job is running"),
    ("negative rank", steps(rank=-1), "steps[0].rank: must be within 0..2147483647 (got -1)"),
    ("negative step", steps(step=-5), "steps[0].step: must be within 0..9007199254740992 (got -5)"),
    ("phase over the step", steps(compute_s=50.0),
     "steps[0].compute_s: must be at most 1.5 × duration_s + 1 s (2.5 s here), a phase cannot outlast its step "
     "(got 50)"),
    ("checkpoint phase", envelope("checkpoint", "node-01", T, job="j", rank=0, checkpoint_id="c", phase="halfway"),
     "phase: must be one of 'start', 'end', 'failed' (got 'halfway')"),
    ("interval 0", net(interval_s=0.0), "interval_s: must be within 0..1e+08 s, excluding 0 (got 0.0)"),
    ("syslog level", envelope("hw", "node-01", T, kernel=[{"seq": 1, "class": "xid", "level": 8, "message": "x"}]),
     "kernel[0].level: must be within 0..7 syslog level (got 8)"),
    ("NUL in a node", steps() | {"node": "node\x00-01"},
     "node: must not hold control characters or unpaired surrogates (got 'node\\x00-01')"),
    ("newline in a job", steps() | {"job": "jA\nFAKE LOG LINE"},
     "job: must not hold control characters or unpaired surrogates (got 'jA\\nFAKE LOG LINE')"),
    ("escape in a nic", net(nics=[{"nic": "eth0\x1b[31m", "rx_bytes_per_s": 0, "tx_bytes_per_s": 0,
                                    "rx_packets_per_s": 0, "tx_packets_per_s": 0, "rx_errors_per_s": 0,
                                    "tx_errors_per_s": 0, "rx_drops_per_s": 0, "tx_drops_per_s": 0,
                                    "link_up": True}]),
     "nics[0].nic: must not hold control characters or unpaired surrogates (got 'eth0\\x1b[31m')"),
    ("C1 control in a node", steps() | {"node": "node\x85-01"},
     "node: must not hold control characters or unpaired surrogates (got 'node\\x85-01')"),
    ("NUL in a log line", envelope("hw", "node-01", T, kernel=[{"seq": 1, "class": "xid", "level": 3,
                                                                "message": "a\x00b"}]),
     "kernel[0].message: must not hold control characters (but tab, line feed, carriage return) or unpaired "
     "surrogates (got 'a\\x00b')"),
]


@pytest.mark.parametrize("msg, says", [(m, s) for _, m, s in REFUSED], ids=[n for n, _, _ in REFUSED])
def test_c_what_the_docs_rule_out_is_refused_by_both_checkers(msg: dict[str, Any], says: str) -> None:
    assert reason(json.dumps(msg).encode()) == says  # non-ASCII escaped: the decoder's slow path
    assert reason(json.dumps(msg, ensure_ascii=False).encode()) == says  # raw UTF-8 where JSON allows it
    with pytest.raises(ContractError) as exc:
        validate(json.loads(json.dumps(msg)))
    assert str(exc.value) == says


ACCEPTED = [
    ("a finished job with no rank", placement(state="finished", ranks=[])),
    ("a phase a little over its step", steps(compute_s=2.5)),
    ("gpu_share 1", placement(ranks=[{"rank": 0, "node": "n", "gpu": 0, "gpu_share": 1}])),
    ("tab and newline in a log line", envelope("hw", "node-01", T, kernel=[{"seq": 1, "class": "xid", "level": 3,
                                                                           "message": "a\tb\r\nc"}])),
    ("a degree sign", envelope("hw", "node-01", T, bmc=[{"name": "Inlet", "type": "temperature",
                                                          "health": "ok", "unit": "°C"}])),
    ("DEL in a name", steps() | {"node": "node\x7f"}),
    ("an escaped backslash before n", steps() | {"job": "C:\\new"}),
]


@pytest.mark.parametrize("msg", [m for _, m in ACCEPTED], ids=[n for n, _ in ACCEPTED])
def test_c_what_the_docs_allow_still_decodes(msg: dict[str, Any]) -> None:
    for raw in (json.dumps(msg).encode(), json.dumps(msg, ensure_ascii=False).encode()):
        assert json.loads(json.dumps(dict(decode(raw)), default=dict)) is not None
        assert decode(raw)["node"] == msg["node"]
    validate(json.loads(json.dumps(msg)))


def test_c_an_unpaired_surrogate_is_refused() -> None:
    raw = b'{"schema":2,"kind":"steps","time":%d,"node":"n","job":"\\ud800","steps":[]}' % int(T)
    assert reason(raw) == "job: must not hold control characters or unpaired surrogates (got '\\ud800')"


ENCODINGS = [
    ("UTF-16 with its BOM", json.dumps(steps()).encode("utf-16"),
     "not valid JSON: starts with a UTF-16 or UTF-32 byte-order mark (the contract is UTF-8)"),
    ("UTF-16-LE", json.dumps(steps()).encode("utf-16-le"),
     "not valid JSON: a NUL byte at offset 1 (UTF-16 or UTF-32? the contract is UTF-8)"),
    ("UTF-32-BE", json.dumps(steps()).encode("utf-32-be"),
     "not valid JSON: a NUL byte at offset 0 (UTF-16 or UTF-32? the contract is UTF-8)"),
    ("a UTF-8 BOM", b"\xef\xbb\xbf" + json.dumps(steps()).encode(),
     "not valid JSON: starts with a UTF-8 byte-order mark (the contract is UTF-8 without one)"),
    ("Latin-1", json.dumps(steps() | {"node": "nöde"}, ensure_ascii=False).encode("latin-1"),
     "not valid JSON: not UTF-8 (byte 0xf6 at offset 63)"),
]


@pytest.mark.parametrize("raw, says", [(r, s) for _, r, s in ENCODINGS], ids=[n for n, _, _ in ENCODINGS])
def test_c_only_utf8_without_a_bom_is_read(raw: bytes, says: str) -> None:
    assert reason(raw) == says


def test_c_a_repeated_key_counts_its_last_occurrence_on_both_paths() -> None:
    """Documented, not refused: msgspec cannot tell cheaply.  Both readers must agree on the value."""
    raw = encode(steps())[:-1] + b',"node":"node-02"}'
    assert decode(raw)["node"] == "node-02"  # the compiled decoder
    slow = raw[:-1] + b',"x":"\\n"}'  # an escape sends it through the reference checker
    assert decode(slow)["node"] == "node-02"


def test_every_refusal_is_a_contract_error_never_another_exception() -> None:
    """The fields each bound reaches, at and past their edges, through both checkers."""
    edges: list[dict[str, Any]] = []
    for v in (-1, 0, RANK_MAX, RANK_MAX + 1, 2 ** 63, -(2 ** 63) - 1, 10 ** 30, math.pi):
        edges += [steps(rank=v), steps(step=v), placement(ranks=[{"rank": v, "node": "n", "gpu": 0}]),
                  placement(ranks=[{"rank": 0, "node": "n", "gpu": v}])]
    for m in edges:
        raw = json.dumps(m).encode()
        try:
            decode(raw)
        except ContractError:
            pass
