"""The ``hw`` collector and its sources, on real captures (see tests/fixtures/agents/ATTRIBUTION.md)."""

from __future__ import annotations

import base64
import http.server
import json
import logging
import os
import shutil
import threading
from typing import Any, Iterator

import pytest
from whywait.agents.collectors import COLLECTORS, HardwareCollector
from whywait.agents.collectors.bmc import BmcSource, RedfishClient, parse_power, parse_sdr, parse_thermal
from whywait.agents.collectors.kmsg import KmsgSource, classify, parse_record
from whywait.agents.collectors.pcie import PcieSource, device_class, generation, parse_aer, parse_speed
from whywait.agents.collectors.ports import PortSource
from whywait.agents.events import TOPIC_HW, envelope, validate

from tests.agents.conftest import fixture_path
from tests.agents.fake_nvml import FakeNvml, load_capture

T0 = 1_764_442_800.0


def valid(body: dict[str, Any]) -> dict[str, Any]:
    """The body as a ``hw`` message must pass the contract; returns the body."""
    validate(envelope("hw", "node-01", T0, **body), TOPIC_HW)
    return body


# --- PCIe ---------------------------------------------------------------------------------------

def test_speed_generation_and_aer_parsing() -> None:
    assert parse_speed("16.0 GT/s PCIe\n") == 16.0 and parse_speed("8 GT/s") == 8.0
    assert parse_speed("Unknown") is None and parse_speed(None) is None
    assert [generation(x) for x in (2.5, 5.0, 8.0, 16.0, 32.0, 64.0, 3.0, None)] == [1, 2, 3, 4, 5, 6, None, None]
    assert parse_aer("RxErr 2\nBadTLP 1\nTOTAL_ERR_COR 3\n") == 3
    assert parse_aer("RxErr 2\nBadTLP 1\n") == 3  # older kernels: no total line
    assert parse_aer("") is None
    assert device_class(0x030200, 0x10DE) == "gpu" and device_class(0x030000, 0x1A03) is None  # a BMC's VGA
    assert device_class(0x020000, 0x8086) == "nic" and device_class(0x020700, 0x15B3) == "nic"
    assert device_class(0x010802, 0xC0A9) == "nvme" and device_class(0x060400, 0x1022) is None


def test_pcie_links_of_a_real_sys_tree(node_exporter_root: str) -> None:
    src = PcieSource(node_exporter_root)
    assert src.available() is None
    links = {r["device"]: r for r in src.read(0.0)}
    # node_exporter's capture: an NVMe drive whose Gen4 x4 link trained at Gen3 (8 GT/s of 16),
    # and an Intel NIC (ens10f0) at its full Gen2 x4; the bridges are not followed.
    assert set(links) == {"0000:01:00.0", "0000:45:00.0"}
    nvme, nic = links["0000:01:00.0"], links["0000:45:00.0"]
    assert (nvme["class"], nvme["width"], nvme["width_max"], nvme["gen"], nvme["gen_max"]) == ("nvme", 4, 4, 3, 4)
    assert (nic["class"], nic["width"], nic["width_max"], nic["gen"], nic["gen_max"]) == ("nic", 4, 4, 2, 2)
    assert nic["nics"] == ["ens10f0"]
    assert "aer_correctable" not in nic  # a first reading: no interval yet
    again = {r["device"]: r for r in src.read(10.0)}
    assert again["0000:45:00.0"]["aer_correctable"] == 0 and again["0000:45:00.0"]["aer_fatal"] == 0
    valid({"pcie": list(again.values())})


