"""Test-side OCI 1.1 artifact helper: push a directory of YAML as a bundle, pull it back by digest.

All HTTP goes through oras-py with a bounded ``do_request``: oras-py's own retries every failure
five times with growing sleeps (about 131 s against a dead registry). Here an authentication
refusal is final at once and an unreachable registry is retried ``attempts`` times only.
"""

from __future__ import annotations

import gzip
import hashlib
import io
import json
import tarfile
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import oras.auth.base
import oras.auth.utils
import oras.provider
import requests

from agent.errors import PermanentError, TemporaryError

BUNDLE_LAYER_MEDIA_TYPE = "application/vnd.fleetlet.bundle.layer.v1.tar+gzip"
BUNDLE_ARTIFACT_TYPE = "application/vnd.fleetlet.bundle.v1"
EMPTY_CONFIG_MEDIA_TYPE = "application/vnd.oci.empty.v1+json"
EMPTY_CONFIG = b"{}"
MANIFEST_MEDIA_TYPE = "application/vnd.oci.image.manifest.v1+json"
MANIFEST_ACCEPT = ", ".join(
    [
        MANIFEST_MEDIA_TYPE,
        "application/vnd.oci.image.index.v1+json",
        "application/vnd.docker.distribution.manifest.v2+json",
        "application/vnd.docker.distribution.manifest.list.v2+json",
    ]
)

_UNBOUNDED_DO_REQUEST = oras.provider.Registry.do_request.__wrapped__  # type: ignore[attr-defined]


class RegistryAuthError(PermanentError):
    """The registry refused our credentials (or their absence): 401/403."""


class RegistryUnavailableError(TemporaryError):
    """The registry could not be reached, timed out or answered 5xx, after every attempt."""


class RegistryResponseError(PermanentError):
    """The registry answered something unexpected (missing object, digest mismatch...)."""


def sha256_digest(data: bytes) -> str:
    return "sha256:" + hashlib.sha256(data).hexdigest()


def descriptor(media_type: str, data: bytes) -> dict[str, Any]:
    """An OCI descriptor for ``data``."""
    return {"mediaType": media_type, "digest": sha256_digest(data), "size": len(data)}


class _PreemptiveBasicAuth(oras.auth.base.AuthBackend):  # type: ignore[misc]
    """Sends basic credentials with every request and treats a 401/403 as final.

    It never reads ~/.docker/config.json: tests must not depend on the user's logins.
    """

    def __init__(self, username: str | None, password: str | None) -> None:
        super().__init__()
        self._header: dict[str, str] = {}
        if username is not None and password is not None:
            token = oras.auth.utils.get_basic_auth(username, password)
            self._header = {"Authorization": f"Basic {token}"}

    def get_auth_header(self) -> dict[str, str]:
        return dict(self._header)

    def load_configs(self, container: Any, configs: list[str] | None = None) -> None:
        return None

    def authenticate_request(
        self, original: requests.Response, headers: dict[str, str], refresh: bool = False
    ) -> tuple[dict[str, str], bool]:
        # Credentials (if any) went with the request already: nothing new to try.
        reason = _registry_errors(original)
        who = "without credentials" if not self._header else "with the given credentials"
        raise RegistryAuthError(
            f"{original.request.method} {original.url}: registry refused access {who}: "
            f"HTTP {original.status_code} {reason}"
        )


def _registry_errors(response: requests.Response) -> str:
    try:
        errors = response.json().get("errors", [])
        return "; ".join(f"{e.get('code')}: {e.get('message')}" for e in errors) or response.reason
    except (ValueError, AttributeError):
        return str(response.reason)


class _TimeoutSession(requests.Session):
    """A session whose requests time out (requests has no default timeout)."""

    def __init__(self, timeout: float) -> None:
        super().__init__()
        self._timeout = timeout

    def request(self, *args: Any, **kwargs: Any) -> requests.Response:  # type: ignore[override]
        kwargs.setdefault("timeout", self._timeout)
        return super().request(*args, **kwargs)


