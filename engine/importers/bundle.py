"""Incident bundles (``incident.whywait``): an incident's events, topology and rules in one file.

Written by ``whywait export``, read by ``whywait replay --input`` (no broker needed)
and ``whywait import`` (back into topics, e.g. on a staging cluster).  A bundle is a
zip archive (deflate) holding:

``manifest.json``
    format name and version, whywait and contract schema versions, the window and
    filters it was cut with, message counts per topic, and the SHA-256 and size of
    every other member (checked before anything is read).
``events.jsonl``
    one line per message, in event-time order: ``{"topic": ..., "value": "<raw JSON>"}``.
    The raw value is kept byte for byte, so a replay of the bundle sees exactly what a
    replay of the topics saw.
``topology.yaml``, ``rules/...``
    the topology and the rule files in force, so the replay needs nothing else.

Events are streamed in and out: neither writing nor reading holds the range in memory.
"""

from __future__ import annotations

import hashlib
import json
import time
import zipfile
import zlib
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterator

import msgspec
from whywait.agents.events import SCHEMA_VERSION
from whywait.engine.importers import ImportFormatError

FORMAT = "whywait-bundle"
VERSION = 1
EVENTS = "events.jsonl"
MANIFEST = "manifest.json"


class _Line(msgspec.Struct):
    """One line of ``events.jsonl`` as the writer makes it (other keys are ignored, as ``json.loads`` did)."""

    topic: str
    value: str


# A replay of a bundle reads every line: the compiled decoder takes a third of json.loads' time per line.
_LINE = msgspec.json.Decoder(_Line)


@dataclass
class BundleWriter:
    """Streams events into a new bundle; :meth:`close` adds topology, rules and the manifest.

    Used as a context manager by ``whywait export``: ``add(topic, raw)`` per message, in
    event-time order.
    """

    path: Path
    window: dict[str, Any]
    counts: Counter[str] = field(default_factory=Counter)

    def __post_init__(self) -> None:
        self._zip = zipfile.ZipFile(self.path, "w", compression=zipfile.ZIP_DEFLATED, compresslevel=6)
        self._events = self._zip.open(EVENTS, "w", force_zip64=True)
        self._hash = hashlib.sha256()
        self._bytes = 0
        self._members: dict[str, dict[str, Any]] = {}

    def __enter__(self) -> BundleWriter:
        return self

    def __exit__(self, *exc: object) -> None:
        if exc[0] is not None:  # a failed export leaves no half-written bundle behind
            self._events.close()
            self._zip.close()
            self.path.unlink(missing_ok=True)

    def add(self, topic: str, raw: bytes) -> None:
        """Append one message (its raw Kafka value) of ``topic``."""
        line = (json.dumps({"topic": topic, "value": raw.decode()}, separators=(",", ":")) + "\n").encode()
        self._events.write(line)
        self._hash.update(line)
        self._bytes += len(line)
        self.counts[topic] += 1

    def add_file(self, name: str, data: bytes) -> None:
        """Add a whole member (topology, a rule file)."""
        self._zip.writestr(name, data)
        self._members[name] = {"sha256": hashlib.sha256(data).hexdigest(), "bytes": len(data)}

    def close(self, topology: Path | None, rule_files: list[tuple[str, Path]]) -> None:
        """Finish the events, add the topology and rule files, then write the manifest last."""
        self._events.close()
        self._members[EVENTS] = {"sha256": self._hash.hexdigest(), "bytes": self._bytes}
        if topology is not None:
            self.add_file("topology.yaml", topology.read_bytes())
        for rel, p in rule_files:
            self.add_file(f"rules/{rel}", p.read_bytes())
        from importlib.metadata import PackageNotFoundError, version

        try:
            whywait_version = version("whywait")
        except PackageNotFoundError:  # pragma: no cover - running from a bare checkout
            whywait_version = "unknown"
        manifest = {"format": FORMAT, "version": VERSION, "whywait": whywait_version, "schema": SCHEMA_VERSION,
                    "created_at": time.time(), "window": self.window, "messages": dict(sorted(self.counts.items())),
                    "members": dict(sorted(self._members.items()))}
        self._zip.writestr(MANIFEST, json.dumps(manifest, indent=2, sort_keys=True))
        self._zip.close()


