"""OCI artifact sources: pull by manifest digest with oras-py, bounded, checking every byte.

Requests go through the project's one registry client (:mod:`agent.source.registry`: bounded
retries and timeouts, explicit credentials from the Secret named by the source).

The manifest's raw bytes must hash to the pinned digest; an OCI index is followed to the
bundle artifact's manifest (checked against its descriptor); each selected layer (chosen by
media type) must match its descriptor's digest AND size, checked while streaming to disk, with
the size capped before the download starts. Layers are then unpacked with the safe extractor,
into one tree with one budget: the unpack limits hold for the image, not for each layer, and
links are judged across layers. A Helm chart in a registry (Helm's own media types) is an
artifact like any other: its chart layer unpacks to ``<chart>/``, which the ``helm`` format
renders. A container image's layers (OCI or Docker media types) are content too, unpacked in
order: an OLM bundle image (``manifests/``, ``metadata/`` at its root) is what the
``registry+v1`` format renders. Layers are unpacked as archives, not as image filesystems:
whiteout files (``.wh.*``) are not interpreted, so an image whose later layers delete files
of earlier ones is not what a bundle image is (bundle images are one ``COPY`` each).
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import json
import re
import tempfile
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import requests

from agent.source.archive import ArchiveLimits, TreeBudget, extract_archive
from agent.source.content import (
    ContentRefusedError,
    Credentials,
    DigestMismatchError,
    FetchError,
    InvalidSourceError,
    check_sha256_digest,
    sha256_digest,
)
from agent.source.registry import (
    RegistryClient,
    RegistrySettings,
)

BUNDLE_LAYER_MEDIA_TYPE = "application/vnd.fleetlet.bundle.layer.v1.tar+gzip"
BUNDLE_ARTIFACT_TYPE = "application/vnd.fleetlet.bundle.v1"
# A Helm chart pushed with `helm push`: its one content layer is the chart archive
# (`<chart>/Chart.yaml`...); the provenance layer, if any, is not content.
HELM_CHART_LAYER_MEDIA_TYPE = "application/vnd.cncf.helm.chart.content.v1.tar+gzip"
HELM_CONFIG_MEDIA_TYPE = "application/vnd.cncf.helm.config.v1+json"
# A container image's filesystem layers (an OLM bundle image is one: manifests/ and metadata/
# at its root), unpacked in order into one tree.
IMAGE_LAYER_MEDIA_TYPES = (
    "application/vnd.oci.image.layer.v1.tar+gzip",
    "application/vnd.oci.image.layer.v1.tar",
    "application/vnd.docker.image.rootfs.diff.tar.gzip",
)
OCI_MANIFEST = "application/vnd.oci.image.manifest.v1+json"
OCI_INDEX = "application/vnd.oci.image.index.v1+json"
DOCKER_MANIFEST = "application/vnd.docker.distribution.manifest.v2+json"
DOCKER_LIST = "application/vnd.docker.distribution.manifest.list.v2+json"
_MANIFEST_TYPES = (OCI_MANIFEST, DOCKER_MANIFEST)
_INDEX_TYPES = (OCI_INDEX, DOCKER_LIST)
_ACCEPT = ", ".join((*_MANIFEST_TYPES, *_INDEX_TYPES))


class ContentNotFoundError(FetchError):
    """The registry does not have the pinned manifest or blob (yet, or any more)."""

    reason = "ContentNotFound"


class InvalidArtifactError(ContentRefusedError):
    """The artifact's manifest is malformed, oversized or has no bundle layer."""

    reason = "InvalidArtifact"


@dataclass(frozen=True, kw_only=True)
class OciSettings:
    """How the OCI client behaves. ``plain_http`` talks HTTP (tests, in-cluster registries).

    ``timeout`` bounds each read and ``connect_timeout`` each connection; a request is made
    ``attempts`` times at most, ``backoff`` seconds apart and doubling, with jitter."""

    plain_http: bool = False
    timeout: float = 10.0
    connect_timeout: float = 5.0
    attempts: int = 3
    backoff: float = 0.5
    max_manifest_bytes: int = 4 * 1024 * 1024
    max_layer_bytes: int = 64 * 1024 * 1024
    layer_media_types: tuple[str, ...] = (
        BUNDLE_LAYER_MEDIA_TYPE,
        HELM_CHART_LAYER_MEDIA_TYPE,
        *IMAGE_LAYER_MEDIA_TYPES,
    )
    artifact_types: tuple[str, ...] = (BUNDLE_ARTIFACT_TYPE, HELM_CONFIG_MEDIA_TYPE)
    archive_limits: ArchiveLimits = field(default_factory=ArchiveLimits)
    user_agent: str = "fleetlet-agent"


