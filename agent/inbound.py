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

What refuses the whole publication, and what fails only a group, is decided by WHERE the error
is raised (not by its class: an InvalidManifestError is a ContentRefusedError too):

- refused whole (recorded in the cluster, ``last_refusal`` in the status document, said on
  every BundleDeployment, not retried until the branch moves): every failure of the
  verification (signature, identity, inclusion proof, serial, expiry, schema), and every
  permanent error of the **source layer** (:mod:`agent.source`) while it fetches, unpacks and
  composes a bundle's tree: a digest mismatch, path traversal, links leaving the tree, unpack
  limits, an unusable source. Those mean a compromised or corrupt source: the agent fails
  closed. So does anything a library raises that none of our checks names (a bug met on
  hostile input), as before;
- fails only its group: a permanent error of the **render** of a bundle whose tree was
  composed (an unknown format, a plugin that fails, a tool that fails, such as a chart that
  does not template, invalid manifests or a broken YAML file coming out of the render). The
  verified set is accepted; the bundles that rendered go on to the reconcile; the failing
  bundle's group (and the groups that ``dependsOn`` it, which are not rendered, though their
  sources are still fetched and judged) are left out of :attr:`SyncResult.bundles`, and the failure is listed in :attr:`SyncResult.failed` and
  kept for the reconcile's first :meth:`InboundPipeline.render` of that bundle, which raises
  it instead of rendering again: the group fails there alone (RenderFailed, refused until its
  target changes), its dependents wait, the other groups move. Nothing of a bundle that did
  not render is ever applied, so this trades no safety for the isolation;
- a temporary error (a registry away) leaves the commit to be tried again, as before.

The apply, health and prune stages (the outbound half) consume :class:`SyncResult.bundles`.
"""

from __future__ import annotations

import functools
import logging
import shutil
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

from agent.api import (
    BundleDeploymentEntry,
    BundleDeploymentSet,
    BundleDeploymentSpec,
    canonical_bytes,
    digest_of,
    format_time,
    set_to_dict,
    to_dict,
)
from agent.errors import (
    FleetletError,
    PermanentError,
    TemporaryError,
    ValidationError,
    VerificationError,
)
from agent.kube import KubeApiError, KubeClient
from agent.render.cache import RenderCache, sources_digest
from agent.render.facts import ClusterFacts
from agent.render.manifests import Manifest
from agent.render.plain import Ownership, RenderRequest
from agent.render.scope import ScopeLookup, with_bundle_crds
from agent.render.tools import ToolSettings
from agent.report.bundles import BundleDeployments
from agent.secrets.keys import ClusterKeys, KeyFileError, Keyring
from agent.source.branch import (
    BranchContentError,
    BranchNotFoundError,
    BranchWatcher,
    FetchTooLargeError,
)
from agent.source.compose import ContentStore, source_credentials
from agent.source.content import (
    LOCAL_STORAGE_ERRNOS,
    ContentRefusedError,
    Credentials,
    LocalStorageError,
)
from agent.state import AgentState, ClusterState
from agent.verify import DEFAULT_CLOCK_SKEW, DeferredTrust, TrustPolicy, verify_publication

log = logging.getLogger(__name__)

CREATED_NAMESPACE_ANNOTATION = "fleetlet.io/created-by-bundle"
# Built-in formats whose output does not depend on whether the bundle is installed already.
_UPGRADE_BLIND = frozenset({"plain", "kustomize", "registry+v1"})


def renders_as_upgrade(format_name: str, *, installed: bool) -> bool:
    """Whether a bundle of ``format_name`` renders as an upgrade (``.Release.IsUpgrade``): when
    the cluster already runs it, and only for the formats that may render differently then
    (helm, plugins): for the others it stays out of the render cache's key."""
    return installed and format_name not in _UPGRADE_BLIND


class PublicationUnreadableError(VerificationError):
    """Reading or checking the publication failed in a way none of our checks names (a
    library met input it cannot handle): refused, as any publication we cannot verify."""

    reason = "PublicationUnreadable"


@dataclass(frozen=True, kw_only=True)
class RenderedBundle:
    """One BundleDeployment of the accepted set, rendered."""

    name: str
    group: str
    objects: list[Manifest]


