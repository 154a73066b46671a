"""Hot reload of rule files: the running engine picks up edits, and refuses bad ones.

The engine calls :meth:`RuleReloader.poll` every few seconds.  When any rule,
macro or override file under the watched paths was added, removed or changed,
the whole set is loaded again: a good set replaces the running one; a bad one
is refused with every error, and the last good set keeps running.
"""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Iterable

from whywait.engine.rules.loader import RuleLoadError, RuleSet, load_rules, yaml_files

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class ReloadResult:
    """The outcome of a reload: the new set, or the errors that refused it."""

    rules: RuleSet | None
    errors: tuple[str, ...] = ()

    @property
    def ok(self) -> bool:
        return self.rules is not None


class RuleReloader:
    """Watches rule paths by modification time and size (no inotify: works on any filesystem)."""

    def __init__(self, paths: Iterable[str | Path]) -> None:
        self.paths = [Path(p) for p in paths]
        self._seen = self._scan()

    def _scan(self) -> dict[str, tuple[float, int]]:
        out: dict[str, tuple[float, int]] = {}
        for p in self.paths:
            files = yaml_files(p) if p.is_dir() else [p]
            for f in files:
                try:
                    st = os.stat(f)
                except OSError:
                    continue
                out[str(f)] = (st.st_mtime, st.st_size)
        return out

    def poll(self) -> ReloadResult | None:
        """Return None when nothing changed, else the result of loading the changed set."""
        now = self._scan()
        if now == self._seen:
            return None
        self._seen = now
        try:
            return ReloadResult(load_rules(self.paths))
        except RuleLoadError as exc:
            return ReloadResult(None, tuple(str(e) for e in exc.errors))
        except Exception as exc:  # noqa: BLE001 - a loader bug met by an edit must not stop the running engine
            log.exception("loading the edited rules failed")
            return ReloadResult(None, (f"the rules could not be loaded: {type(exc).__name__}: {exc}",))
