"""The OpenAI-compatible routes (``/v1/models``, ``/v1/embeddings``, ``/v1/completions``, ``/v1/chat/completions``).

Declared on every HTTP port app by :func:`.http_routes.create_app` and, with ``--openai-port``, alone on
an app of their own (:func:`.http_routes.openai_app`). Each view is decode (:mod:`..protocol.openai`) →
the data plane (``infer_start`` / ``infer_stream``, so statistics, metrics, traces and dynamic batching
count these requests as any other) → encode (:mod:`..protocol.openai_responses`). A :class:`TritonError`
becomes OpenAI's error object with the status of ``OPENAI_STATUS``; ``--openai-restricted-api`` (Triton's
syntax: ``<API>[,<API>...] <header> <value>``, APIs ``inference`` and ``model-repository``) answers 401.
A client that leaves cancels the model requests: a stream's body is closed by the driver, an answer
being collected watches the connection.
"""

from __future__ import annotations

import logging
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from functools import wraps
from pathlib import Path
from typing import Any

import gevent
import numpy as np
from flask import Flask

from ..errors import Code, TritonError
from ..inference import InferResponse
from ..plane.dataplane import DataPlane, Streamed
from ..protocol import openai, openai_logprobs, openai_models, openai_responses, restricted
from ..protocol.dtypes import BY_ENUM_VALUE
from ..protocol.openai_logprobs import Aligner, Token
from ..protocol.openai_models import Spec
from ..protocol.openai_responses import Answer, Choice, StopScanner
from ..runtime.kernel import Reply as Reply_
from .http import JSON_HEADERS, HttpRequest, Reply, View
from .http_status import OPENAI_STATUS, status_line
from .openai_templates import ChatTemplates

log = logging.getLogger(__name__)

SSE_HEADERS = [("Content-Type", "text/event-stream; charset=utf-8"), ("Cache-Control", "no-cache")]
API_OF_ENDPOINT = {"openai_models": "model-repository", "openai_model": "model-repository",
                   "openai_embeddings": "inference", "openai_completions": "inference", "openai_chat": "inference"}


@dataclass(frozen=True, slots=True)
class OpenAIOptions:
    tokenizer: str = ""  # --tokenizer: one tokenizer for every model's chat template
    default_max_tokens: int = openai.DEFAULT_MAX_TOKENS
    restricted: tuple[tuple[str, str, str], ...] = ()  # --openai-restricted-api: (APIs, header, value)
    repositories: tuple[Path, ...] = ()  # where a model's own tokenizer folder is looked for


def error_reply(error: TritonError) -> Reply:
    if error.code is Code.NOT_FOUND:  # the routes' only lookups are of the request's model
        return status_line(404), JSON_HEADERS, openai.error_body(error, "model_not_found", "model")
    return status_line(OPENAI_STATUS[error.code]), JSON_HEADERS, openai.error_body(error)


def openai_routes(app: Flask, plane: DataPlane, options: OpenAIOptions) -> None:
    rules = restricted.openai_rules(options.restricted)
    templates = ChatTemplates(options.tokenizer, options.repositories)
    started = int(time.time())  # a model's "created": we keep no load times, so the server's start

    def route(rule: str, endpoint: str, method: str = "GET") -> Callable[[View], View]:
        def register(view: View) -> View:
            guarded = _guarded(view, rules.get(API_OF_ENDPOINT[endpoint]))
            app.add_url_rule(rule, endpoint, guarded, methods=[method])
            return view
        return register

    @route("/v1/models", "openai_models")
    def list_models(req: HttpRequest) -> Reply:
        names = sorted({entry["name"] for entry in plane.repository_index(True)})
        return _json(openai_responses.models([(name, started) for name in names if _kind(plane, name)]))

    @route("/v1/models/<model>", "openai_model")
    def retrieve_model(req: HttpRequest, model: str) -> Reply:
        if not _kind(plane, model):
            raise TritonError.not_found(f"The model '{model}' does not exist or follows no OpenAI contract")
        return _json(openai_responses.model_json(model, started))

    @route("/v1/embeddings", "openai_embeddings", "POST")
    def embeddings(req: HttpRequest) -> Reply:
        request = openai.parse_embeddings(req.payload())
        contract = openai_models.embedding_contract(request.model, *_specs(plane, request.model))
        parts = openai_models.embedding_requests(contract, request.model, request.texts)
        pending = [(plane.infer_start(r), rows) for r, rows in parts]  # all queued first: batched together
        answers = _answers([p.reply for p, _ in pending], req)
        rows = [openai_models.embedding_rows(contract, a, n) for a, (_, n) in zip(answers, pending, strict=True)]
        tokens = sum(openai_models.embedding_tokens(contract, a) for a in answers)
        return _json(openai_responses.embeddings(request.model, _stack(rows), request.base64, tokens))

    @route("/v1/completions", "openai_completions", "POST")
    def completions(req: HttpRequest) -> Reply:
        return _generate(plane, req, openai.parse_completion(req.payload(), options.default_max_tokens), None)

    @route("/v1/chat/completions", "openai_chat", "POST")
    def chat_completions(req: HttpRequest) -> Reply:
        return _generate(plane, req, openai.parse_chat(req.payload(), options.default_max_tokens), templates.prompt)


