"""The agent's settings, grouped: where it pulls from, whom it trusts, how often it works.

The CLI (:mod:`agent.cli`, the edge) reads flags and ``FLEETLET_*`` variables into these
dataclasses and builds the agent from them; nothing below the CLI reads configuration. Each
group validates itself on construction (:class:`SettingsError` names the setting).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from datetime import timedelta
from pathlib import Path
from typing import TYPE_CHECKING, Any

from agent.errors import ConfigurationError
from agent.render.tools import ToolSettings
from agent.source.branch import branch_ref

if TYPE_CHECKING:
    from agent.apply.guard import Guard  # not at run time: the supervisor stays light


class SettingsError(ConfigurationError):
    """A setting is missing or invalid; the message names it."""

    reason = "SettingsInvalid"


@dataclass(frozen=True, kw_only=True)
class ReconcileSettings:
    """How the agent moves groups."""

    agent_namespace: str
    """Where its own objects live (revision store, group records, runs, credentials)."""
    health_interval: float = 1.0
    """The longest pause, in seconds, between two health assessments while waiting for a
    group (the first pauses are shorter: see :func:`agent.health.wait_healthy`)."""
    uninstall_failed_install: bool = False
    """A first install that fails has no previous revision: leave it as it is (default, for
    inspection; still known, so removing the bundle deletes it) or delete what it created."""
    workers: int = 8
    """Objects of a stage applied concurrently."""
    parallel_groups: int = 4
    """Independent groups (no ``dependsOn`` path between them) moved concurrently."""
    retry_backoff: float = 30.0
    """Seconds before a target refused for a reason the cluster caused (a missing namespace
    or CRD, a webhook down) is tried again by itself; doubles with each attempt, up to 10
    minutes."""
    establish_timeout: float = 60.0
    """Seconds a group's CRDs may take to become Established."""
    guard: Guard | None = None
    """The agent's own objects, off limits to bundle content (None: nothing guarded; the
    CLI always sets it)."""
    failpoint: Callable[[str], None] | None = None
    """Called with the name of each step of a move (``approved``, ``intent``,
    ``apply:<progress>``,
    ``applied``, ``health``, ``healthy``, ``pruned``, ``stored``, ``finished``, ``rollback``,
    ``rollback:applied``, ``rollback:pruned``): fault injection for crash tests
    (``FLEETLET_FAILPOINT``); None in production."""


@dataclass(frozen=True, kw_only=True)
class RepoSettings:
    """The desired-state repository, this cluster's branch in it, and where status goes."""

    url: str
    """Clone URL of the repository (``https://``, ``ssh://``, ``git://``, or a local path)."""
    cluster: str
    """This cluster's name: the agent reads ``fleetlet/clusters/<cluster>`` only."""
    status_url: str | None = None
    """Where status goes, on ``fleetlet/status/<cluster>`` (None: ``url``)."""
    cache_dir: Path = Path("/var/cache/fleetlet")
    """The local bare repository of the branch, the content cache, the status repository
    (an emptyDir is enough: everything that matters is in the cluster)."""
    protocol_v2: bool = True
    """Poll with a protocol v2 ``ls-refs`` for this one branch (git://, http(s)://) instead of
    libgit2's listing of every branch, so the poll's cost does not grow with the fleet."""

    def __post_init__(self) -> None:
        if not self.url:
            raise SettingsError("repo url: must be set (--repo / FLEETLET_REPO)")
        try:
            branch_ref(self.cluster)
        except ValueError as exc:
            raise SettingsError(f"cluster: {exc}") from exc


@dataclass(frozen=True, kw_only=True)
class PollSettings:
    """Timing of the agent's jobs, in seconds."""

    interval: float = 30.0
    """Between two polls (an idle poll is one ref listing)."""
    jitter: float = 5.0
    """Up to this much is added at random to each wait, so agents do not poll in lockstep."""
    max_backoff: float = 300.0
    """Upper bound of the exponential backoff after errors (server down, timeouts)."""
    drift_interval: float = 300.0
    """Between two drift checks of the accepted set (objects put back, health assessed)."""
    heartbeat: float = 60.0
    """Between two status documents pushed when nothing changed."""
    worker_timeout: float = 3600.0
    """The longest a worker process may run one job (a move waits for health, runs hooks):
    one that takes longer is killed and its job tried again with backoff."""
    warm_worker: bool = False
    """Keep the next worker started and loaded while idle (``--warm-worker``): a move starts
    1-2 s sooner (more under load), for the standby's memory (about 90 MB)."""

    def __post_init__(self) -> None:
        if self.interval <= 0:
            raise SettingsError(f"poll interval: must be positive, got {self.interval}")
        if self.jitter < 0:
            raise SettingsError(f"poll jitter: must not be negative, got {self.jitter}")
        if self.drift_interval <= 0 or self.heartbeat <= 0 or self.worker_timeout <= 0:
            raise SettingsError("drift interval, heartbeat and worker timeout: must be positive")
        if self.max_backoff < self.interval:
            raise SettingsError(
                f"max backoff ({self.max_backoff}) must not be below the interval ({self.interval})"
            )