def credentials_from_docker_config(
    config: bytes | str | Mapping[str, Any], host: str
) -> Credentials | None:
    """The credentials for ``host`` in a docker config JSON (``.dockerconfigjson``), or None.

    Accepts ``auths[host].auth`` (base64 ``user:password``) or ``username``/``password``,
    keyed by ``host``, ``https://host`` or ``http://host`` (with or without a path).
    Raises ValueError if the document is not a docker config.
    """
    data = json.loads(config) if isinstance(config, bytes | str) else dict(config)
    auths = data.get("auths") if isinstance(data, dict) else None
    if not isinstance(auths, dict):
        raise ValueError("not a docker config JSON: no 'auths' object")
    for key, entry in auths.items():
        bare = re.sub(r"^https?://", "", str(key)).split("/")[0]
        if bare != host or not isinstance(entry, dict):
            continue
        if entry.get("auth"):
            try:
                user, _, password = base64.b64decode(entry["auth"]).decode().partition(":")
            except (binascii.Error, UnicodeDecodeError) as exc:
                raise ValueError(f"auths[{key!r}].auth is not base64 user:password") from exc
            return Credentials(username=user, password=password)
        if entry.get("username") is not None:
            return Credentials(username=entry["username"], password=entry.get("password", ""))
        if entry.get("identitytoken"):
            return Credentials(token=entry["identitytoken"])
    return None


@dataclass(frozen=True)
class OciReference:
    """``host/repository`` parsed from a source URI."""

    host: str
    repository: str
    plain_http: bool | None


def parse_reference(uri: str, *, source: str) -> tuple[OciReference, str | None]:
    """Split ``[oci://|http://|https://]host/repo[:tag][@digest]`` into reference and digest.

    Raises InvalidSourceError when there is no host or repository.
    """
    plain: bool | None = None
    rest = uri
    for prefix, is_plain in (("oci://", None), ("http://", True), ("https://", False)):
        if rest.startswith(prefix):
            rest, plain = rest[len(prefix) :], is_plain
            break
    digest = None
    if "@" in rest:
        rest, digest = rest.split("@", 1)
    host, _, repository = rest.partition("/")
    # A tag is ignored: the pin decides. Only strip a ':' after the last '/'.
    if ":" in repository.rsplit("/", 1)[-1]:
        repository = repository.rsplit(":", 1)[0]
    if not host or not repository:
        raise InvalidSourceError(
            f"cannot parse OCI reference {uri!r}", source=source, rule="BadReference"
        )
    return OciReference(host=host, repository=repository, plain_http=plain), digest


