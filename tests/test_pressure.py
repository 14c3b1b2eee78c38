"""Disk and memory pressure: the agent's disk full, its cache directory read-only, and bundles
just under and just over each of its content limits. Each ends with a clear reason (a
refusal naming the limit, or a temporary error naming the disk and why), what runs keeps
running, and the same agent goes on with the next publication.

The disk is made full and read-only for real: the agent's cache directory is a tmpfs of a few
MiB, filled up or remounted read-only (mounting needs root or CAP_SYS_ADMIN, as CI has).
"""

from __future__ import annotations

import contextlib
import gzip
import io
import os
import random
import subprocess
import tarfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from agent.errors import ConfigurationError, PermanentError, TemporaryError
from agent.kube import KubeClient
from agent.loop import Agent
from tests.fleetlab import Lab, conditions, configmap, live
from tests.realenv.httpserver import StaticHttpServer
from tests.realenv.kube import Cluster
from tests.realenv.oci import OciClient, push_layers
from tests.test_crds import crds as crds  # the fixture: the CRDs installed

KiB = 1024
LIMITS = {
    "--max-file-bytes": 96 * KiB,
    "--max-bundle-files": 8,
    "--max-bundle-bytes": 256 * KiB,
    "--max-download-bytes": 80 * KiB,
    "--cache-max-bytes": 200 * KiB,
}
FLAGS = [str(x) for pair in LIMITS.items() for x in pair]


@contextlib.contextmanager
def tmpfs(path: Path, size: str) -> Iterator[Path]:
    """A tmpfs of ``size`` mounted at ``path`` (unmounted at the end)."""
    path.mkdir(parents=True, exist_ok=True)
    mounted = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", f"size={size},mode=0755", "tmpfs", str(path)],
        capture_output=True,
        text=True,
    )
    if mounted.returncode != 0:
        pytest.fail(
            "the disk pressure tests mount a small tmpfs (root or CAP_SYS_ADMIN needed): "
            + mounted.stderr
        )
    try:
        yield path
    finally:
        subprocess.run(["umount", "-l", str(path)], capture_output=True)


def remount(path: Path, mode: str) -> None:
    subprocess.run(["mount", "-o", f"remount,{mode}", str(path)], check=True)


def fill(path: Path, *, leave: int = 0) -> Path:
    """Write under ``path`` until its file system is full, then free ``leave`` bytes; the
    filler file."""
    filler = path / "filler"
    with open(filler, "wb", buffering=0) as out, contextlib.suppress(OSError):
        while True:
            out.write(b"\0" * 4 * KiB)
    if leave:
        os.truncate(filler, max(0, filler.stat().st_size - leave))
    return filler


def layer(files: dict[str, bytes]) -> bytes:
    """A tar+gzip layer holding exactly ``files`` (no directory entries)."""
    raw = io.BytesIO()
    with tarfile.open(fileobj=raw, mode="w", format=tarfile.USTAR_FORMAT) as tar:
        for name, data in files.items():
            info = tarfile.TarInfo(name)
            info.size = len(data)
            info.mtime = 1_700_000_000
            tar.addfile(info, io.BytesIO(data))
    return gzip.compress(raw.getvalue(), mtime=0)


def layer_of_size(size: int, base: dict[str, bytes], seed: int) -> bytes:
    """A layer of exactly ``size`` bytes: ``base`` and a file of random (incompressible)
    bytes whose length is tuned until the compressed layer is that size."""
    rng = random.Random(seed)
    noise = rng.randbytes(2 * size)
    # The compressed size does not take every value as the noise grows a byte at a time (a
    # deflate block boundary can skip one): a small compressible file is the second knob.
    for fill in range(64):
        files = {**base, "fill.txt": b"f" * fill} if fill else dict(base)
        length = size - 1024
        for _ in range(20):
            data = layer({**files, "pad.bin": noise[:length]})
            if len(data) == size:
                return data
            length += size - len(data)
    raise AssertionError(f"no layer of exactly {size} bytes")


