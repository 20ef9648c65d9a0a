"""Decoupled BLS streams read by a process-isolated Python model are bounded as in-process ones are.

An isolated model's ``exec(decoupled=True)`` / ``async_exec(decoupled=True)`` was served by the server,
which forwarded the target's whole stream into the model's process: a model that asked for 2000 x 1 MiB
and read 3 held 2 GB there (the target sent them all), and its iterator's ``cancel()`` or dropping it
never reached the target. Now the server sends on only while the model has not taken the stream's
bound (1024 responses or 4 MiB: the model's process gives credits back), and a cancel or a drop cancels
the target. The caller runs in a process of its own (its config parameter); the target ``flood``
(test_stream_backpressure.py) in-process, or isolated too (the server-wide flag). No sleeps: the tests
wait on what the server reports and on the models' files.
"""

from __future__ import annotations

import json
import queue
from pathlib import Path

import numpy as np
import pytest
import tritonclient.grpc as grpcclient

from .server import IDENTITY_CONFIG, IDENTITY_PY, ServerProcess, add_model
from .test_stream_backpressure import (
    BOUND_RESPONSES,
    ISOLATION,
    _async_holder_repo,
    _blocked_or_done,
    _rss_mb,
    _sent_when_cancelled,
)

# MODE is "<how>:<what>": how = exec | async (exec or async_exec, decoupled); what = see the tests
READER_PY = """
import asyncio, json, os
import numpy as np
import triton_python_backend_utils as pb_utils


def index(response):
    return int(pb_utils.get_output_tensor_by_name(response, "INDEX").as_numpy()[0])


def ask(rid, count, size):
    return pb_utils.InferenceRequest(model_name="flood", request_id=rid,
                                     inputs=[pb_utils.Tensor("COUNT", np.array([count], np.int32)),
                                             pb_utils.Tensor("SIZE", np.array([size], np.int32))])


def identity(x):
    ask = pb_utils.InferenceRequest(model_name="identity", requested_output_names=["OUTPUT0"],
                                    inputs=[pb_utils.Tensor("INPUT0", np.array([x], np.float32))])
    return float(ask.exec().output_tensors()[0].as_numpy()[0])


class TritonPythonModel:
    def initialize(self, args):
        self.dir = json.loads(args["model_config"])["parameters"]["dir"]["string_value"]
        with open(os.path.join(self.dir, "reader.pid"), "w") as f:  # the test reads this process's RSS
            f.write(str(os.getpid()))

    async def execute(self, requests):
        out = []
        for request in requests:
            how, what = pb_utils.get_input_tensor_by_name(request, "MODE").as_numpy()[0].decode().split(":")
            result = await getattr(self, what)(how, f"{how}_{what}")
            out.append(pb_utils.InferenceResponse([pb_utils.Tensor("OUT", np.array([json.dumps(result).encode()],
                                                                                    dtype=object))]))
        return out

    async def stream(self, how, rid, count, size):
        if how == "exec":
            return ask(rid, count, size).exec(decoupled=True)
        return await ask(rid, count, size).async_exec(decoupled=True)

    async def gate(self, rid):  # the test opens it once it saw the target held back (or done)
        path = os.path.join(self.dir, rid + ".gate")
        for _ in range(6000):
            if os.path.exists(path):
                return
            await asyncio.sleep(0.01)  # model code polling a file the test writes

    async def hold(self, how, rid):  # read 3 of 2000 x 1 MiB, wait for the gate, drop the rest unread
        responses = await self.stream(how, rid, 2000, 1 << 20)
        first = [index(next(responses)) for _ in range(3)]
        await self.gate(rid)
        del responses
        return first

    async def cancel(self, how, rid):  # read 3 of 5000, cancel() and keep the iterator
        responses = await self.stream(how, rid, 5000, 1)
        first = [index(next(responses)) for _ in range(3)]
        responses.cancel()
        self.kept = responses
        return first + [len(list(responses))]

    async def drop(self, how, rid):  # read 3 of 5000, drop the iterator and return at once
        responses = await self.stream(how, rid, 5000, 1)
        first = [index(next(responses)) for _ in range(3)]
        del responses
        return first

    async def forget(self, how, rid):  # never await the future
        ask(rid, 5000, 1).async_exec(decoupled=True)
        return True

    async def slow(self, how, rid):  # read one of 5000 x 4 KiB, wait for the gate, then every one
        responses = await self.stream(how, rid, 5000, 4096)
        seen = [index(next(responses))]
        await self.gate(rid)
        with open(os.path.join(self.dir, rid + ".sent")) as f:
            ahead = int(f.read()) - 1  # sent by the target and not read by this model
        *rest, final = responses  # the final one: flags only
        seen += [index(r) for r in rest]
        outs = [pb_utils.get_output_tensor_by_name(r, "OUT").as_numpy() for r in rest]
        return {"in_order": seen == list(range(5000)), "ahead": ahead,
                "contents": all(o.shape == (4096,) and bool((o == i % 251).all()) for i, o in enumerate(outs, 1)),
                "final_empty": not final.output_tensors() and not final.has_error()}

    async def nested(self, how, rid):  # read 3000 x 16 B, with another BLS call after every 500
        responses = await self.stream(how, rid, 3000, 16)
        seen, answers = [], []
        for response in responses:
            if response.output_tensors():
                seen.append(index(response))
                if len(seen) % 500 == 1:
                    answers.append(identity(len(seen)))
        return {"in_order": seen == list(range(3000)), "answers": answers}
"""


