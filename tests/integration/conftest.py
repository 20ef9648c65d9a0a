"""Fixtures: a real server on the example repository (one per session) and a factory for ad-hoc ones."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
import tritonclient.http as httpclient

from .clients import PROTOCOLS, Client
from .server import ROOT, ServerProcess


@pytest.fixture(scope="session")
def example_server() -> Iterator[ServerProcess]:
    server = ServerProcess(ROOT / "model_repository", flags=("--allow-client-shm=true",)).wait_ready()
    yield server
    server.stop()


@pytest.fixture
def client(example_server: ServerProcess) -> Iterator[httpclient.InferenceServerClient]:
    c = httpclient.InferenceServerClient(example_server.url, concurrency=8)
    yield c
    c.close()


@pytest.fixture(params=PROTOCOLS)
def any_client(request: pytest.FixtureRequest, example_server: ServerProcess) -> Iterator[Client]:
    """The example server through ``tritonclient.http`` and then ``tritonclient.grpc``."""
    c = Client(request.param, example_server)
    yield c
    c.close()


@pytest.fixture
def grpc_client(example_server: ServerProcess) -> Iterator[Client]:
    c = Client("grpc", example_server)
    yield c
    c.close()


@pytest.fixture
def start_server() -> Iterator[Callable[..., ServerProcess]]:
    started: list[ServerProcess] = []

    def start(*repos: Path, flags: tuple[str, ...] = (), wait: bool = True, open_files: int | None = None) -> ServerProcess:
        server = ServerProcess(*repos, flags=flags, open_files=open_files)
        started.append(server)
        return server.wait_ready() if wait else server

    yield start
    for server in started:
        server.stop()
