"""Incident bundles (``incident.whywait``): an incident's events, topology and rules in one file.

Written by ``whywait export``, read by ``whywait replay --input`` (no broker needed)
and ``whywait import`` (back into topics, e.g. on a staging cluster).  A bundle is a
zip archive (deflate) holding:

``manifest.json``
    format name and version, whywait and contract schema versions, the window and
    filters it was cut with, message counts per topic, and the SHA-256 and size of
    every other member (checked before anything is read: :meth:`Bundle.verify`
    refuses a member missing from the list, a listed one missing from the archive,
    and any mismatch, so an edited bundle is never replayed).
``events.jsonl``
    one line per message, in event-time order: ``{"topic": ..., "value": "<raw JSON>"}``.
    The raw value is kept byte for byte, so a replay of the bundle sees exactly what a
    replay of the topics saw.
``topology.yaml``, ``rules/...``
    the topology and the rule files in force, so the replay needs nothing else.  One rules folder (or file)
    is laid out as it was: ``rules/macros.yaml``, ``rules/gpu/gpu.xid-ecc.yaml``; several keep a folder each,
    named as theirs (``rules/rules/...`` and ``rules/site-rules/...``), loaded in the order given.  The
    manifest's ``rule_paths`` lists what the replay loads (``["rules"]``).  A bundle without it (written
    before it existed, when every rule path had a folder of its own: ``rules/rules/gpu/...``) loads each
    folder or file under ``rules/`` as one path, as it always did.

Events are streamed in and out: neither writing nor reading holds the range in memory.  A line
longer than any contract message (:data:`MAX_LINE_BYTES`) is skipped as it is read, not held, and
counted in :attr:`Bundle.skipped`; so is a line that is not a topic and a value.  Every problem is one
line naming the bundle and the member:
``incident.whywait: manifest.json: window: expected ...``, ``incident.whywait!topology.yaml:2: ...``.
"""

from __future__ import annotations

import hashlib
import itertools
import json
import logging
import math
import re
import time
import zipfile
import zlib
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterator

import msgspec
from whywait.agents.events import MAX_MESSAGE_BYTES, SCHEMA_VERSION, TOPICS
from whywait.engine.importers import ImportFormatError

log = logging.getLogger(__name__)

FORMAT = "whywait-bundle"
VERSION = 1
EVENTS = "events.jsonl"
MANIFEST = "manifest.json"
TOPOLOGY = "topology.yaml"
#: The longest line of ``events.jsonl`` read: the largest contract message with every byte escaped as
#: ``\u00XX`` (6 bytes), plus its topic.  A longer line cannot hold a message the engine would accept.
MAX_LINE_BYTES = 6 * MAX_MESSAGE_BYTES + (64 << 10)
_MAX_MANIFEST_BYTES = 16 << 20  # a manifest lists members and counts: kilobytes
# Rule files are kilobytes and a 10,240-GPU cluster's topology under a megabyte; both are extracted and loaded
# whole, so a member listed (with a matching checksum) as gigabytes of one repeated byte, a few kilobytes
# compressed, is refused before it is read instead of filling the memory or the disk of whoever replays it.
_MAX_RULE_BYTES = 4 << 20
_MAX_TOPOLOGY_BYTES = 256 << 20
_SHA256 = re.compile(r"[0-9a-f]{64}")
_ZIP_MAGIC = b"PK\x03\x04"  # a zip archive's first bytes (its first member's header)
_MAX_RULE_PATHS = 64


def _member_cap(name: str) -> tuple[int, str] | None:
    """The most bytes member ``name`` may hold and what it is (None: no cap, ``events.jsonl`` is streamed)."""
    if name == TOPOLOGY:
        return _MAX_TOPOLOGY_BYTES, "topology"
    return (_MAX_RULE_BYTES, "rule file") if name.startswith("rules/") else None


class _Line(msgspec.Struct):
    """One line of ``events.jsonl`` as the writer makes it (other keys are ignored, as ``json.loads`` did)."""

    topic: str
    value: str


