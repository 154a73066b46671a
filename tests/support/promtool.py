"""Prometheus's ``promtool`` for tests: the one on PATH, else built once from its Go module and cached.

:func:`promtool_binary` returns ``promtool`` from PATH when there is one, else the cached binary
(``$WHYWAIT_CACHE/promtool/v0.316.0/promtool``, ``~/.cache/whywait/...`` by default), built by
:func:`tests.support.gobuild.go_install` when it is missing (a large build: about 6.5 minutes on a
2-core machine with a cold module cache; v0.316.0's go.mod asks for Go 1.26.7 or later).  Without Go
the caller skips with :data:`NO_GO`; a build that fails raises
:class:`~tests.support.gobuild.GoBuildError` with one line.
"""

from __future__ import annotations

import shutil
from pathlib import Path

from tests.support.gobuild import go_install

VERSION = "v0.316.0"
MODULE = "github.com/prometheus/prometheus/cmd/promtool"
NO_GO = ("Go is not installed (needed once to build promtool " + VERSION
         + " for the alert rule tests; or put a promtool on PATH)")


def promtool_binary(*, timeout: float = 1800.0) -> Path:
    """A promtool: the one on PATH, else the cached one, built now if missing."""
    on_path = shutil.which("promtool")
    if on_path:
        return Path(on_path)
    return go_install(MODULE, VERSION, "promtool", timeout=timeout, no_go=NO_GO)
