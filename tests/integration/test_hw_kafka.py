"""The hw path end to end through the real Kafka broker: agent → Kafka → contract → evaluator → diagnosis.

A node whose GPU 1 makes NVML hang (the fake NVML blocks that GPU's calls, shaped after a real H100
capture) runs the real agent with the GPU and hw collectors; the hw collector also reads node_exporter's
real sysfs tree (PCIe links, ports) and a kernel log.  The messages are read back from the broker,
validated, and fed with the job's placement to the production evaluator and the shipped rules, which
must blame that GPU.
"""

from __future__ import annotations

import asyncio
import os
import threading
import uuid
from pathlib import Path
from typing import Any

import pytest
from whywait.agents.agent import Agent
from whywait.agents.collectors.gpu import NvmlCollector
from whywait.agents.collectors.hardware import HardwareCollector
from whywait.agents.collectors.kmsg import KmsgSource
from whywait.agents.collectors.pcie import PcieSource
from whywait.agents.collectors.ports import PortSource
from whywait.agents.events import TOPIC_GPU, TOPIC_HW, envelope
from whywait.agents.publisher import KafkaPublisher
from whywait.engine.evaluate.evaluator import Evaluator
from whywait.engine.rules.loader import load_rules
from whywait.topology.model import Topology

from tests.agents.conftest import fixture_path
from tests.agents.conftest import node_exporter_root as _node_exporter_root
from tests.agents.fake_nvml import FakeNvml, load_capture
from tests.integration.test_agent_kafka import consume

pytestmark = pytest.mark.integration

H100 = "linux-x86_64__nvidia-h100-80gb-hbm3__590.48.01.txt"
RULES = Path(__file__).resolve().parents[2] / "rules"


# node_exporter's sysfs capture, unpacked (the agent tests' fixture, shared here).
node_exporter_root = _node_exporter_root


async def test_a_gpu_that_hangs_nvml_is_diagnosed_through_kafka(kafka_bootstrap: str, tmp_path: Any,
                                                                node_exporter_root: str) -> None:
    from whywait.engine.stream.topics import ensure_topics_async

    await ensure_topics_async(kafka_bootstrap)  # as the engine does at start: the broker creates no topics
    node = f"it-hw-{uuid.uuid4().hex[:8]}"
    cap = load_capture(fixture_path("nvidia-smi", H100))
    fake = FakeNvml([cap, cap])
    fake.row = 1
    gate = threading.Event()
    gpu = NvmlCollector(nvml=fake, call_timeout_s=0.2)
    kmsg_root = tmp_path / "kmsg-root"
    (kmsg_root / "dev").mkdir(parents=True)
    (kmsg_root / "dev" / "kmsg").write_text(open(fixture_path("kmsg", "kmsg.1.log")).read() + "\n")
    hw = HardwareCollector(node_exporter_root, gpu=gpu, sources=[
        PcieSource(node_exporter_root), PortSource(node_exporter_root),
        KmsgSource(str(kmsg_root), str(tmp_path / "kmsg.state"))])
    pub = KafkaPublisher(kafka_bootstrap, os.path.join(str(tmp_path), "spool"))
    agent = Agent(node, [gpu, hw], pub, interval=0.5)

    async def hang_gpu_1() -> None:
        await asyncio.sleep(0.8)
        fake.hang[1] = gate  # from now on every NVML call on GPU 1 blocks

    try:
        await asyncio.gather(agent.run(rounds=5), hang_gpu_1())
    finally:
        gate.set()
    assert pub.invalid == 0 and pub.spooled == 0
    got = await consume(kafka_bootstrap, [TOPIC_GPU, TOPIC_HW], node, {TOPIC_GPU: 5, TOPIC_HW: 5})
    hw_msgs = got[TOPIC_HW]
    assert hw_msgs[0]["pcie"] and hw_msgs[0]["ports"] and hw_msgs[0]["kernel"] == []
    assert any(not h["responsive"] for m in hw_msgs for h in m["nvml"] if h["gpu"] == 1)
    assert all(h["responsive"] for m in hw_msgs for h in m["nvml"] if h["gpu"] == 0)
    assert [g["gpu"] for g in got[TOPIC_GPU][-1]["gpus"]] == [0]  # the hung GPU is left out, GPU 0 goes on

    topo = Topology.from_dict({"format": 1, "name": "it", "nodes": [{"id": node, "gpus": 2}]})
    ev = Evaluator(load_rules([RULES]), topo)
    t0 = min(m["time"] for m in hw_msgs) - 1
    diags = ev.ingest(envelope("placement", "sched", t0, job="it-job", project="p", team="t", state="running",
                               ranks=[{"rank": 0, "node": node, "gpu": 0}, {"rank": 1, "node": node, "gpu": 1}]))
    for m in sorted(got[TOPIC_GPU] + hw_msgs, key=lambda m: m["time"]):
        diags += ev.ingest(m)
    diags += ev.advance(ev.store.max_time + 5)
    fired = [d for d in diags if d.status == "firing" and d.rule_id == "hardware.nvml-unresponsive"]
    assert fired and fired[0].labels.get("gpu") == f"{node}/gpu1" and fired[0].ranks == (1,)
