"""Applying a lockstep group against a real API server: dry run of everything first, stages,
optional manifests, conflicts, impersonation, unchanged objects, and pruning."""

from __future__ import annotations

import time
import uuid
from collections.abc import Iterator
from typing import Any

import pytest

from agent.api.models import ManifestSelector
from agent.apply.group import FIELD_MANAGER, apply_group
from agent.apply.inventory import Entry, Inventory, plan_prune, prune
from agent.apply.plan import ApplyError, ApplySettings, BundleInput, PlanError, identity
from agent.apply.verified import VerifiedObjects
from agent.kube import LIST_FROM, KubeClient, ObjectRef
from agent.render.plain import BUNDLE_LABEL, GROUP_LABEL
from tests.realenv.kube import Cluster


@pytest.fixture(scope="module")
def kube(kube_cluster: Cluster, tmp_path_factory: pytest.TempPathFactory) -> Iterator[KubeClient]:
    cache = tmp_path_factory.mktemp("discovery")
    with KubeClient(kubeconfig=str(kube_cluster.kubeconfig), discovery_cache_dir=cache) as client:
        yield client


@pytest.fixture
def cluster_scoped(kube: KubeClient) -> Iterator[list[dict[str, Any]]]:
    """Cluster-scoped objects a test creates; deleted afterwards."""
    created: list[dict[str, Any]] = []
    yield created
    for obj in reversed(created):
        kube.delete(obj)


def owned(obj: dict[str, Any], bundle: str, group: str) -> dict[str, Any]:
    labels = obj["metadata"].setdefault("labels", {})
    labels.update({BUNDLE_LABEL: bundle, GROUP_LABEL: group})
    return obj


def configmap(namespace: str, name: str, **data: str) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": {"name": name, "namespace": namespace},
        "data": data,
    }


def deployment(namespace: str, name: str, image: str = "example.com/web:1") -> dict[str, Any]:
    return {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {"name": name, "namespace": namespace},
        "spec": {
            "replicas": 1,
            "selector": {"matchLabels": {"app": name}},
            "template": {
                "metadata": {"labels": {"app": name}},
                "spec": {"containers": [{"name": "main", "image": image}]},
            },
        },
    }


def crd(group: str) -> dict[str, Any]:
    return {
        "apiVersion": "apiextensions.k8s.io/v1",
        "kind": "CustomResourceDefinition",
        "metadata": {"name": f"widgets.{group}"},
        "spec": {
            "group": group,
            "scope": "Namespaced",
            "names": {"plural": "widgets", "singular": "widget", "kind": "Widget"},
            "versions": [
                {
                    "name": "v1",
                    "served": True,
                    "storage": True,
                    "schema": {
                        "openAPIV3Schema": {
                            "type": "object",
                            "properties": {
                                "spec": {
                                    "type": "object",
                                    "x-kubernetes-preserve-unknown-fields": True,
                                }
                            },
                        }
                    },
                }
            ],
        },
    }


def unique(stem: str) -> str:
    return f"{stem}-{uuid.uuid4().hex[:6]}"


def service_monitor(namespace: str) -> dict[str, Any]:
    return {
        "apiVersion": "monitoring.coreos.com/v1",
        "kind": "ServiceMonitor",
        "metadata": {"name": "web", "namespace": namespace},
        "spec": {"selector": {"matchLabels": {"app": "web"}}},
    }


# --- stages ---------------------------------------------------------------------------------


