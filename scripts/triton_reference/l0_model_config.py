"""Run the CPU-only part of Triton's ``qa/L0_model_config`` on our server or on real Triton 2.51.

Usage::

    git -C <server mirror> archive HEAD qa/L0_model_config qa/python_models/auto_complete | tar x -C /tmp/l0
    python scripts/triton_reference/l0_model_config.py --qa /tmp/l0/qa --server ours     # or: triton

The cases are laid out as the suite's ``test.sh`` lays them out (``autofill_noplatform/{common,custom,
ensemble,python}/*`` must fail to load with the text of their ``expected`` file in an ``E`` log line;
``autofill_noplatform_success/{ensemble,python}/*`` must load and ``/config`` must equal an ``expected``
file over HTTP or gRPC, as ``compare_status.py`` checks), all with ``--strict-model-config=false``.
``--load-api OUT.json`` instead starts each refused case's repository in EXPLICIT mode with nothing
loaded and asks the load API for the case's model over HTTP and gRPC, from the files and again with
its config given as an override; it writes what each answer was (HTTP status and ``error``, gRPC code
and details) so that two runs (``--server ours`` / ``triton``) can be compared with ``--compare``.
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


def start(server: str, models: Path, log: Path, extra: tuple[str, ...] = ()) -> tuple[subprocess.Popen, int, int]:
    http, grpc = free_port(), free_port()
    common = [*extra, f"--model-repository={models}", "--strict-model-config=false", "--http-address=127.0.0.1",
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


def _http_load(http: int, model: str, config: str | None) -> dict:
    import urllib.error
    import urllib.request

    body = json.dumps({"parameters": {"config": config}} if config is not None else {}).encode()
    req = urllib.request.Request(f"http://127.0.0.1:{http}/v2/repository/models/{model}/load", data=body,
                                 method="POST")
    try:
        with urllib.request.urlopen(req, timeout=120) as r:
            return {"status": r.status}
    except urllib.error.HTTPError as e:
        text = e.read().decode(errors="replace")
        try:
            text = json.loads(text)["error"]
        except (ValueError, KeyError, TypeError):
            pass
        return {"status": e.code, "error": text}


def _grpc_load(grpc: int, model: str, config: str | None) -> dict:
    import tritonclient.grpc as grpcclient
    from tritonclient.utils import InferenceServerException

    try:
        grpcclient.InferenceServerClient(f"127.0.0.1:{grpc}").load_model(model, config=config)
        return {"code": "OK"}
    except InferenceServerException as e:
        return {"code": e.status(), "error": e.message()}


def _override(models: Path, model: str) -> str | None:
    """The model's config file as the load API's JSON ``config`` (None where protobuf cannot read it)."""
    import tritonclient.grpc.model_config_pb2 as mc
    from google.protobuf import json_format, text_format

    path = models / model / "config.pbtxt"
    if not path.is_file():
        return None
    try:
        cfg = text_format.Parse(path.read_text(), mc.ModelConfig())
    except text_format.ParseError:
        return None
    return json_format.MessageToJson(cfg, preserving_proto_field_name=True)


def load_api_case(qa: Path, case: Path, server: str) -> dict:
    """The load API's answers for one refused case: from its files, then with its config as an override."""
    out: dict = {}
    with tempfile.TemporaryDirectory() as tmp:
        dest = Path(tmp)
        prepare(qa, case, dest, False)
        models = dest / "models"
        proc, http, grpc = start(server, models, dest / "server.log", ("--model-control-mode=explicit",))
        try:
            if not wait(proc, http):
                return {"error": "did not start"}
            config = _override(models, case.name)
            for label, cfg in (("files", None), ("override", config)):
                if label == "override" and cfg is None:
                    continue
                out[label] = {"http": _http_load(http, case.name, cfg), "grpc": _grpc_load(grpc, case.name, cfg)}
        finally:
            proc.terminate()
            proc.wait(30)
    return out


def _normalized(answer: dict) -> dict:
    """One answer with what cannot match across servers taken out: temporary folders, the frames of
    Triton's own ``triton_python_backend_utils.py`` in a traceback, and the reason we keep after
    Triton's poll text (docs/compatibility.md)."""
    text = answer.get("error")
    if text is None:
        return answer
    text = re.sub(r"/tmp/[^/]+/models/", "<tmp>/models/", text)
    text = re.sub(r"\n  \S*triton_python_backend_utils\.py\(\d+\): \w+", "", text)
    text = re.sub(r"(failed to poll from model repository): .*", r"\1", text, flags=re.S)
    return {**answer, "error": text}


def compare(a: Path, b: Path) -> int:
    """Print the cases whose load API answers differ between two ``--load-api`` files (each case's first
    answer over HTTP and gRPC, from the files and with the override; a second load of a model Triton
    refused may answer otherwise, as gRPC comes second: its ``no version is available``)."""
    left, right = json.loads(a.read_text()), json.loads(b.read_text())
    same = 0
    for case in left:
        l_case, r_case = ({k: {p: _normalized(v) for p, v in d.items()} if isinstance(d, dict) else d
                           for k, d in side.get(case, {}).items()} for side in (left, right))
        if l_case == r_case:
            same += 1
            continue
        print(f"DIFF {case}\n  {a.name}: {json.dumps(l_case)}\n  {b.name}: {json.dumps(r_case)}")
    print(f"{same} of {len(left)} cases answer the same")
    return 0 if same == len(left) else 1


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--qa", type=Path, help="the qa folder (holding L0_model_config)")
    parser.add_argument("--server", choices=("ours", "triton"), default="ours")
    parser.add_argument("--only", default="", help="run the cases whose path contains this")
    parser.add_argument("--load-api", type=Path, help="write the load API's answers for the refused cases here")
    parser.add_argument("--compare", type=Path, nargs=2, help="compare two --load-api files")
    args = parser.parse_args()
    if args.compare:
        return compare(*args.compare)
    base = args.qa / "L0_model_config"
    cases = [(c, False) for g in FAIL_GROUPS for c in sorted((base / g).iterdir())]
    cases += [(c, True) for g in OK_GROUPS for c in sorted((base / g).iterdir())]
    passed = 0
    selected = [(c, ok) for c, ok in cases if args.only in str(c)]
    if args.load_api:
        answers = {}
        for case, should_load in selected:
            if not should_load:
                answers[str(case.relative_to(base))] = load_api_case(args.qa, case, args.server)
                print(case.relative_to(base), json.dumps(answers[str(case.relative_to(base))]), flush=True)
        args.load_api.write_text(json.dumps(answers, indent=1, sort_keys=True))
        return 0
    for case, should_load in selected:
        why = run_case(args.qa, case, args.server, should_load)
        passed += not why
        print(("PASS " if not why else "FAIL ") + str(case.relative_to(base)) + ("" if not why else "\n  " + why),
              flush=True)
    print(f"{args.server}: {passed} of {len(selected)} pass")
    return 0 if passed == len(selected) else 1


if __name__ == "__main__":
    sys.exit(main())
