"""Scale-out on Kafka partitions: which worker evaluates what (pure; no Kafka, no faust).

With one input partition per topic a second ``whywait engine`` is an idle standby.  With more,
the consumer group splits the input partitions between workers, but the inputs are keyed by
*node* (telemetry) and by *job* (steps, checkpoints), and a job's peer comparison needs every
rank of the job on one worker.  So the partitioned engine runs two stages in one consumer group:

1. **route** (input topics, any worker): decode and validate each message (bad ones go to the
   dead-letter topic here, once), then forward its bytes to the internal topic
   :data:`~whywait.engine.stream.topics.TOPIC_BY_JOB` on the partition(s) that need it
   (:func:`routes`):

   - node telemetry to the partition of each job with a rank on that node (a node shared by
     jobs of fractional GPUs goes to each of their partitions);
   - telemetry of a node in no job to the partition of the node's own name, so it is still
     stored and judged by the same worker every time;
   - steps and checkpoints to their job's partition;
   - for *contention*: ``net`` and ``storage`` telemetry of a node that runs a job also goes to
     the partitions of the jobs of *other projects* that share its leaf switch or one of its
     storage pools.  The contention rules (``rules/contention/*``) read exactly that: the other
     job's per-node send or read rate on the shared place.  The copy goes once per partition,
     not once per job, so one message costs at most ``partitions`` copies, whatever the number
     of jobs on a shared pool.

   Placements are not forwarded: every worker reads the compacted placement topic whole, as a
   global table (``engine/stream/tables.py``), outside the consumer group, and so does the
   router: the routing above always uses every job's placement.

2. **evaluate** (the internal topic): a worker evaluates the jobs whose partition it owns
   (:class:`OwnedTopology` hides the others from the evaluator's tick), against all the data of
   the job's ranks, plus the neighbours' data its contention rules read.

Why copies rather than per-place summaries: the contention conditions compare the other job's
raw per-node metric (the busiest node on the shared switch or pool), so shipping those messages
to where the job is judged keeps one rule language and one evaluator for one worker and for N.
The cost is bounded (above) and paid only by ``net`` and ``storage`` messages of nodes whose
place is shared with another project's job.

The partition of a key is :func:`partition_for` (CRC-32, stable across processes and versions);
the router sends with an explicit partition, so Kafka's own partitioner never decides.
"""

from __future__ import annotations

import zlib
from typing import Any, Callable, Iterable, Mapping

JOB_KINDS = frozenset({"steps", "checkpoint"})
# Telemetry the contention rules read on *another* job's nodes (see the module docstring).
CONTENTION_KINDS = {"net": "switch", "storage": "pool"}


def partition_for(key: str, partitions: int) -> int:
    """The partition of the internal topic that ``key`` (a job, or a node in no job) belongs to."""
    return zlib.crc32(key.encode()) % partitions if partitions > 1 else 0


def routes(msg: Mapping[str, Any], topology: Any, partitions: int) -> dict[int, str]:
    """Where the router forwards one validated message: partition -> record key.

    Empty for a placement (read by every worker as a global table).  The key names the job (or
    the jobless node) the partition was chosen for; it is informational, the partition decides.
    """
    kind = msg["kind"]
    out: dict[int, str] = {}
    if kind == "placement":
        return out
    if kind in JOB_KINDS:
        job = str(msg["job"])
        out[partition_for(job, partitions)] = job
        return out
    node = str(msg["node"])
    try:
        jobs = topology.jobs_on_node(node)
    except Exception:  # noqa: BLE001 - a node outside the topology: the evaluator dead-letters it
        jobs = ()
    if not jobs:
        out[partition_for(node, partitions)] = node
        return out
    for j in jobs:
        out.setdefault(partition_for(j.job, partitions), j.job)
    where = CONTENTION_KINDS.get(kind)
    if where is not None and len(out) < partitions:
        projects = {j.project for j in jobs}
        for other in _sharing(topology, node, where):
            if other.project not in projects:
                out.setdefault(partition_for(other.job, partitions), other.job)
    return out


def _sharing(topology: Any, node: str, where: str) -> Iterable[Any]:
    if where == "switch":
        leaf = topology.leaf_of(node)
        return topology.jobs_on_switch(leaf) if leaf else ()
    found: dict[str, Any] = {}
    for pool in topology.pools_of(node):
        for j in topology.jobs_on_pool(pool):
            found.setdefault(j.job, j)
    return found.values()


