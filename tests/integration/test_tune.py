"""``triton-actor tune`` end to end (docs/tune.md): a real server, our load generator, the report (and
the report page in headless chromium: ``TUNE_REPORT_SCREENSHOT=docs/tune_report.png`` keeps the picture).

Each run is kept small (one concurrency, two instance counts, two batch sizes, short windows) so it
ends in well under a minute; which configuration wins is the host's business, so the tests check what
was measured and written, not the winner.
"""

from __future__ import annotations

import csv
import json
import os
import shutil
import signal
import sys
import urllib.error
import urllib.request
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest
import tritonclient.http as httpclient
from gevent import subprocess  # the test process is gevent-patched (tests/conftest.py)

from scripts import modelgen
from triton_actor.tune import report
from triton_actor.tune.points import Candidate, Point

from .server import ROOT, ServerProcess

# from the shipped (2 instances, batch 8) the climbs go down only: both counts and both sizes are measured
SMALL = ("--model", "batcher", "--concurrency", "2", "--instances", "1,2", "--max-batch-sizes", "4,8",
         "--dynamic-batching", "on", "--no-preferred", "--queue-delays-us", "0", "--isolation", "thread", "--warmup-s", "0.3",
         "--window-s", "0.3", "--max-windows", "5", "--max-minutes", "2", "--workers", "1")


def _repo(tmp_path: Path) -> Path:
    """``batcher``: 1 ms per execute (outside the GIL), batch 8, dynamic batching, two instances."""
    repo = tmp_path / "repo"
    modelgen.python_identity(repo, "batcher", delay_ms=1, dims=(4,), max_batch_size=8, count=2, dynamic_batching=True)
    return repo


def _tune(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "triton_actor", "tune", *args], cwd=ROOT, capture_output=True,
                          text=True, timeout=110)


def _measured(out: Path) -> list[dict[str, str]]:
    with (out / "points.csv").open() as f:
        return list(csv.DictReader(f))


def test_tune_writes_a_tuned_config_that_our_server_serves(tmp_path: Path,
                                                            start_server: Callable[..., ServerProcess]) -> None:
    repo, out = _repo(tmp_path), tmp_path / "report"
    shipped = (repo / "batcher" / "config.pbtxt").read_text()
    proc = _tune("--model-repository", str(repo), "--out", str(out), *SMALL)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    rows = _measured(out)
    assert {r["instances"] for r in rows} == {"1", "2"} and {r["max_batch_size"] for r in rows} == {"4", "8"}
    assert all(not r["error"] and float(r["throughput"]) > 0 and float(r["server_cpu_pct"]) > 0 for r in rows)
    assert "points," in proc.stderr and "ETA" in proc.stderr  # the progress lines
    # the table's legend and verdict: a pick, or (on a noisy machine the back-to-back rounds can refute the
    # search's best) the shipped config kept; either way the written tuned.pbtxt is what the summary picked
    assert "* pick, b the shipped config; pick: " in proc.stdout or \
        "* pick, b the shipped config; keeping the shipped config: " in proc.stdout, proc.stdout
    pick = json.loads((out / "summary.json").read_text())["pick"]["candidate"]
    for name in ("index.html", "throughput_vs_p99.png", "tuned.pbtxt", "server.log"):
        assert (out / name).is_file(), name
    assert (repo / "batcher" / "config.pbtxt").read_text() == shipped  # never rewritten
    tuned = repo / "batcher" / "configs" / "tuned.pbtxt"
    assert tuned.read_text() == (out / "tuned.pbtxt").read_text()
    server = start_server(repo, flags=("--model-config-name", "tuned"))
    served = httpclient.InferenceServerClient(server.url).get_model_config("batcher")
    assert served["instance_group"][0]["count"] == pick["instances"]
    assert served["max_batch_size"] == pick["max_batch_size"]


def test_attached_with_url_the_server_keeps_its_config_without_apply(tmp_path: Path,
                                                                     start_server: Callable[..., ServerProcess]) -> None:
    repo, out = _repo(tmp_path), tmp_path / "report"
    server = start_server(repo, flags=("--model-control-mode", "explicit", "--load-model", "batcher"))
    client = httpclient.InferenceServerClient(server.url)
    before = client.get_model_config("batcher")
    proc = _tune("--url", server.grpc_url, "--protocol", "grpc", "--model-repository", str(repo), "--out", str(out), *SMALL)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    rows = _measured(out)
    assert {r["instances"] for r in rows} == {"1", "2"}  # it did swap configs while it measured
    assert {r["server_cpu_pct"] for r in rows} == {"0.0"}  # not its process: not counted
    assert client.get_model_config("batcher") == before
    assert client.is_model_ready("batcher")
    assert not (repo / "batcher" / "configs").exists() and (out / "tuned.pbtxt").is_file()