def _guarded(view: View, rule: restricted.Rule | None) -> View:
    """``view`` answering OpenAI's error objects, behind ``--openai-restricted-api``'s header check."""

    @wraps(view)
    def guarded(req: HttpRequest, **args: Any) -> Reply:
        if rule is not None and req.headers.get(rule.header) != rule.value:
            return status_line(401), JSON_HEADERS, openai.auth_error_body(
                f"This API is restricted, expecting header '{rule.header}' with valid value")
        try:
            return view(req, **args)
        except TritonError as e:
            return error_reply(e)
        except Exception as e:  # a bug of ours still answers in OpenAI's shape, and is logged
            log.exception("unexpected error on %s %s", req.method, req.path)
            return error_reply(TritonError.internal(f"internal error: {e!r}"))

    return guarded


def _json(body: bytes) -> Reply:
    return "200 OK", JSON_HEADERS, body


def _stack(parts: list[np.ndarray]) -> np.ndarray:
    return parts[0] if len(parts) == 1 else np.concatenate(parts)


def _specs(plane: DataPlane, model: str) -> tuple[list[Spec], list[Spec], int, bool]:
    cfg = plane.model_config_message(model, -1)
    inputs = [(i.name, BY_ENUM_VALUE[i.data_type], tuple(i.dims), i.optional) for i in cfg.input]
    outputs = [(o.name, BY_ENUM_VALUE[o.data_type], tuple(o.dims), False) for o in cfg.output]
    return inputs, outputs, cfg.max_batch_size, cfg.model_transaction_policy.decoupled


def _kind(plane: DataPlane, model: str) -> str:
    """"generation", "embeddings", or "" for a model that follows neither contract (or is not there)."""
    try:
        specs = _specs(plane, model)
    except TritonError:
        return ""
    for kind, check in (("generation", openai_models.generation_contract),
                        ("embeddings", openai_models.embedding_contract)):
        try:
            check(model, *specs)
            return kind
        except TritonError:
            pass
    return ""


def _generate(plane: DataPlane, req: HttpRequest, gen: openai.Generation,
              template: Callable[..., str] | None) -> Reply:
    contract = openai_models.generation_contract(gen.model, *_specs(plane, gen.model))
    prompt = template(gen.model, gen.messages) if template is not None else gen.prompt
    rid = ("chatcmpl-" if gen.chat else "cmpl-") + uuid.uuid4().hex
    echo = prompt if gen.echo and not contract.echoes else ""
    choices = _Choices(gen, echo)
    try:  # every choice queued before any is read: they generate side by side
        for _ in range(gen.n):
            choices.streams.append(plane.infer_stream(openai_models.generation_request(contract, gen.model, prompt,
                                                                                       gen, rid)))
    except BaseException:
        choices.close()
        raise
    if gen.stream:
        chunks = openai_responses.Chunks(rid, int(time.time()), gen.model, gen.chat, gen.include_usage)
        return "200 OK", SSE_HEADERS, _Events(choices, chunks)
    try:
        texts = _collected(choices, req)
    finally:
        choices.close()
    encode = openai_responses.chat if gen.chat else openai_responses.completion
    return _json(encode(rid, int(time.time()), gen.model, texts, openai_responses.usage(choices.counts)))


def _answers(replies: list[Reply_[InferResponse]], req: HttpRequest) -> list[InferResponse]:
    """Every reply's response. A client that closes its connection meanwhile cancels the requests not
    answered yet (still queued: never run), as /infer does."""
    for reply in replies:
        if not reply.ready() and req.peer_gone is not None and not reply.wait_or(req.peer_gone()):
            for other in replies:
                if not other.ready():
                    other.fail(TritonError(Code.CANCELLED, "request cancelled by the client"))
            break
    return [reply.get() for reply in replies]


