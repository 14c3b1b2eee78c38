"""A real Kubernetes control plane on loopback: etcd, kube-apiserver, kube-controller-manager,
kube-scheduler and kwok (fake nodes, so pods really get scheduled and Deployments become
Available), each a process of its own logging to a file.

Certificates come from ``cryptography``: one CA signs the apiserver's serving certificate and
every client certificate (admin in ``system:masters``, the controller-manager and scheduler under
their bootstrap RBAC names, and users minted by tests). Every port is a free loopback port and
every file lives under the cluster's own directory, so several clusters run side by side.
"""

from __future__ import annotations

import atexit
import base64
import contextlib
import ctypes
import datetime
import ipaddress
import json
import os
import signal
import socket
import ssl
import subprocess
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Generator, Iterable, Mapping, Sequence
from pathlib import Path
from types import TracebackType
from typing import IO, Any

import yaml
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID
from kubernetes import client as k8s_client
from kubernetes import config as k8s_config

from tests.realenv.binaries import ensure_binaries

KWOK_STAGES = Path(__file__).parent / "kwok" / "stages.yaml"
# kwok manages only nodes carrying this annotation (see its start flags).
FAKE_NODE_ANNOTATION = ("kwok.x-k8s.io/node", "fake")
SERVICE_CIDR = "10.96.0.0/16"
POD_CIDR = "10.244.0.0/16"
# The controllers a workload-running cluster needs: workloads and their pods, namespace
# deletion, garbage collection of owned objects, ServiceAccounts with their tokens and the
# kube-root-ca.crt ConfigMap, nodes, endpoints. Starting fewer than all (`*`) roughly halves
# the controller-manager's start-up; pass ``controllers=("*",)`` for every default one.
CONTROLLERS = (
    "serviceaccount-token-controller",
    "serviceaccount-controller",
    "root-ca-certificate-publisher-controller",
    "namespace-controller",
    "garbage-collector-controller",
    "deployment-controller",
    "replicaset-controller",
    "statefulset-controller",
    "daemonset-controller",
    "job-controller",
    "cronjob-controller",
    "ttl-after-finished-controller",
    "disruption-controller",
    "node-lifecycle-controller",
    "pod-garbage-collector-controller",
    "endpointslice-controller",
    "clusterrole-aggregation-controller",
)


# A start-up step: the component waited on, and the probe that says it is ready.
_Step = tuple[str, Callable[[], bool]]


class ClusterError(RuntimeError):
    """The control plane failed to start or a component died (the message has its log tail)."""


def free_ports(count: int) -> list[int]:
    """``count`` distinct TCP ports free on 127.0.0.1 right now (the OS picks them)."""
    with contextlib.ExitStack() as stack:
        ports = []
        # All sockets stay bound until every port is picked, so the ports are distinct.
        for _ in range(count):
            sock = stack.enter_context(socket.socket(socket.AF_INET, socket.SOCK_STREAM))
            sock.bind(("127.0.0.1", 0))
            ports.append(int(sock.getsockname()[1]))
        return ports


def _log_tail(path: Path, lines: int = 40) -> str:
    try:
        text = path.read_text(errors="replace")
    except OSError:
        return "(no log)"
    return "\n".join(text.splitlines()[-lines:])


# --- certificates ------------------------------------------------------------------------------


def _new_key() -> ec.EllipticCurvePrivateKey:
    # P-256 keys are generated in microseconds (RSA takes tens of milliseconds each).
    return ec.generate_private_key(ec.SECP256R1())


def _key_pem(key: ec.EllipticCurvePrivateKey) -> bytes:
    return key.private_bytes(
        serialization.Encoding.PEM,
        serialization.PrivateFormat.PKCS8,
        serialization.NoEncryption(),
    )


def _cert_pem(cert: x509.Certificate) -> bytes:
    return cert.public_bytes(serialization.Encoding.PEM)


