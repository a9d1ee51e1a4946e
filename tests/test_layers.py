"""The floors of ``vidcache/__init__.py``'s docstring are true: every import goes down (or sideways within a
floor), never up, and no modules import each other in a cycle.

Plain Python: the imports are read from each module's ``ast`` (module-level and function-level ones,
absolute ``vidcache.x`` and relative ``.x`` / ``..x``), nothing is imported.  Imports under
``if TYPE_CHECKING:`` are annotations only and never run, so they are not edges.
"""
from __future__ import annotations

import ast
import importlib
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent / "vidcache"

# The floors, bottom up: vidcache/floors.py is their one statement (read as data, not imported: the house is
# checked without running it).
def _floors_module():
    import runpy
    return runpy.run_path(str(ROOT / "floors.py"))


_F = _floors_module()
FLOORS = [(name, modules) for name, modules, _ in _F["FLOORS"]]
UNSTATED = _F["UNSTATED"]
STORE_MAY_IMPORT = _F["STORE_MAY_IMPORT"]
LOADER_MAY_IMPORT = _F["LOADER_MAY_IMPORT"]
ENGINES = tuple(__import__("vidcache.engines", fromlist=["ENGINES"]).ENGINES)   # the engines' records


# --- reading imports -------------------------------------------------------------------------------
@dataclass(frozen=True)
class Import:
    source: str        # the importing module
    target: str        # the vidcache module (or other top-level module) it imports
    line: int
    function_level: bool

    def where(self) -> str:
        kind = "function-level" if self.function_level else "module-level"
        return f"{self.source} (line {self.line}, {kind}) imports {self.target}"


def module_names(root: Path) -> dict[str, Path]:
    """Dotted module name -> file, for every .py file of the package at ``root``."""
    out = {}
    for path in sorted(root.rglob("*.py")):
        parts = list(path.relative_to(root.parent).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        out[".".join(parts)] = path
    return out


def _is_type_checking(test: ast.expr) -> bool:
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING")


def _facade_exports(modules: dict[str, Path], pkg: str) -> dict[str, str]:
    """``from vidcache import Name`` runs the facade's lazy ``__getattr__``: resolve Name through its
    ``_EXPORTS`` table to the module that really gets imported."""
    tree = ast.parse(modules[pkg].read_text())
    for node in tree.body:
        if isinstance(node, ast.Assign) and any(isinstance(t, ast.Name) and t.id == "_EXPORTS" for t in node.targets):
            return ast.literal_eval(node.value)
    return {}


def imports_of(name: str, path: Path, modules: dict[str, Path], exports: dict[str, str]) -> list[Import]:
    """Every runtime import in ``path`` (module ``name``), resolved to module names."""
    tree = ast.parse(path.read_text(), filename=str(path))
    is_pkg = path.name == "__init__.py"
    out: list[Import] = []

    def add(target: str, node: ast.AST, in_function: bool) -> None:
        out.append(Import(name, target, node.lineno, in_function))

    def resolve_from(node: ast.ImportFrom) -> list[str]:
        if node.level:
            base = name.split(".") if is_pkg else name.split(".")[:-1]
            if node.level - 1 > len(base) - 1:
                raise AssertionError(f"{name} line {node.lineno}: relative import above the package")
            base = base[: len(base) - (node.level - 1)]
            mod = ".".join(base + ([node.module] if node.module else []))
        else:
            mod = node.module
        targets = []
        for alias in node.names:
            sub = f"{mod}.{alias.name}"
            if sub in modules:                          # from . import keys: the submodule itself
                targets.append(sub)
            elif mod == ROOT.name and alias.name in exports:
                targets.append(exports[alias.name])      # from vidcache import X: the lazy facade's target
            else:
                targets.append(mod)
        return targets

    def visit(node: ast.AST, in_function: bool) -> None:
        if isinstance(node, ast.If) and _is_type_checking(node.test):
            for child in node.orelse:                   # the else branch does run
                visit(child, in_function)
            return
        if isinstance(node, ast.Import):
            for alias in node.names:
                add(alias.name, node, in_function)
        elif isinstance(node, ast.ImportFrom):
            for t in resolve_from(node):
                add(t, node, in_function)
        inner = in_function or isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda))
        for child in ast.iter_child_nodes(node):
            visit(child, inner)

    visit(tree, False)
    return out


def all_imports(root: Path) -> tuple[dict[str, Path], list[Import]]:
    modules = module_names(root)
    exports = _facade_exports(modules, root.name)
    edges = [imp for name, path in modules.items() for imp in imports_of(name, path, modules, exports)]
    return modules, edges


