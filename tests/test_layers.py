"""The import direction of every package: nothing runs back up the layers.

    whywait (the root: errors, YAML, durations)
      └── agents, topology            the node agent and the cluster model: no engine, no simulator
            └── engine                the stream processor and its pure core
                  └── simulate        the simulator and what is measured with it (eval, rule tests)
                        └── engine/commands, engine/cli.py    the CLI edge: may import anything

Read from the source (every ``import`` statement, lazy ones inside functions included), so a violation is caught
even on a code path no other test runs.  The pure core (the rule evaluator, the rule model, the topology model)
also stays free of Kafka, faust, Slack and NVML, so it replays deterministically and tests fast.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]

# package -> the whywait packages it must never import
FORBIDDEN: dict[str, set[str]] = {
    "whywait": {"agents", "topology", "engine", "simulate"},
    "agents": {"topology", "engine", "simulate"},
    "topology": {"agents", "engine", "simulate"},
    "engine": {"simulate"},
}
# the CLI edge of the engine package: allowed to reach the simulator (whywait simulate, eval, rules test, demo)
EDGE = ("engine/commands/", "engine/cli.py", "whywait/__main__.py")
IO_LIBS = {"aiokafka", "kafka", "faust", "mode", "slack_sdk", "pynvml"}
PURE_CORE = ("engine/evaluate", "engine/rules", "engine/diagnosis.py", "topology")


def _imports(path: Path) -> list[tuple[int, str]]:
    """Every absolute module name ``path`` imports, with its line (relative imports resolved to the package)."""
    tree = ast.parse(path.read_text(), str(path))
    rel = path.relative_to(ROOT).with_suffix("")
    here = ["whywait", *rel.parts] if rel.parts[0] != "whywait" else list(rel.parts)
    out: list[tuple[int, str]] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            out += [(node.lineno, a.name) for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = here[: len(here) - node.level]
                out.append((node.lineno, ".".join([*base, node.module] if node.module else base)))
            elif node.module:
                out.append((node.lineno, node.module))
    return out


def _files(top: str) -> list[Path]:
    return sorted(p for p in (ROOT / top).rglob("*.py") if "__pycache__" not in p.parts)


@pytest.mark.parametrize("package", sorted(FORBIDDEN))
def test_no_import_runs_back_up_the_layers(package: str) -> None:
    bad = []
    for f in _files(package):
        rel = f.relative_to(ROOT).as_posix()
        if rel.startswith(EDGE):
            continue
        for line, mod in _imports(f):
            parts = mod.split(".")
            # the old top-level names are gone: everything is whywait.<package>
            if parts[0] in {"agents", "engine", "topology", "simulate"}:
                bad.append(f"{rel}:{line}: imports {mod} (use whywait.{mod})")
            elif parts[0] == "whywait" and len(parts) > 1 and parts[1] in FORBIDDEN[package]:
                bad.append(f"{rel}:{line}: {package} must not import {mod}")
    assert not bad, "\n".join(bad)


def test_the_pure_core_imports_no_io_library() -> None:
    bad = []
    for top in PURE_CORE:
        files = [ROOT / top] if top.endswith(".py") else _files(top)
        for f in files:
            for line, mod in _imports(f):
                if mod.split(".")[0] in IO_LIBS:
                    bad.append(f"{f.relative_to(ROOT)}:{line}: imports {mod}")
    assert not bad, "\n".join(bad)


def test_the_checker_sees_a_violation(tmp_path: Path) -> None:
    """The test above cannot pass vacuously: the parser finds lazy imports inside functions too."""
    f = ROOT / "agents" / "_layers_probe_tmp.py"
    f.write_text("def f():\n    from whywait.engine.errors import ConfigError\n    return ConfigError\n")
    try:
        assert (2, "whywait.engine.errors") in _imports(f)
        with pytest.raises(AssertionError, match="agents must not import whywait.engine.errors"):
            test_no_import_runs_back_up_the_layers("agents")
    finally:
        f.unlink()