class _CertificateAuthority:
    """A self-signed CA that issues serving and client certificates for one cluster."""

    def __init__(self, *, common_name: str) -> None:
        self.key = _new_key()
        now = datetime.datetime.now(datetime.UTC)
        name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, common_name)])
        self.cert = (
            x509.CertificateBuilder()
            .subject_name(name)
            .issuer_name(name)
            .public_key(self.key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - datetime.timedelta(minutes=5))
            .not_valid_after(now + datetime.timedelta(days=2))
            .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
            .add_extension(
                x509.KeyUsage(
                    digital_signature=True,
                    content_commitment=False,
                    key_encipherment=False,
                    data_encipherment=False,
                    key_agreement=False,
                    key_cert_sign=True,
                    crl_sign=True,
                    encipher_only=False,
                    decipher_only=False,
                ),
                critical=True,
            )
            .add_extension(
                x509.SubjectKeyIdentifier.from_public_key(self.key.public_key()), critical=False
            )
            .sign(self.key, hashes.SHA256())
        )

    def issue(
        self,
        *,
        common_name: str,
        organizations: Iterable[str] = (),
        server_names: Iterable[str] = (),
        server_ips: Iterable[str] = (),
    ) -> tuple[bytes, bytes]:
        """Return ``(cert_pem, key_pem)``: a server certificate when names or IPs are given,
        else a client certificate (Kubernetes reads user = CN, groups = O)."""
        key = _new_key()
        now = datetime.datetime.now(datetime.UTC)
        attributes = [x509.NameAttribute(NameOID.COMMON_NAME, common_name)]
        attributes += [x509.NameAttribute(NameOID.ORGANIZATION_NAME, o) for o in organizations]
        sans: list[x509.GeneralName] = [x509.DNSName(n) for n in server_names]
        sans += [x509.IPAddress(ipaddress.ip_address(ip)) for ip in server_ips]
        usage = (
            x509.oid.ExtendedKeyUsageOID.SERVER_AUTH
            if sans
            else (x509.oid.ExtendedKeyUsageOID.CLIENT_AUTH)
        )
        builder = (
            x509.CertificateBuilder()
            .subject_name(x509.Name(attributes))
            .issuer_name(self.cert.subject)
            .public_key(key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - datetime.timedelta(minutes=5))
            .not_valid_after(now + datetime.timedelta(days=2))
            .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
            .add_extension(x509.ExtendedKeyUsage([usage]), critical=False)
            .add_extension(
                x509.AuthorityKeyIdentifier.from_issuer_public_key(self.key.public_key()),
                critical=False,
            )
        )
        if sans:
            builder = builder.add_extension(x509.SubjectAlternativeName(sans), critical=False)
        cert = builder.sign(self.key, hashes.SHA256())
        return _cert_pem(cert), _key_pem(key)


# --- processes ---------------------------------------------------------------------------------

# Strong references: a cluster dropped without stop() must still be stopped at exit.
_LIVE: set[Cluster] = set()


def _stop_all_live() -> None:
    for cluster in list(_LIVE):
        cluster.stop()


# Safety net: a test run that ends without its fixtures' finalizers still stops every process.
atexit.register(_stop_all_live)


# Loaded in the parent: the child between fork and exec must not import or allocate much.
_LIBC = ctypes.CDLL(None, use_errno=True)
_PR_SET_PDEATHSIG = 1


def _die_with_parent() -> None:
    """In the child: ask Linux to SIGKILL it when the parent dies (even by SIGKILL), so an
    aborted test run leaves no control plane behind."""
    _LIBC.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)