# A replay of a bundle reads every line: the compiled decoder takes a third of json.loads' time per line.
_LINE = msgspec.json.Decoder(_Line)
_TOPICS = frozenset(t.name for t in TOPICS)  # the topics a bundle's lines may name: the contract's


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

    def close(self, topology: Path | None, rule_files: list[tuple[str, Path]],
              rule_paths: list[str] | None = None) -> None:
        """Finish the events, add the topology and rule files, then write the manifest last.

        ``rule_files`` are ``(name under rules/, file)``; ``rule_paths``, the paths under the bundle's root the
        replay loads, in order (``["rules"]``; :func:`whywait.engine.commands.export_cmd.bundle_rules` gives both).
        Without them the reader loads each folder or file under ``rules/`` as one path.
        """
        self._events.close()
        self._members[EVENTS] = {"sha256": self._hash.hexdigest(), "bytes": self._bytes}
        if topology is not None:
            self.add_file("topology.yaml", topology.read_bytes())
        for rel, p in rule_files:
            self.add_file(f"rules/{rel}", p.read_bytes())
        manifest = {"format": FORMAT, "version": VERSION, "whywait": _own_version(), "schema": SCHEMA_VERSION,
                    "created_at": time.time(), "window": self.window, "messages": dict(sorted(self.counts.items())),
                    "members": dict(sorted(self._members.items()))}
        if rule_paths is not None:
            manifest["rule_paths"] = list(rule_paths)
        self._zip.writestr(MANIFEST, json.dumps(manifest, indent=2, sort_keys=True))
        self._zip.close()


