"""``silence add`` checks a ``rule_id`` matcher against the loaded rules, and counts a site folder's labels.

``-m rule_id=network.straggler-retransmit`` (an ``s`` short) was stored and matched nothing, silently; ``-m site=dc2``,
a label only a site folder's rules set, was refused as unknown with no way to name that folder.
"""

from __future__ import annotations

import argparse
from pathlib import Path

import pytest
from whywait.engine.commands import silence_cmd
from whywait.engine.notify.silences import InMemorySilenceStore, SilenceError

RULES = Path(__file__).resolve().parents[2] / "rules"
SITE_RULE = """\
apiVersion: whywait/v1
id: site.cpu-hot
title: "{{ job }} waits on {{ node }}: CPU saturated"
cause: "{{ node }} is busy"
next_step: "look at {{ node }}"
group_by: [job, node]
labels: {site: dc2}
when: {type: threshold, metric: host.cpu_busy_pct, agg: max, window: 5s, value: "> 95", culprit: true}
"""


@pytest.fixture
def store(monkeypatch: pytest.MonkeyPatch) -> InMemorySilenceStore:
    s = InMemorySilenceStore()
    s.close = lambda: None  # type: ignore[method-assign]
    monkeypatch.setattr(silence_cmd, "open_store", lambda bootstrap: s)
    monkeypatch.delenv("WHYWAIT_SITE_RULES", raising=False)
    monkeypatch.setenv("WHYWAIT_RULES", str(RULES))
    return s


@pytest.fixture
def site(tmp_path: Path) -> Path:
    d = tmp_path / "site-rules"
    d.mkdir()
    (d / "site.cpu-hot.yaml").write_text(SITE_RULE)
    (d / "quieter.yaml").write_text("override: network.straggler-retransmits\nlabels: {owner_site: dc2}\n")
    return d


def _run(argv: list[str]) -> int:
    p = argparse.ArgumentParser()
    silence_cmd.register(p)
    return silence_cmd.run(p.parse_args(argv))


def test_a_rule_id_no_rule_has_is_refused_with_a_did_you_mean(store: InMemorySilenceStore) -> None:
    with pytest.raises(SilenceError) as exc:
        _run(["add", "-m", "rule_id=network.straggler-retransmit", "--for", "2h"])
    assert str(exc.value).startswith("-m rule_id=network.straggler-retransmit: no loaded rule's id matches it, so "
                                     "the silence would match nothing; did you mean 'network.straggler-retransmits'?")
    assert "--force" in str(exc.value)
    with pytest.raises(SilenceError, match="no loaded rule's id matches it"):
        _run(["add", "-m", "rule_id=netwrk.*", "--for", "2h"])
    assert store.all() == []
    # --force stores it anyway (the engine may load rules this command does not)
    assert _run(["add", "-m", "rule_id=network.straggler-retransmit", "--for", "2h", "--force"]) == 0


def test_a_rule_id_or_a_glob_matching_a_loaded_rule_is_accepted(store: InMemorySilenceStore) -> None:
    assert _run(["add", "-m", "rule_id=network.straggler-retransmits", "--for", "2h"]) == 0
    assert _run(["add", "-m", "rule_id=network.*", "--for", "2h"]) == 0
    assert len(store.all()) == 2


def test_a_site_folder_s_labels_and_rules_count_when_the_command_is_told_of_it(
        store: InMemorySilenceStore, site: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    with pytest.raises(SilenceError, match=r"unknown name 'site'.*--rules PATH to count a site folder's labels"):
        _run(["add", "-m", "site=dc2", "--for", "2h"])
    with pytest.raises(SilenceError, match="-m rule_id=site.cpu-hot: no loaded rule's id matches it"):
        _run(["add", "-m", "rule_id=site.cpu-hot", "--for", "2h"])
    assert _run(["add", "-m", "site=dc2", "-m", "rule_id=site.cpu-hot", "--rules", str(site), "--for", "2h"]) == 0
    # an override's label (loaded after the engine's rules it changes)
    assert _run(["add", "-m", "owner_site=dc2", "--rules", str(site), "--for", "2h"]) == 0
    # and without --rules when the engine's own variables name the site folder
    monkeypatch.setenv("WHYWAIT_SITE_RULES", str(site))
    assert _run(["add", "-m", "site=dc2", "-m", "rule_id=site.*", "--for", "2h"]) == 0
    assert len(store.all()) == 3


def test_rules_named_on_the_command_line_that_do_not_load_are_refused(tmp_path: Path) -> None:
    """`--rules /nonexistent` left the rule-id check undone and stored a silence that matched nothing."""
    for matchers in ({"rule_id": "network.straggler-retransmit"}, {"job": "train-llm"}):
        with pytest.raises(SilenceError, match=r"--rules: the rules do not load: .*nonexistent"):
            silence_cmd.check_names(matchers, more=[tmp_path / "nonexistent"])
