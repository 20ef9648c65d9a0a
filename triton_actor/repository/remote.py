"""Model repositories on object stores: ``--model-repository s3://bucket/prefix`` (and other fsspec schemes).

As Triton does, a remote repository is downloaded to a local folder and models are loaded from there
(Triton: a temp folder, or ``TRITON_AWS_MOUNT_DIRECTORY``); backends only ever read local files. A
:class:`RemoteRepository` mirrors one prefix into its cache folder: :meth:`~RemoteRepository.sync` lists
the prefix, downloads what is new or changed, deletes what is gone, and says whether anything changed.
The repository actor then sees an ordinary folder: POLL reconciles it (the server re-syncs every
``--repository-poll-secs`` and nudges a rescan when something changed), EXPLICIT re-syncs before a load.

Stores: ``s3://`` goes through boto3 (s3fs needs aiobotocore, whose botocore pin clashes with the boto3
that moto and our pins install, and runs asyncio under gevent); every other scheme (``gs://``, ``az://``,
``memory://``...) goes through fsspec and the scheme's fsspec package, imported only when used.
Credentials and endpoint come from the usual environment, as in Triton: ``AWS_ACCESS_KEY_ID``,
``AWS_SECRET_ACCESS_KEY``, ``AWS_SESSION_TOKEN``, ``AWS_DEFAULT_REGION``, ``AWS_ENDPOINT_URL`` (or
Triton's ``s3://host:port/bucket/prefix`` form for a non-AWS endpoint, plain HTTP).

Owner: the server creates one RemoteRepository per remote repository; it alone writes its cache folder.
``sync`` runs in the calling greenlet (boto3's sockets are cooperative once gevent patched them) and is
serialized by a lock, since a POLL tick and an EXPLICIT load may ask at once. Safety: an object key that
is absolute, holds ``..``/``.``/empty segments or a backslash is refused (logged, never written), and every
destination is checked to resolve inside the cache folder. Failure: a listing or download error raises
:class:`~..errors.TritonError` (UNAVAILABLE); files are written to a staging folder beside the mirror and
renamed into place, so what the mirror holds is always whole files, and the next sync retries.
"""

from __future__ import annotations

import logging
import os
import re
import shutil
import tempfile
import uuid
from pathlib import Path, PurePosixPath
from typing import Any, Protocol

from ..errors import TritonError

log = logging.getLogger(__name__)
_SCHEME = re.compile(r"^([a-zA-Z][a-zA-Z0-9+.-]*)://")
_HOST_PORT = re.compile(r"^(?:(https?)://)?([A-Za-z0-9.-]+):(\d+)/(.*)$")


def is_remote(location: str) -> bool:
    """A ``scheme://`` repository that is not a local path (``file://`` counts as local)."""
    m = _SCHEME.match(location)
    return m is not None and m.group(1).lower() != "file"


def safe_relative(key: str) -> PurePosixPath | None:
    """An object key (relative to the prefix) as a relative path, or None when it could leave the folder."""
    if not key or key.startswith("/") or "\\" in key or "\x00" in key:
        return None
    parts = key.split("/")
    if any(p in ("", ".", "..") for p in parts):
        return None
    return PurePosixPath(*parts)


class ObjectStore(Protocol):
    """The few calls a mirror needs (a narrow fsspec-like seam)."""

    url: str

    def list(self) -> dict[str, str]:
        """Every object under the prefix: key relative to the prefix → a stamp that changes with its content."""
        ...

    def fetch(self, key: str, dest: Path) -> None:
        """Write the object ``key`` (relative to the prefix) to the local file ``dest``."""
        ...


class S3Store:
    """``s3://bucket/prefix`` (or ``s3://[http(s)://]host:port/bucket/prefix``) through boto3."""

    def __init__(self, url: str) -> None:
        import boto3  # optional dependency: `pip install triton-actor[s3]`

        self.url = url
        rest = url[len("s3://"):]
        endpoint = None
        m = _HOST_PORT.match(rest)
        if m:
            endpoint = f"{m.group(1) or 'http'}://{m.group(2)}:{m.group(3)}"
            rest = m.group(4)
        bucket, _, prefix = rest.partition("/")
        if not bucket:
            raise TritonError.invalid_arg(f"no bucket in model repository '{url}'")
        self.bucket = bucket
        self.prefix = prefix.strip("/") + "/" if prefix.strip("/") else ""
        self._client = boto3.session.Session().client("s3", endpoint_url=endpoint)

    def list(self) -> dict[str, str]:
        found: dict[str, str] = {}
        pages = self._client.get_paginator("list_objects_v2").paginate(Bucket=self.bucket, Prefix=self.prefix)
        for page in pages:
            for obj in page.get("Contents", ()):
                key = obj["Key"][len(self.prefix):]
                if key and not key.endswith("/"):  # "folder/" keys are the console's directory markers
                    found[key] = f"{obj.get('ETag', '')}:{obj['Size']}:{obj['LastModified'].isoformat()}"
        return found

    def fetch(self, key: str, dest: Path) -> None:
        body = self._client.get_object(Bucket=self.bucket, Key=self.prefix + key)["Body"]
        with open(dest, "wb") as f:
            for chunk in body.iter_chunks(1 << 20):
                f.write(chunk)


