"""Hooks and waves: what runs before, between and after a group's objects.

Users bring Helm charts and Argo CD applications; both order a deployment with annotations,
and fleetlet honours them as ordered stages of the group's move:

- **waves** (``fleetlet.io/wave``, or Argo CD's ``argocd.argoproj.io/sync-wave``; an integer,
  default 0): a group's objects are applied wave by wave, lowest first, each wave healthy
  before the next (CRDs and Namespaces still go first, whatever their wave);
- **hooks** (``helm.sh/hook``, ``argocd.argoproj.io/hook``) are objects created, not applied,
  when their moment comes, and waited for until they complete (a Job Complete, a Pod
  Succeeded; any other kind once created):

  ========================  ==========================================  ======================
  when                      Helm                                        Argo CD
  ========================  ==========================================  ======================
  before the objects        ``pre-install`` / ``pre-upgrade``            ``PreSync``
  after the objects         (none)                                      ``Sync``
  after the group healthy   ``post-install`` / ``post-upgrade``          ``PostSync``
  when the move failed      (none)                                      ``SyncFail``
  before / after removal    ``pre-delete`` / ``post-delete``             ``PostDelete`` (after)
  never (reported)          ``test``, ``pre/post-rollback``              ``Skip``
  ========================  ==========================================  ======================

  Hooks run as Helm runs them (``pkg/action/hooks.go``): the group's Namespaces
  (``createNamespace``'s and the bundles' own) exist before any hook; Helm hooks one at a time,
  by ``helm.sh/hook-weight`` (lowest first), then name, then kind, each followed with a watch
  until it completed (a Job that completes and is deleted at once, ``ttlSecondsAfterFinished:
  0``, is seen completing; one gone before it was seen to complete fails); Argo CD hooks of
  one sync wave together. Delete policies (``helm.sh/hook-delete-policy``,
  ``argocd.argoproj.io/hook-delete-policy``): ``before-hook-creation`` (the default, as in
  both tools: the previous hook object of that name is deleted, and gone, before a new one is
  created), ``hook-succeeded`` (applied once every hook of the moment succeeded, so a Role a
  later Job runs as stays until then), ``hook-failed`` (the hook that failed). A hook's time
  limit is its bundle's health check timeout.

A hook that fails (a Job Failed, a Pod Failed, not done in time) fails the move, and the group
is rolled back. Hooks are never part of a bundle's inventory or of its stored revision: drift
correction and rollback do not run them again. Helm's install/upgrade hooks are chosen by
whether the bundle has a healthy revision in this cluster already. A hook object a failed run
of the same bundle left behind is replaced, whatever its policy, so a retry starts clean.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from agent.errors import PermanentError
from agent.kube import CONTENT_FIELD_MANAGER, ConflictError, KubeClient, ObjectRef
from agent.render.plain import BUNDLE_LABEL

Manifest = dict[str, Any]

WAVE_ANNOTATION = "fleetlet.io/wave"
ARGO_WAVE = "argocd.argoproj.io/sync-wave"
HELM_HOOK = "helm.sh/hook"
HELM_WEIGHT = "helm.sh/hook-weight"
HELM_DELETE = "helm.sh/hook-delete-policy"
ARGO_HOOK = "argocd.argoproj.io/hook"
ARGO_DELETE = "argocd.argoproj.io/hook-delete-policy"

PRE, SYNC, POST, FAIL, PRE_DELETE, POST_DELETE = (
    "pre",
    "sync",
    "post",
    "fail",
    "pre-delete",
    "post-delete",
)
MOMENTS = (PRE, SYNC, POST, FAIL, PRE_DELETE, POST_DELETE)

_HELM = {
    ("pre-install", True): PRE,
    ("pre-upgrade", False): PRE,
    ("post-install", True): POST,
    ("post-upgrade", False): POST,
    ("pre-delete", True): PRE_DELETE,
    ("pre-delete", False): PRE_DELETE,
    ("post-delete", True): POST_DELETE,
    ("post-delete", False): POST_DELETE,
}
_HELM_NOT_THIS_MOVE = {"pre-install", "pre-upgrade", "post-install", "post-upgrade"}
_HELM_NEVER = {"test", "test-success", "test-failure", "pre-rollback", "post-rollback"}
_ARGO = {
    "PreSync": PRE,
    "Sync": SYNC,
    "PostSync": POST,
    "SyncFail": FAIL,
    "PostDelete": POST_DELETE,
}
_POLICIES = {
    "before-hook-creation": "before-hook-creation",
    "hook-succeeded": "hook-succeeded",
    "hook-failed": "hook-failed",
    "BeforeHookCreation": "before-hook-creation",
    "HookSucceeded": "hook-succeeded",
    "HookFailed": "hook-failed",
}


class HookError(PermanentError):
    """A hook or wave annotation that cannot be honoured (names the object and the value)."""

    reason = "InvalidHook"


class HookFailedError(PermanentError):
    """A hook did not complete: ``hook`` names it, the message says what its status was."""

    reason = "HookFailed"

    def __init__(self, message: str, *, bundle: str, hook: str) -> None:
        super().__init__(message)
        self.bundle = bundle
        self.hook = hook


@dataclass(frozen=True, kw_only=True)
class Hook:
    """One hook object of a bundle: when it runs, its weight and delete policies."""

    bundle: str
    manifest: Manifest
    moment: str
    weight: int = 0
    policies: frozenset[str] = frozenset({"before-hook-creation"})

    @property
    def name(self) -> str:
        """``Kind namespace/name`` (a generated name shows as ``prefix*``)."""
        meta = self.manifest.get("metadata") or {}
        name = meta.get("name") or f"{meta.get('generateName') or '?'}*"
        where = f"{meta['namespace']}/{name}" if meta.get("namespace") else name
        return f"{self.manifest.get('kind')} {where}"


@dataclass(kw_only=True)
class Split:
    """A bundle's rendered objects, sorted out: what is applied and which hooks run when."""

    main: list[Manifest] = field(default_factory=list)
    hooks: dict[str, list[Hook]] = field(default_factory=lambda: {m: [] for m in MOMENTS})
    not_run: list[str] = field(default_factory=list)
    """Hooks that are reported, never run (tests, rollback hooks, Argo ``Skip``)."""

    def of(self, moment: str) -> list[Hook]:
        return self.hooks[moment]


