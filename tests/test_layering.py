"""The import layering of DESIGN.md, checked on the source: every ``import`` of a kubevol
module (at module level, inside functions, and under ``TYPE_CHECKING``) is read with
``ast``, and the graph must keep the layers, keep grpc inside the CSI packages, and hold no
cycle. A function-level import is an edge like any other, so a lazy import that hides a
cycle is found; lazy imports of third-party modules (for start-up speed) are not edges.

    errors/types ◄ util ◄ layout ◄ mount ◄ k8s ◄ bases ◄ metrics, csi (protocol)
        ◄ plugins (kubernetes.io/csi included), csidriver ◄ node, nomad ◄ testing ◄ cli

This is DESIGN.md's order with two layers lower than it draws them (see ``GROUPS``): the
mount layer below the bases, as Kubernetes' mount-utils sits below pkg/volume, and ``k8s``
below the bases, whose ``VolumeHost`` serves plugins the objects and tokens it defines. The
layers are folders. A package may import its
own modules and those of lower layers, never a sibling of its own layer (plugins ↛
csidriver: the node side and the driver kit share only the protocol). ``kubevol.testing``
may import anything below the CLI; the package ``kubevol`` itself is the public facade over
everything.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

import attrs

PACKAGE_DIR = Path(__file__).resolve().parent.parent / "kubevol"

#: (group, layer, module prefixes). A module belongs to the group of its longest prefix; a
#: top-level module not named here is a base. The mount layer sits below the bases, as
#: Kubernetes' mount-utils sits below pkg/volume: the bases' interfaces are typed with the
#: mount interface (``VolumeHost.get_mounter``) and their default unstage verdict is the
#: mount layer's rule, while the mount layer needs nothing of the bases.
GROUPS: tuple[tuple[str, float, tuple[str, ...]], ...] = (
    # The bottom: errors, argument types, and primitives that know no volume concept.
    ("errors/types", 0, ("kubevol.errors", "kubevol.types", "kubevol._version")),
    ("util", 0.5, ("kubevol.util",)),
    ("layout", 1, ("kubevol.layout",)),
    ("mount", 1.5, ("kubevol.mount",)),
    # Below the bases: the host interface serves plugins ConfigMaps, Secrets and tokens.
    ("k8s", 1.8, ("kubevol.k8s",)),
    ("bases", 2, ()),
    ("metrics", 3, ("kubevol.metrics",)),
    ("csi protocol", 3, ("kubevol.csi",)),
    ("plugins", 4, ("kubevol.plugins",)),
    ("csidriver", 4, ("kubevol.csidriver",)),
    ("node", 5, ("kubevol.node",)),
    ("nomad", 5, ("kubevol.nomad",)),
    ("testing", 5.5, ("kubevol.testing",)),
    ("cli", 6, ("kubevol.cli",)),
    ("facade", 7, ()),
)

#: The packages that speak gRPC: the protocol, the CSI plugin and the driver kit.
GRPC_PACKAGES = ("kubevol.csi", "kubevol.plugins.csi", "kubevol.csidriver")

#: Imports under ``TYPE_CHECKING`` that name a type of a higher layer. They have no effect
#: at run time; each is here because a lower layer's interface is typed with it.
TYPE_ONLY_BACK_EDGES: dict[tuple[str, str], str] = {
    ("kubevol.types", "kubevol.spec"): "argument types (VolumeOptions, ...) carry a Spec",
}

#: Edges left out of the cycle check. The one cycle kubevol keeps on purpose: the host
#: knows its plugin manager and the manager its host, as in the kubelet, for types only.
CYCLE_EXEMPT_EDGES: dict[tuple[str, str], str] = {
    ("kubevol.host", "kubevol.manager"): "type-only host↔manager cycle (mirrors the kubelet)",
}

#: Violations being removed by work in progress. Each names who removes it; remove the entry
#: when the fix lands (the test fails on an entry that is no longer needed).
IN_PROGRESS: dict[tuple[str, str], str] = {}


@attrs.frozen
class Edge:
    """One import of ``target`` by ``source``."""

    source: str
    target: str
    line: int
    type_only: bool
    in_function: bool


def _modules() -> dict[str, Path]:
    out = {}
    for path in PACKAGE_DIR.rglob("*.py*"):
        if path.suffix not in (".py", ".pyi"):
            continue
        parts = path.relative_to(PACKAGE_DIR.parent).with_suffix("").parts
        if parts[-1] == "__init__":
            parts = parts[:-1]
        out[".".join(parts)] = path
    return out


MODULES = _modules()


def _resolve(name: str) -> str:
    """The module ``name`` is, or the nearest package holding it."""
    while name not in MODULES and "." in name:
        name = name.rpartition(".")[0]
    return name


def _is_type_checking(test: ast.expr) -> bool:
    return isinstance(test, ast.Name | ast.Attribute) and ast.unparse(test).endswith(
        "TYPE_CHECKING"
    )


#: (imported module, line, type-only, inside a function)
_Import = tuple[str, int, bool, bool]


def _imports(module: str, path: Path) -> Iterator[_Import]:
    """(imported module, line, type-only, inside a function) for every import in ``path``,
    third-party ones included (``grpc.aio``...)."""
    tree = ast.parse(path.read_text(encoding="utf-8"), str(path))
    package = module if path.stem == "__init__" else module.rpartition(".")[0]

    def walk(node: ast.AST, type_only: bool, in_function: bool) -> Iterator[_Import]:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.If) and _is_type_checking(child.test):
                for stmt in child.body:
                    yield from walk_one(stmt, True, in_function)
                for stmt in child.orelse:
                    yield from walk_one(stmt, type_only, in_function)
            else:
                yield from walk_one(child, type_only, in_function)

    def walk_one(node: ast.AST, type_only: bool, in_function: bool) -> Iterator[_Import]:
        if isinstance(node, ast.Import):
            for alias in node.names:
                yield alias.name, node.lineno, type_only, in_function
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package
                for _ in range(node.level - 1):
                    anchor = anchor.rpartition(".")[0]
                base = f"{anchor}.{base}" if base else anchor
            for alias in node.names:
                # ``from kubevol import layout`` imports the module kubevol.layout.
                full = f"{base}.{alias.name}"
                yield (full if full in MODULES else base), node.lineno, type_only, in_function
        else:
            nested = in_function or isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef)
            yield from walk(node, type_only, nested)

    yield from walk(tree, False, False)


def _edges() -> tuple[list[Edge], list[Edge]]:
    """(edges between kubevol modules, imports of grpc)."""
    edges, grpc = [], []
    for module, path in sorted(MODULES.items()):
        for name, line, type_only, in_function in _imports(module, path):
            top = name.split(".")[0]
            if top == "grpc":
                grpc.append(Edge(module, name, line, type_only, in_function))
            elif top == "kubevol":
                target = _resolve(name)
                if target != module:
                    edges.append(Edge(module, target, line, type_only, in_function))
    return edges, grpc


EDGES, GRPC_IMPORTS = _edges()


def _group(module: str) -> tuple[str, float]:
    if module == "kubevol":
        return "facade", 7
    best: tuple[str, float, str] | None = None
    for name, layer, prefixes in GROUPS:
        for prefix in prefixes:
            if (module == prefix or module.startswith(prefix + ".")) and (
                best is None or len(prefix) > len(best[2])
            ):
                best = (name, layer, prefix)
    if best is not None:
        return best[0], best[1]
    assert module.count(".") == 1, f"package {module} is in no layer: add it to GROUPS"
    return "bases", 2


def _where(edge: Edge) -> str:
    how = "type-only " if edge.type_only else "function-level " if edge.in_function else ""
    return f"{edge.source}:{edge.line} {how}imports {edge.target}"


def _layer_violations(edges: list[Edge] = EDGES) -> dict[tuple[str, str], Edge]:
    out: dict[tuple[str, str], Edge] = {}
    for edge in edges:
        (src_group, src_layer), (dst_group, dst_layer) = _group(edge.source), _group(edge.target)
        if src_group == dst_group or dst_layer < src_layer:
            continue
        key = (edge.source, edge.target)
        if edge.type_only and key in TYPE_ONLY_BACK_EDGES:
            continue
        out.setdefault(key, edge)
    return out


def _cycles(edges: list[Edge] = EDGES) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan, iterative)."""
    graph: dict[str, set[str]] = {}
    for edge in edges:
        if (edge.source, edge.target) not in CYCLE_EXEMPT_EDGES:
            graph.setdefault(edge.source, set()).add(edge.target)
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []
    for start in sorted(graph):
        if start in index:
            continue
        work: list[tuple[str, Iterator[str]]] = [(start, iter(sorted(graph.get(start, ()))))]
        index[start] = low[start] = len(index)
        stack.append(start)
        on_stack.add(start)
        while work:
            node, successors = work[-1]
            advanced = False
            for succ in successors:
                if succ not in index:
                    index[succ] = low[succ] = len(index)
                    stack.append(succ)
                    on_stack.add(succ)
                    work.append((succ, iter(sorted(graph.get(succ, ())))))
                    advanced = True
                    break
                if succ in on_stack:
                    low[node] = min(low[node], index[succ])
            if advanced:
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                component = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.append(member)
                    if member == node:
                        break
                if len(component) > 1:
                    found.append(sorted(component))
    return found


