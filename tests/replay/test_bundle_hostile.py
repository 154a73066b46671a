"""Hostile bundles: every edit is refused in one line naming the bundle, nothing is read quadratically or held.

An events.jsonl without line ends took 15.7 s and 480 MB for 200 MiB; members the manifest did not list were
loaded unchecked (and an empty member list checked nothing); malformed manifests were internal errors; a bad
bundled topology was named by a deleted temporary path.
"""

from __future__ import annotations

import hashlib
import json
import time
import tracemalloc
import zipfile
from pathlib import Path
from typing import Any, Callable

import pytest
from whywait.engine.cli import main
from whywait.engine.importers import ImportFormatError
from whywait.engine.importers import bundle as bundle_mod
from whywait.engine.importers.bundle import Bundle, BundleWriter, _lines
from whywait.simulate.cluster import make_cluster

START = 1_764_442_800.0
EVENT = json.dumps({"schema": 1, "kind": "host", "time": START + 1, "node": "node-01", "cpu_busy_pct": 5.0,
                    "cpu_iowait_pct": 0.0, "mem_used_bytes": 1, "mem_total_bytes": 2}).encode()
RULE = (Path(__file__).resolve().parents[2] / "rules" / "gpu" / "gpu.xid-ecc.yaml")


def good_bundle(tmp_path: Path) -> Path:
    topo = tmp_path / "topo.yaml"
    make_cluster(nodes=2).to_yaml(topo)
    p = tmp_path / "good.whywait"
    with BundleWriter(p, {"since": START, "until": START + 60, "lead_s": 0.0}) as bw:
        bw.add("whywait.host.v1", EVENT)
        bw.close(topo, [("gpu/gpu.xid-ecc.yaml", RULE)])
    return p


def edited(src: Path, change: Callable[[dict[str, bytes], dict[str, Any]], Any], name: str = "bad.whywait",
           relist: bool = False) -> Path:
    """A copy of ``src`` after ``change(members, manifest)``; ``relist`` recomputes every checksum after it."""
    with zipfile.ZipFile(src) as z:
        members = {n: z.read(n) for n in z.namelist()}
    manifest = json.loads(members.pop("manifest.json"))
    change(members, manifest)
    if relist:
        manifest["members"] = {n: {"sha256": hashlib.sha256(b).hexdigest(), "bytes": len(b)}
                               for n, b in members.items()}
    out = src.with_name(name)
    return written(out, members, json.dumps(manifest))


def written(out: Path, members: dict[str, bytes], manifest: str) -> Path:
    with zipfile.ZipFile(out, "w", compression=zipfile.ZIP_DEFLATED) as z:
        for n, b in members.items():
            z.writestr(n, b)
        z.writestr("manifest.json", manifest)
    return out


def refused(path: Path) -> str:
    with pytest.raises(ImportFormatError) as exc:
        b = Bundle(path)
        b.verify()
    text = str(exc.value)
    assert "\n" not in text and text.startswith(f"{path}: ")
    return text[len(f"{path}: "):]


def test_a_good_bundle_verifies(tmp_path: Path) -> None:
    b = Bundle(good_bundle(tmp_path))
    b.verify()
    assert list(b.events()) == [("whywait.host.v1", EVENT)]


def test_a_member_the_manifest_does_not_list_is_refused(tmp_path: Path) -> None:
    bad = edited(good_bundle(tmp_path), lambda m, _: m.update({"rules/gpu/evil.yaml": b"id: evil\n"}))
    assert refused(bad) == ("member rules/gpu/evil.yaml is not listed in the manifest (the bundle was edited: "
                            "a bundle lists every member with its checksum)")


def test_an_empty_member_list_does_not_let_edited_events_through(tmp_path: Path) -> None:
    def change(m: dict[str, bytes], manifest: dict[str, Any]) -> None:
        m["events.jsonl"] = m["events.jsonl"].replace(b"5.0", b"99.0")
        manifest["members"] = {}

    assert refused(edited(good_bundle(tmp_path), change)) == (
        "manifest.json: members: events.jsonl is not listed (every bundle has its events)")