class Bundle:
    """An opened bundle: its manifest (checked), its events as a stream, its topology and rules.

    Opening checks the manifest's shape; :meth:`verify` checks the members against it, and is called
    before anything else is read (``whywait replay --input``, ``whywait import``).
    """

    def __init__(self, path: Path) -> None:
        self.path = path
        #: lines of events.jsonl skipped while reading, by reason (a line over :data:`MAX_LINE_BYTES`, or
        #: one that is not ``{"topic": ..., "value": "..."}``)
        self.skipped: Counter[str] = Counter()
        self.bad_lines = 0
        self._zip = _open_zip(path)
        try:
            with self._zip.open(MANIFEST) as fh:
                raw = fh.read(_MAX_MANIFEST_BYTES + 1)
        except KeyError:
            raise ImportFormatError(f"{path}: not a whywait bundle (no {MANIFEST})") from None
        except (zipfile.BadZipFile, zlib.error, OSError) as exc:
            raise ImportFormatError(f"{path}: {MANIFEST} is corrupt ({exc})") from None
        if len(raw) > _MAX_MANIFEST_BYTES:
            raise ImportFormatError(f"{path}: {MANIFEST} is over {_MAX_MANIFEST_BYTES >> 20} MiB: not a manifest")
        try:
            manifest = json.loads(raw)
        except (ValueError, RecursionError) as exc:
            raise ImportFormatError(f"{path}: {MANIFEST} is not valid JSON ({exc})") from None
        if not isinstance(manifest, dict):
            raise ImportFormatError(f"{path}: {MANIFEST}: expected a JSON object (got {_kind(manifest)})")
        self.manifest: dict[str, Any] = manifest
        fmt, version = manifest.get("format"), manifest.get("version")
        if fmt == FORMAT and isinstance(version, int) and not isinstance(version, bool) and version > VERSION:
            # What a bundle from a newer whywait is, and what to do: the format check below said only "expected".
            by = manifest.get("whywait")
            raise ImportFormatError(f"{path}: bundle format version {version}, written by a newer whywait"
                                    f"{f' ({by})' if isinstance(by, str) else ''}; this one "
                                    f"({_own_version()}) reads version {VERSION}: upgrade whywait to read it")
        if fmt != FORMAT or version != VERSION:
            raise ImportFormatError(f"{path}: {MANIFEST}: expected format {FORMAT!r} version {VERSION} "
                                    f"(got {_shown(fmt)} {_shown(version)})")
        self._check_manifest()

    def _bad(self, key: str, expected: str, got: Any) -> ImportFormatError:
        return ImportFormatError(f"{self.path}: {MANIFEST}: {key}: expected {expected} (got {_shown(got)})")

    def _check_manifest(self) -> None:
        """Check the types of the manifest's fields that readers use (each present one; :meth:`verify` needs them)."""
        m = self.manifest
        members = m.get("members")
        if members is not None:
            if not isinstance(members, dict):
                raise self._bad("members", 'an object of member name → {"sha256": ..., "bytes": ...}', members)
            for name, entry in members.items():
                if not (isinstance(entry, dict) and isinstance(entry.get("sha256"), str)
                        and _SHA256.fullmatch(entry["sha256"]) and _is_int(entry.get("bytes"))
                        and entry["bytes"] >= 0):
                    raise self._bad(f"members[{name!r}]", '{"sha256": "<64 hex digits>", "bytes": <size>}', entry)
        window = m.get("window")
        if window is not None:
            if not isinstance(window, dict):
                raise self._bad("window", "an object with since and until (Unix seconds)", window)
            for key in ("since", "until", "lead_s"):
                v: Any = window.get(key)
                if (key in window or key == "since") and not (_is_number(v) and (key != "lead_s" or v >= 0)):
                    what = "seconds ≥ 0" if key == "lead_s" else "Unix seconds"
                    raise self._bad(f"window.{key}", what, v)
            if "until" in window and window["until"] <= window["since"]:
                raise self._bad("window.until", f"a time after window.since ({window['since']})", window["until"])
            for key in ("jobs", "projects"):
                v = window.get(key, [])
                if not (isinstance(v, list) and all(isinstance(x, str) for x in v)):
                    raise self._bad(f"window.{key}", "a list of names", v)
        messages = m.get("messages")
        if messages is not None and not (isinstance(messages, dict) and all(_is_int(v) for v in messages.values())):
            raise self._bad("messages", "an object of topic → count", messages)
        paths = m.get("rule_paths")
        if paths is not None:
            want = f'a list of up to {_MAX_RULE_PATHS} paths under rules/ ("rules", "rules/site-rules")'
            if not (isinstance(paths, list) and len(paths) <= _MAX_RULE_PATHS):
                raise self._bad("rule_paths", want, paths)
            for i, p in enumerate(paths):
                if not (isinstance(p, str) and _safe_rule_path(p)):
                    raise self._bad(f"rule_paths[{i}]", want, p)

    def verify(self) -> None:
        """Check the bundle is whole and unedited: every member listed with its size and SHA-256, and matching.

        Streams each member once.  Raises :class:`ImportFormatError` for a member the manifest does not list
        (one added later), a listed one missing, no ``events.jsonl``, no window, or any mismatch.
        """
        members: dict[str, dict[str, Any]] | None = self.manifest.get("members")
        if members is None:
            raise self._bad("members", 'an object of member name → {"sha256": ..., "bytes": ...}', None)
        if not isinstance(self.manifest.get("window"), dict):
            raise self._bad("window", "an object with since and until (Unix seconds)", self.manifest.get("window"))
        if EVENTS not in members:
            raise ImportFormatError(f"{self.path}: {MANIFEST}: members: {EVENTS} is not listed "
                                    "(every bundle has its events)")
        names = Counter(i.filename for i in self._zip.infolist() if not i.is_dir())
        for name in sorted(names):
            if names[name] > 1:
                raise ImportFormatError(f"{self.path}: member {name} is in the archive twice (the bundle was edited)")
            if name != MANIFEST and name not in members:
                raise ImportFormatError(f"{self.path}: member {name} is not listed in the manifest (the bundle was "
                                        "edited: a bundle lists every member with its checksum)")
        for name, want in sorted(members.items()):
            cap = _member_cap(name)
            if cap is not None and isinstance(want, dict) and isinstance(want.get("bytes"), int) \
                    and want["bytes"] > cap[0]:
                raise ImportFormatError(f"{self.path}: {name} is listed as {want['bytes']:,} bytes, over the "
                                        f"{cap[0] >> 20} MiB a {cap[1]} may be")
            h = hashlib.sha256()
            n = 0
            try:
                with self._zip.open(name) as fh:
                    while chunk := fh.read(1 << 20):
                        h.update(chunk)
                        n += len(chunk)
                        if n > want["bytes"]:  # a member bigger than listed is not read to its end
                            break
            except KeyError:
                raise ImportFormatError(f"{self.path}: member {name} listed in the manifest is missing") from None
            except (zipfile.BadZipFile, zlib.error, OSError) as exc:
                raise ImportFormatError(f"{self.path}: {name} is corrupt ({exc})") from None
            if h.hexdigest() != want["sha256"] or n != want["bytes"]:
                raise ImportFormatError(f"{self.path}: {name} does not match its checksum in the manifest "
                                        "(the bundle is corrupt or was edited)")

    def events(self) -> Iterator[tuple[str, bytes]]:
        """Yield ``(topic, raw value)`` in the bundle's (event-time) order.

        A line over :data:`MAX_LINE_BYTES` is skipped without being held, and a line that is not
        ``{"topic": ..., "value": "..."}`` is skipped too (one naming a topic that is none of the contract's is
        said to be that, ``unknown topic 'x'``, not the shape it breaks); each is counted in :attr:`skipped`,
        which the summary prints (the first few by line number), and logged at debug level only (``-v`` names
        every one): it was a WARNING as well, so each bad line was said twice, in two styles.  A line of the
        right shape is yielded whatever its topic: the contract's decoder says what is wrong with its value
        there (``kind 'host' belongs on whywait.host.v1, not whywait.nosuch.v1``).  (A bundle whose checksums
        were recomputed after an edit can hold such lines.)
        """
        with self._zip.open(EVENTS) as fh:
            for no, line in enumerate(_lines(fh, MAX_LINE_BYTES), start=1):
                if line is None:
                    self.skipped[f"{EVENTS}: a line over {MAX_LINE_BYTES:,} bytes (longer than any contract "
                                 "message)"] += 1
                    log.debug("%s:%s:%d: line over %s bytes, longer than any contract message: skipped",
                              self.path, EVENTS, no, f"{MAX_LINE_BYTES:,}")
                    continue
                try:
                    fast = _LINE.decode(line)
                    topic, value = fast.topic, fast.value.encode()
                except (msgspec.DecodeError, UnicodeEncodeError, RecursionError):
                    # Anything unusual is read as it always was: the same values, the same errors.
                    # (A line nested past the decoders' depth limit raises RecursionError: it is malformed too.)
                    try:
                        rec = json.loads(line)
                        topic = rec["topic"]
                        if isinstance(topic, str) and topic not in _TOPICS:
                            self._skip_line(no, _unknown_topic(topic), "unknown topics")
                            continue
                        value = rec["value"].encode()
                    except (ValueError, KeyError, TypeError, AttributeError, RecursionError):
                        # One bad line costs that line, as a malformed message on a topic does: the
                        # replay (or import) goes on, and its summary counts it.
                        self._skip_line(no, "expected " + '{"topic": ..., "value": "..."}')
                        continue
                yield topic, value

    def _skip_line(self, no: int, why: str, why_all: str | None = None) -> None:
        """Count line ``no`` of the events as skipped, for ``why``: the first few by number, the rest together
        (for ``why_all``: one count for every unknown topic, however many an edit named)."""
        self.bad_lines += 1
        where = f"line {no}: {why}" if self.bad_lines <= 3 else f"more lines: {why_all or why}"
        self.skipped[f"{EVENTS}: {where}"] += 1
        log.debug("%s:%s:%d: %s: skipped", self.path, EVENTS, no, why)

    def extract(self, dest: Path) -> tuple[Path | None, list[Path]]:
        """Write the topology and rule files under ``dest``; return the topology path and the rule paths.

        The topology is loaded once here, so a bad one is named as the bundle's member
        (``incident.whywait!topology.yaml:2: ...``), not by the temporary file it was written to.
        """
        names = self._zip.namelist()
        topo = None
        if TOPOLOGY in names:
            topo = dest / TOPOLOGY
            self._copy(TOPOLOGY, topo)
            self._check_topology(topo)
        rules = [n for n in names if n.startswith("rules/") and not n.endswith("/")]
        for n in rules:
            out = dest / n
            if ".." in Path(n).parts:  # never write outside dest
                raise ImportFormatError(f"{self.path}: unsafe member name {n!r}")
            out.parent.mkdir(parents=True, exist_ok=True)
            self._copy(n, out)
        return topo, [dest / p for p in self.rule_paths(rules)]

    def rule_paths(self, rules: list[str]) -> list[str]:
        """The rule paths the replay loads, under the bundle's root, in order; ``rules`` are the rule members.

        The manifest's ``rule_paths`` when it has them (each must name a rule member or a folder of them).
        A bundle written before them kept a folder (or file) under ``rules/`` per rule path given to export:
        ``rules/rules/...``.  One with a ``macros.yaml`` at the top of ``rules/`` is one rules tree, as
        bundles lay out one path now, and written without ``rule_paths`` (``BundleWriter.close`` with none).
        """
        listed = self.manifest.get("rule_paths")
        if isinstance(listed, list):
            for i, p in enumerate(listed):
                if not any(n == p or n.startswith(p.rstrip("/") + "/") for n in rules):
                    raise ImportFormatError(f"{self.path}: {MANIFEST}: rule_paths[{i}]: {p!r} names no rule file "
                                            "in the bundle")
            return [str(p).rstrip("/") for p in listed]
        if not rules:
            return []
        if any(n in (f"rules/{m}" for m in ("macros.yaml", "macros.yml")) for n in rules):
            return ["rules"]
        return [f"rules/{t}" for t in sorted({n.split("/")[1] for n in rules})]

    def _copy(self, name: str, out: Path) -> None:
        """Stream member ``name`` to ``out``, never more than its cap (:func:`_member_cap`), even if unverified."""
        cap = _member_cap(name)
        n = 0
        with self._zip.open(name) as src, out.open("wb") as dst:
            while chunk := src.read(1 << 20):
                n += len(chunk)
                if cap is not None and n > cap[0]:
                    raise ImportFormatError(f"{self.path}: {name} is over the {cap[0] >> 20} MiB a {cap[1]} may be")
                dst.write(chunk)

    def _check_topology(self, topo: Path) -> None:
        from whywait.topology.errors import TopologyError
        from whywait.topology.model import Topology

        try:
            Topology.from_yaml(topo)
        except TopologyError as exc:
            raise ImportFormatError(self.shown(str(exc), topo.parent)) from None

    def shown(self, message: str, dest: Path) -> str:
        """``message`` with the paths of members extracted under ``dest`` written as ``BUNDLE!member``.

        For an error about an extracted file (a rule the replay loads): the temporary folder is gone by the
        time the user reads it.
        """
        return message.replace(f"{dest}/", f"{self.path}!")

    def close(self) -> None:
        self._zip.close()


