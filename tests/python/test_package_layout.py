"""The Python package's modules import each other without circles, as the C++ layers include
downward only (include_graph_test): every import of a shardtensor module, at the top of a file
or inside a function, is an edge, and the graph has no cycle. A function-level import is how a
circle hides, so the only ones allowed are listed here with the reason."""

import ast
import pathlib

import shardtensor

PACKAGE = pathlib.Path(shardtensor.__file__).parent

# (importing module, imported module): why it is imported inside a function.
DEFERRED = {
    ("shardtensor._compile", "shardtensor._compile_trace"):
        "it patches dynamo's internals: only a process that traces ShardTensors imports it",
}


def _module_name(path: pathlib.Path) -> str:
    parts = ["shardtensor", *path.relative_to(PACKAGE).with_suffix("").parts]
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _modules() -> dict:
    return {_module_name(path): path for path in sorted(PACKAGE.rglob("*.py"))}


def _imports(name: str, path: pathlib.Path, modules: dict):
    """(imported module, whether outside every function) for each import of a package module."""
    tree = ast.parse(path.read_text())
    in_functions = {id(inner) for node in ast.walk(tree) if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef))
                    for inner in ast.walk(node)}
    package = name if path.name == "__init__.py" else name.rsplit(".", 1)[0]
    for node in ast.walk(tree):
        if not isinstance(node, ast.ImportFrom):
            continue
        if node.level:
            base = package.split(".")[:len(package.split(".")) - (node.level - 1)]
            target = ".".join(base + ([node.module] if node.module else []))
        elif (node.module or "").startswith("shardtensor"):
            target = node.module
        else:
            continue
        for alias in node.names:
            imported = f"{target}.{alias.name}"
            if imported in modules:  # from . import _mesh
                yield imported, id(node) not in in_functions
            elif target in modules and target != name and alias.name != "_C":  # from ._mesh import X
                yield target, id(node) not in in_functions


def _graph():
    modules = _modules()
    edges, deferred = {m: set() for m in modules}, set()
    for name, path in modules.items():
        for imported, at_top in _imports(name, path, modules):
            edges[name].add(imported)
            if not at_top:
                deferred.add((name, imported))
    return edges, deferred


def _a_cycle(edges: dict):
    """One cycle of the graph as a list of modules, or None."""
    state = {}  # module -> "open" while on the path, "done" after

    def visit(node, path):
        state[node] = "open"
        for nxt in sorted(edges[node]):
            if state.get(nxt) == "open":
                return path[path.index(nxt):] + [nxt]
            if nxt not in state:
                found = visit(nxt, path + [nxt])
                if found:
                    return found
        state[node] = "done"
        return None

    for start in sorted(edges):
        if start not in state:
            found = visit(start, [start])
            if found:
                return found
    return None


def test_the_package_imports_without_circles():
    edges, _ = _graph()
    assert len(edges) > 20, f"found only {sorted(edges)} under {PACKAGE}"
    cycle = _a_cycle(edges)
    assert cycle is None, "the package's modules import each other in a circle: " + " -> ".join(cycle)


def test_imports_inside_functions_are_the_listed_ones():
    _, deferred = _graph()
    unlisted = sorted(deferred - set(DEFERRED))
    assert not unlisted, ("a shardtensor module imported inside a function (a hidden circle, or a cost to list "
                          "in DEFERRED with its reason): " + ", ".join(f"{a} imports {b}" for a, b in unlisted))


def test_the_checker_sees_a_circle():
    assert _a_cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    assert _a_cycle({"a": {"b"}, "b": set()}) is None
