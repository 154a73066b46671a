"""The node agent's collectors, one module per source, and their registry.

:data:`COLLECTORS` maps the name used on the command line
(``--collectors gpu,network,storage,host,hw``) to the class; an unknown name is an
error listing the valid ones (:func:`collector_class`).  Every collector takes
a ``root`` path prefix for ``/proc`` and ``/sys`` so tests run it on fixtures.
"""

from __future__ import annotations

from whywait.agents.collectors.base import AgentConfigError, AgentError, Collector, CollectorOff
from whywait.agents.collectors.dcgm import DcgmCollector
from whywait.agents.collectors.gpu import NvmlCollector
from whywait.agents.collectors.hardware import HardwareCollector
from whywait.agents.collectors.host import HostCollector
from whywait.agents.collectors.network import NetworkCollector
from whywait.agents.collectors.storage import StorageCollector

COLLECTORS: dict[str, type[Collector]] = {
    "gpu": NvmlCollector,
    "dcgm": DcgmCollector,
    "network": NetworkCollector,
    "storage": StorageCollector,
    "host": HostCollector,
    "hw": HardwareCollector,
}


def collector_class(name: str) -> type[Collector]:
    """The collector registered as ``name``; :class:`AgentConfigError` naming the valid ones otherwise."""
    try:
        return COLLECTORS[name]
    except KeyError:
        raise AgentConfigError(f"unknown collector {name!r} (valid: {', '.join(COLLECTORS)})") from None


__all__ = ["COLLECTORS", "AgentConfigError", "AgentError", "Collector", "CollectorOff", "DcgmCollector",
           "HardwareCollector", "HostCollector", "NetworkCollector", "NvmlCollector", "StorageCollector",
           "collector_class"]
