"""The condition registry: every type's schema, docs and evaluation come from one class, and agree."""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from whywait.engine.evaluate.conditions import Ctx, Result, evaluate
from whywait.engine.evaluate.store import MetricStore
from whywait.engine.rules.condition_types import (
    CONDITIONS,
    Compare,
    ConditionParams,
    Duration,
    MetricName,
    Number,
    condition,
    condition_types,
    param,
    render_table,
    update_docs,
)
from whywait.engine.rules.loader import RuleLoadError, load_rules
from whywait.engine.rules.schema import Condition, leaves

DOCS = Path(__file__).resolve().parents[2] / "docs" / "rules.md"

# One YAML value per parameter kind, to build a leaf with only its required keys.
_SAMPLE = {"duration": "30s", "number": 2, "share (0–1)": 0.5, "comparison": "> 1.5", "metric": "gpu.temp_c",
           "list of integers": [79], "aggregation": "max"}


def _sample(kind_text: str) -> Any:
    return _SAMPLE[kind_text] if kind_text in _SAMPLE else kind_text.split(" | ")[0]


def _rule(leaf_yaml: str) -> str:
    return ("apiVersion: whywait/v1\nid: gpu.test-rule\ntitle: t\ncause: c\nnext_step: n\nwhen:\n"
            + "".join(f"  {line}\n" for line in leaf_yaml.splitlines()))


class _Job:
    """The placed job a condition is evaluated for (``JobView``)."""

    job: str = "j"
    project: str = "p"
    team: str = "t"
    channel: str | None = None
    ranks: dict[int, tuple[str, int]] = {0: ("n1", 0), 1: ("n2", 0)}


def test_every_registered_type_has_schema_docs_and_evaluation() -> None:
    types_ = condition_types()
    assert list(types_)[:3] == ["threshold", "peer_outlier", "self_history"] and len(types_) == 15
    for name, ct in types_.items():
        assert ct.params.type_name == name
        assert dataclasses.is_dataclass(ct.params) and ct.params.__dataclass_params__.frozen  # type: ignore
        assert ct.doc, f"{name}: the class docstring is its documentation"
        assert callable(ct.evaluate)
        for s in ct.specs:
            assert s.doc, f"{name}.{s.key} has no doc"
            if not s.required and s.default is not None:  # a default must pass its own parser
                text = {"duration": None, "comparison": f"{s.default}"}.get(s.kind.text, s.default)
                if text is not None:
                    assert s.kind.parse(text) == s.default, (name, s.key)


def test_docs_tables_match_the_registry() -> None:
    text = DOCS.read_text(encoding="utf-8")
    assert update_docs(text) == text, "docs/rules.md is stale: run `whywait rules conditions --docs docs/rules.md`"
    for ct in condition_types().values():
        assert render_table(ct) in text


def test_docs_without_a_table_for_a_type_is_refused() -> None:
    text = DOCS.read_text(encoding="utf-8")
    cut = text.replace("<!-- end generated: rotation -->", "")
    with pytest.raises(ValueError, match="no generated table for condition type 'rotation'"):
        update_docs(cut)


@pytest.mark.parametrize("name", list(condition_types()))
def test_schema_builds_the_class_and_evaluation_runs(tmp_path: Path, name: str) -> None:
    """A leaf with only the required keys loads into the type's class with the class's defaults, and evaluates."""
    ct = CONDITIONS[name]
    keys = [f"type: {name}"] + [f"{s.key}: {_sample(s.kind.text)!r}".replace("'", '"')
                                for s in ct.specs if s.required]
    if name == "peer_outlier":  # needs one of ratio / zscore (its check)
        keys.append('ratio: "> 2"')
    f = tmp_path / "gpu.test-rule.yaml"
    f.write_text(_rule("\n".join(keys)))
    [leaf] = leaves(load_rules([f]).rules["gpu.test-rule"].when)
    assert isinstance(leaf.params, ct.params)
    for s in ct.specs:
        if not s.required and not (name == "peer_outlier" and s.key == "ratio"):
            assert getattr(leaf.params, s.attr) == s.default
            assert leaf.params[s.key] == s.default  # the mapping read the step-aligned bodies use
    store = MetricStore()
    store.max_time = 1000.0
    r = evaluate(leaf, Ctx(store, 1000.0, _Job(), None, "gpu.test-rule", {}))
    assert isinstance(r, Result) and r.holds is False  # nothing stored: nothing holds