class OciClient(oras.provider.Registry):  # type: ignore[misc]
    """An oras-py registry client for plain-HTTP loopback registries, with bounded retries.

    ``attempts`` is how many times a request is tried when the registry is unreachable or
    answers 5xx; ``request_attempts`` counts every HTTP attempt made (for tests to assert on).
    """

    def __init__(
        self,
        *,
        host: str,
        username: str | None = None,
        password: str | None = None,
        attempts: int = 3,
        backoff: float = 0.2,
        timeout: float = 10.0,
    ) -> None:
        super().__init__(hostname=host, insecure=True, auth_backend="basic")
        self.session = _TimeoutSession(timeout)
        self.auth = _PreemptiveBasicAuth(username, password)
        self.auth.session = self.session
        self.auth.prefix = "http"
        self.attempts = attempts
        self.backoff = backoff
        self.request_attempts = 0

    def do_request(
        self,
        url: str,
        method: str = "GET",
        data: dict[str, Any] | bytes | None = None,
        headers: dict[str, str] | None = None,
        json: dict[str, Any] | None = None,
        stream: bool = False,
    ) -> requests.Response:
        """One HTTP request with credentials, retried only while the registry is unreachable.

        Raises RegistryAuthError on 401/403, RegistryUnavailableError when every attempt failed.
        """
        merged = {**(headers or {}), **self.auth.get_auth_header()}
        failure = ""
        for attempt in range(self.attempts):
            if attempt:
                time.sleep(self.backoff * 2 ** (attempt - 1))
            self.request_attempts += 1
            try:
                response: requests.Response = _UNBOUNDED_DO_REQUEST(
                    self, url, method, data, dict(merged), json, stream
                )
            except (requests.ConnectionError, requests.Timeout) as exc:
                failure = f"{type(exc).__name__}: {exc}"
                continue
            if response.status_code >= 500:
                failure = f"HTTP {response.status_code} {_registry_errors(response)}"
                continue
            return response
        raise RegistryUnavailableError(
            f"{method} {url}: registry unreachable after {self.attempts} attempts: {failure}"
        )

    # --- artifact operations -------------------------------------------------------------------

    def push_blob(self, repository: str, data: bytes, media_type: str) -> dict[str, Any]:
        """Upload ``data`` (monolithic POST + PUT) unless present; return its descriptor.

        Raises RegistryResponseError if the registry does not accept it.
        """
        desc = descriptor(media_type, data)
        base = f"http://{self.hostname}/v2/{repository}/blobs"
        if self.do_request(f"{base}/{desc['digest']}", "HEAD").status_code == 200:
            return desc
        started = self.do_request(f"{base}/uploads/", "POST")
        location = started.headers.get("Location", "")
        if started.status_code != 202 or not location:
            raise RegistryResponseError(
                f"POST {base}/uploads/: HTTP {started.status_code} {_registry_errors(started)}"
            )
        if location.startswith("/"):
            location = f"http://{self.hostname}{location}"
        separator = "&" if "?" in location else "?"
        done = self.do_request(
            f"{location}{separator}digest={desc['digest']}",
            "PUT",
            data=data,
            headers={"Content-Type": "application/octet-stream"},
        )
        if done.status_code != 201:
            raise RegistryResponseError(
                f"blob upload {desc['digest']}: HTTP {done.status_code} {_registry_errors(done)}"
            )
        return desc

    def push_manifest(self, repository: str, reference: str, manifest: bytes) -> str:
        """PUT the exact manifest bytes under ``reference`` (a tag or digest); return the digest.

        Raises RegistryResponseError if the registry refuses it or reports another digest.
        """
        url = f"http://{self.hostname}/v2/{repository}/manifests/{reference}"
        response = self.do_request(
            url, "PUT", data=manifest, headers={"Content-Type": MANIFEST_MEDIA_TYPE}
        )
        if response.status_code != 201:
            raise RegistryResponseError(
                f"PUT {url}: HTTP {response.status_code} {_registry_errors(response)}"
            )
        digest = sha256_digest(manifest)
        reported = response.headers.get("Docker-Content-Digest")
        if reported is not None and reported != digest:
            raise RegistryResponseError(f"PUT {url}: registry says {reported}, bytes are {digest}")
        return digest

    def fetch_manifest(self, repository: str, digest: str) -> bytes:
        """GET the manifest by digest; return its raw bytes after checking their sha256.

        Raises RegistryResponseError if it is missing or its bytes do not match the digest.
        """
        url = f"http://{self.hostname}/v2/{repository}/manifests/{digest}"
        response = self.do_request(url, "GET", headers={"Accept": MANIFEST_ACCEPT})
        if response.status_code != 200:
            raise RegistryResponseError(
                f"GET {url}: HTTP {response.status_code} {_registry_errors(response)}"
            )
        body = response.content
        if sha256_digest(body) != digest:
            raise RegistryResponseError(f"GET {url}: manifest bytes hash to {sha256_digest(body)}")
        return body

    def fetch_blob(self, repository: str, desc: Mapping[str, Any], outfile: Path) -> bytes:
        """Download a blob with oras-py's ``download_blob``; check digest and size; return it.

        Raises RegistryResponseError on a missing blob or a digest/size mismatch.
        """
        try:
            self.download_blob(f"{self.hostname}/{repository}", desc["digest"], str(outfile))
        except requests.HTTPError as exc:
            raise RegistryResponseError(f"blob {desc['digest']}: {exc}") from exc
        data = outfile.read_bytes()
        if len(data) != desc["size"] or sha256_digest(data) != desc["digest"]:
            raise RegistryResponseError(
                f"blob {desc['digest']}: got {len(data)} bytes hashing to {sha256_digest(data)}, "
                f"descriptor says {desc['size']} bytes"
            )
        return data

    def resolve_tag(self, repository: str, tag: str) -> str:
        """Resolve a tag to its manifest digest with one HEAD request.

        Raises RegistryResponseError if the tag is unknown or no digest header comes back.
        """
        url = f"http://{self.hostname}/v2/{repository}/manifests/{tag}"
        response = self.do_request(url, "HEAD", headers={"Accept": MANIFEST_ACCEPT})
        digest = response.headers.get("Docker-Content-Digest")
        if response.status_code != 200 or not digest:
            raise RegistryResponseError(f"HEAD {url}: HTTP {response.status_code}, no digest")
        return digest


