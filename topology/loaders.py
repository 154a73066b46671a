"""Loaders of real fabric-topology formats into :class:`~topology.model.Topology` (filled in below)."""

from __future__ import annotations
