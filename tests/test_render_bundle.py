"""One bundle from three kinds of sources (a private registry, a private git server, an http
archive), composed, then rendered with the ``plain`` format against a real API server's
discovery; a second sync of the same pins touches no server."""

from __future__ import annotations

import hashlib
import json
import threading
import uuid
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest
import yaml

from agent.api import Source
from agent.api.models import SecretReference, SourceAuth
from agent.kube import KubeClient
from agent.render.formats import render_bundle
from agent.render.plain import BUNDLE_LABEL, GROUP_LABEL, Ownership, RenderRequest
from agent.source.cache import ContentCache
from agent.source.compose import ContentStore, credentials_from_secret
from agent.source.content import Credentials
from agent.source.git import GitFetcher
from agent.source.oci import OciFetcher, OciSettings
from tests.hostile import commit_files
from tests.hostile.archives import entry, tar
from tests.realenv.git_fixtures import GIT_PASSWORD, GIT_USER
from tests.realenv.gitserver import GitHttpServer
from tests.realenv.kube import Cluster
from tests.realenv.oci import OciClient, push_bundle
from tests.realenv.registry import Registry
from tests.realenv.registry_fixtures import REGISTRY_PASSWORD, REGISTRY_USER


def _doc(kind: str, name: str, api_version: str = "v1", **extra: object) -> bytes:
    body = {"apiVersion": api_version, "kind": kind, "metadata": {"name": name}, **extra}
    return yaml.safe_dump(body).encode()


class _Files(ThreadingHTTPServer):
    daemon_threads = True

    def __init__(self, files: dict[str, bytes]) -> None:
        super().__init__(("127.0.0.1", 0), _FileHandler)
        self.files = files
        self.hits = 0


class _FileHandler(BaseHTTPRequestHandler):
    server: _Files

    def log_message(self, format: str, *args: object) -> None:
        return None

    def do_GET(self) -> None:
        self.server.hits += 1
        data = self.server.files.get(self.path, b"")
        self.send_response(200 if self.path in self.server.files else 404)
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)


@pytest.fixture
def file_server() -> Iterator[_Files]:
    server = _Files({})
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield server
    server.shutdown()
    server.server_close()
    thread.join(timeout=10)


def test_three_sources_compose_and_render(
    auth_registry: Registry,
    git_http: GitHttpServer,
    file_server: _Files,
    kube_cluster: Cluster,
    tmp_path: Path,
) -> None:
    nonce = uuid.uuid4().hex[:8]
    # 1. The registry artifact: the namespace and a ConfigMap.
    image_dir = tmp_path / "image"
    image_dir.mkdir()
    (image_dir / "01_namespace.yaml").write_bytes(_doc("Namespace", f"team-{nonce}"))
    (image_dir / "03_settings.yaml").write_bytes(_doc("ConfigMap", "settings"))
    pusher = OciClient(host=auth_registry.host, username=REGISTRY_USER, password=REGISTRY_PASSWORD)
    image = push_bundle(pusher, f"bundles/composed-{nonce}", image_dir)
    # 2. The git directory: a Deployment and a ClusterRole.
    repo = f"composed-{nonce}.git"
    commit = commit_files(
        git_http.create_bare(repo),
        tmp_path / "work",
        {
            "deploy/02_app/deployment.yaml": _doc("Deployment", "web", "apps/v1"),
            "deploy/02_app/role.yaml": _doc(
                "ClusterRole", f"reader-{nonce}", "rbac.authorization.k8s.io/v1"
            ),
        },
    )
    # 3. The http archive: a Service, in a subdirectory.
    archive = tar(entry("svc.yaml", data=_doc("Service", "web", spec={"ports": [{"port": 80}]})))
    file_server.files["/extra.tar.gz"] = archive
    sources = [
        Source(
            kind="image",
            uri=f"{auth_registry.host}/bundles/composed-{nonce}",
            digest=image.digest,
            auth=SourceAuth(secret_ref=SecretReference(name="registry-secret")),
        ),
        Source(
            kind="git",
            uri=git_http.url_for(repo),
            commit=commit,
            directory="deploy",
            auth=SourceAuth(secret_ref=SecretReference(name="git-secret")),
        ),
        Source(
            kind="http",
            uri=f"http://127.0.0.1:{file_server.server_address[1]}/extra.tar.gz",
            sha256=hashlib.sha256(archive).hexdigest(),
            destination="04_extra",
        ),
    ]
    secrets: dict[str, Credentials] = {
        "registry-secret": credentials_from_secret(
            {
                ".dockerconfigjson": json.dumps(
                    {
                        "auths": {
                            auth_registry.host: {
                                "username": REGISTRY_USER,
                                "password": REGISTRY_PASSWORD,
                            }
                        }
                    }
                ).encode()
            },
            host=auth_registry.host,
        ),
        "git-secret": credentials_from_secret({"username": GIT_USER, "password": GIT_PASSWORD}),
    }
    store = ContentStore(
        cache=ContentCache(root=tmp_path / "cache", max_bytes=1 << 26),
        oci=OciFetcher(settings=OciSettings(plain_http=True)),
        git=GitFetcher(repos_dir=tmp_path / "repos"),
    )

    tree = store.compose(
        sources, tmp_path / "bundle", credentials=lambda name, _host: secrets.get(name)
    )
    with KubeClient(
        kubeconfig=str(kube_cluster.kubeconfig), discovery_cache_dir=tmp_path / "discovery"
    ) as kube:
        request = RenderRequest(
            source="bundle web",
            namespace=f"team-{nonce}",
            scope=kube.scope,
            ownership=Ownership(bundle="web", group="frontend", revision="1"),
        )
        objects = render_bundle(tree, format="plain", request=request)

    assert [(o["kind"], o["metadata"].get("namespace")) for o in objects] == [
        ("Namespace", None),
        ("Deployment", f"team-{nonce}"),
        ("ClusterRole", None),
        ("ConfigMap", f"team-{nonce}"),
        ("Service", f"team-{nonce}"),
    ]
    assert all(o["metadata"]["labels"][BUNDLE_LABEL] == "web" for o in objects)
    assert all(o["metadata"]["labels"][GROUP_LABEL] == "frontend" for o in objects)

    # The same pins again: everything from the cache, no server asked anything.
    registry_mark, git_mark, http_mark = (
        auth_registry.request_count(),
        git_http.request_count(),
        file_server.hits,
    )
    again = store.compose(
        sources, tmp_path / "again", credentials=lambda name, _host: secrets.get(name)
    )
    assert auth_registry.requests(since=registry_mark) == []
    assert git_http.requests(since=git_mark) == []
    assert file_server.hits == http_mark
    assert sorted(p.relative_to(again).as_posix() for p in again.rglob("*") if p.is_file()) == [
        "01_namespace.yaml",
        "02_app/deployment.yaml",
        "02_app/role.yaml",
        "03_settings.yaml",
        "04_extra/svc.yaml",
    ]