def test_aer_counts_per_interval_and_a_device_that_falls_off_the_bus(node_exporter_root: str,
                                                                       tmp_path: Any) -> None:
    root = str(tmp_path / "root")
    shutil.copytree(node_exporter_root, root, symlinks=True)
    dev = os.path.join(root, "sys", "devices", "pci0000:40", "0000:40:01.3", "0000:45:00.0")
    src = PcieSource(root)
    src.read(0.0)
    text = open(os.path.join(dev, "aer_dev_correctable")).read().replace("TOTAL_ERR_COR 0", "TOTAL_ERR_COR 7")
    os.chmod(os.path.join(dev, "aer_dev_correctable"), 0o644)
    with open(os.path.join(dev, "aer_dev_correctable"), "w") as fh:
        fh.write(text)
    nic = next(r for r in src.read(10.0) if r["device"] == "0000:45:00.0")
    assert nic["aer_correctable"] == 7
    os.unlink(os.path.join(root, "sys", "bus", "pci", "devices", "0000:45:00.0"))  # the NIC is gone
    lost = next(r for r in src.read(20.0) if r["device"] == "0000:45:00.0")
    assert lost["width"] == 0 and lost["gen"] == 0 and lost["width_max"] == 4 and lost["nics"] == ["ens10f0"]


def test_full_links_of_procfs_capture(procfs_root: str) -> None:
    # procfs's capture: an NVMe drive at its full Gen3 x4 and an Intel NIC at its full Gen4 x8.
    links = {r["device"]: r for r in PcieSource(procfs_root).read(0.0)}
    assert {d: (r["class"], r["width"], r["width_max"], r["gen"], r["gen_max"]) for d, r in links.items()} == {
        "0000:01:00.0": ("nvme", 4, 4, 3, 3), "0000:a2:00.0": ("nic", 8, 8, 4, 4)}


# --- ports ---------------------------------------------------------------------------------------

def test_ports_of_a_real_h100_node(h100_ib_root: str) -> None:
    ports = {p["nic"]: p for p in PortSource(h100_ib_root).read(0.0)}
    rails = [n for n in ports if not n.startswith("mlx5_bond")]
    assert len(rails) == 8 and all(ports[n]["speed_mbps"] == 400_000.0 for n in rails)
    assert all(ports[n]["link_layer"] == "InfiniBand" and ports[n]["rdma"] and ports[n]["link_up"] for n in rails)
    # the RoCE bond runs at 2X NDR: 200 Gb/s, a different link layer from the rails
    assert ports["mlx5_bond_0/1"]["speed_mbps"] == 200_000.0 and ports["mlx5_bond_0/1"]["link_layer"] == "Ethernet"
    valid({"ports": list(ports.values())})


def test_gid_table_sanity(h100_ib_root: str) -> None:
    port = os.path.join(h100_ib_root, "sys", "class", "infiniband", "mlx5_bond_0", "ports", "1")
    os.makedirs(os.path.join(port, "gids"))
    os.makedirs(os.path.join(port, "gid_attrs", "types"))
    for i, (gid, kind) in enumerate([("fe80:0000:0000:0000:0a5c:1aff:fe2b:3c4d", "IB/RoCE v1"),
                                     ("fe80:0000:0000:0000:0a5c:1aff:fe2b:3c4d", "RoCE v2"),
                                     ("0000:0000:0000:0000:0000:0000:0000:0000", "")]):
        open(os.path.join(port, "gids", str(i)), "w").write(gid + "\n")
        open(os.path.join(port, "gid_attrs", "types", str(i)), "w").write(kind + "\n")
    bond = next(p for p in PortSource(h100_ib_root).read(0.0) if p["nic"] == "mlx5_bond_0/1")
    assert bond["gids"] == 2 and bond["roce_v2_gids"] == 1
    os.unlink(os.path.join(port, "gids", "1"))  # the RoCE v2 entry vanished (an IP change gone wrong)
    bond = next(p for p in PortSource(h100_ib_root).read(0.0) if p["nic"] == "mlx5_bond_0/1")
    assert bond["gids"] == 1 and bond["roce_v2_gids"] == 0


def test_ethernet_ports_of_a_real_sys_tree(node_exporter_root: str) -> None:
    ports = {p["nic"]: p for p in PortSource(node_exporter_root).read(0.0)}
    # eth0 sits under PCI device 0000:03:00.0 (1 Gb/s, up); the bond, dmz and int are virtual
    assert ports["eth0"] == {"nic": "eth0", "link_up": True, "link_layer": "Ethernet", "speed_mbps": 1000.0,
                             "rdma": False}
    assert not any(n in ports for n in ("bond0", "dmz", "int", "bonding_masters"))
    valid({"ports": list(ports.values())})


