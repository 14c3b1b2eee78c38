"""The preview of a move, as pure logic: per-object actions and diffs, the bounds, Secret
redaction, the security summary, and the CEL rules a cluster admin writes over it. (The live
preview, from a real server-side dry run, is tested end to end in test_approval_flow.py.)"""

from __future__ import annotations

import copy
from typing import Any

import pytest

from agent.api import from_dict, to_dict
from agent.api.approvals import MAX_DIFF, MAX_LISTED, RequestPreview
from agent.approve.policy import activation, evaluate
from agent.approve.preview import build_preview, rendered_changes
from agent.approve.request import Request

Object = dict[str, Any]


def deployment(image: str, **pod: Any) -> Object:
    return {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {
            "name": "web",
            "namespace": "shop",
            "annotations": {"fleetlet.io/revision": "7"},
        },
        "spec": {
            "template": {
                "spec": {"containers": [{"name": "main", "image": image}], **pod},
            }
        },
    }


def cluster_role(name: str, rules: list[Object]) -> Object:
    return {
        "apiVersion": "rbac.authorization.k8s.io/v1",
        "kind": "ClusterRole",
        "metadata": {"name": name},
        "rules": rules,
    }


def preview_of(before: list[Object], after: list[Object]) -> RequestPreview:
    return build_preview(rendered_changes({"b": before}, {"b": after}), source="rendered").preview


def test_actions_paths_and_diffs() -> None:
    old = deployment("web:1.0")
    new = deployment("web:2.0")
    new["metadata"]["annotations"]["fleetlet.io/revision"] = "8"  # fleetlet's own: not a change
    gone = {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": {"name": "old", "namespace": "shop"},
    }
    same = {"apiVersion": "v1", "kind": "Service", "metadata": {"name": "web", "namespace": "shop"}}
    added = {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": {"name": "new", "namespace": "shop"},
    }
    p = preview_of([old, gone, same], [new, same, added])
    assert (p.created, p.changed, p.deleted, p.unchanged) == (1, 1, 1, 1)
    by = {(o.kind, o.name): o for o in p.objects}
    web = by[("Deployment", "web")]
    assert web.action == "changed"
    assert web.paths == ("spec.template.spec.containers[0].image",)
    assert "-      - image: web:1.0\n" in web.diff and "+      - image: web:2.0\n" in web.diff
    assert "fleetlet.io/revision" not in web.diff
    assert by[("ConfigMap", "new")].action == "created"
    assert by[("ConfigMap", "old")].action == "deleted"
    assert ("Service", "web") not in by  # unchanged objects are counted, not listed


def test_secret_values_never_appear_only_whether_they_change() -> None:
    def secret(**data: str) -> Object:
        return {
            "apiVersion": "v1",
            "kind": "Secret",
            "metadata": {"name": "db", "namespace": "shop"},
            "data": data,
        }

    p = preview_of([secret(user="YWRtaW4=", password="aHVudGVyMg==")],
                   [secret(user="YWRtaW4=", password="czNjcjN0", token="bmV3")])  # fmt: skip
    (change,) = p.objects
    for value in ("YWRtaW4=", "aHVudGVyMg==", "czNjcjN0", "bmV3"):
        assert value not in change.diff
    assert "+  password: '<redacted: changed>'" in change.diff
    assert "+  token: '<redacted: changed>'" in change.diff
    assert "  user: <redacted>" in change.diff
    assert set(change.paths) == {"data.password", "data.token"}


