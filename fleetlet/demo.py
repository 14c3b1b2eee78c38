"""``fleetlet demo``: a whole fleet on this machine, on embedded defaults.

Three Kubernetes clusters (kube-apiserver, etcd, controller-manager, scheduler and kwok, as the
tests run them), a git server, an OCI registry and a local Sigstore, all on loopback; the
bundles of ``fleet-examples/`` pushed to the registry; the fleet published by the hub, signed;
one agent per cluster and the hub with its dashboard. It waits until every installation is
Ready, prints a summary and the dashboard's address, and keeps running until Ctrl-C, which
stops everything it started. ``--scenario failed-upgrade`` then gives the canary store a broken
upgrade of the ``shop`` group (and every store a good upgrade of ``payments-config``) and
waits for the canary's group to roll back while the others move on. ``--scenario approval``
makes ``payments-config`` need an approval and upgrades it: the production stores' own
ApprovalPolicy approves it automatically, the canary waits for a person, and the demo shows the
request's preview and approves it as that person (docs/approvals.md). ``--scenario rollout``
gives ``payments-config`` and the ``shop`` group rollout strategies (the canary store first):
payments-config v2 reaches the canary, is promoted to the production stores and completes; a
broken shop-backend v2 reaches the canary only, and the hub halts its rollout and publishes the
previous version back there (docs/rollouts.md).

Once the stores' agents have reported their age keys, the demo encrypts a small Secret
(``payments/payments-db``, a random password) with the real ``sops`` binary to the stores'
recipients (``fleetlet hub recipients``), commits the encrypted file to its fleet copy, pushes it
as the content of the bundle ``payments-db`` and publishes again: each store's agent decrypts it
at render (docs/secrets.md, fleet-examples/README.md). The plaintext stays in
``<workdir>/operator/``, outside every git repository. Without sops the demo says so and skips
that step only.

The demo runs from a source checkout: the components live in ``tests/realenv`` (test code, not
shipped in the wheels). ``python -m fleetlet.demo pin [--check]`` recomputes the digests the
example fleet pins from ``fleet-examples/content``.
"""

from __future__ import annotations

import argparse
import base64
import contextlib
import importlib
import os
import re
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from types import FrameType
from typing import Any

import yaml

from agent.errors import PermanentError
from hub.api.tokens import TokenEntry, token_digest, write_tokens

REPO_ROOT = Path(__file__).resolve().parent.parent
EXAMPLES = REPO_ROOT / "fleet-examples"
CONTENT = EXAMPLES / "content"
CRDS = REPO_ROOT / "crds"
AGENT_NAMESPACE = "fleetlet-system"
REGISTRY_PORT = 5000
PINNED_HOST = f"127.0.0.1:{REGISTRY_PORT}"
REPOSITORY_PREFIX = "retail/"
CANARY = "store-eu-1"
APPROVALS = REPO_ROOT / "deploy" / "agent" / "approvals"
AUTO_APPROVER = REPO_ROOT / "deploy" / "agent" / "auto-approver"
APPROVER = "alice"
SECRET_BUNDLE = "payments-db"  # the bundle of the encrypted Secret, added by the demo
SECRET_NAMESPACE = "payments"
SOPS_VERSION = "v3.13.3"  # the release the tests encrypt with (tests/realenv/binaries.py)
OPERATOR = "ops-oncall"  # the name of the demo's admin token: who promotes a rollout
# The production stores' own rule book: what touches no RBAC, CRD or webhook goes through.
APPROVAL_POLICY = {
    "apiVersion": "fleetlet.io/v1alpha1",
    "kind": "ApprovalPolicy",
    "metadata": {"name": "store-defaults"},
    "spec": {
        "rules": [
            {
                "name": "no-rbac-crds-webhooks",
                "description": "changes that grant nothing and extend no API",
                "expression": "preview.security.rbac.size() == 0 && "
                "preview.security.crds.size() == 0 && preview.security.webhooks.size() == 0",
            }
        ]
    },
}
_DIGEST_LINE = re.compile(r"^(\s*digest:\s*)(sha256:[0-9a-f]{64})\s*$", re.M)


