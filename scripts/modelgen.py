"""Generate example and test models: complete Triton model directories, written from code.

Design rule 9: example and test models are generated (ONNX with ``onnx.helper``, TorchScript with ``torch.jit``),
never downloaded. All weights come from a numpy RNG seeded explicitly, so the same call always writes the same
model, and ``mlp_reference`` / ``classifier_reference`` compute the expected outputs in plain numpy.

Every ``onnx_*`` / ``torchscript_*`` function writes ``<repo>/<name>/config.pbtxt`` (unless told not to),
``<repo>/<name>/<version>/model.onnx`` or ``model.pt`` and, for the classifier, ``labels.txt``; it returns the
model directory. ``python_identity`` writes a Python-backend ``model.py`` instead. numpy, onnx and torch are
imported inside the functions, so importing this module is cheap.

``scripts/make_examples.py`` uses it to fill ``model_repository/``; the tests use it to build models in tmp dirs.
It is not server code, so it lives beside its users: the scripts here import it as ``modelgen`` (their folder
is on ``sys.path``), the tests as ``scripts.modelgen`` (pytest puts the repository root on ``sys.path``).
"""

from __future__ import annotations

import itertools
import warnings
from collections.abc import Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import numpy as np

__all__ = [
    "CIFAR10_LABELS",
    "TYPES",
    "classifier_reference",
    "classifier_weights",
    "corrupt_copy",
    "mlp_reference",
    "mlp_weights",
    "onnx_all_types",
    "onnx_classifier",
    "onnx_mlp",
    "onnx_mlp_config",
    "python_identity",
    "torchscript_mlp",
    "torchscript_named_inputs",
    "torchscript_two_inputs",
]

CIFAR10_LABELS = ("airplane", "automobile", "bird", "cat", "deer", "dog", "frog", "horse", "ship", "truck")

# Triton config type (without ``TYPE_``) -> (protocol datatype, numpy dtype name, ONNX TensorProto name) for the
# types ``onnx_all_types`` includes. All of these have an ONNX Runtime CPU Identity kernel and a numpy dtype that
# the onnxruntime Python API accepts. Left out: BF16 (numpy has no bfloat16, so no Python client/ORT feed for it).
TYPES: dict[str, tuple[str, str, str]] = {
    "BOOL": ("BOOL", "bool", "BOOL"),
    "UINT8": ("UINT8", "uint8", "UINT8"),
    "UINT16": ("UINT16", "uint16", "UINT16"),
    "UINT32": ("UINT32", "uint32", "UINT32"),
    "UINT64": ("UINT64", "uint64", "UINT64"),
    "INT8": ("INT8", "int8", "INT8"),
    "INT16": ("INT16", "int16", "INT16"),
    "INT32": ("INT32", "int32", "INT32"),
    "INT64": ("INT64", "int64", "INT64"),
    "FP16": ("FP16", "float16", "FLOAT16"),
    "FP32": ("FP32", "float32", "FLOAT"),
    "FP64": ("FP64", "float64", "DOUBLE"),
    "STRING": ("BYTES", "object", "STRING"),
}


# ---------------------------------------------------------------------------------------------------------------
# weights and numpy references


def mlp_weights(dims: Sequence[int], seed: int = 0) -> list[tuple[np.ndarray, np.ndarray]]:
    """Weights of the MLP ``dims[0] -> dims[1] -> ... -> dims[-1]``: one ``(W [in, out], b [out])`` per layer.

    float32, He-scaled normal W and small normal b from ``numpy.random.default_rng(seed)``.
    """
    import numpy as np

    dims = _check_dims(dims)
    rng = np.random.default_rng(seed)
    layers = []
    for fan_in, fan_out in itertools.pairwise(dims):
        w = rng.standard_normal((fan_in, fan_out), dtype=np.float32) * np.float32(np.sqrt(2.0 / fan_in))
        b = rng.standard_normal(fan_out, dtype=np.float32) * np.float32(0.1)
        layers.append((w, b))
    return layers


