"""The notifier interface: where a :class:`~whywait.engine.diagnosis.Diagnosis` goes once it is made.

The engine calls :meth:`Notifier.notify` for every diagnosis the evaluator returns
(firing, updated, resolved) and :meth:`Notifier.close` at shutdown.  The registry of
notifier classes (``NOTIFIERS``) and the factory (``make_notifier``) are in
``engine/notify/__init__.py``.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from typing import ClassVar

from whywait.engine.diagnosis import Diagnosis


class Notifier(ABC):
    """Delivers diagnoses to one sink.

    ``notify`` must not block the stream for long: a notifier that talks to a remote
    service queues the work and delivers it in the background.  ``flush`` waits until
    what was queued has been delivered (or ``timeout`` passes) and returns whether it
    all was; ``close`` flushes briefly and releases resources.
    """

    name: ClassVar[str] = ""

    @abstractmethod
    def notify(self, diagnosis: Diagnosis) -> None:
        """Hand over one diagnosis (firing or resolved)."""

    def flush(self, timeout: float = 10.0) -> bool:
        """Deliver everything queued now (ignoring grouping delays); True when nothing is left."""
        return True

    def close(self) -> None:  # noqa: B027 - optional hook
        """Flush and release resources; the notifier is unusable afterwards."""

    def __enter__(self) -> Notifier:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
