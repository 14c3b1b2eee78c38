"""Enrollment (issue 30), end to end: a real ``hub serve --enroll``, a real API server (a
control plane of this module's own: install writes cluster-wide objects), a real git server,
a real publication and a real agent.

A control plane without any fleetlet object, a token made with ``hub enroll-token create``,
one ``agent install --enroll`` (its name derived from the cluster, its key made in the
cluster): the request is accepted by the token's CEL policy over its facts, or by hand with
``hub clusters accept``; the cluster lands in the inventory file the hub owns, the next
publication gives it its set, and the agent, configured from what the hub answered, reports
the bundle Ready. The refusals each give their reason: expired, revoked, exhausted, labels out
of scope, a name already taken, a request replayed, edited in flight or stale, a policy that
says no; an enrollment token opens nothing else on the hub API; the credentials the hub hands
out read their own branch and push their own status, nothing else, on the real git server.
"""

from __future__ import annotations

import base64
import json
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import nacl.signing
import pytest
import requests
import yaml

from agent.install.enroll import SIGNATURE_HEADER, open_sealed, signed_request
from agent.kube import KubeClient
from hub.api.tokens import write_clear_tokens
from hub.enroll.tokens import create_token
from hub.publish.flow import prepare, publish
from hub.publish.git import BranchStore
from hub.publish.sign import PublicationSigner
from tests.fleetlab import REPO_ROOT, Lab, conditions, configmap, namespace_manifest
from tests.realenv.hubserver import serving_hub
from tests.realenv.kube import Cluster
from tests.realenv.sigstore.mini import DEFAULT_IDENTITY
from tests.test_hub_fleet import write_fleet

IMAGE = "registry.example.test/fleetlet-agent@sha256:" + "1" * 64
ADMIN, READ = "admin-token-" + "a" * 20, "read-token-" + "r" * 20


def fleetlet(*args: str, check: bool = True, **kwargs: Any) -> subprocess.CompletedProcess[str]:
    done = subprocess.run(
        [sys.executable, "-m", "fleetlet", *args],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=REPO_ROOT,
        env={**os.environ, "PYTHONPATH": str(REPO_ROOT)},
        **kwargs,
    )
    if check:
        assert done.returncode == 0, f"fleetlet {' '.join(args)}: {done.stderr}"
    return done


class Hub:
    """An enrollment directory, a fleet repo whose inventory the hub writes, and hub serve."""

    def __init__(self, lab: Lab, tmp: Path) -> None:
        self.lab = lab
        self.dir = tmp / "enroll"
        self.dir.mkdir(parents=True)
        self.fleet = write_fleet(
            tmp / "fleet",
            clusters=[{"name": "edge-1", "labels": {"tier": "canary"}}],
            bundles=[],
            settings={
                "name": "lab",
                "repo": "https://fleet.example.invalid/lab.git",
                "signing": {"identity": DEFAULT_IDENTITY, "issuer": lab.sigstore.issuer},
            },
        )
        (self.dir / "trusted_root.json").write_text(lab.sigstore.trusted_root_path.read_text())
        (self.dir / "config.yaml").write_text(
            yaml.safe_dump(
                {
                    "repo": lab.url,
                    "statusRepo": lab.status_url,
                    "identity": DEFAULT_IDENTITY,
                    "issuer": lab.sigstore.issuer,
                    "trustedRoot": "trusted_root.json",
                    "inventory": str(self.fleet / "clusters" / "enrolled.yaml"),
                }
            )
        )
        self.api_tokens = tmp / "api-tokens.yaml"
        write_clear_tokens(self.api_tokens, {ADMIN: "admin", READ: "read"})
        self.admin_file = tmp / "admin-token"
        self.admin_file.write_text(ADMIN)
        self.url = ""

    def token(self, id: str, *flags: str) -> Path:
        """``hub enroll-token create``; the file holding the printed token."""
        done = fleetlet("hub", "enroll-token", "create", "--dir", str(self.dir), "--id", id, *flags)
        path = self.dir.parent / f"{id}.token"
        path.write_text(done.stdout.strip())
        return path

    def enroll(self, request: Signed, token: str) -> requests.Response:
        return requests.post(
            f"{self.url}/api/v1/enroll",
            data=request.body,
            headers={
                "Authorization": f"Bearer {token}",
                "Content-Type": "application/json",
                SIGNATURE_HEADER: request.signature,
            },
            timeout=30,
        )

    def inventory(self) -> dict[str, dict[str, str]]:
        path = self.fleet / "clusters" / "enrolled.yaml"
        if not path.exists():
            return {}
        return {c["name"]: c["labels"] for c in yaml.safe_load(path.read_text())["clusters"]}