@dataclass(frozen=True, kw_only=True)
class RenderFailure:
    """A bundle of the accepted set whose render failed with a permanent error about its own
    content or format (not its source): only its group fails."""

    name: str
    group: str
    error: PermanentError


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
    """The bundles rendered (a failed bundle's group and its dependents are not among them)."""
    failed: tuple[RenderFailure, ...] = ()
    """Bundles of the accepted set that could not be rendered (see the module docstring)."""


class InboundPipeline:
    """Poll, fetch, verify, fetch content and render this cluster's set."""

    def __init__(
        self,
        *,
        cluster: str,
        watcher: BranchWatcher,
        trust: TrustPolicy | DeferredTrust,
        content: ContentStore,
        kube: KubeClient,
        state: ClusterState,
        agent_namespace: str,
        workdir: Path,
        bundles: BundleDeployments | None = None,
        clock: Callable[[], datetime] = lambda: datetime.now(UTC),
        tools: ToolSettings | None = None,
        installed: Callable[[str], bool] | None = None,
        renders: RenderCache | None = None,
        failpoint: Callable[[str], None] | None = None,
        clock_skew: timedelta = DEFAULT_CLOCK_SKEW,
    ) -> None:
        """``bundles``: where a refused publication is reported on the BundleDeployments
        (None: not reported, for clusters without the CRDs); ``tools``: where helm and
        kustomize are (default: PATH, then the cache); ``installed(bundle)``: whether the
        bundle has a healthy revision already (helm's ``.Release.IsUpgrade``); ``renders``: the
        render cache (default: in memory and under ``workdir/renders``); ``trust``: a
        :class:`~agent.verify.DeferredTrust` loads sigstore only when it verifies a signature;
        ``failpoint``: called with the name of each step done (``polled``, ``fetched``,
        ``verified``, ``rendered``), for fault-injection tests (``FLEETLET_FAILPOINT``); None
        in production; ``clock_skew``: how far this cluster's clock may be off when a
        publication's validity is judged."""
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
        self._tools = tools or ToolSettings()
        self._installed = installed or (lambda _bundle: False)
        self.renders = renders or RenderCache(directory=self._workdir / "renders")
        self.failpoint = failpoint
        self.clock_skew = clock_skew
        self._policy_digest: str | None = None
        self.facts: ClusterFacts | None = None
        """The cluster facts the last render used (None: no render since the start)."""
        self._keys = ClusterKeys(kube, agent_namespace, clock=clock)
        self.keyring: Keyring | None = None
        """The cluster's age keys as last read (None: not read since the start)."""
        # Render failures of the last set rendered whole, by bundle: the reconcile's render of
        # such a bundle raises it once instead of rendering again (see the module docstring).
        self._failed: dict[str, RenderFailure] = {}
        self._failed_serial: int | None = None

    @property
    def source_policy(self) -> str | None:
        """The digest of the cluster's own source policy (``--verify-sources``), or None."""
        verifier = getattr(self._content, "verifier", None)
        return verifier.policy.digest() if verifier is not None else None

    @property
    def _policy(self) -> str:
        """Who may sign and which CAs are trusted: a refusal is remembered under this policy."""
        if self._policy_digest is None:
            digest = self._trust.digest()
            # The cluster's source policy judges the set too: a changed one tries it again.
            source = self.source_policy
            self._policy_digest = f"{digest} sources {source}" if source else digest
        return self._policy_digest

    def sync(self) -> SyncResult:
        """One inbound reconcile.

        Raises GitUnavailableError / FetchError / ApiUnavailableError (temporary: retry with
        backoff) and the refusals: VerificationError or ValidationError subclasses (after
        recording them in the cluster), BranchNotFoundError, and ContentRefusedError from the
        source layer or for content a library cannot read (permanent). A bundle that does not
        render is not raised: it is in :attr:`SyncResult.failed` (see the module docstring).
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
        self._step("polled")
        try:
            files = self._watcher.fetch(commit)
            self._step("fetched")
            verified = verify_publication(
                files=files,
                cluster=self.cluster,
                last_serial=state.last_serial,
                trust=self._trust,
                now=self._clock(),
                clock_skew=self.clock_skew,
            )
        except (VerificationError, ValidationError, BranchContentError, FetchTooLargeError) as exc:
            self._refuse(state, commit, exc)
            raise
        except FleetletError:
            raise  # the git server away: the same commit is tried again
        except Exception as exc:
            log.warning(
                "publication at %s: unexpected error while verifying", commit, exc_info=True
            )
            refused = PublicationUnreadableError(
                f"the publication cannot be read: {type(exc).__name__}: {exc}"
            )
            self._refuse(state, commit, refused)
            raise refused from exc
        self._step("verified")
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
            bundles, failed = self.render_each(deployment_set)
        except PermanentError as exc:
            # Hostile or corrupt source content: the same commit fetches the same way, so it is
            # not fetched again until the branch moves.
            self._refuse(state, commit, exc)
            raise
        except FleetletError:
            raise  # a registry or git server away: tried again
        except OSError as exc:
            if exc.errno not in LOCAL_STORAGE_ERRNOS:
                raise self._unreadable(state, commit, deployment_set, exc) from exc
            # The agent's own disk (full, read-only): the content is not at fault.
            raise LocalStorageError.of(
                exc, doing="render the set", source=f"serial {deployment_set.serial}"
            ) from exc
        except Exception as exc:
            raise self._unreadable(state, commit, deployment_set, exc) from exc
        self._step("rendered")
        for failure in failed:
            log.warning(
                "serial %s: bundle %s (group %s) cannot be rendered; only its group fails: %s",
                deployment_set.serial,
                failure.name,
                failure.group,
                failure.error,
            )
        self._failed = {f.name: f for f in failed}
        self._failed_serial = deployment_set.serial
        # The serial is accepted once everything it names could be fetched and rendered (or
        # failed to render on its own): a temporary fetch failure leaves the commit to be tried
        # again at the next poll. The set first: a crash between the two writes re-verifies
        # the same commit, harmlessly.
        self._state.save_set(deployment_set)
        self._state.save(accepted)
        return SyncResult(
            outcome="rendered",
            commit=commit,
            serial=deployment_set.serial,
            deployment_set=deployment_set,
            bundles=bundles,
            failed=tuple(failed),
        )

    def _unreadable(
        self,
        state: AgentState,
        commit: str,
        deployment_set: BundleDeploymentSet,
        exc: Exception,
    ) -> ContentRefusedError:
        """Content that made a library raise what none of our checks names: refused (and
        remembered), as any content we cannot read."""
        log.warning("content of serial %s: unexpected error", deployment_set.serial, exc_info=True)
        unreadable = ContentRefusedError(
            f"the content cannot be read: {type(exc).__name__}: {exc}",
            source="content",
            rule="Unreadable",
        )
        self._refuse(state, commit, unreadable)
        return unreadable

    def _step(self, name: str) -> None:
        if self.failpoint is not None:
            self.failpoint(name)

    def _refuse(self, state: AgentState, commit: str, exc: Exception) -> None:
        """Remember (in the cluster) that ``commit`` was refused and why, and say so on every
        BundleDeployment: they keep running what they have."""
        reason = exc.reason if isinstance(exc, FleetletError) else "ValidationFailed"
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
        render them, in the set's group order. A bundle whose render failed when the set was
        accepted raises that failure (once) instead of being rendered again.

        Raises FetchError (temporary), ContentRefusedError, InvalidManifestError,
        UnknownFormatError and the render's other errors (permanent).
        """
        chosen = list(deployment_set.bundle_deployments if entries is None else entries)
        if self._failed_serial == deployment_set.serial:
            for entry in chosen:
                known = self._failed.pop(entry.name, None)
                if known is not None:
                    raise known.error
        rendered, failed = self.render_each(deployment_set, chosen)
        if failed:
            raise failed[0].error
        return rendered

    def render_each(
        self,
        deployment_set: BundleDeploymentSet,
        entries: Sequence[BundleDeploymentEntry] | None = None,
    ) -> tuple[list[RenderedBundle], list[RenderFailure]]:
        """Fetch the sources of ``entries`` (default: every bundle of the set) by digest and
        render them, in the set's group order: the bundles rendered, and those whose render
        failed with a permanent error (after which the rest of their group, and the groups
        that depend on it, are not rendered, since they cannot move in this set; their sources
        are still fetched and judged).

        Raises FetchError (temporary), the source layer's permanent errors
        (ContentRefusedError: the whole set is refused) and what a library raises that none of
        our checks names.
        """
        root = self._workdir / "trees" / str(deployment_set.serial)
        shutil.rmtree(root, ignore_errors=True)
        order = {group: i for i, group in enumerate(deployment_set.groups)}
        chosen = deployment_set.bundle_deployments if entries is None else entries
        entries = sorted(chosen, key=lambda e: order[e.group])
        rendered: list[RenderedBundle] = []
        failed: list[RenderFailure] = []
        left_out: set[str] = set()  # groups that failed, and groups that depend on them
        # CRDs of earlier groups are not served yet when the set is rendered; their kinds'
        # scope comes from the CRD objects themselves (a Promotion gets the target namespace
        # even though the platform group that defines it has not been applied yet).
        crds: list[Manifest] = []
        # What helm's .Capabilities say, read from this cluster once per render.
        facts = ClusterFacts.of(
            kube_version=self._kube.server_version(), api_versions=self._kube.api_versions()
        )
        self.facts = facts
        keyring = self.read_keyring()
        try:
            for entry in entries:
                source = _SourceStep(
                    functools.partial(
                        self._content.compose,
                        entry.spec.sources,
                        root / entry.name,
                        credentials=self._credentials,
                    )
                )
                if entry.group in left_out or left_out & set(entry.spec.depends_on):
                    # It cannot move in this set, and its render could depend on what failed
                    # (CRDs): not rendered. Its sources are still fetched and judged: hostile
                    # source content refuses the set wherever it is.
                    left_out.add(entry.group)
                    source()
                    continue
                try:
                    objects = self._render_one(deployment_set, entry, crds, facts, source, keyring)
                except PermanentError as exc:
                    if source.raised(exc):
                        raise  # hostile or corrupt source content: the whole set is refused
                    failed.append(RenderFailure(name=entry.name, group=entry.group, error=exc))
                    left_out.add(entry.group)
                    continue
                crds.extend(o for o in objects if o.get("kind") == "CustomResourceDefinition")
                rendered.append(RenderedBundle(name=entry.name, group=entry.group, objects=objects))
        finally:
            shutil.rmtree(root, ignore_errors=True)
        # A group's bundles move together: none of a failed group is handed on.
        return [b for b in rendered if b.group not in left_out], failed

    def _render_one(
        self,
        deployment_set: BundleDeploymentSet,
        entry: BundleDeploymentEntry,
        crds: list[Manifest],
        facts: ClusterFacts,
        tree: Callable[[], Path],
        keyring: Keyring,
    ) -> list[Manifest]:
        return render_entry(
            self.renders,
            entry,
            serial=deployment_set.serial,
            scope=with_bundle_crds(crds, self._kube.scope),
            facts=facts,
            tools=self._tools,
            installed=self._installed(entry.name),
            tree=tree,
            keyring=keyring,
        )

    def read_keyring(self) -> Keyring:
        """The cluster's age keys (made on first use; see :mod:`agent.secrets.keys`). A key
        Secret that cannot be used is no keyring: a SOPS file then fails its bundle, naming
        why, and every other bundle renders.

        Raises ApiUnavailableError (temporary).
        """
        try:
            self.keyring = self._keys.keyring()
        except (KeyFileError, KubeApiError) as exc:
            log.warning("%s: age keys not usable: %s", self.cluster, exc)
            return Keyring(identities=(), recipients=(), problem=str(exc))
        return self.keyring

    def _credentials(self, secret_name: str, host: str) -> Credentials:
        return read_source_credentials(self._kube, self._agent_namespace, secret_name, host)


