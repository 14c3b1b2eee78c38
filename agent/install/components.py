"""The kustomize components of ``deploy/agent/`` for ``agent install --self-upgrade``.

A kustomize (or Flux) user gets what ``--self-upgrade=off`` or ``no-new-rules`` installs by
adding ``deploy/agent/self-upgrade-off`` (or ``self-upgrade-no-new-rules``) to the
``components:`` of an overlay of ``deploy/agent``: strategic-merge patches that give the
ClusterRole and Role ``fleetlet-agent`` the setting's rules (an RBAC rule list has no merge key:
the patch's list replaces the base's), set ``FLEETLET_SELF_UPGRADE`` in the agent's pod, and,
for ``off``, delete the candidate Deployment. Written with the base
(:func:`agent.install.manifests.base_files`) from the same objects ``agent install`` applies,
so a test can build them with kustomize and compare.
"""

from __future__ import annotations

import textwrap
from typing import Any

from agent.install.manifests import NAME, Object, rbac_objects
from agent.install.names import DEFAULT_NAMESPACE
from agent.upgrade.deployment import CANDIDATE
from agent.upgrade.rights import ENV_SELF_UPGRADE, HELP, SelfUpgrade

COMPONENT = "deploy/agent/self-upgrade-{mode}"


def self_upgrade_patches(mode: SelfUpgrade, namespace: str = DEFAULT_NAMESPACE) -> list[Object]:
    """The strategic-merge patches that turn the base (``on``) into ``mode``'s objects."""
    own = [
        o
        for o in rbac_objects(namespace, mode)
        if o["kind"] in ("ClusterRole", "Role") and o["metadata"]["name"] == NAME
    ]
    patches: list[Object] = [
        {
            "apiVersion": o["apiVersion"],
            "kind": o["kind"],
            "metadata": {k: v for k, v in o["metadata"].items() if k in ("name", "namespace")},
            "rules": o["rules"],
        }
        for o in own
    ]
    names = [NAME] if mode is SelfUpgrade.OFF else [NAME, CANDIDATE]
    for name in names:
        env: dict[str, Any] = {"name": ENV_SELF_UPGRADE, "value": mode.value}
        template = {"spec": {"containers": [{"name": "agent", "env": [env]}]}}
        patches.append(_deployment_patch(name, namespace, {"template": template}))
    if mode is SelfUpgrade.OFF:
        patches.append({**_deployment_patch(CANDIDATE, namespace, None), "$patch": "delete"})
    return patches


def _deployment_patch(name: str, namespace: str, spec: dict[str, Any] | None) -> Object:
    patch: Object = {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {"name": name, "namespace": namespace},
    }
    if spec is not None:
        patch["spec"] = spec
    return patch


def component_files(dump: Any, header: str) -> dict[str, bytes]:
    """``{path: content}`` of each component (``dump``: canonical YAML of one object)."""
    files: dict[str, bytes] = {}
    for mode in (SelfUpgrade.NO_NEW_RULES, SelfUpgrade.OFF):
        directory = COMPONENT.format(mode=mode.value)
        patches = self_upgrade_patches(mode)
        names = [_file_name(p) for p in patches]
        for name, patch in zip(names, patches, strict=True):
            files[f"{directory}/{name}"] = header.encode() + dump(patch)
        said = (
            f"`agent install --self-upgrade={mode.value}` as a kustomize component: {HELP[mode]}."
        )
        note = (
            "\n".join(textwrap.wrap(said, 94))
            + "\nAdd it to an overlay of deploy/agent (docs/operations.md):\n"
            f"  resources: [../fleetlet/deploy/agent]\n"
            f"  components: [../fleetlet/deploy/agent/self-upgrade-{mode.value}]"
        )
        comment = "".join(f"# {line}\n" for line in note.splitlines())
        kustomization = {
            "apiVersion": "kustomize.config.k8s.io/v1alpha1",
            "kind": "Component",
            "patches": [{"path": name} for name in names],
        }
        files[f"{directory}/kustomization.yaml"] = (header + comment).encode() + dump(kustomization)
    return files


def _file_name(patch: Object) -> str:
    kind = str(patch["kind"]).lower()
    suffix = "-delete" if patch.get("$patch") == "delete" else ""
    return f"{kind}-{patch['metadata']['name']}{suffix}.yaml"


__all__ = ["COMPONENT", "component_files", "self_upgrade_patches"]
