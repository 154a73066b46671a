"""The engine's metrics, read through the real /metrics server and prometheus_client's own parser (no Kafka).

A Processor is fed encoded contract messages with a fault, two bad records and a root-cause rule that inhibits the
symptom rule, exactly as the stream layer hands them over; the scrape must count what happened.
"""

from __future__ import annotations

import urllib.error
import urllib.request
from pathlib import Path
from typing import Any, Iterator

import pytest
from prometheus_client.parser import text_string_to_metric_families
from whywait.agents.events import encode, envelope, topic_for_kind
from whywait.agents.observe import MetricsAddrError, ObserveServer, check_addr_free, metrics_addr, parse_addr
from whywait.engine.diagnosis import Diagnosis, Owner
from whywait.engine.evaluate.evaluator import Evaluator
from whywait.engine.notify.silences import InMemorySilenceStore, Silence
from whywait.engine.observe.metrics import METRIC_NAMES, EngineMetrics, NotifierCollector, Readiness
from whywait.engine.rules.loader import load_rules
from whywait.engine.stream.processor import Processor, Record
from whywait.simulate.cluster import make_cluster

T0 = 1_800_000_000.0
NODES = ["node-01", "node-02", "node-03", "node-04"]
SYMPTOM = """\
apiVersion: whywait/v1
id: network.obs-straggler
title: "{{ job }} waits on {{ node }}"
cause: "{{ node }} retransmits"
next_step: "check {{ switch }}"
for: 2s
group_by: [job, node]
when:
  type: peer_outlier
  metric: net.tcp_retrans_segs_per_s
  window: 3s
  ratio: "> 10"
  min_value: "> 20"
  culprit: true
"""
ROOT = """\
apiVersion: whywait/v1
id: network.obs-root
title: root cause
cause: the job's comm grew
next_step: look
inhibits: [network.obs-straggler]
when:
  type: self_history
  metric: job.comm_s
  window: 3s
  baseline: 60s
  ratio: "> 1.3"
"""


def stream(seconds: int, fault: tuple[int, int]) -> Iterator[dict[str, Any]]:
    """Four nodes, one rank each; node-03 retransmits and the job's comm time grows during ``fault``."""
    ranks = [{"rank": i, "node": n, "gpu": 0} for i, n in enumerate(NODES)]
    yield envelope("placement", "scheduler", T0, job="job-a", project="proj", team="team-a",
                   slack_channel="#team-a", state="running", ranks=ranks)
    for s in range(1, seconds + 1):
        t = T0 + s
        bad = fault[0] <= s < fault[1]
        for i, n in enumerate(NODES):
            yield envelope("net", n, t, interval_s=1.0, nics=[], tcp_retrans_segs_per_s=500.0 if bad and
                           n == "node-03" else 1.0 + i % 2, tcp_out_segs_per_s=20000.0)
            comm = 0.6 if bad else 0.2 + 0.01 * i
            yield envelope("steps", n, t, job="job-a", steps=[{"rank": i, "step": s, "duration_s": 0.8 + comm,
                                                              "data_wait_s": 0.01, "compute_s": 0.6, "comm_s": comm}])


def records(msgs: Iterator[dict[str, Any]]) -> list[Record]:
    return [Record(topic_for_kind(m["kind"]), encode(m), None, 0, i) for i, m in enumerate(msgs)]


def scrape(url: str) -> dict[str, Any]:
    """name -> {labels tuple -> value}, through prometheus_client's parser (as Prometheus would read it)."""
    with urllib.request.urlopen(url, timeout=5) as r:
        text = r.read().decode()
    out: dict[str, Any] = {}
    for fam in text_string_to_metric_families(text):
        for s in fam.samples:
            out.setdefault(s.name, {})[tuple(sorted(s.labels.items()))] = s.value
    return out


@pytest.fixture
def engine(tmp_path: Path) -> Iterator[tuple[Processor, EngineMetrics, str]]:
    (tmp_path / "network.obs-straggler.yaml").write_text(SYMPTOM)
    (tmp_path / "network.obs-root.yaml").write_text(ROOT)
    p = Processor(Evaluator(load_rules([tmp_path]), make_cluster(nodes=4, gpus_per_node=1)),
                  wall_clock=lambda: T0 + 200)  # the events are stamped in 2027
    m = EngineMetrics().bind(p)
    server = ObserveServer(("127.0.0.1", 0), m.registry, Readiness(p)).start()
    try:
        yield p, m, f"http://127.0.0.1:{server.port}"
    finally:
        server.stop()