class Bundles:
    """Publishes the one bundle ``big`` (a ConfigMap and padding, in ``namespace``: not the
    agent's own, which bundle content may not touch) and says what runs."""

    def __init__(self, lab: Lab, kube: KubeClient, namespace: str, http: StaticHttpServer):
        self.lab, self.kube, self.ns, self.http = lab, kube, namespace, http
        self.name = lab.name("big")
        self.version = 0

    def manifest(self, version: int) -> bytes:
        return configmap("big", self.ns, {"value": f"v{version}"}).encode()

    def publish_layer(self, files: dict[str, bytes] | None = None, raw: bytes | None = None) -> int:
        """Publish the next version with these files besides its ConfigMap (or this layer)."""
        self.version += 1
        data = (
            raw
            if raw is not None
            else layer({"cm.yaml": self.manifest(self.version), **(files or {})})
        )
        digest = push_layers(OciClient(host=self.lab.registry.host), "big", [data])
        self.lab.publish([{"name": self.name, "sources": [self.lab.source("big", digest)]}])
        return self.version

    def publish_http(self, size: int) -> int:
        """Publish the next version from http: one manifest file of exactly ``size`` bytes."""
        self.version += 1
        text = self.manifest(self.version)
        text += b"#" + b"x" * (size - len(text) - 2) + b"\n"
        assert len(text) == size
        url = self.http.put(f"big-{self.version}.yaml", text)
        import hashlib

        sha = hashlib.sha256(text).hexdigest()
        self.lab.publish(
            [{"name": self.name, "sources": [{"kind": "http", "uri": url, "sha256": sha}]}]
        )
        return self.version

    def running(self) -> str | None:
        found = live(self.kube, "v1", "ConfigMap", "big", self.ns)
        return (found or {}).get("data", {}).get("value")


@pytest.fixture
def http(tmp_path: Path) -> Iterator[StaticHttpServer]:
    with StaticHttpServer(workdir=tmp_path / "http") as server:
        yield server


def tick(agent: Agent) -> Exception | None:
    try:
        agent.tick()
    except (TemporaryError, PermanentError) as exc:
        return exc
    return None


def test_bundles_just_under_and_just_over_each_limit(
    lab: Lab,
    crds: Cluster,
    namespace: str,
    app_namespace: str,
    tmp_path: Path,
    http: StaticHttpServer,
) -> None:
    kube = KubeClient(kubeconfig=str(crds.kubeconfig))
    bundles = Bundles(lab, kube, app_namespace, http)
    workdir = tmp_path / "agent"
    agent = lab.agent(
        "edge-1", crds, namespace=namespace, workdir=workdir, status=False, extra=FLAGS
    )
    first = bundles.publish_layer()
    assert tick(agent) is None
    assert bundles.running() == f"v{first}"

    file_limit = LIMITS["--max-file-bytes"]
    files_limit = LIMITS["--max-bundle-files"]
    bytes_limit = LIMITS["--max-bundle-bytes"]
    download = LIMITS["--max-download-bytes"]

    def cm() -> int:  # the next version's ConfigMap file
        return len(bundles.manifest(bundles.version + 1))

    cases: list[tuple[str, Any, str | None]] = [
        ("a file at the limit", lambda: bundles.publish_layer({"pad.bin": b"\0" * file_limit}), None),
        ("a file one byte over", lambda: bundles.publish_layer({"pad.bin": b"\0" * (file_limit + 1)}), "FileTooLarge"),
        ("as many files as allowed", lambda: bundles.publish_layer({f"p{i}.bin": b"x" for i in range(files_limit - 1)}), None),
        ("one file too many", lambda: bundles.publish_layer({f"p{i}.bin": b"x" for i in range(files_limit)}), "TooManyFiles"),
        ("a bundle at the limit", lambda: bundles.publish_layer(_pads(bytes_limit - cm(), file_limit)), None),
        ("a bundle one byte over", lambda: bundles.publish_layer(_pads(bytes_limit - cm() + 1, file_limit)), "TooManyBytes"),
        ("a layer at the limit", lambda: bundles.publish_layer(raw=layer_of_size(download, {"cm.yaml": bundles.manifest(bundles.version + 1)}, 1)), None),
        ("a layer one byte over", lambda: bundles.publish_layer(raw=layer_of_size(download + 1, {"cm.yaml": bundles.manifest(bundles.version + 1)}, 2)), "LayerTooLarge"),
        ("a download at the limit", lambda: bundles.publish_http(download), None),
        ("a download one byte over", lambda: bundles.publish_http(download + 1), "DownloadTooLarge"),
    ]  # fmt: skip
    running = first
    for what, publish, rule in cases:
        version = publish()
        error = tick(agent)
        if rule is None:
            assert error is None, (what, error)
            running = version
            assert conditions(kube, bundles.name)["Ready"]["status"] == "True", what
        else:
            # Refused, with the rule and the limit named; what ran before still runs.
            assert isinstance(error, PermanentError), (what, error)
            assert rule in str(error), (what, str(error))
            ready = conditions(kube, bundles.name)["Ready"]
            assert ready["status"] == "False" and rule in ready["message"], (what, ready)
        assert bundles.running() == f"v{running}", what
    # The content cache holds at most its bound, or the one entry larger than it.
    entries = [p for p in (workdir / "content" / "entries").iterdir() if p.is_dir()]
    sizes = [sum(f.stat().st_size for f in (e / "tree").rglob("*") if f.is_file()) for e in entries]
    assert sum(sizes) <= max(LIMITS["--cache-max-bytes"], max(sizes)), sizes
    # And the agent goes on.
    last = bundles.publish_layer()
    assert tick(agent) is None and bundles.running() == f"v{last}"