def test_link_mode_masks_decode_to_speeds() -> None:
    from whywait.agents.collectors.ports import fastest_mode

    assert fastest_mode([1 << 5, 0, 0, 0]) == 1000                      # 1000baseT_Full
    assert fastest_mode([0, 1 << (38 - 32), 0, 0]) == 100_000           # 100000baseCR4_Full
    assert fastest_mode([0, 0, 1 << (89 - 64), 0]) == 400_000           # 400000baseCR4_Full
    assert fastest_mode([1 << 13 | 1 << 6, 1 << (49 - 32), 0, 0]) is None  # pause, autoneg, FEC: no speed
    assert fastest_mode([0, 0, 0, 1 << (121 - 96)]) == 1_600_000


def test_the_driver_query_on_this_host_never_raises() -> None:
    from whywait.agents.collectors.ports import link_modes

    assert link_modes("no-such-if0") is None
    for name in os.listdir("/sys/class/net"):
        got = link_modes(name)  # a virtual NIC says nothing (None or no modes); a real one gives speeds
        assert got is None or all(v is None or v >= 10 for v in got)


def test_ports_carry_the_driver_modes_on_this_host() -> None:
    calls: list[str] = []

    def fake(ifname: str) -> tuple[int | None, int | None]:
        calls.append(ifname)
        return 100_000, 25_000

    ports = PortSource("/", link_modes=fake).read(0.0)
    eth = [p for p in ports if p["nic"] in calls]
    assert all(p["speed_max_mbps"] == 100_000.0 and p["speed_common_max_mbps"] == 25_000.0 for p in eth)
    valid({"ports": ports})


# --- the kernel log ------------------------------------------------------------------------------

def test_records_parse() -> None:
    assert parse_record("6,3964,206764307,-;nvidia-nvswitch2: open (major=510)") == (
        6, 3964, 206764307, "nvidia-nvswitch2: open (major=510)")
    assert parse_record("4,12,5,-;line one\n SUBSYSTEM=pci\n") == (4, 12, 5, "line one")
    assert parse_record("garbage") is None and parse_record("a,b,c;x") is None


def test_real_kernel_lines_are_classified() -> None:
    lines = open(fixture_path("kmsg", "kernel-lines.txt")).read().splitlines()
    got = [(classify(ln) or {}).get("class") for ln in lines]
    assert got == ["fs_error", "fs_error", "fs_readonly", None,
                   "pcie_aer", None, None, None,
                   None, "mce", "mce", None, None,
                   "hung_task", None, None,
                   "nic_fw", "nic_fw"]
    assert classify(lines[2])["device"] == "sdb7"
    assert classify(lines[4])["device"] == "0000:00:1b.4"
    assert classify(lines[16])["device"] == "0000:0d:00.0"


def test_xid_line_of_a_real_h100_dmesg() -> None:
    found = [c for c in map(classify, open(fixture_path("kmsg", "dmesg-with-xid-119.log"))) if c]
    # five XID 119s (GSP RPC timeouts, raised while nvidia-smi and gpud waited on the GPU), nothing else
    assert found == [{"class": "xid", "device": "0000:9b:00.0", "code": 119}] * 5


def test_a_quiet_real_kmsg_reports_nothing() -> None:
    # gpud's captures: nvswitch opens, link-ready notices, nvidia-peermem complaints; none is hardware.
    for name in ("kmsg.1.log", "kmsg.2.peermem.log"):
        for raw in open(fixture_path("kmsg", name)).read().splitlines():
            rec = parse_record(raw)
            assert rec is not None, raw
            assert classify(rec[3]) is None, raw