def pack_directory(directory: Path) -> bytes:
    """Pack a directory as a deterministic tar+gzip: sorted names, zeroed times and owners."""
    raw = io.BytesIO()
    with tarfile.open(fileobj=raw, mode="w", format=tarfile.PAX_FORMAT) as tar:
        for path in sorted(directory.rglob("*")):
            name = path.relative_to(directory).as_posix()
            info = tarfile.TarInfo(name)
            info.mtime = 0
            info.uid = info.gid = 0
            info.uname = info.gname = ""
            if path.is_dir():
                info.type = tarfile.DIRTYPE
                info.mode = 0o755
                tar.addfile(info)
            elif path.is_file():
                data = path.read_bytes()
                info.size = len(data)
                info.mode = 0o644
                tar.addfile(info, io.BytesIO(data))
    return gzip.compress(raw.getvalue(), compresslevel=9, mtime=0)


def artifact_digest(directory: Path) -> str:
    """The manifest digest :func:`push_bundle` gives ``directory``, computed offline (the
    packing is deterministic): what a fleet repo pins before anything is pushed."""
    layer = descriptor(BUNDLE_LAYER_MEDIA_TYPE, pack_directory(directory))
    return sha256_digest(build_manifest(layer=layer))


def unpack_layer(data: bytes, destination: Path) -> None:
    """Unpack a tar+gzip layer (tarfile's "data" filter: no traversal, links or devices)."""
    destination.mkdir(parents=True, exist_ok=True)
    with tarfile.open(fileobj=io.BytesIO(data), mode="r:gz") as tar:
        tar.extractall(destination, filter="data")


@dataclass(frozen=True)
class PushedArtifact:
    """What push_bundle put in the registry."""

    repository: str
    digest: str
    manifest: bytes
    layer: dict[str, Any]

    def reference(self, host: str) -> str:
        """``HOST/REPOSITORY@DIGEST``."""
        return f"{host}/{self.repository}@{self.digest}"


def build_manifest(
    *,
    layer: Mapping[str, Any],
    artifact_type: str = BUNDLE_ARTIFACT_TYPE,
    annotations: Mapping[str, str] | None = None,
) -> bytes:
    """The OCI 1.1 artifact manifest bytes (empty config, one layer), canonical JSON."""
    manifest: dict[str, Any] = {
        "schemaVersion": 2,
        "mediaType": MANIFEST_MEDIA_TYPE,
        "artifactType": artifact_type,
        "config": descriptor(EMPTY_CONFIG_MEDIA_TYPE, EMPTY_CONFIG),
        "layers": [dict(layer)],
    }
    if annotations:
        manifest["annotations"] = dict(annotations)
    return json.dumps(manifest, sort_keys=True, separators=(",", ":")).encode()