def _annotations(obj: Mapping[str, Any]) -> Mapping[str, str]:
    meta = obj.get("metadata")
    found = meta.get("annotations") if isinstance(meta, Mapping) else None
    return found if isinstance(found, Mapping) else {}


def _where(obj: Mapping[str, Any]) -> str:
    meta = obj.get("metadata") or {}
    name = meta.get("name") or f"{meta.get('generateName') or '?'}*"
    return f"{obj.get('kind')} {name}"


def _integer(value: str, what: str, obj: Mapping[str, Any]) -> int:
    try:
        return int(str(value).strip())
    except ValueError:
        raise HookError(f"{_where(obj)}: {what} {value!r} is not an integer") from None


def wave_of(obj: Mapping[str, Any]) -> int:
    """The object's wave: ``fleetlet.io/wave``, else Argo CD's sync wave, else 0.

    Raises HookError for a value that is not an integer."""
    annotations = _annotations(obj)
    for key in (WAVE_ANNOTATION, ARGO_WAVE):
        if key in annotations:
            return _integer(annotations[key], key, obj)
    return 0


def _policies(value: str | None) -> frozenset[str]:
    if not value:
        return frozenset({"before-hook-creation"})
    return frozenset(_POLICIES.get(p.strip(), p.strip()) for p in value.split(",") if p.strip())


