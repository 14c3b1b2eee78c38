"""The agent's inbound pipeline end to end: a hub-published repo on a real git server, content
in a real registry, signatures from the mini Sigstore, state in a real API server.

What an operator checks: each agent verifies and renders its own set and never fetches another
cluster's branch; an idle sync costs no registry request; a restarted agent keeps its last
accepted serial and refuses an older publication as a replay, without retrying it; a refused
publication is recorded in the cluster; a registry outage is temporary and the next sync after
it comes back succeeds.
"""

from __future__ import annotations

import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pygit2
import pytest

from agent.errors import IdentityMismatchError, ReplayError, TemporaryError
from agent.inbound import InboundPipeline
from agent.kube import KubeClient
from agent.source.branch import BranchWatcher
from agent.source.cache import ContentCache
from agent.source.compose import ContentStore
from agent.source.oci import OciFetcher, OciSettings
from agent.state import ClusterState
from agent.verify import IdentityPolicy, TrustPolicy
from hub.publish.flow import prepare, publish
from hub.publish.git import BranchStore
from hub.publish.sign import PublicationSigner
from tests.realenv.gitserver import GitDaemon
from tests.realenv.kube import Cluster
from tests.realenv.oci import OciClient, push_bundle
from tests.realenv.registry import Registry
from tests.realenv.sigstore import MiniSigstore
from tests.realenv.sigstore.mini import DEFAULT_IDENTITY
from tests.test_crds import crds as crds  # the fixture: the CRDs installed
from tests.test_hub_fleet import write_fleet

CLUSTERS = [
    {"name": "alpha", "labels": {"tier": "canary"}},
    {"name": "beta", "labels": {"tier": "production"}},
]


def push_app(registry: Registry, tmp: Path, *, tag: str, value: str) -> str:
    """Push a bundle of two manifests (a namespaced ConfigMap without a namespace, and a
    Namespace) as an OCI artifact; returns its manifest digest."""
    d = tmp / f"app-{tag}-{value}"
    d.mkdir(parents=True, exist_ok=True)
    (d / "01_namespace.yaml").write_text(
        "apiVersion: v1\nkind: Namespace\nmetadata:\n  name: sync-app\n"
    )
    (d / "02_config.yaml").write_text(
        f"apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: app-config\ndata:\n  value: {value}\n"
    )
    return push_bundle(OciClient(host=registry.host), "agent/app", d, tag=tag).digest


@dataclass
class Published:
    """A fleet published to a bare repo on the git daemon."""

    registry: Registry
    sigstore: MiniSigstore
    repo: Path
    url: str
    tmp: Path

    def publish(self, *, tag: str) -> None:
        fleet = write_fleet(
            self.tmp / f"fleet-{tag}",
            clusters=CLUSTERS,
            bundles=[
                {
                    "name": "app",
                    "sources": [
                        {"kind": "image", "uri": f"{self.registry.host}/agent/app", "tag": tag}
                    ],
                    "formatOptions": {"targetNamespace": "sync-app"},
                    "targets": [{"clusterSelector": {}}],
                }
            ],
            settings={
                "name": "sync",
                "repo": "https://fleet.example.invalid/sync.git",
                "publication": {"expiresAfter": "7d", "refreshBefore": "1d"},
                "signing": {"identity": DEFAULT_IDENTITY, "issuer": self.sigstore.issuer},
            },
        )
        signer = PublicationSigner.from_trust_config(
            trust_config=self.sigstore.trust_config_path, token=self.sigstore.mint_token()
        )
        with BranchStore(url=self.url) as store:
            publish(prepare(fleet), store, signer=signer)

    def tip(self, cluster: str) -> str:
        return git(self.repo, "rev-parse", f"refs/heads/fleetlet/clusters/{cluster}")

    def move(self, cluster: str, commit: str) -> None:
        """What an attacker with write access to the repo (or a stale mirror) can do."""
        git(self.repo, "update-ref", f"refs/heads/fleetlet/clusters/{cluster}", commit)


