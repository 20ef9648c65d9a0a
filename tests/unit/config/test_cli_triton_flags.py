"""tritonserver command lines from NVIDIA's docs, charts and manifests → Settings; what is refused."""

from __future__ import annotations

import logging
import re
import shlex

import pytest

from triton_actor.config.command_line import parse
from triton_actor.errors import TritonError
from triton_actor.inference import InferRequest
from triton_actor.observability import log_format
from triton_actor.observability.log_trace_settings import RuntimeSettings
from triton_actor.protocol import h2_connection as h2c
from triton_actor.protocol import h2_events as h2e
from triton_actor.protocol import header_forward
from triton_actor.protocol import http2 as h2

# every flag this change added, as Triton's docs and Helm charts spell them (both --flag=value and --flag value)
NVIDIA_LINE = """
tritonserver --model-repository=/models --model-control-mode=explicit --load-model=*
  --log-verbose=1 --log-info=true --log-warning=false --log-error=1 --log-format=ISO8601 --log-file=/tmp/t.log
  --http-port=8000 --reuse-http-port=true --http-header-forward-pattern=x-.* --http-thread-count=8
  --grpc-port=8001 --grpc-header-forward-pattern (?-i)x-.* --grpc-max-response-pool-size=32
  --grpc-max-connection-age=60000 --grpc-max-connection-age-grace=5000
  --allow-sagemaker=false --sagemaker-port=8080 --allow-vertex-ai=false --allow-gpu-metrics=false
  --allow-cpu-metrics=0 --model-load-retry-count=2 --model-namespacing=false --enable-peer-access=true
  --pinned-memory-pool-byte-size=268435456 --cuda-memory-pool-byte-size=0:67108864
  --cuda-memory-pool-byte-size 1:67108864 --cuda-virtual-address-size=0:1073741824
  --min-supported-compute-capability=6.0 --buffer-manager-thread-count=0 --host-policy=gpu0,numa-node=0
  --backend-directory=/opt/tritonserver/backends --repoagent-directory=/opt/tritonserver/repoagents
  --rate-limit=OFF --response-cache-byte-size=0 --cache-directory=/opt/tritonserver/caches
"""


def _parse(line: str) -> object:
    return parse(shlex.split(line)[1:], environ={})


def test_an_nvidia_command_line_parses_into_settings() -> None:
    s = _parse(NVIDIA_LINE)
    assert (s.log_verbose, s.log_info, s.log_warning, s.log_error) == (1, True, False, True)
    assert (s.log_format, s.log_file) == ("ISO8601", "/tmp/t.log")
    assert s.reuse_http_port and (s.http_header_forward_pattern, s.grpc_header_forward_pattern) == ("x-.*", "(?-i)x-.*")
    assert (s.grpc_max_connection_age_secs, s.grpc_max_connection_age_grace_secs) == (60.0, 5.0)
    assert (s.allow_cpu_metrics, s.allow_gpu_metrics, s.model_load_retry_count) == (False, False, 2)
    ignored = dict(s.ignored_flags)
    assert set(ignored) == {"--http-thread-count", "--grpc-max-response-pool-size", "--sagemaker-port",
                            "--enable-peer-access", "--pinned-memory-pool-byte-size", "--cuda-memory-pool-byte-size",
                            "--cuda-virtual-address-size", "--min-supported-compute-capability",
                            "--buffer-manager-thread-count", "--host-policy", "--backend-directory",
                            "--repoagent-directory", "--cache-directory"}
    assert "built in" in ignored["--backend-directory"]


def test_defaults_are_tritons() -> None:
    s = parse(["--model-repository", "m"], environ={})
    assert (s.log_warning, s.log_error, s.log_format, s.log_file, s.reuse_http_port) == (True, True, "default", "",
                                                                                        False)
    assert (s.allow_cpu_metrics, s.allow_gpu_metrics, s.model_load_retry_count, s.ignored_flags) == (True, True, 0, ())
    assert (s.http_header_forward_pattern, s.grpc_max_connection_age_secs) == ("", 0.0)
    # Triton: "Ignored unless --allow-metrics is true"
    s = parse(["--model-repository", "m", "--allow-metrics=false"], environ={})
    assert (s.allow_cpu_metrics, s.allow_gpu_metrics) == (False, False)


@pytest.mark.parametrize(("flags", "named"), [
    (["--allow-sagemaker=true"], "--allow-sagemaker=true"),
    (["--allow-sagemaker"], "--allow-sagemaker=true"),
    (["--allow-vertex-ai", "1"], "--allow-vertex-ai=true"),
    (["--model-namespacing=true"], "--model-namespacing=true"),
])
def test_what_would_mislead_is_refused_naming_the_flag(flags: list[str], named: str) -> None:
    with pytest.raises(SystemExit) as e:
        parse(["--model-repository", "m", *flags], environ={})
    message = str(e.value.code)
    assert message.startswith("error: ") and named in message and "\n" not in message
    assert "false" in message or "off" in message or "=0" in message  # says what is accepted


