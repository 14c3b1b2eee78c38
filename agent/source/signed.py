"""The cluster's own check of source signatures (``agent install --verify-sources FILE``).

The hub verifies every OCI source against the fleet's signature policy before publishing, and
the set records that it did (``signature: {policy, signer, layout}``). A cluster that wants
more than the hub's word sets a policy of its own: then, before any image source is used
(fetched or taken from the cache), the agent reads the digest's cosign signatures from the
source's registry and verifies them itself (:mod:`agent.verify.cosign`), with the hub away.
A source the hub vouched for is still refused when the cluster's policy disagrees, naming
both. A pass is remembered by (digest, policy digest) beside the content cache; a refusal
never is.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

from agent.api.reasons import Reason
from agent.errors import FieldProblem
from agent.source.content import ContentRefusedError, Credentials
from agent.source.oci import parse_reference
from agent.source.registry import RegistryClient, RegistrySettings
from agent.verify.cosign import PassCache, SignatureCheck, SignatureReader, check_signatures
from agent.verify.sources import SourcePolicy, file_reader, parse_source_policy

if TYPE_CHECKING:
    from agent.api.signatures import SignedSource


class SourceSignatureError(ContentRefusedError):
    """An image source's signature does not satisfy the cluster's source policy."""

    reason = Reason.SOURCE_SIGNATURE_REFUSED


class SourcePolicyError(ContentRefusedError):
    """The cluster's source policy file cannot be used."""

    reason = "SourcePolicyInvalid"


def load_cluster_policy(path: Path) -> SourcePolicy:
    """The policy file (YAML: keys, identities, trustedRoot; files relative to it). Raises
    SourcePolicyError naming every problem."""
    import yaml

    from agent.api.yamlio import SAFE_LOADER

    where = str(path)
    try:
        raw = yaml.load(path.read_bytes(), Loader=SAFE_LOADER)
    except (OSError, yaml.YAMLError) as exc:
        raise SourcePolicyError(
            f"cannot read the source policy: {exc}", source=where, rule="PolicyUnreadable"
        ) from exc
    problems: list[FieldProblem] = []
    policy = parse_source_policy(
        raw, name="cluster", where="policy", read=file_reader(path.parent), problems=problems
    )
    if policy is None:
        shown = "; ".join(f"{p.path}: expected {p.expected}, got {p.found}" for p in problems)
        raise SourcePolicyError(shown, source=where, rule="PolicyInvalid")
    return policy


class SourceVerifier:
    """Checks image sources against the cluster's policy; passes cached in ``cache_dir``."""

    def __init__(
        self, policy: SourcePolicy, *, cache_dir: Path, settings: RegistrySettings
    ) -> None:
        self.policy = policy
        self.cache = PassCache(cache_dir)
        self.settings = settings
        self.checked = 0

    def require(
        self, source: Any, *, credentials: Credentials | None, label: str
    ) -> SignatureCheck:
        """The passing check of ``source`` (an ``image`` source). Raises SourceSignatureError
        (refused), SignaturesUnavailableError (the registry did not answer)."""
        digest = str(source.digest or "")
        wanted = self.policy.digest()
        cached = self.cache.get(digest, wanted)
        if cached is not None:
            return cached
        ref, _ = parse_reference(source.uri, source=label)
        plain = self.settings.plain_http if ref.plain_http is None else ref.plain_http
        client = RegistryClient(
            host=ref.host,
            settings=RegistrySettings(
                plain_http=plain,
                timeout=self.settings.timeout,
                connect_timeout=self.settings.connect_timeout,
                attempts=self.settings.attempts,
                backoff=self.settings.backoff,
                user_agent=self.settings.user_agent,
            ),
            credentials=credentials,
            source=f"{label} (signatures)",
        )
        try:
            reader = SignatureReader(
                client,
                base=f"{'http' if plain else 'https'}://{ref.host}",
                repository=ref.repository,
            )
            check = check_signatures(reader, digest, self.policy)
        finally:
            client.session.close()
        self.checked += 1
        if not check.ok:
            vouched = getattr(source, "signature", None)
            hub = (
                f"; the hub vouched for it (signed by {vouched.signer}, policy "
                f"{vouched.policy[:19]}), but the cluster's policy decides"
                if vouched is not None
                else ""
            )
            raise SourceSignatureError(
                f"not signed as the cluster's source policy ({wanted[:19]}) requires: "
                f"{check.reason}{hub}; the policy wants {self.policy.wanted()}",
                source=label,
                rule="SourceSignature",
            )
        self.cache.put(check)
        return check


def signed_sources(entry: Any, cluster_policy: str | None) -> tuple[SignedSource, ...]:
    """The status document's record of a bundle's image sources the hub verified (and the
    cluster too, under ``cluster_policy``, the digest of its own policy when it has one)."""
    from agent.api.signatures import SignedSource

    return tuple(
        SignedSource(
            digest=str(s.digest),
            signer=s.signature.signer,
            policy=s.signature.policy,
            cluster_policy=cluster_policy,
        )
        for s in entry.spec.sources
        if s.kind == "image" and s.signature is not None
    )[:16]