def test_scrape_counts_events_dead_letters_diagnoses_and_ticks(engine: tuple[Processor, EngineMetrics, str]) -> None:
    p, _m, url = engine
    recs = records(stream(140, (80, 110)))
    recs.append(Record("whywait.host.v1", b"{not json", None, 0, 99_999))
    recs.append(Record("whywait.net.v1", encode(envelope("net", "node-99", T0 + 139, interval_s=1.0, nics=[],
                                                          tcp_retrans_segs_per_s=1.0, tcp_out_segs_per_s=1.0)),
                       None, 0, 100_000))
    for i in range(0, len(recs), 500):  # batches, as the stream takes them
        p.process(recs[i:i + 500])
    s = scrape(url + "/metrics")
    events = s["whywait_engine_events_total"]
    assert events[(("topic", "whywait.net.v1"),)] == 4 * 140 + 1
    assert events[(("topic", "whywait.steps.v1"),)] == 4 * 140
    assert events[(("topic", "whywait.placement.v1"),)] == 1
    dead = s["whywait_engine_dead_letters_total"]
    assert dead == {(("reason", "contract"),): 1, (("reason", "unknown_node"),): 1}
    # the root cause fired and resolved once; the symptom it covers was muted, once, not once per second
    assert s["whywait_engine_diagnoses_fired_total"] == {(("rule", "network.obs-root"),): 1}
    assert s["whywait_engine_diagnoses_resolved_total"] == {(("rule", "network.obs-root"),): 1}
    assert s["whywait_engine_diagnoses_inhibited_total"] == {(("rule", "network.obs-straggler"),): 1}
    ticks = s["whywait_engine_ticks_total"][()]
    assert ticks >= 130
    assert s["whywait_engine_tick_duration_seconds_count"][()] == ticks
    assert s["whywait_engine_tick_duration_seconds_sum"][()] > 0
    assert s["whywait_engine_tick_interval_seconds"][()] == 1.0
    assert s["whywait_engine_jobs"][()] == 1 and s["whywait_engine_nodes_reporting"][()] == 4
    assert s["whywait_engine_series"][()] > 4 and s["whywait_engine_entities"][()] >= 4
    assert s["whywait_engine_rules_loaded"][()] == 2


def test_every_declared_metric_is_exported(engine: tuple[Processor, EngineMetrics, str]) -> None:
    p, m, url = engine
    m.set_lag({("whywait.net.v1", 0): 3})
    m.registry.register(NotifierCollector(type("N", (), {"stats": lambda self: {}})()))
    p.process(records(stream(5, (0, 0))))
    m.reload_failures.inc()
    m.silenced.labels("x").inc()
    with urllib.request.urlopen(url + "/metrics", timeout=5) as r:
        families = {f.name + ("_total" if f.type == "counter" else "")
                    for f in text_string_to_metric_families(r.read().decode())
                    if not f.name.endswith("_created")}  # prometheus_client's creation timestamps
    assert families == set(METRIC_NAMES)  # every family declared (and documented), every declared one exported


def test_lag_series_follow_the_assignment(engine: tuple[Processor, EngineMetrics, str]) -> None:
    _p, m, url = engine
    m.set_lag({("whywait.net.v1", 0): 7, ("whywait.gpu.v1", 1): 0})
    s = scrape(url + "/metrics")
    assert s["whywait_engine_consumer_lag"][(("partition", "0"), ("topic", "whywait.net.v1"))] == 7
    assert s["whywait_engine_assigned_partitions"][()] == 2
    m.set_lag({("whywait.gpu.v1", 1): 2})  # a rebalance took net-0 away: its series must go, not freeze
    s = scrape(url + "/metrics")
    assert s["whywait_engine_consumer_lag"] == {(("partition", "1"), ("topic", "whywait.gpu.v1")): 2}


def get(url: str) -> tuple[int, str]:
    try:
        with urllib.request.urlopen(url, timeout=5) as r:
            return r.status, r.read().decode()
    except urllib.error.HTTPError as e:
        return e.code, e.read().decode()


def test_readyz_says_why_in_one_line(engine: tuple[Processor, EngineMetrics, str]) -> None:
    p, _m, url = engine
    assert get(url + "/healthz") == (200, "ok\n")
    assert get(url + "/readyz") == (503, "not ready: not consuming yet\n")
    now = [100.0]
    ready = Readiness(p, stale_after_s=30.0, clock=lambda: now[0])
    ready.sampled("KafkaConnectionError: no broker")
    assert ready() == "broker not answered yet (KafkaConnectionError: no broker)"
    ready.sampled()
    assert ready() and "no input partitions" in str(ready())
    ready.assigned(4)
    assert ready() is None
    now[0] = 140.0
    ready.sampled("KafkaTimeoutError")
    assert ready() == "broker not answering for 40s: KafkaTimeoutError"
    p.evaluator.rules = load_rules([])
    assert ready() == "no rules loaded"
    assert get(url + "/nope")[0] == 404