def read_source_credentials(
    kube: KubeClient, namespace: str, secret_name: str, host: str
) -> Credentials:
    """The credentials a bundle source names (Secret ``secret_name`` of the agent's
    ``namespace``) for ``host``: only from a Secret meant for sources, only for its hosts (see
    :func:`agent.source.compose.source_credentials`). Raises TemporaryError (no such Secret,
    not one for sources) and InvalidSourceError."""
    where = f"{namespace}/{secret_name}"
    secret = kube.get(
        {
            "apiVersion": "v1",
            "kind": "Secret",
            "metadata": {"name": secret_name, "namespace": namespace},
        }
    )
    if secret is None:
        # An admin can create it without the branch moving: try again later.
        raise TemporaryError(f"source credentials: no Secret {where}", delay=30.0)
    return source_credentials(secret, host=host, where=where)


class _SourceStep:
    """Composes a bundle's tree (the source layer) and remembers what it raised, so that a
    failure of the source is told from a failure of the render that read the tree."""

    def __init__(self, compose: Callable[[], Path]) -> None:
        self._compose = compose
        self._raised: BaseException | None = None

    def __call__(self) -> Path:
        try:
            return self._compose()
        except BaseException as exc:
            self._raised = exc
            raise

    def raised(self, exc: BaseException) -> bool:
        """Whether ``exc`` (or what it was raised from) came out of the source layer."""
        seen: BaseException | None = exc
        while seen is not None:
            if seen is self._raised:
                return True
            seen = seen.__cause__ or seen.__context__
        return False


