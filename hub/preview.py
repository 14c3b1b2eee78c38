"""``hub diff --cluster C``: what a publication would change in a cluster, object by object, in
the shape of an approval request's preview (``agent.approve.preview``), rendered, not live.

For each lockstep group with a bundle added, removed or changed, the bundles' content is fetched
by digest and rendered the way the agent renders it (same formats, same render cache), once as
the cluster's branch has it and once as the fleet would publish it; the two renderings are
compared. Without a cluster there is no dry run: what the cluster's own controllers and defaults
would do is not shown, nor objects someone else changed (the agent's own request, made from a
server-side dry run, shows those). Content behind credentials the agent reads from its own
Secrets (``auth.secretRef``) is not fetched here: such bundles are named in ``notes``.

What a render depends on in the cluster comes from the facts its agent reported
(``cluster.json`` beside its status, :mod:`hub.facts`): its Kubernetes version and served APIs
(helm's ``.Capabilities``), and which bundles it runs (those render as an upgrade,
``.Release.IsUpgrade``), as the agent renders them. A cluster whose agent reported none is
rendered with the tools' defaults and every bundle as an install, and ``notes`` says so.

SOPS-encrypted objects stay encrypted here (the hub holds no cluster's key): the preview shows
their values as ``<encrypted>``/``<encrypted: changed>`` and ``notes`` counts the values the
cluster's agent will decrypt.
"""

from __future__ import annotations

import functools
import shutil
import tempfile
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from agent.api import BundleDeploymentEntry, load_set, to_dict
from agent.api.approvals import RequestPreview
from agent.api.facts import ReportedFacts
from agent.approve.preview import build_preview, rendered_changes
from agent.errors import FleetletError, ValidationError
from agent.inbound import render_entry
from agent.render.cache import RenderCache
from agent.render.facts import ClusterFacts
from agent.render.scope import builtin_scope, with_bundle_crds
from agent.render.tools import ToolSettings
from agent.secrets.sops import count_encrypted, is_sops_document
from agent.source.cache import ContentCache
from agent.source.compose import ContentStore
from agent.source.oci import OciFetcher, OciSettings
from agent.upgrade import AGENT_ENTRY
from agent.verify.publication import SET_FILE
from hub.errors import PublishError
from hub.publish.flow import ClusterDiff, Prepared
from hub.publish.git import BranchStore
from hub.publish.shards import ShardedStore

Manifest = dict[str, Any]
LOOPBACK = ("127.0.0.1", "localhost", "[::1]")


@dataclass(frozen=True, kw_only=True)
class GroupPreview:
    """One group's preview, and its whole diffs (those the preview cut)."""

    group: str
    preview: RequestPreview
    full_diffs: Mapping[str, str] = field(default_factory=dict)


@dataclass(frozen=True, kw_only=True)
class ClusterPreview:
    """A cluster's previews, by group, and what could not be rendered here (and why)."""

    cluster: str
    groups: tuple[GroupPreview, ...] = ()
    notes: tuple[str, ...] = ()

    def to_dict(self) -> dict[str, Any]:
        return {
            "groups": {g.group: to_dict(g.preview) for g in self.groups},
            **({"notes": list(self.notes)} if self.notes else {}),
        }


class BundleRenderer:
    """Renders set entries the way the agent does, from a cache under ``cache_dir``."""

    def __init__(self, *, cache_dir: Path, tools: ToolSettings, plain_http: bool) -> None:
        self.workdir = cache_dir / "work"
        self.content = ContentStore(
            cache=ContentCache(root=cache_dir / "content", max_bytes=1 << 30),
            oci=OciFetcher(settings=OciSettings(plain_http=plain_http)),
        )
        self.renders = RenderCache(directory=cache_dir / "renders")
        self.tools = tools

    def render(
        self,
        entries: Sequence[BundleDeploymentEntry],
        *,
        serial: int,
        facts: ReportedFacts | None = None,
    ) -> dict[str, list[Manifest]]:
        """Each entry's finished objects (CRDs of earlier entries give their kinds' scope),
        with the cluster's reported ``facts`` (None: the tools' defaults, all as installs).

        Raises the inbound pipeline's errors (FetchError: temporary; refusals: permanent).
        """
        cluster = facts.facts if facts is not None else ClusterFacts()
        installed = facts.installed if facts is not None else frozenset()
        out: dict[str, list[Manifest]] = {}
        crds: list[Manifest] = []
        root = Path(tempfile.mkdtemp(prefix="preview-", dir=self._workdir()))
        try:
            for entry in entries:
                if entry.name == AGENT_ENTRY:
                    out[entry.name] = []  # the agent's own image: never rendered (agent.upgrade)
                    continue
                objects = render_entry(
                    self.renders,
                    entry,
                    serial=serial,
                    scope=with_bundle_crds(crds, builtin_scope),
                    facts=cluster,
                    tools=self.tools,
                    installed=entry.name in installed,
                    tree=functools.partial(
                        self.content.compose,
                        entry.spec.sources,
                        root / entry.name,
                        credentials=None,
                    ),
                )
                crds.extend(o for o in objects if o.get("kind") == "CustomResourceDefinition")
                out[entry.name] = objects
        finally:
            shutil.rmtree(root, ignore_errors=True)
        return out

    def _workdir(self) -> Path:
        self.workdir.mkdir(parents=True, exist_ok=True)
        return self.workdir


