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

  ``helm.sh/hook-weight`` (or the sync wave of an Argo hook) orders hooks of one moment,
  lowest first, a weight's hooks all complete before the next weight starts. Delete policies
  (``helm.sh/hook-delete-policy``, ``argocd.argoproj.io/hook-delete-policy``):
  ``before-hook-creation`` (the default, as in both tools: the previous hook object of that
  name is deleted before a new one is created), ``hook-succeeded``, ``hook-failed``.

A hook that fails (a Job Failed, a Pod Failed, not done in time) fails the move, and the group
is rolled back. Hooks are never part of a bundle's inventory or of its stored revision: drift
correction and rollback do not run them again. Helm's install/upgrade hooks are chosen by
whether the bundle has a healthy revision in this cluster already.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from agent.errors import PermanentError
from agent.kube import CONTENT_FIELD_MANAGER, ConflictError, KubeClient, ObjectRef

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


def run_hooks(
    hooks: Sequence[Hook],
    *,
    client_for: ClientFor,
    timeout: float,
    interval: float = 1.0,
    on_progress: Callable[[str], None] | None = None,
) -> list[str]:
    """Run hooks weight by weight (lowest first): create each (after deleting an old one of
    the same name, ``before-hook-creation``), wait until all of a weight are done, then apply
    the delete policies. Returns what ran, for the run's message.

    Raises HookFailedError (the first hook that failed or was not done within ``timeout``
    seconds, after every hook of its weight has ended or the time is up), and the
    KubeClient's errors of creating them.
    """
    say = on_progress or (lambda _message: None)
    ran: list[str] = []
    deadline = time.monotonic() + timeout
    for weight in sorted({h.weight for h in hooks}):
        batch = [h for h in hooks if h.weight == weight]
        say(f"running {len(batch)} hook(s) of weight {weight}: " + ", ".join(h.name for h in batch))
        created = [(h, _create(h, client_for(h.bundle))) for h in batch]
        failure: HookFailedError | None = None
        pending = list(created)
        while pending:
            still = []
            for hook, ref in pending:
                state, why = hook_state(client_for(hook.bundle).get(ref))
                if state == "running":
                    still.append((hook, ref))
                elif state == "failed" and failure is None:
                    failure = HookFailedError(
                        f"hook {hook.name} failed: {why}", bundle=hook.bundle, hook=hook.name
                    )
            pending = still
            if failure is not None or not pending:
                break
            if time.monotonic() > deadline:
                hook = pending[0][0]
                failure = HookFailedError(
                    f"hook {hook.name} not done after {timeout:.0f}s",
                    bundle=hook.bundle,
                    hook=hook.name,
                )
                break
            time.sleep(interval)
        for hook, ref in created:
            ok = failure is None or failure.hook != hook.name
            if ("hook-succeeded" in hook.policies and failure is None) or (
                "hook-failed" in hook.policies and not ok
            ):
                client_for(hook.bundle).delete(ref)
        if failure is not None:
            raise failure
        ran.extend(h.name for h in batch)
    return ran


def _create(hook: Hook, client: KubeClient) -> ObjectRef:
    """Create a hook object; a named one replaces the previous object of its name
    (``before-hook-creation``). Returns the created object's reference."""
    meta = hook.manifest.get("metadata") or {}
    if meta.get("name") and "before-hook-creation" in hook.policies:
        ref = ObjectRef.of(hook.manifest)
        if client.delete(ref, propagation="Background"):
            _wait_gone(client, ref)
    try:
        created = client.create(hook.manifest, field_manager=CONTENT_FIELD_MANAGER)
    except ConflictError as exc:
        raise HookFailedError(
            f"hook {hook.name} exists already and its delete policy keeps it "
            f"({exc.server_message}); add before-hook-creation",
            bundle=hook.bundle,
            hook=hook.name,
        ) from exc
    return ObjectRef.of(created)


def _wait_gone(client: KubeClient, ref: ObjectRef, timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    while client.get(ref) is not None:
        if time.monotonic() > deadline:
            raise HookFailedError(
                f"the previous {ref} was not deleted in {timeout:.0f}s", bundle="", hook=str(ref)
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