def render_entry(
    renders: RenderCache,
    entry: BundleDeploymentEntry,
    *,
    serial: int,
    scope: ScopeLookup,
    facts: ClusterFacts,
    tools: ToolSettings,
    installed: bool,
    tree: Callable[[], Path],
    keyring: Keyring | None = None,
) -> list[Manifest]:
    """One bundle of set ``serial`` rendered as the agent applies it (through ``renders``, the
    render cache: the pins name the content, so a bundle rendered before for the same options
    and cluster facts is neither fetched nor rendered again), its created namespace added.
    ``tree`` composes the bundle's sources when a render is needed; ``installed``: whether
    the bundle runs on the cluster (helm renders it as an upgrade); ``keyring``: the cluster's
    age keys, which open the bundle's SOPS files (None: left encrypted). The hub's previews
    render with this too, without a keyring.

    Raises what ``tree`` and the format raise (FetchError: temporary; refusals: permanent).
    """
    spec = entry.spec
    options = spec.format_options
    objects = renders.render(
        format=spec.format,
        content=sources_digest(to_dict(s) for s in spec.sources),
        request=RenderRequest(
            source=entry.name,
            namespace=options.target_namespace if options else None,
            scope=scope,
            ownership=Ownership(bundle=entry.name, group=entry.group, revision=str(serial)),
            options=_options_dict(options),
            cluster=facts,
            tools=tools,
            upgrade=renders_as_upgrade(spec.format, installed=installed),
            patches=tuple(to_dict(p) for p in spec.patches),
            keyring=keyring,
        ),
        tree=tree,
    )
    return with_created_namespace(objects, spec, bundle=entry.name)


