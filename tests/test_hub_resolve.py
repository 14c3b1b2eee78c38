"""Pinning sources against the real registry, git daemon and an http server on loopback."""

from __future__ import annotations

import hashlib
import http.server
import subprocess
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from hub.errors import ResolveError, SourceUnavailableError
from hub.fleet.model import Bundle, SourceRef
from hub.resolve import Resolver, ResolveSettings
from tests.realenv.gitserver import GitDaemon
from tests.realenv.oci import OciClient, push_bundle
from tests.realenv.registry import Registry, free_port


class _Quiet(http.server.SimpleHTTPRequestHandler):
    def log_message(self, format: str, *args: object) -> None:
        pass


class HttpFiles:
    """A real HTTP server on loopback serving ``root``; counts the GETs it answered."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.gets = 0
        outer = self

        class Handler(_Quiet):
            def __init__(self, *args: object, **kwargs: object) -> None:
                super().__init__(*args, directory=str(root), **kwargs)  # type: ignore[arg-type]

            def do_GET(self) -> None:
                outer.gets += 1
                super().do_GET()

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    def url(self, name: str) -> str:
        return f"http://127.0.0.1:{self.server.server_address[1]}/{name}"

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()
        self.thread.join(timeout=10)


@pytest.fixture(scope="module")
def http_files(tmp_path_factory: pytest.TempPathFactory) -> Iterator[HttpFiles]:
    server = HttpFiles(tmp_path_factory.mktemp("http-files"))
    yield server
    server.close()


def git(cwd: Path, *args: str) -> str:
    env = {
        "GIT_AUTHOR_NAME": "t",
        "GIT_AUTHOR_EMAIL": "t@example.invalid",
        "GIT_COMMITTER_NAME": "t",
        "GIT_COMMITTER_EMAIL": "t@example.invalid",
        "HOME": str(cwd),
        "PATH": "/usr/bin:/bin",
    }
    done = subprocess.run(
        ["git", *args], cwd=cwd, env=env, capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0, f"git {' '.join(args)}: {done.stderr}"
    return done.stdout.strip()


def make_git_source(server: GitDaemon, name: str, work: Path, content: str = "a") -> str:
    """A repo on ``server`` with branch main and annotated tag v1; returns main's commit."""
    server.create_bare(name)
    work.mkdir(parents=True, exist_ok=True)
    git(work, "init", "-q", "-b", "main")
    (work / "deploy").mkdir(exist_ok=True)
    (work / "deploy" / "cm.yaml").write_text(f"kind: ConfigMap\ndata: {{x: {content}}}\n")
    git(work, "add", "-A")
    git(work, "commit", "-q", "-m", "content")
    git(work, "tag", "-a", "v1", "-m", "release v1")
    git(work, "push", "-q", server.url_for(name), "main", "v1")
    return git(work, "rev-parse", "HEAD")


def push_image(registry: Registry, repo: str, tag: str, tmp: Path, content: str) -> str:
    d = tmp / f"{repo.replace('/', '_')}-{tag}-{content}"
    d.mkdir(parents=True, exist_ok=True)
    (d / "cm.yaml").write_text(f"kind: ConfigMap\ndata: {{x: {content}}}\n")
    return push_bundle(OciClient(host=registry.host), repo, d, tag=tag).digest


def bundle(name: str, *sources: SourceRef) -> Bundle:
    return Bundle(
        name=name, file=f"bundles/{name}.yaml", sources=sources, spec={}, targets=(), overrides=()
    )


def test_oci_tag_is_pinned_to_the_manifest_digest_with_one_request(
    registry: Registry, tmp_path: Path
) -> None:
    digest = push_image(registry, "hub/resolve-web", "v1", tmp_path, "one")
    ref = SourceRef(kind="image", uri=f"{registry.host}/hub/resolve-web", ref_field="tag", ref="v1")
    mark = registry.request_count()
    with Resolver() as resolver:
        # Ten bundles use the same tag: one HEAD on the registry.
        pins = resolver.resolve_bundles([bundle(f"b{i}", ref) for i in range(10)])
    assert pins == {ref: digest}
    served = registry.requests(since=mark)
    assert [(r.method, r.path) for r in served] == [("HEAD", "/v2/hub/resolve-web/manifests/v1")]


def test_moving_a_tag_gives_the_new_digest(registry: Registry, tmp_path: Path) -> None:
    first = push_image(registry, "hub/resolve-move", "stable", tmp_path, "one")
    second = push_image(registry, "hub/resolve-move", "stable", tmp_path, "two")
    assert first != second
    ref = SourceRef(
        kind="image", uri=f"http://{registry.host}/hub/resolve-move", ref_field="tag", ref="stable"
    )
    with Resolver() as resolver:
        assert resolver.resolve_bundles([bundle("web", ref)]) == {ref: second}


def test_unknown_tag_names_bundle_and_reference(registry: Registry) -> None:
    ref = SourceRef(kind="image", uri=f"{registry.host}/hub/nothing", ref_field="tag", ref="v9")
    with Resolver() as resolver, pytest.raises(ResolveError) as caught:
        resolver.resolve_bundles([bundle("web", ref)])
    assert caught.value.failures == [
        (
            "web",
            f"image {registry.host}/hub/nothing:v9 (tag)",
            f"tag not found in {registry.host}/hub/nothing",
        )
    ]
    assert "bundle 'web'" in str(caught.value)