@pytest.fixture
def hub(lab: Lab, tmp_path: Path) -> Iterator[Hub]:
    made = Hub(lab, tmp_path / "hub")
    work = tmp_path / "serve"
    work.mkdir()
    extra = ["--tokens", str(made.api_tokens), "--enroll", str(made.dir)]
    with serving_hub(lab.status_url, work, extra) as url:
        made.url = url
        yield made


@pytest.fixture
def fresh_cluster(tmp_path: Path, kube_binaries: dict[str, Path]) -> Iterator[Cluster]:
    """A control plane of this test's own, without any fleetlet object."""
    cluster = Cluster(name="enroll", workdir=tmp_path / "kube", binaries=kube_binaries).start()
    try:
        with KubeClient(kubeconfig=cluster.kubeconfig) as kube:
            names = [c["metadata"]["name"] for c in kube.list("apiextensions.k8s.io/v1", "CustomResourceDefinition")]  # fmt: skip
            assert not [n for n in names if n.endswith(".fleetlet.io")]
            assert kube.get({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "fleetlet-system"}}) is None  # fmt: skip
        yield cluster
    finally:
        cluster.stop()


class Signed:
    """A request as the agent sends it: the body's bytes, their signature, the cluster's key."""

    def __init__(
        self,
        cluster: str,
        labels: dict[str, str] | None = None,
        *,
        facts: dict[str, Any] | None = None,
        now: float | None = None,
    ) -> None:
        self.key = nacl.signing.SigningKey.generate()
        facts = facts or {"kubernetesVersion": "v1.0.0", "apiGroupVersions": ["v1"]}
        self.body, self.signature = signed_request(
            self.key, cluster=cluster, labels=labels or {}, facts=facts, now=now
        )


def request_body(cluster: str, labels: dict[str, str] | None = None, **kw: Any) -> Signed:
    return Signed(cluster, labels, **kw)


def install_enroll(
    hub: Hub, cluster: Cluster, token: Path, *extra: str, popen: bool = False
) -> Any:
    args = [
        "agent", "install", "--enroll", hub.url, "--token-file", str(token),
        "--image", IMAGE, "--kubeconfig", str(cluster.kubeconfig), *extra,
    ]  # fmt: skip
    if popen:
        return subprocess.Popen(
            [sys.executable, "-m", "fleetlet", *args],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            cwd=REPO_ROOT,
            env={**os.environ, "PYTHONPATH": str(REPO_ROOT)},
        )
    return fleetlet(*args, check=False)


POLICY = (
    "facts.kubernetesVersion.startsWith('v1.') && 'apps/v1' in facts.apiGroupVersions "
    "&& 'plain' in facts.formats && labels.tier == 'edge' && cluster.startsWith('c-')"
)


def converge(hub: Hub, lab: Lab, cluster: Cluster, name: str, namespace: str, tmp: Path) -> None:
    """The hub's next publication gives the enrolled cluster a bundle (it targets tier=edge),
    and the agent, configured as the hub answered, reports it Ready."""
    ns, bundle = f"shop-{lab.suffix}-{name}", lab.name(f"web-{name}")
    digest = lab.push(
        "shop/web", {"01.yaml": namespace_manifest(ns), "02.yaml": configmap("s", ns, {"v": "1"})},
        tag="v1",
    )  # fmt: skip
    (hub.fleet / "bundles" / f"{bundle}.yaml").write_text(
        yaml.safe_dump(
            {
                "name": bundle,
                "sources": [lab.source("shop/web", digest)],
                "targets": [{"clusterSelector": {"matchLabels": {"tier": "edge"}}}],
            }
        )
    )
    signer = PublicationSigner.from_trust_config(
        trust_config=lab.sigstore.trust_config_path, token=lab.sigstore.mint_token()
    )
    with BranchStore(url=lab.url, cache_dir=tmp / "hub-cache") as store:
        report = publish(prepare(hub.fleet), store, signer=signer)
    assert {c.cluster: c.serial_after for c in report.changes}[name] >= 1
    with KubeClient(kubeconfig=cluster.kubeconfig) as kube:
        config = kube.get({"apiVersion": "v1", "kind": "ConfigMap",
                           "metadata": {"name": "fleetlet-agent", "namespace": namespace}})  # fmt: skip
        assert config is not None
        assert config["data"]["cluster"] == name and config["data"]["repo"] == lab.url
        agent = lab.agent(name, cluster, namespace=namespace, workdir=tmp / f"agent-{name}")
        agent.tick()
        assert conditions(kube, bundle)["Ready"]["status"] == "True"


