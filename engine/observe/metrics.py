"""Every metric ``whywait engine`` exports on ``/metrics``, defined in one place.

Most are read when Prometheus scrapes, from the counters the engine keeps anyway (the processor's ``counts``, the
evaluator's incidents and store, the notifier's ``stats``), through custom collectors: the hot path gains no
metric calls per message.  The few that are events in time (a tick's duration, a refused rule reload, the lag
sampled every few seconds, a silenced diagnosis) are prometheus_client objects bumped where they happen.

:data:`METRIC_NAMES` lists every family name, so the shipped Grafana dashboard and alert rules are tested against it.
"""

from __future__ import annotations

import time
from typing import Any, Callable, Iterable

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

# A tick evaluates every rule for every job: milliseconds on a small cluster, a second or more when it falls behind.
TICK_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0)

# The notifier's delivery counters exported for every receiver (0 until they happen, so rate() has a series).
NOTIFY_OUTCOMES = ("sent", "retried", "failed", "rate_limited")

# family name (as Prometheus stores it) -> help, for the tests and docs/operations.md
METRIC_NAMES: dict[str, str] = {
    "whywait_engine_events_total": "records consumed, by topic",
    "whywait_engine_evaluated_total": "records evaluated (valid, admitted), by kind",
    "whywait_engine_dead_letters_total": "records sent to the dead-letter topic, by reason",
    "whywait_engine_publish_failures_total": "diagnoses or dead letters the broker refused, by what",
    "whywait_engine_consumer_lag": "messages behind the end of each assigned partition",
    "whywait_engine_assigned_partitions": "input partitions this worker consumes",
    "whywait_engine_lag_sampled_timestamp_seconds": "when the lag was last read from the broker",
    "whywait_engine_broker_up": "1 when the Kafka broker answered the last probe (every 3 s), 0 when it did not",
    "whywait_engine_tick_duration_seconds": "wall time of one evaluation tick",
    "whywait_engine_tick_interval_seconds": "event time one tick covers: a tick slower than this falls behind",
    "whywait_engine_ticks_total": "evaluation ticks run",
    "whywait_engine_tick_errors_total": "ticks that raised (a second of evaluation lost)",
    "whywait_engine_series": "metric series held in the window store",
    "whywait_engine_entities": "entities (GPUs, NICs, mounts, nodes, jobs) with a series",
    "whywait_engine_nodes_reporting": "nodes the store has telemetry from",
    "whywait_engine_jobs": "jobs placed (watched)",
    "whywait_engine_incidents": "open incidents, by state (pending, firing)",
    "whywait_engine_diagnoses_fired_total": "incidents announced firing, by rule",
    "whywait_engine_diagnoses_resolved_total": "incidents resolved, by rule",
    "whywait_engine_diagnoses_inhibited_total": "incidents muted by a firing root cause, by rule",
    "whywait_engine_diagnoses_silenced_total": "firing incidents a silence covered when notified, by rule",
    "whywait_engine_rules_loaded": "rules in force",
    "whywait_engine_rule_reload_failures_total": "rule reloads refused (the last good rules keep running)",
    "whywait_notifications_total": "notifier deliveries, by receiver and outcome (sent, retried, failed, "
                                   "rate_limited, ...)",
    "whywait_notifications_waiting": "notifications queued for a receiver",
}


