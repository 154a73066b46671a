"""The local Apache Kafka broker (jars from Maven Central) and how whywait finds a broker.

``resolve_bootstrap()`` and ``ensure_broker()`` are what the other commands use; see
:mod:`whywait.engine.localkafka.broker`.  Pure stdlib: importing this starts nothing.
"""

from whywait.engine.localkafka.broker import (
    BOOTSTRAP_ENV,
    KAFKA_VERSION,
    BrokerStartError,
    LocalBroker,
    ensure_broker,
    fetch_jars,
    resolve_bootstrap,
)

__all__ = ["BOOTSTRAP_ENV", "KAFKA_VERSION", "BrokerStartError", "LocalBroker", "ensure_broker", "fetch_jars",
           "resolve_bootstrap"]
