#!/usr/bin/env python3
"""The 256→1024→16 ONNX MLP through the server (perf_analyzer, HTTP, c=1) at batch 1 and 16, next to
the same model run in-process with onnxruntime (same thread settings), in one run; and the server's
resident memory with and without a TorchScript model loaded.

    scripts/install_bench_tools.sh && .venv/bin/python scripts/bench_mlp.py
"""

from __future__ import annotations

import os
import shutil
import signal
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "scripts"))

import modelgen  # noqa: E402
from bench_http import free_port, perf, rss_kb, start_ours, wait_ready  # noqa: E402

DIMS = (256, 1024, 16)


def in_process(model: Path, batch: int, seconds: float = 3.0, width: int = DIMS[0]) -> float:
    """infer/s (requests of ``batch`` rows of ``width`` inputs) of one in-process session with the server's
    settings (one instance: half the cores, no spinning)."""
    import numpy as np
    import onnxruntime as ort

    opts = ort.SessionOptions()
    opts.intra_op_num_threads = max(1, (os.cpu_count() or 1) // 2)
    opts.inter_op_num_threads = 1
    opts.add_session_config_entry("session.intra_op.allow_spinning", "0")
    sess = ort.InferenceSession(str(model), opts, providers=["CPUExecutionProvider"])
    x = np.random.default_rng(0).standard_normal((batch, width)).astype(np.float32)
    for _ in range(100):
        sess.run(None, {"INPUT0": x})
    n, start = 0, time.perf_counter()
    while time.perf_counter() - start < seconds:
        sess.run(None, {"INPUT0": x})
        n += 1
    return n / (time.perf_counter() - start)


def through_server(port: int, batch: int, out: Path) -> float:
    return perf(port, 1, 3000, out, model="mlp", extra=("-b", str(batch)))["rps"] / batch  # requests/s


def main() -> int:
    work = Path(tempfile.mkdtemp(prefix="bench_mlp_"))
    try:
        repo = work / "repo"
        modelgen.onnx_mlp(repo, "mlp", dims=DIMS, max_batch_size=16, dynamic_batching=False)
        port = free_port()
        proc = start_ours(repo, port)
        wait_ready(port, proc)
        rows = []
        for batch in (1, 16):
            served = through_server(port, batch, work / "pa.csv")
            local = in_process(repo / "mlp" / "1" / "model.onnx", batch)
            rows.append((batch, served, local))
            print(f"[bench_mlp] batch {batch}: server {served:.0f} req/s, in-process {local:.0f} req/s", flush=True)
        proc.send_signal(signal.SIGINT)
        proc.wait(30)
        memory = {}
        for label, with_torch in (("python examples only", False), ("python examples + TorchScript MLP", True)):
            r = work / label.replace(" ", "_")
            shutil.copytree(ROOT / "model_repository", r, ignore=shutil.ignore_patterns(
                "__pycache__", "mlp_onnx", "image_classifier_onnx", "mlp_torchscript"))
            if with_torch:
                modelgen.torchscript_mlp(r, "mlp_torchscript", dims=DIMS)
            port = free_port()
            p = start_ours(r, port)
            wait_ready(port, p)
            memory[label] = rss_kb(p.pid, False) / 1024
            p.send_signal(signal.SIGINT)
            p.wait(30)
        print("| batch | through the server (req/s) | in-process ORT (req/s) | ratio |\n|---|---|---|---|")
        for batch, served, local in rows:
            print(f"| {batch} | {served:.0f} | {local:.0f} | {served / local:.2f} |")
        for label, mb in memory.items():
            print(f"RSS, {label}: {mb:.0f} MB")
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