def test_edited_events_do_not_match_their_checksum(tmp_path: Path) -> None:
    bad = edited(good_bundle(tmp_path), lambda m, _: m.update({"events.jsonl": m["events.jsonl"] + b"\n"}))
    assert refused(bad) == ("events.jsonl does not match its checksum in the manifest (the bundle is corrupt or "
                            "was edited)")


@pytest.mark.parametrize("manifest, says", [
    ([1, 2], "manifest.json: expected a JSON object (got an array)"),
    ({"members": [1, 2]}, 'manifest.json: members: expected an object of member name → {"sha256": ..., "bytes": ...}'
                          " (got [1, 2])"),
    ({"members": {"events.jsonl": "abc"}}, "manifest.json: members['events.jsonl']: expected "
                                           '{"sha256": "<64 hex digits>", "bytes": <size>} (got "abc")'),
    ({"members": {"events.jsonl": {"sha256": "0" * 64, "bytes": -1}}}, "manifest.json: members['events.jsonl']: "
                                                                       "expected "),
    ({"window": {"since": "x"}}, 'manifest.json: window.since: expected Unix seconds (got "x")'),
    ({"window": "garbage"}, 'manifest.json: window: expected an object with since and until (Unix seconds) '
                            '(got "garbage")'),
    ({"window": {"since": START, "until": START, "lead_s": 0}}, "manifest.json: window.until: expected a time after "
                                                                "window.since"),
    ({"window": {"since": START, "lead_s": -5}}, "manifest.json: window.lead_s: expected seconds ≥ 0 (got -5)"),
    ({"window": None}, "manifest.json: window: expected an object with since and until (Unix seconds) (got nothing)"),
    ({"messages": {"t": "many"}}, "manifest.json: messages: expected an object of topic → count"),
    ('{"format": "whywait-bundle", "version": 1, "x": ' + "[" * 100_000, "manifest.json is not valid JSON"),
])
def test_a_malformed_manifest_is_one_line_naming_the_field(tmp_path: Path, manifest: Any, says: str) -> None:
    src = good_bundle(tmp_path)
    if isinstance(manifest, dict):
        bad = edited(src, lambda _m, man: man.update(manifest))
    else:  # the whole manifest replaced
        with zipfile.ZipFile(src) as z:
            members = {n: z.read(n) for n in z.namelist() if n != "manifest.json"}
        text = manifest if isinstance(manifest, str) else json.dumps(manifest)
        bad = written(tmp_path / "bad.whywait", members, text)
    assert refused(bad).startswith(says)


def test_a_line_without_end_is_read_in_one_pass_and_skipped_not_held(monkeypatch: pytest.MonkeyPatch) -> None:
    class Endless:  # 200 MiB without a line end, a MiB at a time
        left = 200

        def read(self, n: int) -> bytes:
            if not self.left:
                return b""
            self.left -= 1
            return b"x" * n

    tracemalloc.start()
    t0 = time.perf_counter()
    try:
        assert list(_lines(Endless(), limit=4 << 20)) == [None]
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < 16 << 20 and time.perf_counter() - t0 < 10


