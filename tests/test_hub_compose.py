"""The hub's fast paths produce exactly what the agent's own encoders produce.

Sets composed from a shape's template, proofs written directly, blobs stored as deltas in the
hub's packs, cluster files read from the parsed-file cache: each is compared with the slow,
obvious way (the agent's ``dump_set``/``set_digest``/``ClusterProof.to_bytes``, libgit2 and git
reading the pack, a fresh parse). Pure logic and local files: no server needed.
"""

from __future__ import annotations

import subprocess
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pygit2
import pytest
import yaml

from agent.api import dump_set, load_set, set_digest
from hub.fleet.load import load_fleet
from hub.fleet.render import Header, build_set, plan_clusters
from hub.publish.compose import SetComposer
from hub.publish.pack import PackWriter
from hub.publish.sign import Leaf, sign_leaves
from tests.test_hub_fleet import write_fleet

DIGEST = "sha256:" + "cd" * 32
# Names YAML reads as something else when plain (booleans, null, numbers), and plain ones.
NAMES = ["yes", "no", "on", "off", "y", "n", "true", "null", "123", "1e5", "0x1f", "edge-1", "a"]


def fleet(tmp: Path, names: list[str]) -> Path:
    return write_fleet(
        tmp,
        clusters=[
            {"name": n, "labels": {"tier": "edge" if i % 2 else "core"}}
            for i, n in enumerate(names)
        ],
        bundles=[
            {
                "name": "web",
                "sources": [{"kind": "image", "uri": "registry.example/web", "digest": DIGEST}],
                "format": "helm",
                "formatOptions": {"values": {"text": "a: b", "n": 1.5, "list": [1, "x"]}},
                "group": "apps",
                "targets": [{"clusterSelector": {}}],
                "overrides": [{"clusters": ["a"], "values": {"text": "ünïcode"}}],
            },
            {
                "name": "db",
                "sources": [{"kind": "image", "uri": "registry.example/db", "digest": DIGEST}],
                "dependsOn": ["apps"],
                "targets": [{"clusterSelector": {"matchLabels": {"tier": "edge"}}}],
            },
        ],
        settings={"repo": "https://fleet.example.invalid/f.git"},
    )


def test_composed_sets_are_the_agents_bytes_and_digests(tmp_path: Path) -> None:
    loaded = load_fleet(fleet(tmp_path / "f", NAMES))
    pins = {src: src.ref for b in loaded.bundles for src in b.all_sources}  # already pinned
    plans = plan_clusters(loaded, pins)
    now = datetime(2026, 11, 22, 22, 0, tzinfo=UTC)
    composer = SetComposer(
        issued_at=now,
        expires_at=now + timedelta(days=7),
        source_repo="https://fleet.example.invalid/f.git",
        source_commit="ab" * 20,
    )
    for serial in (1, 9, 10, 123456):
        for name in NAMES:
            header = Header(
                serial=serial,
                issued_at=now,
                expires_at=now + timedelta(days=7),
                source_repo="https://fleet.example.invalid/f.git",
                source_commit="ab" * 20,
            )
            expected = build_set(plans[name], header)
            data = composer.set_bytes(plans[name], serial)
            assert data == dump_set(expected), name
            assert composer.digest(plans[name], serial) == set_digest(expected), name
            assert load_set(data, origin=name) == expected
            head, own, tail = composer.parts(plans[name], serial) or (b"", b"", b"")
            assert head + own + tail == data


def test_proofs_written_directly_are_the_agents_bytes() -> None:
    leaves = [Leaf(cluster=f"c-{i}", serial=i + 1, set_digest=DIGEST) for i in range(37)]
    now = datetime.now(UTC).replace(microsecond=0)
    signed = sign_leaves(
        leaves=leaves,
        signer=None,
        issued_at=now,
        expires_at=now + timedelta(days=1),
        source_repo="r",
        source_commit="c",
    )
    for leaf in leaves:
        assert signed.proof_bytes(leaf.cluster) == signed.proof(leaf.cluster).to_bytes()


