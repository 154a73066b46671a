"""Where a bundle keeps its rules, and bundles that are not whole.

One rules folder is laid out as it is (``rules/macros.yaml``, ``rules/gpu/...``; it was ``rules/rules/...``),
the manifest says what the replay loads (``rule_paths``), and bundles written the old way still replay.  An
empty, truncated, compressed or newer bundle, or a folder, is one line naming the file and what it is.
"""

from __future__ import annotations

import gzip
import hashlib
import json
import zipfile
from pathlib import Path
from typing import Any, Iterator

import pytest
from whywait.engine.cli import main
from whywait.engine.commands.export_cmd import bundle_rules, rule_files
from whywait.engine.importers import ImportFormatError
from whywait.engine.importers.bundle import Bundle, BundleWriter, is_bundle
from whywait.engine.rules.loader import load_rules

RULES = Path(__file__).resolve().parents[2] / "rules"
START = 1_764_442_800.0
EVENT = json.dumps({"schema": 1, "kind": "host", "time": START + 1, "node": "node-01", "cpu_busy_pct": 5.0,
                    "cpu_iowait_pct": 0.0, "mem_used_bytes": 1, "mem_total_bytes": 2}).encode()
WINDOW = {"since": START, "until": START + 60, "lead_s": 0.0}
SITE_RULE = """\
apiVersion: whywait/v1
id: site.cpu-hot
title: "{{ job }} waits on {{ node }}: CPU saturated"
cause: "{{ node }} is busy"
next_step: "look at {{ node }}"
group_by: [job, node]
when: {macro: hot}
"""


def site_tree(tmp_path: Path, name: str = "site") -> Path:
    """A small rules tree: macros at its top, a rule in a sub-folder that uses one."""
    tree = tmp_path / name
    (tree / "host").mkdir(parents=True)
    (tree / "macros.yaml").write_text("macros:\n  hot: {type: threshold, metric: host.cpu_busy_pct, agg: max, "
                                      "window: 5s, value: \"> 95\", culprit: true}\n")
    (tree / "host" / "site.cpu-hot.yaml").write_text(SITE_RULE)
    return tree


def write(path: Path, files: list[tuple[str, Path]], rule_paths: list[str] | None = None) -> Path:
    with BundleWriter(path, dict(WINDOW)) as bw:
        bw.add("whywait.host.v1", EVENT)
        bw.close(None, files, rule_paths)
    return path


def members(path: Path) -> list[str]:
    with zipfile.ZipFile(path) as z:
        return sorted(n for n in z.namelist() if n.startswith("rules/"))


def extracted(path: Path, dest: Path) -> list[Path]:
    b = Bundle(path)
    b.verify()
    dest.mkdir()
    return b.extract(dest)[1]


def old_bundle(path: Path, rules: dict[str, bytes]) -> Path:
    """A bundle as whywait wrote it before ``rule_paths``: each rule path in a folder of its own under rules/."""
    events = (json.dumps({"topic": "whywait.host.v1", "value": EVENT.decode()}, separators=(",", ":"))
              + "\n").encode()
    all_members = {"events.jsonl": events, **rules}
    manifest = {"format": "whywait-bundle", "version": 1, "whywait": "0.1.0", "schema": 2, "created_at": START,
                "window": WINDOW, "messages": {"whywait.host.v1": 1},
                "members": {n: {"sha256": hashlib.sha256(b).hexdigest(), "bytes": len(b)}
                            for n, b in sorted(all_members.items())}}
    with zipfile.ZipFile(path, "w", compression=zipfile.ZIP_DEFLATED) as z:
        for n, b in all_members.items():
            z.writestr(n, b)
        z.writestr("manifest.json", json.dumps(manifest))
    return path


# ---- the layout ----------------------------------------------------------------------------------------------


