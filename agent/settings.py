"""The agent's settings for pulling its branch: where, as whom, how often, and whom to trust.

Grouped: :class:`RepoSettings` (the desired-state repository and this cluster's branch),
:class:`PollSettings` (the loop's timing), :class:`TrustSettings` (Sigstore trust config and the
identity policy). The trusted root comes from the agent's deployment (image or Secret), never
from the repository it protects. ``Settings.from_env`` reads the environment at the edge; the
dataclasses themselves are pure and validate on construction.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

from agent.errors import PermanentError
from agent.source.branch import branch_ref
from agent.source.credentials import GitCredentials


class SettingsError(PermanentError):
    """A setting is missing or invalid; the message names it."""

    reason = "SettingsInvalid"


@dataclass(frozen=True, kw_only=True)
class RepoSettings:
    """The desired-state repository and this cluster's branch in it."""

    url: str
    """Clone URL of the repository (``https://``, ``ssh://``, ``git://``, or a local path)."""
    cluster: str
    """This cluster's name: the agent reads ``fleetlet/clusters/<cluster>`` only."""
    credentials: GitCredentials | None = None
    """How to authenticate (token/basic over HTTPS, ssh key); None for an open server."""
    cache_dir: Path = Path("/var/cache/fleetlet")
    """Where the local bare repository of the branch is kept (an emptyDir is enough)."""
    connect_timeout: float = 10.0
    """Seconds to wait for the git server to accept a connection."""
    io_timeout: float = 30.0
    """Seconds a git server may stay silent during a request."""
    protocol_v2: bool = True
    """Poll with a protocol v2 ``ls-refs`` for this one branch (git://, http(s)://) instead of
    libgit2's listing of every branch, so the poll's cost does not grow with the fleet; other
    schemes and v0-only servers fall back to libgit2. Off: ``FLEETLET_GIT_PROTOCOL_V2=false``."""

    def __post_init__(self) -> None:
        if not self.url:
            raise SettingsError("repo url: must be set")
        try:
            branch_ref(self.cluster)
        except ValueError as exc:
            raise SettingsError(f"cluster: {exc}") from exc
        if self.connect_timeout <= 0 or self.io_timeout <= 0:
            raise SettingsError("git timeouts must be positive")


@dataclass(frozen=True, kw_only=True)
class PollSettings:
    """Timing of the poll loop, in seconds."""

    interval: float = 30.0
    """Time between two idle polls (one ref listing each)."""
    jitter: float = 5.0
    """Up to this much is added at random to each wait, so agents do not poll in lockstep."""
    max_backoff: float = 300.0
    """Upper bound of the exponential backoff after errors (server down, timeouts)."""

    def __post_init__(self) -> None:
        if self.interval <= 0:
            raise SettingsError(f"poll interval: must be positive, got {self.interval}")
        if self.jitter < 0:
            raise SettingsError(f"poll jitter: must not be negative, got {self.jitter}")
        if self.max_backoff < self.interval:
            raise SettingsError(
                f"max backoff ({self.max_backoff}) must not be below the interval ({self.interval})"
            )


@dataclass(frozen=True, kw_only=True)
class TrustSettings:
    """Whom the agent believes: the Sigstore trust config and the signer's identity."""

    trusted_root: Path
    """Sigstore ``trusted_root.json`` from the agent's deployment (never from the repo)."""
    identity: str
    """Expected signer identity (the certificate's SAN, e.g. the hub's workload identity)."""
    issuer: str
    """Expected OIDC issuer of the signer's certificate."""

    def __post_init__(self) -> None:
        if not self.identity or not self.issuer:
            raise SettingsError("identity policy: both identity and issuer must be set")


@dataclass(frozen=True, kw_only=True)
class Settings:
    """Everything the agent needs to pull and verify its branch."""

    repo: RepoSettings
    """Repository, cluster, credentials."""
    trust: TrustSettings
    """Trusted root and identity policy."""
    poll: PollSettings = field(default_factory=PollSettings)
    """Loop timing."""

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None) -> Settings:
        """Read ``FLEETLET_REPO``, ``FLEETLET_CLUSTER``, ``FLEETLET_CACHE_DIR``,
        ``FLEETLET_TRUSTED_ROOT``, ``FLEETLET_IDENTITY``, ``FLEETLET_ISSUER``,
        ``FLEETLET_POLL_INTERVAL``, ``FLEETLET_POLL_JITTER``, ``FLEETLET_MAX_BACKOFF``,
        ``FLEETLET_GIT_PROTOCOL_V2`` (``1``/``true`` to enable); git
        credentials from the directory ``FLEETLET_GIT_CREDENTIALS_DIR`` (a mounted Secret) if
        set, else from ``FLEETLET_GIT_*`` variables (see ``GitCredentials.from_env``).

        Raises SettingsError naming the missing or invalid variable.
        """
        env = os.environ if environ is None else environ

        def required(name: str) -> str:
            value = env.get(name)
            if not value:
                raise SettingsError(f"{name} must be set")
            return value

        def number(name: str, default: float) -> float:
            raw = env.get(name)
            if not raw:
                return default
            try:
                return float(raw)
            except ValueError:
                raise SettingsError(f"{name}: expected seconds, got {raw!r}") from None

        def flag(name: str, *, default: bool = False) -> bool:
            raw = (env.get(name) or "").strip().lower()
            if not raw:
                return default
            if raw in ("0", "false", "no"):
                return False
            if raw in ("1", "true", "yes"):
                return True
            raise SettingsError(f"{name}: expected true or false, got {raw!r}")

        creds_dir = env.get("FLEETLET_GIT_CREDENTIALS_DIR")
        creds = (
            GitCredentials.from_files(Path(creds_dir))
            if creds_dir
            else GitCredentials.from_env(environ=env)
        )
        return cls(
            repo=RepoSettings(
                url=required("FLEETLET_REPO"),
                cluster=required("FLEETLET_CLUSTER"),
                credentials=None if creds.kind == "none" else creds,
                cache_dir=Path(env.get("FLEETLET_CACHE_DIR") or "/var/cache/fleetlet"),
                protocol_v2=flag("FLEETLET_GIT_PROTOCOL_V2", default=True),
            ),
            trust=TrustSettings(
                trusted_root=Path(required("FLEETLET_TRUSTED_ROOT")),
                identity=required("FLEETLET_IDENTITY"),
                issuer=required("FLEETLET_ISSUER"),
            ),
            poll=PollSettings(
                interval=number("FLEETLET_POLL_INTERVAL", 30.0),
                jitter=number("FLEETLET_POLL_JITTER", 5.0),
                max_backoff=number("FLEETLET_MAX_BACKOFF", 300.0),
            ),
        )