class _Process:
    """One component: a child process logging to a file in its own process group."""

    def __init__(self, *, name: str, argv: list[str], log_path: Path, cwd: Path) -> None:
        self.name = name
        self.log_path = log_path
        self._log: IO[bytes] = open(log_path, "ab")  # noqa: SIM115 - closed in stop()
        self._log.write(("$ " + " ".join(argv) + "\n").encode())
        self._log.flush()
        # The parent-death signal fires when the *thread* that forked dies, so only a process
        # started from the main thread may use it (fixtures start clusters there).
        on_main = threading.current_thread() is threading.main_thread()
        self.popen = subprocess.Popen(
            argv,
            stdin=subprocess.DEVNULL,
            stdout=self._log,
            stderr=subprocess.STDOUT,
            cwd=cwd,
            start_new_session=True,
            preexec_fn=_die_with_parent if on_main else None,
        )

    def exited(self) -> int | None:
        return self.popen.poll()

    def signal(self, sig: int) -> None:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(self.popen.pid, sig)

    def close_log(self) -> None:
        with contextlib.suppress(OSError):
            self._log.close()


def _stop_processes(processes: list[_Process], grace: float) -> None:
    """Stop ``processes`` one after the other, in the order given: SIGTERM, up to ``grace``
    seconds to exit, then SIGKILL. Every process is reaped and its log closed."""
    for proc in processes:
        if proc.exited() is None:
            proc.signal(signal.SIGTERM)
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.popen.wait(timeout=grace)
        if proc.exited() is None:
            proc.signal(signal.SIGKILL)
            proc.popen.wait()
        proc.close_log()


# --- the cluster -------------------------------------------------------------------------------