def test_one_rules_folder_is_laid_out_as_it_is(tmp_path: Path) -> None:
    """`whywait export` of ./rules stored rules/rules/gpu/...: now rules/gpu/..., rules/macros.yaml."""
    names = [n for n, _ in rule_files([RULES])]
    assert "macros.yaml" in names and "gpu/gpu.xid-ecc.yaml" in names
    assert not any(n.startswith("rules/") for n in names)
    files, paths = bundle_rules([RULES])
    assert paths == ["rules"]
    b = write(tmp_path / "b.whywait", files, paths)
    got = members(b)
    assert "rules/macros.yaml" in got and "rules/gpu/gpu.xid-ecc.yaml" in got
    assert not any(n.startswith("rules/rules/") for n in got)
    assert json.loads(zipfile.ZipFile(b).read("manifest.json"))["rule_paths"] == ["rules"]
    loaded = extracted(b, tmp_path / "out")
    assert loaded == [tmp_path / "out" / "rules"]
    assert {r.id for r in load_rules(loaded)} == {r.id for r in load_rules([RULES])}


def test_one_rule_file_is_rules_slash_its_name(tmp_path: Path) -> None:
    rule = RULES / "gpu" / "gpu.xid-ecc.yaml"
    files, paths = bundle_rules([rule])
    assert files == [("gpu.xid-ecc.yaml", rule)] and paths == ["rules/gpu.xid-ecc.yaml"]
    b = write(tmp_path / "b.whywait", files, paths)
    assert members(b) == ["rules/gpu.xid-ecc.yaml"]
    assert extracted(b, tmp_path / "out") == [tmp_path / "out" / "rules" / "gpu.xid-ecc.yaml"]


def test_several_paths_keep_a_folder_each_loaded_in_order(tmp_path: Path) -> None:
    site = site_tree(tmp_path)
    (site / "host" / "override.yaml").write_text("override: gpu.xid-ecc\nseverity: warning\n")
    files, paths = bundle_rules([RULES, site])
    assert paths == ["rules/rules", "rules/site"]
    b = write(tmp_path / "b.whywait", files, paths)
    loaded = extracted(b, tmp_path / "out")
    assert loaded == [tmp_path / "out" / "rules" / "rules", tmp_path / "out" / "rules" / "site"]
    rs = load_rules(loaded)  # the site's macros found at its top; its override applied after the shipped rule
    assert "site.cpu-hot" in rs.rules and rs.rules["gpu.xid-ecc"].severity == "warning"


def test_only_rule_yaml_travels(tmp_path: Path) -> None:
    """A README, an editor's backup or a stray archive is no rule; one over 4 MiB made the bundle unreplayable."""
    site = site_tree(tmp_path)
    (site / "README.md").write_text("# our rules\n")
    (site / "host" / "site.cpu-hot.yaml~").write_text(SITE_RULE)
    (site / "dump.tar").write_bytes(b"\0" * (5 << 20))
    files, paths = bundle_rules([site])
    assert sorted(n for n, _ in files) == ["host/site.cpu-hot.yaml", "macros.yaml"]
    b = write(tmp_path / "b.whywait", files, paths)
    assert {r.id for r in load_rules(extracted(b, tmp_path / "out"))} == {"site.cpu-hot"}


def test_a_path_given_twice_or_inside_another_travels_once(tmp_path: Path) -> None:
    """The engine loads a file reached twice once; a bundle holding it twice replayed every rule as a duplicate."""
    site = site_tree(tmp_path)
    files, paths = bundle_rules([site, site, site / "host"])
    assert sorted(n for n, _ in files) == ["site/host/site.cpu-hot.yaml", "site/macros.yaml"]
    assert paths == ["rules/site"]
    b = write(tmp_path / "b.whywait", files, paths)
    assert {r.id for r in load_rules(extracted(b, tmp_path / "out"))} == {"site.cpu-hot"}


