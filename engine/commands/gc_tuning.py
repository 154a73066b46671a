"""The garbage collector's setting for a long batch of work: a replay, the report's pass, a live engine.

Used by ``whywait replay`` (around the replay and the report) and ``whywait engine`` (around the
faust worker).  Both allocate and keep many objects (decoded messages in flight, the evaluator's
15 minutes of state) and free little cyclic garbage, so at Python's default the collector mostly
re-traversed what was alive.
"""

from __future__ import annotations

import gc
from contextlib import contextmanager
from typing import Iterator

# The cyclic garbage collector's first threshold (Python's default is 700 allocations).  At 700 the collector
# ran about 1,100 times over the bench's 44,289 messages (1,024 GPUs, 60 s) and took 0.9 of a replay's 4.3
# CPU-s, mostly in full collections over everything alive; at 50,000, 0.2.
GC_YOUNG = 50_000


@contextmanager
def batch_gc() -> Iterator[None]:
    """Tune the garbage collector for one long batch of work; restore it after.

    Entered once the rules and topology are loaded.  What exists by then lives as long as the
    process, so it is frozen (never traversed again), and the youngest generation is collected
    every :data:`GC_YOUNG` allocations instead of 700.  Memory stays bounded: the older generations
    are still collected at Python's usual ratios, so cyclic garbage is freed as before, only in
    larger batches.
    """
    old = gc.get_threshold()
    gc.collect()
    gc.freeze()
    gc.set_threshold(GC_YOUNG, old[1], old[2])
    try:
        yield
    finally:
        gc.set_threshold(*old)
        gc.unfreeze()