class DemoError(PermanentError):
    """The demo could not start or did not reach its goal; the message says which part."""


def _say(message: str) -> None:
    print(f"[demo] {message}", file=sys.stderr, flush=True)


def _realenv() -> Any:
    """The test environment's modules (a source checkout is needed)."""
    # Imported by name: they are test code, outside the packages (and mypy's scope).
    names = ("binaries", "gitserver", "kube", "oci", "registry", "sigstore", "sigstore.mini")
    try:
        modules = {n: importlib.import_module(f"tests.realenv.{n}") for n in names}
    except ImportError as exc:
        raise DemoError(
            f"fleetlet demo runs from a source checkout of fleetlet (it starts the components "
            f"of tests/realenv): run `bash scripts/demo.sh` from the repository ({exc})"
        ) from exc
    return argparse.Namespace(**{n.rsplit(".", 1)[-1]: m for n, m in modules.items()})


# --- the example fleet's pins ---------------------------------------------------------------


def bundle_files(fleet: Path = EXAMPLES) -> dict[str, Path]:
    """Bundle name -> its file in the fleet directory."""
    out = {}
    for path in sorted((fleet / "bundles").glob("*.yaml")):
        name = yaml.safe_load(path.read_text())["name"]
        out[str(name)] = path
    return out


def content_digest(bundle: str, version: str) -> str:
    """The digest the artifact of ``content/<bundle>/<version>`` has (deterministic packing)."""
    directory = CONTENT / bundle / version
    if not directory.is_dir():
        raise DemoError(f"no content directory {directory}")
    digest: str = _realenv().oci.artifact_digest(directory)
    return digest


def pin(*, check: bool) -> list[str]:
    """Point every example bundle at the digest of its ``v1`` content; returns the bundles
    whose pin was stale (``check``: nothing rewritten)."""
    stale = []
    for name, path in bundle_files().items():
        text = path.read_text()
        match = _DIGEST_LINE.search(text)
        if match is None:
            raise DemoError(f"{path}: no `digest: sha256:...` line")
        want = content_digest(name, "v1")
        if match.group(2) != want:
            stale.append(name)
            if not check:
                path.write_text(text[: match.start(2)] + want + text[match.end(2) :])
    return stale


