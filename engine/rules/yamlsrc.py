"""YAML loading that remembers where every value came from.

Called by the rule loader (and the rule-test loader) so that every schema error
can name the file and line of the offending key.  :func:`load_with_lines`
returns plain Python data plus a map from key path (a tuple of keys and list
indexes) to its 1-based line number.
"""

from __future__ import annotations

from typing import Any

import yaml

Path_ = tuple[Any, ...]


class YamlSyntaxError(ValueError):
    """The text is not YAML at all; ``line`` is 1-based."""

    def __init__(self, message: str, line: int) -> None:
        self.line = line
        super().__init__(message)


def load_with_lines(text: str) -> tuple[Any, dict[Path_, int]]:
    """Parse ``text`` and return ``(data, lines)``; raise :class:`YamlSyntaxError` on bad YAML."""
    try:
        node = yaml.compose(text, Loader=yaml.SafeLoader)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None) or getattr(exc, "context_mark", None)
        line = mark.line + 1 if mark is not None else 1
        problem = getattr(exc, "problem", None) or str(exc)
        raise YamlSyntaxError(f"not valid YAML: {problem}", line) from None
    lines: dict[Path_, int] = {}
    if node is None:
        return None, lines
    return _convert(node, (), lines), lines


def _convert(node: yaml.Node, path: Path_, lines: dict[Path_, int]) -> Any:
    lines[path] = node.start_mark.line + 1
    if isinstance(node, yaml.MappingNode):
        out: dict[Any, Any] = {}
        for knode, vnode in node.value:
            if knode.tag == "tag:yaml.org,2002:merge" or not isinstance(knode, yaml.ScalarNode):
                # `<<: *anchor` merge keys and complex keys: refuse them with their line rather than
                # build something the schema would misread.
                what = "a merge key (<<)" if knode.tag == "tag:yaml.org,2002:merge" else "a non-scalar key"
                raise YamlSyntaxError(f"{what} is not supported here: write the keys out",
                                      knode.start_mark.line + 1)
            key = _scalar(knode)
            if key in out:
                raise YamlSyntaxError(f"duplicate key {key!r} (the first is on line {lines[path + (key,)]})",
                                      knode.start_mark.line + 1)
            lines[path + (key,)] = knode.start_mark.line + 1
            out[key] = _convert(vnode, path + (key,), lines)
            lines[path + (key,)] = knode.start_mark.line + 1
        return out
    if isinstance(node, yaml.SequenceNode):
        return [_convert(v, path + (i,), lines) for i, v in enumerate(node.value)]
    return _scalar(node)


def _scalar(node: yaml.Node) -> Any:
    loader = yaml.SafeLoader("")
    try:
        return loader.construct_object(node, deep=True)
    finally:
        loader.dispose()


def line_of(lines: dict[Path_, int], path: Path_) -> int:
    """Return the line of ``path``, or of its nearest ancestor that has one."""
    p = tuple(path)
    while p:
        if p in lines:
            return lines[p]
        p = p[:-1]
    return lines.get((), 1)
