"""Replay for postmortems, without a broker: the event-time merge, determinism, stale placements,
the rule backtest, the report (HTML/Markdown/PNG labels) and bundles."""

from __future__ import annotations

import argparse
import itertools
import json
import random
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from whywait.agents.events import encode, envelope
from whywait.engine.commands.replay_cmd import allow_relative_times, parse_time
from whywait.engine.replay import EventTimeMerge, Window, backtest, diagnoses_jsonl, incidents, replay
from whywait.engine.rules.loader import load_rules
from whywait.simulate.cluster import make_cluster, make_job
from whywait.simulate.faults import make_fault
from whywait.simulate.sim import Simulation
from whywait.topology.model import Topology

REPO = Path(__file__).resolve().parents[2]
RULES = REPO / "rules"
START = 1_764_442_800.0


def sim(faults: list[tuple[str, str, float, float]], nodes: int = 8, duration: float = 260) -> tuple[Topology, list]:
    topo = make_cluster(nodes=nodes)
    s = Simulation(topo, [make_job(topo)], [make_fault(k, n, a, b) for k, n, a, b in faults],
                   start_time=START, duration_s=duration, seed=2)
    return Topology.from_dict(topo.to_dict()), list(s.messages())


@pytest.fixture(scope="module")
def one_fault() -> tuple[Topology, list]:
    return sim([("nic-packet-loss", "node-05", 120, 200)])


def merged(msgs: list, window: Window, partitions: int = 1, batch: int = 10_000, seed: int = 0,
           raw: bool = False, slack_s: float = 30.0) -> list:
    """Drive an EventTimeMerge the way the Kafka reader does: partitions hashed by key, read in batches.

    Returns the released messages, or with ``raw`` the released ``(topic, bytes)`` pairs."""
    rng = random.Random(seed)
    streams: dict[str, list[tuple[str, bytes]]] = {}
    for topic, m in msgs:
        key = m.get("job") if m["kind"] in ("steps", "checkpoint", "placement") else m["node"]
        streams.setdefault(f"{topic}[{hash(key) % partitions}]", []).append((topic, encode(m)))
    merge = EventTimeMerge(streams, window, slack_s)
    merge.raw = raw
    pos = dict.fromkeys(streams, 0)
    out: list = []
    while (sid := merge.want()) is not None:
        items = streams[sid][pos[sid]:pos[sid] + rng.randint(1, batch)]
        pos[sid] += len(items)
        if not items:
            merge.close(sid)
            continue
        merge.add(sid, items[0][0], [raw for _, raw in items])
        out += merge.ready()
    return out + list(merge.drain())


def test_replay_finds_the_incident_with_utc_times(one_fault: tuple[Topology, list]) -> None:
    infra, msgs = one_fault
    res, _ = replay(merged(msgs, Window(START, START + 260)), load_rules([RULES]), infra)
    net = [s for s in incidents(res.diagnoses, res.end) if s.first.rule_id == "network.straggler-retransmits"]
    assert len(net) == 1
    s = net[0]
    assert s.first.culprit == "node-05" and START + 118 <= s.start <= START + 130 and s.resolved
    assert START + 195 <= s.end <= START + 240


def test_a_range_that_ends_as_the_fault_ends_closes_the_incident_when_it_stopped(
        one_fault: tuple[Topology, list]) -> None:
    # The range stops 5 s after the fault (120-200 s): the incident is still in its keep_firing_for.  It
    # resolves when that runs out after the condition last held, not at the first tick after the hour the
    # replay used to skip to (before: 45 minutes after the data, on a 60 s range).
    infra, msgs = one_fault
    cut = [(tp, m) for tp, m in msgs if m["time"] < START + 205]
    res, _ = replay(merged(cut, Window(START, START + 205)), load_rules([RULES]), infra)
    [s] = [s for s in incidents(res.diagnoses, res.end) if s.first.rule_id == "network.straggler-retransmits"]
    keep = load_rules([RULES]).rules["network.straggler-retransmits"].keep_firing_for_s
    assert s.resolved and START + 195 <= s.end <= START + 205 + keep + 2, s.end - START


def test_output_is_byte_identical_whatever_the_partitions_and_batches(one_fault: tuple[Topology, list]) -> None:
    _, msgs = one_fault
    w = Window(START, START + 260)
    outputs = set()
    for partitions, batch, seed in [(1, 10_000, 0), (3, 7, 1), (6, 500, 2), (2, 1, 3)]:
        res, _ = replay(merged(msgs, w, partitions, batch, seed), load_rules([RULES]),
                        Topology.from_dict(make_cluster(nodes=8).to_dict()))
        assert res.diagnoses
        outputs.add(diagnoses_jsonl(res.diagnoses))
    assert len(outputs) == 1


def test_merge_memory_is_bounded_by_the_slack_not_the_range(one_fault: tuple[Topology, list]) -> None:
    _, msgs = one_fault
    w = Window(START, START + 260)
    streams = {"a": [(t, encode(m)) for t, m in msgs]}
    merge = EventTimeMerge(streams, w, slack_s=10)
    peak = 0
    for i in range(0, len(streams["a"]), 50):
        chunk = streams["a"][i:i + 50]
        for topic, group in itertools.groupby(chunk, key=lambda x: x[0]):
            merge.add("a", topic, [raw for _, raw in group])
        list(merge.ready())
        peak = max(peak, merge.held)
    per_s = len(msgs) / 260
    assert peak < 15 * per_s < len(msgs) / 10  # ~slack's worth, far below the whole range