# --- the running fleet ----------------------------------------------------------------------


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
    """One demo run; :meth:`run` returns the exit code and always stops what it started."""

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
        self.env = _realenv()
        self.stack = contextlib.ExitStack()
        self.processes: list[Process] = []
        self.read_token = "read-" + secrets.token_urlsafe(18)
        self.admin_token = "admin-" + secrets.token_urlsafe(18)
        self.hub_url = ""
        self.expected: dict[tuple[str, str], str] = {}
        self.agent_extra: Callable[[str], list[str]] = lambda cluster: []
        """More flags of ``agent run`` for a cluster (bench/e2e_latency.py's channel)."""

    # -- the steps ---------------------------------------------------------------------------

    def run(self) -> int:
        with self.stack:
            try:
                return self.steps()
            finally:
                # A second Ctrl-C must not cut the teardown short and leave things running.
                for number in (signal.SIGINT, signal.SIGTERM):
                    signal.signal(number, signal.SIG_IGN)
                _say("stopping agents, hub, clusters, git server, registry and Sigstore")
                self._stop_processes()  # then the stack: clusters, Sigstore, git, registry

    def steps(self) -> int:
        self.start_components()
        self.push_content()
        self.publish_fleet()
        self.start_agents_and_hub()
        self.wait_for(self.all_ready, "every installation Ready")
        secret = self.encrypted_secret()
        print(self.summary("Every installation is Ready"), flush=True)
        if secret:
            print(secret, flush=True)
        if self.scenario == "failed-upgrade":
            self.failed_upgrade()
        elif self.scenario == "approval":
            self.approval()
        elif self.scenario == "rollout":
            self.rollout()
        elif self.scenario == "agent-upgrade":
            __import__("fleetlet.demo_agent_upgrade").demo_agent_upgrade.agent_upgrade(self)
        print(
            f"\nDashboard: {self.dashboard}\n"
            f"API: {self.hub_url}/api/v1 (read-only token: {self.read_token})\n"
            f"Logs and state: {self.workdir}",
            flush=True,
        )
        if self.exit_when_ready:
            return 0
        print("Press Ctrl-C to stop everything.", flush=True)
        self.wait_for_interrupt()
        return 0

    @property
    def dashboard(self) -> str:
        from hub.serve import dashboard_url

        return dashboard_url(self.hub_url, self.read_token)

    def start_components(self) -> None:
        env = self.env
        _say(
            "Kubernetes binaries: found in the cache, or built once from the Go module proxy "
            "(the first build takes about 8 minutes on 2 cores; progress follows)"
        )
        binaries = env.binaries.ensure_binaries(progress=sys.stderr)
        self.kubectl = str(binaries["kubectl"])
        port = _free_port(REGISTRY_PORT)
        _say(f"OCI registry on 127.0.0.1:{port}, git daemon, local Sigstore")
        self.registry = env.registry.Registry(workdir=self._dir("registry"), port=port)
        self.registry.start()
        self.stack.callback(self.registry.stop)
        self.git = env.gitserver.GitDaemon(workdir=self._dir("git"))
        self.git.start()
        self.stack.callback(self.git.stop)
        self.git.create_bare("fleet-state.git")
        self.git.create_bare("fleet-status.git")
        self.sigstore = self.stack.enter_context(
            env.sigstore.MiniSigstore(workdir=self._dir("sigstore"), rekor_version=1)
        )
        names = [c["name"] for c in self._inventory()]
        _say(f"starting {len(names)} clusters: {', '.join(names)} (about a minute)")
        self.clusters = {
            name: env.kube.Cluster(
                name=name, workdir=self._dir(f"clusters/{name}"), binaries=binaries
            )
            for name in names
        }
        for cluster in self.clusters.values():
            self.stack.callback(cluster.stop)
        env.kube.start_clusters(list(self.clusters.values()))
        for name, cluster in self.clusters.items():
            self._kubectl(cluster, "apply", "--server-side", "-f", str(CRDS))
            self._kubectl(cluster, "create", "namespace", AGENT_NAMESPACE)
            _say(f"cluster {name}: API server {cluster.server}, fleetlet CRDs installed")

    def push_content(self) -> None:
        client = self.env.oci.OciClient(host=self.registry.host)
        self.digests: dict[tuple[str, str], str] = {}
        for bundle_dir in sorted(p for p in CONTENT.iterdir() if p.is_dir()):
            for version in sorted(p for p in bundle_dir.iterdir() if p.is_dir()):
                pushed = self.env.oci.push_bundle(
                    client, REPOSITORY_PREFIX + bundle_dir.name, version, tag=version.name
                )
                self.digests[(bundle_dir.name, version.name)] = pushed.digest
        _say(f"pushed {len(self.digests)} bundle artifacts to {self.registry.host}")

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
        self._commit("the example fleet")
        for name, path in bundle_files(fleet).items():
            want = self.digests.get((name, "v1"))
            if want is None or want not in path.read_text():
                raise DemoError(
                    f"{path.name}: its digest is not the one of content/{name}/v1 ({want}); "
                    "run `python -m fleetlet.demo pin`"
                )
        self._publish()
        self.expected = self._expected()

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
                    "--cache-dir", str(self._dir(f"agents/{name}")),
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
                "--cache-dir", str(self._dir("hub-cache")),
                "--cluster-repo", self.git.url_for("fleet-state.git"),
                "--trust-config", str(self.sigstore.trust_config_path),
                "--identity-token", str(identity),
                "--rollout-interval", "2s",
            ],
        )  # fmt: skip
        _say(f"{len(self.clusters)} agents and the hub started; waiting for the fleet to settle")

    def encrypted_secret(self) -> str | None:
        """Encrypt a Secret to the stores' age recipients with sops, commit it to the fleet
        copy, push it as ``payments-db``'s content, publish and wait until every store has it.

        Returns the line the summary prints, or None when sops is missing (said in one line).
        """
        sops = _find_sops()
        if sops is None:
            _say(
                f"sops is not installed (not on PATH, not in the cache): skipping the encrypted "
                f"Secret (`python3 -m tests.realenv.binaries sops` builds {SOPS_VERSION})"
            )
            return None
        status_repo = self.git.url_for("fleet-status.git")
        listed: list[str] = []

        def reported() -> str | None:
            try:
                out = self._fleetlet("hub", "recipients", str(self.fleet),
                                     "--status-repo", status_repo)  # fmt: skip
            except DemoError as exc:
                return str(exc).splitlines()[-1]
            listed[:] = [out.strip()]
            return None

        self.wait_for(reported, "every store's age key (fleetlet hub recipients)")
        recipients = listed[0]
        # The operator's side: the Secret in clear, in a directory of no git repository.
        operator = self._dir("operator")
        operator.chmod(0o700)
        password = "pdb-" + secrets.token_urlsafe(18)
        plain = operator / f"{SECRET_BUNDLE}.yaml"
        plain.touch(mode=0o600)
        plain.write_text(
            yaml.safe_dump(
                {
                    "apiVersion": "v1",
                    "kind": "Secret",
                    "metadata": {"name": SECRET_BUNDLE, "namespace": SECRET_NAMESPACE},
                    "type": "Opaque",
                    "stringData": {"username": "payments", "password": password},
                },
                sort_keys=False,
            )
        )
        done = subprocess.run(
            [str(sops), "--encrypt", "--age", recipients,
             "--encrypted-regex", "^(data|stringData)$", plain.name],
            cwd=operator, capture_output=True, text=True, timeout=120,
            env={k: v for k, v in os.environ.items() if not k.startswith("SOPS_")},
        )  # fmt: skip
        if done.returncode != 0:
            raise DemoError(f"sops --encrypt: {done.stderr.strip()}")
        if password in done.stdout:
            raise DemoError("sops --encrypt left the password in clear")
        content = self.fleet / "secrets" / SECRET_BUNDLE
        content.mkdir(parents=True, exist_ok=True)
        (content / "01_secret.yaml").write_text(done.stdout)
        pushed = self.env.oci.push_bundle(
            self.env.oci.OciClient(host=self.registry.host),
            REPOSITORY_PREFIX + SECRET_BUNDLE, content, tag="v1",
        )  # fmt: skip
        bundle = {
            "name": SECRET_BUNDLE,
            "sources": [
                {
                    "kind": "image",
                    "uri": f"{self.registry.host}/{REPOSITORY_PREFIX}{SECRET_BUNDLE}",
                    "digest": pushed.digest,
                }
            ],
            "formatOptions": {"targetNamespace": SECRET_NAMESPACE},
            "dependsOn": ["payments-config"],  # its namespace
            "targets": [{"clusterSelector": {}}],
        }
        (self.fleet / "bundles" / f"{SECRET_BUNDLE}.yaml").write_text(
            "# The database password of the payment gateway: secrets/payments-db/01_secret.yaml,\n"
            "# encrypted with sops to every store's age key (fleet-examples/README.md).\n"
            + yaml.safe_dump(bundle, sort_keys=False)
        )
        self._commit("payments-db: a Secret encrypted with sops to the stores' age keys")
        _say(
            f"encrypted Secret {SECRET_NAMESPACE}/{SECRET_BUNDLE} with {sops} to "
            f"{len(recipients.split(','))} age recipients; committed and pushed, publishing"
        )
        self._publish()
        self.expected = self._expected()
        self.wait_for(self.all_ready, f"every store to decrypt and apply {SECRET_BUNDLE}")
        for name, cluster in self.clusters.items():
            encoded = self._kubectl_out(
                cluster, "-n", SECRET_NAMESPACE, "get", "secret", SECRET_BUNDLE,
                "-o", "jsonpath={.data.password}",
            )  # fmt: skip
            if base64.b64decode(encoded).decode(errors="replace") != password:
                raise DemoError(f"{name}: Secret {SECRET_NAMESPACE}/{SECRET_BUNDLE} not decrypted")
        return (
            f"\nSecret {SECRET_NAMESPACE}/{SECRET_BUNDLE}: encrypted with sops to the stores' "
            f"age keys (only the ciphertext is in git), decrypted by each store's agent: in "
            f"{', '.join(self.clusters)}. In clear only in {plain}"
        )

    def failed_upgrade(self) -> None:
        """The canary's shop group gets a broken v2 and rolls back; every store gets a good
        payments-config v2."""
        files = bundle_files(self.fleet)
        backend = yaml.safe_load(files["shop-backend"].read_text())
        source = dict(backend["sources"][0], digest=self.digests[("shop-backend", "v2")])
        backend["overrides"] = [
            {"clusterSelector": {"matchLabels": {"tier": "canary"}}, "sources": [source]}
        ]
        files["shop-backend"].write_text(yaml.safe_dump(backend, sort_keys=False))
        payments = yaml.safe_load(files["payments-config"].read_text())
        payments["sources"][0]["digest"] = self.digests[("payments-config", "v2")]
        files["payments-config"].write_text(yaml.safe_dump(payments, sort_keys=False))
        self._commit("shop-backend v2 to the canary; payments-config v2 everywhere")
        before = {k: self._installation(*k).get("appliedSerial") for k in self.expected}
        _say(
            f"scenario failed-upgrade: shop-backend v2 (its catalog-api image is broken) to the "
            f"canary {CANARY}, payments-config v2 to every store"
        )
        self._publish()

        def settled() -> str | None:
            items = self._items()
            for (cluster, bundle), _ in self.expected.items():
                item = items.get((cluster, bundle))
                if item is None:
                    return f"{cluster}/{bundle} not reported"
                if cluster == CANARY and bundle in ("shop-backend", "shop-frontend"):
                    if item["state"] != "RolledBack":
                        return f"{cluster}/{bundle} is {item['state']}, not RolledBack yet"
                elif bundle == "payments-config" and (
                    item["state"] != "Ready"
                    or item.get("appliedSerial") == before[(cluster, bundle)]
                ):
                    return f"{cluster}/{bundle} not on the new serial yet"
            return None

        self.wait_for(settled, "the canary's shop group rolled back and payments-config upgraded")
        detail = self._installation(CANARY, "shop-backend")
        ready: dict[str, Any] = next(
            (c for c in detail.get("conditions", []) if c.get("type") == "Ready"), {}
        )
        print(
            self.summary(
                f"Scenario failed-upgrade: the shop group on {CANARY} rolled back "
                f"({ready.get('message', '')[:300]}); payments-config moved on everywhere"
            ),
            flush=True,
        )

    def approval(self) -> None:
        """payments-config needs an approval and gets v2: the production stores' ApprovalPolicy
        approves it, the canary waits for alice, who previews and approves it."""
        for name, cluster in self.clusters.items():
            self._kubectl(cluster, "apply", "--server-side", "-k", str(APPROVALS))
            if name != CANARY:
                self._kubectl(cluster, "apply", "--server-side", "-k", str(AUTO_APPROVER))
                self._kubectl_stdin(cluster, yaml.safe_dump(APPROVAL_POLICY), "apply", "-f", "-")
        canary = self.clusters[CANARY]
        alice = canary.mint_user(APPROVER)
        self._kubectl(
            canary, "create", "clusterrolebinding", "alice-approves",
            "--clusterrole=fleetlet-approver", f"--user={APPROVER}",
        )  # fmt: skip
        _say(
            f"scenario approval: ValidatingAdmissionPolicy fleetlet-approvals on every store; "
            f"ApprovalPolicy store-defaults on the production stores; {APPROVER} may approve "
            f"on {CANARY}"
        )
        files = bundle_files(self.fleet)
        payments = yaml.safe_load(files["payments-config"].read_text())
        payments["sources"][0]["digest"] = self.digests[("payments-config", "v2")]
        payments["approval"] = "manual"
        files["payments-config"].write_text(yaml.safe_dump(payments, sort_keys=False))
        self._commit("payments-config v2, approval: manual")
        before = {c: self._installation(c, "payments-config").get("appliedSerial")
                  for c in self.clusters}  # fmt: skip
        self._publish()

        def asked() -> str | None:
            items = self._items()
            for cluster in self.clusters:
                item = items.get((cluster, "payments-config")) or {}
                state = item.get("state", "not reported")
                if cluster == CANARY:
                    if state != "AwaitingApproval":
                        return f"{cluster}/payments-config is {state}, not AwaitingApproval yet"
                elif state != "Ready" or item.get("appliedSerial") == before[cluster]:
                    return f"{cluster}/payments-config not approved and upgraded yet"
            return None

        self.wait_for(asked, "the production stores upgraded, the canary asking for approval")
        request = self._pending_request(CANARY, "payments-config")
        preview = self._fleetlet("preview", request, "--kubeconfig", alice)
        print(f"\n$ fleetlet preview {request}\n{preview}", flush=True)
        approved = self._fleetlet(
            "approve", request, "--kubeconfig", alice, "--reason", "new gateway endpoint, reviewed"
        )
        print(f"\n$ fleetlet approve {request} --reason ...\n{approved}", flush=True)

        def moved() -> str | None:
            item = self._items().get((CANARY, "payments-config"))
            if (
                item is None
                or item["state"] != "Ready"
                or item.get("appliedSerial") == before[CANARY]
            ):
                return f"{CANARY}/payments-config not upgraded yet"
            return None

        self.wait_for(moved, f"{CANARY} to apply the approved request")
        print(
            self.summary(
                f"Scenario approval: payments-config v2 approved by ApprovalPolicy "
                f"store-defaults on the production stores and by {APPROVER} on {CANARY}"
            ),
            flush=True,
        )

    def rollout(self) -> None:
        """payments-config v2 goes canary first, is promoted to the production stores and
        completes; a broken shop-backend v2 reaches the canary only and is reverted there."""
        strategy = {
            "waves": [
                {"name": "canary", "clusterSelector": {"matchLabels": {"tier": "canary"}}},
                {"name": "production", "pauseBefore": True},
            ],
            "maxFailures": 0,
            "soakTime": "5s",
            "progressDeadline": "5m",
            "onFailure": "revert",
        }
        files = bundle_files(self.fleet)
        payments = yaml.safe_load(files["payments-config"].read_text())
        payments["sources"][0]["digest"] = self.digests[("payments-config", "v2")]
        payments["rollout"] = strategy
        files["payments-config"].write_text(yaml.safe_dump(payments, sort_keys=False))
        self._commit("payments-config v2, rolled out canary first")
        before = {c: self._installation(c, "payments-config").get("appliedSerial")
                  for c in self.clusters}  # fmt: skip
        _say(
            "scenario rollout: payments-config v2 with a rollout strategy (the canary store, "
            "then the production stores once promoted); the hub runs the rollout controller"
        )
        self._publish()
        payments_id = self._rollout_of("payments-config")["id"]

        def gated() -> str | None:
            found = self._rollout(payments_id)
            if found["status"] != "WaitingForPromotion":
                return f"rollout {payments_id} is {found['status']}"
            return None

        self.wait_for(gated, f"{CANARY} Ready on payments-config v2 and the next wave gated")
        for cluster in self.clusters:
            if (
                cluster != CANARY
                and self._installation(cluster, "payments-config").get("appliedSerial")
                != before[cluster]
            ):
                raise DemoError(f"{cluster} got payments-config v2 before its wave")
        print(f"\n$ fleetlet hub rollout status {payments_id}", flush=True)
        print(
            self._fleetlet("hub", "rollout", "status", payments_id, *self._hub_args()), flush=True
        )
        promoted = self._fleetlet(
            "hub", "rollout", "promote", payments_id, "--reason", "the canary is fine",
            *self._hub_args(),
        )  # fmt: skip
        print(
            f"\n$ fleetlet hub rollout promote {payments_id} --reason ...\n{promoted}", flush=True
        )

        def completed() -> str | None:
            found = self._rollout(payments_id)
            return None if found["status"] == "Completed" else f"rollout is {found['status']}"

        self.wait_for(completed, "payments-config v2 on every store")

        # A broken shop-backend v2 (its catalog-api image never gets ready), same strategy.
        files = bundle_files(self.fleet)
        backend = yaml.safe_load(files["shop-backend"].read_text())
        backend["sources"][0]["digest"] = self.digests[("shop-backend", "v2")]
        backend["rollout"] = strategy
        files["shop-backend"].write_text(yaml.safe_dump(backend, sort_keys=False))
        self._commit("shop-backend v2, rolled out canary first")
        _say("scenario rollout: shop-backend v2 (broken) with the same strategy")
        self._publish()
        shop_id = self._rollout_of("shop")["id"]

        def reverted() -> str | None:
            found = self._rollout(shop_id)
            if found["status"] != "Reverted":
                return f"rollout {shop_id} is {found['status']}"
            counts = found["counts"]
            if counts.get("reverted", 0) < 1:
                return "the previous version not yet back on the canary's branch"
            return None

        self.wait_for(reverted, f"{CANARY} to fail shop-backend v2 and the hub to revert it")

        def back() -> str | None:
            for bundle in ("shop-backend", "shop-frontend"):
                item = self._installation(CANARY, bundle)
                if item["state"] != "Ready":
                    return f"{CANARY}/{bundle} is {item['state']}"
            return None

        self.wait_for(back, f"{CANARY} to accept the previous shop version and report it Ready")
        print(f"\n$ fleetlet hub rollout status {shop_id}", flush=True)
        print(self._fleetlet("hub", "rollout", "status", shop_id, *self._hub_args()), flush=True)
        print(
            self.summary(
                f"Scenario rollout: payments-config v2 promoted by {OPERATOR} and completed; "
                f"shop-backend v2 halted on {CANARY} and reverted, never sent to the other stores"
            ),
            flush=True,
        )

    def _hub_args(self) -> list[str]:
        return ["--hub", self.hub_url, "--token-file", str(self.admin_token_file)]

    def _rollout(self, rollout_id: str) -> dict[str, Any]:
        found: dict[str, Any] = self._get(f"/rollouts/{rollout_id}")
        return found

    def _rollout_of(self, group: str) -> dict[str, Any]:
        for item in self._get("/rollouts")["items"]:
            if item["group"] == group and item["status"] != "Superseded":
                found: dict[str, Any] = item
                return found
        raise DemoError(f"no rollout of group {group} started")

    def _pending_request(self, cluster: str, bundle: str) -> str:
        for request in self._installation(cluster, bundle).get("requests", []):
            if request.get("state") == "Pending":
                return str(request["name"])
        raise DemoError(f"{cluster}/{bundle}: no pending request reported")

    def _fleetlet(self, *args: str) -> str:
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
        items = self._items()
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
                _say(f"waiting for {goal}: {missing}")
                last = missing
            if time.monotonic() > deadline:
                raise DemoError(
                    f"timed out after {self.timeout:.0f}s waiting for {goal}: {missing}"
                )
            time.sleep(1.0)

    def summary(self, title: str) -> str:
        items = self._items()
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

    def _dir(self, name: str) -> Path:
        path = self.workdir / name
        path.mkdir(parents=True, exist_ok=True)
        return path

    def _inventory(self) -> list[dict[str, Any]]:
        clusters: list[dict[str, Any]] = yaml.safe_load(
            (EXAMPLES / "clusters" / "inventory.yaml").read_text()
        )["clusters"]
        return clusters

    def _kubectl(self, cluster: Any, *args: str) -> None:
        done = subprocess.run(
            [self.kubectl, "--kubeconfig", str(cluster.kubeconfig), *args],
            capture_output=True,
            text=True,
            timeout=120,
        )
        if done.returncode != 0:
            raise DemoError(f"kubectl {' '.join(args)} on {cluster.name}: {done.stderr.strip()}")

    def _kubectl_out(self, cluster: Any, *args: str) -> str:
        done = subprocess.run(
            [self.kubectl, "--kubeconfig", str(cluster.kubeconfig), *args],
            capture_output=True,
            text=True,
            timeout=120,
        )
        if done.returncode != 0:
            raise DemoError(f"kubectl {' '.join(args)} on {cluster.name}: {done.stderr.strip()}")
        return done.stdout

    def _kubectl_stdin(self, cluster: Any, stdin: str, *args: str) -> None:
        done = subprocess.run(
            [self.kubectl, "--kubeconfig", str(cluster.kubeconfig), *args],
            input=stdin,
            capture_output=True,
            text=True,
            timeout=120,
        )
        if done.returncode != 0:
            raise DemoError(f"kubectl {' '.join(args)} on {cluster.name}: {done.stderr.strip()}")

    def _commit(self, message: str) -> None:
        _git(self.fleet, "add", "-A")
        _git(self.fleet, "-c", "user.name=demo", "-c", "user.email=demo@fleetlet.invalid",
             "commit", "-q", "-m", message)  # fmt: skip

    def _publish(self) -> None:
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
            url=self.git.url_for("fleet-state.git"), cache_dir=self._dir("hub-publish")
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
        _say(f"published and signed once: {moved or 'nothing changed'}")
        for rid, event in result.events:
            _say(f"rollout {rid}: {event.action}: {event.message}")

    def _expected(self) -> dict[tuple[str, str], str]:
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

    def _get(self, path: str) -> Any:
        import requests

        response = requests.get(
            f"{self.hub_url}/api/v1{path}",
            headers={"Authorization": f"Bearer {self.admin_token}"},
            timeout=10,
        )
        response.raise_for_status()
        return response.json()

    def _items(self) -> dict[tuple[str, str], dict[str, Any]]:
        return {(i["cluster"], i["bundle"]): i for i in self._get("/installations")["items"]}

    def _installation(self, cluster: str, bundle: str) -> dict[str, Any]:
        found: dict[str, Any] = self._get(f"/installations/{cluster}/{bundle}")
        return found

    def _spawn(self, name: str, args: list[str]) -> None:
        log = self._dir("logs") / f"{name}.log"
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