def mlp_reference(x: np.ndarray, dims: Sequence[int], seed: int = 0) -> np.ndarray:
    """numpy forward pass of the generated MLP (``x @ W + b``, ReLU between layers, none after the last).

    Computed in float64, returned as float32; ``x`` is ``[batch, dims[0]]`` (or ``[dims[0]]``).
    """
    import numpy as np

    h = np.asarray(x, dtype=np.float64)
    layers = mlp_weights(dims, seed)
    for i, (w, b) in enumerate(layers):
        h = h @ w.astype(np.float64) + b.astype(np.float64)
        if i < len(layers) - 1:
            h = np.maximum(h, 0.0)
    return h.astype(np.float32)


def classifier_weights(
    classes: int = 10, image: Sequence[int] = (3, 32, 32), seed: int = 0, filters: int = 8
) -> dict[str, np.ndarray]:
    """Weights of the generated classifier: ``conv_w [filters, C, 3, 3]``, ``conv_b``, ``fc_w [filters, classes]``,
    ``fc_b``.

    The classifier head is normalized over 64 solid-colour probe images (features centred and scaled), so inputs
    that differ in colour land in different classes with a clearly peaked softmax (stable top-k order).
    """
    import numpy as np

    channels, height, width = (int(d) for d in image)
    rng = np.random.default_rng(seed)
    conv_w = rng.standard_normal((filters, channels, 3, 3), dtype=np.float32) * np.float32(np.sqrt(2.0 / (9 * channels)))
    conv_b = rng.standard_normal(filters, dtype=np.float32) * np.float32(0.1)
    head_w = rng.standard_normal((filters, classes)) * 3.0
    head_b = rng.standard_normal(classes) * 0.5
    probes = rng.random((64, channels, 1, 1)) * np.ones((1, 1, height, width))
    feats = _classifier_features(probes, conv_w, conv_b)
    mu, sigma = feats.mean(axis=0), feats.std(axis=0) + 1e-3
    # logits = ((f - mu) / sigma) @ head_w + head_b, folded into one Gemm
    fc_w = (head_w / sigma[:, None]).astype(np.float32)
    fc_b = (head_b - (mu / sigma) @ head_w).astype(np.float32)
    return {"conv_w": conv_w, "conv_b": conv_b, "fc_w": fc_w, "fc_b": fc_b}


def classifier_reference(
    x: np.ndarray, classes: int = 10, image: Sequence[int] = (3, 32, 32), seed: int = 0
) -> np.ndarray:
    """numpy forward pass of ``onnx_classifier``: probabilities ``[batch, classes]`` (float32)."""
    import numpy as np

    wts = classifier_weights(classes, image, seed)
    feats = _classifier_features(np.asarray(x), wts["conv_w"], wts["conv_b"])
    logits = feats @ wts["fc_w"].astype(np.float64) + wts["fc_b"].astype(np.float64)
    e = np.exp(logits - logits.max(axis=1, keepdims=True))
    return (e / e.sum(axis=1, keepdims=True)).astype(np.float32)


def _classifier_features(x: np.ndarray, conv_w: np.ndarray, conv_b: np.ndarray) -> np.ndarray:
    """Conv 3x3 pad 1 -> Relu -> global average pool, in float64: ``[batch, filters]``."""
    import numpy as np

    x = np.asarray(x, dtype=np.float64)
    _, _, h, w = x.shape
    xp = np.pad(x, ((0, 0), (0, 0), (1, 1), (1, 1)))
    kernel = conv_w.astype(np.float64)
    out = np.zeros((x.shape[0], kernel.shape[0], h, w))
    for i in range(3):
        for j in range(3):
            out += np.einsum("nchw,fc->nfhw", xp[:, :, i : i + h, j : j + w], kernel[:, :, i, j])
    out += conv_b.astype(np.float64)[None, :, None, None]
    return np.maximum(out, 0.0).mean(axis=(2, 3))


