"""The live status page in a real headless browser (Debian's chromium), and /status.json's numbers.

Traffic runs in greenlets while chromium loads ``/status``; the page polls ``/status.json`` on its own
timer, so the DOM chromium dumps shows live values only if the script ran, fetched and rendered
(``--virtual-time-budget`` lets the page's timers run ahead; chromium waits for the fetches it makes).
``STATUS_PAGE_SCREENSHOT=docs/status_page.png`` keeps the screenshot (the README's picture).
"""

from __future__ import annotations

import base64
import hashlib
import json
import os
import re
import shutil
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path

import gevent
import gevent.event
import numpy as np
import pytest
import tritonclient.http as httpclient
from gevent import subprocess

from scripts import modelgen

from .server import ServerProcess, add_model

pytestmark = pytest.mark.timeout(120)
CHROMIUM = shutil.which("chromium") or "/usr/bin/chromium"


def _chromium(*args: str) -> str:
    cmd = [CHROMIUM, "--headless", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
           "--hide-scrollbars", "--user-data-dir=" + os.environ.get("TMPDIR", "/tmp") + f"/chromium-{os.getpid()}",
           *args]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=90)
    assert done.returncode == 0, done.stderr
    return done.stdout


@pytest.fixture
def busy_server(tmp_path: Path, start_server: Callable[..., ServerProcess]) -> Iterator[ServerProcess]:
    """Two models under steady traffic from 6 clients, and one that failed to load."""
    repo = tmp_path / "models"
    modelgen.python_identity(repo, "slow_batcher", delay_ms=15, dims=(4,), max_batch_size=8, dynamic_batching=True,
                             max_queue_delay_us=2000)
    modelgen.python_identity(repo, "quick", delay_ms=0, dims=(4,), max_batch_size=4, count=2)
    add_model(repo, "broken", 'backend: "python"\nmax_batch_size: 0\n', "raise RuntimeError('no weights here')\n")
    server = start_server(repo, flags=("--exit-on-error=false", "--strict-readiness=false"))
    stop = gevent.event.Event()

    def traffic(model: str, rows: int) -> None:
        client = httpclient.InferenceServerClient(server.url)
        inp = httpclient.InferInput("INPUT0", [rows, 4], "FP32")
        inp.set_data_from_numpy(np.ones((rows, 4), np.float32))
        while not stop.is_set():
            client.infer(model, [inp])
        client.close()

    workers = [gevent.spawn(traffic, "slow_batcher", 1 + i % 2) for i in range(4)]
    workers += [gevent.spawn(traffic, "quick", 1) for _ in range(2)]
    try:
        with gevent.Timeout(30):  # traffic is flowing before the page opens
            while sum(_status(server)["versions"][i]["success"] for i in range(3)) < 20:
                gevent.sleep(0.05)  # polling /status.json under a deadline
        yield server
    finally:
        stop.set()
        gevent.joinall(workers, timeout=30, raise_error=True)


def _status(server: ServerProcess) -> dict:
    with urllib.request.urlopen(f"http://{server.url}/status.json", timeout=30) as answer:  # gevent-patched socket
        return json.loads(answer.read())


def _rows(dom: str) -> dict[str, str]:
    return {m.group(1): m.group(0) for m in re.finditer(r'<tr data-model="([\w.-]+)".*?</tr>', dom, re.S)}


def _cell(row: str, cls: str) -> str:
    m = re.search(rf'<td class="{cls}">([^<]*)</td>', row)
    assert m, row
    return m.group(1)


def test_status_json_counts(busy_server: ServerProcess) -> None:
    st = _status(busy_server)
    by_name = {v["name"]: v for v in st["versions"]}
    assert set(by_name) == {"slow_batcher", "quick", "broken"}
    assert by_name["broken"]["state"] == "UNAVAILABLE" and "no weights here" in by_name["broken"]["reason"]
    quick, slow = by_name["quick"], by_name["slow_batcher"]
    assert quick["instances"] == ["quick_0_0", "quick_0_1"] and len(slow["instances"]) == 1
    assert sum(slow["batches"].values()) == slow["execution_count"] > 0
    assert quick["batches"] == {"1": quick["execution_count"]}
    assert 15 <= slow["latency_ms"]["p50"] <= slow["latency_ms"]["p99"] < 10_000  # the model sleeps 15 ms
    assert 0 < quick["latency_ms"]["p50"] < slow["latency_ms"]["p50"]


@pytest.mark.host_tools
def test_page_updates_live_in_chromium(busy_server: ServerProcess, tmp_path: Path) -> None:
    url = f"http://{busy_server.url}/status"
    dom = _chromium("--virtual-time-budget=6000", "--dump-dom", url)
    assert int(re.search(r'data-updates="(\d+)"', dom).group(1)) >= 3, dom[:2000]
    rows = _rows(dom)
    assert set(rows) == {"slow_batcher", "quick", "broken"}, dom[:2000]
    for model in ("slow_batcher", "quick"):
        row = rows[model]
        assert 'class="pill READY"' in row
        assert int(_cell(row, "success")) > 0
        # a number, not the dash shown before: the page had two answers half a second apart (by the server's clock) to
        # compute it from. Not > 0: on a busy machine this process's clients may not get a request
        # through in that half second, and 0.0 is then the right rate.
        assert float(_cell(row, "rate")) >= 0
        assert float(_cell(row, "p50")) > 0 and float(_cell(row, "p99")) >= float(_cell(row, "p50"))
    assert 'class="hist"' in rows["slow_batcher"]
    assert "UNAVAILABLE" in rows["broken"] and "no weights here" in rows["broken"]
    shot = Path(os.environ.get("STATUS_PAGE_SCREENSHOT") or tmp_path / "status.png").resolve()
    _chromium("--virtual-time-budget=4000", "--window-size=1280,560", f"--screenshot={shot}", url)
    assert shot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and shot.stat().st_size > 10_000


def test_the_page_is_sent_with_a_content_security_policy(busy_server: ServerProcess) -> None:
    """The page's own inline script (by its hash) and fetches of its origin only; not sniffed as another
    type. test_page_updates_live_in_chromium shows the script still runs under it."""
    with urllib.request.urlopen(f"http://{busy_server.url}/status", timeout=30) as answer:
        page, headers = answer.read(), answer.headers
    assert headers["X-Content-Type-Options"] == "nosniff"
    policy = dict(part.strip().split(" ", 1) for part in headers["Content-Security-Policy"].split(";"))
    assert policy["default-src"] == "'none'" and policy["connect-src"] == "'self'"
    assert policy["frame-ancestors"] == "'none'" and policy["base-uri"] == "'none'"
    script = re.search(rb"<script>(.*?)</script>", page, re.S).group(1)
    assert policy["script-src"] == f"'sha256-{base64.b64encode(hashlib.sha256(script).digest()).decode()}'"
