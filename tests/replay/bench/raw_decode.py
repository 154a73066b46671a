"""Read and decode a bundle's events and nothing else: the floor a replay is compared with.

``python raw_decode.py BUNDLE`` prints messages per second.
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

from whywait.agents.events import decode
from whywait.engine.importers.bundle import Bundle


def main(path: Path) -> int:
    bundle = Bundle(path)
    t0 = time.perf_counter()
    n = 0
    for topic, raw in bundle.events():
        decode(raw, topic)
        n += 1
    dt = time.perf_counter() - t0
    print(f"raw read + decode: {n} messages in {dt:.2f} s = {n / dt:,.0f} msg/s")
    return 0


if __name__ == "__main__":
    sys.exit(main(Path(sys.argv[1])))
