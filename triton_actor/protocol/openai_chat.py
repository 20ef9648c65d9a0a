"""Chat messages → the prompt a generation model reads: the tokenizer's chat template, or our fallback (sans-I/O).

A Hugging Face tokenizer folder keeps its template in ``tokenizer_config.json`` (``chat_template``: Jinja,
or a list of named ones of which ``default`` is used) with the special tokens it names (``bos_token``,
``eos_token``). It is rendered as ``transformers``' ``apply_chat_template(tokenize=False,
add_generation_prompt=True)`` renders it: a sandboxed Jinja environment with ``trim_blocks`` and
``lstrip_blocks``, ``raise_exception`` and a ``tojson`` that does not escape HTML. Where no template is
found, :data:`FALLBACK_TEMPLATE`: one ``<|role|>`` line per message, then ``<|assistant|>``. Where the
files come from is the front end's business (``frontends/openai_templates.py``).
"""

from __future__ import annotations

import json
from typing import Any

import jinja2
from jinja2.sandbox import ImmutableSandboxedEnvironment

from ..errors import TritonError

FALLBACK_TEMPLATE = (
    "{% for message in messages %}<|{{ message['role'] }}|>\n{{ message['content'] }}\n{% endfor %}"
    "{% if add_generation_prompt %}<|assistant|>\n{% endif %}"
)
_SPECIALS = ("bos_token", "eos_token", "unk_token", "pad_token")


def _raise(message: str) -> None:
    raise TritonError.invalid_arg(f"'messages' refused by the chat template: {message}")


def _tojson(value: Any, indent: int | None = None) -> str:
    return json.dumps(value, indent=indent, ensure_ascii=False)


def compile_template(source: str) -> jinja2.Template:
    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True, extensions=["jinja2.ext.loopcontrols"])
    env.globals["raise_exception"] = _raise
    env.filters["tojson"] = _tojson
    try:
        return env.from_string(source)
    except jinja2.TemplateError as e:
        raise TritonError.internal(f"the chat template does not compile: {e}") from None


def template_of(tokenizer_config: dict[str, Any]) -> tuple[str | None, dict[str, str]]:
    """(template source or None, special tokens) of a ``tokenizer_config.json``."""
    source = tokenizer_config.get("chat_template")
    if isinstance(source, list):
        named = {t.get("name"): t.get("template") for t in source if isinstance(t, dict)}
        source = named.get("default")
    specials = {}
    for key in _SPECIALS:
        token = tokenizer_config.get(key)
        if isinstance(token, dict):
            token = token.get("content")
        if isinstance(token, str):
            specials[key] = token
    return (source if isinstance(source, str) else None), specials


def render(template: jinja2.Template, messages: tuple[tuple[str, str], ...], specials: dict[str, str]) -> str:
    conversation = [{"role": role, "content": content} for role, content in messages]
    try:
        return template.render(messages=conversation, add_generation_prompt=True, **specials)
    except TritonError:
        raise
    except jinja2.TemplateError as e:
        raise TritonError.invalid_arg(f"'messages' could not be rendered by the chat template: {e}") from None
