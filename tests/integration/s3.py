"""A real S3-protocol server for the tests: moto's server mode, started on a free port, and a bucket client."""

from __future__ import annotations

import os
import socket
import sys
from collections.abc import Iterator
from pathlib import Path

import boto3
import pytest
from gevent import subprocess

from .model_control import wait_for

MOTO_SERVER = Path(sys.executable).with_name("moto_server")
CREDENTIALS = {"AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing", "AWS_DEFAULT_REGION": "us-east-1"}


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _answers(port: int) -> bool:
    try:
        socket.create_connection(("127.0.0.1", port), timeout=1).close()
        return True
    except OSError:
        return False


class Bucket:
    """One bucket on the moto server, with helpers to mirror a local model folder into it."""

    def __init__(self, endpoint: str, name: str) -> None:
        self.endpoint = endpoint
        self.name = name
        self.client = boto3.session.Session().client("s3", endpoint_url=endpoint, **_lower(CREDENTIALS))
        self.client.create_bucket(Bucket=name)

    def put(self, key: str, data: bytes | str) -> None:
        self.client.put_object(Bucket=self.name, Key=key, Body=data.encode() if isinstance(data, str) else data)

    def upload(self, folder: Path, prefix: str) -> None:
        """Every file under ``folder`` to ``prefix/<relative path>``."""
        for path in sorted(folder.rglob("*")):
            if path.is_file():
                self.put(f"{prefix}/{path.relative_to(folder).as_posix()}", path.read_bytes())

    def delete_prefix(self, prefix: str) -> None:
        for obj in self.client.list_objects_v2(Bucket=self.name, Prefix=prefix).get("Contents", ()):
            self.client.delete_object(Bucket=self.name, Key=obj["Key"])


def _lower(creds: dict[str, str]) -> dict[str, str]:
    return {"aws_access_key_id": creds["AWS_ACCESS_KEY_ID"], "aws_secret_access_key": creds["AWS_SECRET_ACCESS_KEY"],
            "region_name": creds["AWS_DEFAULT_REGION"]}


@pytest.fixture
def moto_endpoint(monkeypatch: pytest.MonkeyPatch) -> Iterator[str]:
    """``moto_server`` on a free port; the credentials are in this process's environment (servers inherit)."""
    if not MOTO_SERVER.exists():
        pytest.skip("moto[server] is not installed")
    port = _free_port()
    proc = subprocess.Popen([str(MOTO_SERVER), "-H", "127.0.0.1", "-p", str(port)],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=dict(os.environ, **CREDENTIALS))
    try:
        wait_for(lambda: proc.poll() is not None or _answers(port), 30, "moto_server to listen")
        assert proc.poll() is None, "moto_server exited"
        for key, value in CREDENTIALS.items():
            monkeypatch.setenv(key, value)
        monkeypatch.delenv("AWS_ENDPOINT_URL", raising=False)
        monkeypatch.delenv("AWS_PROFILE", raising=False)
        yield f"http://127.0.0.1:{port}"
    finally:
        proc.terminate()
        proc.wait(10)
