"""The real OCI registry of the test environment, driven through oras-py.

A bundle (a directory of YAML) is pushed as an OCI 1.1 artifact and pulled back by manifest
digest; every byte is checked against its digest; auth refusals are quick and final.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import pytest

from tests.realenv.oci import (
    BUNDLE_ARTIFACT_TYPE,
    BUNDLE_LAYER_MEDIA_TYPE,
    EMPTY_CONFIG_MEDIA_TYPE,
    OciClient,
    RegistryAuthError,
    RegistryUnavailableError,
    push_bundle,
    unpack_layer,
)
from tests.realenv.registry import Registry
from tests.realenv.registry_fixtures import REGISTRY_PASSWORD, REGISTRY_USER, RegistryFactory


def _bundle_dir(root: Path) -> dict[str, bytes]:
    files = {
        "01_namespace.yaml": b"apiVersion: v1\nkind: Namespace\nmetadata:\n  name: web\n",
        "02_configmap.yaml": (
            b"apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: web\ndata:\n  color: blue\n"
        ),
        "sub/deployment.yaml": b"apiVersion: apps/v1\nkind: Deployment\nmetadata:\n  name: w\n",
    }
    for name, data in files.items():
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_bytes(data)
    return files


def _tree(root: Path) -> dict[str, bytes]:
    return {p.relative_to(root).as_posix(): p.read_bytes() for p in root.rglob("*") if p.is_file()}


def _round_trip(
    host: str, tmp_path: Path, *, username: str | None = None, password: str | None = None
) -> None:
    source = tmp_path / "bundle"
    originals = _bundle_dir(source)
    pusher = OciClient(host=host, username=username, password=password)
    pushed = push_bundle(pusher, "bundles/web", source)

    # A fresh client that knows only the digest.
    puller = OciClient(host=host, username=username, password=password)
    manifest_bytes = puller.fetch_manifest("bundles/web", pushed.digest)
    assert "sha256:" + hashlib.sha256(manifest_bytes).hexdigest() == pushed.digest
    manifest = json.loads(manifest_bytes)
    assert manifest["artifactType"] == BUNDLE_ARTIFACT_TYPE
    assert manifest["config"]["mediaType"] == EMPTY_CONFIG_MEDIA_TYPE
    assert manifest["config"]["size"] == 2
    [layer] = manifest["layers"]
    assert layer["mediaType"] == BUNDLE_LAYER_MEDIA_TYPE

    blob = puller.fetch_blob("bundles/web", layer, tmp_path / "layer.tar.gz")
    assert len(blob) == layer["size"]
    assert "sha256:" + hashlib.sha256(blob).hexdigest() == layer["digest"]
    unpack_layer(blob, tmp_path / "unpacked")
    assert _tree(tmp_path / "unpacked") == originals


def test_bundle_pushed_and_pulled_back_by_digest(registry: Registry, tmp_path: Path) -> None:
    _round_trip(registry.host, tmp_path)


def test_same_bundle_gives_same_digest(registry: Registry, tmp_path: Path) -> None:
    """The layer is packed deterministically: pushing the same files twice gives one digest."""
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    _bundle_dir(tmp_path / "a")
    _bundle_dir(tmp_path / "b")
    client = OciClient(host=registry.host)
    first = push_bundle(client, "bundles/same", tmp_path / "a")
    second = push_bundle(client, "bundles/same", tmp_path / "b")
    assert first.digest == second.digest


def test_auth_registry_round_trip_with_credentials(auth_registry: Registry, tmp_path: Path) -> None:
    assert auth_registry.username == REGISTRY_USER
    _round_trip(
        auth_registry.host,
        tmp_path,
        username=auth_registry.username,
        password=auth_registry.password,
    )


@pytest.mark.parametrize(
    ("username", "password"),
    [(None, None), (REGISTRY_USER, "wrong-password"), ("nobody", REGISTRY_PASSWORD)],
    ids=["no-credentials", "wrong-password", "unknown-user"],
)
def test_auth_registry_refuses_quickly_and_clearly(
    auth_registry: Registry, tmp_path: Path, username: str | None, password: str | None
) -> None:
    source = tmp_path / "bundle"
    _bundle_dir(source)
    owner = OciClient(
        host=auth_registry.host,
        username=auth_registry.username,
        password=auth_registry.password,
    )
    pushed = push_bundle(owner, "bundles/private", source)

    mark = auth_registry.request_count()
    stranger = OciClient(host=auth_registry.host, username=username, password=password)
    with pytest.raises(RegistryAuthError, match=r"refused access .*HTTP 401"):
        stranger.fetch_manifest("bundles/private", pushed.digest)
    # One HTTP attempt, not oras-py's five retries with sleeps of ~2 minutes in all.
    assert stranger.request_attempts == 1
    seen = auth_registry.requests(since=mark)
    assert [(r.method, r.status) for r in seen] == [("GET", 401)]

    with pytest.raises(RegistryAuthError):
        push_bundle(stranger, "bundles/private", source)
    assert stranger.request_attempts == 2


def test_tag_resolves_to_digest_with_one_head(registry: Registry, tmp_path: Path) -> None:
    source = tmp_path / "bundle"
    _bundle_dir(source)
    client = OciClient(host=registry.host)
    pushed = push_bundle(client, "bundles/tagged", source, tag="v1.2.3")

    mark = registry.request_count()
    assert client.resolve_tag("bundles/tagged", "v1.2.3") == pushed.digest
    seen = registry.requests(since=mark)
    assert [(r.method, r.path, r.status) for r in seen] == [
        ("HEAD", "/v2/bundles/tagged/manifests/v1.2.3", 200)
    ]


def test_registry_down_is_bounded_then_back_on_same_address(
    registry_factory: RegistryFactory, tmp_path: Path
) -> None:
    private = registry_factory()
    source = tmp_path / "bundle"
    originals = _bundle_dir(source)
    client = OciClient(host=private.host, attempts=3, backoff=0.05)
    pushed = push_bundle(client, "bundles/web", source)
    host = private.host

    private.kill()
    before = client.request_attempts
    with pytest.raises(RegistryUnavailableError, match="unreachable after 3 attempts"):
        client.fetch_manifest("bundles/web", pushed.digest)
    assert client.request_attempts - before == 3

    private.start()
    assert private.host == host
    manifest = json.loads(client.fetch_manifest("bundles/web", pushed.digest))
    blob = client.fetch_blob("bundles/web", manifest["layers"][0], tmp_path / "layer")
    unpack_layer(blob, tmp_path / "unpacked")
    assert _tree(tmp_path / "unpacked") == originals
