"""The one YAML reader of whywait: plain data, plus the line of every key and item.

Called for rule files and their overrides (:mod:`whywait.engine.rules.loader`), rule tests
(:mod:`whywait.simulate.ruletest`), topology files (:mod:`whywait.topology.schema` and the topology
importers) and simulator scenarios (:mod:`whywait.simulate.scenario`), so each of their schema errors can
say ``file:line``.

Stricter than ``yaml.safe_load`` on purpose, because these files are hand-edited:

- a **duplicate key** is an error naming both lines (``safe_load`` silently keeps the last one);
- a **merge key** (``<<: *anchor``) and a non-scalar key are errors: the schemas would misread them;
- an alias that expands into more than :data:`ALIAS_BUDGET` nodes (a "billion laughs" file) is an error.

Every problem is a :class:`whywait.errors.YamlError` carrying ``source`` and ``line``.  Parsing runs on
libyaml's composer when PyYAML has it (a 10,000-GPU topology file in a fraction of the pure-Python time);
the values are then built here, in one pass that also records the lines.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Mapping, NamedTuple

import yaml

from whywait.errors import YamlError

#: a key path inside a document: mapping keys and sequence indexes, e.g. ``("nodes", 2, "nics", 0, "leaf")``
KeyPath = tuple[Any, ...]

#: most nodes that aliases (``*name``) may expand into, across one document
ALIAS_BUDGET = 100_000

_Composer: Any = getattr(yaml, "CSafeLoader", yaml.SafeLoader)
_MAP = "tag:yaml.org,2002:map"
_SEQ = "tag:yaml.org,2002:seq"
_STR = "tag:yaml.org,2002:str"
_MERGE = "tag:yaml.org,2002:merge"
_PLAIN_TAGS = frozenset(f"tag:yaml.org,2002:{t}" for t in ("int", "float", "bool", "null"))


class Span(NamedTuple):
    """Where a scalar's text stands: its first content line, its last line, and its YAML style.

    ``style`` is ``'|'`` (literal block), ``'>'`` (folded block), ``'"'``/``"'"`` (quoted) or ``''`` (plain).
    A tuple rather than a dataclass: a 10,000-GPU topology file has tens of thousands of scalars.
    """

    first: int
    last: int
    style: str

    def line_in(self, text_line: int) -> int:
        """The file line of line ``text_line`` (1-based) of the scalar's value.

        Exact for literal blocks (``|``) and one-line values; for folded and multi-line plain values,
        whose line breaks YAML rewrites, the same offset clipped to the value's lines.
        """
        return max(self.first, min(self.first + max(text_line, 1) - 1, self.last))


@dataclass
class Document:
    """One parsed YAML document: ``data`` as plain Python values, and where each part of it stands.

    ``lines`` maps a key path to the line of its key (for mapping values) or of its item (for sequence
    items); the empty path is the document's first line.  ``spans`` holds every scalar's :class:`Span`.
    """

    source: str
    data: Any
    lines: dict[KeyPath, int] = field(default_factory=dict)
    spans: dict[KeyPath, Span] = field(default_factory=dict)
    text: str = ""

    def line(self, path: KeyPath) -> int:
        """The line of ``path``, or of its nearest ancestor that has one (a missing key has none)."""
        return line_of(self.lines, path)

    def source_text(self, span: Span) -> str:
        """The file's own lines ``span.first`` to ``span.last``, before YAML folded or unescaped them.

        A checker that re-parses a value from this text (a Jinja template) gets line numbers in the file's
        terms, where the parsed value's line breaks may have been folded away.
        """
        return "\n".join(self.text.splitlines()[span.first - 1: span.last])


def line_of(lines: Mapping[KeyPath, int], path: KeyPath) -> int:
    """The line of ``path`` in ``lines``, or of its nearest ancestor that has one; 1 when none has."""
    p = tuple(path)
    while p:
        if p in lines:
            return lines[p]
        p = p[:-1]
    return lines.get((), 1)


def format_path(path: KeyPath) -> str:
    """Spell a key path the way error messages do: ``nodes[2].nics[0].leaf``."""
    out = ""
    for p in path:
        out += f"[{p}]" if isinstance(p, int) else (f".{p}" if out else str(p))
    return out


def dotted(lines: Mapping[KeyPath, int]) -> dict[str, int]:
    """``lines`` keyed by :func:`format_path` strings, for schemas that name paths as text (topology)."""
    out: dict[str, int] = {}
    names: dict[KeyPath, str] = {(): ""}  # each path's text, built from its parent's (parents come first)
    for p, n in lines.items():
        if not p:
            continue
        parent = names.get(p[:-1])
        if parent is None:
            parent = format_path(p[:-1])
        last = p[-1]
        text = f"{parent}[{last}]" if isinstance(last, int) else (f"{parent}.{last}" if parent else str(last))
        names[p] = text
        out[text] = n
    return out


def loads(text: str, source: str = "<string>") -> Document:
    """Parse one YAML document from ``text``; raise :class:`YamlError` (with ``source`` and line) when it is bad.

    An empty document gives ``data`` None.
    """
    try:
        root = _compose(text, _Composer)
    except yaml.YAMLError as exc:
        raise _syntax_error(_clearer(text, exc), source) from None
    except RecursionError:
        raise YamlError(source, 0, "not valid YAML: it nests too deeply") from None
    doc = Document(source, None, text=text)
    if root is None:
        return doc
    builder = _Builder(doc)
    try:
        doc.data = builder.build(root, ())
    except RecursionError:
        raise YamlError(source, root.start_mark.line + 1, "not valid YAML: it nests too deeply") from None
    doc.lines[()] = root.start_mark.line + 1
    return doc


def load(path: str | Path) -> Document:
    """Read and parse the YAML file at ``path``; an unreadable file is a :class:`YamlError` too."""
    source = str(path)
    try:
        text = Path(path).read_text(encoding="utf-8")
    except UnicodeDecodeError as exc:
        raise YamlError(source, 0, f"cannot read: not UTF-8 text (byte {exc.start})") from None
    except OSError as exc:
        raise YamlError(source, 0, f"cannot read: {exc.strerror or exc}") from None
    return loads(text, source)


def _compose(text: str, loader_class: Any) -> yaml.Node | None:
    loader = loader_class(text)
    try:
        return loader.get_single_node()  # type: ignore[no-any-return]
    finally:
        loader.dispose()


def _clearer(text: str, exc: yaml.YAMLError) -> yaml.YAMLError:
    """PyYAML's own parser's error for ``text`` where libyaml's is terser ("did not find expected ','")."""
    if _Composer is yaml.SafeLoader:
        return exc
    try:
        _compose(text, yaml.SafeLoader)
    except yaml.YAMLError as clearer:
        return clearer
    except RecursionError:
        pass
    return exc


