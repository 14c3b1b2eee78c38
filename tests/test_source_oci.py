"""OCI sources against the real registry: pull by digest, auth, tampering, outages, the cache."""

from __future__ import annotations

import json
import uuid
from pathlib import Path

import pytest

from agent.source.cache import ContentCache
from agent.source.compose import ContentStore, credentials_from_secret
from agent.source.content import (
    AuthenticationError,
    Credentials,
    DigestMismatchError,
    InvalidSourceError,
)
from agent.source.oci import (
    ContentNotFoundError,
    InvalidArtifactError,
    OciFetcher,
    OciSettings,
)
from agent.source.registry import RegistryUnavailableError
from tests.hostile import Src
from tests.realenv.oci import (
    BUNDLE_ARTIFACT_TYPE,
    BUNDLE_LAYER_MEDIA_TYPE,
    EMPTY_CONFIG,
    EMPTY_CONFIG_MEDIA_TYPE,
    OciClient,
    build_manifest,
    pack_directory,
    push_bundle,
    sha256_digest,
)
from tests.realenv.registry import Registry
from tests.realenv.registry_fixtures import REGISTRY_PASSWORD, REGISTRY_USER, RegistryFactory

SETTINGS = OciSettings(plain_http=True, attempts=3, backoff=0.05, timeout=5.0)
CREDS = Credentials(username=REGISTRY_USER, password=REGISTRY_PASSWORD)


def _bundle(root: Path) -> dict[str, bytes]:
    """A bundle directory with a unique file, so its digest is this test's own."""
    files = {
        "01_namespace.yaml": b"apiVersion: v1\nkind: Namespace\nmetadata:\n  name: web\n",
        "sub/02_cm.yaml": (
            b"apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: web\ndata:\n  nonce: "
            + uuid.uuid4().hex.encode()
            + b"\n"
        ),
    }
    for name, data in files.items():
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_bytes(data)
    return files


def _tree(root: Path) -> dict[str, bytes]:
    return {p.relative_to(root).as_posix(): p.read_bytes() for p in root.rglob("*") if p.is_file()}


def _store(tmp_path: Path) -> ContentStore:
    cache = ContentCache(root=tmp_path / "cache", max_bytes=64 * 1024 * 1024)
    return ContentStore(cache=cache, oci=OciFetcher(settings=SETTINGS))


def _blob_path(registry: Registry, digest: str) -> Path:
    hexdigest = digest.removeprefix("sha256:")
    return (
        registry.storage_dir
        / "docker/registry/v2/blobs/sha256"
        / hexdigest[:2]
        / hexdigest
        / "data"
    )


def _flip_one_byte(path: Path, at: int) -> None:
    data = bytearray(path.read_bytes())
    data[at] ^= 0x01
    path.write_bytes(bytes(data))


def test_pull_by_digest_unpacks_the_bundle(registry: Registry, tmp_path: Path) -> None:
    files = _bundle(tmp_path / "bundle")
    pushed = push_bundle(OciClient(host=registry.host), "bundles/pull", tmp_path / "bundle")
    store = _store(tmp_path)

    tree = store.tree(Src("image", f"{registry.host}/bundles/pull", digest=pushed.digest))

    assert _tree(tree) == files


def test_second_fetch_of_a_cached_digest_makes_no_registry_request(
    registry: Registry, tmp_path: Path
) -> None:
    files = _bundle(tmp_path / "bundle")
    pushed = push_bundle(OciClient(host=registry.host), "bundles/cached", tmp_path / "bundle")
    source = Src("image", f"{registry.host}/bundles/cached", digest=pushed.digest)
    store = _store(tmp_path)
    store.tree(source)
    mark = registry.request_count()

    again = store.tree(source)
    # A new store on the same cache directory (an agent restart) also needs no request.
    restarted = _store(tmp_path).tree(source)

    assert registry.requests(since=mark) == []
    assert _tree(again) == _tree(restarted) == files


def test_auth_registry_with_basic_credentials(auth_registry: Registry, tmp_path: Path) -> None:
    files = _bundle(tmp_path / "bundle")
    pusher = OciClient(host=auth_registry.host, username=REGISTRY_USER, password=REGISTRY_PASSWORD)
    pushed = push_bundle(pusher, "bundles/private", tmp_path / "bundle")
    fetcher = OciFetcher(settings=SETTINGS)

    fetcher.fetch(
        uri=f"{auth_registry.host}/bundles/private",
        digest=pushed.digest,
        dest=tmp_path / "out",
        credentials=CREDS,
    )

    assert _tree(tmp_path / "out") == files


