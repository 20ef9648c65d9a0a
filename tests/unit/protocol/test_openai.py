"""The OpenAI wire formats (protocol/openai*.py): requests checked, contracts, tensors, chunks, templates."""

from __future__ import annotations

import base64

import numpy as np
import orjson
import pytest

from triton_actor.errors import Code, TritonError
from triton_actor.inference import InferResponse
from triton_actor.protocol import openai, openai_chat, openai_models, openai_responses
from triton_actor.protocol.dtypes import BY_WIRE, BYTES

BOOL, FP32, INT32 = BY_WIRE["BOOL"], BY_WIRE["FP32"], BY_WIRE["INT32"]


def _body(**fields: object) -> bytes:
    return orjson.dumps(fields)


def test_completion_request_collects_sampling_parameters() -> None:
    gen = openai.parse_completion(_body(model="m", prompt="hi", temperature=0.5, seed=7, stop="\n", n=2,
                                        stream=True, stream_options={"include_usage": True}, user="u"))
    assert (gen.prompt, gen.n, gen.stream, gen.include_usage, gen.max_tokens, gen.stop) == ("hi", 2, True, True, 16,
                                                                                            ("\n",))
    assert gen.sampling == {"temperature": 0.5, "seed": 7, "max_tokens": 16, "stop": ["\n"]}


def test_chat_prefers_max_completion_tokens_and_joins_text_parts() -> None:
    gen = openai.parse_chat(_body(model="m", max_tokens=3, max_completion_tokens=5, messages=[
        {"role": "user", "content": [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}]}]))
    assert gen.max_tokens == 5 and gen.messages == (("user", "ab"),) and gen.chat


@pytest.mark.parametrize(("fields", "code", "param"), [
    ({"prompt": "x"}, Code.INVALID_ARG, "model"),
    ({"model": "m", "prompt": ""}, Code.INVALID_ARG, "prompt"),
    ({"model": "m", "prompt": [1, 2]}, Code.INVALID_ARG, "prompt"),
    ({"model": "m", "prompt": "x", "temperature": 3}, Code.INVALID_ARG, "temperature"),
    ({"model": "m", "prompt": "x", "max_tokens": 0}, Code.INVALID_ARG, "max_tokens"),
    ({"model": "m", "prompt": "x", "n": True}, Code.INVALID_ARG, "n"),
    ({"model": "m", "prompt": "x", "stop": ["a"] * 5}, Code.INVALID_ARG, "stop"),
    ({"model": "m", "prompt": "x", "stream_options": {"include_usage": True}}, Code.INVALID_ARG, "stream_options"),
    ({"model": "m", "prompt": "x", "logprobs": 6}, Code.INVALID_ARG, "logprobs"),
    ({"model": "m", "prompt": "x", "logprobs": 2, "echo": True}, Code.UNSUPPORTED, "logprobs"),
    ({"model": "m", "prompt": "x", "suffix": "y"}, Code.UNSUPPORTED, "suffix"),
    ({"model": "m", "prompt": "x", "min_tokens": -1}, Code.INVALID_ARG, "min_tokens"),
    ({"model": "m", "prompt": "x", "ignore_eos": 123}, Code.INVALID_ARG, "ignore_eos"),
])
def test_bad_completions_name_their_parameter(fields: dict[str, object], code: Code, param: str) -> None:
    with pytest.raises(TritonError) as e:
        openai.parse_completion(orjson.dumps(fields))
    assert e.value.code is code
    body = orjson.loads(openai.error_body(e.value))
    error = body["error"]
    assert error["param"] == param and error["type"] == "invalid_request_error"
    assert body["detail"] == error["message"]  # Triton's frontend's field, for its clients


def test_embeddings_request() -> None:
    assert openai.parse_embeddings(_body(model="m", input="a")).texts == ("a",)
    assert openai.parse_embeddings(_body(model="m", input=["a", "b"], encoding_format="base64")).base64
    for bad in ({"model": "m", "input": []}, {"model": "m", "input": [[1, 2]]}, {"model": "m", "input": "a",
                                                                                   "encoding_format": "int8"}):
        with pytest.raises(TritonError):
            openai.parse_embeddings(orjson.dumps(bad))


def test_an_embeddings_request_holds_a_bounded_number_of_texts() -> None:
    """Each text of a model without batching is its own queued request: the list is bounded as OpenAI's is."""
    most = openai.MAX_EMBEDDING_INPUTS
    assert len(openai.parse_embeddings(_body(model="m", input=["a"] * most)).texts) == most
    with pytest.raises(TritonError) as info:
        openai.parse_embeddings(_body(model="m", input=["a"] * (most + 1)))
    assert info.value.code == Code.INVALID_ARG and f"at most {most} strings" in info.value.message


