"""``whywait digest --post`` through slack_sdk to the local Slack server, with a week as a real cluster has it:
hundreds of jobs, so Slack's limits (50 blocks, 3,000 characters a section, about 13,000 in all) are met.

Before: every job was a section of one message, so a project with 60 jobs posted 61 blocks and Slack refused
the whole digest (``invalid_blocks``); nothing in the tests posted a digest at all.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Iterator

import pytest
from whywait.agents.events import envelope
from whywait.engine.commands.digest_cmd import post
from whywait.engine.report import digest as digest_mod
from whywait.engine.report.digest import Digest, messages

from tests.support.slack_server import MAX_BLOCKS, SlackServer

T0 = 1_764_442_800.0
TOKEN = "xoxb-digest-0000"


@pytest.fixture
def slack(monkeypatch: pytest.MonkeyPatch) -> Iterator[SlackServer]:
    with SlackServer(channels=["#sweeps", "#vision"], token=TOKEN) as s:
        monkeypatch.setenv("SLACK_BOT_TOKEN", TOKEN)
        monkeypatch.setenv("WHYWAIT_SLACK_API_URL", s.url)
        yield s


def week(jobs: int, project: str = "sweeps", channel: str = "#sweeps", long_name: bool = False) -> Digest:
    """``jobs`` jobs of one project, 8 GPUs for 10 minutes each, job k losing k/1000 GPU-hours to the network."""
    d = Digest(T0, T0 + 7 * 86400)
    for k in range(jobs):
        job = f"hp-sweep-{k:03d}" + ("-" + "x" * 3000 if long_name else "")
        d.add(envelope("placement", "sched", T0, job=job, project=project, team="ml", state="running",
                       slack_channel=channel, ranks=[{"rank": r, "node": "n0", "gpu": r} for r in range(8)]))
        for s in range(60):
            d.add(envelope("steps", "n0", T0 + 60 + 10 * s, job=job,
                           steps=[{"rank": r, "step": s, "duration_s": 10.0} for r in range(8)]))
        d.add_diagnosis({"rule_id": "network.straggler-retransmits", "fingerprint": f"f{k}", "status": "resolved",
                         "severity": "warning", "cause": "c", "owner": None, "title": "t", "job": job,
                         "culprit": "n0", "starts_at": T0 + 60, "detected_at": T0 + 65, "ends_at": T0 + 120,
                         "cost": {"gpu_hours_lost": k / 1000}})
    d.finish()
    return d


def test_a_project_of_two_hundred_jobs_is_one_message_within_slacks_limits(slack: SlackServer, tmp_path: Path,
                                                                           capsys: pytest.CaptureFixture[str]) -> None:
    d = week(200)
    post(d, d.rows())
    assert capsys.readouterr().out == "posted to #sweeps\n"
    (root,) = slack.roots("#sweeps")
    assert len(root.blocks or []) <= MAX_BLOCKS
    text = root.all_text
    # the jobs that lost the most are named, the rest summed in one line
    assert "hp-sweep-199" in text and "hp-sweep-190" in text and "hp-sweep-189" not in text
    rest = [r for r in d.rows() if r["job"] < "hp-sweep-190"]
    used, lost = sum(r["gpu_hours_used"] for r in rest), sum(r["gpu_hours_lost"] for r in rest)
    assert f"…and 190 more job(s) of sweeps: {used:,.1f} GPU-hours used, {lost:,.1f} lost" in text
    (chart,) = slack.thread(root.ts)
    (f,) = [slack.files[i] for i in chart.files]
    assert f.filename == "digest.png" and (f.content or b"")[:4] == b"\x89PNG"


def test_a_job_name_longer_than_a_section_is_cut_not_refused(slack: SlackServer) -> None:
    d = week(3, long_name=True)
    post(d, d.rows())
    (root,) = slack.roots("#sweeps")
    assert all(len(b["text"]["text"]) <= 3000 for b in root.blocks or [] if b["type"] == "section")


def test_a_channel_many_projects_name_gets_the_rest_in_its_thread(slack: SlackServer,
                                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(digest_mod, "TOP_JOBS", 10)
    d = Digest(T0, T0 + 7 * 86400)
    for p in range(8):  # eight projects of twelve jobs, one channel: 8 x (10 sections + 1 line) + a header
        part = week(12, project=f"proj-{p}", channel="#vision")
        for job, use in part.jobs.items():
            d.jobs[f"p{p}-{job}"] = use
        d.last_diag.update({f"p{p}-{k}": v for k, v in part.last_diag.items()})
    post(d, d.rows())
    (root,) = slack.roots("#vision")
    replies = slack.thread(root.ts)
    continued = [m for m in replies if m.blocks]
    assert continued and all(len(m.blocks or []) <= MAX_BLOCKS for m in [root, *continued])
    shown = "\n".join(m.all_text for m in [root, *continued])
    assert all(f"proj-{p} /" in shown for p in range(8))
    assert shown.count("Useful GPU time,") == 1  # one header, on the first message
    assert not slack.calls_to("chat.postMessage", ok=False)


def test_messages_split_on_blocks_and_characters() -> None:
    blocks = [{"type": "section", "text": {"type": "mrkdwn", "text": "x" * 100}} for _ in range(120)]
    assert [len(m) for m in messages(blocks)] == [50, 50, 20]
    assert [len(m) for m in messages(blocks, max_chars=1000)] == [10] * 12


def test_the_chart_shows_the_biggest_losses_and_one_bar_for_the_rest(tmp_path: Path,
                                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    import matplotlib.axes

    bars: list[list[str]] = []
    real = matplotlib.axes.Axes.barh

    def barh(self: Any, y: Any, *a: Any, **k: Any) -> Any:
        bars.append(list(y))
        return real(self, y, *a, **k)

    monkeypatch.setattr(matplotlib.axes.Axes, "barh", barh)
    week(200).plot(tmp_path / "d.png")
    assert len(bars[0]) == digest_mod.TOP_BARS
    assert bars[0][0] == "sweeps / hp-sweep-199" and bars[0][-1] == "176 other jobs / together"


def test_a_digest_slack_refuses_names_slacks_reason(slack: SlackServer) -> None:
    """A digest Slack refuses (the channel is gone) is a NotifyError naming Slack's reason (the CLI's one line)."""
    from whywait.engine.errors import NotifyError

    d = week(2, channel="#gone")
    with pytest.raises(NotifyError, match="Slack refused the digest: channel_not_found"):
        post(d, d.rows())


def test_an_unreachable_slack_is_one_line(monkeypatch: pytest.MonkeyPatch,
                                          capsys: pytest.CaptureFixture[str]) -> None:
    """Slack down during ``--post``: urllib's error used to reach the CLI as an internal error (exit 70)."""
    from whywait.engine.cli import main
    from whywait.engine.commands import digest_cmd
    from whywait.engine.errors import NotifyError

    monkeypatch.setenv("SLACK_BOT_TOKEN", TOKEN)
    monkeypatch.setenv("WHYWAIT_SLACK_API_URL", "http://127.0.0.1:1/")
    d = week(2)
    with pytest.raises(NotifyError, match="^Slack unreachable: .*Connection refused"):
        post(d, d.rows())
    monkeypatch.setattr(digest_cmd, "run", lambda args: post(d, d.rows()))
    assert main(["digest", "--post"]) == 3
    err = capsys.readouterr().err
    assert err.startswith("whywait digest: Slack unreachable: ") and err.count("\n") == 1
