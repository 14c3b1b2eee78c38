"""Signing a publication: one Merkle tree, one statement, ONE Sigstore signing event.

Whatever the number of clusters, the hub signs a single small statement naming the Merkle
root over every cluster's ``(cluster, serial, set digest)`` leaf; each cluster branch gets its
own set, the shared statement and bundle, and its inclusion proof.
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path

import requests
from sigstore.errors import Error as SigstoreError
from sigstore.errors import NetworkError
from sigstore.models import ClientTrustConfig
from sigstore.oidc import ExpiredIdentity, IdentityToken
from sigstore.sign import SigningContext

from agent.api import BundleDeploymentSet, dump_set, set_digest
from agent.errors import FieldProblem, TemporaryError, ValidationError
from agent.verify.merkle import MerkleTree, publication_leaf
from agent.verify.publication import (
    API_VERSION,
    BUNDLE_FILE,
    PROOF_FILE,
    PROOF_KIND,
    SET_FILE,
    STATEMENT_FILE,
    ClusterProof,
    PublicationStatement,
)
from hub.errors import PublishError


@dataclass(frozen=True, kw_only=True)
class PublicationSigner:
    """Where and as whom to sign: a sigstore ``SigningContext`` and an ``IdentityToken``.

    The CLI edge builds it (from a client trust config and an OIDC token, see
    :meth:`from_trust_config`, or ``SigningContext.from_trust_config(...)`` directly).
    """

    context: SigningContext
    identity_token: IdentityToken

    @classmethod
    def from_trust_config(
        cls, *, trust_config: str | os.PathLike[str] | ClientTrustConfig, token: str
    ) -> PublicationSigner:
        """Build a signer from a client trust config (a path or a loaded one) and a raw JWT.

        Raises :class:`~hub.errors.PublishError` when the trust config or the token is unusable.
        """
        try:
            if not isinstance(trust_config, ClientTrustConfig):
                trust_config = ClientTrustConfig.from_json(Path(trust_config).read_text())
            context = SigningContext.from_trust_config(trust_config)
        except OSError as exc:
            raise PublishError(f"signing trust config: cannot read: {exc}") from exc
        except Exception as exc:  # pydantic/protobuf parse errors and sigstore's own
            raise PublishError(f"signing trust config: unusable: {_one_line(exc)}") from exc
        try:
            identity_token = IdentityToken(token)
        except Exception as exc:  # sigstore.oidc.IdentityError and JWT decoding errors
            raise PublishError(f"signing identity token: unusable: {_one_line(exc)}") from exc
        return cls(context=context, identity_token=identity_token)


@dataclass(frozen=True, kw_only=True)
class ClusterPublication:
    """One cluster's part of a publication, and the exact files of its branch."""

    cluster: str
    serial: int
    set_digest: str
    proof: ClusterProof
    files: Mapping[str, bytes]


@dataclass(frozen=True, kw_only=True)
class Publication:
    """A signed publication: the statement, its Sigstore bundle, and every cluster's part."""

    statement: PublicationStatement
    statement_bytes: bytes
    bundle_json: bytes
    clusters: Mapping[str, ClusterPublication]


@dataclass(frozen=True, kw_only=True)
class Leaf:
    """One cluster's leaf of the publication's Merkle tree."""

    cluster: str
    serial: int
    set_digest: str


@dataclass(frozen=True, kw_only=True)
class SignedTree:
    """The tree over a publication's leaves, its statement and the statement's Sigstore
    bundle (None when signing is off: ``hub publish --no-sign``)."""

    statement: PublicationStatement
    statement_bytes: bytes
    bundle_json: bytes | None
    tree: MerkleTree
    index: Mapping[str, int]

    checked: dict[str, bool] = field(default_factory=dict, compare=False, repr=False)

    def proof(self, cluster: str) -> ClusterProof:
        """The inclusion proof of ``cluster``'s leaf (KeyError if it is not in the tree)."""
        at = self.index[cluster]
        return ClusterProof(
            cluster=cluster,
            leaf_index=at,
            tree_size=self.tree.size,
            hashes=tuple(self.tree.inclusion_proof(at)),
        )

    def proof_bytes(self, cluster: str) -> bytes:
        """``proof(cluster).to_bytes()``, written directly (100,000 of them per full publish).

        The first one is checked against :meth:`ClusterProof.to_bytes`; if they ever differ,
        every proof is encoded by it.
        """
        if not self.checked.get("fast", True) or not cluster.isascii():
            return self.proof(cluster).to_bytes()
        at = self.index[cluster]
        hashes = ",".join(f'"{h.hex()}"' for h in self.tree.inclusion_proof(at))
        fast = (
            f'{{"apiVersion":"{API_VERSION}","cluster":"{cluster}","hashes":[{hashes}],'
            f'"kind":"{PROOF_KIND}","leafIndex":{at},"treeSize":{self.tree.size}}}'
        ).encode()
        if "fast" not in self.checked:
            self.checked["fast"] = fast == self.proof(cluster).to_bytes()
            if not self.checked["fast"]:
                return self.proof(cluster).to_bytes()
        return fast


