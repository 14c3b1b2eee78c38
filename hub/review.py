"""``hub diff --base REV --head REV``: what a change to the fleet repo does, as a pull-request
check (docs/operations.md, "A pull request's diff as a check").

    checkout -> prepare (both) -> compare -> render (one cluster per change) -> summarize

Both revisions of FLEET_DIR are written out of its git repository (never from the work tree)
and loaded, resolved and planned as ``hub publish`` would (:func:`hub.publish.flow.prepare`).
The plans are compared shape by shape (clusters of one shape share their entries, see
:class:`hub.fleet.render.Plans`), then bundle by bundle: the clusters whose bundle changes the
same way (the same fields from the same values to the same values; the same spec when added or
removed) make one :class:`Change`, so a change to one bundle over 10,000 clusters is one entry.

For each change (at most :data:`MAX_RENDERED` of them), its first cluster is rendered at both
revisions the way the agent renders (:class:`hub.preview.BundleRenderer`, the tools' default
capabilities; the bundles before it in its group and in the groups it depends on first, for
their CRDs' scope), and the two renderings go through the approval preview's code
(:func:`agent.approve.preview.build_preview`): objects created, changed and deleted, and the
security summary (RBAC widened, CRDs, webhooks, privileged pods, namespaces). The rollout
waves come from the head's strategy for the bundle's group over the clusters where that group
changes (:func:`hub.rollout.plan.plan_waves`), and ``approval: manual`` at the head says which
clusters will wait for an approver.
"""

from __future__ import annotations

import contextlib
import json
import os
import tempfile
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import pygit2

from agent.api import BundleDeploymentEntry, to_dict
from agent.api.approvals import RequestPreview
from agent.approve.preview import build_preview, rendered_changes
from agent.errors import FleetletError, PermanentError
from agent.render.tools import ToolSettings
from hub.fleet.render import ClusterPlan
from hub.publish.compare import ContentCache
from hub.publish.flow import Prepared, entry_fields, prepare
from hub.rollout.plan import plan_waves

Progress = Callable[[str], None]
ChangeKind = Literal["added", "removed", "changed"]
MAX_RENDERED = 20
"""Changes rendered object by object in one run (the rest are listed by their fields)."""
MAX_CLUSTERS_SHOWN = 8
MAX_CHANGES_SHOWN = 10
MAX_MARKDOWN = 60_000
"""Characters of the markdown summary (GitHub refuses comments over 65,536)."""
LINK_MODE = 0o120000
TREE_MODE = 0o040000
COMMIT_MODE = 0o160000


class RevisionError(PermanentError):
    """A revision of the fleet repo that cannot be read (not a git repo, unknown rev, no
    fleet directory at that revision)."""


# --- checkout --------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Revision:
    """A revision of the fleet repo as asked (``rev``) and as found (``commit``, ``subject``)."""

    rev: str
    commit: str
    subject: str

    def to_dict(self) -> dict[str, str]:
        return {"rev": self.rev, "commit": self.commit, "subject": self.subject}


def _repository(fleet_dir: Path) -> tuple[pygit2.Repository, str]:
    """The repository holding ``fleet_dir`` and the fleet's path inside it ('' at its root)."""
    found = pygit2.discover_repository(str(fleet_dir.resolve()))
    if found is None:
        raise RevisionError(
            f"{fleet_dir}: not inside a git repository (--base/--head are revisions of it)"
        )
    repo = pygit2.Repository(found)
    if repo.is_bare or repo.workdir is None:
        raise RevisionError(f"{fleet_dir}: in a bare repository; give the directory of a checkout")
    prefix = fleet_dir.resolve().relative_to(Path(repo.workdir).resolve()).as_posix()
    return repo, "" if prefix == "." else prefix


def _commit(repo: pygit2.Repository, rev: str, option: str) -> pygit2.Commit:
    try:
        return repo.revparse_single(rev).peel(pygit2.Commit)
    except (KeyError, ValueError, pygit2.GitError, pygit2.InvalidSpecError) as exc:
        raise RevisionError(
            f"{option} {rev}: not a commit of {repo.workdir} (fetch it first: a CI checkout "
            "needs the base branch's history, e.g. actions/checkout with fetch-depth: 0)"
        ) from exc


