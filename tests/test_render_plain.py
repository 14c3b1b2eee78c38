"""The ``plain`` format: order, target namespace, ownership, the format registry and plugins,
``fleetlet render``'s handler, and scope from a real API server's discovery."""

from __future__ import annotations

import os
import sys
import textwrap
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from kubernetes import client as k8s_client

from agent.kube import KubeClient
from agent.render import formats
from agent.render.command import BundleDirError, RenderOptions, run_render
from agent.render.formats import UnknownFormatError, render_bundle
from agent.render.manifests import InvalidManifestError
from agent.render.plain import (
    BUNDLE_LABEL,
    GROUP_LABEL,
    REVISION_ANNOTATION,
    Ownership,
    RenderRequest,
    manifest_files,
)
from agent.render.scope import builtin_scope, mapping_scope
from tests.realenv.kube import Cluster

SCOPE = mapping_scope(
    {"Namespace": False, "ConfigMap": True, "ClusterRole": False, "apps/Deployment": True}
)


def _obj(kind: str, name: str, api_version: str = "v1", **meta: object) -> str:
    return yaml.safe_dump(
        {"apiVersion": api_version, "kind": kind, "metadata": {"name": name, **meta}}
    )


def _write(root: Path, files: dict[str, str]) -> Path:
    for name, text in files.items():
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_text(text)
    return root


def test_files_are_ordered_by_numeric_prefix_then_path(tmp_path: Path) -> None:
    names = [
        "z.yaml",
        "10_late.yaml",
        "9_early.yml",
        "01_namespace.yaml",
        "a.json",
        "02_dir/b.yaml",
        "02_dir/01_a.yaml",
        "sub/x.yaml",
        "README.md",
        ".hidden.yaml",
        ".git/config.yaml",
    ]
    _write(tmp_path, {n: _obj("ConfigMap", "x") for n in names})

    order = manifest_files(tmp_path, source="t", limits=RenderRequest().limits)

    assert order == [
        "01_namespace.yaml",
        "02_dir/01_a.yaml",
        "02_dir/b.yaml",
        "9_early.yml",
        "10_late.yaml",
        "a.json",
        "sub/x.yaml",
        "z.yaml",
    ]


def test_namespace_ownership_and_document_order(tmp_path: Path) -> None:
    _write(
        tmp_path,
        {
            "01_namespace.yaml": _obj("Namespace", "team"),
            "02_objects.yaml": "---\n".join(
                [
                    _obj("ConfigMap", "defaulted", labels={"app": "web"}),
                    _obj("ConfigMap", "explicit", namespace="elsewhere"),
                    _obj("ClusterRole", "reader", api_version="rbac.authorization.k8s.io/v1"),
                    _obj("Deployment", "web", api_version="apps/v1"),
                    _obj("Mystery", "m", api_version="example.com/v1"),
                ]
            ),
        },
    )
    request = RenderRequest(
        source="bundle web",
        namespace="team",
        scope=SCOPE,
        ownership=Ownership(bundle="web", group="frontend", revision="7/sha256:abc"),
    )

    objects = render_bundle(tmp_path, format="plain", request=request)

    assert [
        (o["kind"], o["metadata"]["name"], o["metadata"].get("namespace")) for o in objects
    ] == [
        ("Namespace", "team", None),
        ("ConfigMap", "defaulted", "team"),
        ("ConfigMap", "explicit", "elsewhere"),
        ("ClusterRole", "reader", None),
        ("Deployment", "web", "team"),
        ("Mystery", "m", None),  # unknown kind: left as written
    ]
    for obj in objects:
        assert obj["metadata"]["labels"][BUNDLE_LABEL] == "web"
        assert obj["metadata"]["labels"][GROUP_LABEL] == "frontend"
        assert obj["metadata"]["annotations"][REVISION_ANNOTATION] == "7/sha256:abc"
    assert objects[1]["metadata"]["labels"]["app"] == "web"


def test_kinds_defined_by_the_bundles_own_crds(tmp_path: Path) -> None:
    def crd(kind: str, scope: str) -> str:
        return yaml.safe_dump(
            {
                "apiVersion": "apiextensions.k8s.io/v1",
                "kind": "CustomResourceDefinition",
                "metadata": {"name": f"{kind.lower()}s.example.com"},
                "spec": {
                    "group": "example.com",
                    "scope": scope,
                    "names": {"kind": kind, "plural": f"{kind.lower()}s"},
                    "versions": [{"name": "v1", "served": True, "storage": True}],
                },
            }
        )

    _write(
        tmp_path,
        {
            "01_crds.yaml": crd("Widget", "Namespaced") + "---\n" + crd("Gadget", "Cluster"),
            "02_crs.yaml": _obj("Widget", "w", "example.com/v1")
            + "---\n"
            + _obj("Gadget", "g", "example.com/v1"),
        },
    )
    objects = render_bundle(
        tmp_path, format="plain", request=RenderRequest(namespace="ns", scope=builtin_scope)
    )
    assert {o["kind"]: o["metadata"].get("namespace") for o in objects} == {
        "CustomResourceDefinition": None,
        "Widget": "ns",
        "Gadget": None,
    }