def git(repo: Path, *args: str) -> str:
    done = subprocess.run(
        ["git", "--git-dir", str(repo), *args], capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0, done.stderr
    return done.stdout.strip()


def trust_for(sigstore: MiniSigstore, *, subject: str = DEFAULT_IDENTITY) -> TrustPolicy:
    return TrustPolicy(
        trusted_root=sigstore.trusted_root_path,
        identity=IdentityPolicy(issuer=sigstore.issuer, subject=subject),
    )


def agent(
    published: Published,
    kube_cluster: Cluster,
    cluster: str,
    workdir: Path,
    namespace: str,
    *,
    trust: TrustPolicy | None = None,
) -> tuple[InboundPipeline, BranchWatcher, OciFetcher]:
    """A fresh agent process's objects: nothing in memory survives between two calls."""
    kube = KubeClient(kubeconfig=str(kube_cluster.kubeconfig))
    watcher = BranchWatcher(repo_url=published.url, cluster=cluster, cache_dir=workdir / "branch")
    oci = OciFetcher(settings=OciSettings(plain_http=True, attempts=2, backoff=0.1))
    content = ContentStore(cache=ContentCache(root=workdir / "cache", max_bytes=64 << 20), oci=oci)
    pipeline = InboundPipeline(
        cluster=cluster,
        watcher=watcher,
        trust=trust or trust_for(published.sigstore),
        content=content,
        kube=kube,
        state=ClusterState(kube=kube, namespace=namespace, name=f"fleetlet-agent-state-{cluster}"),
        agent_namespace=namespace,
        workdir=workdir,
    )
    return pipeline, watcher, oci


def local_refs(workdir: Path) -> set[str]:
    repo = pygit2.Repository(str(workdir / "branch" / "branch.git"))
    return set(repo.references)


@pytest.fixture
def published(
    registry_factory: Any,
    git_daemon: GitDaemon,
    mini_sigstore: MiniSigstore,
    tmp_path: Path,
    request: pytest.FixtureRequest,
) -> Published:
    registry = registry_factory()
    push_app(registry, tmp_path, tag="v1", value="one")
    name = f"sync-{request.node.name[:40]}.git".replace("[", "-").replace("]", "")
    result = Published(
        registry=registry,
        sigstore=mini_sigstore,
        repo=git_daemon.create_bare(name),
        url=git_daemon.url_for(name),
        tmp=tmp_path,
    )
    result.publish(tag="v1")
    return result


def test_each_agent_renders_its_own_set_and_fetches_nothing_else(
    published: Published, kube_cluster: Cluster, namespace: str, tmp_path: Path
) -> None:
    results = {}
    for cluster in ("alpha", "beta"):
        pipeline, _, _ = agent(published, kube_cluster, cluster, tmp_path / cluster, namespace)
        results[cluster] = pipeline.sync()
    for cluster, result in results.items():
        assert result.outcome == "rendered"
        assert result.serial == 1
        assert result.deployment_set is not None and result.deployment_set.cluster == cluster
        [bundle] = result.bundles
        kinds = [(o["kind"], o["metadata"]["name"]) for o in bundle.objects]
        assert kinds == [("Namespace", "sync-app"), ("ConfigMap", "app-config")]
        config = bundle.objects[1]
        # Namespaced without a namespace: the target namespace, decided by discovery.
        assert config["metadata"]["namespace"] == "sync-app"
        assert "namespace" not in bundle.objects[0]["metadata"]
        assert config["metadata"]["labels"]["fleetlet.io/bundle"] == "app"
        # Only this cluster's branch ever reached the agent's local repository.
        refs = local_refs(tmp_path / cluster)
        assert refs == {f"refs/remotes/origin/fleetlet/clusters/{cluster}"}


def test_idle_sync_makes_no_fetch_and_no_registry_request(
    published: Published, kube_cluster: Cluster, namespace: str, tmp_path: Path
) -> None:
    pipeline, watcher, oci = agent(published, kube_cluster, "alpha", tmp_path / "a", namespace)
    assert pipeline.sync().outcome == "rendered"
    fetches, attempts = watcher.fetches, oci.attempts_made
    mark = published.registry.request_count()
    for _ in range(3):
        assert pipeline.sync().outcome == "unchanged"
    assert watcher.fetches == fetches
    assert oci.attempts_made == attempts
    assert published.registry.request_count() == mark


def test_restart_keeps_the_serial_and_an_older_publication_is_refused_as_a_replay(
    published: Published, kube_cluster: Cluster, namespace: str, tmp_path: Path
) -> None:
    first, _, _ = agent(published, kube_cluster, "alpha", tmp_path / "run1", namespace)
    assert first.sync().serial == 1
    old = published.tip("alpha")
    push_app(published.registry, published.tmp, tag="v1", value="two")  # the tag moves
    published.publish(tag="v1")
    # A restarted agent: new process, new local cache; only the cluster remembers.
    second, _, _ = agent(published, kube_cluster, "alpha", tmp_path / "run2", namespace)
    upgraded = second.sync()
    assert upgraded.outcome == "rendered" and upgraded.serial == 2
    assert upgraded.bundles[0].objects[1]["data"] == {"value": "two"}

    published.move("alpha", old)  # the branch is rolled back to serial 1
    third, watcher, _ = agent(published, kube_cluster, "alpha", tmp_path / "run3", namespace)
    with pytest.raises(ReplayError, match="serial 1"):
        third.sync()
    state = ClusterState(
        kube=KubeClient(kubeconfig=str(kube_cluster.kubeconfig)),
        namespace=namespace,
        name="fleetlet-agent-state-alpha",
    ).load()
    assert state.last_serial == 2
    assert state.refused_commit == old
    assert state.refusal_reason == "SerialNotNewer"
    # Not retried until the branch moves: no fetch at the next poll.
    fetches = watcher.fetches
    assert third.sync().outcome == "refused-before"
    assert watcher.fetches == fetches


def test_a_refused_signer_is_recorded_in_the_cluster(
    published: Published, kube_cluster: Cluster, namespace: str, tmp_path: Path
) -> None:
    pipeline, _, _ = agent(
        published,
        kube_cluster,
        "beta",
        tmp_path / "b",
        namespace,
        trust=trust_for(published.sigstore, subject="someone-else@fleet.test"),
    )
    with pytest.raises(IdentityMismatchError, match=r"someone-else@fleet\.test"):
        pipeline.sync()
    live = KubeClient(kubeconfig=str(kube_cluster.kubeconfig)).get(
        {
            "apiVersion": "v1",
            "kind": "ConfigMap",
            "metadata": {"name": "fleetlet-agent-state-beta", "namespace": namespace},
        }
    )
    assert live is not None
    assert '"refusal_reason": "IdentityMismatch"' in live["data"]["state"]
    assert '"last_serial": null' in live["data"]["state"]


def test_registry_outage_is_temporary_and_the_next_sync_recovers(
    published: Published, kube_cluster: Cluster, namespace: str, tmp_path: Path
) -> None:
    pipeline, _, oci = agent(published, kube_cluster, "alpha", tmp_path / "a", namespace)
    published.registry.kill()
    with pytest.raises(TemporaryError) as caught:
        pipeline.sync()
    assert getattr(caught.value, "reason", "") in {"FetchFailed", "RegistryUnavailable"}
    assert oci.attempts_made == 2  # bounded: no two-minute retry loop
    published.registry.start()
    result = pipeline.sync()  # the commit was not marked done: it is tried again
    assert result.outcome == "rendered" and result.serial == 1


def test_agent_sync_once_command(
    published: Published, crds: Cluster, namespace: str, tmp_path: Path
) -> None:
    kube_cluster = crds

    def run(identity: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [
                sys.executable, "-m", "fleetlet", "agent", "sync", "--once",
                "--repo", published.url, "--cluster", "beta",
                "--kubeconfig", str(kube_cluster.kubeconfig),
                "--trusted-root", str(published.sigstore.trusted_root_path),
                "--identity", identity, "--issuer", published.sigstore.issuer,
                "--namespace", namespace, "--cache-dir", str(tmp_path / identity),
                "--plain-http-registries",
            ],
            capture_output=True, text=True, timeout=120,
        )  # fmt: skip

    # Exit codes: 1 this sync failed, 4 it went fine but something earlier still holds, 0
    # converged; a summary on stdout every time, the reason in one line on stderr.
    refused = run("intruder@fleet.test")
    assert refused.returncode == 1
    assert "intruder@fleet.test" in refused.stderr and len(refused.stderr.splitlines()) == 1
    assert refused.stdout.startswith("beta: failed"), refused.stdout
    again = run("intruder@fleet.test")
    assert again.returncode == 4
    assert "was refused and the branch has not moved since (IdentityMismatch" in again.stderr
    assert again.stdout.startswith("beta: refused-before"), again.stdout
    done = run(DEFAULT_IDENTITY)
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith("beta: rendered, serial 1; moved: app"), done.stdout
    applied = KubeClient(kubeconfig=str(kube_cluster.kubeconfig)).get(
        {
            "apiVersion": "v1",
            "kind": "ConfigMap",
            "metadata": {"name": "app-config", "namespace": "sync-app"},
        }
    )
    assert applied is not None and applied["data"] == {"value": "one"}
    idle = run(DEFAULT_IDENTITY)
    assert idle.returncode == 0, idle.stderr
    assert idle.stdout.startswith("beta: unchanged, serial 1"), idle.stdout
    # The shared cluster is left as found: the hostile suite checks nothing made sync-app.
    kube = KubeClient(kubeconfig=str(kube_cluster.kubeconfig))
    ref = {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "sync-app"}}
    kube.delete(ref)
    deadline = time.monotonic() + 120
    while kube.get(ref) is not None:
        assert time.monotonic() < deadline, "namespace sync-app not deleted"
        time.sleep(0.5)