def test_bounds_cut_diffs_and_keep_them_whole_aside() -> None:
    big = {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "big", "namespace": "s"},
           "data": {f"k{i}": "x" * 80 for i in range(200)}}  # fmt: skip
    many = [
        {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": f"c{i}", "namespace": "s"}}
        for i in range(MAX_LISTED + 20)
    ]
    result = build_preview(rendered_changes({}, {"b": [big, *many]}), source="rendered")
    p = result.preview
    assert p.created == MAX_LISTED + 21 and len(p.objects) == MAX_LISTED and p.omitted == 21
    first = p.objects[0]
    assert first.truncated and len(first.diff) <= MAX_DIFF
    whole = result.full_diffs["b: ConfigMap s/big"]
    assert len(whole) > MAX_DIFF and whole.count("x" * 80 + "\n") == 200
    assert "b: ConfigMap s/c519" in result.full_diffs  # an object not listed: its diff aside
    # The whole preview fits a request (and the API type's bounds).
    assert from_dict(RequestPreview, to_dict(p)) == p


def test_rbac_added_and_widened_with_wildcards_escalation_and_secrets() -> None:
    reader = cluster_role("reader", [{"apiGroups": [""], "resources": ["pods"], "verbs": ["get"]}])
    wider = copy.deepcopy(reader)
    wider["rules"].append({"apiGroups": [""], "resources": ["secrets"], "verbs": ["list"]})
    wider["rules"].append({"apiGroups": ["*"], "resources": ["*"], "verbs": ["escalate", "bind"]})
    p = preview_of([reader], [wider])
    (finding,) = p.security.rbac
    assert (finding.object, finding.action) == ("ClusterRole reader", "changed")
    details = set(finding.details)
    assert {"cluster-wide", "apiGroups: *", "resources: *", "escalate", "bind"} <= details
    assert "secrets: list" in details
    assert "pods: get" not in details  # it had that already: not a widening
    # The same role again is no finding; narrowing neither.
    assert preview_of([wider], [wider]).findings == 0
    assert preview_of([wider], [reader]).findings == 0


def test_bindings_crds_webhooks_namespaces_and_privileged_pods() -> None:
    binding = {
        "apiVersion": "rbac.authorization.k8s.io/v1",
        "kind": "ClusterRoleBinding",
        "metadata": {"name": "everyone-admin"},
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole",
                    "name": "cluster-admin"},
        "subjects": [{"kind": "Group", "name": "system:authenticated"}],
    }  # fmt: skip
    crd = {
        "apiVersion": "apiextensions.k8s.io/v1",
        "kind": "CustomResourceDefinition",
        "metadata": {"name": "widgets.example.com"},
        "spec": {"group": "example.com", "names": {"kind": "Widget"}, "scope": "Namespaced"},
    }
    hook = {
        "apiVersion": "admissionregistration.k8s.io/v1",
        "kind": "ValidatingWebhookConfiguration",
        "metadata": {"name": "check"},
        "webhooks": [{"name": "check.example.com", "failurePolicy": "Ignore"}],
    }
    ns = {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "shop"}}
    plain = deployment("web:1")
    privileged = deployment(
        "web:1",
        hostNetwork=True,
        volumes=[{"name": "sock", "hostPath": {"path": "/var/run/docker.sock"}}],
    )
    privileged["spec"]["template"]["spec"]["containers"][0]["securityContext"] = {
        "privileged": True,
        "capabilities": {"add": ["NET_ADMIN"]},
    }
    p = preview_of([plain], [binding, crd, hook, ns, privileged])
    (b,) = p.security.rbac
    assert {"cluster-wide", "cluster-admin", "roleRef: ClusterRole cluster-admin",
            "subject: Group system:authenticated"} <= set(b.details)  # fmt: skip
    assert p.security.crds[0].details == ("Widget (example.com, Namespaced)", "new API")
    assert p.security.webhooks[0].details == ("webhook check.example.com (failurePolicy Ignore)",)
    assert p.security.namespaces[0].object == "Namespace shop"
    (pod,) = p.security.privileged
    assert set(pod.details) == {
        "capability NET_ADMIN container main",
        "hostNetwork",
        "hostPath /var/run/docker.sock",
        "privileged container main",
    }
    assert p.findings == 5
    # A pod spec that keeps the privileges it had is no finding.
    assert preview_of([privileged], [privileged]).findings == 0


IMAGE_TAGS_ONLY = (
    "preview.created == 0 && preview.deleted == 0 && preview.refused == 0 && "
    "preview.omitted == 0 && preview.objects.all(o, o.paths.all(p, p.endsWith('.image')))"
)
NO_RISK = (
    "preview.security.rbac.size() == 0 && preview.security.crds.size() == 0 && "
    "preview.security.webhooks.size() == 0"
)