def test_crd_its_resource_a_namespace_and_a_deployment_apply_in_stages(
    kube: KubeClient, cluster_scoped: list[dict[str, Any]]
) -> None:
    group = f"{unique('t')}.example.com"
    ns = unique("staged")
    definition = crd(group)
    namespace = {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": ns}}
    widget = {
        "apiVersion": f"{group}/v1",
        "kind": "Widget",
        "metadata": {"name": "w", "namespace": ns},
        "spec": {"size": 3},
    }
    cluster_scoped.extend([definition, namespace])
    objects = [
        owned(o, "platform", "platform")
        for o in (widget, deployment(ns, "operator"), namespace, definition)
    ]
    messages: list[str] = []

    # Marked optional, the Widget is still applied: its API is served once its CRD is.
    optional = ApplySettings(optional=(ManifestSelector(api_group=group, kind="Widget"),))

    result = apply_group(
        kube,
        [BundleInput(name="platform", objects=objects, settings=optional)],
        agent_namespace="default",
        on_progress=messages.append,
    )

    kinds = [r.ref.kind for r in result.objects]
    assert kinds == ["CustomResourceDefinition", "Namespace", "Widget", "Deployment"]
    assert result.counts == {"created": 4, "configured": 0, "unchanged": 0, "skipped": 0}
    applying = [m for m in messages if m.startswith("applying")]
    assert applying == [
        "applying 1 CustomResourceDefinitions (1/4)",
        "applying 1 Namespaces (2/4)",
        "applying 2 objects (4/4)",
    ]
    live = kube.get(widget)
    assert live is not None and live["spec"] == {"size": 3}
    assert live["metadata"]["uid"] == result.objects[2].uid
    assert kube.get(deployment(ns, "operator")) is not None

    again = apply_group(
        kube, [BundleInput(name="platform", objects=objects)], agent_namespace="default"
    )
    assert again.counts == {"created": 0, "configured": 0, "unchanged": 4, "skipped": 0}


def test_service_accounts_go_before_the_token_secrets_that_name_them(
    kube: KubeClient, cluster_scoped: list[dict[str, Any]]
) -> None:
    # The token controller deletes a service-account-token Secret whose ServiceAccount does
    # not exist yet, so the two must not be applied concurrently, whatever their file order.
    ns = f"tokens-{uuid.uuid4().hex[:6]}"
    namespace = {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": ns}}
    cluster_scoped.append(namespace)
    token = {
        "apiVersion": "v1",
        "kind": "Secret",
        "type": "kubernetes.io/service-account-token",
        "metadata": {
            "name": "gateway-token",
            "namespace": ns,
            "annotations": {"kubernetes.io/service-account.name": "gateway"},
        },
    }
    account = {
        "apiVersion": "v1",
        "kind": "ServiceAccount",
        "metadata": {"name": "gateway", "namespace": ns},
    }
    objects = [owned(o, "gw", "gw") for o in (token, account, namespace)]
    messages: list[str] = []

    result = apply_group(
        kube,
        [BundleInput(name="gw", objects=objects)],
        agent_namespace="default",
        on_progress=messages.append,
    )

    assert [r.ref.kind for r in result.objects] == ["Namespace", "ServiceAccount", "Secret"]
    assert "applying 1 ServiceAccounts (3/4)" in messages
    deadline = time.monotonic() + 60
    while True:
        live = kube.get(token)
        assert live is not None, "the token controller deleted the Secret"
        if (live.get("data") or {}).get("token"):
            break
        assert time.monotonic() < deadline, "the token controller never filled the Secret"
        time.sleep(0.2)


def test_second_apply_reports_unchanged_and_a_change_configured(
    kube: KubeClient, namespace: str
) -> None:
    objects = [owned(configmap(namespace, f"cm-{i}", n=str(i)), "app", "apps") for i in range(3)]
    first = apply_group(kube, [BundleInput(name="app", objects=objects)], agent_namespace=namespace)
    assert [r.action for r in first.objects] == ["created"] * 3

    objects[1]["data"]["n"] = "changed"
    second = apply_group(
        kube, [BundleInput(name="app", objects=objects)], agent_namespace=namespace
    )
    assert [r.action for r in second.objects] == ["unchanged", "configured", "unchanged"]
    assert [r.uid for r in second.objects] == [r.uid for r in first.objects]


def test_many_objects_of_a_kind_are_compared_through_one_list(
    kube: KubeClient, namespace: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    objects = [
        owned(configmap(namespace, f"cm-{i}", n=str(i)), "app", "apps")
        for i in range(LIST_FROM + 4)
    ]
    first = apply_group(kube, [BundleInput(name="app", objects=objects)], agent_namespace=namespace)
    assert first.counts["created"] == len(objects)

    gets: list[Any] = []
    real_get, real_list = kube.get, kube.list

    def get(obj: Any) -> Any:
        gets.append(ObjectRef.of(obj).name)
        return real_get(obj)

    def list_then_edit(*args: Any, **kwargs: Any) -> Any:
        items = real_list(*args, **kwargs)
        # Someone else adds a key to cm-2 after the LIST: its listed version is stale.
        kube.apply(configmap(namespace, "cm-2", extra="x"), field_manager="someone-else")
        return items

    monkeypatch.setattr(kube, "get", get)
    monkeypatch.setattr(kube, "list", list_then_edit)
    objects[1]["data"]["n"] = "changed"
    second = apply_group(
        kube, [BundleInput(name="app", objects=objects)], agent_namespace=namespace
    )
    actions = [r.action for r in second.objects]
    assert actions == ["unchanged", "configured"] + ["unchanged"] * (len(objects) - 2)
    assert gets == ["cm-2"]  # only the object changed since the LIST is read again
    assert [r.uid for r in second.objects] == [r.uid for r in first.objects]


def _count_dry_runs(kube: KubeClient, monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """Names of the objects dry-run through ``kube`` from now on (the real requests are made)."""
    dry_runs: list[str] = []
    real_apply = kube.apply

    def apply(obj: Any, **kwargs: Any) -> Any:
        if kwargs.get("dry_run"):
            dry_runs.append(ObjectRef.of(obj).name)
        return real_apply(obj, **kwargs)

    monkeypatch.setattr(kube, "apply", apply)
    return dry_runs


def test_verified_objects_skip_their_dry_run_until_they_or_their_manifest_change(
    kube: KubeClient, namespace: str, monkeypatch: pytest.MonkeyPatch, tmp_path: Any
) -> None:
    many = [
        owned(configmap(namespace, f"cm-{i}", n=str(i)), "app", "apps")
        for i in range(LIST_FROM + 2)
    ]
    few = [owned(deployment(namespace, "web"), "app", "apps")]
    objects = [*many, *few]
    verified = VerifiedObjects(tmp_path / "verified.json")
    first = apply_group(
        kube, [BundleInput(name="app", objects=objects)], agent_namespace=namespace,
        verified=verified,
    )  # fmt: skip
    assert first.counts["created"] == len(objects)
    deadline = time.monotonic() + 60
    while "deployment.kubernetes.io/revision" not in (
        (kube.get(few[0]) or {})["metadata"].get("annotations") or {}
    ):
        assert time.monotonic() < deadline, "the deployment controller never saw the Deployment"
        time.sleep(0.2)
    # Another process (the next worker) reads what this one saved.
    verified = VerifiedObjects(tmp_path / "verified.json")
    dry_runs = _count_dry_runs(kube, monkeypatch)
    second = apply_group(
        kube, [BundleInput(name="app", objects=objects)], agent_namespace=namespace,
        verified=verified,
    )  # fmt: skip
    assert second.counts["unchanged"] == len(objects)
    # The ConfigMaps were listed and are as applied; the Deployment's controller wrote to it
    # after the apply (its revision annotation), so it is dry-run once more (twice if its
    # status moves between the dry run and the read), then known.
    assert set(dry_runs) == {"web"}
    dry_runs.clear()
    third = apply_group(
        kube, [BundleInput(name="app", objects=objects)], agent_namespace=namespace,
        verified=verified,
    )  # fmt: skip
    assert third.counts["unchanged"] == len(objects) and dry_runs == []

    # Drift (someone edits cm-3) and a new manifest (cm-5): dry-run, then applied (taking the
    # edited field back, as the agent does for the objects it applied before).
    kube.patch(ObjectRef("v1", "ConfigMap", "cm-3", namespace), {"data": {"n": "edited"}})
    objects[5]["data"]["n"] = "new"
    reclaim = frozenset(identity(ObjectRef.of(o)) for o in objects)
    fourth = apply_group(
        kube,
        [BundleInput(name="app", objects=objects, settings=ApplySettings(reclaim=reclaim))],
        agent_namespace=namespace,
        verified=verified,
    )
    assert sorted(dry_runs) == ["cm-3", "cm-5"]
    assert {r.ref.name: r.action for r in fourth.objects if r.action != "unchanged"} == {
        "cm-3": "configured",
        "cm-5": "configured",
    }
    assert kube.get(objects[3])["data"] == {"n": "3"}  # type: ignore[index]


def test_verified_objects_never_let_a_refused_group_write(
    kube: KubeClient, namespace: str, tmp_path: Any
) -> None:
    good = [owned(configmap(namespace, f"cm-{i}", n=str(i)), "app", "apps") for i in range(3)]
    verified = VerifiedObjects(tmp_path / "verified.json")
    apply_group(
        kube, [BundleInput(name="app", objects=good)], agent_namespace=namespace,
        verified=verified,
    )  # fmt: skip
    changed = [configmap(namespace, f"cm-{i}", n="two") for i in range(3)]
    bad = owned(configmap(namespace, "broken", **{"not a key!": "x"}), "app", "apps")
    with pytest.raises(ApplyError):
        apply_group(
            kube,
            [BundleInput(name="app", objects=[*[owned(c, "app", "apps") for c in changed], bad])],
            agent_namespace=namespace,
            verified=verified,
        )
    assert [kube.get(c)["data"] for c in good] == [{"n": str(i)} for i in range(3)]  # type: ignore[index]
    assert kube.get(bad) is None


# --- nothing written when anything is refused -------------------------------------------------


def test_one_invalid_object_writes_nothing_and_is_named(kube: KubeClient, namespace: str) -> None:
    good = [
        owned(configmap(namespace, "fine", a="1"), "one", "g"),
        owned(deployment(namespace, "web"), "one", "g"),
    ]
    bad = owned(configmap(namespace, "broken", **{"not a key!": "x"}), "two", "g")

    with pytest.raises(ApplyError) as caught:
        apply_group(
            kube,
            [BundleInput(name="one", objects=good), BundleInput(name="two", objects=[bad])],
            agent_namespace=namespace,
        )
    error = caught.value
    assert error.bundle == "two" and error.target == f"ConfigMap {namespace}/broken"
    assert error.reason == "Invalid"
    assert "dry run refused" in str(error) and "a valid config key" in str(error)
    for obj in [*good, bad]:
        assert kube.get(obj) is None


def test_optional_service_monitor_is_skipped_and_listed(kube: KubeClient, namespace: str) -> None:
    objects = [
        owned(configmap(namespace, "cfg", a="1"), "mon", "g"),
        owned(service_monitor(namespace), "mon", "g"),
    ]
    settings = ApplySettings(
        optional=(ManifestSelector(api_group="monitoring.coreos.com", kind="ServiceMonitor"),)
    )

    result = apply_group(
        kube,
        [BundleInput(name="mon", objects=objects, settings=settings)],
        agent_namespace=namespace,
    )
    assert [r.ref.kind for r in result.objects] == ["ConfigMap"]
    assert [(s.bundle, s.ref.kind, s.ref.name) for s in result.skipped] == [
        ("mon", "ServiceMonitor", "web")
    ]
    assert result.counts["skipped"] == 1
    assert "does not serve kind ServiceMonitor" in result.skipped[0].reason

    objects[0]["data"]["a"] = "2"
    with pytest.raises(PlanError) as caught:
        apply_group(kube, [BundleInput(name="mon", objects=objects)], agent_namespace=namespace)
    message = str(caught.value)
    assert f"ServiceMonitor {namespace}/web" in message
    assert "monitoring.coreos.com/v1" in message and "optional" in message
    live = kube.get(objects[0])
    assert live is not None and live["data"] == {"a": "1"}


def test_conflict_names_the_other_manager_and_take_ownership_takes_over(
    kube: KubeClient, namespace: str
) -> None:
    kube.apply(configmap(namespace, "shared", mode="blue"), field_manager="kubectl-edit")
    objects = [owned(configmap(namespace, "shared", mode="green"), "app", "g")]

    with pytest.raises(ApplyError) as caught:
        apply_group(kube, [BundleInput(name="app", objects=objects)], agent_namespace=namespace)
    assert caught.value.reason == "Conflict"
    assert caught.value.managers == ("kubectl-edit",)
    assert "kubectl-edit" in str(caught.value) and "takeOwnership" in str(caught.value)

    taken = apply_group(
        kube,
        [BundleInput(name="app", objects=objects, settings=ApplySettings(take_ownership=True))],
        agent_namespace=namespace,
    )
    assert [r.action for r in taken.objects] == ["configured"]
    live = kube.get(objects[0])
    assert live is not None and live["data"] == {"mode": "green"}
    data_owners = {
        m["manager"] for m in live["metadata"]["managedFields"] if "f:data" in m.get("fieldsV1", {})
    }
    assert data_owners == {FIELD_MANAGER}


def test_service_account_without_clusterrole_rights_fails_and_nothing_is_applied(
    kube: KubeClient, namespace: str
) -> None:
    # The ServiceAccount may manage ConfigMaps in the namespace, nothing else.
    kube.apply(
        {
            "apiVersion": "v1",
            "kind": "ServiceAccount",
            "metadata": {"name": "deployer", "namespace": namespace},
        },
        field_manager="test",
    )
    kube.apply(
        {
            "apiVersion": "rbac.authorization.k8s.io/v1",
            "kind": "Role",
            "metadata": {"name": "configmaps", "namespace": namespace},
            "rules": [{"apiGroups": [""], "resources": ["configmaps"], "verbs": ["*"]}],
        },
        field_manager="test",
    )
    kube.apply(
        {
            "apiVersion": "rbac.authorization.k8s.io/v1",
            "kind": "RoleBinding",
            "metadata": {"name": "deployer", "namespace": namespace},
            "roleRef": {
                "apiGroup": "rbac.authorization.k8s.io",
                "kind": "Role",
                "name": "configmaps",
            },
            "subjects": [{"kind": "ServiceAccount", "name": "deployer", "namespace": namespace}],
        },
        field_manager="test",
    )
    role_name = unique("fleetlet-test-reader")
    cluster_role = owned(
        {
            "apiVersion": "rbac.authorization.k8s.io/v1",
            "kind": "ClusterRole",
            "metadata": {"name": role_name},
            "rules": [{"apiGroups": [""], "resources": ["pods"], "verbs": ["get"]}],
        },
        "restricted",
        "g",
    )
    restricted = BundleInput(
        name="restricted",
        objects=[cluster_role, owned(configmap(namespace, "allowed", a="1"), "restricted", "g")],
        settings=ApplySettings(service_account_name="deployer"),
    )
    other = BundleInput(
        name="other", objects=[owned(configmap(namespace, "other", a="1"), "other", "g")]
    )

    with pytest.raises(ApplyError) as caught:
        apply_group(kube, [other, restricted], agent_namespace=namespace)
    error = caught.value
    assert error.reason == "Forbidden" and error.bundle == "restricted"
    assert error.target == f"ClusterRole {role_name}"
    assert f"system:serviceaccount:{namespace}:deployer" in str(error)
    assert 'cannot patch resource "clusterroles"' in str(error)
    assert kube.get(cluster_role) is None
    assert kube.get(configmap(namespace, "allowed")) is None
    assert kube.get(configmap(namespace, "other")) is None


# --- prune ----------------------------------------------------------------------------------


def test_prune_deletes_removed_keeps_crds_hands_over_and_spares_foreign_objects(
    kube: KubeClient, namespace: str, cluster_scoped: list[dict[str, Any]]
) -> None:
    definition = crd(f"{unique('p')}.example.com")
    cluster_scoped.append(definition)

    def rev1() -> list[dict[str, Any]]:
        return [
            owned(definition, "a", "ga"),
            owned(configmap(namespace, "keep", v="1"), "a", "ga"),
            owned(configmap(namespace, "drop", v="1"), "a", "ga"),
            owned(configmap(namespace, "move", v="1"), "a", "ga"),
        ]

    first = apply_group(kube, [BundleInput(name="a", objects=rev1())], agent_namespace=namespace)
    old = first.inventory_of("a")
    moved_uid = next(r.uid for r in first.objects if r.ref.name == "move")
    # An object someone else made; an old inventory naming it must not get it deleted.
    foreign = kube.apply(configmap(namespace, "foreign", v="theirs"), field_manager="someone-else")
    # One wearing our label that we never applied (another manager made it).
    impostor = kube.apply(
        owned(configmap(namespace, "impostor", v="theirs"), "a", "ga"), field_manager="someone-else"
    )
    old = Inventory.of([*old, Entry.of(ObjectRef.of(foreign)), Entry.of(ObjectRef.of(impostor))])

    second = apply_group(
        kube,
        [BundleInput(name="a", objects=[owned(configmap(namespace, "keep", v="2"), "a", "ga")])],
        agent_namespace=namespace,
    )
    # The object moves to bundle b of another group, applied before a's group prunes.
    b = apply_group(
        kube,
        [BundleInput(name="b", objects=[owned(configmap(namespace, "move", v="1"), "b", "gb")])],
        agent_namespace=namespace,
    )
    new = {"a": second.inventory_of("a")}
    claimed = {e.key: "b" for e in b.inventory_of("b")}

    plan = plan_prune({"a": old}, new, claimed_elsewhere=claimed)
    by_name = {i.entry.key.name: i.action for i in plan.items}
    assert by_name == {
        definition["metadata"]["name"]: "keep",
        "drop": "delete",
        "move": "handover",
        "foreign": "delete",
        "impostor": "delete",
    }

    outcomes = {o.entry.key.name: o.done for o in prune(kube, plan)}
    assert outcomes == {
        definition["metadata"]["name"]: "kept",
        "drop": "deleted",
        "move": "handed-over",
        "foreign": "not-ours",
        "impostor": "not-ours",
    }
    assert kube.get(configmap(namespace, "drop")) is None
    assert kube.get(definition) is not None
    live_move = kube.get(configmap(namespace, "move"))
    assert live_move is not None and live_move["metadata"]["uid"] == moved_uid
    assert live_move["metadata"]["labels"][BUNDLE_LABEL] == "b"
    assert kube.get(foreign) is not None and kube.get(impostor) is not None
    assert kube.get(configmap(namespace, "keep")) is not None

    # With keepCRDs off the removed CRD goes too.
    outcomes_again = prune(
        kube, plan_prune({"a": old}, new, keep_crds={"a": False}, claimed_elsewhere=claimed)
    )
    assert {o.entry.key.name: o.done for o in outcomes_again}[
        definition["metadata"]["name"]
    ] == "deleted"


def test_hand_over_inside_one_group_keeps_the_uid(kube: KubeClient, namespace: str) -> None:
    first = apply_group(
        kube,
        [
            BundleInput(name="a", objects=[owned(configmap(namespace, "moving", v="1"), "a", "g")]),
            BundleInput(name="b", objects=[]),
        ],
        agent_namespace=namespace,
    )
    second = apply_group(
        kube,
        [
            BundleInput(name="a", objects=[]),
            BundleInput(name="b", objects=[owned(configmap(namespace, "moving", v="1"), "b", "g")]),
        ],
        agent_namespace=namespace,
    )
    plan = plan_prune(
        {"a": first.inventory_of("a")},
        {"a": second.inventory_of("a"), "b": second.inventory_of("b")},
    )
    assert [(i.entry.key.name, i.action) for i in plan.items] == [("moving", "handover")]
    prune(kube, plan)
    live = kube.get(configmap(namespace, "moving"))
    assert live is not None and live["metadata"]["uid"] == first.objects[0].uid
    assert second.objects[0].action == "configured"