def split(bundle: str, objects: Iterable[Manifest], *, install: bool) -> Split:
    """Sort a bundle's rendered objects into the objects to apply and its hooks (see the
    module docstring); ``install``: the bundle has no healthy revision here yet.

    Raises HookError (an unknown hook, a weight or wave that is not an integer).
    """
    out = Split()
    for obj in objects:
        annotations = _annotations(obj)
        helm, argo = annotations.get(HELM_HOOK), annotations.get(ARGO_HOOK)
        if not helm and not argo:
            out.main.append(obj)
            continue
        if helm:
            events = [e.strip() for e in helm.split(",") if e.strip()]
            moments = {_HELM[(e, install)] for e in events if (e, install) in _HELM}
            unknown = [
                e
                for e in events
                if e not in _HELM_NOT_THIS_MOVE | _HELM_NEVER and "delete" not in e
            ]
            if unknown:
                raise HookError(f"{_where(obj)}: unknown helm hook {', '.join(unknown)}")
            weight = _integer(annotations.get(HELM_WEIGHT, "0"), HELM_WEIGHT, obj)
            policies = _policies(annotations.get(HELM_DELETE))
            if not moments and any(e in _HELM_NEVER for e in events):
                out.not_run.append(f"{_where(obj)} ({helm})")
        else:
            assert argo is not None
            kinds = [k.strip() for k in argo.split(",") if k.strip()]
            unknown = [k for k in kinds if k not in _ARGO and k != "Skip"]
            if unknown:
                raise HookError(f"{_where(obj)}: unknown Argo CD hook {', '.join(unknown)}")
            moments = {_ARGO[k] for k in kinds if k in _ARGO}
            weight = wave_of(obj)
            policies = _policies(annotations.get(ARGO_DELETE))
            if "Skip" in kinds:
                out.not_run.append(f"{_where(obj)} (Skip)")
                continue
        for moment in sorted(moments):
            out.hooks[moment].append(
                Hook(bundle=bundle, manifest=obj, moment=moment, weight=weight, policies=policies)
            )
    for obj in out.main:
        wave_of(obj)  # refuse a bad wave now, before anything is written
    return out


# --- running hooks -------------------------------------------------------------------------


def hook_state(obj: Mapping[str, Any] | None) -> tuple[str, str]:
    """(``done`` | ``failed`` | ``running``, why) of a created hook object: a Job by its
    Complete/Failed condition, a Pod by its phase, any other kind done once it exists."""
    if obj is None:
        return "failed", "it is gone"
    kind = obj.get("kind")
    found = obj.get("status")
    status: Mapping[str, Any] = found if isinstance(found, Mapping) else {}
    if kind == "Job":
        for cond in status.get("conditions") or []:
            if not isinstance(cond, Mapping) or cond.get("status") != "True":
                continue
            if cond.get("type") == "Complete":
                return "done", "Job complete"
            if cond.get("type") == "Failed":
                return (
                    "failed",
                    f"Job failed: {cond.get('reason') or ''} {cond.get('message') or ''}".strip(),
                )
        return "running", "Job not complete"
    if kind == "Pod":
        phase = status.get("phase")
        if phase == "Succeeded":
            return "done", "Pod succeeded"
        if phase == "Failed":
            return (
                "failed",
                f"Pod failed: {status.get('reason') or status.get('message') or ''}".strip(),
            )
        return "running", f"Pod {phase or 'Pending'}"
    return "done", "created"


ClientFor = Callable[[str], KubeClient]
"""The client a bundle's hooks are created with (its identity), by bundle name."""

TimeoutFor = Callable[[str], float]
"""How long a bundle's hook may take (its health check timeout), by bundle name."""

# Helm's install order of kinds (pkg/releaseutil/kind_sorter.go): hooks of one weight and one
# name are created in this order; unknown kinds last.
_KIND_ORDER = {
    kind: i
    for i, kind in enumerate(
        str.split(
            "PriorityClass Namespace NetworkPolicy ResourceQuota LimitRange PodSecurityPolicy "
            "PodDisruptionBudget ServiceAccount Secret SecretList ConfigMap StorageClass "
            "PersistentVolume PersistentVolumeClaim CustomResourceDefinition ClusterRole "
            "ClusterRoleList ClusterRoleBinding ClusterRoleBindingList Role RoleList RoleBinding "
            "RoleBindingList Service DaemonSet Pod ReplicationController ReplicaSet Deployment "
            "HorizontalPodAutoscaler StatefulSet Job CronJob IngressClass Ingress APIService "
            "MutatingWebhookConfiguration ValidatingWebhookConfiguration"
        )
    )
}


