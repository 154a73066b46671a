"""Hostile input against the contract: every malformed message is a ContractError with a precise reason.

Each case here was accepted, or escaped as another exception (RecursionError, OverflowError), before the
contract said what it says now.  The reasons are exact, as the dead-letter topic shows them.
"""

from __future__ import annotations

from typing import Any

import pytest
from whywait.agents.events import ContractError, decode, envelope, validate

T = 1_764_442_800.0


def steps(**over: Any) -> dict[str, Any]:
    return envelope("steps", "node-01", T, job="jA", steps=[{"rank": 0, "step": 10, "duration_s": 1.0, **over}])


def reason(raw: bytes | str, topic: str | None = None) -> str:
    with pytest.raises(ContractError) as exc:
        decode(raw, topic)
    return str(exc.value)


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
