"""Session-wide fixtures: one real Kafka broker for the whole test run.

``kafka_bootstrap`` is ``$WHYWAIT_KAFKA_BOOTSTRAP`` when set; otherwise a
:class:`~whywait.engine.localkafka.broker.LocalBroker` (KRaft, 127.0.0.1, free ports, data in a
tmp dir) is started for the session and stopped at its end.  While it runs,
``WHYWAIT_KAFKA_BOOTSTRAP`` points at it, so code under test that calls
``resolve_bootstrap()`` finds it.  Every test marked ``integration`` gets the
fixture whether or not it asks for it.  Subfolders add their own conftest files.
"""

from __future__ import annotations

import functools
import logging
import os
import shutil
import tempfile
from typing import Any, Iterator

import pytest
from hypothesis import HealthCheck, settings

# Property tests check what the code does, never how fast: a per-example deadline (200 ms by default) and
# the "too slow" health check are timed assertions, and on a shared 2-core CI machine a GC pause or a busy
# neighbour makes one example slow now and then.  Speed is measured by the benchmarks instead.
settings.register_profile("whywait", deadline=None, suppress_health_check=[HealthCheck.too_slow])
settings.load_profile("whywait")

# The engine keeps faust's tables per consumer group, and the notifier its outbox, under $XDG_STATE_HOME
# (~/.local/state).  The tests' hundreds of throwaway groups had piled up there, and a test could read an
# outbox an earlier run left: each session gets a state folder of its own, removed at its end.
_STATE_HOME = tempfile.mkdtemp(prefix="whywait-test-state-")
os.environ["XDG_STATE_HOME"] = _STATE_HOME


def pytest_unconfigure(config: pytest.Config) -> None:
    shutil.rmtree(_STATE_HOME, ignore_errors=True)


@pytest.fixture(scope="session")
def kafka_bootstrap(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    from whywait.engine.localkafka import broker as lb

    env = os.environ.get(lb.BOOTSTRAP_ENV, "").strip()
    if env:
        yield env
        return
    if shutil.which("java") is None or not (lb.jars_fetched() or shutil.which("mvn")):
        why = f"no Kafka: set {lb.BOOTSTRAP_ENV}, or install java and mvn for the local broker"
        if os.environ.get("CI"):  # in CI a missing broker is a failure, never a quiet skip
            pytest.fail(why)
        pytest.skip(why)
    broker = lb.LocalBroker(detached=False)
    bootstrap = broker.start(data_dir=tmp_path_factory.mktemp("kafka-broker"))
    os.environ[lb.BOOTSTRAP_ENV] = bootstrap
    try:
        yield bootstrap
    finally:
        os.environ.pop(lb.BOOTSTRAP_ENV, None)
        broker.stop()


@pytest.fixture
def kafka_topic_factory(kafka_bootstrap: str) -> Any:
    """``await kafka_topic_factory(partitions=1, compacted=False, config=None, name=None) -> topic name``."""
    from tests.support.kafka import create_topic

    return functools.partial(create_topic, kafka_bootstrap)


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Tests marked ``integration`` all use the session broker (started before their first one)."""
    for item in items:
        names = getattr(item, "fixturenames", None)
        if item.get_closest_marker("integration") is not None and names is not None \
                and "kafka_bootstrap" not in names:
            names.append("kafka_bootstrap")


@pytest.fixture(autouse=True)
def _root_logging_restored() -> Iterator[None]:
    """Put the root logger's handlers and level back after each test.

    A test that runs the CLI's ``main()`` gets its ``configure_logging``: the root handlers replaced by a
    stream handler on the test's captured stderr, which pytest closes after the test.  A later record (an
    aiohttp task collected while another test ran) then printed "--- Logging error ---" and a traceback
    into the suite's output.
    """
    root = logging.getLogger()
    before, level = list(root.handlers), root.level
    yield
    root.handlers[:] = [h for h in root.handlers if h in before] + [h for h in before if h not in root.handlers]
    root.setLevel(level)