def _steps(hooks: Sequence[Hook]) -> list[list[Hook]]:
    """The hooks of a moment in the order they run, as steps: a Helm hook is a step of its
    own, run after the one before it completed (Helm sorts by weight, then name, then kind);
    an Argo CD hook runs together with the other Argo hooks of its wave."""
    keyed: dict[tuple[Any, ...], list[Hook]] = {}
    for hook in hooks:
        meta = hook.manifest.get("metadata") or {}
        if HELM_HOOK in _annotations(hook.manifest):
            kind = str(hook.manifest.get("kind"))
            name = str(meta.get("name") or meta.get("generateName") or "")
            key: tuple[Any, ...] = (hook.weight, 1, name, _KIND_ORDER.get(kind, 99), kind)
            key += (hook.bundle, str(meta.get("namespace") or ""))
        else:
            key = (hook.weight, 0)
        keyed.setdefault(key, []).append(hook)
    return [keyed[k] for k in sorted(keyed)]


def run_hooks(
    hooks: Sequence[Hook],
    *,
    client_for: ClientFor,
    timeout_for: TimeoutFor,
    on_progress: Callable[[str], None] | None = None,
) -> list[str]:
    """Run one moment's hooks as Helm runs them (pkg/action/hooks.go): step by step (see
    :func:`_steps`), each hook created (after the previous object of its name is deleted,
    ``before-hook-creation``) and followed with a watch until it completed, within its
    bundle's time limit. Once every hook of the moment succeeded, those with
    ``hook-succeeded`` are deleted (last first); when one fails, it is deleted if it has
    ``hook-failed``, and the hooks that succeeded before it if they have ``hook-succeeded``.
    CustomResourceDefinitions are never deleted by a policy. Returns what ran, for the run's
    message.

    Raises HookFailedError (the hook that failed, was gone before it was seen to complete, or
    was not done in time), and the KubeClient's errors of creating or deleting them.
    """
    say = on_progress or (lambda _message: None)
    succeeded: list[tuple[Hook, ObjectRef]] = []
    for step in _steps(hooks):
        say(f"running hook(s) of weight {step[0].weight}: " + ", ".join(h.name for h in step))
        created: list[tuple[Hook, ObjectRef, str]] = []
        try:
            for hook in step:
                created.append((hook, *_create(hook, client_for(hook.bundle))))
            failure = _follow(created, client_for, timeout_for)
        except HookFailedError as exc:
            failure = exc
        done = [(h, ref) for h, ref, _rv in created if failure is None or failure.hook != h.name]
        succeeded.extend(done)
        if failure is not None:
            for hook, ref, _rv in created:
                if hook.name == failure.hook:
                    _delete_by_policy(hook, ref, "hook-failed", client_for)
            for hook, ref in reversed(succeeded):
                _delete_by_policy(hook, ref, "hook-succeeded", client_for)
            raise failure
    for hook, ref in reversed(succeeded):
        _delete_by_policy(hook, ref, "hook-succeeded", client_for)
    return [h.name for h, _ref in succeeded]


def _follow(
    created: Sequence[tuple[Hook, ObjectRef, str]],
    client_for: ClientFor,
    timeout_for: TimeoutFor,
) -> HookFailedError | None:
    """Follow each created hook until it completed (one watch each, in turn: they run at the
    same time in the cluster). Returns the first failure."""
    for hook, ref, version in created:
        client = client_for(hook.bundle)
        state, why = _watch_until_done(client, ref, version, timeout_for(hook.bundle))
        if state != "done":
            return HookFailedError(
                f"hook {hook.name} failed: {why}", bundle=hook.bundle, hook=hook.name
            )
    return None