def _cycle_edges(component: list[str]) -> list[Edge]:
    members = set(component)
    return [
        e
        for e in EDGES
        if e.source in members
        and e.target in members
        and (e.source, e.target) not in CYCLE_EXEMPT_EDGES
    ]


def test_every_module_is_in_a_layer() -> None:
    """A new package gets a place in the layering before it lands."""
    for module in MODULES:
        _group(module)


def test_imports_follow_the_layers() -> None:
    """No module imports a module of a higher layer or of a sibling package of its own layer
    (function-level imports included; type-only ones only where listed)."""
    violations = {
        key: edge for key, edge in _layer_violations().items() if key not in IN_PROGRESS
    }
    assert not violations, (
        "imports against the layering (a new top-level module is a base unless GROUPS says "
        "otherwise: list a primitive under errors/types):\n"
        + "\n".join(_where(e) for e in violations.values())
    )


def test_only_the_csi_packages_import_grpc() -> None:
    """grpc is the CSI transport: only the protocol, the CSI plugin and the driver kit import
    it."""
    outside = [
        e
        for e in GRPC_IMPORTS
        if not any(e.source == p or e.source.startswith(p + ".") for p in GRPC_PACKAGES)
    ]
    assert not outside, "\n".join(_where(e) for e in outside)


def test_there_is_no_import_cycle() -> None:
    """Apart from the type-only host↔manager pair, no set of modules imports itself round,
    not even through an import hidden in a function."""
    cycles = []
    for component in _cycles():
        edges = [e for e in _cycle_edges(component) if (e.source, e.target) not in IN_PROGRESS]
        if edges and _still_cyclic(component, edges):
            cycles.append(component)
    assert not cycles, "import cycles:\n" + "\n\n".join(
        "\n".join(_where(e) for e in _cycle_edges(c)) for c in cycles
    )


