"""Run the client-side Python tests of Triton's ``qa/L0_http`` and ``qa/L0_grpc`` unchanged on our server.

Usage::

    git -C <server mirror> archive HEAD qa/L0_http qa/L0_grpc qa/common qa/python_models/string_identity \\
        docs/examples/model_repository | tar x -C /tmp/l0
    python /tmp/l0/qa/common/gen_qa_identity_models.py --onnx --models_dir /tmp/l0/identity   # Triton's own
    python scripts/triton_reference/l0_http_grpc.py --root /tmp/l0 --identity /tmp/l0/identity

Each test file runs from its suite's folder, against a server started with the flags and the repository
its ``test.sh`` gives it (the example models as ``client_examples.py`` lays them out, and
``scripts/make_examples.py``'s image classifier for L0_grpc's ``densenet_onnx``; ``onnx_zero_*``
from Triton's own identity-model generator; ``string_identity`` from its ``python_models``). The suites'
clients dial localhost:8000 and :8001, so the servers take those ports: they must be free. Not run: the
tests that need the C++ client, nginx, basic auth, client plugins, CUDA or the generate endpoint's
``python_models/generate_models``. ``http_request_many_chunks.py`` needs ``psutil`` in the client's
environment (``pip install psutil``, as the suite does).
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]
sys.path.insert(0, str(ROOT / "scripts"))
sys.path.insert(0, str(HERE))
from client_examples import IMAGE, Server, port_free, triton_repository  # noqa: E402

RESTRICTED = ("--http-restricted-api=model-repository:admin-key=admin-value",
              "--http-restricted-api=inference,metadata:infer-key=infer-value")
SIZE_TESTS = ("test_default_limit_raw_binary", "test_default_limit_json", "test_large_string_in_json",
              "test_default_limit_compressed", "test_json_dtype_size_expansion_exceeds_limit_error")
LARGE_SIZE_TESTS = ("test_large_input_raw_binary", "test_large_input_json", "test_large_input_compressed")


def copy_renamed(src: Path, dst: Path, old: str, new: str, extra: str = "") -> None:
    """``src`` as model ``new`` (the suites' ``cp -r`` and ``sed``), ``extra`` appended to its config."""
    shutil.copytree(src, dst)
    config = dst / "config.pbtxt"
    config.write_text(config.read_text().replace(old, new) + extra)


def repositories(root: Path, identity: Path, work: Path) -> dict[str, Path]:
    """Each repository as its test.sh lays it out."""
    examples = root / "docs/examples/model_repository"
    repos = {name: work / name for name in ("models", "grpc_models", "grpc_test_models", "http_test_models",
                                            "size_models")}
    for repo in repos.values():
        repo.mkdir()
    triton_repository(examples, repos["models"])
    # L0_grpc's own models folder has an eighth model, densenet_onnx for its image clients (its clients count
    # eight): the example repository's image classifier stands in for it, as in client_examples.py
    triton_repository(examples, repos["grpc_models"])
    shutil.copytree(ROOT / "model_repository" / IMAGE, repos["grpc_models"] / IMAGE)
    shutil.copytree(repos["models"] / "simple", repos["grpc_test_models"] / "simple")
    string_identity = repos["grpc_test_models"] / "string_identity"
    (string_identity / "1").mkdir(parents=True)
    shutil.copy(root / "qa/python_models/string_identity/model.py", string_identity / "1")
    config = (root / "qa/python_models/string_identity/config.pbtxt").read_text()
    (string_identity / "config.pbtxt").write_text(config.replace("dims: [ 1 ]", "dims: [ -1 ]"))
    http = repos["http_test_models"]
    for name in ("onnx_zero_1_float32", "onnx_zero_1_object", "onnx_zero_1_float16", "onnx_zero_3_float32"):
        shutil.copytree(identity / name, http / name)
    one = http / "onnx_zero_1_object_1_element"  # the suite's sed "0,/-1/{s/-1/1/}": the first -1 only
    shutil.copytree(http / "onnx_zero_1_object", one)
    text = (one / "config.pbtxt").read_text().replace("onnx_zero_1_object", "onnx_zero_1_object_1_element")
    (one / "config.pbtxt").write_text(text.replace("-1", "1", 1))
    copy_renamed(http / "onnx_zero_1_float32", http / "onnx_zero_1_float32_queue", "onnx_zero_1_float32",
                 "onnx_zero_1_float32_queue", "dynamic_batching { \n    max_queue_delay_microseconds: 1000000\n"
                 "    preferred_batch_size: [ 8 ]\n    default_queue_policy {\n        max_queue_size: 1\n    }\n}\n")
    shutil.copytree(examples / "simple_identity", http / "simple_identity")
    int64 = http / "simple_identity_int64"
    shutil.copytree(examples / "simple_identity", int64)
    text = (int64 / "config.pbtxt").read_text().replace("TYPE_STRING", "TYPE_INT64")
    (int64 / "config.pbtxt").write_text(text.replace("simple_identity", "simple_identity_int64"))
    shutil.copytree(identity / "onnx_zero_1_float32", repos["size_models"] / "onnx_zero_1_float32")
    shutil.copytree(examples / "simple_identity", repos["size_models"] / "simple_identity")
    return repos


def plan(repos: dict[str, Path]) -> list[tuple[Path, tuple[str, ...], list[tuple[str, tuple[str, ...]]]]]:
    """(repository, server flags, [(suite/test file, its arguments)]) in the order the suites run them."""
    return [
        (repos["models"], ("--allow-client-shm=true",), [
            ("L0_http/python_http_aio_test.py", ()), ("L0_http/http_request_many_chunks.py", ())]),
        (repos["grpc_models"], ("--allow-client-shm=true",), [("L0_grpc/python_grpc_aio_test.py", ())]),
        (repos["grpc_test_models"], (), [("L0_grpc/python_unit_test.py", ("GrpcTest",))]),
        (repos["models"], RESTRICTED, [("L0_http/http_restricted_api_test.py", ("RestrictedAPITest",))]),
        (repos["http_test_models"], ("--model-control-mode=explicit", "--load-model=*"),
         [("L0_http/http_test.py", ())]),
        (repos["size_models"], (), [("L0_http/http_input_size_limit_test.py", (f"InferSizeLimitTest.{t}",))
                                    for t in SIZE_TESTS]),
        (repos["size_models"], (f"--http-max-input-size={2**27}",),
         [("L0_http/http_input_size_limit_test.py", (f"InferSizeLimitTest.{t}",)) for t in LARGE_SIZE_TESTS]),
    ]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--root", type=Path, required=True, help="where qa/ and docs/ of Triton's server were unpacked")
    ap.add_argument("--identity", type=Path, required=True, help="gen_qa_identity_models.py --onnx's output")
    ap.add_argument("--keep", type=Path, help="copy every test's output and the server logs here")
    args = ap.parse_args()
    if not (port_free(8000) and port_free(8001)):
        raise SystemExit("the suites' clients dial localhost:8000 and :8001: free those ports first")
    work = Path(tempfile.mkdtemp(prefix="l0-http-grpc-"))
    out = work / "out"
    out.mkdir()
    failed = 0
    try:
        repos = repositories(args.root, args.identity, work)
        for n, (repo, flags, tests) in enumerate(plan(repos)):
            server = Server(repo, out / f"server-{n}.log", *flags, ports=(8000, 8001))  # the ports they dial
            try:
                for test, test_args in tests:
                    suite, name = test.split("/")
                    env = dict(os.environ, SERVER_PID=str(server.proc.pid))
                    run = subprocess.run([sys.executable, name, *test_args], cwd=args.root / "qa" / suite, env=env,
                                         capture_output=True, text=True, timeout=900)
                    text = run.stdout + run.stderr
                    (out / re.sub(r"[^\w.-]+", "_", f"{test} {' '.join(test_args)}")).write_text(text)
                    ran = re.findall(r"Ran (\d+) tests?", text)
                    bad = re.findall(r"^(?:FAIL|ERROR): (\w+)", text, re.M)
                    failed += run.returncode != 0
                    print(f"{'PASS' if run.returncode == 0 else 'FAIL'}  {test} {' '.join(test_args)}: "
                          f"{ran[-1] if ran else '?'} run" + (f", failed: {', '.join(sorted(set(bad)))}" if bad else ""),
                          flush=True)
            finally:
                server.stop()
    finally:
        if args.keep is not None:
            shutil.copytree(out, args.keep, dirs_exist_ok=True)
        shutil.rmtree(work, ignore_errors=True)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
