"""The OpenAI-compatible API (docs/openai.md) through the official ``openai`` client against the real server.

One repository and one server for the module: the MiniLM embedding pipeline (``scripts/minilm.py``),
``tiny_lm`` (``scripts/tinylm.py``, the generation example) and a model that follows neither contract.
The server also listens on ``--openai-port``. Greedy decoding (temperature 0) makes ``tiny_lm`` give the
same text every time, so streamed and unstreamed answers can be compared exactly.
"""

from __future__ import annotations

import base64
import json
import re
import socket
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import gevent
import numpy as np
import openai
import pytest
import tritonclient.http as httpclient

from scripts import minilm, tinylm

from .server import IDENTITY_PY, ServerProcess, add_model

pytestmark = pytest.mark.timeout(180)

IDENTITY_CONFIG = """
name: "identity"
backend: "python"
max_batch_size: 8
input [ { name: "INPUT0", data_type: TYPE_INT32, dims: [ 1 ] } ]
output [ { name: "OUTPUT0", data_type: TYPE_INT32, dims: [ 1 ] } ]
"""
# shaped as the mock model of Triton's OpenAI frontend tests: [1, 1] dims, a required stream flag, KIND_MODEL
ECHO_LLM_CONFIG = """
backend: "python"
max_batch_size: 0
model_transaction_policy { decoupled: true }
input [
  { name: "text_input", data_type: TYPE_STRING, dims: [ 1, 1 ] },
  { name: "stream", data_type: TYPE_BOOL, dims: [ 1, 1 ] }
]
output [ { name: "text_output", data_type: TYPE_STRING, dims: [ 1, -1 ] } ]
instance_group [ { count: 1, kind: KIND_MODEL } ]
"""
ECHO_LLM_PY = """
import triton_python_backend_utils as pb_utils

class TritonPythonModel:
    def execute(self, requests):
        for request in requests:
            text = pb_utils.get_input_tensor_by_name(request, "text_input").as_numpy()
            stream = bool(pb_utils.get_input_tensor_by_name(request, "stream").as_numpy().reshape(-1)[0])
            sender = request.get_response_sender()
            for _ in range(3 if stream else 1):
                sender.send(pb_utils.InferenceResponse([pb_utils.Tensor("text_output", text)]))
            sender.send(flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)
        return None
"""
SENTENCES = ["A man is eating food.", "A man is eating a piece of bread.", "The new movie is awesome."]
GREEDY = {"temperature": 0, "max_tokens": 40}


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    repo = tmp_path_factory.mktemp("openai_repo")
    for name in ("minilm_tokenize", "minilm_encoder_onnx", "minilm_pool", "minilm_ensemble"):
        minilm.write_model(repo, name)
    tinylm.write_model(repo, token_delay_ms=2)
    add_model(repo, "identity", IDENTITY_CONFIG, IDENTITY_PY)
    add_model(repo, "echo_llm", ECHO_LLM_CONFIG, ECHO_LLM_PY)
    proc = ServerProcess(repo, flags=("--openai-port", "0")).wait_ready(120)
    yield proc
    proc.stop()


def _openai_port(server: ServerProcess) -> int:
    found = re.search(r"Started OpenAI-compatible HTTP service at [^ ]+:(\d+)", server.log())
    assert found, server.log()
    return int(found.group(1))


def _http(method: str, url: str, body: bytes | None = None) -> tuple[int, bytes]:
    try:
        with urllib.request.urlopen(urllib.request.Request(url, body, method=method), timeout=60) as reply:
            return reply.status, reply.read()
    except urllib.error.HTTPError as e:
        return e.code, e.read()


@pytest.fixture(scope="module")
def client(server: ServerProcess) -> Iterator[openai.OpenAI]:
    c = openai.OpenAI(base_url=f"http://{server.url}/v1", api_key="unused", max_retries=0, timeout=60)
    yield c
    c.close()


def test_models_lists_the_models_of_a_contract(client: openai.OpenAI) -> None:
    ids = {m.id for m in client.models.list()}
    assert {"minilm_ensemble", "tiny_lm"} <= ids
    assert "identity" not in ids and "minilm_tokenize" not in ids  # an INT64 output: no embedding
    model = client.models.retrieve("tiny_lm")
    assert (model.id, model.object, model.owned_by) == ("tiny_lm", "model", "Triton Inference Server")
    with pytest.raises(openai.NotFoundError):
        client.models.retrieve("identity")


