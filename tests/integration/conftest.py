"""Fixtures: a real server on the example repository (one per session) and a factory for ad-hoc ones."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
import tritonclient.http as httpclient
from gevent import subprocess  # the test process is gevent-patched (tests/conftest.py)

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


def _openssl(*args: str) -> None:
    subprocess.run(["openssl", *args], check=True, capture_output=True)


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A CA made here, a server certificate for localhost / 127.0.0.1 and a client certificate (gRPC's TLS
    tests, the Redis cache over TLS)."""
    d = tmp_path_factory.mktemp("pki")
    _openssl("req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "2", "-subj", "/CN=test-ca",
             "-keyout", str(d / "ca.key"), "-out", str(d / "ca.pem"))
    (d / "san.cnf").write_text("subjectAltName=DNS:localhost,IP:127.0.0.1\n")
    for name in ("server", "client"):
        _openssl("req", "-newkey", "rsa:2048", "-nodes", "-subj", f"/CN={name}", "-keyout", str(d / f"{name}.key"),
                 "-out", str(d / f"{name}.csr"))
        _openssl("x509", "-req", "-in", str(d / f"{name}.csr"), "-CA", str(d / "ca.pem"), "-CAkey", str(d / "ca.key"),
                 "-CAcreateserial", "-days", "2", "-extfile", str(d / "san.cnf"), "-out", str(d / f"{name}.pem"))
    return d
