"""What a new user ran into with replay, the demo and the digest, without a broker: history published after newer
data (a backfill) is read and merged in order, the summary's cost is the incident's final one, relative times
ahead of now, filters that match nothing say what did, missing Slack tokens are refused before any work, and the
demo's events are stamped in the past with a replay command printed last."""

from __future__ import annotations

import json
import random
import subprocess
import sys
from pathlib import Path

import pytest
from whywait.agents.events import encode, envelope
from whywait.engine.commands.replay_cmd import latest_cost, parse_time
from whywait.engine.replay import EventTimeMerge, TailScan, Window, diagnoses_jsonl, incidents, replay
from whywait.engine.report.digest import Digest
from whywait.engine.rules.loader import load_rules
from whywait.simulate.cluster import make_cluster, make_job
from whywait.simulate.faults import make_fault
from whywait.simulate.sim import Simulation
from whywait.topology.model import Topology

REPO = Path(__file__).resolve().parents[2]
RULES = REPO / "rules"
START = 1_764_442_800.0
LATER = START + 2_000  # newer data, published first


def simulate(start: float, faults: list[tuple[str, str, float, float]], duration: float = 260) -> list:
    topo = make_cluster(nodes=8)
    s = Simulation(topo, [make_job(topo)], [make_fault(k, n, a, b) for k, n, a, b in faults],
                   start_time=start, duration_s=duration, seed=2)
    return list(s.messages())


def infra() -> Topology:
    return Topology.from_dict(make_cluster(nodes=8).to_dict())


@pytest.fixture(scope="module")
def history() -> list:
    return simulate(START, [("nic-packet-loss", "node-05", 120, 200)])


@pytest.fixture(scope="module")
def newer() -> list:
    return simulate(LATER, [], duration=400)


def partitions_of(msgs: list, n: int) -> dict[str, list[tuple[str, bytes]]]:
    out: dict[str, list[tuple[str, bytes]]] = {}
    for topic, m in msgs:
        key = m.get("job") if m["kind"] in ("steps", "checkpoint", "placement") else m["node"]
        out.setdefault(f"{topic}[{hash(key) % n}]", []).append((topic, encode(m)))
    return out


def read_like_kafka(parts: dict[str, list[tuple[str, bytes]]], w: Window, tail_from: dict[str, int],
                    batch: int, seed: int, scan: bool = True) -> tuple[list, EventTimeMerge]:
    """Drive the merge as the Kafka reader does: each partition up to ``tail_from`` (what was produced before the
    window's end), then each run of the window's events that ``TailScan`` finds in the rest, a stream apiece.
    Without ``scan`` a partition is one stream that stops after its run of messages past the window."""
    rng = random.Random(seed)
    spans: dict[str, tuple[list[tuple[str, bytes]], int, int]] = {}
    merge = EventTimeMerge([], w)
    for name, recs in parts.items():
        at = tail_from.get(name, len(recs))
        if not scan:
            spans[name] = (recs, 0, len(recs))
            continue
        spans[name] = (recs, 0, at)
        merge.to_end.add(name)
        ts = TailScan(w, merge.slack_s, placements=name.startswith("whywait.placement"))
        for off in range(at, len(recs)):
            ts.add(off, recs[off][1])
        for a, b in ts.runs():
            spans[f"{name}@{a}"] = (recs, a, b)
            merge.to_end.add(f"{name}@{a}")
    merge.open = dict.fromkeys(spans, -float("inf"))
    pos = {sid: a for sid, (_, a, _) in spans.items()}
    out: list = []
    while (sid := merge.want()) is not None:
        recs, _, end = spans[sid]
        items = recs[pos[sid]:min(end, pos[sid] + rng.randint(1, batch))]
        pos[sid] += len(items)
        if not items:
            merge.close(sid)
            continue
        k = 0
        while k < len(items):  # one topic per add, as the reader's partitions are
            j = k
            while j < len(items) and items[j][0] == items[k][0]:
                j += 1
            merge.add(sid, items[k][0], [raw for _, raw in items[k:j]])
            k = j
        if pos[sid] >= end and sid in merge.open:
            merge.close(sid)
        out += merge.ready()
    return out + merge.drain(), merge


