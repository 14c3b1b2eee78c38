"""SOPS files rendered by every format, through the render cache as the agent renders them:
a Secret manifest of a plain tree, a helm values file (real helm), a Secret manifest kustomize
lists as a resource and a file its generator reads (real kustomize). With the cluster's key the
output holds the plaintext, and the cache directory does not; without one (the hub's preview)
the values stay encrypted.
"""

from __future__ import annotations

import base64
import os
from pathlib import Path

import pytest

from agent.api import to_dict
from agent.render.cache import RenderCache, tree_digest
from agent.render.manifests import Manifest
from agent.render.plain import RenderRequest
from agent.render.tools import ToolSettings
from agent.secrets.keys import Keyring
from agent.secrets.sops import SopsError
from tests.realenv.helm import copy_chart, helm_binary
from tests.test_secrets_sops import PASSWORD, SECRET, encrypt, make_key


def _render(
    tree: Path, format: str, keyring: Keyring | None, cache: RenderCache, **options: object
) -> list[Manifest]:
    request = RenderRequest(
        source="shop",
        namespace="shop",
        options=options,
        tools=ToolSettings.from_env(),
        keyring=keyring,
    )
    return cache.render(
        format=format, content=tree_digest(tree), request=request, tree=lambda: tree
    )


def _copy(tree: Path, to: Path) -> Path:
    """A fresh copy of the tree for each render (the agent composes one per render)."""
    import shutil

    shutil.copytree(tree, to)
    return to


def _no_plaintext_under(root: Path) -> None:
    for directory, _dirs, files in os.walk(root):
        for name in files:
            data = (Path(directory) / name).read_bytes()
            assert PASSWORD.encode() not in data, name


def test_a_helm_values_file_encrypted_with_sops_renders_decrypted_in_the_agent_only(
    sops_binary: Path, tmp_path: Path
) -> None:
    helm_binary()
    keyring, _ = make_key(tmp_path, "edge-1")
    source = tmp_path / "source"
    source.mkdir()
    copy_chart("greeter", source)
    encrypt(sops_binary, source / "greeter", "values-secret.yaml", f"audience: {PASSWORD}\n",
            "--age", keyring.current)  # fmt: skip
    options = {"valuesFiles": ["greeter/values-secret.yaml"]}

    hub = RenderCache(directory=tmp_path / "hub-renders")
    previewed = _render(_copy(source, tmp_path / "t1"), "helm", None, hub, **options)
    message = next(o for o in previewed if o["kind"] == "ConfigMap")["data"]["message"]
    assert "ENC[AES256_GCM," in message and PASSWORD not in message

    agent = RenderCache(directory=tmp_path / "agent-renders")
    rendered = _render(_copy(source, tmp_path / "t2"), "helm", keyring, agent, **options)
    message = next(o for o in rendered if o["kind"] == "ConfigMap")["data"]["message"]
    assert message == f"hello, {PASSWORD}!"
    _no_plaintext_under(tmp_path / "agent-renders")
    # Kept in memory: the next reconcile renders nothing.
    again = _render(_copy(source, tmp_path / "t3"), "helm", keyring, agent, **options)
    assert again == rendered and agent.hits == 1
    # A restarted agent finds nothing on disk, and renders again.
    restarted = RenderCache(directory=tmp_path / "agent-renders")
    assert _render(_copy(source, tmp_path / "t4"), "helm", keyring, restarted, **options) == (
        rendered
    )
    assert restarted.hits == 0


def test_kustomize_reads_a_sops_secret_resource_and_generator_files_decrypted(
    sops_binary: Path, tmp_path: Path
) -> None:
    keyring, _ = make_key(tmp_path, "edge-1")
    tree = tmp_path / "tree"
    tree.mkdir()
    encrypt(sops_binary, tree, "secret.yaml", SECRET, "--age", keyring.current,
            "--encrypted-regex", "^(data|stringData)$")  # fmt: skip
    encrypt(sops_binary, tree, "app.json", f'{{"dsn": "postgres://app:{PASSWORD}@db"}}',
            "--age", keyring.current)  # fmt: skip
    encrypt(sops_binary, tree, "db.env", f"DB_PASSWORD={PASSWORD}\nDB_USER=app\n",
            "--age", keyring.current)  # fmt: skip
    (tree / "kustomization.yaml").write_text(
        "resources: [secret.yaml]\n"
        "secretGenerator:\n"
        "  - name: app\n"
        "    files: [app.json]\n"
        "  - name: env\n"
        "    envs: [db.env]\n"
        "generatorOptions: {disableNameSuffixHash: true}\n"
    )
    objects = _render(tree, "kustomize", keyring, RenderCache())
    secrets = {o["metadata"]["name"]: o for o in objects if o["kind"] == "Secret"}
    assert secrets["db"]["stringData"]["password"] == PASSWORD and "sops" not in secrets["db"]
    generated = base64.b64decode(secrets["app"]["data"]["app.json"]).decode()
    assert PASSWORD in generated and "sops" not in generated
    env = {k: base64.b64decode(v).decode() for k, v in secrets["env"]["data"].items()}
    assert env == {"DB_PASSWORD": PASSWORD, "DB_USER": "app"}


