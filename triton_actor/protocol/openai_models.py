"""Which repository models the OpenAI routes serve, and the tensors they exchange with them (sans-I/O).

**Generation** (``/v1/completions``, ``/v1/chat/completions``): Triton's OpenAI-frontend contract, so a
model written for it (triton-inference-server/vllm_backend, the frontend's ``mock_llm`` test model) works
unchanged: a BYTES input ``text_input`` and a BYTES output ``text_output``; when the model declares them,
``stream`` (BOOL; true only for a decoupled model asked to stream), ``sampling_parameters`` (BYTES, the
request's sampling keys as JSON), ``exclude_input_in_output`` (BOOL, ``not echo``),
``return_num_input_tokens`` / ``return_num_output_tokens`` (BOOL, true) and TensorRT-LLM's separate
``max_tokens``, ``temperature``, ``top_p``, ``seed``, ``frequency_penalty``, ``presence_penalty`` inputs
(in the model's own datatype). Any other required input and the model is not of the contract.
Outputs ``num_input_tokens`` / ``num_output_tokens`` (integers), when given, are the ``usage`` counts; a
BYTES output ``logprobs`` (the vLLM backend's JSON, :mod:`.openai_logprobs`) makes the model one that gives
log probabilities, asked for with ``return_logprobs`` (BOOL) and ``sampling_parameters.logprobs``.

**Embeddings** (``/v1/embeddings``): any model, not decoupled, with exactly one required input, of BYTES,
and exactly one floating-point output (the MiniLM ensemble: ``TEXT`` → ``EMBEDDING``); an integer output
``num_input_tokens``, when declared, is ``usage.prompt_tokens`` (summed over the texts). A list of texts
becomes one request of ``n`` rows (``max_batch_size`` rows at most each), so dynamic batching sees them.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import orjson

from ..errors import TritonError
from ..inference import InferInput, InferRequest, InferResponse, RequestedOutput
from . import openai_logprobs
from .dtypes import BYTES, DType
from .openai import Generation
from .openai_logprobs import Token

# (name, datatype, dims, optional) of one input or output of the model's config
Spec = tuple[str, DType, tuple[int, ...], bool]

GENERATION_DOC = "docs/openai.md#the-model-contracts"
_FLOATS = frozenset({"FP16", "FP32", "FP64"})
_INTEGERS = frozenset({"INT8", "INT16", "INT32", "INT64", "UINT8", "UINT16", "UINT32", "UINT64"})
_BOOL_INPUTS = ("stream", "exclude_input_in_output", "return_num_input_tokens", "return_num_output_tokens",
                "return_logprobs")
_SEPARATE = ("max_tokens", "temperature", "top_p", "seed", "frequency_penalty", "presence_penalty")
_KNOWN = frozenset({"text_input", "sampling_parameters", *_BOOL_INPUTS, *_SEPARATE})


@dataclass(frozen=True, slots=True)
class GenerationModel:
    inputs: tuple[Spec, ...]  # the contract's inputs the model declares
    max_batch_size: int
    decoupled: bool
    logprobs: bool = False  # whether it declares the BYTES output 'logprobs'

    @property
    def echoes(self) -> bool:
        """Whether the model itself puts the prompt before its text (else the server does, for ``echo``)."""
        return any(name == "exclude_input_in_output" for name, *_ in self.inputs)


@dataclass(frozen=True, slots=True)
class EmbeddingModel:
    input: Spec
    output: str
    max_batch_size: int
    tokens: str | None = None  # its integer output 'num_input_tokens', when it declares one: usage.prompt_tokens


def not_of_contract(model: str, kind: str, why: str) -> TritonError:
    return TritonError.invalid_arg(f"'model' '{model}' does not follow the OpenAI {kind} contract: {why} "
                                   f"(see {GENERATION_DOC})")


def generation_contract(model: str, inputs: list[Spec], outputs: list[Spec], max_batch_size: int,
                        decoupled: bool) -> GenerationModel:
    named = {spec[0]: spec for spec in inputs}
    if named.get("text_input", ("", None))[1] is not BYTES:
        raise not_of_contract(model, "generation", "it has no BYTES input 'text_input'")
    if not any(name == "text_output" and dtype is BYTES for name, dtype, *_ in outputs):
        raise not_of_contract(model, "generation", "it has no BYTES output 'text_output'")
    unknown = [name for name, _, _, optional in inputs if not optional and name not in _KNOWN]
    if unknown:
        raise not_of_contract(model, "generation", f"it requires input(s) {unknown} the API cannot fill")
    logprobs = any(name == "logprobs" and dtype is BYTES for name, dtype, *_ in outputs)
    return GenerationModel(tuple(s for s in inputs if s[0] in _KNOWN), max_batch_size, decoupled, logprobs)


def embedding_contract(model: str, inputs: list[Spec], outputs: list[Spec], max_batch_size: int,
                       decoupled: bool) -> EmbeddingModel:
    required = [spec for spec in inputs if not spec[3]]
    if len(required) != 1 or required[0][1] is not BYTES:
        raise not_of_contract(model, "embeddings", "it needs exactly one required input, of BYTES")
    floats = [spec[0] for spec in outputs if spec[1].wire in _FLOATS]
    if len(floats) != 1:
        raise not_of_contract(model, "embeddings", "it needs exactly one floating-point output")
    if decoupled:
        raise not_of_contract(model, "embeddings", "it is decoupled")
    tokens = next((name for name, dtype, *_ in outputs if name == "num_input_tokens" and dtype.wire in _INTEGERS), None)
    return EmbeddingModel(required[0], floats[0], max_batch_size, tokens)


def _shape(dims: tuple[int, ...], max_batch_size: int, rows: int = 1) -> tuple[int, ...]:
    shape = tuple(1 if d < 0 else d for d in dims)
    return (rows, *shape) if max_batch_size > 0 else shape


def _tensor(spec: Spec, max_batch_size: int, value: object) -> InferInput:
    name, dtype, dims, _ = spec
    shape = _shape(dims, max_batch_size)
    if dtype is BYTES:
        data = np.array([value if isinstance(value, bytes) else str(value).encode()], dtype=np.object_)
    elif dtype.numpy is None:
        raise TritonError.invalid_arg(f"input '{name}': {dtype.wire} cannot be filled from a request")
    else:
        data = np.array([value], dtype=dtype.numpy)
    return InferInput(name, dtype, shape, data.reshape(shape))


def generation_request(contract: GenerationModel, model: str, prompt: str, gen: Generation,
                       request_id: str = "") -> InferRequest:
    """The model request of one choice of ``gen`` (``prompt``: the rendered chat template for a chat)."""
    if gen.logprobs is not None and not contract.logprobs:
        raise TritonError.unsupported(f"'logprobs' are not given by model '{model}': it declares no BYTES output "
                                      f"'logprobs' (see {GENERATION_DOC})")
    values: dict[str, object] = {
        "text_input": prompt.encode(),
        "stream": gen.stream and contract.decoupled,
        "sampling_parameters": orjson.dumps(gen.sampling),
        "exclude_input_in_output": not gen.echo,
        "return_num_input_tokens": True,
        "return_num_output_tokens": True,
        "return_logprobs": gen.logprobs is not None,
    }
    values.update((key, gen.sampling[key]) for key in _SEPARATE if key in gen.sampling)
    tensors = {}
    for spec in contract.inputs:
        if spec[0] in values:
            tensors[spec[0]] = _tensor(spec, contract.max_batch_size, values[spec[0]])
        elif not spec[3]:
            raise TritonError.invalid_arg(f"'{spec[0]}' is required by model '{model}' and the request does not give it")
    return InferRequest(model, -1, request_id, tensors)


def text_of(response: InferResponse) -> str:
    for name, array in response.outputs:
        if name == "text_output":
            return "".join(x.decode("utf-8", "replace") if isinstance(x, bytes) else str(x) for x in array.reshape(-1))
    return ""


def tokens_of(response: InferResponse) -> tuple[int | None, int | None]:
    """``(num_input_tokens, num_output_tokens)`` as the model reported them (None: not reported)."""
    found: dict[str, int] = {}
    for name, array in response.outputs:
        if name in ("num_input_tokens", "num_output_tokens") and array.size and array.dtype.kind in "iu":
            found[name] = int(array.reshape(-1)[0])
    return found.get("num_input_tokens"), found.get("num_output_tokens")


def logprobs_of(response: InferResponse, top_n: int) -> list[Token] | None:
    """The tokens of the model's ``logprobs`` output (None: it gave none, or JSON ``null``)."""
    for name, array in response.outputs:
        if name == "logprobs" and array.size:
            return openai_logprobs.parse(array.reshape(-1)[0], top_n)
    return None