def test_duplicate_object_is_refused(tmp_path: Path) -> None:
    _write(tmp_path, {"a.yaml": _obj("ConfigMap", "same"), "b/c.yaml": _obj("ConfigMap", "same")})
    with pytest.raises(InvalidManifestError) as refused:
        render_bundle(
            tmp_path, format="plain", request=RenderRequest(source="b", namespace="ns", scope=SCOPE)
        )
    assert refused.value.rule == "DuplicateObject"
    assert "ConfigMap same appears twice: in a.yaml and in b/c.yaml" in str(refused.value)


def test_symlinks_inside_are_followed_outside_refused(tmp_path: Path) -> None:
    # Hidden directories are not walked: the link is the only way to the file.
    bundle = _write(tmp_path / "bundle", {".shared/cm.yaml": _obj("ConfigMap", "a")})
    os.symlink(".shared/cm.yaml", bundle / "02_link.yaml")
    objects = render_bundle(bundle, format="plain", request=RenderRequest(scope=SCOPE))
    assert [o["metadata"]["name"] for o in objects] == ["a"]

    (tmp_path / "secret.yaml").write_text(_obj("Secret", "stolen"))
    os.symlink("../secret.yaml", bundle / "03_escape.yaml")
    with pytest.raises(InvalidManifestError) as refused:
        render_bundle(bundle, format="plain", request=RenderRequest(scope=SCOPE))
    assert refused.value.rule == "SymlinkEscapes"
    assert refused.value.file == "03_escape.yaml"


@pytest.mark.parametrize(
    ("name", "target"),
    [
        (".x", "/etc"),  # a hidden symlinked directory: not walked, judged all the same
        (".cache/x", "../../.."),  # a link in a hidden directory
        ("x", "sub/../../bundle/01_cm.yaml"),  # out and back in by the tree's own name
    ],
)
def test_every_link_is_judged_hidden_or_not_and_none_may_climb_out(
    tmp_path: Path, name: str, target: str
) -> None:
    # Other formats' tools (kustomize, helm) read what the plain format skips.
    bundle = _write(tmp_path / "bundle", {"01_cm.yaml": _obj("ConfigMap", "a")})
    (bundle / "sub").mkdir()
    (bundle / name).parent.mkdir(parents=True, exist_ok=True)
    os.symlink(target, bundle / name)
    with pytest.raises(InvalidManifestError) as refused:
        render_bundle(bundle, format="plain", request=RenderRequest(scope=SCOPE))
    assert refused.value.rule == "SymlinkEscapes"
    assert refused.value.file == name


def test_a_dangling_or_looping_manifest_link_is_a_refusal(tmp_path: Path) -> None:
    bundle = _write(tmp_path / "bundle", {"01_cm.yaml": _obj("ConfigMap", "a")})
    os.symlink("missing.yaml", bundle / "02_dangling.yaml")
    with pytest.raises(InvalidManifestError) as refused:
        render_bundle(bundle, format="plain", request=RenderRequest(scope=SCOPE))
    assert (refused.value.rule, refused.value.file) == ("UnreadableFile", "02_dangling.yaml")


def test_unknown_format_names_the_available_ones(tmp_path: Path) -> None:
    with pytest.raises(UnknownFormatError) as unknown:
        render_bundle(tmp_path, format="nope", request=RenderRequest())
    assert "plain" in str(unknown.value)


@pytest.fixture
def plugin_on_path(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """Install a format plugin the way pip would: a module plus dist-info with entry points
    (found here through sys.path, by the plugin's child process through PYTHONPATH)."""
    site = tmp_path / "site"
    (site / "fleetlet_test_plugin-1.0.dist-info").mkdir(parents=True)
    (site / "fleetlet_test_plugin-1.0.dist-info" / "METADATA").write_text(
        "Metadata-Version: 2.1\nName: fleetlet-test-plugin\nVersion: 1.0\n"
    )
    (site / "fleetlet_test_plugin-1.0.dist-info" / "entry_points.txt").write_text(
        "[fleetlet.formats]\nechoformat = fleetlet_test_plugin:EchoFormat\n"
    )
    (site / "fleetlet_test_plugin.py").write_text(
        textwrap.dedent("""
        class EchoFormat:
            name = "echoformat"

            def render(self, tree, request):
                return [{"apiVersion": "v1", "kind": "ConfigMap",
                         "metadata": {"name": request.options["name"]}}]
    """)
    )
    sys.path.insert(0, str(site))
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([str(site), os.environ.get("PYTHONPATH", "")]))
    formats._plugins.cache_clear()
    yield
    sys.path.remove(str(site))
    sys.modules.pop("fleetlet_test_plugin", None)
    formats._LOADED.pop("echoformat", None)
    formats._plugins.cache_clear()