def _request(preview: RequestPreview) -> Request:
    from agent.api.approvals import (
        BundleDeploymentRequestSpec,
        BundleDeploymentRequestStatus,
        BundlePin,
    )

    digest = "sha256:" + "a" * 64
    return Request(
        name="app-s2-abcdef",
        spec=BundleDeploymentRequestSpec(
            cluster="edge-1",
            group="app",
            serial=2,
            set_digest=digest,
            requested_by="agent",
            bundles=(BundlePin(name="web", spec_digest=digest, content_digest=digest),),
            preview=preview,
        ),
        status=BundleDeploymentRequestStatus(),
        created=None,
        resource_version="1",
    )


@pytest.mark.parametrize(
    ("after", "image_only", "no_risk"),
    [
        (deployment("web:2.0"), True, True),
        (
            {
                **deployment("web:2.0"),
                "metadata": {"name": "web", "namespace": "shop", "labels": {"tier": "x"}},
            },
            False,
            True,
        ),
        (
            cluster_role("r", [{"apiGroups": [""], "resources": ["*"], "verbs": ["*"]}]),
            False,
            False,
        ),
    ],
    ids=["image-tag", "label-too", "new-clusterrole"],
)
def test_cel_rules_over_the_preview(after: Object, image_only: bool, no_risk: bool) -> None:
    request = _request(preview_of([deployment("web:1.0")], [after]))
    variables = activation(request)
    assert evaluate(IMAGE_TAGS_ONLY, variables) is image_only
    assert evaluate(NO_RISK, variables) is no_risk
    assert evaluate("request.group == 'app' && request.bundles == ['web']", variables)


def test_requests_reach_the_status_document_bounded_pending_first() -> None:
    """What the hub gets of the requests: no diffs, bounded, the pending ones first, and the
    document's wire form (canonical bytes) round-trips."""
    import dataclasses
    from datetime import UTC, datetime

    import rfc8785

    from agent.api import Condition
    from agent.api.status import ClusterStatus, dump_status, load_status, status_to_dict
    from agent.approve.summary import MAX_BYTES, reports

    many = [deployment(f"web:{i}") for i in range(40)]
    for i, obj in enumerate(many):
        obj["metadata"]["name"] = f"web-{i}"
    big = preview_of([], many)
    requests = []
    for group in range(30):
        for n, state in enumerate(("Denied", "Approved", "Approved", "Approved")):
            request = _request(big)
            spec = dataclasses.replace(request.spec, group=f"g{group}", serial=10 - n)
            status = request.status
            if state != "Pending":
                status = dataclasses.replace(
                    status,
                    decision=state,
                    decided_by="alice",
                    reason="no" if state == "Denied" else None,
                    conditions=(
                        Condition(
                            type=state,
                            status="True",
                            reason=state,
                            last_transition_time=datetime(2026, 11, 22, tzinfo=UTC),
                        ),
                    ),
                )
            requests.append(
                dataclasses.replace(
                    request, name=f"g{group}-s{10 - n}-aaaaaa", spec=spec, status=status
                )
            )
    pending = dataclasses.replace(_request(big), name="late-s1-bbbbbb")
    pending = dataclasses.replace(pending, spec=dataclasses.replace(pending.spec, group="late"))
    shown = reports([*requests, pending])
    assert shown[0].name == "late-s1-bbbbbb" and shown[0].state == "Pending"
    assert all(len(r.preview.objects) <= 20 and not any(o.diff for o in r.preview.objects)
               for r in shown)  # fmt: skip
    assert shown[0].preview.created == 40 and shown[0].preview.omitted == 20
    assert sum(len(rfc8785.dumps(to_dict(r))) for r in shown) <= MAX_BYTES
    assert all(sum(r.group == f"g{g}" for r in shown) <= 3 for g in range(30))
    document = ClusterStatus(
        schema_version=1,
        cluster="edge-1",
        agent_version="0.1.0",
        heartbeat=datetime(2026, 11, 22, 22, tzinfo=UTC),
        sequence=3,
        requests=shown,
    )
    wire = dump_status(document)
    assert wire == rfc8785.dumps(status_to_dict(document))
    assert load_status(wire, origin="t") == document