def _collected(choices: _Choices, req: HttpRequest) -> list[Answer]:
    """Every choice's (text, finish_reason, logprobs). A client that closes its connection meanwhile cancels the
    generation, as it does a stream or an /infer: the reading greenlet is dropped and the requests closed."""
    if req.peer_gone is None:
        return [choices.collect(i) for i in range(len(choices.streams))]
    reader = gevent.spawn(lambda: [choices.collect(i) for i in range(len(choices.streams))])
    gevent.wait([reader, req.peer_gone()], count=1)
    if not reader.ready():
        reader.kill()
        choices.close()
        raise TritonError(Code.CANCELLED, "request cancelled by the client")
    return reader.get()


class _Choices:
    """The model requests of one generation, one per choice, and what each said so far."""

    def __init__(self, gen: openai.Generation, echo: str) -> None:
        self.gen, self.echo = gen, echo
        self.streams: list[Streamed] = []
        self.counts = [Choice(gen.max_tokens) for _ in range(gen.n)]
        self.stopped = False  # whether the choice read last ended at a stop string

    def pieces(self, index: int) -> Iterator[tuple[str, list[Token] | None]]:
        """The choice's text as it may be sent (stop strings applied), each piece with the log probabilities
        of the tokens it completes (None when not asked); then ``finish_reason`` is known."""
        scanner, aligner, sent = StopScanner(self.gen.stop), Aligner(), 0
        wanted = self.gen.logprobs is not None
        if self.echo:
            yield self.echo, None
        for item, _final in self.streams[index].responses:
            if isinstance(item, TritonError):
                raise item
            if item is None:
                continue
            text = openai_models.text_of(item)
            self.counts[index].count(text, openai_models.tokens_of(item))
            if wanted:
                aligner.add(self._logprobs(item, text))
            piece = scanner.feed(text)
            sent += len(piece)
            if piece:
                yield piece, aligner.take(sent) if wanted else None
            if scanner.stopped:
                break
        self.stopped = scanner.stopped
        self.streams[index].responses.close()  # stopped early: cancels the rest of the generation
        rest = scanner.flush()
        sent += len(rest)
        last = aligner.rest(sent) if wanted else None
        if rest or last:
            yield rest, last

    def _logprobs(self, response: InferResponse, text: str) -> list[Token]:
        tokens = openai_models.logprobs_of(response, self.gen.logprobs or 0)
        if tokens is None and text:  # the contract says it does: a model that does not is at fault
            raise TritonError.internal(f"model '{self.gen.model}' gave text without its 'logprobs' output, "
                                       "though the request asked for them (return_logprobs)")
        return tokens or []

    def collect(self, index: int) -> Answer:
        """The choice's (text, finish_reason, logprobs in OpenAI's shape or None)."""
        texts, tokens = [], []
        for piece, logprobs in self.pieces(index):
            texts.append(piece)
            tokens.extend(logprobs or ())
        return "".join(texts), self.counts[index].finish_reason(self.stopped), self.logprobs(tokens)

    def logprobs(self, tokens: list[Token] | None) -> dict[str, Any] | None:
        if self.gen.logprobs is None or tokens is None:
            return None
        return openai_logprobs.chat(tokens) if self.gen.chat else openai_logprobs.completion(tokens)

    def close(self) -> None:
        for streamed in self.streams:
            streamed.responses.close()


class _Events:
    """A streamed generation's body: each choice's chunks in turn, the usage chunk, ``[DONE]``. The
    driver calls :meth:`close` when the stream ends or the client leaves, which cancels the requests."""

    def __init__(self, choices: _Choices, chunks: openai_responses.Chunks) -> None:
        self.choices, self.chunks = choices, chunks

    def __iter__(self) -> Iterator[bytes]:
        choices, chunks = self.choices, self.chunks
        try:
            for i in range(len(choices.streams)):
                start = chunks.start(i)
                if start:
                    yield start
                for piece, tokens in choices.pieces(i):
                    yield chunks.text(i, piece, logprobs=choices.logprobs(tokens))
                yield chunks.text(i, "", choices.counts[i].finish_reason(choices.stopped))
        except TritonError as e:  # the status line went out already: the error is the last event
            yield openai_responses.error_chunk(openai.error_body(e))
            return
        if chunks.include_usage:
            yield chunks.usage(openai_responses.usage(choices.counts))
        yield openai_responses.DONE

    def close(self) -> None:
        self.choices.close()