def _lines(fh: Any, limit: int = MAX_LINE_BYTES, chunk: int = 1 << 20) -> Iterator[bytes | None]:
    """The lines of a binary file read a MiB at a time, without their ends; a last line may lack one.

    A line longer than ``limit`` is yielded as None: its bytes are dropped as they are read, so a member
    with no line ends costs one pass and ``limit`` bytes of memory.  Each byte is looked at once (a line's
    pieces are joined when it ends).  A zip member's own line iteration is Python code run per line (a
    ``peek`` and a ``read`` each): it cost more than decoding the lines did.
    """
    pending: list[bytes] = []  # the pieces of the current line read so far
    size = 0  # their length
    over = False  # the current line is past `limit`: its pieces are not kept
    while data := fh.read(chunk):
        parts = data.split(b"\n")
        last = parts.pop()  # the start of a line this chunk does not end
        if parts:  # the current line ends in this chunk, and the lines after it are whole
            first = parts[0]
            if over or size + len(first) > limit:
                yield None
            else:
                yield b"".join((*pending, first)) if pending else first
            pending, size, over = [], 0, False
            if limit >= chunk:  # each is shorter than the chunk it was read in
                yield from itertools.islice(parts, 1, None)
            else:
                yield from (x if len(x) <= limit else None for x in itertools.islice(parts, 1, None))
        size += len(last)
        if over or size > limit:
            over, pending = True, []
        elif last:
            pending.append(last)
    if over:
        yield None
    elif pending:
        yield b"".join(pending)


