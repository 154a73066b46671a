"""Loading a rule set from files: one rule per ``*.yaml`` (or ``*.yml``) file, macros beside them.

Called at engine start, by ``whywait rules check`` and by hot reload.  Files
named ``*.test.yaml`` (``*.test.yml``) are rule tests, and ``macros.yaml``
(``macros.yml``) holds named conditions shared by the set; both are skipped as
rules.  Every error of every file is collected; :func:`load_rules` raises one
:class:`RuleLoadError` listing them all.
"""

from __future__ import annotations

import dataclasses
import difflib
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterable  # noqa: UP035

import jinja2
from whywait.engine.diagnosis import Evidence
from whywait.engine.errors import RuleError
from whywait.engine.rules.metrics import METRICS
from whywait.engine.rules.schema import Rule, RuleSchemaError, parse_rule
from whywait.engine.rules.templating import TEMPLATE_VARS, TemplateOrigin, note_origin, problems, undeclared
from whywait.engine.rules.templating import env as _env

from whywait import yamlio
from whywait.errors import YamlError

MACROS_FILE = "macros.yaml"
TEST_SUFFIX = ".test.yaml"
# Both spellings of YAML's extension: a folder of `.yml` rules must not pass `rules check` as "0 rule(s) OK".
YAML_SUFFIXES = (".yaml", ".yml")
MACROS_FILES = tuple(f"macros{s}" for s in YAML_SUFFIXES)
TEST_SUFFIXES = tuple(f".test{s}" for s in YAML_SUFFIXES)


def yaml_files(folder: Path) -> list[Path]:
    """Every ``*.yaml`` and ``*.yml`` file under ``folder``, sorted."""
    return sorted(f for s in YAML_SUFFIXES for f in folder.rglob(f"*{s}"))


def is_test_file(path: Path) -> bool:
    """Whether ``path`` is named as a rule test (``x.test.yaml`` or ``x.test.yml``)."""
    return path.name.endswith(TEST_SUFFIXES)


def tested_rule_id(test_file: Path) -> str:
    """The rule id a test file is named after: ``network.x.test.yml`` -> ``network.x``."""
    name = test_file.name
    return next((name[: -len(s)] for s in TEST_SUFFIXES if name.endswith(s)), name)


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
    # Rules an override removed (``disable: true``), by id, with the file that did: known, not loaded.  Another
    # rule's ``inhibits``/``supersedes`` and a rule test may still name them (there is simply nothing to mute).
    disabled: dict[str, str] = field(default_factory=dict)

    def __iter__(self):  # type: ignore[no-untyped-def]
        return iter(self.rules.values())

    def __len__(self) -> int:
        return len(self.rules)


def rule_files(paths: Iterable[str | Path]) -> list[Path]:
    """Expand files and folders into the sorted list of rule files (tests and macros excluded).

    A file reached twice (``--rules rules/ --rules rules/network``) is listed once, where first reached.
    """
    out: list[Path] = []
    seen: set[Path] = set()
    for p in map(Path, paths):
        cands = yaml_files(p) if p.is_dir() else [p]
        for c in cands:
            if is_test_file(c) or c.name in MACROS_FILES or c.resolve() in seen:
                continue
            seen.add(c.resolve())
            out.append(c)
    return out


def _yaml_error(e: YamlError) -> RuleSchemaError:
    return RuleSchemaError(e.source, e.line, None, "", e.problem + yaml_hint(e))


_QUOTE_FIRST = re.compile(r"""^\s*(?:-\s+)?[^\s:#'"{\[][^:#]*:\s+[{\["']""")
_COLON_IN_VALUE = re.compile(r"""^\s*(?:-\s+)?[^\s:#'"][^:#]*:\s+[^'"\s].*:(\s|$)""")
_INDENT = ("; check the indentation here and on the line above: a mapping's keys start in one column, a list's "
           "items ('- ') under their key, with spaces")


