"""OpenAI's API requests (https://platform.openai.com/docs/api-reference), sans-I/O: bodies in, checked values out.

``/v1/completions``, ``/v1/chat/completions`` and ``/v1/embeddings`` bodies become frozen values; a bad
body raises :class:`TritonError` (INVALID_ARG, or UNSUPPORTED for a feature we refuse), whose message
starts with ``'<param>'`` when one parameter is at fault (:func:`error_body` reads it back into the
OpenAI error's ``param``). What is checked and refused follows Triton's OpenAI frontend
(``python/openai/openai_frontend/engine/triton_engine.py``, ``_validate_*_request``) except that ``n``
is served (one model request per choice). Sampling keys the model should see are collected as Triton's
frontend collects them for vLLM's ``sampling_parameters`` JSON: every key the request set, less those
the server itself consumes (:data:`_NOT_SAMPLING`). The model contracts and the tensors built from a
request are in :mod:`.openai_models`; responses, chunks and the stop-string scan in
:mod:`.openai_responses`.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

import orjson

from ..errors import Code, TritonError
from .payloads import json_object

DEFAULT_MAX_TOKENS = 16  # Triton's --default-max-tokens default
MAX_N = 16  # choices per request: each is one model request
MAX_STOPS = 4  # OpenAI's limit on stop sequences
MAX_LOGPROBS = 5  # alternatives per token of a completion (OpenAI's and Triton's schema: logprobs <= 5)
MAX_TOP_LOGPROBS = 20  # alternatives per token of a chat (top_logprobs <= 20)
# texts in one embeddings request, OpenAI's own limit: a model without batching makes one model request
# per text, all queued at once, so a 64 MiB body of one-character strings would queue millions of them
MAX_EMBEDDING_INPUTS = 2048

# keys the server consumes or refuses; the rest of a request's keys reach the model in sampling_parameters
_NOT_SAMPLING = frozenset({
    "model", "stream", "messages", "prompt", "echo", "store", "metadata", "response_format", "service_tier",
    "stream_options", "tools", "tool_choice", "parallel_tool_calls", "user", "function_call", "functions",
    "suffix", "max_completion_tokens", "max_tokens", "logprobs", "top_logprobs", "best_of", "n", "stop",
    "logit_bias", "modalities", "audio", "prediction", "reasoning_effort",
})
ROLES = frozenset({"system", "developer", "user", "assistant", "tool"})


@dataclass(frozen=True, slots=True)
class Generation:
    """A completion or chat request: ``prompt`` for a completion, ``messages`` (role, text) for a chat."""

    model: str
    prompt: str
    messages: tuple[tuple[str, str], ...]
    stream: bool
    include_usage: bool
    n: int
    echo: bool
    max_tokens: int
    stop: tuple[str, ...]
    sampling: dict[str, Any]  # what the model's sampling_parameters JSON holds (max_tokens and stop included)
    logprobs: int | None = None  # alternatives per token the client wants with log probabilities; None: none

    @property
    def chat(self) -> bool:
        return bool(self.messages)


@dataclass(frozen=True, slots=True)
class Embeddings:
    model: str
    texts: tuple[str, ...]
    base64: bool


def invalid(param: str, message: str) -> TritonError:
    return TritonError.invalid_arg(f"'{param}' {message}")


def _body(body: bytes) -> dict[str, Any]:
    return json_object(body, "the request body")


def _model(data: dict[str, Any]) -> str:
    model = data.get("model")
    if not isinstance(model, str) or not model:
        raise invalid("model", "is required: the name of a model of the repository")
    return model


def _number(data: dict[str, Any], key: str, low: float, high: float, integer: bool = False) -> Any:
    value = data.get(key)
    if value is None:
        return None
    kinds = (int,) if integer else (int, float)
    if isinstance(value, bool) or not isinstance(value, kinds) or not low <= value <= high:
        bounds = f"from {low} to {high}" if integer else f"from {low:g} to {high:g}"  # 2147483648, not 2.14748e+09
        raise invalid(key, f"must be {'an integer' if integer else 'a number'} {bounds}, got {value!r}")
    return value


def _flag(data: dict[str, Any], key: str) -> bool:
    value = data.get(key)
    if value is None:
        return False
    if not isinstance(value, bool):
        raise invalid(key, f"must be a boolean, got {value!r}")
    return value


def _stops(value: Any) -> tuple[str, ...]:
    if value is None:
        return ()
    stops = [value] if isinstance(value, str) else value
    if not isinstance(stops, list) or len(stops) > MAX_STOPS or not all(isinstance(s, str) and s for s in stops):
        raise invalid("stop", f"must be a non-empty string or a list of up to {MAX_STOPS} of them")
    return tuple(stops)


def _refuse_unsupported(data: dict[str, Any]) -> None:
    if data.get("logit_bias") is not None:
        raise TritonError.unsupported("'logit_bias' is not supported")
    if data.get("tools") or data.get("tool_choice") not in (None, "none") or data.get("functions"):
        raise TritonError.unsupported("'tools' are not supported: tool calling needs a tool-call parser")
    if data.get("suffix") is not None:
        raise TritonError.unsupported("'suffix' is not currently supported")
    if (_number(data, "best_of", 0, MAX_N, integer=True) or 1) > 1:
        raise TritonError.unsupported("'best_of' above 1 is not supported")


def _completion_logprobs(data: dict[str, Any]) -> int | None:
    """A completion's ``logprobs``: how many alternatives per token; 0 or none asks for nothing (as Triton's)."""
    return _number(data, "logprobs", 0, MAX_LOGPROBS, integer=True) or None


def _chat_logprobs(data: dict[str, Any]) -> int | None:
    """A chat's ``logprobs`` (a flag) and ``top_logprobs`` (alternatives per token, 0 when not given)."""
    top = _number(data, "top_logprobs", 0, MAX_TOP_LOGPROBS, integer=True)
    if not _flag(data, "logprobs"):
        if top is not None:  # Triton's frontend's words, which its tests look for
            raise invalid("top_logprobs", "refused: `top_logprobs` can only be used when `logprobs` is True")
        return None
    return top or 0