# ---- 1. history published after newer data ---------------------------------------------------------------------


def test_history_published_after_newer_data_is_read_and_merged_in_order(history: list, newer: list) -> None:
    # `whywait simulate --start-time <earlier>` (or `whywait import`) after `make demo`: each partition holds the
    # newer data first, then the window's.  The reader stopped after 16 messages past the window: "replayed 6
    # messages, 0 incident(s)".  Now it reads the tail's run of the window's events, as its own stream.
    w = Window(START, START + 260)
    want = diagnoses_jsonl(replay(read_like_kafka(partitions_of(history, 1), w, {}, 10_000, 0)[0],
                                  load_rules([RULES]), infra())[0].diagnoses)
    assert "node-05" in want
    n_clean = len(read_like_kafka(partitions_of(history, 1), w, {}, 10_000, 0)[0])
    outputs = set()
    for n, batch, seed in [(1, 10_000, 0), (3, 7, 1), (6, 500, 2), (2, 1, 3)]:
        parts = partitions_of(newer + history, n)
        out, merge = read_like_kafka(parts, w, dict.fromkeys(parts, 0), batch, seed)  # all produced after it
        assert len(out) == n_clean and not merge.skipped
        outputs.add(diagnoses_jsonl(replay(out, load_rules([RULES]), infra())[0].diagnoses))
    assert outputs == {want}  # byte-identical whatever the partitions and batches


def test_the_early_stop_still_holds_for_a_tail_not_scanned(history: list, newer: list) -> None:
    w = Window(START, START + 260)
    out, merge = read_like_kafka(partitions_of(newer + history, 1), w, {}, 10_000, 0, scan=False)
    assert len(out) < 100 and merge.read < len(newer) / 10  # stopped after the run past the window