def test_a_plain_secret_for_another_cluster_fails_the_render_naming_the_file(
    sops_binary: Path, tmp_path: Path
) -> None:
    theirs, _ = make_key(tmp_path, "edge-1")
    mine, _ = make_key(tmp_path, "edge-3")
    tree = tmp_path / "tree"
    tree.mkdir()
    encrypt(sops_binary, tree, "secret.yaml", SECRET, "--age", theirs.current)
    with pytest.raises(SopsError) as caught:
        _render(tree, "plain", mine, RenderCache(directory=tmp_path / "renders"))
    assert caught.value.rule == "NotARecipient"
    assert str(caught.value).startswith("shop: secret.yaml: not encrypted to this cluster")
    assert list((tmp_path / "renders").glob("*")) == []  # failures are not cached


# --- a bundle's encrypted values from the fleet repo ------------------------------------------


def test_encrypted_values_travel_whole_from_the_fleet_repo_and_open_only_in_the_agent(
    sops_binary: Path, tmp_path: Path
) -> None:
    from hub.errors import FleetRepoError
    from hub.fleet.load import load_fleet
    from hub.fleet.render import plan_clusters
    from hub.publish import flow
    from tests.test_hub_fleet import CLUSTERS, image_bundle, write_fleet

    eu, _ = make_key(tmp_path, "eu")
    us, _ = make_key(tmp_path, "us")
    bundle = image_bundle(
        "greeter",
        format="helm",
        formatOptions={"values": {"greeting": "hi", "audience": "inline"}},
        encryptedValues="secrets/greeter.yaml",
        overrides=[{"clusterSelector": {"matchLabels": {"region": "us"}},
                    "encryptedValues": "secrets/greeter-us.yaml"}],
    )  # fmt: skip
    root = write_fleet(tmp_path / "fleet", clusters=CLUSTERS, bundles=[bundle])
    (root / "secrets").mkdir()
    encrypt(sops_binary, root / "secrets", "greeter.yaml", f"audience: {PASSWORD}\n",
            "--age", eu.current)  # fmt: skip
    encrypt(sops_binary, root / "secrets", "greeter-us.yaml", "audience: us-only\n",
            "--age", us.current)  # fmt: skip
    fleet = load_fleet(root)
    plans = plan_clusters(fleet, {s: s.ref for s in fleet.bundles[0].all_sources})
    eu_spec = plans["eu-edge-1"].entries[0].spec
    us_spec = plans["us-edge-1"].entries[0].spec
    assert eu_spec.format_options.encrypted_values is not None
    assert PASSWORD not in str(eu_spec) and "ENC[AES256_GCM," in str(eu_spec)
    assert us_spec.format_options.encrypted_values != eu_spec.format_options.encrypted_values
    # hub diff: opaque.
    # (``entry_fields`` on main since the entry diff became public; ``_entry_fields`` before)
    fields_of = getattr(flow, "entry_fields", None) or flow._entry_fields
    fields = fields_of(plans["eu-edge-1"].entries[0], plans["us-edge-1"].entries[0])
    assert ("formatOptions.encryptedValues", "encrypted", "encrypted, changed") in fields

    helm_binary()
    source = tmp_path / "source"
    source.mkdir()
    copy_chart("greeter", source)

    def message(keyring: Keyring | None) -> str:
        request = RenderRequest(
            source="greeter",
            namespace="shop",
            options=dict(to_dict(eu_spec.format_options)),
            tools=ToolSettings.from_env(),
            keyring=keyring,
        )
        objects = RenderCache(directory=tmp_path / "renders").render(
            format="helm", content="x", request=request, tree=lambda: source
        )
        return str(next(o for o in objects if o["kind"] == "ConfigMap")["data"]["message"])

    assert message(eu) == f"hi, {PASSWORD}!"  # over the inline values
    _no_plaintext_under(tmp_path / "renders")
    assert "ENC[AES256_GCM," in message(None)  # the hub's preview
    with pytest.raises(SopsError) as caught:
        message(us)
    assert caught.value.rule == "NotARecipient"
    assert "formatOptions.encryptedValues" in str(caught.value)

    (root / "secrets" / "greeter.yaml").write_text(f"audience: {PASSWORD}\n")
    with pytest.raises(FleetRepoError) as refused:
        load_fleet(root)
    assert "bundles/greeter.yaml: encryptedValues" in str(refused.value)
    assert "encrypted with sops" in str(refused.value)


def test_fleetlet_render_shows_the_values_encrypted_and_says_how_many(
    sops_binary: Path, tmp_path: Path
) -> None:
    from agent.render.command import RenderOptions, run_render

    keyring, _ = make_key(tmp_path, "edge-1")
    tree = tmp_path / "tree"
    tree.mkdir()
    encrypt(sops_binary, tree, "secret.yaml", SECRET, "--age", keyring.current,
            "--encrypted-regex", "^(data|stringData)$")  # fmt: skip
    notes: list[str] = []
    out = run_render(bundle_dir=str(tree), options=RenderOptions(), note=notes.append)
    assert PASSWORD not in out and "ENC[AES256_GCM," in out
    assert any("3 values in 1 SOPS files stay encrypted here (secret.yaml (3))" in n for n in notes)