def _pads(total: int, most: int) -> dict[str, bytes]:
    """Zero-filled files of at most ``most`` bytes each, ``total`` bytes together."""
    pads = {}
    index = 0
    while total > 0:
        size = min(total, most)
        pads[f"pad{index}.bin"] = b"\0" * size
        total -= size
        index += 1
    return pads


def test_a_full_disk_is_a_clear_temporary_failure_and_the_agent_recovers(
    lab: Lab,
    crds: Cluster,
    namespace: str,
    app_namespace: str,
    tmp_path: Path,
    http: StaticHttpServer,
) -> None:
    kube = KubeClient(kubeconfig=str(crds.kubeconfig))
    bundles = Bundles(lab, kube, app_namespace, http)
    with tmpfs(tmp_path / "cache", "8m") as cache:
        agent = lab.agent("edge-1", crds, namespace=namespace, workdir=cache, status=False)
        first = bundles.publish_layer()
        assert tick(agent) is None and bundles.running() == f"v{first}"

        filler = fill(cache)
        second = bundles.publish_layer({"data.bin": random.Random(3).randbytes(256 * KiB)})
        error = tick(agent)
        assert isinstance(error, TemporaryError), error
        assert error.reason == "LocalStorageUnavailable", (error.reason, str(error))
        assert "No space left on device" in str(error) and str(cache) in str(error), str(error)
        assert bundles.running() == f"v{first}"  # what ran keeps running
        degraded = conditions(kube, bundles.name)["Degraded"]
        assert degraded["status"] == "True" and degraded["reason"] == "LocalStorageUnavailable"
        # Again while still full: the same, nothing refused for good.
        assert isinstance(tick(agent), TemporaryError)

        filler.unlink()
        assert tick(agent) is None
        assert bundles.running() == f"v{second}"
        assert conditions(kube, bundles.name)["Degraded"]["status"] == "False"

        # Room for the publication, not for its content: the unpacking is refused by the
        # disk, not the content refused.
        filler = fill(cache, leave=96 * KiB)
        third = bundles.publish_layer({"data.bin": random.Random(4).randbytes(256 * KiB)})
        error = tick(agent)
        assert isinstance(error, TemporaryError), error
        assert error.reason == "LocalStorageUnavailable", (error.reason, str(error))
        assert bundles.running() == f"v{second}"
        filler.unlink()
        assert tick(agent) is None
        assert bundles.running() == f"v{third}"


def test_a_read_only_cache_directory(
    lab: Lab,
    crds: Cluster,
    namespace: str,
    app_namespace: str,
    tmp_path: Path,
    http: StaticHttpServer,
) -> None:
    kube = KubeClient(kubeconfig=str(crds.kubeconfig))
    bundles = Bundles(lab, kube, app_namespace, http)
    with tmpfs(tmp_path / "cache", "16m") as cache:
        # Read-only from the start: the agent says so and which flag to change.
        remount(cache, "ro")
        with pytest.raises(ConfigurationError, match=r"--cache-dir .*cannot write there"):
            lab.agent("edge-1", crds, namespace=namespace, workdir=cache, status=False)
        remount(cache, "rw")

        agent = lab.agent("edge-1", crds, namespace=namespace, workdir=cache, status=False)
        first = bundles.publish_layer()
        assert tick(agent) is None and bundles.running() == f"v{first}"
        # Read-only while it runs: a new version waits, what runs keeps running and is still
        # put back when someone edits it.
        remount(cache, "ro")
        second = bundles.publish_layer()
        error = tick(agent)
        assert isinstance(error, TemporaryError), error
        assert error.reason == "LocalStorageUnavailable", (error.reason, str(error))
        assert "Read-only file system" in str(error), str(error)
        kube.apply(
            {"apiVersion": "v1", "kind": "ConfigMap",
             "metadata": {"name": "big", "namespace": app_namespace}, "data": {"value": "edited"}},
            field_manager="someone-else", force=True,
        )  # fmt: skip
        assert isinstance(tick(agent), TemporaryError)
        assert bundles.running() == f"v{first}"

        remount(cache, "rw")
        assert tick(agent) is None
        assert bundles.running() == f"v{second}"
    assert os.path.ismount(tmp_path / "cache") is False