def test_attached_with_apply_the_pick_is_loaded_and_written(tmp_path: Path,
                                                            start_server: Callable[..., ServerProcess]) -> None:
    repo, out = _repo(tmp_path), tmp_path / "report"
    server = start_server(repo, flags=("--model-control-mode", "explicit", "--load-model", "batcher"))
    assert "tune_report" not in _get_json(server, "/status.json")
    proc = _tune("--url", server.url, "--apply", "--model-repository", str(repo), "--out", str(out), *SMALL)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    pick = json.loads((out / "summary.json").read_text())["pick"]["candidate"]
    served = httpclient.InferenceServerClient(server.url).get_model_config("batcher")
    assert (served["instance_group"][0]["count"], served["max_batch_size"]) == (pick["instances"], pick["max_batch_size"])
    assert (repo / "batcher" / "configs" / "tuned.pbtxt").is_file()
    # the server's status page links the run's report, served from the report folder
    linked = _get_json(server, "/status.json")["tune_report"]
    assert linked["model"] == "batcher" and linked["url"] == "tune/report/"
    assert linked["verdict"] == json.loads((out / "summary.json").read_text())["verdict"]
    status, headers, body = _get(server, "/tune/report/")
    assert status == 200 and body == (out / "index.html").read_bytes() and "img-src 'self'" in headers["Content-Security-Policy"]
    status, headers, body = _get(server, "/tune/report/throughput_vs_p99.png")
    assert (status, headers["Content-Type"], body[:4]) == (200, "image/png", b"\x89PNG")
    assert _get(server, "/tune/report/points.csv")[2] == (out / "points.csv").read_bytes()
    assert "the server's status page links this report" in json.dumps(json.loads((out / "summary.json").read_text())["notes"])
    html = _chromium_dom(server, tmp_path)
    assert 'id="tune-report" href="tune/report/"' in html, html[-2000:]


def test_the_report_route_serves_the_report_folder_and_nothing_outside_it(
        tmp_path: Path, start_server: Callable[..., ServerProcess]) -> None:
    out = tmp_path / "report"
    point = Point(Candidate(1, 8, True, (8,)), 1, throughput=10.0, p50_ms=1, p95_ms=1, p99_ms=1, stable=True, windows=3)
    report.write(out, report.Outcome("batcher", "throughput", None, [point], baseline=point))
    (tmp_path / "secret.json").write_text('{"secret": 1}')
    (out / "escape.json").symlink_to(tmp_path / "secret.json")  # a link out of the folder
    (out / "sub").mkdir()
    (out / "sub" / "inner.json").write_text("{}")
    (out / "server.log").write_text("not a report file")
    server = start_server(_repo(tmp_path), flags=("--model-control-mode", "explicit", "--load-model", "batcher"))
    for bad in ("relative/path", str(tmp_path), str(tmp_path / "missing")):  # not absolute / not a report / absent
        assert _post(server, "/v2/tune/report", {"path": bad})[0] == 400, bad
    assert _get(server, "/tune/report/")[0] == 404  # nothing registered yet
    assert _post(server, "/v2/tune/report", {"path": str(out)})[0] == 200
    assert _get(server, "/tune/report/summary.json")[0] == 200
    for name in ("escape.json", "sub/inner.json", "..%2Fsecret.json", "%2E%2E/secret.json", "server.log", ".hidden.json",
                 "missing.png"):
        assert _get(server, "/tune/report/" + name)[0] == 404, name
    assert _post(server, "/v2/tune/report", {"path": str(out)}, method="GET")[0] == 405


def _request(server: ServerProcess, path: str, data: bytes | None = None,
             method: str = "GET") -> tuple[int, dict[str, str], bytes]:
    request = urllib.request.Request(f"http://{server.url}{path}", data, method=method)
    try:
        with urllib.request.urlopen(request, timeout=30) as r:
            return r.status, dict(r.headers), r.read()
    except urllib.error.HTTPError as e:
        return e.code, dict(e.headers), e.read()


def _get(server: ServerProcess, path: str) -> tuple[int, dict[str, str], bytes]:
    return _request(server, path)