class Bundle:
    """An opened bundle: its manifest (checked), its events as a stream, its topology and rules."""

    def __init__(self, path: Path) -> None:
        self.path = path
        try:
            self._zip = zipfile.ZipFile(path)
        except FileNotFoundError:
            raise ImportFormatError(f"{path}: no such file") from None
        except (zipfile.BadZipFile, OSError) as exc:
            raise ImportFormatError(f"{path}: not a whywait bundle ({exc})") from None
        try:
            self.manifest: dict[str, Any] = json.loads(self._zip.read(MANIFEST))
        except KeyError:
            raise ImportFormatError(f"{path}: not a whywait bundle (no {MANIFEST})") from None
        except ValueError as exc:
            raise ImportFormatError(f"{path}: {MANIFEST} is not valid JSON ({exc})") from None
        if self.manifest.get("format") != FORMAT or self.manifest.get("version") != VERSION:
            raise ImportFormatError(f"{path}: {MANIFEST}: expected format {FORMAT!r} version {VERSION} "
                                    f"(got {self.manifest.get('format')!r} {self.manifest.get('version')!r})")

    def verify(self) -> None:
        """Check every member's size and SHA-256 against the manifest (streaming); raise on a mismatch."""
        members = self.manifest.get("members") or {}
        for name, want in sorted(members.items()):
            h = hashlib.sha256()
            n = 0
            try:
                with self._zip.open(name) as fh:
                    while chunk := fh.read(1 << 20):
                        h.update(chunk)
                        n += len(chunk)
            except KeyError:
                raise ImportFormatError(f"{self.path}: member {name} listed in the manifest is missing") from None
            except (zipfile.BadZipFile, zlib.error, OSError) as exc:
                raise ImportFormatError(f"{self.path}: {name} is corrupt ({exc})") from None
            if h.hexdigest() != want.get("sha256") or n != want.get("bytes"):
                raise ImportFormatError(f"{self.path}: {name} does not match its checksum in the manifest "
                                        "(the bundle is corrupt or was edited)")

    def events(self) -> Iterator[tuple[str, bytes]]:
        """Yield ``(topic, raw value)`` in the bundle's (event-time) order; a bad line names its number."""
        with self._zip.open(EVENTS) as fh:
            for no, line in enumerate(_lines(fh), start=1):
                try:
                    fast = _LINE.decode(line)
                    topic, value = fast.topic, fast.value.encode()
                except (msgspec.DecodeError, UnicodeEncodeError):
                    # Anything unusual is read as it always was: the same values, the same errors.
                    try:
                        rec = json.loads(line)
                        topic, value = rec["topic"], rec["value"].encode()
                    except (ValueError, KeyError, TypeError, AttributeError):
                        raise ImportFormatError(f"{self.path}:{EVENTS}:{no}: expected "
                                                '{"topic": ..., "value": "..."}') from None
                yield topic, value

    def extract(self, dest: Path) -> tuple[Path | None, list[Path]]:
        """Write the topology and rule files under ``dest``; return the topology path and the rule paths."""
        names = self._zip.namelist()
        topo = None
        if "topology.yaml" in names:
            topo = dest / "topology.yaml"
            topo.write_bytes(self._zip.read("topology.yaml"))
        rules = [n for n in names if n.startswith("rules/") and not n.endswith("/")]
        for n in rules:
            out = dest / n
            if ".." in Path(n).parts:  # never write outside dest
                raise ImportFormatError(f"{self.path}: unsafe member name {n!r}")
            out.parent.mkdir(parents=True, exist_ok=True)
            out.write_bytes(self._zip.read(n))
        # The rule paths as they were given to export (a folder keeps its macros.yaml at its top).
        tops = sorted({Path(n).parts[1] for n in rules})
        return topo, [dest / "rules" / t for t in tops]

    def close(self) -> None:
        self._zip.close()


def _lines(fh: Any, chunk: int = 1 << 20) -> Iterator[bytes]:
    """The lines of a binary file read a MiB at a time, without their ends; a last line may lack one.

    A zip member's own line iteration is Python code run per line (a ``peek`` and a ``read`` each):
    it cost more than decoding the lines did.
    """
    tail = b""
    while data := fh.read(chunk):
        lines = (tail + data).split(b"\n")
        tail = lines.pop()
        yield from lines
    if tail:
        yield tail


def is_bundle(path: Path) -> bool:
    """Whether ``path`` looks like a bundle (a zip holding a manifest)."""
    try:
        with zipfile.ZipFile(path) as z:
            return MANIFEST in z.namelist()
    except (zipfile.BadZipFile, OSError):
        return False
