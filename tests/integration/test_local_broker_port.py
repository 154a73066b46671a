"""A restarted local broker (``whywait kafka start`` without ``--port``) comes back on the same port."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from whywait.engine.localkafka import broker as lb

pytestmark = pytest.mark.integration


def test_restarted_detached_broker_keeps_its_port(tmp_path: Path) -> None:
    real = lb.libs_dir().parent
    if not lb.jars_fetched():
        pytest.skip("no Kafka jars in the cache (`whywait kafka fetch`)")
    cache = tmp_path / "cache"
    cache.mkdir()
    os.symlink(real, cache / real.name)  # the jars, without fetching them again
    first = lb.LocalBroker(cache, detached=True)
    try:
        bootstrap = first.start(timeout=90, quiet=True)
        port = first.port
        assert port is not None and not lb.in_ephemeral_range(port)
    finally:
        first.stop()
    assert not lb.probe(bootstrap, timeout=0.5)
    second = lb.LocalBroker(cache, detached=True)
    try:
        assert second.start(timeout=90, quiet=True) == bootstrap
    finally:
        second.stop()