def corrupt_copy(src_file: Path | str, dst_file: Path | str, keep_bytes: int) -> Path:
    """Write the first ``keep_bytes`` bytes of ``src_file`` to ``dst_file`` (a truncated, unloadable model)."""
    data = Path(src_file).read_bytes()[: max(0, int(keep_bytes))]
    dst = Path(dst_file)
    dst.parent.mkdir(parents=True, exist_ok=True)
    dst.write_bytes(data)
    return dst


# ---------------------------------------------------------------------------------------------------------------
# ONNX models


def onnx_mlp(
    repo: Path | str,
    name: str = "mlp_onnx",
    dims: Sequence[int] = (256, 1024, 16),
    max_batch_size: int = 64,
    dynamic_batching: bool = True,
    config: bool = True,
    opset: int = 17,
    *,
    seed: int = 0,
    version: int = 1,
    max_queue_delay_us: int = 0,
    preferred_batch_size: Sequence[int] = (),
    count: int = 1,
) -> Path:
    """MLP ``INPUT0 [batch, dims[0]] FP32 -> (MatMul+Add, Relu)* -> MatMul+Add -> OUTPUT0 [batch, dims[-1]]``.

    The batch dim is dynamic (``"batch"``) in the graph. ``config=False`` writes no config.pbtxt (auto-complete);
    the config options are those of ``onnx_mlp_config``.
    """
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    dims = _check_dims(dims)
    layers = mlp_weights(dims, seed)
    nodes, inits = [], []
    cur = "INPUT0"
    for i, (w, b) in enumerate(layers):
        last = i == len(layers) - 1
        inits += [numpy_helper.from_array(w, f"fc{i}.weight"), numpy_helper.from_array(b, f"fc{i}.bias")]
        nodes.append(helper.make_node("MatMul", [cur, f"fc{i}.weight"], [f"fc{i}.mm"], name=f"fc{i}_matmul"))
        add_out = "OUTPUT0" if last else f"fc{i}.out"
        nodes.append(helper.make_node("Add", [f"fc{i}.mm", f"fc{i}.bias"], [add_out], name=f"fc{i}_add"))
        if not last:
            nodes.append(helper.make_node("Relu", [add_out], [f"relu{i}"], name=f"relu{i}"))
            cur = f"relu{i}"
    graph = helper.make_graph(
        nodes,
        name,
        [helper.make_tensor_value_info("INPUT0", TensorProto.FLOAT, ["batch", dims[0]])],
        [helper.make_tensor_value_info("OUTPUT0", TensorProto.FLOAT, ["batch", dims[-1]])],
        initializer=inits,
    )
    model_dir = _version_dir(repo, name, version)
    _save_onnx(onnx, helper, graph, opset, model_dir / str(version) / "model.onnx")
    if config:
        onnx_mlp_config(model_dir, dims, max_batch_size, dynamic_batching, seed=seed,
                        max_queue_delay_us=max_queue_delay_us, preferred_batch_size=preferred_batch_size, count=count)
    return model_dir


def onnx_mlp_config(
    model_dir: Path | str,
    dims: Sequence[int],
    max_batch_size: int = 64,
    dynamic_batching: bool = True,
    *,
    seed: int = 0,
    max_queue_delay_us: int = 0,
    preferred_batch_size: Sequence[int] = (),
    count: int = 1,
) -> Path:
    """Write only the config.pbtxt of an ``onnx_mlp`` model (named after ``model_dir``), e.g. next to a model file
    generated once and linked in. ``dynamic_batching`` (only with ``max_batch_size > 0``) writes a
    ``dynamic_batching`` block with ``max_queue_delay_microseconds`` / ``preferred_batch_size`` when given;
    ``count`` is the number of CPU instances."""
    dims = _check_dims(dims)
    model_dir = Path(model_dir)
    _write_config(
        model_dir,
        model_dir.name,
        "onnxruntime",
        max_batch_size,
        inputs=[_io("INPUT0", "FP32", _dims(max_batch_size, [dims[0]]))],
        outputs=[_io("OUTPUT0", "FP32", _dims(max_batch_size, [dims[-1]]))],
        dynamic_batching=dynamic_batching and max_batch_size > 0,
        max_queue_delay_us=max_queue_delay_us,
        preferred_batch_size=preferred_batch_size,
        count=count,
        comment=f"MLP {' -> '.join(map(str, dims))} (generated by scripts/modelgen.py, seed {seed}).",
    )
    return model_dir


