"""The agent's deployment files (systemd unit, Kubernetes DaemonSet) name only flags the agent takes."""

from __future__ import annotations

import argparse
import configparser
import shlex
from pathlib import Path

import yaml
from whywait.agents.cli import register

DEPLOY = Path(__file__).resolve().parents[2] / "deploy"


def _parse(args: list[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser(exit_on_error=False)
    register(p)
    return p.parse_args(args)


def test_the_systemd_unit_runs_the_agent_with_flags_it_takes() -> None:
    unit = configparser.ConfigParser(strict=False, interpolation=None)
    unit.read(DEPLOY / "systemd" / "whywait-agent.service")
    exec_start = shlex.split(unit["Service"]["ExecStart"])
    assert exec_start[:2] == ["/usr/local/bin/whywait", "agent"]
    ns = _parse([a for a in exec_start[2:] if not a.startswith("$")])
    assert ns.state_dir == "/var/lib/whywait"
    assert unit["Service"]["StateDirectory"] == "whywait" and unit["Service"]["RuntimeDirectory"] == "whywait"
    env = (DEPLOY / "systemd" / "agent.env").read_text()
    assert "WHYWAIT_KAFKA_BOOTSTRAP=" in env and "WHYWAIT_METRICS_ADDR=" in env


def test_the_daemonset_runs_the_agent_with_flags_it_takes() -> None:
    ds = yaml.safe_load((DEPLOY / "kubernetes" / "whywait-agent-daemonset.yaml").read_text())
    spec = ds["spec"]["template"]["spec"]
    [c] = spec["containers"]
    assert c["args"][0] == "agent"
    ns = _parse(c["args"][1:])
    assert ns.root == "/host" and ns.node == "$(NODE_NAME)" and ns.metrics_addr == ":9465"
    mounts = {m["mountPath"] for m in c["volumeMounts"]}
    assert {"/host/proc", "/host/sys", "/host/dev/kmsg", "/run/whywait", ns.state_dir} <= mounts
    assert spec["hostNetwork"] and spec["hostPID"]
    probes = {c["readinessProbe"]["httpGet"]["path"], c["livenessProbe"]["httpGet"]["path"]}
    assert probes == {"/readyz", "/healthz"}
