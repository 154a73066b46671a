"""Shipped rule files and their tests, damaged: `whywait rules check` names the problem, never crashes.

A rule file cut short, a line indented wrongly, a stray bracket, a huge number, a Python tag, a
self-referencing alias, a non-UTF-8 byte: each is refused with file and line (exit 1 or 2) or passes,
and none is an internal error (exit 70).
"""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Iterator

import pytest
from whywait.engine.cli import main

from whywait.errors import EXIT_INTERNAL

RULES = Path(__file__).resolve().parents[2] / "rules"
SAMPLE = sorted(p for p in RULES.rglob("*.yaml")
                if not p.name.endswith(".test.yaml") and p.name != "macros.yaml")[::6]  # macros: no test file


def _damaged(data: bytes) -> Iterator[tuple[str, bytes]]:
    lines = data.split(b"\n")
    for i in range(0, len(lines), max(1, len(lines) // 12)):
        yield f"cut after line {i}", b"\n".join(lines[:i])
        for label, change in (("a stray ']'", lambda ln: ln + b" ]"), ("indented", lambda ln: b"  " + ln),
                              ("a huge number", lambda ln: ln.replace(b": ", b": 1e400 #", 1)),
                              ("a Python tag", lambda ln: ln.replace(b": ", b": !!python/object:os.system ", 1)),
                              ("a self alias", lambda ln: ln.replace(b": ", b": &a [*a] #", 1))):
            yield f"{label} on line {i + 1}", b"\n".join(lines[:i] + [change(lines[i])] + lines[i + 1:])
    yield "a non-UTF-8 byte", data[: len(data) // 2] + b"\xff" + data[len(data) // 2:]


@pytest.mark.parametrize("rule", SAMPLE, ids=lambda p: p.stem)
@pytest.mark.parametrize("which", ["rule", "test"])
def test_rules_check_of_a_damaged_file(rule: Path, which: str, tmp_path: Path,
                                       capsys: pytest.CaptureFixture[str]) -> None:
    test = rule.with_name(rule.stem + ".test.yaml")
    target = rule if which == "rule" else test
    assert target.exists(), f"{rule.name} has no test file (every shipped rule has one)"
    failures = []
    for what, data in _damaged(target.read_bytes()):
        folder = tmp_path / "rules"
        shutil.rmtree(folder, ignore_errors=True)
        folder.mkdir()
        shutil.copy(rule, folder / rule.name)
        if test.exists():
            shutil.copy(test, folder / test.name)
        (folder / target.name).write_bytes(data)
        rc = main(["rules", "check", str(folder)])
        err = capsys.readouterr().err
        if rc == EXIT_INTERNAL or "Traceback" in err:
            failures.append(f"{what}: rc {rc}: {err.strip()[-200:]}")
    assert failures == []


def test_another_yaml_file_in_a_rules_folder_is_one_line(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    # A topology left beside the rules gave ten errors: one per key it has and one per rule key it lacks.
    shutil.copy(RULES / "job" / "job.whole-job-slow.yaml", tmp_path)
    shutil.copy(RULES / "macros.yaml", tmp_path)
    (tmp_path / "cluster.yaml").write_text("format: 1\nname: lab\nnodes: []\n")
    assert main(["rules", "check", str(tmp_path)]) == 1
    err = capsys.readouterr()
    lines = [ln for ln in (err.out + err.err).splitlines() if "cluster.yaml" in ln]
    assert lines == [f"{tmp_path / 'cluster.yaml'}:1: not a rule file: none of its keys (format, name, nodes) is "
                     "a rule's; move it out of the rules folder"]
