"""Loading a rule set from files: one rule per ``*.yaml`` file, macros beside them.

Called at engine start, by ``whywait rules check`` and by hot reload.  Files
named ``*.test.yaml`` are rule tests, and ``macros.yaml`` holds named conditions
shared by the set; both are skipped as rules.  Every error of every file is
collected; :func:`load_rules` raises one :class:`RuleLoadError` listing them all.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterable

import jinja2

from engine.errors import RuleError
from engine.rules.schema import Rule, RuleSchemaError, parse_rule
from engine.rules.templating import env as _env
from engine.rules.yamlsrc import YamlSyntaxError, load_with_lines

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




def _check_templates(rule: Rule, errors: list[RuleSchemaError]) -> None:
    for key in ("title", "cause", "next_step"):
        try:
            _env.from_string(getattr(rule, key))
        except jinja2.TemplateSyntaxError as e:
            errors.append(RuleSchemaError(rule.file, e.lineno, rule.id, key, f"template does not parse: {e.message}"))
    for i, c in enumerate(rule.checks):
        try:
            _env.from_string(c.name)
        except jinja2.TemplateSyntaxError as e:
            errors.append(RuleSchemaError(rule.file, e.lineno, rule.id, f"checks[{i}].name",
                                          f"template does not parse: {e.message}"))


def load_rules(paths: Iterable[str | Path]) -> RuleSet:
    """Load every rule under ``paths``; raise :class:`RuleLoadError` listing all problems."""
    paths = [Path(p) for p in paths]
    errors: list[RuleSchemaError] = []
    for p in paths:
        if not p.exists():
            errors.append(RuleSchemaError(str(p), 0, None, "", "no such file or folder"))
    macros = _load_macros(paths, errors)
    rules: dict[str, Rule] = {}
    files = rule_files(p for p in paths if p.exists())
    for f in files:
        try:
            data, lines = load_with_lines(f.read_text())
        except YamlSyntaxError as e:
            errors.append(RuleSchemaError(str(f), e.line, None, "", str(e)))
            continue
        except OSError as e:
            errors.append(RuleSchemaError(str(f), 0, None, "", f"cannot read: {e.strerror}"))
            continue
        rule, errs = parse_rule(data, str(f), lines, macros, expected_id=f.stem)
        errors += errs
        if rule is None:
            continue
        if rule.id in rules:
            errors.append(RuleSchemaError(str(f), lines.get(("id",), 1), rule.id, "id",
                                          f"duplicates the rule in {rules[rule.id].file}"))
            continue
        _check_templates(rule, errors)
        rules[rule.id] = rule
    for rule in rules.values():
        for i, target in enumerate(rule.inhibits):
            if target not in rules:
                errors.append(RuleSchemaError(rule.file, rule.inhibits_line, rule.id, f"inhibits[{i}]",
                                              f"must name a loaded rule (got {target!r})"))
    if errors:
        raise RuleLoadError(errors)
    return RuleSet(rules, tuple(str(f) for f in files))