class OwnedTopology:
    """The topology as one worker's evaluator sees it: every job placed, only its own evaluated.

    ``jobs()`` (what the evaluator's tick iterates) lists the jobs whose partition ``owns``;
    everything else (placements, paths, other jobs sharing a switch for contention) is the
    whole topology, so a rule reads the same facts on any worker.  ``owns`` is None until the
    worker knows its assignment: then it evaluates nothing.
    """

    def __init__(self, topology: Any, partitions: int) -> None:
        self.base = topology
        self.partitions = partitions
        self.owned: frozenset[int] = frozenset()

    def owns(self, job: str) -> bool:
        """Whether this worker evaluates ``job`` (its partition is assigned here)."""
        return partition_for(job, self.partitions) in self.owned

    def jobs(self) -> tuple[Any, ...]:
        """The placed jobs this worker evaluates, sorted by id."""
        return tuple(j for j in self.base.jobs() if self.owns(j.job))

    def __getattr__(self, name: str) -> Any:  # everything else is the whole topology
        return getattr(self.base, name)


# ---- the incident checkpoint, per job -----------------------------------------------------------

def job_of_entity(entity: Any, job_nodes: dict[str, str]) -> str | None:
    """The job a condition-state entity belongs to: ``job:rank`` names it; a node or GPU by its node."""
    if not isinstance(entity, str):
        return None
    if ":" in entity:
        return entity.rsplit(":", 1)[0]
    return job_nodes.get(entity.split("/", 1)[0])


def split_snapshot(snap: dict[str, Any], topology: Any, jobs: Iterable[str]) -> dict[str, dict[str, Any]]:
    """Cut the evaluator's snapshot into one per job (for the jobs in ``jobs``).

    Each holds the job's incidents (by their ``job`` label), the frozen baselines of its ranks and
    nodes, and the cost floors of its incidents; a job with nothing to keep maps to an empty
    snapshot.  Called by the partitioned engine's checkpoint, which writes each under its own key so
    the worker that gains the job's partition continues its incidents.
    """
    wanted = set(jobs)
    out: dict[str, dict[str, Any]] = {j: {"incidents": [], "cond_state": [], "counted_until": {}} for j in wanted}
    job_nodes: dict[str, str] = {}
    for j in topology.jobs():
        if j.job in wanted:
            for n in j.nodes:
                job_nodes.setdefault(n, j.job)
    fp_job: dict[str, str] = {}
    for inc in snap.get("incidents", ()):
        job = (inc.get("labels") or {}).get("job")
        if job in wanted:
            out[job]["incidents"].append(inc)
            fp_job[inc["fingerprint"]] = job
    for key, value in snap.get("cond_state", ()):
        job = None
        if len(key) >= 4 and key[2] in wanted:  # step conditions: (rule, line, job, rank)
            job = key[2]
        elif len(key) >= 3:
            job = job_of_entity(key[2], job_nodes)
        if job in wanted:
            out[job]["cond_state"].append([key, value])
    for fp, t in (snap.get("counted_until") or {}).items():
        if fp in fp_job:
            out[fp_job[fp]]["counted_until"][fp] = t
    return out


def is_empty(part: dict[str, Any]) -> bool:
    """Whether a per-job snapshot holds nothing worth keeping (its checkpoint is a tombstone)."""
    return not part.get("incidents") and not part.get("cond_state")


def drop_jobs(evaluator: Any, keep: Callable[[str], bool]) -> int:
    """Forget the incidents of the jobs ``keep`` refuses, without resolving them; return how many.

    Called when a worker loses partitions: their jobs' incidents continue on the new owner (from
    the per-job checkpoint), so here they must neither resolve nor linger.
    """
    gone = [fp for fp, inc in evaluator.incidents.items()
            if inc.labels.get("job") is not None and not keep(inc.labels["job"])]
    for fp in gone:
        del evaluator.incidents[fp]
    return len(gone)


# ---- event-time order on the repartition topic ----------------------------------------------------

