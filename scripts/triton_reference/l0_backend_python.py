"""Run subtests of Triton's ``qa/L0_backend_python`` unchanged on our server or on real Triton 2.51.

Usage::

    git -C <server mirror> archive HEAD qa/L0_backend_python qa/python_models qa/common | tar x -C /tmp/l0bp
    python scripts/triton_reference/l0_backend_python.py --qa /tmp/l0bp/qa --server ours [--isolated] \\
        response_sender response_sender_complete_final async_execute argument_validation

Each subtest's repository is laid out as its ``test.sh`` lays it out, the server gets the flags it
gives (``--log-verbose=1``; ``--isolated`` adds ``--backend-config=python,isolation=process`` on ours),
and the suite's own client file runs under pytest from the folder ``test.sh`` runs it in. The clients
dial the fixed ports 8000/8001 (as the suite does), so each subtest runs in a network namespace of its
own (``unshare -rn``): other servers on this machine are neither reached nor disturbed.
``argument_validation`` runs with ``TEST_JETSON=1``, which skips the shared-memory leak probe (it
needs Triton's compiled ``triton_shm_monitor``); the model's own unittest decides the result.
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

TRITON = Path(os.environ.get("BENCH_TOOLS_DIR", Path.home() / ".cache/triton_actor_bench")) / "tritonserver"
ROOT = Path(__file__).resolve().parents[2]
SUBTESTS = ("response_sender", "response_sender_complete_final", "async_execute", "argument_validation")


def _copy_model(pm: Path, src: str, models: Path, name: str) -> None:
    (models / name / "1").mkdir(parents=True)
    shutil.copy(pm / src / "model.py", models / name / "1")
    shutil.copy(pm / src / "config.pbtxt", models / name)


def layout(qa: Path, subtest: str, models: Path) -> tuple[Path, Path, dict[str, str]]:
    """The repository as the subtest's test.sh builds it; returns (client file, its folder, environment)."""
    pm, suite = qa / "python_models", qa / "L0_backend_python"
    env: dict[str, str] = {}
    if subtest == "response_sender":
        for variant in ("", "_decoupled", "_async", "_decoupled_async", "_batching", "_decoupled_batching",
                        "_async_batching", "_decoupled_async_batching"):
            m = models / f"response_sender{variant}"
            (m / "1").mkdir(parents=True)
            shutil.copy(pm / "response_sender" / "model_common.py", m / "1")
            src = "model_async.py" if "async" in variant else "model.py"
            shutil.copy(pm / "response_sender" / src, m / "1" / "model.py")
            config = (pm / "response_sender" / "config.pbtxt").read_text()
            if "decoupled" in variant:
                config += "\nmodel_transaction_policy { decoupled: True }\n"
            if "batching" in variant:
                config += "\ndynamic_batching { max_queue_delay_microseconds: 500000 }\n"
            (m / "config.pbtxt").write_text(config)
        client = suite / "response_sender" / "response_sender_test.py"
    elif subtest == "response_sender_complete_final":
        _copy_model(pm, subtest, models, subtest)
        client = suite / "response_sender" / "response_sender_complete_final_test.py"
    elif subtest == "async_execute":
        _copy_model(pm, "async_execute_decouple", models, "async_execute_decouple")
        _copy_model(pm, "async_execute_decouple_bls", models, "async_execute_decouple_bls")
        client = suite / "async_execute" / "concurrency_test.py"
    elif subtest == "argument_validation":
        shutil.copytree(suite / "argument_validation" / "models" / "argument_validation", models / "argument_validation")
        env = {"MODEL_NAME": "argument_validation", "TEST_JETSON": "1"}
        return suite / "test_infer_shm_leak.py", suite / "argument_validation", env
    else:
        raise SystemExit(f"unknown subtest {subtest}")
    return client, client.parent, env


def run(qa: Path, subtest: str, server: str, isolated: bool, keep: Path | None) -> str:
    """Lay out, start the server, run the client; return pytest's summary line."""
    work = Path(tempfile.mkdtemp(prefix=f"l0bp-{server}-{subtest}-"))
    models = work / "models"
    models.mkdir()
    client, cwd, env = layout(qa, subtest, models)
    log = (work / "server.log").open("w")
    if server == "triton":
        args = [str(TRITON), f"--model-repository={models}", "--log-verbose=1"]
    else:
        args = [sys.executable, "-m", "triton_actor", f"--model-repository={models}", "--log-verbose=1"]
        if isolated:
            args.append("--backend-config=python,isolation=process")
    proc = subprocess.Popen(args, stdout=log, stderr=subprocess.STDOUT, cwd=ROOT)
    try:
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline and proc.poll() is None:
            try:
                with urllib.request.urlopen("http://localhost:8000/v2/health/ready", timeout=1) as r:
                    if r.status == 200:
                        break
            except OSError:
                time.sleep(0.3)
        test = subprocess.run(
            [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-o", "addopts=", "-rA", str(client)],
            cwd=cwd, env={**os.environ, **env, "SERVER_LOG": str(work / "server.log")},
            capture_output=True, text=True, timeout=600)
        (work / "pytest.out").write_text(test.stdout + test.stderr)
    finally:
        proc.terminate()
        try:
            proc.wait(60)
        except subprocess.TimeoutExpired:
            proc.kill()
        for cache in models.glob("*/1/__pycache__"):  # Triton's stub writes them into the repository
            shutil.rmtree(cache, ignore_errors=True)
    summary = [line for line in (work / "pytest.out").read_text().splitlines()
               if re.search(r"\d+ (passed|failed|error)", line)]
    if keep is not None:
        shutil.copytree(work, keep / work.name)
    shutil.rmtree(work, ignore_errors=True)
    return summary[-1] if summary else "no result"


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--qa", type=Path, required=True, help="the qa folder (holding L0_backend_python)")
    parser.add_argument("--server", choices=("ours", "triton"), default="ours")
    parser.add_argument("--isolated", action="store_true", help="ours: every Python model in its own process")
    parser.add_argument("--keep", type=Path, help="copy each subtest's folder (logs, pytest output) here")
    parser.add_argument("subtests", nargs="*", default=list(SUBTESTS))
    args = parser.parse_args()
    if os.environ.get("L0BP_NETNS") != "1":  # the suite's fixed ports: a private network namespace
        env = {**os.environ, "L0BP_NETNS": "1"}
        cmd = ["unshare", "-rn", "sh", "-c", 'ip link set lo up && exec "$@"', "sh", sys.executable, *sys.argv]
        return subprocess.run(cmd, env=env).returncode
    failed = 0
    for subtest in args.subtests:
        summary = run(args.qa.resolve(), subtest, args.server, args.isolated, args.keep)
        failed += "failed" in summary or "passed" not in summary
        label = args.server + (" isolated" if args.isolated else "")
        print(f"{label} {subtest}: {summary}", flush=True)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
