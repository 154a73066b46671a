"""Output paths are checked before a command works, and a refused file is one line, exit 2, never a "bug".

Before: ``whywait replay --report DIR`` on a path it could not create, or ``export -o`` into a folder that did not
exist, read the whole window first and then ended with ``internal error: FileNotFoundError ... (a bug in
whywait ...)``, exit 70.  These tests put each output under a regular file (``tmp/file/out``), which fails for
every user, root included.
"""

from __future__ import annotations

import argparse
from pathlib import Path

import pytest
from whywait.engine.cli import main
from whywait.engine.commands.outputs import check_output
from whywait.engine.errors import ConfigError


@pytest.fixture
def blocker(tmp_path: Path) -> Path:
    """A regular file: nothing can be created under it."""
    f = tmp_path / "file"
    f.write_text("x")
    return f


def test_no_output_asked_passes() -> None:
    check_output(None, "--json")


def test_a_new_file_is_probed_and_nothing_is_left(tmp_path: Path) -> None:
    out = tmp_path / "new.json"
    check_output(out, "--json")
    assert not out.exists()


def test_an_existing_file_is_kept_as_it_is(tmp_path: Path) -> None:
    out = tmp_path / "old.json"
    out.write_text("keep me")
    check_output(out, "--json")
    assert out.read_text() == "keep me"


@pytest.mark.parametrize("case, expected", [
    ("under_file", "its folder {blocker} is not a folder"),
    ("missing_parent", "its folder {tmp}/no/such does not exist"),
    ("a_folder", "is a folder; name a file"),
])
def test_a_file_that_cannot_be_written_is_refused(case: str, expected: str, tmp_path: Path, blocker: Path) -> None:
    path = {"under_file": blocker / "out.json", "missing_parent": tmp_path / "no" / "such" / "out.json",
            "a_folder": tmp_path}[case]
    with pytest.raises(ConfigError) as err:
        check_output(path, "--json")
    assert str(err.value) == f"--json {path}: " + expected.format(blocker=blocker, tmp=tmp_path)


def test_a_report_folder_is_made_with_its_parents(tmp_path: Path) -> None:
    out = tmp_path / "a" / "b" / "report"
    check_output(out, "--report", folder=True)
    assert out.is_dir() and list(out.iterdir()) == []  # the probe file is gone


def test_a_report_folder_that_cannot_be_made_is_refused(blocker: Path) -> None:
    with pytest.raises(ConfigError, match=r"^--report .*: is a file, not a folder$"):
        check_output(blocker, "--report", folder=True)
    with pytest.raises(ConfigError, match=r"^--report .*/file/report: cannot create the folder \(.+\)$"):
        check_output(blocker / "report", "--report", folder=True)


# Every command that writes a file, with the flag, refused before it reads its input: the missing bundle, traces or
# topology sources named here would give another error if the command had got that far.
COMMANDS = [
    (["replay", "--input", "missing.whywait", "--json"], "--json"),
    (["replay", "--input", "missing.whywait", "--stats-json"], "--stats-json"),
    (["replay", "--input", "missing.whywait", "--backtest-json"], "--backtest-json"),
    (["replay", "--input", "missing.whywait", "--plot"], "--plot"),
    (["replay", "--input", "missing.whywait", "--report"], "--report"),
    (["export", "--since", "-10m", "--bootstrap", "127.0.0.1:1", "-o"], "--output"),
    (["digest", "--since", "7d", "--bootstrap", "127.0.0.1:1", "--json"], "--json"),
    (["digest", "--since", "7d", "--bootstrap", "127.0.0.1:1", "--blocks"], "--blocks"),
    (["digest", "--since", "7d", "--bootstrap", "127.0.0.1:1", "--plot"], "--plot"),
    (["eval", "--quick", "--json"], "--json"),
    (["eval", "--quick", "--plot"], "--plot"),
    (["bench", "--gpus", "8", "--bootstrap", "127.0.0.1:1", "--json"], "--json"),
    (["bench", "--gpus", "8", "--bootstrap", "127.0.0.1:1", "--keep"], "--keep"),
    (["simulate", "--dry-run", "--duration", "10", "--topology-out"], "--topology-out"),
    (["simulate", "--dry-run", "--duration", "10", "--truth-out"], "--truth-out"),
    (["import", "missing-trace.json", "-o"], "--output"),
    (["topology", "import", "slurm-conf", "missing.conf", "-o"], "--output"),
]