def _still_cyclic(component: list[str], edges: list[Edge]) -> bool:
    """Whether ``component`` stays cyclic with only ``edges`` (in-progress ones removed)."""
    graph: dict[str, set[str]] = {}
    for e in edges:
        graph.setdefault(e.source, set()).add(e.target)

    def reaches(start: str, goal: str) -> bool:
        seen, todo = set(), [start]
        while todo:
            node = todo.pop()
            for nxt in graph.get(node, ()):
                if nxt == goal:
                    return True
                if nxt not in seen:
                    seen.add(nxt)
                    todo.append(nxt)
        return False

    return any(reaches(m, m) for m in component)


def test_in_progress_entries_are_still_needed() -> None:
    """An allowance for work in progress goes as soon as the work lands."""
    violations = set(_layer_violations())
    cyclic = {(e.source, e.target) for c in _cycles() for e in _cycle_edges(c)}
    fixed = sorted(key for key in IN_PROGRESS if key not in violations | cyclic)
    assert not fixed, f"fixed, remove from IN_PROGRESS: {fixed}"


def test_the_checker_sees_hidden_imports() -> None:
    """The graph has the imports this check exists for: one inside a function and one under
    TYPE_CHECKING (if it saw neither kind, every check above would pass vacuously)."""
    assert any(e.in_function for e in EDGES)
    assert any(
        e.type_only and (e.source, e.target) == ("kubevol.host", "kubevol.manager")
        for e in EDGES
    )


def test_the_checker_finds_planted_violations() -> None:
    """A back edge, a sideways edge and a cycle hidden in a function are each found on a
    made-up graph (so a green run means the rules ran, not that they are blind)."""
    planted = [
        Edge("kubevol.layout", "kubevol.node.host", 1, False, True),
        Edge("kubevol.plugins.empty_dir", "kubevol.csidriver.server", 2, False, True),
        Edge("kubevol.node.host", "kubevol.layout", 3, False, False),
        Edge("kubevol.csi.client", "kubevol.csi.errors", 4, False, False),
        Edge("kubevol.csi.errors", "kubevol.csi.client", 5, False, True),
    ]
    assert set(_layer_violations(planted)) == {
        ("kubevol.layout", "kubevol.node.host"),
        ("kubevol.plugins.empty_dir", "kubevol.csidriver.server"),
    }
    assert sorted(map(sorted, _cycles(planted))) == [
        ["kubevol.csi.client", "kubevol.csi.errors"],
        ["kubevol.layout", "kubevol.node.host"],
    ]
