from __future__ import annotations

import http.server
import logging
import re
import threading
from typing import Iterator

import pytest
from whywait.agents.collectors.dcgm import DcgmCollector, parse_prometheus
from whywait.agents.events import TOPIC_GPU, envelope, validate

from tests.agents.conftest import fixture_path


def l4_scrape() -> str:
    return open(fixture_path("dcgm", "dcgm-exporter-L4-kops.prom"), encoding="utf-8").read()


def l40s_scrape() -> str:
    """The dcgm-exporter lines embedded in upcloud's Markdown test output."""
    text = open(fixture_path("dcgm", "accelerator-metrics.md"), encoding="utf-8").read()
    return "\n".join(line for line in text.splitlines() if line.startswith(("DCGM_", "# HELP DCGM", "# TYPE DCGM")))


class Canned(DcgmCollector):
    """The collector with its HTTP fetch replaced by a list of scrapes."""

    def __init__(self, scrapes: list[str], **kw: object) -> None:
        super().__init__("http://unused/metrics", **kw)  # type: ignore[arg-type]
        self.scrapes = scrapes

    def fetch(self) -> str:
        return self.scrapes.pop(0)


def check(body: dict | None) -> dict:
    assert body is not None
    validate(envelope("gpu", "node-01", 1_764_442_800.0, **body), TOPIC_GPU)
    return body


def test_parse_prometheus_real_scrape() -> None:
    samples, bad = parse_prometheus(l4_scrape())
    assert bad == 0
    names = {n for n, _, _ in samples}
    assert {"DCGM_FI_DEV_GPU_UTIL", "DCGM_FI_DEV_FB_USED", "DCGM_FI_DEV_POWER_USAGE"} <= names
    _, labels, value = next(s for s in samples if s[0] == "DCGM_FI_DEV_POWER_USAGE")
    assert value == 16.365 and labels["UUID"] == "GPU-c2f76b33-7953-256e-8f33-1343419b1a1c"
    assert labels["Hostname"] == "i-030791dc5a37cd257" and labels["modelName"] == "NVIDIA L4"


def test_parse_prometheus_counts_malformed_lines() -> None:
    samples, bad = parse_prometheus('ok{gpu="0"} 1\nnot a sample line at all {\nx{gpu="0"} NaNish\n')
    assert len(samples) == 1 and bad == 2


def test_l4_scrape_maps_onto_gpu_fields() -> None:
    g = check(Canned([l4_scrape()]).collect(0.0, 0.0))["gpus"][0]
    assert g["gpu"] == 0 and g["uuid"] == "GPU-c2f76b33-7953-256e-8f33-1343419b1a1c"
    assert g["sm_clock_mhz"] == 210 and g["temp_c"] == 31 and g["power_w"] == 16.365
    assert g["util_pct"] == 0 and g["mem_util_pct"] == 0
    assert g["mem_used_bytes"] == 0 and g["mem_total_bytes"] == (22563 + 470) << 20
    assert g["pcie_replay"] == 0 and g["remapped_rows_failed"] is False
    assert g["hostname"] == "i-030791dc5a37cd257" and g["pcie_tx_bytes_per_s"] == 112603


def test_l40s_scrape_from_another_site() -> None:
    g = check(Canned([l40s_scrape()]).collect(0.0, 0.0))["gpus"][0]
    assert g["uuid"] == "GPU-5b4e07f6-3a86-4340-039d-25f2a83cdc43" and g["temp_c"] == 32 and g["power_w"] == 35.686


def test_lowercase_label_spellings_are_accepted() -> None:
    text = re.sub(r'\bUUID="', 'uuid="', l4_scrape()).replace('Hostname="', 'hostname="')
    g = check(Canned([text], hostname="i-030791dc5a37cd257").collect(0.0, 0.0))["gpus"][0]
    assert g["uuid"] == "GPU-c2f76b33-7953-256e-8f33-1343419b1a1c" and g["hostname"] == "i-030791dc5a37cd257"


def test_hostname_filter_skips_other_nodes() -> None:
    assert check(Canned([l4_scrape()], hostname="another-node").collect(0.0, 0.0))["gpus"] == []


