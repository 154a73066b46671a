from __future__ import annotations

import logging
import os
import shutil

import pytest
from whywait.agents.collectors.network import NetworkCollector, normalise_pci
from whywait.agents.events import TOPIC_NET, envelope, validate

T0 = 1_764_442_800.0


def check(body: dict | None) -> dict:
    assert body is not None
    validate(envelope("net", "node-01", T0, **body), TOPIC_NET)
    return body


def bump(path: str, by: int) -> None:
    with open(path) as fh:
        v = int(fh.read().strip())
    with open(path, "w") as fh:
        fh.write(f"{v + by}\n")


def set_value(path: str, value: int) -> None:
    with open(path, "w") as fh:
        fh.write(f"{value}\n")


def bump_snmp(path: str, section: str, field: str, by: int) -> None:
    lines = open(path).read().splitlines()
    for i, line in enumerate(lines):
        if line.startswith(section + ":") and i + 1 < len(lines) and lines[i + 1].startswith(section + ":"):
            header, values = line.split()[1:], lines[i + 1].split()
            k = header.index(field) + 1
            values[k] = str(int(values[k]) + by)
            lines[i + 1] = " ".join(values)
            break
    open(path, "w").write("\n".join(lines) + "\n")


@pytest.fixture()
def ne_root(node_exporter_root: str, tmp_path: "os.PathLike[str]") -> str:
    """A writable copy of node_exporter's tree, with the class/net link a real sysfs has for ens10f0."""
    root = os.path.join(str(tmp_path), "ne")
    shutil.copytree(node_exporter_root, root, symlinks=True)
    os.symlink("../../devices/pci0000:40/0000:40:01.3/0000:45:00.0/net/ens10f0",
               os.path.join(root, "sys/class/net/ens10f0"))
    return root


def test_tcp_counters_from_node_exporter_proc(ne_root: str) -> None:
    c = NetworkCollector(ne_root)
    assert c.collect(T0, 0.0) is None  # a rate needs two readings
    bump_snmp(os.path.join(ne_root, "proc/net/snmp"), "Tcp", "RetransSegs", 40)
    bump_snmp(os.path.join(ne_root, "proc/net/snmp"), "Tcp", "OutSegs", 2000)
    bump_snmp(os.path.join(ne_root, "proc/net/netstat"), "TcpExt", "TCPTimeouts", 6)
    body = check(c.collect(T0 + 2, 2.0))
    assert body["tcp_retrans_segs_per_s"] == 20.0 and body["tcp_out_segs_per_s"] == 1000.0
    assert body["tcp_timeouts_per_s"] == 3.0 and body["interval_s"] == 2.0


def test_ethernet_statistics_operstate_speed_and_flaps(ne_root: str) -> None:
    c = NetworkCollector(ne_root)
    c.collect(T0, 0.0)
    d = os.path.join(ne_root, "sys/devices/pci0000:40/0000:40:01.3/0000:45:00.0/net/ens10f0")
    bump(os.path.join(d, "statistics/rx_bytes"), 125_000_000)
    bump(os.path.join(d, "statistics/tx_dropped"), 7)
    bump(os.path.join(d, "carrier_changes"), 2)
    nics = {n["nic"]: n for n in check(c.collect(T0 + 1, 1.0))["nics"]}
    e = nics["ens10f0"]
    assert e["rx_bytes_per_s"] == 125_000_000.0 and e["tx_drops_per_s"] == 7.0
    assert e["carrier_changes"] == 2 and e["link_up"] is True and e["speed_mbps"] == 1000
    assert "bond0" not in nics  # fixture entries without statistics are not interfaces we can follow


def test_h100_infiniband_ports(h100_ib_root: str) -> None:
    c = NetworkCollector(h100_ib_root)
    assert c.collect(T0, 0.0) is None
    base = os.path.join(h100_ib_root, "sys/class/infiniband")
    bump(os.path.join(base, "mlx5_0/ports/1/counters/port_xmit_data"), 1_000_000)  # words
    bump(os.path.join(base, "mlx5_0/ports/1/counters/port_xmit_wait"), 5000)
    bump(os.path.join(base, "mlx5_0/ports/1/counters/symbol_error"), 3)
    bump(os.path.join(base, "mlx5_4/ports/1/hw_counters/out_of_buffer"), 9)
    nics = {n["nic"]: n for n in check(c.collect(T0 + 1, 1.0))["nics"]}
    assert sorted(nics) == ["mlx5_0/1", "mlx5_1/1", "mlx5_4/1", "mlx5_5/1", "mlx5_6/1", "mlx5_7/1", "mlx5_8/1",
                            "mlx5_9/1", "mlx5_bond_0/1"]
    p = nics["mlx5_0/1"]
    assert p["tx_bytes_per_s"] == 4_000_000.0 and p["rx_bytes_per_s"] == 0.0  # 4-byte words → bytes
    assert p["xmit_wait_per_s"] == 5000.0 and p["symbol_errors"] == 3
    assert p["link_up"] is True and p["speed_mbps"] == 400_000.0 and p["link_layer"] == "InfiniBand"
    assert nics["mlx5_4/1"]["rx_drops_per_s"] == 9.0
    assert c.errors == 0