def internal(edges: list[Import], pkg: str) -> list[Import]:
    return [e for e in edges if e.target == pkg or e.target.startswith(pkg + ".")]


# --- the rules -------------------------------------------------------------------------------------
def floor_of(module: str, pkg: str = "vidcache") -> int:
    rel = module[len(pkg) + 1:] if module != pkg else ""
    best, longest = None, -1
    for i, (_, names) in enumerate(FLOORS):
        for n in names:      # the most specific name wins: "sglang.plugin" over "sglang", say
            if ((n == "" and rel == "") or (n and (rel == n or rel.startswith(n + ".")))) and len(n) > longest:
                best, longest = i, len(n)
    if best is None:
        raise AssertionError(f"{module} is on no floor: add it to vidcache/__init__.py's docstring and to "
                             "tests/test_layers.py FLOORS")
    return best


def floor_violations(edges: list[Import], pkg: str = "vidcache") -> list[str]:
    out = []
    for e in internal(edges, pkg):
        src, dst = floor_of(e.source, pkg), floor_of(e.target, pkg)
        if dst > src:
            out.append(f"{e.where()}: floor '{FLOORS[src][0]}' imports up to floor '{FLOORS[dst][0]}'")
    return out


def package_violations(edges: list[Import], sub: str, allowed: set[str], pkg: str = "vidcache") -> list[str]:
    own = f"{pkg}.{sub}"
    return [f"{e.where()}: {own}/ may import only {sorted(allowed)} and its own modules"
            for e in internal(edges, pkg)
            if (e.source == own or e.source.startswith(own + "."))
            and not (e.target == own or e.target.startswith(own + ".")) and e.target not in allowed]


def engine_violations(edges: list[Import], engines=ENGINES, pkg: str = "vidcache") -> list[str]:
    """Imports from one engine's adapter package (``vidcache/sglang/``, ``vidcache/vllm/``) into another's: what
    both need belongs in the engine-neutral core, ``vidcache/rollout/``."""
    def engine_of(module: str) -> str | None:
        return next((e for e in engines if module == f"{pkg}.{e}" or module.startswith(f"{pkg}.{e}.")), None)

    out = []
    for e in internal(edges, pkg):
        mine, theirs = engine_of(e.source), engine_of(e.target)
        if mine and theirs and mine != theirs:
            out.append(f"{e.where()}: {pkg}/{mine}/ imports {pkg}/{theirs}/ (move what both need to {pkg}/rollout/)")
    return out


def miles_violations(edges: list[Import]) -> list[str]:
    return [f"{e.where()}: vidcache must not depend on the Miles integration"
            for e in edges if e.target.split(".")[0] in ("miles_integration", "miles")]


