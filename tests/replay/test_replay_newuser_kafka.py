"""Through the real broker: history published after newer data (``whywait simulate`` of an earlier time, ``whywait
import`` of a step table) is replayed whole; a tail too long to scan is not read past the window, and the replay
says where it stopped; a missing input topic is a note, none at all one line; filters that match nothing say so."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

pytestmark = pytest.mark.integration

REPO = Path(__file__).resolve().parents[2]
DURATION = 260
# Its own stretch of event time, in the past: everything here is produced after the window, as a backfill is.
START = float(int(time.time()) - 86_400 * 30)


def whywait(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "whywait", *args], capture_output=True, text=True, cwd=REPO,
                          timeout=300, env=env)


@pytest.fixture(scope="module")
def backfilled(kafka_bootstrap: str, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """Newer data first (20 minutes after the window), then the window's, as `make demo` then `simulate` left them."""
    from whywait.engine.stream.topics import ensure_topics

    ensure_topics(kafka_bootstrap)
    work = tmp_path_factory.mktemp("backfill")
    env = {**os.environ, "WHYWAIT_KAFKA_BOOTSTRAP": kafka_bootstrap}
    env.pop("SLACK_BOT_TOKEN", None)
    r = whywait("simulate", "--nodes", "8", "--duration", "200", "--speed", "0", "--start-time",
                str(START + 1200), env=env)
    assert r.returncode == 0, r.stderr
    topo = work / "topology.yaml"
    r = whywait("simulate", "--nodes", "8", "--duration", str(DURATION), "--speed", "0", "--fault",
                "nic-packet-loss:node-05@120-200", "--start-time", str(START), "--topology-out", str(topo), env=env)
    assert r.returncode == 0, r.stderr
    published = int((r.stdout + r.stderr).split("published ")[1].split()[0])
    return {"env": env, "topo": topo, "work": work, "published": published}


def window(*more: str) -> list[str]:
    return ["--since", str(START), "--until", str(START + DURATION), "--lead", "0s", *more]


def test_history_published_after_newer_data_is_replayed_whole(backfilled: dict[str, Any],
                                                                kafka_bootstrap: str) -> None:
    stats = backfilled["work"] / "stats.json"
    r = whywait("replay", *window("--topology", str(backfilled["topo"]), "--read-to-end", "--stats-json",
                                  str(stats)), env=backfilled["env"])
    assert r.returncode == 0, r.stderr
    got = json.loads(stats.read_text())
    # all of it but the couple of messages stamped at the simulation's very end, past --until; plus the placements
    # of other tests' jobs on this shared broker stamped before the window (each job's latest enters at the start,
    # as a running job's does): their number depends on which tests ran first
    assert backfilled["published"] - 20 <= got["messages"] <= backfilled["published"] + 50, (got, r.stdout)
    assert "network.straggler-retransmits  node-05" in r.stdout and got["stopped_early"] == []
    assert "stopped reading" not in r.stderr