def _reader_repo(tmp_path: Path) -> tuple[Path, Path]:
    repo, out = _async_holder_repo(tmp_path, "reader", READER_PY,
                                   ', { key: "TRITON_ACTOR_ISOLATION" value: { string_value: "process" } }')
    add_model(repo, "identity", IDENTITY_CONFIG, IDENTITY_PY)
    return repo, out


def _ask(client: grpcclient.InferenceServerClient, mode: str) -> queue.Queue:
    x = grpcclient.InferInput("MODE", [1], "BYTES")
    x.set_data_from_numpy(np.array([mode.encode()], dtype=object))
    results: queue.Queue = queue.Queue()
    client.async_infer("reader", [x], lambda result, error: results.put((result, error)), client_timeout=120)
    return results


def _answer(results: queue.Queue) -> object:
    result, error = results.get(timeout=120)
    assert error is None, error
    return json.loads(result.as_numpy("OUT")[0])


def _rss_of(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    raise AssertionError("no VmRSS")


@ISOLATION
@pytest.mark.parametrize("how", ["exec", "async"])
def test_an_isolated_bls_caller_that_reads_a_few_holds_back_its_target(tmp_path: Path, start_server,
                                                                       flags: tuple[str, ...], how: str) -> None:
    """3 read of 2000 x 1 MiB: the target's send() waits after a few (before: it sent all 2000 and the
    caller's process held 2 GB); neither the server nor the caller's process grows with the stream;
    dropping the iterator then cancels the target."""
    repo, out = _reader_repo(tmp_path)
    server: ServerProcess = start_server(repo, flags=flags)
    child = int((out / "reader.pid").read_text())
    assert child != server.proc.pid
    client = grpcclient.InferenceServerClient(server.grpc_url)
    try:
        server_before, child_before = _rss_mb(server), _rss_of(child)
        results = _ask(client, f"{how}:hold")
        rid = f"{how}_hold"
        _blocked_or_done(server, out, rid)
        sent = int((out / f"{rid}.sent").read_text())
        server_grown, child_grown = _rss_mb(server) - server_before, _rss_of(child) - child_before
        # 3 read, the pump's 4 MiB (a 1 MiB response over it goes alone) and the channel's, one waiting;
        # a few more for the credits the caller's process gives back at half the window
        assert not (out / f"{rid}.done").exists() and sent <= 3 + 2 * 5 + 6, sent  # before: all 2000
        assert server_grown < 128, f"the server grew by {server_grown:.0f} MB"
        assert child_grown < 128, f"the caller's process grew by {child_grown:.0f} MB"  # before: about 2000
        (out / f"{rid}.gate").write_text("open")
        assert _answer(results) == [0, 1, 2]
        assert _sent_when_cancelled(out, rid) < 2000
    finally:
        client.close()


CANCELS = [("exec", "cancel"), ("exec", "drop"), ("async", "cancel"), ("async", "drop"), ("async", "forget")]


def test_an_isolated_bls_caller_that_cancels_or_drops_its_iterator_cancels_the_target(tmp_path: Path,
                                                                                      start_server) -> None:
    """``cancel()``, the iterator dropped after 3 responses, or an ``async_exec`` future never awaited: the
    target sees ``is_cancelled()`` and stops (before: nothing reached it, it sent all 5000)."""
    repo, out = _reader_repo(tmp_path)
    server: ServerProcess = start_server(repo)
    client = grpcclient.InferenceServerClient(server.grpc_url)
    try:
        for how, what in CANCELS:
            answer = _answer(_ask(client, f"{how}:{what}"))
            assert answer == {"cancel": [0, 1, 2, 0], "drop": [0, 1, 2], "forget": True}[what], (how, what, answer)
            sent = _sent_when_cancelled(out, f"{how}_{what}")
            assert sent <= 2 * BOUND_RESPONSES + 8, (how, what, sent)
    finally:
        client.close()


@ISOLATION
def test_an_isolated_bls_caller_reading_slowly_gets_every_response_in_order(tmp_path: Path, start_server,
                                                                            flags: tuple[str, ...]) -> None:
    """5000 x 4 KiB (over both bounds) read after a pause: while the caller had read one, the target ran
    at most the pump's bound and its channel's ahead (before: it sent all 5000 into the caller's process);
    then every response arrives, whole and in order, and the flags-only final; exec and async_exec."""
    repo, out = _reader_repo(tmp_path)
    server: ServerProcess = start_server(repo, flags=flags)
    client = grpcclient.InferenceServerClient(server.grpc_url)
    try:
        for how in ("exec", "async"):
            results = _ask(client, f"{how}:slow")
            _blocked_or_done(server, out, f"{how}_slow")
            (out / f"{how}_slow.gate").write_text("open")
            got = _answer(results)
            ahead = got.pop("ahead")
            assert got == {"in_order": True, "contents": True, "final_empty": True}, how
            assert ahead <= 2 * BOUND_RESPONSES + 8, f"{how}: the target ran {ahead} responses ahead of the caller"
    finally:
        client.close()


def test_an_isolated_bls_caller_makes_other_calls_while_it_reads_a_long_stream(tmp_path: Path, start_server) -> None:
    """A model that calls the server while it reads a stream longer than the bound: the calls made during a
    command are served on the instance's thread, so that thread must not be the one forwarding the stream
    (it would wait for the model to read on while the model waits for its call: for ever)."""
    repo, _out = _reader_repo(tmp_path)
    server: ServerProcess = start_server(repo)
    client = grpcclient.InferenceServerClient(server.grpc_url)
    try:
        for how in ("exec", "async"):
            assert _answer(_ask(client, f"{how}:nested")) == {
                "in_order": True, "answers": [1.0, 501.0, 1001.0, 1501.0, 2001.0, 2501.0]}, how
    finally:
        client.close()
