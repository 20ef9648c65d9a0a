"""The shim's ``tests/conftest.py``, in place of Triton's: the same fixtures, pointed at triton_actor.

Triton's conftest finds vLLM or TensorRT-LLM installed and starts its frontend over their models. Here
``backend`` is ``"vllm"`` (``tiny_lm`` follows the vLLM backend's contract: ``sampling_parameters`` JSON,
``logprobs`` JSON), ``model`` is ``tiny_lm`` and ``model_repository`` Triton's ``vllm_models`` path, which
``repositories.ours`` turns into one holding ``tiny_lm``; ``tokenizer_model`` is None (the model's own chat
template). ``fastapi_client_class_scope`` is a running server's ``TestClient`` (the stub's, over HTTP).
Async tests (``pytest.mark.asyncio``) run on one event loop, without the pytest-asyncio plugin.
"""

from __future__ import annotations

import asyncio
import inspect
from pathlib import Path

import pytest
from fastapi.testclient import TestClient
from tests.utils import OpenAIServer, setup_fastapi_app, setup_server

LOOP = asyncio.new_event_loop()


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", "openai: mark test to run with OpenAI server (subprocess)")
    config.addinivalue_line("markers", "fastapi: mark test to run with the FastAPI test client")
    config.addinivalue_line("markers", "asyncio: mark test as an asyncio test")


@pytest.hookimpl(tryfirst=True)
def pytest_pyfunc_call(pyfuncitem: pytest.Function) -> bool | None:
    if not inspect.iscoroutinefunction(pyfuncitem.obj):
        return None
    names = pyfuncitem._fixtureinfo.argnames
    LOOP.run_until_complete(pyfuncitem.obj(**{name: pyfuncitem.funcargs[name] for name in names}))
    return True


@pytest.fixture(scope="session")
def tool_call_parser() -> str:
    return "llama3"


@pytest.fixture(scope="session")
def backend() -> str:
    return "vllm"


@pytest.fixture(scope="session")
def model() -> str:
    return "tiny_lm"


@pytest.fixture(scope="session")
def model_repository() -> str:
    return str(Path(__file__).parent / "vllm_models")


@pytest.fixture(scope="session")
def tokenizer_model() -> None:
    return None


@pytest.fixture(scope="session")
def prompt() -> str:
    return "What is machine learning?"


@pytest.fixture(scope="session")
def messages(prompt: str) -> list[dict[str, str]]:
    return [{"role": "user", "content": prompt}]


@pytest.fixture(scope="session")
def input(prompt: str) -> str:
    return prompt


@pytest.fixture(scope="module")
def server(model_repository: str, tokenizer_model: str | None, backend: str, tool_call_parser: str):
    args = ["--model-repository", model_repository, "--backend", backend, "--tool-call-parser", tool_call_parser]
    if tokenizer_model:
        args += ["--tokenizer", tokenizer_model]
    with OpenAIServer(args) as openai_server:
        yield openai_server


@pytest.fixture(scope="class")
def fastapi_client_class_scope(model_repository: str, tokenizer_model: str | None, backend: str):
    server = setup_server(model_repository=model_repository)
    app = setup_fastapi_app(tokenizer=tokenizer_model, server=server, backend=backend)
    with TestClient(app) as test_client:
        yield test_client
    server.stop()
