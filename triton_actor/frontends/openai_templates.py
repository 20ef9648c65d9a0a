"""Where a generation model's chat template comes from: ``--tokenizer``, a tokenizer folder beside the model, or the fallback.

As Triton's OpenAI frontend, ``--tokenizer`` names one tokenizer for every model: a local folder, or a
Hugging Face id, which ``transformers`` (when installed) loads; its ``apply_chat_template`` renders.
Without the flag each model may keep its own tokenizer files: in ``<repository>/<model>/``, or in its
``tokenizer/`` folder. A folder's template is ``chat_template.jinja``, else the
``chat_template`` of its ``tokenizer_config.json``, rendered by :mod:`..protocol.openai_chat` with no
``transformers`` needed. Nothing found: the fallback template (docs/openai.md). What a model was found to
use is kept until the server stops (a reloaded model keeps its first template). Runs on the hub.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from functools import partial
from pathlib import Path
from typing import Any

import orjson

from ..errors import TritonError
from ..protocol import openai_chat

log = logging.getLogger(__name__)

Messages = tuple[tuple[str, str], ...]
Renderer = Callable[[Messages], str]


class ChatTemplates:
    """The renderer of each model, found on its first chat request. Owned by one server's OpenAI routes."""

    def __init__(self, tokenizer: str, repositories: Sequence[Path]) -> None:
        self._tokenizer = tokenizer
        self._repositories = tuple(repositories)
        self._renderers: dict[str, Renderer] = {}  # one entry per model name served a chat
        self._shared: Renderer | None = None  # --tokenizer's, loaded once

    def prompt(self, model: str, messages: Messages) -> str:
        renderer = self._renderers.get(model)
        if renderer is None:
            renderer = self._renderers[model] = self._find(model)
        return renderer(messages)

    def _find(self, model: str) -> Renderer:
        if self._tokenizer:
            if self._shared is None:
                self._shared = _load(self._tokenizer) or _fallback()
            return self._shared
        for repo in self._repositories:
            for folder in (repo / model, repo / model / "tokenizer"):
                found = _from_folder(folder)
                if found is not None:
                    log.info("model '%s': chat template of %s", model, folder)
                    return found
        return _fallback()


def _fallback() -> Renderer:
    return partial(openai_chat.render, openai_chat.compile_template(openai_chat.FALLBACK_TEMPLATE), specials={})


def _from_folder(folder: Path) -> Renderer | None:
    config: dict[str, Any] = {}
    try:
        config = orjson.loads((folder / "tokenizer_config.json").read_bytes())
    except (OSError, orjson.JSONDecodeError):
        pass
    source, specials = openai_chat.template_of(config if isinstance(config, dict) else {})
    try:
        source = (folder / "chat_template.jinja").read_text()
    except OSError:
        pass
    if source is None:
        return None
    return partial(openai_chat.render, openai_chat.compile_template(source), specials=specials)


def _load(tokenizer: str) -> Renderer | None:
    """``--tokenizer``: a folder we read ourselves, else whatever ``transformers`` makes of the name."""
    if Path(tokenizer).is_dir():
        found = _from_folder(Path(tokenizer))
        if found is not None:
            return found
    try:
        from transformers import AutoTokenizer
    except ImportError:
        log.warning("--tokenizer %s: no chat template there and transformers is not installed; "
                    "the fallback template is used", tokenizer)
        return None
    loaded = AutoTokenizer.from_pretrained(tokenizer)

    def render(messages: Messages) -> str:
        try:
            return loaded.apply_chat_template([{"role": r, "content": c} for r, c in messages], tokenize=False,
                                              add_generation_prompt=True)
        except Exception as e:  # noqa: BLE001  (transformers raises ValueError, jinja errors and more)
            raise TritonError.invalid_arg(f"'messages' could not be rendered by the chat template: {e}") from None

    return render
