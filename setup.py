"""Packaging: the wheel installs ONE top-level package, ``whywait``.

The repository keeps ``agents/``, ``engine/``, ``topology/``, ``simulate/`` and ``rules/`` at the top level, where
operators look for them; ``package_dir`` maps each onto ``whywait.<name>``.  The package list is computed here (not
hand-kept in pyproject.toml) so a new subpackage or rules folder is packaged without editing anything.  Everything
else (name, version, dependencies, scripts) is in pyproject.toml.
"""

from __future__ import annotations

import os

from setuptools import find_packages, setup

CODE = ("agents", "engine", "topology", "simulate")


def _packages() -> list[str]:
    pkgs = ["whywait"]
    for top in CODE:
        pkgs += [f"whywait.{top}"] + [f"whywait.{top}.{p}" for p in find_packages(top)]
    # The shipped rules are data: every folder under rules/ becomes a (data-only) package.
    for folder, _dirs, _files in os.walk("rules"):
        pkgs.append("whywait." + folder.replace(os.sep, "."))
    return pkgs


setup(
    packages=_packages(),
    package_dir={"whywait": "whywait", **{f"whywait.{top}": top for top in (*CODE, "rules")}},
    package_data={
        "whywait.engine": ["templates/*.j2", "localkafka/*.xml", "localkafka/*.properties"],
        "whywait.simulate": ["scenarios/*.yaml"],
        **{"whywait." + folder.replace(os.sep, "."): ["*.yaml", "*.md"] for folder, _d, _f in os.walk("rules")},
    },
)