def test_auth_registry_with_docker_config_json(auth_registry: Registry, tmp_path: Path) -> None:
    files = _bundle(tmp_path / "bundle")
    pusher = OciClient(host=auth_registry.host, username=REGISTRY_USER, password=REGISTRY_PASSWORD)
    pushed = push_bundle(pusher, "bundles/dockercfg", tmp_path / "bundle")
    config = json.dumps(
        {
            "auths": {
                "other.example:5000": {"username": "x", "password": "y"},
                f"http://{auth_registry.host}": {
                    "username": REGISTRY_USER,
                    "password": REGISTRY_PASSWORD,
                },
            }
        }
    )
    # As the agent gets it: the decoded data of a kubernetes.io/dockerconfigjson Secret.
    credentials = credentials_from_secret(
        {".dockerconfigjson": config.encode()}, host=auth_registry.host
    )

    OciFetcher(settings=SETTINGS).fetch(
        uri=f"{auth_registry.host}/bundles/dockercfg",
        digest=pushed.digest,
        dest=tmp_path / "out",
        credentials=credentials,
    )

    assert credentials is not None and credentials.username == REGISTRY_USER
    assert _tree(tmp_path / "out") == files


@pytest.mark.parametrize("credentials", [None, Credentials(username=REGISTRY_USER, password="no")])
def test_wrong_or_missing_password_is_refused_at_once(
    auth_registry: Registry, tmp_path: Path, credentials: Credentials | None
) -> None:
    pusher = OciClient(host=auth_registry.host, username=REGISTRY_USER, password=REGISTRY_PASSWORD)
    _bundle(tmp_path / "bundle")
    pushed = push_bundle(pusher, "bundles/locked", tmp_path / "bundle")
    fetcher = OciFetcher(settings=SETTINGS)
    mark = auth_registry.request_count()

    with pytest.raises(AuthenticationError) as refused:
        fetcher.fetch(
            uri=f"{auth_registry.host}/bundles/locked",
            digest=pushed.digest,
            dest=tmp_path / "out",
            credentials=credentials,
        )

    assert refused.value.reason == "AuthenticationFailed"
    assert "refused" in str(refused.value) or "requires credentials" in str(refused.value)
    # No retry loop against a refusal: one challenge, at most one answer to it.
    assert fetcher.attempts_made == 1
    seen = auth_registry.requests(since=mark)
    assert 1 <= len(seen) <= 2 and all(r.status == 401 for r in seen)


def test_tampered_layer_blob_is_refused(registry: Registry, tmp_path: Path) -> None:
    _bundle(tmp_path / "bundle")
    pushed = push_bundle(OciClient(host=registry.host), "bundles/tampered", tmp_path / "bundle")
    _flip_one_byte(_blob_path(registry, pushed.layer["digest"]), at=40)

    with pytest.raises(DigestMismatchError) as refused:
        _store(tmp_path).tree(
            Src("image", f"{registry.host}/bundles/tampered", digest=pushed.digest)
        )

    assert refused.value.rule == "LayerDigest"
    assert pushed.layer["digest"] in str(refused.value)
    assert "bundles/tampered" in refused.value.source


def test_tampered_manifest_is_refused(registry: Registry, tmp_path: Path) -> None:
    _bundle(tmp_path / "bundle")
    pushed = push_bundle(OciClient(host=registry.host), "bundles/badmanifest", tmp_path / "bundle")
    manifest_path = _blob_path(registry, pushed.digest)
    # Same length, one character changed inside the artifactType string.
    at = manifest_path.read_bytes().index(b"fleetlet.bundle")
    _flip_one_byte(manifest_path, at=at)

    with pytest.raises(DigestMismatchError) as refused:
        _store(tmp_path).tree(
            Src("image", f"{registry.host}/bundles/badmanifest", digest=pushed.digest)
        )

    assert refused.value.rule == "ManifestDigest"
    assert pushed.digest in str(refused.value)


def _push_manifest(client: OciClient, repository: str, manifest: bytes, media_type: str) -> str:
    digest = sha256_digest(manifest)
    url = f"http://{client.hostname}/v2/{repository}/manifests/{digest}"
    answer = client.do_request(url, "PUT", data=manifest, headers={"Content-Type": media_type})
    assert answer.status_code == 201, answer.text
    return digest


def test_layer_descriptor_lying_about_size_is_refused(registry: Registry, tmp_path: Path) -> None:
    _bundle(tmp_path / "bundle")
    client = OciClient(host=registry.host)
    layer = client.push_blob(
        "bundles/liar", pack_directory(tmp_path / "bundle"), BUNDLE_LAYER_MEDIA_TYPE
    )
    client.push_blob("bundles/liar", EMPTY_CONFIG, EMPTY_CONFIG_MEDIA_TYPE)
    lying = {**layer, "size": layer["size"] - 7}
    digest = client.push_manifest(
        "bundles/liar", sha256_digest(build_manifest(layer=lying)), build_manifest(layer=lying)
    )

    with pytest.raises(DigestMismatchError) as refused:
        _store(tmp_path).tree(Src("image", f"{registry.host}/bundles/liar", digest=digest))

    assert refused.value.rule == "LayerSize"