def _kmsg_root(tmp_path: Any, boot: str = "boot-a") -> str:
    root = str(tmp_path / "root")
    os.makedirs(os.path.join(root, "dev"), exist_ok=True)
    os.makedirs(os.path.join(root, "proc", "sys", "kernel", "random"), exist_ok=True)
    shutil.copy(fixture_path("kmsg", "kmsg.1.log"), os.path.join(root, "dev", "kmsg"))
    with open(os.path.join(root, "dev", "kmsg"), "a") as fh:
        fh.write("\n")  # the capture's last record has no newline; the records appended next need one
    open(os.path.join(root, "proc", "sys", "kernel", "random", "boot_id"), "w").write(boot + "\n")
    open(os.path.join(root, "proc", "stat"), "w").write("cpu 1 2 3 4\nbtime 1764400000\n")
    return root


def _append(root: str, *records: str) -> None:
    with open(os.path.join(root, "dev", "kmsg"), "a") as fh:
        fh.write("".join(r + "\n" for r in records))


def test_kmsg_skips_history_reports_new_errors_and_never_twice_after_a_restart(tmp_path: Any) -> None:
    root = _kmsg_root(tmp_path)
    state = str(tmp_path / "state" / "kmsg.state")
    src = KmsgSource(root, state)
    assert src.available() is None
    assert src.read(0.0) == []  # the buffer's history (46 real records) is not news
    _append(root, "3,4100,238400000,-;EXT4-fs (sdb7): Remounting filesystem read-only",
            "6,4101,238400001,-;IPv6: ADDRCONF(NETDEV_CHANGE): eth0: link becomes ready")
    ev = src.read(1.0)
    assert [(e["seq"], e["class"], e["level"], e["device"]) for e in ev] == [(4100, "fs_readonly", 3, "sdb7")]
    assert ev[0]["logged_at"] == pytest.approx(1764400000 + 238.4)
    valid({"kernel": ev})
    src.close()
    # The agent restarts: the ring buffer still holds 4100; it must not be reported again.
    _append(root, "4,4102,238500000,-;mce: [Hardware Error]: CPU 0: Machine Check: 0 Bank 3: fe0000000000ffff")
    again = KmsgSource(root, state)
    assert again.available() is None
    assert [(e["seq"], e["class"]) for e in again.read(2.0)] == [(4102, "mce")]
    again.close()


def test_kmsg_after_a_reboot_reports_the_new_boot_from_its_start(tmp_path: Any) -> None:
    root = _kmsg_root(tmp_path)
    state = str(tmp_path / "kmsg.state")
    src = KmsgSource(root, state)
    src.available()
    src.read(0.0)
    src.close()
    root2 = _kmsg_root(tmp_path / "b", boot="boot-b")
    with open(os.path.join(root2, "dev", "kmsg"), "w") as fh:  # a new boot: sequence numbers start again
        fh.write("3,5,1000000,-;INFO: task kworker/u16:9:7088 blocked for more than 120 seconds.\n")
    after = KmsgSource(root2, state)
    after.available()
    assert [(e["seq"], e["class"]) for e in after.read(1.0)] == [(5, "hung_task")]


@pytest.mark.parametrize("flags, where", [(["--state-dir", "{tmp}/state"], "{tmp}/state/kmsg.state"),
                                          (["--spool-dir", "{tmp}/spool"], "{tmp}/spool/kmsg.state")])
def test_the_agent_writes_its_state_only_where_it_was_told(tmp_path: Any, flags: list[str], where: str) -> None:
    # An operator running the agent as an ordinary user with --state-dir (or only --spool-dir) expects
    # nothing written elsewhere: the kernel log's place had gone to /var/lib/whywait or ~/.cache.
    import subprocess
    import sys

    root = _kmsg_root(tmp_path)
    home = tmp_path / "home"
    home.mkdir()
    tmp = str(tmp_path)
    env = {k: v for k, v in os.environ.items() if k != "WHYWAIT_STATE_DIR"}
    env["HOME"] = str(home)
    cmd = [sys.executable, "-m", "whywait", "agent", "--print", "--rounds", "1", "--collectors", "hw",
           "--root", root, "--interval", "0.05", *[f.format(tmp=tmp) for f in flags]]
    out = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    state = where.format(tmp=tmp)
    assert os.path.isfile(state), (os.listdir(tmp), out.stderr)
    assert json.load(open(state))["boot_id"] == "boot-a"
    assert list(home.iterdir()) == []  # nothing under ~/.cache


