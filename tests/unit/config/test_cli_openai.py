"""Triton's OpenAI frontend's flags (--openai-port, --tokenizer, --default-max-tokens, --openai-restricted-api)."""

from __future__ import annotations

import shlex

import pytest

from triton_actor.config.command_line import parse
from triton_actor.protocol import restricted


def test_defaults_serve_no_openai_port() -> None:
    s = parse(["--model-repository", "/m"])
    assert (s.openai_port, s.tokenizer, s.default_max_tokens, s.openai_restricted_api) == (None, "", 16, ())


def test_the_openai_flags_as_triton_spells_them() -> None:
    s = parse(shlex.split("--model-repository /m --openai-port 9000 --tokenizer /tok --default-max-tokens 64 "
                          "--openai-restricted-api inference,model-repository admin-key admin-value"))
    assert (s.openai_port, s.tokenizer, s.default_max_tokens) == (9000, "/tok", 64)
    rules = restricted.openai_rules(s.openai_restricted_api)
    assert rules == {"inference": restricted.Rule("admin-key", "admin-value"),
                     "model-repository": restricted.Rule("admin-key", "admin-value")}


@pytest.mark.parametrize("flags", [
    "--openai-restricted-api metrics k v",  # no /metrics on the OpenAI port here
    "--openai-restricted-api inference k v --openai-restricted-api inference k2 v2",
    "--default-max-tokens 0",
])
def test_refused(flags: str) -> None:
    with pytest.raises(SystemExit):
        parse(["--model-repository", "/m", *shlex.split(flags)])


def test_http_restricted_api_covers_the_openai_routes() -> None:
    assert restricted.http_categories("openai_completions") == ("inference",)
    assert restricted.http_categories("openai_models") == ("model-repository",)