def test_saturated_ib_counter_is_flagged_not_a_rate(h100_ib_root: str) -> None:
    # gpud's capture has mlx5_1's 8-bit link_downed at 255: saturated.
    c = NetworkCollector(h100_ib_root)
    c.collect(T0, 0.0)
    wait = os.path.join(h100_ib_root, "sys/class/infiniband/mlx5_0/ports/1/counters/port_xmit_wait")
    set_value(wait, 0xFFFFFFFF)
    nics = {n["nic"]: n for n in check(c.collect(T0 + 1, 1.0))["nics"]}
    assert nics["mlx5_1/1"]["saturated"] == ["link_downed"] and "carrier_changes" not in nics["mlx5_1/1"]
    assert nics["mlx5_0/1"]["saturated"] == ["port_xmit_wait"] and "xmit_wait_per_s" not in nics["mlx5_0/1"]


def test_ib_counter_reset_is_not_negative(h100_ib_root: str) -> None:
    c = NetworkCollector(h100_ib_root)
    c.collect(T0, 0.0)
    set_value(os.path.join(h100_ib_root, "sys/class/infiniband/mlx5_0/ports/1/counters/port_rcv_data"), 250)
    p = {n["nic"]: n for n in check(c.collect(T0 + 1, 1.0))["nics"]}["mlx5_0/1"]
    assert p["rx_bytes_per_s"] == 1000.0  # driver reload: counted from zero


def test_procfs_infiniband_mlx4_hfi1_mlx5(procfs_root: str) -> None:
    c = NetworkCollector(procfs_root)
    c.collect(T0, 0.0)
    nics = {n["nic"]: n for n in check(c.collect(T0 + 1, 1.0))["nics"]}
    assert {"mlx4_0/1", "mlx4_0/2", "hfi1_0/1", "mlx5_0/1"} <= set(nics)
    assert nics["mlx4_0/1"]["speed_mbps"] == 40_000.0 and nics["hfi1_0/1"]["speed_mbps"] == 100_000.0


def test_malformed_snmp_line_is_skipped_and_counted(tmp_path: "os.PathLike[str]") -> None:
    root = str(tmp_path)
    os.makedirs(os.path.join(root, "proc/net"))
    open(os.path.join(root, "proc/net/snmp"), "w").write(
        "Tcp: RetransSegs OutSegs\nTcp: 5\nTcp: RetransSegs OutSegs\nTcp: 7 9\n")
    c = NetworkCollector(root)
    c.collect(T0, 0.0)
    assert c.errors == 1 and c.enabled


def test_nothing_readable_turns_the_collector_off(tmp_path: "os.PathLike[str]",
                                                  caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, "whywait.agent")
    c = NetworkCollector(str(tmp_path))
    assert c.collect(T0, 0.0) is None and not c.enabled
    assert c.collect(T0 + 1, 1.0) is None
    off = [r.getMessage() for r in caplog.records if "collector off" in r.getMessage()]
    assert off == ["Network collector off: no /sys/class/net, no /sys/class/infiniband and no /proc/net/snmp"]


