"""The import rules of docs/architecture.md, checked from the source.

Every import counts, at module level or inside a function (a lazy import is still a
dependency): search <- profiler <- service, search <- worker; the service and the worker never
import each other (they talk over REST); inside search/ the four jobs import downwards only
(models <- prices <- algorithm <- plans) and without cycles; the exhaustive reference checks the
algorithm and nothing depends on it.
"""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("search", "profiler", "service", "worker", "paretoplan", "web", "bench")
LAYERS = {"search.models": 0, "search.prices": 1, "search.algorithm": 2, "search.plans": 3}
REFERENCE = "search.algorithm.exhaustive"
# `paretoplan search --exhaustive` (and a SearchRequest with exhaustive=true) runs the reference
# on request: the entry point that offers it as a mode may import it; nothing that prices or
# searches may.
REFERENCE_ENTRY_POINTS = {"search.plans.api"}


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _imported_names(path: Path, name: str) -> set[str]:
    """Every dotted name an import statement anywhere in the file may load: `import a.b` gives
    a.b; `from a.b import c` gives a.b and a.b.c (c may be a submodule); relative imports are
    resolved against the module's package."""
    tree = ast.parse(path.read_text(), filename=str(path))
    package = name.split(".") if path.name == "__init__.py" else name.split(".")[:-1]
    out: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            out.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base_parts = package[:len(package) - (node.level - 1)]
                base = ".".join(base_parts + ([node.module] if node.module else []))
            else:
                base = node.module or ""
            out.add(base)
            out.update(f"{base}.{alias.name}" for alias in node.names)
    return out


def _collect() -> dict[str, set[str]]:
    modules: dict[str, set[str]] = {}
    for package in PACKAGES:
        for path in sorted((ROOT / package).rglob("*.py")):
            name = _module_name(path)
            modules[name] = _imported_names(path, name)
    return modules


MODULES = _collect()


def _top(name: str) -> str:
    return name.split(".")[0]


def _violations(importer_package: str, forbidden: set[str]) -> list[str]:
    return sorted(f"{m} imports {n}" for m, names in MODULES.items() if _top(m) == importer_package
                  for n in names if _top(n) in forbidden)


def _layer(name: str) -> int | None:
    for prefix, layer in LAYERS.items():
        if name == prefix or name.startswith(prefix + "."):
            return layer
    return None


def test_the_rules_see_every_package() -> None:
    assert {_top(m) for m in MODULES} == set(PACKAGES)
    assert "search.algorithm.ft" in MODULES and REFERENCE in MODULES


def test_service_never_imports_worker() -> None:
    assert _violations("service", {"worker"}) == []


def test_worker_never_imports_service() -> None:
    assert _violations("worker", {"service"}) == []


def test_search_imports_no_profiler_service_or_worker() -> None:
    assert _violations("search", {"profiler", "service", "worker"}) == []


def test_profiler_imports_no_service_or_worker() -> None:
    assert _violations("profiler", {"service", "worker"}) == []


def test_search_layers_import_downwards_only() -> None:
    """models <- prices <- algorithm <- plans; search/errors.py and search/__init__.py are
    outside the layers. A layer importing the `search` package itself would load every layer
    (its __init__ re-exports plans), so that counts as importing the top one."""
    bad = []
    for m, names in MODULES.items():
        mine = _layer(m)
        if mine is None:
            continue
        for n in names:
            theirs = max(LAYERS.values()) if n == "search" else _layer(n)
            if theirs is not None and theirs > mine:
                bad.append(f"{m} (layer {mine}) imports {n} (layer {theirs})")
    assert sorted(set(bad)) == []


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components with more than one module, or a module importing itself
    (Tarjan's algorithm, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    on_stack: set[str] = set()
    stack: list[str] = []
    out: list[list[str]] = []
    counter = 0
    for start in sorted(graph):
        if start in index:
            continue
        work = [(start, iter(sorted(graph[start])))]
        index[start] = low[start] = counter
        counter += 1
        stack.append(start)
        on_stack.add(start)
        while work:
            v, children = work[-1]
            w = next(children, None)
            if w is not None:
                if w not in index:
                    index[w] = low[w] = counter
                    counter += 1
                    stack.append(w)
                    on_stack.add(w)
                    work.append((w, iter(sorted(graph[w]))))
                elif w in on_stack:
                    low[v] = min(low[v], index[w])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[v])
            if low[v] == index[v]:
                comp = []
                while True:
                    w = stack.pop()
                    on_stack.discard(w)
                    comp.append(w)
                    if w == v:
                        break
                if len(comp) > 1 or v in graph[v]:
                    out.append(sorted(comp))
    return out


def test_cycle_finder_finds_cycles() -> None:
    assert _cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert _cycles({"a": {"a"}, "b": set()}) == [["a"]]
    assert _cycles({"a": {"b"}, "b": set()}) == []


def test_search_has_no_import_cycle() -> None:
    """Edges are the modules an import names (a package's __init__ only when it is named
    itself: Python runs parent packages first, which is no dependency of the importer's code)."""
    search = {m for m in MODULES if _top(m) == "search"}
    graph = {m: {n for n in MODULES[m] if n in search} for m in search}
    assert _cycles(graph) == []


def test_nothing_depends_on_the_exhaustive_reference() -> None:
    users = sorted(m for m, names in MODULES.items()
                   if m != REFERENCE and m not in REFERENCE_ENTRY_POINTS
                   and any(n == REFERENCE or n.startswith(REFERENCE + ".") for n in names))
    assert users == []