def push_bundle(
    client: OciClient,
    repository: str,
    directory: Path,
    *,
    tag: str | None = None,
    artifact_type: str = BUNDLE_ARTIFACT_TYPE,
    layer_media_type: str = BUNDLE_LAYER_MEDIA_TYPE,
    annotations: Mapping[str, str] | None = None,
) -> PushedArtifact:
    """Push ``directory`` as an OCI 1.1 artifact; tag it if ``tag`` is given.

    Raises RegistryAuthError, RegistryUnavailableError or RegistryResponseError.
    """
    layer_bytes = pack_directory(directory)
    layer = client.push_blob(repository, layer_bytes, layer_media_type)
    client.push_blob(repository, EMPTY_CONFIG, EMPTY_CONFIG_MEDIA_TYPE)
    manifest = build_manifest(layer=layer, artifact_type=artifact_type, annotations=annotations)
    digest = client.push_manifest(repository, sha256_digest(manifest), manifest)
    if tag is not None:
        client.push_manifest(repository, tag, manifest)
    return PushedArtifact(repository=repository, digest=digest, manifest=manifest, layer=layer)


def push_layers(
    client: OciClient,
    repository: str,
    layers: Sequence[bytes],
    *,
    tag: str | None = None,
    layer_media_type: str = BUNDLE_LAYER_MEDIA_TYPE,
) -> str:
    """Push an artifact of several layers (in order) as they are; returns its manifest digest."""
    descriptors = [client.push_blob(repository, data, layer_media_type) for data in layers]
    client.push_blob(repository, EMPTY_CONFIG, EMPTY_CONFIG_MEDIA_TYPE)
    manifest: dict[str, Any] = {
        "schemaVersion": 2,
        "mediaType": MANIFEST_MEDIA_TYPE,
        "artifactType": BUNDLE_ARTIFACT_TYPE,
        "config": descriptor(EMPTY_CONFIG_MEDIA_TYPE, EMPTY_CONFIG),
        "layers": descriptors,
    }
    raw = json.dumps(manifest, sort_keys=True, separators=(",", ":")).encode()
    digest = client.push_manifest(repository, sha256_digest(raw), raw)
    if tag is not None:
        client.push_manifest(repository, tag, raw)
    return digest


IMAGE_CONFIG_MEDIA_TYPE = "application/vnd.oci.image.config.v1+json"
IMAGE_LAYER_MEDIA_TYPE = "application/vnd.oci.image.layer.v1.tar+gzip"


def push_image(
    client: OciClient,
    repository: str,
    directory: Path,
    *,
    tag: str | None = None,
    labels: Mapping[str, str] | None = None,
) -> str:
    """Push ``directory`` as a one-layer container image (what ``FROM scratch`` + ``COPY``
    builds, e.g. an OLM bundle image: an OCI image config with ``labels``, one image layer);
    returns its manifest digest."""
    packed = pack_directory(directory)
    layer = client.push_blob(repository, packed, IMAGE_LAYER_MEDIA_TYPE)
    config = json.dumps(
        {
            "architecture": "amd64",
            "os": "linux",
            "config": {"Labels": dict(labels or {})},
            "rootfs": {"type": "layers", "diff_ids": [sha256_digest(gzip.decompress(packed))]},
        },
        sort_keys=True,
        separators=(",", ":"),
    ).encode()
    client.push_blob(repository, config, IMAGE_CONFIG_MEDIA_TYPE)
    manifest = {
        "schemaVersion": 2,
        "mediaType": MANIFEST_MEDIA_TYPE,
        "config": descriptor(IMAGE_CONFIG_MEDIA_TYPE, config),
        "layers": [layer],
    }
    raw = json.dumps(manifest, sort_keys=True, separators=(",", ":")).encode()
    digest = client.push_manifest(repository, sha256_digest(raw), raw)
    if tag is not None:
        client.push_manifest(repository, tag, raw)
    return digest
