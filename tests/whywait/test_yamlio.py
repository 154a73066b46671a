"""whywait.yamlio: plain data plus the line of every key and item; hostile YAML refused with file:line."""

from __future__ import annotations

from pathlib import Path

import pytest

from whywait import yamlio
from whywait.errors import WhywaitError, YamlError

DOC = """\
name: demo
nodes:
  - id: node-01
    nics:
      - {name: mlx5_0, leaf: leaf-01}
  - id: node-02
cause: |
  line one
  {{ oops }}
folded: >
  a
  b
"""


def test_values_and_the_line_of_every_key_and_item() -> None:
    doc = yamlio.loads(DOC, "t.yaml")
    assert doc.data["nodes"][0]["nics"][0] == {"name": "mlx5_0", "leaf": "leaf-01"}
    assert doc.lines[("name",)] == 1 and doc.lines[("nodes", 1)] == 6 and doc.lines[("nodes", 1, "id")] == 6
    assert doc.lines[("nodes", 0, "nics", 0, "leaf")] == 5
    assert doc.line(("nodes", 0, "nics", 0, "missing")) == 5  # a missing key: its nearest ancestor's line
    assert yamlio.dotted(doc.lines)["nodes[0].nics[0].leaf"] == 5


def test_spans_place_a_line_of_a_block_value_in_the_file() -> None:
    doc = yamlio.loads(DOC, "t.yaml")
    literal = doc.spans[("cause",)]
    assert (literal.first, literal.last, literal.style) == (8, 9, "|") and literal.line_in(2) == 9
    folded = doc.spans[("folded",)]
    assert doc.data["folded"] == "a b\n" and doc.source_text(folded) == "  a\n  b"
    assert folded.line_in(7) == 12  # clipped to the value's own lines


@pytest.mark.parametrize("text, message", [
    ("a: 1\nb: 2\na: 3\n", "t.yaml:3: duplicate key 'a' (the first is on line 1)"),
    ("x:\n  - {k: 1, k: 2}\n", "t.yaml:2: duplicate key 'k' (the first is on line 2)"),
    ("base: &b {a: 1}\nc:\n  <<: *b\n", "t.yaml:3: a merge key (<<) is not supported here: write the keys out"),
    ("? [a, b]\n: 1\n", "t.yaml:1: a non-scalar key is not supported here: keys are names"),
    ("a: [1, 2\n", "t.yaml:2: not valid YAML: expected ',' or ']', but got '<stream end>'"),
    ("a: !shell rm\n", "t.yaml:1: not valid YAML: could not determine a constructor for the tag '!shell'"),
    ("a: !!python/object:os.system {}\n", "t.yaml:1: the tag 'tag:yaml.org,2002:python/object:os.system' "
                                          "is not supported here"),
    ("a: 1\n---\nb: 2\n", "t.yaml:2: not valid YAML: expected a single document in the stream, "
                          "but found another document"),
])
def test_hostile_or_ambiguous_yaml_is_one_line_with_its_place(text: str, message: str) -> None:
    with pytest.raises(YamlError) as exc:
        yamlio.loads(text, "t.yaml")
    assert str(exc.value) == message and isinstance(exc.value, WhywaitError)


def test_an_alias_bomb_is_refused() -> None:
    lines = ['a: &a ["x", "x", "x", "x", "x", "x", "x", "x", "x", "x"]']
    for i in range(1, 9):  # each level 10x the one before: 10**9 values if expanded
        lines.append(f"{chr(97 + i)}: &{chr(97 + i)} [" + ", ".join([f"*{chr(96 + i)}"] * 10) + "]")
    with pytest.raises(YamlError, match=r"aliases expand into more than 100,000 values"):
        yamlio.loads("\n".join(lines) + "\n", "bomb.yaml")


def test_small_aliases_expand_into_independent_values() -> None:
    doc = yamlio.loads("a: &x {k: [1]}\nb: *x\n", "t.yaml")
    assert doc.data["a"] == doc.data["b"] and doc.data["a"] is not doc.data["b"]


def test_deep_nesting_is_refused_not_a_recursion_traceback() -> None:
    with pytest.raises(YamlError, match="nests too deeply|maximum nesting depth"):
        yamlio.loads("[" * 5000 + "]" * 5000, "deep.yaml")


def test_files_that_cannot_be_read(tmp_path: Path) -> None:
    with pytest.raises(YamlError, match=r"nope\.yaml: cannot read: No such file"):
        yamlio.load(tmp_path / "nope.yaml")
    bad = tmp_path / "latin1.yaml"
    bad.write_bytes(b"name: caf\xe9\n")
    with pytest.raises(YamlError, match=r"latin1\.yaml: cannot read: not UTF-8 text \(byte 9\)"):
        yamlio.load(bad)


def test_empty_document_is_none() -> None:
    assert yamlio.loads("# nothing\n", "e.yaml").data is None
