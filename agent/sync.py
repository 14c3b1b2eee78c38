"""The agent's inbound pipeline: poll → fetch → verify → fetch content → render.

One call of :meth:`InboundPipeline.sync` is one reconcile of the inbound half, each stage one
method raising with its own reason (the ``reason`` attribute of the error):

- ``poll``: one ref listing of ``fleetlet/clusters/<cluster>``; an unchanged branch ends here.
- ``fetch``: only this cluster's branch, the publication's four files.
- ``verify``: :func:`agent.verify.verify_publication` against the last serial this cluster
  accepted, which :class:`ClusterState` keeps IN THE CLUSTER (a restarted or re-scheduled
  agent keeps its anti-rollback memory). A refused commit is remembered and not retried
  until the branch moves.
- ``content`` and ``render``: every bundle's sources by digest through the cache, rendered
  with its format, namespaces defaulted from the API server's discovery.

The apply, health and prune stages (the outbound half) consume :class:`SyncResult.bundles`.
"""

from __future__ import annotations

import base64
import functools
import json
import shutil
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from cryptography.hazmat.primitives import hashes

from agent.api import (
    BundleDeploymentEntry,
    BundleDeploymentSet,
    canonical_bytes,
    digest_of,
    format_time,
    set_from_dict,
    set_to_dict,
    to_dict,
)
from agent.bundles import BundleDeployments
from agent.errors import PermanentError, TemporaryError, ValidationError, VerificationError
from agent.kube import KubeClient
from agent.render.cache import RenderCache, sources_digest
from agent.render.manifests import Manifest
from agent.render.plain import Ownership, RenderRequest
from agent.render.scope import with_bundle_crds
from agent.source.branch import (
    BranchContentError,
    BranchNotFoundError,
    BranchWatcher,
    FetchTooLargeError,
)
from agent.source.compose import ContentStore, credentials_from_secret
from agent.source.content import Credentials
from agent.verify import TrustPolicy, verify_publication

STATE_NAME = "fleetlet-agent-state"


@dataclass(frozen=True, kw_only=True)
class AgentState:
    """What the agent remembers between runs (persisted by :class:`ClusterState`)."""

    last_serial: int | None = None
    """The highest serial accepted; anything not greater is refused as a replay."""
    commit: str | None = None
    """The branch commit whose publication was accepted last."""
    content_digest: str | None = None
    """Digest of the accepted set's bundles and groups (serial and times left out), so a
    refresh with identical content only advances the serial."""
    refused_commit: str | None = None
    """A commit whose publication was refused: not retried until the branch moves."""
    refusal_reason: str | None = None
    refusal_message: str | None = None
    refused_under: str | None = None
    refused_at: str | None = None
    """When the refusal was made (RFC 3339)."""
    """The trust policy the refusal was made under: a changed policy (the operator fixed the
    agent's configuration) retries the same commit."""
    last_poll: str | None = None


class ClusterState:
    """The agent's state in a ConfigMap of its own namespace, written with server-side apply."""

    def __init__(self, *, kube: KubeClient, namespace: str, name: str = STATE_NAME) -> None:
        self._kube = kube
        self._namespace = namespace
        self._name = name

    def load(self) -> AgentState:
        """The stored state (empty on first start). Raises the KubeClient's errors."""
        live = self._kube.get(
            {"apiVersion": "v1", "kind": "ConfigMap", "metadata": self._metadata()}
        )
        if live is None:
            return AgentState()
        raw = (live.get("data") or {}).get("state")
        try:
            data = json.loads(raw) if raw else {}
            return AgentState(**{k: v for k, v in data.items() if k in _STATE_FIELDS})
        except (ValueError, TypeError) as exc:
            # A state we cannot read must not silently reset anti-rollback memory.
            raise PermanentError(
                f"ConfigMap {self._namespace}/{self._name}: unreadable agent state ({exc})"
            ) from exc

    def save(self, state: AgentState) -> None:
        """Store ``state``. Raises the KubeClient's errors."""
        body = {
            "apiVersion": "v1",
            "kind": "ConfigMap",
            "metadata": {**self._metadata(), "labels": {"app.kubernetes.io/name": "fleetlet"}},
            "data": {"state": json.dumps(state.__dict__, sort_keys=True)},
        }
        self._kube.apply(body, field_manager="fleetlet", force=True)

    def _metadata(self) -> dict[str, str]:
        return {"name": self._name, "namespace": self._namespace}

    def _set_ref(self) -> dict[str, Any]:
        meta = {"name": f"{self._name}-set", "namespace": self._namespace}
        return {"apiVersion": "v1", "kind": "ConfigMap", "metadata": meta}

    def load_set(self) -> BundleDeploymentSet | None:
        """The last accepted set (None before the first): what the agent keeps running,
        known after a restart without the git server. Raises PermanentError (unreadable),
        the KubeClient's errors."""
        live = self._kube.get(self._set_ref())
        raw = ((live or {}).get("data") or {}).get("set.json")
        if not raw:
            return None
        try:
            return set_from_dict(json.loads(raw), origin=f"ConfigMap {self._name}-set")
        except (ValueError, ValidationError) as exc:
            raise PermanentError(
                f"ConfigMap {self._namespace}/{self._name}-set: unreadable accepted set ({exc})"
            ) from exc

    def save_set(self, deployment_set: BundleDeploymentSet) -> None:
        """Keep the accepted set (verified before, so it is trusted as the cluster is).
        Raises the KubeClient's errors."""
        body = self._set_ref()
        body["metadata"]["labels"] = {"app.kubernetes.io/name": "fleetlet"}
        body["data"] = {"set.json": canonical_bytes(set_to_dict(deployment_set)).decode()}
        self._kube.apply(body, field_manager="fleetlet", force=True)