@pytest.mark.parametrize("argv, flag", COMMANDS, ids=[" ".join(a[:1] + a[-1:]) for a, _ in COMMANDS])
def test_every_command_refuses_an_output_it_cannot_write_first(argv: list[str], flag: str, blocker: Path,
                                                               capsys: pytest.CaptureFixture[str]) -> None:
    out = blocker / "out"
    assert main([*argv, str(out)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1, err
    assert err.startswith(f"whywait {argv[0]}: {flag} {out}: "), err
    assert "internal error" not in err


def test_a_file_the_system_refuses_is_exit_2_not_a_bug(monkeypatch: pytest.MonkeyPatch,
                                                       capsys: pytest.CaptureFixture[str]) -> None:
    """Whatever no command checked (a disk that fills, a folder removed meanwhile) is still the user's, said so."""
    import whywait.engine.commands.rules_cmd as rules_cmd

    def full(args: argparse.Namespace) -> int:
        raise OSError(28, "No space left on device", "/data/report.html")

    monkeypatch.setattr(rules_cmd, "run", full)
    assert main(["rules", "metrics"]) == 2
    assert capsys.readouterr().err == "whywait rules: /data/report.html: No space left on device\n"


def test_an_oserror_without_a_file_is_still_reported_as_a_bug(monkeypatch: pytest.MonkeyPatch,
                                                              capsys: pytest.CaptureFixture[str]) -> None:
    import whywait.engine.commands.rules_cmd as rules_cmd

    def broken(args: argparse.Namespace) -> int:
        raise OSError("something inside whywait")

    monkeypatch.setattr(rules_cmd, "run", broken)
    assert main(["rules", "metrics"]) == 70
    assert "internal error: OSError" in capsys.readouterr().err


@pytest.mark.parametrize("argv", [
    ["replay", "--input", "missing.whywait", "--plot"],
    ["digest", "--since", "7d", "--bootstrap", "127.0.0.1:1", "--plot"],
    ["eval", "--quick", "--plot"],
], ids=["replay", "digest", "eval"])
@pytest.mark.parametrize("name, says", [
    ("out.txt", "'.txt' is not an image format matplotlib writes"),
    ("out", "it has no suffix"),  # matplotlib wrote out.png, not the name given
])
def test_a_plot_matplotlib_cannot_write_is_refused_before_anything_is_read(
        argv: list[str], name: str, says: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    # Before: `--plot out.txt` replayed the whole window, then ended in "internal error: ValueError: Format 'txt'
    # is not supported (... a bug in whywait ...)", exit 70.
    out = tmp_path / name
    assert main([*argv, str(out)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith(f"whywait {argv[0]}: --plot {out}: {says}: name a .png"), err
    assert not out.exists()


@pytest.mark.parametrize("name", ["out.png", "out.SVG", "out.pdf"])
def test_an_image_suffix_matplotlib_writes_passes(name: str, tmp_path: Path) -> None:
    check_output(tmp_path / name, "--plot", image=True)


@pytest.mark.parametrize("argv, flag", [
    (["replay", "--input", "missing.whywait", "--json", "-"], "--json"),
    (["digest", "--since", "7d", "--bootstrap", "127.0.0.1:1", "--json", "-"], "--json"),
], ids=["replay", "digest"])
def test_stdout_as_an_output_file_is_refused_not_written_as_a_file_named_dash(
        argv: list[str], flag: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.chdir(tmp_path)
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert err == f"whywait {argv[0]}: {flag} -: writing to stdout is not supported (the command's summary goes " \
                  "there): name a file\n"
    assert not (tmp_path / "-").exists()


def test_a_plot_inside_the_report_folder_that_report_will_create_passes(tmp_path: Path,
                                                                         capsys: pytest.CaptureFixture[str]) -> None:
    # Before: `--report r5 --plot r5/timeline.png` was refused: "its folder r5 does not exist".
    from whywait.engine.commands.outputs import check_outputs

    rep = tmp_path / "r5"
    check_outputs([], [(rep, "--report")], [(rep / "timeline.png", "--plot")])
    assert rep.is_dir()
    # and the command goes past its outputs: the missing bundle is what stops it now
    assert main(["replay", "--input", str(tmp_path / "missing.whywait"), "--report", str(tmp_path / "r6"),
                 "--plot", str(tmp_path / "r6" / "t.png")]) == 2
    err = capsys.readouterr().err
    assert "--plot" not in err and "missing.whywait" in err, err
