"""Generated example/test models (``scripts/modelgen.py``, ``scripts/make_examples.py``).

Each model is checked in-process against its numpy reference (onnxruntime / torch, no server), and every
config.pbtxt written must parse with the server's own parser.
"""

from __future__ import annotations

import sys
import warnings
from pathlib import Path

import numpy as np
import pytest
from gevent import subprocess  # the test process is gevent-patched (tests/conftest.py), as test_style does

from scripts import modelgen
from triton_actor.protocol._generated import model_config_pb2 as mc
from triton_actor.repository.config import parse_text

ROOT = Path(__file__).resolve().parents[2]
MLP_DIMS = (256, 1024, 16)


def _session(path: Path):
    ort = pytest.importorskip("onnxruntime")
    opts = ort.SessionOptions()
    opts.intra_op_num_threads = 1
    return ort.InferenceSession(str(path), opts, providers=["CPUExecutionProvider"])


def _torch_load(path: Path):
    torch = pytest.importorskip("torch")
    with warnings.catch_warnings():  # torch.jit.load is deprecated in torch 2.x
        warnings.simplefilter("ignore")
        return torch.jit.load(str(path)).eval()


def _config(model_dir: Path):
    path = model_dir / "config.pbtxt"
    return parse_text(path.read_text(encoding="utf-8"), model_dir.name, path)


@pytest.fixture(scope="module")
def onnx_repo(tmp_path_factory: pytest.TempPathFactory) -> Path:
    pytest.importorskip("onnx")
    repo = tmp_path_factory.mktemp("onnx_repo")
    modelgen.onnx_mlp(repo)
    modelgen.onnx_classifier(repo)
    modelgen.onnx_all_types(repo)
    return repo


@pytest.fixture(scope="module")
def torch_repo(tmp_path_factory: pytest.TempPathFactory) -> Path:
    pytest.importorskip("torch")
    repo = tmp_path_factory.mktemp("torch_repo")
    modelgen.torchscript_mlp(repo)
    modelgen.torchscript_two_inputs(repo)
    modelgen.torchscript_named_inputs(repo)
    return repo


def test_import_is_cheap() -> None:
    code = (
        "import sys, scripts.modelgen\n"
        "heavy = [m for m in ('torch', 'onnx', 'onnxruntime') if m in sys.modules]\n"
        "assert not heavy, heavy\n"
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT)
    assert proc.returncode == 0, proc.stderr


def test_weights_are_deterministic() -> None:
    a, b = modelgen.mlp_weights((8, 6, 3), seed=3), modelgen.mlp_weights((8, 6, 3), seed=3)
    assert [w.shape for w, _ in a] == [(8, 6), (6, 3)]
    assert [bb.shape for _, bb in a] == [(6,), (3,)]
    for (w1, b1), (w2, b2) in zip(a, b, strict=True):
        assert w1.dtype == np.float32 and b1.dtype == np.float32
        np.testing.assert_array_equal(w1, w2)
        np.testing.assert_array_equal(b1, b2)
    assert not np.array_equal(a[0][0], modelgen.mlp_weights((8, 6, 3), seed=4)[0][0])
    with pytest.raises(ValueError):
        modelgen.mlp_weights((8,))


@pytest.mark.parametrize("dims", [MLP_DIMS, (8, 3), (32, 64, 48, 5)])
def test_onnx_mlp_matches_reference(tmp_path: Path, dims: tuple[int, ...]) -> None:
    pytest.importorskip("onnx")
    model_dir = modelgen.onnx_mlp(tmp_path, "m", dims=dims)
    assert model_dir == tmp_path / "m"
    sess = _session(model_dir / "1" / "model.onnx")
    assert [(i.name, i.shape) for i in sess.get_inputs()] == [("INPUT0", ["batch", dims[0]])]
    assert [(o.name, o.shape) for o in sess.get_outputs()] == [("OUTPUT0", ["batch", dims[-1]])]
    for batch in (1, 7):
        x = np.random.default_rng(batch).standard_normal((batch, dims[0])).astype(np.float32)
        (out,) = sess.run(None, {"INPUT0": x})
        assert out.dtype == np.float32 and out.shape == (batch, dims[-1])
        np.testing.assert_allclose(out, modelgen.mlp_reference(x, dims), rtol=1e-5, atol=1e-5)