def checkout(repo: pygit2.Repository, commit: pygit2.Commit, prefix: str, into: Path) -> None:
    """Write the fleet directory (``prefix``) of ``commit`` into ``into``, from git objects
    only: regular files with their executable bit, links as links, submodules left out.

    A pull request's files are the author's: a link leading out of the fleet directory (to
    the CI job's files or ``/proc``, whose bytes an error message could then quote in the
    comment) is refused with RevisionError."""
    tree: pygit2.Tree = commit.tree
    if prefix:
        try:
            obj = tree[prefix]
        except KeyError:
            raise RevisionError(f"{prefix}: not in commit {commit.id} (no fleet there)") from None
        if obj.filemode != TREE_MODE:
            raise RevisionError(f"{prefix}: not a directory in commit {commit.id}")
        tree = repo[obj.id].peel(pygit2.Tree)
    _write_tree(repo, tree, into, "", str(commit.id))


def _write_tree(
    repo: pygit2.Repository, tree: pygit2.Tree, into: Path, rel: str, commit: str
) -> None:
    into.mkdir(parents=True, exist_ok=True)
    for entry in tree:
        name = entry.name or ""
        if name in ("", ".", "..") or "/" in name:
            continue
        target = into / name
        path = f"{rel}{name}"
        if entry.filemode == TREE_MODE:
            _write_tree(repo, repo[entry.id].peel(pygit2.Tree), target, f"{path}/", commit)
        elif entry.filemode == LINK_MODE:
            link = repo[entry.id].peel(pygit2.Blob).data.decode("utf-8", "replace")
            resolved = os.path.normpath(os.path.join(os.path.dirname(path), link))
            if link.startswith("/") or resolved == ".." or resolved.startswith("../"):
                raise RevisionError(
                    f"{path} in commit {commit[:12]}: a link to {link!r}, outside the fleet "
                    "directory (refused: a pull request's links stay inside it)"
                )
            os.symlink(link, target)
        elif entry.filemode != COMMIT_MODE:
            target.write_bytes(repo[entry.id].peel(pygit2.Blob).data)
            if entry.filemode == 0o100755:
                target.chmod(0o755)


# --- compare ---------------------------------------------------------------------------------


@dataclass(slots=True)
class Change:
    """One bundle changing the same way on ``clusters`` (sorted once complete)."""

    bundle: str
    group: str
    kind: ChangeKind
    fields: tuple[tuple[str, Any, Any], ...]
    clusters: list[str] = field(default_factory=list)
    manual: bool = False
    """``approval: manual`` at the head: each cluster waits for an approver."""
    preview: RequestPreview | None = None
    full_diffs: Mapping[str, str] = field(default_factory=dict)
    rendered_for: str | None = None
    notes: list[str] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        return {
            "change": self.kind,
            "clusters": len(self.clusters),
            "names": self.clusters,
            "fields": [{"path": p, "before": b, "after": a} for p, b, a in self.fields],
            "needsApproval": self.manual,
            **({"renderedFor": self.rendered_for} if self.rendered_for else {}),
            **({"preview": to_dict(self.preview)} if self.preview is not None else {}),
            **({"notes": self.notes} if self.notes else {}),
        }


@dataclass(frozen=True, slots=True)
class WaveSummary:
    name: str
    pause_before: bool
    clusters: int


@dataclass(slots=True)
class BundleSummary:
    """Every change of one bundle, and its group's rollout over the clusters that change."""

    bundle: str
    group: str
    changes: list[Change]
    waves: tuple[WaveSummary, ...] | None = None
    """None: the group is published to every cluster at once (no rollout strategy)."""

    @property
    def clusters(self) -> int:
        return sum(len(c.clusters) for c in self.changes)

    @property
    def approvals(self) -> int:
        return sum(len(c.clusters) for c in self.changes if c.manual)

    def objects(self) -> tuple[int, int, int]:
        """Objects created, changed, deleted, summed over the rendered changes."""
        previews = [c.preview for c in self.changes if c.preview is not None]
        return (
            sum(p.created for p in previews),
            sum(p.changed for p in previews),
            sum(p.deleted for p in previews),
        )

    def to_dict(self) -> dict[str, Any]:
        return {
            "bundle": self.bundle,
            "group": self.group,
            "clusters": self.clusters,
            "needApproval": self.approvals,
            "rollout": None
            if self.waves is None
            else {
                "waves": [
                    {"name": w.name, "pauseBefore": w.pause_before, "clusters": w.clusters}
                    for w in self.waves
                ]
            },
            "changes": [c.to_dict() for c in self.changes],
        }