def with_created_namespace(
    objects: list[Manifest], spec: BundleDeploymentSpec, *, bundle: str
) -> list[Manifest]:
    """``objects`` with the target namespace in front when the bundle asks to create it
    (``createNamespace``) and does not render it itself. It carries the namespace labels and
    annotations, and no bundle ownership label: pruning and removal leave it in place (as
    Fleet and Argo CD do), whatever else lives in it."""
    namespace = spec.format_options.target_namespace if spec.format_options else None
    if not spec.create_namespace or namespace is None:
        return objects
    for obj in objects:
        meta = obj.get("metadata") or {}
        if obj.get("kind") == "Namespace" and meta.get("name") == namespace:
            return objects
    created: Manifest = {
        "apiVersion": "v1",
        "kind": "Namespace",
        "metadata": {
            "name": namespace,
            "labels": {str(k): str(v) for k, v in (spec.namespace_labels or {}).items()},
            "annotations": {
                **{str(k): str(v) for k, v in (spec.namespace_annotations or {}).items()},
                CREATED_NAMESPACE_ANNOTATION: bundle,
            },
        },
    }
    return [created, *objects]


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
    "InboundPipeline",
    "PublicationUnreadableError",
    "RenderFailure",
    "RenderedBundle",
    "SyncResult",
    "render_entry",
    "renders_as_upgrade",
]