def test_onnx_mlp_config(onnx_repo: Path) -> None:
    cfg = _config(onnx_repo / "mlp_onnx")
    assert cfg.name == "mlp_onnx" and cfg.backend == "onnxruntime" and cfg.max_batch_size == 64
    assert [(i.name, list(i.dims)) for i in cfg.input] == [("INPUT0", [256])]
    assert [(o.name, list(o.dims)) for o in cfg.output] == [("OUTPUT0", [16])]
    assert cfg.HasField("dynamic_batching")
    assert [(g.count, g.kind) for g in cfg.instance_group] == [(1, mc.ModelInstanceGroup.KIND_CPU)]


def test_onnx_mlp_variants(tmp_path: Path) -> None:
    pytest.importorskip("onnx")
    bare = modelgen.onnx_mlp(tmp_path, "bare", dims=(4, 2), config=False)
    assert not (bare / "config.pbtxt").exists() and (bare / "1" / "model.onnx").is_file()

    nobatch = modelgen.onnx_mlp(tmp_path, "nobatch", dims=(4, 2), max_batch_size=0, version=3)
    assert (nobatch / "3" / "model.onnx").is_file()
    cfg = _config(nobatch)
    assert cfg.max_batch_size == 0 and not cfg.HasField("dynamic_batching")
    assert list(cfg.input[0].dims) == [-1, 4] and list(cfg.output[0].dims) == [-1, 2]

    static = modelgen.onnx_mlp(tmp_path, "static", dims=(4, 2), dynamic_batching=False)
    assert not _config(static).HasField("dynamic_batching")


def test_onnx_mlp_batching_options(tmp_path: Path) -> None:
    pytest.importorskip("onnx")
    model_dir = modelgen.onnx_mlp(tmp_path, "tuned", dims=(4, 2), max_batch_size=16, max_queue_delay_us=1000,
                                  preferred_batch_size=(8, 16), count=2)
    cfg = _config(model_dir)
    assert cfg.HasField("dynamic_batching")
    assert cfg.dynamic_batching.max_queue_delay_microseconds == 1000
    assert list(cfg.dynamic_batching.preferred_batch_size) == [8, 16]
    assert [(g.count, g.kind) for g in cfg.instance_group] == [(2, mc.ModelInstanceGroup.KIND_CPU)]

    # the config alone, next to a model file made elsewhere (the benchmark links one cached file)
    model = (model_dir / "1" / "model.onnx").read_bytes()
    other = tmp_path / "plain"
    (other / "1").mkdir(parents=True)
    (other / "1" / "model.onnx").write_bytes(model)
    assert modelgen.onnx_mlp_config(other, (4, 2), 16, dynamic_batching=False) == other
    cfg = _config(other)
    assert cfg.name == "plain" and cfg.max_batch_size == 16 and not cfg.HasField("dynamic_batching")
    assert [(i.name, list(i.dims)) for i in cfg.input] == [("INPUT0", [4])]


@pytest.mark.parametrize("batching", [False, True])
def test_python_identity(tmp_path: Path, batching: bool) -> None:
    import importlib.util
    import time

    from triton_actor.backends.python import triton_python_backend_utils as pb_utils

    model_dir = modelgen.python_identity(tmp_path, "ident", delay_ms=20, dims=(3,), count=2, max_batch_size=8,
                                         dynamic_batching=batching, max_queue_delay_us=500)
    cfg = _config(model_dir)
    assert cfg.backend == "python" and cfg.max_batch_size == 8
    assert [(i.name, list(i.dims)) for i in cfg.input] == [("INPUT0", [3])]
    assert [(o.name, list(o.dims)) for o in cfg.output] == [("OUTPUT0", [3])]
    assert [g.count for g in cfg.instance_group] == [2]
    assert cfg.parameters["execute_delay_ms"].string_value == "20"
    assert cfg.HasField("dynamic_batching") is batching
    if batching:
        assert cfg.dynamic_batching.max_queue_delay_microseconds == 500

    spec = importlib.util.spec_from_file_location("ident_model", model_dir / "1" / "model.py")
    module = importlib.util.module_from_spec(spec)
    saved = sys.modules.get("triton_python_backend_utils")
    sys.modules["triton_python_backend_utils"] = pb_utils
    try:
        spec.loader.exec_module(module)
    finally:
        if saved is None:
            del sys.modules["triton_python_backend_utils"]
        else:
            sys.modules["triton_python_backend_utils"] = saved
    model = module.TritonPythonModel()
    model.initialize({"model_config": '{"parameters": {"execute_delay_ms": {"string_value": "20"}}}'})
    xs = [np.arange(3, dtype=np.float32) + k for k in range(3)]
    start = time.perf_counter()
    responses = model.execute([pb_utils.InferenceRequest(inputs=[pb_utils.Tensor("INPUT0", x)]) for x in xs])
    assert time.perf_counter() - start >= 0.019, "one sleep per execute, whatever the batch"
    for x, response in zip(xs, responses, strict=True):
        (out,) = response.output_tensors()
        assert out.name() == "OUTPUT0"
        np.testing.assert_array_equal(out.as_numpy(), x)