def sign_leaves(
    *,
    leaves: Sequence[Leaf],
    signer: PublicationSigner | None,
    issued_at: datetime,
    expires_at: datetime,
    source_repo: str,
    source_commit: str,
) -> SignedTree:
    """Build the Merkle tree over ``leaves`` (ordered by cluster) and sign its statement once.

    The sets behind the leaves must come from ``source_repo``/``source_commit`` and expire at
    ``expires_at`` at the latest (the caller builds them so). ``signer`` None: no signature.
    Raises ValidationError (no leaves, a cluster twice, naive or inverted times),
    TemporaryError and PublishError as :func:`sign_publication`.
    """
    issued_at, expires_at = issued_at.replace(microsecond=0), expires_at.replace(microsecond=0)
    ordered = sorted(leaves, key=lambda leaf: leaf.cluster)
    problems: list[FieldProblem] = []
    if not ordered:
        problems.append(FieldProblem(path="leaves", expected="at least one leaf", found="none"))
    for name, moment in (("issued_at", issued_at), ("expires_at", expires_at)):
        if moment.tzinfo is None:
            problems.append(FieldProblem(path=name, expected="an aware time", found="naive"))
    if not problems and expires_at <= issued_at:
        problems.append(
            FieldProblem(
                path="expires_at", expected=f"later than {issued_at}", found=str(expires_at)
            )
        )
    for i in range(1, len(ordered)):
        if ordered[i - 1].cluster == ordered[i].cluster:
            problems.append(
                FieldProblem(
                    path=f"leaves[{ordered[i].cluster}]",
                    expected="one leaf per cluster",
                    found="a second leaf",
                )
            )
    if problems:
        raise ValidationError(problems, origin="publication")
    tree = MerkleTree(
        [
            publication_leaf(cluster=leaf.cluster, serial=leaf.serial, set_digest=leaf.set_digest)
            for leaf in ordered
        ]
    )
    statement = PublicationStatement(
        merkle_root=tree.root,
        tree_size=tree.size,
        issued_at=issued_at,
        expires_at=expires_at,
        source_repo=source_repo,
        source_commit=source_commit,
        serial_min=min(leaf.serial for leaf in ordered),
        serial_max=max(leaf.serial for leaf in ordered),
    )
    statement_bytes = statement.to_bytes()
    bundle_json = _sign_once(signer, statement_bytes) if signer is not None else None
    return SignedTree(
        statement=statement,
        statement_bytes=statement_bytes,
        bundle_json=bundle_json,
        tree=tree,
        index={leaf.cluster: i for i, leaf in enumerate(ordered)},
    )


def sign_publication(
    *,
    sets: Sequence[BundleDeploymentSet],
    signer: PublicationSigner,
    issued_at: datetime,
    expires_at: datetime,
    source_repo: str,
    source_commit: str,
) -> Publication:
    """Build the Merkle tree over ``sets``, sign its statement once, and return every branch.

    Leaves are ordered by cluster name, so the same sets always give the same root. Each set
    must come from ``source_repo``/``source_commit`` and expire no later than ``expires_at``
    (an agent refuses a set that outlives its statement).

    Raises :class:`ValidationError` for inconsistent input (no sets, a cluster twice, a set
    from another source or outliving the statement, naive or inverted times),
    :class:`TemporaryError` when a Sigstore service cannot be reached or answers 5xx, and
    :class:`~hub.errors.PublishError` for any other signing failure (expired token, refused
    request).
    """
    # The statement, like the sets, carries whole seconds: keep the in-memory one identical.
    issued_at, expires_at = issued_at.replace(microsecond=0), expires_at.replace(microsecond=0)
    ordered = sorted(sets, key=lambda s: s.cluster)
    _check_inputs(ordered, issued_at, expires_at, source_repo, source_commit)

    digests = [set_digest(s) for s in ordered]
    tree = MerkleTree(
        [
            publication_leaf(cluster=s.cluster, serial=s.serial, set_digest=d)
            for s, d in zip(ordered, digests, strict=True)
        ]
    )
    statement = PublicationStatement(
        merkle_root=tree.root,
        tree_size=tree.size,
        issued_at=issued_at,
        expires_at=expires_at,
        source_repo=source_repo,
        source_commit=source_commit,
        serial_min=min(s.serial for s in ordered),
        serial_max=max(s.serial for s in ordered),
    )
    statement_bytes = statement.to_bytes()
    bundle_json = _sign_once(signer, statement_bytes)

    clusters: dict[str, ClusterPublication] = {}
    for index, (s, digest) in enumerate(zip(ordered, digests, strict=True)):
        proof = ClusterProof(
            cluster=s.cluster,
            leaf_index=index,
            tree_size=tree.size,
            hashes=tuple(tree.inclusion_proof(index)),
        )
        clusters[s.cluster] = ClusterPublication(
            cluster=s.cluster,
            serial=s.serial,
            set_digest=digest,
            proof=proof,
            files={
                SET_FILE: dump_set(s),
                STATEMENT_FILE: statement_bytes,
                BUNDLE_FILE: bundle_json,
                PROOF_FILE: proof.to_bytes(),
            },
        )
    return Publication(
        statement=statement,
        statement_bytes=statement_bytes,
        bundle_json=bundle_json,
        clusters=clusters,
    )


