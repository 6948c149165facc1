"""The layers: policy <- coldstore <- actors <- cluster, with no import pointing up (lazy ones
included), kvres.testing above the engines but below the drivers, no I/O in policy, no import
cycle among the modules of a package (sub-packages included) nor between sub-packages (each
package's top level one node, each direct sub-package another), no module over 600 lines; the backend host
and the engines import no Ray.

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


RAY_FREE = ("actors/host", "actors/engines")  # plain classes that work without Ray (the actors are shells)


def test_the_backend_host_and_the_engines_import_no_ray() -> None:
    bad = [
        f"{path.relative_to(ROOT)}:{line} imports {name}"
        for folder in RAY_FREE for path in sorted((ROOT / folder).rglob("*.py"))
        for line, name in _imports(path, "actors") if name.split(".")[0] == "ray"
    ]
    assert not bad, "the backend host and the engines work without Ray (Ray's shells live in actors/ray_actors/):\n" + \
        "\n".join(bad)


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


# ---- cycles inside a package ------------------------------------------------------------------

PACKAGES = (*LAYERS, "testing")


def _module_name(path: Path, package: str) -> str:
    rel = path.relative_to(ROOT / package).with_suffix("")
    parts = list(rel.parts[:-1] if rel.name == "__init__" else rel.parts)
    return ".".join(["kvres", package, *parts])


def _module_edges(path: Path, package: str, modules: set[str]) -> list[tuple[int, str]]:
    """The package's own modules ``path`` imports, wherever the import sits: ``from . import x``
    and ``from .p import x`` name the module ``x`` when it is one, else the package they come from."""
    here = _module_name(path, package).split(".")
    if path.name != "__init__.py":
        here = here[:-1]  # the package the module lives in
    out: list[tuple[int, str]] = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        targets: list[str] = []
        if isinstance(node, ast.Import):
            targets = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                base = ".".join(here[: len(here) - (node.level - 1)] + ([node.module] if node.module else []))
            targets = [f"{base}.{a.name}" if f"{base}.{a.name}" in modules else base for a in node.names]
        out += [(node.lineno, t) for t in dict.fromkeys(targets) if t in modules]
    return out


def _import_graph(package: str, root: Path | None = None) -> dict[str, dict[str, int]]:
    """module -> {imported module of the same package: line of the first such import}."""
    global ROOT
    saved, ROOT = ROOT, root or ROOT
    try:
        paths = {_module_name(p, package): p for p in _modules(package)}
        graph: dict[str, dict[str, int]] = {}
        for name, path in paths.items():
            edges = graph.setdefault(name, {})
            for line, target in _module_edges(path, package, set(paths)):
                edges.setdefault(target, line)
        return graph
    finally:
        ROOT = saved


def _cycles(graph: dict[str, dict[str, int]]) -> list[list[str]]:
    """One cycle (its modules in import order, the first repeated at the end) per knot of modules
    that import each other (a strongly connected component, Tarjan's); fix one, the next shows."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    components: list[set[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for nxt in graph[node]:
            if nxt not in index:
                visit(nxt)
                low[node] = min(low[node], low[nxt])
            elif nxt in on_stack:
                low[node] = min(low[node], index[nxt])
        if low[node] == index[node]:
            component = set()
            while True:
                member = stack.pop()
                on_stack.discard(member)
                component.add(member)
                if member == node:
                    break
            if len(component) > 1 or node in graph[node]:
                components.append(component)

    for node in sorted(graph):
        if node not in index:
            visit(node)
    cycles = []
    for component in components:
        start = min(component)
        path, seen = [start], {start}
        while True:  # walk inside the component until a module repeats: that loop is a cycle
            nxt = min(n for n in graph[path[-1]] if n in component)
            if nxt in seen:
                cycles.append([*path[path.index(nxt):], nxt])
                break
            path.append(nxt)
            seen.add(nxt)
    return cycles


def _describe(cycle: list[str], graph: dict[str, dict[str, int]]) -> str:
    return "  " + "; ".join(f"{a} (line {graph[a][b]}) -> {b}" for a, b in zip(cycle, cycle[1:], strict=False))


@pytest.mark.parametrize("package", PACKAGES)
def test_no_import_cycle_inside_a_package(package: str) -> None:
    graph = _import_graph(package)
    cycles = _cycles(graph)
    assert not cycles, f"import cycles inside {package}/ (imports inside functions count):\n" + "\n".join(
        _describe(c, graph) for c in cycles
    )


def test_the_cycle_checker_finds_a_lazy_cycle_through_a_sub_package(tmp_path: Path) -> None:
    pkg = tmp_path / "cluster"
    (pkg / "sub").mkdir(parents=True)
    (pkg / "__init__.py").write_text("from . import a\n")
    (pkg / "a.py").write_text("from .sub.b import f\n")
    (pkg / "sub" / "__init__.py").write_text("")
    (pkg / "sub" / "b.py").write_text("def f():\n    from .. import a\n")
    (pkg / "c.py").write_text("from kvres.cluster.sub import b\nimport kvres.cluster.a\n")
    graph = _import_graph("cluster", tmp_path)
    assert graph["kvres.cluster"] == {"kvres.cluster.a": 1}
    assert graph["kvres.cluster.c"] == {"kvres.cluster.sub.b": 1, "kvres.cluster.a": 2}
    assert _cycles(graph) == [["kvres.cluster.a", "kvres.cluster.sub.b", "kvres.cluster.a"]]


# ---- cycles between sub-packages --------------------------------------------------------------

MAX_MODULE_LINES = 600


def _packages(root: Path) -> set[str]:
    """Every package and sub-package of the five (the folders holding an ``__init__.py``)."""
    return {_module_name(p, package) for package in PACKAGES for p in (root / package).rglob("__init__.py")}


def _group_of(module: str, packages: set[str]) -> str:
    """The node a module belongs to: its package's direct sub-package (``kvres.actors.engines``
    holds ``engines.llama`` too), else the package's top level (``kvres.actors``)."""
    sub = ".".join(module.split(".")[:3])
    return sub if sub in packages and sub.count(".") == 2 else ".".join(module.split(".")[:2])


def _group_graph(root: Path | None = None) -> dict[str, dict[str, list[str]]]:
    """node -> {node it imports: ["path:line", ...]}, over the modules of all five packages."""
    global ROOT
    saved, ROOT = ROOT, root or ROOT
    try:
        packages = _packages(ROOT)
        paths = {_module_name(p, package): (p, package) for package in PACKAGES for p in _modules(package)}
        graph: dict[str, dict[str, list[str]]] = {}
        for name, (path, package) in paths.items():
            here = _group_of(name, packages)
            edges = graph.setdefault(here, {})
            for line, target in _module_edges(path, package, set(paths)):
                there = _group_of(target, packages)
                if there != here:
                    graph.setdefault(there, {})
                    edges.setdefault(there, []).append(f"{path.relative_to(ROOT)}:{line}")
        return graph
    finally:
        ROOT = saved


def _describe_groups(cycle: list[str], graph: dict[str, dict[str, list[str]]]) -> str:
    return "\n".join(f"  {a} -> {b}: {', '.join(graph[a][b])}" for a, b in zip(cycle, cycle[1:], strict=False))


def test_no_import_cycle_between_sub_packages() -> None:
    """Each package's top level and each of its sub-packages is one node (``kvres.actors``,
    ``kvres.actors.engines``, ``kvres.actors.sizing``, ``kvres.cluster.serve``, ...): the imports
    between them point one way, lazy ones included."""
    graph = _group_graph()
    cycles = _cycles({node: dict.fromkeys(edges, 0) for node, edges in graph.items()})
    cycles += [[a, b, a] for a in sorted(graph) for b in sorted(graph[a])  # and every pair importing each other
               if a < b and a in graph[b] and [a, b, a] not in cycles and [b, a, b] not in cycles]
    assert not cycles, "import cycles between sub-packages (imports inside functions count):\n" + "\n".join(
        f"{' -> '.join(c)}\n{_describe_groups(c, graph)}" for c in cycles
    )


def test_the_sub_package_checker_finds_a_lazy_cycle(tmp_path: Path) -> None:
    pkg = tmp_path / "actors"
    for sub in ("engines", "sizing"):
        (pkg / sub).mkdir(parents=True)
        (pkg / sub / "__init__.py").write_text("")
    (pkg / "__init__.py").write_text("")
    (pkg / "config.py").write_text("X = 1\n")
    (pkg / "engines" / "spec.py").write_text("from ..config import X\n\ndef f():\n    from ..sizing import budget\n")
    (pkg / "sizing" / "budget.py").write_text("from kvres.actors.engines.spec import f\n")
    graph = _group_graph(tmp_path)
    assert graph["kvres.actors.engines"] == {"kvres.actors": ["actors/engines/spec.py:1"],
                                             "kvres.actors.sizing": ["actors/engines/spec.py:4"]}
    assert graph["kvres.actors.sizing"] == {"kvres.actors.engines": ["actors/sizing/budget.py:1"]}
    simple = {node: dict.fromkeys(edges, 0) for node, edges in graph.items()}
    assert _cycles(simple) == [["kvres.actors.engines", "kvres.actors.sizing", "kvres.actors.engines"]]


@pytest.mark.parametrize("package", PACKAGES)
def test_no_module_is_over_600_lines(package: str) -> None:
    long = [(path.relative_to(ROOT), n) for path in _modules(package)
            if (n := len(path.read_text().splitlines())) > MAX_MODULE_LINES]
    assert not long, f"modules over {MAX_MODULE_LINES} lines (split them by job):\n" + "\n".join(
        f"  {path}: {n} lines" for path, n in long
    )