class FsspecStore:
    """Any other fsspec scheme (``gs://``, ``az://``, ``memory://``...), with the scheme's package installed."""

    def __init__(self, url: str) -> None:
        import fsspec.core  # optional dependency: `pip install triton-actor[fsspec]` and the scheme's package

        self.url = url
        self._fs, root = fsspec.core.url_to_fs(url)
        self._root = root.rstrip("/")

    def list(self) -> dict[str, str]:
        found: dict[str, str] = {}
        for path, info in self._fs.find(self._root, detail=True).items():
            if info.get("type") == "directory":
                continue
            key = path[len(self._root):].lstrip("/") if path.startswith(self._root) else ""
            if key:
                stamp = [info.get(k) for k in ("ETag", "etag", "md5", "mtime", "LastModified", "created", "size")]
                found[key] = repr(stamp)
        return found

    def fetch(self, key: str, dest: Path) -> None:
        self._fs.get_file(f"{self._root}/{key}", str(dest))


def open_store(url: str) -> ObjectStore:
    return S3Store(url) if url.lower().startswith("s3://") else FsspecStore(url)


class RemoteRepository:
    """Mirrors one remote prefix into ``self.root`` (a local folder the repository actor reads)."""

    def __init__(self, url: str, cache_base: str = "", store: ObjectStore | None = None) -> None:
        self.url = url
        self._store = store
        self._base = Path(tempfile.mkdtemp(prefix="triton-actor-repo-", dir=cache_base or None)).resolve()
        self.root = self._base / "repository"  # what the repository actor reads
        self._staging = self._base / "partial"  # downloads land here, then are renamed into root
        self.root.mkdir()
        self._staging.mkdir()
        self._stamps: dict[str, str] = {}
        import gevent.lock  # here, not at import: the CLI imports this module before gevent is patched

        self._lock = gevent.lock.Semaphore()
        self._refused: set[str] = set()

    def sync(self) -> bool:
        """Make ``root`` hold exactly what is under the prefix now; True when a file was added, changed or
        removed. Raises TritonError (UNAVAILABLE) when the store cannot be listed or read."""
        with self._lock:
            try:
                if self._store is None:
                    self._store = open_store(self.url)
                listing = self._store.list()
                wanted = {str(p): stamp for key, stamp in listing.items() if (p := self._accept(key)) is not None}
                changed = [self._download(key, stamp) for key, stamp in sorted(wanted.items())
                           if self._stamps.get(key) != stamp or not (self.root / key).is_file()]
            except TritonError:
                raise
            except Exception as e:  # boto3 / fsspec raise their own types
                raise TritonError.unavailable(f"failed to read model repository '{self.url}': {e}") from e
            removed = self._prune(set(wanted))
            if changed or removed:
                log.info("model repository %s: %d file(s) downloaded, %d removed", self.url, len(changed), removed)
            return bool(changed or removed)

    def close(self) -> None:
        """Remove the cache folder (at shutdown)."""
        shutil.rmtree(self._base, ignore_errors=True)

    def _accept(self, key: str) -> PurePosixPath | None:
        rel = safe_relative(key)
        if rel is None or not _inside(self.root / rel, self.root):
            if key not in self._refused:
                self._refused.add(key)
                log.error("model repository %s: object key %r refused (it would leave the repository folder)",
                          self.url, key)
            return None
        return rel

    def _download(self, key: str, stamp: str) -> str:
        dest = self.root / key
        tmp = self._staging / uuid.uuid4().hex
        try:
            self._store.fetch(key, tmp)  # type: ignore[union-attr]
            if dest.is_dir():
                shutil.rmtree(dest)  # a folder became a file
            dest.parent.mkdir(parents=True, exist_ok=True)
            os.replace(tmp, dest)
        finally:
            tmp.unlink(missing_ok=True)
        self._stamps[key] = stamp
        return key

    def _prune(self, wanted: set[str]) -> int:
        """Delete local files that are not in ``wanted`` (removed remotely), then empty folders."""
        removed = 0
        for dirpath, _dirs, filenames in os.walk(self.root, topdown=False):
            for name in filenames:
                path = Path(dirpath, name)
                key = path.relative_to(self.root).as_posix()
                if key not in wanted:
                    path.unlink(missing_ok=True)
                    self._stamps.pop(key, None)
                    removed += 1
            if Path(dirpath) != self.root and not os.listdir(dirpath):
                os.rmdir(dirpath)
        return removed


def _inside(path: Path, root: Path) -> bool:
    return Path(os.path.abspath(path)).is_relative_to(root)


def poll(mirrors: list[RemoteRepository], period: float, changed: Any) -> None:
    """Greenlet (owned by the server, POLL mode): re-sync every mirror each ``period`` seconds and call
    ``changed()`` (the repository actor's nudge) when one of them changed. A failed sync is logged and
    retried on the next tick; the models keep serving what they loaded."""
    import gevent

    while True:
        gevent.sleep(period)
        dirty = False
        for mirror in mirrors:
            try:
                dirty = mirror.sync() or dirty
            except TritonError as e:
                log.error("poll: %s", e.message)
            except Exception:  # e.g. an OSError in the cache folder: log it, keep polling
                log.exception("poll: syncing model repository %s failed", mirror.url)
        if dirty:
            changed()
