"""The demo's environment: three Kubernetes clusters (kube-apiserver, etcd, controller-manager,
scheduler and kwok, as the tests run them, from ``tests/realenv``), a git server, an OCI
registry and a local Sigstore on loopback, the example content pushed and the fleet published
signed, one agent per cluster and the hub with its dashboard, all as child processes the
:class:`Demo` stops in order. Its methods are what the steps (:mod:`fleetlet.demo.command`),
the encrypted Secret (:mod:`fleetlet.demo.secret`) and the scenarios
(:mod:`fleetlet.demo.scenarios`) act with: commit and publish the fleet copy, run kubectl or
``fleetlet``, read the hub's API, wait for a state. Also used by ``bench/e2e_latency.py``.
"""

from __future__ import annotations

import contextlib
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from types import FrameType
from typing import Any

import yaml

from fleetlet.demo.examples import (
    CONTENT,
    CRDS,
    EXAMPLES,
    OPERATOR,
    PINNED_HOST,
    REGISTRY_PORT,
    REPO_ROOT,
    REPOSITORY_PREFIX,
    bundle_files,
)
from fleetlet.demo.realenv import DemoError, load_components, say
from hub.api.tokens import TokenEntry, token_digest, write_tokens

AGENT_NAMESPACE = "fleetlet-system"


def _free_port(preferred: int | None = None) -> int:
    for port in ([preferred] if preferred else []) + [0]:
        with socket.socket() as probe:
            try:
                probe.bind(("127.0.0.1", port))
            except OSError:
                continue
            return int(probe.getsockname()[1])
    raise DemoError("no free port on 127.0.0.1")


@dataclass
class Process:
    """A child process and where its output goes."""

    name: str
    popen: subprocess.Popen[bytes]
    log: Path

    def alive(self) -> bool:
        return self.popen.poll() is None

    def tail(self, lines: int = 15) -> str:
        with contextlib.suppress(OSError):
            return "\n".join(self.log.read_text(errors="replace").splitlines()[-lines:])
        return ""

    def stop(self) -> None:
        if self.popen.poll() is None:
            self.popen.send_signal(signal.SIGTERM)
            try:
                self.popen.wait(timeout=20)
            except subprocess.TimeoutExpired:
                self.popen.kill()
                self.popen.wait()