def test_stale_placement_and_contract_breaks_are_skipped_and_counted(one_fault: tuple[Topology, list]) -> None:
    infra, msgs = one_fault
    stale = envelope("placement", "sched", START + 5, job="old-job", project="p", team="t", state="running",
                     ranks=[{"rank": 0, "node": "node-99", "gpu": 0}])
    w = Window(START, START + 260)
    extra = [("whywait.placement.v1", stale)]
    streams = {"a": [(t, encode(m)) for t, m in sorted(msgs + extra, key=lambda x: x[1]["time"])]}
    streams["a"].insert(10, ("whywait.net.v1", b"{not json"))
    # broken, but says a time outside the window: another window's business, not counted here
    streams["a"].insert(11, ("whywait.steps.v1", b'{"schema": 2, "kind": "steps", "time": 5.0, "node": "x"}'))
    merge = EventTimeMerge(streams, w)
    for topic, raw in streams["a"]:
        merge.add("a", topic, [raw])
    res, _ = replay(merge.drain(), load_rules([RULES]), infra)
    assert any("unknown node 'node-99'" in k for k in res.skipped), res.skipped
    assert sum(merge.skipped.values()) == 1 and "contract break on whywait.net.v1" in next(iter(merge.skipped))
    assert any(s.first.culprit == "node-05" for s in incidents(res.diagnoses, res.end))


def test_telemetry_of_nodes_the_topology_lacks_is_left_out_as_live(one_fault: tuple[Topology, list]) -> None:
    """The live engine dead-letters a node it does not know; the replay left such telemetry in, where it
    counted in event time: a handful of invented nodes stamped 10 minutes ahead moved every input's median."""
    infra, msgs = one_fault
    evil = [envelope("host", f"evil-{i}", m["time"] + 600, cpu_busy_pct=1.0, cpu_iowait_pct=0.0, mem_used_bytes=1,
                     mem_total_bytes=2) for i in range(12) for t, m in msgs[:4000:40] if m["kind"] == "host"]
    plain, _ = replay((m for _, m in msgs), load_rules([RULES]), infra)
    mixed = sorted([m for _, m in msgs] + evil, key=lambda m: m["time"] - (600 if m["node"].startswith("evil") else 0))
    res, _ = replay(iter(mixed), load_rules([RULES]), infra)
    assert sum(res.skipped.values()) == len(evil)
    assert all(k.startswith("telemetry from a node the topology does not hold") for k in res.skipped)
    assert len(res.skipped) == 4  # the first 3 names said apart, with the hosts like them; the rest together
    assert diagnoses_jsonl(res.diagnoses) == diagnoses_jsonl(plain.diagnoses)


def test_backtest_reports_a_lowered_threshold_firing_earlier(one_fault: tuple[Topology, list],
                                                           tmp_path: Path) -> None:
    infra, msgs = one_fault
    new = tmp_path / "rules"
    shutil.copytree(RULES, new)
    f = new / "network" / "network.straggler-retransmits.yaml"
    f.write_text(f.read_text().replace("for: 3s", "for: 0s"))
    res, old = replay(merged(msgs, Window(START, START + 260)), load_rules([new]), infra,
                      against=(load_rules([RULES]), Topology.from_dict(make_cluster(nodes=8).to_dict())))
    assert old is not None
    cmp = backtest(res, old)
    t = [x for x in cmp["timing"] if x["rule_id"] == "network.straggler-retransmits"]
    assert len(t) == 1 and t[0]["direction"] == "earlier" and t[0]["seconds"] == 3.0
    assert not cmp["only_new"] and not cmp["only_old"]


def test_relative_iso_and_unix_times() -> None:
    assert parse_time("-2h", now=10_000.0) == 2_800.0
    assert parse_time("-10m", now=10_000.0) == 9_400.0
    assert parse_time("-7d", now=1e6) == 1e6 - 7 * 86400
    assert parse_time("1764442800") == 1_764_442_800.0
    assert parse_time("2025-11-29T19:00:00Z") == 1_764_442_800.0
    p = argparse.ArgumentParser()
    allow_relative_times(p)
    p.add_argument("--since")
    assert p.parse_args(["--since", "-10m"]).since == "-10m"


@pytest.mark.parametrize("v", ["1e400", "inf", "nan", "1e17", "+99999999999w"])
def test_a_time_past_any_date_is_a_config_error(v: str) -> None:
    from whywait.engine.errors import ConfigError

    with pytest.raises(ConfigError, match=r"^--since: .* is not a time between the years 1 and 9999"):
        parse_time(v, now=1e9, what="--since")


@pytest.mark.parametrize("cmd", [["replay", "--since", "1e400", "--until", "1764442800"],
                                 ["replay", "--since", "1764442800", "--until", "1e400"],
                                 ["export", "--since", "1e400", "-o", "x.whywait"],
                                 ["digest", "--since", "1e400"]])