@dataclass(frozen=True, slots=True)
class Review:
    """What going from ``base`` to ``head`` does to the fleet."""

    base: Revision
    head: Revision
    clusters: int
    changed: int
    bundles: tuple[BundleSummary, ...]
    notes: tuple[str, ...] = ()

    def to_dict(self) -> dict[str, Any]:
        return {
            "base": self.base.to_dict(),
            "head": self.head.to_dict(),
            "clusters": {"total": self.clusters, "changed": self.changed},
            "bundles": [b.to_dict() for b in self.bundles],
            **({"notes": list(self.notes)} if self.notes else {}),
        }


def _shape_of(plans: Mapping[str, ClusterPlan]) -> dict[str, tuple[int, int]]:
    shapes = getattr(plans, "shapes", None)
    if shapes is not None:
        return {name: key for key, names in shapes.items() for name in names}
    return {name: (id(p.entries), id(p.groups)) for name, p in plans.items()}


def compare(base: Prepared, head: Prepared) -> tuple[list[Change], int]:
    """The changes from ``base`` to ``head`` (by bundle, then first cluster), and how many
    clusters change at all."""
    base_shape, head_shape = _shape_of(base.plans), _shape_of(head.plans)
    by_pair: dict[tuple[Any, Any], list[str]] = {}
    for name in base_shape.keys() | head_shape.keys():
        by_pair.setdefault((base_shape.get(name), head_shape.get(name)), []).append(name)
    old_cache, new_cache = ContentCache(), ContentCache()
    changes: dict[tuple[str, str, str], Change] = {}
    changed = 0
    for names in by_pair.values():
        old = base.plans.get(names[0])
        new = head.plans.get(names[0])
        if old is not None and new is not None and old_cache.digest(old) == new_cache.digest(new):
            continue
        changed += len(names)
        for bundle, kind, fields, group, manual in _bundle_changes(old, new, old_cache, new_cache):
            key = (bundle, kind, json.dumps(fields, sort_keys=True, default=str))
            found = changes.get(key)
            if found is None:
                found = changes[key] = Change(
                    bundle=bundle, group=group, kind=kind, fields=fields, manual=manual
                )
            found.clusters.extend(names)
    for c in changes.values():
        c.clusters.sort()
    return sorted(changes.values(), key=lambda c: (c.bundle, c.clusters[0])), changed


def _bundle_changes(
    old: ClusterPlan | None,
    new: ClusterPlan | None,
    old_cache: ContentCache,
    new_cache: ContentCache,
) -> Iterator[tuple[str, ChangeKind, tuple[tuple[str, Any, Any], ...], str, bool]]:
    before = {e.name: e for e in old.entries} if old is not None else {}
    after = {e.name: e for e in new.entries} if new is not None else {}
    for name in sorted(before.keys() | after.keys()):
        was, now = before.get(name), after.get(name)
        if was is None and now is not None:
            yield name, "added", _spec_fields(now), now.group, now.spec.approval == "manual"
        elif now is None and was is not None:
            yield name, "removed", _spec_fields(was), was.group, False
        elif was is not None and now is not None and _text(old_cache, was) != _text(new_cache, now):
            fields = tuple(entry_fields(was, now))
            yield name, "changed", fields, now.group, now.spec.approval == "manual"


def _text(cache: ContentCache, entry: BundleDeploymentEntry) -> str:
    from agent.api import dump_yaml

    frag = cache.fragments.get(id(entry))
    if frag is None:
        frag = cache.fragments[id(entry)] = dump_yaml([to_dict(entry)]).decode("utf-8")
        cache.keep.append(entry)
    return frag


def _spec_fields(entry: BundleDeploymentEntry) -> tuple[tuple[str, Any, Any], ...]:
    return tuple((path, None, value) for path, _before, value in entry_fields(None, entry))


# --- render ----------------------------------------------------------------------------------