class Cluster:
    """One control plane. ``start()``/``stop()`` or use it as a context manager.

    ``start()`` raises :class:`ClusterError` (with the failing component's log tail) and leaves
    nothing running; ``stop()`` is idempotent and always safe.
    """

    def __init__(
        self,
        *,
        name: str,
        workdir: Path,
        nodes: int = 1,
        binaries: Mapping[str, Path] | None = None,
        start_timeout: float = 180.0,
        stop_grace: float = 5.0,
        controllers: Iterable[str] = CONTROLLERS,
    ) -> None:
        self.name = name
        self.workdir = Path(workdir)
        self.nodes = nodes
        self._binaries = dict(binaries) if binaries else None
        self._start_timeout = start_timeout
        self._stop_grace = stop_grace
        self._controllers = list(controllers)
        self._processes: list[_Process] = []
        self._started = False
        self._user_serial = 0
        self._kwok_port = 0
        self._argv: dict[str, list[str]] = {}
        self._lock = threading.Lock()
        self.etcd_url = ""
        self.server = ""
        self.logs_dir = self.workdir / "logs"
        self.pki_dir = self.workdir / "pki"
        self.ca_path = self.pki_dir / "ca.crt"
        self.kubeconfig = self.workdir / "admin.kubeconfig"
        self._ca: _CertificateAuthority | None = None
        self.start_seconds: float | None = None

    # -- public API -----------------------------------------------------------------------------

    @property
    def node_names(self) -> list[str]:
        """The names of the fake (kwok) nodes."""
        return [f"{self.name}-node-{i}" for i in range(self.nodes)]

    def start(self) -> Cluster:
        """Start every component and wait until the cluster is usable.

        Usable means: ``/readyz`` answers ok, the ``default`` ServiceAccount exists in ``default``
        (the controller-manager works) and every fake node is Ready (kwok works). Raises
        :class:`ClusterError`; on any failure everything started so far is stopped.
        """
        start_clusters([self])
        return self

    def stop(self, *, grace: float | None = None) -> None:
        """Stop every process (SIGTERM, then SIGKILL after ``grace`` seconds, by default the
        constructor's ``stop_grace``). Idempotent."""
        with self._lock:
            processes, self._processes = self._processes, []
        # Reverse start order: the apiserver's clients first, etcd last. Stopping etcd while
        # the apiserver still runs makes the apiserver hang for minutes in its shutdown.
        _stop_processes(list(reversed(processes)), self._stop_grace if grace is None else grace)
        self._started = False
        _LIVE.discard(self)

    def __enter__(self) -> Cluster:
        return self.start()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()

    def api_client(self) -> k8s_client.ApiClient:
        """A new ``kubernetes`` ApiClient authenticated as the admin (``system:masters``)."""
        return self.client_for(self.kubeconfig)

    @staticmethod
    def client_for(kubeconfig: Path | str) -> k8s_client.ApiClient:
        """A new ``kubernetes`` ApiClient for any kubeconfig file (e.g. one from ``mint_user``)."""
        loader: Callable[..., k8s_client.ApiClient] = k8s_config.new_client_from_config
        return loader(config_file=str(kubeconfig))

    def mint_user(self, name: str, groups: Iterable[str] = ()) -> str:
        """Issue a client certificate for user ``name`` in ``groups``; return its kubeconfig path.

        The user has no permissions beyond what RBAC grants ``name``/``groups`` (and the
        built-in ``system:authenticated`` discovery roles).
        """
        ca = self._require_ca()
        cert, key = ca.issue(common_name=name, organizations=list(groups))
        with self._lock:
            self._user_serial += 1
            serial = self._user_serial
        safe = "".join(c if c.isalnum() or c in "-_." else "_" for c in name)
        path = self.workdir / "users" / f"{serial:03d}-{safe}.kubeconfig"
        path.parent.mkdir(parents=True, exist_ok=True)
        self._write_kubeconfig(path, user=name, cert_pem=cert, key_pem=key)
        return str(path)

    def version(self) -> dict[str, Any]:
        """The apiserver's ``/version`` document."""
        document: dict[str, Any] = json.loads(self._get("/version"))
        return document

    def log_path(self, component: str) -> Path:
        """The log file of ``component`` (``etcd``, ``kube-apiserver``, ``kwok``, ...)."""
        return self.logs_dir / f"{component}.log"

    def stop_apiserver(self) -> None:
        """Stop the apiserver alone (an outage: clients get connection refused on the same URL).

        The other components keep running and retry, as in a real cluster. Idempotent.
        """
        with self._lock:
            gone = [p for p in self._processes if p.name == "kube-apiserver"]
            self._processes = [p for p in self._processes if p.name != "kube-apiserver"]
        _stop_processes(gone, self._stop_grace)

    def restart_controllers(self) -> None:
        """Restart the controller-manager, the scheduler and kwok (same arguments).

        After an API server restart their informers reconnect with client-go's backoff: a
        Deployment update can then go unseen for a minute. Tests of a client (the agent) that
        should not wait on that restart them instead. Raises :class:`ClusterError`.
        """
        names = ("kube-controller-manager", "kube-scheduler", "kwok")
        with self._lock:
            gone = [p for p in self._processes if p.name in names]
            self._processes = [p for p in self._processes if p.name not in names]
        _stop_processes(gone, 0.5)
        # The stopped kwok holds its nodes' Leases: a new one would wait for them to expire
        # (--node-lease-duration-seconds, 40 s) before it marks any pod Ready.
        for node in self.node_names:
            self._delete(f"/apis/coordination.k8s.io/v1/namespaces/kube-node-lease/leases/{node}")
        for name in names:
            self._spawn(name, self._argv[name])
        self._check_alive()

    def freeze_apiserver(self) -> None:
        """SIGSTOP the apiserver: connections are accepted (by the kernel) and never answered,
        as a hung server; the other components wait. :meth:`thaw_apiserver` resumes it."""
        for proc in self._processes:
            if proc.name == "kube-apiserver":
                proc.signal(signal.SIGSTOP)

    def thaw_apiserver(self) -> None:
        """SIGCONT after :meth:`freeze_apiserver`; returns once it answers again."""
        for proc in self._processes:
            if proc.name == "kube-apiserver":
                proc.signal(signal.SIGCONT)
        deadline = time.monotonic() + 60
        while not self._apiserver_ready():
            self._check_alive()
            if time.monotonic() > deadline:
                raise self._timed_out("kube-apiserver")
            time.sleep(0.05)

    def start_apiserver(self, *, timeout: float = 120.0) -> None:
        """Start the apiserver again after :meth:`stop_apiserver` (same port, certificates and
        data) and wait until ``/readyz`` is ok. Raises :class:`ClusterError`."""
        if not self._started:
            raise ClusterError(f"cluster {self.name} is not started")
        if any(p.name == "kube-apiserver" for p in self._processes):
            return
        self._spawn("kube-apiserver", self._argv["kube-apiserver"])
        deadline = time.monotonic() + timeout
        while not self._apiserver_ready():
            self._check_alive()
            if time.monotonic() > deadline:
                raise self._timed_out("kube-apiserver")
            time.sleep(0.1)

    # -- start-up -------------------------------------------------------------------------------

    def _phases(self) -> Generator[_Step, None, None]:
        """Start the components step by step; yield ``(component, ready)`` wherever start-up
        must wait until ``ready()`` is true (the driver, :func:`start_clusters`, polls it)."""
        binaries = self._binaries or ensure_binaries()
        for sub in ("logs", "pki", "etcd"):
            # 0700: etcd warns about (and a real cluster would not have) a readable data dir.
            (self.workdir / sub).mkdir(mode=0o700, parents=True, exist_ok=True)
        self._write_pki()

        etcd_client, etcd_peer, api_port, self._kwok_port = free_ports(4)
        self.etcd_url = f"http://127.0.0.1:{etcd_client}"
        self._spawn("etcd", [str(binaries["etcd"]), *self._etcd_args(etcd_client, etcd_peer)])

        self.server = f"https://127.0.0.1:{api_port}"
        self._write_kubeconfigs()
        self._spawn(
            "kube-apiserver", [str(binaries["kube-apiserver"]), *self._apiserver_args(api_port)]
        )
        yield "kube-apiserver", self._apiserver_ready

        # The rest only talk to the apiserver, which is up now: start them together.
        self._spawn(
            "kube-controller-manager",
            [str(binaries["kube-controller-manager"]), *self._controller_manager_args()],
        )
        self._spawn("kube-scheduler", [str(binaries["kube-scheduler"]), *self._scheduler_args()])
        self._spawn("kwok", [str(binaries["kwok"]), *self._kwok_args()])
        api = self.api_client()
        try:
            core = k8s_client.CoreV1Api(api)
            for node in self.node_names:
                core.create_node(self._node_manifest(node))
            yield "kube-controller-manager", lambda: self._default_sa_exists(core)
            yield "kwok", lambda: self._nodes_ready(core)
        finally:
            api.close()

    def _spawn(self, component: str, argv: list[str]) -> None:
        self._argv[component] = argv
        proc = _Process(
            name=component, argv=argv, log_path=self.log_path(component), cwd=self.workdir
        )
        with self._lock:
            self._processes.append(proc)

    def _check_alive(self) -> None:
        """Raise ClusterError naming the first component that has exited, with its log tail."""
        for proc in self._processes:
            code = proc.exited()
            if code is not None:
                raise ClusterError(
                    f"cluster {self.name}: {proc.name} exited with code {code} during "
                    f"start-up; last lines of {proc.log_path}:\n{_log_tail(proc.log_path)}"
                )

    def _timed_out(self, component: str) -> ClusterError:
        log = self.log_path(component)
        return ClusterError(
            f"cluster {self.name}: {component} not ready after {self._start_timeout:.0f} s;"
            f" last lines of {log}:\n{_log_tail(log)}"
        )

    def _ssl_context(self) -> ssl.SSLContext:
        context = ssl.create_default_context(cafile=str(self.ca_path))
        context.load_cert_chain(self.pki_dir / "admin.crt", self.pki_dir / "admin.key")
        return context

    def _get(self, path: str, timeout: float = 5.0) -> bytes:
        with urllib.request.urlopen(
            self.server + path, context=self._ssl_context(), timeout=timeout
        ) as response:
            return bytes(response.read())

    def _delete(self, path: str, timeout: float = 5.0) -> None:
        """DELETE ``path``; gone already is fine."""
        request = urllib.request.Request(self.server + path, method="DELETE")
        try:
            with urllib.request.urlopen(request, context=self._ssl_context(), timeout=timeout):
                pass
        except urllib.error.HTTPError as exc:
            if exc.code != 404:
                raise

    def _apiserver_ready(self) -> bool:
        try:
            return self._get("/readyz", timeout=2.0).strip() == b"ok"
        except (urllib.error.URLError, OSError):
            return False

    @staticmethod
    def _default_sa_exists(core: k8s_client.CoreV1Api) -> bool:
        core.read_namespaced_service_account("default", "default", _request_timeout=5)
        return True

    def _nodes_ready(self, core: k8s_client.CoreV1Api) -> bool:
        for name in self.node_names:
            node = core.read_node_status(name, _request_timeout=5)
            status = node.status
            conditions = {c.type: c.status for c in (status.conditions if status else None) or []}
            if conditions.get("Ready") != "True":
                return False
        return True

    # -- configuration --------------------------------------------------------------------------

    def _require_ca(self) -> _CertificateAuthority:
        if self._ca is None:
            raise ClusterError(f"cluster {self.name} has no CA yet: start() it first")
        return self._ca

    def _write_pki(self) -> None:
        ca = _CertificateAuthority(common_name=f"fleetlet-test-{self.name}-ca")
        self._ca = ca
        pki = self.pki_dir
        self.ca_path.write_bytes(_cert_pem(ca.cert))
        (pki / "ca.key").write_bytes(_key_pem(ca.key))
        serving = ca.issue(
            common_name="kube-apiserver",
            server_names=[
                "localhost",
                "kubernetes",
                "kubernetes.default",
                "kubernetes.default.svc",
                "kubernetes.default.svc.cluster.local",
            ],
            # 10.96.0.1: the `kubernetes` Service's IP, first of the service range.
            server_ips=["127.0.0.1", "10.96.0.1"],
        )
        clients = {
            "admin": ca.issue(common_name="admin", organizations=["system:masters"]),
            # The bootstrap RBAC roles are bound to these names: the controllers run with the
            # permissions they have in a real cluster.
            "kube-controller-manager": ca.issue(common_name="system:kube-controller-manager"),
            "kube-scheduler": ca.issue(common_name="system:kube-scheduler"),
            # kwok acts as every kubelet (node and pod status of all fake nodes).
            "kwok": ca.issue(common_name="kwok", organizations=["system:masters"]),
        }
        for stem, (cert, key) in {"apiserver": serving, **clients}.items():
            (pki / f"{stem}.crt").write_bytes(cert)
            (pki / f"{stem}.key").write_bytes(key)
        sa_key = _new_key()
        (pki / "sa.key").write_bytes(_key_pem(sa_key))
        (pki / "sa.pub").write_bytes(
            sa_key.public_key().public_bytes(
                serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo
            )
        )
        for key_file in pki.glob("*.key"):
            key_file.chmod(0o600)

    def _write_kubeconfig(self, path: Path, *, user: str, cert_pem: bytes, key_pem: bytes) -> None:
        def b64(data: bytes) -> str:
            return base64.b64encode(data).decode()

        document = {
            "apiVersion": "v1",
            "kind": "Config",
            "clusters": [
                {
                    "name": self.name,
                    "cluster": {
                        "server": self.server,
                        "certificate-authority-data": b64(self.ca_path.read_bytes()),
                    },
                }
            ],
            "users": [
                {
                    "name": user,
                    "user": {
                        "client-certificate-data": b64(cert_pem),
                        "client-key-data": b64(key_pem),
                    },
                }
            ],
            "contexts": [{"name": self.name, "context": {"cluster": self.name, "user": user}}],
            "current-context": self.name,
        }
        path.write_text(yaml.safe_dump(document, sort_keys=False))
        path.chmod(0o600)

    def _write_kubeconfigs(self) -> None:
        for stem in ("kube-controller-manager", "kube-scheduler", "kwok"):
            self._write_kubeconfig(
                self.workdir / f"{stem}.kubeconfig",
                user=stem,
                cert_pem=(self.pki_dir / f"{stem}.crt").read_bytes(),
                key_pem=(self.pki_dir / f"{stem}.key").read_bytes(),
            )
        self._write_kubeconfig(
            self.kubeconfig,
            user="admin",
            cert_pem=(self.pki_dir / "admin.crt").read_bytes(),
            key_pem=(self.pki_dir / "admin.key").read_bytes(),
        )

    def _etcd_args(self, client_port: int, peer_port: int) -> list[str]:
        client = f"http://127.0.0.1:{client_port}"
        peer = f"http://127.0.0.1:{peer_port}"
        return [
            f"--name={self.name}",
            f"--data-dir={self.workdir / 'etcd'}",
            f"--listen-client-urls={client}",
            f"--advertise-client-urls={client}",
            f"--listen-peer-urls={peer}",
            f"--initial-advertise-peer-urls={peer}",
            f"--initial-cluster={self.name}={peer}",
            "--initial-cluster-state=new",
            # Test data: durability buys nothing and fsync costs most of etcd's latency.
            "--unsafe-no-fsync",
            # 2 GiB, etcd's default: ample for tests and bounded.
            "--quota-backend-bytes=2147483648",
            "--snapshot-count=10000",
            "--log-level=warn",
        ]

    def _apiserver_args(self, port: int) -> list[str]:
        pki = self.pki_dir
        return [
            f"--etcd-servers={self.etcd_url}",
            "--bind-address=127.0.0.1",
            "--advertise-address=127.0.0.1",
            f"--secure-port={port}",
            f"--cert-dir={pki}",
            f"--tls-cert-file={pki / 'apiserver.crt'}",
            f"--tls-private-key-file={pki / 'apiserver.key'}",
            f"--client-ca-file={self.ca_path}",
            "--authorization-mode=Node,RBAC",
            "--service-account-issuer=https://kubernetes.default.svc.cluster.local",
            f"--service-account-key-file={pki / 'sa.pub'}",
            f"--service-account-signing-key-file={pki / 'sa.key'}",
            f"--service-cluster-ip-range={SERVICE_CIDR}",
            "--allow-privileged=true",
            # 127.0.0.1 may not be an endpoint of the `kubernetes` Service; nothing in-cluster
            # needs it (kwok pods run nowhere).
            "--endpoint-reconciler-type=none",
            "--profiling=false",
            "--v=1",
        ]

    def _controller_manager_args(self) -> list[str]:
        kubeconfig = self.workdir / "kube-controller-manager.kubeconfig"
        return [
            f"--kubeconfig={kubeconfig}",
            f"--authentication-kubeconfig={kubeconfig}",
            f"--authorization-kubeconfig={kubeconfig}",
            # No health/metrics server needed: start-up readiness is observed through the API.
            "--secure-port=0",
            "--leader-elect=false",
            f"--controllers={','.join(self._controllers)}",
            f"--service-account-private-key-file={self.pki_dir / 'sa.key'}",
            f"--root-ca-file={self.ca_path}",
            "--use-service-account-credentials=true",
            f"--cluster-signing-cert-file={self.ca_path}",
            f"--cluster-signing-key-file={self.pki_dir / 'ca.key'}",
            f"--service-cluster-ip-range={SERVICE_CIDR}",
            # The default client rate (20 qps) makes a 1,000-replica Deployment take ~50 s.
            "--kube-api-qps=500",
            "--kube-api-burst=1000",
            "--profiling=false",
            "--v=1",
        ]

    def _scheduler_args(self) -> list[str]:
        kubeconfig = self.workdir / "kube-scheduler.kubeconfig"
        return [
            f"--kubeconfig={kubeconfig}",
            f"--authentication-kubeconfig={kubeconfig}",
            f"--authorization-kubeconfig={kubeconfig}",
            "--secure-port=0",
            "--leader-elect=false",
            "--kube-api-qps=500",
            "--kube-api-burst=1000",
            "--profiling=false",
            "--v=1",
        ]

    def _kwok_args(self) -> list[str]:
        key, value = FAKE_NODE_ANNOTATION
        return [
            f"--kubeconfig={self.workdir / 'kwok.kubeconfig'}",
            f"--config={KWOK_STAGES}",
            "--manage-all-nodes=false",
            f"--manage-nodes-with-annotation-selector={key}={value}",
            f"--server-address=127.0.0.1:{self._kwok_port}",
            f"--cidr={POD_CIDR}",
            "--node-ip=127.0.0.1",
            # kwok renews the node's Lease (the heartbeat stage is slow, it counts on it);
            # without one, the node lifecycle controller sees a node silent for longer than
            # its grace period, marks its pods NotReady, and nothing marks them Ready again.
            "--node-lease-duration-seconds=40",
        ]

    def _node_manifest(self, name: str) -> dict[str, Any]:
        key, value = FAKE_NODE_ANNOTATION
        # Enough room for thousands of pods (kwok pods cost nothing); ephemeral storage as
        # every real node has it (charts request it: bitnami's resource presets).
        resources = {"cpu": "1000", "memory": "4Ti", "pods": "10000", "ephemeral-storage": "100Ti"}
        return {
            "apiVersion": "v1",
            "kind": "Node",
            "metadata": {
                "name": name,
                "annotations": {key: value, "node.alpha.kubernetes.io/ttl": "0"},
                "labels": {
                    "kubernetes.io/hostname": name,
                    "kubernetes.io/os": "linux",
                    "kubernetes.io/arch": "amd64",
                    "type": "kwok",
                },
            },
            "status": {"allocatable": resources, "capacity": resources},
        }


