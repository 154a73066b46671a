"""The ``whywait`` command's contract with a shell: --version, documented exit codes, one line per error,
a quiet end when stdout closes early, and no traceback even from a bug."""

from __future__ import annotations

import argparse
import subprocess
import sys
from pathlib import Path

import pytest
from whywait.engine.cli import main

from whywait import __version__
from whywait.errors import EXIT_CODES

REPO = Path(__file__).resolve().parents[1]


def test_version(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exc:
        main(["--version"])
    assert exc.value.code == 0 and capsys.readouterr().out == f"whywait {__version__}\n"


def test_help_documents_every_exit_code(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        main(["--help"])
    out = capsys.readouterr().out
    for code, what in EXIT_CODES.items():
        assert f"{code:>3}  {what}" in out


@pytest.mark.parametrize("args", [["rules", "metrics"], ["events", "doc"]])
def test_a_closed_stdout_ends_quietly(args: list[str]) -> None:
    # The reader closes the pipe before the command writes: the write fails with EPIPE, as under `| head`.
    proc = subprocess.Popen([sys.executable, "-m", "whywait", *args], cwd=REPO, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE)
    assert proc.stdout is not None and proc.stderr is not None
    proc.stdout.close()
    err = proc.stderr.read().decode()
    assert proc.wait(timeout=60) == 141 and err == ""


def test_notify_render_into_a_closed_pipe_ends_quietly(tmp_path: Path) -> None:
    import json

    from whywait.engine.diagnosis import Diagnosis, Evidence

    d = Diagnosis(rule_id="network.straggler-retransmits", fingerprint="f", status="firing", severity="warning",
                  title="train waits on node-07", cause="packet loss", job="train", owner=None, starts_at=1.0,
                  detected_at=2.0, evidence=(Evidence("net.rx_drops_per_s", "node-07", 9.0, "packets/s", 0.0),))
    f = tmp_path / "d.json"
    f.write_text(json.dumps(d.to_dict()))
    proc = subprocess.Popen([sys.executable, "-m", "whywait", "notify", "render", str(f)], cwd=REPO,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    assert proc.stdout is not None and proc.stderr is not None
    proc.stdout.close()
    err = proc.stderr.read().decode()
    assert proc.wait(timeout=60) == 141 and err == ""


def test_a_bug_is_one_line_and_exit_70(monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    import whywait.engine.commands.rules_cmd as rules_cmd

    def broken(args: argparse.Namespace) -> int:
        raise KeyError("boom")

    monkeypatch.setattr(rules_cmd, "run", broken)
    assert main(["rules", "metrics"]) == 70
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("whywait rules: internal error: KeyError: 'boom' (a bug in whywait")


def test_an_input_error_is_exit_2_and_an_unreachable_service_exit_3(tmp_path: Path,
                                                                     capsys: pytest.CaptureFixture[str]) -> None:
    bad = tmp_path / "topo.yaml"
    bad.write_text("format: 1\nformat: 1\n")
    assert main(["topology", "check", str(bad)]) == 1  # `check` reports the problems it found: exit 1
    assert capsys.readouterr().out == f"{bad}:2: duplicate key 'format' (the first is on line 1)\n"
    assert main(["replay", "--topology", str(bad), "--since", "-1m"]) == 2
    assert capsys.readouterr().err.endswith(f"{bad}:2: duplicate key 'format' (the first is on line 1)\n")


@pytest.mark.parametrize("argv, what", [
    (["events", "check", "{missing}"], "{missing}: cannot read: No such file or directory"),
    (["events", "check", "{folder}"], "{folder}: cannot read: Is a directory"),
    (["events", "check", "{binary}"], "{binary}: cannot read: not UTF-8 text"),
    # an empty capture said "0 valid, 0 invalid" and exit 0: a pass for an agent that wrote nothing
    (["events", "check", "{empty}"],
     "{empty}: holds no message (an empty file, or blank lines only): nothing to check"),
    (["topology", "check", "{missing}"], "{missing}: cannot read: No such file or directory"),
    (["topology", "check", "{folder}"], "{folder}: cannot read: Is a directory"),
    (["import", "{folder}", "-o", "{out}"], "{folder}: cannot read: Is a directory"),
    (["import", "{missing}", "-o", "{out}"], "{missing}: cannot read: No such file or directory"),
])
def test_a_file_that_cannot_be_read_is_exit_2_not_a_bug(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                                        argv: list[str], what: str) -> None:
    (tmp_path / "binary").write_bytes(b"\xff\xfe\n")
    (tmp_path / "empty").write_text("\n\n")
    names = {"missing": tmp_path / "nope", "folder": tmp_path, "binary": tmp_path / "binary", "out": tmp_path / "o",
             "empty": tmp_path / "empty"}
    assert main([a.format(**names) for a in argv]) == 2
    err = capsys.readouterr().err
    assert err == f"whywait {argv[0]}: {what.format(**names)}\n"


def test_events_check_reads_json_lines_and_a_json_array_alike(tmp_path: Path,
                                                              capsys: pytest.CaptureFixture[str]) -> None:
    import json

    good = {"schema": 2, "kind": "host", "time": 1.7e9, "node": "n1", "cpu_busy_pct": 50.8, "cpu_iowait_pct": 0.0,
            "cpu_steal_pct": 0.0, "mem_used_bytes": 730595328, "mem_total_bytes": 25276203008, "cpu_count": 2}
    msgs = [good, {**good, "node": 5}, good]
    lines, array = tmp_path / "m.jsonl", tmp_path / "m.json"
    lines.write_text("".join(json.dumps(m) + "\n" for m in msgs))
    array.write_text(json.dumps(msgs, indent=2))
    for f, bad_line in ((lines, 2), (array, 14)):  # the array: the line its second element starts on
        assert main(["events", "check", str(f)]) == 1
        out, err = capsys.readouterr()
        assert out.startswith(f"{f}:{bad_line}: node: ") and err == "2 valid, 1 invalid\n", (out, err)


def test_the_demo_says_an_unreachable_broker_as_the_engine_does(capsys: pytest.CaptureFixture[str],
                                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    """It ended in aiokafka's bare 'KafkaConnectionError' after trying to create its topics."""
    monkeypatch.setenv("WHYWAIT_KAFKA_BOOTSTRAP", "127.0.0.1:1")
    assert main(["demo"]) == 3
    assert capsys.readouterr().err == ("whywait demo: Kafka at 127.0.0.1:1 is unreachable: no answer to ApiVersions "
                                       "(WHYWAIT_KAFKA_BOOTSTRAP names it: is that broker still running? "
                                       "`whywait kafka start` starts a local one)\n")
    # given some other way (a flag, the local broker's file), the advice is to start one or to set the variable
    from whywait.engine.errors import BrokerUnavailable

    monkeypatch.delenv("WHYWAIT_KAFKA_BOOTSTRAP")
    assert str(BrokerUnavailable("127.0.0.1:2", "nothing answers there")) == (
        "Kafka at 127.0.0.1:2 is unreachable: nothing answers there (start one with `whywait kafka start` or set "
        "WHYWAIT_KAFKA_BOOTSTRAP)")


def test_a_usage_error_is_one_line_with_the_option_meant(capsys: pytest.CaptureFixture[str]) -> None:
    """argparse printed the command's whole usage (eight lines for replay) before the one line that mattered."""
    for argv, want in (
            (["replay", "--sinse", "-2h"], "whywait replay: unrecognized arguments: --sinse -2h (did you mean "
                                          "--since?); `whywait replay --help` lists the options\n"),
            (["replsy"], "whywait: argument COMMAND: invalid choice: 'replsy' (did you mean 'replay'?); "
                         "`whywait --help` lists the options\n"),
            (["import", "--format", "kinto", "x"], "whywait import: argument --format: invalid choice: 'kinto' "
                                                   "(did you mean 'kineto'?); `whywait import --help` lists the "
                                                   "options\n")):
        with pytest.raises(SystemExit) as exc:
            main(argv)
        assert exc.value.code == 2 and capsys.readouterr().err == want