def _needs_secret(entry: BundleDeploymentEntry) -> str | None:
    for source in entry.spec.sources:
        if source.auth is not None:
            return source.auth.secret_ref.name
    return None


def plain_http_for(entries: Iterable[BundleDeploymentEntry]) -> bool:
    """Whether the image sources are all on loopback (spoken to over plain HTTP, as the hub's
    resolver does)."""
    hosts = {
        s.uri.split("://", 1)[-1].split("/", 1)[0]
        for e in entries
        for s in e.spec.sources
        if s.kind == "image"
    }
    return bool(hosts) and all(h.rsplit(":", 1)[0] in LOOPBACK for h in hosts)


def preview_clusters(
    prepared: Prepared,
    store: BranchStore | ShardedStore,
    diffs: Sequence[ClusterDiff],
    *,
    clusters: Iterable[str],
    cache_dir: Path,
    tools: ToolSettings,
    facts: Mapping[str, ReportedFacts] | None = None,
    progress: Callable[[str], None] = lambda _message: None,
) -> dict[str, ClusterPreview]:
    """The previews of ``clusters`` (those of ``diffs`` that would change), by cluster,
    rendered with the cluster ``facts`` their agents reported (see the module's docstring).

    A group whose content cannot be fetched or rendered is named in the cluster's ``notes``
    with why, and so is a cluster without facts. Raises PublishError (a branch holding an
    unreadable set).
    """
    facts = facts or {}
    wanted = set(clusters)
    out: dict[str, ClusterPreview] = {}
    for d in diffs:
        if d.cluster not in wanted or not d.bundles:
            continue
        old_entries: dict[str, BundleDeploymentEntry] = {}
        old_serial = d.serial_before or 1
        branches = (
            store.stores[prepared.shard_map.shard_of(d.cluster)]
            if isinstance(store, ShardedStore)
            else store
        )
        data = branches.read_file(d.cluster, SET_FILE)
        if data is not None:
            try:
                old = load_set(data, origin=f"fleetlet/clusters/{d.cluster}:{SET_FILE}")
            except ValidationError as exc:
                raise PublishError(
                    f"branch fleetlet/clusters/{d.cluster} holds an unreadable {SET_FILE}: {exc}"
                ) from exc
            old_entries = {e.name: e for e in old.bundle_deployments}
        plan = prepared.plans.get(d.cluster)
        new_entries = {e.name: e for e in plan.entries} if plan else {}
        touched = {b.name for b in d.bundles}
        group_of = {n: e.group for n, e in {**old_entries, **new_entries}.items()}
        groups = sorted({group_of[n] for n in touched})
        notes = [
            f"bundle {n}: not rendered here (its source needs the agent's Secret {secret})"
            for n in sorted(touched)
            if (e := new_entries.get(n) or old_entries.get(n)) and (secret := _needs_secret(e))
        ]
        skipped = {note.split(":", 1)[0].removeprefix("bundle ") for note in notes}
        reported = facts.get(d.cluster)
        if reported is None:
            notes.append(
                f"cluster {d.cluster}: its agent reported no cluster facts (cluster.json on "
                f"its status branch: an older agent, or none yet): rendered with default "
                "capabilities (helm's .Capabilities: Kubernetes version, API versions) and "
                "every bundle as an install"
            )
        before_entries = [old_entries[n] for n in sorted(touched) if n in old_entries]
        after_entries = [new_entries[n] for n in sorted(touched) if n in new_entries]
        before_entries = [e for e in before_entries if e.name not in skipped]
        after_entries = [e for e in after_entries if e.name not in skipped]
        progress(
            f"{d.cluster}: rendering {len(before_entries)} published and {len(after_entries)} "
            "new bundles for the preview"
        )
        renderer = BundleRenderer(
            cache_dir=cache_dir,
            tools=tools,
            plain_http=plain_http_for([*before_entries, *after_entries]),
        )
        previews = []
        for group in groups:
            names = {n for n in touched if group_of[n] == group}
            try:
                before = renderer.render(
                    [e for e in before_entries if e.name in names],
                    serial=old_serial,
                    facts=reported,
                )
                after = renderer.render(
                    [e for e in after_entries if e.name in names],
                    serial=old_serial + 1,
                    facts=reported,
                )
            except FleetletError as exc:
                # The agent would refuse it too: said here, the rest of the diff still shown.
                notes.append(f"group {group}: not previewed: {exc}")
                continue
            sealed = [
                count_encrypted(o)
                for objects in after.values()
                for o in objects
                if is_sops_document(o)
            ]
            if sealed:
                notes.append(
                    f"group {group}: {sum(sealed)} encrypted values in {len(sealed)} SOPS "
                    "objects, shown encrypted: only the cluster's agent opens them, with its "
                    "own age key (docs/secrets.md)"
                )
            built = build_preview(rendered_changes(before, after), source="rendered")
            previews.append(
                GroupPreview(group=group, preview=built.preview, full_diffs=built.full_diffs)
            )
        out[d.cluster] = ClusterPreview(
            cluster=d.cluster, groups=tuple(previews), notes=tuple(notes)
        )
    return out


__all__ = ["BundleRenderer", "ClusterPreview", "GroupPreview", "plain_http_for", "preview_clusters"]