def test_the_rate_limiter_flags_are_tritons() -> None:
    s = parse(["--model-repository", "m"], environ={})
    assert (s.rate_limit, s.rate_limit_resources) == ("off", ())
    s = parse(["--model-repository", "m", "--rate-limit=execution_count", "--rate-limit-resource=R1:10",
               "--rate-limit-resource=R2:5:0", "--rate-limit-resource=R2:8:1"], environ={})
    assert s.rate_limit == "execution_count"
    assert s.rate_limit_resources == (("R1", -2, 10), ("R2", 0, 5), ("R2", 1, 8))
    with pytest.raises(SystemExit) as e:
        parse(["--model-repository", "m", "--rate-limit-resource=R1"], environ={})
    assert str(e.value.code) == ("error: --rate-limit-resource option format is '<resource_name>:<count>:<device>' "
                                 "or '<resource_name>:<count>'. Got R1")


@pytest.mark.parametrize("bad", ["--log-format=json", "--http-header-forward-pattern=(", "--rate-limit=fast",
                                 "--cuda-memory-pool-byte-size=64", "--host-policy=numa", "--log-warning=maybe",
                                 "--model-load-retry-count=-1", "--grpc-max-connection-age=-5"])
def test_bad_values_are_errors(bad: str) -> None:
    with pytest.raises(SystemExit) as e:
        parse(["--model-repository", "m", bad], environ={})
    assert e.value.code not in (0, None)


# -- log lines ----------------------------------------------------------------------------------
def _record(level: int = logging.INFO) -> logging.LogRecord:
    record = logging.LogRecord("triton_actor.server", level, __file__, 1, "Started %s", ("HTTPService",), None)
    record.created = 1716235405.829575  # 2024-05-20T20:03:25.829575Z
    record.process = 3355
    return record


def test_tritons_two_line_formats() -> None:
    default = log_format.TritonFormatter().format(_record())
    assert re.fullmatch(r"I0520 \d\d:03:25\.829575 3355 triton_actor\.server\] Started HTTPService", default)
    iso = log_format.TritonFormatter("ISO8601").format(_record(logging.WARNING))
    assert iso == "2024-05-20T20:03:25Z W 3355 triton_actor.server] Started HTTPService"


def test_severities_are_switches() -> None:
    f = log_format.SeverityFilter()
    f.info, f.warning, f.error = True, False, True  # not a threshold: warnings off, errors on
    assert [f.filter(_record(lv)) for lv in (logging.DEBUG, logging.INFO, logging.WARNING, logging.ERROR)] == \
        [False, True, False, True]


def test_runtime_settings_show_the_start_settings_and_keep_the_log_file() -> None:
    start = {"log_file": "/tmp/x.log", "log_info": True, "log_warning": False, "log_error": True,
             "log_verbose_level": 0, "log_format": "ISO8601"}
    settings = RuntimeSettings(log=start)
    assert settings.update_log({}) == start
    assert settings.update_log({"log_file": "/tmp/x.log"})["log_file"] == "/tmp/x.log"  # unchanged: fine
    with pytest.raises(TritonError):
        settings.update_log({"log_file": "/tmp/y.log"})


# -- header forwarding --------------------------------------------------------------------------
def test_header_forwarding_rule() -> None:
    headers = [("my_header_1", "v1"), ("header_2", "v2"), ("x-my_header", "v3"), (":path", "/p"),
               ("content-type", "application/grpc")]
    assert header_forward.forwarded(header_forward.compile_pattern("MY_HEADER.*"), headers) == \
        {"my_header_1": "v1", "x-my_header": "v3"}  # case-insensitive, matched anywhere in the name
    assert header_forward.forwarded(header_forward.compile_pattern("(?-i)MY_HEADER.*"), headers) == {}
    assert header_forward.forwarded(header_forward.compile_pattern(".*"), [(":authority", "a"), ("te", "t")]) == {}
    assert header_forward.forwarded(header_forward.compile_pattern(""), headers) == {}
    with pytest.raises(TritonError, match="reserved for Triton usage"):
        header_forward.forwarded(header_forward.compile_pattern(".*"), [("triton_enable_empty_final_response", "1")])
    request = InferRequest("m", -1, "", {}, parameters={"my_a": 1, "other": 2})
    assert header_forward.with_forwarded(request, {"my_a": "h"}).parameters == {"my_a": "h", "other": 2}


# -- connection age -----------------------------------------------------------------------------
def test_an_old_connection_gets_goaway_and_is_closed_after_the_grace() -> None:
    conn = h2c.H2Connection(h2e.Limits(max_connection_age=10.0, max_connection_age_grace=2.0), 100.0)
    conn.initiate_connection()
    conn.data_to_send()
    assert conn.tick(105.0) <= 110.0 and not conn.going_away  # woken at the age
    conn.tick(110.0)
    sent = conn.data_to_send()
    assert conn.aged and conn.going_away and not conn.closed
    assert sent[3] == 7 and b"max_age" in sent  # GOAWAY(NO_ERROR)
    assert conn.tick(111.0) <= 112.0 and not conn.closed
    conn.tick(112.0)
    assert conn.closed


def test_an_aged_connection_without_grace_does_not_wake_the_tick_at_once() -> None:
    """Found by review: with no grace (the default) the deadline after the GOAWAY was the age itself,
    already past, so the driver's tick looped with sleep(0) at 100 % CPU for as long as a stream stayed open."""
    conn = h2c.H2Connection(h2e.Limits(max_connection_age=1.0), 0.0)
    conn.initiate_connection()
    conn.receive_data(h2.PREFACE + h2.frame(h2.SETTINGS, 0, 0), 0.0)  # past the handshake (its timeout)
    conn.tick(1.0)
    assert conn.aged and not conn.closed
    for now in (1.5, 5.0, 100.0):
        assert conn.tick(now) > now