def _render(
    change: Change,
    base: Prepared,
    head: Prepared,
    cache_dir: Path,
    tools: ToolSettings,
) -> None:
    """Render ``change``'s first cluster at both revisions and keep the preview on it."""
    from hub.preview import BundleRenderer, plain_http_for

    cluster = change.clusters[0]
    sides = []
    for prepared in (base, head):
        plan = prepared.plans.get(cluster)
        entries = list(plan.entries) if plan else []
        # The bundles before it in its group and in the groups its group depends on are
        # rendered too, as the agent applies them first: their CRDs give their kinds' scope.
        groups = _needed_groups(entries, change.group)
        kept = [e for e in entries if e.group in groups]
        upto = next((i for i, e in enumerate(kept) if e.name == change.bundle), None)
        sides.append(kept[: upto + 1] if upto is not None else [])
    renderer = BundleRenderer(
        cache_dir=cache_dir, tools=tools, plain_http=plain_http_for([*sides[0], *sides[1]])
    )
    try:
        before, after = _both(renderer, sides)
    except FleetletError:
        try:  # a dependency that cannot be rendered here: the bundle's group alone
            alone = [[e for e in side if e.group == change.group] for side in sides]
            before, after = _both(renderer, alone)
        except FleetletError as exc:
            change.notes.append(f"not rendered: {exc}")
            return
    built = build_preview(
        rendered_changes(
            {k: v for k, v in before.items() if k == change.bundle},
            {k: v for k, v in after.items() if k == change.bundle},
        ),
        source="rendered",
    )
    change.preview, change.full_diffs, change.rendered_for = (
        built.preview,
        built.full_diffs,
        cluster,
    )


def _needed_groups(entries: Sequence[BundleDeploymentEntry], group: str) -> set[str]:
    """``group`` and every group it depends on, transitively (by the entries' dependsOn)."""
    deps: dict[str, set[str]] = {}
    for e in entries:
        deps.setdefault(e.group, set()).update(e.spec.depends_on)
    found, todo = set(), [group]
    while todo:
        g = todo.pop()
        if g not in found:
            found.add(g)
            todo += sorted(deps.get(g, ()))
    return found


def _both(
    renderer: Any, sides: Sequence[Sequence[BundleDeploymentEntry]]
) -> tuple[dict[str, list[dict[str, Any]]], dict[str, list[dict[str, Any]]]]:
    before = renderer.render(sides[0], serial=1) if sides[0] else {}
    after = renderer.render(sides[1], serial=2) if sides[1] else {}
    return before, after


# --- the run ---------------------------------------------------------------------------------


def review(
    fleet_dir: str | Path,
    *,
    base: str,
    head: str,
    render: bool = True,
    cache_dir: Path | None = None,
    registry_credentials: Mapping[str, tuple[str, str]] | None = None,
    tools: ToolSettings | None = None,
    progress: Progress | None = None,
) -> Review:
    """Compare the fleet at ``base`` with the fleet at ``head`` (revisions of the git
    repository holding ``fleet_dir``). ``render`` False: no content is fetched (no objects,
    no security summary). ``cache_dir`` keeps parsed fleet files and rendered content.

    Raises RevisionError, FleetRepoError (either revision is not a valid fleet), the resolver's
    errors (a reference could not be pinned).
    """
    say = progress or (lambda _message: None)
    repo, prefix = _repository(Path(fleet_dir))
    commits = (_commit(repo, base, "--base"), _commit(repo, head, "--head"))
    with contextlib.ExitStack() as stack:
        work = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="fleetlet-review-")))
        cache = cache_dir or work / "cache"
        prepared: list[Prepared] = []
        for side, commit in zip(("base", "head"), commits, strict=True):
            root = work / side
            checkout(repo, commit, prefix, root)
            say(f"{side}: planning the fleet at {str(commit.id)[:12]} ({_subject(commit)})")
            prepared.append(
                prepare(
                    root,
                    registry_credentials=registry_credentials,
                    progress=say,
                    cache_dir=cache / "fleet-files",
                    signature_cache=cache / "signatures",
                )
            )
        old, new = prepared
        changes, changed = compare(old, new)
        say(f"{changed} clusters change, in {len(changes)} distinct bundle changes")
        notes: list[str] = []
        if render:
            settings = tools or ToolSettings.from_env()
            for i, change in enumerate(changes):
                if i >= MAX_RENDERED:
                    change.notes.append(
                        f"not rendered: only the first {MAX_RENDERED} changes are rendered"
                    )
                    continue
                say(f"{change.bundle}: rendering {change.clusters[0]} at both revisions")
                _render(change, old, new, cache / "preview", settings)
            if changes:
                notes.append(
                    "objects are rendered for the first cluster of each change with the tools' "
                    "default capabilities (not the cluster's reported Kubernetes version), not "
                    "a live dry run; bundles whose sources need the agent's Secret are not "
                    "rendered; a cluster's own approval policy (requireApproval) is not known "
                    "here"
                )
        bundles = _summaries(changes, new)
    return Review(
        base=Revision(rev=base, commit=str(commits[0].id), subject=_subject(commits[0])),
        head=Revision(rev=head, commit=str(commits[1].id), subject=_subject(commits[1])),
        clusters=len(new.plans),
        changed=changed,
        bundles=tuple(bundles),
        notes=tuple(notes),
    )


