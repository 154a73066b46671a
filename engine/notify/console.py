"""The console notifier: prints the plain-text preview of each diagnosis.

The default when no Slack token is configured (``make demo`` uses it), and the
sink of ``--dry-run``.
"""

from __future__ import annotations

import sys
import threading
from typing import TextIO

from whywait.engine.diagnosis import Diagnosis
from whywait.engine.notify.base import Notifier
from whywait.engine.notify.render import plain_text


class ConsoleNotifier(Notifier):
    """Writes each diagnosis to ``stream`` (stdout by default) as the message would read."""

    name = "console"

    def __init__(self, stream: TextIO | None = None, *, dashboard_url_template: str | None = None) -> None:
        self._stream = stream
        self._dashboard = dashboard_url_template
        self._lock = threading.Lock()
        self.sent: list[Diagnosis] = []  # what was printed, for tests and the demo's summary

    def notify(self, diagnosis: Diagnosis) -> None:
        text = plain_text(diagnosis, dashboard_url_template=self._dashboard)
        stream = self._stream or sys.stdout
        with self._lock:
            stream.write("─" * 72 + "\n" + text)
            stream.flush()
            self.sent.append(diagnosis)