def test_delta_blobs_read_back_in_libgit2_and_git(tmp_path: Path) -> None:
    repo = tmp_path / "r.git"
    pygit2.init_repository(str(repo), bare=True)
    pack = PackWriter()
    head, tail = b"h" * 70_000 + b"\n", b"tail\n" * 30_000  # copies over 64 KiB are split
    base = head + b"cluster: base\n" + tail
    base_id = pack.blob(base)
    expected = {}
    for name in ("b", "c" * 300):  # an insert over 127 bytes is split too
        own = f"cluster: {name}\n".encode()
        data = head + own + tail
        blob = pack.blob_delta(
            data,
            base=base_id,
            base_size=len(base),
            ops=[(0, len(head)), own, (len(base) - len(tail), len(tail))],
        )
        expected[blob] = data
    written = pack.write(repo)
    assert written is not None
    reader = pygit2.Repository(str(repo))
    for blob, data in expected.items():
        assert reader[blob].data == data
    # git's own reader agrees, object by object.
    done = subprocess.run(
        ["git", "--git-dir", str(repo), "cat-file", "--batch-check"],
        input="\n".join(expected) + "\n",
        capture_output=True,
        text=True,
        check=True,
        timeout=60,
    )
    sizes = [int(line.split()[2]) for line in done.stdout.splitlines()]
    assert sizes == [len(d) for d in expected.values()]
    subprocess.run(
        ["git", "--git-dir", str(repo), "verify-pack", str(written)],
        check=True,
        capture_output=True,
        timeout=60,
    )


def test_cluster_files_are_parsed_again_only_when_their_bytes_change(tmp_path: Path) -> None:
    root = fleet(tmp_path / "f", ["a", "b", "c"])
    cache = tmp_path / "cache"
    first = load_fleet(root, cache_dir=cache)
    assert len(list(cache.glob("*.json"))) == 1
    inventory = root / "clusters" / "inventory.yaml"
    # The cache answers for these bytes: a file that would no longer parse is not read.
    cached = load_fleet(root, cache_dir=cache)
    assert [(c.name, dict(c.labels)) for c in cached.clusters] == [
        (c.name, dict(c.labels)) for c in first.clusters
    ]
    doc = yaml.safe_load(inventory.read_text())
    doc["clusters"].append({"name": "d", "labels": {"tier": "lab"}})
    inventory.write_text(yaml.safe_dump(doc))
    changed = load_fleet(root, cache_dir=cache)
    assert [c.name for c in changed.clusters] == ["a", "b", "c", "d"]
    assert len(list(cache.glob("*.json"))) == 1  # the old entry is pruned
    # A damaged cache entry costs a parse, never a wrong fleet.
    for entry in cache.glob("*.json"):
        entry.write_text("{broken")
    assert [c.name for c in load_fleet(root, cache_dir=cache).clusters] == ["a", "b", "c", "d"]
    # A file with problems is reported, and not cached.
    doc["clusters"].append({"name": "Not_A_Name"})
    inventory.write_text(yaml.safe_dump(doc))
    with pytest.raises(Exception, match="Not_A_Name"):
        load_fleet(root, cache_dir=cache)


def test_packs_from_git_read_back_with_their_deltas(tmp_path: Path) -> None:
    """What a git server sends (deltas against objects of the same pack, of both kinds) is
    read as git itself reads it."""
    import hashlib

    from hub.publish.pack import store_received
    from hub.status.fetch import parse_pack

    repo = tmp_path / "r.git"
    pygit2.init_repository(str(repo), bare=True)
    base = b"".join(b"line %d of a status document\n" % i for i in range(400))
    blobs = [base + b"cluster %d\n" % i for i in range(20)]
    ids = []
    for data in blobs:
        done = subprocess.run(
            ["git", "--git-dir", str(repo), "hash-object", "-w", "--stdin"],
            input=data,
            capture_output=True,
            check=True,
            timeout=60,
        )
        ids.append(done.stdout.decode().strip())
    for flag in ("", "--no-reuse-delta"):
        args = ["git", "--git-dir", str(repo), "pack-objects", "--stdout", "--window=10"]
        for ofs in (True, False):
            command = args + ([flag] if flag else []) + ([] if ofs else ["--no-delta-base-offset"])
            pack = subprocess.run(
                command,
                input="\n".join(ids).encode() + b"\n",
                capture_output=True,
                check=True,
                timeout=60,
            ).stdout
            objects = parse_pack(pack)
            got = {
                hashlib.sha1(f"{k} {len(d)}\0".encode() + d).hexdigest(): d for k, d, *_ in objects
            }
            assert got == dict(zip(ids, blobs, strict=True))
            assert {oid.hex() for _, _, oid, _, _ in objects} == set(ids)
            # Kept as it came, with the index parse_pack's offsets and crcs make: git and
            # libgit2 read every object from it.
            kept = tmp_path / f"kept-{flag}-{ofs}.git"
            pygit2.init_repository(str(kept), bare=True)
            path = store_received(pack, [(o, at, crc) for _, _, o, at, crc in objects], kept)
            verified = subprocess.run(
                ["git", "verify-pack", str(path.with_suffix(".idx"))],
                capture_output=True,
                timeout=60,
            )
            assert verified.returncode == 0, verified.stderr
            assert [pygit2.Repository(str(kept))[i].data for i in ids] == blobs
    with pytest.raises(ValueError, match="checksum"):
        parse_pack(pack[:-1] + bytes([pack[-1] ^ 1]))