def test_an_overlong_events_line_is_counted_and_skipped(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    line = json.dumps({"topic": "whywait.host.v1", "value": EVENT.decode()}).encode() + b"\n"
    monkeypatch.setattr(bundle_mod, "MAX_LINE_BYTES", 3 << 20)
    events = line + b"x" * (5 << 20) + b"\n" + line + b"not json\n"
    bad = edited(good_bundle(tmp_path), lambda m, _: m.update({"events.jsonl": events}), relist=True)
    b = Bundle(bad)
    b.verify()
    assert list(b.events()) == [("whywait.host.v1", EVENT)] * 2
    assert sum(b.skipped.values()) == 2
    assert any("line 4: expected" in why for why in b.skipped)  # line numbers still count the long one
    assert "longer than any contract message" in next(iter(b.skipped))


def test_a_bad_bundled_topology_is_named_as_the_bundle_s_member(tmp_path: Path) -> None:
    bad = edited(good_bundle(tmp_path), lambda m, _: m.update({"topology.yaml": b"format: 1\nnodes: 7\n"}),
                 relist=True)
    b = Bundle(bad)
    b.verify()
    dest = tmp_path / "x"
    dest.mkdir()
    with pytest.raises(ImportFormatError) as exc:
        b.extract(dest)
    assert str(exc.value).startswith(f"{bad}!topology.yaml:2: ") and str(dest) not in str(exc.value)


@pytest.mark.parametrize("change, says", [
    (lambda m, man: man.update({"window": "garbage"}), "manifest.json: window: expected an object"),
    (lambda m, man: m.update({"rules/gpu/evil.yaml": b"id: evil\n"}), "member rules/gpu/evil.yaml is not listed"),
])
def test_replay_refuses_a_hostile_bundle_in_one_line(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                                     change: Callable[..., Any], says: str) -> None:
    bad = edited(good_bundle(tmp_path), change)
    assert main(["replay", "--input", str(bad)]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and says in err and "internal error" not in err


def test_replay_counts_the_lines_a_bundle_skipped(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                  capsys: pytest.CaptureFixture[str]) -> None:
    line = json.dumps({"topic": "whywait.host.v1", "value": EVENT.decode()}).encode() + b"\n"
    monkeypatch.setattr(bundle_mod, "MAX_LINE_BYTES", 3 << 20)
    bad = edited(good_bundle(tmp_path), lambda m, _: m.update({"events.jsonl": line + b"x" * (5 << 20) + b"\n"}),
                 relist=True)
    stats = tmp_path / "stats.json"
    # the bundled rule alone inhibits rules the bundle lacks: replay with every shipped rule
    assert main(["replay", "--input", str(bad), "--rules", str(RULE.parents[1]), "--stats-json", str(stats)]) == 0
    out = capsys.readouterr().out
    assert "replayed 1 messages" in out and "skipped 1: events.jsonl: a line over" in out
    assert [n for why, n in json.loads(stats.read_text())["skipped"].items() if "a line over" in why] == [1]


def test_a_bad_bundled_rule_is_named_as_the_bundle_s_member(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    member = "rules/gpu/gpu.xid-ecc.yaml"
    bad = edited(good_bundle(tmp_path), lambda m, _: m.update({member: m[member].replace(b"severity:", b"sevrity:")}),
                 relist=True)
    assert main(["replay", "--input", str(bad)]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and f"{bad}!{member}:" in err and "whywait-replay-" not in err


def test_a_member_listed_as_gigabytes_is_refused_before_it_is_read(tmp_path: Path,
                                                                   capsys: pytest.CaptureFixture[str]) -> None:
    """A rule file of 5 MiB of one byte, its checksum right: a few kilobytes compressed, refused unread."""
    bad = edited(good_bundle(tmp_path), lambda m, _: m.update({"rules/gpu/big.yaml": b" " * (5 << 20)}), relist=True)
    assert bad.stat().st_size < 64 << 10
    assert main(["replay", "--input", str(bad)]) == 2
    err = capsys.readouterr().err
    assert err == (f"whywait replay: {bad}: rules/gpu/big.yaml is listed as 5,242,880 bytes, over the 4 MiB a rule "
                   "file may be\n")


def test_an_unverified_member_is_extracted_no_further_than_its_cap(tmp_path: Path,
                                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(bundle_mod, "_MAX_TOPOLOGY_BYTES", 1 << 20)
    bad = edited(good_bundle(tmp_path), lambda m, _: m.update({"topology.yaml": b"#" * (3 << 20)}), relist=True)
    dest = tmp_path / "x"
    dest.mkdir()
    with pytest.raises(ImportFormatError, match="topology.yaml is over the 1 MiB a topology may be"):
        Bundle(bad).extract(dest)
    assert (dest / "topology.yaml").stat().st_size <= 1 << 20
