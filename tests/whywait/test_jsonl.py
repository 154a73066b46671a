"""whywait.jsonl: JSON lines, or one JSON array, read the same way."""

from __future__ import annotations

import json

import pytest

from whywait.jsonl import json_records

MSGS = [{"kind": "net", "node": "n1", "nics": [{"nic": "eth0"}]}, {"kind": "host", "node": "n1"}, [1, "]"]]


@pytest.mark.parametrize("text, lines", [
    ("".join(json.dumps(m) + "\n" for m in MSGS), [1, 2, 3]),            # JSON lines
    ("\n" + "".join(json.dumps(m) + "\n\n" for m in MSGS), [2, 4, 6]),   # blank lines skipped, numbers kept
    (json.dumps(MSGS, indent=2) + "\n", [2, 11, 15]),                    # a pretty-printed array: where each starts
    (json.dumps(MSGS), [1, 1, 1]),                                       # an array on one line
    ("\n  " + json.dumps(MSGS, indent=1), [3, 12, 16]),                  # after blank lines
])
def test_lines_and_arrays_give_the_same_messages(text: str, lines: list[int]) -> None:
    got = list(json_records(text.splitlines(keepends=True)))
    assert [json.loads(t) for _, t in got] == MSGS
    assert [n for n, _ in got] == lines


def test_lines_that_are_not_json_are_given_for_the_caller_to_report() -> None:
    text = '[1, 2]\n{"a": 1}\nnot json\n'  # JSON lines whose first line is an array: not one array
    assert list(json_records(text.splitlines(keepends=True))) == [(1, "[1, 2]\n"), (2, '{"a": 1}\n'), (3, "not json\n")]
    assert list(json_records(["[\n", "{]\n"])) == [(1, "[\n"), (2, "{]\n")]
    assert list(json_records([])) == [] and list(json_records(["[]"])) == []
