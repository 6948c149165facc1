"""The layers: policy <- coldstore <- actors <- cluster, with no import pointing up (lazy ones
included), kvres.testing above the engines but below the drivers, and no I/O in policy.

Every module is parsed (not imported), so an import inside a function counts as much as one at the
top of a file."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
LAYERS = ("policy", "coldstore", "actors", "cluster")
ALLOWED = {
    "policy": set(),
    "coldstore": {"policy"},
    "actors": {"policy", "coldstore"},
    "cluster": {"policy", "coldstore", "actors"},
    "testing": {"policy", "coldstore", "actors"},
}
POLICY_FORBIDDEN = {"os", "io", "logging", "pathlib", "tempfile", "shutil", "subprocess", "gguf", "ray",
                    "llama_cpp", "openvino", "openvino_genai", "torch", "platformdirs", "msgpack"}


def _modules(package: str) -> list[Path]:
    return sorted((ROOT / package).rglob("*.py"))


def _imports(path: Path, package: str) -> list[tuple[int, str]]:
    """Absolute names of everything ``path`` imports (relative imports resolved)."""
    rel = path.relative_to(ROOT / package).with_suffix("")
    here = ["kvres", package, *rel.parts[:-1]]  # the package the module lives in
    out: list[tuple[int, str]] = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            out += [(node.lineno, alias.name) for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = here[: len(here) - (node.level - 1)]
                name = ".".join(base + ([node.module] if node.module else []))
            else:
                name = node.module or ""
            out.append((node.lineno, name))
    return out


def _layer_of(name: str) -> str | None:
    parts = name.split(".")
    if len(parts) >= 2 and parts[0] == "kvres":
        return parts[1]
    return None


@pytest.mark.parametrize("package", [*LAYERS, "testing"])
def test_no_import_points_up(package: str) -> None:
    bad = []
    for path in _modules(package):
        for line, name in _imports(path, package):
            layer = _layer_of(name)
            if layer is not None and layer != package and layer not in ALLOWED[package]:
                bad.append(f"{path.relative_to(ROOT)}:{line} imports {name}")
    assert not bad, "imports pointing up the layers:\n" + "\n".join(bad)


def test_nothing_in_the_package_imports_the_test_doubles() -> None:
    bad = [
        f"{path.relative_to(ROOT)}:{line} imports {name}"
        for package in LAYERS for path in _modules(package)
        for line, name in _imports(path, package) if _layer_of(name) == "testing"
    ]
    assert not bad, "\n".join(bad)


def test_policy_does_no_io_and_loads_no_engine() -> None:
    bad = []
    for path in _modules("policy"):
        tree = ast.parse(path.read_text(), str(path))
        for line, name in _imports(path, "policy"):
            if name.split(".")[0] in POLICY_FORBIDDEN:
                bad.append(f"{path.relative_to(ROOT)}:{line} imports {name}")
        for node in ast.walk(tree):
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "open":
                bad.append(f"{path.relative_to(ROOT)}:{node.lineno} calls open()")
    assert not bad, "policy must stay pure:\n" + "\n".join(bad)


def test_the_checker_sees_lazy_and_relative_imports(tmp_path: Path) -> None:
    """The parser above must resolve ``from ..x import`` and imports inside functions."""
    pkg = tmp_path / "actors" / "llama"
    pkg.mkdir(parents=True)
    mod = pkg / "m.py"
    mod.write_text("def f():\n    from ...cluster import config\n    from ..store_ports import X\n")
    rel = mod.relative_to(tmp_path / "actors")
    assert rel.parts == ("llama", "m.py")
    global ROOT
    saved, ROOT = ROOT, tmp_path
    try:
        names = [n for _, n in _imports(mod, "actors")]
    finally:
        ROOT = saved
    assert names == ["kvres.cluster", "kvres.actors.store_ports"]