def _get_json(server: ServerProcess, path: str) -> dict:
    status, _, body = _get(server, path)
    assert status == 200, body
    return json.loads(body)


def _post(server: ServerProcess, path: str, body: dict, method: str = "POST") -> tuple[int, dict[str, str], bytes]:
    return _request(server, path, json.dumps(body).encode(), method)


def _chromium_dom(server: ServerProcess, tmp_path: Path) -> str:
    """The status page's DOM after its script polled /status.json and rendered (headless chromium)."""
    chromium = shutil.which("chromium") or "/usr/bin/chromium"
    done = subprocess.run([chromium, "--headless", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
                           f"--user-data-dir={tmp_path / 'profile'}", "--virtual-time-budget=3000", "--dump-dom",
                           f"http://{server.url}/status"], capture_output=True, text=True, timeout=90)
    assert done.returncode == 0, done.stderr
    return done.stdout


@pytest.mark.parametrize("protocol", ["http", "grpc"])
def test_open_loop_latency_counts_the_queue_a_closed_loop_hides(tmp_path: Path, protocol: str,
                                                               start_server: Callable[..., ServerProcess]) -> None:
    """One instance, 20 ms per request, no batching: about 50/s. Offered 150/s in an open loop, the
    backlog grows and each latency, timed from the request's scheduled send, includes its wait; the
    closed loop at 4 clients is never more than 4 requests deep and shows about 4 executions."""
    repo = tmp_path / "repo"
    modelgen.python_identity(repo, "slow", delay_ms=20, dims=(4,), max_batch_size=0, count=1)
    server = start_server(repo)
    spec = {"url": server.url if protocol == "http" else server.grpc_url, "protocol": protocol, "model": "slow", "outputs": ["OUTPUT0"],
            "inputs": [{"name": "INPUT0", "datatype": "FP32", "shape": [1, 4]}], "warmup_s": 0.2, "window_s": 0.5,
            "min_windows": 3, "max_windows": 4, "stability_pct": 10}
    opened = _loadgen(dict(spec, request_rate=150))
    closed = _loadgen(dict(spec, concurrency=4))
    assert not opened["error"] and not closed["error"]
    assert opened["throughput"] < 150 * 0.8  # it could not keep up with the offered rate
    assert opened["p50_ms"] > closed["p99_ms"], (opened, closed)  # the queue is in the open loop's figures
    assert not opened["stable"]  # latency grows window after window


def _loadgen(spec: dict) -> dict:
    done = subprocess.run([sys.executable, "-m", "triton_actor.tune.loadgen", json.dumps(spec)], cwd=ROOT,
                          capture_output=True, text=True, timeout=90)
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout.strip().splitlines()[-1])


def test_ctrl_c_writes_the_report_of_what_was_measured(tmp_path: Path) -> None:
    repo, out = _repo(tmp_path), tmp_path / "report"
    proc = subprocess.Popen([sys.executable, "-m", "triton_actor", "tune", "--model-repository", str(repo),
                             "--out", str(out), *SMALL], cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True)
    seen = []
    for line in proc.stderr:  # the progress lines (not a terminal: one per point)
        seen.append(line)
        if " 1/" in line:
            proc.send_signal(signal.SIGINT)
            break
    stdout, stderr = proc.communicate(timeout=60)
    assert proc.returncode == 0, "".join(seen) + stdout + stderr
    summary = json.loads((out / "summary.json").read_text())
    assert summary["interrupted"] and summary["points"] >= 1 and summary["pick"] is not None
    assert "interrupted: the points measured before the stop" in stdout
    assert (out / "server.log").read_text().rstrip().endswith("server stopped")  # the server went with us


