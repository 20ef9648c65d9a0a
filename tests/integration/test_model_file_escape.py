"""Nothing outside a model's version folder is read, compiled or imported, whatever a load request says.

A load-API config override whose ``default_model_filename`` is an absolute path, climbs out with ``..``,
or names a symlink out of the folder must be refused before the file is imported (auto-complete runs
``model.py``'s top level, so the check has to come first). The bait writes a marker file if it ever runs.
"""

from __future__ import annotations

import json
from pathlib import Path

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