def test_a_token_enrolls_a_cluster_accepted_by_policy_and_its_agent_converges(
    hub: Hub, lab: Lab, fresh_cluster: Cluster, tmp_path: Path
) -> None:
    token = hub.token(
        "stores", "--labels", "tier=edge", "--allow-labels", "region in (eu-1,eu-2)",
        "--max-clusters", "5", "--expires", "1h", "--policy", POLICY,
    )  # fmt: skip
    listed = fleetlet("hub", "enroll-token", "list", "--dir", str(hub.dir), "-o", "json")
    (row,) = json.loads(listed.stdout)["items"]
    assert (row["id"], row["state"], row["maxClusters"], row["policy"]) == (
        "stores", "live", 5, POLICY,
    )  # fmt: skip
    assert token.read_text() not in (hub.dir / "tokens.yaml").read_text()  # stored hashed

    # Enrolled without self-upgrade's rights (agent.upgrade.rights): as any install.
    done = install_enroll(hub, fresh_cluster, token, "--labels", "region=eu-1",
                          "--self-upgrade", "off")  # fmt: skip
    assert done.returncode == 0, done.stderr
    with KubeClient(kubeconfig=fresh_cluster.kubeconfig) as kube:
        uid = kube.get(
            {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "kube-system"}}
        )
        assert uid is not None
        name = "c-" + uid["metadata"]["uid"].replace("-", "")[:12]
        assert f"cluster {name} is in the fleet" in done.stdout
        assert ", self-upgrade off (" in done.stdout
        candidate = {"apiVersion": "apps/v1", "kind": "Deployment",
                     "metadata": {"name": "fleetlet-agent-candidate", "namespace": "fleetlet-system"}}  # fmt: skip
        assert kube.get(candidate) is None
        # The cluster is in the inventory the hub owns, with the token's label and its claim.
        assert hub.inventory() == {name: {"tier": "edge", "region": "eu-1"}}
        shown = fleetlet(
            "hub", "clusters", "list", "--hub", hub.url, "--token-file", str(hub.admin_file),
            "-o", "json",
        )  # fmt: skip
        (request,) = json.loads(shown.stdout)["items"]
        assert (request["cluster"], request["state"], request["token"], request["decidedBy"]) == (
            name, "accepted", "stores", "token:stores policy",
        )  # fmt: skip
        assert request["facts"]["kubernetesVersion"].startswith("v1.")
        assert "plain" in request["facts"]["formats"]

        # The private key stayed in the cluster: the hub holds only the public part.
        secret = kube.get({"apiVersion": "v1", "kind": "Secret",
                           "metadata": {"name": "fleetlet-enrollment", "namespace": "fleetlet-system"}})  # fmt: skip
        assert secret is not None
        private = base64.b64decode(secret["data"]["private-key"]).decode()
        public = base64.b64decode(secret["data"]["public-key"]).decode()
        stored = (hub.dir / "requests" / f"{name}.json").read_text()
        assert public in stored and private not in stored
    converge(hub, lab, fresh_cluster, name, "fleetlet-system", tmp_path)