def yaml_hint(e: YamlError) -> str:
    """Plain words after PyYAML's for the usual slips in a rule or test file, from the line it names ('' if none).

    ``expected <block end>, but found '<block mapping start>'`` says nothing to most rule authors: the slips behind
    it are a key indented off its mapping's column, a tab, a value with ``: `` in it, or one starting with ``{``
    (a Jinja template), ``[`` or a quote that does not end it, which YAML reads as YAML rather than as text.
    """
    p = e.problem
    if not p.startswith("not valid YAML") and "non-scalar key" not in p:
        return ""
    if "'\\t'" in p or "'\t'" in p:
        return "; a tab: YAML indents with spaces only, replace the tab with spaces"
    try:
        text = Path(e.source).read_text(encoding="utf-8").splitlines()[e.line - 1] if e.line > 0 else ""
    except (OSError, UnicodeDecodeError, IndexError):
        text = ""
    if "\t" in text[: len(text) - len(text.lstrip())]:
        return "; a tab: YAML indents with spaces only, replace the tab with spaces"
    if _QUOTE_FIRST.match(text) and ("'<scalar>'" in p or "non-scalar key" in p):  # text after a {..}, [..], ".."
        return ("; a value starting with '{', '[' or a quote is read as YAML, not text: quote the whole value "
                "(title: \"{{ job }} is slow\", with ' inside if need be)")
    if "mapping values are not allowed" in p and _COLON_IN_VALUE.match(text):
        return "; a value holding ': ' must be quoted (title: \"slow: really\")"
    if any(k in p for k in ("expected <block end>", "mapping values are not allowed", "did not find expected key",
                            "could not find expected ':'", "expected <document start>")):
        return _INDENT
    return ""


def _load_macros(paths: Iterable[Path], errors: list[RuleSchemaError],
                 where: dict[str, tuple[str, dict[Any, int]]] | None = None) -> dict[str, Any]:
    """The macros of the ``macros.yaml`` in (or given as) ``paths``; ``where`` gets each one's file and lines."""
    macros: dict[str, Any] = {}
    for f in (f for p in paths for f in ([p / m for m in MACROS_FILES] if p.is_dir() else [p])):
        if f.name not in MACROS_FILES or not f.exists():
            continue
        try:
            y = yamlio.load(f)
            data = y.data
        except YamlError as e:
            errors.append(_yaml_error(e))
            continue
        if not isinstance(data, dict) or not isinstance(data.get("macros", {}), dict):
            errors.append(RuleSchemaError(str(f), 1, None, "macros", "must be a mapping of name → condition"))
            continue
        macros.update(data.get("macros", {}))
        if where is not None:
            where.update((str(name), (str(f), y.lines)) for name in data.get("macros", {}))
    return macros




#: evidence names the evaluator adds beside the metrics: a topology fact, and another rule's clean check seen
_EV_EXTRA = ("topology", "check")
_EV_FIELDS = frozenset(f.name for f in dataclasses.fields(Evidence))


def _evidence_refs(template: jinja2.nodes.Template) -> list[tuple[int, str, str | None]]:
    """Every ``ev['name']`` (and ``ev['name'].field``) in a parsed template: ``(template line, name, field)``."""
    out: list[tuple[int, str, str | None]] = []
    attrs = {id(g.node): g.attr for g in template.find_all(jinja2.nodes.Getattr)}
    for item in template.find_all(jinja2.nodes.Getitem):
        target, arg = item.node, item.arg
        if isinstance(target, jinja2.nodes.Name) and target.name == "ev" and isinstance(arg, jinja2.nodes.Const) \
                and isinstance(arg.value, str):
            out.append((item.lineno, arg.value, attrs.get(id(item))))
    return out


