"""Where the notification pipeline remembers its incidents: a :class:`StateStore`.

One record per incident key (see ``whywait.engine.notify.pipeline.incidents.group_key``): the
findings it shows, what was last announced, every receiver's receipt (Slack's: the
channel and ``ts`` of its message), and its ack and timeline.  A restarted or
failed-over notifier loads the records and keeps editing the same messages instead of
posting duplicates; an incident a notifier opens itself is looked up with
:meth:`StateStore.current` before it is announced or saved, since another engine worker may
have announced it (the one whose job this worker just took over).

:class:`InMemoryStateStore` serves tests (share one instance to simulate a
restart) and single-shot runs; :class:`KafkaStateStore` keeps the records in the
compacted topic :data:`STATE_TOPIC`, keyed by incident key, tombstoned when an
incident is forgotten.
"""

from __future__ import annotations

import copy
import threading
from abc import ABC, abstractmethod
from typing import Any

STATE_TOPIC = "whywait.notify-state.v1"


class StateStore(ABC):
    """Incident records by key.  ``load`` is called once at start; ``put``/``delete`` on every change."""

    @abstractmethod
    def load(self) -> dict[str, dict[str, Any]]:
        """Every record stored, by key."""

    def current(self, keys: list[str]) -> dict[str, dict[str, Any]]:
        """The newest record of each of ``keys`` that has one, as the store holds it *now*: written by another
        engine worker since :meth:`load` included.  The notifier asks before it announces or saves an incident
        it opened itself, so a worker that took over a job edits the message the previous one posted."""
        records = self.load()
        return {k: records[k] for k in keys if k in records}

    @abstractmethod
    def put(self, key: str, record: dict[str, Any]) -> None:
        """Store ``record`` (JSON-ready) as the latest for ``key``."""

    @abstractmethod
    def delete(self, key: str) -> None:
        """Forget ``key``."""

    def close(self) -> None:  # noqa: B027 - optional hook
        """Release resources."""


class InMemoryStateStore(StateStore):
    """Records in a dict; a second notifier given the same instance sees the first one's state."""

    def __init__(self) -> None:
        self._records: dict[str, dict[str, Any]] = {}
        self._lock = threading.Lock()
        self.writes = 0  # for tests: how many puts and deletes happened

    def load(self) -> dict[str, dict[str, Any]]:
        with self._lock:
            return copy.deepcopy(self._records)

    def put(self, key: str, record: dict[str, Any]) -> None:
        with self._lock:
            self._records[key] = copy.deepcopy(record)
            self.writes += 1

    def delete(self, key: str) -> None:
        with self._lock:
            self._records.pop(key, None)
            self.writes += 1


class KafkaStateStore(StateStore):
    """Records in the compacted topic :data:`STATE_TOPIC` (created on first use)."""

    def __init__(self, bootstrap: str, *, topic: str = STATE_TOPIC, timeout: float = 30.0,
                 read_timeout: float = 5.0) -> None:
        from whywait.engine.notify.kafka_kv import CompactedTopic

        self._table = CompactedTopic(bootstrap, topic, follow=False, client_id="whywait-notify-state")
        self._timeout = timeout
        self._read_timeout = read_timeout  # current(): the scheduler waits on it, as on a put
        self._loaded = False

    def load(self) -> dict[str, dict[str, Any]]:
        if not self._loaded:
            self._table.start(timeout=self._timeout)
            self._loaded = True
        return self._table.snapshot()

    def current(self, keys: list[str]) -> dict[str, dict[str, Any]]:
        """Read the topic up to its end offsets now (the table stops at those of its start), then look."""
        self.load()
        table = self._table.read_to_end(timeout=self._read_timeout)
        return {k: table[k] for k in keys if k in table}

    def put(self, key: str, record: dict[str, Any]) -> None:
        self.load()
        self._table.put(key, record)

    def delete(self, key: str) -> None:
        self.load()
        self._table.put(key, None)

    def close(self) -> None:
        self._table.close()