def test_classifier(onnx_repo: Path) -> None:
    model_dir = onnx_repo / "image_classifier_onnx"
    labels = (model_dir / "labels.txt").read_text(encoding="utf-8").splitlines()
    assert labels == list(modelgen.CIFAR10_LABELS)
    cfg = _config(model_dir)
    assert cfg.backend == "onnxruntime" and cfg.max_batch_size == 8 and cfg.HasField("dynamic_batching")
    assert [(i.name, list(i.dims)) for i in cfg.input] == [("IMAGE", [3, 32, 32])]
    assert [(o.name, list(o.dims), o.label_filename) for o in cfg.output] == [
        ("PROBABILITIES", [10], "labels.txt")
    ]

    sess = _session(model_dir / "1" / "model.onnx")
    rng = np.random.default_rng(0)
    colours = rng.random((8, 3, 1, 1)).astype(np.float32) * np.ones((1, 1, 32, 32), np.float32)
    images = np.concatenate([colours, rng.random((4, 3, 32, 32)).astype(np.float32)])
    (probs,) = sess.run(None, {"IMAGE": images})
    assert probs.shape == (12, 10)
    np.testing.assert_allclose(probs.sum(axis=1), 1.0, rtol=1e-5)
    # float32 sums in another order than numpy's (onnxruntime 1.32's kernels): up to 3e-4 relative apart
    # on probabilities near 0.01
    np.testing.assert_allclose(probs, modelgen.classifier_reference(images), rtol=1e-3, atol=1e-5)
    assert len(set(probs[:8].argmax(axis=1))) >= 3, "different colours should land in different classes"


def test_classifier_other_shape(tmp_path: Path) -> None:
    pytest.importorskip("onnx")
    model_dir = modelgen.onnx_classifier(tmp_path, "c", classes=12, image=(1, 8, 8))
    labels = (model_dir / "labels.txt").read_text(encoding="utf-8").splitlines()
    assert len(labels) == 12 and labels[-1] == "class_11"
    x = np.random.default_rng(1).random((2, 1, 8, 8)).astype(np.float32)
    (probs,) = _session(model_dir / "1" / "model.onnx").run(None, {"IMAGE": x})
    np.testing.assert_allclose(probs, modelgen.classifier_reference(x, 12, (1, 8, 8)), rtol=1e-3, atol=1e-5)


def test_all_types_round_trip(tmp_path: Path) -> None:
    pytest.importorskip("onnx")
    model_dir, names = modelgen.onnx_all_types(tmp_path)
    assert names == list(modelgen.TYPES)
    assert {"BOOL", "UINT8", "INT8", "INT16", "INT32", "INT64", "FP16", "FP32", "FP64", "STRING"} <= set(names)
    cfg = _config(model_dir)
    assert cfg.max_batch_size == 8
    assert [i.name for i in cfg.input] == [f"IN_{t}" for t in names]
    assert [o.name for o in cfg.output] == [f"OUT_{t}" for t in names]
    assert all(list(io.dims) == [-1] for io in [*cfg.input, *cfg.output])

    feeds = {}
    for t in names:
        dtype = modelgen.TYPES[t][1]
        if dtype == "object":
            # onnxruntime's Python API takes and returns str for ONNX STRING (bytes would be str()-ed)
            feeds[f"IN_{t}"] = np.array([["a", "é\x00z", ""], ["xyz", "", "q"]], dtype=object)
        elif dtype == "bool":
            feeds[f"IN_{t}"] = np.array([[True, False, True], [False, False, True]])
        else:
            feeds[f"IN_{t}"] = (np.arange(6).reshape(2, 3) * 7 + 1).astype(dtype)
    sess = _session(model_dir / "1" / "model.onnx")
    outs = dict(zip([o.name for o in sess.get_outputs()], sess.run(None, feeds), strict=True))
    for t in names:
        out, sent = outs[f"OUT_{t}"], feeds[f"IN_{t}"]
        assert out.dtype == sent.dtype, t
        assert out.shape == sent.shape and out.tolist() == sent.tolist(), t