def _watch_until_done(
    client: KubeClient, ref: ObjectRef, version: str, timeout: float
) -> tuple[str, str]:
    """(``done`` | ``failed``, why) of a created hook, followed by a watch from the version it
    was created at, so that a hook that completes and is deleted at once (a Job's
    ``ttlSecondsAfterFinished: 0``) is seen completing: its deletion carries its last state.
    Kinds other than Job and Pod are done once created."""
    if ref.kind not in ("Job", "Pod"):
        return "done", "created"
    deadline = time.monotonic() + timeout
    while True:
        left = deadline - time.monotonic()
        if left <= 0:
            return "failed", f"not done after {timeout:.0f}s"
        restart = False
        for kind, obj in client.watch(ref, resource_version=version, timeout=left):
            if kind == "ERROR":
                restart = True  # the version is too old (410): read it anew, then watch on
                break
            version = str((obj.get("metadata") or {}).get("resourceVersion") or version)
            state, why = hook_state(obj)
            if state != "running":
                return state, why
            if kind == "DELETED":
                return "failed", f"it was deleted before it completed ({why})"
        if restart or time.monotonic() < deadline:
            live = client.get(ref)
            if live is None:
                return "failed", "it is gone, and was not seen to complete"
            state, why = hook_state(live)
            if state != "running":
                return state, why
            version = str((live.get("metadata") or {}).get("resourceVersion") or version)


def _delete_by_policy(hook: Hook, ref: ObjectRef, policy: str, client_for: ClientFor) -> None:
    """Delete a hook object (and wait until it is gone) when it has ``policy``; never a CRD."""
    if policy not in hook.policies or ref.kind == "CustomResourceDefinition":
        return
    client = client_for(hook.bundle)
    if client.delete(ref, propagation="Background"):
        _wait_gone(client, ref, bundle=hook.bundle)


def _create(hook: Hook, client: KubeClient) -> tuple[ObjectRef, str]:
    """Create a hook object; a named one replaces the previous object of its name
    (``before-hook-creation``), and so does a hook this bundle left behind in a run that
    failed (it carries the bundle's ownership label), whatever its policy: a failed first
    install is retried cleanly. Returns the created object's reference and resourceVersion."""
    meta = hook.manifest.get("metadata") or {}
    if meta.get("name") and "before-hook-creation" in hook.policies:
        _delete_previous(hook, client)
    try:
        created = client.create(hook.manifest, field_manager=CONTENT_FIELD_MANAGER)
    except ConflictError as exc:
        if not meta.get("name") or not _left_by_this_bundle(hook, client):
            raise HookFailedError(
                f"hook {hook.name} exists already and its delete policy keeps it "
                f"({exc.server_message}); add before-hook-creation",
                bundle=hook.bundle,
                hook=hook.name,
            ) from exc
        _delete_previous(hook, client)
        created = client.create(hook.manifest, field_manager=CONTENT_FIELD_MANAGER)
    version = str((created.get("metadata") or {}).get("resourceVersion") or "")
    return ObjectRef.of(created), version


def _delete_previous(hook: Hook, client: KubeClient) -> None:
    ref = ObjectRef.of(hook.manifest)
    if client.delete(ref, propagation="Background"):
        _wait_gone(client, ref, bundle=hook.bundle)


def _left_by_this_bundle(hook: Hook, client: KubeClient) -> bool:
    live = client.get(ObjectRef.of(hook.manifest))
    labels = ((live or {}).get("metadata") or {}).get("labels") or {}
    mine = (hook.manifest.get("metadata") or {}).get("labels") or {}
    return bool(
        live is not None
        and mine.get(BUNDLE_LABEL) == hook.bundle
        and labels.get(BUNDLE_LABEL) == hook.bundle
    )


def _wait_gone(client: KubeClient, ref: ObjectRef, *, bundle: str, timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    while client.get(ref) is not None:
        if time.monotonic() > deadline:
            raise HookFailedError(
                f"the previous {ref} was not deleted in {timeout:.0f}s",
                bundle=bundle,
                hook=str(ref),
            )
        time.sleep(0.2)


__all__ = [
    "FAIL",
    "MOMENTS",
    "POST",
    "POST_DELETE",
    "PRE",
    "PRE_DELETE",
    "SYNC",
    "Hook",
    "HookError",
    "HookFailedError",
    "Split",
    "hook_state",
    "run_hooks",
    "split",
    "wave_of",
]