class Demo:
    """One demo run: the environment (clusters, git server, registry, Sigstore, hub, agents)
    and what the steps and scenarios do with it. :meth:`run` returns the exit code of the steps
    it is given and always stops what it started."""

    def __init__(
        self,
        *,
        workdir: Path,
        scenario: str,
        exit_when_ready: bool,
        timeout: float,
        interval: float,
    ) -> None:
        self.workdir = workdir
        self.scenario = scenario
        self.exit_when_ready = exit_when_ready
        self.timeout = timeout
        self.interval = interval
        self.env = load_components()
        self.stack = contextlib.ExitStack()
        self.processes: list[Process] = []
        self.read_token = "read-" + secrets.token_urlsafe(18)
        self.admin_token = "admin-" + secrets.token_urlsafe(18)
        self.hub_url = ""
        self.expected: dict[tuple[str, str], str] = {}
        self.agent_extra: Callable[[str], list[str]] = lambda cluster: []
        """More flags of ``agent run`` for a cluster (bench/e2e_latency.py's channel)."""

    # -- the steps ---------------------------------------------------------------------------

    def run(self, steps: Callable[[], int]) -> int:
        with self.stack:
            try:
                return steps()
            finally:
                # A second Ctrl-C must not cut the teardown short and leave things running.
                for number in (signal.SIGINT, signal.SIGTERM):
                    signal.signal(number, signal.SIG_IGN)
                say("stopping agents, hub, clusters, git server, registry and Sigstore")
                self._stop_processes()  # then the stack: clusters, Sigstore, git, registry

    @property
    def dashboard(self) -> str:
        from hub.serve import dashboard_url

        return dashboard_url(self.hub_url, self.read_token)

    def start_components(self) -> None:
        env = self.env
        say(
            "Kubernetes binaries: found in the cache, or built once from the Go module proxy "
            "(the first build takes about 8 minutes on 2 cores; progress follows)"
        )
        binaries = env.binaries.ensure_binaries(progress=sys.stderr)
        self.kubectl = str(binaries["kubectl"])
        port = _free_port(REGISTRY_PORT)
        say(f"OCI registry on 127.0.0.1:{port}, git daemon, local Sigstore")
        self.registry = env.registry.Registry(workdir=self.directory("registry"), port=port)
        self.registry.start()
        self.stack.callback(self.registry.stop)
        self.git = env.gitserver.GitDaemon(workdir=self.directory("git"))
        self.git.start()
        self.stack.callback(self.git.stop)
        self.git.create_bare("fleet-state.git")
        self.git.create_bare("fleet-status.git")
        self.sigstore = self.stack.enter_context(
            env.sigstore.MiniSigstore(workdir=self.directory("sigstore"), rekor_version=1)
        )
        names = [c["name"] for c in self._inventory()]
        say(f"starting {len(names)} clusters: {', '.join(names)} (about a minute)")
        self.clusters = {
            name: env.kube.Cluster(
                name=name, workdir=self.directory(f"clusters/{name}"), binaries=binaries
            )
            for name in names
        }
        for cluster in self.clusters.values():
            self.stack.callback(cluster.stop)
        env.kube.start_clusters(list(self.clusters.values()))
        for name, cluster in self.clusters.items():
            self.kubectl_run(cluster, "apply", "--server-side", "-f", str(CRDS))
            self.kubectl_run(cluster, "create", "namespace", AGENT_NAMESPACE)
            say(f"cluster {name}: API server {cluster.server}, fleetlet CRDs installed")

    def push_content(self) -> None:
        client = self.env.oci.OciClient(host=self.registry.host)
        self.digests: dict[tuple[str, str], str] = {}
        for bundle_dir in sorted(p for p in CONTENT.iterdir() if p.is_dir()):
            for version in sorted(p for p in bundle_dir.iterdir() if p.is_dir()):
                pushed = self.env.oci.push_bundle(
                    client, REPOSITORY_PREFIX + bundle_dir.name, version, tag=version.name
                )
                self.digests[(bundle_dir.name, version.name)] = pushed.digest
        say(f"pushed {len(self.digests)} bundle artifacts to {self.registry.host}")

    def publish_fleet(self) -> None:
        fleet = self.workdir / "fleet"
        shutil.copytree(EXAMPLES, fleet, ignore=shutil.ignore_patterns("content"))
        settings = yaml.safe_load((fleet / "fleet.yaml").read_text())
        settings["signing"] = {
            "identity": self.env.mini.DEFAULT_IDENTITY,
            "issuer": self.sigstore.issuer,
        }
        (fleet / "fleet.yaml").write_text(yaml.safe_dump(settings, sort_keys=False))
        if self.registry.host != PINNED_HOST:
            for path in (fleet / "bundles").glob("*.yaml"):
                path.write_text(path.read_text().replace(PINNED_HOST, self.registry.host))
        self.fleet = fleet
        _git(fleet, "init", "-q", "-b", "main")
        self.commit("the example fleet")
        for name, path in bundle_files(fleet).items():
            want = self.digests.get((name, "v1"))
            if want is None or want not in path.read_text():
                raise DemoError(
                    f"{path.name}: its digest is not the one of content/{name}/v1 ({want}); "
                    "run `python -m fleetlet.demo pin`"
                )
        self.publish()
        self.expected = self.expected_states()

    def start_agents_and_hub(self) -> None:
        from agent.report.seal import write_keypair

        key, public = self.workdir / "hub.key", self.workdir / "hub.pub"
        write_keypair(key, public)
        tokens = self.workdir / "tokens.yaml"
        write_tokens(
            tokens,
            [
                TokenEntry(name=OPERATOR, role="admin", sha256=token_digest(self.admin_token)),
                TokenEntry(name="dashboard", role="read", sha256=token_digest(self.read_token)),
            ],
        )
        tokens.chmod(0o600)
        self.admin_token_file = self.workdir / "admin.token"
        self.admin_token_file.write_text(self.admin_token + "\n")
        self.admin_token_file.chmod(0o600)
        # The hub's rollout controller signs as the fleet's publisher (a token the local
        # Sigstore accepts, valid for a day; in production a projected service-account token).
        identity = self.workdir / "hub-identity.token"
        identity.write_text(
            self.sigstore.minter.mint(self.env.mini.DEFAULT_IDENTITY, lifetime=86400)
        )
        identity.chmod(0o600)
        for name, cluster in self.clusters.items():
            self._spawn(
                f"agent-{name}",
                [
                    "agent", "run",
                    "--repo", self.git.url_for("fleet-state.git"),
                    "--status-repo", self.git.url_for("fleet-status.git"),
                    "--cluster", name,
                    "--kubeconfig", str(cluster.kubeconfig),
                    "--trusted-root", str(self.sigstore.trusted_root_path),
                    "--identity", self.env.mini.DEFAULT_IDENTITY,
                    "--issuer", self.sigstore.issuer,
                    "--namespace", AGENT_NAMESPACE,
                    "--cache-dir", str(self.directory(f"agents/{name}")),
                    "--plain-http-registries",
                    "--hub-public-key", str(public),
                    "--interval", str(self.interval), "--jitter", str(self.interval / 4),
                    "--heartbeat", "5",
                    *self.agent_extra(name),
                ],
            )  # fmt: skip
        port = _free_port()
        self.hub_url = f"http://127.0.0.1:{port}"
        self._spawn(
            "hub",
            [
                "hub", "serve",
                "--repo", self.git.url_for("fleet-status.git"),
                "--listen", f"127.0.0.1:{port}",
                "--tokens", str(tokens), "--hub-key", str(key),
                "--refresh", "1s", "--stale-after", "60s",
                "--fleet", str(self.fleet),
                "--cache-dir", str(self.directory("hub-cache")),
                "--cluster-repo", self.git.url_for("fleet-state.git"),
                "--trust-config", str(self.sigstore.trust_config_path),
                "--identity-token", str(identity),
                "--rollout-interval", "2s",
            ],
        )  # fmt: skip
        say(f"{len(self.clusters)} agents and the hub started; waiting for the fleet to settle")

    def hub_args(self) -> list[str]:
        return ["--hub", self.hub_url, "--token-file", str(self.admin_token_file)]

    def fleetlet(self, *args: str) -> str:
        done = subprocess.run(
            [sys.executable, "-m", "fleetlet", *args],
            capture_output=True, text=True, timeout=120, cwd=REPO_ROOT,
        )  # fmt: skip
        if done.returncode != 0:
            raise DemoError(f"fleetlet {' '.join(args[:2])}: {done.stderr.strip()}")
        return done.stdout.rstrip("\n")

    # -- waiting and reporting ---------------------------------------------------------------

    def all_ready(self) -> str | None:
        """None when every expected installation has its expected state, else what is not."""
        items = self.installations()
        for key, state in sorted(self.expected.items()):
            item = items.get(key)
            if item is None:
                return f"{key[0]}/{key[1]} not reported yet"
            if item["state"] != state:
                return f"{key[0]}/{key[1]} is {item['state']}"
        return None

    def wait_for(self, pending: Callable[[], str | None], goal: str) -> None:
        deadline = time.monotonic() + self.timeout
        last = ""
        while True:
            self._check_alive()
            try:
                missing = pending()
            except (OSError, ValueError, KeyError) as exc:  # the hub not listening yet
                missing = f"hub not answering yet ({exc.__class__.__name__})"
            if missing is None:
                return
            if missing != last:
                say(f"waiting for {goal}: {missing}")
                last = missing
            if time.monotonic() > deadline:
                raise DemoError(
                    f"timed out after {self.timeout:.0f}s waiting for {goal}: {missing}"
                )
            time.sleep(1.0)

    def summary(self, title: str) -> str:
        items = self.installations()
        rows = [("CLUSTER", "BUNDLE", "GROUP", "STATE", "SERIAL")]
        for (cluster, bundle), item in sorted(items.items()):
            serial = item.get("appliedSerial")
            rows.append(
                (cluster, bundle, str(item.get("group") or "-"), item["state"], str(serial or "-"))
            )
        widths = [max(len(r[i]) for r in rows) for i in range(5)]
        lines = [
            "  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)).rstrip() for r in rows
        ]
        return f"\n{title}\n\n" + "\n".join(lines)

    def wait_for_interrupt(self) -> None:
        stop = False

        def handler(signum: int, frame: FrameType | None) -> None:
            nonlocal stop
            stop = True

        for number in (signal.SIGINT, signal.SIGTERM):
            signal.signal(number, handler)
        with contextlib.suppress(KeyboardInterrupt):
            while not stop:
                self._check_alive()
                time.sleep(0.5)

    # -- helpers -----------------------------------------------------------------------------

    def directory(self, name: str) -> Path:
        path = self.workdir / name
        path.mkdir(parents=True, exist_ok=True)
        return path

    def _inventory(self) -> list[dict[str, Any]]:
        clusters: list[dict[str, Any]] = yaml.safe_load(
            (EXAMPLES / "clusters" / "inventory.yaml").read_text()
        )["clusters"]
        return clusters

    def kubectl_run(self, cluster: Any, *args: str) -> None:
        done = subprocess.run(
            [self.kubectl, "--kubeconfig", str(cluster.kubeconfig), *args],
            capture_output=True,
            text=True,
            timeout=120,
        )
        if done.returncode != 0:
            raise DemoError(f"kubectl {' '.join(args)} on {cluster.name}: {done.stderr.strip()}")

    def kubectl_out(self, cluster: Any, *args: str) -> str:
        done = subprocess.run(
            [self.kubectl, "--kubeconfig", str(cluster.kubeconfig), *args],
            capture_output=True,
            text=True,
            timeout=120,
        )
        if done.returncode != 0:
            raise DemoError(f"kubectl {' '.join(args)} on {cluster.name}: {done.stderr.strip()}")
        return done.stdout

    def kubectl_stdin(self, cluster: Any, stdin: str, *args: str) -> None:
        done = subprocess.run(
            [self.kubectl, "--kubeconfig", str(cluster.kubeconfig), *args],
            input=stdin,
            capture_output=True,
            text=True,
            timeout=120,
        )
        if done.returncode != 0:
            raise DemoError(f"kubectl {' '.join(args)} on {cluster.name}: {done.stderr.strip()}")

    def commit(self, message: str) -> None:
        _git(self.fleet, "add", "-A")
        _git(self.fleet, "-c", "user.name=demo", "-c", "user.email=demo@fleetlet.invalid",
             "commit", "-q", "-m", message)  # fmt: skip

    def publish(self) -> None:
        """``hub publish`` of the fleet, signed (it starts rollouts where a group has a
        strategy)."""
        from hub.publish.flow import prepare
        from hub.publish.git import BranchStore
        from hub.publish.shards import ShardedStore
        from hub.publish.sign import PublicationSigner
        from hub.rollout.controller import Controller

        signer = PublicationSigner.from_trust_config(
            trust_config=self.sigstore.trust_config_path, token=self.sigstore.mint_token()
        )
        with BranchStore(
            url=self.git.url_for("fleet-state.git"), cache_dir=self.directory("hub-publish")
        ) as store:
            result = Controller(sharded=ShardedStore.of(store)).publish(
                prepare(self.fleet), signer=signer, actor="demo"
            )
        assert result.publication is not None
        moved = ", ".join(
            f"{c.cluster} serial {c.serial_after}"
            for c in result.publication.changes
            if c.status != "unchanged"
        )
        say(f"published and signed once: {moved or 'nothing changed'}")
        for rid, event in result.events:
            say(f"rollout {rid}: {event.action}: {event.message}")

    def expected_states(self) -> dict[tuple[str, str], str]:
        """(cluster, bundle) -> the state it should reach: Paused where the set pauses it."""
        from hub.fleet.load import load_fleet
        from hub.fleet.render import plan_clusters

        fleet = load_fleet(self.fleet)
        pins = {s: s.ref for b in fleet.bundles for s in b.all_sources}
        out = {}
        for cluster, plan in plan_clusters(fleet, pins).items():
            for entry in plan.entries:
                out[(cluster, entry.name)] = "Paused" if entry.spec.paused else "Ready"
        return out

    def api_get(self, path: str) -> Any:
        import requests

        response = requests.get(
            f"{self.hub_url}/api/v1{path}",
            headers={"Authorization": f"Bearer {self.admin_token}"},
            timeout=10,
        )
        response.raise_for_status()
        return response.json()

    def installations(self) -> dict[tuple[str, str], dict[str, Any]]:
        return {(i["cluster"], i["bundle"]): i for i in self.api_get("/installations")["items"]}

    def installation(self, cluster: str, bundle: str) -> dict[str, Any]:
        found: dict[str, Any] = self.api_get(f"/installations/{cluster}/{bundle}")
        return found

    def _spawn(self, name: str, args: list[str]) -> None:
        log = self.directory("logs") / f"{name}.log"
        handle = log.open("wb")
        popen = subprocess.Popen(
            [sys.executable, "-m", "fleetlet", *args],
            cwd=REPO_ROOT,
            stdout=handle,
            stderr=subprocess.STDOUT,
            start_new_session=True,  # Ctrl-C reaches the demo, which stops them in order
        )
        handle.close()
        self.processes.append(Process(name=name, popen=popen, log=log))

    def _check_alive(self) -> None:
        """Raises DemoError when an agent or the hub has exited (with its log's tail)."""
        for process in self.processes:
            if not process.alive():
                raise DemoError(
                    f"{process.name} exited ({process.popen.returncode}):\n{process.tail()}"
                )

    def _stop_processes(self) -> None:
        for process in reversed(self.processes):
            process.stop()


def _git(where: Path, *args: str) -> None:
    done = subprocess.run(
        ["git", "-C", str(where), *args], capture_output=True, text=True, timeout=60
    )
    if done.returncode != 0:
        raise DemoError(f"git {' '.join(args)}: {done.stderr.strip()}")
