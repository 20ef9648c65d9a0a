"""Log and trace settings over HTTP and gRPC: one owner, Triton's shapes (https://github.com/triton-inference-server/server/blob/main/docs/protocol/extension_logging.md, https://github.com/triton-inference-server/server/blob/main/docs/protocol/extension_trace.md)."""

from __future__ import annotations

import pytest
from tritonclient.utils import InferenceServerException

from .clients import Client


def test_log_settings(any_client: Client) -> None:
    c = any_client
    assert c.log_settings() == {"log_file": "", "log_info": True, "log_warning": True, "log_error": True,
                                "log_verbose_level": 0, "log_format": "default"}
    assert c.log_settings({"log_verbose_level": 1})["log_verbose_level"] == 1
    assert c.log_settings({"log_verbose_level": 0})["log_verbose_level"] == 0
    with pytest.raises(InferenceServerException) as e:
        c.log_settings({"log_format": "xml"})
    assert c.status(e.value) == c.expect("INVALID_ARGUMENT", 400)


def test_trace_settings(any_client: Client) -> None:
    c = any_client
    assert c.trace_settings() == {"trace_level": ["OFF"], "trace_rate": ["1000"], "trace_count": ["-1"],
                                  "log_frequency": ["0"], "trace_file": [""], "trace_mode": ["triton"]}
    model = "add_sub" if c.grpc else "string_ops"  # one model per protocol: the example server is shared
    assert c.trace_settings(model, {"trace_rate": "5"})["trace_rate"] == ["5"]
    assert c.trace_settings(model)["trace_rate"] == ["5"]
    assert c.trace_settings()["trace_rate"] == ["1000"]  # the global value is unchanged
    with pytest.raises(InferenceServerException) as e:
        c.trace_settings("nope")
    assert c.status(e.value) == c.expect("INVALID_ARGUMENT", 400)
    assert "Request for unknown model : nope" in e.value.message()
    with pytest.raises(InferenceServerException) as e:
        c.trace_settings(update={"trace_file": "/tmp/x"})
    assert c.status(e.value) == c.expect("UNIMPLEMENTED", 501)