def test_refusals_each_say_why(hub: Hub, lab: Lab, tmp_path: Path) -> None:
    one = hub.token("one", "--labels", "tier=edge", "--max-clusters", "1")
    assert hub.enroll(request_body("shop-1"), one.read_text()).json()["state"] == "accepted"

    # Exhausted: one cluster, already used.
    answer = hub.enroll(request_body("shop-2"), one.read_text())
    assert answer.status_code == 403
    assert answer.json()["error"] == "enrollment token 'one' is exhausted (1 of 1 clusters)"

    # No takeover: a name enrolled (by any token) or in the fleet repo is refused.
    other = hub.token("other", "--max-clusters", "0", "--allow-labels", "region in (eu-1)")
    answer = hub.enroll(request_body("shop-1"), other.read_text())
    assert (answer.status_code, answer.json()["error"]) == (
        409, "cluster 'shop-1' is already accepted: pick another name",
    )  # fmt: skip

    # Labels outside the scope: a key the token does not allow, a value its selector refuses,
    # a fixed label contradicted.
    for labels, reason in [
        ({"admin": "true"}, "label admin=true is outside the token's scope (it allows no admin)"),
        ({"region": "us-1"}, "labels region=us-1 are outside the token's scope"),
    ]:
        answer = hub.enroll(request_body("shop-3", labels), other.read_text())
        assert answer.status_code == 403 and answer.json()["error"].startswith(reason), answer.text
    answer = hub.enroll(
        request_body("shop-3", {"tier": "core"}),
        hub.token("fixed", "--labels", "tier=edge").read_text(),
    )
    assert (
        answer.json()["error"] == "label tier=core is outside the token's scope (it sets tier=edge)"
    )
    assert set(hub.inventory()) == {"shop-1"}

    # Revoked.
    fleetlet("hub", "enroll-token", "revoke", "--dir", str(hub.dir), "other")
    answer = hub.enroll(request_body("shop-4", {"region": "eu-1"}), other.read_text())
    assert (answer.status_code, answer.json()["error"]) == (
        403,
        "enrollment token 'other' was revoked",
    )

    # Expired (made an hour ago, valid for a minute).
    old = create_token(
        hub.dir, id="old", labels={}, allow_labels=None, max_clusters=0,
        expires=timedelta(minutes=1), approve="auto", now=datetime.now(UTC) - timedelta(hours=1),
    )  # fmt: skip
    answer = hub.enroll(request_body("shop-5"), old)
    assert answer.status_code == 403
    assert answer.json()["error"].startswith("enrollment token 'old' expired at ")
    answer = hub.enroll(request_body("shop-5"), "not-a-token")
    assert (answer.status_code, answer.json()["error"]) == (401, "unknown enrollment token")

    # An enrollment token opens nothing else on the hub: not the API, not the decisions.
    live = hub.token("live", "--max-clusters", "0").read_text()
    auth = {"Authorization": f"Bearer {live}"}
    for method, path in [
        ("GET", "/api/v1/clusters"),
        ("GET", "/api/v1/installations"),
        ("GET", "/api/v1/enrollments"),
        ("POST", "/api/v1/enrollments/shop-9/accept"),
        ("GET", "/api/v1/enroll/shop-1"),  # another token's request
        ("GET", "/api/v1/enroll/..%2Fused"),  # no way out of the requests
        ("GET", "/metrics"),
    ]:
        answer = requests.request(method, hub.url + path, headers=auth, timeout=30)
        assert answer.status_code in (401, 404), (path, answer.status_code)
        error = answer.json()["error"]
        assert answer.status_code == 401 or "by this token" in error or "no such endpoint" in error
    # A read token may list requests but not decide them.
    answer = requests.post(
        f"{hub.url}/api/v1/enrollments/shop-1/accept",
        headers={"Authorization": f"Bearer {READ}"},
        timeout=30,
    )
    assert answer.status_code == 403