def test_index_is_followed_to_the_bundle_manifest(registry: Registry, tmp_path: Path) -> None:
    files = _bundle(tmp_path / "bundle")
    client = OciClient(host=registry.host)
    pushed = push_bundle(client, "bundles/indexed", tmp_path / "bundle")
    other = build_manifest(
        layer=client.push_blob("bundles/indexed", b"other", "application/octet-stream"),
        artifact_type="application/vnd.example.other",
    )
    other_digest = _push_manifest(
        client, "bundles/indexed", other, "application/vnd.oci.image.manifest.v1+json"
    )
    index = json.dumps(
        {
            "schemaVersion": 2,
            "mediaType": "application/vnd.oci.image.index.v1+json",
            "manifests": [
                {
                    "mediaType": "application/vnd.oci.image.manifest.v1+json",
                    "digest": other_digest,
                    "size": len(other),
                    "artifactType": "application/vnd.example.other",
                },
                {
                    "mediaType": "application/vnd.oci.image.manifest.v1+json",
                    "digest": pushed.digest,
                    "size": len(pushed.manifest),
                    "artifactType": BUNDLE_ARTIFACT_TYPE,
                },
            ],
        }
    ).encode()
    index_digest = _push_manifest(
        client, "bundles/indexed", index, "application/vnd.oci.image.index.v1+json"
    )

    tree = _store(tmp_path).tree(
        Src("image", f"{registry.host}/bundles/indexed", digest=index_digest)
    )

    assert _tree(tree) == files


def test_artifact_without_a_bundle_layer_is_refused(registry: Registry, tmp_path: Path) -> None:
    client = OciClient(host=registry.host)
    layer = client.push_blob("bundles/nolayer", uuid.uuid4().bytes, "application/octet-stream")
    client.push_blob("bundles/nolayer", EMPTY_CONFIG, EMPTY_CONFIG_MEDIA_TYPE)
    manifest = build_manifest(layer=layer)
    digest = client.push_manifest("bundles/nolayer", sha256_digest(manifest), manifest)

    with pytest.raises(InvalidArtifactError) as refused:
        _store(tmp_path).tree(Src("image", f"{registry.host}/bundles/nolayer", digest=digest))

    assert refused.value.rule == "NoBundleLayer"
    assert "application/octet-stream" in str(refused.value)


def test_unknown_digest_is_not_found(registry: Registry, tmp_path: Path) -> None:
    digest = sha256_digest(uuid.uuid4().bytes)
    with pytest.raises(ContentNotFoundError):
        _store(tmp_path).tree(Src("image", f"{registry.host}/bundles/none", digest=digest))


def test_registry_down_fails_within_bounded_attempts_then_recovers(
    registry_factory: RegistryFactory, tmp_path: Path
) -> None:
    private = registry_factory()
    files = _bundle(tmp_path / "bundle")
    pushed = push_bundle(OciClient(host=private.host), "bundles/outage", tmp_path / "bundle")
    fetcher = OciFetcher(settings=SETTINGS)
    cache = ContentCache(root=tmp_path / "cache", max_bytes=1 << 26)
    store = ContentStore(cache=cache, oci=fetcher)
    source = Src("image", f"{private.host}/bundles/outage", digest=pushed.digest)
    private.kill()

    with pytest.raises(RegistryUnavailableError) as down:
        store.tree(source)

    assert down.value.attempts == SETTINGS.attempts
    assert fetcher.attempts_made == SETTINGS.attempts
    assert down.value.reason == "RegistryUnavailable"
    assert private.host in str(down.value)
    assert cache.keys() == []

    private.start()
    assert _tree(store.tree(source)) == files


def test_credentials_from_secret_data() -> None:
    basic = credentials_from_secret({"username": b"u", "password": b"s3cr3t"}, host="r:5000")
    assert (basic.username, basic.password) == ("u", "s3cr3t")
    assert "s3cr3t" not in repr(basic)
    config = b'{"auths": {"r:5000": {"auth": "dTpw"}}}'  # base64 of u:p
    docker = credentials_from_secret({".dockerconfigjson": config}, host="r:5000")
    assert (docker.username, docker.password) == ("u", "p")
    with pytest.raises(InvalidSourceError) as missing:
        credentials_from_secret({".dockerconfigjson": config}, host="elsewhere:5000")
    assert missing.value.rule == "BadCredentials"
