"""The one HTTP router (``frontends/http.py``) as a plain callable, without sockets: the url map answers
every path, ``/infer`` included, with the route cache (fast path) and without it."""

from __future__ import annotations

import dataclasses
import gzip
from collections.abc import Iterator
from unittest.mock import MagicMock

import pytest

from triton_actor.errors import TritonError
from triton_actor.frontends import cached_answers, http
from triton_actor.frontends.http import HttpFrontend
from triton_actor.frontends.http_routes import create_app, empty_app
from triton_actor.runtime import fastpath


@pytest.fixture(params=[True, False], ids=["fast", "slow"])
def router(request: pytest.FixtureRequest) -> Iterator[tuple[HttpFrontend, MagicMock]]:
    before = fastpath.enabled
    fastpath.set_enabled(request.param)
    plane = MagicMock()
    yield HttpFrontend(create_app(plane), max_input_size=100), plane
    fastpath.set_enabled(before)


def test_views_get_the_url_arguments(router: tuple[HttpFrontend, MagicMock]) -> None:
    route, plane = router
    plane.route.return_value.refuse_decoupled.side_effect = TritonError.unsupported("decoupled")
    for _ in range(2):  # the second time from the route cache, when fast paths are on
        assert route("POST", "/v2/models/m/infer", "", {}, b"{}") == (
            "501 Not Implemented", http.JSON_HEADERS, b'{"error":"decoupled"}')
        plane.route.assert_called_with("m", -1)
    assert route("GET", "/v2/health/live", "", {}, b"") == ("200 OK", http.TEXT_HEADERS, b"")
    plane.model_metadata.return_value = {"name": "m"}
    assert route("GET", "/v2/models/m/versions/3", "", {}, b"")[2] == b'{"name":"m"}'
    plane.model_metadata.assert_called_with("m", 3)
    assert (("POST", "/v2/models/m/infer") in fastpath.caches()["http.routes"]) is fastpath.enabled


@pytest.mark.parametrize("caching", [True, False])
def test_a_body_is_looked_up_by_its_bytes_only_with_a_response_cache(monkeypatch: pytest.MonkeyPatch,
                                                                       caching: bool) -> None:
    """Without a response cache (--cache-config) an /infer body is not looked up by its bytes: that call
    and lookup were on every request of every server."""
    looked_up: list[object] = []
    monkeypatch.setattr(cached_answers, "http_again", lambda *args: looked_up.append(args))
    plane = MagicMock()
    plane.route.return_value.refuse_decoupled.side_effect = TritonError.unsupported("decoupled")
    route = HttpFrontend(create_app(plane, caching=caching))
    assert route("POST", "/v2/models/m/infer", "", {}, b"{}")[0] == "501 Not Implemented"
    assert len(looked_up) == (1 if caching else 0)


@pytest.mark.parametrize(("method", "path", "status", "allow"), [
    ("GET", "/v2/models/m/infer", "405 Not Allowed", "POST"),
    ("OPTIONS", "/v2/health/live", "405 Not Allowed", "GET, HEAD"),
    ("PUT", "/v2/logging", "405 Not Allowed", "GET, HEAD, POST"),
    ("POST", "/v2/models/m/versions/abc/infer", "404 Not Found", None),
    ("GET", "/v2//health/live", "404 Not Found", None),
    ("GET", "/nope", "404 Not Found", None),
])
def test_unknown_paths_and_wrong_methods(router: tuple[HttpFrontend, MagicMock], method: str, path: str,
                                         status: str, allow: str | None) -> None:
    route, _plane = router
    got_status, headers, body = route(method, path, "", {}, b"")
    assert got_status == status and ("Content-Type", "text/plain") in headers
    assert dict(headers).get("Allow") == allow
    assert body == (b'{"error":"Method Not Allowed"}' if allow else b'{"error":"Not Found"}')


def test_each_kind_of_router_has_its_own_route_cache(router: tuple[HttpFrontend, MagicMock]) -> None:
    """The metrics port's router never answers with the HTTP port's endpoints, nor the other way round."""
    route, _plane = router
    app = empty_app()
    app.add_url_rule("/metrics", "metrics", lambda req: ("200 OK", http.TEXT_HEADERS, b"m"), methods=["GET"])
    metrics = HttpFrontend(app, name="metrics")
    for _ in range(2):  # the second time from the route caches, when fast paths are on
        assert route("GET", "/v2/health/live", "", {}, b"")[0] == "200 OK"
        assert metrics("GET", "/v2/health/live", "", {}, b"")[0] == "404 Not Found"
        assert metrics("GET", "/metrics", "", {}, b"")[2] == b"m"
        assert route("GET", "/metrics", "", {}, b"")[0] == "404 Not Found"


def test_errors_in_views(router: tuple[HttpFrontend, MagicMock]) -> None:
    route, plane = router
    plane.server_metadata.side_effect = RuntimeError("boom")
    status, _, body = route("GET", "/v2", "", {}, b"")
    assert status == "500 Internal Server Error" and b"boom" in body


def test_payload_limits_decompressed_size() -> None:
    req = http.HttpRequest("POST", "/", "", {"content-encoding": "gzip"}, gzip.compress(b"x" * 101), 100)
    with pytest.raises(TritonError, match=r"^Decompressed data size exceeds the maximum allowed value of 100 bytes"):
        req.payload()
    assert dataclasses.replace(req, body=gzip.compress(b"x" * 100)).payload() == b"x" * 100
    with pytest.raises(TritonError, match="unsupported Content-Encoding 'br'"):
        dataclasses.replace(req, headers={"content-encoding": "br"}).payload()
    assert dataclasses.replace(req, body=b"").payload() == b""  # nothing to inflate
    with pytest.raises(TritonError, match="failed to decompress the gzip request body: truncated"):
        dataclasses.replace(req, body=gzip.compress(b"x" * 100)[:-12]).payload()
