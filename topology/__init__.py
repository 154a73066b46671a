"""The cluster topology: a pure networkx model, its YAML format and loaders of real fabric dumps.

Imports only the standard library, networkx and PyYAML, so the engine and the
tests can use it without Kafka, Slack or NVML (a test asserts that).
"""

from __future__ import annotations

from whywait.topology.errors import TopologyError, UnknownEntityError
from whywait.topology.model import JobInfo, Mount, Nic, Topology

__all__ = ["JobInfo", "Mount", "Nic", "Topology", "TopologyError", "UnknownEntityError"]
