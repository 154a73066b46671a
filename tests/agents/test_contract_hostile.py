"""Hostile input against the contract: every malformed message is a ContractError with a precise reason.

Each case here was accepted, or escaped as another exception (RecursionError, OverflowError), before the
contract said what it says now.  The reasons are exact, as the dead-letter topic shows them.
"""

from __future__ import annotations

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