def onnx_classifier(
    repo: Path | str,
    name: str = "image_classifier_onnx",
    classes: int = 10,
    image: Sequence[int] = (3, 32, 32),
    *,
    max_batch_size: int = 8,
    seed: int = 0,
    version: int = 1,
    opset: int = 17,
) -> Path:
    """Image classifier ``IMAGE [batch, C, H, W] -> Conv(8, 3x3, pad 1) -> Relu -> GlobalAveragePool -> Flatten
    -> Gemm -> Softmax -> PROBABILITIES [batch, classes]``, with ``labels.txt`` (CIFAR-10 names, then
    ``class_<i>``) named by ``label_filename`` on the output."""
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    image = [int(d) for d in image]
    if len(image) != 3 or min(image) < 1 or classes < 1:
        raise ValueError(f"image must be (C, H, W) and classes >= 1, got image={image} classes={classes}")
    wts = classifier_weights(classes, image, seed)
    nodes = [
        helper.make_node("Conv", ["IMAGE", "conv_w", "conv_b"], ["conv"], kernel_shape=[3, 3], pads=[1, 1, 1, 1]),
        helper.make_node("Relu", ["conv"], ["relu"]),
        helper.make_node("GlobalAveragePool", ["relu"], ["pool"]),
        helper.make_node("Flatten", ["pool"], ["feats"], axis=1),
        helper.make_node("Gemm", ["feats", "fc_w", "fc_b"], ["logits"]),
        helper.make_node("Softmax", ["logits"], ["PROBABILITIES"], axis=1),
    ]
    graph = helper.make_graph(
        nodes,
        name,
        [helper.make_tensor_value_info("IMAGE", TensorProto.FLOAT, ["batch", *image])],
        [helper.make_tensor_value_info("PROBABILITIES", TensorProto.FLOAT, ["batch", classes])],
        initializer=[numpy_helper.from_array(v, k) for k, v in wts.items()],
    )
    model_dir = _version_dir(repo, name, version)
    _save_onnx(onnx, helper, graph, opset, model_dir / str(version) / "model.onnx")
    labels = [CIFAR10_LABELS[i] if i < len(CIFAR10_LABELS) else f"class_{i}" for i in range(classes)]
    (model_dir / "labels.txt").write_text("".join(f"{label}\n" for label in labels), encoding="utf-8")
    _write_config(
        model_dir,
        name,
        "onnxruntime",
        max_batch_size,
        # the layout named, as Triton's densenet_onnx example names it: tritonclient's image_client.py reads it
        inputs=[_io("IMAGE", "FP32", _dims(max_batch_size, image), format="FORMAT_NCHW")],
        outputs=[_io("PROBABILITIES", "FP32", _dims(max_batch_size, [classes]), label_filename="labels.txt")],
        dynamic_batching=max_batch_size > 0,
        comment=f"Tiny {classes}-class image classifier (generated by scripts/modelgen.py, seed {seed}).",
    )
    return model_dir