def test_kmsg_reads_are_bounded(tmp_path: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    import whywait.agents.collectors.kmsg as kmsg

    monkeypatch.setattr(kmsg, "MAX_EVENTS", 3)
    root = _kmsg_root(tmp_path)
    src = KmsgSource(root)
    src.available()
    src.read(0.0)
    _append(root, *(f"4,{5000 + i},1,-;pcieport 0000:00:1b.4: PCIe Bus Error: severity=Corrected, type=Physical"
                    for i in range(10)))
    assert len(src.read(1.0)) == 3 and src.skipped == 7


def test_kmsg_without_permission_is_off_with_a_reason(tmp_path: Any) -> None:
    why = KmsgSource(str(tmp_path)).available()
    assert why is not None and why.startswith("cannot open ") and "dev/kmsg" in why


# --- the BMC --------------------------------------------------------------------------------------

def test_ipmitool_sdr_of_a_real_proliant_with_a_failed_psu() -> None:
    sensors = parse_sdr(open(fixture_path("ipmitool", "proliant-dl360-sdr-elist-full.txt")).read())
    by = {s["name"]: s for s in sensors}
    assert by["Power Supply 1"] == {"name": "Power Supply 1", "type": "psu", "health": "critical", "context": "psu",
                                    "reading": 0.0, "unit": "W", "note": "Failure detected"}
    assert by["Power Supply 2"]["health"] == "ok" and by["Power Supply 2"]["reading"] == 95.0
    assert by["Power Supplies"]["type"] == "redundancy" and by["Power Supplies"]["health"] == "warning"
    assert by["Power Supplies"]["note"] == "Non-Redundant"
    assert by["Fans"]["type"] == "redundancy" and by["Fans"]["health"] == "ok"
    assert by["Fan Block 1"] == {"name": "Fan Block 1", "type": "fan", "health": "ok", "reading": 21.56, "unit": "%"}
    assert by["Temp 1"]["context"] == "inlet" and by["Temp 1"]["reading"] == 20.0  # entity 64: air inlet
    assert "Temp 4" not in by  # ns: no reading
    assert by["Power Meter"]["type"] == "power" and by["Power Meter"]["reading"] == 100.0
    assert "VRM 1" not in by and "Memory" not in by
    valid({"bmc": sensors})


def _mockup_dir() -> str:
    return fixture_path("redfish", "public-rackmount1")


def test_redfish_mockup_parses() -> None:
    thermal = parse_thermal(json.load(open(os.path.join(_mockup_dir(), "Chassis", "1U", "Thermal", "index.json"))))
    by = {s["name"]: s for s in thermal}
    assert by["Chassis Intake Temp"] == {"name": "Chassis Intake Temp", "type": "temperature", "health": "ok",
                                         "context": "inlet", "reading": 25.0, "unit": "°C"}
    assert "CPU2 Temp" not in by  # disabled
    assert by["BaseBoard System Fan"]["reading"] == 2100.0 and by["BaseBoard System Fan"]["unit"] == "RPM"
    assert by["BaseBoard System Fans"]["type"] == "redundancy" and by["BaseBoard System Fans"]["health"] == "ok"
    power = parse_power(json.load(open(os.path.join(_mockup_dir(), "Chassis", "1U", "Power", "index.json"))))
    psu = next(s for s in power if s["type"] == "psu")
    assert psu["health"] == "warning" and psu["reading"] == 325.0 and psu["note"] == "Status.Health Warning"
    assert next(s for s in power if s["type"] == "power")["reading"] == 344.0


def test_redfish_thresholds_escalate_a_reading_the_bmc_still_calls_ok() -> None:
    doc = {"Temperatures": [{"Name": "Inlet", "ReadingCelsius": 43, "UpperThresholdNonCritical": 35,
                             "UpperThresholdCritical": 42, "Status": {"State": "Enabled", "Health": "OK"}}],
           "Fans": [{"Name": "Fan 3", "Reading": 0, "ReadingUnits": "RPM", "LowerThresholdCritical": 500,
                     "Status": {"State": "Enabled", "Health": "OK"}}]}
    by = {s["name"]: s for s in parse_thermal(doc)}
    assert by["Inlet"]["health"] == "critical" and by["Inlet"]["context"] == "inlet"
    assert by["Fan 3"]["health"] == "critical"


class _MockupHandler(http.server.BaseHTTPRequestHandler):
    """Serves a Redfish mockup folder the way DMTF's mockup server does: ``/redfish/v1/X`` → ``X/index.json``."""

    root = ""
    auth = ""

    def do_GET(self) -> None:  # noqa: N802 - http.server's name
        if self.headers.get("Authorization") != self.auth:
            self.send_response(401)
            self.end_headers()
            return
        rel = self.path.split("#")[0].removeprefix("/redfish/v1").strip("/")
        path = os.path.join(self.root, rel, "index.json")
        if not os.path.isfile(path):
            self.send_response(404)
            self.end_headers()
            return
        body = open(path, "rb").read()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args: Any) -> None:
        pass


