"""Reading a bundle's events: every line as written, a bad line named by its number."""

from __future__ import annotations

import json
import zipfile
from pathlib import Path

import pytest
from whywait.engine.importers.bundle import Bundle, BundleWriter


def bundle_with(tmp_path: Path, events: bytes) -> Bundle:
    p = tmp_path / "b.whywait"
    with zipfile.ZipFile(p, "w", compression=zipfile.ZIP_DEFLATED) as z:
        z.writestr("manifest.json", json.dumps({"format": "whywait-bundle", "version": 1}))
        z.writestr("events.jsonl", events)
    return Bundle(p)


@pytest.mark.parametrize("events, want", [
    (b'{"topic":"a","value":"{\\"x\\":\\"\\u00e9\\ud83d\\ude00\\"}"}\n', [("a", '{"x":"é😀"}'.encode())]),
    (b'{"topic":"a","value":"v"}\n{"topic":"b","value":"w"}', [("a", b"v"), ("b", b"w")]),  # no last newline
    (b'{"value":"v","topic":"t","extra":1}\r\n', [("t", b"v")]),
    (b"", []),
])
def test_events_are_read_as_written(tmp_path: Path, events: bytes, want: list) -> None:
    assert list(bundle_with(tmp_path, events).events()) == want


def test_a_long_bundle_crosses_read_chunks_line_by_line(tmp_path: Path) -> None:
    lines = [{"topic": f"t{i % 7}", "value": json.dumps({"i": i, "pad": "x" * (i % 300)})} for i in range(20_000)]
    b = bundle_with(tmp_path, "".join(json.dumps(x) + "\n" for x in lines).encode())  # several MiB
    assert list(b.events()) == [(x["topic"], x["value"].encode()) for x in lines]


@pytest.mark.parametrize("events, line", [
    (b'{"topic":"a","value":"v"}\n\n{"topic":"b","value":"w"}\n', 2),  # an empty line
    (b'{"topic":"whywait.host.v1"}\n', 1),
    (b'{"topic":"a","value":"v"}\nnot json\n', 2),
    (b'{"topic":"whywait.host.v1","value":"\\ud800"}\n', 1),  # not text
    (b'{"topic":"a","value":"v"}\n' + b"[" * 100_000 + b"]" * 100_000 + b"\n", 2),  # nested past any decoder's depth
    (b'{"topic":"a","value":"v","x":' + b"[" * 100_000 + b"]" * 100_000 + b"}\n", 1),
])
def test_a_bad_line_is_skipped_named_and_counted(tmp_path: Path, events: bytes, line: int) -> None:
    """One bad line costs that line (it used to stop a replay half done): the good ones are all read."""
    b = bundle_with(tmp_path, events)
    good = [(x["topic"], x["value"].encode()) for x in map(json.loads, events.splitlines()[:line - 1])]
    assert list(b.events())[:line - 1] == good
    assert b.skipped == {f'events.jsonl: line {line}: expected {{"topic": ..., "value": "..."}}': 1}


def test_past_three_bad_lines_they_are_counted_together(tmp_path: Path) -> None:
    good = b'{"topic":"a","value":"v"}\n'
    b = bundle_with(tmp_path, good + b"x\n" * 5 + good)
    assert list(b.events()) == [("a", b"v")] * 2
    assert sorted(b.skipped.values()) == [1, 1, 1, 2] and sum(b.skipped.values()) == 5


def test_two_rule_folders_of_one_name_both_travel(tmp_path: Path) -> None:
    """The shipped ./rules and a site's /etc/whywait/rules: the second overwrote the first in the bundle."""
    from whywait.engine.commands.export_cmd import rule_files
    from whywait.engine.rules.loader import load_rules

    shipped = Path(__file__).resolve().parents[2] / "rules"
    site = tmp_path / "site" / "rules"
    site.mkdir(parents=True)
    own = next(shipped.rglob("network.straggler-retransmits.yaml")).read_text()
    (site / "site.retransmits.yaml").write_text(own.replace("id: network.straggler-retransmits",
                                                            "id: site.retransmits", 1))
    names = [n for n, _ in rule_files([shipped, site])]
    assert "rules-2/site.retransmits.yaml" in names and any(n.startswith("rules/network/") for n in names)
    p = tmp_path / "b.whywait"
    with BundleWriter(p, {"since": 0.0, "until": 1.0, "lead_s": 0.0}) as bw:
        bw.close(None, rule_files([shipped, site]))
    b = Bundle(p)
    b.verify()
    _, paths = b.extract(tmp_path / "out")
    assert [q.name for q in paths] == ["rules", "rules-2"]
    ids = {r.id for r in load_rules(paths)}
    assert {"site.retransmits", "network.straggler-retransmits"} <= ids
