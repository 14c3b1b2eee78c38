"""A fleet whose every server can be taken away, for the outage and soak tests.

:class:`OutageWorld` runs, each as its own process on loopback: a Kubernetes control plane of
its own (its API server is stopped, restarted and frozen), the registry, the desired-state git
server, a separate status git server, a git server for git content and an http server for http
content. One agent (built as ``fleetlet agent run`` builds it, in this process) runs a set of two
groups: ``base`` (a Namespace, from the registry) and ``app``, which depends on it and holds a
bundle per content source: ``web`` (a Deployment, registry), ``conf`` (ConfigMaps, git: every
even version adds one, so a later version prunes it) and ``remote`` (a ConfigMap, http).

A server is taken away in one of two ways (:class:`Fault`): ``refused`` (its process stopped:
connections are refused) or ``hanging`` (SIGSTOP: the kernel still accepts connections and
nothing ever answers); :meth:`Fault.heal` brings it back.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import gzip
import hashlib
import io
import subprocess
import tarfile
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pygit2

from agent.api.crds import CRDS, REPO_ROOT
from agent.api.status import ClusterStatus, load_status, status_branch
from agent.apply.intent import GroupRecords
from agent.assemble import build_agent
from agent.cli import settings_from_args
from agent.health import Status, assess
from agent.kube import KubeClient
from agent.loop import Agent
from tests.fleetlab import Lab, configmap, deployment, live, namespace_manifest
from tests.realenv.binaries import kubectl
from tests.realenv.gitserver import GitDaemon
from tests.realenv.httpserver import StaticHttpServer
from tests.realenv.kube import Cluster
from tests.realenv.registry import Registry
from tests.realenv.sigstore import MiniSigstore
from tests.test_crash import Version

AGENT_NAMESPACE = "fleetlet-outage"
HEALTH_TIMEOUT = 60
# Small, so that an outage test costs seconds: every request is bounded by these.
CONNECT_TIMEOUT = 1.0
READ_TIMEOUT = 2.0
TIMING_FLAGS = (
    "--connect-timeout", str(CONNECT_TIMEOUT), "--read-timeout", str(READ_TIMEOUT),
    "--fetch-attempts", "2", "--clock-skew", "1s",
)  # fmt: skip
_SIGNATURE = pygit2.Signature("content", "content@fleetlet.invalid", 1_700_000_000, 0)


class Trap:
    """A failpoint of the agent that runs ``action`` once, at the first step whose name starts
    with the armed prefix (the agent's steps: ``polled``, ``fetched``, ``verified``,
    ``rendered``, ``intent``, ``apply:dry run...``, ``apply:applying...``, ``applied``,
    ``health``, ``healthy``, ``pruned``, ``stored``, ``finished``...)."""

    def __init__(self) -> None:
        self._armed: tuple[str, Callable[[], None]] | None = None
        self.sprung: list[str] = []

    def arm(self, prefix: str, action: Callable[[], None]) -> None:
        self._armed = (prefix, action)

    def disarm(self) -> None:
        self._armed = None

    def __call__(self, name: str) -> None:
        armed = self._armed
        if armed is not None and name.startswith(armed[0]):
            self._armed = None
            self.sprung.append(name)
            armed[1]()


@dataclass
class Fault:
    """One server taken away: ``mode`` is ``refused`` or ``hanging``."""

    component: str
    mode: str
    down: Callable[[], None]
    up: Callable[[], None]
    active: bool = False

    def inject(self) -> None:
        if not self.active:
            self.active = True
            self.down()

    def heal(self) -> None:
        if self.active:
            self.active = False
            self.up()


@dataclass
class OutageWorld:
    """See the module docstring. Build with :meth:`create`; :meth:`close` stops everything."""

    cluster: Cluster
    registry: Registry
    fleet_git: GitDaemon
    status_git: GitDaemon
    content_git: GitDaemon
    http: StaticHttpServer
    sigstore: MiniSigstore
    workdir: Path
    lab: Lab = field(init=False)
    kube: KubeClient = field(init=False)
    trap: Trap = field(default_factory=Trap)
    agent: Agent | None = None
    version: Version | None = None
    published: list[Version] = field(default_factory=list)
    content_repo: str = "content.git"

    def __post_init__(self) -> None:
        self.lab = Lab(
            registry=self.registry,
            git=self.fleet_git,
            status_git=self.status_git,
            sigstore=self.sigstore,
            tmp=self.workdir / "lab",
            clusters=[{"name": "edge", "labels": {"tier": "edge"}}],
        )
        self.content_git.create_bare(self.content_repo)
        self.kube = KubeClient(kubeconfig=str(self.cluster.kubeconfig))
        self.kube.apply(
            {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": AGENT_NAMESPACE}},
            field_manager="fleetlet-tests",
        )
        self.names = {b: self.lab.name(b) for b in ("base", "web", "conf", "remote")}
        self.ns = self.lab.name("outage")
        self._base = self.lab.push("base", {"ns.yaml": namespace_manifest(self.ns)}, tag="v1")

    # -- the servers ------------------------------------------------------------------------

    def fault(self, component: str, mode: str) -> Fault:
        """``component``: ``fleet-git``, ``status-git``, ``content-git``, ``registry``,
        ``http`` or ``apiserver``; ``mode``: ``refused`` or ``hanging``."""
        server: Any = {
            "fleet-git": self.fleet_git,
            "status-git": self.status_git,
            "content-git": self.content_git,
            "registry": self.registry,
            "http": self.http,
        }.get(component)
        if component == "apiserver":
            cluster = self.cluster

            def back(resume: Callable[[], None]) -> Callable[[], None]:
                # The controllers would reconnect by themselves, up to a minute later: they
                # are not what these tests are about.
                def bring_back() -> None:
                    resume()
                    cluster.restart_controllers()

                return bring_back

            if mode == "refused":
                return Fault(component, mode, cluster.stop_apiserver, back(cluster.start_apiserver))
            return Fault(component, mode, cluster.freeze_apiserver, back(cluster.thaw_apiserver))
        if server is None:
            raise ValueError(f"unknown component {component!r}")
        if mode == "refused":
            return Fault(component, mode, server.kill, server.start)
        return Fault(component, mode, server.freeze, server.thaw)

    def address(self, component: str) -> str:
        """What an error about ``component`` names (host:port)."""
        if component == "apiserver":
            return self.cluster.server.removeprefix("https://")
        server: Any = {
            "fleet-git": self.fleet_git,
            "status-git": self.status_git,
            "content-git": self.content_git,
            "registry": self.registry,
            "http": self.http,
        }[component]
        return f"127.0.0.1:{server.port}"

    # -- content and publications -----------------------------------------------------------

    def _git_content(self, version: Version) -> str:
        files = {"config.yaml": configmap("settings", self.ns, {"value": version.value})}
        if version.extra:
            files["extra.yaml"] = configmap(
                f"extra-{version.number}", self.ns, {"n": version.value}
            )
        repo = pygit2.Repository(str(self.content_git.root / self.content_repo))
        builder = repo.TreeBuilder()
        for name, text in sorted(files.items()):
            builder.insert(name, repo.create_blob(text.encode()), pygit2.GIT_FILEMODE_BLOB)
        parents = [] if repo.head_is_unborn else [repo.head.target]
        commit = repo.create_commit(
            "refs/heads/main", _SIGNATURE, _SIGNATURE, version.value, builder.write(), parents
        )
        return str(commit)

    def _http_content(self, version: Version) -> tuple[str, str]:
        text = configmap("remote", self.ns, {"value": version.value}).encode()
        raw = io.BytesIO()
        with tarfile.open(fileobj=raw, mode="w") as tar:
            info = tarfile.TarInfo("remote.yaml")
            info.size = len(text)
            info.mtime = 1_700_000_000
            tar.addfile(info, io.BytesIO(text))
        data = gzip.compress(raw.getvalue(), mtime=0)
        url = self.http.put(f"remote-{version.number}.tar.gz", data)
        return url, hashlib.sha256(data).hexdigest()

    def publish(
        self, version: Version, *, expires_after: str = "7d", health_timeout: int = HEALTH_TIMEOUT
    ) -> None:
        """Publish ``version`` of the fleet, valid for ``expires_after``."""
        lab, names = self.lab, self.names
        web = lab.push(
            "web", {"deployment.yaml": deployment("web", self.ns, version.image)}, tag=version.value
        )
        commit = self._git_content(version)
        url, sha = self._http_content(version)
        git = {"kind": "git", "uri": self.content_git.url_for(self.content_repo), "commit": commit}
        http = {"kind": "http", "uri": url, "sha256": sha}
        checks = {"timeoutSeconds": health_timeout}
        app = {"group": "app", "dependsOn": ["base"], "healthChecks": checks}
        lab.publish(
            [
                {
                    "name": names["base"],
                    "sources": [lab.source("base", self._base)],
                    "group": "base",
                },
                {"name": names["web"], "sources": [lab.source("web", web)], **app},
                {"name": names["conf"], "sources": [git], **app},
                {"name": names["remote"], "sources": [http], **app},
            ],
            expires_after=expires_after,
            refresh_before="1s",
        )
        self.version = version
        self.published.append(version)

    def next_version(self, *, broken: bool = False) -> Version:
        number = (self.published[-1].number + 1) if self.published else 1
        return Version(number, broken=broken)

    # -- the agent --------------------------------------------------------------------------

    def agent_args(self, *extra: str) -> list[str]:
        return self.lab.agent_args(
            "edge",
            self.cluster,
            namespace=AGENT_NAMESPACE,
            workdir=self.workdir / "agent",
            extra=[*TIMING_FLAGS, *extra],
        )

    def build_agent(self) -> Agent:
        """An in-process agent built as ``fleetlet agent run`` builds it, with :attr:`trap`
        as its failpoint."""
        from fleetlet.cli import build_parser

        args: argparse.Namespace = build_parser().parse_args(
            ["agent", "sync", "--once", *self.agent_args()]
        )
        settings = settings_from_args(args)
        settings = dataclasses.replace(
            settings, reconcile=dataclasses.replace(settings.reconcile, failpoint=self.trap)
        )
        agent: Agent = build_agent(settings)
        self.agent = agent
        return agent

    # -- what a user checks -----------------------------------------------------------------

    def running(self) -> dict[str, Any]:
        """What runs in the cluster: the web image, each ConfigMap's value, the extras."""
        web = live(self.kube, "apps/v1", "Deployment", "web", self.ns)
        settings = live(self.kube, "v1", "ConfigMap", "settings", self.ns)
        remote = live(self.kube, "v1", "ConfigMap", "remote", self.ns)
        extras = sorted(
            c["metadata"]["name"]
            for c in self.kube.list("v1", "ConfigMap", namespace=self.ns)
            if c["metadata"]["name"].startswith("extra-")
        )
        return {
            "image": web["spec"]["template"]["spec"]["containers"][0]["image"] if web else None,
            "settings": (settings or {}).get("data", {}).get("value"),
            "remote": (remote or {}).get("data", {}).get("value"),
            "extras": extras,
        }

    def expected(self, version: Version) -> dict[str, Any]:
        return {
            "image": version.image,
            "settings": version.value,
            "remote": version.value,
            "extras": [f"extra-{version.number}"] if version.extra else [],
        }

    def assert_wholly_on(self, version: Version, *, healthy: bool = True) -> None:
        """Every object of the app group is ``version``'s, nothing of another version is left
        (no partial group), and (``healthy``) the Deployment is Current."""
        assert self.running() == self.expected(version), (version, self.running(), self.why())
        if healthy:
            deadline = time.monotonic() + 60
            while assess(live(self.kube, "apps/v1", "Deployment", "web", self.ns)).status is not (
                Status.CURRENT
            ):
                assert time.monotonic() < deadline, "web never became Current"
                time.sleep(0.3)

    def why(self) -> dict[str, str]:
        """Each bundle's Ready reason and message (for failure messages)."""
        found = {}
        for bundle in self.names:
            with contextlib.suppress(Exception):
                ready = self.conditions(bundle)["Ready"]
                found[bundle] = f"{ready['reason']}: {ready['message']}"
        return found

    def status(self, bundle: str) -> dict[str, Any]:
        bd = live(self.kube, "fleetlet.io/v1alpha1", "BundleDeployment", self.names[bundle])
        assert bd is not None, f"no BundleDeployment {bundle}"
        return dict(bd.get("status") or {})

    def object_count(self, bundle: str, version: Version) -> int:
        """How many objects ``bundle`` has at ``version``."""
        return 2 if bundle == "conf" and version.extra else 1

    def conditions(self, bundle: str) -> dict[str, dict[str, Any]]:
        bd = live(self.kube, "fleetlet.io/v1alpha1", "BundleDeployment", self.names[bundle])
        assert bd is not None, f"no BundleDeployment {bundle}"
        return {c["type"]: c for c in (bd.get("status") or {}).get("conditions") or []}

    def moving(self) -> bool:
        """Whether the app group has an intent recorded (a move the agent will finish or undo)."""
        return GroupRecords(self.kube, namespace=AGENT_NAMESPACE).load("app").intent is not None

    def status_document(self) -> ClusterStatus | None:
        """The status document on the status server now (None: none pushed yet)."""
        path = self.status_git.root / self.lab.status_name
        repo = pygit2.Repository(str(path))
        ref = repo.references.get("refs/heads/" + status_branch("edge"))
        if ref is None:
            return None
        commit = repo[ref.target]
        assert isinstance(commit, pygit2.Commit)
        blob = repo[commit.tree["status.json"].id]
        assert isinstance(blob, pygit2.Blob)
        return load_status(bytes(blob.data), origin="status server")

    def heal_all(self, faults: list[Fault]) -> None:
        for fault in faults:
            fault.heal()

    def close(self) -> None:
        for server in (self.fleet_git, self.status_git, self.content_git):
            server.thaw()
            server.kill()
        self.registry.thaw()
        self.registry.kill()
        self.http.thaw()
        self.http.kill()


