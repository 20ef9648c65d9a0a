"""repository/remote.py without a network: key safety, and a mirror following a fake store."""

from __future__ import annotations

from pathlib import Path

import pytest

from triton_actor.errors import TritonError
from triton_actor.repository import remote


class FakeStore:
    """An in-memory object store: key → bytes; the stamp is the content itself."""

    url = "fake://bucket/prefix"

    def __init__(self) -> None:
        self.objects: dict[str, bytes] = {}
        self.fetched: list[str] = []
        self.broken = False

    def list(self) -> dict[str, str]:
        if self.broken:
            raise ConnectionError("store down")
        return {k: v.hex() for k, v in self.objects.items()}

    def fetch(self, key: str, dest: Path) -> None:
        self.fetched.append(key)
        dest.write_bytes(self.objects[key])


@pytest.mark.parametrize("key", ["../x", "a/../../x", "/etc/passwd", "a//b", "a/./b", "a\\..\\b", "", "a/\x00"])
def test_unsafe_keys_are_refused(key: str) -> None:
    assert remote.safe_relative(key) is None


def test_safe_keys_are_relative_paths() -> None:
    assert str(remote.safe_relative("m/1/model.py")) == "m/1/model.py"
    assert str(remote.safe_relative("m/..hidden")) == "m/..hidden"  # a name that starts with dots is a name


@pytest.mark.parametrize(("location", "expected"), [("s3://b/p", True), ("gs://b", True), ("memory://x", True),
                                                    ("file:///tmp/m", False), ("/tmp/m", False), ("models", False)])
def test_is_remote(location: str, expected: bool) -> None:
    assert remote.is_remote(location) is expected


def test_mirror_follows_adds_changes_and_removals(tmp_path: Path) -> None:
    store = FakeStore()
    mirror = remote.RemoteRepository(store.url, str(tmp_path), store=store)
    store.objects = {"a/config.pbtxt": b"c", "a/1/model.py": b"v1", "../escape": b"no", "b/1/m": b"b"}
    assert mirror.sync() is True
    assert (mirror.root / "a/1/model.py").read_bytes() == b"v1"
    assert not list(tmp_path.rglob("escape"))
    assert mirror.sync() is False and len(store.fetched) == 3  # nothing changed: nothing fetched again

    store.objects["a/1/model.py"] = b"v2"
    del store.objects["b/1/m"]
    assert mirror.sync() is True
    assert (mirror.root / "a/1/model.py").read_bytes() == b"v2"
    assert not (mirror.root / "b").exists()  # emptied folders go too, so POLL sees the model gone
    assert store.fetched[-1] == "a/1/model.py"

    (mirror.root / "stray.txt").write_text("left by someone")  # the mirror owns its folder
    assert mirror.sync() is True and not (mirror.root / "stray.txt").exists()


def test_a_failing_store_raises_unavailable_and_keeps_the_files(tmp_path: Path) -> None:
    store = FakeStore()
    store.objects = {"a/1/model.py": b"v1"}
    mirror = remote.RemoteRepository(store.url, str(tmp_path), store=store)
    mirror.sync()
    store.broken = True
    with pytest.raises(TritonError) as e:
        mirror.sync()
    assert e.value.code.name == "UNAVAILABLE" and "store down" in e.value.message
    assert (mirror.root / "a/1/model.py").read_bytes() == b"v1"
    mirror.close()
    assert not mirror.root.exists()


def test_s3_url_forms(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("AWS_DEFAULT_REGION", "us-east-1")
    plain = remote.S3Store("s3://bucket/some/prefix/")
    assert (plain.bucket, plain.prefix) == ("bucket", "some/prefix/")
    root = remote.S3Store("s3://bucket")
    assert (root.bucket, root.prefix) == ("bucket", "")
    triton = remote.S3Store("s3://127.0.0.1:9000/bucket/models")  # Triton's form for a non-AWS endpoint
    assert (triton.bucket, triton.prefix) == ("bucket", "models/")
    assert triton._client.meta.endpoint_url == "http://127.0.0.1:9000"
    tls = remote.S3Store("s3://https://minio.local:9443/bucket")
    assert (tls.bucket, tls.prefix, tls._client.meta.endpoint_url) == ("bucket", "", "https://minio.local:9443")


def test_other_schemes_go_through_fsspec(tmp_path: Path) -> None:
    """fsspec's in-memory filesystem stands in for gs://, az://...: same listing and fetch calls."""
    fsspec = pytest.importorskip("fsspec")
    fs = fsspec.filesystem("memory")
    fs.pipe({"/repo-t/models/a/config.pbtxt": b"c", "/repo-t/models/a/1/model.py": b"v1"})
    try:
        mirror = remote.RemoteRepository("memory://repo-t/models", str(tmp_path))
        assert mirror.sync() is True
        assert (mirror.root / "a/1/model.py").read_bytes() == b"v1"
        fs.rm("/repo-t/models/a/1/model.py")
        assert mirror.sync() is True and not (mirror.root / "a/1").exists()
    finally:
        fs.rm("/repo-t", recursive=True)