def onnx_all_types(
    repo: Path | str,
    name: str = "types_onnx",
    *,
    max_batch_size: int = 8,
    config: bool = True,
    version: int = 1,
    opset: int = 17,
) -> tuple[Path, list[str]]:
    """One ``Identity`` per type: ``IN_<TYPE> [batch, -1] -> OUT_<TYPE>`` for every type in ``TYPES``.

    Returns ``(model_dir, type_names)``; names are config types without ``TYPE_`` (``"STRING"`` is the protocol's
    ``"BYTES"``, see ``TYPES``).
    """
    import onnx
    from onnx import TensorProto, helper

    names = list(TYPES)
    nodes, ins, outs = [], [], []
    for t in names:
        onnx_type = getattr(TensorProto, TYPES[t][2])
        ins.append(helper.make_tensor_value_info(f"IN_{t}", onnx_type, ["batch", f"n_{t.lower()}"]))
        outs.append(helper.make_tensor_value_info(f"OUT_{t}", onnx_type, ["batch", f"n_{t.lower()}"]))
        nodes.append(helper.make_node("Identity", [f"IN_{t}"], [f"OUT_{t}"], name=f"identity_{t.lower()}"))
    graph = helper.make_graph(nodes, name, ins, outs)
    model_dir = _version_dir(repo, name, version)
    _save_onnx(onnx, helper, graph, opset, model_dir / str(version) / "model.onnx")
    if config:
        _write_config(
            model_dir,
            name,
            "onnxruntime",
            max_batch_size,
            inputs=[_io(f"IN_{t}", t, _dims(max_batch_size, [-1])) for t in names],
            outputs=[_io(f"OUT_{t}", t, _dims(max_batch_size, [-1])) for t in names],
            comment="Identity for each data type (generated by scripts/modelgen.py).",
        )
    return model_dir, names


def onnx_accumulator(repo: Path | str, name: str = "accumulator_onnx", *, max_batch_size: int = 4,
                     version: int = 1, opset: int = 17, strategy: str = "") -> Path:
    """A stateful sequence model: ``OUTPUT = ACC_IN + INPUT * READY``, ``ACC_OUT = OUTPUT``, FP32 ``[batch, 1]``.

    ``READY`` is a sequence control and ``ACC_IN``/``ACC_OUT`` an implicit state (zeros at START), so a
    sequence of requests answers its running sum; the config (``sequence_batching`` with ``strategy``) is
    written beside it. Empty slots (READY 0) add nothing.
    """
    import onnx
    from onnx import TensorProto, helper

    f = TensorProto.FLOAT
    ins = [helper.make_tensor_value_info(n, f, ["batch", 1]) for n in ("INPUT", "READY", "ACC_IN")]
    outs = [helper.make_tensor_value_info(n, f, ["batch", 1]) for n in ("OUTPUT", "ACC_OUT")]
    nodes = [helper.make_node("Mul", ["INPUT", "READY"], ["ADDED"]),
             helper.make_node("Add", ["ACC_IN", "ADDED"], ["OUTPUT"]),
             helper.make_node("Identity", ["OUTPUT"], ["ACC_OUT"])]
    model_dir = _version_dir(repo, name, version)
    _save_onnx(onnx, helper, helper.make_graph(nodes, name, ins, outs), opset, model_dir / str(version) / "model.onnx")
    _write_config(model_dir, name, "onnxruntime", max_batch_size, inputs=[_io("INPUT", "FP32", [1])],
                  outputs=[_io("OUTPUT", "FP32", [1])], comment="Running sum per sequence (generated by scripts/modelgen.py).")
    _append_sequence_block(model_dir, strategy)
    return model_dir


# ---------------------------------------------------------------------------------------------------------------
# TorchScript models


def torchscript_mlp(
    repo: Path | str,
    name: str = "mlp_torchscript",
    dims: Sequence[int] = (256, 1024, 16),
    max_batch_size: int = 64,
    *,
    dynamic_batching: bool = False,
    config: bool = True,
    seed: int = 0,
    version: int = 1,
) -> Path:
    """The same MLP as ``onnx_mlp`` (same weights for the same dims/seed) as TorchScript ``model.pt``;
    config ``backend: "pytorch"``, ``INPUT__0 [dims[0]]`` -> ``OUTPUT__0 [dims[-1]]``."""
    with _quiet():
        import torch

        dims = _check_dims(dims)
        mods: list[Any] = []
        for i, (w, b) in enumerate(mlp_weights(dims, seed)):
            lin = torch.nn.Linear(w.shape[0], w.shape[1])
            with torch.no_grad():
                lin.weight.copy_(torch.from_numpy(w.T.copy()))
                lin.bias.copy_(torch.from_numpy(b))
            mods.append(lin)
            if i < len(dims) - 2:
                mods.append(torch.nn.ReLU())
        model = torch.nn.Sequential(*mods).eval()
        model_dir = _version_dir(repo, name, version)
        _save_script(torch, model, model_dir / str(version) / "model.pt")
    if config:
        _write_config(
            model_dir,
            name,
            "pytorch",
            max_batch_size,
            inputs=[_io("INPUT__0", "FP32", _dims(max_batch_size, [dims[0]]))],
            outputs=[_io("OUTPUT__0", "FP32", _dims(max_batch_size, [dims[-1]]))],
            dynamic_batching=dynamic_batching and max_batch_size > 0,
            comment=f"MLP {' -> '.join(map(str, dims))} in TorchScript, same weights as the ONNX one (seed {seed}).",
        )
    return model_dir