def _subject(commit: pygit2.Commit) -> str:
    return str(commit.message).strip().split("\n", 1)[0][:200]


def _summaries(changes: Sequence[Change], head: Prepared) -> list[BundleSummary]:
    by_bundle: dict[str, list[Change]] = {}
    for c in changes:
        by_bundle.setdefault(c.bundle, []).append(c)
    moving: dict[str, set[str]] = {}
    for c in changes:
        if c.kind != "removed":
            moving.setdefault(c.group, set()).update(c.clusters)
    waves: dict[str, tuple[WaveSummary, ...] | None] = {}
    for group, names in moving.items():
        strategy = head.fleet.rollouts.get(group)
        if strategy is None:
            waves[group] = None
            continue
        labels = {n: head.plans[n].cluster.labels for n in names if n in head.plans}
        waves[group] = tuple(
            WaveSummary(name=w.name, pause_before=w.pause_before, clusters=len(w.members))
            for w in plan_waves(strategy, labels)
        )
    return [
        BundleSummary(
            bundle=name,
            group=found[0].group,
            changes=found,
            waves=waves.get(found[0].group),
        )
        for name, found in sorted(by_bundle.items())
    ]


# --- markdown --------------------------------------------------------------------------------


def _n(count: int) -> str:
    return f"{count:,}"


def _clusters(count: int) -> str:
    return f"{_n(count)} cluster{'' if count == 1 else 's'}"


def _code(value: Any) -> str:
    text = "(unset)" if value is None else value if isinstance(value, str) else json.dumps(value)
    text = text if len(text) <= 80 else text[:77] + "..."
    return "`" + text.replace("`", "'").replace("\n", " ") + "`"


def _security(preview: RequestPreview) -> list[str]:
    s = preview.security
    out = []
    for label, found in (
        ("RBAC", s.rbac),
        ("CRD", s.crds),
        ("webhook", s.webhooks),
        ("privileged", s.privileged),
        ("namespace", s.namespaces),
    ):
        for f in found:
            details = "; ".join(f.details)
            out.append(
                f"**{label}**: {f.object} ({f.action})" + (f": {details}" if details else "")
            )
    return out


def _security_cell(summary: BundleSummary) -> str:
    counts: dict[str, int] = {}
    for c in summary.changes:
        if c.preview is None:
            continue
        s = c.preview.security
        for label, found in (
            ("RBAC", s.rbac),
            ("CRD", s.crds),
            ("webhook", s.webhooks),
            ("privileged", s.privileged),
            ("namespace", s.namespaces),
        ):
            if found:
                counts[label] = counts.get(label, 0) + len(found)
    return ", ".join(f"{n} {label}" for label, n in counts.items()) or "none"


def _waves_text(summary: BundleSummary) -> str:
    if all(c.kind == "removed" for c in summary.changes):
        return "— (removed at once)"
    if summary.waves is None:
        return "at once (no rollout)"
    parts = []
    for w in summary.waves:
        gate = ", after a promote" if w.pause_before else ""
        parts.append(f"{w.name} ({_n(w.clusters)}{gate})")
    return " → ".join(parts)