def test_torchscript_mlp_matches_onnx(onnx_repo: Path, torch_repo: Path) -> None:
    torch = pytest.importorskip("torch")
    model = _torch_load(torch_repo / "mlp_torchscript" / "1" / "model.pt")
    sess = _session(onnx_repo / "mlp_onnx" / "1" / "model.onnx")
    x = np.random.default_rng(7).standard_normal((5, 256)).astype(np.float32)
    with torch.no_grad():
        ts_out = model(torch.from_numpy(x)).numpy()
    (onnx_out,) = sess.run(None, {"INPUT0": x})
    np.testing.assert_allclose(ts_out, onnx_out, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(ts_out, modelgen.mlp_reference(x, MLP_DIMS), rtol=1e-5, atol=1e-5)

    cfg = _config(torch_repo / "mlp_torchscript")
    assert cfg.backend == "pytorch" and cfg.max_batch_size == 64
    assert [(i.name, list(i.dims)) for i in cfg.input] == [("INPUT__0", [256])]
    assert [(o.name, list(o.dims)) for o in cfg.output] == [("OUTPUT__0", [16])]


def test_torchscript_two_inputs(torch_repo: Path) -> None:
    torch = pytest.importorskip("torch")
    model_dir = torch_repo / "add_sub_torchscript"
    model = _torch_load(model_dir / "1" / "model.pt")
    assert [a.name for a in model.forward.schema.arguments] == ["self", "a", "b"]
    a, b = torch.tensor([1.0, 2.0, 3.0, 4.0]), torch.tensor([0.5, 0.5, 1.0, 8.0])
    total, diff = model(a, b)
    assert total.tolist() == [1.5, 2.5, 4.0, 12.0] and diff.tolist() == [0.5, 1.5, 2.0, -4.0]
    cfg = _config(model_dir)
    assert cfg.backend == "pytorch" and cfg.max_batch_size == 0
    assert [(i.name, list(i.dims)) for i in cfg.input] == [("INPUT__0", [4]), ("INPUT__1", [4])]
    assert [o.name for o in cfg.output] == ["OUTPUT__0", "OUTPUT__1"]


def test_torchscript_named_inputs(torch_repo: Path) -> None:
    torch = pytest.importorskip("torch")
    model_dir = torch_repo / "add_sub_named_torchscript"
    model = _torch_load(model_dir / "1" / "model.pt")
    assert [a.name for a in model.forward.schema.arguments] == ["self", "x", "y"]
    total, diff = model(x=torch.tensor([5.0] * 4), y=torch.tensor([1.0] * 4))
    assert total.tolist() == [6.0] * 4 and diff.tolist() == [4.0] * 4
    cfg = _config(model_dir)
    assert [i.name for i in cfg.input] == ["y", "x"], "reversed: binding must be by name, not position"
    assert [o.name for o in cfg.output] == ["OUTPUT__0", "OUTPUT__1"]


def test_corrupt_copy(onnx_repo: Path, tmp_path: Path) -> None:
    ort = pytest.importorskip("onnxruntime")
    src = onnx_repo / "mlp_onnx" / "1" / "model.onnx"
    dst = modelgen.corrupt_copy(src, tmp_path / "bad" / "1" / "model.onnx", keep_bytes=1000)
    assert dst.read_bytes() == src.read_bytes()[:1000]
    with pytest.raises(Exception, match=r"(?i)protobuf|parse|load"):
        ort.InferenceSession(str(dst), providers=["CPUExecutionProvider"])
    assert modelgen.corrupt_copy(src, tmp_path / "empty.onnx", 0).stat().st_size == 0


def test_make_examples(tmp_path: Path) -> None:
    pytest.importorskip("onnx")
    pytest.importorskip("torch")
    script = [sys.executable, str(ROOT / "scripts" / "make_examples.py"), "--repo", str(tmp_path)]
    first = subprocess.run(script, capture_output=True, text=True, cwd=tmp_path, timeout=120)
    assert first.returncode == 0, first.stderr
    for name in ("mlp_onnx", "image_classifier_onnx", "mlp_torchscript", "tiny_lm"):
        assert f"[make_examples] wrote {tmp_path / name}" in first.stdout or f"wrote {name}" in first.stdout
        _config(tmp_path / name)
    assert (tmp_path / "image_classifier_onnx" / "labels.txt").is_file()
    assert (tmp_path / "mlp_torchscript" / "1" / "model.pt").is_file()

    mtime = (tmp_path / "mlp_onnx" / "1" / "model.onnx").stat().st_mtime_ns
    again = subprocess.run(script, capture_output=True, text=True, cwd=tmp_path, timeout=120)
    assert again.returncode == 0, again.stderr
    # 4 generated models + the 6 of the MiniLM pipeline (written with the examples extra, else skipped by name)
    assert "wrote" not in again.stdout and again.stdout.count("skipped") == 10
    assert (tmp_path / "mlp_onnx" / "1" / "model.onnx").stat().st_mtime_ns == mtime
