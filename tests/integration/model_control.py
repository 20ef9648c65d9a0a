"""Helpers for the model-control tests: a model whose answer tells which version (and edition) served."""

from __future__ import annotations

import json
import time
import urllib.request
from collections.abc import Callable
from pathlib import Path

import gevent
import gevent.event
import numpy as np
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException

from .server import IDENTITY_CONFIG, add_model

# OUTPUT0 = 100 * version + EDITION for every element: the client sees which code served it.
TAGGED_PY = """
import numpy as np
import triton_python_backend_utils as pb_utils

EDITION = {edition}

class TritonPythonModel:
    def initialize(self, args):
        self.tag = 100.0 * int(args["model_version"]) + EDITION

    def execute(self, requests):
        out = []
        for r in requests:
            x = pb_utils.get_input_tensor_by_name(r, "INPUT0").as_numpy()
            out.append(pb_utils.InferenceResponse([pb_utils.Tensor("OUTPUT0", np.full(x.shape, self.tag, np.float32))]))
        return out
"""

def tagged(edition: int) -> str:
    return TAGGED_PY.format(edition=edition)


def add_tagged(repo: Path, name: str, versions: tuple[str, ...] = ("1",), edition: int = 0,
               config: str = IDENTITY_CONFIG) -> Path:
    return add_model(repo, name, config, tagged(edition), versions)


def ask(client: httpclient.InferenceServerClient, model: str, version: str = "") -> float:
    """One request; the tag of the version that answered."""
    i = httpclient.InferInput("INPUT0", [2], "FP32")
    i.set_data_from_numpy(np.zeros(2, np.float32))
    return float(client.infer(model, [i], model_version=version).as_numpy("OUTPUT0")[0])


def answers(client: httpclient.InferenceServerClient, model: str, expected: float) -> bool:
    """The model answers ``expected`` now (False while it is loading, gone or failing)."""
    try:
        return ask(client, model) == expected
    except InferenceServerException:
        return False


def gone(client: httpclient.InferenceServerClient, model: str) -> bool:
    """The server no longer knows the model (404)."""
    try:
        ask(client, model)
    except InferenceServerException as e:
        return e.status() == "404"
    return False


def index(client: httpclient.InferenceServerClient) -> dict[tuple[str, str], dict]:
    return {(e["name"], e.get("version", "")): e for e in client.get_model_repository_index()}


def wait_for(condition: Callable[[], bool], timeout: float = 30.0, what: str = "condition") -> float:
    """Re-check ``condition`` every 20 ms (the server offers no event for it); seconds it took."""
    start = time.monotonic()
    while not condition():
        if time.monotonic() - start > timeout:
            raise AssertionError(f"timed out after {timeout} s waiting for {what}")
        gevent.sleep(0.02)  # the wait-for helper's poll
    return time.monotonic() - start


def live_status(url: str) -> dict:
    """``GET /status.json`` (plane/live_status.py): per model version its state, the requests ``queued``
    and ``running`` in its scheduler now, and its counts."""
    with urllib.request.urlopen(f"http://{url}/status.json", timeout=30) as answer:  # gevent-patched socket
        return json.loads(answer.read())


def version_status(url: str, model: str, version: int = 1) -> dict:
    """``model`` ``version``'s row of ``/status.json`` ({} while it has none)."""
    return next((v for v in live_status(url)["versions"] if v["name"] == model and v["version"] == version), {})


def wait_queued(url: str, model: str, queued: int, version: int = 1, timeout: float = 30.0) -> None:
    """Wait until ``queued`` requests of ``model`` wait in its scheduler's queue (what the server shows)."""
    wait_for(lambda: version_status(url, model, version).get("queued") == queued, timeout,
             f"{queued} request(s) of '{model}' in its queue")


class Hammer:
    """``clients`` greenlets, each with its own client, asking ``model`` back to back until :meth:`stop`."""

    def __init__(self, url: str, model: str, clients: int = 4) -> None:
        self.answers: list[tuple[float, float]] = []  # (monotonic time answered, tag)
        self.failures: list[str] = []
        self._stop = gevent.event.Event()
        self._greenlets = [gevent.spawn(self._run, url, model) for _ in range(clients)]

    def _run(self, url: str, model: str) -> None:
        client = httpclient.InferenceServerClient(url)
        while not self._stop.is_set():
            try:
                tag = ask(client, model)
            except Exception as e:
                self.failures.append(repr(e))
            else:
                self.answers.append((time.monotonic(), tag))
        client.close()

    def stop(self) -> None:
        self._stop.set()
        gevent.joinall(self._greenlets, timeout=30)

    @property
    def clients(self) -> int:
        return len(self._greenlets)

    @property
    def sent(self) -> int:
        return len(self.answers) + len(self.failures)
