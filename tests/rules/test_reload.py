"""Hot reload: edits are picked up, a bad edit is refused with its errors, the last good set stays."""

from __future__ import annotations

import os
from pathlib import Path

from whywait.engine.rules.reload import RuleReloader

from tests.rules.test_schema import GOOD


def _bump(f: Path) -> None:
    st = f.stat()
    os.utime(f, (st.st_atime, st.st_mtime + 5))  # filesystems with coarse mtimes still see the edit


def test_reload_picks_up_edits_and_refuses_bad_ones(tmp_path: Path) -> None:
    d = tmp_path / "rules"
    d.mkdir()
    f = d / "network.test-rule.yaml"
    good = GOOD + "severity: warning\n"
    f.write_text(good)
    r = RuleReloader([d])
    assert r.poll() is None  # nothing changed
    f.write_text(good.replace("severity: warning", "severity: critical"))
    _bump(f)
    res = r.poll()
    assert res is not None and res.ok and res.rules is not None
    assert res.rules.rules["network.test-rule"].severity == "critical"
    f.write_text(good.replace("window: 5s", "window: five", 1))
    _bump(f)
    res = r.poll()
    assert res is not None and not res.ok
    assert len(res.errors) == 1 and "'when.all[0].window' must be a duration like '60s'" in res.errors[0]
    assert res.errors[0].startswith(f"{f}:")
