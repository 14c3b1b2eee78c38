"""The preview of a move: per object created, changed, deleted, unchanged or refused, with a
bounded diff of each, and the security summary.

The same shape comes from two places. The agent compares the live cluster with the server-side
dry run of the group (:func:`live_changes`: exactly what the apply would do, as the bundles'
own identities); ``fleetlet hub diff`` compares the rendered sets before and after a
publication (:func:`rendered_changes`: no cluster needed). :func:`build_preview` turns either
into a :class:`~agent.api.approvals.RequestPreview`, whose size is bounded (objects listed,
characters per diff, characters in all); every diff cut there is kept whole in
:attr:`Preview.full_diffs`, which the agent stores in a ConfigMap the request names.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

from agent.api.approvals import (
    MAX_DIFF,
    MAX_FINDINGS,
    MAX_LISTED,
    MAX_PATHS,
    Finding,
    ObjectChange,
    PreviewSource,
    RequestPreview,
    SecuritySummary,
)
from agent.apply.group import DryRunResult
from agent.apply.inventory import Inventory, Key, PrunePlan
from agent.approve.diff import changed_paths, cleaned, redacted, unified
from agent.approve.security import findings
from agent.kube import ObjectRef

Object = dict[str, Any]
ChangeAction = Literal["created", "changed", "deleted", "unchanged", "refused"]

MAX_INLINE = 256 * 1024
"""Characters of diffs kept inline in one request, in all (the rest only in the full diffs)."""


@dataclass(frozen=True, kw_only=True)
class Change:
    """One object of a move: what happens to it, and the object before and after (None:
    absent or unknown). ``note`` explains what a diff cannot show (a refusal's message)."""

    bundle: str
    ref: ObjectRef
    action: ChangeAction
    before: Mapping[str, Any] | None = None
    after: Mapping[str, Any] | None = None
    note: str = ""

    @property
    def target(self) -> str:
        where = f"{self.ref.namespace}/{self.ref.name}" if self.ref.namespace else self.ref.name
        return f"{self.ref.kind} {where}"


@dataclass(frozen=True, kw_only=True)
class Preview:
    """A request's preview, and the whole diff of every object whose diff it cut
    (``bundle: Kind namespace/name`` -> diff)."""

    preview: RequestPreview
    full_diffs: Mapping[str, str] = field(default_factory=dict)


def live_changes(
    results: Sequence[DryRunResult], deletions: PrunePlan | None = None
) -> list[Change]:
    """The changes of a group's dry run (:func:`agent.apply.dry_run_group`) and of the
    pruning its move would do (only ``delete`` items of ``deletions``)."""
    changes: list[Change] = []
    for r in results:
        base: dict[str, Any] = {"bundle": r.bundle, "ref": r.ref}
        if r.refused is not None:
            changes.append(Change(**base, action="refused", note=r.refused.server_message))
        elif r.deferred:
            changes.append(
                Change(
                    **base,
                    action="created",
                    after=r.manifest,
                    note="not dry-run: its CRD or Namespace comes with the group",
                )
            )
        elif not r.existed:
            changes.append(Change(**base, action="created", after=r.answer or r.manifest))
        elif r.unchanged:
            changes.append(Change(**base, action="unchanged"))
        elif r.live is None:
            changes.append(
                Change(
                    **base,
                    action="changed",
                    after=r.answer,
                    note="the bundle's identity may not read the object: not compared",
                )
            )
        elif cleaned(r.live) == cleaned(r.answer):
            # Only bookkeeping moves (fleetlet's revision annotation, a new serial each time).
            changes.append(Change(**base, action="unchanged"))
        else:
            changes.append(Change(**base, action="changed", before=r.live, after=r.answer))
    for item in deletions.of("delete") if deletions is not None else ():
        changes.append(Change(bundle=item.bundle, ref=item.entry.ref, action="deleted"))
    return changes


def rendered_changes(
    before: Mapping[str, Sequence[Mapping[str, Any]]],
    after: Mapping[str, Sequence[Mapping[str, Any]]],
) -> list[Change]:
    """The changes between two renderings of bundles (bundle -> objects); a bundle absent
    from ``after`` is removed whole. Objects are matched by API group, kind, namespace and
    name (:class:`~agent.apply.inventory.Key`)."""
    changes: list[Change] = []
    for bundle in sorted(set(before) | set(after)):
        old = {_key(o): o for o in before.get(bundle, ())}
        new = {_key(o): o for o in after.get(bundle, ())}
        for key, obj in new.items():
            ref = ObjectRef.of(obj)
            previous = old.get(key)
            if previous is None:
                changes.append(Change(bundle=bundle, ref=ref, action="created", after=obj))
            elif cleaned(previous) == cleaned(obj):
                changes.append(Change(bundle=bundle, ref=ref, action="unchanged"))
            else:
                changes.append(
                    Change(bundle=bundle, ref=ref, action="changed", before=previous, after=obj)
                )
        for key, obj in old.items():
            if key not in new:
                changes.append(
                    Change(bundle=bundle, ref=ObjectRef.of(obj), action="deleted", before=obj)
                )
    return changes


def _key(obj: Mapping[str, Any]) -> Key:
    return next(iter(Inventory.from_objects([obj]).entries))


def build_preview(changes: Iterable[Change], *, source: PreviewSource = "live") -> Preview:
    """The bounded preview of ``changes`` (see the module docstring)."""
    counts = {"created": 0, "changed": 0, "deleted": 0, "unchanged": 0, "refused": 0}
    listed: list[ObjectChange] = []
    full: dict[str, str] = {}
    found: dict[str, list[Finding]] = {
        c: [] for c in ("rbac", "crds", "webhooks", "privileged", "namespaces")
    }
    budget = MAX_INLINE
    omitted = 0
    old_label, new_label = ("live", "dry run") if source == "live" else ("published", "rendered")
    for change in changes:
        counts[change.action] += 1
        if change.action == "unchanged":
            continue
        action = change.action
        for category, finding in findings(
            bundle=change.bundle,
            target=change.target,
            api_version=change.ref.api_version,
            kind=change.ref.kind,
            action=action,
            before=change.before,
            after=change.after,
        ):
            if len(found[category]) < MAX_FINDINGS:
                found[category].append(finding)
        before, after = redacted(cleaned(change.before), cleaned(change.after))
        text = change.note + "\n" if change.note else ""
        if action in ("created", "changed"):
            text += unified(before, after, old=old_label, new=new_label)
        paths = changed_paths(before, after, limit=MAX_PATHS) if action == "changed" else []
        name = f"{change.bundle}: {change.target}"
        if len(listed) >= MAX_LISTED:
            omitted += 1
            if text:
                full[name] = text
            continue
        shown = text[: min(MAX_DIFF, budget)]
        truncated = len(shown) < len(text)
        if truncated:
            full[name] = text
            shown = shown[: max(0, len(shown) - 40)] + "\n... (cut: see the full diff)\n"
        budget -= len(shown)
        listed.append(
            ObjectChange(
                bundle=change.bundle,
                api_version=change.ref.api_version,
                kind=change.ref.kind,
                namespace=change.ref.namespace,
                name=change.ref.name,
                action=action,
                paths=tuple(p[:512] for p in paths),
                diff=shown,
                truncated=truncated,
            )
        )
    security = SecuritySummary(**{k: tuple(v) for k, v in found.items()})
    return Preview(
        preview=RequestPreview(
            source=source,
            created=counts["created"],
            changed=counts["changed"],
            deleted=counts["deleted"],
            unchanged=counts["unchanged"],
            refused=counts["refused"],
            findings=security.total,
            security=security,
            objects=tuple(listed),
            omitted=omitted,
        ),
        full_diffs=full,
    )


__all__ = ["Change", "Preview", "build_preview", "live_changes", "rendered_changes"]