@pytest.fixture()
def redfish_url() -> Iterator[str]:
    handler = type("H", (_MockupHandler,), {"root": _mockup_dir(),
                                            "auth": "Basic " + base64.b64encode(b"whywait:s3cret").decode()})
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    t = threading.Thread(target=server.serve_forever, daemon=True)
    t.start()
    yield f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()
    server.server_close()


def test_redfish_over_http_with_credentials_from_a_file(redfish_url: str, tmp_path: Any) -> None:
    pw = tmp_path / "bmc-password"
    pw.write_text("s3cret\n")
    src = BmcSource(env={"WHYWAIT_BMC_URL": redfish_url, "WHYWAIT_BMC_USERNAME": "whywait",
                         "WHYWAIT_BMC_PASSWORD_FILE": str(pw)}, poll_s=3600)
    src.fetch = None
    assert src._configure() is None and src.via.startswith("Redfish at ")
    src.poll()
    sensors = src.read(0.0)
    assert sensors is not None and src.read(0.0) is None  # each poll's result is handed out once
    kinds = sorted({s["type"] for s in sensors})
    assert kinds == ["fan", "power", "psu", "redundancy", "temperature"]
    assert any(s["type"] == "psu" and s["health"] == "warning" for s in sensors)
    valid({"bmc": sensors})


def test_redfish_wrong_password_is_one_line_and_counted(redfish_url: str, tmp_path: Any,
                                                        caplog: pytest.LogCaptureFixture) -> None:
    src = BmcSource(fetch=RedfishClient(redfish_url, "whywait", "wrong", timeout=2).sensors, poll_s=3600)
    with caplog.at_level(logging.WARNING, logger="whywait.agent"):
        src.poll()
        src.poll()
    assert src.errors == 2 and src.read(0.0) is None
    assert src.last_error == f"GET {redfish_url}/redfish/v1/Chassis: HTTP 401 Unauthorized"
    assert len([r for r in caplog.records if "bmc:" in r.getMessage()]) == 1  # said once, not every poll


def test_bmc_without_configuration_is_off_with_a_reason(tmp_path: Any) -> None:
    why = BmcSource(str(tmp_path), env={}).available()
    assert why is not None and "WHYWAIT_BMC_URL" in why
    assert "WHYWAIT_BMC_PASSWORD_FILE" in (BmcSource(env={"WHYWAIT_BMC_URL": "https://x",
                                                          "WHYWAIT_BMC_USERNAME": "u"}).available() or "")