def bounded(call: Callable[[], Any], *, limit: float = 300.0) -> Any:
    """Run ``call`` in a thread and return what it returns (or raise what it raises); fail
    the test if it has not returned after ``limit`` seconds: a hang, not a slow call."""
    box: dict[str, Any] = {}

    def run() -> None:
        try:
            box["value"] = call()
        except BaseException as exc:
            box["error"] = exc

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    thread.join(limit)
    if thread.is_alive():
        raise AssertionError(f"the call did not return within {limit} s: it hangs")
    if "error" in box:
        raise box["error"]
    return box["value"]


def install_crds(cluster: Cluster) -> None:
    """Apply fleetlet's CRDs (as a user would: kubectl, server-side) and wait until each is
    Established."""
    args = [kubectl(), "--kubeconfig", str(cluster.kubeconfig), "apply", "--server-side",
            "--field-manager=fleetlet-tests", "--force-conflicts"]  # fmt: skip
    for crd in CRDS:
        args += ["-f", str(REPO_ROOT / crd.file)]
    done = subprocess.run(args, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    kube = KubeClient(kubeconfig=str(cluster.kubeconfig))
    deadline = time.monotonic() + 60
    for crd in CRDS:
        ref = {
            "apiVersion": "apiextensions.k8s.io/v1",
            "kind": "CustomResourceDefinition",
            "metadata": {"name": crd.name},
        }
        while True:
            found = kube.get(ref) or {}
            conditions = (found.get("status") or {}).get("conditions") or []
            states = {c["type"]: c["status"] for c in conditions}
            if states.get("Established") == "True":
                break
            assert time.monotonic() < deadline, f"{crd.name} not Established"
            time.sleep(0.2)


def world_in(tmp: Path, cluster: Cluster, sigstore: MiniSigstore) -> Iterator[OutageWorld]:
    """An :class:`OutageWorld` on ``cluster`` (CRDs installed), its servers started under
    ``tmp``; everything is stopped when the generator is closed."""
    install_crds(cluster)
    (tmp / "registry").mkdir(parents=True, exist_ok=True)
    registry = Registry(workdir=tmp / "registry")
    gits = [GitDaemon(workdir=tmp / f"git-{name}") for name in ("fleet", "status", "content")]
    http = StaticHttpServer(workdir=tmp / "http")
    for server in (registry, *gits, http):
        server.start()
    world = OutageWorld(
        cluster=cluster,
        registry=registry,
        fleet_git=gits[0],
        status_git=gits[1],
        content_git=gits[2],
        http=http,
        sigstore=sigstore,
        workdir=tmp,
    )
    try:
        yield world
    finally:
        world.close()
