"""OpenAI's response bodies and stream chunks, and what one choice of a generation has said so far (sans-I/O).

A stream is Server-Sent Events: ``data: <chunk JSON>\\n\\n`` per chunk, then ``data: [DONE]\\n\\n``. A chat
stream's first chunk of each choice carries ``delta.role``; with ``stream_options.include_usage`` every
chunk has ``"usage": null`` and one last chunk with no choices has the counts (OpenAI's shape; Triton's
frontend leaves the nulls out). ``id``, ``created`` and the clock are the caller's.
"""

from __future__ import annotations

import base64
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import orjson

DONE = b"data: [DONE]\n\n"


def sse(payload: bytes) -> bytes:
    return b"data: " + payload + b"\n\n"


class StopScanner:
    """Cuts a choice's text at the first stop string, across the pieces it arrives in: holds back the
    last ``len(longest stop) - 1`` characters, which could be the start of one."""

    __slots__ = ("_stops", "_hold", "_held", "stopped")

    def __init__(self, stops: tuple[str, ...]) -> None:
        self._stops = stops
        self._hold = max((len(s) for s in stops), default=1) - 1
        self._held = ""
        self.stopped = False

    def feed(self, text: str) -> str:
        """What may be sent of ``text`` now (nothing once a stop string was seen)."""
        if self.stopped:
            return ""
        buf = self._held + text
        cuts = [i for i in (buf.find(s) for s in self._stops) if i >= 0]
        if cuts:
            self.stopped, self._held = True, ""
            return buf[:min(cuts)]
        keep = min(self._hold, len(buf))
        self._held = buf[len(buf) - keep:] if keep else ""
        return buf[:len(buf) - keep]

    def flush(self) -> str:
        """The held-back text, once no more comes."""
        out, self._held = self._held, ""
        return out


@dataclass(slots=True)
class Choice:
    """One choice's counts: tokens as the model reports them (``num_*_tokens``), else one a response."""

    max_tokens: int
    prompt_tokens: int | None = None
    reported: int | None = None  # num_output_tokens summed over the responses
    responses: int = 0  # responses with text
    text: list[str] = field(default_factory=list)

    def count(self, text: str, tokens: tuple[int | None, int | None]) -> None:
        prompt, out = tokens
        if self.prompt_tokens is None and prompt is not None:
            self.prompt_tokens = prompt
        if out is not None:
            self.reported = (self.reported or 0) + out
        if text:
            self.responses += 1

    @property
    def completion_tokens(self) -> int:
        return self.responses if self.reported is None else self.reported

    def finish_reason(self, stopped: bool) -> str:
        return "length" if not stopped and self.completion_tokens >= self.max_tokens else "stop"


def usage(choices: list[Choice]) -> dict[str, int]:
    prompt = choices[0].prompt_tokens or 0 if choices else 0
    completion = sum(c.completion_tokens for c in choices)
    return {"prompt_tokens": prompt, "completion_tokens": completion, "total_tokens": prompt + completion}


def _head(rid: str, kind: str, created: int, model: str) -> dict[str, Any]:
    return {"id": rid, "object": kind, "created": created, "model": model, "system_fingerprint": None}


# one choice of an answer: (text, finish_reason, logprobs in OpenAI's shape or None)
Answer = tuple[str, str, dict[str, Any] | None]


def completion(rid: str, created: int, model: str, texts: list[Answer], counts: dict[str, int]) -> bytes:
    body = _head(rid, "text_completion", created, model)
    body["choices"] = [{"index": i, "text": text, "logprobs": logprobs, "finish_reason": reason}
                       for i, (text, reason, logprobs) in enumerate(texts)]
    body["usage"] = counts
    return orjson.dumps(body)


def chat(rid: str, created: int, model: str, texts: list[Answer], counts: dict[str, int]) -> bytes:
    body = _head(rid, "chat.completion", created, model)
    body["choices"] = [{"index": i, "message": {"role": "assistant", "content": text, "refusal": None},
                        "logprobs": logprobs, "finish_reason": reason}
                       for i, (text, reason, logprobs) in enumerate(texts)]
    body["usage"] = counts
    return orjson.dumps(body)


@dataclass(frozen=True, slots=True)
class Chunks:
    """The chunk encoder of one streamed request."""

    rid: str
    created: int
    model: str
    chat: bool
    include_usage: bool

    def _chunk(self, choices: list[dict[str, Any]]) -> bytes:
        body = _head(self.rid, "chat.completion.chunk" if self.chat else "text_completion", self.created, self.model)
        body["choices"] = choices
        if self.include_usage:
            body["usage"] = None
        return sse(orjson.dumps(body))

    def start(self, index: int) -> bytes:
        """A chat choice's first chunk (its role); nothing for a completion."""
        if not self.chat:
            return b""
        return self._chunk([{"index": index, "delta": {"role": "assistant", "content": ""}, "logprobs": None,
                             "finish_reason": None}])

    def text(self, index: int, text: str, finish_reason: str | None = None,
             logprobs: dict[str, Any] | None = None) -> bytes:
        if self.chat:
            choice = {"index": index, "delta": {"content": text} if text or finish_reason is None else {},
                      "logprobs": logprobs, "finish_reason": finish_reason}
        else:
            choice = {"index": index, "text": text, "logprobs": logprobs, "finish_reason": finish_reason}
        return self._chunk([choice])

    def usage(self, counts: dict[str, int]) -> bytes:
        body = _head(self.rid, "chat.completion.chunk" if self.chat else "text_completion", self.created, self.model)
        body["choices"] = []
        body["usage"] = counts
        return sse(orjson.dumps(body))


def error_chunk(error_body: bytes) -> bytes:
    """An error met mid-stream (the status line went out already): the error object as one event."""
    return sse(error_body)


def embeddings(model: str, rows: np.ndarray, as_base64: bool, prompt_tokens: int = 0) -> bytes:
    """``rows``: float32 [n, dims]; base64 is the little-endian float32 bytes of each row (OpenAI's)."""
    if as_base64:
        values: list[Any] = [base64.b64encode(row.astype("<f4").tobytes()).decode() for row in rows]
    else:
        values = list(rows)
    data = [{"object": "embedding", "index": i, "embedding": v} for i, v in enumerate(values)]
    return orjson.dumps({"object": "list", "data": data, "model": model,
                         "usage": {"prompt_tokens": prompt_tokens, "total_tokens": prompt_tokens}},
                        option=orjson.OPT_SERIALIZE_NUMPY)


def models(entries: list[tuple[str, int]]) -> bytes:
    return orjson.dumps({"object": "list", "data": [model(name, created) for name, created in entries]})


def model_json(name: str, created: int) -> bytes:
    return orjson.dumps(model(name, created))


def model(name: str, created: int) -> dict[str, Any]:
    return {"id": name, "object": "model", "created": created, "owned_by": "Triton Inference Server"}
