"""``check``'s warnings found without running a model, its report lines, and the command's dispatch."""

from __future__ import annotations

import io
import sys
import tarfile
from pathlib import Path

import pytest

from triton_actor import cli
from triton_actor.check import report, static
from triton_actor.check.command import _crash_report
from triton_actor.protocol._generated import model_config_pb2 as mc


def _config(kind: int = mc.ModelInstanceGroup.KIND_CPU, env: str = "") -> mc.ModelConfig:
    cfg = mc.ModelConfig(name="m", backend="python")
    cfg.instance_group.add(kind=kind, gpus=[0] if kind == mc.ModelInstanceGroup.KIND_GPU else [])
    if env:
        cfg.parameters["EXECUTION_ENV_PATH"].string_value = env
    return cfg


def _model(tmp_path: Path, source: str) -> Path:
    (tmp_path / "m" / "1").mkdir(parents=True)
    (tmp_path / "m" / "1" / "model.py").write_text(source)
    return tmp_path / "m"


def _archive(path: Path, members: list[str]) -> None:
    with tarfile.open(path, "w:gz") as tar:
        for name in members:
            info = tarfile.TarInfo(name)
            tar.addfile(info, io.BytesIO(b""))


def test_imports_the_environment_lacks_are_named_with_their_line(tmp_path: Path) -> None:
    model_dir = _model(tmp_path, "import os\nimport numpy\nimport helper\n\n"
                                 "def f():\n    from not_here_either.sub import x\n"
                                 "try:\n    import optional_thing\nexcept ImportError:\n    pass\n"
                                 "import not_here\nfrom . import sibling\n")
    (model_dir / "1" / "helper.py").write_text("")
    found = static.missing_imports(model_dir / "1" / "model.py", model_dir)
    assert found == [
        "m/1/model.py:6 imports 'not_here_either', which this environment lacks (importlib.util.find_spec found nothing)",
        "m/1/model.py:11 imports 'not_here', which this environment lacks (importlib.util.find_spec found nothing)",
    ]


def test_a_model_file_that_does_not_parse_is_left_to_the_load(tmp_path: Path) -> None:
    model_dir = _model(tmp_path, "def broken(:\n")
    assert static.missing_imports(model_dir / "1" / "model.py", model_dir) == []


def test_kind_gpu_without_a_gpu_warns_and_is_checked_on_the_cpu(tmp_path: Path) -> None:
    cfg = _config(mc.ModelInstanceGroup.KIND_GPU)
    model_dir = _model(tmp_path, "")
    assert "KIND_GPU and this host has no GPU" in static.warnings(cfg, model_dir, gpu_count=0)[0]
    assert static.warnings(cfg, model_dir, gpu_count=1) == []
    cpu = static.cpu_only(cfg)
    assert cpu.instance_group[0].kind == mc.ModelInstanceGroup.KIND_CPU and not cpu.instance_group[0].gpus
    assert cfg.instance_group[0].kind == mc.ModelInstanceGroup.KIND_GPU  # a copy


def test_execution_env_archives(tmp_path: Path) -> None:
    model_dir = _model(tmp_path, "")
    here = f"{sys.version_info.major}.{sys.version_info.minor}"
    _archive(model_dir / "good.tar.gz", [f"lib/python{here}/site-packages/x.py", "bin/python"])
    _archive(model_dir / "old.tar.gz", ["lib/python2.7/site-packages/x.py"])
    (model_dir / "broken.tar.gz").write_bytes((model_dir / "good.tar.gz").read_bytes()[:20])

    def env(name: str) -> list[str]:
        return static.warnings(_config(env=f"$$TRITON_MODEL_DIRECTORY/{name}"), model_dir, gpu_count=0)

    assert env("good.tar.gz") == []
    assert "its interpreter is Python 2.7" in env("old.tar.gz")[0]
    assert "the archive cannot be unpacked" in env("broken.tar.gz")[0]
    assert "the archive cannot be unpacked" in env("missing.tar.gz")[0]


def test_failure_names_the_models_frame_before_a_library_frame() -> None:
    text = ("SystemError: boom\n\nAt:\n  /usr/lib/python3/ctypes/__init__.py(519): string_at\n"
            "  /repo/m/1/model.py(7): initialize\n")
    assert (report.Failure.from_text(text).file, report.Failure.from_text(text).line) == (
        "/usr/lib/python3/ctypes/__init__.py", 519)
    assert (report.Failure.from_text(text, ["/repo"]).file, report.Failure.from_text(text, ["/repo"]).line) == (
        "/repo/m/1/model.py", 7)
    bad = report.Failure.from_text("model 'm': invalid config at /repo/m/config.pbtxt:3:17: nope")
    assert (bad.file, bad.line) == ("/repo/m/config.pbtxt", 3)
    assert report.Failure.from_text("no place named").file is None


def test_status_and_lines() -> None:
    ok = report.ModelResult("a", 0.5, 3 * 2**20, "one synthesised request", 1.25).settle(strict=False)
    warned = report.ModelResult("bb", 0.5, 0, "model_warmup ran (1 sample(s))", warnings=["w"])
    failed = report.ModelResult("c", error=report.Failure("first\nAt:\n  f.py(1): g\n", "f.py", 1)).settle(False)
    assert report.line(ok, 2) == "OK    a   load 0.50 s  rss +3.0 MiB  one synthesised request (1.2 ms)"
    assert warned.settle(strict=False).status == report.WARN and warned.settle(strict=True).status == report.FAIL
    assert report.line(failed, 2).splitlines() == ["FAIL  c   f.py:1: first", "      At:", "      f.py(1): g"]
    assert report.summary([ok, warned, failed]) == "3 model(s): 1 OK, 0 with warnings, 2 failed"
    assert report.document(["r"], True, [failed, ok])["ok"] is False


def test_crash_report_keeps_the_crashing_threads_frames() -> None:
    log = ["I1127 loading", "Fatal Python error: Segmentation fault", "", "Current thread 0x1 (most recent call first):",
           '  File "/r/m/1/model.py", line 7 in initialize', "", "Thread 0x2 (most recent call first):",
           '  File "/hub.py", line 1 in run', "Extension modules: numpy"]
    assert _crash_report(log) == log[1:2] + log[3:5]
    assert _crash_report(["no crash here"]) == []


def test_check_is_a_subcommand_and_the_tritonserver_command_line_is_unchanged(monkeypatch: pytest.MonkeyPatch) -> None:
    seen: list[list[str]] = []
    monkeypatch.setattr("triton_actor.check.command.main", lambda argv: seen.append(argv) or 3)

    def leave(code: int) -> None:
        raise SystemExit(code)

    monkeypatch.setattr(cli.os, "_exit", leave)
    with pytest.raises(SystemExit) as left:
        cli.main(["check", "repo", "--strict"])
    assert left.value.code == 3 and seen == [["repo", "--strict"]]

    class Served(Exception):
        pass

    def serve(argv: list[str]) -> None:
        raise Served(argv)

    monkeypatch.setattr(cli, "parse", serve)  # the server's path starts by parsing tritonserver's flags
    with pytest.raises(Served):  # a flag's value that happens to be "check" is not a subcommand
        cli.main(["--model-repository", "check"])
    assert seen == [["repo", "--strict"]]