def test_a_request_replayed_edited_in_flight_or_stale_is_refused(hub: Hub) -> None:
    token = hub.token("sig", "--max-clusters", "0", "--allow-labels", "region").read_text()
    # Edited in flight: a label added to the signed bytes (the same length, so a proxy could).
    edited = request_body("shop-e", {"region": "eu-1"})
    edited.body = edited.body.replace(b'"region": "eu-1"', b'"region": "us-1"')
    answer = hub.enroll(edited, token)
    assert (answer.status_code, answer.json()["error"]) == (
        401,
        "the request's signature does not verify with its publicKey (no Fleetlet-Signature, "
        "or the request was edited in flight)",
    )
    # ... or its key swapped for another (the credentials would be sealed to it).
    swapped = request_body("shop-e")
    other = nacl.signing.SigningKey.generate()
    swapped.body = swapped.body.replace(
        json.loads(swapped.body)["publicKey"].encode(),
        base64.b64encode(bytes(other.verify_key)),
    )
    assert hub.enroll(swapped, token).status_code == 401
    unsigned = request_body("shop-e")
    unsigned.signature = ""
    assert hub.enroll(unsigned, token).status_code == 401
    # Replayed: the same signed request twice (refused as a replay, before the name is looked
    # at), and an old request (outside the hub's window) whatever its nonce.
    first = request_body("shop-r", {"region": "eu-1"})
    accepted = hub.enroll(first, token)
    assert accepted.json().get("state") == "accepted", accepted.text
    again = hub.enroll(first, token)
    assert again.status_code == 409
    assert again.json()["error"].startswith("this request was received already (nonce ")
    stale = request_body("shop-s", {"region": "eu-1"}, now=time.time() - 3600)
    answer = hub.enroll(stale, token)
    assert answer.status_code == 401
    assert "outside the hub's window of 300 s (a replayed request" in answer.json()["error"]
    assert set(hub.inventory()) == {"shop-r"}


def test_a_policy_that_says_no_leaves_the_request_pending_with_why(hub: Hub) -> None:
    token = hub.token(
        "new-k8s", "--max-clusters", "0", "--labels", "tier=edge",
        "--policy", "facts.kubernetesVersion.matches('^v1[.](3[0-9])[.]') && labels.tier == 'edge'",
    ).read_text()  # fmt: skip
    new = request_body("shop-new", facts={"kubernetesVersion": "v1.34.1"})
    assert hub.enroll(new, token).json()["state"] == "accepted"
    old = hub.enroll(request_body("shop-old", facts={"kubernetesVersion": "v1.29.0"}), token)
    assert old.json()["state"] == "pending"
    assert old.json()["waiting"] == (
        "the token's policy is false for this request: waiting for a decision"
    )
    # An expression failing on a request (a fact it lacks) fails closed: pending, with why.
    hasnt = hub.enroll(request_body("shop-nofacts", facts={"other": "x"}), token)
    assert hasnt.json()["state"] == "pending"
    assert hasnt.json()["waiting"].startswith("the token's policy failed: ")
    assert set(hub.inventory()) == {"shop-new"}
    listed = requests.get(
        f"{hub.url}/api/v1/enrollments?state=pending",
        headers={"Authorization": f"Bearer {READ}"},
        timeout=30,
    ).json()["items"]
    assert sorted(r["cluster"] for r in listed) == ["shop-nofacts", "shop-old"]


@pytest.mark.parametrize(
    ("policy", "error"),
    [
        ("facts.kubernetesVersion ==", "does not compile"),
        ("fact.kubernetesVersion == 'v1'", "no variable 'fact' (it sees cluster, labels, claimed, facts, token)"),
        ("facts.kubernetesVersion", "is not a boolean"),
    ],
)  # fmt: skip
def test_a_policy_that_cannot_work_is_refused_when_the_token_is_made(
    tmp_path: Path, policy: str, error: str
) -> None:
    done = fleetlet(
        "hub", "enroll-token", "create", "--dir", str(tmp_path), "--id", "bad", "--policy", policy,
        check=False,
    )  # fmt: skip
    assert done.returncode != 0
    (line,) = done.stderr.strip().splitlines()
    assert line.startswith(f"fleetlet: --policy {policy!r}") and error in line, line
    assert not (tmp_path / "tokens.yaml").exists()


