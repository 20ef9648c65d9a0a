"""Triton error code → HTTP status (as server's ``src/http_server.cc`` maps them): the only place the mapping lives."""

from __future__ import annotations

from ..errors import Code

HTTP_STATUS: dict[Code, int] = {
    Code.INTERNAL: 500,
    Code.NOT_FOUND: 404,
    Code.UNAVAILABLE: 503,
    Code.UNSUPPORTED: 501,
    Code.INVALID_ARG: 400,
    Code.UNKNOWN: 400,
    Code.ALREADY_EXISTS: 400,
    Code.CANCELLED: 400,
}

# the OpenAI routes' statuses (frontends/openai_routes.py): OpenAI answers what it does not support with 400
# and a server that cannot serve now with 503; a cancelled request is the client's (499 is nginx's, not HTTP's)
OPENAI_STATUS: dict[Code, int] = {**HTTP_STATUS, Code.UNSUPPORTED: 400, Code.UNKNOWN: 500}

REASONS = {200: "OK", 400: "Bad Request", 401: "Unauthorized", 403: "Forbidden", 404: "Not Found", 405: "Method Not Allowed",
           408: "Request Timeout", 413: "Payload Too Large", 414: "URI Too Long", 431: "Request Header Fields Too Large",
           500: "Internal Server Error", 501: "Not Implemented", 503: "Service Unavailable",
           505: "HTTP Version Not Supported"}


def status_line(status: int) -> str:
    return f"{status} {REASONS.get(status, '')}".rstrip()