def _check_templates(rule: Rule, errors: list[RuleSchemaError], doc: _Doc) -> None:
    """Parse every template of ``rule`` and check the names it reads; errors point at their line in the file.

    Called once per loaded rule.  A Jinja syntax error is placed on the file line of the template line
    Jinja names (exact for ``|`` blocks, see :class:`whywait.yamlio.Span`); an ``ev['...']`` naming no
    metric, or a variable the evaluator does not fill, is refused so a typo never reaches a pager.
    """
    texts: list[tuple[str, str, tuple[Any, ...]]] = [
        (key, getattr(rule, key), (key,)) for key in ("title", "cause", "next_step")]
    texts += [("culprit", rule.culprit, ("culprit",))] if rule.culprit else []
    texts += [(f"checks[{i}].name", c.name, ("checks", i, "name")) for i, c in enumerate(rule.checks)]
    # A label value may be a template too (`phase: "{{ phase }}"`): the diagnosis carries it rendered.
    texts += [(f"labels.{k}", v, ("labels", k)) for k, v in rule.labels.items() if "{" in v]
    for key, text, path in texts:
        file = str(doc.origins[path[0]][0]) if path[0] in doc.origins else rule.file
        span = doc.spans.get(path)
        line_at: Callable[[int], int] = span.line_in if span is not None else _fixed(yamlio.line_of(doc.lines, path))
        raw = doc.texts.get(path)
        folded = raw is not None and span is not None and span.style != "|"
        try:
            parsed = _env.parse(text)
            found = problems(text)
            if found and raw is not None and folded:  # the text as written in the file: each problem on its line
                found = _same_problems(found, problems(raw))
            unknown = sorted(undeclared(text)) if not found else []
        except jinja2.TemplateSyntaxError as e:
            errors.append(RuleSchemaError(file, _syntax_line(doc, path, e, line_at), rule.id, key,
                                          f"template does not parse: {e.message}"))
            continue
        except Exception as e:  # noqa: BLE001 - whatever else Jinja raises on a template is that template's fault
            errors.append(RuleSchemaError(file, line_at(1), rule.id, key,
                                          f"template cannot be checked: {type(e).__name__}: {e}"))
            continue
        for lineno, message in found:
            errors.append(RuleSchemaError(file, line_at(lineno), rule.id, key, f"template: {message}"))
        if found:
            continue
        note_origin(text, TemplateOrigin(rule.id, key, file, line_at(1)))
        if unknown:
            errors.append(RuleSchemaError(
                file, line_at(1), rule.id, key, f"template uses unknown variable(s) {', '.join(unknown)} "
                f"(known: {', '.join(sorted(TEMPLATE_VARS))})"))
        if raw is not None and folded:
            try:  # the text as written in the file, so each reference has its own line (see _syntax_line)
                parsed = _env.parse(raw)
            except jinja2.TemplateSyntaxError:
                pass
        for lineno, name, attr in _evidence_refs(parsed):
            if name not in METRICS and name not in _EV_EXTRA:
                near = difflib.get_close_matches(name, list(METRICS), n=1)
                hint = f"; did you mean {near[0]!r}?" if near else " (see `whywait rules metrics`)"
                errors.append(RuleSchemaError(file, line_at(lineno), rule.id, key,
                                              f"template reads ev[{name!r}], which is not a metric{hint}"))
            if attr is not None and attr not in _EV_FIELDS:
                errors.append(RuleSchemaError(file, line_at(lineno), rule.id, key,
                                              f"template reads ev[{name!r}].{attr}, which evidence does not have "
                                              f"(fields: {', '.join(sorted(_EV_FIELDS))})"))


def _same_problems(found: list[tuple[int, str]], as_written: list[tuple[int, str]]) -> list[tuple[int, str]]:
    """The problems found in the text as YAML gave it, on the lines of the text as written when both agree."""
    return as_written if [m for _, m in as_written] == [m for _, m in found] else found


def _fixed(line: int) -> Callable[[int], int]:
    return lambda _template_line: line


def _syntax_line(doc: _Doc, path: tuple[Any, ...], e: jinja2.TemplateSyntaxError,
                 at: Callable[[int], int]) -> int:
    """The file line of a template syntax error.

    YAML folds the lines of a ``>`` block or a multi-line plain value, so Jinja's line number counts lines
    that are not the file's.  Parsing the text as written in the file (folding changes only whitespace,
    which Jinja's tags ignore) gives the error's line in the file's terms.
    """
    raw, span = doc.texts.get(path), doc.spans.get(path)
    if raw is not None and span is not None and span.style != "|":
        try:
            _env.parse(raw)
        except jinja2.TemplateSyntaxError as again:
            return span.line_in(again.lineno or 1)
    return at(e.lineno or 1)


@dataclass
class _Doc:
    """One rule document on its way to parsing, with where each key came from."""

    file: Path
    data: Any
    lines: dict[Any, int]
    expected_id: str | None = None
    origins: dict[str, tuple[Path, int]] = field(default_factory=dict)  # overridden key -> (file, line)
    spans: dict[Any, yamlio.Span] = field(default_factory=dict)  # where each scalar's text stands
    texts: dict[Any, str] = field(default_factory=dict)  # each scalar's text as written in the file

    def __post_init__(self) -> None:
        if self.expected_id is None:
            self.expected_id = self.file.stem


