"""Log probabilities: the model's ``logprobs`` output in, OpenAI's two shapes out (sans-I/O).

The model side is the vLLM backend's (``src/utils/request.py`` in triton-inference-server/vllm_backend),
which Triton's OpenAI frontend reads: a BYTES output ``logprobs`` holding, per response, JSON ``null`` or a
list with one object per token generated since the last response, ``{token_id: {"logprob", "rank",
"decoded_token"}}``: the sampled token first (vLLM builds the object in that order), then the ``N`` most
likely ones, ``N`` being ``sampling_parameters.logprobs``. Triton's frontend takes the entry of the lowest
rank as the sampled token, which is another token whenever sampling did not pick the most likely one; the
first entry is the one vLLM sampled.

The client side is OpenAI's: a completion's ``{"text_offset", "token_logprobs", "tokens", "top_logprobs"}``
(offsets into the choice's text, which a stream continues across chunks) and a chat's ``{"content": [{"token",
"logprob", "bytes", "top_logprobs": [{"token", "logprob", "bytes"}]}], "refusal": null}``.

The server cuts a choice's text at stop strings and holds back what could start one
(:class:`.openai_responses.StopScanner`), so :class:`Aligner` hands out a token's entry once the text it
covers went out, and drops the tokens of text that never does.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass
from typing import Any

import orjson

from ..errors import TritonError


@dataclass(frozen=True, slots=True)
class Token:
    text: str
    logprob: float
    top: tuple[tuple[str, float], ...]  # the most likely tokens, most likely first
    offset: int = 0  # where the token starts in the choice's text


def parse(raw: bytes | str, top_n: int) -> list[Token] | None:
    """The tokens of one ``logprobs`` output value (None for JSON ``null``), ``top_n`` alternatives each."""
    try:
        entries = orjson.loads(raw)
        if entries is None:
            return None
        return [_token(entry, top_n) for entry in entries]
    except (orjson.JSONDecodeError, TypeError, KeyError, ValueError, AttributeError, StopIteration) as e:
        raise TritonError.internal(f"the model's 'logprobs' output is not vLLM's list of "
                                   f"{{token_id: {{logprob, rank, decoded_token}}}}: {e!r}") from None


def _token(entry: dict[str, Any], top_n: int) -> Token:
    sampled = next(iter(entry.values()))
    ranked = sorted(entry.values(), key=lambda v: v.get("rank") or 1 << 62)[:top_n]
    return Token(str(sampled["decoded_token"]), float(sampled["logprob"]),
                 tuple((str(v["decoded_token"]), float(v["logprob"])) for v in ranked))


class Aligner:
    """One choice's tokens, handed out as the text they cover is sent. Offsets count the characters of the
    tokens' own texts, as vLLM's and Triton's frontends count them."""

    __slots__ = ("_pending", "_end")

    def __init__(self) -> None:
        self._pending: deque[Token] = deque()
        self._end = 0  # where the next token starts

    def add(self, tokens: list[Token]) -> None:
        for token in tokens:
            self._pending.append(Token(token.text, token.logprob, token.top, self._end))
            self._end += len(token.text)

    def take(self, sent: int) -> list[Token]:
        """The tokens that end within the first ``sent`` characters of the choice's text."""
        out = []
        while self._pending and self._pending[0].offset + len(self._pending[0].text) <= sent:
            out.append(self._pending.popleft())
        return out

    def rest(self, sent: int) -> list[Token]:
        """Once the choice ended with ``sent`` characters: the tokens that start in them (the one a stop
        string cut through included); the others covered text the client never gets."""
        out = [token for token in self._pending if token.offset < sent]
        self._pending.clear()
        return out


def completion(tokens: list[Token]) -> dict[str, Any]:
    """A completion choice's (or chunk's) ``logprobs``."""
    return {"text_offset": [t.offset for t in tokens], "token_logprobs": [t.logprob for t in tokens],
            "tokens": [t.text for t in tokens], "top_logprobs": [dict(t.top) for t in tokens]}


def chat(tokens: list[Token]) -> dict[str, Any]:
    """A chat choice's (or chunk's) ``logprobs``."""
    return {"content": [{"token": t.text, "logprob": t.logprob, "bytes": list(t.text.encode()),
                         "top_logprobs": [{"token": text, "logprob": lp, "bytes": list(text.encode())}
                                          for text, lp in t.top]} for t in tokens],
            "refusal": None}