def _syntax_error(exc: yaml.YAMLError, source: str) -> YamlError:
    mark = getattr(exc, "problem_mark", None) or getattr(exc, "context_mark", None)
    problem = getattr(exc, "problem", None) or str(exc).splitlines()[0]
    context = getattr(exc, "context", None)
    if context and problem.startswith("but "):  # "expected a single document in the stream, but found ..."
        problem = f"{context}, {problem}"
    return YamlError(source, mark.line + 1 if mark is not None else 0, f"not valid YAML: {problem}")


class _Builder:
    """Turns a composed node tree into plain values, recording lines and refusing what the schemas cannot use."""

    def __init__(self, doc: Document) -> None:
        self.doc = doc
        self.constructor = yaml.constructor.SafeConstructor()
        self.expanded = 0  # nodes built under an alias, against ALIAS_BUDGET
        self.seen: set[int] = set()  # ids of nodes already built once: a second visit is an alias

    def fail(self, node: yaml.Node, problem: str) -> YamlError:
        return YamlError(self.doc.source, node.start_mark.line + 1, problem)

    def build(self, node: yaml.Node, path: KeyPath) -> Any:
        if isinstance(node, yaml.ScalarNode):
            return self._scalar(node, path)
        # Only collections can amplify (an alias to a scalar is one value), so only they are counted.
        if id(node) in self.seen:
            # An alias: PyYAML hands back the anchored node itself.  Rebuilding it gives every path its own
            # values (so a schema may not mutate a shared one), within a budget that stops alias bombs.
            self.expanded += len(node.value)
            if self.expanded > ALIAS_BUDGET:
                raise self.fail(node, f"aliases expand into more than {ALIAS_BUDGET:,} values: write them out")
        self.seen.add(id(node))
        if isinstance(node, yaml.MappingNode):
            return self._mapping(node, path)
        if isinstance(node, yaml.SequenceNode):
            if node.tag != _SEQ:
                raise self.fail(node, f"the tag {node.tag!r} is not supported here")
            out = []
            for i, item in enumerate(node.value):
                self.doc.lines[path + (i,)] = item.start_mark.line + 1
                out.append(self.build(item, path + (i,)))
            return out
        raise self.fail(node, f"a {type(node).__name__} is not supported here")  # pragma: no cover - no such node

    def _mapping(self, node: yaml.MappingNode, path: KeyPath) -> dict[Any, Any]:
        if node.tag != _MAP:
            raise self.fail(node, f"the tag {node.tag!r} is not supported here")
        out: dict[Any, Any] = {}
        first_line: dict[Any, int] = {}
        for knode, vnode in node.value:
            line = knode.start_mark.line + 1
            if knode.tag == _MERGE:
                raise self.fail(knode, "a merge key (<<) is not supported here: write the keys out")
            if not isinstance(knode, yaml.ScalarNode):
                raise self.fail(knode, "a non-scalar key is not supported here: keys are names")
            key = self._value(knode)
            try:
                hash(key)
            except TypeError:  # e.g. a !!binary key decoded to something unhashable
                raise self.fail(knode, f"the key {knode.value!r} cannot be used as a name") from None
            if key in first_line:
                raise self.fail(knode, f"duplicate key {key!r} (the first is on line {first_line[key]})")
            first_line[key] = line
            self.doc.lines[path + (key,)] = line
            out[key] = self.build(vnode, path + (key,))
        return out

    def _scalar(self, node: yaml.Node, path: KeyPath) -> Any:
        style = getattr(node, "style", None) or ""
        first = node.start_mark.line + 1 + (1 if style in ("|", ">") else 0)
        last = max(first, node.end_mark.line + (0 if style in ("|", ">") else 1))
        self.doc.spans[path] = Span(first, last, style)
        return self._value(node)

    def _value(self, node: yaml.Node) -> Any:
        tag = node.tag
        if tag == _STR:
            return node.value  # the common case, without the constructor's bookkeeping
        make = self.constructor.yaml_constructors.get(tag) if tag in _PLAIN_TAGS else None
        try:
            if make is not None:  # int, float, bool, null: straight to the constructor of the tag
                return make(self.constructor, node)
            return self.constructor.construct_object(node, deep=True)
        except yaml.YAMLError as exc:
            problem = getattr(exc, "problem", None) or str(exc).splitlines()[0]
            raise self.fail(node, f"not valid YAML: {problem}") from None