def start_clusters(clusters: Sequence[Cluster]) -> list[Cluster]:
    """Start several clusters at once and return them once all are usable.

    Their start-ups overlap (each waits on its own apiserver, controllers and nodes while the
    others progress), all from the calling thread. Clusters already started are left as they
    are. Raises :class:`ClusterError`; on any failure every cluster of this call is stopped.
    """
    began = time.monotonic()
    pending: dict[Cluster, tuple[Generator[_Step, None, None], str, Callable[[], bool]]] = {}
    todo = [c for c in dict.fromkeys(clusters) if not c._started]
    try:
        for cluster in todo:
            _LIVE.add(cluster)
            cluster._started = True
            phases = cluster._phases()
            pending[cluster] = (phases, *next(phases))
        delay = 0.05
        while pending:
            for cluster, (phases, component, ready) in list(pending.items()):
                cluster._check_alive()
                try:
                    done = ready()
                except Exception:  # not ready yet: connection refused, 404, 403 during bootstrap
                    done = False
                if done:
                    try:
                        pending[cluster] = (phases, *next(phases))
                    except StopIteration:
                        del pending[cluster]
                        cluster.start_seconds = time.monotonic() - began
                elif time.monotonic() > began + cluster._start_timeout:
                    raise cluster._timed_out(component)
            if pending:
                time.sleep(delay)
                delay = min(delay * 1.5, 0.5)
    except BaseException:
        for phases, _, _ in pending.values():
            phases.close()
        for cluster in todo:
            # Half-started components are no use to anyone: a short grace is enough.
            cluster.stop(grace=1.0)
        raise
    return list(clusters)