def test_xid_gauge_change_is_one_occurrence_and_ecc_is_a_delta() -> None:
    extra = ('DCGM_FI_DEV_XID_ERRORS{gpu="0",UUID="GPU-x"} %d\nDCGM_FI_DEV_ECC_DBE_VOL_TOTAL{gpu="0",UUID="GPU-x"} %d\n'
             'DCGM_FI_DEV_CLOCK_THROTTLE_REASONS{gpu="0",UUID="GPU-x"} %d\n')
    base = "\n".join(line.replace('UUID="GPU-c2f76b33-7953-256e-8f33-1343419b1a1c"', 'UUID="GPU-x"')
                     for line in l4_scrape().splitlines()) + "\n"
    c = Canned([base + extra % (13, 2, 0), base + extra % (13, 2, 0), base + extra % (79, 5, 0x40)])
    assert check(c.collect(0.0, 0.0))["gpus"][0]["xid"] == []  # an XID from before the agent started
    assert check(c.collect(1.0, 1.0))["gpus"][0]["xid"] == []
    g = check(c.collect(2.0, 2.0))["gpus"][0]
    assert g["xid"] == [79] and g["ecc_uncorrected"] == 3 and g["throttle_reasons"] == ["hw_thermal_slowdown"]


@pytest.fixture()
def exporter() -> Iterator[str]:
    """A local HTTP server on 127.0.0.1 serving the real L4 scrape at /metrics."""
    body = l4_scrape().encode()

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:  # noqa: N802
            if self.path != "/metrics":
                self.send_error(404)
                return
            self.send_response(200)
            self.send_header("Content-Type", "text/plain; version=0.0.4")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args: object) -> None:
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    t = threading.Thread(target=server.serve_forever, daemon=True)
    t.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()


def test_scrape_over_http(exporter: str) -> None:
    c = DcgmCollector(exporter + "/metrics")
    g = check(c.collect(0.0, 0.0))["gpus"][0]
    assert g["uuid"] == "GPU-c2f76b33-7953-256e-8f33-1343419b1a1c"


def test_unreachable_exporter_is_a_counted_error_and_recovers(exporter: str) -> None:
    c = DcgmCollector(exporter + "/nope", timeout=1.0)
    assert c.collect(0.0, 0.0) is None and c.errors == 1 and "scrape" in c.parts_off
    c.url = exporter + "/metrics"
    assert c.collect(1.0, 1.0) is not None and "scrape" not in c.parts_off


def test_exposition_details_follow_prometheus_client() -> None:
    # A counter written without `_total` keeps its written name; escaped label values and timestamps parse.
    text = ('# TYPE DCGM_FI_DEV_PCIE_REPLAY_COUNTER counter\nDCGM_FI_DEV_PCIE_REPLAY_COUNTER{gpu="0"} 4\n'
            '# TYPE req_total counter\nreq_total 2\nm{path="a\\"b\\\\c",gpu="1"} 3 1700000000000\n')
    samples, bad = parse_prometheus(text)
    assert bad == 0
    assert samples == [("DCGM_FI_DEV_PCIE_REPLAY_COUNTER", {"gpu": "0"}, 4.0), ("req_total", {}, 2.0),
                       ("m", {"path": 'a"b\\c', "gpu": "1"}, 3.0)]


def test_an_exporter_that_cannot_be_scraped_is_a_warning_and_counts_as_off(
        exporter: str, caplog: pytest.LogCaptureFixture) -> None:
    # It was an INFO line, and collector_off{dcgm} stayed 0 although no gpu message went out.
    from prometheus_client import generate_latest
    from whywait.agents.agent import Agent
    from whywait.agents.observe import agent_registry
    from whywait.agents.publisher import MemoryPublisher

    c = DcgmCollector(exporter + "/nope", timeout=1.0)
    with caplog.at_level(logging.INFO, logger="whywait.agent"):
        assert c.collect(0.0, 0.0) is None
    assert [r.levelno for r in caplog.records if "scrape off" in r.getMessage()] == [logging.WARNING]
    agent = Agent("n1", [c], MemoryPublisher())
    assert 'whywait_agent_collector_off{collector="dcgm"} 1.0' in generate_latest(agent_registry(agent)).decode()
    c.url = exporter + "/metrics"
    assert c.collect(1.0, 1.0) is not None
    assert 'whywait_agent_collector_off{collector="dcgm"} 0.0' in generate_latest(agent_registry(agent)).decode()
