"""No import cycles inside ``lola``.

Every module under ``src/lola`` is parsed with :mod:`ast`; each ``import lola…`` and
``from lola… import …`` is an edge of the package's import graph, including imports inside
functions (a lazy import defers a cycle, it does not remove it) and excluding those under
``if TYPE_CHECKING:`` (never executed). ``from X import name`` is an edge to ``X.name`` when that
is a module, else to ``X``; relative imports are resolved. Importing ``lola.a.b`` first runs
``lola.a``'s ``__init__``, so the edge goes to every package above the target too (but the root
``lola`` and the packages that hold the importing module itself, which are already running). A
strongly connected component of more than one module (or a module importing itself) is a cycle,
and the test names one path through each.

Above modules, the layers: collapsing every module to its subpackage (``lola.linearize``,
``lola.pretrained``, ``lola.integrations.transformers``, …) must leave a graph without cycles,
so that no layer imports one that imports it back (the loading layer below inference and
training, inference never reaching into training).
"""

from __future__ import annotations

import ast
from collections.abc import Iterable, Mapping
from pathlib import Path

import lola

PACKAGE_DIR = Path(lola.__file__).resolve().parent


def module_files(package_dir: Path = PACKAGE_DIR) -> dict[str, Path]:
    """``{dotted module name: file}`` for every ``.py`` file of the package."""
    root = package_dir.parent
    modules: dict[str, Path] = {}
    for path in sorted(package_dir.rglob("*.py")):
        parts = list(path.relative_to(root).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        modules[".".join(parts)] = path
    return modules


def _is_type_checking(test: ast.expr) -> bool:
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING")


def _imports(tree: ast.AST, type_checking: bool = False) -> Iterable[ast.Import | ast.ImportFrom]:
    """Every import statement of ``tree``, at any depth, except the bodies of ``if TYPE_CHECKING:``
    (included with ``type_checking``: what a type checker follows)."""
    stack = [tree]
    while stack:
        node = stack.pop()
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            yield node
        if isinstance(node, ast.If) and _is_type_checking(node.test) and not type_checking:
            stack.extend(node.orelse)  # the `else:` branch does run
            continue
        stack.extend(ast.iter_child_nodes(node))


def import_edges(name: str, path: Path, modules: Mapping[str, Path], top: str = "lola", type_checking: bool = False) -> set[str]:
    """The ``top…`` modules that module ``name`` (source at ``path``) imports (with
    ``type_checking``, also under ``if TYPE_CHECKING:``)."""
    is_package = path.name == "__init__.py"
    edges: set[str] = set()
    for node in _imports(ast.parse(path.read_text(encoding="utf-8"), filename=str(path)), type_checking):
        if isinstance(node, ast.Import):
            targets = [alias.name for alias in node.names]
        else:
            if node.level:
                base = name.split(".") if is_package else name.split(".")[:-1]
                base = base[: len(base) - (node.level - 1)]
                source = ".".join(base + ([node.module] if node.module else []))
            else:
                source = node.module or ""
            targets = [f"{source}.{alias.name}" if f"{source}.{alias.name}" in modules else source for alias in node.names]
        for target in targets:
            if target == top or target.startswith(top + "."):
                # `import lola.a.b` where lola.a.b is no module of ours (a typo, an attribute): its closest module
                while target not in modules and "." in target:
                    target = target.rsplit(".", 1)[0]
                if target in modules:
                    edges.add(target)
                    edges.update(_outer_packages(target, name, modules, top))
    return edges


def _outer_packages(target: str, importer: str, modules: Mapping[str, Path], top: str) -> set[str]:
    """The packages that importing ``target`` initialises first, except the root and those that
    hold ``importer`` (already being initialised when it runs)."""
    parts = target.split(".")
    own = importer.split(".")
    outer = set()
    for depth in range(2, len(parts)):
        package = ".".join(parts[:depth])
        if package in modules and own[:depth] != parts[:depth]:
            outer.add(package)
    return outer


def layer_of(module: str, top: str = "lola") -> str:
    """The subpackage (layer) a module belongs to: ``lola.x`` for ``lola.x…``, and
    ``lola.integrations.y`` for the integrations, each its own layer."""
    parts = module.split(".")
    depth = 3 if len(parts) > 2 and parts[1] == "integrations" else 2
    return ".".join(parts[:depth])


def layer_graph(graph: Mapping[str, Iterable[str]], top: str = "lola") -> dict[str, set[str]]:
    """``graph`` collapsed to layers (the root package left out: it re-exports everything)."""
    layers: dict[str, set[str]] = {}
    for source, targets in graph.items():
        if source == top:
            continue
        edges = layers.setdefault(layer_of(source, top), set())
        edges.update(layer_of(t, top) for t in targets if t != top and layer_of(t, top) != layer_of(source, top))
    return layers


def import_graph(package_dir: Path = PACKAGE_DIR, type_checking: bool = False) -> dict[str, set[str]]:
    modules = module_files(package_dir)
    top = package_dir.name
    return {name: import_edges(name, path, modules, top, type_checking) for name, path in modules.items()}


def strongly_connected_components(graph: Mapping[str, Iterable[str]]) -> list[list[str]]:
    """Tarjan's algorithm (iterative), components in no particular order, each sorted."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    on_stack: set[str] = set()
    stack: list[str] = []
    components: list[list[str]] = []
    counter = 0
    for start in sorted(graph):
        if start in index:
            continue
        work = [(start, iter(sorted(graph.get(start, ()))))]
        index[start] = low[start] = counter
        counter += 1
        stack.append(start)
        on_stack.add(start)
        while work:
            node, children = work[-1]
            advanced = False
            for child in children:
                if child not in index:
                    index[child] = low[child] = counter
                    counter += 1
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(graph.get(child, ())))))
                    advanced = True
                    break
                if child in on_stack:
                    low[node] = min(low[node], index[child])
            if advanced:
                continue
            work.pop()
            if work:
                parent = work[-1][0]
                low[parent] = min(low[parent], low[node])
            if low[node] == index[node]:
                component = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.append(member)
                    if member == node:
                        break
                components.append(sorted(component))
    return components


def _path(graph: Mapping[str, Iterable[str]], start: str, goal: str, within: set[str]) -> list[str]:
    """A shortest path ``start -> … -> goal`` inside ``within`` (breadth first)."""
    previous: dict[str, str | None] = {start: None}
    queue = [start]
    for node in queue:
        for child in sorted(graph.get(node, ())):
            if child in within and child not in previous:
                previous[child] = node
                queue.append(child)
    path = [goal]
    while previous[path[-1]] is not None:
        path.append(previous[path[-1]])
    return path[::-1]


def cycles(graph: Mapping[str, Iterable[str]]) -> list[str]:
    """One readable description per cycle of ``graph``: its modules, and one path through each edge
    that leaves the first module for another member and comes back."""
    found = []
    for component in strongly_connected_components(graph):
        first = component[0]
        if len(component) == 1 and first not in set(graph.get(first, ())):
            continue
        members = set(component)
        loops = []
        for child in sorted(set(graph.get(first, ())) & members):
            loops.append(" -> ".join([first, *_path(graph, child, first, members)]) if child != first else f"{first} -> {first}")
        found.append(f"{len(component)} modules ({', '.join(component)}):\n    " + "\n    ".join(loops))
    return found


def test_cycle_finder_finds_cycles() -> None:
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a", "d"}, "d": set(), "e": {"e"}, "f": {"a"}}
    assert sorted(strongly_connected_components(graph)) == [["a", "b", "c"], ["d"], ["e"], ["f"]]
    assert sorted(cycles(graph)) == ["1 modules (e):\n    e -> e", "3 modules (a, b, c):\n    a -> b -> c -> a"]
    assert cycles({"a": {"b"}, "b": set()}) == []


def test_edges_follow_the_rules(tmp_path: Path) -> None:
    pkg = tmp_path / "pkg"
    (pkg / "sub").mkdir(parents=True)
    (pkg / "__init__.py").write_text("from pkg import sub\n")
    (pkg / "sub" / "__init__.py").write_text("from .mod import thing\nfrom . import other\n")
    (pkg / "sub" / "other.py").write_text(
        "from typing import TYPE_CHECKING\n"
        "if TYPE_CHECKING:\n    from pkg.a import A\n"
        "else:\n    import pkg.b\n"
        "def lazy():\n    from ..a import helper\n    import pkg.sub.mod as m\n"
    )
    (pkg / "sub" / "mod.py").write_text("import os\nfrom pkg import a as not_a_module_import\n")
    (pkg / "a.py").write_text("from pkg.sub.mod import thing\n")
    (pkg / "b.py").write_text("")
    graph = import_graph(pkg)
    assert graph == {
        "pkg": {"pkg.sub"},
        "pkg.sub": {"pkg.sub.mod", "pkg.sub.other"},
        "pkg.sub.other": {"pkg.a", "pkg.b", "pkg.sub.mod"},
        "pkg.sub.mod": {"pkg.a"},
        "pkg.a": {"pkg.sub", "pkg.sub.mod"},  # importing pkg.sub.mod runs pkg.sub's __init__ first
        "pkg.b": set(),
    }
    assert cycles(graph) == [
        "4 modules (pkg.a, pkg.sub, pkg.sub.mod, pkg.sub.other):\n    pkg.a -> pkg.sub -> pkg.sub.mod -> pkg.a\n    pkg.a -> pkg.sub.mod -> pkg.a"
    ]
    # A type checker follows the `if TYPE_CHECKING:` import too (and the `else:` branch as well).
    assert import_graph(pkg, type_checking=True)["pkg.sub.other"] == {"pkg.a", "pkg.b", "pkg.sub.mod"}
    (pkg / "b.py").write_text("from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from pkg.sub.other import lazy\n")
    assert import_graph(pkg)["pkg.b"] == set()
    assert import_graph(pkg, type_checking=True)["pkg.b"] == {"pkg.sub", "pkg.sub.other"}


def test_importing_a_submodule_initialises_its_packages(tmp_path: Path) -> None:
    pkg = tmp_path / "pkg"
    (pkg / "a" / "deep").mkdir(parents=True)
    (pkg / "__init__.py").write_text("")
    (pkg / "a" / "__init__.py").write_text("from pkg.a.inner import x\n")
    (pkg / "a" / "inner.py").write_text("from pkg.a.deep.leaf import y\n")
    (pkg / "a" / "deep" / "__init__.py").write_text("")
    (pkg / "a" / "deep" / "leaf.py").write_text("")
    (pkg / "b.py").write_text("import pkg.a.deep.leaf\n")
    graph = import_graph(pkg)
    assert graph["pkg.b"] == {"pkg.a", "pkg.a.deep", "pkg.a.deep.leaf"}  # pkg.a's __init__ runs first
    assert graph["pkg.a.inner"] == {"pkg.a.deep", "pkg.a.deep.leaf"}  # not its own package
    assert cycles(graph) == []


def test_layers_collapse_and_their_cycles_are_found() -> None:
    graph = {
        "lola": {"lola.x"},
        "lola.x.a": {"lola.y.b", "lola.x.c"},
        "lola.x.c": set(),
        "lola.y.b": {"lola.integrations.t.m"},
        "lola.integrations.t.m": {"lola.x.c"},
    }
    layers = layer_graph(graph)
    assert layers == {"lola.x": {"lola.y"}, "lola.y": {"lola.integrations.t"}, "lola.integrations.t": {"lola.x"}}
    assert cycles(layers) == ["3 modules (lola.integrations.t, lola.x, lola.y):\n    lola.integrations.t -> lola.x -> lola.y -> lola.integrations.t"]


def test_lola_layers_have_no_cycles() -> None:
    layers = layer_graph(import_graph())
    assert "lola.pretrained" in layers["lola.integrations.transformers"]
    found = cycles(layers)
    assert not found, "import cycles between lola's layers:\n" + "\n".join(found)


def test_the_loading_layer_sits_below_inference_and_training() -> None:
    layers = layer_graph(import_graph())
    assert "lola.pretrained" in layers["lola.linearize"]  # training writes through it
    for layer in ("lola.pretrained", "lola.integrations.transformers", "lola.eval", "lola.models", "lola.integrations.lm_eval"):
        assert "lola.linearize" not in layers[layer], f"{layer} imports training code"


def test_lola_has_no_import_cycles() -> None:
    graph = import_graph()
    assert "lola.config" in graph and "lola.integrations.transformers.apply" in graph
    found = cycles(graph)
    assert not found, "import cycles inside lola:\n" + "\n".join(found)


def test_lola_has_no_import_cycles_for_type_checkers() -> None:
    # An import under `if TYPE_CHECKING:` hides a cycle from the interpreter, not from a reader:
    # the two modules still depend on each other.
    found = cycles(import_graph(type_checking=True))
    assert not found, "import cycles inside lola through `if TYPE_CHECKING:` imports:\n" + "\n".join(found)


LIBRARY = (
    "lola.core",
    "lola.kernels",
    "lola.memory",
    "lola.policies",
    "lola.engine",
    "lola.feature_maps",
    "lola.layer",
    "lola.config",
    "lola.schedules",
    "lola.registry",
    "lola.limits",
    "lola.errors",
)
"""The inference library: what a LoLA layer needs to run (docs/design.md, "The packages")."""
APPLICATION = ("lola.cli", "lola.eval", "lola.linearize", "lola.integrations", "lola.models", "lola.data", "lola.methods")
"""What is built around it: the command, evaluations, training, integrations, model loading, text."""


def _within(module: str, packages: tuple[str, ...]) -> bool:
    return any(module == p or module.startswith(p + ".") for p in packages)


def test_the_library_never_imports_the_application() -> None:
    """No module of the inference library reaches, through any chain of imports (lazy ones
    included), a module of the application around it."""
    graph = import_graph()
    assert _within("lola.engine.composer", LIBRARY) and _within("lola.eval.niah", APPLICATION)
    found = []
    for start in sorted(m for m in graph if _within(m, LIBRARY)):
        seen, stack = {start}, [(start, [start])]
        while stack:
            module, path = stack.pop()
            for target in sorted(graph.get(module, ())):
                if target in seen:
                    continue
                seen.add(target)
                if _within(target, APPLICATION):
                    found.append(" -> ".join([*path, target]))
                stack.append((target, [*path, target]))
    assert not found, "the library imports the application:\n" + "\n".join(found[:10])
