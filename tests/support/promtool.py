"""Prometheus's ``promtool`` for tests: the one on PATH, else built once from its Go module and cached.

:func:`promtool_binary` returns ``promtool`` from PATH when there is one, else the cached binary
(``$WHYWAIT_CACHE/promtool/v0.316.0/promtool``, ``~/.cache/whywait/...`` by default, next to the
Alertmanager of :mod:`tests.support.alertmanager`), building it first when it is missing::

    GOFLAGS=-mod=mod GOBIN=<tmp> go install github.com/prometheus/prometheus/cmd/promtool@v0.316.0

(a large build: several minutes on a 2-core machine with a cold module cache; v0.316.0's go.mod asks
for Go 1.26.7 or later).  Concurrent test processes
build it once (a file lock) and the binary appears by an atomic rename, never half-written.  Without
Go the caller skips with :data:`NO_GO`; a build that fails raises :class:`PromtoolBuildError` with one
line (its last line of output) and leaves the whole output in ``build.log`` beside the binary.
"""

from __future__ import annotations

import fcntl
import os
import shutil
import subprocess
import tempfile
import time
from pathlib import Path

VERSION = "v0.316.0"
MODULE = "github.com/prometheus/prometheus/cmd/promtool"
NO_GO = ("Go is not installed (needed once to build promtool " + VERSION
         + " for the alert rule tests; or put a promtool on PATH)")


class PromtoolBuildError(RuntimeError):
    """``go install`` failed or timed out; the message is one line, the full output is in ``build.log``."""


def cache_dir() -> Path:
    """Where the binary is kept: ``$WHYWAIT_CACHE/promtool/VERSION`` (``~/.cache/whywait`` by default)."""
    base = os.environ.get("WHYWAIT_CACHE")
    root = Path(base).expanduser() if base else Path.home() / ".cache" / "whywait"
    return root / "promtool" / VERSION


def go_available() -> bool:
    return shutil.which("go") is not None


def _usable(path: Path) -> bool:
    return path.is_file() and os.access(path, os.X_OK)


def promtool_binary(*, timeout: float = 1800.0) -> Path:
    """A promtool: the one on PATH, else the cached one, built now if missing.  Raises
    :class:`PromtoolBuildError` when the build fails and ``FileNotFoundError`` (with :data:`NO_GO`)
    when there is neither a promtool nor Go."""
    on_path = shutil.which("promtool")
    if on_path:
        return Path(on_path)
    target = cache_dir() / "promtool"
    if _usable(target):
        return target
    if not go_available():
        raise FileNotFoundError(NO_GO)
    target.parent.mkdir(parents=True, exist_ok=True)
    with open(target.parent / "build.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # another test process may be building it right now
        if _usable(target):
            return target
        log = target.parent / "build.log"
        cmd = f"go install {MODULE}@{VERSION}"
        with tempfile.TemporaryDirectory(dir=target.parent) as gobin:
            env = {**os.environ, "GOBIN": gobin, "GOFLAGS": "-mod=mod"}
            start = time.monotonic()
            try:
                proc = subprocess.run(["go", "install", f"{MODULE}@{VERSION}"], env=env, capture_output=True,
                                      text=True, timeout=timeout, cwd=gobin)
            except subprocess.TimeoutExpired as e:
                out = e.stdout or b""
                log.write_bytes(out if isinstance(out, bytes) else out.encode())
                raise PromtoolBuildError(f"{cmd} timed out after {timeout:.0f}s; its output is in {log}") from None
            took = time.monotonic() - start
            output = proc.stdout + proc.stderr
            log.write_text(f"$ GOFLAGS=-mod=mod GOBIN=<tmp> {cmd}\n# exit {proc.returncode} after {took:.0f}s\n"
                           + output)
            built = Path(gobin) / "promtool"
            if proc.returncode != 0 or not built.is_file():
                lines = [ln.strip() for ln in output.splitlines() if ln.strip()]
                last = lines[-1] if lines else "no output"
                raise PromtoolBuildError(f"{cmd} failed (exit {proc.returncode}) after {took:.0f}s: {last} "
                                         f"(full output in {log})")
            os.replace(built, target)  # atomic: a half-written binary is never found
    return target