def test_embeddings_match_the_v2_infer_of_the_same_model(client: openai.OpenAI, server: ServerProcess) -> None:
    floats = client.embeddings.create(model="minilm_ensemble", input=SENTENCES, encoding_format="float")
    assert [d.index for d in floats.data] == [0, 1, 2] and floats.model == "minilm_ensemble"
    got = np.array([d.embedding for d in floats.data], dtype=np.float32)
    triton = httpclient.InferenceServerClient(server.url)
    text = httpclient.InferInput("TEXT", [3, 1], "BYTES")
    text.set_data_from_numpy(np.array([[s.encode()] for s in SENTENCES], dtype=np.object_))
    answer = triton.infer("minilm_ensemble", [text])
    expected = answer.as_numpy("EMBEDDING")
    np.testing.assert_allclose(got, expected, atol=1e-6)
    assert floats.usage.prompt_tokens == floats.usage.total_tokens == answer.as_numpy("num_input_tokens").sum() > 0
    # the count Triton's own OpenAI test expects of this model (tokenized by vLLM) for one sentence
    one = client.embeddings.create(model="minilm_ensemble", input="The food was delicious and the waiter...")
    assert one.usage.prompt_tokens == 12
    triton.close()
    raw = client.embeddings.create(model="minilm_ensemble", input=SENTENCES, encoding_format="base64")
    decoded = np.array([np.frombuffer(base64.b64decode(d.embedding), dtype="<f4") for d in raw.data])
    np.testing.assert_array_equal(decoded, expected)
    default = client.embeddings.create(model="minilm_ensemble", input=SENTENCES[0])  # the client asks base64
    np.testing.assert_array_equal(np.array(default.data[0].embedding, dtype=np.float32), expected[0])


def test_embeddings_of_a_list_are_one_model_request(client: openai.OpenAI, server: ServerProcess) -> None:
    triton = httpclient.InferenceServerClient(server.url)
    before = triton.get_inference_statistics("minilm_ensemble")["model_stats"][0]["inference_count"]
    client.embeddings.create(model="minilm_ensemble", input=SENTENCES + SENTENCES, encoding_format="float")
    stats = triton.get_inference_statistics("minilm_ensemble")["model_stats"][0]
    triton.close()
    assert stats["inference_count"] - before == 6  # counted by the data plane: six rows
    assert stats["inference_stats"]["success"]["count"] >= 1


def test_completion_counts_and_stops(client: openai.OpenAI) -> None:
    full = client.completions.create(model="tiny_lm", prompt="The server", **GREEDY)
    choice = full.choices[0]
    assert full.object == "text_completion" and len(choice.text) == 40 and choice.finish_reason == "length"
    assert (full.usage.prompt_tokens, full.usage.completion_tokens, full.usage.total_tokens) == (10, 40, 50)
    again = client.completions.create(model="tiny_lm", prompt="The server", **GREEDY)
    assert again.choices[0].text == choice.text  # greedy: the same text
    word = choice.text.split()[2]
    stopped = client.completions.create(model="tiny_lm", prompt="The server", stop=[word], **GREEDY)
    assert stopped.choices[0].text == choice.text[:choice.text.index(word)]
    assert stopped.choices[0].finish_reason == "stop"
    echoed = client.completions.create(model="tiny_lm", prompt="The server", echo=True, **GREEDY)
    assert echoed.choices[0].text == "The server" + choice.text
    two = client.completions.create(model="tiny_lm", prompt="The server", n=2, **GREEDY)
    assert [c.index for c in two.choices] == [0, 1] and two.usage.completion_tokens == 80


def test_chat_streamed_and_not_say_the_same(client: openai.OpenAI) -> None:
    messages = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "What does the server do?"}]
    whole = client.chat.completions.create(model="tiny_lm", messages=messages, **GREEDY)
    assert whole.object == "chat.completion" and whole.choices[0].message.role == "assistant"
    text = whole.choices[0].message.content
    assert len(text) == 40 and whole.usage.completion_tokens == 40
    # the template of tiny_lm/tokenizer_config.json made the prompt: 'System: ...\nUser: ...\nAssistant: '
    assert whole.usage.prompt_tokens == len("System: Be brief.\nUser: What does the server do?\nAssistant: ")
    chunks = list(client.chat.completions.create(model="tiny_lm", messages=messages, stream=True,
                                                 stream_options={"include_usage": True}, **GREEDY))
    assert chunks[0].choices[0].delta.role == "assistant"
    assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices) == text
    assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] == "length"
    assert chunks[-1].choices == [] and chunks[-1].usage.completion_tokens == 40
    assert all(c.object == "chat.completion.chunk" and c.id == chunks[0].id for c in chunks)


def test_stream_of_two_choices(client: openai.OpenAI) -> None:
    stream = client.completions.create(model="tiny_lm", prompt="A client", n=2, stream=True, **GREEDY)
    texts = ["", ""]
    for chunk in stream:
        texts[chunk.choices[0].index] += chunk.choices[0].text
    assert texts[0] == texts[1] and len(texts[0]) == 40
    word = texts[0].split()[2]  # the server cuts a stream at a stop string that arrives over several chunks
    pieces = [c.choices[0] for c in client.completions.create(model="tiny_lm", prompt="A client", stop=word,
                                                               stream=True, **GREEDY)]
    assert "".join(p.text for p in pieces) == texts[0][:texts[0].index(word)]
    assert pieces[-1].finish_reason == "stop"