def test_dot_and_dot_dot_are_named_by_their_folder(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    site = site_tree(tmp_path)
    other = site_tree(tmp_path, "other")
    (other / "host" / "site.cpu-hot.yaml").rename(other / "host" / "site.cpu-warm.yaml")
    (other / "host" / "site.cpu-warm.yaml").write_text(SITE_RULE.replace("site.cpu-hot", "site.cpu-warm"))
    monkeypatch.chdir(site / "host")
    files, paths = bundle_rules([Path(".."), other])
    assert paths == ["rules/site", "rules/other"] and all(".." not in n for n, _ in files)


def test_a_new_bundle_without_rule_paths_loads_its_one_tree(tmp_path: Path) -> None:
    """`BundleWriter.close(topo, rule_files([RULES]))` (no rule_paths): macros.yaml at the top of rules/ is a tree."""
    b = write(tmp_path / "b.whywait", rule_files([RULES]))
    assert "rule_paths" not in json.loads(zipfile.ZipFile(b).read("manifest.json"))
    assert extracted(b, tmp_path / "out") == [tmp_path / "out" / "rules"]


# ---- bundles written the old way ---------------------------------------------------------------------------


def test_an_old_layout_bundle_still_loads_each_folder_as_its_path(tmp_path: Path) -> None:
    site = site_tree(tmp_path)
    shipped = {f"rules/rules/{f.relative_to(RULES)}": f.read_bytes() for f in RULES.rglob("*.yaml")}
    own = {f"rules/site/{f.relative_to(site)}": f.read_bytes() for f in site.rglob("*.yaml")}
    b = old_bundle(tmp_path / "old.whywait", {**shipped, **own})
    loaded = extracted(b, tmp_path / "out")
    assert loaded == [tmp_path / "out" / "rules" / "rules", tmp_path / "out" / "rules" / "site"]
    ids = {r.id for r in load_rules(loaded)}
    assert "site.cpu-hot" in ids and "gpu.xid-ecc" in ids


def test_an_old_layout_bundle_replays(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    shipped = {f"rules/rules/{f.relative_to(RULES)}": f.read_bytes() for f in RULES.rglob("*.yaml")}
    b = old_bundle(tmp_path / "old.whywait", shipped)
    assert main(["replay", "--input", str(b)]) == 0
    assert "replayed 1 messages" in capsys.readouterr().out


def test_an_old_bundle_of_one_rule_file_loads_it(tmp_path: Path) -> None:
    rule = RULES / "gpu" / "gpu.xid-ecc.yaml"
    b = old_bundle(tmp_path / "old.whywait", {"rules/gpu.xid-ecc.yaml": rule.read_bytes()})
    assert extracted(b, tmp_path / "out") == [tmp_path / "out" / "rules" / "gpu.xid-ecc.yaml"]


# ---- export writes the new layout ----------------------------------------------------------------------------


def fake_kafka(monkeypatch: pytest.MonkeyPatch, events: list[tuple[str, bytes]]) -> None:
    from whywait.engine.commands import replay_cmd

    def batches(*_a: Any, **_k: Any) -> Iterator[tuple[str, bytes]]:
        yield from events

    monkeypatch.setattr(replay_cmd, "kafka_batches", batches)


def test_export_writes_the_one_folder_layout_and_it_replays(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                            capsys: pytest.CaptureFixture[str]) -> None:
    fake_kafka(monkeypatch, [("whywait.host.v1", EVENT)])
    site = site_tree(tmp_path)
    out = tmp_path / "incident.whywait"
    assert main(["export", "--since", str(START), "--until", str(START + 60), "--rules", str(site),
                 "--bootstrap", "127.0.0.1:1", "-o", str(out)]) == 0
    assert members(out) == ["rules/host/site.cpu-hot.yaml", "rules/macros.yaml"]
    capsys.readouterr()
    assert main(["replay", "--input", str(out)]) == 0
    assert "replayed 1 messages" in capsys.readouterr().out


def test_export_of_an_empty_window_says_the_bundle_holds_no_events(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                                   capsys: pytest.CaptureFixture[str]) -> None:
    fake_kafka(monkeypatch, [])
    out = tmp_path / "incident.whywait"
    assert main(["export", "--since", str(START), "--until", str(START + 60), "--rules", str(site_tree(tmp_path)),
                 "--job", "train", "--bootstrap", "127.0.0.1:1", "-o", str(out)]) == 0
    err = capsys.readouterr().err
    assert "whywait export: no message was read between 2025-11-29 19:00:00 and 2025-11-29 19:01:00 UTC for " \
           f"train: {out} holds no events" in err


# ---- a manifest's rule_paths -----------------------------------------------------------------------------------


@pytest.mark.parametrize("rule_paths, says", [
    ("rules", "manifest.json: rule_paths: expected a list of up to 64 paths under rules/"),
    (["rules/../../etc"], "manifest.json: rule_paths[0]: expected a list of up to 64 paths under rules/"),
    (["/etc/passwd"], "manifest.json: rule_paths[0]: expected"),
    ([3], "manifest.json: rule_paths[0]: expected"),
    (["rules"] * 65, "manifest.json: rule_paths: expected"),
])
def test_a_malformed_rule_paths_is_refused_on_opening(tmp_path: Path, rule_paths: Any, says: str) -> None:
    b = write(tmp_path / "b.whywait", *bundle_rules([site_tree(tmp_path)]))
    bad = _with_manifest(b, lambda m: m.update({"rule_paths": rule_paths}))
    with pytest.raises(ImportFormatError) as exc:
        Bundle(bad)
    assert str(exc.value).startswith(f"{bad}: {says}")


def test_rule_paths_naming_no_rule_file_is_refused_on_extracting(tmp_path: Path) -> None:
    b = write(tmp_path / "b.whywait", *bundle_rules([site_tree(tmp_path)]))
    bad = _with_manifest(b, lambda m: m.update({"rule_paths": ["rules", "rules/gone"]}))
    with pytest.raises(ImportFormatError) as exc:
        extracted(bad, tmp_path / "out")
    assert str(exc.value) == f"{bad}: manifest.json: rule_paths[1]: 'rules/gone' names no rule file in the bundle"


def _with_manifest(src: Path, change: Any) -> Path:
    with zipfile.ZipFile(src) as z:
        all_members = {n: z.read(n) for n in z.namelist()}
    manifest = json.loads(all_members.pop("manifest.json"))
    change(manifest)
    out = src.with_name("edited.whywait")
    with zipfile.ZipFile(out, "w") as z:
        for n, b in all_members.items():
            z.writestr(n, b)
        z.writestr("manifest.json", json.dumps(manifest))
    return out


# ---- bundles that are not whole ----------------------------------------------------------------------------


def good(tmp_path: Path) -> Path:
    with BundleWriter(tmp_path / "good.whywait", dict(WINDOW)) as bw:
        for _ in range(2000):
            bw.add("whywait.host.v1", EVENT)
        bw.close(None, *bundle_rules([site_tree(tmp_path)]))
    return tmp_path / "good.whywait"


def _cut(src: Path, keep: float) -> bytes:
    data = src.read_bytes()
    return data[: int(len(data) * keep)]


@pytest.mark.parametrize("make, says", [
    (lambda src: b"", "is empty (0 bytes), not a bundle: was the export interrupted, or the copy not finished?"),
    (lambda src: _cut(src, 0.5), "is truncated: a zip archive whose end is missing ("),
    (lambda src: src.read_bytes()[:-10], "is truncated: a zip archive whose end is missing ("),
    (lambda src: src.read_bytes()[:64], "is truncated: a zip archive whose end is missing (64 bytes)"),
    (lambda src: gzip.compress(src.read_bytes()), "is gzip-compressed, not a bundle (a bundle is a zip already)"),
    (lambda src: b"step,duration\n1,2\n", "is a table, not a bundle: `whywait import "),
    (lambda src: b"\x00\x01 binary\n", "not a whywait bundle (not a zip archive: "),
])
def test_a_bundle_that_is_not_whole_is_one_line(tmp_path: Path, capsys: pytest.CaptureFixture[str], make: Any,
                                                says: str) -> None:
    bad = tmp_path / "bad.whywait"
    bad.write_bytes(make(good(tmp_path)))
    with pytest.raises(ImportFormatError) as exc:
        Bundle(bad)
    assert str(exc.value).startswith(f"{bad}: {says}")
    assert is_bundle(bad)  # `whywait import` reads it as a bundle, not as a step table
    for argv in (["replay", "--input", str(bad)], ["import", str(bad), "-o", str(tmp_path / "out.jsonl")]):
        assert main(argv) == 2
        err = capsys.readouterr().err
        assert err.startswith(f"whywait {argv[0]}: {bad}: {says}") and len(err.splitlines()) == 1


def test_a_truncated_zip_not_named_whywait_is_still_read_as_a_bundle(tmp_path: Path,
                                                                      capsys: pytest.CaptureFixture[str]) -> None:
    bad = tmp_path / "incident.zip"
    bad.write_bytes(_cut(good(tmp_path), 0.5))
    assert is_bundle(bad)
    assert main(["import", str(bad), "-o", str(tmp_path / "out.jsonl")]) == 2
    assert "is truncated: a zip archive whose end is missing" in capsys.readouterr().err


def test_a_folder_is_not_a_bundle(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    d = tmp_path / "incident.whywait"
    d.mkdir()
    assert main(["replay", "--input", str(d)]) == 2
    assert capsys.readouterr().err == (f"whywait replay: {d}: is a folder, not a bundle (the file `whywait export -o` "
                                       "writes)\n")


def test_a_bundle_from_a_newer_whywait_says_so(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    newer = _with_manifest(good(tmp_path), lambda m: m.update({"version": 2, "whywait": "9.1.0"}))
    assert main(["replay", "--input", str(newer)]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"whywait replay: {newer}: bundle format version 2, written by a newer whywait (9.1.0); "
                          "this one (") and err.endswith(") reads version 1: upgrade whywait to read it\n")


def test_another_format_is_named_as_it_was_given(tmp_path: Path) -> None:
    other = _with_manifest(good(tmp_path), lambda m: m.update({"format": "x" * 500}))
    with pytest.raises(ImportFormatError) as exc:
        Bundle(other)
    text = str(exc.value)
    assert text.startswith(f"{other}: manifest.json: expected format 'whywait-bundle' version 1 (got \"xxx")
    assert len(text) < 300  # a hostile manifest's value is cut short



@pytest.mark.parametrize("argv, says", [
    (["--rules", "@/notes.md"], "whywait export: --rules @/notes.md: is not a rule file (rule files are YAML, named "
                                "*.yaml or *.yml)\n"),
    (["--rules", ""], "whywait export: argument --rules: an empty path (an unset variable?); `whywait export --help` "
                      "lists the options\n"),
    (["--topology", ""], "whywait export: argument --topology: an empty path (an unset variable?); `whywait export "
                         "--help` lists the options\n"),
])
def test_export_refuses_a_wrong_rules_path_in_one_line(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                                      monkeypatch: pytest.MonkeyPatch, argv: list[str],
                                                      says: str) -> None:
    fake_kafka(monkeypatch, [("whywait.host.v1", EVENT)])
    (tmp_path / "notes.md").write_text("# notes\n")
    out = tmp_path / "incident.whywait"
    argv = ["export", "--since", str(START), "--until", str(START + 60), "--bootstrap", "127.0.0.1:1", "-o", str(out),
            *(a.replace("@", str(tmp_path)) for a in argv)]
    try:
        code = main(argv)
    except SystemExit as exc:  # argparse refuses before the command runs
        code = int(exc.code or 0)
    assert code == 2 and not out.exists()
    assert capsys.readouterr().err == says.replace("@", str(tmp_path))