def _apply_overrides(docs: list[_Doc], errors: list[RuleSchemaError],
                     disabled: dict[str, str] | None = None) -> list[_Doc]:
    """Apply ``override:`` and ``extends:`` documents, in load order, to the rules they name.

    A site keeps its changes in its own folder, loaded after the shipped one
    (``--rules rules/ --rules site-rules/``), without copying the shipped rule:

    - ``override: <id>`` replaces the top-level keys it sets in that rule (``labels`` are merged);
      ``disable: true`` removes the rule (``disabled`` gets its id and the override's file).  Its file name is
      free.  ``disable`` must be a YAML boolean: ``"true"``, ``1`` or ``yes please`` were taken for false, and
      the rule stayed enabled with the check saying OK.
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
    if disabled is None:
        disabled = {}
    for m in mods:
        key = "override" if "override" in m.data else "extends"
        target = m.data[key]
        if "disable" in m.data:
            where = m.lines.get(("disable",), m.lines.get((key,), 1))
            if key == "extends":
                errors.append(RuleSchemaError(str(m.file), where, None, "disable",
                                              "is for an override: (to drop a rule made with extends:, delete its "
                                              "file)"))
                continue
            if not isinstance(m.data["disable"], bool):
                errors.append(RuleSchemaError(str(m.file), where, None, "disable",
                                              f"must be true or false, unquoted (got {m.data['disable']!r})"))
                continue
        base = by_id.get(target)
        if base is None:
            errors.append(RuleSchemaError(str(m.file), m.lines.get((key,), 1), None, key,
                                          f"must name a rule loaded before it (got {target!r})"
                                          f"{_override_hint(target, list(by_id))}"))
            continue
        changes = {k: v for k, v in m.data.items() if k not in (key, "disable")}
        if key == "override":
            if m.data.get("disable") is True:
                disabled[target] = str(m.file)
                continue
            if "id" in changes and changes["id"] != target:
                errors.append(RuleSchemaError(str(m.file), m.lines.get(("id",), 1), target, "id",
                                              "an override cannot rename its rule (use extends:)"))
                continue
            doc = base
        else:
            doc = _Doc(m.file, dict(base.data), dict(base.lines), origins=dict(base.origins),
                       spans=dict(base.spans), texts=dict(base.texts))
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
            for path, span in m.spans.items():
                if path and path[0] == k:
                    doc.spans[path] = span
                    doc.texts.pop(path, None)
                    if path in m.texts:
                        doc.texts[path] = m.texts[path]
        doc.data = merged
        if key == "extends":
            by_id.setdefault(str(merged.get("id")), doc)
    return [d for d in plain if not (isinstance(d.data, dict) and d.data.get("id") in disabled)]


#: What ``--rules shipped`` (``rules check``, ``rules test``, ``replay``) names: :func:`shipped_rules_dir`.
SHIPPED = "shipped"


def shipped_rules_dir() -> Path:
    """The rules shipped with whywait: ``whywait/rules`` in an installed wheel (package data), ``rules/`` in a
    checkout; both two folders above this one."""
    return Path(__file__).resolve().parents[2] / "rules"


def _shipped_ids() -> list[str]:
    """The ids of the shipped rules (a rule's id is its file's name)."""
    return [f.stem for f in rule_files([shipped_rules_dir()])] if shipped_rules_dir().is_dir() else []


def _override_hint(target: Any, loaded: list[str]) -> str:
    """What to do about an ``override:``/``extends:`` naming no rule loaded before it.

    The usual slip is a site folder checked or loaded alone (``rules check site-rules``): the rule it changes is
    a shipped one, which must be loaded first.  Else a typo: the nearest id loaded or shipped.
    """
    if not isinstance(target, str):
        return ""
    shipped = _shipped_ids()
    if target in shipped:
        return (f"; {target!r} is a shipped rule: load the shipped rules first, before this folder "
                f"(--rules {SHIPPED}, that is {shipped_rules_dir()})")
    near = difflib.get_close_matches(target, sorted({*loaded, *shipped}), n=1, cutoff=0.8)
    if near:
        return f"; did you mean {near[0]!r}?"
    return "; load the rules that hold it first, before this folder (--rules FOLDER)"


def _attribute(e: RuleSchemaError, doc: _Doc) -> RuleSchemaError:
    """Name the override file, not the shipped one, for an error in a key the override set."""
    top = e.path.split(".")[0].split("[")[0]
    if top in doc.origins:
        f, _ = doc.origins[top]
        return RuleSchemaError(str(f), e.line, e.rule_id, e.path, e.message)
    return e


# The usual slip behind a rule named but not loaded: a sub-folder loaded without the rest of its tree.
_LOAD_HINT = "; load the folder that holds it too, e.g. --rules rules"


def load_rules(paths: Iterable[str | Path]) -> RuleSet:
    """Load every rule under ``paths``; raise :class:`RuleLoadError` listing all problems."""
    given = [Path(p) for p in paths]
    errors: list[RuleSchemaError] = []
    for p in given:
        if not p.exists():
            errors.append(RuleSchemaError(str(p), 0, None, "", "no such file or folder"))
    macro_lines: dict[str, tuple[str, dict[Any, int]]] = {}
    macros = _load_macros(given, errors, macro_lines)
    rules: dict[str, Rule] = {}
    files = rule_files(p for p in given if p.exists())
    docs: list[_Doc] = []
    broken: set[str] = set()  # ids of rules whose files were refused (a rule's id is its file's name)
    seen_macro: set[str] = set()
    for f in files:
        try:
            y = yamlio.load(f)
        except YamlError as e:
            errors.append(_yaml_error(e))
            broken.add(f.stem)
            continue
        docs.append(_Doc(f, y.data, y.lines, spans=y.spans,
                         texts={p: y.source_text(sp) for p, sp in y.spans.items() if sp.last > sp.first}))
    disabled: dict[str, str] = {}
    for doc in _apply_overrides(docs, errors, disabled):
        rule, errs = parse_rule(doc.data, str(doc.file), doc.lines, macros, expected_id=doc.expected_id,
                                macro_lines=macro_lines)
        # an error in a macro's own value is reported once, at its line in the macros file, however many use it
        errors += [e for e in (_attribute(e, doc) for e in errs) if e.rule_id is not None or str(e) not in seen_macro]
        seen_macro.update(str(e) for e in errs if e.rule_id is None)
        if rule is None:
            # its own errors say what is wrong; the rules that inhibit or supersede it need not say it again
            broken.add(str(doc.data.get("id") or doc.expected_id) if isinstance(doc.data, dict) else "")
            continue
        if rule.id in rules:
            errors.append(RuleSchemaError(str(doc.file), doc.lines.get(("id",), 1), rule.id, "id",
                                          f"duplicates the rule in {rules[rule.id].file}"))
            continue
        _check_templates(rule, errors, doc)
        rules[rule.id] = rule
    # A rule another one names but an override disabled is known: the reference has nothing to mute.
    known = rules.keys() | broken | disabled.keys()
    for rule in rules.values():
        for i, target in enumerate(rule.inhibits):
            if target not in known:
                errors.append(RuleSchemaError(rule.file, rule.inhibits_line, rule.id, f"inhibits[{i}]",
                                              f"must name a loaded rule (got {target!r}){_LOAD_HINT}"))
        for i, target in enumerate(rule.supersedes):
            if target not in known or target == rule.id:
                hint = _LOAD_HINT if target != rule.id else ""
                errors.append(RuleSchemaError(rule.file, rule.supersedes_line, rule.id, f"supersedes[{i}]",
                                              f"must name another loaded rule (got {target!r}){hint}"))
    if given and not files and not errors and not any(is_test_file(p) or p.name in MACROS_FILES for p in given):
        # A folder given by mistake (an empty one, the wrong level) would otherwise replay, backtest or run the
        # engine with no rule at all and report nothing found: a clean bill that nothing was checked for.
        # (`rules check` of a test or macros file alone loads no rule, on purpose.)
        where = ", ".join(str(p) for p in given)
        errors.append(RuleSchemaError(where, 0, None, "",
                                      "holds no rule file (a .yaml or .yml file other than macros and *.test.yaml)"))
    if errors:
        raise RuleLoadError(errors)
    return RuleSet(rules, tuple(str(f) for f in files), disabled)
