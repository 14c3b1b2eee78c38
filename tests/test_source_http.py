"""http sources against a real loopback HTTP server: sha256 pin, size cap, auth, archives."""

from __future__ import annotations

import base64
import gzip
import hashlib
import socket
import tarfile
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from agent.source.archive import UnsafeArchiveError
from agent.source.cache import ContentCache
from agent.source.compose import ContentStore
from agent.source.content import AuthenticationError, Credentials, DigestMismatchError, FetchError
from agent.source.http import DownloadTooLargeError, HttpFetcher, HttpSettings
from tests.hostile import Src
from tests.hostile.archives import GOOD_YAML, entry, tar

SETTINGS = HttpSettings(attempts=3, backoff=0.05, timeout=5.0, max_bytes=1024 * 1024)


class _Server(ThreadingHTTPServer):
    daemon_threads = True

    def __init__(self) -> None:
        super().__init__(("127.0.0.1", 0), _Handler)
        self.files: dict[str, bytes] = {}
        self.protected: set[str] = set()
        self.hits: list[str] = []

    @property
    def base(self) -> str:
        return f"http://127.0.0.1:{self.server_address[1]}"


class _Handler(BaseHTTPRequestHandler):
    server: _Server

    def log_message(self, format: str, *args: object) -> None:
        return None

    def do_GET(self) -> None:
        self.server.hits.append(self.path)
        if self.path in self.server.protected:
            expected = base64.b64encode(b"user:secret").decode()
            if self.headers.get("Authorization") != f"Basic {expected}":
                self.send_response(401)
                self.send_header("WWW-Authenticate", 'Basic realm="t"')
                self.send_header("Content-Length", "0")
                self.end_headers()
                return
        if self.path == "/endless":
            # No Content-Length: only the streaming cap can stop it.
            self.send_response(200)
            self.end_headers()
            try:
                for _ in range(10_000):
                    self.wfile.write(b"x" * 65536)
            except OSError:
                pass
            return
        data = self.server.files.get(self.path)
        if data is None:
            self.send_response(404)
            self.send_header("Content-Length", "0")
            self.end_headers()
            return
        self.send_response(200)
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)


@pytest.fixture
def server() -> Iterator[_Server]:
    running = _Server()
    thread = threading.Thread(target=running.serve_forever, daemon=True)
    thread.start()
    yield running
    running.shutdown()
    running.server_close()
    thread.join(timeout=10)


def _sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def _tree(root: Path) -> dict[str, bytes]:
    return {p.relative_to(root).as_posix(): p.read_bytes() for p in root.rglob("*") if p.is_file()}


def _store(tmp_path: Path) -> ContentStore:
    cache = ContentCache(root=tmp_path / "cache", max_bytes=1 << 26)
    return ContentStore(cache=cache, http=HttpFetcher(settings=SETTINGS))


def test_archive_download_is_checked_unpacked_and_cached(server: _Server, tmp_path: Path) -> None:
    archive = tar(
        entry("manifests/", kind=tarfile.DIRTYPE), entry("manifests/01_cm.yaml", data=GOOD_YAML)
    )
    server.files["/bundle.tar.gz"] = archive
    store = _store(tmp_path)
    source = Src("http", f"{server.base}/bundle.tar.gz", sha256=f"sha256:{_sha(archive)}")

    tree = store.tree(source)
    store.tree(source)

    assert _tree(tree) == {"manifests/01_cm.yaml": GOOD_YAML}
    assert server.hits == ["/bundle.tar.gz"]


def test_single_manifest_file_keeps_its_name(server: _Server, tmp_path: Path) -> None:
    server.files["/app.yaml"] = GOOD_YAML
    tree = _store(tmp_path).tree(Src("http", f"{server.base}/app.yaml", sha256=_sha(GOOD_YAML)))
    assert _tree(tree) == {"app.yaml": GOOD_YAML}


def test_sha256_mismatch_is_refused_and_not_cached(server: _Server, tmp_path: Path) -> None:
    server.files["/app.yaml"] = GOOD_YAML
    store = _store(tmp_path)
    pin = _sha(GOOD_YAML + b"# edited\n")

    with pytest.raises(DigestMismatchError) as refused:
        store.tree(Src("http", f"{server.base}/app.yaml", sha256=pin))

    assert refused.value.rule == "Sha256Mismatch"
    assert pin in str(refused.value) and _sha(GOOD_YAML) in str(refused.value)
    assert store.cache.keys() == []


def test_download_larger_than_the_cap_is_cut_short(server: _Server, tmp_path: Path) -> None:
    server.files["/big.yaml"] = b"#" * (SETTINGS.max_bytes + 1)
    with pytest.raises(DownloadTooLargeError) as announced:
        _store(tmp_path).tree(Src("http", f"{server.base}/big.yaml", sha256="0" * 64))
    with pytest.raises(DownloadTooLargeError) as streamed:
        _store(tmp_path).tree(Src("http", f"{server.base}/endless", sha256="0" * 64))
    assert announced.value.rule == streamed.value.rule == "DownloadTooLarge"


def test_basic_auth(server: _Server, tmp_path: Path) -> None:
    server.files["/private.yaml"] = GOOD_YAML
    server.protected.add("/private.yaml")
    fetcher = HttpFetcher(settings=SETTINGS)
    uri = f"{server.base}/private.yaml"

    with pytest.raises(AuthenticationError):
        fetcher.fetch(
            uri=uri,
            sha256=_sha(GOOD_YAML),
            dest=tmp_path / "no",
            credentials=Credentials(username="user", password="wrong"),
        )
    fetcher.fetch(
        uri=uri,
        sha256=_sha(GOOD_YAML),
        dest=tmp_path / "yes",
        credentials=Credentials(username="user", password="secret"),
    )

    assert _tree(tmp_path / "yes") == {"private.yaml": GOOD_YAML}
    assert server.hits == ["/private.yaml", "/private.yaml"]  # the refusal was not retried


def test_hostile_archive_over_http_is_refused(server: _Server, tmp_path: Path) -> None:
    archive = tar(entry("../escape.yaml", data=GOOD_YAML))
    server.files["/evil.tar.gz"] = archive
    with pytest.raises(UnsafeArchiveError) as refused:
        _store(tmp_path).tree(Src("http", f"{server.base}/evil.tar.gz", sha256=_sha(archive)))
    assert refused.value.rule == "PathTraversal"
    assert refused.value.file == "evil.tar.gz!../escape.yaml"


def test_server_down_is_temporary_with_bounded_attempts(tmp_path: Path) -> None:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    fetcher = HttpFetcher(settings=SETTINGS)
    with pytest.raises(FetchError) as down:
        fetcher.fetch(uri=f"http://127.0.0.1:{port}/x.yaml", sha256="0" * 64, dest=tmp_path / "o")
    assert fetcher.attempts_made == SETTINGS.attempts
    assert f"after {SETTINGS.attempts} attempts" in str(down.value)


def test_gzip_single_file_that_is_not_a_tar_is_refused(server: _Server, tmp_path: Path) -> None:
    data = gzip.compress(GOOD_YAML, mtime=0)
    server.files["/app.yaml.gz"] = data
    with pytest.raises(UnsafeArchiveError) as refused:
        _store(tmp_path).tree(Src("http", f"{server.base}/app.yaml.gz", sha256=_sha(data)))
    assert refused.value.rule == "CorruptArchive"