def test_bmc_poll_interval_from_the_environment_is_checked() -> None:
    assert BmcSource(env={"WHYWAIT_BMC_POLL_S": "15"}).poll_s == 15.0
    assert BmcSource(env={"WHYWAIT_BMC_POLL_S": "0.1"}).available() == (
        "WHYWAIT_BMC_POLL_S must be seconds between 1 and 3600 (got '0.1')")


def test_bmc_polls_in_the_background_so_a_slow_bmc_never_blocks_the_round() -> None:
    gate = threading.Event()

    def slow() -> list[dict[str, Any]]:
        gate.wait(5)
        return [{"name": "Fan 1", "type": "fan", "health": "ok"}]

    src = BmcSource(fetch=slow, poll_s=3600)
    assert src.available() is None
    assert src.read(0.0) is None  # nothing yet, and the call did not wait
    gate.set()
    for _ in range(100):
        got = src.read(0.0)
        if got:
            break
        threading.Event().wait(0.02)
    assert got == [{"name": "Fan 1", "type": "fan", "health": "ok"}]
    src.close()


# --- the collector ---------------------------------------------------------------------------------

def test_registry_and_collector_on_a_real_tree(node_exporter_root: str, caplog: pytest.LogCaptureFixture) -> None:
    assert COLLECTORS["hw"] is HardwareCollector
    with caplog.at_level(logging.INFO, logger="whywait.agent"):
        c = HardwareCollector(node_exporter_root, sources=[PcieSource(node_exporter_root),
                                                           PortSource(node_exporter_root),
                                                           KmsgSource(node_exporter_root),
                                                           BmcSource(node_exporter_root, env={})])
    assert c.enabled
    assert set(c.parts_off) == {"kernel", "bmc", "nvml"}
    lines = [r.getMessage() for r in caplog.records]
    assert any(m.startswith("HW collector: kernel off: cannot open") for m in lines)
    assert set(valid(c.collect(T0, 0.0))) == {"pcie", "ports"}  # the agent's priming call
    assert set(valid(c.collect(T0 + 1, 1.0))) == {"pcie", "ports"}  # the first message says everything
    assert c.collect(T0 + 2, 2.0) is None  # then nothing is due until 10 s later: no message
    assert set(valid(c.collect(T0 + 11, 11.0))) == {"pcie", "ports"}


def test_collector_with_nothing_to_read_turns_off_in_one_line(tmp_path: Any) -> None:
    c = HardwareCollector(str(tmp_path), sources=[PcieSource(str(tmp_path)), KmsgSource(str(tmp_path))])
    assert not c.enabled and c.off_reason.startswith("no source of hardware health here: pcie: no ")


def test_collector_publishes_nvml_health_and_gpu_throughput(node_exporter_root: str) -> None:
    from whywait.agents.collectors.gpu import NvmlCollector

    fake = FakeNvml([load_capture(fixture_path("nvidia-smi", "linux-x86_64__nvidia-h100-80gb-hbm3__590.48.01.txt"))])
    fake.row = 1
    gpu = NvmlCollector(nvml=fake)
    gpu.collect(T0, 0.0)
    c = HardwareCollector(node_exporter_root, sources=[], gpu=gpu)
    body = valid(c.collect(T0, 0.0))
    assert body["nvml"][0]["gpu"] == 0 and body["nvml"][0]["responsive"] is True
    assert body["nvml"][0]["calls"] > 0
    # No sysfs PCIe source here (a container without the host's /sys): NVML's link stands in.
    assert body["pcie"] == [{"device": "0000:00:09.0", "class": "gpu", "gpu": 0, "width": 16, "width_max": 16,
                             "gen": 5, "gen_max": 5, "tx_bytes_per_s": 3092 * 1024, "rx_bytes_per_s": 6346 * 1024}]
    # A sysfs GPU link gets NVML's throughput beside it.
    links = [{"device": "0000:00:09.0", "class": "gpu", "gpu": 0, "width": 16, "width_max": 16, "gen": 5,
              "gen_max": 5}]
    c._add_gpu_throughput(links)
    assert links[0]["tx_bytes_per_s"] == 3092 * 1024 and links[0]["rx_bytes_per_s"] == 6346 * 1024


