"""Credentials of the agent's own desired-state repository, and the pygit2 callbacks using them.

Three shapes: basic auth over HTTPS (``username`` + ``password``), a token over HTTPS (sent as
the password; the user defaults to ``x-access-token``, which GitHub, Gitea and GitLab accept),
and an ssh key (pygit2 ``Keypair`` from key files). Reading the environment or a mounted Secret
happens only in the ``from_env``/``from_files`` constructors; everything else is pure.

Over ssh, libgit2 (1.6 and later) checks the server's host key against
``$HOME/.ssh/known_hosts`` itself (libgit2 PR #6450): the agent's deployment mounts that file.

The callbacks offer the credentials once: libgit2 replays fixed credentials up to 15 times and
then fails with a vague message, so being asked a second time is taken as the refusal it is
and raised as :class:`GitAuthError` (a permanent error: retrying cannot fix a wrong password).
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

import pygit2

from agent.errors import PermanentError
from agent.report.logs import mask

DEFAULT_TOKEN_USER = "x-access-token"
DEFAULT_SSH_USER = "git"

# Keys of a Secret mounted as a directory, as the Kubernetes Secret types name them
# (kubernetes.io/basic-auth, kubernetes.io/ssh-auth), plus ``token``.
_FILE_USERNAME = "username"
_FILE_PASSWORD = "password"
_FILE_TOKEN = "token"
_FILE_SSH_KEY = "ssh-privatekey"
_FILE_SSH_PUBLIC_KEY = "ssh-publickey"
_FILE_SSH_PASSPHRASE = "ssh-passphrase"


class GitAuthError(PermanentError):
    """The git server refused our credentials, or wants credentials we do not have."""

    reason = "GitAuthFailed"


class CredentialsConfigError(PermanentError):
    """The configured credentials are unusable (half a pair, a key file that is missing)."""

    reason = "GitCredentialsInvalid"


@dataclass(frozen=True, kw_only=True)
class GitCredentials:
    """How the agent authenticates to its repository. All fields optional; see ``kind``.

    ``ssh_key``/``ssh_public_key`` are paths to key files (libssh2 reads them itself);
    ``ssh_user`` is the ssh login (``git`` by default, or the user named in the URL).
    """

    username: str | None = None
    password: str | None = None
    token: str | None = None
    ssh_key: Path | None = None
    ssh_public_key: Path | None = None
    ssh_passphrase: str | None = None
    ssh_user: str | None = None

    def __post_init__(self) -> None:
        # Whatever happens next, these values never reach a log line.
        for secret in (self.password, self.token, self.ssh_passphrase):
            mask(secret)
        if self.password is not None and self.token is not None:
            raise CredentialsConfigError("git credentials: give a password or a token, not both")
        if self.username is not None and self.password is None and self.token is None:
            raise CredentialsConfigError(
                f"git credentials: user {self.username!r} has no password or token"
            )

    def __repr__(self) -> str:
        # Never print a secret, not even in a traceback.
        return (
            f"GitCredentials(kind={self.kind!r}, username={self.username!r}, "
            f"ssh_key={self.ssh_key!r})"
        )

    @property
    def kind(self) -> str:
        """``"basic"``, ``"token"``, ``"ssh"`` or ``"none"``."""
        if self.password is not None:
            return "basic"
        if self.token is not None:
            return "token"
        if self.ssh_key is not None:
            return "ssh"
        return "none"

    @classmethod
    def from_env(
        cls, prefix: str = "FLEETLET_GIT_", environ: Mapping[str, str] | None = None
    ) -> GitCredentials:
        """Read ``<prefix>USERNAME``, ``PASSWORD``, ``TOKEN``, ``SSH_KEY_FILE``,
        ``SSH_PUBLIC_KEY_FILE``, ``SSH_PASSPHRASE``, ``SSH_USER`` (unset or empty: absent).

        Raises CredentialsConfigError for an incomplete combination.
        """
        env = os.environ if environ is None else environ

        def get(name: str) -> str | None:
            return env.get(prefix + name) or None

        key = get("SSH_KEY_FILE")
        public = get("SSH_PUBLIC_KEY_FILE")
        return cls(
            username=get("USERNAME"),
            password=get("PASSWORD"),
            token=get("TOKEN"),
            ssh_key=Path(key) if key else None,
            ssh_public_key=Path(public) if public else None,
            ssh_passphrase=get("SSH_PASSPHRASE"),
            ssh_user=get("SSH_USER"),
        )

    @classmethod
    def from_files(cls, directory: Path) -> GitCredentials:
        """Read a Secret mounted at ``directory``: ``username``/``password`` (basic-auth),
        ``token``, ``ssh-privatekey`` (ssh-auth; optional ``ssh-publickey``, ``ssh-passphrase``).

        Text values are stripped of surrounding whitespace (a trailing newline is common).
        Raises CredentialsConfigError if ``directory`` is not a directory or the set is
        incomplete.
        """
        directory = Path(directory)
        if not directory.is_dir():
            raise CredentialsConfigError(f"git credentials directory {directory} does not exist")

        def text(name: str) -> str | None:
            path = directory / name
            try:
                value = path.read_text(encoding="utf-8").strip()
            except FileNotFoundError:
                return None
            except (OSError, UnicodeDecodeError) as exc:
                raise CredentialsConfigError(f"cannot read git credential {path}: {exc}") from exc
            return value or None

        key = directory / _FILE_SSH_KEY
        public = directory / _FILE_SSH_PUBLIC_KEY
        return cls(
            username=text(_FILE_USERNAME),
            password=text(_FILE_PASSWORD),
            token=text(_FILE_TOKEN),
            ssh_key=key if key.is_file() else None,
            ssh_public_key=public if public.is_file() else None,
            ssh_passphrase=text(_FILE_SSH_PASSPHRASE),
        )


class GitCallbacks(pygit2.RemoteCallbacks):  # type: ignore[misc]
    """Offers the credentials once; also caps the bytes a fetch may receive.

    One instance per network operation (it counts the asks of that operation).
    Raises GitAuthError from inside libgit2 (pygit2 re-raises it from the operation);
    raises ``too_large`` (if given) once more than ``max_bytes`` were received.
    """

    def __init__(
        self,
        credentials: GitCredentials | None,
        *,
        max_bytes: int | None = None,
        too_large: type[Exception] | None = None,
    ) -> None:
        super().__init__()
        self._creds = credentials
        self._max_bytes = max_bytes
        self._too_large = too_large
        self.asked = 0
        self.received_bytes = 0

    def credentials(
        self, url: str, username_from_url: str | None, allowed_types: pygit2.enums.CredentialType
    ) -> pygit2.UserPass | pygit2.Keypair | pygit2.Username:
        answer = credential_for(
            self._creds,
            url=url,
            username_from_url=username_from_url,
            allowed=allowed_types,
            attempt=self.asked + 1,
        )
        # libssh2 asks for the login name alone before the key: that ask is not a refusal.
        if not isinstance(answer, pygit2.Username):
            self.asked += 1
        return answer

    def transfer_progress(self, stats: pygit2.remotes.TransferProgress) -> None:
        self.received_bytes = stats.received_bytes
        if self._max_bytes is not None and stats.received_bytes > self._max_bytes:
            error = self._too_large or PermanentError
            raise error(f"fetch exceeds {self._max_bytes} bytes")


def credential_for(
    creds: GitCredentials | None,
    *,
    url: str,
    username_from_url: str | None,
    allowed: pygit2.enums.CredentialType,
    attempt: int = 1,
) -> pygit2.UserPass | pygit2.Keypair | pygit2.Username:
    """The pygit2 credential answering the server's ``attempt``-th ask for ``allowed`` types
    (asks for the ssh login name alone are not counted).

    Raises GitAuthError on a second ask (the first answer was refused), when no credentials
    are configured, or when the server accepts none of the configured kinds.
    """
    types = pygit2.enums.CredentialType
    kind = creds.kind if creds is not None else "none"
    if creds is not None and kind == "ssh" and allowed == types.USERNAME:
        # libssh2 first asks for the login name alone; not counted as an attempt.
        return pygit2.Username(creds.ssh_user or username_from_url or DEFAULT_SSH_USER)
    if attempt > 1:
        who = creds.username or creds.ssh_user or username_from_url if creds else None
        named = f" of {who}" if who else ""
        raise GitAuthError(f"{url}: the git server refused the {kind} credentials{named}")
    if creds is None or kind == "none":
        raise GitAuthError(f"{url}: the git server asks for credentials and none are configured")
    if kind == "ssh" and allowed & types.SSH_KEY:
        return pygit2.Keypair(
            creds.ssh_user or username_from_url or DEFAULT_SSH_USER,
            str(creds.ssh_public_key) if creds.ssh_public_key else None,
            str(creds.ssh_key),
            creds.ssh_passphrase or "",
        )
    if kind in ("basic", "token") and allowed & types.USERPASS_PLAINTEXT:
        secret = creds.password if creds.password is not None else creds.token
        user = creds.username or username_from_url or DEFAULT_TOKEN_USER
        return pygit2.UserPass(user, secret or "")
    raise GitAuthError(
        f"{url}: the git server accepts {allowed!r} and the configured credentials are {kind}"
    )


def remote_callbacks(
    credentials: GitCredentials | None,
    *,
    max_bytes: int | None = None,
    too_large: type[Exception] | None = None,
) -> GitCallbacks:
    """Fresh one-shot callbacks for ONE network operation (see :class:`GitCallbacks`)."""
    return GitCallbacks(credentials, max_bytes=max_bytes, too_large=too_large)
