"""Loading a rule set from files: one rule per ``*.yaml`` file, macros beside them.

Called at engine start, by ``whywait rules check`` and by hot reload.  Files
named ``*.test.yaml`` are rule tests, and ``macros.yaml`` holds named conditions
shared by the set; both are skipped as rules.  Every error of every file is
collected; :func:`load_rules` raises one :class:`RuleLoadError` listing them all.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterable  # noqa: UP035

import jinja2
from whywait.engine.errors import RuleError
from whywait.engine.rules.schema import Rule, RuleSchemaError, parse_rule
from whywait.engine.rules.templating import TEMPLATE_VARS, undeclared
from whywait.engine.rules.templating import env as _env
from whywait.engine.rules.yamlsrc import YamlSyntaxError, load_with_lines

MACROS_FILE = "macros.yaml"
TEST_SUFFIX = ".test.yaml"


class RuleLoadError(RuleError):
    """One or more rule files are invalid; ``errors`` holds each, ``str()`` lists them one per line."""

    def __init__(self, errors: list[RuleSchemaError]) -> None:
        self.errors = errors
        super().__init__(f"{len(errors)} error(s) in rules:\n" + "\n".join(f"  {e}" for e in errors)
                         if len(errors) > 1 else str(errors[0]))


@dataclass(frozen=True)
class RuleSet:
    """The loaded rules, by id, with the files they came from."""

    rules: dict[str, Rule] = field(default_factory=dict)
    files: tuple[str, ...] = ()

    def __iter__(self):  # type: ignore[no-untyped-def]
        return iter(self.rules.values())

    def __len__(self) -> int:
        return len(self.rules)


def rule_files(paths: Iterable[str | Path]) -> list[Path]:
    """Expand files and folders into the sorted list of rule files (tests and macros excluded)."""
    out: list[Path] = []
    for p in map(Path, paths):
        cands = sorted(p.rglob("*.yaml")) if p.is_dir() else [p]
        out += [c for c in cands if not c.name.endswith(TEST_SUFFIX) and c.name != MACROS_FILE]
    return out


def _load_macros(paths: Iterable[Path], errors: list[RuleSchemaError]) -> dict[str, Any]:
    macros: dict[str, Any] = {}
    for p in paths:
        f = p / MACROS_FILE if p.is_dir() else None
        if f is None or not f.exists():
            continue
        try:
            data, lines = load_with_lines(f.read_text())
        except YamlSyntaxError as e:
            errors.append(RuleSchemaError(str(f), e.line, None, "", str(e)))
            continue
        if not isinstance(data, dict) or not isinstance(data.get("macros", {}), dict):
            errors.append(RuleSchemaError(str(f), 1, None, "macros", "must be a mapping of name → condition"))
            continue
        macros.update(data.get("macros", {}))
    return macros




def _check_templates(rule: Rule, errors: list[RuleSchemaError], lines: dict[Any, int]) -> None:
    texts: list[tuple[str, str, tuple[Any, ...]]] = [
        (key, getattr(rule, key), (key,)) for key in ("title", "cause", "next_step")]
    texts += [("culprit", rule.culprit, ("culprit",))] if rule.culprit else []
    texts += [(f"checks[{i}].name", c.name, ("checks", i, "name")) for i, c in enumerate(rule.checks)]
    # A label value may be a template too (`phase: "{{ phase }}"`): the diagnosis carries it rendered.
    texts += [(f"labels.{k}", v, ("labels", k)) for k, v in rule.labels.items() if "{" in v]
    for key, text, path in texts:
        try:
            _env.from_string(text)
        except jinja2.TemplateSyntaxError as e:
            errors.append(RuleSchemaError(rule.file, e.lineno, rule.id, key, f"template does not parse: {e.message}"))
            continue
        unknown = sorted(undeclared(text))
        if unknown:
            errors.append(RuleSchemaError(
                rule.file, lines.get(path, 1), rule.id, key, f"template uses unknown variable(s) {', '.join(unknown)} "
                f"(known: {', '.join(sorted(TEMPLATE_VARS))})"))


@dataclass
class _Doc:
    """One rule document on its way to parsing, with where each key came from."""

    file: Path
    data: Any
    lines: dict[Any, int]
    expected_id: str | None = None
    origins: dict[str, tuple[Path, int]] = field(default_factory=dict)  # overridden key -> (file, line)

    def __post_init__(self) -> None:
        if self.expected_id is None:
            self.expected_id = self.file.stem


def _apply_overrides(docs: list[_Doc], errors: list[RuleSchemaError]) -> list[_Doc]:
    """Apply ``override:`` and ``extends:`` documents, in load order, to the rules they name.

    A site keeps its changes in its own folder, loaded after the shipped one
    (``--rules rules/ --rules site-rules/``), without copying the shipped rule:

    - ``override: <id>`` replaces the top-level keys it sets in that rule (``labels`` are merged);
      ``disable: true`` removes the rule.  Its file name is free.
    - ``extends: <id>`` plus its own ``id`` makes a new rule that starts as a copy of ``<id>``.
    """
    by_id: dict[str, _Doc] = {}
    plain: list[_Doc] = []
    mods: list[_Doc] = []
    for d in docs:
        if isinstance(d.data, dict) and ("override" in d.data or "extends" in d.data):
            mods.append(d)
        else:
            plain.append(d)
            if isinstance(d.data, dict) and isinstance(d.data.get("id"), str):
                by_id.setdefault(d.data["id"], d)
    disabled: set[str] = set()
    for m in mods:
        key = "override" if "override" in m.data else "extends"
        target = m.data[key]
        base = by_id.get(target)
        if base is None:
            errors.append(RuleSchemaError(str(m.file), m.lines.get((key,), 1), None, key,
                                          f"must name a rule loaded before it (got {target!r})"))
            continue
        changes = {k: v for k, v in m.data.items() if k not in (key, "disable")}
        if key == "override":
            if m.data.get("disable") is True:
                disabled.add(target)
                continue
            if "id" in changes and changes["id"] != target:
                errors.append(RuleSchemaError(str(m.file), m.lines.get(("id",), 1), target, "id",
                                              "an override cannot rename its rule (use extends:)"))
                continue
            doc = base
        else:
            doc = _Doc(m.file, dict(base.data), dict(base.lines), origins=dict(base.origins))
            plain.append(doc)
        merged = dict(doc.data)
        for k, v in changes.items():
            if k == "labels" and isinstance(v, dict) and isinstance(merged.get("labels"), dict):
                merged["labels"] = {**merged["labels"], **v}
            else:
                merged[k] = v
            doc.origins[k] = (m.file, m.lines.get((k,), 1))
            for path, line in m.lines.items():
                if path and path[0] == k:
                    doc.lines[path] = line
        doc.data = merged
        if key == "extends":
            by_id.setdefault(str(merged.get("id")), doc)
    return [d for d in plain if not (isinstance(d.data, dict) and d.data.get("id") in disabled)]


def _attribute(e: RuleSchemaError, doc: _Doc) -> RuleSchemaError:
    """Name the override file, not the shipped one, for an error in a key the override set."""
    top = e.path.split(".")[0].split("[")[0]
    if top in doc.origins:
        f, _ = doc.origins[top]
        return RuleSchemaError(str(f), e.line, e.rule_id, e.path, e.message)
    return e


def load_rules(paths: Iterable[str | Path]) -> RuleSet:
    """Load every rule under ``paths``; raise :class:`RuleLoadError` listing all problems."""
    given = [Path(p) for p in paths]
    errors: list[RuleSchemaError] = []
    for p in given:
        if not p.exists():
            errors.append(RuleSchemaError(str(p), 0, None, "", "no such file or folder"))
    macros = _load_macros(given, errors)
    rules: dict[str, Rule] = {}
    files = rule_files(p for p in given if p.exists())
    docs: list[_Doc] = []
    for f in files:
        try:
            data, lines = load_with_lines(f.read_text())
        except YamlSyntaxError as e:
            errors.append(RuleSchemaError(str(f), e.line, None, "", str(e)))
            continue
        except OSError as e:
            errors.append(RuleSchemaError(str(f), 0, None, "", f"cannot read: {e.strerror}"))
            continue
        docs.append(_Doc(f, data, lines))
    for doc in _apply_overrides(docs, errors):
        rule, errs = parse_rule(doc.data, str(doc.file), doc.lines, macros, expected_id=doc.expected_id)
        errors += [_attribute(e, doc) for e in errs]
        if rule is None:
            continue
        if rule.id in rules:
            errors.append(RuleSchemaError(str(doc.file), doc.lines.get(("id",), 1), rule.id, "id",
                                          f"duplicates the rule in {rules[rule.id].file}"))
            continue
        _check_templates(rule, errors, doc.lines)
        rules[rule.id] = rule
    for rule in rules.values():
        for i, target in enumerate(rule.inhibits):
            if target not in rules:
                errors.append(RuleSchemaError(rule.file, rule.inhibits_line, rule.id, f"inhibits[{i}]",
                                              f"must name a loaded rule (got {target!r})"))
    if errors:
        raise RuleLoadError(errors)
    return RuleSet(rules, tuple(str(f) for f in files))
