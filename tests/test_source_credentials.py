"""Issue 28 item 6: a source's ``auth.secretRef`` only opens Secrets meant for source
credentials, and a credential goes only to the host it was made for.

Against the real API server (the Secrets are real objects of a namespace, read by the agent's
own resolver), the real registry and git server with basic auth (what they were asked, and by
whom, is read from their logs), and a loopback http redirector for the redirect case.
"""

from __future__ import annotations

import base64
import hashlib
import threading
import uuid
from collections.abc import Callable, Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest

from agent.api import Source
from agent.api.models import SecretReference, SourceAuth
from agent.inbound import read_source_credentials
from agent.kube import KubeClient
from agent.source.cache import ContentCache
from agent.source.compose import (
    SOURCE_CREDENTIAL_LABEL,
    SOURCE_HOSTS_ANNOTATION,
    ContentStore,
    CredentialNotForHostError,
    CredentialNotForSourcesError,
)
from agent.source.content import AuthenticationError, Credentials
from agent.source.git import GitFetcher
from agent.source.http import HttpFetcher
from agent.source.oci import OciFetcher, OciSettings
from tests.hostile import commit_files
from tests.realenv.git_fixtures import GIT_PASSWORD, GIT_USER
from tests.realenv.gitserver import GitHttpServer
from tests.realenv.kube import Cluster
from tests.realenv.oci import OciClient, push_bundle
from tests.realenv.registry import Registry
from tests.realenv.registry_fixtures import REGISTRY_PASSWORD, REGISTRY_USER

Resolver = Callable[[str, str], Credentials | None]


def _secret(kube: KubeClient, namespace: str, name: str, data: dict[str, str], *,
            source: bool = True, hosts: str | None = None,
            labels: dict[str, str] | None = None) -> None:  # fmt: skip
    meta: dict[str, Any] = {"name": name, "namespace": namespace,
                            "labels": {**(labels or {})}, "annotations": {}}  # fmt: skip
    if source:
        meta["labels"][SOURCE_CREDENTIAL_LABEL] = "true"
    if hosts is not None:
        meta["annotations"][SOURCE_HOSTS_ANNOTATION] = hosts
    kube.create({"apiVersion": "v1", "kind": "Secret", "metadata": meta, "type": "Opaque",
                 "data": {k: base64.b64encode(v.encode()).decode() for k, v in data.items()}})  # fmt: skip


@pytest.fixture
def kube(kube_cluster: Cluster, tmp_path: Path) -> Iterator[KubeClient]:
    with KubeClient(
        kubeconfig=str(kube_cluster.kubeconfig), discovery_cache_dir=tmp_path / "discovery"
    ) as client:
        yield client


def _store(tmp_path: Path) -> ContentStore:
    return ContentStore(
        cache=ContentCache(root=tmp_path / "cache", max_bytes=1 << 26),
        oci=OciFetcher(settings=OciSettings(plain_http=True)),
        git=GitFetcher(repos_dir=tmp_path / "repos"),
        http=HttpFetcher(),
    )


def _git_source(git_http: GitHttpServer, tmp_path: Path, secret: str) -> Source:
    repo = f"private-{uuid.uuid4().hex[:8]}.git"
    commit = commit_files(git_http.create_bare(repo), tmp_path / "work",
                          {"cm.yaml": b"apiVersion: v1\nkind: ConfigMap\nmetadata: {name: x}\n"})  # fmt: skip
    return Source(kind="git", uri=git_http.url_for(repo), commit=commit,
                  auth=SourceAuth(secret_ref=SecretReference(name=secret)))  # fmt: skip


