"""Package and module boundaries, checked from the source with ``ast``.

The import graph is built from every ``.py`` file under each workspace member's ``src/``
(imports at the top of a module and inside functions alike; ``TYPE_CHECKING`` blocks too).
The test fails on:

* a cycle between packages (the distributions the members' ``pyproject.toml`` declare; an
  edge is a declared dependency on another member or an import of one);
* an import of a project package that the importing member does not declare as a dependency;
* an import of a ``_private`` name (or module) from another module of the project;
* an import cycle between modules;
* an import of a project module that does not exist (a path left behind by a move).

What is left is listed below in explicit allow-lists, each entry with its reason; anything
not listed fails. Tests (``tests/`` directories) are outside the distributions and run in the
workspace environment, so they are not checked for declared dependencies.

Run: ``.venv/bin/pytest tests/test_boundaries.py -q -s`` (``-s`` prints what it finds).
"""

from __future__ import annotations

import ast
import re
import tomllib
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

# Package cycles that stay, each with its reason. Entry: the sorted distributions of the
# cycle's strongly connected component, joined with " <-> ".
PACKAGE_CYCLES_ALLOWED: dict[str, str] = {}

# Imports of a project package the member does not declare. Entry: "member -> member (module
# imports module)".
UNDECLARED_ALLOWED: dict[str, str] = {
}

# Imports of a private name from another module that stay, each with its reason.
# Entry: "importing.module -> imported.module._name".
PRIVATE_ALLOWED: dict[str, str] = {
}

# Module import cycles that stay, each with its reason. Entry: the sorted modules of the
# cycle's strongly connected component, joined with " <-> ".
MODULE_CYCLES_ALLOWED: dict[str, str] = {
}


@dataclass
class Member:
    name: str  # distribution name, normalised
    path: Path
    deps: set[str]  # declared dependencies that are workspace members
    modules: set[str] = field(default_factory=set)  # top-level import names under src/


