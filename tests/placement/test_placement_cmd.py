"""The command's edges that need no broker: --print, the prolog that never fails a job, one-line errors."""

from __future__ import annotations

import io
import json
import sys

import pytest
from whywait.engine.cli import main

from tests.placement.conftest import FIX


def test_prolog_prints_the_placement(capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SLURM_JOB_ID", "4242")
    rc = main(["placement", "slurm", "--prolog", "--print", "--scontrol-json",
               str(FIX / "scontrol-show-job-23.02.json"), "--ownership", str(FIX / "ownership.yaml")])
    out, err = capsys.readouterr()
    assert rc == 0
    msg = json.loads(out)
    assert msg["topic"] == "whywait.placement.v1" and msg["key"] == "slurm-4242" and len(msg["ranks"]) == 16
    assert msg["user"] == "alice" and msg["account"] == "llm-pretrain" and msg["slack_channel"] == "#llm-pretrain"
    assert "placement slurm-4242: 16 rank(s) on 2 node(s)" in err


def test_a_failing_prolog_never_fails_the_job(capsys: pytest.CaptureFixture[str],
                                              monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("SLURM_JOB_ID", raising=False)
    assert main(["placement", "slurm", "--prolog", "--print"]) == 0  # Slurm would drain the node otherwise
    assert "SLURM_JOB_ID is not set" in capsys.readouterr().err
    assert main(["placement", "slurm", "--prolog", "--print", "--strict"]) == 2
    assert capsys.readouterr().err.startswith("whywait placement: SLURM_JOB_ID is not set")


def test_publish_from_stdin(capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(sys, "stdin", io.StringIO("job: j1\nnodes: [{node: n1, gpus: [0, 1]}]\n"))
    assert main(["placement", "publish", "-", "--print", "--default-channel", "#gpu-alerts"]) == 0
    out, err = capsys.readouterr()
    msg = json.loads(out)
    assert msg["team"] == "no owner known" and msg["slack_channel"] == "#gpu-alerts"
    assert "owner unknown/no owner known #gpu-alerts" in err


def test_publish_errors_are_one_line(tmp_path, capsys: pytest.CaptureFixture[str]) -> None:  # type: ignore[no-untyped-def]
    bad = tmp_path / "p.yaml"
    bad.write_text("job: j1\nnodes: {node: n1}\n")
    assert main(["placement", "publish", str(bad), "--print"]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"whywait placement: {bad}:1: job 'j1': nodes must be a list") and "Traceback" not in err


def test_a_prolog_with_no_writable_spool_or_a_broken_ownership_file_still_exits_0(
        tmp_path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> None:  # type: ignore[no-untyped-def]
    # PrologSlurmctld runs as SlurmUser, often with no writable home; a non-zero exit requeues or holds the job.
    monkeypatch.setenv("SLURM_JOB_ID", "4242")
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    rc = main(["placement", "slurm", "--prolog", "--scontrol-json", str(FIX / "scontrol-show-job-23.02.json"),
               "--bootstrap", "127.0.0.1:1", "--spool", str(blocker / "spool")])
    err = capsys.readouterr().err
    assert rc == 0, err
    assert "(the placement spool is" in err and "--spool or WHYWAIT_PLACEMENT_SPOOL" in err, err
    assert err.rstrip().endswith("(the job runs; it is not placed)") and "Traceback" not in err
    # A broken ownership file: the job is still placed, with no owner known.
    bad = tmp_path / "own.yaml"
    bad.write_text("owners: [\n")
    rc = main(["placement", "slurm", "--prolog", "--print", "--scontrol-json",
               str(FIX / "scontrol-show-job-23.02.json"), "--ownership", str(bad), "--default-channel", "#gpu"])
    out, err = capsys.readouterr()
    assert rc == 0 and json.loads(out)["team"] == "no owner known", err
    assert "placing the job with no owner known" in err


def test_a_numeric_job_id_is_text_and_spaces_around_one_are_refused(capsys: pytest.CaptureFixture[str],
                                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(sys, "stdin", io.StringIO("job: 4312\nnodes: [{node: n1, gpus: [0]}]\n"))
    assert main(["placement", "publish", "-", "--print"]) == 0
    assert json.loads(capsys.readouterr().out)["job"] == "4312"
    monkeypatch.setattr(sys, "stdin", io.StringIO("job: ' spaced '\nnodes: [{node: n1, gpus: [0]}]\n"))
    assert main(["placement", "publish", "-", "--print"]) == 2
    assert "has spaces around it; the training's steps name it 'spaced'" in capsys.readouterr().err


def test_an_unreachable_kubernetes_api_is_one_line_and_exit_3(capsys: pytest.CaptureFixture[str]) -> None:
    import socket

    with socket.socket() as s:  # a port nothing listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    rc = main(["placement", "k8s", "--once", "--print", "--api-server", f"http://127.0.0.1:{port}"])
    err = capsys.readouterr().err
    assert rc == 3, err
    lines = [ln for ln in err.splitlines() if ln.strip()]
    assert len(lines) == 1 and lines[0].startswith("whywait placement: Kubernetes API unreachable"), err
