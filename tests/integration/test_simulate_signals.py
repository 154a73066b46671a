"""``whywait simulate`` stopped by a signal takes its forked generator with it (it used to be orphaned)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.support.kafka import wait_for

pytestmark = pytest.mark.integration
REPO = Path(__file__).resolve().parents[2]


def children(pid: int) -> list[int]:
    out: list[int] = []
    for task in Path(f"/proc/{pid}/task").iterdir():
        text = (task / "children").read_text().split()
        out += [int(c) for c in text]
    return out


def alive(pid: int) -> bool:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except FileNotFoundError:
        return False
    return stat.rsplit(")", 1)[1].split()[0] != "Z"


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGKILL], ids=["term", "kill"])
def test_stopping_simulate_stops_its_generator(kafka_bootstrap: str, sig: int) -> None:
    proc = subprocess.Popen([sys.executable, "-m", "whywait", "simulate", "--bootstrap", kafka_bootstrap,
                             "--nodes", "4", "--duration", "3600", "--speed", "1"],
                            cwd=REPO, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                            env={**os.environ, "PYTHONUNBUFFERED": "1"})
    try:
        assert wait_for(lambda: bool(children(proc.pid)), 60), proc.stderr
        time.sleep(2)  # publishing, paced: the generator waits on its queue
        [child] = children(proc.pid)
        os.kill(proc.pid, sig)
        proc.wait(30)
        assert wait_for(lambda: not alive(child), 10), f"generator {child} outlived its parent"
    finally:
        if proc.poll() is None:
            proc.kill()