def _namespace(enforce: str | None) -> Object:
    labels = {} if enforce is None else {"pod-security.kubernetes.io/enforce": enforce}
    return {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "ops", "labels": labels}}


ESCALATIONS: list[tuple[str, list[Object], Object, str, str]] = [
    (
        "apiservice",
        [],
        {
            "apiVersion": "apiregistration.k8s.io/v1",
            "kind": "APIService",
            "metadata": {"name": "v1beta1.metrics.k8s.io"},
            "spec": {
                "group": "metrics.k8s.io",
                "version": "v1beta1",
                "service": {"namespace": "evil", "name": "api"},
                "insecureSkipTLSVerify": True,
            },
        },
        "webhooks",
        "v1beta1.metrics.k8s.io served by Service evil/api",
    ),
    (
        "token-secret",
        [],
        {
            "apiVersion": "v1",
            "kind": "Secret",
            "type": "kubernetes.io/service-account-token",
            "metadata": {
                "name": "t",
                "namespace": "kube-system",
                "annotations": {"kubernetes.io/service-account.name": "admin"},
            },
        },
        "rbac",
        "token of ServiceAccount admin",
    ),
    (
        "hostpath-pv",
        [],
        {
            "apiVersion": "v1",
            "kind": "PersistentVolume",
            "metadata": {"name": "root"},
            "spec": {
                "capacity": {"storage": "1Gi"},
                "accessModes": ["ReadWriteOnce"],
                "hostPath": {"path": "/"},
            },
        },
        "rbac",
        "hostPath /",
    ),
    (
        "namespace-relabelled-privileged",
        [_namespace("restricted")],
        _namespace("privileged"),
        "webhooks",
        "Pod Security enforce relaxed: restricted -> privileged",
    ),
    (
        "namespace-created-privileged",
        [],
        _namespace("privileged"),
        "webhooks",
        "Pod Security enforce: privileged",
    ),
    (
        "namespace-label-removed",
        [_namespace("baseline")],
        _namespace(None),
        "webhooks",
        "Pod Security enforce label removed (was baseline): the cluster's default applies",
    ),
]


@pytest.mark.parametrize(
    ("before", "after", "category", "detail"),
    [e[1:] for e in ESCALATIONS],
    ids=[e[0] for e in ESCALATIONS],
)
def test_escalations_without_rbac_are_findings_that_no_risk_rules_do_not_approve(
    before: list[Object], after: Object, category: str, detail: str
) -> None:
    """Issue 28 item 8: an APIService, a ServiceAccount token Secret, a hostPath
    PersistentVolume and a Namespace relaxed to Pod Security ``privileged`` grant as much as a
    ClusterRole: each is a finding, in a category the "no RBAC, CRDs or webhooks" rule reads,
    so that rule does not approve the move."""
    preview = preview_of(before, [after])
    (finding,) = getattr(preview.security, category)
    assert detail in finding.details
    assert evaluate(NO_RISK, activation(_request(preview))) is False


def test_harmless_neighbours_of_the_escalations_are_no_findings() -> None:
    """An opaque Secret, a PersistentVolume on NFS, a local APIService, a Namespace made
    stricter: no finding, the no-risk rule approves."""
    harmless = [
        {"apiVersion": "v1", "kind": "Secret", "type": "Opaque",
         "metadata": {"name": "s", "namespace": "a"}},
        {"apiVersion": "v1", "kind": "PersistentVolume", "metadata": {"name": "nfs"},
         "spec": {"nfs": {"server": "nas", "path": "/x"}}},
        {"apiVersion": "apiregistration.k8s.io/v1", "kind": "APIService",
         "metadata": {"name": "v1.apps"}, "spec": {"group": "apps", "version": "v1"}},
        _namespace("restricted"),
    ]  # fmt: skip
    preview = preview_of([_namespace("baseline")], harmless)
    assert preview.findings == 0, preview.security
    assert evaluate(NO_RISK, activation(_request(preview))) is True