@pytest.mark.usefixtures("plugin_on_path")
def test_plugin_format_from_an_entry_point_is_finished_like_plain(tmp_path: Path) -> None:
    request = RenderRequest(
        namespace="ns",
        scope=SCOPE,
        options={"name": "from-plugin"},
        ownership=Ownership(bundle="b", group="g", revision="1"),
    )

    # The bundle's tree apart from the plugin's installation: a plugin inside the tree being
    # rendered is never imported (the tree is hostile; see test_render_plugins).
    tree = tmp_path / "tree"
    tree.mkdir()
    objects = render_bundle(tree, format="echoformat", request=request)

    assert "echoformat" in formats.available_formats()
    assert objects == [
        {
            "apiVersion": "v1",
            "kind": "ConfigMap",
            "metadata": {
                "name": "from-plugin",
                "namespace": "ns",
                "labels": {BUNDLE_LABEL: "b", GROUP_LABEL: "g"},
                "annotations": {REVISION_ANNOTATION: "1"},
            },
        }
    ]


def test_run_render_prints_the_rendered_stream(tmp_path: Path) -> None:
    _write(
        tmp_path,
        {
            "02_app/deploy.yaml": _obj("Deployment", "web", "apps/v1"),
            "01_namespace.yaml": _obj("Namespace", "team"),
        },
    )

    out = run_render(
        bundle_dir=str(tmp_path), options=RenderOptions(format="plain", namespace="team")
    )

    docs = list(yaml.safe_load_all(out))
    assert [(d["kind"], d["metadata"].get("namespace")) for d in docs] == [
        ("Namespace", None),
        ("Deployment", "team"),
    ]
    with pytest.raises(BundleDirError):
        run_render(bundle_dir=str(tmp_path / "missing"), options=RenderOptions())


def test_scope_from_a_real_api_servers_discovery(kube_cluster: Cluster, tmp_path: Path) -> None:
    kind = f"Widget{uuid.uuid4().hex[:8]}"
    plural = kind.lower() + "s"
    crd: dict[str, Any] = {
        "apiVersion": "apiextensions.k8s.io/v1",
        "kind": "CustomResourceDefinition",
        "metadata": {"name": f"{plural}.render.fleetlet.test"},
        "spec": {
            "group": "render.fleetlet.test",
            "scope": "Namespaced",
            "names": {"kind": kind, "plural": plural},
            "versions": [
                {
                    "name": "v1",
                    "served": True,
                    "storage": True,
                    "schema": {"openAPIV3Schema": {"type": "object"}},
                }
            ],
        },
    }
    with KubeClient(
        kubeconfig=str(kube_cluster.kubeconfig), discovery_cache_dir=tmp_path / "discovery"
    ) as kube:
        scope = kube.scope
        assert scope("v1", "ConfigMap") is True
        assert scope("apps/v1", "Deployment") is True
        assert scope("v1", "Namespace") is False
        assert scope("rbac.authorization.k8s.io/v1", "ClusterRole") is False
        assert scope("render.fleetlet.test/v1", kind) is None
        # The built-in table derived from the client agrees with the server on these.
        for api_version, builtin in [
            ("v1", "ConfigMap"),
            ("v1", "Namespace"),
            ("storage.k8s.io/v1", "StorageClass"),
        ]:
            assert builtin_scope(api_version, builtin) == scope(api_version, builtin)

        with kube_cluster.api_client() as api:
            extensions = k8s_client.ApiextensionsV1Api(api)
            extensions.create_custom_resource_definition(body=crd)  # type: ignore[arg-type]
            try:
                # A kind that appears later (a CRD applied by an earlier group) is discovered.
                for _ in range(100):
                    if scope("render.fleetlet.test/v1", kind) is not None:
                        break
                    time.sleep(0.1)
                assert scope("render.fleetlet.test/v1", kind) is True
            finally:
                extensions.delete_custom_resource_definition(crd["metadata"]["name"])
