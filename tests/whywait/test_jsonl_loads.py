"""JSON nested past the parser's stack, given to every reader of outside JSON: one line, never an internal error.

`json.loads` raises RecursionError there, which no `except ValueError` catches: `topology import agent`,
`notify render` and `digest` (a record on the diagnoses topic) reported internal errors.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from whywait.engine.cli import main

from whywait import jsonl
from whywait.errors import EXIT_INTERNAL

DEEP = "[" * 100_000 + "]" * 100_000


def test_loads_makes_deep_nesting_a_decode_error() -> None:
    with pytest.raises(json.JSONDecodeError, match="nested too deeply"):
        jsonl.loads(DEEP)
    with pytest.raises(ValueError, match="nested too deeply"):
        jsonl.loads(DEEP.encode())
    assert jsonl.loads('{"a": [1]}') == {"a": [1]}


@pytest.mark.parametrize("argv", [
    ["events", "check", "{f}"],
    ["topology", "import", "agent", "{f}", "-o", "{out}"],
    ["topology", "import", "k8s-nodes", "{f}", "-o", "{out}"],
    ["topology", "import", "netq", "{f}", "-o", "{out}"],
    ["notify", "render", "{f}"],
    ["placement", "publish", "{f}", "--print"],
    ["placement", "slurm", "--prolog", "--job-id", "1", "--scontrol-json", "{f}", "--print", "--strict"],
    ["import", "--format", "kineto", "{f}", "--job", "j", "--node", "n", "-o", "{out}"],
    ["import", "--format", "steps", "{f}", "--job", "j", "--node", "n", "-o", "{out}"],
], ids=lambda a: " ".join(a[:3]))
def test_every_reader_of_outside_json_says_one_line(argv: list[str], tmp_path: Path,
                                                    capsys: pytest.CaptureFixture[str]) -> None:
    f = tmp_path / "deep.json"
    f.write_text(DEEP + "\n")
    rc = main([a.format(f=f, out=tmp_path / "out") for a in argv])
    err = capsys.readouterr().err
    assert rc != EXIT_INTERNAL and "internal error" not in err and "Traceback" not in err, err[-300:]
