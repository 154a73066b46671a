"""The wheel, installed as a user would: one top-level ``whywait`` package, the shipped rules found by default.

Builds the wheel from this checkout (no build isolation: setuptools is already here, and the machine may have no
network), installs it with ``--no-deps`` into a fresh virtualenv whose only other path is this environment's
site-packages (the dependencies, not this checkout), and runs the CLI from an empty folder, so nothing can come
from the checkout by accident.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import sysconfig
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def installed(tmp_path_factory: pytest.TempPathFactory) -> Path:
    work = tmp_path_factory.mktemp("wheel")
    src = work / "src"  # a copy, so the build's scratch folders (build/, *.egg-info) stay out of the checkout
    shutil.copytree(ROOT, src, ignore=shutil.ignore_patterns(".git", ".venv", "build", "*.egg-info", "__pycache__",
                                                               ".pytest_cache", ".mypy_cache", ".ruff_cache"))
    r = subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q", "-w",
                        str(work / "dist"), str(src)], capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    (work / "build.log").write_text(r.stdout + r.stderr)
    (wheel,) = (work / "dist").glob("whywait-*.whl")
    venv = work / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True, timeout=120)
    py = venv / "bin" / "python"
    r = subprocess.run([str(py), "-m", "pip", "install", "-q", "--no-deps", "--no-index", str(wheel)],
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    site = Path(subprocess.run([str(py), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                               capture_output=True, text=True, check=True).stdout.strip())
    # the dependencies come from this environment; .pth lines add a path but do not run its .pth files, so this
    # environment's editable install of the checkout stays out
    (site / "deps.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")
    (work / "run").mkdir()
    return venv


def whywait(venv: Path, *args: str) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("WHYWAIT_") and k != "PYTHONPATH"}
    return subprocess.run([str(venv / "bin" / "whywait"), *args], capture_output=True, text=True, timeout=600,
                          cwd=venv.parent / "run", env=env)


def test_the_wheel_holds_one_top_level_package_with_the_rules(installed: Path) -> None:
    (wheel,) = (installed.parent / "dist").glob("whywait-*.whl")
    names = zipfile.ZipFile(wheel).namelist()
    tops = {n.split("/")[0] for n in names if not n.split("/")[0].endswith(".dist-info")}
    assert tops == {"whywait"}, tops
    for must in ("whywait/engine/cli.py", "whywait/agents/events.py", "whywait/topology/model.py",
                 "whywait/simulate/sim.py", "whywait/rules/job/job.straggler.yaml",
                 "whywait/rules/job/job.straggler.test.yaml", "whywait/rules/macros.yaml",
                 "whywait/engine/templates/", "whywait/simulate/scenarios/stragglers.yaml"):
        assert any(n.startswith(must) for n in names), must


def test_the_build_prints_no_warning(installed: Path) -> None:
    """`make demo` printed ~110 lines of setuptools warnings: `project.license` as a table, and the data folders
    engine/templates and simulate/scenarios missing from `packages`."""
    log = (installed.parent / "build.log").read_text()
    assert "Warning" not in log and "deprecated" not in log, log


def test_installed_cli_finds_its_own_code_and_rules(installed: Path) -> None:
    py = installed / "bin" / "python"
    r = subprocess.run([str(py), "-c", "import json, whywait, whywait.engine.cli as c; "
                        "print(json.dumps([whywait.__file__, c.__file__]))"],
                       capture_output=True, text=True, cwd=installed.parent / "run", check=True)
    for f in json.loads(r.stdout):
        assert str(installed) in f, f  # from the venv, not the checkout
    r = whywait(installed, "--version")
    assert r.returncode == 0 and r.stdout.startswith("whywait "), r.stdout + r.stderr
    r = whywait(installed, "rules", "check")
    assert r.returncode == 0, r.stdout + r.stderr
    assert "rules:0" not in r.stdout + r.stderr


def test_installed_rule_tests_run(installed: Path) -> None:
    site = next((installed / "lib").glob("python3*/site-packages"))
    shipped = site / "whywait" / "rules"
    # the GPU rules' tests, with the rest of the shipped rules loaded for the macros and inhibitions they name
    r = whywait(installed, "rules", "test", str(shipped / "gpu"), "--rules", str(shipped))
    assert r.returncode == 0, r.stdout + r.stderr
    assert "passed" in r.stdout.lower() or "ok" in r.stdout.lower(), r.stdout
