"""The package's import graph keeps its shape (design.md, "Layers, enforced").

Nodes: each first-level subpackage of ``triton_actor`` and each module at its top; a folder that holds only
packages (``actors/``) stands for its packages, one node each. Every import counts, those inside functions
too; an import made for the type checker only (under ``if TYPE_CHECKING:``) does not, since it never runs.
The test fails on

* an import circle, between nodes or between two modules,
* an import from a layer into a layer above it (``LAYERS``, top first; runtime/ may be used by every layer
  and uses only the core values below it), or between two nodes of one layer,
* a module at the top of the package that is not in ``TOP_LEVEL``.

A new package or top-level module has to be placed in ``LAYERS`` (and ``TOP_LEVEL``) deliberately.
"""

from __future__ import annotations

import ast
import itertools
from pathlib import Path

PACKAGE = "triton_actor"
ROOT = Path(__file__).resolve().parents[2] / PACKAGE

# Top first. A node may import the nodes of the layers below its own, never those above or beside it.
LAYERS: list[tuple[str, ...]] = [
    ("__main__",),  # python -m triton_actor
    ("cli",),  # the entry point: parses the command line, runs the server or the gunicorn arbiter
    ("tune",),  # `triton-actor tune`: a client of the server (over the wire), so above everything it runs
    ("check",),  # triton-actor check: a tool that loads each model of a repository in a Server of its own
    ("workers",),  # several worker processes: the arbiter, the gunicorn worker class, the control sockets
    ("server",),  # the composition root: builds the actor tree and the front ends
    ("frontends",),  # HTTP, gRPC, metrics and status endpoints: decode → call → encode
    ("plane",),  # the calls layer: data plane, calls from Python models (BLS), live status data
    ("host",),  # host-wide state: the Host seam, its handlers, shared-memory regions, metrics snapshot
    ("actors.repository",),  # RepositoryActor: repositories, control mode, routing table
    ("actors.model",),  # ModelActor: versions, loading, validation, routing handles
    ("actors.scheduling",),  # schedulers, batching policies, the instance pool, instances, ensembles
    ("backends",),  # ONNX Runtime, TorchScript, Python (+ triton_python_backend_utils), devices
    ("config",),  # Settings and the flags that make them
    ("observability", "metrics", "cache"),  # logs and traces; metric families, statistics, StatsD; response cache
    ("repository",),  # the repository's files: layout, config.pbtxt, snapshots, reconcile
    ("protocol",),  # sans-I/O wire formats and transports
    ("runtime",),  # the actor kernel, the thread bridge, channels, fast paths, GC settling
    ("inference",),  # core values: the request and response types
    ("errors", "bootstrap", "__init__", "actors"),  # the one error type; the gevent patching; docstrings
]
TOP_LEVEL = {"__init__", "__main__", "bootstrap", "cli", "errors", "inference", "server"}  # at most 8


def _modules() -> dict[str, Path]:
    out = {}
    for path in sorted(ROOT.rglob("*.py")):
        rel = path.relative_to(ROOT.parent).with_suffix("")
        parts = list(rel.parts)
        if "_generated" in parts:
            continue
        if parts[-1] == "__init__":
            parts = parts[:-1]
        out[".".join(parts)] = path
    return out


MODULES = _modules()
PACKAGES = {m for m, p in MODULES.items() if p.name == "__init__.py"}


def _node(module: str) -> str:
    """The node a module belongs to (a name from LAYERS)."""
    parts = module.split(".")[1:]
    if not parts:
        return "__init__"
    first = parts[0]
    folder = ROOT / first
    if folder.is_dir() and not [p for p in folder.glob("*.py") if p.name != "__init__.py"] and len(parts) > 1:
        return f"{first}.{parts[1]}"  # a folder of packages: each package is a node
    return first


def _type_checking_only(tree: ast.AST) -> set[int]:
    ids: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.If) and (
                (isinstance(node.test, ast.Name) and node.test.id == "TYPE_CHECKING")
                or (isinstance(node.test, ast.Attribute) and node.test.attr == "TYPE_CHECKING")):
            for stmt in node.body:
                ids.update(id(n) for n in ast.walk(stmt))
    return ids


def _imports() -> list[tuple[str, str, int]]:
    """(importing module, imported module, line) for every import of the package by the package."""
    edges = []
    for module, path in MODULES.items():
        tree = ast.parse(path.read_text(), str(path))
        skip = _type_checking_only(tree)
        is_package = path.name == "__init__.py"
        for node in ast.walk(tree):
            if id(node) in skip:
                continue
            if isinstance(node, ast.Import):
                targets = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom):
                if node.level:
                    base = module.split(".") if is_package else module.split(".")[:-1]
                    base = base[: len(base) - node.level + 1]
                    target = ".".join([*base, *([node.module] if node.module else [])])
                else:
                    target = node.module or ""
                targets = [f"{target}.{a.name}" if f"{target}.{a.name}" in MODULES else target for a in node.names]
            else:
                continue
            for target in targets:
                if target == PACKAGE or target.startswith(PACKAGE + "."):
                    while target not in MODULES and "." in target:
                        target = target.rsplit(".", 1)[0]
                    edges.append((module, target, node.lineno))
    return edges


EDGES = _imports()


