"""GPU pods from the Kubernetes watch API, grouped into jobs and turned into placements.

:class:`PodTracker` is pure: it is fed pods (as the API's JSON, camelCase keys) and
returns the placement messages to publish.  :func:`watch_pods` is the thin edge that
lists and watches pods with the official ``kubernetes`` client and feeds the tracker.

* A pod counts when a container requests ``nvidia.com/gpu`` and it is bound to a node
  (``spec.nodeName``) and not finished (``status.phase`` not Succeeded/Failed).
* Its job is the first of :data:`JOB_LABELS` it carries (Kubeflow, JobSet,
  LeaderWorkerSet, batch/v1 Job), else its controller, else the pod itself; the job id
  is ``<namespace>/<name>``.
* Its GPU indexes come from the ``whywait.io/gpus`` annotation, else a container's
  ``NVIDIA_VISIBLE_DEVICES``/``CUDA_VISIBLE_DEVICES`` when they list indexes, else
  ``0..n-1`` (said once per pod in the log: the device plugin does not publish them).
* Ranks: pods ordered by role (a Kubeflow ``master``/``launcher`` or LeaderWorkerSet
  leader first), then replica/completion index, then name; each pod's GPUs in index
  order.  A pod keeps its ranks while the job runs: when one pod ends or restarts, the
  others' ranks do not shift.
* A job is published again whenever its ranks change (a pod restarted on another
  node moves its ranks in the engine's live graph) and ``finished`` when its last GPU
  pod ends or is deleted.
"""

from __future__ import annotations

import logging
import re
from dataclasses import dataclass
from typing import Any, Callable, Iterable, Mapping

from whywait.engine.placement.model import JobFacts, PlacementError, placement_message
from whywait.engine.placement.ownership import OwnershipFile
from whywait.topology.model import MAX_GPUS_PER_NODE

log = logging.getLogger("whywait.placement.k8s")

GPU_RESOURCE = "nvidia.com/gpu"
GPU_ANNOTATION = "whywait.io/gpus"
JOB_LABELS = ("training.kubeflow.org/job-name", "jobset.sigs.k8s.io/jobset-name",
              "leaderworkerset.sigs.k8s.io/name", "batch.kubernetes.io/job-name", "job-name")
ROLE_KEYS = ("training.kubeflow.org/replica-type", "leaderworkerset.sigs.k8s.io/role")
FIRST_ROLES = ("master", "launcher", "leader")
RANK_KEYS = ("training.kubeflow.org/replica-index", "batch.kubernetes.io/job-completion-index",
             "leaderworkerset.sigs.k8s.io/worker-index", "jobset.sigs.k8s.io/job-index")
_DONE = ("Succeeded", "Failed")


def _count(v: Any) -> int:
    try:
        return int(str(v))
    except (TypeError, ValueError):
        return 0


def pod_gpu_count(pod: Mapping[str, Any]) -> int:
    """GPUs the pod's containers request (limits, else requests, of ``nvidia.com/gpu``)."""
    total = 0
    for c in (pod.get("spec") or {}).get("containers") or []:
        res = c.get("resources") or {}
        total += _count((res.get("limits") or {}).get(GPU_RESOURCE) or (res.get("requests") or {}).get(GPU_RESOURCE))
    return total


def _index_list(text: str) -> tuple[int, ...] | None:
    parts = [p.strip() for p in text.split(",") if p.strip()]
    if parts and all(p.isdigit() for p in parts):
        return tuple(int(p) for p in parts)
    return None


@dataclass(frozen=True)
class PodInfo:
    """What the tracker keeps of one GPU pod."""

    uid: str
    name: str
    job: str
    namespace: str
    node: str
    gpus: tuple[int, ...]
    order: tuple[int, int, str]
    labels: Mapping[str, str]
    user: str | None