@pytest.mark.parametrize("scan_max", [10**9, 0])
def test_a_short_tail_is_scanned_and_a_long_one_says_where_it_stopped(backfilled: dict[str, Any],
                                                                       kafka_bootstrap: str, scan_max: int,
                                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    from whywait.engine.commands import replay_cmd
    from whywait.engine.replay import EventTimeMerge, Window

    monkeypatch.setattr(replay_cmd, "TAIL_SCAN_MAX", scan_max)
    w = Window(START, START + DURATION)
    merge = EventTimeMerge([], w)
    n = sum(1 for _ in replay_cmd.kafka_batches(kafka_bootstrap, w, merge))
    if scan_max:  # the default: a tail of up to TAIL_SCAN_MAX records is read
        assert n >= backfilled["published"] - 20 and merge.stopped_early == []
    else:  # the tail is not scanned: the partitions stop after the newer data, and that is said
        assert n < 100 and merge.stopped_early
        s = merge.stopped_early[0]
        assert s["offset"] < s["end"] and s["partition"].startswith("whywait.")
        [(why, unread)] = [(k, v) for k, v in merge.skipped.items() if k.startswith("not read")]
        assert "--read-to-end" in why and unread >= backfilled["published"] - 20


def test_the_cli_says_in_one_line_where_it_stopped(backfilled: dict[str, Any], kafka_bootstrap: str) -> None:
    # the whole suite's data on the session broker may make the tail long or short: both are fine, but when it
    # stopped early the replay says so in one line and in the stats, and otherwise it read the window whole
    stats = backfilled["work"] / "stats-default.json"
    r = whywait("replay", *window("--topology", str(backfilled["topo"]), "--stats-json", str(stats)),
                env=backfilled["env"])
    assert r.returncode == 0, r.stderr
    got = json.loads(stats.read_text())
    if got["stopped_early"]:
        [line] = [x for x in r.stderr.splitlines() if "stopped reading" in x]
        assert "--read-to-end reads them all (history backfilled with `whywait import`)" in line
    else:
        assert got["messages"] >= backfilled["published"] - 20


def test_imported_step_history_is_replayed(backfilled: dict[str, Any], kafka_bootstrap: str,
                                           tmp_path: Path) -> None:
    # `whywait import` of a step table after newer steps: "published 6 messages", and the replay read them all
    t0 = START + 5000
    newer = tmp_path / "newer.csv"
    newer.write_text("time,rank,step,duration_s\n" + "".join(f"{t0 + 3000 + k},0,{k},1.0\n" for k in range(40)))
    older = tmp_path / "older.csv"
    older.write_text("time,rank,step,duration_s\n" + "".join(f"{t0 + k},0,{k},1.0\n" for k in range(4)))
    job = f"imported-{START:.0f}"
    for f in (newer, older):
        r = whywait("import", str(f), "--job", job, "--node", "node-01", "--project", "research", "--team", "r",
                    env=backfilled["env"])
        assert r.returncode == 0, r.stderr
    assert "published 6 messages" in r.stdout + r.stderr  # the placement, the 4 steps, and its 'finished' (a2fe36a)
    stats = tmp_path / "stats.json"
    r = whywait("replay", "--since", str(t0 - 10), "--until", str(t0 + 60), "--lead", "0s", "--read-to-end",
                "--topology", str(backfilled["topo"]), "--job", job, "--stats-json", str(stats),
                env=backfilled["env"])
    assert r.returncode == 0, r.stderr
    assert json.loads(stats.read_text())["messages"] >= 5, r.stdout  # the placement and the 4 steps


def test_a_filter_that_matches_nothing_names_what_was_seen(backfilled: dict[str, Any],
                                                           kafka_bootstrap: str) -> None:
    stats = backfilled["work"] / "stats-job.json"
    r = whywait("replay", *window("--topology", str(backfilled["topo"]), "--read-to-end", "--job", "nosuchjob",
                                  "--stats-json", str(stats)), env=backfilled["env"])
    assert r.returncode == 0, r.stderr
    assert "note: --job nosuchjob: no message of it in the window (jobs seen: train-llm)" in r.stdout, r.stdout
    assert any("nosuchjob" in n for n in json.loads(stats.read_text())["notes"])
    r = whywait("digest", "--since", str(START), "--until", str(START + DURATION), "--project", "nosuch",
                env=backfilled["env"])
    assert r.returncode == 0, r.stderr
    assert "note: --project nosuch: no job of it in the period (projects: " in r.stdout and "llm" in r.stdout


def test_a_missing_input_topic_is_a_note_and_none_at_all_one_line(backfilled: dict[str, Any], kafka_bootstrap: str,
                                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    import whywait.agents.events as events
    from whywait.engine.commands.replay_cmd import kafka_batches
    from whywait.engine.errors import ConfigError
    from whywait.engine.replay import EventTimeMerge, Window

    w = Window(START, START + DURATION)
    # `whywait simulate` with no engine run yet: the agent-health topic (say) was never created
    monkeypatch.setattr(events, "INPUT_TOPICS", (*events.INPUT_TOPICS, "whywait.never-created.v1"))
    merge = EventTimeMerge([], w)
    assert sum(1 for _ in kafka_batches(kafka_bootstrap, w, merge, read_to_end=True)) > 1000
    assert merge.notes == [f"topic(s) whywait.never-created.v1 not on {kafka_bootstrap}: nothing read from them"]
    monkeypatch.setattr(events, "INPUT_TOPICS", ("whywait.never-created.v1", "whywait.nor-this.v1"))
    with pytest.raises(ConfigError, match=r"none of the input topics \(whywait.never-created.v1, whywait.nor-this"):
        list(kafka_batches(kafka_bootstrap, w, EventTimeMerge([], w)))
