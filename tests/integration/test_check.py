"""``triton-actor check``: every model of a repository loaded in a process of its own, one line each.

The repository is built per test: good ONNX and Python models, and one of each way a model can go wrong
(a config that does not parse, ``os._exit``, ``sys.exit`` and a segfault in ``initialize``, an import of a module that
does not exist, KIND_GPU on this GPU-less host, an EXECUTION_ENV_PATH archive that cannot be unpacked).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
from gevent import subprocess

from scripts import modelgen

from .server import IDENTITY_CONFIG, IDENTITY_PY, ROOT, add_model

pytestmark = pytest.mark.timeout(240)

def _python_model(repo: Path, name: str, *, top: str = "", init: str = "pass", extra: str = "") -> Path:
    """The harness's Python identity, with ``top`` at the top of model.py and ``init`` as its initialize."""
    model_py = IDENTITY_PY.replace("class TritonPythonModel:\n", f"{top}\n\nclass TritonPythonModel:\n"
                                   f"    def initialize(self, args):\n        {init}\n\n")
    return add_model(repo, name, IDENTITY_CONFIG + "instance_group [ { kind: KIND_CPU } ]\n" + extra, model_py)


def _gpu_only(model_dir: Path) -> None:
    text = (model_dir / "config.pbtxt").read_text()
    (model_dir / "config.pbtxt").write_text(text.replace("KIND_CPU", "KIND_GPU"))


def _check(*args: str | Path) -> tuple[int, str, str]:
    proc = subprocess.run([sys.executable, "-m", "triton_actor", "check", *map(str, args)], cwd=ROOT,
                          capture_output=True, text=True, timeout=200)
    return proc.returncode, proc.stdout, proc.stderr


def _lines(stdout: str) -> dict[str, str]:
    """Model name → its line (the first one; indented lines below it are its details)."""
    out = {}
    for line in stdout.splitlines():
        parts = line.split()
        if len(parts) > 1 and parts[0] in ("OK", "WARN", "FAIL"):
            out[parts[1]] = line
    return out


@pytest.fixture
def broken_repo(tmp_path: Path) -> Path:
    repo = tmp_path / "repo"
    modelgen.onnx_mlp(repo, "mlp", dims=(4, 8, 2), max_batch_size=8)
    _python_model(repo, "identity")
    _python_model(repo, "exits", init="import os; os._exit(3)")
    _python_model(repo, "segfaults", init="import ctypes; ctypes.string_at(0)")
    _python_model(repo, "sys_exits", init="import sys; sys.exit(4)")
    _python_model(repo, "needs_module", top="import no_such_module_for_check")
    _gpu_only(modelgen.onnx_mlp(repo, "mlp_gpu", dims=(4, 8, 2), max_batch_size=8))
    (repo / "bad_config" / "1").mkdir(parents=True)
    (repo / "bad_config" / "config.pbtxt").write_text('name: "bad_config"\nbackend: "python"\nmax_batch_size: [\n')
    return repo


def test_each_model_gets_its_line_and_the_exit_status_says_whether_all_loaded(broken_repo: Path) -> None:
    code, out, err = _check(broken_repo)
    lines = _lines(out)
    assert code == 1, out + err
    assert set(lines) == {"mlp", "identity", "exits", "segfaults", "sys_exits", "needs_module", "mlp_gpu",
                          "bad_config"}, out
    assert lines["mlp"].startswith("OK ") and "one synthesised request" in lines["mlp"]
    assert lines["identity"].startswith("OK ")
    # the server's own text, with the file and line it names
    assert lines["bad_config"].startswith("FAIL ")
    # the file and line, then the load API's answer as Triton 2.51 words it (its wrapper, then the reason)
    config = broken_repo / "bad_config" / "config.pbtxt"
    assert (f"{config}:3: failed to load 'bad_config', failed to poll from model repository: model 'bad_config': "
            f"invalid config at {config}:3:") in lines["bad_config"]
    assert "os._exit(3)" in lines["exits"] and f"{broken_repo / 'exits' / '1' / 'model.py'}:" in lines["exits"]
    assert "SIGSEGV" in lines["segfaults"] and f"{broken_repo / 'segfaults' / '1' / 'model.py'}:" in lines["segfaults"]
    assert lines["sys_exits"].startswith("FAIL ") and "SystemExit: 4" in lines["sys_exits"]
    assert "No module named 'no_such_module_for_check'" in out
    assert "imports 'no_such_module_for_check', which this environment lacks" in out
    # KIND_GPU on a host without a GPU: checked on the CPU, a warning rather than a failure
    assert lines["mlp_gpu"].startswith("WARN ") and "KIND_GPU and this host has no GPU" in out
    assert "8 model(s): 2 OK, 1 with warnings, 5 failed" in out