def test_only_secrets_meant_for_sources_and_only_for_their_hosts(
    kube: KubeClient, namespace: str, auth_registry: Registry, git_http: GitHttpServer,
    tmp_path: Path,
) -> None:  # fmt: skip
    def resolve(name: str, host: str) -> Credentials:
        return read_source_credentials(kube, namespace, name, host)

    git_pair = {"username": GIT_USER, "password": GIT_PASSWORD}
    # The agent's own git credentials (what install writes: no source label).
    _secret(kube, namespace, "fleetlet-git-credentials", git_pair, source=False)
    # A bundle's outputs Secret, even if someone labelled it for sources.
    _secret(kube, namespace, "fleetlet-outputs-web", git_pair, hosts=git_http.host,
            labels={"fleetlet.io/outputs-of": "web"})  # fmt: skip
    # Labelled, but naming no host.
    _secret(kube, namespace, "no-hosts", git_pair)
    # Meant for the registry alone.
    _secret(kube, namespace, "registry-only",
            {"username": REGISTRY_USER, "password": REGISTRY_PASSWORD}, hosts=auth_registry.host)  # fmt: skip
    # Meant for the git server.
    _secret(kube, namespace, "git-ok", git_pair, hosts=git_http.host)

    store = _store(tmp_path)
    mark = len(git_http.requests())
    for name in ("fleetlet-git-credentials", "fleetlet-outputs-web", "no-hosts"):
        source = _git_source(git_http, tmp_path / name, name)
        with pytest.raises(CredentialNotForSourcesError) as refused:
            store.compose([source], tmp_path / f"b-{name}", credentials=resolve)
        assert f"Secret {namespace}/{name}" in str(refused.value)
        assert refused.value.reason == "CredentialNotForSources"
    # The registry's credentials named by a source on the git server: not sent there.
    source = _git_source(git_http, tmp_path / "cross", "registry-only")
    with pytest.raises(CredentialNotForHostError) as crossed:
        store.compose([source], tmp_path / "b-cross", credentials=resolve)
    assert f"not for {git_http.host}: not sent" in str(crossed.value)
    # None of the four asked the git server anything with a credential.
    assert not [r for r in git_http.requests()[mark:] if r.user]

    # Each credential where it belongs works.
    good = _git_source(git_http, tmp_path / "good", "git-ok")
    tree = store.compose([good], tmp_path / "b-good", credentials=resolve)
    assert (tree / "cm.yaml").is_file()
    assert [r.user for r in git_http.requests()[mark:] if r.user] and all(
        r.user == GIT_USER for r in git_http.requests()[mark:] if r.user
    )
    pusher = OciClient(host=auth_registry.host, username=REGISTRY_USER, password=REGISTRY_PASSWORD)
    content = tmp_path / "image"
    content.mkdir()
    (content / "cm.yaml").write_bytes(b"apiVersion: v1\nkind: ConfigMap\nmetadata: {name: y}\n")
    name = f"bundles/bound-{uuid.uuid4().hex[:8]}"
    image = push_bundle(pusher, name, content)
    source = Source(kind="image", uri=f"{auth_registry.host}/{name}", digest=image.digest,
                    auth=SourceAuth(secret_ref=SecretReference(name="registry-only")))  # fmt: skip
    assert (
        store.compose([source], tmp_path / "b-image", credentials=resolve) / "cm.yaml"
    ).is_file()


class _Hop(ThreadingHTTPServer):
    def __init__(self, handler: Callable[[BaseHTTPRequestHandler], None]) -> None:
        super().__init__(("127.0.0.1", 0), _HopHandler)
        self.handle_get = handler
        self.authorization: list[str | None] = []


class _HopHandler(BaseHTTPRequestHandler):
    server: _Hop

    def log_message(self, format: str, *args: object) -> None:
        return None

    def do_GET(self) -> None:
        self.server.authorization.append(self.headers.get("Authorization"))
        self.server.handle_get(self)


def _serving(server: _Hop) -> threading.Thread:
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    return thread


def test_a_redirect_to_another_host_gets_no_credential(tmp_path: Path) -> None:
    """The http source's server (127.0.0.1) redirects to another host (localhost): the token
    goes to the first, never to the second."""
    data = b"apiVersion: v1\nkind: ConfigMap\nmetadata: {name: z}\n"

    def final(handler: BaseHTTPRequestHandler) -> None:
        handler.send_response(200)
        handler.send_header("Content-Length", str(len(data)))
        handler.end_headers()
        handler.wfile.write(data)

    target = _Hop(final)
    port = target.server_address[1]

    def redirect(handler: BaseHTTPRequestHandler) -> None:
        handler.send_response(302)
        handler.send_header("Location", f"http://localhost:{port}/cm.yaml")
        handler.send_header("Content-Length", "0")
        handler.end_headers()

    first = _Hop(redirect)
    threads = [_serving(target), _serving(first)]
    try:
        host = f"127.0.0.1:{first.server_address[1]}"
        source = Source(kind="http", uri=f"http://{host}/cm.yaml",
                        sha256=hashlib.sha256(data).hexdigest(),
                        auth=SourceAuth(secret_ref=SecretReference(name="web-token")))  # fmt: skip
        secrets = {"web-token": Credentials(token="t0ken", hosts=frozenset({host}))}
        tree = _store(tmp_path).compose(
            [source], tmp_path / "b", credentials=lambda name, _host: secrets.get(name)
        )
        assert (tree / "cm.yaml").read_bytes() == data
        assert first.authorization == ["Bearer t0ken"]
        assert target.authorization == [None]
    finally:
        for server in (first, target):
            server.shutdown()
            server.server_close()
        for thread in threads:
            thread.join(timeout=10)


def test_git_credentials_are_not_answered_to_another_host(
    git_http: GitHttpServer, tmp_path: Path
) -> None:
    """Credentials bound to one host, handed to the git fetcher for a server elsewhere (as
    after a redirect): the credential callback refuses to answer."""
    source = _git_source(git_http, tmp_path, "x")
    elsewhere = Credentials(username=GIT_USER, password=GIT_PASSWORD,
                            hosts=frozenset({"git.example.invalid"}), secret="ns/x")  # fmt: skip
    mark = len(git_http.requests())
    with pytest.raises(AuthenticationError, match=r"holds them for git\.example\.invalid only"):
        GitFetcher(repos_dir=tmp_path / "repos").fetch(
            uri=source.uri, commit=str(source.commit), directory=None, dest=tmp_path / "t",
            credentials=elsewhere,
        )  # fmt: skip
    assert not [r for r in git_http.requests()[mark:] if r.user]
