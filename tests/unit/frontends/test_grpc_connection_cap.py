"""The gRPC connection cap's default follows the open-file limit (a soft RLIMIT_NOFILE of 1024 with
1000 connections ran out of descriptors: EMFILE); an explicit cap is kept."""

from __future__ import annotations

import resource

import pytest

from triton_actor.config.command_line import parse
from triton_actor.config.settings import Settings


@pytest.mark.parametrize(("soft", "cap"), [(1024, 512), (256, 128), (100_000, 1000), (resource.RLIM_INFINITY, 1000)])
def test_default_cap_is_half_the_open_file_limit(monkeypatch: pytest.MonkeyPatch, soft: int, cap: int) -> None:
    monkeypatch.setattr(resource, "getrlimit", lambda which: (soft, resource.RLIM_INFINITY))
    assert Settings().grpc_max_connections == cap
    assert parse(["--model-repository", "m"], environ={}).grpc_max_connections == cap
    assert parse(["--model-repository", "m", "--grpc-max-connections", "900"], environ={}).grpc_max_connections == 900
