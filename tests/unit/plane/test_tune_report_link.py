"""The status page's tune report link (plane/tune_report.py): the folder is a client's word, so what it reads
from there is bounded and never blocks."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from triton_actor.errors import TritonError
from triton_actor.plane.tune_report import MAX_FILE_BYTES, TuneReport


def _report(folder: Path) -> Path:
    folder.mkdir()
    (folder / "summary.json").write_text(json.dumps({"model": "m", "verdict": "kept"}))
    (folder / "index.html").write_text("<html></html>")
    return folder


def test_a_report_folder_is_taken_and_its_files_served(tmp_path: Path) -> None:
    report = TuneReport()
    report.set(str(_report(tmp_path / "r")))
    assert report.file("index.html") == (b"<html></html>", "text/html; charset=utf-8")


def test_a_summary_that_is_a_fifo_or_too_big_is_refused_without_blocking(tmp_path: Path) -> None:
    fifo = tmp_path / "fifo"
    fifo.mkdir()
    (fifo / "index.html").write_text("<html></html>")
    os.mkfifo(fifo / "summary.json")  # a plain open would wait for a writer forever
    big = _report(tmp_path / "big")
    with open(big / "summary.json", "wb") as f:
        f.truncate(MAX_FILE_BYTES + 1)
    report = TuneReport()
    for folder in (fifo, big):
        with pytest.raises(TritonError, match="is not a tune report folder"):
            report.set(str(folder))
    assert report.status() is None
