"""A small fleet for end-to-end agent tests: bundles pushed to a real registry, a fleet
published (signed through the mini Sigstore) to a real git server, and agents built exactly as
``fleetlet agent run`` builds them, in-process or as ``python -m fleetlet`` subprocesses.

Each lab has its own registry and git server (tests stop and start them), its own agent
namespace per agent (state, revision store, intents, runs) and unique bundle names, so labs
on the one shared API server do not see each other.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import uuid
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from agent.cli import _build_agent
from agent.kube import KubeClient, ObjectRef
from agent.loop import Agent
from hub.publish.flow import PublishReport, prepare, publish
from hub.publish.git import BranchStore
from hub.publish.sign import PublicationSigner
from tests.realenv.gitserver import GitDaemon, GitHttpServer
from tests.realenv.kube import Cluster
from tests.realenv.oci import OciClient, push_bundle
from tests.realenv.registry import Registry
from tests.realenv.sigstore import MiniSigstore
from tests.realenv.sigstore.mini import DEFAULT_IDENTITY
from tests.test_hub_fleet import write_fleet

REPO_ROOT = Path(__file__).resolve().parent.parent

Files = Mapping[str, str]


def deployment(name: str, namespace: str, image: str, *, replicas: int = 1) -> str:
    """A Deployment manifest (kwok runs its pods; an image tagged ``broken`` never gets ready)."""
    return f"""apiVersion: apps/v1
kind: Deployment
metadata:
  name: {name}
  namespace: {namespace}
spec:
  replicas: {replicas}
  progressDeadlineSeconds: 600
  selector:
    matchLabels: {{app: {name}}}
  template:
    metadata:
      labels: {{app: {name}}}
    spec:
      containers:
        - name: main
          image: {image}
"""


def configmap(name: str, namespace: str, data: Mapping[str, str]) -> str:
    lines = "".join(f"  {k}: {v!r}\n" for k, v in data.items())
    return (
        f"apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: {name}\n  namespace: {namespace}\n"
        f"data:\n{lines}"
    )


def service(name: str, namespace: str) -> str:
    return f"""apiVersion: v1
kind: Service
metadata:
  name: {name}
  namespace: {namespace}
spec:
  selector: {{app: {name}}}
  ports:
    - port: 80
      targetPort: 8080
"""


def namespace_manifest(name: str) -> str:
    return f"apiVersion: v1\nkind: Namespace\nmetadata:\n  name: {name}\n"


def crd_manifest(group: str, plural: str, kind: str) -> str:
    return f"""apiVersion: apiextensions.k8s.io/v1
kind: CustomResourceDefinition
metadata:
  name: {plural}.{group}
spec:
  group: {group}
  scope: Namespaced
  names: {{plural: {plural}, singular: {kind.lower()}, kind: {kind}}}
  versions:
    - name: v1
      served: true
      storage: true
      schema:
        openAPIV3Schema:
          type: object
          x-kubernetes-preserve-unknown-fields: true
