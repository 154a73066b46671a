"""Which agent processes publish as each node: two taking turns under one name are two machines.

Called by the evaluator for every ``agent_health`` message that carries the agent's ``instance``
(:meth:`NodeIdentities.note`); the live engine asks :meth:`Evaluator.duplicate_diagnoses` after each batch.
Pure: event time only, no wall clock.

Why: machines cloned from one image keep its host name, and the agent publishes as the host name by
default.  Two hosts then send as ``node-03``: every metric of node-03 alternates between two machines,
its GPUs' temperatures and its NIC's counters are a mix, and whatever whywait says of node-03 is unreliable.
Nothing in the telemetry itself says so.  Each agent names its process in its health message (``<boot
id>/<pid>``, see ``agents.agent.agent_instance``).  A restart gives a new instance and never goes back to
the old one; a *return* to an instance seen before is another agent still sending.  Two instances that
each returned twice within ``window_s`` make a duplicate: one delayed message of a stopping agent
makes one return of each (old, new, old, new), never two.
"""

from __future__ import annotations

from collections import Counter, deque
from dataclasses import dataclass, field


@dataclass
class Seen:
    """What one node's health messages said of the processes sending them."""

    last: str  # the instance of the latest message
    instances: dict[str, float] = field(default_factory=dict)  # instance -> event time last seen (bounded)
    returns: deque[tuple[float, str]] = field(default_factory=deque)  # (event time, instance) of each return


class NodeIdentities:
    """Per node, the agent instances it was sent by, and whether two of them take turns now."""

    def __init__(self, window_s: float = 60.0, min_returns: int = 2, quiet_s: float = 120.0,
                 max_nodes: int = 10_000, max_instances: int = 8) -> None:
        self.window_s = window_s
        self.min_returns = min_returns
        self.quiet_s = quiet_s
        self.max_nodes = max_nodes
        self.max_instances = max_instances
        self.nodes: dict[str, Seen] = {}
        self.now = float("-inf")  # the newest event time of any health message: the clock of this module

    def note(self, node: str, instance: str, t: float) -> None:
        """Record that ``instance`` sent a health message as ``node`` at event time ``t``."""
        if t > self.now:
            self.now = t
        seen = self.nodes.get(node)
        if seen is None:
            if len(self.nodes) >= self.max_nodes:  # bounded: a flood of invented node names cannot grow it
                self.nodes.pop(next(iter(self.nodes)))
            self.nodes[node] = Seen(instance, {instance: t})
            return
        if instance != seen.last:
            if instance in seen.instances:
                seen.returns.append((t, instance))
            seen.last = instance
        seen.instances[instance] = t
        if len(seen.instances) > self.max_instances:  # a restart loop: keep the latest
            del seen.instances[min(seen.instances, key=seen.instances.__getitem__)]
        while seen.returns and seen.returns[0][0] < self.now - max(self.window_s, self.quiet_s):
            seen.returns.popleft()

    def duplicated(self, node: str) -> list[str] | None:
        """The instances taking turns as ``node`` now (latest heard first), or None when it is one process."""
        seen = self.nodes.get(node)
        if seen is None:
            return None
        since = self.now - self.window_s
        counts = Counter(i for t, i in seen.returns if t >= since)
        turns = [i for i, n in counts.items() if n >= self.min_returns]
        if len(turns) < 2:
            return None
        return sorted(turns, key=lambda i: (-seen.instances.get(i, since), i))

    def quiet(self, node: str) -> bool:
        """Whether ``node`` had no return to an earlier instance for ``quiet_s`` (a duplicate is over)."""
        seen = self.nodes.get(node)
        return seen is None or not seen.returns or seen.returns[-1][0] < self.now - self.quiet_s