def test_acceptance_by_hand_and_denial_through_the_cli(
    hub: Hub, lab: Lab, fresh_cluster: Cluster, tmp_path: Path
) -> None:
    token = hub.token(
        "manual", "--approve", "manual", "--max-clusters", "0", "--labels", "tier=edge"
    )
    waiting = install_enroll(hub, fresh_cluster, token, "--cluster", "store-7", popen=True)
    try:
        admin = ["--hub", hub.url, "--token-file", str(hub.admin_file)]
        deadline = time.monotonic() + 120
        while True:
            listed = fleetlet("hub", "clusters", "list", "--state", "pending", *admin)
            if "store-7" in listed.stdout:
                break
            assert waiting.poll() is None, waiting.communicate()
            assert time.monotonic() < deadline, "the request never showed as pending"
            time.sleep(0.3)
        assert hub.inventory() == {}  # pending: not in the fleet yet
        assert (
            fleetlet("hub", "clusters", "accept", "store-7", *admin).stdout
            == "cluster store-7 accepted\n"
        )
        out, err = waiting.communicate(timeout=120)
    finally:
        if waiting.poll() is None:
            waiting.kill()
    assert waiting.returncode == 0, err
    assert "enrollment pending" in err and "cluster store-7 is in the fleet" in out
    assert hub.inventory() == {"store-7": {"tier": "edge"}}
    converge(hub, lab, fresh_cluster, "store-7", "fleetlet-system", tmp_path)

    # A denied request: the list shows it with who denied it and why; it cannot be accepted.
    answer = hub.enroll(request_body("store-8"), token.read_text())
    assert answer.json()["state"] == "pending"
    fleetlet("hub", "clusters", "deny", "store-8", "--reason", "not ours", *admin)
    items = json.loads(fleetlet("hub", "clusters", "list", *admin, "-o", "json").stdout)["items"]
    assert {r["cluster"]: (r["state"], r.get("reason")) for r in items} == {
        "store-7": ("accepted", None),
        "store-8": ("denied", "not ours"),
    }
    table = fleetlet("hub", "clusters", "list", "--state", "denied", *admin).stdout.splitlines()
    assert table[0].split()[:3] == ["CLUSTER", "STATE", "TOKEN"]
    assert table[1].split()[:3] == ["store-8", "denied", "manual"] and len(table) == 2
    assert " by token-" in table[1] and table[1].endswith(": not ours"), table[1]
    again = fleetlet("hub", "clusters", "accept", "store-8", *admin, check=False)
    assert again.returncode == 1 and "cluster 'store-8' is already denied" in again.stderr


STATUS_HOOK = """#!/bin/sh
while read -r old new ref; do
  [ "$ref" = "refs/heads/fleetlet/status/$REMOTE_USER" ] && continue
  echo "fleetlet: $REMOTE_USER may not push $ref" >&2
  exit 1
done
"""