class OciFetcher:
    """Pulls bundle artifacts by manifest digest into a directory."""

    def __init__(self, *, settings: OciSettings | None = None) -> None:
        self.settings = settings or OciSettings()
        self.attempts_made = 0  # HTTP attempts over this fetcher's life (for tests, metrics)

    def fetch(
        self,
        *,
        uri: str,
        digest: str,
        dest: Path,
        credentials: Credentials | None = None,
        source: str | None = None,
    ) -> None:
        """Pull ``uri`` at manifest ``digest`` and unpack its bundle layers into ``dest``.

        Raises InvalidSourceError, DigestMismatchError, InvalidArtifactError,
        UnsafeArchiveError (permanent); AuthenticationError, ContentNotFoundError,
        RegistryUnavailableError (temporary).
        """
        label = source or f"image {uri}@{digest}"
        check_sha256_digest(digest, source=label)
        ref, in_uri = parse_reference(uri, source=label)
        if in_uri is not None and in_uri != digest:
            raise InvalidSourceError(
                f"URI names {in_uri} but the pin is {digest}", source=label, rule="PinConflict"
            )
        settings = self.settings
        if ref.plain_http is not None and ref.plain_http != settings.plain_http:
            settings = replace(settings, plain_http=ref.plain_http)
        client = RegistryClient(
            host=ref.host,
            settings=RegistrySettings(
                plain_http=settings.plain_http,
                timeout=settings.timeout,
                connect_timeout=settings.connect_timeout,
                attempts=settings.attempts,
                backoff=settings.backoff,
                user_agent=settings.user_agent,
            ),
            credentials=credentials,
            source=label,
        )
        try:
            manifest = self._manifest(client, ref, digest, None, label, depth=0)
            layers = self._layers(manifest, label)
            # One budget for every layer: the caps hold for the image's tree, and each
            # layer's links are judged again with the layers unpacked after it.
            budget = TreeBudget(settings.archive_limits)
            with tempfile.TemporaryDirectory(prefix="fleetlet-oci-") as scratch:
                for number, layer in enumerate(layers):
                    blob = Path(scratch) / f"layer-{number}"
                    self._download(client, ref, layer, blob, label)
                    extract_archive(
                        blob,
                        dest,
                        source=label,
                        name=f"layer {layer['digest']}",
                        budget=budget,
                    )
                    blob.unlink()
        finally:
            self.attempts_made += client.attempts_made
            client.session.close()

    def _get(
        self, client: RegistryClient, url: str, *, accept: str | None, label: str, what: str
    ) -> requests.Response:
        headers = {"Accept": accept} if accept else {}
        response = client.do_request(url, "GET", headers=headers, stream=True)
        if response.status_code == 404:
            response.close()
            raise ContentNotFoundError(f"{what} not found at {url}", source=label)
        if response.status_code != 200:
            response.close()
            raise FetchError(
                f"GET {url}: HTTP {response.status_code} {response.reason}", source=label
            )
        return response

    def _manifest(
        self,
        client: RegistryClient,
        ref: OciReference,
        digest: str,
        size: int | None,
        label: str,
        *,
        depth: int,
    ) -> dict[str, Any]:
        url = f"{client.prefix}://{ref.host}/v2/{ref.repository}/manifests/{digest}"
        limit = self.settings.max_manifest_bytes
        with self._get(client, url, accept=_ACCEPT, label=label, what="manifest") as response:
            body = _read_capped(response, limit, label=label, what=f"manifest {digest}")
        actual = sha256_digest(body)
        if actual != digest:
            raise DigestMismatchError(
                f"manifest bytes hash to {actual}, the pin is {digest}",
                source=label,
                file=f"manifest {digest}",
                rule="ManifestDigest",
            )
        if size is not None and len(body) != size:
            raise DigestMismatchError(
                f"manifest is {len(body)} bytes, its descriptor says {size}",
                source=label,
                file=f"manifest {digest}",
                rule="ManifestSize",
            )
        try:
            document = json.loads(body)
        except ValueError as exc:
            raise InvalidArtifactError(
                f"manifest is not JSON: {exc}",
                source=label,
                file=f"manifest {digest}",
                rule="BadManifest",
            ) from exc
        if not isinstance(document, dict):
            raise InvalidArtifactError(
                "manifest is not a JSON object",
                source=label,
                file=f"manifest {digest}",
                rule="BadManifest",
            )
        media_type = document.get("mediaType") or response.headers.get("Content-Type", "")
        if media_type in _INDEX_TYPES or "manifests" in document:
            if depth > 0:
                raise InvalidArtifactError(
                    "an index inside an index",
                    source=label,
                    file=f"manifest {digest}",
                    rule="NestedIndex",
                )
            chosen = self._choose(document, label, digest)
            check_sha256_digest(chosen["digest"], source=label)  # it goes into a URL
            return self._manifest(
                client, ref, chosen["digest"], chosen["size"], label, depth=depth + 1
            )
        return document

    def _choose(self, index: dict[str, Any], label: str, digest: str) -> dict[str, Any]:
        """The bundle artifact's manifest descriptor in an index."""
        entries = [m for m in index.get("manifests") or [] if _is_descriptor(m)]
        wanted = [m for m in entries if m.get("artifactType") in self.settings.artifact_types]
        if not wanted:
            wanted = [
                m for m in entries if m.get("mediaType") in _MANIFEST_TYPES and "platform" not in m
            ]
        if len(wanted) != 1:
            raise InvalidArtifactError(
                f"index lists {len(wanted)} bundle manifests (artifactType "
                f"{'/'.join(self.settings.artifact_types)}), expected exactly one",
                source=label,
                file=f"manifest {digest}",
                rule="NoArtifactManifest",
            )
        chosen: dict[str, Any] = wanted[0]
        return chosen

    def _layers(self, manifest: dict[str, Any], label: str) -> list[dict[str, Any]]:
        raw = manifest.get("layers")
        if not isinstance(raw, list) or not all(_is_descriptor(d) for d in raw):
            raise InvalidArtifactError(
                "manifest has no valid 'layers' list",
                source=label,
                file="manifest",
                rule="BadManifest",
            )
        layers = [d for d in raw if d.get("mediaType") in self.settings.layer_media_types]
        if not layers:
            found = sorted({str(d.get("mediaType")) for d in raw})
            raise InvalidArtifactError(
                f"no layer of media type {', '.join(self.settings.layer_media_types)} "
                f"(found: {', '.join(found) or 'none'})",
                source=label,
                file="manifest",
                rule="NoBundleLayer",
            )
        for layer in layers:
            if layer["size"] > self.settings.max_layer_bytes:
                raise InvalidArtifactError(
                    f"layer {layer['digest']} is {layer['size']} bytes, more than the limit "
                    f"of {self.settings.max_layer_bytes}",
                    source=label,
                    file=f"layer {layer['digest']}",
                    rule="LayerTooLarge",
                )
        return layers

    def _download(
        self,
        client: RegistryClient,
        ref: OciReference,
        layer: dict[str, Any],
        out: Path,
        label: str,
    ) -> None:
        digest, size = layer["digest"], layer["size"]
        check_sha256_digest(digest, source=label)
        url = f"{client.prefix}://{ref.host}/v2/{ref.repository}/blobs/{digest}"
        hasher = hashlib.sha256()
        got = 0
        response = client.get_blob(f"{ref.host}/{ref.repository}", digest, stream=True)
        if response.status_code != 200:
            response.close()
            if response.status_code == 404:
                raise ContentNotFoundError(f"layer not found at {url}", source=label)
            raise FetchError(
                f"GET {url}: HTTP {response.status_code} {response.reason}", source=label
            )
        try:
            with response, open(out, "wb") as sink:
                for chunk in response.iter_content(64 * 1024):
                    got += len(chunk)
                    if got > size:
                        break  # longer than the descriptor: no need to read the rest
                    hasher.update(chunk)
                    sink.write(chunk)
        except requests.RequestException as exc:
            raise FetchError(f"download of layer {digest} failed: {exc}", source=label) from exc
        if got != size:
            raise DigestMismatchError(
                f"layer is {'more than ' if got > size else ''}{got} bytes, "
                f"its descriptor says {size}",
                source=label,
                file=f"layer {digest}",
                rule="LayerSize",
            )
        actual = "sha256:" + hasher.hexdigest()
        if actual != digest:
            raise DigestMismatchError(
                f"layer bytes hash to {actual}, its descriptor says {digest}",
                source=label,
                file=f"layer {digest}",
                rule="LayerDigest",
            )


def _is_descriptor(value: object) -> bool:
    return (
        isinstance(value, dict)
        and isinstance(value.get("digest"), str)
        and isinstance(value.get("size"), int)
        and not isinstance(value.get("size"), bool)
        and value["size"] >= 0
    )


def _read_capped(response: requests.Response, limit: int, *, label: str, what: str) -> bytes:
    chunks: list[bytes] = []
    total = 0
    try:
        for chunk in response.iter_content(64 * 1024):
            total += len(chunk)
            if total > limit:
                raise InvalidArtifactError(
                    f"larger than {limit} bytes", source=label, file=what, rule="ManifestTooLarge"
                )
            chunks.append(chunk)
    except requests.RequestException as exc:
        raise FetchError(f"reading {what} failed: {exc}", source=label) from exc
    return b"".join(chunks)
