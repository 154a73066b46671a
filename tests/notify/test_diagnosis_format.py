"""A diagnosis read back from a file, a topic or a snapshot is checked field by field (Diagnosis.from_dict).

Before, `whywait notify render` of a hand-edited diagnosis (a number written as a string, a rank as
null, a time past any date) failed inside the renderer as an internal error, and `whywait digest`
stopped at one such record on the diagnoses topic.  Every field of a real diagnosis is replaced in
turn by values of the wrong type: each is one line naming the field, or renders.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Callable

import pytest
from whywait.engine.cli import main
from whywait.engine.diagnosis import Diagnosis, DiagnosisFormatError
from whywait.engine.report.digest import Digest

from tests.support.hostile import retyped
from whywait.errors import EXIT_INTERNAL

WRONG: tuple[Any, ...] = (None, "x", -1, 1e308, [], {}, True, 10**30)


def test_every_field_of_the_wrong_type_is_one_line(make_diagnosis: Callable[..., Diagnosis], tmp_path: Path,
                                                   capsys: pytest.CaptureFixture[str]) -> None:
    real = json.loads(json.dumps(make_diagnosis(ranks=(48, 49), cost={"gpu_hours_lost": 1.5}).to_dict()))
    path = tmp_path / "d.json"
    failures = []
    for what, d in retyped(real, WRONG, deleted=True):
        path.write_text(json.dumps(d))
        rc = main(["notify", "render", str(path)])
        err = capsys.readouterr().err
        if rc == EXIT_INTERNAL or "Traceback" in err or (rc != 0 and len(err.strip().splitlines()) != 1):
            failures.append(f"{what}: rc {rc}: {err.strip()[-200:]}")
    assert failures == []


def test_the_error_names_the_field(make_diagnosis: Callable[..., Diagnosis]) -> None:
    d = make_diagnosis().to_dict()
    d["evidence"][0]["value"] = "909"
    with pytest.raises(DiagnosisFormatError, match=r"^evidence\[0\]\.value must be a number \(got '909'\)$"):
        Diagnosis.from_dict(d)
    d = make_diagnosis().to_dict()
    d["starts_at"] = 1e300
    with pytest.raises(DiagnosisFormatError, match=r"^starts_at must be a Unix time in seconds"):
        Diagnosis.from_dict(d)
    # A newer engine's extra fields are still ignored, at the top and in the evidence.
    d = make_diagnosis().to_dict()
    d["added_later"] = 1
    d["evidence"][0]["added_later"] = 2
    assert Diagnosis.from_dict(d) == make_diagnosis()


def test_digest_refuses_a_bad_record_where_it_is_read(make_diagnosis: Callable[..., Diagnosis]) -> None:
    dg = Digest(since=0.0, until=2e9)
    bad = make_diagnosis().to_dict()
    bad["starts_at"] = "yesterday"
    with pytest.raises(ValueError, match="starts_at"):  # digest_cmd counts it as an unreadable diagnosis
        dg.add_diagnosis(bad)
    dg.add_diagnosis(make_diagnosis().to_dict())
    dg.finish()  # the good one is kept and the digest finishes
    assert len(dg.last_diag) == 1