@pytest.mark.host_tools
def test_the_report_page_renders_with_its_plots_in_chromium(tmp_path: Path) -> None:
    points = [Point(Candidate(n, b, True, (b,)), c, throughput=t, p50_ms=p99 / 2, p95_ms=p99 * 0.9, p99_ms=p99,
                    cv_pct=3.0, stable=True, windows=3)
              for n, b, c, t, p99 in [(2, 16, 1, 900, 1.5), (2, 16, 4, 1500, 4.0), (4, 16, 4, 1700, 3.5),
                                      (4, 16, 16, 1900, 12.0), (1, 16, 4, 1100, 5.0), (4, 32, 4, 1750, 3.4)]]
    outcome = report.Outcome("identity_batch", "throughput", 10.0, points, baseline=points[1], elapsed_s=42,
                             tuned_text="# tuned\n", confirm=[points[1], points[5]])
    index = report.write(tmp_path, outcome)
    shot = tmp_path / "shot.png"
    chromium = shutil.which("chromium") or "/usr/bin/chromium"
    done = subprocess.run([chromium, "--headless", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
                           "--hide-scrollbars", f"--user-data-dir={tmp_path / 'profile'}", "--window-size=1000,1400",
                           f"--screenshot={shot}", index.as_uri()], capture_output=True, text=True, timeout=90)
    assert done.returncode == 0 and shot.read_bytes()[:4] == b"\x89PNG", done.stderr
    dom = subprocess.run([chromium, "--headless", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
                          f"--user-data-dir={tmp_path / 'profile'}", "--dump-dom", index.as_uri()],
                         capture_output=True, text=True, timeout=90).stdout
    assert dom.count("<img") == 3 and "1.17x the shipped config" in dom
    if os.environ.get("TUNE_REPORT_SCREENSHOT"):
        shutil.copy(shot, os.environ["TUNE_REPORT_SCREENSHOT"])


def test_an_ensemble_tunes_its_composing_models_and_serves_with_their_tuned_configs(
        tmp_path: Path, start_server: Callable[..., ServerProcess]) -> None:
    repo, out = tmp_path / "repo", tmp_path / "report"
    for name in ("first", "second"):
        modelgen.python_identity(repo, name, delay_ms=1, dims=(4,), max_batch_size=8, count=1, dynamic_batching=True)
    (repo / "pipe" / "1").mkdir(parents=True)
    (repo / "pipe" / "config.pbtxt").write_text(modelgen.ensemble_chain_config("pipe", ["first", "second"]))
    proc = _tune("--model-repository", str(repo), "--model", "pipe", "--out", str(out), "--concurrency", "2",
                 "--instances", "1,2", "--max-batch-sizes", "4,8", "--dynamic-batching", "on", "--no-preferred",
                 "--queue-delays-us", "0", "--isolation", "thread", "--warmup-s", "0.3", "--window-s", "0.3",
                 "--max-windows", "5", "--max-minutes", "2")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    rows = _measured(out)
    assert {r["model"] for r in rows} == {"first", "second"} and all(not r["error"] for r in rows)
    assert {r["max_batch_size"] for r in rows} <= {"4", "8"}  # never below the ensemble's 4
    summary = json.loads((out / "summary.json").read_text())
    assert set(summary["ensemble"]) == {"first", "second"}
    assert not (repo / "pipe" / "configs").exists()
    server = start_server(repo, flags=("--model-config-name", "tuned"))
    client = httpclient.InferenceServerClient(server.url)
    for name in ("first", "second"):
        served = client.get_model_config(name)
        assert served["instance_group"][0]["count"] == summary["ensemble"][name]["instances"]
        assert (out / f"tuned-{name}.pbtxt").read_text() == (repo / name / "configs" / "tuned.pbtxt").read_text()
    inp = httpclient.InferInput("IN", [1, 4], "FP32")
    inp.set_data_from_numpy(np.arange(4, dtype=np.float32).reshape(1, 4))
    assert client.infer("pipe", [inp]).as_numpy("OUT").tolist() == [[0.0, 1.0, 2.0, 3.0]]


def test_one_load_generator_serves_the_points_and_a_dead_one_is_started_again(
        tmp_path: Path, start_server: Callable[..., ServerProcess]) -> None:
    """The points of a run share one load generator process (``loadgen --serve``); one that died between
    points is replaced for the next, which measures as usual."""
    from triton_actor.tune import config_writer
    from triton_actor.tune.measure import Measurer, Timing
    from triton_actor.tune.target import Target

    server = start_server(_repo(tmp_path))
    target = Target.attach(server.url, "http", "batcher")
    base_json = target.config_json()
    base = config_writer.from_json(json.dumps(base_json), "batcher")
    measure = Measurer(target, base, base_json, Timing(warmup_s=0.2, window_s=0.2, max_windows=4))
    shipped = config_writer.candidate_of(base)
    try:
        first = measure(shipped, 1)
        assert measure._proc is not None
        pid = measure._proc.pid
        second = measure(shipped, 2)
        assert first.ok and second.ok and measure._proc.pid == pid, (first, second)
        os.kill(pid, signal.SIGKILL)
        measure._proc.wait()
        third = measure(shipped, 2)
        assert third.ok and measure._proc.pid != pid, third
    finally:
        measure.close()
        target.close()
