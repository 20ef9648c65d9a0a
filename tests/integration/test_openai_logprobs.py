"""Log probabilities through the official ``openai`` client: ``tiny_lm`` gives them as the vLLM backend does.

``tiny_lm`` (``scripts/tinylm.py``) answers ``return_logprobs`` with vLLM's JSON; the server turns it into
OpenAI's completion and chat shapes, streamed and not. Two models of the contract give none: ``echo_llm``
declares no ``logprobs`` output (refused up front with a 400) and ``mute_llm`` declares one but never fills
it (its fault: a 500).
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from itertools import accumulate

import openai
import pytest

from scripts import tinylm

from .server import ServerProcess, add_model
from .test_openai import ECHO_LLM_CONFIG, ECHO_LLM_PY

pytestmark = pytest.mark.timeout(180)

GREEDY = {"temperature": 0, "max_tokens": 24}
PROMPT = "The server"
MESSAGES = [{"role": "user", "content": "What does the server do?"}]
MUTE_LLM_CONFIG = ECHO_LLM_CONFIG.replace(
    'output [ { name: "text_output", data_type: TYPE_STRING, dims: [ 1, -1 ] } ]',
    'output [ { name: "text_output", data_type: TYPE_STRING, dims: [ 1, -1 ] },\n'
    '         { name: "logprobs", data_type: TYPE_STRING, dims: [ 1 ] } ]')


@pytest.fixture(scope="module")
def client(tmp_path_factory: pytest.TempPathFactory) -> Iterator[openai.OpenAI]:
    repo = tmp_path_factory.mktemp("logprobs_repo")
    tinylm.write_model(repo, token_delay_ms=0)
    add_model(repo, "echo_llm", ECHO_LLM_CONFIG, ECHO_LLM_PY)
    add_model(repo, "mute_llm", MUTE_LLM_CONFIG, ECHO_LLM_PY)
    server = ServerProcess(repo).wait_ready(120)
    c = openai.OpenAI(base_url=f"http://{server.url}/v1", api_key="unused", max_retries=0, timeout=60)
    yield c
    c.close()
    server.stop()


def test_completion_logprobs_streamed_and_not_are_the_same(client: openai.OpenAI) -> None:
    whole = client.completions.create(model="tiny_lm", prompt=PROMPT, logprobs=3, **GREEDY).choices[0]
    lp = whole.logprobs
    assert "".join(lp.tokens) == whole.text and len(lp.tokens) == 24  # one character, one token
    assert lp.text_offset == [0, *accumulate(len(t) for t in lp.tokens[:-1])]
    assert all(len(top) == 3 for top in lp.top_logprobs)
    # greedy: the sampled token is the most likely one, and its log probability is the one in the top list
    assert all(max(top, key=top.get) == t and top[t] == v for t, v, top in zip(lp.tokens, lp.token_logprobs,
                                                                                lp.top_logprobs, strict=True))
    assert all(v <= 0 for v in lp.token_logprobs)
    tokens, offsets, values, tops = [], [], [], []
    for chunk in client.completions.create(model="tiny_lm", prompt=PROMPT, logprobs=3, stream=True, **GREEDY):
        if chunk.choices[0].logprobs:
            tokens += chunk.choices[0].logprobs.tokens
            offsets += chunk.choices[0].logprobs.text_offset
            values += chunk.choices[0].logprobs.token_logprobs
            tops += chunk.choices[0].logprobs.top_logprobs
    assert (tokens, offsets, values, tops) == (lp.tokens, lp.text_offset, lp.token_logprobs, lp.top_logprobs)


def test_chat_logprobs_streamed_and_not_are_the_same(client: openai.OpenAI) -> None:
    whole = client.chat.completions.create(model="tiny_lm", messages=MESSAGES, logprobs=True, top_logprobs=2,
                                           **GREEDY).choices[0]
    content = whole.logprobs.content
    assert "".join(t.token for t in content) == whole.message.content and len(content) == 24
    assert all(t.bytes == list(t.token.encode()) and len(t.top_logprobs) == 2 for t in content)
    assert all(t.top_logprobs[0].token == t.token and t.top_logprobs[0].logprob == t.logprob for t in content)
    streamed = []
    for chunk in client.chat.completions.create(model="tiny_lm", messages=MESSAGES, logprobs=True, top_logprobs=2,
                                                stream=True, **GREEDY):
        if chunk.choices and chunk.choices[0].logprobs:
            streamed += chunk.choices[0].logprobs.content
    assert [t.model_dump() for t in streamed] == [t.model_dump() for t in content]
    bare = client.chat.completions.create(model="tiny_lm", messages=MESSAGES, logprobs=True, **GREEDY).choices[0]
    assert [t.top_logprobs for t in bare.logprobs.content] == [[]] * 24  # no top_logprobs: none, as OpenAI
    assert client.chat.completions.create(model="tiny_lm", messages=MESSAGES, **GREEDY).choices[0].logprobs is None


def test_a_sampled_token_need_not_be_the_most_likely(client: openai.OpenAI) -> None:
    lp = client.completions.create(model="tiny_lm", prompt=PROMPT, logprobs=5, max_tokens=200, temperature=2,
                                   seed=3).choices[0].logprobs
    assert any(t not in top for t, top in zip(lp.tokens, lp.top_logprobs, strict=True)) or any(
        top[t] < max(top.values()) for t, top in zip(lp.tokens, lp.top_logprobs, strict=True))
    assert all(math.isclose(top[t], v) for t, v, top in zip(lp.tokens, lp.token_logprobs, lp.top_logprobs,
                                                            strict=True) if t in top)


def test_a_stop_string_cuts_the_logprobs_with_the_text(client: openai.OpenAI) -> None:
    text = client.completions.create(model="tiny_lm", prompt=PROMPT, **GREEDY).choices[0].text
    word = text.split()[2]
    for stream in (False, True):
        chunks = client.completions.create(model="tiny_lm", prompt=PROMPT, logprobs=1, stop=word, stream=stream,
                                           **GREEDY)
        choices = [c.choices[0] for c in chunks] if stream else [chunks.choices[0]]
        tokens = [t for c in choices if c.logprobs for t in c.logprobs.tokens]
        assert "".join(c.text for c in choices) == "".join(tokens) == text[:text.index(word)]


def test_a_model_that_gives_no_logprobs(client: openai.OpenAI) -> None:
    with pytest.raises(openai.BadRequestError) as e:
        client.completions.create(model="echo_llm", prompt="x", logprobs=1)
    assert "declares no BYTES output 'logprobs'" in e.value.message and e.value.body["param"] == "logprobs"
    with pytest.raises(openai.BadRequestError):
        client.chat.completions.create(model="echo_llm", messages=MESSAGES, logprobs=True)
    assert client.completions.create(model="echo_llm", prompt="x").choices[0].text == "x"  # without: served
    with pytest.raises(openai.InternalServerError) as e:
        client.completions.create(model="mute_llm", prompt="x", logprobs=1)
    assert "gave text without its 'logprobs' output" in e.value.message and e.value.body["type"] == "server_error"
    with pytest.raises(openai.BadRequestError) as e:
        client.chat.completions.create(model="tiny_lm", messages=MESSAGES, top_logprobs=2)
    assert "`top_logprobs` can only be used when `logprobs` is True" in e.value.message
    with pytest.raises(openai.BadRequestError) as e:
        client.completions.create(model="tiny_lm", prompt="x", logprobs=1, echo=True)
    assert e.value.body["param"] == "logprobs"