def test_errors_are_openai_error_objects(client: openai.OpenAI, server: ServerProcess) -> None:
    with pytest.raises(openai.NotFoundError) as e:
        client.completions.create(model="nope", prompt="x")
    assert e.value.code == "model_not_found"
    with pytest.raises(openai.BadRequestError) as e:
        client.embeddings.create(model="identity", input="x")
    assert "does not follow the OpenAI embeddings contract" in e.value.message and e.value.body["param"] == "model"
    with pytest.raises(openai.BadRequestError) as e:
        client.completions.create(model="minilm_ensemble", prompt="x")
    assert "generation contract" in e.value.message
    with pytest.raises(openai.BadRequestError) as e:
        client.completions.create(model="tiny_lm", prompt="x", temperature=5)
    assert e.value.body["param"] == "temperature" and e.value.body["type"] == "invalid_request_error"
    with pytest.raises(openai.BadRequestError):
        client.chat.completions.create(model="tiny_lm", messages=[], max_tokens=1)
    status, body = _http("POST", f"http://{server.url}/v1/completions", b"{not json")
    assert status == 400 and set(json.loads(body)["error"]) == {"message", "type", "param", "code"}


def test_the_openai_port_serves_the_same_routes_only(server: ServerProcess) -> None:
    port = _openai_port(server)
    c = openai.OpenAI(base_url=f"http://127.0.0.1:{port}/v1", api_key="unused", max_retries=0)
    answer = c.completions.create(model="tiny_lm", prompt="The server", **GREEDY)
    assert len(answer.choices[0].text) == 40
    c.close()
    assert _http("GET", f"http://127.0.0.1:{port}/v2/health/ready")[0] == 404
    assert _http("GET", f"http://127.0.0.1:{port}/health/ready")[0] == 200  # Triton's frontend's probe there
    assert _http("GET", f"http://{server.url}/health/ready")[0] == 404  # not a route of the HTTP port


def test_a_client_leaving_mid_stream_cancels_the_generation(client: openai.OpenAI, server: ServerProcess) -> None:
    stream = client.completions.create(model="tiny_lm", prompt="The server", max_tokens=1_000_000, stream=True)
    for _, _chunk in zip(range(3), stream, strict=False):
        pass
    stream.close()  # the connection goes: the model sees is_cancelled() and stops
    assert server.stderr.wait(lambda: "tiny_lm: request cancelled after" in server.log(), 60), server.log()


def test_a_model_of_tritons_frontend_contract_and_the_fallback_template(client: openai.OpenAI) -> None:
    one = client.completions.create(model="echo_llm", prompt="hello")
    assert one.choices[0].text == "hello" and one.usage.completion_tokens == 1  # no counts: one response
    streamed = "".join(c.choices[0].text for c in client.completions.create(model="echo_llm", prompt="hi",
                                                                            stream=True))
    assert streamed == "hihihi"
    chat = client.chat.completions.create(model="echo_llm", messages=[{"role": "user", "content": "hi"}])
    assert chat.choices[0].message.content == "<|user|>\nhi\n<|assistant|>\n"  # no tokenizer: the fallback


def test_a_client_leaving_before_the_answer_cancels_the_generation(server: ServerProcess) -> None:
    triton = httpclient.InferenceServerClient(server.url)

    def finished() -> int:
        stats = triton.get_inference_statistics("tiny_lm")["model_stats"][0]["inference_stats"]
        return stats["success"]["count"] + stats["fail"]["count"]

    before = finished()
    body = json.dumps({"model": "tiny_lm", "prompt": "The server", "max_tokens": 100_000_000}).encode()
    with socket.create_connection(("127.0.0.1", server.port)) as conn:  # minutes of work, then gone
        conn.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                     b"Content-Length: %d\r\n\r\n%s" % (len(body), body))
    deadline = time.monotonic() + 60
    while finished() == before:  # the request ends (cancelled) long before it could have generated that much
        assert time.monotonic() < deadline, server.log()
        gevent.sleep(0.05)  # polling the statistics under a deadline
    triton.close()


def test_restricted_api(tmp_path: Path, start_server) -> None:
    add_model(tmp_path, "identity", IDENTITY_CONFIG, IDENTITY_PY)
    tinylm.write_model(tmp_path)
    server = start_server(tmp_path, flags=("--openai-restricted-api", "inference", "infer-key", "secret",
                                           "--http-restricted-api", "model-repository:repo-key=r"))
    c = openai.OpenAI(base_url=f"http://{server.url}/v1", api_key="unused", max_retries=0)
    with pytest.raises(openai.PermissionDeniedError):  # --http-restricted-api covers /v1 too: Triton's 403
        c.models.list()
    assert [m.id for m in c.models.list(extra_headers={"repo-key": "r"})] == ["tiny_lm"]
    with pytest.raises(openai.AuthenticationError) as e:
        c.completions.create(model="tiny_lm", prompt="x", max_tokens=1)
    assert "expecting header 'infer-key'" in e.value.message
    ok = c.completions.create(model="tiny_lm", prompt="x", max_tokens=1, extra_headers={"infer-key": "secret"})
    assert len(ok.choices[0].text) == 1
    c.close()
