"""An agent image as an OCI artifact: the agent's code and ``fleetlet-agent.json``.

Where the agent runs as a process (``fleetlet demo``, the tests, a machine without a container
runtime), its "image" is an OCI artifact pinned by digest like any bundle's content: the
packages ``agent`` and ``fleetlet`` (``python -m fleetlet agent run`` never imports the hub)
and a small manifest naming its version. :func:`pack` lays one out (``push`` it with any OCI
client: ``oras push``, or tests/realenv/oci.py), :func:`pull` fetches one by digest through
the agent's own OCI client (digest checked, unpack limits applied) and reads its manifest.
"""

from __future__ import annotations

import json
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from agent.errors import PermanentError

if TYPE_CHECKING:  # the OCI client (requests, oras) only where an image is pulled
    from agent.source.oci import OciFetcher

MANIFEST = "fleetlet-agent.json"
PACKAGES = ("agent", "fleetlet")
_DONE = ".pulled"


class InvalidAgentImageError(PermanentError):
    """An agent artifact without a readable ``fleetlet-agent.json`` or the agent's code."""

    reason = "InvalidAgentImage"


@dataclass(frozen=True, slots=True)
class AgentImage:
    """An agent image unpacked: where (its root goes first on the candidate's path), and its
    version."""

    root: Path
    version: str


def pack(source: Path, dest: Path, *, version: str, image: str | None = None) -> Path:
    """Lay out an agent artifact's tree in ``dest`` from a checkout ``source``; with ``image``
    (a container image by digest), a release for agents in a pod too: the image, and the CRDs
    and RBAC rules of this code's ``agent install`` (:func:`agent.upgrade.deployment.read_release`)."""
    dest.mkdir(parents=True, exist_ok=True)
    for package in PACKAGES:
        shutil.copytree(
            source / package,
            dest / package,
            ignore=shutil.ignore_patterns("__pycache__", "*.pyc"),
            dirs_exist_ok=True,
        )
    manifest: dict[str, object] = {"version": version}
    if image is not None:
        from agent.upgrade.deployment import release_manifest

        manifest = release_manifest(image, version=version)
    (dest / MANIFEST).write_text(json.dumps(manifest, indent=2) + "\n")
    return dest


def pull(fetcher: OciFetcher, *, uri: str, digest: str, cache: Path) -> AgentImage:
    """The image ``uri@digest``, pulled once into ``cache``. Raises what
    :meth:`OciFetcher.fetch` raises, InvalidAgentImageError."""
    root = cache / digest.replace(":", "-")
    if not (root / _DONE).is_file():
        shutil.rmtree(root, ignore_errors=True)
        root.mkdir(parents=True)
        fetcher.fetch(uri=uri, digest=digest, dest=root, source=f"agent image {uri}@{digest}")
        (root / _DONE).write_text(digest + "\n")
    try:
        manifest = json.loads((root / MANIFEST).read_text())
        version = str(manifest["version"])
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise InvalidAgentImageError(
            f"agent image {uri}@{digest}: no readable {MANIFEST} ({exc})"
        ) from exc
    return AgentImage(root=root, version=version)


def main(argv: list[str] | None = None) -> int:
    """``python -m agent.upgrade.artifact DEST --version V [--image REF@sha256:...]``: lay
    out a release of this checkout (push DEST as a tar+gzip layer, docs/operations.md)."""
    import argparse

    parser = argparse.ArgumentParser(
        prog="python -m agent.upgrade.artifact",
        description="Lay out an agent release artifact of this checkout in DEST.",
    )
    parser.add_argument("dest", type=Path)
    parser.add_argument("--version", required=True)
    parser.add_argument(
        "--image", help="the container image, REPOSITORY@sha256:<digest> (agents in a pod)"
    )
    args = parser.parse_args(argv)
    root = Path(__file__).resolve().parent.parent.parent
    pack(root, args.dest, version=args.version, image=args.image)
    if args.image:
        from agent.upgrade.deployment import read_release

        try:
            read_release(args.dest, str(args.dest))  # the release agents will read, checked
        except PermanentError as exc:  # (run as __main__, this module's classes are copies)
            parser.exit(2, f"error: {exc}\n")
    print(args.dest)
    return 0


__all__ = ["MANIFEST", "AgentImage", "InvalidAgentImageError", "main", "pack", "pull"]

if __name__ == "__main__":
    raise SystemExit(main())