class EngineMetrics:
    """The engine's registry and the metrics bumped as things happen.  Built once by ``whywait engine``.

    :meth:`bind` adds the collectors that read the processor and the notifier when scraped.
    """

    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        self.registry = registry if registry is not None else CollectorRegistry()
        r = self.registry
        self.tick = Histogram("whywait_engine_tick_duration_seconds", METRIC_NAMES[
            "whywait_engine_tick_duration_seconds"], buckets=TICK_BUCKETS, registry=r)
        self.tick_interval = Gauge("whywait_engine_tick_interval_seconds",
                                   METRIC_NAMES["whywait_engine_tick_interval_seconds"], registry=r)
        self.reload_failures = Counter("whywait_engine_rule_reload_failures",
                                       METRIC_NAMES["whywait_engine_rule_reload_failures_total"], registry=r)
        self.lag = Gauge("whywait_engine_consumer_lag", METRIC_NAMES["whywait_engine_consumer_lag"],
                         ["topic", "partition"], registry=r)
        self.assigned = Gauge("whywait_engine_assigned_partitions",
                              METRIC_NAMES["whywait_engine_assigned_partitions"], registry=r)
        self.lag_sampled = Gauge("whywait_engine_lag_sampled_timestamp_seconds",
                                 METRIC_NAMES["whywait_engine_lag_sampled_timestamp_seconds"], registry=r)
        self.broker_up = Gauge("whywait_engine_broker_up", METRIC_NAMES["whywait_engine_broker_up"], registry=r)
        self.broker_up.set(1)  # the engine starts only once the broker answered
        self.silenced = Counter("whywait_engine_diagnoses_silenced",
                                METRIC_NAMES["whywait_engine_diagnoses_silenced_total"], ["rule"], registry=r)
        self._lag_labels: set[tuple[str, str]] = set()
        self._silenced_fps: set[str] = set()

    def bind(self, processor: Any, notifier: Any = None) -> EngineMetrics:
        """Export ``processor``'s (and its evaluator's) counters and ``notifier``'s stats; returns self."""
        self.tick_interval.set(processor.evaluator.step_s)
        processor.evaluator.tick_observer = self.tick.observe
        self.registry.register(EngineCollector(processor))
        if notifier is not None:
            self.registry.register(NotifierCollector(notifier))
        return self

    def set_lag(self, lags: dict[tuple[str, int], int]) -> None:
        """Record one lag sample, ``(topic, partition) -> messages behind``; partitions no longer assigned vanish."""
        now = {(t, str(p)) for t, p in lags}
        for gone in self._lag_labels - now:
            self.lag.remove(*gone)
        for (t, p), n in lags.items():
            self.lag.labels(t, str(p)).set(n)
        self._lag_labels = now
        self.assigned.set(len(lags))
        self.lag_sampled.set(time.time())

    def note_notified(self, diagnosis: Any, notifier: Any) -> None:
        """Count ``diagnosis`` as silenced when it fires and a silence in ``notifier``'s store covers it.

        Called on the notify thread, before each diagnosis goes to the notifier.  Matched on the diagnosis's own
        fields (rule_id, job, culprit, severity, fingerprint, labels, team, project); a silence on the notifier's
        incident group alone (a Slack button's) is the notifier's to count.  Once per incident.
        """
        store = getattr(notifier, "silences", None)
        fp = diagnosis.fingerprint
        if diagnosis.status != "firing":
            self._silenced_fps.discard(fp)
            return
        if store is None or fp in self._silenced_fps:
            return
        owner = diagnosis.owner
        fields = {k: str(v) for k, v in (diagnosis.labels or {}).items()}
        fields.update({"rule_id": diagnosis.rule_id, "job": diagnosis.job or "", "culprit": diagnosis.culprit or "",
                       "severity": diagnosis.severity, "fingerprint": fp,
                       "team": owner.team if owner else "", "project": owner.project if owner else ""})
        try:
            hit = store.matching(fields, time.time())
        except Exception:  # noqa: BLE001 - a broken store is the notifier's to report; the count just skips it
            return
        if hit is not None:
            self._silenced_fps.add(fp)
            self.silenced.labels(diagnosis.rule_id).inc()


def _by_prefix(counts: dict[str, int], prefix: str) -> list[tuple[str, int]]:
    return sorted((k[len(prefix):], v) for k, v in counts.items() if k.startswith(prefix))


def _retry(read: Callable[[], int], tries: int = 3) -> int:
    """``read()``, tried again if the stream thread changed a dict under it (scrapes run on their own thread)."""
    for _ in range(tries - 1):
        try:
            return read()
        except RuntimeError:  # "dictionary changed size during iteration"
            continue
    return read()


class EngineCollector(Collector):
    """Reads the processor's counters, the evaluator's incidents and the store's size when scraped."""

    def __init__(self, processor: Any) -> None:
        self.processor = processor

    def collect(self) -> Iterable[Metric]:
        p = self.processor
        ev = p.evaluator
        counts: dict[str, int] = dict(p.counts)  # one C-level copy: safe while the stream thread counts

        def counter(name: str, label: str | None, items: Iterable[tuple[str, int]]) -> Metric:
            fam = CounterMetricFamily(name.removesuffix("_total"), METRIC_NAMES[name],
                                      labels=[label] if label else None)
            for k, v in items:
                fam.add_metric([k] if label else [], v)
            return fam

        def gauge(name: str, value: float) -> Metric:
            fam = GaugeMetricFamily(name, METRIC_NAMES[name])
            fam.add_metric([], value)
            return fam

        yield counter("whywait_engine_events_total", "topic", _by_prefix(counts, "topic."))
        yield counter("whywait_engine_evaluated_total", "kind", _by_prefix(counts, "kind."))
        yield counter("whywait_engine_dead_letters_total", "reason", _by_prefix(counts, "dead_letters."))
        yield counter("whywait_engine_publish_failures_total", "what", _by_prefix(counts, "send_failed."))
        yield counter("whywait_engine_diagnoses_fired_total", "rule", _by_prefix(counts, "fired."))
        yield counter("whywait_engine_diagnoses_resolved_total", "rule", _by_prefix(counts, "resolved."))
        yield counter("whywait_engine_diagnoses_inhibited_total", "rule", sorted(dict(ev.inhibited).items()))
        yield counter("whywait_engine_ticks_total", None, [("", ev.ticks)])
        yield counter("whywait_engine_tick_errors_total", None, [("", ev.tick_errors)])
        keys = list(ev.store.series)
        yield gauge("whywait_engine_series", len(keys))
        yield gauge("whywait_engine_entities", len({e for _, e in keys}))
        yield gauge("whywait_engine_nodes_reporting", len(ev.store.node_last))
        yield gauge("whywait_engine_jobs", _retry(lambda: len(ev.topology.jobs())))
        incidents = list(ev.incidents.values())
        inc = GaugeMetricFamily("whywait_engine_incidents", METRIC_NAMES["whywait_engine_incidents"],
                                labels=["state"])
        firing = sum(1 for i in incidents if i.firing)
        inc.add_metric(["firing"], firing)
        inc.add_metric(["pending"], len(incidents) - firing)
        yield inc
        yield gauge("whywait_engine_rules_loaded", len(ev.rules))


