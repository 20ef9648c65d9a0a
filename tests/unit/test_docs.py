"""The documentation builds as a site with every link and page resolving, and the README stays a front page.

``mkdocs build --strict`` (``mkdocs.yml``: validation of links, anchors and omitted pages set to warn)
fails on any warning: a broken link or anchor, a page under ``docs/`` missing from the nav.
"""

from __future__ import annotations

import re
import sys
from pathlib import Path

import pytest
from gevent import subprocess  # the test process is gevent-patched (tests/conftest.py)

ROOT = Path(__file__).resolve().parents[2]
README_MAX_LINES = 300
_LINK = re.compile(r"\]\(([^)\s]+)\)")
_HEADING = re.compile(r"^#{1,6}\s+(.+?)\s*#*\s*$", re.MULTILINE)


def test_mkdocs_build_is_strict_clean(tmp_path: Path) -> None:
    pytest.importorskip("mkdocs", reason="mkdocs is not installed (pip install -e '.[test]')")
    proc = subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(tmp_path / "site")],
                          capture_output=True, text=True, cwd=ROOT, timeout=100)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "WARNING" not in proc.stderr, proc.stderr
    assert (tmp_path / "site" / "compatibility" / "index.html").exists()


def test_readme_is_short() -> None:
    lines = (ROOT / "README.md").read_text(encoding="utf-8").count("\n")
    assert lines <= README_MAX_LINES, f"README.md has {lines} lines; move detail to a page under docs/"


def _anchors(page: Path) -> set[str]:
    from markdown.extensions.toc import slugify  # what mkdocs' toc uses for heading ids

    text = re.sub(r"```.*?```", "", page.read_text(encoding="utf-8"), flags=re.DOTALL)
    return {slugify(h, "-") for h in _HEADING.findall(text)}


def test_readme_links_into_docs_resolve() -> None:
    pytest.importorskip("markdown", reason="markdown comes with mkdocs (pip install -e '.[test]')")
    links = [m for m in _LINK.findall((ROOT / "README.md").read_text(encoding="utf-8"))
             if not re.match(r"[a-z]+://", m)]
    assert any(link.startswith("docs/") for link in links)
    for link in links:
        path, _, anchor = link.partition("#")
        target = ROOT / path
        assert target.exists(), f"README.md links to {link}, which does not exist"
        if anchor:
            assert anchor in _anchors(target), f"README.md links to {link}: no heading with that anchor"
