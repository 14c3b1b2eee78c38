"""Secrets end to end: a Secret encrypted with the real ``sops`` binary to two clusters' age
recipients, published by the hub, applied decrypted by those two clusters' agents on real
control planes; a third cluster, not a recipient, fails that group alone (the reason names the
file and the recipients) and keeps running the rest; the plaintext is nowhere outside the
clusters' API servers (every object of every branch of the fleet and status repositories, the
hub's cache, the agents' work directories with their render cache, the logs, the
BundleDeployments and Events).

Each agent makes its cluster's key pair itself (a Secret of its namespace) and reports the
public half with its status; ``fleetlet hub recipients --selector region=eu`` prints what the
operator passes to ``sops --age``. Key rotation is asked on the Secret and done by the agent.
"""

from __future__ import annotations

import base64
import logging
import os
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pygit2
import pytest
import yaml

from agent.kube import KubeClient
from agent.secrets.keys import (
    KEY_FILE,
    KEY_SECRET,
    RETIRE_ANNOTATION,
    ROTATE_ANNOTATION,
    ClusterKeys,
    parse_identities,
)
from tests.fleetlab import REPO_ROOT, Lab, conditions, configmap, live, namespace_manifest
from tests.realenv.kube import Cluster
from tests.test_crds import crds as crds  # the fixture: the CRDs on the first cluster
from tests.test_rollout_e2e import stores as stores  # the three clusters, CRDs on each
from tests.test_secrets_sops import SECRET, sops

PASSWORD = "pa55-Zebra-7781"  # what tests.test_secrets_sops.SECRET holds
TOKEN = "tok-42"  # its base64 `data.token`


API_KEY = "k3y-Marmot-5120"
GREET_SECRET = """\
apiVersion: v1
kind: Secret
metadata:
  name: greet
stringData:
  password: {{ .Values.password | quote }}
  apiKey: {{ .Values.apiKey | quote }}
"""


def _publish(lab: Lab, fleet: Path) -> None:
    """``hub publish`` of the fleet directory, as :meth:`Lab.publish` does."""
    from hub.publish.flow import prepare, publish
    from hub.publish.git import BranchStore
    from hub.publish.sign import PublicationSigner

    signer = PublicationSigner.from_trust_config(
        trust_config=lab.sigstore.trust_config_path, token=lab.sigstore.mint_token()
    )
    with BranchStore(url=lab.url, cache_dir=lab.tmp / "hub-cache") as store:
        publish(prepare(fleet), store, signer=signer)


def _needles() -> list[bytes]:
    return [
        API_KEY.encode(),
        base64.b64encode(API_KEY.encode()),
        PASSWORD.encode(),
        base64.b64encode(PASSWORD.encode()),
        TOKEN.encode(),
        base64.b64encode(TOKEN.encode()),
        PASSWORD.encode("utf-16-le"),
    ]


def _files_with_plaintext(root: Path) -> list[str]:
    found = []
    for directory, _dirs, files in os.walk(root):
        for name in files:
            path = Path(directory) / name
            if path.is_symlink() or not path.is_file():
                continue
            data = path.read_bytes()
            if any(n in data for n in _needles()):
                found.append(str(path))
    return found


def _blobs_with_plaintext(repo_path: Path) -> tuple[int, list[str]]:
    repo = pygit2.Repository(str(repo_path))
    found, objects = [], 0
    for oid in repo.odb:
        data = repo.odb.read(oid)[1]
        objects += 1
        if any(n in data for n in _needles()):
            found.append(str(oid))
    return objects, found


def _recipients(fleet: Path, lab: Lab, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "fleetlet", "hub", "recipients", str(fleet),
         "--status-repo", lab.status_url, *args],
        capture_output=True, text=True, timeout=120, cwd=REPO_ROOT,
    )  # fmt: skip


