"""One policy vocabulary: the names of policy kinds, scorers and capabilities are defined once in
``kvres.policy`` (a ``Literal`` beside the table that maps each name to its class); no code compares
a policy kind or a scorer name, or asks ``isinstance`` of a residency or scorer class (it asks the
object); and ``policy/`` names no engine (a ``LoadReport`` says whether the backend's engine evicts
by itself)."""

from __future__ import annotations

import ast
import re
from dataclasses import fields
from pathlib import Path
from typing import get_args

import pytest

from kvres.actors.backend_setup.engine_registry import ENGINES
from kvres.actors.config import SessionPolicy
from kvres.policy.capabilities import Capabilities, CapabilityName
from kvres.policy.residency import RESIDENCIES, EngineEviction, PolicyKind, make_residency
from kvres.policy.scorers import SCORERS, ScorerName, scorer_for

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = ("policy", "coldstore", "actors", "cluster", "testing")
KINDS = set(get_args(PolicyKind))
SCORER_NAMES = set(get_args(ScorerName))
POLICY_CLASSES = {"Residency", "NoEviction", "Streaming", "Scored", "EngineEvicts",
                  "Scorer", "SnapKV", "H2O", "KeyNorm"}
# "none" is a common word (a RoPE scaling, a tool choice): it counts where a kind or scorer is compared
GENERIC = {"none"}


def _modules(*packages: str) -> list[Path]:
    return sorted(p for pkg in packages for p in (ROOT / pkg).rglob("*.py"))


def _strings(node: ast.expr) -> set[str]:
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return {node.value}
    if isinstance(node, ast.Tuple | ast.List | ast.Set):
        return {s for elt in node.elts for s in _strings(elt)}
    return set()


def _names(node: ast.expr) -> set[str]:
    return {n.id for n in ast.walk(node) if isinstance(n, ast.Name)} | {
        n.attr for n in ast.walk(node) if isinstance(n, ast.Attribute)}


def _vocabulary_comparisons(tree: ast.AST) -> list[int]:
    vocabulary = KINDS | SCORER_NAMES
    lines = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Compare):
            operands = [node.left, *node.comparators]
            said = set().union(*map(_strings, operands)) & vocabulary
            about_policy = any("kind" in n or "scorer" in n for op in operands for n in _names(op))
            if said - GENERIC or (said and about_policy):
                lines.append(node.lineno)
        elif isinstance(node, ast.MatchValue) and _strings(node.value) & vocabulary:
            lines.append(node.lineno)
    return lines


def _class_checks(tree: ast.AST) -> list[int]:
    lines = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and len(node.args) == 2 \
                and node.func.id in ("isinstance", "issubclass") and _names(node.args[1]) & POLICY_CLASSES:
            lines.append(node.lineno)
    return lines


def test_each_name_is_defined_once_beside_its_class() -> None:
    assert set(RESIDENCIES) == KINDS and all(cls.kind == kind for kind, cls in RESIDENCIES.items())
    assert set(SCORERS) == SCORER_NAMES and all(cls.name == name for name, cls in SCORERS.items())
    assert set(get_args(CapabilityName)) == {f.name for f in fields(Capabilities)}
    for kind in KINDS:
        residency = make_residency(kind, budget_tokens=128)
        assert type(residency) is RESIDENCIES[kind] and residency.kind == kind
        assert residency.keeps_every_token == (kind == "none")
    for name in SCORER_NAMES:
        assert scorer_for(name, 8).name == name
    with pytest.raises(ValueError, match="unknown policy kind 'x'; known: none, streaming, scored, engine"):
        make_residency("x")
    engine = SessionPolicy.engine_evicts(128, sink_tokens=2, recent_tokens=32, aggregation="SUM").residency
    told = engine.engine_eviction()
    assert isinstance(told, EngineEviction) and (told.budget_tokens, told.aggregation) == (128, "SUM")
    assert (told.stream.sink_tokens, told.stream.recent_tokens) == (2, 32)


def test_no_code_compares_policy_kinds_or_scorer_names() -> None:
    found = {}
    for path in _modules(*PACKAGES):
        lines = _vocabulary_comparisons(ast.parse(path.read_text(), str(path)))
        if lines:
            found[str(path.relative_to(ROOT))] = lines
    assert not found, f"policy kinds or scorer names compared (ask the residency object instead): {found}"


def test_no_code_asks_isinstance_of_a_policy_class() -> None:
    found = {}
    for path in _modules(*PACKAGES):
        lines = _class_checks(ast.parse(path.read_text(), str(path)))
        if lines:
            found[str(path.relative_to(ROOT))] = lines
    assert not found, f"isinstance of a residency or scorer class (ask the object instead): {found}"


def test_policy_names_no_engine() -> None:
    engine_name = re.compile("|".join(rf"(?<![\w.-]){re.escape(name)}(?![\w.-])" for name in ENGINES))
    found = {}
    for path in _modules("policy"):
        lines = [i for i, line in enumerate(path.read_text().splitlines(), 1) if engine_name.search(line)]
        if lines:
            found[str(path.relative_to(ROOT))] = lines
    assert not found, f"engine names in policy/ (say what the engine can do instead): {found}"


def test_the_checks_find_what_they_look_for() -> None:
    assert _vocabulary_comparisons(ast.parse('if policy.kind == "none": pass')) == [1]
    assert _vocabulary_comparisons(ast.parse('x = name in ("snapkv", "h2o")')) == [1]
    assert _vocabulary_comparisons(ast.parse('x = scaling not in (None, "none")')) == []
    assert _vocabulary_comparisons(ast.parse('x = action.kind == "suspend"')) == []
    assert _class_checks(ast.parse("x = isinstance(r, (Scored, Streaming))")) == [1]
    assert _class_checks(ast.parse("x = isinstance(c, KeyCapture)")) == []
