"""The ownership file: matching, the default owner, file:line errors, and hot reload."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from whywait.engine.placement.model import PlacementError
from whywait.engine.placement.ownership import NO_OWNER_TEAM, OwnershipFile, parse_ownership

from tests.placement.conftest import FIX


def test_accounts_namespaces_and_labels_map_to_owners() -> None:
    o = OwnershipFile(FIX / "ownership.yaml")
    assert o.resolve(account="llm-pretrain").channel == "#llm-pretrain"
    assert o.resolve(namespace="llm", labels={"team": "pretraining"}).team == "pretraining"
    assert o.resolve(namespace="llm", labels={"team": "other"}).known is False  # every key given must match
    nobody = o.resolve(namespace="team-x")
    assert (nobody.project, nobody.team, nobody.channel, nobody.known) == ("team-x", NO_OWNER_TEAM, "#gpu-alerts",
                                                                          False)


def test_every_problem_is_reported_with_its_line(tmp_path: Path) -> None:
    text = ("default_channel: gpu-alerts\n"
            "owners:\n"
            "  - project: llm\n"
            "    team: pt\n"
            "    match: {slurm_acount: llm}\n"
            "  - project: v\n"
            "    chanel: '#v'\n"
            "    match: {namespace: v}\n")
    with pytest.raises(PlacementError) as exc:
        parse_ownership(text, "own.yaml")
    assert str(exc.value).splitlines()[1:] == [
        "  own.yaml:1: default_channel: expected a Slack channel such as '#gpu-alerts' (got 'gpu-alerts')",
        "  own.yaml:5: owners[0].match.slurm_acount: unknown key (valid: labels, namespace, slurm_account, user)",
        "  own.yaml:6: owners[1].team: expected a non-empty string (got None)",
        "  own.yaml:7: owners[1].chanel: unknown key (valid: channel, match, project, team)",
    ]


def test_hot_reload_and_a_broken_edit_keeps_the_last_good_rules(tmp_path: Path) -> None:
    path = tmp_path / "own.yaml"
    path.write_text("owners: [{project: a, team: ta, channel: '#a', match: {namespace: ns}}]\n")
    now = [0.0]
    o = OwnershipFile(path, clock=lambda: now[0])
    assert o.resolve(namespace="ns").team == "ta"
    path.write_text("owners: [{project: b, team: tb, channel: '#b', match: {namespace: ns}}]\n")
    os.utime(path, (1, 1))
    now[0] = 2.0
    assert o.resolve(namespace="ns").team == "tb" and o.reloads == 1
    path.write_text("owners: [{project: c, match: {namespace: ns}}]\n")
    os.utime(path, (2, 2))
    now[0] = 4.0
    assert o.resolve(namespace="ns").team == "tb"
    assert o.last_error is not None and "owners[0].team" in o.last_error