def _generation(data: dict[str, Any], prompt: str, messages: tuple[tuple[str, str], ...],
                max_tokens_keys: tuple[str, ...], default_max_tokens: int) -> Generation:
    model = _model(data)
    _refuse_unsupported(data)
    logprobs = _chat_logprobs(data) if messages else _completion_logprobs(data)
    if logprobs is not None and data.get("echo"):
        raise TritonError.unsupported("'logprobs' with 'echo' is not supported: the model contract gives no "
                                      "log probabilities of the prompt")
    stream = _flag(data, "stream")
    options = data.get("stream_options")
    if options is not None and not stream:  # Triton's frontend's words, which its tests look for
        raise invalid("stream_options", "refused: `stream_options` can only be used when `stream` is True")
    if options is not None and not isinstance(options, dict):
        raise invalid("stream_options", "must be an object")
    include_usage = options is not None and options.get("include_usage") is True
    max_tokens = default_max_tokens
    for key in max_tokens_keys:  # the first one given wins (max_completion_tokens over the deprecated max_tokens)
        given = _number(data, key, 1, 1 << 31, integer=True)
        if given is not None:
            max_tokens = given
            break
    _number(data, "temperature", 0, 2)
    _number(data, "top_p", 0, 1)
    _number(data, "seed", -(1 << 63), (1 << 64) - 1, integer=True)
    for key in ("frequency_penalty", "presence_penalty"):
        _number(data, key, -2, 2)
    _number(data, "min_tokens", 0, 1 << 31, integer=True)  # vLLM's extensions that Triton's schema checks
    _flag(data, "ignore_eos")
    n = _number(data, "n", 1, MAX_N, integer=True) or 1
    stop = _stops(data.get("stop"))
    sampling = {k: v for k, v in data.items() if k not in _NOT_SAMPLING and v is not None}
    sampling["max_tokens"] = max_tokens
    if stop:
        sampling["stop"] = list(stop)
    if logprobs is not None:  # vLLM's key: the alternatives per token (the model also gets return_logprobs)
        sampling["logprobs"] = logprobs
    return Generation(model, prompt, messages, stream, include_usage, n, _flag(data, "echo"), max_tokens, stop,
                      sampling, logprobs)