@dataclass(frozen=True, kw_only=True)
class NetworkSettings:
    """How long the agent waits for the servers it talks to (the API server, git, registries,
    http), in seconds, and how many times one request to a registry or an http server is made.

    Every request is bounded: ``connect_timeout`` for the connection, ``read_timeout`` for each
    wait on an answer (a server that accepts and never answers). A failed sync is retried by
    the poll job's backoff, not by long waits here."""

    connect_timeout: float = 5.0
    read_timeout: float = 30.0
    attempts: int = 3
    """Requests to a registry or an http server per fetch (backoff with jitter between)."""

    def __post_init__(self) -> None:
        if self.connect_timeout <= 0 or self.read_timeout <= 0:
            raise SettingsError(
                f"timeouts: must be positive, got connect {self.connect_timeout}, "
                f"read {self.read_timeout} (--connect-timeout, --read-timeout)"
            )
        if self.attempts < 1:
            raise SettingsError(f"fetch attempts: at least 1, got {self.attempts}")


@dataclass(frozen=True, kw_only=True)
class LimitSettings:
    """How much content the agent takes in for one bundle, and how much it keeps on disk.

    A bundle over a limit is refused (with the limit named); the agent keeps running what it
    has. The defaults suit most fleets; an edge node with a small disk lowers them, a fleet of
    large charts raises them."""

    max_bundle_bytes: int = 128 * 1024 * 1024
    """Bytes of one bundle's files, all its sources together, unpacked."""
    max_bundle_files: int = 10_000
    """Files, directories and links of one bundle."""
    max_file_bytes: int = 16 * 1024 * 1024
    """Bytes of one file of a bundle."""
    max_download_bytes: int = 64 * 1024 * 1024
    """Bytes of one download: an OCI layer, an http archive."""
    cache_bytes: int = 1024 * 1024 * 1024
    """The content cache's size; the least recently used content goes first."""

    def __post_init__(self) -> None:
        for name in (
            "max_bundle_bytes",
            "max_bundle_files",
            "max_file_bytes",
            "max_download_bytes",
            "cache_bytes",
        ):
            if getattr(self, name) <= 0:
                raise SettingsError(f"{name.replace('_', ' ')}: must be positive")


@dataclass(frozen=True, kw_only=True)
class TrustSettings:
    """Whom the agent believes: the Sigstore trust config and the signer's identity."""

    trusted_root: Path
    """Sigstore ``trusted_root.json`` from the agent's deployment (never from the repo)."""
    identity: str
    """Expected signer identity (the certificate's SAN, e.g. the hub's workload identity)."""
    issuer: str
    """Expected OIDC issuer of the signer's certificate."""
    max_validity: timedelta = timedelta(days=30)
    """A publication valid for longer than this (``expiresAt - issuedAt``) is refused: a set
    signed to stay valid for years would defeat the freeze protection."""
    clock_skew: timedelta = timedelta(minutes=5)
    """How far this cluster's clock may be off when a publication's ``issuedAt`` and
    ``expiresAt`` are judged (also when the running publication is said to have expired)."""
    source_policy: Path | None = None
    """The cluster's own source signature policy (``--verify-sources``): image sources are
    verified by the agent itself before use (:mod:`agent.source.signed`)."""

    def __post_init__(self) -> None:
        if self.clock_skew < timedelta(0):
            raise SettingsError(f"clock skew: must not be negative, got {self.clock_skew}")
        if not (str(self.trusted_root) and self.identity and self.issuer):
            raise SettingsError(
                "--trusted-root, --identity and --issuer are required: the agent never "
                "applies an unverified publication"
            )


@dataclass(frozen=True, kw_only=True)
class AgentSettings:
    """Everything the agent of one cluster is built from."""

    repo: RepoSettings
    trust: TrustSettings
    reconcile: ReconcileSettings
    poll: PollSettings = field(default_factory=PollSettings)
    network: NetworkSettings = field(default_factory=NetworkSettings)
    limits: LimitSettings = field(default_factory=LimitSettings)
    kubeconfig: str | None = None
    """None: the in-cluster configuration (the pod's ServiceAccount)."""
    tools: ToolSettings = field(default_factory=ToolSettings)
    """Where helm and kustomize are (``FLEETLET_HELM``, ``FLEETLET_KUSTOMIZE``, else PATH, else
    the cache of pinned releases)."""
    status: bool = True
    """Push status to git."""
    hub_public_key: Path | None = None
    """The hub's X25519 public key: sensitive outputs are sealed to it (without it they are
    omitted from the status)."""
    agent_sealing_key: Path | None = None
    """This agent's sealing key (from ``fleetlet hub agent-key``): the hub can tell the values
    it sealed from any sealed with the hub's public key alone."""
    plain_http_registries: bool = False
    """Talk plain HTTP to OCI registries (local registries only)."""

    @property
    def namespace(self) -> str:
        """The agent's own namespace."""
        return self.reconcile.agent_namespace