def test_accepted_credentials_read_their_own_branch_and_push_only_their_own_status(
    lab: Lab, git_server_factory: Any, tmp_path: Path
) -> None:
    """The hub's credentialsCommand issues a user per cluster on the real git HTTP server; the
    repositories' rules of docs/operations.md ("Who may push what") keep each one to its own
    branch: it lists and fetches its own ``fleetlet/clusters/<cluster>`` and nothing else of
    the desired state, pushes its own ``fleetlet/status/<cluster>`` and nothing else."""
    from tests.realenv.git_fixtures import GIT_PASSWORD, GIT_USER

    git = git_server_factory("http")
    git.create_bare(
        "status.git",
        hooks={"pre-receive": STATUS_HOOK},
        config={"fleetlet.ownRefPrefix": "refs/heads/fleetlet/status/"},
    )
    git.create_bare(
        "fleet.git",
        hooks={"pre-receive": f'#!/bin/sh\n[ "$REMOTE_USER" = {GIT_USER} ] || exit 1\n'},
        config={"fleetlet.ownRefPrefix": "refs/heads/fleetlet/clusters/"},
    )
    made = Hub(lab, tmp_path / "hub")
    config = yaml.safe_load((made.dir / "config.yaml").read_text())
    config |= {
        "repo": git.url_for("fleet.git"),
        "statusRepo": git.url_for("status.git"),
        "credentialsCommand": [
            sys.executable,
            "-m",
            "tests.realenv.git_issuer",
            str(git.users_file),
        ],
    }
    (made.dir / "config.yaml").write_text(yaml.safe_dump(config))
    token = made.token("shops", "--max-clusters", "2").read_text()
    work = tmp_path / "serve"
    work.mkdir()
    issued: dict[str, dict[str, Any]] = {}
    with serving_hub(
        lab.status_url, work, ["--tokens", str(made.api_tokens), "--enroll", str(made.dir)]
    ) as url:
        made.url = url
        for name in ("shop-a", "shop-b"):
            request = request_body(name)
            answer = made.enroll(request, token).json()
            assert answer["state"] == "accepted", answer
            issued[name] = open_sealed(request.key, answer["sealedCredentials"])
            # Only the cluster's key opens them: the hub keeps none in clear.
            stored = (made.dir / "requests" / f"{name}.json").read_text()
            assert issued[name]["statusGit"]["password"] not in stored

    repo = tmp_path / "local"
    subprocess.run(["git", "init", "-q", str(repo)], check=True)

    def commit(message: str) -> str:
        subprocess.run(
            ["git", "-C", str(repo), "-c", "user.name=t", "-c", "user.email=t@t", "commit", "-q",
             "--allow-empty", "-m", message],
            check=True,
        )  # fmt: skip
        return subprocess.run(
            ["git", "-C", str(repo), "rev-parse", "HEAD"], capture_output=True, text=True
        ).stdout.strip()

    def git_as(
        user: str, password: str, *args: str, repository: str, cwd: Path = repo
    ) -> subprocess.CompletedProcess[str]:
        where = git.url_for(repository).replace("http://", f"http://{user}:{password}@")
        return subprocess.run(
            ["git", "-C", str(cwd), *[where if a == "URL" else a for a in args]],
            capture_output=True, text=True, timeout=60,
        )  # fmt: skip

    # The hub's publisher pushes both clusters' branches (each its own commit).
    own = commit("set of shop-a")
    for ref in ("refs/heads/fleetlet/clusters/shop-a", "refs/fleetlet/publication"):
        assert git_as(GIT_USER, GIT_PASSWORD, "push", "URL", f"HEAD:{ref}", repository="fleet.git").returncode == 0  # fmt: skip
    theirs = commit("set of shop-b")
    assert git_as(GIT_USER, GIT_PASSWORD, "push", "URL", "HEAD:refs/heads/fleetlet/clusters/shop-b", repository="fleet.git").returncode == 0  # fmt: skip

    a_read, a_status = issued["shop-a"]["git"], issued["shop-a"]["statusGit"]
    reader = (a_read["username"], a_read["password"])
    # Reads: shop-a's credential lists and fetches its own branch only, under both protocols
    # (into a repository of its own that has none of the commits).
    listed = git_as(*reader, "ls-remote", "URL", repository="fleet.git")
    assert listed.stdout == f"{own}\trefs/heads/fleetlet/clusters/shop-a\n", listed
    for protocol in ("0", "2"):
        empty = tmp_path / f"reader-{protocol}"
        subprocess.run(["git", "init", "-q", str(empty)], check=True)
        v = ["-c", f"protocol.version={protocol}"]
        branch = git_as(*reader, *v, "fetch", "URL", "fleetlet/clusters/shop-b", repository="fleet.git", cwd=empty)  # fmt: skip
        assert branch.returncode != 0 and "couldn't find remote ref" in branch.stderr
        by_id = git_as(*reader, *v, "fetch", "URL", theirs, repository="fleet.git", cwd=empty)
        assert by_id.returncode != 0 and "not allow request for unadvertised object" in by_id.stderr
        assert git_as(*reader, *v, "fetch", "URL", "fleetlet/clusters/shop-a", repository="fleet.git", cwd=empty).returncode == 0  # fmt: skip
    # Pushes: its own status branch and nothing else, nowhere else.
    writer = (a_status["username"], a_status["password"])

    def push(
        repository: str, ref: str, who: tuple[str, str] = writer
    ) -> subprocess.CompletedProcess[str]:
        return git_as(*who, "push", "URL", f"HEAD:{ref}", repository=repository)

    assert push("status.git", "refs/heads/fleetlet/status/shop-a").returncode == 0
    refused = push("status.git", "refs/heads/fleetlet/status/shop-b")
    assert refused.returncode != 0
    assert "fleetlet: shop-a may not push refs/heads/fleetlet/status/shop-b" in refused.stderr
    assert push("status.git", "refs/heads/main").returncode != 0
    assert push("fleet.git", "refs/heads/fleetlet/clusters/shop-a").returncode != 0
    assert push("status.git", "refs/heads/fleetlet/status/shop-a", ("shop-a", "wrong")).returncode != 0  # fmt: skip
    # ... and it does not read other clusters' status either.
    status = git_as(*writer, "ls-remote", "URL", repository="status.git")
    assert [line.split("\t")[1] for line in status.stdout.splitlines()] == [
        "refs/heads/fleetlet/status/shop-a"
    ]