class ReorderBuffer:
    """Holds repartitioned records and releases them in event-time order, as far as every input allows.

    Why: the router forwards in the order it reads the input partitions, and on a backlog (a
    replay, a restart, a failover) it reads them in slices of different spans of event time: a
    job's steps can land tens of seconds of event time after its telemetry.  The evaluator's
    watermark waits for the periodic telemetry only (a hung job sends no steps), so the stream
    layer restores the order first: a record is released once every *active* input kind of every
    partition has reached its event time.  A kind is active while it keeps arriving (within ``idle_wall_s``) or
    while the repartition topic has unread records (``backlog``); with no backlog, nothing is held
    longer than ``max_hold_s`` of wall time, so live latency stays a few seconds at most.  On a
    backlog, a kind more than ``idle_event_s`` of event time behind the newest (a hung job's steps)
    is not waited for.  Whatever else, nothing is released past the event time an input partition
    with unrouted records has been routed to, by whichever worker routes it (:meth:`progress`); nor,
    for a record that arrived after a router last said it had nothing left to route, more than
    ``quiet_event_s`` of event time past where that router had got then (its frontier): "nothing left"
    is only as new as the router's last word, and a busy router (its loop evaluating a backlog) says
    nothing while new records pile up in its partitions.  Live, every router routes telemetry every
    second and speaks after each batch, so this bound moves with the data; an idle router's frontier is
    the end of the data.  (Routers do not speak on a timer: a word every half second on an idle
    repartition topic kept the group's lag above 0 for ever, and whoever waits for the group to catch up,
    the bench or an operator, waited in vain.)
    Pure: the caller passes each record's event time and kind, and the wall clock.
    """

    def __init__(self, kinds: Iterable[str], idle_wall_s: float = 3.0, max_hold_s: float = 2.0,
                 idle_event_s: float = 120.0, max_records: int = 500_000, stale_s: float = 30.0,
                 quiet_event_s: float = 10.0) -> None:
        import heapq

        self._heapq = heapq
        self.kinds = frozenset(kinds)  # the steady inputs whose progress is waited for
        self.idle_wall_s = idle_wall_s
        self.max_hold_s = max_hold_s
        self.idle_event_s = idle_event_s
        self.max_records = max_records
        self.heap: list[tuple[float, int, float, Any]] = []  # (event time, seq, arrival wall, record)
        self.kind_max: dict[tuple[int, str], float] = {}  # (partition, kind) -> newest event time
        self.kind_seen: dict[tuple[int, str], float] = {}  # (partition, kind) -> wall time it last arrived
        self.seq = 0
        # What each router said of the input partitions it reads (see :meth:`progress`): source ->
        # (event time routed up to, records not routed yet, wall time said).  ``stale_s`` forgets a
        # router that stopped saying (it died; the group gives its partitions to another, which says anew).
        self.sources: dict[str, tuple[float, int, float]] = {}
        self.stale_s = stale_s
        # How far past a router's last "nothing left" a record that arrived after it may go: well under the 30 s
        # of silence that makes job.node-unseen, so a busy router's nodes never look silent for that.
        self.quiet_event_s = quiet_event_s

    def push(self, record: Any, t: float, kind: str | None, wall: float, partition: int = 0) -> None:
        """Hold ``record`` (event time ``t``, from ``partition`` of the repartition topic)."""
        self.seq += 1
        self._heapq.heappush(self.heap, (t, self.seq, wall, record))
        if kind in self.kinds:
            # Per partition: partitions progress at their own pace (a sparse one runs ahead in event
            # time), and one partition's progress says nothing of another's.
            key = (partition, kind)
            if t > self.kind_max.get(key, float("-inf")):
                self.kind_max[key] = t
            self.kind_seen[key] = wall

    def progress(self, source: str, routed_to: float, unrouted: int, wall: float) -> None:
        """A router's word on one input partition (``source``): it has forwarded everything it read from
        it up to event time ``routed_to``, and ``unrouted`` records wait there still.

        Why: every worker's router feeds every partition of the repartition topic, each through its
        own backlog at its own pace.  This worker cannot see the others' backlog; without their word,
        a job's steps routed late by another worker arrived after the job's telemetry had been
        released (and ``job.rank-silent`` fired on ranks that were not silent).
        """
        self.sources[source] = (routed_to, unrouted, wall)

    def behind(self, wall: float, arrived: float | None = None) -> float:
        """Event time up to which a record may be released as far as the routers' words go: the least
        event time routed so far of every input partition with unrouted records, and, for a record that
        arrived (wall time ``arrived``) after a router's last word that its partition had none,
        ``quiet_event_s`` past where that router had got (inf when nothing bounds it; a router silent for
        ``stale_s`` is not heard).

        Why the second: at ``--speed 0`` a router that said "0 unrouted" and then spent seconds evaluating
        had tens of seconds of event time waiting in its partitions; the other worker released its own
        routed records past them after ``max_hold_s``, and a node whose telemetry was still unrouted fired
        ``job.node-unseen``.
        """
        out = float("inf")
        for t, lag, seen in self.sources.values():
            if wall - seen > self.stale_s:
                continue
            if lag > 0:
                out = min(out, t)
            elif arrived is not None and seen < arrived and t > float("-inf"):  # (-inf: it has routed nothing)
                out = min(out, t + self.quiet_event_s)
        return out

    def _bounds(self, wall: float) -> tuple[float, list[tuple[float, float]]]:
        """(the bound of the routers with records left, [(wall said, routed to)] of the caught-up ones,
        oldest word first): :meth:`behind` for every held record without a pass over every router each."""
        lagging = float("inf")
        quiet: list[tuple[float, float]] = []
        for t, lag, seen in self.sources.values():
            if wall - seen > self.stale_s:
                continue
            if lag > 0:
                lagging = min(lagging, t)
            elif t > float("-inf"):
                quiet.append((seen, t + self.quiet_event_s))
        quiet.sort()
        return lagging, quiet

    def watermark(self, wall: float, backlog: bool) -> float:
        """Event time up to which every active kind of every partition has arrived."""
        top: dict[int, float] = {}
        for (p, _), t in self.kind_max.items():
            top[p] = max(top.get(p, t), t)
        active = [t for k, t in self.kind_max.items() if wall - self.kind_seen[k] <= self.idle_wall_s
                  or (backlog and top[k[0]] - t <= self.idle_event_s)]
        return min(active) if active else float("inf")

    def release(self, wall: float, backlog: bool) -> list[Any]:
        """The held records that may go to the evaluator now, oldest event time first."""
        lagging, quiet = self._bounds(wall)
        w = self.watermark(wall, backlog)
        out = []
        heap = self.heap
        while heap:
            t, _, arrived, _ = heap[0]
            if len(heap) <= self.max_records:
                b = lagging
                for seen, routed in quiet:  # the words said before this record arrived
                    if seen >= arrived:
                        break
                    b = min(b, routed)
                if t > b or not (t <= w or (not backlog and wall - arrived >= self.max_hold_s)):
                    break
            out.append(self._heapq.heappop(heap)[3])
        return out

    def __len__(self) -> int:
        return len(self.heap)


