"""Make the seeds that cannot be written by hand: a real signed publication (its four branch
files and the trusted root that verifies them), a real status document, the real answers of a
git server to a protocol v2 ``ls-refs``, and small archives.

    python -m tests.fuzz.seeds tests/fuzz/corpus

Run it again only to refresh the corpus (the publication is signed by a fresh mini Sigstore,
so its files and trusted root change together).
"""

from __future__ import annotations

import gzip
import io
import json
import socket
import sys
import tarfile
import tempfile
from pathlib import Path

import pygit2

CLUSTER = "edge-1"


def _publication(out: Path, tmp: Path) -> None:
    from hub.publish.flow import prepare, publish
    from hub.publish.git import BranchStore
    from hub.publish.sign import PublicationSigner
    from tests.realenv.gitserver import GitDaemon
    from tests.realenv.sigstore import MiniSigstore
    from tests.realenv.sigstore.mini import DEFAULT_IDENTITY
    from tests.test_hub_fleet import write_fleet

    digest = "sha256:" + "ab" * 32
    with MiniSigstore(workdir=tmp / "sigstore") as sigstore, GitDaemon(workdir=tmp / "git") as git:
        git.create_bare("fleet.git")
        fleet = write_fleet(
            tmp / "fleet",
            clusters=[{"name": CLUSTER, "labels": {"tier": "edge"}}, {"name": "edge-2"}],
            bundles=[
                {
                    "name": "web",
                    "group": "app",
                    "sources": [{"kind": "image", "uri": "127.0.0.1:5000/web", "digest": digest}],
                    "targets": [{"clusterSelector": {}}],
                    "healthChecks": {"timeoutSeconds": 60},
                }
            ],
            settings={
                "name": "seed",
                "repo": "https://fleet.example.invalid/seed.git",
                "publication": {"expiresAfter": "7d", "refreshBefore": "1d"},
                "signing": {"identity": DEFAULT_IDENTITY, "issuer": sigstore.issuer},
            },
        )
        signer = PublicationSigner.from_trust_config(
            trust_config=sigstore.trust_config_path, token=sigstore.mint_token()
        )
        url = git.url_for("fleet.git")
        with BranchStore(url=url, cache_dir=tmp / "hub-cache") as store:
            publish(prepare(fleet), store, signer=signer)
        repo = pygit2.Repository(str(git.root / "fleet.git"))
        commit = repo.revparse_single(f"refs/heads/fleetlet/clusters/{CLUSTER}")
        assert isinstance(commit, pygit2.Commit)
        target = out / "publication"
        target.mkdir(parents=True, exist_ok=True)
        for entry in commit.tree:
            blob = repo[entry.id]
            assert isinstance(blob, pygit2.Blob)
            (target / entry.name).write_bytes(blob.data)
        (target / "trusted_root.json").write_bytes(sigstore.trusted_root_path.read_bytes())
        statement = json.loads((target / "statement.json").read_bytes())
        meta = {
            "cluster": CLUSTER,
            "identity": DEFAULT_IDENTITY,
            "issuer": sigstore.issuer,
            "now": statement["issuedAt"],
        }
        (target / "meta.json").write_text(json.dumps(meta, indent=2) + "\n")
        # The ls-refs answers of a real git daemon for this cluster's branch.
        _pkt_lines(
            out / "pktline", git.port, "/fleet.git", f"refs/heads/fleetlet/clusters/{CLUSTER}"
        )


def _pkt_lines(out: Path, port: int, path: str, ref: str) -> None:
    from agent.source.lsrefs import _ls_refs_command
    from agent.source.pktline import pkt

    out.mkdir(parents=True, exist_ok=True)
    with socket.create_connection(("127.0.0.1", port), timeout=5) as sock:
        sock.sendall(pkt(f"git-upload-pack {path}\0host=127.0.0.1\0\0version=2\0".encode()))
        capabilities = _read_section(sock)
        sock.sendall(_ls_refs_command(ref) + b"0000")
        listing = _read_section(sock)
    (out / "answer.bin").write_bytes(capabilities + listing)


def _read_section(sock: socket.socket) -> bytes:
    data = b""
    while True:
        head = _exactly(sock, 4)
        data += head
        length = int(head, 16)
        if length in (0, 1):
            return data
        data += _exactly(sock, length - 4)


def _exactly(sock: socket.socket, size: int) -> bytes:
    got = b""
    while len(got) < size:
        chunk = sock.recv(size - len(got))
        if not chunk:
            raise RuntimeError("git daemon closed the connection")
        got += chunk
    return got


def _archives(out: Path) -> None:
    out.mkdir(parents=True, exist_ok=True)
    manifest = b"apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: seed\ndata:\n  k: v\n"

    def tar(members: list[tuple[str, bytes | None]]) -> bytes:
        raw = io.BytesIO()
        with tarfile.open(fileobj=raw, mode="w", format=tarfile.PAX_FORMAT) as archive:
            for name, data in members:
                info = tarfile.TarInfo(name)
                info.mtime = 1_700_000_000
                if data is None:
                    info.type = tarfile.DIRTYPE
                    archive.addfile(info)
                else:
                    info.size = len(data)
                    archive.addfile(info, io.BytesIO(data))
        return raw.getvalue()

    plain = tar([("bundle", None), ("bundle/01_config.yaml", manifest)])
    (out / "bundle.tar").write_bytes(plain)
    (out / "bundle.tar.gz").write_bytes(gzip.compress(plain, mtime=0))
    raw = io.BytesIO()
    with tarfile.open(fileobj=raw, mode="w", format=tarfile.GNU_FORMAT) as archive:
        link = tarfile.TarInfo("bundle/link.yaml")
        link.type = tarfile.SYMTYPE
        link.linkname = "01_config.yaml"
        archive.addfile(link)
    (out / "link.tar").write_bytes(raw.getvalue())


def _status(out: Path) -> None:
    from datetime import UTC, datetime

    from agent.api.status import dump_status, status_from_dict
    from tests.test_hub_status import make_bundle, make_run, make_status

    out.mkdir(parents=True, exist_ok=True)
    bundles = {
        "web": make_bundle([make_run(CLUSTER, "web", 2, 1), make_run(CLUSTER, "web", 1, 1)]),
        "conf": make_bundle(
            [make_run(CLUSTER, "conf", 2, 1, result="RolledBack", outputs={"ip": {"value": "1"}})],
            ready=False,
        ),
    }
    doc = make_status(CLUSTER, heartbeat=datetime(2026, 11, 22, 23, 0, tzinfo=UTC), bundles=bundles)
    (out / "status.json").write_bytes(dump_status(status_from_dict(doc, origin="seed")))


def main(argv: list[str]) -> int:
    out = Path(argv[0]) if argv else Path(__file__).parent / "corpus"
    with tempfile.TemporaryDirectory(prefix="fleetlet-seeds-") as tmp:
        _publication(out, Path(tmp))
    _archives(out / "archive")
    _status(out / "status")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
