"""Packaging: the wheel installs ONE top-level package, ``whywait``.

The repository keeps ``agents/``, ``engine/``, ``topology/``, ``simulate/`` and ``rules/`` at the top level, where
operators look for them; ``package_dir`` maps each onto ``whywait.<name>``.  The package list is computed here (not
hand-kept in pyproject.toml) so a new subpackage, data folder or rules folder is packaged without editing anything.
Folders of data inside the code (``engine/templates``, ``simulate/scenarios``) are listed as packages of their own,
with all their files: left out, setuptools warns at every build that Python would import them but the wheel's
configuration does not name them.  Everything else (name, version, dependencies, scripts) is in pyproject.toml.
"""

from __future__ import annotations

import os

from setuptools import find_packages, setup

CODE = ("agents", "engine", "topology", "simulate")


def _data_folders() -> list[str]:
    """The folders inside the code packages that hold data only (no ``__init__.py``), as paths."""
    out = []
    for top in CODE:
        for folder, dirs, _files in os.walk(top):
            dirs[:] = sorted(d for d in dirs if d != "__pycache__")
            if not os.path.isfile(os.path.join(folder, "__init__.py")):
                out.append(folder)
    return out


def _packages() -> list[str]:
    pkgs = ["whywait"]
    for top in CODE:
        pkgs += [f"whywait.{top}"] + [f"whywait.{top}.{p}" for p in find_packages(top)]
    pkgs += ["whywait." + folder.replace(os.sep, ".") for folder in _data_folders()]
    # The shipped rules are data: every folder under rules/ becomes a (data-only) package.
    for folder, _dirs, _files in os.walk("rules"):
        pkgs.append("whywait." + folder.replace(os.sep, "."))
    return pkgs


setup(
    packages=_packages(),
    package_dir={"whywait": "whywait", **{f"whywait.{top}": top for top in (*CODE, "rules")}},
    package_data={
        "whywait.engine.localkafka": ["*.xml", "*.properties"],
        **{"whywait." + folder.replace(os.sep, "."): ["*"] for folder in _data_folders()},
        **{"whywait." + folder.replace(os.sep, "."): ["*.yaml", "*.md"] for folder, _d, _f in os.walk("rules")},
    },
)
