"""Restricted APIs (https://github.com/triton-inference-server/server/blob/main/docs/customization_guide/inference_protocols.md): ``--http-restricted-api`` and ``--grpc-restricted-protocol``.

Syntax, as Triton's: ``<category>[,<category>...]:<header>=<value>``; the flag may be given several times
(a category in two of them is an error). A request to a restricted category must carry ``<header>`` with
exactly ``<value>``; otherwise HTTP answers 403 and gRPC UNAVAILABLE, both with
``This API is restricted, expecting header '<header>'``. Pure data and functions: the front ends check.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

CATEGORIES = ("health", "metadata", "inference", "shared-memory", "model-config", "model-repository",
              "statistics", "trace", "logging")

# HTTP endpoints (Flask endpoint names in frontends/http_routes.py) → category; shared memory by pattern
HTTP_ENDPOINTS = {
    "health_live": "health", "health_ready": "health", "model_ready": "health",
    "server_metadata": "metadata", "model_metadata": "metadata",
    "infer": "inference", "generate_one": "inference", "generate_stream": "inference",
    "model_config": "model-config",
    "repository_index": "model-repository", "repository_load": "model-repository",
    "repository_unload": "model-repository",
    "tune_report_register": "model-repository",  # names a folder the server then serves (plane/tune_report.py)
    "model_stats": "statistics",
    "trace_settings": "trace",
    "logging_settings": "logging",
    # the OpenAI routes (frontends/openai_routes.py), as Triton's OpenAI frontend groups them
    "openai_models": "model-repository", "openai_model": "model-repository",
    "openai_embeddings": "inference", "openai_completions": "inference", "openai_chat": "inference",
}

GRPC_METHODS = {
    "ServerLive": "health", "ServerReady": "health", "ModelReady": "health", "Check": "health",
    "ServerMetadata": "metadata", "ModelMetadata": "metadata",
    "ModelInfer": "inference", "ModelStreamInfer": "inference",
    "ModelConfig": "model-config",
    "RepositoryIndex": "model-repository", "RepositoryModelLoad": "model-repository",
    "RepositoryModelUnload": "model-repository",
    "ModelStatistics": "statistics",
    "TraceSetting": "trace",
    "LogSettings": "logging",
}


# our own endpoints that show what restricted ones do: /status.json is statistics and the repository's
# states and load errors, so it needs what each of those needs (the page itself is static)
HTTP_ENDPOINTS_OF_SEVERAL = {"status_json": ("statistics", "model-repository"),
                             "tune_report_file": ("statistics", "model-repository")}  # the report: both, as the page


def http_categories(endpoint: str) -> tuple[str, ...]:
    """The categories whose restrictions apply to ``endpoint`` (all of them)."""
    if "_shm_" in endpoint:
        return ("shared-memory",)
    one = HTTP_ENDPOINTS.get(endpoint)
    return (one,) if one is not None else HTTP_ENDPOINTS_OF_SEVERAL.get(endpoint, ())


def grpc_category(method: str) -> str | None:
    if "SharedMemory" in method:
        return "shared-memory"
    return GRPC_METHODS.get(method)


@dataclass(frozen=True, slots=True)
class Rule:
    header: str  # lower case, as both front ends hold header names
    value: str


class Restrictions:
    """Which header each restricted category wants; :meth:`refusal` says why a request is refused."""

    def __init__(self, specs: Iterable[str] = (), flag: str = "--http-restricted-api") -> None:
        self.rules: dict[str, Rule] = {}
        for spec in specs:
            categories, sep, header_value = spec.partition(":")
            header, eq, value = header_value.partition("=")
            if not sep or not eq or not header or not categories:
                raise ValueError(f"{flag} expects '<API>[,<API>...]:<key>=<value>', got '{spec}'")
            for category in categories.split(","):
                category = category.strip()
                if category not in CATEGORIES:
                    raise ValueError(f"unknown restricted API category '{category}' in {flag} "
                                     f"(known: {', '.join(CATEGORIES)})")
                if category in self.rules:
                    raise ValueError(f"restricted API category '{category}' given twice in {flag}")
                self.rules[category] = Rule(header.strip().lower(), value)

    def __bool__(self) -> bool:
        return bool(self.rules)

    def refusal(self, category: str | None, header_value: str | None) -> str | None:
        """None when allowed; else the error message. ``header_value``: the rule's header in the request."""
        rule = self.rules.get(category) if category is not None else None
        if rule is None or header_value == rule.value:
            return None
        return f"This API is restricted, expecting header '{rule.header}'"

    def header_for(self, category: str | None) -> str | None:
        rule = self.rules.get(category) if category is not None else None
        return rule.header if rule is not None else None


OPENAI_APIS = ("inference", "model-repository")


def openai_rules(specs: Iterable[tuple[str, str, str]]) -> dict[str, Rule]:
    """``--openai-restricted-api <API>[,<API>...] <header> <value>`` (Triton's OpenAI frontend's syntax, three
    arguments) → API → rule; ValueError for an unknown API or one named twice, as that frontend refuses them."""
    rules: dict[str, Rule] = {}
    for apis, header, value in specs:
        for api in apis.split(","):
            if api not in OPENAI_APIS:
                raise ValueError(f"--openai-restricted-api: Unknown API '{api}'. Available APIs: "  # Triton's words
                                 f"{list(OPENAI_APIS)}")
            if api in rules:
                raise ValueError(f"--openai-restricted-api: restricted api '{api}' can not be specified in "
                                 "multiple config groups")
            rules[api] = Rule(header.lower(), value)
    return rules