@pytest.mark.parametrize("yaml_,message", [
    ("type: peer_outlier\nmetric: gpu.temp_c", "'when' 'peer_outlier' needs 'ratio' or 'zscore'"),
    ("type: topology\npredicate: share_pool\nmetric: gpu.temp_c",
     "'when' 'topology' needs both 'metric' and 'value' (the other job's activity) or neither"),
    ("type: threshold\nmetric: gpu.temp_c\nvalue: '> 1'\nmin_share: 1.5",
     "'when.min_share' must be a share between 0 and 1 (got 1.5)"),
    ("type: absence\nlevel: gpu\nfor: 5s", "'when.level' must be one of rank, node (got 'gpu')"),
    ("type: peer_outlier\nmetric: gpu.temp_c\nratio: '> 2'\npeers: mount",
     "'when.peers' must be one of all, same_name (got 'mount')"),
])
def test_bad_parameters_name_file_line_expected_and_got(tmp_path: Path, yaml_: str, message: str) -> None:
    f = tmp_path / "gpu.test-rule.yaml"
    f.write_text(_rule(yaml_))
    with pytest.raises(RuleLoadError) as exc:
        load_rules([f])
    [err] = exc.value.errors
    assert str(err).startswith(f"{f}:")
    assert str(err).endswith(f"rule 'gpu.test-rule': {message}")


@dataclasses.dataclass(frozen=True, kw_only=True)
class _HotCondition(ConditionParams):
    """Test-only: entities whose latest value passes ``value``."""

    metric: MetricName = param(doc="the metric")
    value: Compare = param(doc="comparison")  # not a kind: refused at registration
    window: Duration = param(10.0, "window")


@dataclasses.dataclass(frozen=True, kw_only=True)
class _LatestCondition(ConditionParams):
    """Test-only: entities whose latest value is at least ``at_least``."""

    metric: MetricName = param(doc="the metric")
    at_least: Number = param(doc="the least value that holds")
    window: Duration = param(10.0, "window")


@pytest.fixture
def latest_registered() -> Iterator[None]:
    condition_types()

    @condition("latest_at_least", _LatestCondition)
    def _latest(c: Condition, ctx: Ctx) -> Result:
        p = c.params
        assert isinstance(p, _LatestCondition)
        hits = [e for e in ctx.entities("gpu") if (v := ctx.store.value(p.metric, e, "last", ctx.now, p.window))
                is not None and v >= p.at_least]
        return Result(bool(hits), hits)

    yield
    del CONDITIONS["latest_at_least"]


def test_one_declaration_adds_a_condition_type(tmp_path: Path, latest_registered: None) -> None:
    """A class and its registered function are all it takes: the schema reads it and the evaluator runs it."""
    f = tmp_path / "gpu.test-rule.yaml"
    f.write_text(_rule("type: latest_at_least\nmetric: gpu.temp_c\nat_least: 90\nculprit: true"))
    [leaf] = leaves(load_rules([f]).rules["gpu.test-rule"].when)
    store = MetricStore()
    store.put("gpu.temp_c", "n1/gpu0", 999.0, 95.0)
    store.put("gpu.temp_c", "n2/gpu0", 999.0, 60.0)
    store.max_time = 999.0
    ctx = Ctx(store, 1000.0, _Job(), None, "gpu.test-rule", {})
    r = evaluate(leaf, ctx)
    assert r.holds and r.entities == ["n1/gpu0"] and ctx.culprit_level == "gpu"
    f.write_text(_rule("type: latest_at_least\nmetric: gpu.temp_c"))
    with pytest.raises(RuleLoadError, match="'when.at_least' is required for 'latest_at_least'"):
        load_rules([f])


def test_registration_refuses_what_the_schema_could_not_read() -> None:
    with pytest.raises(TypeError, match="no parameter kind for annotation"):
        condition("hot", _HotCondition)(lambda c, ctx: Result(False))
    with pytest.raises(TypeError, match="registered twice"):
        condition("threshold", _LatestCondition)(lambda c, ctx: Result(False))
    assert "hot" not in CONDITIONS


def test_cli_lists_conditions_and_metrics_and_rewrites_stale_docs(tmp_path: Path,
                                                                   capsys: pytest.CaptureFixture[str]) -> None:
    from whywait.engine.cli import main

    assert main(["rules", "conditions"]) == 0
    out = capsys.readouterr().out
    assert "peer_outlier: An entity against its job's peers" in out
    assert "    peers                all | same_name" in out
    assert main(["rules", "metrics"]) == 0
    assert "storage.device.read_rtt_ms       device ms" in capsys.readouterr().out
    stale = tmp_path / "rules.md"
    text = DOCS.read_text(encoding="utf-8")
    stale.write_text(text.replace("| `peers` |", "| `peerz` |"), encoding="utf-8")
    assert main(["rules", "conditions", "--docs", str(stale)]) == 0
    assert stale.read_text(encoding="utf-8") == text
    assert capsys.readouterr().err.strip() == f"{stale}: updated"
    assert main(["rules", "conditions", "--docs", str(tmp_path / "missing.md")]) == 1
    assert capsys.readouterr().err.strip() == f"{tmp_path / 'missing.md'}: No such file or directory"