def _check_inputs(
    ordered: Sequence[BundleDeploymentSet],
    issued_at: datetime,
    expires_at: datetime,
    source_repo: str,
    source_commit: str,
) -> None:
    problems: list[FieldProblem] = []
    if not ordered:
        problems.append(FieldProblem(path="sets", expected="at least one set", found="none"))
    for name, moment in (("issued_at", issued_at), ("expires_at", expires_at)):
        if moment.tzinfo is None:
            problems.append(FieldProblem(path=name, expected="an aware time", found="naive"))
    if problems:
        raise ValidationError(problems, origin="publication")
    if expires_at <= issued_at:
        problems.append(
            FieldProblem(
                path="expires_at", expected=f"later than {issued_at}", found=str(expires_at)
            )
        )
    for i, s in enumerate(ordered):
        where = f"sets[{s.cluster}]"
        if i and ordered[i - 1].cluster == s.cluster:
            problems.append(
                FieldProblem(path=where, expected="one set per cluster", found="a second set")
            )
        if (s.source.repo, s.source.commit) != (source_repo, source_commit):
            problems.append(
                FieldProblem(
                    path=f"{where}.source",
                    expected=f"{source_repo}@{source_commit}",
                    found=f"{s.source.repo}@{s.source.commit}",
                )
            )
        if s.expires_at > expires_at:
            problems.append(
                FieldProblem(
                    path=f"{where}.expiresAt",
                    expected=f"at most the publication's {expires_at}",
                    found=str(s.expires_at),
                )
            )
    if problems:
        raise ValidationError(problems, origin="publication")


def _sign_once(signer: PublicationSigner, statement_bytes: bytes) -> bytes:
    """The single Sigstore signing event of a publication; converts sigstore's errors."""
    try:
        with signer.context.signer(signer.identity_token) as sigstore_signer:
            bundle = sigstore_signer.sign_artifact(statement_bytes)
    except ExpiredIdentity as exc:
        raise PublishError("signing: the OIDC identity token has expired") from exc
    except requests.RequestException as exc:
        status = exc.response.status_code if exc.response is not None else None
        if status is None or status >= 500:
            raise TemporaryError(
                f"signing: a Sigstore service is unavailable: {_one_line(exc)}"
            ) from exc
        raise PublishError(f"signing: refused by a Sigstore service: {_one_line(exc)}") from exc
    except NetworkError as exc:
        raise TemporaryError(
            f"signing: a Sigstore service is unreachable: {_one_line(exc)}"
        ) from exc
    except (SigstoreError, ValueError) as exc:
        raise PublishError(f"signing: {_one_line(exc)}") from exc
    except Exception as exc:
        # sigstore's Fulcio/Rekor clients raise private types raised while handling the HTTP
        # error: a 5xx or a connection failure may pass, anything else will not.
        cause = exc.__cause__ or exc.__context__
        if isinstance(cause, requests.RequestException):
            response = cause.response
            if response is None or response.status_code >= 500:
                raise TemporaryError(
                    f"signing: a Sigstore service is unavailable: {_one_line(exc)}"
                ) from exc
        raise PublishError(f"signing failed: {type(exc).__name__}: {_one_line(exc)}") from exc
    return bundle.to_json().encode()


def _one_line(exc: BaseException, limit: int = 300) -> str:
    """sigstore's and pydantic's messages span lines; errors here are one line."""
    text = " ".join(str(exc).split()) or type(exc).__name__
    return text if len(text) <= limit else text[: limit - 3] + "..."
