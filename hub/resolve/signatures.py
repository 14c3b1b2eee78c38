"""Before a publication: every pinned OCI source checked against its signature policy.

:func:`verify_sources` runs between resolving the fleet's references and planning its sets
(:mod:`hub.publish.flow`). For each ``image`` source a policy covers (``fleet.yaml:
sourceSigning``, :mod:`hub.fleet.signing`): the pinned digest's cosign signatures are read
from its registry and verified (:mod:`agent.verify.cosign`). A digest passes or fails the same
way for the same policy wherever it is used, so each (digest, policy) is checked once per run,
and a pass is remembered in the hub's cache directory (``signatures/``): a publish that
changes 1% of the fleet reads no signature of an unchanged source. A refusal is never
cached (a signature may be added), nor is an unreachable registry (a retry may help).

The verdicts give :class:`SourceSignatures`: the proof each verified source carries in the
signed set (``signature: {policy, signer, layout}``), and the refusal ``hub publish`` raises,
naming each bundle, source, digest, and what was missing.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from agent.errors import FieldProblem
from agent.source.content import Credentials
from agent.source.registry import RegistryClient, RegistrySettings
from agent.verify.cosign import PassCache, SignatureCheck, SignatureReader, check_signatures
from agent.verify.sources import SourcePolicy
from hub.errors import FleetRepoError
from hub.fleet.model import Bundle, ChartPin, Fleet, Pin, SourceRef
from hub.fleet.signing import SourceSigning
from hub.resolve.resolver import ResolveSettings, split_oci_uri


@dataclass(frozen=True, slots=True)
class SourceVerdict:
    """One image source against its policy: the check, and the bundles that use it."""

    source: SourceRef
    digest: str
    bundles: tuple[str, ...]
    policy: SourcePolicy
    check: SignatureCheck

    def refusal(self) -> str:
        """One line: who uses what, which digest, why it fails, what the policy wants."""
        return (
            f"{', '.join(self.bundles)}: image {self.source.uri}@{self.digest} is not signed "
            f"as {self.policy.describe()} requires: {self.check.reason}; "
            f"the policy wants {self.policy.wanted()}"
        )

    def proof(self) -> dict[str, Any]:
        """The set's ``signature`` of the source (only for a verified one)."""
        assert self.check.ok and self.check.signer is not None
        return {
            "policy": self.policy.digest(),
            "signer": self.check.signer,
            "layout": self.check.layout,
        }


@dataclass(slots=True)
class SourceSignatures:
    """Every checked source's verdict, and what the checks cost."""

    verdicts: dict[SourceRef, SourceVerdict] = field(default_factory=dict)
    checked: int = 0
    """Distinct (digest, policy) pairs verified against the registry in this run."""
    cached: int = 0
    """Pairs answered by the cache directory."""
    requests: int = 0
    """Registry requests made to read signatures."""

    def failed(self) -> list[SourceVerdict]:
        return [v for v in self.verdicts.values() if not v.check.ok]

    def proofs(self) -> dict[SourceRef, dict[str, Any]]:
        return {s: v.proof() for s, v in self.verdicts.items() if v.check.ok}

    def refusals(self) -> list[str]:
        """Every failing source's refusal, one line each (sorted)."""
        return sorted(v.refusal() for v in self.failed())

    def refusal(self) -> str | None:
        """Every failing source in one line, numbered when several (None: all pass)."""
        failed = self.refusals()
        if len(failed) <= 1:
            return f"a source is not signed as its policy requires: {failed[0]}" if failed else None
        shown = " ".join(f"[{i}] {line}" for i, line in enumerate(failed, 1))
        return f"{len(failed)} sources are not signed as their policies require: {shown}"


def verify_sources(
    fleet: Fleet,
    bundles: Iterable[Bundle],
    pins: Mapping[SourceRef, Pin],
    *,
    settings: ResolveSettings,
    cache_dir: Path | None = None,
) -> SourceSignatures:
    """Check every image source of ``bundles`` that a policy covers (the module docstring).

    Raises FleetRepoError when a ``verify`` names no policy of ``fleet.yaml``, and
    SignaturesUnavailableError when a registry does not answer.
    """
    signing = fleet.settings.source_signing or SourceSigning()
    wanted: dict[tuple[SourceRef, str], list[str]] = {}
    problems: list[FieldProblem] = []
    for bundle in bundles:
        for src in bundle.all_sources:
            if src.kind != "image":
                continue
            name = signing.chosen(src.verify, bundle.verify)
            if name is None:
                continue
            if name not in signing.policies:
                problems.append(
                    FieldProblem(
                        path=f"{bundle.file}: verify",
                        expected="the name of a policy of fleet.yaml sourceSigning.policies "
                        f"({', '.join(sorted(signing.policies)) or 'none defined'})",
                        found=repr(name),
                    )
                )
                continue
            wanted.setdefault((src, name), []).append(bundle.name)
    if problems:
        raise FleetRepoError(problems, origin=str(fleet.root))
    result = SourceSignatures()
    done: dict[tuple[str, str], SignatureCheck] = {}
    readers: dict[tuple[str, str], SignatureReader] = {}
    clients: dict[tuple[str, bool], RegistryClient] = {}
    cache = PassCache(cache_dir) if cache_dir is not None else None
    for (src, name), users in sorted(wanted.items(), key=lambda kv: (kv[0][0].uri, kv[0][1])):
        pin = pins[src]
        digest = pin.pin if isinstance(pin, ChartPin) else pin
        policy = signing.policies[name]
        key = (digest, policy.digest())
        check = done.get(key) or (cache.get(*key) if cache is not None else None)
        if check is not None and key not in done:
            result.cached += 1
        if check is None:
            reader = _reader(src.uri, settings, readers, clients)
            before = reader.requests
            check = check_signatures(reader, digest, policy)
            result.requests += reader.requests - before
            result.checked += 1
            if check.ok and cache is not None:
                cache.put(check)
        done[key] = check
        verdict = SourceVerdict(src, digest, tuple(sorted(set(users))), policy, check)
        previous = result.verdicts.get(src)
        # A source under two policies (two bundles naming different ones) must pass both.
        if previous is None or previous.check.ok:
            result.verdicts[src] = verdict
    return result


def _reader(
    uri: str,
    settings: ResolveSettings,
    readers: dict[tuple[str, str], SignatureReader],
    clients: dict[tuple[str, bool], RegistryClient],
) -> SignatureReader:
    host, repo, plain = split_oci_uri(uri, settings.insecure_registries)
    reader = readers.get((host, repo))
    if reader is not None:
        return reader
    client = clients.get((host, plain))
    if client is None:
        user, password = (settings.registry_credentials or {}).get(host, (None, None))
        client = RegistryClient(
            host=host,
            settings=RegistrySettings(
                plain_http=plain,
                timeout=settings.timeout,
                attempts=settings.attempts,
                backoff=settings.backoff,
                user_agent=settings.user_agent,
            ),
            credentials=Credentials(username=user, password=password) if user else None,
            source=f"registry {host} (signatures)",
        )
        clients[(host, plain)] = client
    reader = SignatureReader(
        client, base=f"{'http' if plain else 'https'}://{host}", repository=repo
    )
    readers[(host, repo)] = reader
    return reader