def torchscript_two_inputs(repo: Path | str, name: str = "add_sub_torchscript", *, version: int = 1) -> Path:
    """TorchScript ``forward(self, a, b) -> (a + b, a - b)``; config binds by index: ``INPUT__0``/``INPUT__1``
    -> ``OUTPUT__0`` (sum) / ``OUTPUT__1`` (difference). FP32 dims [4], max_batch_size 0."""
    return _torchscript_add_sub(repo, name, version, "ab", ["INPUT__0", "INPUT__1"],
                                "forward(a, b) -> (a + b, a - b); inputs bound by INPUT__<index>.")


def torchscript_named_inputs(repo: Path | str, name: str = "add_sub_named_torchscript", *, version: int = 1) -> Path:
    """TorchScript ``forward(self, x, y) -> (x + y, x - y)`` whose config lists the inputs by forward-argument
    name in REVERSED order (``y`` then ``x``), so a server binding by position instead of name gets ``x - y``
    wrong. Outputs ``OUTPUT__0`` (sum) / ``OUTPUT__1`` (``x - y``). FP32 dims [4], max_batch_size 0."""
    return _torchscript_add_sub(repo, name, version, "xy", ["y", "x"],
                                "forward(x, y) -> (x + y, x - y); inputs bound by forward-argument name (listed reversed).")


def _torchscript_add_sub(repo: Path | str, name: str, version: int, args: str, config_inputs: list[str],
                         comment: str) -> Path:
    with _quiet():
        import torch

        model_dir = _version_dir(repo, name, version)
        _save_script(torch, _add_sub_module(torch, args), model_dir / str(version) / "model.pt")
    _write_config(
        model_dir,
        name,
        "pytorch",
        0,
        inputs=[_io(n, "FP32", [4]) for n in config_inputs],
        outputs=[_io("OUTPUT__0", "FP32", [4]), _io("OUTPUT__1", "FP32", [4])],
        comment=comment,
    )
    return model_dir


def torchscript_accumulator(repo: Path | str, name: str = "accumulator_torchscript", *, max_batch_size: int = 4,
                            version: int = 1, strategy: str = "") -> Path:
    """The TorchScript twin of :func:`onnx_accumulator`: ``forward(INPUT, READY, ACC_IN) -> (OUTPUT, ACC_OUT)``
    bound by argument name, ``READY`` a sequence control and ``ACC_IN``/``ACC_OUT`` an implicit state."""
    with _quiet():
        import torch

        class Accumulator(torch.nn.Module):
            def forward(self, INPUT, READY, ACC_IN):
                total = ACC_IN + INPUT * READY
                return total, total.clone()

        model_dir = _version_dir(repo, name, version)
        _save_script(torch, Accumulator().eval(), model_dir / str(version) / "model.pt")
    _write_config(model_dir, name, "pytorch", max_batch_size, inputs=[_io("INPUT", "FP32", [1])],
                  outputs=[_io("OUTPUT", "FP32", [1])], comment="Running sum per sequence (generated by scripts/modelgen.py).")
    _append_sequence_block(model_dir, strategy)
    return model_dir