def cycles(edges: list[Import], pkg: str = "vidcache") -> list[list[Import]]:
    """One cycle per strongly connected component of the module graph (Tarjan), as its edges."""
    graph: dict[str, dict[str, Import]] = {}
    for e in internal(edges, pkg):
        if e.target != e.source:
            graph.setdefault(e.source, {}).setdefault(e.target, e)
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    comps: list[list[str]] = []

    def strong(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in graph.get(v, {}):
            if w not in index:
                strong(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                comps.append(comp)

    for v in sorted(graph):
        if v not in index:
            strong(v)
    out = []
    for comp in comps:             # walk one concrete cycle inside the component
        members, start = set(comp), min(comp)
        path, seen, v = [], {start: 0}, start
        while True:
            w = next(t for t in sorted(graph[v]) if t in members)
            path.append(graph[v][w])
            if w in seen:
                out.append(path[seen[w]:])
                break
            seen[w] = len(path)
            v = w
    return out


def _report(title: str, problems: list[str]) -> str:
    return f"{title} ({len(problems)}):\n  " + "\n  ".join(problems)


# --- the tests on vidcache/ ------------------------------------------------------------------------
@pytest.fixture(scope="module")
def graph():
    return all_imports(ROOT)


def test_every_module_is_on_a_floor(graph):
    modules, _ = graph
    for name in modules:
        floor_of(name)


def test_no_import_runs_up_a_floor(graph):
    problems = floor_violations(graph[1])
    assert not problems, _report("imports that run back up a floor", problems)


def test_store_imports_only_errors(graph):
    problems = package_violations(graph[1], "store", STORE_MAY_IMPORT)
    assert not problems, _report("vidcache/store/ imports", problems)


def test_loader_imports_only_options_digest_errors(graph):
    problems = package_violations(graph[1], "loader", LOADER_MAY_IMPORT)
    assert not problems, _report("vidcache/loader/ imports", problems)


def test_no_engine_adapter_imports_another(graph):
    """``vidcache/sglang/`` and ``vidcache/vllm/`` stand side by side on ``vidcache/rollout/``: neither imports the
    other (module-level or in a function), private names or public."""
    problems = engine_violations(graph[1])
    assert not problems, _report("imports between engine adapters", problems)
    on_core = {e.source.split(".")[1] for e in graph[1] if e.target.startswith("vidcache.rollout.")}
    assert set(ENGINES) <= on_core, on_core          # both stand on the core (so the check above sees their imports)


def test_nothing_imports_miles(graph):
    problems = miles_violations(graph[1])
    assert not problems, _report("imports of the Miles integration", problems)


def test_no_import_cycles(graph):
    found = cycles(graph[1])
    assert not found, _report("import cycles", [" -> ".join([c[0].source] + [e.target for e in c]) + "\n    " +
                                                "\n    ".join(e.where() for e in c) for c in found])


def test_the_docstring_states_these_floors():
    """vidcache/__init__.py's docstring lists floors.py's floors, in order, each with its modules."""
    import re

    import vidcache
    doc = vidcache.__doc__
    lines = doc[doc.index("Floors"):].splitlines()[1:]
    stated = []
    for line in lines:
        if not line.startswith("  "):
            break
        stated.append([n.strip().rstrip("/") for n in re.split(r"\s{3,}", line.strip())[0].split(",")])
    ours = [[n for n in names if n not in UNSTATED] for _, names in FLOORS]
    assert stated == ours, f"vidcache/__init__.py states {stated}, vidcache/floors.py has {ours}"


def test_the_readme_code_map_states_these_floors():
    """The README's code map (| floor | modules | job |) has floors.py's floors, in order, named as there, with
    the same modules (a package's submodules in brackets are not counted)."""
    import re
    readme = (ROOT.parent / "README.md").read_text()
    rows = [ln for ln in readme[readme.index("| floor | modules | job |"):].splitlines()[2:]]
    table = []
    for ln in rows:
        if not ln.startswith("| "):
            break
        name, modules = [c.strip() for c in ln.split("|")[1:3]]
        top = re.sub(r"\([^)]*\)", "", modules)           # "store/ (base, ...)": the package alone
        table.append((name, [m.rstrip("/").replace("/", ".") for m in re.findall(r"`([^`]+)`", top)]))
    ours = [(name, [n for n in names if n not in UNSTATED]) for name, names in FLOORS]
    assert table == ours, f"README's code map {table}, vidcache/floors.py {ours}"


# --- the public names --------------------------------------------------------------------------------
def test_every_public_name_imports():
    import vidcache
    from vidcache import _EXPORTS

    assert vidcache.__all__ == sorted(_EXPORTS) and vidcache.__all__
    for name in vidcache.__all__:
        obj = getattr(vidcache, name)
        want = getattr(importlib.import_module(_EXPORTS[name]), name)
        assert obj is want, name
    with pytest.raises(AttributeError, match="no attribute"):
        vidcache.NoSuchName  # noqa: B018


def test_type_checkers_see_every_public_name():
    """The face's ``if TYPE_CHECKING:`` block imports each name of ``_EXPORTS`` from its module, and nothing else
    (type checkers cannot see through the lazy ``__getattr__``)."""
    from vidcache import _EXPORTS

    tree = ast.parse((ROOT / "__init__.py").read_text())
    seen = {}
    for node in tree.body:
        if isinstance(node, ast.If) and _is_type_checking(node.test):
            for imp in node.body:
                assert isinstance(imp, ast.ImportFrom) and imp.level == 0, ast.dump(imp)
                seen.update({a.asname or a.name: imp.module for a in imp.names})
    assert seen == _EXPORTS


def test_star_import_in_a_fresh_interpreter():
    """``from vidcache import *`` in a clean process (no test has imported anything yet) binds every name."""
    code = ("import vidcache\nns = {}\nexec('from vidcache import *', ns)\n"
            "missing = [n for n in vidcache.__all__ if n not in ns]\nassert not missing, missing\n")
    subprocess.run([sys.executable, "-c", code], check=True, cwd=ROOT.parent, timeout=120)


# --- the checker catches what it should (so a green run means something) ------------------------------
def _fake(tmp_path: Path, files: dict[str, str]) -> Path:
    root = tmp_path / "vidcache"
    for rel, text in {"__init__.py": '_EXPORTS = {"VideoCache": "vidcache.cache"}\n', **files}.items():
        p = root / rel
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_text(text)
    for d in [p for p in root.rglob("*") if p.is_dir()]:
        (d / "__init__.py").touch()
    return root


def test_checker_resolves_relative_function_level_and_type_checking_imports(tmp_path):
    root = _fake(tmp_path, {
        "errors.py": "",
        "keys.py": "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from .cache import VideoCache\n"
                   "else:\n    from . import errors\n",
        "cache.py": "from . import keys\nfrom .store.base import Store\n"
                    "def get():\n    from .handle import VideoHandle\n",
        "handle.py": "import vidcache.cache\n",
        "store/base.py": "from ..errors import X\nfrom ..options import Y\n",
        "loader/build.py": "from .. import keys\nfrom vidcache import VideoCache\nimport miles_integration.x\n",
        "sglang/plugin/qwen_vl.py": "from ...cache import node_cache\nfrom ..transport import parse_ref\n",
        "vllm/check.py": "def f():\n    from ..sglang.check import _http\n",
        "vllm/loader.py": "from ..rollout.ref import parse_ref\n",
    })
    _, edges = all_imports(root)
    got = {(e.source, e.target, e.function_level) for e in edges}
    assert ("vidcache.keys", "vidcache.cache", False) not in got            # TYPE_CHECKING: not an edge
    assert ("vidcache.keys", "vidcache.errors", False) in got               # ...but its else branch is
    assert ("vidcache.cache", "vidcache.handle", True) in got               # function-level, relative
    assert ("vidcache.cache", "vidcache.store.base", False) in got
    assert ("vidcache.store.base", "vidcache.options", False) in got        # ..x from a subpackage
    assert ("vidcache.loader.build", "vidcache.keys", False) in got         # from .. import submodule
    assert ("vidcache.loader.build", "vidcache.cache", False) in got        # through the facade's table
    assert ("vidcache.sglang.plugin.qwen_vl", "vidcache.cache", False) in got
    assert ("vidcache.sglang.plugin.qwen_vl", "vidcache.sglang.transport", False) in got
    ups = "\n".join(floor_violations(edges))
    assert "vidcache.cache (line 4, function-level) imports vidcache.handle" in ups
    assert "vidcache.loader.build (line 2, module-level) imports vidcache.cache" in ups
    assert "vidcache.store.base" not in ups                                 # options is below store
    assert "imports vidcache.options" in "\n".join(package_violations(edges, "store", STORE_MAY_IMPORT))
    assert "imports vidcache.keys" in "\n".join(package_violations(edges, "loader", LOADER_MAY_IMPORT))
    assert "miles_integration.x" in "\n".join(miles_violations(edges))
    crossed = engine_violations(edges)                                      # function-level, private: still caught
    assert len(crossed) == 1 and "vidcache.vllm.check (line 2, function-level) imports vidcache.sglang.check" in crossed[0]
    (cycle,) = cycles(edges)
    assert {(e.source, e.target) for e in cycle} == {("vidcache.cache", "vidcache.handle"),
                                                      ("vidcache.handle", "vidcache.cache")}


def test_checker_passes_a_clean_tree(tmp_path):
    root = _fake(tmp_path, {
        "errors.py": "", "options.py": "from .errors import E\n",
        "store/base.py": "from ..errors import E\n", "store/memory.py": "from .base import S\n",
        "loader/build.py": "from ..options import O\nfrom .decode import open_reader\n", "loader/decode.py": "",
        "cache.py": "from .loader.build import b\nfrom typing import TYPE_CHECKING\n"
                    "if TYPE_CHECKING:\n    from .handle import VideoHandle\n",
        "handle.py": "def f():\n    from .cache import cache_for\n",
        "rollout/ref.py": "from ..errors import E\n", "sglang/request.py": "from ..rollout.ref import r\n",
        "vllm/request.py": "from ..rollout.ref import r\n",
    })
    _, edges = all_imports(root)
    assert not floor_violations(edges) and not cycles(edges) and not miles_violations(edges)
    assert not engine_violations(edges)
    assert not package_violations(edges, "store", STORE_MAY_IMPORT)
    assert not package_violations(edges, "loader", LOADER_MAY_IMPORT)
    # store/base <-> store/memory is a cycle within a floor, which the cycle check must still see.
    (root / "store" / "memory.py").write_text("from .base import S\n")
    (root / "store" / "base.py").write_text("from .memory import M\n")
    _, edges = all_imports(root)
    assert [sorted({e.source for e in c}) for c in cycles(edges)] == [["vidcache.store.base", "vidcache.store.memory"]]