def _is_int(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _is_number(v: Any) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)


def _kind(v: Any) -> str:
    names: dict[type, str] = {dict: "an object", list: "an array", str: "a string"}
    return names.get(type(v), type(v).__name__)


def _unknown_topic(topic: str) -> str:
    return f"unknown topic {topic if len(topic) <= 80 else topic[:77] + '...'!r}"


def _shown(v: Any) -> str:
    """A manifest value in an error: JSON, cut short."""
    text = json.dumps(v) if v is not None else "nothing"
    return text if len(text) <= 80 else text[:77] + "..."


def is_bundle(path: Path) -> bool:
    """Whether ``path`` is meant as a bundle: named ``*.whywait``, or a zip archive (``whywait import`` reads it
    as one).

    Profiler traces and step tables are never zips, so a zip without a manifest, or one cut short (its
    table of contents lost, it opens as no zip at all), is a bundle that :class:`Bundle` refuses in one line,
    not a step table whose first bytes are "not UTF-8".
    """
    if path.suffix == ".whywait":  # what `whywait export -o` is told to write, e.g. incident.whywait
        return True
    try:
        with path.open("rb") as fh:
            head = fh.read(len(_ZIP_MAGIC))
    except OSError:
        return False
    return head == _ZIP_MAGIC or zipfile.is_zipfile(path)