def test_a_sops_secret_reaches_its_two_recipients_only_and_its_plaintext_nothing_else(
    lab: Lab,
    stores: dict[str, Cluster],
    tmp_path: Path,
    sops_binary: Path,
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.DEBUG)
    lab.clusters = [
        {"name": "edge-1", "labels": {"region": "eu"}},
        {"name": "edge-2", "labels": {"region": "eu"}},
        {"name": "edge-3", "labels": {"region": "us"}},
    ]
    names = sorted(stores)
    agent_ns = f"fleetlet-{uuid.uuid4().hex[:6]}"
    kubes = {n: KubeClient(kubeconfig=str(c.kubeconfig)) for n, c in stores.items()}
    for kube in kubes.values():
        kube.apply(
            {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": agent_ns}},
            field_manager="fleetlet-tests",
        )
    agents = {
        n: lab.agent(n, stores[n], namespace=agent_ns, workdir=tmp_path / "agents" / n)
        for n in names
    }
    web_ns, shop_ns = lab.name("web"), lab.name("shop")
    web, creds, greet = lab.name("web"), lab.name("creds"), lab.name("greet")
    greet_ns = lab.name("greet")
    digest = lab.push(
        "web",
        {"01.yaml": namespace_manifest(web_ns), "02.yaml": configmap("c", web_ns, {"v": "1"})},
        tag="one",
    )
    web_bundle = {"name": web, "sources": [lab.source("web", digest)]}

    # A first publication without secrets: each agent makes its key pair and reports it.
    lab.publish([web_bundle])
    fleet = lab.fleet_dir([web_bundle])
    deadline = time.monotonic() + 120
    while True:
        for name in names:
            agents[name].tick()
        listed = _recipients(fleet, lab, "--selector", "region=eu")
        if listed.returncode == 0:
            break
        assert time.monotonic() < deadline, listed.stderr
        time.sleep(1)
    keys = {}
    for name in names:
        secret = live(kubes[name], "v1", "Secret", KEY_SECRET, agent_ns)
        assert secret is not None, f"{name}: no key Secret"
        text = base64.b64decode(secret["data"][KEY_FILE]).decode()
        keys[name] = parse_identities(text, origin=name)
    recipients = listed.stdout.strip()
    assert recipients == f"{keys['edge-1'].current},{keys['edge-2'].current}"
    table = _recipients(fleet, lab, "-o", "table")
    assert table.returncode == 0, table.stderr
    for name in names:
        assert f"{name}" in table.stdout and keys[name].current in table.stdout
    assert _recipients(fleet, lab, "--selector", "region in (eu").returncode != 0

    # The operator encrypts with the real sops to what `hub recipients` printed.
    work = tmp_path / "operator"
    work.mkdir()
    (work / "secret.yaml").write_text(SECRET.replace("namespace: shop", f"namespace: {shop_ns}"))
    encrypted = sops(
        sops_binary, "--encrypt", "--age", recipients, "--encrypted-regex",
        "^(data|stringData)$", "secret.yaml", cwd=work,
    )  # fmt: skip
    assert PASSWORD not in encrypted and TOKEN not in encrypted
    creds_digest = lab.push(
        "creds",
        {"01_ns.yaml": namespace_manifest(shop_ns), "02_secret.yaml": encrypted},
        tag="one",
    )
    creds_bundle = {"name": creds, "sources": [lab.source("creds", creds_digest)]}

    # A chart with an encrypted values file, and the bundle's encrypted values in the fleet repo.
    (work / "values-secret.yaml").write_text(f"apiKey: {API_KEY}\n")
    (work / "greet.yaml").write_text(f"password: {PASSWORD}\n")
    chart_values, fleet_values = (
        sops(sops_binary, "--encrypt", "--age", recipients, name, cwd=work)
        for name in ("values-secret.yaml", "greet.yaml")
    )
    greet_digest = lab.push(
        "greet",
        {
            "Chart.yaml": "apiVersion: v2\nname: greet\nversion: 0.1.0\n",
            "values.yaml": "password: none\napiKey: none\n",
            "values-secret.yaml": chart_values,
            "templates/secret.yaml": GREET_SECRET,
        },
        tag="one",
    )
    greet_bundle = {
        "name": greet,
        "sources": [lab.source("greet", greet_digest)],
        "format": "helm",
        "formatOptions": {"targetNamespace": greet_ns, "valuesFiles": ["values-secret.yaml"]},
        "createNamespace": True,
        "encryptedValues": "secrets/greet.yaml",
    }
    fleet = lab.fleet_dir([web_bundle, creds_bundle, greet_bundle])
    (fleet / "secrets").mkdir()
    (fleet / "secrets" / "greet.yaml").write_text(fleet_values)
    _publish(lab, fleet)
    for name in names:
        agents[name].tick()

    for name in ("edge-1", "edge-2"):
        secret = live(kubes[name], "v1", "Secret", "db", shop_ns)
        assert secret is not None, f"{name}: the Secret was not applied"
        assert base64.b64decode(secret["data"]["password"]).decode() == PASSWORD
        assert base64.b64decode(secret["data"]["token"]).decode() == TOKEN
        assert "sops" not in secret
        assert conditions(kubes[name], creds)["Ready"]["status"] == "True"
        rendered = live(kubes[name], "v1", "Secret", "greet", greet_ns)
        assert rendered is not None, f"{name}: the chart's Secret was not applied"
        data = {k: base64.b64decode(v).decode() for k, v in rendered["data"].items()}
        assert data == {"password": PASSWORD, "apiKey": API_KEY}

    # edge-3 is no recipient: that group fails with the file and the recipients named,
    # nothing of it is applied, the other group keeps running.
    failed = conditions(kubes["edge-3"], creds)["Ready"]
    assert failed["status"] == "False" and failed["reason"] == "RenderFailed", failed
    for expected in ("02_secret.yaml", "not encrypted to this cluster", keys["edge-3"].current):
        assert expected in failed["message"], failed["message"]
    assert keys["edge-1"].current in failed["message"]
    assert live(kubes["edge-3"], "v1", "Secret", "db", shop_ns) is None
    assert live(kubes["edge-3"], "v1", "Namespace", shop_ns) is None
    failed = conditions(kubes["edge-3"], greet)["Ready"]
    assert failed["reason"] == "RenderFailed", failed
    assert "values-secret.yaml: not encrypted to this cluster" in failed["message"], failed
    assert live(kubes["edge-3"], "v1", "Namespace", greet_ns) is None
    assert conditions(kubes["edge-3"], web)["Ready"]["status"] == "True"
    assert live(kubes["edge-3"], "v1", "ConfigMap", "c", web_ns) is not None

    # The plaintext is nowhere but in the two API servers' Secrets.
    for repo in (lab.repo_name, lab.status_name):
        objects, found = _blobs_with_plaintext(lab.git.root / repo)
        assert objects > 10 and not found, f"{repo}: plaintext in {found}"
    assert _files_with_plaintext(lab.tmp / "hub-cache") == []
    for name in names:
        workdir = tmp_path / "agents" / name
        # The render cache is on disk (the web bundle's render is there), the secrets' not.
        assert list(workdir.rglob("renders/*.json.z")), f"{name}: no render cache on disk"
        assert _files_with_plaintext(workdir) == [], name
    assert not any(
        n.decode("latin-1") in record.getMessage() for record in caplog.records for n in _needles()
    )
    for name in names:
        for kind in ("BundleDeployment", "Event"):
            api = "fleetlet.io/v1alpha1" if kind == "BundleDeployment" else "v1"
            for obj in kubes[name].list(api, kind):
                text = yaml.safe_dump(obj)
                assert not any(n.decode() in text for n in _needles()[:-1]), f"{name}: {kind}"

    # A rotation asked on edge-1's key Secret: its agent makes the new key and reports both;
    # `hub recipients` gives the new one, the old one stays listed (and opening) until retired.
    kubes["edge-1"].patch(
        {"apiVersion": "v1", "kind": "Secret",
         "metadata": {"name": KEY_SECRET, "namespace": agent_ns}},
        {"metadata": {"annotations": {ROTATE_ANNOTATION: "one"}}},
    )  # fmt: skip
    deadline = time.monotonic() + 120
    while True:
        agents["edge-1"].tick()
        shown = _recipients(fleet, lab, "--selector", "region=eu", "-o", "json")
        assert shown.returncode == 0, shown.stderr
        edge_1 = next(
            c for c in yaml.safe_load(shown.stdout)["clusters"] if c["cluster"] == "edge-1"
        )
        if edge_1["older"]:
            break
        assert time.monotonic() < deadline, shown.stdout
        time.sleep(1)
    assert edge_1["older"] == [keys["edge-1"].current]
    assert edge_1["recipient"] not in (keys["edge-1"].current, None)
    assert live(kubes["edge-1"], "v1", "Secret", "db", shop_ns) is not None
    assert conditions(kubes["edge-1"], creds)["Ready"]["status"] == "True"


def test_a_rotated_key_opens_old_and_new_files_until_the_old_one_is_retired(
    crds: Cluster, namespace: str, sops_binary: Path, tmp_path: Path
) -> None:
    kube = KubeClient(kubeconfig=str(crds.kubeconfig))
    keys = ClusterKeys(kube, namespace)
    first = keys.keyring()
    assert keys.keyring().recipients == first.recipients  # made once, then read
    old_file = _encrypted(sops_binary, tmp_path, "old.yaml", first.current)

    ref = {"apiVersion": "v1", "kind": "Secret", "metadata": {"name": KEY_SECRET,
           "namespace": namespace}}  # fmt: skip
    kube.patch(ref, {"metadata": {"annotations": {ROTATE_ANNOTATION: "2026-11"}}})
    rotated = keys.keyring()
    assert len(rotated.recipients) == 2 and rotated.recipients[1] == first.current
    assert keys.keyring().recipients == rotated.recipients  # once per word
    new_file = _encrypted(sops_binary, tmp_path, "new.yaml", rotated.current)
    for path in (old_file, new_file):
        assert _opens(path, rotated)

    # Once every file is re-encrypted to the new key, the old one is retired.
    kube.patch(ref, {"metadata": {"annotations": {RETIRE_ANNOTATION: first.current}}})
    retired = keys.keyring()
    assert retired.recipients == (rotated.current,)
    secret = live(kube, "v1", "Secret", KEY_SECRET, namespace)
    assert secret is not None and RETIRE_ANNOTATION not in secret["metadata"]["annotations"]
    assert _opens(new_file, retired) and not _opens(old_file, retired)


def _encrypted(binary: Path, directory: Path, name: str, recipient: str) -> Path:
    (directory / name).write_text(SECRET)
    out = sops(binary, "--encrypt", "--age", recipient, name, cwd=directory)
    (directory / name).write_text(out)
    return directory / name


def _opens(path: Path, keyring: object) -> bool:
    from agent.secrets.sops import SopsError
    from tests.test_secrets_sops import opened

    try:
        return opened(path, keyring).document["stringData"]["password"] == PASSWORD  # type: ignore[arg-type]
    except SopsError:
        return False