def test_notifier_stats_per_receiver_and_flat() -> None:
    class PerReceiver:
        def stats(self) -> dict[str, Any]:
            return {"sent": 5, "receivers": {"slack": {"sent": 4, "retried": 2, "rate_limited": 1, "failed": 0,
                                                       "waiting": 3, "fallback_channel": 1},
                                             "webhook": {"sent": 1, "failed": 2, "waiting": 0}}}

    class SlackNotifier:  # the notifier before the rewrite: a property, flat, no "sent"
        stats = {"posted": 2, "updated": 3, "replied": 1, "failed": 1, "waiting": 4}

    fams = {f.name: f for f in NotifierCollector(PerReceiver()).collect()}
    got = {tuple(s.labels.values()): s.value for s in fams["whywait_notifications"].samples}
    assert got[("slack", "sent")] == 4 and got[("slack", "rate_limited")] == 1
    assert got[("slack", "fallback_channel")] == 1 and got[("webhook", "failed")] == 2
    assert got[("webhook", "rate_limited")] == 0  # present before it first happens
    assert ("slack", "waiting") not in got
    waiting = {s.labels["receiver"]: s.value for s in fams["whywait_notifications_waiting"].samples}
    assert waiting == {"slack": 3, "webhook": 0}
    fams = {f.name: f for f in NotifierCollector(SlackNotifier()).collect()}
    got = {tuple(s.labels.values()): s.value for s in fams["whywait_notifications"].samples}
    assert got[("slack", "sent")] == 6 and got[("slack", "failed")] == 1


def test_silenced_counts_once_per_incident() -> None:
    class N:
        silences = InMemorySilenceStore()

    n = N()
    n.silences.add(Silence.new({"job": "job-a"}, duration=3600, created_by="alice"))
    m = EngineMetrics()

    def diag(job: str, status: str = "firing") -> Diagnosis:
        return Diagnosis(rule_id="r", fingerprint=f"fp-{job}", status=status, severity="warning",  # type: ignore[arg-type]
                         title="t", cause="c", job=job, owner=Owner("p", "t", "#c"), starts_at=T0, detected_at=T0,
                         next_step="n", confidence=1.0)

    for d in (diag("job-a"), diag("job-a"), diag("job-b"), diag("job-a", "resolved"), diag("job-a")):
        m.note_notified(d, n)
    # job-a twice (it resolved in between), job-b not at all: no silence covers it
    assert m.registry.get_sample_value("whywait_engine_diagnoses_silenced_total", {"rule": "r"}) == 2


def test_addresses() -> None:
    assert parse_addr("127.0.0.1:9464") == ("127.0.0.1", 9464)
    assert parse_addr(":9464") == ("0.0.0.0", 9464)
    assert parse_addr("[::1]:9") == ("::1", 9)
    for bad in ("9464", "host:", "host:99999", "host:http"):
        with pytest.raises(MetricsAddrError, match="must be HOST:PORT"):
            parse_addr(bad)
    assert metrics_addr("off") is None


def test_env_address_and_a_busy_port(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("WHYWAIT_METRICS_ADDR", "nope")
    with pytest.raises(MetricsAddrError, match=r"\$WHYWAIT_METRICS_ADDR must be HOST:PORT"):
        metrics_addr(None)
    monkeypatch.delenv("WHYWAIT_METRICS_ADDR")
    assert metrics_addr(None) is None  # off by default
    first = ObserveServer(("127.0.0.1", 0), EngineMetrics().registry)
    try:
        with pytest.raises(MetricsAddrError, match=f"cannot serve metrics on 127.0.0.1:{first.port}"):
            ObserveServer(("127.0.0.1", first.port), EngineMetrics().registry)
        with pytest.raises(MetricsAddrError, match=f"cannot serve metrics on 127.0.0.1:{first.port}"):
            check_addr_free(("127.0.0.1", first.port))  # what the engine asks before it connects to Kafka
    finally:
        first.stop()
    check_addr_free(("127.0.0.1", first.port))  # free again


def test_the_engine_says_a_taken_port_before_it_connects(capsys: pytest.CaptureFixture[str],
                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    """It connected to Kafka, read the placements and restored its state first, then failed on the port."""
    from whywait.engine.cli import main

    monkeypatch.setenv("WHYWAIT_KAFKA_BOOTSTRAP", "127.0.0.1:1")  # nothing there: reaching it would be exit 3
    first = ObserveServer(("127.0.0.1", 0), EngineMetrics().registry)
    topo = Path(__file__).resolve().parents[1] / "fixtures" / "topology" / "small.yaml"
    try:
        rc = main(["engine", "--topology", str(topo), "--metrics-addr", f"127.0.0.1:{first.port}"])
    finally:
        first.stop()
    assert rc == 2
    assert capsys.readouterr().err.strip() == (f"whywait engine: cannot serve metrics on 127.0.0.1:{first.port}: "
                                               "Address already in use")


def test_a_broken_collector_is_a_500_in_one_line_not_a_dead_server() -> None:
    class Broken:
        def collect(self) -> Any:
            raise KeyError("gone")

    reg = EngineMetrics().registry
    reg.register(Broken())  # type: ignore[arg-type]
    server = ObserveServer(("127.0.0.1", 0), reg).start()
    try:
        url = f"http://127.0.0.1:{server.port}"
        assert get(url + "/metrics") == (500, "metrics failed: KeyError: 'gone'\n")
        assert get(url + "/healthz") == (200, "ok\n")  # still serving
    finally:
        server.stop()
