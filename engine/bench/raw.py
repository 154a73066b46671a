"""The floor every figure is compared with: aiokafka consume + ``json.loads`` + contract decode, nothing else.

Run by the harness as its own process, like the engine and replay, so that its CPU-seconds come
from the kernel the same way: ``python -m whywait.engine.bench.raw BOOTSTRAP RANGES_JSON``, where
the JSON lists ``[topic, partition, first, end]`` offsets.  It prints one JSON line: messages,
the CPU-seconds and wall seconds of the reading loop (consumer started and assigned before the
clock starts, as the engine's clock starts at its partition assignment).
"""

from __future__ import annotations

import asyncio
import json
import sys
import time
from typing import Any


async def consume(bootstrap: str, ranges: list[list[Any]]) -> dict[str, float]:
    """Read every record of ``ranges`` and decode it against the contract; return the figures."""
    from aiokafka import AIOKafkaConsumer, TopicPartition
    from whywait.agents.events import ContractError, decode

    c = AIOKafkaConsumer(bootstrap_servers=bootstrap, enable_auto_commit=False, group_id=None)
    await c.start()
    try:
        want = {TopicPartition(t, p): (first, end) for t, p, first, end in ranges if end > first}
        c.assign(list(want))
        for tp, (first, _) in want.items():
            c.seek(tp, first)
        n = bad = 0
        cpu0, wall0 = time.process_time(), time.perf_counter()
        open_ = set(want)
        while open_:
            for tp, recs in (await c.getmany(*open_, timeout_ms=1000, max_records=5000)).items():
                end = want[tp][1]
                for r in recs:
                    if r.offset >= end:
                        break
                    try:
                        decode(r.value, tp.topic)
                        n += 1
                    except ContractError:
                        bad += 1
                if recs and recs[-1].offset + 1 >= end:
                    open_.discard(tp)
        return {"messages": n, "contract_errors": bad, "cpu_s": time.process_time() - cpu0,
                "wall_s": time.perf_counter() - wall0}
    finally:
        await c.stop()


def main(argv: list[str]) -> int:
    bootstrap, ranges_path = argv
    with open(ranges_path) as fh:
        ranges = json.load(fh)
    print(json.dumps(asyncio.run(consume(bootstrap, ranges))), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