def test_with_commit_the_inventory_is_a_commit_in_the_fleet_checkout(
    lab: Lab, tmp_path: Path
) -> None:
    """``commit: true``: each acceptance is a commit of the inventory file, which the next
    ``load_fleet`` (what ``hub publish`` reads) sees."""
    from hub.enroll.service import Enrollment
    from hub.fleet.load import load_fleet

    made = Hub(lab, tmp_path / "hub")
    subprocess.run(["git", "init", "-q", str(made.fleet)], check=True)
    config = yaml.safe_load((made.dir / "config.yaml").read_text()) | {"commit": True}
    (made.dir / "config.yaml").write_text(yaml.safe_dump(config))
    token = made.token("git", "--max-clusters", "0", "--allow-labels", "zone").read_text()
    service = Enrollment(made.dir, known={"edge-1": {}})
    for name in ("shop-x", "shop-y"):
        request = request_body(name, {"zone": "a"})
        assert service.submit(token, request.body, request.signature)["state"] == "accepted"
    log = subprocess.run(
        ["git", "-C", str(made.fleet), "log", "--format=%s %an"],
        capture_output=True, text=True, check=True,
    ).stdout  # fmt: skip
    assert log.splitlines() == [
        "fleetlet: enroll cluster shop-y fleetlet hub",
        "fleetlet: enroll cluster shop-x fleetlet hub",
    ]
    fleet = load_fleet(made.fleet)
    assert {c.name: dict(c.labels) for c in fleet.clusters} == {
        "edge-1": {"tier": "canary"},
        "shop-x": {"zone": "a"},
        "shop-y": {"zone": "a"},
    }
    # A poll never leaves the requests directory.
    try:
        service.poll(token, "../used")
    except Exception as exc:
        assert str(exc) == "no enrollment request '../used' by this token"
    # A name the fleet repo already holds is not enrolled over.
    taken = request_body("edge-1")
    try:
        service.submit(token, taken.body, taken.signature)
    except Exception as exc:
        assert str(exc) == "cluster 'edge-1' is already accepted: pick another name"
    else:
        raise AssertionError("edge-1 was enrolled over the fleet repo's cluster")


def test_the_openapi_document_has_the_enrollment_endpoints(hub: Hub) -> None:
    from openapi_spec_validator import validate as validate_spec

    document = requests.get(
        f"{hub.url}/api/v1/openapi.json", headers={"Authorization": f"Bearer {READ}"}, timeout=30
    ).json()
    validate_spec(document)
    paths = document["paths"]
    assert {
        "/api/v1/enroll": ["post"],
        "/api/v1/enroll/{cluster}": ["get"],
        "/api/v1/enrollments": ["get"],
        "/api/v1/enrollments/{cluster}/{verdict}": ["post"],
    }.items() <= {p: list(v) for p, v in paths.items()}.items()
    states = document["components"]["schemas"]["EnrollmentRequest"]["properties"]["state"]
    assert states["enum"] == ["pending", "accepted", "denied"]
    # Each answer it declares for the listing matches what the hub says.
    listed = requests.get(
        f"{hub.url}/api/v1/enrollments", headers={"Authorization": f"Bearer {READ}"}, timeout=30
    )
    assert listed.status_code == 200 and listed.json() == {"items": []}
    wrong = requests.get(
        f"{hub.url}/api/v1/enrollments?state=maybe",
        headers={"Authorization": f"Bearer {READ}"},
        timeout=30,
    )
    assert wrong.status_code == 400 and "400" in paths["/api/v1/enrollments"]["get"]["responses"]
