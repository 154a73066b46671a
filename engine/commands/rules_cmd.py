"""``whywait rules``: lint rules, run their tests, list the metrics they may use.

- ``whywait rules check PATH...``: load without running anything; every schema error of every
  file (with file and line), duplicate ids, inhibitions naming no rule, templates that do not parse or read
  an unknown metric, and rule tests (``*.test.yaml``) checked as strictly as rules: unknown keys, fault
  names, events against the contract, expectations naming no rule.  Exit 1 when anything is wrong.
- ``whywait rules test DIR|FILE...``: run the rule tests under the paths through the same evaluator as
  production, against the rules *in those paths* (plus ``--rules PATH``, e.g. the shipped rules a site
  folder overrides or inhibits, and the rules tree a path lies in: ``rules/`` for ``rules/network``,
  said in one line); print one line per case and the failures in full; ``--junit FILE`` writes JUnit
  XML for CI.  Exit 1 when a case fails.
- ``whywait rules metrics``: the metric names, their level and unit.
- ``whywait rules conditions``: the condition types and their parameters, from the one registry;
  ``--docs FILE`` rewrites the generated condition tables of a Markdown file (``docs/rules.md``).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path


def register(p: argparse.ArgumentParser) -> None:
    """Add the ``check``, ``test`` and ``metrics`` actions; called by :func:`whywait.engine.cli.build_parser`."""
    sub = p.add_subparsers(dest="action", metavar="ACTION", required=True)
    c = sub.add_parser("check", help="lint rule files and folders, and their tests")
    c.add_argument("paths", nargs="*", type=Path, help="rule files or folders (default: ./rules)")
    t = sub.add_parser("test", help="run rule tests (*.test.yaml) against the rules beside them")
    t.add_argument("paths", nargs="*", type=Path,
                   help="folders of rules and their tests, or test files (default: ./rules)")
    t.add_argument("--rules", action="append", type=Path, default=[],
                   help="more rules to load first, e.g. the shipped ones a site folder overrides, "
                        "inhibits or takes macros from (repeatable)")
    t.add_argument("--require-all", action="store_true", help="fail when a rule under test has no test file")
    t.add_argument("--junit", type=Path, metavar="FILE", help="also write the results as JUnit XML to FILE")
    sub.add_parser("metrics", help="list the metrics rules may name")
    cd = sub.add_parser("conditions", help="list the condition types and their parameters")
    cd.add_argument("--docs", type=Path, metavar="FILE",
                    help="rewrite the generated condition tables in FILE (docs/rules.md) instead")


def run(args: argparse.Namespace) -> int:
    """Run the chosen action; return 0 when all is well, 1 when a check or a case failed."""
    if args.action == "metrics":
        from whywait.engine.rules.metrics import METRICS

        for m in METRICS.values():
            print(f"{m.name:32} {m.level:6} {m.unit:12} {m.doc}")
        return 0
    if args.action == "conditions":
        return _conditions(args.docs)
    if args.action == "check":
        return _check(args.paths or [_default_dir()])
    return _test(args)


def _default_dir() -> Path:
    from whywait.engine.commands.engine_cmd import default_rules_dir

    return default_rules_dir()


def _check(paths: list[Path]) -> int:
    from whywait.engine.rules.loader import RuleLoadError, is_test_file, load_rules
    from whywait.simulate.ruletest import RuleTestError, find_test_files, load_cases

    _require(paths)
    problems: list[str] = []
    rule_ids = None
    n_rules = 0
    try:
        rs = load_rules(paths)
        # with no rule among the paths (test files given alone) there is nothing to check their names against
        rule_ids, n_rules = (rs.rules.keys() if len(rs) else None), len(rs)
    except RuleLoadError as exc:
        problems += [str(e) for e in exc.errors]
    tests = [p for p in paths if p.is_dir() or is_test_file(p)]
    n_tests = 0
    for f in find_test_files(p for p in tests if p.exists()):
        n_tests += 1
        try:
            # with the rules broken, still check everything a test file says on its own
            load_cases(f, rule_ids)
        except RuleTestError as exc:
            problems += exc.problems
    for line in problems:
        print(line)
    if problems:
        print(f"{len(problems)} error(s)", file=sys.stderr)
        return 1
    print(f"{n_rules} rule(s) and {n_tests} test file(s) OK", file=sys.stderr)
    return 0


def _test(args: argparse.Namespace) -> int:
    from whywait.engine.errors import ConfigError
    from whywait.engine.rules.loader import RuleSet, load_rules, rule_files
    from whywait.simulate.ruletest import junit_xml, run_files, untested_rules

    paths: list[Path] = args.paths or [_default_dir()]
    _require([*args.rules, *paths])
    # The rules under test are the ones in the paths given: a folder's rules, or the rule a test file is
    # named after.  --rules come first, so a site folder's `override:` finds the rule it changes; then the
    # rules tree a path lies in (rules/ for rules/network), for the macros and rules it refers to.
    under_test = [p if p.is_dir() else _rule_beside(p) for p in paths]
    trees: list[Path] = []
    for p in paths:
        tree = rules_tree(p)
        if tree is not None and not any(_within(tree, q) for q in [*args.rules, *paths, *trees]):
            trees.append(tree)
            print(f"rules test: {p} lies in the rules tree {_shown(tree)}: loading its other rules too, for the "
                  "macros and rules it refers to (--rules to choose others)", file=sys.stderr)
    rules = load_rules([*args.rules, *trees, *(p for p in under_test if p is not None)])
    results = run_files(rules, paths)
    failed = [r for r in results if not r.ok]
    for r in results:
        print(f"{'PASS' if r.ok else 'FAIL'}  {r.file}: {r.name}")
        for failure in r.failures:
            print(f"      {failure}")
    missing: list[str] = []
    if args.require_all:  # only the rules under test need cases, not the ones --rules brought in
        files = {str(f) for f in rule_files(p for p in under_test if p is not None)}
        missing = untested_rules(RuleSet({k: r for k, r in rules.rules.items() if r.file in files}), paths)
    for rid in missing:
        print(f"FAIL  rule {rid} has no test cases")
    print(f"{len(results) - len(failed)} passed, {len(failed) + len(missing)} failed")
    if args.junit:
        try:
            args.junit.write_text(junit_xml(results))
        except OSError as exc:
            raise ConfigError(f"--junit {args.junit}: cannot write: {exc.strerror or exc}") from None
    return 1 if failed or missing else 0


def _require(paths: list[Path]) -> None:
    """Refuse a path that does not exist, in one line, before loading anything."""
    from whywait.engine.errors import ConfigError

    for p in paths:
        if not p.exists():
            raise ConfigError(f"{p}: no such file or folder")


def rules_tree(path: Path) -> Path | None:
    """The rules tree ``path`` lies inside: the nearest folder above it holding ``macros.yaml`` or ``macros.yml``
    (the shipped ``rules/``, or a site's own tree laid out the same way), or None.

    A folder that holds its macros file itself is a tree's root, not inside one.  Called by ``rules test``,
    whose rules in ``rules/network`` use macros and inhibit rules that live elsewhere in ``rules/``.
    """
    from whywait.engine.rules.loader import MACROS_FILES

    def has_macros(folder: Path) -> bool:
        return any((folder / m).is_file() for m in MACROS_FILES)

    here = path.absolute()
    if here.is_dir() and has_macros(here):
        return None
    for folder in (here if here.is_dir() else here.parent, *here.parents):
        if has_macros(folder):
            return folder
    return None


def _within(path: Path, other: Path) -> bool:
    """Whether ``path`` is ``other`` or lies inside it."""
    return path.resolve().is_relative_to(other.resolve())


def _shown(path: Path) -> str:
    """``path`` relative to the working folder when it lies there (``rules/``), else absolute."""
    try:
        return f"{path.relative_to(Path.cwd())}/"
    except ValueError:
        return f"{path}/"


def _rule_beside(test_file: Path) -> Path | None:
    """The rule file a test file is named after (``x.test.yaml`` or ``x.test.yml`` -> ``x.yaml`` or ``x.yml``),
    when it exists."""
    from whywait.engine.rules.loader import YAML_SUFFIXES, is_test_file, tested_rule_id

    if not is_test_file(test_file):
        return None
    rules = (test_file.with_name(tested_rule_id(test_file) + s) for s in YAML_SUFFIXES)
    return next((r for r in rules if r.is_file()), None)


def _conditions(docs: Path | None) -> int:
    """List every registered condition type, or rewrite the generated tables of ``docs``; return the exit code."""
    from whywait.engine.rules.condition_types import condition_types, default_text, update_docs

    if docs is not None:
        try:
            text = docs.read_text(encoding="utf-8")
            new = update_docs(text)
        except (OSError, UnicodeDecodeError, ValueError) as exc:
            print(f"{docs}: {getattr(exc, 'strerror', None) or exc}", file=sys.stderr)
            return 1
        if new != text:
            docs.write_text(new, encoding="utf-8")
        print(f"{docs}: {'updated' if new != text else 'already up to date'}", file=sys.stderr)
        return 0
    for ct in condition_types().values():
        print(f"{ct.name}: {ct.doc}")
        for s in ct.specs:
            print(f"    {s.key:20} {s.kind.text:22} {default_text(s):10} {s.doc}")
    return 0
