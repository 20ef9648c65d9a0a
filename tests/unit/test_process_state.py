"""The table of process-wide state in docs/architecture.md is complete and true.

An ``ast`` walk of the package finds its module-level mutable state: a module-level name that a function
rebinds (``global``, or ``module.NAME = v`` from another module), writes into (``NAME[k] = v``,
``NAME.attr = v``, ``del NAME[k]``) or changes through a mutating method (``NAME.append(...)``, a
``ContextVar``'s ``set``, a cache's ``put``), and a module-level
lock, semaphore, context variable, cache or weak set, which hold state by what they are. Writes in the
module's own body are its initialization, not state (a table of dtypes filled in at import). Every name
the walk finds must be in a row of the table that is not marked **removed**; every name a live row
gives must be one the walk finds (a row for state the walk cannot see, the gevent patching, names none:
"—"); a row marked **removed** names state that is gone.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PACKAGE = ROOT / "triton_actor"
DOC = ROOT / "docs" / "architecture.md"

# methods that change the object they are called on (containers, ContextVar, fastpath.BoundedCache)
MUTATORS = {"append", "appendleft", "extend", "extendleft", "add", "update", "pop", "popleft", "popitem",
            "clear", "setdefault", "remove", "discard", "insert", "set", "put", "move_to_end", "rotate"}
# constructors whose instances are state by what they are, even when nothing in the module writes them
STATEFUL = {"Lock", "RLock", "Semaphore", "BoundedSemaphore", "native_lock", "native_rlock", "ContextVar",
            "BoundedCache", "WeakSet", "WeakKeyDictionary", "WeakValueDictionary", "ServerHooks", "local"}


def _module_names(tree: ast.Module) -> dict[str, ast.expr | None]:
    """Names bound by the module's own body (assignments only: functions, classes and imports are code)."""
    names: dict[str, ast.expr | None] = {}
    for node in tree.body:
        if isinstance(node, ast.Assign):
            targets, value = node.targets, node.value
        elif isinstance(node, ast.AnnAssign):
            targets, value = [node.target], node.value
        else:
            continue
        for target in targets:
            for name in ast.walk(target):
                if isinstance(name, ast.Name):
                    names[name.id] = value
    return names


def _written_in_functions(tree: ast.Module, names: set[str]) -> set[str]:
    found: set[str] = set()
    for func in ast.walk(tree):
        if not isinstance(func, (ast.FunctionDef, ast.AsyncFunctionDef)):
            continue
        for node in ast.walk(func):
            if isinstance(node, ast.Global):
                found.update(node.names)
            targets: list[ast.expr] = []
            if isinstance(node, (ast.Assign, ast.Delete)):
                targets = node.targets
            elif isinstance(node, (ast.AugAssign, ast.AnnAssign)):
                targets = [node.target]
            for target in targets:
                if isinstance(target, (ast.Subscript, ast.Attribute)) and isinstance(target.value, ast.Name):
                    found.add(target.value.id)
            if (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr in MUTATORS
                    and isinstance(node.func.value, ast.Name)):
                found.add(node.func.value.id)
    return found & names


def _module_aliases(tree: ast.Module, path: Path) -> dict[str, Path]:
    """Names this module binds to other modules of the package (``from .x import y as z``) → their files."""
    aliases: dict[str, Path] = {}
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom):
            if node.level:
                base = path.parents[node.level - 1]
            elif (node.module or "").startswith("triton_actor"):
                base, node.module = PACKAGE, (node.module or "").removeprefix("triton_actor").lstrip(".") or None
            else:
                continue
            folder = base.joinpath(*(node.module or "").split(".")) if node.module else base
            for alias in node.names:
                for candidate in (folder / f"{alias.name}.py", folder / alias.name / "__init__.py"):
                    if candidate.exists():
                        aliases[alias.asname or alias.name] = candidate
    return aliases


def _written_from_outside(tree: ast.Module, path: Path) -> set[tuple[Path, str]]:
    """``module.NAME = v`` in a function of another module (a child process setting its forwarder)."""
    aliases = _module_aliases(tree, path)
    found: set[tuple[Path, str]] = set()
    for func in ast.walk(tree):
        if isinstance(func, (ast.FunctionDef, ast.AsyncFunctionDef)):
            for node in ast.walk(func):
                for target in node.targets if isinstance(node, ast.Assign) else []:
                    if (isinstance(target, ast.Attribute) and isinstance(target.value, ast.Name)
                            and target.value.id in aliases):
                        found.add((aliases[target.value.id], target.attr))
    return found


def _constructor(value: ast.expr | None) -> str:
    if not isinstance(value, ast.Call):
        return ""
    func = value.func
    return func.attr if isinstance(func, ast.Attribute) else func.id if isinstance(func, ast.Name) else ""


def walk() -> set[tuple[str, str]]:
    """(module path under triton_actor/, name) of every module-level mutable the walk finds."""
    state: set[tuple[str, str]] = set()
    trees = {path: ast.parse(path.read_text(encoding="utf-8")) for path in sorted(PACKAGE.rglob("*.py"))
             if "_generated" not in path.parts}
    names = {path: _module_names(tree) for path, tree in trees.items()}
    for path, tree in trees.items():
        module = path.relative_to(PACKAGE).as_posix()
        for name in _written_in_functions(tree, set(names[path])):
            state.add((module, name))
        for name, value in names[path].items():
            if _constructor(value) in STATEFUL:
                state.add((module, name))
        for other, name in _written_from_outside(tree, path):
            if name in names.get(other, {}):
                state.add((other.relative_to(PACKAGE).as_posix(), name))
    return state


def table() -> list[tuple[list[str], list[str], bool]]:
    """The rows of "Process-wide state": (modules, names, removed)."""
    text = DOC.read_text(encoding="utf-8")
    section = text.split("## Process-wide state", 1)[1].split("\n## ", 1)[0]
    rows = []
    for line in section.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) != 5 or not cells[0].isdigit():
            continue
        modules = re.findall(r"`([\w/.]+\.py)`", cells[1])
        names = re.findall(r"`(\w+)`", cells[2])
        rows.append((modules, names, "**removed**" in cells[4]))
    return rows


def _resolve(module: str) -> str:
    """A module as the table writes it (a path under triton_actor/, or its tail) → its path there."""
    matches = [p.relative_to(PACKAGE).as_posix() for p in PACKAGE.rglob(Path(module).name)
               if p.relative_to(PACKAGE).as_posix().endswith(module)]
    return matches[0] if len(matches) == 1 else module


def test_the_table_names_every_module_level_mutable_the_walk_finds() -> None:
    rows = table()
    assert len(rows) >= 10, "the table of docs/architecture.md#process-wide-state was not found"
    listed = {(_resolve(m), n) for modules, names, removed in rows if not removed for m in modules for n in names}
    found = walk()
    missing = sorted(f"{m}: {n}" for m, n in found if not any(m == lm and n == ln for lm, ln in listed))
    assert not missing, ("module-level state missing from docs/architecture.md#process-wide-state (add a row: "
                         f"owner, why process-wide), or make it a Server's: {missing}")


def test_every_name_in_the_table_is_state_the_walk_finds_or_is_gone() -> None:
    found = walk()
    for modules, names, removed in table():
        paths = [_resolve(m) for m in modules]
        for name in names:
            hits = [p for p in paths if (p, name) in found]
            if removed:
                assert not hits, f"{name} is marked removed but is still module-level state in {hits}"
            else:
                assert hits, f"the table lists {name} in {modules}, which the walk does not find there"
