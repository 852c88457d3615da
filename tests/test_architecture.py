"""The layering of src/gpurig, read from the source: no import circles, nothing imports a layer above it.

Every ``import`` counts, also those inside functions (gpurig imports torch and
mpi4py late so that ``gpurig --help`` stays fast, but a late import is still a
dependency). docs/ARCHITECTURE.md draws the same layers.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

SRC = Path(__file__).resolve().parents[1] / "src" / "gpurig"

# Top to bottom: a module may import its own layer's modules and any layer below, never one above.
LAYERS = [
    ("entry", {"gpurig.__main__"}),
    ("cli", {"gpurig.cli"}),
    ("api", {"gpurig"}),                          # the library API: gpurig.init, gpurig.DataParallel, ...
    ("train", {"gpurig.train"}),
    ("choose", {"gpurig.choose"}),               # calls predict and plan (hardware)
    ("predict", {"gpurig.predict"}),
    ("measure", {"gpurig.measure"}),
    ("hardware", {"gpurig.hardware"}),
    ("parallel", {"gpurig.parallel"}),
    ("perf", {"gpurig.perf"}),
    ("models", {"gpurig.models"}),
    ("spec", {"gpurig.spec"}),
    ("comm", {"gpurig.comm"}),
    ("launch", {"gpurig.launch"}),
    ("base", {"gpurig.errors", "gpurig.units", "gpurig.timing", "gpurig.files"}),
]


def modules() -> dict[str, Path]:
    """Every module of the package by dotted name (a package by its own name).

    >>> modules()["gpurig.comm"].name
    '__init__.py'
    """
    found = {}
    for path in SRC.rglob("*.py"):
        parts = list(path.relative_to(SRC.parent).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        found[".".join(parts)] = path
    return found


def imports(name: str, path: Path, known: dict[str, Path]) -> set[str]:
    """The gpurig modules ``name`` imports, anywhere in its text (``from a import b`` counts b if b is a module)."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            targets = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")[:len(package.split(".")) - (node.level - 1)]
                base = ".".join(anchor + ([base] if base else []))
            targets = [f"{base}.{a.name}" if f"{base}.{a.name}" in known else base for a in node.names]
        else:
            continue
        for target in targets:
            while target and target not in known:
                target = target.rpartition(".")[0]
            if target and target != name:
                found.add(target)
    return found


def layer_of(name: str) -> int:
    """Index of ``name``'s layer in :data:`LAYERS` (the longest matching prefix wins)."""
    best, index = -1, None
    for i, (_, prefixes) in enumerate(LAYERS):
        for prefix in prefixes:
            if (name == prefix or name.startswith(prefix + ".")) and len(prefix) > best:
                best, index = len(prefix), i
    if index is None:
        raise AssertionError(f"{name} belongs to no layer: add it to LAYERS and docs/ARCHITECTURE.md")
    return index


GRAPH = {name: imports(name, path, modules()) for name, path in modules().items()}


def test_every_module_has_a_layer():
    for name in GRAPH:
        layer_of(name)


def test_no_import_reaches_up_a_layer():
    upward = [f"{name} ({LAYERS[layer_of(name)][0]}) imports {target} ({LAYERS[layer_of(target)][0]})"
              for name, targets in GRAPH.items() for target in targets if layer_of(target) < layer_of(name)]
    assert upward == []


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Every strongly connected group of more than one module (Tarjan), each sorted.

    >>> cycles({"a": {"b"}, "b": {"a"}, "c": {"a"}})
    [['a', 'b']]
    """
    index, low, stack, on_stack, out = {}, {}, [], set(), []

    def visit(v):
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in graph.get(v, ()):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            group = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                group.append(w)
                if w == v:
                    break
            if len(group) > 1:
                out.append(sorted(group))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return out


def test_no_import_circles():
    assert cycles(GRAPH) == []


@pytest.mark.parametrize("graph, expected", [
    ({"a": {"b"}, "b": {"c"}, "c": {"a"}}, [["a", "b", "c"]]),
    ({"a": {"b"}, "b": set()}, []),
])
def test_the_circle_finder_finds_circles(graph, expected):
    assert cycles(graph) == expected


def test_no_top_level_module_shares_a_name_with_a_package_module():
    top = {p.stem for p in SRC.glob("*.py")} - {"__init__", "__main__"}
    inner = {p.stem for p in SRC.glob("*/**/*.py")}
    assert top & inner == set()


def test_a_layer_violation_is_caught(tmp_path):
    # the checks above read real files: a module of a low layer importing a high one must be reported
    module = tmp_path / "gpurig" / "comm" / "bad.py"
    module.parent.mkdir(parents=True)
    module.write_text("from gpurig.train import loop\n")
    found = imports("gpurig.comm.bad", module, {"gpurig.train", "gpurig.train.loop", "gpurig.comm.bad"})
    assert found == {"gpurig.train.loop"} and layer_of("gpurig.train.loop") < layer_of("gpurig.comm.bad")
