"""Turn a lockstep group's rendered objects (per bundle) into an apply plan.

Stages: 1 CustomResourceDefinitions (the applier waits until they are Established), 2
Namespaces, 3 ServiceAccounts (a token Secret or a Pod naming one that does not exist yet is
refused or deleted by the cluster, so they must not race), 4 everything else. Inside a stage objects keep the group's order: bundles in the
order given, each bundle's objects in the renderer's order (numeric file prefixes honoured).

Every object's API must be served, or be served once stage 1 is done (a CRD of the same group
defines it). An object matched by its bundle's ``optional`` selectors whose API is not served
is skipped and listed; any other object of a kind not served fails the plan (:class:`PlanError`
naming the object).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

from agent.api.models import BundleDeploymentSpec, ManifestSelector
from agent.apply.guard import Guard
from agent.apply.hooks import wave_of
from agent.errors import PermanentError
from agent.kube import ApiNotServedError, InvalidError, ObjectRef

Manifest = dict[str, Any]

STAGE_CRDS = 0
STAGE_NAMESPACES = 1
STAGE_SERVICE_ACCOUNTS = 2
STAGE_REST = 3
STAGE_NAMES = ("CustomResourceDefinitions", "Namespaces", "ServiceAccounts", "objects")


class ApplyError(PermanentError):
    """Applying a group failed. ``bundle`` and ``target`` (``Kind ns/name``) name the (first)
    object, ``server_message`` is the API server's message (or ours), ``reason`` a CamelCase
    word (ApplyFailed, Conflict, Forbidden, Invalid, NotFound, ApiNotServed, WebhookFailed...),
    ``managers`` the other field managers of a conflict, ``dry_run`` whether the dry run (not
    a write) refused it. ``failures`` lists every object refused when there were several
    (see :meth:`combine`); each is named once in the message."""

    reason = "ApplyFailed"

    def __init__(
        self,
        server_message: str,
        *,
        bundle: str,
        target: str,
        reason: str | None = None,
        managers: Sequence[str] = (),
        dry_run: bool = False,
        failures: Sequence[ApplyError] = (),
        message: str | None = None,
    ) -> None:
        super().__init__(message or f"bundle {bundle}: {target}: {server_message}")
        self.bundle = bundle
        self.target = target
        self.server_message = server_message
        self.managers = tuple(managers)
        self.dry_run = dry_run
        self.failures: tuple[ApplyError, ...] = tuple(failures) or (self,)
        if reason:
            self.reason = reason

    @property
    def where(self) -> set[tuple[str, str]]:
        """(bundle, object) of every refused object."""
        return {(f.bundle, f.target) for f in self.failures}

    @classmethod
    def combine(cls, errors: Sequence[ApplyError]) -> ApplyError:
        """One error for several refused objects (the first one's bundle, object and
        reason; every object in the message)."""
        if len(errors) == 1:
            return errors[0]
        first = errors[0]
        reasons = {e.reason for e in errors}
        when = "dry run" if all(e.dry_run for e in errors) else "apply"
        shown = errors[:20]
        text = f"{len(errors)} objects refused ({when}): " + "; ".join(str(e) for e in shown)
        if len(errors) > len(shown):
            text += f"; and {len(errors) - len(shown)} more"
        return cls(
            first.server_message,
            bundle=first.bundle,
            target=first.target,
            reason=first.reason if len(reasons) == 1 else "ApplyFailed",
            managers=first.managers,
            dry_run=all(e.dry_run for e in errors),
            failures=[f for e in errors for f in e.failures],
            message=text,
        )


class PlanError(ApplyError):
    """The group cannot be applied as rendered (an object's API is not served)."""

    reason = "ApiNotServed"


@dataclass(frozen=True, kw_only=True)
class ApplySettings:
    """The parts of a BundleDeploymentSpec the applier and pruner use."""

    optional: tuple[ManifestSelector, ...] = ()
    service_account_name: str | None = None
    take_ownership: bool = False
    keep_crds: bool = True
    reclaim: frozenset[str] = frozenset()
    """Objects (:func:`identity`) this bundle applied before: their fields are its own, so
    they are taken back (forced) when someone edited them; other managers' fields on other
    objects are taken only with ``take_ownership``."""

    @classmethod
    def from_spec(cls, spec: BundleDeploymentSpec) -> ApplySettings:
        """The settings of a BundleDeployment's spec."""
        return cls(
            optional=spec.optional,
            service_account_name=spec.service_account_name,
            take_ownership=spec.take_ownership,
            keep_crds=spec.keep_crds,
        )


@dataclass(frozen=True, kw_only=True)
class BundleInput:
    """One bundle of a group: its name, its rendered (finished) objects, its settings."""

    name: str
    objects: Sequence[Manifest]
    settings: ApplySettings = field(default_factory=ApplySettings)


@dataclass(frozen=True, kw_only=True)
class PlannedObject:
    """One object to apply. ``deferred``: it cannot be dry-run before the group's CRDs or
    Namespaces exist (its kind comes from a CRD of the group, or its namespace from a
    Namespace of the group), so its dry run runs after stages 1 and 2, before the others."""

    bundle: str
    ref: ObjectRef
    manifest: Manifest
    stage: int
    deferred: bool = False
    wave: int = 0
    """Its wave (:func:`agent.apply.hooks.wave_of`): objects after the Namespaces are applied
    wave by wave, lowest first; CRDs and Namespaces go first whatever their wave."""

    @property
    def target(self) -> str:
        """``Kind namespace/name`` for messages."""
        where = f"{self.ref.namespace}/{self.ref.name}" if self.ref.namespace else self.ref.name
        return f"{self.ref.kind} {where}"


@dataclass(frozen=True, kw_only=True)
class Skipped:
    """An optional object left out because its API is not served."""

    bundle: str
    ref: ObjectRef
    reason: str

    def __str__(self) -> str:
        return f"{self.bundle}: {self.ref} ({self.reason})"


@dataclass(frozen=True, kw_only=True)
class Plan:
    """The stages (each a tuple of objects in order) and the skipped optional objects."""

    stages: tuple[tuple[PlannedObject, ...], ...]
    skipped: tuple[Skipped, ...] = ()

    @property
    def objects(self) -> list[PlannedObject]:
        """Every object, stage by stage."""
        return [obj for stage in self.stages for obj in stage]


class Discovery(Protocol):
    """What planning needs of a client (:class:`agent.kube.KubeClient` has it)."""

    def resource_for(self, api_version: str, kind: str) -> Any: ...


def identity(ref: ObjectRef) -> str:
    """An object's identity across API versions: ``group/Kind/namespace/name``."""
    return f"{api_group(ref.api_version)}/{ref.kind}/{ref.namespace or ''}/{ref.name}"


def api_group(api_version: str) -> str:
    """The API group of an apiVersion (``""`` for the core group)."""
    return api_version.rsplit("/", 1)[0] if "/" in api_version else ""


def is_crd(obj: Mapping[str, Any]) -> bool:
    """Whether a manifest is a CustomResourceDefinition."""
    return (
        obj.get("kind") == "CustomResourceDefinition"
        and api_group(str(obj.get("apiVersion", ""))) == "apiextensions.k8s.io"
    )


def _stage(obj: Mapping[str, Any]) -> int:
    if is_crd(obj):
        return STAGE_CRDS
    if obj.get("kind") == "Namespace" and obj.get("apiVersion") == "v1":
        return STAGE_NAMESPACES
    if obj.get("kind") == "ServiceAccount" and obj.get("apiVersion") == "v1":
        return STAGE_SERVICE_ACCOUNTS
    return STAGE_REST


def _crd_kinds(objects: Iterable[Mapping[str, Any]]) -> set[tuple[str, str]]:
    """(group/version, kind) served once the given CRDs are established."""
    served: set[tuple[str, str]] = set()
    for obj in objects:
        if not is_crd(obj):
            continue
        spec = obj.get("spec") or {}
        group, kind = spec.get("group"), (spec.get("names") or {}).get("kind")
        for version in spec.get("versions") or []:
            if isinstance(version, Mapping) and version.get("served", True):
                served.add((f"{group}/{version.get('name')}", str(kind)))
    return served


def matches(selector: ManifestSelector, ref: ObjectRef) -> bool:
    """Whether an optional-manifest selector matches the object."""
    return (
        selector.api_group == api_group(ref.api_version)
        and selector.kind == ref.kind
        and (selector.name is None or selector.name == ref.name)
    )


def plan_group(
    bundles: Sequence[BundleInput], discovery: Discovery, *, guard: Guard | None = None
) -> Plan:
    """The apply plan of a group; ``guard``: what bundle content may never touch (the
    agent's own objects).

    Raises PlanError (non-optional objects whose API is not served, naming each),
    ApplyError (objects without apiVersion/kind/name; objects the guard refuses, reason
    ProtectedObject), ApiUnavailableError.
    """
    everything = [obj for bundle in bundles for obj in bundle.objects]
    from_crds = _crd_kinds(everything)
    new_namespaces = {
        str((obj.get("metadata") or {}).get("name"))
        for obj in everything
        if _stage(obj) == STAGE_NAMESPACES
    }
    served: dict[tuple[str, str], str | None] = {}
    stages: list[list[PlannedObject]] = [[] for _ in STAGE_NAMES]
    skipped: list[Skipped] = []
    refused: list[ApplyError] = []
    for bundle in bundles:
        for obj in bundle.objects:
            try:
                ref = ObjectRef.of(obj)
            except InvalidError as exc:  # no apiVersion/kind/name
                refused.append(
                    ApplyError(str(exc), bundle=bundle.name, target="object", dry_run=True)
                )
                continue
            refusal = guard.refusal(bundle.name, ref) if guard is not None else None
            if refusal is not None:
                where = PlannedObject(bundle=bundle.name, ref=ref, manifest=obj, stage=0)
                refused.append(
                    ApplyError(
                        refusal,
                        bundle=bundle.name,
                        target=where.target,
                        reason="ProtectedObject",
                        dry_run=True,
                    )
                )
                continue
            key = (ref.api_version, ref.kind)
            if key not in served:
                try:
                    discovery.resource_for(*key)
                    served[key] = None
                except ApiNotServedError as exc:
                    served[key] = exc.server_message
            from_group_crd = key in from_crds
            problem = served[key]
            if problem is not None and not from_group_crd:
                if any(matches(s, ref) for s in bundle.settings.optional):
                    skipped.append(Skipped(bundle=bundle.name, ref=ref, reason=problem))
                    continue
                planned = PlannedObject(bundle=bundle.name, ref=ref, manifest=obj, stage=0)
                refused.append(
                    PlanError(
                        f"{problem} (install the API first, or mark the manifest optional)",
                        bundle=bundle.name,
                        target=planned.target,
                        dry_run=True,
                    )
                )
                continue
            stage = _stage(obj)
            deferred = stage > STAGE_NAMESPACES and (
                (problem is not None and from_group_crd) or ref.namespace in new_namespaces
            )
            stages[stage].append(
                PlannedObject(
                    bundle=bundle.name,
                    ref=ref,
                    manifest=obj,
                    stage=stage,
                    deferred=deferred,
                    wave=wave_of(obj) if stage > STAGE_NAMESPACES else 0,
                )
            )
    if refused:
        # Every object that cannot be applied, not only the first.
        if all(isinstance(e, PlanError) for e in refused):
            raise PlanError.combine(refused)
        raise ApplyError.combine(refused)
    return Plan(stages=tuple(tuple(s) for s in stages), skipped=tuple(skipped))
