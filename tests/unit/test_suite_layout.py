"""The suite collects as one: pytest's default import mode puts each test folder without an ``__init__.py`` on
``sys.path`` and imports its files by their bare names, so two such files with one name stop the whole run at
collection (it happened: tests/unit/plane/ and tests/unit/tune/ each had a test_tune_report.py, and CI failed
before the first test ran, while runs of single folders passed)."""

from __future__ import annotations

from collections import defaultdict
from pathlib import Path

TESTS = Path(__file__).resolve().parents[1]


def _module_name(path: Path) -> str:
    """The name pytest imports ``path`` by: dotted from the top of its package, or bare outside one."""
    parts = [path.stem]
    folder = path.parent
    while (folder / "__init__.py").exists():
        parts.insert(0, folder.name)
        folder = folder.parent
    return ".".join(parts)


def test_no_two_test_files_share_an_import_name() -> None:
    by_name: dict[str, list[str]] = defaultdict(list)
    for path in TESTS.rglob("*.py"):
        if path.name.startswith("test_") or path.name == "conftest.py":
            by_name[_module_name(path)].append(str(path.relative_to(TESTS)))
    # conftest.py files are imported per folder by pytest itself, never by their bare name
    clashes = {name: files for name, files in by_name.items() if len(files) > 1 and name != "conftest"}
    assert not clashes, f"test files pytest would import under one name (rename one): {clashes}"
