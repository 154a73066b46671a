"""``whywait rules``: lint rules, run their tests, list the metrics they may use.

- ``whywait rules check PATH...``: load without running anything; every schema error of every
  file (with file and line), duplicate ids, inhibitions naming no rule, templates that do not parse,
  and rule tests that do not load.  Exit 1 when anything is wrong.
- ``whywait rules test FILE...``: run rule tests (``*.test.yaml``) through the same evaluator as
  production; print one line per case and the failures in full.  Exit 1 when a case fails.
- ``whywait rules metrics``: the metric names, their level and unit.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path


def register(p: argparse.ArgumentParser) -> None:
    sub = p.add_subparsers(dest="action", metavar="ACTION", required=True)
    c = sub.add_parser("check", help="lint rule files and folders")
    c.add_argument("paths", nargs="*", type=Path, help="rule files or folders (default: ./rules)")
    t = sub.add_parser("test", help="run rule tests (*.test.yaml)")
    t.add_argument("paths", nargs="*", type=Path, help="test files or folders (default: ./rules)")
    t.add_argument("--rules", action="append", type=Path, help="the rules under test (default: ./rules)")
    t.add_argument("--require-all", action="store_true", help="fail when a rule has no test file")
    sub.add_parser("metrics", help="list the metrics rules may name")


def run(args: argparse.Namespace) -> int:
    from whywait.engine.commands.engine_cmd import default_rules_dir
    from whywait.engine.rules.loader import RuleLoadError, load_rules

    if args.action == "metrics":
        from whywait.engine.rules.metrics import METRICS

        for m in METRICS.values():
            print(f"{m.name:32} {m.level:5} {m.unit:12} {m.doc}")
        return 0
    if args.action == "check":
        from whywait.simulate.ruletest import RuleTestError, find_test_files, load_cases

        paths = args.paths or [default_rules_dir()]
        try:
            rs = load_rules(paths)
        except RuleLoadError as exc:
            for e in exc.errors:
                print(e)
            print(f"{len(exc.errors)} error(s)", file=sys.stderr)
            return 1
        bad = 0
        for f in find_test_files(p for p in paths if p.is_dir()):
            try:
                load_cases(f)
            except RuleTestError as exc:
                print(exc)
                bad += 1
        print(f"{len(rs)} rule(s) OK" if not bad else f"{bad} test file(s) malformed", file=sys.stderr)
        return 1 if bad else 0
    from whywait.simulate.ruletest import run_files, untested_rules

    rules = load_rules(args.rules or [default_rules_dir()])
    paths = args.paths or [default_rules_dir()]
    results = run_files(rules, paths)
    failed = [r for r in results if not r.ok]
    for r in results:
        print(f"{'PASS' if r.ok else 'FAIL'}  {r.file}: {r.name}")
        for failure in r.failures:
            print(f"      {failure}")
    missing = untested_rules(rules, paths) if args.require_all else []
    for rid in missing:
        print(f"FAIL  rule {rid} has no test cases")
    print(f"{len(results) - len(failed)} passed, {len(failed) + len(missing)} failed")
    return 1 if failed or missing else 0
