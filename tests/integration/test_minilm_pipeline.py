"""The all-MiniLM-L6-v2 sentence-embedding example (``scripts/minilm.py``) through the real server.

One repository and one server per module (the export and the reference take seconds): each model on its own
(tokenize, both encoders, pool), the three chained by the client, then the ``minilm_ensemble`` and ``minilm_bls``
models end to end. Every embedding is checked against sentence-transformers run in this process on the same
packaged weights (in a process of its own). The server runs with ``--exit-on-error=false``: where the ensemble scheduler or BLS is missing,
their tests fail and the others still run.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Iterator
from pathlib import Path

import gevent
import numpy as np
import pytest
from gevent import subprocess  # cooperative: the reference runs while the export does
from tokenizers import Tokenizer

from scripts import minilm

from .clients import PROTOCOLS, Client
from .server import ROOT, ServerProcess

pytestmark = pytest.mark.timeout(180)

SENTENCES = [
    "A man is eating food.",
    "A man is eating a piece of bread.",
    "The new movie is awesome.",
    "Triton serves models over HTTP and gRPC.",
    "Überraschung: naïve café façades!",
    "token " * 300,  # longer than 256 tokens: truncated as sentence-transformers does
]
TOLERANCE = 1e-5  # measured: 1.6e-07 at most for both encoders (float32, the same math in another order)


_REFERENCE = """import json, sys
import numpy as np
from scripts import minilm
np.save(sys.argv[1], minilm.reference(json.loads(sys.argv[2])))
"""


@pytest.fixture(scope="module")
def _reference_job(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[subprocess.Popen, Path]]:
    """sentence-transformers in a plain interpreter of its own, started first so it runs beside the export:
    imported into this gevent-patched process, it left threads that held the test process at exit for minutes."""
    out = tmp_path_factory.mktemp("minilm_reference") / "reference.npy"
    job = subprocess.Popen([sys.executable, "-c", _REFERENCE, str(out), json.dumps(SENTENCES)], cwd=ROOT,
                           stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    yield job, out
    if job.poll() is None:
        job.kill()
        job.wait()


@pytest.fixture(scope="module")
def repo(tmp_path_factory: pytest.TempPathFactory, _reference_job: tuple[subprocess.Popen, Path]) -> Path:
    root = tmp_path_factory.mktemp("minilm")
    minilm.write_pipeline(root)
    return root


@pytest.fixture(scope="module")
def reference(_reference_job: tuple[subprocess.Popen, Path]) -> np.ndarray:
    job, out = _reference_job
    _, err = job.communicate(timeout=150)
    assert job.returncode == 0, err
    return np.load(out)


@pytest.fixture(scope="module")
def server(repo: Path) -> Iterator[ServerProcess]:
    srv = ServerProcess(repo, flags=("--exit-on-error=false",)).wait_ready(timeout=150)
    yield srv
    srv.stop()


@pytest.fixture(params=PROTOCOLS)
def client(request: pytest.FixtureRequest, server: ServerProcess) -> Iterator[Client]:
    c = Client(request.param, server)
    yield c
    c.close()


def _text(sentences: list[str]) -> np.ndarray:
    return np.array([[s.encode("utf-8")] for s in sentences], dtype=np.object_)


def _tokens(repo: Path, sentences: list[str]) -> tuple[np.ndarray, np.ndarray]:
    """What minilm_tokenize should answer, from the same tokenizer.json with the same settings."""
    tok = Tokenizer.from_file(str(repo / "minilm_tokenize" / "1" / "tokenizer.json"))
    tok.enable_truncation(max_length=256)
    tok.enable_padding(pad_id=0, pad_token="[PAD]", pad_to_multiple_of=16)
    encodings = tok.encode_batch(sentences)
    return (np.array([e.ids for e in encodings], dtype=np.int64),
            np.array([e.attention_mask for e in encodings], dtype=np.int64))


def _pool(tokens: np.ndarray, mask: np.ndarray) -> np.ndarray:
    """Mean pooling and normalisation, written out row by row (independent of the model's vectorised code)."""
    rows = []
    for t, m in zip(tokens.astype(np.float64), mask, strict=True):
        mean = t[m.astype(bool)].mean(axis=0)
        rows.append(mean / np.linalg.norm(mean))
    return np.array(rows)


def _infer(client: Client, model: str, inputs: dict[str, tuple[np.ndarray, str]], outputs: list[str]) -> list:
    result = client.infer(model, [client.input(n, a, dt) for n, (a, dt) in inputs.items()],
                          outputs=[client.output(n) for n in outputs])
    return [result.as_numpy(n) for n in outputs]


def _embed(client: Client, model: str, sentences: list[str]) -> np.ndarray:
    (embedding,) = _infer(client, model, {"TEXT": (_text(sentences), "BYTES")}, ["EMBEDDING"])
    return embedding


def test_tokenize(client: Client, repo: Path) -> None:
    ids, mask = _infer(client, "minilm_tokenize", {"TEXT": (_text(SENTENCES), "BYTES")},
                       ["INPUT_IDS", "ATTENTION_MASK"])
    want_ids, want_mask = _tokens(repo, SENTENCES)
    np.testing.assert_array_equal(ids, want_ids)
    np.testing.assert_array_equal(mask, want_mask)
    assert ids.shape == (len(SENTENCES), 256)  # the longest is truncated to 256, a multiple of 16
    assert ids[0, 0] == 101 and ids[0, mask[0].sum() - 1] == 102  # [CLS] ... [SEP]
    short, _ = _infer(client, "minilm_tokenize", {"TEXT": (_text(["hi"]), "BYTES")}, ["INPUT_IDS", "ATTENTION_MASK"])
    assert short.shape == (1, 16)  # padded up to the multiple, not to 256


@pytest.mark.parametrize("encoder", ["minilm_encoder_onnx", "minilm_encoder_torchscript"])
def test_encoder(client: Client, repo: Path, reference: np.ndarray, encoder: str) -> None:
    ids, mask = _tokens(repo, SENTENCES)
    (hidden,) = _infer(client, encoder, {"input_ids": (ids, "INT64"), "attention_mask": (mask, "INT64")},
                       ["last_hidden_state"])
    assert hidden.shape == (*ids.shape, 384) and hidden.dtype == np.float32
    np.testing.assert_allclose(_pool(hidden, mask), reference, atol=TOLERANCE)
    config = client.get_model_config(encoder)
    assert "dynamic_batching" in config and config["max_batch_size"] == 64


def test_encoder_batches_concurrent_requests(server: ServerProcess, repo: Path, reference: np.ndarray) -> None:
    """Concurrent one-sentence requests of one padded length go through the dynamic batcher; each answer is
    still its own sentence's. (HTTP: a tritonclient.grpc client used from greenlets hung the test process's
    exit in grpc's channel close.)"""
    client = Client("http", server)
    picks = [0, 1, 2, 3] * 6
    try:
        before = client.get_inference_statistics("minilm_encoder_onnx")["model_stats"][0]

        def one(i: int) -> np.ndarray:
            ids, mask = _tokens(repo, [SENTENCES[i]])
            (hidden,) = _infer(client, "minilm_encoder_onnx", {"input_ids": (ids, "INT64"),
                                                               "attention_mask": (mask, "INT64")}, ["last_hidden_state"])
            return _pool(hidden, mask)[0]

        jobs = [gevent.spawn(one, i) for i in picks]
        gevent.joinall(jobs, timeout=120, raise_error=True)
        for i, job in zip(picks, jobs, strict=True):
            np.testing.assert_allclose(job.value, reference[i], atol=TOLERANCE)
        after = client.get_inference_statistics("minilm_encoder_onnx")["model_stats"][0]
        assert int(after["inference_count"]) - int(before["inference_count"]) == len(picks)
    finally:
        client.close()


def test_pool(client: Client) -> None:
    rng = np.random.default_rng(0)
    tokens = rng.standard_normal((3, 16, 384)).astype(np.float32)
    mask = np.zeros((3, 16), dtype=np.int64)
    mask[0, :5], mask[1, :16], mask[2, :1] = 1, 1, 1
    (embedding,) = _infer(client, "minilm_pool", {"TOKEN_EMBEDDINGS": (tokens, "FP32"),
                                                  "ATTENTION_MASK": (mask, "INT64")}, ["EMBEDDING"])
    assert embedding.shape == (3, 384) and embedding.dtype == np.float32
    np.testing.assert_allclose(embedding, _pool(tokens, mask), atol=1e-6)


def test_three_models_chained_by_the_client(client: Client, reference: np.ndarray) -> None:
    ids, mask = _infer(client, "minilm_tokenize", {"TEXT": (_text(SENTENCES), "BYTES")},
                       ["INPUT_IDS", "ATTENTION_MASK"])
    (hidden,) = _infer(client, "minilm_encoder_onnx", {"input_ids": (ids, "INT64"), "attention_mask": (mask, "INT64")},
                       ["last_hidden_state"])
    (embedding,) = _infer(client, "minilm_pool", {"TOKEN_EMBEDDINGS": (hidden, "FP32"),
                                                  "ATTENTION_MASK": (mask, "INT64")}, ["EMBEDDING"])
    np.testing.assert_allclose(embedding, reference, atol=TOLERANCE)
    assert 0.7 < float(embedding[0] @ embedding[1]) < 0.8  # two sentences about eating: cosine 0.755
    assert float(embedding[0] @ embedding[2]) < 0.1  # eating vs a movie


@pytest.mark.parametrize("model", ["minilm_ensemble", "minilm_bls"])
def test_pipeline_end_to_end(client: Client, reference: np.ndarray, model: str) -> None:
    """Needs the ensemble scheduler (minilm_ensemble) and BLS (minilm_bls)."""
    embedding = _embed(client, model, SENTENCES)
    assert embedding.shape == (len(SENTENCES), 384) and embedding.dtype == np.float32
    np.testing.assert_allclose(embedding, reference, atol=TOLERANCE)
    single = _embed(client, model, [SENTENCES[1]])
    np.testing.assert_allclose(single[0], reference[1], atol=TOLERANCE)


def test_ensemble_and_bls_agree(client: Client) -> None:
    """The two ways to serve the pipeline give the same embeddings (the same models, the same order of math)."""
    np.testing.assert_allclose(_embed(client, "minilm_ensemble", SENTENCES), _embed(client, "minilm_bls", SENTENCES),
                               atol=1e-6)