def test_tail_runs_are_bounded_and_skip_what_is_outside(history: list) -> None:
    w = Window(START, START + 260)
    scan = TailScan(w)
    recs = [encode(m) for _, m in history]
    for off, raw in enumerate(recs):
        scan.add(off, raw)
    assert scan.runs() == [(0, len(recs))]  # one nearly ordered run
    scan = TailScan(w)
    spread = recs[::len(recs) // 50][:50]  # across the whole window
    for k in range(100):  # the window's events jumping back in time a hundred times
        for off, raw in enumerate(spread):
            scan.add(k * 50 + off, raw)
    scan.add(10_000, b'{"time": 5.0}')  # outside the window: in no run
    scan.add(10_001, None)
    assert len(scan.runs()) == 32 and scan.runs()[-1][1] == 99 * 50 + 50


def test_messages_past_the_window_do_not_move_a_streams_progress(history: list, newer: list) -> None:
    w = Window(START, START + 260)
    merge = EventTimeMerge(["a"], w)
    merge.to_end.add("a")
    merge.add("a", newer[0][0], [encode(m) for t, m in newer if t == newer[0][0]][:500])
    assert merge.open["a"] == -float("inf") and "a" in merge.open  # neither moved on nor closed


# ---- 3. the summary's cost is the incident's final one --------------------------------------------------------


def test_the_summarys_cost_is_the_resolved_incidents(history: list) -> None:
    w = Window(START, START + 260)
    res, _ = replay(read_like_kafka(partitions_of(history, 1), w, {}, 10_000, 0)[0], load_rules([RULES]), infra())
    [s] = [s for s in incidents(res.diagnoses, res.end) if s.first.rule_id == "network.straggler-retransmits"]
    final = s.updates[-1]
    assert s.resolved and final.status == "resolved" and final.cost
    early = s.first.cost["gpu_hours_lost"] if s.first.cost else None
    assert latest_cost(s) == final.cost["gpu_hours_lost"] != early


def test_the_cli_prints_the_resolved_cost(history: list, tmp_path: Path) -> None:
    from whywait.engine.commands.export_cmd import rule_files
    from whywait.engine.importers.bundle import BundleWriter

    w = Window(START, START + 260)
    topo = tmp_path / "topology.yaml"
    make_cluster(nodes=8).to_yaml(topo)
    merge = EventTimeMerge(["a"], w)
    merge.raw = True
    for t, m in history:
        merge.add("a", t, [encode(m)])
    bundle = tmp_path / "incident.whywait"
    with BundleWriter(bundle, {"since": w.since, "until": w.until, "lead_s": 0.0}) as bw:
        for topic, raw in merge.drain():
            bw.add(topic, raw)
        bw.close(topo, rule_files([RULES]))
    out = tmp_path / "d.jsonl"
    r = subprocess.run([sys.executable, "-m", "whywait", "replay", "--input", str(bundle), "--json", str(out)],
                       capture_output=True, text=True, cwd=REPO, timeout=120)
    assert r.returncode == 0, r.stderr
    resolved = [d for d in map(json.loads, out.read_text().splitlines())
                if d["status"] == "resolved" and d["rule_id"] == "network.straggler-retransmits"]
    assert f"cost: {resolved[-1]['cost']['gpu_hours_lost']:.2f} GPU-hours lost" in r.stdout, r.stdout


# ---- 4. times ahead of now; the demo --------------------------------------------------------------------------


def test_relative_times_ahead_of_now() -> None:
    assert parse_time("+10m", now=10_000.0) == 10_600.0
    assert parse_time("+1h30m", now=0.0) == 5_400.0
    assert parse_time("-10m", now=10_000.0) == 9_400.0
    with pytest.raises(Exception, match=r"cannot read '\+soon'.*\+10m"):
        parse_time("+soon", what="--until")


@pytest.mark.parametrize("cmd", [["replay", "--since", "-10m", "--until", "+10m", "--topology", "t.yaml"],
                                 ["export", "--since", "+1m", "--until", "+10m", "-o", "x.whywait"],
                                 ["digest", "--since", "-10m", "--until", "+10m"]])
def test_until_ahead_of_now_is_accepted_everywhere(cmd: list[str], tmp_path: Path) -> None:
    make_cluster(nodes=2).to_yaml(tmp_path / "t.yaml")
    r = subprocess.run([sys.executable, "-m", "whywait", *cmd, "--bootstrap", "127.0.0.1:1"], capture_output=True,
                       text=True, cwd=tmp_path, timeout=60)
    assert r.returncode == 3 and "127.0.0.1:1 is unreachable" in r.stderr, r.stderr  # past the times, to the broker


def test_the_demos_events_are_stamped_in_the_past() -> None:
    from whywait.engine.commands.demo import event_start

    now = 1_800_000_000.0
    start = event_start(now, 360, 0.0)
    assert start + 360 <= now
    # simulated at 12x from its start, event time trails the wall clock all the way
    assert all(start + k * 12 <= now + k for k in range(31))
    assert event_start(now, 360, now - 30) == now + 30  # after an earlier demo's data, never mixed with it


def test_the_demo_prints_a_replay_command_that_reads_its_window(tmp_path: Path) -> None:
    from whywait.engine.commands.demo import replay_command

    line = replay_command(1_796_376_840.0, 1_796_377_200.0, tmp_path / "topology.yaml", tmp_path / "replay")
    args = line.split()
    assert args[1:6] == ["replay", "--since", "2026-12-04T09:34:00Z", "--until", "2026-12-04T09:40:00Z"]
    assert f"--topology {tmp_path / 'topology.yaml'}" in line and f"--report {tmp_path / 'replay'}" in line
    assert parse_time(args[3]) == 1_796_376_840.0


# ---- 11. filters that match nothing ---------------------------------------------------------------------------


def test_a_job_or_project_filter_that_matches_nothing_names_what_was_seen(history: list) -> None:
    parts = partitions_of(history, 2)
    for w, says in [(Window(START, START + 260, jobs=frozenset({"nosuchjob"})),
                     "--job nosuchjob: no message of it in the window (jobs seen: train-llm)"),
                    (Window(START, START + 260, projects=frozenset({"nosuch"})),
                     "--project nosuch: no job of it in the window (projects seen: llm)")]:
        out, merge = read_like_kafka(parts, w, {}, 500, 1)
        assert not any("job" in m for m in out)
        assert merge.filter_hints() == [says]
    _, merge = read_like_kafka(parts, Window(START, START + 260, projects=frozenset({"llm"})), {}, 500, 1)
    assert merge.filter_hints() == []


def test_digest_keeps_only_the_projects_asked_for_and_names_the_others() -> None:
    d = Digest(START, START + 3600, projects=frozenset({"nosuch"}))
    d.add(envelope("placement", "sched", START, job="llm-1", project="research", team="r", state="running",
                   ranks=[{"rank": 0, "node": "n0", "gpu": 0}]))
    d.add(envelope("steps", "n0", START + 10, job="llm-1", steps=[{"rank": 0, "step": 1, "duration_s": 1.0}]))
    d.finish()
    assert d.rows() == [] and d.projects_seen() == ["research"]
    assert "No job reported steps." in json.dumps(d.blocks())


# ---- 12. missing tokens are refused before any work -----------------------------------------------------------


@pytest.mark.parametrize("cmd, says", [
    (["replay", "--since", "-10m", "--slack-thread", "C1:123.4"], "--slack-thread needs SLACK_BOT_TOKEN"),
    (["replay", "--since", "-10m", "--slack-thread", "C1"], "--slack-thread: expected CHANNEL:TS"),
    (["digest", "--since", "7d", "--post"], "--post needs SLACK_BOT_TOKEN"),
])
def test_a_missing_slack_token_is_refused_before_any_work(cmd: list[str], says: str, tmp_path: Path) -> None:
    import os

    env = {k: v for k, v in os.environ.items() if not k.startswith("SLACK_BOT_TOKEN")}
    # an unreachable broker: reading anything first would be exit 3, not 2
    r = subprocess.run([sys.executable, "-m", "whywait", *cmd, "--bootstrap", "127.0.0.1:1"], capture_output=True,
                       text=True, cwd=REPO, timeout=60, env=env)
    assert r.returncode == 2 and says in r.stderr and len(r.stderr.strip().splitlines()) == 1, r.stderr
    assert r.stdout == ""


def test_replay_and_against_live_load_the_engines_rules_site_rules_included(tmp_path: Path,
                                                                             monkeypatch: pytest.MonkeyPatch) -> None:
    # `whywait engine` loads ./rules (or the shipped ones) plus $WHYWAIT_SITE_RULES; replay's default and
    # `--against live` loaded ./rules only, so a site's own rules were missing from its postmortems and backtests.
    from whywait.engine.cli import build_parser
    from whywait.engine.commands.engine_cmd import default_rule_paths
    from whywait.engine.commands.replay_cmd import Plan

    site = tmp_path / "site-rules"
    site.mkdir()
    monkeypatch.setenv("WHYWAIT_SITE_RULES", str(site))
    engine = default_rule_paths()
    assert engine[-1] == site and len(engine) == 2
    parse = build_parser("replay").parse_args
    plain = Plan(parse(["replay", "--since", "-2h"]), tmp_path)
    assert plain.rules_paths == engine and plain.against is None
    new = tmp_path / "new-rules"
    backtest = Plan(parse(["replay", "--since", "-2h", "--rules", str(new), "--against", "live"]), tmp_path)
    assert backtest.rules_paths == [new] and backtest.against == engine
    other = Plan(parse(["replay", "--since", "-2h", "--against", str(new)]), tmp_path)
    assert other.against == [new]


@pytest.mark.parametrize("with_topology", [False, True])
def test_export_says_what_replay_says_of_a_filter_and_a_missing_topology(
        history: list, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str],
        with_topology: bool) -> None:
    # The README's `whywait export --since -2h --job llama-70b-run7 -o incident.whywait` (no --topology) wrote a
    # bundle silently: the job matched nothing, so it held only node telemetry, and the documented next step
    # `whywait replay --input incident.whywait` then failed with "no topology".
    import whywait.engine.commands.replay_cmd as replay_cmd
    from whywait.engine.cli import main

    def from_history(bootstrap: str, window: Window, merge: EventTimeMerge, **_: object) -> list:
        merge.open = {"a": -float("inf")}
        for t, m in history:
            merge.add("a", t, [encode(m)])
        return merge.drain()

    monkeypatch.setattr(replay_cmd, "kafka_batches", from_history)
    monkeypatch.delenv("WHYWAIT_TOPOLOGY", raising=False)
    monkeypatch.delenv("WHYWAIT_SITE_RULES", raising=False)
    monkeypatch.chdir(tmp_path)
    topo = tmp_path / "cluster.yaml"
    make_cluster(nodes=8).to_yaml(topo)
    argv = ["export", "--since", str(START), "--until", str(START + 260), "--job", "llama-70b-run7",
            "-o", str(tmp_path / "incident.whywait"), "--bootstrap", "127.0.0.1:1"]
    assert main(argv + (["--topology", str(topo)] if with_topology else [])) == 0
    out, err = capsys.readouterr()
    assert "note: --job llama-70b-run7: no message of it in the window (jobs seen: " in out, out
    if with_topology:
        assert err == ""
    else:
        assert err.strip().splitlines() == [
            "whywait export: no topology in the bundle (give --topology FILE or set WHYWAIT_TOPOLOGY): "
            f"`whywait replay --input {tmp_path / 'incident.whywait'}` will know only the nodes its placements "
            "name, and no NIC, switch or pool"]