def _norm(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def load_members() -> dict[str, Member]:
    root = tomllib.loads((ROOT / "pyproject.toml").read_text())
    paths: list[Path] = []
    for pattern in root["tool"]["uv"]["workspace"]["members"]:
        paths += sorted(p for p in ROOT.glob(pattern) if (p / "pyproject.toml").is_file())
    raw = {}
    for p in paths:
        project = tomllib.loads((p / "pyproject.toml").read_text())["project"]
        declared = list(project.get("dependencies", []))
        for extra in project.get("optional-dependencies", {}).values():
            declared += extra  # an extra declares an optional dependency: imports of it are guarded
        deps = {_norm(re.split(r"[\s\[<>=!~;]", d, maxsplit=1)[0]) for d in declared}
        raw[_norm(project["name"])] = (p, deps)
    members = {n: Member(n, p, deps & raw.keys()) for n, (p, deps) in raw.items()}
    for m in members.values():
        src = m.path / "src"
        if src.is_dir():
            m.modules = {c.name for c in src.iterdir() if (c / "__init__.py").is_file()}
    return members


def module_name(src: Path, file: Path) -> str:
    parts = list(file.relative_to(src).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


@dataclass
class Graph:
    modules: dict[str, str]  # module -> member name
    is_package: set[str]  # modules that are packages (__init__.py)
    edges: dict[str, set[str]]  # module -> project modules it imports
    private: list[tuple[str, str]]  # (importer, "module._name")
    missing: list[tuple[str, str]]  # (importer, project module that does not exist)


def _resolve(current: str, is_pkg: bool, node: ast.ImportFrom) -> str:
    if not node.level:
        return node.module or ""
    base = current.split(".")
    base = base if is_pkg else base[:-1]
    base = base[: len(base) - (node.level - 1)]
    return ".".join(base + ([node.module] if node.module else []))


def build_graph(members: dict[str, Member]) -> Graph:
    files: dict[str, tuple[Path, str]] = {}
    is_package: set[str] = set()
    for m in members.values():
        src = m.path / "src"
        for f in sorted(src.rglob("*.py")) if src.is_dir() else []:
            name = module_name(src, f)
            files[name] = (f, m.name)
            if f.name == "__init__.py":
                is_package.add(name)
    top = {mod for m in members.values() for mod in m.modules}

    def known(name: str) -> str | None:
        """The longest project module that ``name`` is or lies in."""
        while name:
            if name in files:
                return name
            name = name.rpartition(".")[0]
        return None

    edges: dict[str, set[str]] = {name: set() for name in files}
    private: list[tuple[str, str]] = []
    missing: list[tuple[str, str]] = []
    for name, (f, _member) in files.items():
        tree = ast.parse(f.read_text(), str(f))
        for node in ast.walk(tree):
            if isinstance(node, ast.Import):
                for alias in node.names:
                    if alias.name.split(".")[0] not in top:
                        continue
                    if alias.name not in files:
                        missing.append((name, alias.name))
                    if t := known(alias.name):
                        edges[name].add(t)
                    if any(p.startswith("_") and not p.startswith("__") for p in alias.name.split(".")[1:]):
                        private.append((name, alias.name))
            elif isinstance(node, ast.ImportFrom):
                target = _resolve(name, name in is_package, node)
                if target.split(".")[0] not in top:
                    continue
                if target not in files:
                    missing.append((name, target))
                for alias in node.names:
                    full = f"{target}.{alias.name}"
                    t = full if full in files else known(target)
                    if t is None:
                        continue
                    edges[name].add(t)
                    if alias.name.startswith("_") and not alias.name.startswith("__") and t != name:
                        private.append((name, full))
    return Graph({n: m for n, (_f, m) in files.items()}, is_package, edges, private, missing)


def sccs(edges: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components with more than one node (Tarjan, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    on: set[str] = set()
    stack: list[str] = []
    out: list[list[str]] = []
    counter = 0
    for start in sorted(edges):
        if start in index:
            continue
        work = [(start, iter(sorted(edges[start])))]
        index[start] = low[start] = counter
        counter += 1
        stack.append(start)
        on.add(start)
        while work:
            v, it = work[-1]
            for w in it:
                if w not in edges:
                    continue
                if w not in index:
                    index[w] = low[w] = counter
                    counter += 1
                    stack.append(w)
                    on.add(w)
                    work.append((w, iter(sorted(edges[w]))))
                    break
                if w in on:
                    low[v] = min(low[v], index[w])
            else:
                work.pop()
                if work:
                    low[work[-1][0]] = min(low[work[-1][0]], low[v])
                if low[v] == index[v]:
                    comp = []
                    while True:
                        w = stack.pop()
                        on.discard(w)
                        comp.append(w)
                        if w == v:
                            break
                    if len(comp) > 1:
                        out.append(sorted(comp))
    return out


def findings() -> dict[str, list[str]]:
    members = load_members()
    g = build_graph(members)
    pkg_edges: dict[str, set[str]] = {n: set(m.deps) for n, m in members.items()}
    undeclared: set[str] = set()
    for mod, targets in g.edges.items():
        src_member = g.modules[mod]
        for t in targets:
            dst = g.modules[t]
            if dst == src_member:
                continue
            pkg_edges[src_member].add(dst)
            if dst not in members[src_member].deps:
                undeclared.add(f"{src_member} -> {dst} ({mod} imports {t})")
    module_edges = {m: {t for t in ts if t != m} for m, ts in g.edges.items()}
    return {
        "package cycles": [" <-> ".join(c) for c in sccs(pkg_edges)],
        "undeclared": sorted(undeclared),
        "private": sorted(f"{a} -> {b}" for a, b in set(g.private)),
        "module cycles": [" <-> ".join(c) for c in sccs(module_edges)],
        "missing modules": sorted(f"{a} imports {b}" for a, b in set(g.missing)),
    }


def test_boundaries() -> None:
    found = findings()
    for kind, items in found.items():
        print(f"{kind}: {len(items)}")
        for item in items:
            print(f"  {item}")
    allowed = {"package cycles": PACKAGE_CYCLES_ALLOWED, "undeclared": UNDECLARED_ALLOWED,
               "private": PRIVATE_ALLOWED, "module cycles": MODULE_CYCLES_ALLOWED, "missing modules": {}}
    new = {kind: [i for i in found[kind] if i not in allowed[kind]] for kind in found}
    stale = {kind: [i for i in allowed[kind] if i not in found[kind]] for kind in found}
    assert not any(new.values()), f"new boundary violations: {new}"
    assert not any(stale.values()), f"allow-list entries that no longer occur (remove them): {stale}"


def test_checker_sees_each_kind_of_violation(tmp_path: Path) -> None:
    """The checker itself: a package cycle, an undeclared import, a private import and a
    module cycle in a small synthetic workspace are all found."""
    global ROOT
    (tmp_path / "pyproject.toml").write_text('[tool.uv.workspace]\nmembers = ["a", "b"]\n')
    for name, dep in (("a", "pkg-b"), ("b", "")):
        d = tmp_path / name
        (d / "src" / f"pkg_{name}").mkdir(parents=True)
        deps = f'"{dep}"' if dep else ""
        (d / "pyproject.toml").write_text(f'[project]\nname = "pkg-{name}"\ndependencies = [{deps}]\n')
        (d / "src" / f"pkg_{name}" / "__init__.py").write_text("")
    (tmp_path / "a/src/pkg_a/x.py").write_text("from . import z\nfrom pkg_b.y import _hidden\n")
    (tmp_path / "a/src/pkg_a/z.py").write_text("def f():\n    from .x import g\n    from ..pkg_a.gone import h\n")
    (tmp_path / "b/src/pkg_b/y.py").write_text("import pkg_a.x\n_hidden = 1\n")
    saved, ROOT = ROOT, tmp_path
    try:
        found = findings()
    finally:
        ROOT = saved
    assert found["package cycles"] == ["pkg-a <-> pkg-b"]
    assert found["undeclared"] == ["pkg-b -> pkg-a (pkg_b.y imports pkg_a.x)"]
    assert found["private"] == ["pkg_a.x -> pkg_b.y._hidden"]
    assert found["module cycles"] == ["pkg_a.x <-> pkg_a.z <-> pkg_b.y"]
    assert found["missing modules"] == ["pkg_a.z imports pkg_a.gone"]


FORECASTER_MAX_LINES = 400  # docs/forecaster.md, "The terms": one module per Appendix B term, each short


def test_forecaster_modules_stay_short() -> None:
    """Every module of the forecaster (its terms, the fold, the service shell) is at most
    ``FORECASTER_MAX_LINES`` lines: a part that outgrows it is split along its seams."""
    root = ROOT / "services" / "forecaster" / "src" / "prorsa_forecaster"
    sizes = {p.relative_to(root).as_posix(): len(p.read_text().splitlines()) for p in root.rglob("*.py")}
    assert len(sizes) > 20, sorted(sizes)  # the package is where this test looks
    assert not {m: n for m, n in sizes.items() if n > FORECASTER_MAX_LINES}
