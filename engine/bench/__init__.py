"""``whywait bench``: the engine and replay measured against a raw consume+decode of the same topic.

Layout: :mod:`.stats` (pure figures: medians, spreads, percentiles), :mod:`.procs` (a process's
CPU-seconds and peak RSS from the kernel), :mod:`.feed` (a simulated cluster written once through
the real broker, with the offsets and send times it got), :mod:`.raw` (the floor: aiokafka consume +
contract decode, run as its own process), :mod:`.harness` (the runs: alternating, repeated; the
sustained and the multi-worker modes) and :mod:`.table` (the terminal table and ``--json``).
Nothing here is imported by the engine.
"""
