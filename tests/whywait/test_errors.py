"""One exception tree: every error whywait raises on purpose is a WhywaitError, one subtree per package."""

from __future__ import annotations

import importlib
import inspect
import pkgutil

import pytest

from whywait.errors import EXIT_CODES, WhywaitError

PACKAGES = ("whywait.agents", "whywait.engine", "whywait.topology", "whywait.simulate")


def _all_modules() -> list[str]:
    # whywait's own modules by name: walking the root package would walk the checkout again through it
    names = ["whywait.errors", "whywait.yamlio", "whywait.durations"]
    for pkg in PACKAGES:
        mod = importlib.import_module(pkg)
        names.append(pkg)
        for info in pkgutil.walk_packages(mod.__path__, pkg + "."):
            names.append(info.name)
    return names


def test_every_public_error_class_is_in_the_tree() -> None:
    strays = []
    for name in _all_modules():
        try:
            mod = importlib.import_module(name)
        except ImportError:  # an optional extra (kubernetes, matplotlib) that is not installed
            continue
        for cls_name, cls in inspect.getmembers(mod, inspect.isclass):
            if cls.__module__ != name or cls_name.startswith("_") or not issubclass(cls, Exception):
                continue
            if not issubclass(cls, WhywaitError):
                strays.append(f"{name}.{cls_name}")
    assert strays == []


def test_one_topology_error_and_rule_schema_errors_are_rule_errors() -> None:
    from whywait.engine import errors as engine_errors
    from whywait.engine.rules.schema import RuleSchemaError
    from whywait.simulate.ruletest import RuleTestError
    from whywait.topology import errors as topology_errors

    assert engine_errors.TopologyError is topology_errors.TopologyError
    assert issubclass(RuleSchemaError, engine_errors.RuleError)
    assert issubclass(RuleTestError, engine_errors.RuleError)
    assert engine_errors.WhywaitError is WhywaitError


@pytest.mark.parametrize("path, code", [
    ("whywait.engine.errors.ConfigError", 2), ("whywait.engine.errors.RuleError", 2),
    ("whywait.topology.errors.TopologyError", 2), ("whywait.simulate.errors.SimulationError", 2),
    ("whywait.errors.YamlError", 2), ("whywait.agents.events.ContractError", 2),
    ("whywait.engine.errors.BrokerUnavailable", 3), ("whywait.engine.errors.NotifyError", 3),
    ("whywait.engine.localkafka.broker.BrokerStartError", 3), ("whywait.agents.errors.CollectorOff", 3),
])
def test_each_kind_has_a_documented_exit_code(path: str, code: int) -> None:
    mod, name = path.rsplit(".", 1)
    cls = getattr(importlib.import_module(mod), name)
    assert cls.exit_code == code and code in EXIT_CODES