class PodTracker:
    """Turns pod events into placement messages, one job at a time (pure: no client, no Kafka)."""

    def __init__(self, ownership: OwnershipFile, producer: str, clock: Callable[[], float]) -> None:
        self.ownership = ownership
        self.producer = producer
        self.clock = clock
        self.pods: dict[str, PodInfo] = {}
        self.published: dict[str, tuple[Any, ...]] = {}  # job -> what was last published for it
        # job -> pod slot (its order key) -> GPUs: every pod seen while the job runs, so ranks stay put.
        self.slots: dict[str, dict[tuple[int, int, str], int]] = {}
        self.warned: set[str] = set()
        self.skipped = 0

    def _safe_info(self, pod: Mapping[str, Any]) -> PodInfo | None:
        """:meth:`_info`, but a pod of a shape it cannot read is skipped (counted, said once), never the watcher's end.

        The API server's pods are typed, but annotations and labels are anyone's strings, and one pod must
        not stop the placements of every other job.
        """
        try:
            return self._info(pod)
        except (AttributeError, TypeError, ValueError, KeyError) as exc:
            self.skipped += 1
            meta = pod.get("metadata") if isinstance(pod, Mapping) else None
            name = meta.get("name") if isinstance(meta, Mapping) else None
            if str(name) not in self.warned:
                self.warned.add(str(name))
                log.error("pod %r: skipped, it cannot be read (%s: %s)", name, type(exc).__name__, exc)
            return None

    def _safe_job_message(self, job: str) -> dict[str, Any] | None:
        """:meth:`_job_message`, with a job whose placement breaks the contract skipped and said, not raised."""
        try:
            return self._job_message(job)
        except (PlacementError, AttributeError, TypeError, ValueError, KeyError) as exc:
            self.skipped += 1
            log.error("job %s: skipped (%s)", job, exc)
            return None

    def _info(self, pod: Mapping[str, Any]) -> PodInfo | None:
        meta, spec = pod.get("metadata") or {}, pod.get("spec") or {}
        n = pod_gpu_count(pod)
        node = spec.get("nodeName")
        phase = (pod.get("status") or {}).get("phase")
        if n <= 0 or not node or phase in _DONE or meta.get("deletionTimestamp"):
            return None
        if n > MAX_GPUS_PER_NODE:  # no machine has that many: a typo or a hostile spec, not GPUs to number one by one
            raise ValueError(f"it requests {n} GPUs (at most {MAX_GPUS_PER_NODE} are read)")
        labels = meta.get("labels") or {}
        annotations = meta.get("annotations") or {}
        ns = meta.get("namespace") or "default"
        group = next((labels[k] for k in JOB_LABELS if labels.get(k)), None)
        if group is None:
            owners = [o for o in meta.get("ownerReferences") or [] if o.get("controller")]
            group = owners[0]["name"] if owners else meta.get("name")
            if owners and owners[0].get("kind") == "ReplicaSet":  # a Deployment's pods: drop the hash
                group = re.sub(r"-[a-z0-9]{6,10}$", "", str(group))
        gpus = _index_list(str(annotations.get(GPU_ANNOTATION, "")))
        if gpus is None:
            for c in spec.get("containers") or []:
                for e in c.get("env") or []:
                    if e.get("name") in ("NVIDIA_VISIBLE_DEVICES", "CUDA_VISIBLE_DEVICES") and e.get("value"):
                        gpus = gpus or _index_list(str(e["value"]))
        uid = meta.get("uid") or f"{ns}/{meta.get('name')}"
        if gpus is None or len(gpus) != n:
            if uid not in self.warned:
                self.warned.add(uid)
                log.warning("pod %s/%s: its %d GPU index(es) are not published (annotation %s or "
                            "NVIDIA_VISIBLE_DEVICES); assuming 0..%d", ns, meta.get("name"), n, GPU_ANNOTATION, n - 1)
            gpus = tuple(range(n))
        rank = next((_count(v) for k in RANK_KEYS for v in (labels.get(k), annotations.get(k)) if v is not None),
                    1 << 30)
        role = next((labels[k].lower() for k in ROLE_KEYS if labels.get(k)), "")
        return PodInfo(uid, str(meta.get("name")), f"{ns}/{group}", ns, str(node), tuple(gpus),
                       (0 if role in FIRST_ROLES else 1, rank, str(meta.get("name"))), labels,
                       spec.get("serviceAccountName"))

    def _job_message(self, job: str) -> dict[str, Any] | None:
        pods = sorted((p for p in self.pods.values() if p.job == job), key=lambda p: p.order)
        if not pods:
            self.slots.pop(job, None)
            if job not in self.published:
                return None
            last = self.published.pop(job)
            facts = JobFacts(job, "k8s", (), last[1], last[2], finished=True)
            owner = self.ownership.resolve(namespace=last[2], labels=dict(last[3]), user=last[1])
            return placement_message(facts, owner, self.clock(), self.producer)
        first = pods[0]
        slots = self.slots.setdefault(job, {})
        for p in pods:
            slots[p.order] = max(slots.get(p.order, 0), len(p.gpus))
        ranks = []
        for p in pods:
            base = sum(n for key, n in slots.items() if key < p.order)
            ranks += [(base + i, p.node, g) for i, g in enumerate(p.gpus)]
        facts = JobFacts(job, "k8s", tuple((p.node, p.gpus) for p in pods), first.user, first.namespace,
                         first.labels, tuple(ranks))
        owner = self.ownership.resolve(namespace=first.namespace, labels=first.labels, user=first.user)
        key = (facts.ranks, first.user, first.namespace, tuple(sorted(first.labels.items())), owner)
        if self.published.get(job) is not None and self.published[job][0] == facts.ranks \
                and self.published[job][4] == owner:
            return None
        self.published[job] = (facts.ranks, key[1], key[2], key[3], owner)
        try:
            return placement_message(facts, owner, self.clock(), self.producer)
        except PlacementError as exc:
            self.skipped += 1
            log.error("%s", exc)
            return None

    def handle(self, event: str, pod: Mapping[str, Any]) -> list[dict[str, Any]]:
        """Apply one watch event (``ADDED``, ``MODIFIED``, ``DELETED``); return the placements to publish."""
        meta = (pod.get("metadata") if isinstance(pod, Mapping) else None) or {}
        if not isinstance(meta, Mapping):
            meta = {}
        uid = str(meta.get("uid") or f"{meta.get('namespace')}/{meta.get('name')}")
        before = self.pods.get(uid)
        info = None if event == "DELETED" else self._safe_info(pod)
        if info is None:
            self.pods.pop(uid, None)
        else:
            self.pods[uid] = info
        out = []
        for job in sorted({j for j in (before.job if before else None, info.job if info else None) if j}):
            msg = self._safe_job_message(job)
            if msg is not None:
                out.append(msg)
        return out

    def resync(self, pods: Iterable[Mapping[str, Any]]) -> list[dict[str, Any]]:
        """Replace the state with a full list (at start and after the watch expired); return what changed."""
        self.pods = {}
        for pod in pods:
            info = self._safe_info(pod)
            if info is not None:
                self.pods[info.uid] = info
        out = []
        for job in sorted({p.job for p in self.pods.values()} | set(self.published)):
            msg = self._safe_job_message(job)
            if msg is not None:
                out.append(msg)
        return out