# ---- 6. flags a bundle's own values used to hide ----------------------------------------------------------------


@pytest.fixture(scope="module")
def small_bundle(history: list, tmp_path_factory: pytest.TempPathFactory) -> Path:
    from whywait.engine.commands.export_cmd import rule_files
    from whywait.engine.importers.bundle import BundleWriter

    tmp = tmp_path_factory.mktemp("small-bundle")
    w = Window(START, START + 60)
    topo = tmp / "topology.yaml"
    make_cluster(nodes=8).to_yaml(topo)
    bundle = tmp / "incident.whywait"
    with BundleWriter(bundle, {"since": w.since, "until": w.until, "lead_s": 0.0}) as bw:
        for topic, m in history[:2000]:
            bw.add(topic, encode(m))
        bw.close(topo, rule_files([RULES]))
    return bundle


@pytest.mark.parametrize("flags, says", [
    # a --lead the bundle's own would have replaced was not even read: "abc" replayed as if it were fine
    (["--lead", "abc"], "whywait replay: --lead: cannot read 'abc': use a duration like 15m, 90s or 2h"),
    # one end of the window is the bundle's: name what the bundle holds, not a --until nobody gave
    (["--since", "2026-01-01T00:00:00Z"], "whywait replay: --since 2026-01-01 00:00:00 is outside {bundle}, which "
                                          "holds 2025-11-29 19:00:00 to 2025-11-29 19:01:00 UTC"),
    (["--until", "2020-01-01T00:00:00Z"], "whywait replay: --until 2020-01-01 00:00:00 is outside {bundle}, which "
                                          "holds 2025-11-29 19:00:00 to 2025-11-29 19:01:00 UTC"),
    # an empty folder given as --rules replayed with no rule and reported nothing found
    (["--rules", "{empty}"], "whywait replay: {empty}: holds no rule file (a .yaml or .yml file other than macros "
                             "and *.test.yaml)"),
])
def test_a_bundle_replay_refuses_what_it_used_to_pass_over(flags: list[str], says: str, small_bundle: Path,
                                                           tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from whywait.engine.cli import main

    empty = tmp_path / "rules"
    empty.mkdir()
    (empty / "macros.yaml").write_text("{}\n")
    (empty / "x.test.yaml").write_text("cases: []\n")
    fill = {"bundle": small_bundle, "empty": empty}
    assert main(["replay", "--input", str(small_bundle), *(f.format(**fill) for f in flags)]) == 2
    assert capsys.readouterr().err == says.format(**fill) + "\n"


def test_a_lead_given_with_a_bundle_is_used(small_bundle: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from whywait.engine.cli import main

    assert main(["replay", "--input", str(small_bundle), "--lead", "0s"]) == 0
    assert "replayed 2000 messages" in capsys.readouterr().out
