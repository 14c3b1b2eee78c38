"""The revision store: each bundle's last healthy revisions, kept in the cluster.

A revision (rendered manifests, inventory, free-form ``info`` such as the set serial) is
serialised as canonical JSON, compressed with zlib and cut into chunks of at most
:data:`CHUNK_BYTES`, each in its own Secret in the agent's namespace (a Secret holds at most
1 MiB). Chunk Secrets are named ``fleetlet-rev-<bundle>-<number>-<index>`` and labelled
``fleetlet.io/revision-of=<bundle>``, ``fleetlet.io/revision=<number>``, ``fleetlet.io/chunk``
and ``fleetlet.io/chunks``, and annotated with the content's sha256.

A small index Secret per bundle (``fleetlet-rev-<bundle>``) lists the kept revisions, newest
first, each with its chunk count, size and sha256. A save writes the new chunks first, then the
index, and only then deletes chunks no revision in the index uses: a crash at any moment leaves
the index pointing at complete revisions. :meth:`RevisionStore.load` reassembles and checks the
sha256, so a rollback needs only this store (no hub, git server or registry).
"""

from __future__ import annotations

import base64
import contextlib
import hashlib
import json
import threading
import zlib
from collections.abc import Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

from agent.api import BundleDeploymentSpec, from_dict, to_dict
from agent.api import Revision as AppliedRevision
from agent.apply.inventory import Inventory
from agent.errors import FleetletError, PermanentError
from agent.fanout import each
from agent.kube import STATE_FIELD_MANAGER, InvalidError, KubeClient, ObjectRef

CHUNK_BYTES = 900 * 1024
DEFAULT_HISTORY = 3
REVISION_OF_LABEL = "fleetlet.io/revision-of"
REVISION_LABEL = "fleetlet.io/revision"
CHUNK_LABEL = "fleetlet.io/chunk"
CHUNKS_LABEL = "fleetlet.io/chunks"
SHA256_ANNOTATION = "fleetlet.io/sha256"
SECRET_TYPE = "fleetlet.io/revision"
INDEX_KEY = "index.json"
CHUNK_KEY = "chunk"
_FORMAT = 1


class RevisionStoreError(PermanentError):
    """A stored revision cannot be read back (chunk missing, content does not match its
    sha256, unreadable index or content)."""

    reason = "RevisionCorrupt"


@dataclass(frozen=True, kw_only=True)
class HealthyRevision:
    """One stored revision of a bundle: what to re-apply to return to it. ``number`` grows by
    one per save. ``digest`` (the spec digest of the target it was: what makes a revision the
    same or another), ``spec`` and ``revision`` (the serial and pins it came with) are what
    :meth:`RevisionStore.keep` records in ``info``."""

    bundle: str
    number: int
    manifests: tuple[dict[str, Any], ...]
    inventory: Inventory
    info: Mapping[str, Any] = field(default_factory=dict)
    digest: str = ""
    spec: BundleDeploymentSpec | None = None
    revision: AppliedRevision | None = None
    delete_hooks: tuple[dict[str, Any], ...] = ()
    """The revision's pre-delete and post-delete hooks (run when the bundle is removed)."""

    @classmethod
    def of(
        cls,
        *,
        bundle: str,
        number: int,
        manifests: Sequence[Mapping[str, Any]],
        inventory: Inventory,
        info: Mapping[str, Any],
    ) -> HealthyRevision:
        """The revision with ``digest``, ``spec`` and ``revision`` read from ``info`` (left
        unset when ``info`` does not hold them or they do not validate)."""
        spec: BundleDeploymentSpec | None = None
        revision: AppliedRevision | None = None
        with contextlib.suppress(FleetletError):
            if isinstance(info.get("spec"), Mapping):
                spec = from_dict(BundleDeploymentSpec, info["spec"])
        with contextlib.suppress(FleetletError):
            if isinstance(info.get("revision"), Mapping):
                revision = from_dict(AppliedRevision, info["revision"])
        hooks = info.get("deleteHooks")
        return cls(
            bundle=bundle,
            number=number,
            manifests=tuple(dict(m) for m in manifests),
            inventory=inventory,
            info=dict(info),
            digest=str(info.get("digest") or ""),
            spec=spec,
            revision=revision,
            delete_hooks=tuple(dict(h) for h in hooks if isinstance(h, Mapping))
            if isinstance(hooks, list)
            else (),
        )


