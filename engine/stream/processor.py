"""Decode → evaluate → outputs, for one polled batch of Kafka records.

The stream layer (faust) calls :meth:`Processor.process` with each batch it takes
from the input topics; this class decodes and validates every value against the
event contract, feeds the valid ones to the pure :class:`Evaluator`, and returns
what must be published: diagnoses, and dead letters for the messages that broke
the contract.  It imports neither faust nor aiokafka, so it is unit-tested with
plain bytes.
"""

from __future__ import annotations

import base64
import json
import time
from collections import Counter
from dataclasses import dataclass, field
from typing import Any, Iterable

from agents.events import ContractError, decode
from engine.diagnosis import Diagnosis
from engine.evaluate.evaluator import Evaluator
from topology.errors import TopologyError


@dataclass(frozen=True)
class Record:
    """One consumed Kafka record, as the stream layer hands it over."""

    topic: str
    value: bytes | None
    key: bytes | None = None
    partition: int = 0
    offset: int = -1
    timestamp_ms: int | None = None  # broker/producer timestamp, used only for latency figures


@dataclass
class Output:
    """What one batch produced."""

    diagnoses: list[Diagnosis] = field(default_factory=list)
    dead_letters: list[tuple[bytes, bytes]] = field(default_factory=list)  # (key, value) for the DLQ topic


def dead_letter(rec: Record, reason: str) -> tuple[bytes, bytes]:
    """Build the dead-letter message for ``rec``: the original bytes (base64 if not UTF-8) and the reason."""
    raw = rec.value or b""
    try:
        text: str | None = raw.decode()
        b64 = None
    except UnicodeDecodeError:
        text, b64 = None, base64.b64encode(raw).decode()
    body = {"schema": 1, "kind": "dead_letter", "time": time.time(), "source_topic": rec.topic,
            "partition": rec.partition, "offset": rec.offset, "reason": reason,
            "value": text, "value_base64": b64,
            "key": rec.key.decode(errors="replace") if rec.key else None}
    return rec.topic.encode(), json.dumps(body, separators=(",", ":")).encode()


class Processor:
    """Holds the evaluator and counts what passed through it."""

    def __init__(self, evaluator: Evaluator, not_before: float | None = None) -> None:
        self.evaluator = evaluator
        # Messages older than this event time are skipped (counted): a replay or demo that
        # shares topics with earlier runs starts from a point in event time, not an offset.
        self.not_before = not_before
        self.counts: Counter[str] = Counter()
        # fingerprint -> producer timestamp (ms) of the record whose arrival made the diagnosis
        # possible: the start of the wall-clock latency (event produced -> Slack post).
        self.trigger_ms: dict[str, int] = {}

    def process(self, records: Iterable[Record]) -> Output:
        """Decode and evaluate one batch; return diagnoses and dead letters, in order."""
        out = Output()
        self.evaluator.begin_batch()
        for rec in records:
            if rec.value is None:  # a tombstone on a compacted topic: nothing to evaluate
                self.counts["tombstones"] += 1
                continue
            try:
                msg = decode(rec.value, rec.topic)
            except ContractError as exc:
                self.counts["dead_letters"] += 1
                out.dead_letters.append(dead_letter(rec, str(exc)))
                continue
            if self.not_before is not None and msg["time"] < self.not_before:
                self.counts["skipped_before_start"] += 1
                continue
            try:
                diags = self.evaluator.ingest(msg)
            except TopologyError as exc:  # e.g. a placement on a node the topology does not hold
                self.counts["dead_letters"] += 1
                out.dead_letters.append(dead_letter(rec, f"topology: {exc}"))
                continue
            self.counts["messages"] += 1
            self.counts[f"kind.{msg['kind']}"] += 1
            if diags and rec.timestamp_ms is not None:
                for d in diags:
                    self.trigger_ms[d.fingerprint] = rec.timestamp_ms
            out.diagnoses += diags
        self.counts["diagnoses"] += len(out.diagnoses)
        return out

    def stats(self) -> dict[str, Any]:
        """Counters for the log and the engine's health line."""
        return dict(self.counts)
