"""Run the CPU-only part of Triton's ``qa/L0_model_config`` on our server or on real Triton 2.51.

Usage::

    git -C <server mirror> archive HEAD qa/L0_model_config qa/python_models/auto_complete | tar x -C /tmp/l0
    python scripts/triton_reference/l0_model_config.py --qa /tmp/l0/qa --server ours     # or: triton

The cases are laid out as the suite's ``test.sh`` lays them out (``autofill_noplatform/{common,custom,
ensemble,python}/*`` must fail to load with the text of their ``expected`` file in an ``E`` log line;
``autofill_noplatform_success/{ensemble,python}/*`` must load and ``/config`` must equal an ``expected``
file over HTTP or gRPC, as ``compare_status.py`` checks), all with ``--strict-model-config=false``.
The ``identity`` and ``repeat`` backends of the composing models do not exist in the PyPI build of
Triton nor in ours: those models become Python models with the same config (``repeat`` stays
decoupled), which changes nothing the checks look at. Cases that need TensorRT, OpenVINO, ONNX or
TorchScript model files, or the ``identity`` backend itself (``autofill_noplatform_success/custom``),
are left out.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

TRITON = Path(os.environ.get("BENCH_TOOLS_DIR", Path.home() / ".cache/triton_actor_bench")) / "tritonserver"
ROOT = Path(__file__).resolve().parents[2]
FAIL_GROUPS = ("autofill_noplatform/common", "autofill_noplatform/custom", "autofill_noplatform/ensemble",
               "autofill_noplatform/python")
OK_GROUPS = ("autofill_noplatform_success/ensemble", "autofill_noplatform_success/python")
STUB_MODEL = "class TritonPythonModel:\n    def execute(self, requests):\n        return []\n"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def prepare(qa: Path, case: Path, dest: Path, should_load: bool) -> Path:
    """Copy one case into ``dest/models`` as test.sh does; return the folder holding its ``expected*``."""
    models = dest / "models"
    if (case / "config.pbtxt").is_file() or case.name == "no_config":
        models.mkdir(parents=True)
        shutil.copytree(case, models / case.name)
        expected_dir = models / case.name
    else:
        shutil.copytree(case, models)
        expected_dir = models / case.name if should_load else models
    for config in models.glob("*/config.pbtxt"):
        model_dir = config.parent
        text = config.read_text()
        if re.search(r'backend:\s*"(identity|repeat)"', text):
            config.write_text(re.sub(r'backend:\s*"(identity|repeat)"', 'backend: "python"', text))
            (model_dir / "1").mkdir(exist_ok=True)
            (model_dir / "1" / "model.py").write_text(STUB_MODEL)
        elif case.parent.name == "python":
            (model_dir / "1").mkdir(exist_ok=True)
            src = model_dir / "model.py"
            if not src.is_file():
                src = qa / "python_models" / "auto_complete" / "model.py"
            shutil.copy(src, model_dir / "1" / "model.py")
        elif case.name != "no_version":
            (model_dir / "1").mkdir(exist_ok=True)
    return expected_dir


def start(server: str, models: Path, log: Path) -> tuple[subprocess.Popen, int, int]:
    http, grpc = free_port(), free_port()
    common = [f"--model-repository={models}", "--strict-model-config=false", "--http-address=127.0.0.1",
              f"--http-port={http}", "--grpc-address=127.0.0.1", f"--grpc-port={grpc}", f"--metrics-port={free_port()}"]
    if server == "triton":
        args = [str(TRITON), *common, "--allow-metrics=false"]
    else:
        args = [sys.executable, "-m", "triton_actor", *common]
    out = log.open("w")
    proc = subprocess.Popen(args, stdout=out, stderr=subprocess.STDOUT, cwd=ROOT)
    return proc, http, grpc


def wait(proc: subprocess.Popen, http: int, timeout: float = 90) -> bool:
    """True once the server answers ready, False once it exited (a failed load ends it)."""
    import urllib.request

    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            return False
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{http}/v2/health/ready", timeout=1) as r:
                if r.status == 200:
                    return True
        except OSError:
            pass
        time.sleep(0.2)
    return False


def config_matches(expected_dir: Path, model: str, http: int, grpc: int) -> str:
    """``compare_status.py``: the /config of either protocol equals one ``expected*`` file."""
    import tritonclient.grpc as grpcclient
    import tritonclient.grpc.model_config_pb2 as mc
    import tritonclient.http as httpclient
    from google.protobuf import json_format, text_format

    got_http = httpclient.InferenceServerClient(f"127.0.0.1:{http}").get_model_config(model)
    got_grpc = grpcclient.InferenceServerClient(f"127.0.0.1:{grpc}").get_model_config(model).config
    for efile in sorted(expected_dir.glob("expected*")):
        # the suite expects KIND_GPU on GPU 0 where the config leaves the kind open; this is a CPU host
        text = re.sub(r"\n\s*gpus: 0", "", efile.read_text().replace("KIND_GPU", "KIND_CPU"))
        want = text_format.Parse(text, mc.ModelConfig())
        if json.loads(json_format.MessageToJson(want, preserving_proto_field_name=True)) == got_http:
            return ""
        if want == got_grpc:
            return ""
    return "config differs:\n" + json.dumps(got_http, indent=1)


def run_case(qa: Path, case: Path, server: str, should_load: bool) -> str:
    """'' when the case passes, else why not."""
    with tempfile.TemporaryDirectory() as tmp:
        dest = Path(tmp)
        expected_dir = prepare(qa, case, dest, should_load)
        log = dest / "server.log"
        proc, http, grpc = start(server, dest / "models", log)
        try:
            ready = wait(proc, http)
            if should_load:
                return config_matches(expected_dir, case.name, http, grpc) if ready else "did not start"
            if ready:
                return "unexpected success"
            proc.wait(30)
            text = log.read_text(errors="replace")
            for efile in sorted(expected_dir.glob("expected*")):
                want = efile.read_text().strip().replace("\\[", "[").replace("\\]", "]")  # grep's escapes
                if any(re.match(r"E\d{4}", line) and want in line for line in text.splitlines()):
                    return ""
            errors = [line for line in text.splitlines() if re.match(r"E\d{4}", line)]
            return "expected text not found; errors:\n  " + "\n  ".join(errors[:3])
        finally:
            if proc.poll() is None:
                proc.terminate()
                proc.wait(30)


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--qa", type=Path, required=True, help="the qa folder (holding L0_model_config)")
    parser.add_argument("--server", choices=("ours", "triton"), default="ours")
    parser.add_argument("--only", default="", help="run the cases whose path contains this")
    args = parser.parse_args()
    base = args.qa / "L0_model_config"
    cases = [(c, False) for g in FAIL_GROUPS for c in sorted((base / g).iterdir())]
    cases += [(c, True) for g in OK_GROUPS for c in sorted((base / g).iterdir())]
    passed = 0
    selected = [(c, ok) for c, ok in cases if args.only in str(c)]
    for case, should_load in selected:
        why = run_case(args.qa, case, args.server, should_load)
        passed += not why
        print(("PASS " if not why else "FAIL ") + str(case.relative_to(base)) + ("" if not why else "\n  " + why),
              flush=True)
    print(f"{args.server}: {passed} of {len(selected)} pass")
    return 0 if passed == len(selected) else 1


if __name__ == "__main__":
    sys.exit(main())