"""


@dataclass
class Lab:
    """One fleet on its own registry and git server; see the module docstring."""

    registry: Registry
    git: GitDaemon | GitHttpServer
    sigstore: MiniSigstore
    tmp: Path
    suffix: str = field(default_factory=lambda: uuid.uuid4().hex[:6])
    clusters: list[dict[str, Any]] = field(default_factory=list)
    repo_name: str = "fleet.git"
    status_name: str = "status.git"
    status_git: GitDaemon | GitHttpServer | None = None
    """Where status goes (None: the desired-state git server)."""

    def __post_init__(self) -> None:
        self.git.create_bare(self.repo_name)
        (self.status_git or self.git).create_bare(self.status_name)

    @property
    def url(self) -> str:
        return self.git.url_for(self.repo_name)

    @property
    def status_url(self) -> str:
        return (self.status_git or self.git).url_for(self.status_name)

    def name(self, base: str) -> str:
        """A name unique to this lab (bundles are cluster-scoped BundleDeployments)."""
        return f"{base}-{self.suffix}"

    def push(self, repository: str, files: Files, *, tag: str) -> str:
        """Push a plain bundle (file name -> YAML) as an OCI artifact; returns its digest."""
        directory = self.tmp / "content" / repository / tag / uuid.uuid4().hex[:6]
        directory.mkdir(parents=True)
        for name, text in files.items():
            (directory / name).parent.mkdir(parents=True, exist_ok=True)
            (directory / name).write_text(text)
        return push_bundle(
            OciClient(host=self.registry.host), repository, directory, tag=tag
        ).digest

    def source(self, repository: str, digest: str) -> dict[str, str]:
        return {"kind": "image", "uri": f"{self.registry.host}/{repository}", "digest": digest}

    def publish(
        self,
        bundles: list[dict[str, Any]],
        *,
        expires_after: str = "7d",
        refresh_before: str = "1d",
    ) -> PublishReport:
        """Publish ``bundles`` (fleet-repo bundle documents) to every cluster of the lab,
        valid for ``expires_after``."""
        fleet = self.fleet_dir(bundles, expires_after=expires_after, refresh_before=refresh_before)
        signer = PublicationSigner.from_trust_config(
            trust_config=self.sigstore.trust_config_path, token=self.sigstore.mint_token()
        )
        with BranchStore(url=self.url, cache_dir=self.tmp / "hub-cache") as store:
            return publish(prepare(fleet), store, signer=signer)

    def fleet_dir(
        self,
        bundles: list[dict[str, Any]],
        *,
        expires_after: str = "7d",
        refresh_before: str = "1d",
    ) -> Path:
        """A fleet repo directory targeting ``bundles`` at every cluster of the lab."""
        return write_fleet(
            self.tmp / f"fleet-{uuid.uuid4().hex[:6]}",
            clusters=self.clusters,
            bundles=[{"targets": [{"clusterSelector": {}}], **b} for b in bundles],
            settings={
                "name": "lab",
                "repo": "https://fleet.example.invalid/lab.git",
                "publication": {"expiresAfter": expires_after, "refreshBefore": refresh_before},
                "signing": {"identity": DEFAULT_IDENTITY, "issuer": self.sigstore.issuer},
            },
        )

    def agent_args(
        self,
        cluster: str,
        kube: Cluster,
        *,
        namespace: str,
        workdir: Path,
        status: bool = True,
        hub_public_key: Path | None = None,
        extra: Sequence[str] = (),
        sealing_key: Path | None = None,
    ) -> list[str]:
        """The flags of ``fleetlet agent run``/``sync`` for an agent of ``cluster``
        (``extra``: more flags)."""
        args = [
            "--repo", self.url, "--cluster", cluster,
            "--kubeconfig", str(kube.kubeconfig),
            "--trusted-root", str(self.sigstore.trusted_root_path),
            "--identity", DEFAULT_IDENTITY, "--issuer", self.sigstore.issuer,
            "--namespace", namespace, "--cache-dir", str(workdir),
            "--plain-http-registries", "--heartbeat", "1",
        ]  # fmt: skip
        if status:
            args += ["--status-repo", self.status_url]
        else:
            args += ["--no-status"]
        if hub_public_key is not None:
            args += ["--hub-public-key", str(hub_public_key)]
        if sealing_key is not None:
            args += ["--agent-sealing-key", str(sealing_key)]
        return [*args, *extra]

    def agent(
        self,
        cluster: str,
        kube: Cluster,
        *,
        namespace: str,
        workdir: Path,
        status: bool = True,
        hub_public_key: Path | None = None,
        extra: Sequence[str] = (),
        sealing_key: Path | None = None,
    ) -> Agent:
        """An in-process agent built as ``fleetlet agent run`` builds it."""
        from fleetlet.cli import build_parser

        argv = [
            "agent",
            "sync",
            "--once",
            *self.agent_args(
                cluster,
                kube,
                namespace=namespace,
                workdir=workdir,
                status=status,
                hub_public_key=hub_public_key,
                extra=extra,
                sealing_key=sealing_key,
            ),
        ]
        args: argparse.Namespace = build_parser().parse_args(argv)
        built: Agent = _build_agent(args)
        return built

    def sync_once(
        self,
        cluster: str,
        kube: Cluster,
        *,
        namespace: str,
        workdir: Path,
        env: Mapping[str, str] | None = None,
        timeout: float = 300,
        extra: Sequence[str] = (),
    ) -> subprocess.CompletedProcess[str]:
        """``python -m fleetlet agent sync --once`` as a separate process."""
        return subprocess.run(
            [
                sys.executable,
                "-m",
                "fleetlet",
                "agent",
                "sync",
                "--once",
                *self.agent_args(cluster, kube, namespace=namespace, workdir=workdir, extra=extra),
            ],
            capture_output=True,
            text=True,
            timeout=timeout,
            cwd=REPO_ROOT,
            env={**os.environ, **(env or {})},
        )


def live(
    kube: KubeClient, api_version: str, kind: str, name: str, namespace: str | None = None
) -> dict[str, Any] | None:
    """The live object, or None."""
    return kube.get(ObjectRef(api_version, kind, name, namespace))


def conditions(kube: KubeClient, bundle: str) -> dict[str, dict[str, Any]]:
    """A BundleDeployment's conditions by type."""
    bd = live(kube, "fleetlet.io/v1alpha1", "BundleDeployment", bundle)
    assert bd is not None, f"no BundleDeployment {bundle}"
    return {c["type"]: c for c in (bd.get("status") or {}).get("conditions") or []}


# --- the fixture ---------------------------------------------------------------------------


@pytest.fixture
def lab(
    registry_factory: Any,
    git_server_factory: Any,
    mini_sigstore: MiniSigstore,
    tmp_path: Path,
) -> Lab:
    """A lab with its own registry and git daemon (stopped at the end), clusters ``edge-1``
    and ``edge-2`` in its inventory."""
    created = Lab(
        registry=registry_factory(),
        git=git_server_factory("daemon"),
        sigstore=mini_sigstore,
        tmp=tmp_path / "lab",
        clusters=[
            {"name": "edge-1", "labels": {"tier": "canary"}},
            {"name": "edge-2", "labels": {"tier": "production"}},
        ],
    )
    return created
