"""Every command that takes ``--bootstrap`` says a malformed address is malformed (exit 2, naming the part that is
wrong), before any connection: they took the flag as given, and ``simulate`` ended in an internal error (exit 70),
``digest`` in "unreachable" (exit 3).  The check itself is ``whywait.bootstrap`` (shared with the node agent)."""

from __future__ import annotations

from pathlib import Path

import pytest

from whywait.bootstrap import BootstrapError, check_bootstrap

BAD = "not a host:abc"


@pytest.mark.parametrize("cmd", [
    ["simulate", "--nodes", "2", "--duration", "2", "--speed", "0"],
    ["import", "STEPS", "--job", "j", "--node", "n1"],
    ["digest", "--since", "-1h"],
    ["export", "--since", "-1h", "-o", "x.whywait"],
    ["replay", "--since", "-1h"],
    ["silence", "--bootstrap", BAD, "list"],
    ["agent", "--once"],
])
def test_a_malformed_bootstrap_flag_is_one_line_exit_2(cmd: list[str], tmp_path: Path,
                                                      monkeypatch: pytest.MonkeyPatch,
                                                      capsys: pytest.CaptureFixture[str]) -> None:
    from whywait.engine.cli import main

    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("WHYWAIT_KAFKA_BOOTSTRAP", raising=False)
    steps = tmp_path / "steps.csv"
    steps.write_text("time,rank,step,duration_s\n1796400000,0,1,0.8\n1796400001,0,2,0.8\n")
    args = [str(steps) if a == "STEPS" else a for a in cmd]
    if "--bootstrap" not in args:  # `silence` takes it before its action
        args += ["--bootstrap", BAD]
    assert main(args) == 2
    err = capsys.readouterr().err.strip().splitlines()
    line = next(e for e in err if "--bootstrap" in e)
    assert "the host 'not a host' is not a host name or address (it has a space)" in line, err
    assert "the port 'abc' is not a number" in line and "unreachable" not in " ".join(err), err
    assert not any("internal error" in e or "Traceback" in e for e in err), err


def test_the_shared_check_names_the_source_and_keeps_good_addresses() -> None:
    assert check_bootstrap(" 127.0.0.1:9092 , [::1]:9093", "X") == "127.0.0.1:9092,[::1]:9093"
    with pytest.raises(BootstrapError,
                       match=r"^WHYWAIT_KAFKA_BOOTSTRAP 'h:0': in 'h:0', the port 0 is outside 1-65535"):
        check_bootstrap("h:0", "WHYWAIT_KAFKA_BOOTSTRAP")
    assert issubclass(BootstrapError, ValueError)