def watch_pods(api: Any, tracker: PodTracker, publish: Callable[[dict[str, Any]], None],
               stop: Callable[[], bool], label_selector: str | None = None, timeout_s: int = 300,
               rounds: int | None = None) -> None:
    """List then watch every pod with ``api`` (a ``kubernetes.client.CoreV1Api``), publishing placements.

    The watch is restarted from a fresh list when the server ends it or answers 410
    Gone (the resource version expired), so no event between the two is lost.
    ``rounds`` bounds the list-and-watch cycles (tests); ``stop`` is polled per event.
    """
    from kubernetes import watch
    from kubernetes.client.exceptions import ApiException

    ser = api.api_client.sanitize_for_serialization
    kw: dict[str, Any] = {"label_selector": label_selector} if label_selector else {}
    done = 0
    while not stop() and (rounds is None or done < rounds):
        done += 1
        listed = api.list_pod_for_all_namespaces(**kw)
        for msg in tracker.resync(ser(p) for p in listed.items or []):
            publish(msg)
        w = watch.Watch()
        try:
            for ev in w.stream(api.list_pod_for_all_namespaces, resource_version=listed.metadata.resource_version,
                               timeout_seconds=timeout_s, **kw):
                for msg in tracker.handle(ev["type"], ser(ev["object"])):
                    publish(msg)
                if stop():
                    w.stop()
                    break
        except ApiException as exc:
            if exc.status != 410:
                raise
            log.info("pod watch expired (410 Gone): listing again")
