"""Run tritonclient's own example clients, unchanged, against our server on Triton's example models, unchanged.

Usage::

    git -C <client mirror> archive HEAD src/python/examples | tar x -C /tmp/ce
    git -C <server mirror> archive HEAD docs/examples/model_repository | tar x -C /tmp/ce
    python scripts/triton_reference/client_examples.py --examples /tmp/ce/src/python/examples \\
        --models /tmp/ce/docs/examples/model_repository

The repositories are laid out as Triton's ``qa/L0_http`` and ``qa/L0_grpc`` lay them out: Triton's example
models (``simple``, ``simple_string``, ``simple_int8``, ``simple_identity``, ``simple_sequence``,
``simple_dyna_sequence``: ONNX and Python files as they are) plus ``simple_string_dyna_sequence``, made
from ``simple_dyna_sequence``'s config with the suite's own edits (a string CORRID). Each client runs
against a server started the way the suite starts it: ``--allow-client-shm=true``, and for the model
control clients a fresh server in EXPLICIT mode with nothing loaded (they count the repository's seven
models, load, reload with a config override, unload). The image clients run on our example repository's
``image_classifier_onnx`` (FP32 NCHW, labels); ``simple_grpc_custom_repeat.py`` and
``memory_growth_test.py`` on ``repeat_int32`` and ``custom_identity_int32``.

Three models of the suite use C++ test backends that ship with neither Triton's PyPI build nor ours
(``dyna_sequence``, ``repeat``, ``identity``): ``client_standins/`` has a Python ``model.py`` for each that
computes what the C++ backend computes, under the suite's config with ``backend: "python"``. Left out:
the CUDA shared-memory clients (a GPU), ``ensemble_image_client.py`` (a DALI preprocessing ensemble) and
``grpc_client.py`` (``densenet_onnx``'s weights are downloaded by Triton's ``fetch_models.sh``).

``image_client.py`` over HTTP imports ``attrdict`` (a client-side dependency of the example); when it is
not importable it is installed with pip into the scratch folder. Prints one line per run and a count;
exits 1 when any client fails (``--keep DIR`` keeps every client's output and the server logs).
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import re
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "scripts"))
from bench_http import free_port, wait_ready  # noqa: E402

STANDINS = Path(__file__).resolve().parent / "client_standins"

# (client file, which server, extra arguments); "http"/"grpc" in a file name or -i picks the port
TRITON_EXAMPLES = [
    ("simple_http_health_metadata.py", ()), ("simple_grpc_health_metadata.py", ()),
    ("simple_http_infer_client.py", ()), ("simple_grpc_infer_client.py", ()),
    ("simple_http_async_infer_client.py", ()), ("simple_grpc_async_infer_client.py", ()),
    ("simple_http_aio_infer_client.py", ()), ("simple_grpc_aio_infer_client.py", ()),
    ("simple_http_string_infer_client.py", ()), ("simple_grpc_string_infer_client.py", ()),
    ("simple_grpc_custom_args_client.py", ()), ("simple_grpc_keepalive_client.py", ()),
    ("grpc_explicit_int_content_client.py", ()), ("grpc_explicit_int8_content_client.py", ()),
    ("grpc_explicit_byte_content_client.py", ()),
    ("simple_http_shm_client.py", ()), ("simple_grpc_shm_client.py", ()),
    ("simple_http_shm_string_client.py", ()), ("simple_grpc_shm_string_client.py", ()),
    ("reuse_infer_objects_client.py", ("-i", "http")), ("reuse_infer_objects_client.py", ("-i", "grpc")),
    ("simple_http_sequence_sync_infer_client.py", ()), ("simple_http_sequence_sync_infer_client.py", ("-d",)),
    ("simple_grpc_sequence_sync_infer_client.py", ()), ("simple_grpc_sequence_sync_infer_client.py", ("-d",)),
    ("simple_grpc_sequence_stream_infer_client.py", ()), ("simple_grpc_sequence_stream_infer_client.py", ("-d",)),
    ("simple_grpc_aio_sequence_stream_infer_client.py", ()),
    ("simple_grpc_aio_sequence_stream_infer_client.py", ("-d",)),
]
IMAGE = "image_classifier_onnx"
# the model control clients count the suite's repository: seven models over HTTP, eight over gRPC (L0_grpc's
# also holds densenet_onnx for its image clients: ours has the image classifier in its place)
MODEL_CONTROL = [("simple_http_model_control.py", ()), ("simple_grpc_model_control.py", (IMAGE,))]
OTHER_EXAMPLES = [
    ("image_client.py", ("-m", IMAGE, "-c", "3", "-s", "INCEPTION", "-i", "http", "{image}")),
    ("image_client.py", ("-m", IMAGE, "-c", "2", "-s", "VGG", "-i", "http", "-a", "-b", "2", "{image}")),
    ("image_client.py", ("-m", IMAGE, "-c", "3", "-s", "NONE", "-i", "grpc", "{image}")),
    ("image_client.py", ("-m", IMAGE, "-c", "2", "-s", "INCEPTION", "-i", "grpc", "--streaming", "-b", "2",
                         "{image}")),
    ("grpc_image_client.py", ("-m", IMAGE, "-c", "2", "-s", "INCEPTION", "{image}")),
    ("simple_grpc_custom_repeat.py", ()),
]
# no -u: it dials localhost:8000 and :8001, so its server takes those ports (when they are free)
MEMORY_GROWTH = [("memory_growth_test.py", ("-i", "http", "-r", "2000")),
                 ("memory_growth_test.py", ("-i", "grpc", "-r", "2000"))]


def triton_repository(models: Path, out: Path) -> None:
    """Triton's example models as L0_http has them: seven, with simple_string_dyna_sequence."""
    for name in ("simple", "simple_string", "simple_int8", "simple_identity", "simple_sequence",
                 "simple_dyna_sequence"):
        shutil.copytree(models / name, out / name)
    dyna = out / "simple_string_dyna_sequence"
    dyna.mkdir()
    config = (models / "simple_dyna_sequence" / "config.pbtxt").read_text()
    config = config.replace("simple_dyna_sequence", "simple_string_dyna_sequence")
    config = re.sub(r"(?m)^platform: .*$", 'backend: "python"', config)  # the suite: backend "dyna_sequence"
    # the suite's sed: the line after CONTROL_SEQUENCE_CORRID gets data_type TYPE_STRING
    config = re.sub(r"(CONTROL_SEQUENCE_CORRID\s*\n\s*)data_type:.*", r"\1data_type: TYPE_STRING", config)
    (dyna / "config.pbtxt").write_text(config)
    shutil.copytree(STANDINS / "simple_string_dyna_sequence" / "1", dyna / "1")


