"""Two agents publishing as one node (a cloned machine) are found from their health messages' ``instance``."""

from __future__ import annotations

from pathlib import Path

from whywait.agents.agent import agent_instance
from whywait.agents.events import envelope, validate
from whywait.engine.evaluate.evaluator import Evaluator
from whywait.engine.evaluate.identity import NodeIdentities
from whywait.engine.rules.loader import RuleSet
from whywait.simulate.cluster import make_cluster

T0 = 1_764_442_800.0


def test_clones_taking_turns_are_a_duplicate() -> None:
    ids = NodeIdentities()
    for s in range(4):
        ids.note("node-03", "boot-a/100", T0 + s)
        ids.note("node-03", "boot-b/200", T0 + s + 0.5)
    assert ids.duplicated("node-03") == ["boot-b/200", "boot-a/100"]  # the latest heard first


def test_a_restart_and_a_restart_loop_are_not() -> None:
    ids = NodeIdentities()
    for s in range(30):
        ids.note("node-03", "boot-a/100", T0 + s)
    for s in range(30, 60):  # the agent restarted: a new pid, never back to the old one
        ids.note("node-03", "boot-a/101", T0 + s)
    for s in range(60, 80):  # then crashed every few seconds
        ids.note("node-03", f"boot-a/{200 + s // 3}", T0 + s)
    assert ids.duplicated("node-03") is None


def test_one_late_message_of_a_stopped_agent_is_not() -> None:
    """The old agent's last message, delivered after the new one's first: one return, not two."""
    ids = NodeIdentities()
    ids.note("node-03", "old/1", T0)
    ids.note("node-03", "new/2", T0 + 1)
    ids.note("node-03", "old/1", T0 + 0.9)
    ids.note("node-03", "new/2", T0 + 2)
    assert ids.duplicated("node-03") is None


def test_a_duplicate_ends_when_the_turns_stop() -> None:
    ids = NodeIdentities(quiet_s=120.0)
    for s in range(4):
        ids.note("node-03", "a/1", T0 + s)
        ids.note("node-03", "b/2", T0 + s + 0.5)
    assert not ids.quiet("node-03")
    for s in range(4, 200):  # the clone was switched off
        ids.note("node-03", "b/2", T0 + s)
    assert ids.quiet("node-03") and ids.duplicated("node-03") is None


def test_tables_stay_bounded() -> None:
    ids = NodeIdentities(max_nodes=50, max_instances=4)
    for i in range(1000):
        ids.note(f"fake-{i}", "x/1", T0 + i)
        ids.note("node-01", f"boot/{i}", T0 + i)
    assert len(ids.nodes) <= 50 and len(ids.nodes["node-01"].instances) <= 4


def health(node: str, instance: str, t: float) -> dict:
    return dict(validate(envelope("agent_health", node, t, samples=1, sent=1, spooled=0, dropped=0,
                                  collector_errors=0, instance=instance)))


def test_the_evaluator_announces_a_topology_node_once_and_resolves_it() -> None:
    ev = Evaluator(RuleSet({}, ()), make_cluster(nodes=4, gpus_per_node=8))
    out = []
    for s in range(10):
        for node, inst in (("node-02", "a/1"), ("node-02", "b/2"), ("invented", "a/1"), ("invented", "b/2"),
                           ("node-01", "c/3")):
            ev.ingest(health(node, inst, T0 + s))
        out += ev.duplicate_diagnoses()
    assert [(d.rule_id, d.status, d.culprit) for d in out] == [("whywait.duplicate-node", "firing", "node-02")]
    d = out[0]
    assert d.title == "2 agents publish as node-02: its telemetry mixes 2 machines"
    assert "`a/1`, `b/2`" in d.cause and d.job is None and d.starts_at == T0 + 1
    for s in range(10, 200):
        ev.ingest(health("node-02", "b/2", T0 + s))
        out += ev.duplicate_diagnoses()
    assert [(d.status, d.ends_at) for d in out[1:]] == [("resolved", T0 + 130)]


def test_agent_instance_is_the_boot_id_and_pid(tmp_path: Path) -> None:
    f = tmp_path / "boot_id"
    f.write_text("6f1c0c9e-1f7b-4a52-9c1e-0d3a4b5c6d7e\n")
    boot, pid = agent_instance(str(f)).split("/")
    assert boot == "6f1c0c9e-1f7b-4a52-9c1e-0d3a4b5c6d7e" and int(pid) > 0
    other = agent_instance(str(tmp_path / "missing"))  # not Linux: a random id, still this process's pid
    assert len(other.split("/")[0]) == 16 and other.split("/")[1] == pid
    f.write_text("bad\x00id")
    assert agent_instance(str(f)).split("/")[0] != "bad\x00id"


def test_an_instance_cannot_break_out_of_its_code_span() -> None:
    ev = Evaluator(RuleSet({}, ()), make_cluster(nodes=2, gpus_per_node=8))
    out = []
    for s in range(6):
        ev.ingest(health("node-01", "a`*@here*`/1", T0 + s))
        ev.ingest(health("node-01", "b/2", T0 + s + 0.5))
        out += ev.duplicate_diagnoses()
    [d] = out
    assert "`a'*@here*'/1`" in d.cause and d.cause.count("`") == 4