def parse_completion(body: bytes, default_max_tokens: int = DEFAULT_MAX_TOKENS) -> Generation:
    data = _body(body)
    prompt = data.get("prompt")
    if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], str):
        prompt = prompt[0]  # the client's list form of one prompt
    if not isinstance(prompt, str):
        raise invalid("prompt", "must be one string (a list of prompts or of token ids is not supported)")
    if not prompt:
        raise invalid("prompt", "must be non-empty")
    return _generation(data, prompt, (), ("max_tokens",), default_max_tokens)


def parse_chat(body: bytes, default_max_tokens: int = DEFAULT_MAX_TOKENS) -> Generation:
    data = _body(body)
    if data.get("echo") is not None:
        raise invalid("echo", "is a completions parameter")
    messages = data.get("messages")
    if not isinstance(messages, list) or not messages:
        raise invalid("messages", "must be a non-empty list of messages")
    parsed = tuple(_message(i, m) for i, m in enumerate(messages))
    return _generation(data, "", parsed, ("max_completion_tokens", "max_tokens"), default_max_tokens)


def _message(index: int, message: Any) -> tuple[str, str]:
    where = f"messages[{index}]"
    if not isinstance(message, dict) or message.get("role") not in ROLES:
        raise invalid("messages", f"{where} must be an object whose 'role' is one of {sorted(ROLES)}")
    content = message.get("content")
    if content is None or isinstance(content, str):
        return message["role"], content or ""
    if isinstance(content, list):  # content parts: text only, as Triton's frontend
        texts = []
        for part in content:
            if not isinstance(part, dict) or part.get("type") != "text" or not isinstance(part.get("text"), str):
                raise TritonError.unsupported(f"'messages' {where}: only text content parts are supported")
            texts.append(part["text"])
        return message["role"], "".join(texts)
    raise invalid("messages", f"{where}.content must be a string or a list of text parts")


def parse_embeddings(body: bytes) -> Embeddings:
    data = _body(body)
    model = _model(data)
    given = data.get("input")
    texts = [given] if isinstance(given, str) else given
    if not isinstance(texts, list) or not texts:
        raise invalid("input", "must be a string or a non-empty list of strings")
    if len(texts) > MAX_EMBEDDING_INPUTS:
        raise invalid("input", f"must hold at most {MAX_EMBEDDING_INPUTS} strings, got {len(texts)}")
    if not all(isinstance(t, str) for t in texts):
        raise TritonError.unsupported("'input' of token ids is not supported: send text")
    if any(not t for t in texts):
        raise invalid("input", "must not contain empty strings")
    encoding = data.get("encoding_format", "float") or "float"
    if encoding not in ("float", "base64"):
        raise invalid("encoding_format", f"must be 'float' or 'base64', got {encoding!r}")
    if data.get("dimensions") is not None:
        raise TritonError.unsupported("'dimensions' is not supported: the model's output has the size it has")
    return Embeddings(model, tuple(texts), encoding == "base64")


# -- errors ------------------------------------------------------------------------------------------
_PARAM = re.compile(r"'([A-Za-z_]+)' ")
_TYPES = {Code.INVALID_ARG: "invalid_request_error", Code.UNSUPPORTED: "invalid_request_error",
          Code.NOT_FOUND: "invalid_request_error", Code.CANCELLED: "invalid_request_error",
          Code.UNAVAILABLE: "service_unavailable_error"}


def error_body(error: TritonError, code: str | None = None, param: str | None = None) -> bytes:
    """OpenAI's error object, ``{"error": {"message", "type", "param", "code"}}``, and the message again as
    ``detail``: Triton's OpenAI frontend answers FastAPI's ``{"detail": message}``, which its clients read
    (and its test suite does); OpenAI's clients read ``error`` and ignore the rest."""
    match = _PARAM.match(error.message)
    return orjson.dumps({"error": {
        "message": error.message,
        "type": _TYPES.get(error.code, "server_error"),
        "param": param or (match.group(1) if match else None),
        "code": code,
    }, "detail": error.message})


def auth_error_body(message: str) -> bytes:
    """Triton's OpenAI frontend's refusal of a request without its restricted API's header (401)."""
    return orjson.dumps({"error": {"message": message, "type": "authentication_error", "param": None,
                                   "code": "invalid_auth"}})