class HeldOffsets:
    """How far the evaluate stage may commit each partition of the repartition topic: up to the oldest record
    still held in its :class:`ReorderBuffer`, never past it.

    Why: the stage used to commit each batch once it was in the buffer, evaluated or not.  Held back behind
    another worker's router (:meth:`ReorderBuffer.behind`), most of a backlog could sit there committed: a
    worker that died with it lost it (its successor resumes after the commit and only re-reads it into the
    store), and the bench, which waits for these commits, stopped a 2-worker run with 5,665 of 44,288
    messages evaluated.  Pure: the caller says what it received (in offset order, per partition) and which
    records left the buffer and were evaluated.
    """

    def __init__(self) -> None:
        from collections import deque

        self._deque = deque
        self._held: dict[int, Any] = {}  # partition -> offsets held, in the order received (deque)
        self._out: dict[int, set[int]] = {}  # partition -> offsets released while an older one is held
        self._next: dict[int, int] = {}  # partition -> the offset after the last one received

    def received(self, partition: int, offset: int, held: bool) -> None:
        """Record ``offset`` of ``partition`` as received; ``held``: it went into the buffer (else it is done:
        a progress marker, a copy taken already)."""
        self._next[partition] = offset + 1
        if held:
            q = self._held.get(partition)
            if q is None:
                q = self._held[partition] = self._deque()
            q.append(offset)

    def released(self, records: Iterable[Any]) -> set[int]:
        """Records (``partition``, ``offset``) that left the buffer and were evaluated; the partitions touched."""
        touched: set[int] = set()
        out = self._out
        for r in records:
            touched.add(r.partition)
            out.setdefault(r.partition, set()).add(r.offset)
        for p in touched:
            q, done = self._held.get(p), out[p]
            while q and q[0] in done:
                done.discard(q.popleft())
            if not q:
                done.clear()
        return touched

    def commit_point(self, partition: int) -> int | None:
        """The offset the group may commit for ``partition`` (the next one to read); None before any record."""
        q = self._held.get(partition)
        return q[0] if q else self._next.get(partition)

    def held(self) -> int:
        """Records held, all partitions together."""
        return sum(len(q) for q in self._held.values())
