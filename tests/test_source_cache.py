"""The content cache (bounded, LRU, crash-safe, read-only and verified on use) and the
composition of several sources into one bundle tree judged as a whole."""

from __future__ import annotations

import os
import tarfile
import uuid
from collections.abc import Callable
from pathlib import Path

import pytest

from agent.source.archive import ArchiveLimits
from agent.source.cache import ContentCache
from agent.source.compose import (
    BundleTooLargeError,
    ContentStore,
    SourceConflictError,
    cache_key,
)
from agent.source.content import InvalidSourceError
from agent.source.oci import OciFetcher, OciSettings
from agent.source.tree import UnsafeTreeError
from tests.hostile import Src
from tests.hostile.archives import entry as entry_
from tests.hostile.archives import escaping_link, loop_dir, tar
from tests.realenv.oci import OciClient, push_bundle, push_layers
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


# --- a bundle tree is judged as a whole (issue 15, items 1 and 5) ----------------------------


def _push_tar(registry: Registry, repository: str, layer: bytes) -> str:
    return push_layers(OciClient(host=registry.host), repository, [layer])


def _victim(registry: Registry, tmp_path: Path) -> tuple[Src, Path]:
    """Another bundle's source, cached: what an attacker's bundle would like to write into."""
    digest = _push(
        registry, tmp_path / "victim", {"cm.yaml": b"kind: ConfigMap # victim"}, "poison/victim"
    )
    return Src("image", f"{registry.host}/poison/victim", digest=digest), tmp_path / "cache"


def test_links_of_two_sources_cannot_reach_another_bundles_cached_tree(
    registry: Registry, tmp_path: Path
) -> None:
    victim, cache_root = _victim(registry, tmp_path)
    store = ContentStore(
        cache=ContentCache(root=cache_root, max_bytes=1 << 26),
        oci=OciFetcher(settings=OciSettings(plain_http=True)),
    )
    cached = store.tree(victim)
    entry = cached.parent.name  # entries/<sha256 of the key>/tree: known to anyone
    # Source A: x -> d/s/../../cache/entries/<entry>/tree, inside the tree as written (and
    # alone). Source B: d/ and d/s -> ".". Together: x reaches the victim's cached tree.
    link = escaping_link(2, f"cache/entries/{entry}/tree")
    a = _push_tar(registry, "poison/a", tar(entry_("x", kind=tarfile.SYMTYPE, link=link)))
    b = _push_tar(registry, "poison/b", loop_dir())
    # Source C, laid out at x/evil: through the link, into the victim's tree.
    crb = b"apiVersion: rbac.authorization.k8s.io/v1\nkind: ClusterRoleBinding # attacker\n"
    c = _push_tar(registry, "poison/c", tar(entry_("crb.yaml", data=crb)))
    sources = [
        Src("image", f"{registry.host}/poison/a", digest=a),
        Src("image", f"{registry.host}/poison/b", digest=b),
    ]
    carried = Src("image", f"{registry.host}/poison/c", digest=c, destination="x/evil")

    with pytest.raises(SourceConflictError) as through:
        store.compose([*sources, carried], tmp_path / "attacker")
    assert through.value.rule == "PathThroughSymlink"
    assert through.value.file == "x"
    # Without C, the link itself is judged on the composed tree, and refused.
    with pytest.raises(UnsafeTreeError) as escapes:
        store.compose(sources, tmp_path / "attacker-2")
    assert escapes.value.rule == "SymlinkEscapes"
    assert escapes.value.file == "x"

    victim_tree = store.compose([victim], tmp_path / "victim-bundle")
    found = {p.relative_to(victim_tree).as_posix() for p in victim_tree.rglob("*")}
    assert found == {"cm.yaml"}
    assert not (cached / "evil").exists()


def test_a_cached_tree_is_read_only_and_an_altered_one_is_fetched_again(
    registry: Registry, tmp_path: Path
) -> None:
    victim, cache_root = _victim(registry, tmp_path)
    cache = ContentCache(root=cache_root, max_bytes=1 << 26)
    store = ContentStore(cache=cache, oci=OciFetcher(settings=OciSettings(plain_http=True)))
    cached = store.tree(victim)
    assert all(not p.stat().st_mode & 0o222 for p in [cached, *cached.rglob("*")])
    # Whatever got through (a write as root, a tampered disk), the next use notices.
    (cached / "cm.yaml").chmod(0o644)
    (cached / "cm.yaml").write_bytes(b"kind: ClusterRoleBinding # planted")
    mark = registry.request_count()

    again = store.tree(victim)

    assert (again / "cm.yaml").read_bytes() == b"kind: ConfigMap # victim"
    assert cache.dropped == 1
    assert registry.requests(since=mark) != []  # fetched and checked again
    # A restarted agent checks too.
    (again / "cm.yaml").chmod(0o644)
    os.symlink("cm.yaml", again / "extra.yaml")
    restarted = ContentCache(root=cache_root, max_bytes=1 << 26)
    assert restarted.lookup(cache_key(victim)) is None


def test_unpack_limits_hold_for_the_bundle_tree_across_sources(
    registry: Registry, tmp_path: Path
) -> None:
    limits = ArchiveLimits(max_files=10, max_total_bytes=1 << 20)
    store = ContentStore(
        cache=ContentCache(root=tmp_path / "cache", max_bytes=1 << 26),
        oci=OciFetcher(settings=OciSettings(plain_http=True, archive_limits=limits)),
        limits=limits,
    )
    # Each source well within the limits; five of them are not.
    few = [
        Src(
            "image",
            f"{registry.host}/limits/files{n}",
            digest=_push_tar(
                registry, f"limits/files{n}", tar(*(entry_(f"f{i}.yaml") for i in range(3)))
            ),
            destination=f"s{n}",
        )
        for n in range(5)
    ]
    for source in few:
        store.tree(source)
    with pytest.raises(BundleTooLargeError) as files:
        store.compose(few, tmp_path / "files")
    assert files.value.rule == "TooManyFiles"

    big = [
        Src(
            "image",
            f"{registry.host}/limits/bytes{n}",
            digest=_push_tar(
                registry, f"limits/bytes{n}", tar(entry_(f"b{n}.bin", data=os.urandom(300 << 10)))
            ),
        )
        for n in range(5)
    ]
    with pytest.raises(BundleTooLargeError) as size:
        store.compose(big, tmp_path / "bytes")
    assert size.value.rule == "TooManyBytes"