def _append_sequence_block(model_dir: Path, strategy: str) -> None:
    with (model_dir / "config.pbtxt").open("a", encoding="utf-8") as out:
        out.write(f"""sequence_batching {{
  {strategy}
  control_input [{{ name: "READY" control [{{ kind: CONTROL_SEQUENCE_READY fp32_false_true: [0, 1] }}] }}]
  state [{{ input_name: "ACC_IN" output_name: "ACC_OUT" data_type: TYPE_FP32 dims: [1] }}]
}}
""")


# ---------------------------------------------------------------------------------------------------------------
# Python models

_PYTHON_IDENTITY = '''"""OUTPUT0 = INPUT0 for every request; each execute() first sleeps the config parameter
``execute_delay_ms`` (time.sleep releases the GIL, so instances overlap: a stand-in for I/O or a GPU call).
Generated by scripts/modelgen.py (python_identity)."""

import json
import time

import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def initialize(self, args):
        params = json.loads(args["model_config"]).get("parameters", {})
        self.delay_s = float(params.get("execute_delay_ms", {}).get("string_value", "0")) / 1000.0

    def execute(self, requests):
        if self.delay_s > 0:
            time.sleep(self.delay_s)  # once per execution: a batch costs what one request costs
        return [
            pb_utils.InferenceResponse(
                output_tensors=[pb_utils.Tensor("OUTPUT0", pb_utils.get_input_tensor_by_name(r, "INPUT0").as_numpy())]
            )
            for r in requests
        ]
'''


def python_identity(
    repo: Path | str,
    name: str = "identity_sleep",
    *,
    delay_ms: float = 5.0,
    dims: Sequence[int] = (16,),
    max_batch_size: int = 16,
    count: int = 1,
    dynamic_batching: bool = False,
    max_queue_delay_us: int = 0,
    preferred_batch_size: Sequence[int] = (),
    version: int = 1,
) -> Path:
    """Python-backend identity ``INPUT0 -> OUTPUT0`` (FP32 ``dims``) whose ``execute`` sleeps ``delay_ms`` once per
    call without holding the GIL (parameter ``execute_delay_ms``); ``count`` CPU instances, optional
    ``dynamic_batching`` block as in ``onnx_mlp_config``."""
    model_dir = _version_dir(repo, name, version)
    (model_dir / str(version) / "model.py").write_text(_PYTHON_IDENTITY, encoding="utf-8")
    _write_config(
        model_dir,
        name,
        "python",
        max_batch_size,
        inputs=[_io("INPUT0", "FP32", _dims(max_batch_size, dims))],
        outputs=[_io("OUTPUT0", "FP32", _dims(max_batch_size, dims))],
        dynamic_batching=dynamic_batching and max_batch_size > 0,
        max_queue_delay_us=max_queue_delay_us,
        preferred_batch_size=preferred_batch_size,
        count=count,
        parameters={"execute_delay_ms": f"{delay_ms:g}"},
        comment=f"Identity that sleeps {delay_ms:g} ms per execute (generated by scripts/modelgen.py).",
    )
    return model_dir


def ensemble_chain_config(name: str, steps: Sequence[str], *, max_batch_size: int = 4, dims: Sequence[int] = (4,)) -> str:
    """An ensemble ``IN -> steps[0] -> ... -> OUT`` of identity-shaped models (``INPUT0 -> OUTPUT0``, FP32
    ``dims``), as ``python_identity`` makes them."""
    shape = ", ".join(map(str, dims))
    tensors = ["IN", *(f"MID{i}" for i in range(len(steps) - 1)), "OUT"]
    wired = ",\n".join(f'  {{ model_name: "{m}", model_version: -1, input_map {{ key: "INPUT0" value: "{tensors[i]}" }} '
                        f'output_map {{ key: "OUTPUT0" value: "{tensors[i + 1]}" }} }}' for i, m in enumerate(steps))
    return (f'name: "{name}"\nplatform: "ensemble"\nmax_batch_size: {max_batch_size}\n'
            f'input [ {{ name: "IN", data_type: TYPE_FP32, dims: [ {shape} ] }} ]\n'
            f'output [ {{ name: "OUT", data_type: TYPE_FP32, dims: [ {shape} ] }} ]\n'
            f"ensemble_scheduling {{ step [\n{wired}\n] }}\n")


