"""The shim's ``tests/utils.py``: what Triton's OpenAI tests import from it, pointed at triton_actor.

Triton's ``OpenAIServer(args)`` starts its FastAPI frontend on port 9000; this one starts ``python -m
triton_actor`` with the arguments that mean something here (``--model-repository``, ``--openai-restricted-api``,
``--default-max-tokens``, ``--tokenizer`` when it is a folder: a hub id would be a download) and
``--openai-port 0``, and answers on the port the server bound. A server that exits at startup raises with its
log, as Triton's does. ``setup_server`` / ``setup_fastapi_app`` (the in-process server and FastAPI app of
Triton's tests) start the same process, and the "app" is its base URL, which the shim's ``TestClient`` calls.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import threading
from pathlib import Path

import openai

from tests import repositories

ROOT = Path(__file__).resolve().parents[1]  # the shim's work folder; triton_actor comes from PYTHONPATH
PORT = re.compile(r"Started OpenAI-compatible HTTP service at [^ ]+:(\d+)")
HTTP_PORT = re.compile(r"Started HTTPService at [^ ]+:(\d+)")
KEPT = {"--model-repository": 1, "--openai-restricted-api": 3, "--default-max-tokens": 1, "--tokenizer": 1}
FLAGS_OF_TRITONS_FRONTEND = {"--backend", "--tool-call-parser", "--model-control-mode", "--load-model",
                             "--lora-separator", "--openai-port", "--host", "--uvicorn-log-level"}


def _translate(cli_args: list[str]) -> list[str]:
    out, i = [], 0
    while i < len(cli_args):
        flag = cli_args[i]
        if flag in KEPT:
            values = cli_args[i + 1:i + 1 + KEPT[flag]]
            if flag == "--model-repository":
                values = [repositories.ours(values[0])]
            if flag != "--tokenizer" or (values and values[0] and Path(values[0]).is_dir()):
                out += [flag, *values]
            i += 1 + KEPT[flag]
        elif flag in FLAGS_OF_TRITONS_FRONTEND:
            i += 2
        else:  # a switch of Triton's frontend (--enable-kserve-frontends, ...): nothing here
            i += 1
    return out


class OpenAIServer:
    API_KEY = "EMPTY"
    START_TIMEOUT = 240

    def __init__(self, cli_args: list[str], *, env_dict: dict[str, str] | None = None) -> None:
        self.host = "127.0.0.1"
        self.port = self.http_port = 0
        self.stderr_lines: list[str] = []
        args = [sys.executable, "-m", "triton_actor", *_translate(cli_args), "--openai-port", "0",
                "--http-port", "0", "--http-address", "127.0.0.1", "--allow-grpc", "false",
                "--metrics-port", "0", "--metrics-address", "127.0.0.1"]
        self._ready = threading.Event()
        self.proc = subprocess.Popen(args, env=dict(os.environ, **(env_dict or {})), stdout=subprocess.DEVNULL,
                                     stderr=subprocess.PIPE, text=True)
        threading.Thread(target=self._read_stderr, daemon=True).start()
        if not self._ready.wait(self.START_TIMEOUT) or self.proc.poll() is not None or not self.port:
            self.proc.kill()
            error = RuntimeError("Server exited unexpectedly or failed to start.\nStderr output:\n"
                                 + "\n".join(self.stderr_lines))
            error.stderr_lines = list(self.stderr_lines)
            raise error

    def _read_stderr(self) -> None:
        for line in iter(self.proc.stderr.readline, ""):
            self.stderr_lines.append(line.rstrip("\n"))
            sys.stderr.write(line)
            for pattern, attr in ((PORT, "port"), (HTTP_PORT, "http_port")):
                found = pattern.search(line)
                if found:
                    setattr(self, attr, int(found.group(1)))
            if "server is ready" in line:
                self._ready.set()
        self._ready.set()  # exited: the waiter reads the log

    def __enter__(self) -> OpenAIServer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def stop(self) -> None:
        self.proc.terminate()
        try:
            self.proc.wait(30)
        except subprocess.TimeoutExpired:
            self.proc.kill()

    @property
    def url_root(self) -> str:
        return f"http://{self.host}:{self.port}"

    def url_for(self, *parts: str) -> str:
        return self.url_root + "/" + "/".join(parts)

    def get_client(self) -> openai.OpenAI:
        return openai.OpenAI(base_url=self.url_for("v1"), api_key=self.API_KEY)

    def get_async_client(self) -> openai.AsyncOpenAI:
        return openai.AsyncOpenAI(base_url=self.url_for("v1"), api_key=self.API_KEY)


class _Repository:
    """What ``setup_server`` gives back: the repository, served once ``setup_fastapi_app`` says how."""

    def __init__(self, model_repository: str) -> None:
        self.model_repository = model_repository
        self.servers: list[OpenAIServer] = []

    def stop(self) -> None:
        for server in self.servers:
            server.stop()


def setup_server(model_repository: str, model_control_mode: object = None, load_models: object = None) -> _Repository:
    return _Repository(model_repository)


def setup_fastapi_app(tokenizer: str | None, server: _Repository, backend: str, default_max_tokens: int = 16,
                      tool_call_parser: str | None = None, max_tool_call_parse_bytes: int | None = None) -> str:
    args = ["--model-repository", server.model_repository, "--default-max-tokens", str(default_max_tokens)]
    if tokenizer:
        args += ["--tokenizer", tokenizer]
    started = OpenAIServer(args)
    server.servers.append(started)
    return started.url_root
