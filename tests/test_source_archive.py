"""Safe unpacking: the hostile archive corpus is refused, with its rule, directly and when it
arrives as a layer from the real registry; honest archives unpack intact."""

from __future__ import annotations

import os
import tarfile
from pathlib import Path

import pytest

from agent.errors import PermanentError
from agent.source.archive import UnsafeArchiveError, extract_archive
from agent.source.cache import ContentCache
from agent.source.compose import ContentStore
from agent.source.oci import OciFetcher, OciSettings
from tests.hostile import Src
from tests.hostile.archives import (
    CASES,
    GOOD_YAML,
    LAYERED,
    ArchiveCase,
    LayeredCase,
    entry,
    tar,
)
from tests.realenv.oci import (
    BUNDLE_LAYER_MEDIA_TYPE,
    EMPTY_CONFIG,
    EMPTY_CONFIG_MEDIA_TYPE,
    OciClient,
    build_manifest,
    push_layers,
    sha256_digest,
)
from tests.realenv.registry import Registry


@pytest.mark.parametrize("case", CASES, ids=[c.name for c in CASES])
def test_hostile_archive_is_refused_with_its_rule(case: ArchiveCase, tmp_path: Path) -> None:
    archive = tmp_path / "layer.tar.gz"
    archive.write_bytes(case.build())
    outside = tmp_path / "outside"
    outside.mkdir()

    with pytest.raises(UnsafeArchiveError) as refused:
        extract_archive(
            archive, tmp_path / "out" / "tree", source="image test@sha256:x", limits=case.limits
        )

    error = refused.value
    assert isinstance(error, PermanentError)
    assert error.rule == case.rule
    assert error.reason == "UnsafeArchive"
    assert error.source == "image test@sha256:x"
    assert error.file == (f"layer.tar.gz!{case.member}" if case.member else "layer.tar.gz")
    assert case.rule in str(error) and "image test@sha256:x" in str(error)
    # Nothing was written outside the extraction directory.
    assert sorted(p.name for p in tmp_path.iterdir()) == ["layer.tar.gz", "out", "outside"]
    assert list(outside.iterdir()) == []


@pytest.mark.parametrize("case", CASES, ids=[c.name for c in CASES])
def test_hostile_layer_from_the_registry_is_refused_and_not_cached(
    case: ArchiveCase, registry: Registry, tmp_path: Path
) -> None:
    client = OciClient(host=registry.host)
    repository = f"hostile/{case.name}"
    layer = client.push_blob(repository, case.build(), BUNDLE_LAYER_MEDIA_TYPE)
    client.push_blob(repository, EMPTY_CONFIG, EMPTY_CONFIG_MEDIA_TYPE)
    manifest = build_manifest(layer=layer)
    digest = client.push_manifest(repository, sha256_digest(manifest), manifest)
    settings = OciSettings(plain_http=True, backoff=0.05, archive_limits=case.limits)
    cache = ContentCache(root=tmp_path / "cache", max_bytes=1 << 26)
    store = ContentStore(cache=cache, oci=OciFetcher(settings=settings))

    with pytest.raises(UnsafeArchiveError) as refused:
        store.tree(Src("image", f"{registry.host}/{repository}", digest=digest))

    assert refused.value.rule == case.rule
    assert repository in refused.value.source and digest in refused.value.source
    assert layer["digest"] in refused.value.file
    assert cache.keys() == []
    assert list((tmp_path / "cache" / "staging").iterdir()) == []


def test_honest_archive_unpacks_with_in_tree_links_and_safe_modes(tmp_path: Path) -> None:
    setuid = entry("bin/tool.sh", data=b"#!/bin/sh\n")
    setuid[0].mode = 0o4755
    archive = tmp_path / "ok.tar"
    archive.write_bytes(
        tar(
            entry("manifests/", kind=tarfile.DIRTYPE),
            entry("manifests/01_cm.yaml", data=GOOD_YAML),
            entry("manifests/current", kind=tarfile.SYMTYPE, link="01_cm.yaml"),
            entry("copy.yaml", kind=tarfile.LNKTYPE, link="manifests/01_cm.yaml"),
            setuid,
            compress=False,
        )
    )

    stats = extract_archive(archive, tmp_path / "out", source="test")

    out = tmp_path / "out"
    assert (out / "manifests/01_cm.yaml").read_bytes() == GOOD_YAML
    assert os.readlink(out / "manifests/current") == "01_cm.yaml"
    assert (out / "manifests/current").read_bytes() == GOOD_YAML
    # A hardlink becomes an independent copy.
    assert (out / "copy.yaml").read_bytes() == GOOD_YAML
    assert not os.path.samefile(out / "copy.yaml", out / "manifests/01_cm.yaml")
    assert (out / "bin/tool.sh").stat().st_mode & 0o7777 == 0o755
    assert stats.files == 5


@pytest.mark.parametrize("case", LAYERED, ids=[c.name for c in LAYERED])
def test_layers_are_one_tree_judged_together_from_the_registry(
    case: LayeredCase, registry: Registry, tmp_path: Path
) -> None:
    # Each layer alone passes every check; unpacked into one tree they escape it, write
    # through each other's links, or together exceed the limits meant for the image.
    layers = case.build()
    for layer in layers:
        alone = tmp_path / "alone" / sha256_digest(layer)[7:19]
        (tmp_path / "layer").write_bytes(layer)
        extract_archive(tmp_path / "layer", alone, source="one layer", limits=case.limits)
    repository = f"layered/{case.name}"
    digest = push_layers(OciClient(host=registry.host), repository, layers)
    settings = OciSettings(plain_http=True, backoff=0.05, archive_limits=case.limits)
    cache = ContentCache(root=tmp_path / "cache", max_bytes=1 << 26)
    store = ContentStore(cache=cache, oci=OciFetcher(settings=settings), limits=case.limits)

    with pytest.raises(UnsafeArchiveError) as refused:
        store.tree(Src("image", f"{registry.host}/{repository}", digest=digest))

    assert refused.value.rule == case.rule, str(refused.value)
    assert refused.value.file.endswith(f"!{case.member}")
    assert cache.keys() == []
    assert list((tmp_path / "cache" / "staging").iterdir()) == []
