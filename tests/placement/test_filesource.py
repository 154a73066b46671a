"""`whywait placement publish`: JSON/YAML placements, owners applied, errors with file:line."""

from __future__ import annotations

import pytest
from whywait.engine.placement.filesource import placements_from_text
from whywait.engine.placement.model import PlacementError
from whywait.engine.placement.ownership import OwnershipFile

from tests.placement.conftest import FIX

OWN = OwnershipFile(FIX / "ownership.yaml")


def test_short_form_with_owner_from_the_account() -> None:
    text = "job: pretrain-1\naccount: llm-pretrain\nuser: alice\nnodes:\n  - {node: n1, gpus: [0, 1]}\n" \
           "  - {node: n2, gpus: [0, 1]}\n"
    [m] = placements_from_text(text, "p.yaml", OWN, "me", now=5.0)
    assert m["slack_channel"] == "#llm-pretrain" and m["source"] == "file" and m["time"] == 5.0
    assert [(r["rank"], r["node"], r["gpu"]) for r in m["ranks"]] == [(0, "n1", 0), (1, "n1", 1), (2, "n2", 0),
                                                                       (3, "n2", 1)]


def test_a_list_in_json_with_explicit_ranks_and_a_finished_job() -> None:
    text = ('[{"job": "a", "project": "p", "team": "t", "ranks": [{"rank": 0, "node": "n1", "gpu": 3, "tp": 0}]},'
            ' {"job": "b", "state": "finished"}]')
    a, b = placements_from_text(text, "-", OWN, "me", now=1.0)
    assert a["ranks"] == [{"rank": 0, "node": "n1", "gpu": 3, "tp": 0}] and a["team"] == "t"
    assert b["state"] == "finished" and b["team"] == "no owner known"


def test_every_bad_job_is_named_with_its_line() -> None:
    text = ("- job: ok\n  nodes: [{node: n1, gpus: [0]}]\n"
            "- job: bad\n  nodes: [{node: n1, gpus: [zero]}]\n"
            "- job: worse\n  state: paused\n")
    with pytest.raises(PlacementError) as exc:
        placements_from_text(text, "p.yaml", OWN, "me")
    assert str(exc.value).splitlines() == [
        "2 problems in p.yaml:",
        "  p.yaml:3: job 'bad': each of 'nodes' must be {node: NAME, gpus: [INDEX...]} or {node: NAME, gpus: COUNT} "
        "(got {'node': 'n1', 'gpus': ['zero']})",
        "  p.yaml:5: job 'worse': state must be 'running' or 'finished' (got 'paused')"]


def test_gpus_may_be_a_count_as_in_the_topology_file() -> None:
    """`gpus: 8` was refused although the cluster YAML takes counts."""
    text = "job: j\nproject: p\nteam: t\nnodes:\n  - {node: n1, gpus: 2}\n  - {node: n2, gpus: [1]}\n"
    [m] = placements_from_text(text, "p.yaml", OWN, "me", now=1.0)
    assert [(r["rank"], r["node"], r["gpu"]) for r in m["ranks"]] == [(0, "n1", 0), (1, "n1", 1), (2, "n2", 1)]
    for bad in ("0", "true", "-1"):
        with pytest.raises(PlacementError, match="gpus: COUNT"):
            placements_from_text(text.replace("gpus: 2", f"gpus: {bad}"), "p.yaml", OWN, "me")


def test_a_gpu_count_past_any_machine_is_refused_not_numbered() -> None:
    """`gpus: 100000000` in a placement file was numbered one by one until the process ran out of memory."""
    with pytest.raises(PlacementError, match="each of 'nodes' must be"):
        placements_from_text("job: j\nnodes:\n  - {node: n1, gpus: 100000000}\n", "p.yaml", OWN, "me")


@pytest.mark.parametrize(("field", "value", "says"), [
    ("account", "[1]", "account must be a string"), ("user", "{a: 1}", "user must be a string"),
    ("nodes", "7", "nodes must be a list"), ("ranks", "true", "ranks must be a list"),
])
def test_a_field_of_the_wrong_type_is_named(field: str, value: str, says: str) -> None:
    """A number or a list where a name belongs reached the ownership rules as a TypeError (an internal error)."""
    with pytest.raises(PlacementError, match=f"p.yaml:1: job 'j': {says}"):
        placements_from_text(f"job: j\n{field}: {value}\n", "p.yaml", OWN, "me")