def other_repository(out: Path) -> None:
    shutil.copytree(ROOT / "model_repository" / IMAGE, out / IMAGE)
    for name in ("repeat_int32", "custom_identity_int32"):
        shutil.copytree(STANDINS / name, out / name)


# as the suites start the server for these clients (l0_http_grpc.py gives each suite's own flags instead)
SUITE_FLAGS = ("--allow-metrics=false", "--allow-client-shm=true")


class Server:
    """This checkout's server on ``repo`` with ``flags`` (free ports unless ``ports``), ready when made."""

    def __init__(self, repo: Path, log: Path, *flags: str, ports: tuple[int, int] | None = None) -> None:
        self.http, self.grpc = ports or (free_port(), free_port())
        args = [sys.executable, "-m", "triton_actor", f"--model-repository={repo}", f"--http-port={self.http}",
                f"--grpc-port={self.grpc}", *flags]
        self.proc = subprocess.Popen(args, cwd=ROOT, stdout=log.open("w"), stderr=subprocess.STDOUT)
        wait_ready(self.http, self.proc)

    def url(self, client: str, args: tuple[str, ...]) -> str:
        grpc = "grpc" in client or ("-i" in args and args[args.index("-i") + 1] == "grpc")
        return f"localhost:{self.grpc if grpc else self.http}"

    def stop(self) -> None:
        self.proc.terminate()
        try:
            self.proc.wait(30)
        except subprocess.TimeoutExpired:
            self.proc.kill()