def test_dead_registry_is_temporary_and_bounded() -> None:
    port = free_port()  # nothing listens there
    ref = SourceRef(kind="image", uri=f"127.0.0.1:{port}/x", ref_field="tag", ref="v1")
    settings = ResolveSettings(attempts=2, backoff=0.01, timeout=2.0)
    with Resolver(settings=settings) as resolver, pytest.raises(SourceUnavailableError) as caught:
        resolver.resolve_bundles([bundle("web", ref)])
    assert "registry unreachable after 2 attempts" in str(caught.value)
    assert "bundle 'web'" in str(caught.value)


def test_git_branch_and_annotated_tag_resolve_with_one_listing(
    git_daemon: GitDaemon, tmp_path: Path
) -> None:
    head = make_git_source(git_daemon, "resolve-src.git", tmp_path / "src")
    url = git_daemon.url_for("resolve-src.git")
    branch = SourceRef(kind="git", uri=url, ref_field="branch", ref="main")
    tag = SourceRef(kind="git", uri=url, ref_field="tag", ref="v1")
    with Resolver() as resolver:
        pins = resolver.resolve_bundles([bundle("a", branch), bundle("b", tag)])
        assert resolver.requests["git"] == 1
    # The annotated tag is peeled to the commit it points to.
    assert pins == {branch: head, tag: head}


def test_missing_git_branch_fails_naming_it(git_daemon: GitDaemon, tmp_path: Path) -> None:
    make_git_source(git_daemon, "resolve-nobranch.git", tmp_path / "src")
    url = git_daemon.url_for("resolve-nobranch.git")
    ref = SourceRef(kind="git", uri=url, ref_field="branch", ref="release-9")
    with Resolver() as resolver, pytest.raises(ResolveError) as caught:
        resolver.resolve_bundles([bundle("db", ref)])
    assert f"bundle 'db': cannot resolve git {url}:release-9 (branch): no branch 'release-9'" in (
        str(caught.value)
    )


def test_http_url_is_hashed_once(http_files: HttpFiles) -> None:
    payload = b"archive bytes " * 1000
    (http_files.root / "app.tgz").write_bytes(payload)
    ref = SourceRef(
        kind="http", uri=http_files.url("app.tgz"), ref_field="url", ref=http_files.url("app.tgz")
    )
    before = http_files.gets
    with Resolver() as resolver:
        pins = resolver.resolve_bundles([bundle("a", ref), bundle("b", ref)])
    assert pins == {ref: hashlib.sha256(payload).hexdigest()}
    assert http_files.gets - before == 1


def test_http_404_and_oversize_are_clear(http_files: HttpFiles) -> None:
    (http_files.root / "big.tgz").write_bytes(b"x" * 5000)
    missing = SourceRef(
        kind="http", uri=http_files.url("gone.tgz"), ref_field="url", ref=http_files.url("gone.tgz")
    )
    big = SourceRef(
        kind="http", uri=http_files.url("big.tgz"), ref_field="url", ref=http_files.url("big.tgz")
    )
    settings = ResolveSettings(max_download_bytes=1000)
    with Resolver(settings=settings) as resolver, pytest.raises(ResolveError) as caught:
        resolver.resolve_bundles([bundle("a", missing), bundle("b", big)])
    problems = {b: p for b, _, p in caught.value.failures}
    assert problems["a"] == "HTTP 404 File not found"
    assert "more than the 1000 allowed" in problems["b"]


def test_pinned_references_cost_no_request() -> None:
    ref = SourceRef(kind="image", uri="127.0.0.1:1/x", ref_field="digest", ref="sha256:" + "c" * 64)
    with Resolver() as resolver:
        assert resolver.resolve_bundles([bundle("a", ref)]) == {ref: "sha256:" + "c" * 64}
        assert resolver.requests == {"image": 0, "git": 0, "http": 0, "helm": 0}


def test_tags_on_an_htpasswd_registry_resolve_with_credentials(
    auth_registry: Registry, tmp_path: Path
) -> None:
    from tests.realenv.registry_fixtures import REGISTRY_PASSWORD, REGISTRY_USER

    d = tmp_path / "content"
    d.mkdir()
    (d / "cm.yaml").write_text("kind: ConfigMap\n")
    client = OciClient(host=auth_registry.host, username=REGISTRY_USER, password=REGISTRY_PASSWORD)
    digest = push_bundle(client, "hub/private", d, tag="v1").digest
    ref = SourceRef(
        kind="image", uri=f"{auth_registry.host}/hub/private", ref_field="tag", ref="v1"
    )
    creds = {auth_registry.host: (REGISTRY_USER, REGISTRY_PASSWORD)}
    with Resolver(settings=ResolveSettings(registry_credentials=creds)) as resolver:
        assert resolver.resolve_bundles([bundle("a", ref)]) == {ref: digest}
    # Without credentials the registry refuses: a clear, permanent failure.
    with Resolver() as resolver, pytest.raises(ResolveError, match="refused access"):
        resolver.resolve_bundles([bundle("a", ref)])
