"""Log probabilities (protocol/openai_logprobs.py): the request's keys, the vLLM backend's JSON, OpenAI's shapes."""

from __future__ import annotations

import numpy as np
import orjson
import pytest

from triton_actor.errors import Code, TritonError
from triton_actor.inference import InferResponse
from triton_actor.protocol import openai, openai_logprobs, openai_models
from triton_actor.protocol.dtypes import BY_WIRE, BYTES

BOOL = BY_WIRE["BOOL"]


def _entry(sampled: tuple[str, float, int], *top: tuple[str, float, int]) -> dict[str, dict[str, object]]:
    """vLLM's object for one token: the sampled one first (token ids are made up from the text)."""
    return {str(ord(text[0])): {"logprob": lp, "rank": rank, "decoded_token": text} for text, lp, rank in (sampled, *top)}


def test_completion_and_chat_ask_as_tritons_frontend_asks_vllm() -> None:
    gen = openai.parse_completion(orjson.dumps({"model": "m", "prompt": "x", "logprobs": 3}))
    assert gen.logprobs == 3 and gen.sampling["logprobs"] == 3
    assert openai.parse_completion(orjson.dumps({"model": "m", "prompt": "x", "logprobs": 0})).logprobs is None
    chat = {"model": "m", "messages": [{"role": "user", "content": "x"}]}
    assert openai.parse_chat(orjson.dumps({**chat, "logprobs": True})).sampling["logprobs"] == 0
    assert openai.parse_chat(orjson.dumps({**chat, "logprobs": True, "top_logprobs": 4})).logprobs == 4
    assert openai.parse_chat(orjson.dumps({**chat, "logprobs": False})).logprobs is None
    for bad in ({"top_logprobs": 2}, {"logprobs": True, "top_logprobs": 21}, {"logprobs": 1}):
        with pytest.raises(TritonError) as e:
            openai.parse_chat(orjson.dumps({**chat, **bad}))
        assert e.value.code is Code.INVALID_ARG
    with pytest.raises(TritonError, match="`top_logprobs` can only be used when `logprobs` is True"):
        openai.parse_chat(orjson.dumps({**chat, "top_logprobs": 0}))


GEN_INPUTS = [("text_input", BYTES, (1,), False), ("return_logprobs", BOOL, (1,), True)]


def test_a_model_without_a_logprobs_output_is_refused_and_one_with_it_is_asked() -> None:
    gen = openai.parse_completion(orjson.dumps({"model": "m", "prompt": "x", "logprobs": 1}))
    plain = openai_models.generation_contract("m", GEN_INPUTS, [("text_output", BYTES, (-1,), False)], 0, True)
    with pytest.raises(TritonError) as e:
        openai_models.generation_request(plain, "m", "x", gen)
    assert e.value.code is Code.UNSUPPORTED and "declares no BYTES output 'logprobs'" in e.value.message
    outputs = [("text_output", BYTES, (-1,), False), ("logprobs", BYTES, (-1,), False)]
    giving = openai_models.generation_contract("m", GEN_INPUTS, outputs, 0, True)
    assert openai_models.generation_request(giving, "m", "x", gen).inputs["return_logprobs"].data.tolist() == [True]
    quiet = openai.parse_completion(orjson.dumps({"model": "m", "prompt": "x"}))
    assert openai_models.generation_request(giving, "m", "x", quiet).inputs["return_logprobs"].data.tolist() == [False]


def test_the_sampled_token_is_the_first_entry_and_the_top_ones_are_ranked() -> None:
    raw = orjson.dumps([_entry(("b", -2.0, 3), ("a", -0.5, 1), ("c", -1.0, 2))])
    response = InferResponse([("logprobs", np.array([raw], dtype=np.object_))])
    [token] = openai_models.logprobs_of(response, 2)
    assert (token.text, token.logprob, token.top) == ("b", -2.0, (("a", -0.5), ("c", -1.0)))
    assert openai_logprobs.parse(b"null", 2) is None
    assert openai_models.logprobs_of(InferResponse([]), 2) is None
    with pytest.raises(TritonError, match="not vLLM's list"):
        openai_logprobs.parse(b'[{"1": {"rank": 1}}]', 1)


def test_the_aligner_hands_tokens_out_with_the_text_they_cover() -> None:
    aligner = openai_logprobs.Aligner()
    aligner.add([openai_logprobs.Token(t, -1.0, ()) for t in ("ab", "c", "de")])
    assert aligner.take(1) == []  # "a" went out, "ab" not whole yet
    assert [(t.text, t.offset) for t in aligner.take(3)] == [("ab", 0), ("c", 2)]
    assert [t.text for t in aligner.rest(4)] == ["de"]  # a stop string cut through "de": it is the last
    aligner.add([openai_logprobs.Token("f", -1.0, ())])
    assert aligner.rest(5) == []  # "f" (offset 5) covers text that never went out


def test_openai_shapes() -> None:
    tokens = [openai_logprobs.Token("é", -0.25, (("é", -0.25), ("e", -2.0)), 0), openai_logprobs.Token("x", -1.0, (), 1)]
    assert openai_logprobs.completion(tokens) == {
        "text_offset": [0, 1], "token_logprobs": [-0.25, -1.0], "tokens": ["é", "x"],
        "top_logprobs": [{"é": -0.25, "e": -2.0}, {}]}
    chat = openai_logprobs.chat(tokens)
    assert chat["refusal"] is None and chat["content"][0] == {
        "token": "é", "logprob": -0.25, "bytes": [195, 169],
        "top_logprobs": [{"token": "é", "logprob": -0.25, "bytes": [195, 169]},
                         {"token": "e", "logprob": -2.0, "bytes": [101]}]}
    assert chat["content"][1]["top_logprobs"] == []