def test_stop_scanner_finds_a_stop_split_over_pieces() -> None:
    scanner = openai_responses.StopScanner(("END",))
    sent = [scanner.feed(p) for p in ("abc E", "N", "D tail")]
    assert "".join(sent) == "abc " and scanner.stopped and scanner.feed("more") == ""
    free = openai_responses.StopScanner(("xyz",))
    assert free.feed("ab") == "" and free.feed("cd") == "ab" and free.flush() == "cd"
    assert openai_responses.StopScanner(()).feed("all") == "all"


GEN_INPUTS = [("text_input", BYTES, (1,), False), ("stream", BOOL, (1,), True),
              ("sampling_parameters", BYTES, (1,), True), ("max_tokens", INT32, (1,), True)]
GEN_OUTPUTS = [("text_output", BYTES, (-1,), False)]


def test_generation_contract_and_request() -> None:
    contract = openai_models.generation_contract("m", GEN_INPUTS, GEN_OUTPUTS, 4, True)
    gen = openai.parse_completion(_body(model="m", prompt="hi", max_tokens=3, stream=True))
    request = openai_models.generation_request(contract, "m", "hi", gen)
    assert request.inputs["text_input"].data.tolist() == [[b"hi"]]  # a batching model: a batch of one
    assert request.inputs["stream"].data.tolist() == [[True]]
    assert request.inputs["max_tokens"].data.dtype == np.int32 and request.inputs["max_tokens"].data[0, 0] == 3
    assert orjson.loads(request.inputs["sampling_parameters"].data[0, 0]) == {"max_tokens": 3}
    assert not contract.echoes
    with pytest.raises(TritonError, match="generation contract"):
        openai_models.generation_contract("m", [*GEN_INPUTS, ("lora", BYTES, (1,), False)], GEN_OUTPUTS, 0, True)
    with pytest.raises(TritonError, match="text_output"):
        openai_models.generation_contract("m", GEN_INPUTS, [("text_output", FP32, (1,), False)], 0, True)


def test_embedding_requests_split_at_max_batch_size_and_rows_come_back() -> None:
    contract = openai_models.embedding_contract("e", [("TEXT", BYTES, (1,), False)],
                                                [("EMBEDDING", FP32, (4,), False)], 2, False)
    parts = openai_models.embedding_requests(contract, "e", ("a", "b", "c"))
    assert [(r.inputs["TEXT"].shape, n) for r, n in parts] == [((2, 1), 2), ((1, 1), 1)]
    rows = openai_models.embedding_rows(contract, InferResponse([("EMBEDDING", np.ones((2, 4), np.float32))]), 2)
    body = orjson.loads(openai_responses.embeddings("e", rows, as_base64=True))
    assert np.frombuffer(base64.b64decode(body["data"][1]["embedding"]), "<f4").tolist() == [1.0] * 4
    with pytest.raises(TritonError, match="floating-point"):
        openai_models.embedding_contract("e", [("TEXT", BYTES, (1,), False)], [("IDS", INT32, (4,), False)], 2, False)


def test_stream_chunks_have_openai_shapes() -> None:
    chunks = openai_responses.Chunks("id1", 5, "m", chat=True, include_usage=True)
    first = orjson.loads(chunks.start(0)[len(b"data: "):])
    assert first["choices"][0]["delta"] == {"role": "assistant", "content": ""} and first["usage"] is None
    last = orjson.loads(chunks.text(0, "", "stop")[len(b"data: "):])
    assert last["choices"][0]["delta"] == {} and last["choices"][0]["finish_reason"] == "stop"
    done = orjson.loads(chunks.usage({"prompt_tokens": 1})[len(b"data: "):])
    assert done["choices"] == [] and done["usage"] == {"prompt_tokens": 1}
    assert openai_responses.DONE == b"data: [DONE]\n\n"


def test_chat_templates() -> None:
    messages = (("system", "s"), ("user", "u"))
    fallback = openai_chat.compile_template(openai_chat.FALLBACK_TEMPLATE)
    assert openai_chat.render(fallback, messages, {}) == "<|system|>\ns\n<|user|>\nu\n<|assistant|>\n"
    source, specials = openai_chat.template_of({"chat_template": [{"name": "default", "template": "{{ bos_token }}"
                                                                   "{{ messages | length }}"}],
                                                "bos_token": {"content": "<s>"}})
    assert openai_chat.render(openai_chat.compile_template(source), messages, specials) == "<s>2"
    refusing = openai_chat.compile_template("{{ raise_exception('no system role') }}")
    with pytest.raises(TritonError, match="no system role"):
        openai_chat.render(refusing, messages, {})
