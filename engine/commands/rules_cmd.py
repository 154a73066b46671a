"""``whywait rules``: lint rules, run their tests, list the metrics they may use.

- ``whywait rules check PATH...``: load without running anything; every schema error of every
  file (with file and line), duplicate ids, inhibitions naming no rule, templates that do not parse or read
  an unknown metric, and rule tests (``*.test.yaml``) checked as strictly as rules: unknown keys, fault
  names, events against the contract, expectations naming no rule.
- ``whywait rules test DIR|FILE...``: run the rule tests under the paths through the same evaluator as
  production, against the rules *in those paths* (plus ``--rules PATH``, e.g. the shipped rules a site
  folder overrides or inhibits, and the rules tree a path lies in: ``rules/`` for ``rules/network``,
  said in one line); print one line per case and the failures in full; ``--show`` prints the message each
  alert a case raised would send (title, cause, evidence, next step: what the console notifier prints);
  ``--junit FILE`` writes JUnit XML for CI.
- ``whywait rules metrics``: the metric names, their level and unit.
- ``whywait rules conditions``: the condition types and their parameters, from the one registry;
  ``--docs FILE`` rewrites the generated condition tables of a Markdown file (``docs/rules.md``).

``check`` and ``test`` exit alike (:data:`EXIT_STATUS`, in their ``--help``): 1 when the rules or their tests
are wrong (a file that does not load, named with its line; for ``test``, also a case that failed), 2 for a
wrong command line (a flag, a path that does not exist or is not a rule or test file, an unwritable
``--junit FILE``).  A broken rule made ``check`` exit 1 and ``test`` exit 2.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Iterable

if TYPE_CHECKING:
    from whywait.engine.diagnosis import Diagnosis
    from whywait.simulate.ruletest import CaseResult


#: The exit status of ``rules check`` and ``rules test``, one meaning per code (printed by their ``--help``).
EXIT_STATUS = {
    0: "every rule and test file loads (check), and every case passes (test)",
    1: "the rules or their tests are wrong: a file that does not load (each problem with its file and line), "
       "or a case that failed (test)",
    2: "usage: an unknown flag, a path that does not exist or is not a rule or test file, an unwritable "
       "--junit FILE",
}
EXIT_RULES = 1


def _epilog() -> str:
    import textwrap

    return "exit status:\n" + "\n".join(textwrap.fill(what, 88, initial_indent=f"  {code}  ", subsequent_indent=" " * 5)
                                         for code, what in EXIT_STATUS.items())


def path_arg(text: str) -> Path:
    """A path argument (argparse's ``type``); an empty one (an unset variable: ``rules check "$RULES"``) is refused:
    as ``Path("")`` it would name the working folder, and check or test whatever lies there.  ``export`` uses it
    too."""
    if not text.strip():
        raise argparse.ArgumentTypeError("an empty path (an unset variable?)")
    return Path(text)


def rules_path_arg(text: str) -> Path:
    """A rules path argument (``rules check``/``test`` paths and ``--rules``, ``replay --rules``/``--against``):
    as :func:`path_arg`, and the word ``shipped`` names the rules shipped with whywait, wherever it is installed
    (a folder of that name is ``./shipped``)."""
    from whywait.engine.rules.loader import SHIPPED, shipped_rules_dir

    return shipped_rules_dir() if text == SHIPPED else path_arg(text)


_RULES_HELP = ("more rules to load first, e.g. the shipped ones a site folder overrides, inhibits or takes macros "
               "from: --rules shipped (repeatable)")


def register(p: argparse.ArgumentParser) -> None:
    """Add the ``check``, ``test`` and ``metrics`` actions; called by :func:`whywait.engine.cli.build_parser`."""
    sub = p.add_subparsers(dest="action", metavar="ACTION", required=True)
    c = sub.add_parser("check", help="lint rule files and folders, and their tests", epilog=_epilog(),
                       description="Load rule files and rule tests without running anything; print every problem "
                                   "with its file and line.",
                       formatter_class=argparse.RawDescriptionHelpFormatter)
    c.add_argument("paths", nargs="*", type=rules_path_arg,
                   help="rule files or folders ('shipped': the rules shipped with whywait; default: ./rules)")
    c.add_argument("--rules", action="append", type=rules_path_arg, default=[],
                   help=_RULES_HELP + "; loaded and checked, their tests not")
    t = sub.add_parser("test", help="run rule tests (*.test.yaml) against the rules beside them", epilog=_epilog(),
                       description="Run each case of the rule tests through the engine's evaluator; print one line "
                                   "per case, and each failure.",
                       formatter_class=argparse.RawDescriptionHelpFormatter)
    t.add_argument("paths", nargs="*", type=rules_path_arg,
                   help="folders of rules and their tests, or test files ('shipped': the rules shipped with "
                        "whywait; default: ./rules)")
    t.add_argument("--show", action="store_true",
                   help="print, under each case, the message each alert it raised would send (as the console "
                        "notifier prints it: title, cause, evidence, next step), once per alert, as it first fired")
    t.add_argument("--rules", action="append", type=rules_path_arg, default=[], help=_RULES_HELP)
    t.add_argument("--require-all", action="store_true", help="fail when a rule under test has no test file")
    t.add_argument("--junit", type=path_arg, metavar="FILE", help="also write the results as JUnit XML to FILE")
    sub.add_parser("metrics", help="list the metrics rules may name")
    cd = sub.add_parser("conditions", help="list the condition types and their parameters")
    cd.add_argument("--docs", type=Path, metavar="FILE",
                    help="rewrite the generated condition tables in FILE (docs/rules.md) instead")


def run(args: argparse.Namespace) -> int:
    """Run the chosen action; return its exit status (:data:`EXIT_STATUS`; a usage error raises ConfigError)."""
    if args.action == "metrics":
        from whywait.engine.rules.metrics import METRICS

        for m in METRICS.values():
            print(f"{m.name:32} {m.level:6} {m.unit:12} {m.doc}")
        return 0
    if args.action == "conditions":
        return _conditions(args.docs)
    if args.action == "check":
        return _check(args.paths or [_default_dir()], getattr(args, "rules", []))
    return _test(args)


def _default_dir() -> Path:
    from whywait.engine.commands.engine_cmd import default_rules_dir

    return default_rules_dir()


def _check(paths: list[Path], more: list[Path] | None = None) -> int:
    """``rules check``: load ``more`` (``--rules``) and ``paths``, check the tests under ``paths``; the exit status."""
    from whywait.engine.rules.loader import RuleLoadError, is_test_file, load_rules, rule_files
    from whywait.simulate.ruletest import RuleTestError, find_test_files, load_cases

    more = more or []
    _require(more, "rule")
    _require(paths, "rule")
    problems: list[str] = []
    rule_ids: set[str] | None = None
    disabled: dict[str, str] = {}
    n_rules = 0
    # --rules come first, so a site folder's `override:` finds the shipped rule it changes (as in `rules test`)
    trees = _trees_of(paths, more, "rules check")
    try:
        rs = load_rules([*more, *trees, *paths])
        # with no rule among the paths (test files given alone) there is nothing to check their names against;
        # a rule an override disabled is known (a test may still name it)
        disabled = rs.disabled
        rule_ids, n_rules = ({*rs.rules, *disabled} if len(rs) else None), len(rs)
        if trees or more:  # count the rules of the paths given, not the others loaded beside them
            mine = {f.resolve() for f in rule_files(paths)}
            n_rules = sum(1 for r in rs.rules.values() if Path(r.file).resolve() in mine)
    except RuleLoadError as exc:
        problems += [str(e) for e in exc.errors]
    tests = [p for p in paths if p.is_dir() or is_test_file(p)]
    n_tests = 0
    files, skipped = _skip_disabled(_unique(find_test_files(p for p in tests if p.exists())), disabled)
    _say_skipped("rules check", skipped, disabled)
    for f in files:
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
        return EXIT_RULES
    print(f"{n_rules} rule(s) and {n_tests} test file(s) OK", file=sys.stderr)
    return 0


def _test(args: argparse.Namespace) -> int:
    from whywait.engine.commands.outputs import check_output
    from whywait.engine.errors import ConfigError, RuleError
    from whywait.engine.rules.loader import RuleSet, load_rules, rule_files
    from whywait.simulate.ruletest import find_test_files, junit_xml, run_files, untested_rules

    paths: list[Path] = args.paths or [_default_dir()]
    _require(args.rules, "rule")
    _require(paths, "test")
    check_output(args.junit, "--junit")  # refused now, not after every case has run
    # The rules under test are the ones in the paths given: a folder's rules, or the rule a test file is
    # named after.  --rules come first, so a site folder's `override:` finds the rule it changes; then the
    # rules tree a path lies in (rules/ for rules/network), for the macros and rules it refers to.
    under_test = [p if p.is_dir() else _rule_beside(p) for p in paths]
    trees = _trees_of(paths, args.rules, "rules test")
    try:
        rules = load_rules([*args.rules, *trees, *(p for p in under_test if p is not None)])
        # a test file reached twice (`rules test rules rules/gpu`) runs once.  Each result is printed (and flushed)
        # as its case ends: the shipped tree takes minutes, and piped output showed nothing until the end.
        test_files, skipped = _skip_disabled(_unique(find_test_files(paths)), rules.disabled)
        _say_skipped("rules test", skipped, rules.disabled)
        results = run_files(rules, test_files, on_start=_say_start, on_result=lambda r: _print_result(r, args.show))
        missing: list[str] = []
        if args.require_all:  # only the rules under test need cases, not the ones --rules brought in
            files = {str(f) for f in rule_files(p for p in under_test if p is not None)}
            missing = untested_rules(RuleSet({k: r for k, r in rules.rules.items() if r.file in files}), paths)
    except RuleError as exc:
        # A rule or test file that does not load is what `rules check` reports, and exits alike for (it exited 2
        # here, as a usage error): the rules are wrong, not the command line.  Nothing ran.
        print(f"whywait rules: {exc}", file=sys.stderr)
        return EXIT_RULES
    failed = [r for r in results if not r.ok]
    for rid in missing:
        print(f"FAIL  rule {rid} has no test cases")
    print(f"{len(results) - len(failed)} passed, {len(failed) + len(missing)} failed")
    if args.junit:
        try:
            args.junit.write_text(junit_xml(results))
        except OSError as exc:
            raise ConfigError(f"--junit {args.junit}: cannot write: {exc.strerror or exc}") from None
    return EXIT_RULES if failed or missing else 0


def _skip_disabled(files: list[Path], disabled: dict[str, str]) -> tuple[list[Path], list[tuple[Path, str]]]:
    """``files`` without the tests of a rule an override disabled, and those left out with their rule's id.

    A test file tests the rule its ``rule:`` names, else the one it is named after.  A site that disables a
    shipped rule (``override: job.whole-job-slow`` + ``disable: true``) and checks or tests the shipped tree
    with its folder has nothing to run that rule's cases against: they are skipped, and said so in one line.
    """
    if not disabled:
        return files, []
    from whywait.engine.rules.loader import tested_rule_id

    from whywait import yamlio
    from whywait.errors import YamlError

    keep: list[Path] = []
    skipped: list[tuple[Path, str]] = []
    for f in files:
        try:
            data = yamlio.load(f).data
        except YamlError:
            keep.append(f)  # its own error is reported as it is checked
            continue
        rid = data.get("rule") if isinstance(data, dict) else None
        rid = rid if isinstance(rid, str) and rid else tested_rule_id(f)
        if rid in disabled:
            skipped.append((f, rid))
        else:
            keep.append(f)
    return keep, skipped


def _say_skipped(who: str, skipped: list[tuple[Path, str]], disabled: dict[str, str]) -> None:
    """One line on stderr naming the test files left out as their rule is disabled, and what disabled it."""
    if skipped:
        said = "; ".join(f"{f} ({rid}, disabled by {disabled[rid]})" for f, rid in skipped)
        print(f"{who}: skipped {len(skipped)} test file(s) of disabled rule(s): {said}", file=sys.stderr)


def _say_start(cases: int, files: int) -> None:
    print(f"rules test: running {cases} case(s) from {files} test file(s)", file=sys.stderr, flush=True)


def _print_result(r: CaseResult, show: bool) -> None:
    """One case's PASS/FAIL line and its failures (and with ``--show`` its messages), flushed."""
    print(f"{'PASS' if r.ok else 'FAIL'}  {r.file}: {r.name}")
    for failure in r.failures:
        print(f"      {failure}")
    if show:
        _show(r)
    sys.stdout.flush()


def _show(r: CaseResult) -> None:
    """Print the message of each alert case ``r`` raised, as it first fired (``rules test --show``).

    One message per incident (its fingerprint): the evaluator re-announces an incident as its evidence changes,
    and the notifier edits the one message it posted; the header says how often, and whether it resolved.
    """
    from whywait.engine.notify.render import plain_text

    first: dict[str, Diagnosis] = {}
    updates: dict[str, int] = {}
    resolved: set[str] = set()
    for d in r.diagnoses:
        if d.status == "resolved":
            resolved.add(d.fingerprint)
        elif d.fingerprint in first:
            updates[d.fingerprint] = updates.get(d.fingerprint, 0) + 1
        else:
            first[d.fingerprint] = d
    if not first:
        print("      (no alert)")
    for fp, d in first.items():
        n = updates.get(fp, 0)
        then = ", ".join(x for x in (f"updated {n} time{'s' if n != 1 else ''}" if n else "",
                                      "then resolved" if fp in resolved else "") if x)
        print(f"      > {d.rule_id}" + (f" ({then})" if then else "") + ":")
        for line in plain_text(d).splitlines():
            print(f"        {line}".rstrip())


def _unique(files: Iterable[Path]) -> list[Path]:
    """``files`` without the ones reached twice (a folder and a folder inside it, a path given twice)."""
    seen: set[Path] = set()
    out: list[Path] = []
    for f in files:
        if f.resolve() not in seen:
            seen.add(f.resolve())
            out.append(f)
    return out


def _require(paths: list[Path], kind: str) -> None:
    """Refuse, in one line and before loading anything, a path that does not exist or cannot be what it is given
    as: a file given as rules (``kind`` "rule") that is not YAML, or a file given to ``rules test`` (``kind``
    "test") that is not a rule test.  A usage error (exit 2): the command line is wrong, not the rules."""
    from whywait.engine.errors import ConfigError
    from whywait.engine.rules.loader import TEST_SUFFIXES, YAML_SUFFIXES, is_test_file

    for p in paths:
        if not p.exists():
            raise ConfigError(f"{p}: no such file or folder")
        if p.is_dir():
            continue
        if not p.is_file():
            raise ConfigError(f"{p}: is not a file or a folder")
        if kind == "test" and not is_test_file(p):
            tests = [t for t in (p.with_name(p.stem + s) for s in TEST_SUFFIXES) if t.is_file()]
            hint = f"; its tests are {tests[0]}" if tests and p.suffix in YAML_SUFFIXES else ""
            raise ConfigError(f"{p}: is not a rule-test file: rules test takes test files (named "
                              f"*{' or *'.join(TEST_SUFFIXES)}) or folders of rules and their tests{hint}")
        if kind == "rule" and p.suffix not in YAML_SUFFIXES:
            raise ConfigError(f"{p}: is not a rule file (rule files are YAML, named *{' or *'.join(YAML_SUFFIXES)})")


def _trees_of(paths: list[Path], given: list[Path], who: str) -> list[Path]:
    """The rules trees ``paths`` lie in that no path given already covers, each said once on stderr.

    ``rules check rules/network`` and ``rules test rules/network`` both load the rest of ``rules/``: the
    macros and the rules those in ``network`` inhibit live there (check reported them missing).
    """
    trees: list[Path] = []
    for p in paths:
        tree = rules_tree(p)
        if tree is not None and not any(_within(tree, q) for q in [*given, *paths, *trees]):
            trees.append(tree)
            print(f"{who}: {p} lies in the rules tree {_shown(tree)}: loading its other rules too, for the "
                  "macros and rules it refers to" + (" (--rules to choose others)" if who == "rules test" else ""),
                  file=sys.stderr)
    return trees


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