def test_one_failing_source_does_not_silence_the_others(node_exporter_root: str) -> None:
    class Broken:
        name, every_s, errors = "bmc", 0.0, 0

        def available(self) -> str | None:
            return None

        def read(self, mono: float) -> list[dict[str, Any]]:
            raise ValueError("garbage from the BMC")

    c = HardwareCollector(node_exporter_root, sources=[Broken(), PortSource(node_exporter_root)])
    body = valid(c.collect(T0, 0.0))
    assert set(body) == {"ports"} and c.errors == 1


XID = "3,4200,238600000,-;NVRM: Xid (PCI:0000:3b:00): 48, pid=1234, An uncorrectable double bit error."


async def _first_round_kernel(root: str, state: str) -> list[dict[str, Any]]:
    from whywait.agents.agent import Agent
    from whywait.agents.collectors.hardware import HardwareCollector
    from whywait.agents.publisher import MemoryPublisher

    pub = MemoryPublisher()
    hw = HardwareCollector(root, state_path=state)
    await Agent("n1", [hw], pub, interval=0.05).run(rounds=1)
    return [e for m in pub.of_kind("hw") for e in m.get("kernel", [])]


async def test_kernel_records_logged_while_the_agent_was_down_are_published_in_its_first_round(
        tmp_path: Any) -> None:
    # Finding 1: the agent's priming call read them (moving the saved place past them) and threw them away.
    root = _kmsg_root(tmp_path)
    state = str(tmp_path / "state" / "kmsg.state")
    assert await _first_round_kernel(root, state) == []  # first start: the history is not news
    _append(root, XID)  # the agent is down
    got = await _first_round_kernel(root, state)
    assert [(e["seq"], e["class"], e.get("code")) for e in got] == [(4200, "xid", 48)]
    assert json.load(open(state))["seq"] >= 4200


async def test_the_new_boots_records_are_published_in_the_first_round_after_a_reboot(tmp_path: Any) -> None:
    root = _kmsg_root(tmp_path)
    state = str(tmp_path / "kmsg.state")
    assert await _first_round_kernel(root, state) == []
    root2 = _kmsg_root(tmp_path / "b", boot="boot-b")
    with open(os.path.join(root2, "dev", "kmsg"), "w") as fh:
        fh.write("3,5,1000000,-;INFO: task kworker/u16:9:7088 blocked for more than 120 seconds.\n")
    assert [(e["seq"], e["class"]) for e in await _first_round_kernel(root2, state)] == [(5, "hung_task")]


def test_once_print_shows_the_records_a_stopped_agent_has_not_sent_and_leaves_them_to_it(tmp_path: Any) -> None:
    """`agent --once --print` is a look: it prints the kernel records past the saved place, and does not
    move that place, so the agent publishes them when it starts again."""
    import subprocess
    import sys

    root = _kmsg_root(tmp_path)
    state_dir = str(tmp_path / "state")
    cmd = [sys.executable, "-m", "whywait", "agent", "--collectors", "hw", "--root", root, "--interval", "0.05",
           "--state-dir", state_dir, "--print"]
    subprocess.run([*cmd, "--rounds", "1"], capture_output=True, text=True, timeout=60, check=True)
    saved = open(os.path.join(state_dir, "kmsg.state")).read()
    _append(root, XID)
    out = subprocess.run([*cmd, "--once"], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    kernel = [e for line in out.stdout.splitlines() if '"kind":"hw"' in line
              for e in json.loads(line).get("kernel", [])]
    assert [(e["seq"], e["class"]) for e in kernel] == [(4200, "xid")]
    assert open(os.path.join(state_dir, "kmsg.state")).read() == saved  # the place is the agent's
    again = subprocess.run([*cmd, "--rounds", "1"], capture_output=True, text=True, timeout=60, check=True)
    assert '"seq":4200' in again.stdout