# --- the settings as JSON: what a worker process is given (agent.runner) -------------------


def settings_to_dict(settings: AgentSettings) -> dict[str, Any]:
    """``settings`` as JSON-ready data (:func:`settings_from_dict` reads it back). The
    failpoint, a function, is left out: a worker derives its own."""
    tools = settings.tools
    trust = settings.trust
    return {
        "repo": {
            "url": settings.repo.url,
            "cluster": settings.repo.cluster,
            "statusUrl": settings.repo.status_url,
            "cacheDir": str(settings.repo.cache_dir),
            "protocolV2": settings.repo.protocol_v2,
        },
        "trust": {
            "trustedRoot": str(trust.trusted_root),
            "identity": trust.identity,
            "issuer": trust.issuer,
            "maxValiditySeconds": trust.max_validity.total_seconds(),
            "clockSkewSeconds": trust.clock_skew.total_seconds(),
            "sourcePolicy": str(trust.source_policy) if trust.source_policy else None,
        },
        "reconcile": {
            **{
                k: v
                for k, v in settings.reconcile.__dict__.items()
                if k not in ("failpoint", "guard")
            },
            "guard": (
                {
                    "agentNamespace": guard.agent_namespace,
                    "allowed": sorted(guard.allowed),
                }
                if (guard := settings.reconcile.guard) is not None
                else None
            ),
        },
        "poll": dict(settings.poll.__dict__),
        "network": dict(settings.network.__dict__),
        "limits": dict(settings.limits.__dict__),
        "kubeconfig": settings.kubeconfig,
        "tools": {
            "helm": tools.helm,
            "kustomize": tools.kustomize,
            "cacheRoot": str(tools.cache_root) if tools.cache_root else None,
            "pluginTimeout": tools.plugin_timeout,
            "pluginMaxMemory": tools.plugin_max_memory,
        },
        "status": settings.status,
        "hubPublicKey": str(settings.hub_public_key) if settings.hub_public_key else None,
        "agentSealingKey": str(settings.agent_sealing_key) if settings.agent_sealing_key else None,
        "plainHttpRegistries": settings.plain_http_registries,
    }


def settings_from_dict(
    data: Mapping[str, Any], *, failpoint: Callable[[str], None] | None = None
) -> AgentSettings:
    """The settings :func:`settings_to_dict` wrote, with ``failpoint``.

    Raises SettingsError (a setting is invalid), KeyError or TypeError (not such data).
    """

    def path(value: Any) -> Path | None:
        return Path(value) if value else None

    repo, trust, tools = data["repo"], data["trust"], data["tools"]
    return AgentSettings(
        repo=RepoSettings(
            url=repo["url"],
            cluster=repo["cluster"],
            status_url=repo["statusUrl"],
            cache_dir=Path(repo["cacheDir"]),
            protocol_v2=bool(repo["protocolV2"]),
        ),
        trust=TrustSettings(
            trusted_root=Path(trust["trustedRoot"]),
            identity=trust["identity"],
            issuer=trust["issuer"],
            max_validity=timedelta(seconds=float(trust["maxValiditySeconds"])),
            clock_skew=timedelta(seconds=float(trust["clockSkewSeconds"])),
            source_policy=path(trust.get("sourcePolicy")),
        ),
        reconcile=ReconcileSettings(
            **{k: v for k, v in data["reconcile"].items() if k != "guard"},
            guard=_guard(data["reconcile"].get("guard")),
            failpoint=failpoint,
        ),
        poll=PollSettings(**data["poll"]),
        network=NetworkSettings(**data["network"]),
        limits=LimitSettings(**data["limits"]),
        kubeconfig=data["kubeconfig"],
        tools=ToolSettings(
            helm=tools["helm"],
            kustomize=tools["kustomize"],
            cache_root=path(tools["cacheRoot"]),
            plugin_timeout=float(tools["pluginTimeout"]),
            plugin_max_memory=int(tools["pluginMaxMemory"]),
        ),
        status=bool(data["status"]),
        hub_public_key=path(data["hubPublicKey"]),
        agent_sealing_key=path(data["agentSealingKey"]),
        plain_http_registries=bool(data["plainHttpRegistries"]),
    )


def _guard(data: Mapping[str, Any] | None) -> Guard | None:
    from agent.apply.guard import Guard

    if data is None:
        return None
    return Guard(
        agent_namespace=str(data["agentNamespace"]),
        allowed=frozenset(str(name) for name in data["allowed"]),
    )


__all__ = [
    "AgentSettings",
    "LimitSettings",
    "NetworkSettings",
    "PollSettings",
    "ReconcileSettings",
    "RepoSettings",
    "SettingsError",
    "TrustSettings",
    "settings_from_dict",
    "settings_to_dict",
]