class NotifierCollector(Collector):
    """Reads the notifier's ``stats`` (a method or a property returning a dict) when scraped.

    Two shapes are understood: per receiver (``{"receivers": {name: {counter: n}}}``) and one flat dict of totals,
    exported as receiver ``slack``/``console``/... after the notifier's class.  ``sent`` missing from a flat dict is
    posted + updated + replied.  ``waiting`` is a gauge; every other integer is a counter under ``outcome``.
    """

    def __init__(self, notifier: Any) -> None:
        self.notifier = notifier

    def _stats(self) -> dict[str, dict[str, int]]:
        raw = getattr(self.notifier, "stats", None)
        if raw is None:
            return {}
        stats = raw() if callable(raw) else raw
        if not isinstance(stats, dict):
            return {}
        per = stats.get("receivers")
        if isinstance(per, dict):
            return {str(k): v for k, v in per.items() if isinstance(v, dict)}
        name = type(self.notifier).__name__.removesuffix("Notifier").lower() or "notifier"
        flat = {k: v for k, v in stats.items() if isinstance(v, int)}
        if "sent" not in flat:
            flat["sent"] = sum(flat.get(k, 0) for k in ("posted", "updated", "replied"))
        return {name: flat}

    def collect(self) -> Iterable[Metric]:
        total = CounterMetricFamily("whywait_notifications", METRIC_NAMES["whywait_notifications_total"],
                                    labels=["receiver", "outcome"])
        waiting = GaugeMetricFamily("whywait_notifications_waiting", METRIC_NAMES["whywait_notifications_waiting"],
                                    labels=["receiver"])
        for receiver, counters in sorted(self._stats().items()):
            ints = {k: v for k, v in counters.items() if isinstance(v, int) and not isinstance(v, bool)}
            for outcome in sorted(set(NOTIFY_OUTCOMES) | set(ints) - {"waiting"}):
                total.add_metric([receiver, outcome], ints.get(outcome, 0))
            waiting.add_metric([receiver], ints.get("waiting", 0))
        yield total
        yield waiting


class Readiness:
    """``/readyz`` for the engine: rules loaded, the broker answering, partitions assigned.

    The stream layer calls :meth:`assigned` on each rebalance and :meth:`sampled` after each lag sample (which
    talks to the broker), and sets :attr:`broker` to its broker watch's reason (``BrokerWatch.reason``: the
    broker unreachable for some seconds, said at once rather than when the lag sample goes stale);
    :meth:`__call__` returns None when ready, else the one-line reason.
    """

    def __init__(self, processor: Any, stale_after_s: float = 30.0, clock: Any = time.monotonic) -> None:
        self.processor = processor
        self.stale_after_s = stale_after_s
        self.clock = clock
        self.partitions = 0
        self.last_ok: float | None = None
        self.last_error: str | None = None
        self.broker: Callable[[], str | None] | None = None  # why the broker is down, or None

    def assigned(self, n: int) -> None:
        """The consumer now holds ``n`` input partitions."""
        self.partitions = n

    def sampled(self, error: str | None = None) -> None:
        """A lag sample succeeded (``error`` None) or failed with ``error``."""
        if error is None:
            self.last_ok, self.last_error = self.clock(), None
        else:
            self.last_error = error

    def __call__(self) -> str | None:
        if len(self.processor.evaluator.rules) == 0:
            return "no rules loaded"
        down = self.broker() if self.broker is not None else None
        if down:
            return down
        if self.last_ok is None:
            return f"broker not answered yet ({self.last_error})" if self.last_error else "not consuming yet"
        age = self.clock() - self.last_ok
        if age > self.stale_after_s:
            why = f": {self.last_error}" if self.last_error else ""
            return f"broker not answering for {age:.0f}s{why}"
        if self.partitions == 0:
            return "no input partitions assigned (a standby in the consumer group, or a rebalance in progress)"
        return None


async def read_lag(consumer: Any, topics: Iterable[str]) -> dict[tuple[str, int], int]:
    """Messages behind the end, per assigned partition of ``topics``: the partition's end offset, asked of the
    broker (so a sample that succeeds also shows the broker answers), less the consumer's position.

    Called every few seconds by the stream layer with faust's consumer; raises what the broker client raises.
    """
    wanted = set(topics)
    tps = sorted((tp for tp in consumer.assignment() if tp.topic in wanted), key=lambda tp: (tp.topic, tp.partition))
    if not tps:
        return {}
    ends = await consumer.highwaters(*tps)
    out: dict[tuple[str, int], int] = {}
    for tp in tps:
        end = ends.get(tp)
        if end is None:
            continue
        pos = await consumer.position(tp)
        out[(tp.topic, tp.partition)] = max(0, end - (pos if pos is not None else 0))
    return out