def markdown(review: Review) -> str:
    """The summary a CI job posts on the pull request (bounded by :data:`MAX_MARKDOWN`)."""
    out = [
        "### fleetlet: what this change does to the fleet",
        "",
        f"`{review.base.commit[:12]}` → `{review.head.commit[:12]}` · "
        f"{_clusters(review.clusters)} in the fleet, **{_clusters(review.changed)} "
        f"change{'s' if review.changed == 1 else ''}** · "
        f"{len(review.bundles)} bundle{'' if len(review.bundles) == 1 else 's'} changed",
        "",
    ]
    if not review.bundles:
        out.append("No cluster receives anything new.")
        return "\n".join(out) + "\n"
    approvals = sum(b.approvals for b in review.bundles)
    if approvals:
        out += [
            f"**Needs approval** on {_clusters(approvals)} (`approval: manual`): each cluster's "
            "agent opens a request that an approver must approve (`fleetlet approve`).",
            "",
        ]
    out += [
        "| Bundle | Clusters | Distinct changes | Objects +/~/− | Security | Rollout | Approval |",
        "|---|---:|---:|---|---|---|---|",
    ]
    for b in review.bundles:
        created, changed, deleted = b.objects()
        out.append(
            f"| `{b.bundle}` | {_n(b.clusters)} | {len(b.changes)} | "
            f"{created} / {changed} / {deleted} | {_security_cell(b)} | {_waves_text(b)} | "
            f"{_clusters(b.approvals) if b.approvals else '—'} |"
        )
    for b in review.bundles:
        out += ["", f"#### `{b.bundle}` (group `{b.group}`): {_clusters(b.clusters)}"]
        for i, c in enumerate(b.changes):
            if i >= MAX_CHANGES_SHOWN:
                rest = b.changes[i:]
                out.append(
                    f"- … and {len(rest)} more distinct changes on "
                    f"{_clusters(sum(len(x.clusters) for x in rest))} (see `-o json`)"
                )
                break
            out += _change_lines(c)
    for note in review.notes:
        out += ["", f"<sub>{note}</sub>"]
    text = "\n".join(out) + "\n"
    if len(text) > MAX_MARKDOWN:
        cut = text[: MAX_MARKDOWN - 200].rsplit("\n", 1)[0]
        text = cut + "\n\n… (cut to fit a comment: the whole summary is in `-o json`)\n"
    return text


def _change_lines(c: Change) -> list[str]:
    shown = ", ".join(f"`{n}`" for n in c.clusters[:MAX_CLUSTERS_SHOWN])
    more = len(c.clusters) - MAX_CLUSTERS_SHOWN
    shown += f" and {_n(more)} more" if more > 0 else ""
    out = ["", f"**{c.kind}** on {_clusters(len(c.clusters))}: {shown}"]
    if c.kind == "changed":
        out += [f"- {_code(p)}: {_code(b)} → {_code(a)}" for p, b, a in c.fields[:12]]
        if len(c.fields) > 12:
            out.append(f"- … and {len(c.fields) - 12} more fields")
    if c.manual:
        out.append("- needs approval (`approval: manual`)")
    p = c.preview
    if p is not None:
        out.append(
            f"- objects (rendered for `{c.rendered_for}`): {p.created} created, {p.changed} "
            f"changed, {p.deleted} deleted, {p.unchanged} unchanged"
        )
        for o in p.objects[:20]:
            paths = ", ".join(o.paths[:3]) + (" …" if len(o.paths) > 3 else "")
            out.append(f"  - {o.action} {o.target}" + (f": {paths}" if paths else ""))
        if len(p.objects) > 20 or p.omitted:
            out.append(f"  - … and {len(p.objects) - 20 + p.omitted} more objects")
        security = _security(p)
        out.append(f"- security: {len(security)} finding(s)" if security else "- security: none")
        out += [f"  - {line}" for line in security]
        diffs = [o for o in p.objects if o.diff][:10]
        if diffs:
            out += ["", "<details><summary>diffs</summary>", "", "```diff"]
            for o in diffs:
                out += [f"# {o.target}", o.diff.rstrip("\n")]
            out += ["```", "", "</details>"]
    out += [f"- note: {note}" for note in c.notes]
    return out


__all__ = [
    "MAX_RENDERED",
    "BundleSummary",
    "Change",
    "Review",
    "Revision",
    "RevisionError",
    "checkout",
    "compare",
    "markdown",
    "review",
]