def embedding_requests(contract: EmbeddingModel, model: str, texts: tuple[str, ...]) -> list[tuple[InferRequest, int]]:
    """(request, its number of texts): one request per ``max_batch_size`` texts (a model without
    batching: one per text, or all in one when its first dimension is variable)."""
    name, dtype, dims, _ = contract.input
    mbs = contract.max_batch_size
    per = mbs if mbs > 0 else (len(texts) if dims and dims[0] < 0 else 1)
    wanted = (RequestedOutput(contract.output),) + ((RequestedOutput(contract.tokens),) if contract.tokens else ())
    requests = []
    for start in range(0, len(texts), per):
        part = texts[start:start + per]
        if mbs > 0:
            shape = _shape(dims, mbs, len(part))
        else:
            shape = (len(part), *_shape(dims[1:], 0)) if per > 1 else _shape(dims, 0)
        data = np.array([t.encode() for t in part], dtype=np.object_).reshape(shape)
        requests.append((InferRequest(model, -1, "", {name: InferInput(name, dtype, shape, data)}, wanted), len(part)))
    return requests


def embedding_tokens(contract: EmbeddingModel, response: InferResponse) -> int:
    """The input tokens of one response's texts, as the model counted them (0 when it does not)."""
    for name, array in response.outputs:
        if name == contract.tokens and array.dtype.kind in "iu":
            return int(array.sum())
    return 0


def embedding_rows(contract: EmbeddingModel, response: InferResponse, rows: int) -> np.ndarray:
    """The ``rows`` embeddings of one response, float32 (what the API's base64 carries)."""
    for name, array in response.outputs:
        if name == contract.output:
            if array.size % rows:
                raise TritonError.internal(f"output '{name}' of {array.size} values does not split into {rows} rows")
            return np.asarray(array, dtype=np.float32).reshape(rows, -1)
    raise TritonError.internal(f"the model gave no output '{contract.output}'")