# ---------------------------------------------------------------------------------------------------------------
# helpers


@contextmanager
def _quiet():
    """torch.jit emits Deprecation/User warnings; the suite may run with warnings as errors."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        yield


def _add_sub_module(torch: Any, args: str) -> Any:
    if args == "ab":

        class AddSubAB(torch.nn.Module):
            def forward(self, a, b):
                return a + b, a - b

        return AddSubAB().eval()

    class AddSubXY(torch.nn.Module):
        def forward(self, x, y):
            return x + y, x - y

    return AddSubXY().eval()


def _save_script(torch: Any, module: Any, path: Path) -> None:
    scripted = torch.jit.script(module)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    torch.jit.save(scripted, str(tmp))
    tmp.replace(path)


def _save_onnx(onnx: Any, helper: Any, graph: Any, opset: int, path: Path) -> None:
    opsets = [helper.make_opsetid("", opset)]
    model = helper.make_model(graph, opset_imports=opsets, producer_name="triton_actor scripts/modelgen.py")
    # the newest IR version onnx knows may be newer than the installed onnxruntime reads
    model.ir_version = helper.find_min_ir_version_for(opsets)
    onnx.checker.check_model(model)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_bytes(model.SerializeToString())
    tmp.replace(path)


def _check_dims(dims: Sequence[int]) -> list[int]:
    out = [int(d) for d in dims]
    if len(out) < 2 or min(out) < 1:
        raise ValueError(f"dims must list at least an input and an output size, all >= 1; got {list(dims)}")
    return out


def _version_dir(repo: Path | str, name: str, version: int) -> Path:
    model_dir = Path(repo) / name
    (model_dir / str(version)).mkdir(parents=True, exist_ok=True)
    return model_dir


def _dims(max_batch_size: int, dims: Sequence[int]) -> list[int]:
    """Config dims: without batching (max_batch_size 0) the dynamic batch dim is part of the shape."""
    return list(dims) if max_batch_size > 0 else [-1, *dims]


def _io(name: str, dtype: str, dims: Sequence[int], label_filename: str = "", format: str = "") -> str:
    label = f', label_filename: "{label_filename}"' if label_filename else ""
    fmt = f", format: {format}" if format else ""
    return f'  {{ name: "{name}", data_type: TYPE_{dtype}{fmt}, dims: [ {", ".join(map(str, dims))} ]{label} }}'


def _write_config(
    model_dir: Path,
    name: str,
    backend: str,
    max_batch_size: int,
    *,
    inputs: list[str],
    outputs: list[str],
    dynamic_batching: bool = False,
    max_queue_delay_us: int = 0,
    preferred_batch_size: Sequence[int] = (),
    count: int = 1,
    parameters: dict[str, str] | None = None,
    comment: str = "",
) -> None:
    lines = [f"# {comment}"] if comment else []
    lines += [f'name: "{name}"', f'backend: "{backend}"', f"max_batch_size: {max_batch_size}"]
    lines += ["input [", ",\n".join(inputs), "]", "output [", ",\n".join(outputs), "]"]
    if dynamic_batching:
        fields = [f"preferred_batch_size: [ {', '.join(map(str, preferred_batch_size))} ]"] if preferred_batch_size else []
        fields += [f"max_queue_delay_microseconds: {int(max_queue_delay_us)}"] if max_queue_delay_us else []
        lines.append(f"dynamic_batching {{ {' '.join(fields)} }}" if fields else "dynamic_batching { }")
    lines.append(f"instance_group [ {{ count: {int(count)}, kind: KIND_CPU }} ]")
    for key, value in (parameters or {}).items():
        lines.append(f'parameters {{ key: "{key}" value: {{ string_value: "{value}" }} }}')
    (model_dir / "config.pbtxt").write_text("\n".join(lines) + "\n", encoding="utf-8")