def _open_zip(path: Path) -> zipfile.ZipFile:
    """Open the bundle's archive; anything that is not one whole zip is one line saying what it is instead."""
    try:
        return zipfile.ZipFile(path)
    except FileNotFoundError:
        raise ImportFormatError(f"{path}: no such file") from None
    except IsADirectoryError:
        raise ImportFormatError(f"{path}: is a folder, not a bundle (the file `whywait export -o` writes)") from None
    except OSError as exc:
        raise ImportFormatError(f"{path}: cannot read it ({exc.strerror or exc})") from None
    except zipfile.BadZipFile as exc:
        size = path.stat().st_size
        if size == 0:
            raise ImportFormatError(f"{path}: is empty (0 bytes), not a bundle: was the export interrupted, or the "
                                    "copy not finished?") from None
        with path.open("rb") as fh:
            head = fh.read(512)
        if head.startswith(_ZIP_MAGIC):
            # A zip's table of contents is at its end: a copy or download cut short has lost it.
            raise ImportFormatError(f"{path}: is truncated: a zip archive whose end is missing ({size:,} bytes): "
                                    "was the export, the copy or the download cut short?") from None
        if head.startswith(b"\x1f\x8b"):
            raise ImportFormatError(f"{path}: is gzip-compressed, not a bundle (a bundle is a zip already): "
                                    "decompress it (gunzip) and give the file inside") from None
        if head[257:262] == b"ustar":
            raise ImportFormatError(f"{path}: is a tar archive, not a bundle: extract the .whywait file from it "
                                    "and give that") from None
        first = head.split(b"\n", 1)[0]
        if path.suffix.lower() in (".csv", ".tsv", ".txt") or (
                b"," in first and b"\0" not in head and not head.lstrip().startswith((b"{", b"["))):
            raise ImportFormatError(f"{path}: is a table, not a bundle: `whywait import {path} --project P --team T "
                                    "-o NAME.whywait` makes a bundle of a step table to replay with no broker"
                                    ) from None
        if head.lstrip().startswith(b"{"):
            # what `whywait import -o x.jsonl` and `whywait events` write: contract messages, one a line
            raise ImportFormatError(f"{path}: is JSON lines, not a bundle: import the step table or traces again "
                                    "with `-o NAME.whywait` to write a bundle that replays with no broker") from None
        raise ImportFormatError(f"{path}: not a whywait bundle (not a zip archive: {exc})") from None


def _safe_rule_path(name: str) -> bool:
    """Whether ``name`` (a manifest's ``rule_paths`` entry) is ``rules`` or a plain relative path under ``rules/``."""
    parts = name.rstrip("/").split("/")
    return parts[0] == "rules" and all(p not in ("", ".", "..") for p in parts[1:])


def _own_version() -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("whywait")
    except PackageNotFoundError:  # pragma: no cover - running from a bare checkout
        return "unknown"