_STATE_FIELDS = frozenset(AgentState.__dataclass_fields__)


@dataclass(frozen=True, kw_only=True)
class RenderedBundle:
    """One BundleDeployment of the accepted set, rendered."""

    name: str
    group: str
    objects: list[Manifest]


@dataclass(frozen=True, kw_only=True)
class SyncResult:
    """What one inbound reconcile did.

    ``outcome``: ``unchanged`` (branch did not move), ``refused-before`` (the commit was
    refused earlier), ``serial-advanced`` (newer serial, identical content), ``rendered``.
    """

    outcome: str
    commit: str | None = None
    refusal: str | None = None
    serial: int | None = None
    deployment_set: BundleDeploymentSet | None = None
    bundles: list[RenderedBundle] = field(default_factory=list)


class InboundPipeline:
    """Poll, fetch, verify, fetch content and render this cluster's set."""

    def __init__(
        self,
        *,
        cluster: str,
        watcher: BranchWatcher,
        trust: TrustPolicy,
        content: ContentStore,
        kube: KubeClient,
        state: ClusterState,
        agent_namespace: str,
        workdir: Path,
        bundles: BundleDeployments | None = None,
        clock: Callable[[], datetime] = lambda: datetime.now(UTC),
        renders: RenderCache | None = None,
    ) -> None:
        """``bundles``: where a refused publication is reported on the BundleDeployments
        (None: not reported, for clusters without the CRDs). ``renders``: the render cache
        (default: in memory and under ``workdir/renders``)."""
        self.cluster = cluster
        self._watcher = watcher
        self._trust = trust
        self._content = content
        self._kube = kube
        self._state = state
        self._agent_namespace = agent_namespace
        self._workdir = Path(workdir)
        self._bundles = bundles
        self._clock = clock
        self.renders = renders or RenderCache(directory=self._workdir / "renders")
        # Who may sign and which CAs are trusted: a refusal is remembered under this policy.
        identity = trust.identity
        cas = sorted(
            c.fingerprint(hashes.SHA256()).hex() for c in trust.trusted_root.get_fulcio_certs()
        )
        self._policy = digest_of(
            canonical_bytes({"issuer": identity.issuer, "subject": identity.subject, "cas": cas})
        )

    def sync(self) -> SyncResult:
        """One inbound reconcile.

        Raises GitUnavailableError / FetchError / ApiUnavailableError (temporary: retry with
        backoff) and the refusals: VerificationError or ValidationError subclasses (after
        recording them in the cluster), BranchNotFoundError, ContentRefusedError,
        InvalidManifestError (permanent).
        """
        state = self._state.load()
        commit = self._watcher.poll()
        state = replace(state, last_poll=format_time(self._clock()))
        if commit is None:
            raise BranchNotFoundError(
                f"{self._watcher.repo_url}: no branch {self._watcher.ref} (nothing published "
                f"for cluster {self.cluster!r} yet)"
            )
        if commit == state.commit:
            return SyncResult(outcome="unchanged", commit=commit, serial=state.last_serial)
        if commit == state.refused_commit and state.refused_under == self._policy:
            return SyncResult(
                outcome="refused-before",
                commit=commit,
                serial=state.last_serial,
                refusal=f"{state.refusal_reason}: {state.refusal_message}",
            )
        try:
            files = self._watcher.fetch(commit)
            verified = verify_publication(
                files=files,
                cluster=self.cluster,
                last_serial=state.last_serial,
                trust=self._trust,
                now=self._clock(),
            )
        except (VerificationError, ValidationError, BranchContentError, FetchTooLargeError) as exc:
            self._refuse(state, commit, exc)
            raise
        deployment_set = verified.deployment_set
        content_digest = _content_digest(deployment_set)
        accepted = replace(
            state,
            last_serial=deployment_set.serial,
            commit=commit,
            content_digest=content_digest,
            refused_commit=None,
            refusal_reason=None,
            refusal_message=None,
            refused_under=None,
        )
        if content_digest == state.content_digest:
            self._state.save_set(deployment_set)
            self._state.save(accepted)
            return SyncResult(
                outcome="serial-advanced",
                commit=commit,
                serial=deployment_set.serial,
                deployment_set=deployment_set,
            )
        try:
            bundles = self.render(deployment_set)
        except PermanentError as exc:
            # Hostile or broken content, an unknown format: the same commit renders the same
            # way, so it is not fetched again until the branch moves.
            self._refuse(state, commit, exc)
            raise
        # The serial is accepted once everything it names could be fetched and rendered: a
        # temporary fetch failure leaves the commit to be tried again at the next poll. The
        # set first: a crash between the two writes re-verifies the same commit, harmlessly.
        self._state.save_set(deployment_set)
        self._state.save(accepted)
        return SyncResult(
            outcome="rendered",
            commit=commit,
            serial=deployment_set.serial,
            deployment_set=deployment_set,
            bundles=bundles,
        )

    def _refuse(self, state: AgentState, commit: str, exc: Exception) -> None:
        """Remember (in the cluster) that ``commit`` was refused and why, and say so on every
        BundleDeployment: they keep running what they have."""
        reason = getattr(exc, "reason", "ValidationFailed")
        self._state.save(
            replace(
                state,
                refused_commit=commit,
                refusal_reason=reason,
                refusal_message=str(exc),
                refused_under=self._policy,
                refused_at=format_time(self._clock()),
            )
        )
        if self._bundles is not None:
            self._bundles.report_refusal(reason=reason, message=str(exc), commit=commit)

    def render(
        self,
        deployment_set: BundleDeploymentSet,
        entries: Sequence[BundleDeploymentEntry] | None = None,
    ) -> list[RenderedBundle]:
        """Fetch the sources of ``entries`` (default: every bundle of the set) by digest and
        render them, in the set's group order.

        Raises FetchError (temporary), ContentRefusedError, InvalidManifestError,
        UnknownFormatError (permanent).
        """
        root = self._workdir / "trees" / str(deployment_set.serial)
        shutil.rmtree(root, ignore_errors=True)
        order = {group: i for i, group in enumerate(deployment_set.groups)}
        chosen = deployment_set.bundle_deployments if entries is None else entries
        entries = sorted(chosen, key=lambda e: order[e.group])
        rendered = []
        # CRDs of earlier groups are not served yet when the set is rendered; their kinds'
        # scope comes from the CRD objects themselves (a Promotion gets the target namespace
        # even though the platform group that defines it has not been applied yet).
        crds: list[Manifest] = []
        try:
            for entry in entries:
                spec = entry.spec
                options = spec.format_options
                # Render cache (issue 16): the pins name the content, so a bundle rendered
                # before for the same options is neither fetched nor rendered again.
                objects = self.renders.render(
                    format=spec.format,
                    content=sources_digest(to_dict(s) for s in spec.sources),
                    request=RenderRequest(
                        source=entry.name,
                        namespace=options.target_namespace if options else None,
                        scope=with_bundle_crds(crds, self._kube.scope),
                        ownership=Ownership(
                            bundle=entry.name,
                            group=entry.group,
                            revision=str(deployment_set.serial),
                        ),
                        options=_options_dict(options),
                        patches=tuple(to_dict(p) for p in spec.patches),
                    ),
                    tree=functools.partial(
                        self._content.compose,
                        spec.sources,
                        root / entry.name,
                        credentials=self._credentials,
                    ),
                )
                crds.extend(o for o in objects if o.get("kind") == "CustomResourceDefinition")
                rendered.append(RenderedBundle(name=entry.name, group=entry.group, objects=objects))
        finally:
            shutil.rmtree(root, ignore_errors=True)
        return rendered

    def _credentials(self, secret_name: str) -> Credentials:
        secret = self._kube.get(
            {
                "apiVersion": "v1",
                "kind": "Secret",
                "metadata": {"name": secret_name, "namespace": self._agent_namespace},
            }
        )
        if secret is None:
            # An admin can create it without the branch moving: try again later.
            raise TemporaryError(
                f"source credentials: no Secret {self._agent_namespace}/{secret_name}",
                delay=30.0,
            )
        data = {k: base64.b64decode(v) for k, v in (secret.get("data") or {}).items()}
        return credentials_from_secret(data)


def _content_digest(deployment_set: BundleDeploymentSet) -> str:
    doc = set_to_dict(deployment_set)
    return digest_of(
        canonical_bytes(
            {"bundleDeployments": doc.get("bundleDeployments"), "groups": doc.get("groups")}
        )
    )


def _options_dict(options: Any) -> dict[str, Any]:
    if options is None:
        return {}
    return dict(to_dict(options))


__all__ = [
    "AgentState",
    "ClusterState",
    "InboundPipeline",
    "RenderedBundle",
    "SyncResult",
]
