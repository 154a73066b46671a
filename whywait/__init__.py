"""whywait: tells the owning team where a GPU training job's waiting begins, and why.

One installable package.  In the wheel, ``whywait.agents``, ``whywait.engine``, ``whywait.topology`` and
``whywait.simulate`` are real subfolders (``pyproject.toml`` maps the repository's top-level folders onto them),
and the shipped rules are package data under ``whywait/rules``.

In a source checkout the same folders sit beside this one; extending ``__path__`` to the checkout's root makes
``whywait.agents`` resolve to ``<root>/agents`` there as well, so the code imports one way in both places.
Why not a ``src/whywait/...`` tree: the project's design keeps ``agents/``, ``rules/``, ``topology/`` and
``engine/`` at the top level where operators look for them.
"""

from __future__ import annotations

from pathlib import Path

_root = Path(__file__).resolve().parent.parent
if (_root / "engine" / "__init__.py").is_file() and (_root / "pyproject.toml").is_file():
    __path__.append(str(_root))  # a source checkout: see above


def _version() -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("whywait")
    except PackageNotFoundError:  # running from a checkout that was never pip-installed
        return "0+unknown"


__version__ = _version()
