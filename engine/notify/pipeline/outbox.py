"""The durable outbox: every delivery waits here, in order, until its receiver has taken it.

The pipeline's scheduler appends one item per receiver for each announcement (post,
edit or reply) and removes it once that receiver's ``send`` returns.  While a
receiver is down or rate-limiting, its items simply stay (the other receivers'
items are separate and go on); when it returns they go out in the order they were
queued (per incident lane).  With a folder the outbox is a JSON-lines log
(``outbox.jsonl``: ``{"add": item}`` and ``{"done": seq}`` records, each ``add``
fsync'd), so a restarted notifier resumes where the last one stopped; an exclusive
lock on ``outbox.lock`` keeps two notifiers from sharing one folder.
"""

from __future__ import annotations

import fcntl
import json
import logging
import os
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Literal

from whywait.engine.errors import NotifyError

from whywait import jsonl

log = logging.getLogger(__name__)

Kind = Literal["post", "update", "reply"]
_COMPACT_AFTER = 2000  # done records before the log is rewritten


@dataclass
class OutboxItem:
    """One delivery to one receiver.  ``post`` and ``update`` render the incident's current state
    when sent (so a late edit shows the latest state); ``reply`` carries its text, fixed when queued
    (``meta["lines"]`` holds the same as ``[kind, text]`` pairs for receivers that style them)."""

    seq: int
    kind: Kind
    key: str  # incident key
    lane: str  # ordering lane: the incident's routed channel
    created: float  # wall time queued (for the give-up age)
    text: str = ""
    blocks: list[dict[str, Any]] | None = None
    attempts: int = 0
    meta: dict[str, Any] = field(default_factory=dict)
    receiver: str = "slack"  # records written before there were several receivers were all Slack's

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


class OutboxBusy(NotifyError):
    """The outbox folder is locked by another notifier."""

    def __init__(self, message: str) -> None:
        super().__init__(message, retryable=False)