@dataclass(frozen=True, kw_only=True)
class IndexEntry:
    """An index entry: a revision's number, chunk count, compressed size and sha256."""

    number: int
    chunks: int
    size: int
    sha256: str

    def to_json(self) -> dict[str, Any]:
        """As JSON."""
        return {
            "number": self.number,
            "chunks": self.chunks,
            "size": self.size,
            "sha256": self.sha256,
        }


def _canonical(value: Any) -> bytes:
    return json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False).encode()


class RevisionStore:
    """Revisions of bundles, as Secrets in ``namespace`` written through ``kube``.

    ``history`` is how many revisions per bundle are kept (the newest is the last healthy one).
    """

    def __init__(
        self,
        kube: KubeClient,
        *,
        namespace: str,
        history: int = DEFAULT_HISTORY,
        chunk_bytes: int = CHUNK_BYTES,
    ) -> None:
        if history < 1 or chunk_bytes < 1:
            raise ValueError("history and chunk_bytes must be positive")
        self.kube = kube
        self.namespace = namespace
        self.history = history
        self.chunk_bytes = chunk_bytes
        # Loaded revisions by (bundle, number, sha256): a pass reads the index (one small
        # Secret) and reuses the revision in memory while the index still names it.
        self._loaded: dict[tuple[str, int, str], HealthyRevision] = {}
        self._lock = threading.Lock()  # groups move concurrently, each its own bundles

    # -- names ------------------------------------------------------------------------------

    def _index_name(self, bundle: str) -> str:
        return f"fleetlet-rev-{bundle}"

    def _chunk_name(self, bundle: str, number: int, index: int) -> str:
        return f"fleetlet-rev-{bundle}-{number}-{index}"

    def _secret(
        self,
        name: str,
        *,
        labels: Mapping[str, str],
        data: Mapping[str, bytes],
        annotations: Mapping[str, str] | None = None,
    ) -> dict[str, Any]:
        return {
            "apiVersion": "v1",
            "kind": "Secret",
            "type": SECRET_TYPE,
            "metadata": {
                "name": name,
                "namespace": self.namespace,
                "labels": dict(labels),
                "annotations": dict(annotations or {}),
            },
            "data": {k: base64.b64encode(v).decode("ascii") for k, v in data.items()},
        }

    def _ref(self, name: str) -> ObjectRef:
        return ObjectRef("v1", "Secret", name, self.namespace)

    # -- index ------------------------------------------------------------------------------

    def entries(self, bundle: str) -> list[IndexEntry]:
        """The kept revisions of a bundle, newest first (empty when none).

        Raises RevisionStoreError (unreadable index), ApiUnavailableError, KubeApiError.
        """
        live = self.kube.get(self._ref(self._index_name(bundle)))
        return [] if live is None else self._parse_index(bundle, live)

    def _parse_index(self, bundle: str, live: Mapping[str, Any]) -> list[IndexEntry]:
        try:
            raw = base64.b64decode((live.get("data") or {})[INDEX_KEY])
            document = json.loads(raw)
            return [
                IndexEntry(
                    number=int(e["number"]),
                    chunks=int(e["chunks"]),
                    size=int(e["size"]),
                    sha256=str(e["sha256"]),
                )
                for e in document["revisions"]
            ]
        except (KeyError, TypeError, ValueError) as exc:
            raise RevisionStoreError(
                f"revision index of bundle {bundle} is unreadable: {exc}"
            ) from exc

    def bundles(self) -> list[str]:
        """Bundles with stored revisions. Raises ApiUnavailableError, KubeApiError."""
        # The index Secrets only: listing the chunks would move every revision's bytes.
        found = self.kube.list(
            "v1", "Secret", namespace=self.namespace, label_selector=f"{REVISION_LABEL}=index"
        )
        return sorted({str(s["metadata"]["labels"][REVISION_OF_LABEL]) for s in found})

    # -- save -------------------------------------------------------------------------------

    def save(
        self,
        bundle: str,
        *,
        manifests: Sequence[Mapping[str, Any]],
        inventory: Inventory,
        info: Mapping[str, Any] | None = None,
    ) -> HealthyRevision:
        """Store a new (healthy) revision of ``bundle`` as its latest; older ones beyond
        ``history`` are deleted. Returns it with its number.

        Raises RevisionStoreError (unreadable index), ApiUnavailableError, KubeApiError.
        """
        kept = self.entries(bundle)
        number = (kept[0].number + 1) if kept else 1
        content = _canonical(
            {
                "format": _FORMAT,
                "bundle": bundle,
                "number": number,
                "manifests": list(manifests),
                "inventory": inventory.to_json(),
                "info": dict(info or {}),
            }
        )
        packed = zlib.compress(content, 6)
        digest = hashlib.sha256(packed).hexdigest()
        pieces = [
            packed[i : i + self.chunk_bytes] for i in range(0, len(packed), self.chunk_bytes)
        ] or [b""]
        base_labels = {REVISION_OF_LABEL: bundle, REVISION_LABEL: str(number)}
        secrets = [
            self._secret(
                self._chunk_name(bundle, number, index),
                labels={**base_labels, CHUNK_LABEL: str(index), CHUNKS_LABEL: str(len(pieces))},
                annotations={SHA256_ANNOTATION: digest},
                data={CHUNK_KEY: piece},
            )
            for index, piece in enumerate(pieces)
        ]
        with ThreadPoolExecutor(max_workers=4, thread_name_prefix="store") as pool:
            for done in [pool.submit(self._write, s) for s in secrets]:
                done.result()
        entry = IndexEntry(number=number, chunks=len(pieces), size=len(packed), sha256=digest)
        history = [entry, *[e for e in kept if e.number != number]][: self.history]
        index = {"format": _FORMAT, "bundle": bundle, "revisions": [e.to_json() for e in history]}
        self._write(
            self._secret(
                self._index_name(bundle),
                labels={REVISION_OF_LABEL: bundle, REVISION_LABEL: "index"},
                data={INDEX_KEY: _canonical(index)},
            )
        )
        self._clean(bundle, {e.number: e.chunks for e in history})
        saved = HealthyRevision.of(
            bundle=bundle,
            number=number,
            manifests=manifests,
            inventory=inventory,
            info=dict(info or {}),
        )
        self._remember(saved, digest)
        return saved

    def keep(
        self,
        bundle: str,
        *,
        manifests: Sequence[Mapping[str, Any]],
        inventory: Inventory,
        digest: str,
        spec: BundleDeploymentSpec | None,
        revision: AppliedRevision | None,
        delete_hooks: Sequence[Mapping[str, Any]] = (),
    ) -> HealthyRevision:
        """:meth:`save` a healthy revision with what a rollback needs to know of it: its spec
        digest, its spec and the serial and pins it came with (and the hooks to run when the
        bundle is removed). Raises what save raises."""
        info: dict[str, Any] = {"digest": digest}
        if delete_hooks:
            info["deleteHooks"] = [dict(h) for h in delete_hooks]
        if spec is not None:
            info["spec"] = to_dict(spec)
        if revision is not None:
            info["revision"] = to_dict(revision)
        return self.save(bundle, manifests=manifests, inventory=inventory, info=info)

    def _write(self, secret: Mapping[str, Any]) -> None:
        # The store's Secrets are ours alone: take over any field someone else touched.
        try:
            self.kube.apply(secret, field_manager=STATE_FIELD_MANAGER, force=True)
        except InvalidError:
            # A leftover under that name that cannot be updated into ours (another Secret
            # type is immutable): replace it.
            self.kube.delete(secret)
            self.kube.apply(secret, field_manager=STATE_FIELD_MANAGER, force=True)

    def _clean(self, bundle: str, keep: Mapping[int, int]) -> None:
        """Delete chunk Secrets of the bundle that no kept revision uses."""
        for secret in self.kube.list(
            "v1", "Secret", namespace=self.namespace, label_selector=f"{REVISION_OF_LABEL}={bundle}"
        ):
            labels = secret["metadata"].get("labels") or {}
            if labels.get(REVISION_LABEL) == "index":
                continue
            try:
                number, index = int(labels[REVISION_LABEL]), int(labels[CHUNK_LABEL])
            except (KeyError, ValueError):
                continue
            if index < keep.get(number, 0):
                continue
            self.kube.delete(self._ref(secret["metadata"]["name"]))

    # -- load -------------------------------------------------------------------------------

    def latest(self, bundle: str) -> HealthyRevision | None:
        """The bundle's last healthy revision, None when it has none: the index is read (one
        small Secret) and the revision reused from memory while the index still names it.
        Raises what :meth:`load` raises."""
        return self.get(bundle, None)

    def get(self, bundle: str, number: int | None) -> HealthyRevision | None:
        """Like :meth:`load`, reusing a revision read (or saved) before while the index
        still names it by number and sha256."""
        kept = self.entries(bundle)
        chosen = next((e for e in kept if number is None or e.number == number), None)
        if chosen is None:
            return None
        with self._lock:
            cached = self._loaded.get((bundle, chosen.number, chosen.sha256))
        return cached if cached is not None else self._load_entry(bundle, chosen)

    def latest_of(self, bundles: Sequence[str]) -> dict[str, HealthyRevision | None]:
        """:meth:`latest` of each of ``bundles``, their indexes read with one LIST (the index
        Secrets, by name; one the LIST did not show, say with its label edited away, is read
        by name), the revisions not in memory loaded side by side. Raises what :meth:`load`
        raises."""
        listed = {
            str(s["metadata"]["name"]): s
            for s in self.kube.list(
                "v1", "Secret", namespace=self.namespace, label_selector=f"{REVISION_LABEL}=index"
            )
        }

        def latest(bundle: str) -> HealthyRevision | None:
            live = listed.get(self._index_name(bundle))
            kept = self.entries(bundle) if live is None else self._parse_index(bundle, live)
            if not kept:
                return None
            with self._lock:
                cached = self._loaded.get((bundle, kept[0].number, kept[0].sha256))
            return cached if cached is not None else self._load_entry(bundle, kept[0])

        names = list(bundles)
        return dict(zip(names, each(latest, names), strict=True))

    def latest_number(self, bundle: str) -> int | None:
        """The number of the bundle's last healthy revision (one small read), or None."""
        entries = self.entries(bundle)
        return entries[0].number if entries else None

    def load(self, bundle: str, number: int | None = None) -> HealthyRevision | None:
        """The latest revision of ``bundle`` (or revision ``number``), None when not stored,
        read from its chunks and checked against its sha256.

        Raises RevisionStoreError (a chunk missing, content not matching its sha256, content
        unreadable), ApiUnavailableError, KubeApiError.
        """
        kept = self.entries(bundle)
        chosen = next((e for e in kept if number is None or e.number == number), None)
        if chosen is None:
            return None
        return self._load_entry(bundle, chosen)

    def _load_entry(self, bundle: str, chosen: IndexEntry) -> HealthyRevision:
        """The revision ``chosen`` names (from an index just read), from its chunks, checked
        against its sha256. Raises what :meth:`load` raises."""
        what = f"revision {chosen.number} of bundle {bundle}"
        pieces: list[bytes] = []
        for index in range(chosen.chunks):
            name = self._chunk_name(bundle, chosen.number, index)
            live = self.kube.get(self._ref(name))
            if live is None:
                raise RevisionStoreError(f"{what}: chunk Secret {self.namespace}/{name} is missing")
            try:
                pieces.append(base64.b64decode((live.get("data") or {}).get(CHUNK_KEY, "")))
            except ValueError as exc:
                raise RevisionStoreError(f"{what}: chunk {name} is not base64") from exc
        packed = b"".join(pieces)
        digest = hashlib.sha256(packed).hexdigest()
        if digest != chosen.sha256 or len(packed) != chosen.size:
            raise RevisionStoreError(
                f"{what}: content sha256 {digest} does not match the recorded {chosen.sha256}"
            )
        try:
            document = json.loads(zlib.decompress(packed))
            loaded = HealthyRevision.of(
                bundle=bundle,
                number=chosen.number,
                manifests=document["manifests"],
                inventory=Inventory.from_json(document["inventory"]),
                info=dict(document.get("info") or {}),
            )
        except (zlib.error, ValueError, KeyError, TypeError) as exc:
            raise RevisionStoreError(f"{what}: content unreadable: {exc}") from exc
        self._remember(loaded, chosen.sha256)
        return loaded

    def _remember(self, revision: HealthyRevision, sha256: str) -> None:
        # The latest and the one before (what a rollback returns to) are what passes use.
        with self._lock:
            mine = [k for k in self._loaded if k[0] == revision.bundle]
            for key in mine[:-1]:
                del self._loaded[key]
            self._loaded[(revision.bundle, revision.number, sha256)] = revision

    def delete(self, bundle: str) -> int:
        """Delete every stored revision of ``bundle`` (index first); returns Secrets deleted.

        Raises ApiUnavailableError, KubeApiError.
        """
        with self._lock:
            for key in [k for k in self._loaded if k[0] == bundle]:
                del self._loaded[key]
        deleted = int(self.kube.delete(self._ref(self._index_name(bundle))))
        for secret in self.kube.list(
            "v1", "Secret", namespace=self.namespace, label_selector=f"{REVISION_OF_LABEL}={bundle}"
        ):
            deleted += int(self.kube.delete(self._ref(secret["metadata"]["name"])))
        return deleted
