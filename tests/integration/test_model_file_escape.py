"""Nothing outside a model's version folder is read, compiled or imported, whatever a load request says.

A load-API config override whose ``default_model_filename`` is an absolute path, climbs out with ``..``,
or names a symlink out of the folder must be refused before the file is imported (auto-complete runs
``model.py``'s top level, so the check has to come first). The bait writes a marker file if it ever runs.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import tritonclient.http as httpclient

from .server import IDENTITY_PY, add_model

CONFIG = {"name": "m", "backend": "python", "input": [{"name": "INPUT0", "data_type": "TYPE_FP32", "dims": [1]}],
          "output": [{"name": "OUTPUT0", "data_type": "TYPE_FP32", "dims": [1]}]}


@pytest.fixture
def bait(tmp_path: Path) -> tuple[Path, Path]:
    marker = tmp_path / "ran"
    evil = tmp_path / "evil.py"
    evil.write_text(f"open({str(marker)!r}, 'w').write('imported')\n")
    return evil, marker


def test_a_model_file_outside_the_version_folder_is_never_imported(tmp_path: Path, start_server, bait) -> None:
    evil, marker = bait
    repo = tmp_path / "repo"
    version_dir = add_model(repo, "m", None, IDENTITY_PY) / "1"
    (version_dir / "link.py").symlink_to(evil)
    server = start_server(repo, flags=("--model-control-mode=explicit",))
    client = httpclient.InferenceServerClient(server.url)
    try:
        for name in (str(evil), "../../evil.py", "link.py"):
            config = json.dumps(dict(CONFIG, default_model_filename=name))
            with pytest.raises(httpclient.InferenceServerException) as info:
                client.load_model("m", config=config)
            assert "version folder" in info.value.message(), info.value.message()
            assert not marker.exists(), f"{name!r} was imported"
        client.load_model("m", config=json.dumps(CONFIG))  # the model itself still loads
        assert client.is_model_ready("m")
    finally:
        client.close()


def test_an_initial_state_file_outside_the_model_folder_is_never_read(tmp_path: Path, start_server) -> None:
    """A sequence state's ``initial_state { data_file }`` names a file of ``<model>/initial_state``. It was
    joined to that folder unchecked, so a config (a load request's override, or a file in an object-store
    repository) could read any file on the host into the state that the model's answers echo back
    (``/etc/passwd`` through an identity model). Now it must be a file in that folder, of the state's size."""
    from .test_sequence import REPORT_PY, _seq_config

    secret = tmp_path / "secret.bin"
    secret.write_bytes(np.int32(1234).tobytes())
    repo = tmp_path / "repo"
    model_dir = add_model(repo, "seq", _seq_config("seq").replace("zero_data: true", 'data_file: "seven.bin"'),
                          REPORT_PY)
    (model_dir / "initial_state").mkdir()
    (model_dir / "initial_state" / "seven.bin").write_bytes(np.int32(7).tobytes())
    (model_dir / "initial_state" / "short.bin").write_bytes(b"\0\0")
    server = start_server(repo, flags=("--model-control-mode=explicit", "--load-model=seq"))
    client = httpclient.InferenceServerClient(server.url)
    try:
        x = httpclient.InferInput("INPUT", [1, 1], "INT32")
        x.set_data_from_numpy(np.array([[5]], dtype=np.int32))
        result = client.infer("seq", [x], sequence_id=1, sequence_start=True)
        assert int(result.as_numpy("SUM").flatten()[0]) == 7 + 5  # the model's own file
        config = client.get_model_config("seq")
        for name, text in ((str(secret), "not a file in the model's initial_state folder"),
                           ("../../secret.bin", "not a file in the model's initial_state folder"),
                           ("../config.pbtxt", "not a file in the model's initial_state folder"),
                           ("short.bin", "holds 2 bytes, dims [1] need 4")):
            config["sequence_batching"]["state"][0]["initial_state"][0]["data_file"] = name
            with pytest.raises(httpclient.InferenceServerException) as info:
                client.load_model("seq", config=json.dumps(config))
            assert text in info.value.message(), (name, info.value.message())
        result = client.infer("seq", [x], sequence_id=2, sequence_start=True)
        assert int(result.as_numpy("SUM").flatten()[0]) == 12, "the loaded version kept serving"
    finally:
        client.close()
