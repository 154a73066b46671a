"""Fixture trees for the agent tests: real captures unpacked into temporary roots."""

from __future__ import annotations

import os
import shutil

import pytest

from tests.agents.ttar import extract

FIXTURES = os.path.join(os.path.dirname(__file__), os.pardir, "fixtures", "agents")


def fixture_path(*parts: str) -> str:
    return os.path.normpath(os.path.join(FIXTURES, *parts))


@pytest.fixture(scope="session")
def procfs_root(tmp_path_factory: pytest.TempPathFactory) -> str:
    """prometheus/procfs's ``fixtures.ttar`` unpacked: a root with ``proc/`` and ``sys/``."""
    d = tmp_path_factory.mktemp("procfs")
    extract(fixture_path("procfs", "fixtures.ttar"), str(d))
    return str(d / "fixtures")


@pytest.fixture(scope="session")
def node_exporter_root(tmp_path_factory: pytest.TempPathFactory) -> str:
    """node_exporter's ``sys.ttar`` unpacked, with its ``/proc`` captures beside it."""
    d = tmp_path_factory.mktemp("node_exporter")
    extract(fixture_path("node_exporter", "sys.ttar"), str(d))
    shutil.copytree(fixture_path("node_exporter", "proc"), str(d / "proc"))
    return str(d)


@pytest.fixture()
def h100_ib_root(tmp_path: "os.PathLike[str]") -> str:
    """A root whose ``/sys/class/infiniband`` is gpud's real H100 tree (writable copy)."""
    root = os.path.join(str(tmp_path), "root")
    shutil.copytree(fixture_path("gpud", "sys-class-infiniband-h100.0"),
                    os.path.join(root, "sys", "class", "infiniband"))
    for dirpath, dirnames, filenames in os.walk(root):
        for name in dirnames + filenames:
            os.chmod(os.path.join(dirpath, name), 0o755 if name in dirnames else 0o644)
    return root
