"""Where chat templates come from (frontends/openai_templates.py): --tokenizer, the model's folder, the fallback."""

from __future__ import annotations

import json
from pathlib import Path

from triton_actor.frontends.openai_templates import ChatTemplates

MESSAGES = (("user", "hi"),)


def _tokenizer(folder: Path, template: str, jinja: str | None = None) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "tokenizer_config.json").write_text(json.dumps({"chat_template": template, "bos_token": "<s>"}))
    if jinja is not None:
        (folder / "chat_template.jinja").write_text(jinja)
    return folder


def test_each_model_its_own_template_or_the_fallback(tmp_path: Path) -> None:
    _tokenizer(tmp_path / "a", "{{ bos_token }}A:{{ messages[0]['content'] }}")
    _tokenizer(tmp_path / "b" / "tokenizer", "B", jinja="J:{{ messages[0]['content'] }}")  # the .jinja file wins
    (tmp_path / "c").mkdir()
    templates = ChatTemplates("", [tmp_path])
    assert templates.prompt("a", MESSAGES) == "<s>A:hi"
    assert templates.prompt("b", MESSAGES) == "J:hi"
    assert templates.prompt("c", MESSAGES) == "<|user|>\nhi\n<|assistant|>\n"


def test_the_tokenizer_flag_serves_every_model(tmp_path: Path) -> None:
    _tokenizer(tmp_path / "a", "own")
    shared = _tokenizer(tmp_path / "shared", "S:{{ messages | length }}")
    templates = ChatTemplates(str(shared), [tmp_path])
    assert templates.prompt("a", MESSAGES) == templates.prompt("other", MESSAGES) == "S:1"
