"""The content cache (bounded, LRU, crash-safe) and the composition of several sources."""

from __future__ import annotations

import uuid
from collections.abc import Callable
from pathlib import Path

import pytest

from agent.source.cache import ContentCache
from agent.source.compose import ContentStore, SourceConflictError, cache_key
from agent.source.content import InvalidSourceError
from agent.source.oci import OciFetcher, OciSettings
from tests.hostile import Src
from tests.realenv.oci import OciClient, push_bundle
from tests.realenv.registry import Registry


def _fill(size: int, name: str = "f") -> Callable[[Path], None]:
    def fill(tree: Path) -> None:
        (tree / name).write_bytes(b"x" * size)

    return fill


def test_least_recently_used_entries_go_first(tmp_path: Path) -> None:
    cache = ContentCache(root=tmp_path, max_bytes=3000)
    for key in ("a", "b", "c"):
        cache.store(key, _fill(1000))
    assert cache.lookup("a") is not None  # a is now the most recently used

    cache.store("d", _fill(1000))

    assert cache.keys() == ["c", "a", "d"]
    assert cache.total_bytes == 3000
    assert cache.lookup("b") is None


def test_state_survives_a_restart_and_half_written_entries_vanish(tmp_path: Path) -> None:
    cache = ContentCache(root=tmp_path, max_bytes=10_000)
    cache.store("kept", _fill(10))

    def crash(tree: Path) -> None:
        (tree / "partial").write_bytes(b"half")
        raise RuntimeError("killed mid-fill")

    with pytest.raises(RuntimeError):
        cache.store("lost", crash)
    (tmp_path / "staging" / "leftover-of-a-kill").mkdir()

    reopened = ContentCache(root=tmp_path, max_bytes=10_000)

    assert reopened.keys() == ["kept"]
    assert (reopened.lookup("kept") or Path("/")).joinpath("f").read_bytes() == b"x" * 10
    assert list((tmp_path / "staging").iterdir()) == []


def test_an_entry_larger_than_the_bound_is_kept_alone(tmp_path: Path) -> None:
    cache = ContentCache(root=tmp_path, max_bytes=100)
    cache.store("small", _fill(50))
    cache.store("big", _fill(500))
    assert cache.keys() == ["big"]


def test_cache_keys_are_content_addresses() -> None:
    digest = "sha256:" + "ab" * 32
    assert cache_key(Src("image", "r/x", digest=digest)) == f"image:{digest}"
    assert cache_key(Src("image", "other/y:tag", digest=digest)) == f"image:{digest}"
    assert cache_key(Src("git", "git://h/r", commit="c" * 40, directory="/d/")) == (
        f"git:{'c' * 40}:d"
    )
    assert cache_key(Src("http", "http://h/a", sha256="ab" * 32)) == f"http:sha256:{'ab' * 32}"
    for bad in (
        Src("image", "r/x", digest="latest"),
        Src("git", "git://h/r", commit="main"),
        Src("http", "http://h/a", sha256=None),
        Src("ftp", "ftp://h/a"),
    ):
        with pytest.raises(InvalidSourceError):
            cache_key(bad)


def _push(registry: Registry, root: Path, files: dict[str, bytes], repository: str) -> str:
    for name, data in files.items():
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_bytes(data)
    return push_bundle(OciClient(host=registry.host), repository, root).digest


def test_sources_compose_one_tree_at_their_destinations(registry: Registry, tmp_path: Path) -> None:
    nonce = uuid.uuid4().hex.encode()
    crds = {"crd.yaml": b"kind: CRD # " + nonce}
    app = {"01_ns.yaml": b"kind: Namespace # " + nonce, "sub/cm.yaml": b"kind: ConfigMap"}
    crd_digest = _push(registry, tmp_path / "crds", crds, "compose/crds")
    app_digest = _push(registry, tmp_path / "app", app, "compose/app")
    store = ContentStore(
        cache=ContentCache(root=tmp_path / "cache", max_bytes=1 << 26),
        oci=OciFetcher(settings=OciSettings(plain_http=True)),
    )

    out = store.compose(
        [
            Src("image", f"{registry.host}/compose/crds", digest=crd_digest, destination="crds"),
            Src("image", f"{registry.host}/compose/app", digest=app_digest),
        ],
        tmp_path / "bundle",
    )

    found = {p.relative_to(out).as_posix() for p in out.rglob("*") if p.is_file()}
    assert found == {"crds/crd.yaml", "01_ns.yaml", "sub/cm.yaml"}

    with pytest.raises(SourceConflictError) as conflict:
        store.compose(
            [
                Src("image", f"{registry.host}/compose/app", digest=app_digest),
                Src("image", f"{registry.host}/compose/app", digest=app_digest, destination="."),
            ],
            tmp_path / "conflict",
        )
    assert conflict.value.file == "01_ns.yaml"

    with pytest.raises(InvalidSourceError) as escape:
        store.compose(
            [Src("image", f"{registry.host}/compose/app", digest=app_digest, destination="../x")],
            tmp_path / "escape",
        )
    assert escape.value.rule == "PathTraversal"