def make_pci_tree(root: str) -> None:
    """Two PCIe switches, each with one GPU and one ConnectX behind it (the DGX H100 layout)."""
    sw = {0: "0000:10:00.0/0000:11:00.0", 1: "0000:20:00.0/0000:21:00.0"}
    gpus = {0: "0000:12:00.0", 1: "0000:22:00.0"}
    nics = {0: "0000:13:00.0", 1: "0000:23:00.0"}
    for i in (0, 1):
        dom = f"pci0000:{'10' if i == 0 else '20'}"
        base = os.path.join(root, "sys/devices", dom, sw[i])
        gdir = os.path.join(base, gpus[i])
        ndir = os.path.join(base, nics[i], "infiniband", f"mlx5_{i}")
        os.makedirs(gdir)
        os.makedirs(os.path.join(ndir, "ports/1/counters"))
        for name, v in (("port_rcv_data", 1), ("port_xmit_data", 1)):
            set_value(os.path.join(ndir, "ports/1/counters", name), v)
        open(os.path.join(ndir, "ports/1/state"), "w").write("4: ACTIVE\n")
        for d, numa in ((gdir, 0), (os.path.dirname(os.path.dirname(ndir)), 0)):
            set_value(os.path.join(d, "numa_node"), numa)
        os.makedirs(os.path.join(root, "sys/class/infiniband"), exist_ok=True)
        os.makedirs(os.path.join(root, "sys/bus/pci/devices"), exist_ok=True)
        os.makedirs(os.path.join(root, "sys/bus/pci/drivers/nvidia"), exist_ok=True)
        os.symlink(os.path.relpath(ndir, os.path.join(root, "sys/class/infiniband")),
                   os.path.join(root, "sys/class/infiniband", f"mlx5_{i}"))
        for pci, d in ((gpus[i], gdir), (nics[i], os.path.dirname(os.path.dirname(ndir)))):
            os.symlink(os.path.relpath(d, os.path.join(root, "sys/bus/pci/devices")),
                       os.path.join(root, "sys/bus/pci/devices", pci))
        os.symlink(os.path.relpath(gdir, os.path.join(root, "sys/bus/pci/drivers/nvidia")),
                   os.path.join(root, "sys/bus/pci/drivers/nvidia", gpus[i]))


@pytest.mark.parametrize("from_nvml", [True, False])
def test_nic_gpu_locality_from_pci_ancestry(tmp_path: "os.PathLike[str]", from_nvml: bool) -> None:
    root = str(tmp_path)
    make_pci_tree(root)
    ids = ["00000000:12:00.0", "00000000:22:00.0"] if from_nvml else None  # NVML's spelling
    c = NetworkCollector(root, gpu_bus_ids=ids)
    assert c.locality() == {"mlx5_0": [0], "mlx5_1": [1]}
    c.collect(T0, 0.0)
    nics = {n["nic"]: n for n in check(c.collect(T0 + 1, 1.0))["nics"]}
    assert nics["mlx5_0/1"]["gpus"] == [0] and nics["mlx5_1/1"]["gpus"] == [1]


def test_normalise_pci() -> None:
    assert normalise_pci("00000000:83:00.0") == "0000:83:00.0"
    assert normalise_pci("0000:3B:00.0") == "0000:3b:00.0"


def test_live_on_this_machine() -> None:
    c = NetworkCollector("/", include_virtual=True)
    c.collect()
    import time

    time.sleep(0.2)
    body = check(c.collect())
    assert body["tcp_out_segs_per_s"] >= 0 and c.enabled
    assert all(n["rx_bytes_per_s"] >= 0 for n in body["nics"])


def test_h100_adapters_report_guids_and_pci_addresses(tmp_path: "os.PathLike[str]") -> None:
    # The real capture plus what a real sysfs has beside it (node_guid, gids/0, the device link):
    # the identities the engine matches to a fabric dump's HCA-<n> and to NCCL's PCI ids.
    from tests.support.real_h100 import DUMP_GUIDS, NDV5_NIC_PCI, h100_root

    root = h100_root(tmp_path)
    c = NetworkCollector(root)
    c.collect(T0, 0.0)
    nics = {n["nic"]: n for n in check(c.collect(T0 + 1, 1.0))["nics"]}
    assert nics["mlx5_0/1"]["node_guid"] == "0x" + DUMP_GUIDS["mlx5_0"]
    assert nics["mlx5_0/1"]["port_guid"] == "0x" + DUMP_GUIDS["mlx5_0"]
    assert nics["mlx5_5/1"]["pci_bus_id"] == NDV5_NIC_PCI["mlx5_5"] == "0106:00:00.0"
    # Adapters the capture has no identity for report none rather than a made-up one.
    assert "node_guid" not in nics["mlx5_8/1"] and "pci_bus_id" not in nics["mlx5_bond_0/1"]


def test_unset_gid_is_not_a_guid() -> None:
    from whywait.agents.collectors.network import format_guid

    assert format_guid("0000:0000:0000:0000") is None and format_guid("") is None
    assert format_guid("e09d:7303:0085:94c4\n") == "0xe09d7303008594c4"
