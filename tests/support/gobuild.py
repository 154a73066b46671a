"""Go tools for tests (Alertmanager, promtool): built once with ``go install`` and cached.

:func:`go_install` returns ``$WHYWAIT_CACHE/<name>/<version>/<name>`` (``~/.cache/whywait/...`` by
default, like the Kafka jars), building it first when it is missing::

    GOFLAGS=-mod=mod GOBIN=<tmp> go install <module>@<version>

Concurrent test processes build it once (a file lock beside the binary) and the binary appears by an
atomic rename, never half-written.  Without Go it raises ``FileNotFoundError`` (the caller skips); a
build that fails or times out raises :class:`GoBuildError` with one line (the build's last line of
output) and leaves the whole output in ``build.log`` beside the binary.
"""

from __future__ import annotations

import fcntl
import os
import shutil
import subprocess
import tempfile
import time
from pathlib import Path


class GoBuildError(RuntimeError):
    """``go install`` failed or timed out; the message is one line, the full output is in ``build.log``."""


def go_available() -> bool:
    return shutil.which("go") is not None


def cache_dir(name: str, version: str) -> Path:
    """Where a tool is kept: ``$WHYWAIT_CACHE/<name>/<version>`` (``~/.cache/whywait`` by default)."""
    base = os.environ.get("WHYWAIT_CACHE")
    root = Path(base).expanduser() if base else Path.home() / ".cache" / "whywait"
    return root / name / version


def _usable(path: Path) -> bool:
    return path.is_file() and os.access(path, os.X_OK)


def go_install(module: str, version: str, name: str, *, timeout: float, no_go: str) -> Path:
    """The cached binary ``name`` of ``module@version``, built now if missing (see the module docs).

    ``no_go`` is the ``FileNotFoundError``'s message when Go is absent (the caller's skip reason).
    """
    target = cache_dir(name, version) / name
    if _usable(target):
        return target
    if not go_available():
        raise FileNotFoundError(no_go)
    target.parent.mkdir(parents=True, exist_ok=True)
    with open(target.parent / "build.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # another test process may be building it right now
        if _usable(target):
            return target
        log = target.parent / "build.log"
        cmd = f"go install {module}@{version}"
        with tempfile.TemporaryDirectory(dir=target.parent) as gobin:
            env = {**os.environ, "GOBIN": gobin, "GOFLAGS": "-mod=mod"}
            start = time.monotonic()
            try:
                proc = subprocess.run(["go", "install", f"{module}@{version}"], env=env, capture_output=True,
                                      text=True, timeout=timeout, cwd=gobin)
            except subprocess.TimeoutExpired as e:
                out = e.stdout or b""
                log.write_bytes(out if isinstance(out, bytes) else out.encode())
                raise GoBuildError(f"{cmd} timed out after {timeout:.0f}s; its output is in {log}") from None
            took = time.monotonic() - start
            output = proc.stdout + proc.stderr
            log.write_text(f"$ GOFLAGS=-mod=mod GOBIN=<tmp> {cmd}\n# exit {proc.returncode} after {took:.0f}s\n"
                           + output)
            built = Path(gobin) / name
            if proc.returncode != 0 or not built.is_file():
                lines = [ln.strip() for ln in output.splitlines() if ln.strip()]
                last = lines[-1] if lines else "no output"
                raise GoBuildError(f"{cmd} failed (exit {proc.returncode}) after {took:.0f}s: {last} "
                                   f"(full output in {log})")
            os.replace(built, target)  # atomic: a half-written binary is never found
    return target