class Outbox:
    """Ordered pending deliveries; on disk under ``directory``, in memory when it is None."""

    def __init__(self, directory: Path | str | None = None, *, fsync: bool = True) -> None:
        self.directory = Path(directory) if directory is not None else None
        self._fsync = fsync
        self._items: dict[int, OutboxItem] = {}  # insertion-ordered
        self._next_seq = 1
        self._done_since_compact = 0
        self._log: Any = None
        self._lock_fd: int | None = None
        if self.directory is not None:
            self._open()

    # ---- persistence -----------------------------------------------------------------------

    @property
    def path(self) -> Path | None:
        return None if self.directory is None else self.directory / "outbox.jsonl"

    def _open(self) -> None:
        assert self.directory is not None
        try:
            self.directory.mkdir(parents=True, exist_ok=True)
            fd = os.open(self.directory / "outbox.lock", os.O_RDWR | os.O_CREAT, 0o600)
        except OSError as exc:
            raise NotifyError(f"cannot use the outbox folder {self.directory}: {exc.strerror or exc}",
                              retryable=False) from None
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = os.read(fd, 32).decode(errors="replace").strip() or "?"
            os.close(fd)
            raise OutboxBusy(f"the outbox {self.directory} is in use by another notifier (pid {holder}); "
                             "give each notifier its own WHYWAIT_NOTIFY_OUTBOX") from None
        os.ftruncate(fd, 0)
        os.pwrite(fd, str(os.getpid()).encode(), 0)
        self._lock_fd = fd
        assert self.path is not None
        if self.path.exists():
            self._replay(self.path)
        self._rewrite()

    def _replay(self, path: Path) -> None:
        with path.open("r", encoding="utf-8") as f:
            for n, line in enumerate(f, 1):
                line = line.strip()
                if not line:
                    continue
                try:
                    rec = jsonl.loads(line)
                    if "add" in rec:
                        item = OutboxItem(**rec["add"])
                        self._items[item.seq] = item
                        self._next_seq = max(self._next_seq, item.seq + 1)
                    elif "done" in rec:
                        self._items.pop(int(rec["done"]), None)
                except (json.JSONDecodeError, TypeError, ValueError, KeyError):
                    # a crash mid-write leaves a torn last line; everything before it is intact
                    log.warning("%s:%d: skipping a damaged outbox record", path, n)
        if self._items:
            log.info("outbox %s: %d notification(s) waiting from the last run", self.directory, len(self._items))

    def _rewrite(self) -> None:
        """Replace the log by the pending items alone (atomically)."""
        assert self.path is not None
        if self._log is not None:
            self._log.close()
        tmp = self.path.with_suffix(".tmp")
        with tmp.open("w", encoding="utf-8") as f:
            for item in self._items.values():
                f.write(json.dumps({"add": item.to_dict()}, separators=(",", ":")) + "\n")
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, self.path)
        self._log = self.path.open("a", encoding="utf-8")
        self._done_since_compact = 0

    def _write(self, rec: dict[str, Any], sync: bool) -> None:
        if self._log is None:
            return
        self._log.write(json.dumps(rec, separators=(",", ":")) + "\n")
        self._log.flush()
        if sync and self._fsync:
            os.fsync(self._log.fileno())

    # ---- the queue -------------------------------------------------------------------------

    def append(self, kind: Kind, key: str, lane: str, created: float, *, text: str = "",
               blocks: list[dict[str, Any]] | None = None, meta: dict[str, Any] | None = None,
               receiver: str, sync: bool = True) -> OutboxItem:
        """Queue a delivery for ``receiver``; durable when this returns (with ``sync=False``: once
        :meth:`sync` returns, so a batch costs one fsync)."""
        item = OutboxItem(seq=self._next_seq, kind=kind, key=key, lane=lane, created=created, text=text,
                          blocks=blocks, meta=dict(meta or {}), receiver=receiver)
        self._next_seq += 1
        self._items[item.seq] = item
        self._write({"add": item.to_dict()}, sync=sync)
        return item

    def sync(self) -> None:
        """Make every item appended so far durable (one fsync)."""
        if self._log is not None and self._fsync:
            self._log.flush()
            os.fsync(self._log.fileno())

    def done(self, seq: int) -> None:
        """Remove a delivered (or given-up) item."""
        if self._items.pop(seq, None) is None:
            return
        self._write({"done": seq}, sync=False)
        self._done_since_compact += 1
        if self._log is not None and (not self._items or self._done_since_compact >= _COMPACT_AFTER):
            self._rewrite()

    @classmethod
    def first_free(cls, directory: Path, *, tries: int = 16, fsync: bool = True) -> Outbox:
        """The outbox in ``directory``, or, while another notifier holds it, in the first free
        ``directory-N`` beside it (several notifiers on one machine sharing the default folder)."""
        for n in range(tries):
            candidate = directory if n == 0 else directory.with_name(f"{directory.name}-{n}")
            try:
                box = cls(candidate, fsync=fsync)
            except OutboxBusy:
                continue
            if n:
                log.info("outbox %s is in use; using %s", directory, candidate)
            return box
        raise OutboxBusy(f"the outbox {directory} and {tries - 1} folders beside it are in use; "
                         "set WHYWAIT_NOTIFY_OUTBOX")

    def items(self, receiver: str | None = None) -> list[OutboxItem]:
        """Pending items (of ``receiver``, or all), oldest first."""
        return [i for i in self._items.values() if receiver is None or i.receiver == receiver]

    def has(self, key: str, kind: Kind | None = None, receiver: str | None = None) -> bool:
        """True when an item for incident ``key`` (of ``kind``, for ``receiver``) is pending."""
        return any(i.key == key and (kind is None or i.kind == kind) and (receiver is None or i.receiver == receiver)
                   for i in self._items.values())

    def count(self, receiver: str) -> int:
        """How many items wait for ``receiver``."""
        return sum(1 for i in self._items.values() if i.receiver == receiver)

    def __len__(self) -> int:
        return len(self._items)

    def close(self) -> None:
        """Close the log and release the folder's lock (pending items stay on disk)."""
        if self._log is not None:
            self._log.close()
            self._log = None
        if self._lock_fd is not None:
            fcntl.flock(self._lock_fd, fcntl.LOCK_UN)
            os.close(self._lock_fd)
            self._lock_fd = None