def _find_sops() -> Path | None:
    """The sops binary: on PATH, else the pinned release in the tools cache (where
    scripts/install.sh builds it, beside helm and kustomize), else None."""
    from agent.render.tools import default_cache_root

    on_path = shutil.which("sops")
    if on_path is not None:
        return Path(on_path)
    cached = default_cache_root() / "tools" / f"sops-{SOPS_VERSION}" / "sops"
    return cached if cached.is_file() and os.access(cached, os.X_OK) else None


def _git(where: Path, *args: str) -> None:
    done = subprocess.run(
        ["git", "-C", str(where), *args], capture_output=True, text=True, timeout=60
    )
    if done.returncode != 0:
        raise DemoError(f"git {' '.join(args)}: {done.stderr.strip()}")


def run_demo(args: argparse.Namespace) -> int:
    """The ``fleetlet demo`` command. Raises DemoError (the part that failed)."""
    keep = args.workdir is not None
    workdir = Path(args.workdir) if keep else Path(tempfile.mkdtemp(prefix="fleetlet-demo-"))
    workdir.mkdir(parents=True, exist_ok=True)
    demo = Demo(
        workdir=workdir,
        scenario=args.scenario,
        exit_when_ready=args.exit_when_ready,
        timeout=args.timeout,
        interval=args.interval,
    )

    def interrupted(signum: int, frame: FrameType | None) -> None:
        raise KeyboardInterrupt

    # SIGINT too: a shell starting the demo in the background hands it SIGINT ignored.
    previous = {s: signal.signal(s, interrupted) for s in (signal.SIGINT, signal.SIGTERM)}
    try:
        return demo.run()
    finally:
        for number, handler in previous.items():
            signal.signal(number, handler)
        if not keep:
            shutil.rmtree(workdir, ignore_errors=True)


def main(argv: list[str] | None = None) -> int:
    """``python -m fleetlet.demo pin [--check]``."""
    parser = argparse.ArgumentParser(prog="python -m fleetlet.demo")
    sub = parser.add_subparsers(dest="command", required=True)
    pin_cmd = sub.add_parser("pin", help="pin the example bundles to their content's digests")
    pin_cmd.add_argument("--check", action="store_true", help="only check; exit 1 when stale")
    args = parser.parse_args(argv)
    stale = pin(check=args.check)
    for name in stale:
        print(f"{name}: {'stale pin' if args.check else 'pinned anew'}")
    return 1 if args.check and stale else 0


if __name__ == "__main__":
    raise SystemExit(main())