def test_a_time_past_any_date_is_one_line_exit_2(cmd: list[str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                  capsys: pytest.CaptureFixture[str]) -> None:
    from whywait.engine.cli import main

    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("WHYWAIT_KAFKA_BOOTSTRAP", "127.0.0.1:1")  # never reached: the time is refused first
    assert main(cmd) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "'1e400' is not a time" in err and "internal error" not in err


def report_for(faults: list[tuple[str, str, float, float]], tmp_path: Path) -> tuple[object, dict]:
    from whywait.engine.report import build_report

    infra, msgs = sim(faults, duration=300)
    w = Window(START, START + 300)
    res, _ = replay(merged(msgs, w), load_rules([RULES]), infra)
    spans = incidents(res.diagnoses, res.end)
    rep = build_report(res, spans, merged(msgs, w), w, Topology.from_dict(make_cluster(nodes=8).to_dict()))
    return rep, rep.write(tmp_path / "report")


def test_report_tells_the_whole_story(tmp_path: Path) -> None:
    rep, paths = report_for([("nic-packet-loss", "node-05", 120, 200)], tmp_path)
    html = paths["html"].read_text()
    md = paths["md"].read_text()
    for text in (html, md):
        assert "node-05" in text and "ranks 32–39" in text  # the straggler
        assert "2025-11-29 19:02:0" in text and "UTC" in text  # the fault window in UTC
        assert "GPU-hours lost" in text and "network.straggler-retransmits" in text
        assert "leaf-02" in text  # the topology path
        assert "CPU not saturated on node-05" in text  # checked and clean
    assert 'src="data:image/png;base64,' in html and "http" not in html.split("<body>")[1].split("runbook")[0]
    assert paths["pngs"][0].read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_evidence_beside_the_cost_is_shown_at_the_end_too(tmp_path: Path) -> None:
    # A new user's report: the summary's cost said "1.48 s per step instead of 0.828 s" (the resolution's figures)
    # while the evidence table beside it showed 1.325 s vs 0.8202 s (when it fired), with nothing saying when.
    rep, paths = report_for([("nic-packet-loss", "node-05", 120, 200)], tmp_path)
    md = paths["md"].read_text()
    head = next(line for line in md.splitlines() if line.startswith("| evidence |"))
    assert "| when it fired (" in head and "| at its resolution (" in head, head
    v = rep.data.incidents[0]
    assert v.resolved and v.evidence_last and v.last_at is not None and v.last_at > v.fired_at
    row = next(line for line in md.splitlines() if line.startswith("| `net.tcp_retrans_segs_per_s` | node-05"))
    first = next(e for e in v.evidence if e["metric"] == "net.tcp_retrans_segs_per_s")
    last = v.evidence_last[("net.tcp_retrans_segs_per_s", "node-05")]
    assert f"{first['value']:.4g}" in row and f"{last['value']:.4g}" in row
    assert "at its resolution (" in paths["html"].read_text()


def test_every_incident_is_labelled_without_overlap(tmp_path: Path) -> None:
    import matplotlib.pyplot as plt
    from whywait.engine.report.plots import timeline_figure

    rep, paths = report_for([("nic-packet-loss", "node-05", 100, 180), ("gpu-thermal", "node-02", 104, 190),
                             ("nic-packet-loss", "node-07", 108, 200)], tmp_path)
    views = rep.data.incidents
    assert len(views) >= 3
    # the three overlap on one job: their losses share the time, so the total is the job's loss once
    lost = sum(v.counted or 0.0 for v in views)
    union = max(v.end for v in views) - min(v.start for v in views)
    assert lost <= 128 * union / 3600 * max(1 - v.cost["whatif_step_s"] / v.cost["step_s"] for v in views if v.cost)
    assert all(v.shared_with for v in views if v.cost)
    md = paths["md"].read_text()
    for v in views:
        assert f"### #{v.number} " in md
    fig, labels = timeline_figure(rep.data)
    fig.canvas.draw()
    r = fig.canvas.get_renderer()
    boxes = [a.get_window_extent(r) for a in labels]
    assert len(boxes) == len(views)
    for a, b in itertools.combinations(boxes, 2):
        assert not a.overlaps(b), (a, b)
    evidence_axes = [ax for ax in fig.axes if ax.get_ylabel().startswith("#")]
    assert {ax.get_ylabel().split()[0] for ax in evidence_axes} == {f"#{v.number}" for v in views
                                                                    if v.evidence_series}
    plt.close(fig)


def test_many_incidents_go_on_pages_that_each_label_their_own(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """One figure for every incident grew three panels each: 120 drew a 12 MB PNG in 223 s. Pages bound it."""
    import dataclasses

    import matplotlib.pyplot as plt
    from whywait.engine.report import plots

    rep, _ = report_for([("nic-packet-loss", "node-05", 120, 200)], tmp_path)
    v0 = rep.data.incidents[0]
    rep.data.incidents = [dataclasses.replace(v0, number=k + 1, start=v0.start + 20 * k, end=v0.end + 20 * k)
                          for k in range(5)]
    monkeypatch.setattr(plots, "PAGE_INCIDENTS", 2)
    assert plots.pages(rep.data) == 3
    for page, numbers in enumerate(([1, 2], [3, 4], [5])):
        fig, labels = plots.timeline_figure(rep.data, page)
        fig.canvas.draw()
        assert [int(a.get_text().split()[0][1:]) for a in labels] == numbers
        evidence = [ax for ax in fig.axes if ax.get_ylabel().startswith("#")]
        assert {int(ax.get_ylabel().split()[0][1:]) for ax in evidence} == set(numbers)
        steps = [ax for ax in fig.axes if "per step" in ax.get_ylabel() or "step time" in ax.get_ylabel()]
        assert len(steps) == 1  # each page draws the steps of its incidents' job
        assert fig.axes[-1].get_xlim() == plots.timeline_figure(rep.data, 0)[0].axes[-1].get_xlim()  # one UTC axis
        assert f"incidents #{numbers[0]}–#{numbers[-1]} of 5" in fig.axes[-1].get_xlabel()
        plt.close("all")
    paths = rep.write(tmp_path / "paged")
    assert [p.name for p in paths["pngs"]] == ["timeline.png", "timeline-2.png", "timeline-3.png"]
    md = paths["md"].read_text()
    assert md.index("![timeline](timeline.png)") < md.index("Incidents #3–#4: their jobs' steps and their evidence:") \
        < md.index("![timeline](timeline-2.png)") < md.index("![timeline](timeline-3.png)")
    assert paths["html"].read_text().count('src="data:image/png;base64,') == 3


def test_bundle_replays_without_kafka_to_the_identical_result(one_fault: tuple[Topology, list],
                                                               tmp_path: Path) -> None:
    from whywait.engine.commands.export_cmd import rule_files
    from whywait.engine.importers.bundle import BundleWriter

    infra, msgs = one_fault
    w = Window(START, START + 260)
    topo = tmp_path / "topology.yaml"
    make_cluster(nodes=8).to_yaml(topo)
    merge = EventTimeMerge(["a"], w)
    merge.raw = True
    for t, m in msgs:
        merge.add("a", t, [encode(m)])
    bundle = tmp_path / "incident.whywait"
    with BundleWriter(bundle, {"since": w.since, "until": w.until, "lead_s": 0.0}) as bw:
        for topic, raw in merge.drain():
            bw.add(topic, raw)
        bw.close(topo, rule_files([RULES]))
    want, _ = replay(merged(msgs, w), load_rules([RULES]), infra)
    out = tmp_path / "d.jsonl"
    r = subprocess.run([sys.executable, "-m", "whywait", "replay", "--input", str(bundle), "--json", str(out),
                        "--bootstrap", "127.0.0.1:1"], capture_output=True, text=True, cwd=REPO, timeout=120)
    assert r.returncode == 0, r.stderr
    assert out.read_text() == diagnoses_jsonl(want.diagnoses)
    assert "network.straggler-retransmits  node-05" in r.stdout
    # a corrupt bundle is one line, exit 2
    data = bytearray(bundle.read_bytes())
    data[200:220] = b"x" * 20
    bad = tmp_path / "bad.whywait"
    bad.write_bytes(bytes(data))
    r = subprocess.run([sys.executable, "-m", "whywait", "replay", "--input", str(bad)],
                       capture_output=True, text=True, cwd=REPO, timeout=60)
    assert r.returncode == 2 and len(r.stderr.strip().splitlines()) == 1 and "bad.whywait" in r.stderr


@pytest.mark.parametrize("args, says, code", [
    (["--since", "-10m", "--until", "-20m"], "must be after --since", 2),
    (["--since", "yesterday"], "--since: cannot read 'yesterday'", 2),
    (["--since", "-10m", "--bootstrap", "127.0.0.1:1"], "127.0.0.1:1 is unreachable", 3),
])
def test_bad_ranges_and_unreachable_broker_are_one_line(args: list[str], says: str, code: int, tmp_path: Path) -> None:
    topo = tmp_path / "t.yaml"
    make_cluster(nodes=2).to_yaml(topo)
    r = subprocess.run([sys.executable, "-m", "whywait", "replay", "--topology", str(topo), *args],
                       capture_output=True, text=True, cwd=REPO, timeout=60)
    assert r.returncode == code, r.stderr
    assert says in r.stderr and len(r.stderr.strip().splitlines()) == 1, r.stderr
    assert json.dumps("Traceback") not in r.stderr


def test_slack_thread_gets_the_summary_and_the_png(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from slack_sdk import WebClient
    from whywait.engine.report.slack import post_to_thread

    from tests.support.slack_server import SlackServer

    rep, _ = report_for([("nic-packet-loss", "node-05", 120, 200)], tmp_path)
    with SlackServer(channels=["#ml-platform"], token="xoxb-pm") as slack:
        root = WebClient(token="xoxb-pm", base_url=slack.url).chat_postMessage(channel="#ml-platform",
                                                                               text="[FIRING] train-llm ...")
        monkeypatch.setenv("SLACK_BOT_TOKEN", "xoxb-pm")
        monkeypatch.setenv("WHYWAIT_SLACK_API_URL", slack.url)
        post_to_thread(rep, f"{root['channel']}:{root['ts']}", tmp_path)
        thread = slack.thread(root["ts"])
        assert len(thread) == 2
        assert "node-05" in thread[0].text and "GPU-hours lost" in thread[0].text
        (fid,) = thread[1].files
        f = slack.files[fid]
        assert f.content is not None and f.content[:8] == b"\x89PNG\r\n\x1a\n" and f.thread_ts == root["ts"]
        assert slack.calls_to("files.getUploadURLExternal") and slack.calls_to("files.completeUploadExternal")


def test_report_links_each_incident_to_its_live_slack_thread(tmp_path: Path) -> None:
    from whywait.engine.notify.pipeline.incidents import Incident
    from whywait.engine.report import build_report, slack_threads

    infra, msgs = sim([("nic-packet-loss", "node-05", 120, 200)])
    w = Window(START, START + 260)
    res, _ = replay(merged(msgs, w), load_rules([RULES]), infra)
    spans = incidents(res.diagnoses, res.end)
    fp = spans[0].first.fingerprint
    rec = Incident(key="k", rule_id=spans[0].first.rule_id, lane="#ml-platform", channel="#ml-platform",
                   members={fp: spans[0].first.to_dict()}, ts="1764442925.000100", channel_id="C0000001").to_dict()
    threads = slack_threads([rec, {"members": {"x": {}}, "ts": None}], "https://acme.slack.com")
    assert threads == {fp: "https://acme.slack.com/archives/C0000001/p1764442925000100"}
    rep = build_report(res, spans, merged(msgs, w), w, Topology.from_dict(make_cluster(nodes=8).to_dict()), threads)
    paths = rep.write(tmp_path)
    assert "**Slack thread:** https://acme.slack.com/archives/C0000001/p1764442925000100" in paths["md"].read_text()
    assert '<a href="https://acme.slack.com/archives/C0000001/p1764442925000100">' in paths["html"].read_text()


def test_ctrl_c_keeps_what_was_concluded(one_fault: tuple[Topology, list]) -> None:
    infra, msgs = one_fault

    def interrupted() -> object:
        for m in merged(msgs, Window(START, START + 260)):
            if m["time"] > START + 150:  # mid-incident
                raise KeyboardInterrupt
            yield m

    res, _ = replay(interrupted(), load_rules([RULES]), infra)
    assert res.interrupted and res.end is not None and res.end <= START + 150
    assert [d.culprit for d in res.diagnoses if d.status == "firing"] == ["node-05"]  # what was found so far


def test_job_and_project_filters(one_fault: tuple[Topology, list]) -> None:
    _, msgs = one_fault
    other = envelope("placement", "sched", START + 2, job="other", project="vision", team="cv", state="running",
                     ranks=[{"rank": 0, "node": "node-01", "gpu": 7}])
    steps = envelope("steps", "node-01", START + 3, job="other", steps=[{"rank": 0, "step": 1, "duration_s": 1.0}])
    extra = [("whywait.placement.v1", other), ("whywait.steps.v1", steps)]
    for window, want_jobs in [(Window(START, START + 260, jobs=frozenset({"other"})), {"other"}),
                              (Window(START, START + 260, projects=frozenset({"llm"})), {"train-llm"}),
                              (Window(START, START + 260), {"train-llm", "other"})]:
        out = merged(sorted(msgs + extra, key=lambda x: x[1]["time"]), window)
        assert {m["job"] for m in out if "job" in m} == want_jobs
        assert any(m["kind"] == "gpu" for m in out)  # node telemetry stays: peers are compared on it


def test_report_names_other_projects_on_the_same_switch(tmp_path: Path) -> None:
    from whywait.engine.report import build_report

    topo = make_cluster(nodes=8)
    leaf = topo.leaf_of("node-05")
    mates = [n for n in topo.nodes() if topo.leaf_of(n) == leaf and n != "node-05"]
    far = [n for n in topo.nodes() if topo.leaf_of(n) != leaf]
    jobs = [make_job(topo, nodes=["node-05", *far]),
            make_job(topo, job="vision-7", project="vision", team="cv", channel="#cv", nodes=mates[:1])]
    s = Simulation(topo, jobs, [make_fault("nic-packet-loss", "node-05", 120, 200)], start_time=START,
                   duration_s=260, seed=2)
    msgs = list(s.messages())
    w = Window(START, START + 260)
    infra = Topology.from_dict(make_cluster(nodes=8).to_dict())
    res, _ = replay(merged(msgs, w), load_rules([RULES]), infra)
    spans = [sp for sp in incidents(res.diagnoses, res.end) if sp.first.culprit == "node-05"]
    assert spans
    rep = build_report(res, spans, merged(msgs, w), w, Topology.from_dict(make_cluster(nodes=8).to_dict()))
    md = rep.write(tmp_path)["md"].read_text()
    assert f"vision-7 (project vision, team cv) on {leaf}" in md


def test_a_future_stamped_message_neither_ends_a_stream_nor_makes_batches_matter(
        one_fault: tuple[Topology, list]) -> None:
    # The fuzz test leaves host messages stamped days and decades ahead on the shared topics; one of them early
    # in a partition used to close that stream (its "newest" was past the window), so export and replay read
    # only as much of the window as their fetches happened to hold: different incidents, different reports.
    _, msgs = one_fault
    w = Window(START, START + 260)
    host = next(m for t, m in msgs if m["kind"] == "host")
    ahead = [("whywait.host.v1", {**host, "time": START + d}) for d in (86_400.0, 3.2e9)]
    hostile = ahead + msgs[:50] + ahead + msgs[50:]
    want = diagnoses_jsonl(replay(merged(msgs, w), load_rules([RULES]),
                                  Topology.from_dict(make_cluster(nodes=8).to_dict()))[0].diagnoses)
    n_clean = len(merged(msgs, w))
    for partitions, batch, seed in [(1, 10_000, 0), (3, 7, 1), (2, 1, 3), (1, 300, 4)]:
        out = merged(hostile, w, partitions, batch, seed)
        assert len(out) == n_clean  # the whole window, and nothing from the future
        res, _ = replay(out, load_rules([RULES]), Topology.from_dict(make_cluster(nodes=8).to_dict()))
        assert diagnoses_jsonl(res.diagnoses) == want


def test_a_stream_ends_after_a_run_of_messages_past_the_window(one_fault: tuple[Topology, list]) -> None:
    _, msgs = one_fault
    w = Window(START, START + 60)
    merge = EventTimeMerge(["a"], w, slack_s=5)
    for topic, m in msgs:
        if "a" not in merge.open:
            break
        merge.add("a", topic, [encode(m)])
    assert "a" not in merge.open  # closed long before the 260 s of data ran out
    assert merge.read < len(msgs) / 2


def test_release_is_in_total_order_across_seconds_whatever_the_batches(one_fault: tuple[Topology, list]) -> None:
    # Held messages wait in whole-second buckets; the horizon often falls inside one, which is then released in
    # part.  Times just either side of a second, ties broken by kind, topic and bytes, records up to 2 s out of
    # order and a slack of 2 s (a merge that let that bucket go whole would release some too early): one order.
    _, sim_msgs = one_fault
    rng = random.Random(5)
    msgs = [(tp, {**m, "time": START + i // 4 / 5 + rng.choice([0.0, 1e-9, 0.5, 0.999999, 1.0, 2.0])})
            for i, (tp, m) in enumerate(x for x in sim_msgs[:3000:2] if x[1]["kind"] != "placement")]
    kinds = {"placement": 0, "checkpoint": 1, "steps": 2}
    want = [raw for *_, raw in sorted((m["time"], kinds.get(m["kind"], 3), tp, encode(m)) for tp, m in msgs)]
    w = Window(START, START + 600)
    for partitions, batch, seed in [(1, 10_000, 0), (3, 7, 1), (4, 1, 2), (2, 50, 3), (1, 1, 4)]:
        assert [raw for _, raw in merged(msgs, w, partitions, batch, seed, raw=True, slack_s=2.0)] == want


def test_a_duplicate_delivery_is_released_twice_side_by_side(one_fault: tuple[Topology, list]) -> None:
    _, msgs = one_fault
    # at-least-once delivery: each record again (placements before the window are one per job anyway)
    twice = [x for x in msgs[:400] if x[1]["kind"] != "placement" for _ in range(2)]
    out = [raw for _, raw in merged(twice, Window(START, START + 260), 3, 9, 1, raw=True)]
    assert len(out) == len(twice) and out[0::2] == out[1::2]


def test_batch_gc_restores_the_collector() -> None:
    import gc

    from whywait.engine.commands.gc_tuning import batch_gc

    before = gc.get_threshold()
    with batch_gc():
        assert gc.get_threshold()[0] > before[0] and gc.get_freeze_count() > 0
    assert gc.get_threshold() == before and gc.get_freeze_count() == 0


def test_a_hundred_incidents_give_the_thread_the_first_ones_and_the_count() -> None:
    """A summary line an incident: 120 made a message of 60,000 characters, past what Slack shows."""
    from whywait.engine.report.slack import MAX_TEXT, thread_text

    lines = [f"#{k} **train-{k}** was slowed from ... " + "x" * 400 for k in range(1, 121)]
    text = thread_text([*lines, "In all: 120 incident(s), 9.00 GPU-hours lost."])
    assert len(text) <= MAX_TEXT
    assert text.startswith("*Postmortem (whywait replay)*\n#1 *train-1* was slowed")
    assert text.endswith("more incident(s): the report (`--report DIR`) has every one.\n"
                         "In all: 120 incident(s), 9.00 GPU-hours lost.")
    shown = text.count("was slowed")
    assert 5 <= shown < 120 and f"…and {120 - shown} more incident(s)" in text
    one = thread_text(["#1 **a** was slowed.", "In all: 1 incident(s), 0.10 GPU-hours lost."])
    assert one == "*Postmortem (whywait replay)*\n#1 *a* was slowed.\nIn all: 1 incident(s), 0.10 GPU-hours lost."


def test_a_channel_named_by_name_is_found_past_the_first_page() -> None:
    """``--slack-thread #name:ts``: the channel list is paged; it used to read one page of 1,000 and stop."""
    from slack_sdk import WebClient
    from whywait.engine.errors import NotifyError
    from whywait.engine.report.slack import _channel_id

    from tests.support.slack_server import SlackServer

    names = [f"#team-{k:04d}" for k in range(1050)] + ["#ml-platform"]
    with SlackServer(channels=names, token="xoxb-pm") as slack:
        client = WebClient(token="xoxb-pm", base_url=slack.url)
        assert _channel_id(client, "#ml-platform") == slack.channel_id("#ml-platform")
        assert len(slack.calls_to("conversations.list")) == 6  # 5 pages of 200, then 51
        with pytest.raises(NotifyError, match="Slack channel #nowhere not found"):
            _channel_id(client, "#nowhere")


def test_a_quiet_window_of_many_jobs_draws_the_largest_not_every_one(tmp_path: Path) -> None:
    """Without incidents every job seen was drawn: a cluster of hundreds of jobs made a figure of hundreds of panels."""
    import matplotlib.pyplot as plt
    from whywait.engine.report import plots

    rep, _ = report_for([], tmp_path)
    data = rep.data
    assert not data.incidents and data.jobs == ["train-llm"]
    data.jobs = data.jobs + [f"tiny-{k:03d}" for k in range(30)]  # jobs that sent no steps rank last
    jobs, n = plots.jobs_on(data, [])
    assert n == 31 and len(jobs) == plots.PAGE_JOBS and jobs[0] == "train-llm"
    fig, _ = plots.timeline_figure(data)
    step_panels = [ax for ax in fig.axes if "per step" in ax.get_ylabel() or "step time" in ax.get_ylabel()]
    assert len(step_panels) == plots.PAGE_JOBS
    assert fig.axes[-1].get_xlabel().endswith(f"· the {plots.PAGE_JOBS} largest of 31 jobs")
    plt.close(fig)


def test_history_read_after_newer_data_on_one_stream_is_said_late_not_skipped(one_fault: tuple[Topology, list]) -> None:
    # A step table imported after today's telemetry was written: one partition holds the newer records first.
    # They are evaluated, but late; the summary said "skipped N: late beyond the merge slack (still evaluated)".
    _, msgs = one_fault
    w = Window(START, START + 260)
    newer = [encode(m) for t, m in msgs if m["kind"] == "steps" and m["time"] >= START + 200]
    older = [encode(m) for t, m in msgs if m["kind"] == "steps" and m["time"] < START + 100]
    merge = EventTimeMerge({"a": []}, w, slack_s=10)
    merge.add("a", "whywait.steps.v1", newer)
    list(merge.ready())
    merge.add("a", "whywait.steps.v1", older)
    list(merge.drain())
    assert merge.late == len(older) > 0
    assert not any("late" in k for k in merge.skipped)
    note = merge.late_note()
    assert note is not None and note.startswith(f"{len(older):,} message(s) arrived more than 10 s of event time "
                                                "behind what was already evaluated")
    assert EventTimeMerge({"a": []}, w).late_note() is None


def test_a_range_that_ends_while_the_fault_holds_leaves_the_incident_open_at_its_end(
        one_fault: tuple[Topology, list]) -> None:
    # The data stops at 170 s, inside the fault (120-200 s).  The replay moves its clock on to close the windows,
    # and the incident "resolved" then; the summary said [resolved], and the report "resolved at" a time after
    # the last message.  It held on the last tick with data: it is open when the data ended.
    infra, msgs = one_fault
    cut = [(tp, m) for tp, m in msgs if m["time"] < START + 170]
    res, _ = replay(merged(cut, Window(START, START + 170)), load_rules([RULES]), infra)
    [s] = [s for s in incidents(res.diagnoses, res.end, res.open_at_end)
           if s.first.rule_id == "network.straggler-retransmits"]
    assert not s.resolved and s.end == res.end and s.first.fingerprint in res.open_at_end
    assert [x.resolved for x in incidents(res.diagnoses, res.end) if x.first.fingerprint == s.first.fingerprint] == [
        True]  # without the set, as before


def test_an_incident_open_at_the_end_carries_its_latest_cost_not_the_first_estimate(
        one_fault: tuple[Topology, list], tmp_path: Path) -> None:
    # The report and the console said "0.01 GPU-hours lost" (the first firing's estimate) for an incident still
    # open when the data ended, while --json (and so the digest) held its closing diagnosis's 0.31: the closing
    # diagnosis was dropped from the span.  The report must carry the latest figure the replay computed.
    from whywait.engine.commands.replay_cmd import latest_cost
    from whywait.engine.report import build_report

    infra, msgs = one_fault
    cut = [(tp, m) for tp, m in msgs if m["time"] < START + 170]
    w = Window(START, START + 170)
    res, _ = replay(merged(cut, w), load_rules([RULES]), infra)
    spans = incidents(res.diagnoses, res.end, res.open_at_end)
    [s] = [s for s in spans if s.first.rule_id == "network.straggler-retransmits"]
    assert not s.resolved
    closing = [d for d in res.diagnoses if d.fingerprint == s.first.fingerprint and d.status == "resolved"]
    assert closing and closing[-1].cost and s.first.cost
    want = closing[-1].cost["gpu_hours_lost"]
    assert want > s.first.cost["gpu_hours_lost"]  # the first firing's is the early estimate
    assert latest_cost(s) == pytest.approx(want)
    rep = build_report(res, spans, merged(cut, w), w, Topology.from_dict(make_cluster(nodes=8).to_dict()))
    [v] = [v for v in rep.data.incidents if v.rule_id == "network.straggler-retransmits"]
    assert v.cost is not None and v.cost["gpu_hours_lost"] == pytest.approx(want) and not v.resolved
    md = rep.write(tmp_path / "r")["md"].read_text()
    section = md.split(f"### #{v.number} ", 1)[1].split("\n### ", 1)[0]
    assert f"**Cost:** {want:.2f} GPU-hours lost" in section
    # open: its figures at the data's end, not "at its resolution"
    assert "at its resolution" not in section and "| when the data ended (" in section


def test_a_reused_report_folder_loses_the_stale_pages_of_a_longer_report_and_nothing_else(tmp_path: Path) -> None:
    # Before: a folder that held timeline-2.png from an earlier report of more than eight incidents kept it beside
    # a new report of one page, which a reader took for part of it.
    rep, _ = report_for([("nic-packet-loss", "node-05", 120, 200)], tmp_path)
    folder = tmp_path / "reused"
    folder.mkdir()
    for name in ("timeline-2.png", "timeline-12.png", "timeline-notes.png", "notes.md", "timeline-2.png.bak"):
        (folder / name).write_text("old")
    paths = rep.write(folder)
    assert [p.name for p in paths["pngs"]] == ["timeline.png"]
    assert sorted(p.name for p in folder.iterdir()) == ["notes.md", "report.html", "report.md", "timeline-2.png.bak",
                                                        "timeline-notes.png", "timeline.png"]
    (folder / "timeline-3.png").write_text("--plot's own")  # what the same command wrote there is kept
    rep.write(folder, keep=(folder / "timeline-3.png",))
    assert (folder / "timeline-3.png").read_text() == "--plot's own"


def test_a_report_of_an_interrupted_replay_says_so_where_it_stopped(one_fault: tuple[Topology, list],
                                                                    tmp_path: Path) -> None:
    # Before: a report written after Ctrl-C had the whole window in its title, "still going at 19:02:30 (when the
    # data read ended)" and "N messages - nothing skipped": nothing told a reader it covered part of the window.
    from whywait.engine.report import build_report
    from whywait.engine.report.render import _utc
    from whywait.engine.report.slack import thread_text

    infra, msgs = one_fault
    w = Window(START, START + 260)

    def interrupted() -> object:
        for m in merged(msgs, w):
            if m["time"] > START + 150:
                raise KeyboardInterrupt
            yield m

    res, _ = replay(interrupted(), load_rules([RULES]), infra)
    assert res.interrupted and res.end is not None
    rep = build_report(res, incidents(res.diagnoses, res.end, res.open_at_end), merged(msgs, w), w,
                       Topology.from_dict(make_cluster(nodes=8).to_dict()))
    paths = rep.write(tmp_path / "r")
    md = paths["md"].read_text()
    where = f"after {res.messages:,} messages, at event time {_utc(res.end)}"
    summary = md.split("## Summary", 1)[1].split("## Timeline", 1)[0]
    assert f"- **Interrupted** (Ctrl-C) {where}: this report covers only part of the window" in summary
    read = md.split("## What the replay read", 1)[1]
    assert f"- **interrupted** (Ctrl-C) {where}: the rest of the window, to {_utc(w.until)}, was not read" in read
    assert md.splitlines()[0].endswith("(interrupted: partial)")
    assert f"<b>Interrupted</b> (Ctrl-C) {where}" in paths["html"].read_text()
    assert f"*Interrupted* (Ctrl-C) {where}" in thread_text(rep.summary_lines())  # the Slack post too


def test_concurrent_incidents_of_one_job_count_its_lost_time_once_in_the_total(tmp_path: Path) -> None:
    # The 32-node simulation with 10 faults: "In all: 10 incident(s), 19.94 GPU-hours lost" for a truth of 6.7,
    # three rules charging the same 43.5 lost seconds.  The total counts a job's second once; each incident keeps
    # its own figure, and says what of it the total counts.
    from whywait.engine.report.costs import Loss, counted_losses, loss_span

    rep, paths = report_for([("nic-packet-loss", "node-05", 100, 180), ("gpu-thermal", "node-02", 104, 190),
                             ("nic-packet-loss", "node-07", 108, 200)], tmp_path)
    views = [v for v in rep.data.incidents if v.cost]
    assert len(views) >= 3 and len({v.job for v in views}) == 1
    own = [v.cost["gpu_hours_lost"] for v in views if v.cost]
    # each loss where the rule says it lies (the steps that lost time), else over the incident's span
    want = counted_losses([Loss(v.job, *loss_span(v.cost, v.start, v.end), c) for v, c in zip(views, own, strict=True)])
    assert [v.counted for v in views] == pytest.approx(want)
    assert sum(want) < sum(own) - 0.01
    md = paths["md"].read_text()
    total = next(line for line in md.splitlines() if line.startswith("- In all:"))
    assert total.startswith(f"- In all: {len(rep.data.incidents)} incident(s), {sum(want):.2f} GPU-hours lost (costs "
                            "shared: ") and f"their own figures add up to {sum(own):.2f}" in total, total
    for v in views:  # each incident's own figure stays as it was given, with what the total counts of it
        assert v.cost is not None and v.counted is not None
        line = next(x for x in md.splitlines() if x.startswith(f"#{v.number} ") or x.startswith(f"- #{v.number} "))
        assert f"Cost: {v.cost['gpu_hours_lost']:.2f} GPU-hours lost" in line
        assert f"{v.counted:.2f} of it counted in the total" in line


HOSTILE = "<img src=x onerror=alert(1)>|`x`*y*"


def test_names_are_escaped_in_the_markdown_and_stay_literal_in_the_html(tmp_path: Path) -> None:
    # Before: a job named <img src=x onerror=alert(1)>|`x`*y* gave the evidence table an extra column, put the raw
    # <img> into report.md, and the HTML made <code>x</code> of the name's backticks and broke its own bold tag.
    import dataclasses

    from whywait.engine.report.render import _cells, html, markdown
    from whywait.engine.report.slack import thread_text

    rep, _ = report_for([("nic-packet-loss", "node-05", 120, 200)], tmp_path)
    data = rep.data
    v = data.incidents[0]
    job = v.job or ""
    data.jobs = [HOSTILE if j == job else j for j in data.jobs]

    def hostile(s: str) -> str:
        return s.replace(job, HOSTILE)

    data.incidents[0] = dataclasses.replace(
        v, job=HOSTILE, title=hostile(v.title), cause=hostile(v.cause) + f" Try `kill {HOSTILE}` first.",
        owner="t`e (project p<b>|x)", next_step=hostile(v.next_step) + " Then `ethtool -S` it.",
        evidence=[{**e, "entity": hostile(e["entity"])} for e in v.evidence],
        evidence_last={(m, hostile(ent)): x for (m, ent), x in v.evidence_last.items()},
        names=tuple(hostile(n) for n in v.names) + ("t`e", "p<b>|x"))
    md = markdown(data, "timeline.png")
    outside_code = md.replace(f"`` kill {HOSTILE} ``", "")  # in a code span, <img> is literal text (CommonMark)
    assert "<img" not in outside_code.replace("\\<img", "") and "<b>" not in outside_code.replace("\\<b\\>", "")
    assert "\\<img src=x onerror=alert(1)\\>\\|\\`x\\`\\*y\\*" in md  # the name, escaped
    rows = [line for line in md.splitlines() if line.startswith("| ")]
    widths = {len(_cells(r)) for r in rows if not set(r) <= set("|-")}
    assert widths == {7}, widths  # the | in the name no longer adds a column
    assert f"`` kill {HOSTILE} ``" in md  # a name inside the rule's own code span stays verbatim there
    page = html(data, b"\x89PNG")
    body = page.split("<body>", 1)[1]
    assert "<img src=x" not in body and "<code>x</code>" not in body and "<b>|x" not in body
    assert "&lt;img src=x onerror=alert(1)&gt;|`x`*y*" in body  # the name as it is, literal
    assert "<code>ethtool -S</code>" in body  # the rule's own code spans are still code
    assert f"<code>kill {HOSTILE.replace('<', '&lt;').replace('>', '&gt;')}</code>" in body
    assert "<title>Postmortem: &lt;img src=x" in page
    for row in body.split("<tr>")[1:]:
        assert row.count("<td>") in (0, 7) and row.count("<th>") in (0, 7), row
    slack = thread_text(rep.summary_lines())
    assert "&lt;img src=x onerror=alert(1)&gt;|`x`*y*" in slack and "\\" not in slack  # literal, and no <!...> mention