def test_strict_fails_warnings_and_json_is_one_document(tmp_path: Path) -> None:
    repo = tmp_path / "repo"
    modelgen.onnx_mlp(repo, "mlp", dims=(4, 8, 2), max_batch_size=8)
    _gpu_only(modelgen.onnx_mlp(repo, "mlp_gpu", dims=(4, 8, 2), max_batch_size=8))
    _python_model(repo, "with_env", extra='parameters { key: "EXECUTION_ENV_PATH", value: '
                  '{ string_value: "$$TRITON_MODEL_DIRECTORY/env.tar.gz" } }')
    (repo / "with_env" / "env.tar.gz").write_bytes(b"not an archive")

    code, out, _ = _check(repo)
    assert code == 0, out
    assert _lines(out)["with_env"].startswith("WARN ") and "the archive cannot be unpacked" in out

    code, out, err = _check(repo, "--strict", "--json")
    assert code == 1
    doc = json.loads(out)
    assert doc["ok"] is False and doc["strict"] is True and doc["repositories"] == [str(repo)]
    models = {m["name"]: m for m in doc["models"]}
    assert [m["name"] for m in doc["models"]] == ["mlp", "mlp_gpu", "with_env"]
    assert models["mlp"]["status"] == "OK" and models["mlp"]["error"] is None and models["mlp"]["warnings"] == []
    assert models["mlp"]["load_s"] > 0 and isinstance(models["mlp"]["footprint_bytes"], int)
    assert models["mlp_gpu"]["status"] == "FAIL" and models["mlp_gpu"]["warnings"]
    assert models["with_env"]["status"] == "FAIL"
    assert set(_lines(err)) == {"mlp", "mlp_gpu", "with_env"}  # the progress lines went to stderr


def test_error_json_names_file_and_line(tmp_path: Path) -> None:
    repo = tmp_path / "repo"
    _python_model(repo, "raises", init="raise ValueError('no weights here')")
    code, out, _ = _check(repo, "--json")
    assert code == 1
    (model,) = json.loads(out)["models"]
    assert model["status"] == "FAIL"
    assert "ValueError: no weights here" in model["error"]["message"]
    model_py = repo / "raises" / "1" / "model.py"
    line = model_py.read_text().splitlines().index("        raise ValueError('no weights here')") + 1
    assert model["error"]["file"] == str(model_py) and model["error"]["line"] == line


def test_the_shipped_repository_is_all_ok() -> None:
    code, out, err = _check(ROOT / "model_repository")
    assert code == 0, out + err
    lines = _lines(out)
    # the tracked models, and those scripts/make_examples.py generated where it ran (the README's first command)
    assert {"add_sub", "identity_batch", "string_ops", "text_generator"} <= set(lines)
    assert all(line.startswith("OK ") for line in lines.values()), out


def test_a_repository_without_models_is_a_usage_error(tmp_path: Path) -> None:
    code, _, err = _check(tmp_path)
    assert code == 2 and "no models" in err


def test_a_model_that_never_finishes_loading_fails_at_the_timeout(tmp_path: Path) -> None:
    repo = tmp_path / "repo"
    _python_model(repo, "hangs", init="import threading; threading.Event().wait()")
    _python_model(repo, "identity")
    code, out, _ = _check(repo, "--timeout", "5")
    lines = _lines(out)
    assert code == 1
    assert lines["hangs"].startswith("FAIL ") and "did not load and answer within 5 s" in lines["hangs"]
    assert lines["identity"].startswith("OK ")


FORWARD_PY = """
import triton_python_backend_utils as pb_utils

class TritonPythonModel:
    def execute(self, requests):
        out = []
        for r in requests:
            called = pb_utils.InferenceRequest(model_name="target", requested_output_names=["OUTPUT0"],
                                               inputs=[pb_utils.get_input_tensor_by_name(r, "INPUT0")]).exec()
            if called.has_error():
                raise pb_utils.TritonModelException(called.error().message())
            out.append(pb_utils.InferenceResponse([pb_utils.get_output_tensor_by_name(called, "OUTPUT0")]))
        return out
"""


def test_a_model_that_calls_another_by_bls_finds_it(tmp_path: Path) -> None:
    """Each model is checked in a server of its own: one that calls another (BLS) has that one loaded on its
    first call, as in a server serving the repository; a target that is not in the repository still fails."""
    repo = tmp_path / "repo"
    add_model(repo, "caller", IDENTITY_CONFIG, FORWARD_PY)
    _python_model(repo, "target")
    alone = tmp_path / "alone"
    add_model(alone, "caller", IDENTITY_CONFIG, FORWARD_PY)
    code, out, err = _check(repo)
    assert code == 0 and _lines(out)["caller"].startswith("OK "), out + err
    code, out, _ = _check(alone)
    assert code == 1 and _lines(out)["caller"].startswith("FAIL ") and "target" in _lines(out)["caller"], out