def _where(module: str, line: int) -> str:
    return f"{MODULES[module].relative_to(ROOT.parent)}:{line}"


def _circles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components with more than one member (Tarjan, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    out: list[list[str]] = []
    for start in sorted(graph):
        if start in index:
            continue
        work = [(start, iter(sorted(graph[start])))]
        index[start] = low[start] = len(index)
        stack.append(start)
        on_stack.add(start)
        while work:
            v, children = work[-1]
            for w in children:
                if w not in index:
                    index[w] = low[w] = len(index)
                    stack.append(w)
                    on_stack.add(w)
                    work.append((w, iter(sorted(graph.get(w, ())))))
                    break
                if w in on_stack:
                    low[v] = min(low[v], index[w])
            else:
                work.pop()
                if work:
                    low[work[-1][0]] = min(low[work[-1][0]], low[v])
                if low[v] == index[v]:
                    component = []
                    while True:
                        w = stack.pop()
                        on_stack.discard(w)
                        component.append(w)
                        if w == v:
                            break
                    if len(component) > 1:
                        out.append(sorted(component))
    return out


def _cycle(members: list[str], graph: dict[str, set[str]]) -> list[str]:
    """One shortest circle through the first member: [a, b, ..., a]."""
    inside, start = set(members), members[0]
    paths = {w: [start, w] for w in sorted(graph[start]) if w in inside}
    queue = list(paths)
    while queue and start not in paths:
        v = queue.pop(0)
        for w in sorted(graph[v]):
            if w in inside and w not in paths:
                paths[w] = [*paths[v], w]
                queue.append(w)
    return paths.get(start, [start, start])


def _describe(circles: list[list[str]], graph: dict[str, set[str]], of) -> str:
    lines = []
    for members in circles:
        hops = _cycle(members, graph)
        lines.append(" → ".join(hops) + f"   ({len(members)} in the circle: {', '.join(members)})")
        for a, b in itertools.pairwise(hops):
            src, dst, line = next((s, d, n) for s, d, n in EDGES if of(s) == a and of(d) == b)
            lines.append(f"  {_where(src, line)}: imports {dst}")
    return "\n".join(lines)


def test_no_import_circle_between_nodes() -> None:
    graph: dict[str, set[str]] = {}
    for a, b, _ in EDGES:
        if _node(a) != _node(b):
            graph.setdefault(_node(a), set()).add(_node(b))
            graph.setdefault(_node(b), set())
    circles = _circles(graph)
    assert not circles, "import circles between packages:\n" + _describe(circles, graph, _node)


def test_no_import_circle_between_modules() -> None:
    graph: dict[str, set[str]] = {}
    for a, b, _ in EDGES:
        if a != b and not a.startswith(b + "."):  # a package's modules may import its __init__
            graph.setdefault(a, set()).add(b)
            graph.setdefault(b, set())
    circles = _circles(graph)
    assert not circles, "import circles between modules:\n" + _describe(circles, graph, lambda m: m)


def test_every_node_has_a_layer() -> None:
    placed = {n for layer in LAYERS for n in layer}
    unplaced = sorted({_node(m) for m in MODULES} - placed)
    assert not unplaced, f"packages or top-level modules with no layer in LAYERS: {unplaced}"


def test_imports_point_down() -> None:
    rank = {n: i for i, layer in enumerate(LAYERS) for n in layer}
    wrong = []
    for a, b, line in sorted(set(EDGES)):
        na, nb = _node(a), _node(b)
        if na == nb or na not in rank or nb not in rank:
            continue
        if rank[nb] < rank[na]:
            wrong.append(f"  {_where(a, line)}: {na} imports {b}, which is in a higher layer ({nb})")
        elif rank[nb] == rank[na]:
            wrong.append(f"  {_where(a, line)}: {na} imports {b}, in the same layer ({nb})")
    assert not wrong, "imports that do not point down the layers:\n" + "\n".join(wrong)


def test_few_modules_at_the_top() -> None:
    top = {p.stem for p in ROOT.glob("*.py")}
    assert len(TOP_LEVEL) <= 8
    extra = sorted(top - TOP_LEVEL)
    assert not extra, f"modules at the top of {PACKAGE}/ outside the allowed list: {extra} (give them a package)"


MAX_LINES = 500  # a module past this holds more than one thing (generated code excepted)
MAX_DOC_LINES = 40  # a module docstring is its contract; the rest goes to docs/


def test_modules_stay_small_and_their_docstrings_short() -> None:
    too_long, long_docs = [], []
    for path in MODULES.values():
        text = path.read_text(encoding="utf-8")
        if len(text.splitlines()) > MAX_LINES:
            too_long.append(f"{path.relative_to(ROOT.parent)}: {len(text.splitlines())} lines")
        doc = ast.get_docstring(ast.parse(text), clean=False)
        if doc and doc.count("\n") + 1 > MAX_DOC_LINES:
            long_docs.append(f"{path.relative_to(ROOT.parent)}: a docstring of {doc.count(chr(10)) + 1} lines")
    assert not too_long, f"modules over {MAX_LINES} lines (split them along what they own):\n" + "\n".join(too_long)
    assert not long_docs, f"module docstrings over {MAX_DOC_LINES} lines (keep the contract):\n" + "\n".join(long_docs)
