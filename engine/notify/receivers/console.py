"""The console receiver: prints each announcement as the message would read.

The default when no receiver is configured and no Slack token is set (``make demo``
uses it).  It goes through the same pipeline as the others, so the console shows
the same grouping: one block per incident when it is first announced, the incident
again when it changes (``update``), and the news lines (``reply``) indented below it.
"""

from __future__ import annotations

import sys
import threading
import time
from typing import Any, Callable, Mapping, TextIO

from whywait.engine.diagnosis import Diagnosis
from whywait.engine.notify.pipeline.config import PipelineConfig
from whywait.engine.notify.pipeline.core import Pipeline
from whywait.engine.notify.pipeline.receiver import Announcement, Receipt, Receiver
from whywait.engine.notify.render import plain_text


class ConsoleReceiver(Receiver):
    """Writes to ``stream`` (stdout by default); nothing to lose on restart, so no disk outbox."""

    name = "console"
    durable = False

    def __init__(self, stream: TextIO | None = None, *, dashboard_url_template: str | None = None) -> None:
        self._stream = stream
        self._dashboard = dashboard_url_template
        self._lock = threading.Lock()
        self.sent: list[Diagnosis] = []  # the incidents' views as printed (post and update), for tests and demos

    @classmethod
    def from_env(cls, env: Mapping[str, str]) -> ConsoleReceiver:
        """Stdout, with ``WHYWAIT_DASHBOARD_URL`` for the dashboard link."""
        return cls(dashboard_url_template=env.get("WHYWAIT_DASHBOARD_URL") or None)

    def send(self, announcement: Announcement) -> Receipt:
        """Print it; the receipt only says it was."""
        ann = announcement
        if ann.kind == "reply":
            text = "".join(f"  ↳ {line}\n" for line in ann.text.splitlines())
        else:
            n = len(ann.findings)
            grouped = f"({n} findings grouped)\n" if n > 1 else ""
            text = "─" * 72 + "\n" + grouped + plain_text(ann.view, dashboard_url_template=self._dashboard,
                                                            now=ann.now)
        stream = self._stream or sys.stdout
        with self._lock:
            stream.write(text)
            stream.flush()
            if ann.kind != "reply":
                self.sent.append(ann.view)
        return {"printed": True}  # stable: an unchanged receipt costs no state write


class ConsoleNotifier(Pipeline):
    """The pipeline with one :class:`ConsoleReceiver` and in-memory state (nothing to resume)."""

    name = "console"

    def __init__(self, stream: TextIO | None = None, *, dashboard_url_template: str | None = None,
                 config: PipelineConfig | None = None, clock: Callable[[], float] = time.time,
                 **kwargs: Any) -> None:
        self.receiver = ConsoleReceiver(stream, dashboard_url_template=dashboard_url_template)
        super().__init__([self.receiver], config or PipelineConfig(), clock=clock, **kwargs)

    @property
    def sent(self) -> list[Diagnosis]:
        """What was printed (each incident's view, at each post and update)."""
        return self.receiver.sent
