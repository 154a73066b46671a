"""Network interfaces, InfiniBand/RoCE ports, TCP counters, and NIC↔GPU locality.

Sources:

* ``/proc/net/snmp`` (``Tcp: RetransSegs OutSegs``) and ``/proc/net/netstat``
  (``TcpExt: TCPTimeouts``).
* ``/sys/class/net/<if>/statistics/*``, ``carrier_changes``, ``operstate``,
  ``speed``; ``lo`` and interfaces without a device (bridges, veths, bonds'
  virtual parents) are left out unless ``include_virtual``.
* ``/sys/class/infiniband/<hca>/ports/<n>/counters`` and ``hw_counters``, named
  ``<hca>/<n>``.  ``port_xmit_data``/``port_rcv_data`` count 4-byte words (×4
  for bytes).  The PMA error counters saturate rather than wrap; a saturated
  one is named in the record's ``saturated`` list and reports no rate.
* Identity: each HCA's ``node_guid``, each port's GUID (the low 64 bits of
  ``ports/<n>/gids/0``) and each adapter's PCI address (its ``device`` link), so
  the engine can match the agent's ``mlx5_0/1`` to the fabric dump's ``HCA-1`` and
  to the PCI ids of an NCCL topology (``whywait.topology.reconcile``).
* Locality: each adapter's PCI ancestry (the resolved ``/sys/class/...``
  path) against each GPU's; a GPU is served by the adapter(s) sharing its
  deepest PCI bridge, or failing that its NUMA node.  GPU PCI addresses come
  from NVML when the agent has it, else from ``/sys/bus/pci/drivers/nvidia``.
"""

from __future__ import annotations

import os
import re
from typing import Any, Sequence

from whywait.agents.collectors.base import (
    MAX_MBPS,
    Collector,
    CollectorOff,
    parse_counter,
    parse_gbps,
    parse_int,
    parse_word,
)
from whywait.agents.collectors.base import read_text as _read
from whywait.agents.events import UNIT_BOUNDS
from whywait.agents.rates import RateTracker

_PCI_ADDR = re.compile(r"^[0-9a-f]{4}:[0-9a-f]{2}:[0-9a-f]{2}\.[0-7]$")

# IB counter -> (bit width, saturating).  Widths from the IBA PortCounters
# attribute; the data/packet counters come from PortCountersExtended (64-bit).
_IB_COUNTERS: dict[str, tuple[int, bool]] = {
    "port_rcv_data": (64, False),
    "port_xmit_data": (64, False),
    "port_rcv_packets": (64, False),
    "port_xmit_packets": (64, False),
    "port_rcv_errors": (16, True),
    "port_xmit_discards": (16, True),
    "port_xmit_constraint_errors": (8, True),
    "port_rcv_remote_physical_errors": (16, True),
    "symbol_error": (16, True),
    "link_downed": (8, True),
    "port_xmit_wait": (32, True),
}
# hw_counters worth a rate: drops for lack of receive buffers, and RoCE retransmission signs.
_IB_HW = ("out_of_buffer", "out_of_sequence", "local_ack_timeout_err", "packet_seq_err", "rnr_nak_retry_err",
          "roce_adp_retrans", "roce_slow_restart")
# Virtual interfaces left out (unless include_virtual) when they have no device behind them.
_VIRTUAL = re.compile(r"^(veth|docker|br-|virbr|cali|flannel|cni|vxlan|tun|tap|ifb|dummy|kube|lxc|genev|tunl|"
                      r"bonding_masters)")
_NET_STATS = ("rx_bytes", "tx_bytes", "rx_packets", "tx_packets", "rx_errors", "tx_errors", "rx_dropped",
              "tx_dropped")
# The highest rates the contract takes.  A counter that jumps further in one interval (a damaged or
# truncated file, then the whole one again) gives no rate that interval rather than a refused message.
_MAX_BYTES_S = UNIT_BOUNDS["bytes/s"][1]
_MAX_PER_S = min(UNIT_BOUNDS[u][1] for u in ("packets/s", "errors/s", "segments/s", "events/s", "ticks/s"))


def _max_rate(stat: str) -> float:
    return _MAX_BYTES_S if stat.endswith("bytes") else _MAX_PER_S


def normalise_pci(addr: str) -> str:
    """``00000000:83:00.0`` (NVML) or ``0000:83:00.0`` → ``0000:83:00.0``, lower case."""
    addr = addr.strip().lower()
    dom, _, rest = addr.partition(":")
    if not rest:
        return addr
    return f"{int(dom, 16):04x}:{rest}" if all(c in "0123456789abcdef" for c in dom) else addr