def run_client(examples: Path, server: Server, client: str, args: tuple[str, ...], env: dict[str, str],
               out: Path) -> bool:
    start = time.monotonic()
    url = () if client == "memory_growth_test.py" else ("-u", server.url(client, args))
    proc = subprocess.run([sys.executable, str(examples / client), *args, *url],
                          cwd=examples, env=env, capture_output=True, text=True, timeout=300)
    took = time.monotonic() - start
    name = f"{client} {' '.join(a for a in args if not a.startswith('/'))}".strip()
    (out / (re.sub(r"[^\w.-]+", "_", name) + ".out")).write_text(proc.stdout + proc.stderr)
    last = (proc.stdout.strip().splitlines() or proc.stderr.strip().splitlines() or [""])[-1][:70]
    print(f"{'PASS' if proc.returncode == 0 else 'FAIL'}  {took:5.1f} s  {name:<75} {last}", flush=True)
    return proc.returncode == 0


def port_free(port: int) -> bool:
    with socket.socket() as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as the server binds: TIME_WAIT is no owner
        try:
            s.bind(("0.0.0.0", port))
        except OSError:
            return False
    return True


def client_env(work: Path) -> dict[str, str]:
    env = dict(os.environ)
    if importlib.util.find_spec("attrdict") is None:
        deps = work / "client-deps"
        subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--target", str(deps), "attrdict"], check=True)
        env["PYTHONPATH"] = str(deps)
    return env


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--examples", type=Path, required=True, help="tritonclient's src/python/examples")
    ap.add_argument("--models", type=Path, required=True, help="Triton's docs/examples/model_repository")
    ap.add_argument("--keep", type=Path, help="copy the clients' output and the server logs here")
    args = ap.parse_args()
    work = Path(tempfile.mkdtemp(prefix="client-examples-"))
    out = work / "out"
    out.mkdir()
    triton_repo, other_repo = work / "triton_models", work / "other_models"
    triton_repo.mkdir()
    other_repo.mkdir()
    triton_repository(args.models, triton_repo)
    other_repository(other_repo)
    images = work / "images"
    images.mkdir()
    import numpy as np
    from PIL import Image

    Image.fromarray((np.random.default_rng(0).random((48, 64, 3)) * 255).astype("uint8")).save(images / "noise.png")
    env = client_env(work)
    results: list[bool] = []
    try:
        server = Server(triton_repo, out / "server-examples.log", *SUITE_FLAGS)
        try:
            for client, extra in TRITON_EXAMPLES:
                results.append(run_client(args.examples, server, client, extra, env, out))
        finally:
            server.stop()
        for client, more in MODEL_CONTROL:  # as the suites run them: a fresh server in EXPLICIT mode, nothing loaded
            for name in more:
                shutil.copytree(ROOT / "model_repository" / name, triton_repo / name)
            server = Server(triton_repo, out / f"server-{client}.log", *SUITE_FLAGS, "--model-control-mode=explicit")
            try:
                results.append(run_client(args.examples, server, client, (), env, out))
                # Triton's suites also look for the refused override's reason in the server's log
                logged = "Invalid config override" in (out / f"server-{client}.log").read_text()
                print(f"{'PASS' if logged else 'FAIL'}  the log of {client}'s server names 'Invalid config override'")
                results.append(logged)
            finally:
                server.stop()
            for name in more:
                shutil.rmtree(triton_repo / name)
        server = Server(other_repo, out / "server-other.log", *SUITE_FLAGS)
        try:
            for client, extra in OTHER_EXAMPLES:
                extra = tuple(str(images / "noise.png") if a == "{image}" else a for a in extra)
                results.append(run_client(args.examples, server, client, extra, env, out))
        finally:
            server.stop()
        if all(port_free(p) for p in (8000, 8001)):
            server = Server(other_repo, out / "server-8000.log", *SUITE_FLAGS, ports=(8000, 8001))
            try:
                for client, extra in MEMORY_GROWTH:
                    results.append(run_client(args.examples, server, client, extra, env, out))
            finally:
                server.stop()
        else:
            print("not run: memory_growth_test.py (it dials localhost:8000 and :8001, which are taken here)")
    finally:
        if args.keep is not None:
            shutil.copytree(out, args.keep, dirs_exist_ok=True)
        shutil.rmtree(work, ignore_errors=True)
    print(f"{sum(results)} of {len(results)} client runs passed")
    return 0 if all(results) else 1


if __name__ == "__main__":
    sys.exit(main())