class NetworkCollector(Collector):
    """Samples interfaces and IB ports for a ``net`` message.

    ``gpu_bus_ids`` are the GPUs' PCI addresses in GPU-index order (from NVML);
    when None they are looked up under ``/sys/bus/pci/drivers/nvidia``.
    """

    name = "network"
    kind = "net"

    def __init__(self, root: str = "/", gpu_bus_ids: Sequence[str] | None = None,
                 include_virtual: bool = False) -> None:
        super().__init__(root)
        self.include_virtual = include_virtual
        self.rates = RateTracker()
        self._prev_mono: float | None = None
        self._gpu_bus_ids = [normalise_pci(b) for b in gpu_bus_ids] if gpu_bus_ids is not None else None
        self._locality: dict[str, list[int]] | None = None

    # --- TCP ---------------------------------------------------------------
    def _snmp(self, path: str, section: str, part: str) -> dict[str, int]:
        text = self.read(path, part=part)
        out: dict[str, int] = {}
        if text is None:
            return out
        header: list[str] | None = None
        for line in text.splitlines():
            name, _, rest = line.partition(":")
            if name != section:
                continue
            if header is None:
                header = rest.split()
                continue
            values = rest.split()
            if len(values) != len(header):
                self.errors += 1
                header = None
                continue
            for k, v in zip(header, values, strict=True):
                try:
                    out[k] = int(v)
                except ValueError:
                    self.errors += 1
            header = None
        return out

    # --- Ethernet ----------------------------------------------------------
    def _interfaces(self, mono: float, dt: float | None) -> list[dict[str, Any]]:
        base = self.path("/sys/class/net")
        try:
            names = sorted(os.listdir(base))
        except OSError as exc:
            self.part_off("interfaces", f"cannot list {base}: {exc.strerror or exc}")
            return []
        self.part_on("interfaces")
        out = []
        for name in names:
            d = os.path.join(base, name)
            if name == "lo" or not os.path.isdir(d):
                continue
            physical = os.path.exists(os.path.join(d, "device")) or bool(self._pci_chain(d))
            if not physical and not self.include_virtual and _VIRTUAL.match(name):
                continue
            u = self.rates.update
            r = {}
            for stat in _NET_STATS:
                raw = _read(os.path.join(d, "statistics", stat))
                if raw is None and stat == "rx_bytes":
                    break  # no statistics at all (a bare entry): not an interface we can follow
                v = parse_counter(raw)  # None: unreadable or damaged (-1, 2**70): no rate this interval
                if v is None:
                    self.errors += 1
                    v = -1
                r[stat] = u((name, stat), v, mono, max_rate=_max_rate(stat))
            if "rx_bytes" not in r:
                continue
            cc = parse_counter(_read(os.path.join(d, "carrier_changes")))
            carrier = u((name, "carrier_changes"), cc, mono) if cc is not None else None
            if dt is None or not r["rx_bytes"].ok:
                continue
            oper = parse_word(_read(os.path.join(d, "operstate")))
            speed = parse_int(_read(os.path.join(d, "speed")) or "")  # EINVAL when the link is down
            rec: dict[str, Any] = {
                "nic": name,
                "rx_bytes_per_s": _r(r["rx_bytes"].per_s),
                "tx_bytes_per_s": _r(r["tx_bytes"].per_s),
                "rx_packets_per_s": _r(r["rx_packets"].per_s),
                "tx_packets_per_s": _r(r["tx_packets"].per_s),
                "rx_errors_per_s": _r(r["rx_errors"].per_s),
                "tx_errors_per_s": _r(r["tx_errors"].per_s),
                "rx_drops_per_s": _r(r["rx_dropped"].per_s),
                "tx_drops_per_s": _r(r["tx_dropped"].per_s),
                "link_up": oper == "up",
                "operstate": oper or "unknown",
            }
            if speed is not None and 0 < speed <= MAX_MBPS:
                rec["speed_mbps"] = speed
            if carrier is not None and carrier.delta is not None:
                rec["carrier_changes"] = carrier.delta
            pci = self.pci_address(d)
            if pci:
                rec["pci_bus_id"] = pci
            gpus = self.locality().get(name)
            if gpus:
                rec["gpus"] = gpus
            out.append(rec)
        return out

    # --- InfiniBand --------------------------------------------------------
    def _infiniband(self, mono: float, dt: float | None) -> list[dict[str, Any]]:
        base = self.path("/sys/class/infiniband")
        try:
            hcas = sorted(os.listdir(base))
        except OSError as exc:
            self.part_off("infiniband", f"no {base} ({exc.strerror or exc})")
            return []
        self.part_on("infiniband")
        out = []
        for hca in hcas:
            ports_dir = os.path.join(base, hca, "ports")
            try:
                ports = sorted(os.listdir(ports_dir), key=lambda p: (len(p), p))
            except OSError:
                self.errors += 1
                continue
            node_guid = format_guid(_read(os.path.join(base, hca, "node_guid")) or "")
            pci = self.pci_address(os.path.join(base, hca))
            for port in ports:
                rec = self._ib_port(hca, port, os.path.join(ports_dir, port), mono, dt)
                if rec is not None:
                    if node_guid:
                        rec["node_guid"] = node_guid
                    port_guid = format_guid((_read(os.path.join(ports_dir, port, "gids", "0")) or "").strip()[-19:])
                    if port_guid:
                        rec["port_guid"] = port_guid
                    if pci:
                        rec["pci_bus_id"] = pci
                    out.append(rec)
        return out

    def _ib_port(self, hca: str, port: str, d: str, mono: float, dt: float | None) -> dict[str, Any] | None:
        nic = f"{hca}/{port}"
        u = self.rates.update
        r = {}
        saturated = []
        for counter, (width, sat) in _IB_COUNTERS.items():
            raw = _read(os.path.join(d, "counters", counter))
            if raw is None:
                continue
            v = parse_counter(raw)
            if v is None:  # damaged (-1, 2**70, truncated to nothing): no rate this interval
                self.errors += 1
                continue
            # A data counter without the extended attribute is 32 bits and saturates.
            if counter in ("port_rcv_data", "port_xmit_data", "port_rcv_packets", "port_xmit_packets") \
                    and v == 0xFFFFFFFF:
                width, sat = 32, True
            # port_*_data count 4-byte words: the contract's bytes/s bound is four times the words'.
            top = _MAX_BYTES_S / 4 if counter.endswith("_data") else _MAX_PER_S
            r[counter] = u((nic, counter), v, mono, width=width, saturating=sat, max_rate=top)
            if r[counter].flag == "saturated":
                saturated.append(counter)
        hw = {}
        for counter in _IB_HW:
            v = parse_counter(_read(os.path.join(d, "hw_counters", counter)))
            if v is not None:
                hw[counter] = u((nic, "hw", counter), v, mono, max_rate=_MAX_PER_S)
        if dt is None or "port_rcv_data" not in r:
            return None
        if all(not x.ok and x.flag == "first" for x in r.values()):
            return None

        def rate(c: str, scale: float = 1.0) -> float:
            x = r.get(c)
            return _r(x.per_s * scale) if x is not None and x.per_s is not None else 0.0

        def count(c: str) -> int | None:
            x = r.get(c)
            return x.delta if x is not None else None

        state = parse_word(_read(os.path.join(d, "state")))   # "4: ACTIVE"
        speed = parse_gbps(_read(os.path.join(d, "rate")))     # "400 Gb/sec (4X NDR)"
        rec: dict[str, Any] = {
            "nic": nic,
            "rx_bytes_per_s": rate("port_rcv_data", 4.0),
            "tx_bytes_per_s": rate("port_xmit_data", 4.0),
            "rx_packets_per_s": rate("port_rcv_packets"),
            "tx_packets_per_s": rate("port_xmit_packets"),
            "rx_errors_per_s": rate("port_rcv_errors"),
            "tx_errors_per_s": rate("port_xmit_constraint_errors"),
            "rx_drops_per_s": _r(hw["out_of_buffer"].per_s) if "out_of_buffer" in hw and hw["out_of_buffer"].ok
            else 0.0,
            "tx_drops_per_s": rate("port_xmit_discards"),
            "link_up": state.endswith("ACTIVE"),
            "state": state.partition(":")[2].strip() or state or "unknown",
            "link_layer": parse_word(_read(os.path.join(d, "link_layer"))) or "unknown",
        }
        if speed is not None:
            rec["speed_mbps"] = speed
        for field, counter in (("carrier_changes", "link_downed"), ("symbol_errors", "symbol_error")):
            c = count(counter)
            if c is not None:
                rec[field] = c
        if "port_xmit_wait" in r and r["port_xmit_wait"].per_s is not None:
            rec["xmit_wait_per_s"] = _r(r["port_xmit_wait"].per_s)
        for counter, x in hw.items():
            if x.delta is not None:
                rec[counter] = x.delta
        if saturated:
            rec["saturated"] = saturated
        gpus = self.locality().get(nic) or self.locality().get(hca)
        if gpus:
            rec["gpus"] = gpus
        return rec

    # --- locality ----------------------------------------------------------
    def _pci_chain(self, sysfs_entry: str) -> list[str]:
        """PCI addresses from the root complex down to the device behind a ``/sys/class`` entry."""
        real = os.path.realpath(sysfs_entry)
        return [p for p in real.split(os.sep) if _PCI_ADDR.match(p)]

    def pci_address(self, sysfs_entry: str) -> str | None:
        """The PCI address of the device behind a ``/sys/class/{net,infiniband}/<name>`` entry, or None.

        None for virtual interfaces and for captures without the ``device`` link.
        """
        chain = self._pci_chain(os.path.join(sysfs_entry, "device")) or self._pci_chain(sysfs_entry)
        return chain[-1] if chain else None

    def _numa(self, pci: str) -> int | None:
        return parse_int(_read(self.path(f"/sys/bus/pci/devices/{pci}/numa_node")) or "")

    def gpu_bus_ids(self) -> list[str]:
        """The GPUs' PCI addresses in index order (NVML's when given, else the nvidia driver's)."""
        if self._gpu_bus_ids is not None:
            return self._gpu_bus_ids
        try:
            found = [e for e in os.listdir(self.path("/sys/bus/pci/drivers/nvidia")) if _PCI_ADDR.match(e)]
        except OSError:
            found = []
        return sorted(found)

    def locality(self) -> dict[str, list[int]]:
        """``{nic or hca: [gpu index, ...]}``, computed once (PCI topology does not change)."""
        if self._locality is not None:
            return self._locality
        self._locality = {}
        gpus = self.gpu_bus_ids()
        if not gpus:
            return self._locality
        nics: dict[str, list[str]] = {}
        for cls in ("infiniband", "net"):
            base = self.path(f"/sys/class/{cls}")
            try:
                entries = os.listdir(base)
            except OSError:
                continue
            for e in entries:
                chain = self._pci_chain(os.path.join(base, e))
                if chain:
                    nics[e] = chain
        if not nics:
            return self._locality
        for idx, bus in enumerate(gpus):
            gchain = self._pci_chain(self.path(f"/sys/bus/pci/devices/{bus}")) or [bus]
            gnuma = self._numa(gchain[-1])
            best: tuple[int, int] = (0, 0)
            chosen: list[str] = []
            for nic, chain in nics.items():
                depth = 0
                for a, b in zip(chain, gchain, strict=False):
                    if a != b:
                        break
                    depth += 1
                same_numa = int(gnuma is not None and gnuma >= 0 and self._numa(chain[-1]) == gnuma)
                score = (depth, same_numa)
                if score == (0, 0):
                    continue
                if score > best:
                    best, chosen = score, [nic]
                elif score == best:
                    chosen.append(nic)
            for nic in chosen:
                self._locality.setdefault(nic, []).append(idx)
        return self._locality

    # --- the sample --------------------------------------------------------
    def sample(self, now: float, mono: float) -> dict[str, Any] | None:
        dt = None if self._prev_mono is None else mono - self._prev_mono
        self._prev_mono = mono
        tcp = self._snmp("/proc/net/snmp", "Tcp", "tcp counters")
        ext = self._snmp("/proc/net/netstat", "TcpExt", "tcp timeouts")
        u = self.rates.update
        # RateTracker refuses what no counter holds (a damaged file's -1 or 2**70) and, past max_rate,
        # a jump no interval can have.
        retrans = u("RetransSegs", tcp["RetransSegs"], mono, max_rate=_MAX_PER_S) if "RetransSegs" in tcp else None
        outsegs = u("OutSegs", tcp["OutSegs"], mono, max_rate=_MAX_PER_S) if "OutSegs" in tcp else None
        timeouts = u("TCPTimeouts", ext["TCPTimeouts"], mono, max_rate=_MAX_PER_S) if "TCPTimeouts" in ext else None
        nics = self._interfaces(mono, dt) + self._infiniband(mono, dt)
        self.rates.forget_missing()
        if {"interfaces", "infiniband", "tcp counters"} <= self.parts_off.keys():
            raise CollectorOff("no /sys/class/net, no /sys/class/infiniband and no /proc/net/snmp")
        if dt is None:
            return None
        body: dict[str, Any] = {
            "interval_s": round(dt, 6),
            "nics": nics,
            "tcp_retrans_segs_per_s": _r(retrans.per_s if retrans else None),
            "tcp_out_segs_per_s": _r(outsegs.per_s if outsegs else None),
        }
        if timeouts is not None and timeouts.per_s is not None:
            body["tcp_timeouts_per_s"] = _r(timeouts.per_s)
        return body


def format_guid(text: str) -> str | None:
    """``e09d:7303:0085:94c4`` (sysfs) → ``0xe09d7303008594c4``; None when absent or all zero (an unset GID)."""
    digits = "".join(c for c in text.strip().lower() if c in "0123456789abcdef")
    if len(digits) != 16 or int(digits, 16) == 0:
        return None
    return "0x" + digits



def _r(x: float | None) -> float:
    return 0.0 if x is None else round(x, 3)
