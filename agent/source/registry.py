"""The one client of OCI registries: oras-py's, bounded, with explicit credentials.

oras-py's ``Registry.do_request`` retries every failure five times with growing sleeps (about
131 s against a dead registry). :class:`RegistryClient` replaces it with the undecorated
function (``__wrapped__``) inside the project's backoff (:func:`agent.backoff.attempts`): a few
attempts, per-request timeouts, no retry at all on refused credentials. Credentials are passed
in explicitly (Basic, or a Bearer token fetched from the registry's token service);
``~/.docker/config.json`` is never read. The agent's OCI fetcher (:mod:`agent.source.oci`) and
the hub's resolver (:mod:`hub.resolve.resolver`) both use it.
"""

from __future__ import annotations

import base64
import re
from dataclasses import dataclass
from typing import Any

import oras.auth.base
import oras.provider
import requests

from agent.backoff import attempts
from agent.source.content import (
    AuthenticationError,
    ContentRefusedError,
    Credentials,
    FetchError,
    url_host,
)

_UNBOUNDED_DO_REQUEST = oras.provider.Registry.do_request.__wrapped__  # type: ignore[attr-defined]
_CHALLENGE_PARAM = re.compile(r'(\w+)="([^"]*)"')


class RegistryUnavailableError(FetchError):
    """The registry was unreachable, timed out or answered 5xx on every attempt.

    ``attempts`` is how many HTTP attempts were made for the failing request.
    """

    reason = "RegistryUnavailable"

    def __init__(self, message: str, *, source: str, attempts: int) -> None:
        super().__init__(message, source=source)
        self.attempts = attempts


class RegistryProtocolError(ContentRefusedError):
    """A request to the registry cannot be made at all (a malformed URL, endless redirects):
    retrying cannot help."""

    reason = "RegistryProtocol"


@dataclass(frozen=True, kw_only=True)
class RegistrySettings:
    """How the client behaves. ``plain_http`` talks HTTP (tests, in-cluster registries)."""

    plain_http: bool = False
    timeout: float = 10.0
    """Seconds between two reads (a registry that accepts and then says nothing)."""
    connect_timeout: float = 5.0
    """Seconds a connection may take."""
    attempts: int = 3
    """Tries of one request while the registry is unreachable or answers 5xx."""
    backoff: float = 0.5
    """Seconds before the second try, doubling after."""
    user_agent: str = "fleetlet"


class _ChallengeAuth(oras.auth.base.AuthBackend):  # type: ignore[misc]
    """Answers a registry's challenge with the explicit credentials: Basic, or a Bearer token.

    A 401 after our answer is final (no retry loop against wrong credentials).
    """

    def __init__(self, credentials: Credentials | None, *, source: str) -> None:
        super().__init__()
        self.credentials = credentials
        self.source = source
        self.header: dict[str, str] = {}

    def get_auth_header(self) -> dict[str, str]:
        return dict(self.header)

    def load_configs(self, container: Any, configs: list[str] | None = None) -> None:
        return None  # never the user's docker config

    def _basic(self) -> str | None:
        creds = self.credentials
        if creds is None or creds.username is None:
            return None
        raw = f"{creds.username}:{creds.password or ''}".encode()
        return base64.b64encode(raw).decode()

    def authenticate_request(
        self, original: requests.Response, headers: dict[str, str], refresh: bool = False
    ) -> tuple[dict[str, str], bool]:
        url = original.url
        if self.header and not refresh:
            raise AuthenticationError(
                f"registry refused the credentials for {url} (HTTP {original.status_code})",
                source=self.source,
            )
        challenge = original.headers.get("Www-Authenticate", "")
        scheme = challenge.split(" ", 1)[0].lower()
        basic = self._basic()
        creds = self.credentials
        if creds is not None and not creds.allows(url_host(url)):
            raise AuthenticationError(
                f"{url_host(url)} asks for credentials; Secret {creds.secret} holds them for "
                f"{', '.join(sorted(creds.hosts))} only: not sent",
                source=self.source,
            )
        if scheme == "basic":
            if basic is None:
                raise AuthenticationError(
                    f"registry requires credentials for {url} and the source has none",
                    source=self.source,
                )
            self.header = {"Authorization": f"Basic {basic}"}
        elif scheme == "bearer":
            self.header = {"Authorization": f"Bearer {self._token(challenge, basic, url)}"}
        else:
            raise AuthenticationError(
                f"registry answered HTTP {original.status_code} for {url} without a usable "
                f"challenge ({challenge!r})",
                source=self.source,
            )
        return {**headers, **self.header}, True

    def _token(self, challenge: str, basic: str | None, url: str) -> str:
        params = dict(_CHALLENGE_PARAM.findall(challenge))
        realm = params.pop("realm", "")
        if not realm.startswith(("http://", "https://")):
            raise AuthenticationError(f"bad token realm {realm!r} for {url}", source=self.source)
        headers = {"Authorization": f"Basic {basic}"} if basic else {}
        if self.credentials is not None and self.credentials.token and not basic:
            headers = {"Authorization": f"Bearer {self.credentials.token}"}
        if self.credentials is not None and not self.credentials.allows(url_host(realm)):
            headers = {}  # a token service elsewhere gets no credential: asked anonymously
        try:
            answer = self.session.get(realm, params=params, headers=headers)
        except requests.RequestException as exc:
            raise FetchError(f"token service {realm} failed: {exc}", source=self.source) from exc
        if answer.status_code != 200:
            raise AuthenticationError(
                f"token service {realm} refused the credentials (HTTP {answer.status_code})",
                source=self.source,
            )
        try:
            body = answer.json()
            return str(body.get("token") or body["access_token"])
        except (ValueError, KeyError, AttributeError) as exc:
            raise AuthenticationError(
                f"token service {realm} gave no token", source=self.source
            ) from exc


class _TimeoutSession(requests.Session):
    """A session whose requests time out: requests has no default timeout."""

    def __init__(self, timeout: tuple[float, float], user_agent: str) -> None:
        super().__init__()
        self._timeout = timeout
        self.headers["User-Agent"] = user_agent

    def request(self, *args: Any, **kwargs: Any) -> requests.Response:  # type: ignore[override]
        kwargs.setdefault("timeout", self._timeout)
        return super().request(*args, **kwargs)


class RegistryClient(oras.provider.Registry):  # type: ignore[misc]
    """oras-py's registry client with bounded retries, timeouts and explicit credentials; the
    agent's OCI fetcher and the hub's resolver both talk to registries through it."""

    def __init__(
        self,
        *,
        host: str,
        settings: RegistrySettings,
        credentials: Credentials | None,
        source: str,
    ) -> None:
        """``source`` names what the requests are for, in errors."""
        super().__init__(hostname=host, insecure=settings.plain_http)
        self.settings = settings
        self.source = source
        self.session = _TimeoutSession(
            (settings.connect_timeout, settings.timeout), settings.user_agent
        )
        self.auth = _ChallengeAuth(credentials, source=source)
        self.auth.session = self.session
        self.auth.prefix = self.prefix
        self.attempts_made = 0

    def do_request(
        self,
        url: str,
        method: str = "GET",
        data: dict[str, Any] | bytes | None = None,
        headers: dict[str, str] | None = None,
        json: dict[str, Any] | None = None,
        stream: bool = False,
    ) -> requests.Response:
        """One request, retried a bounded number of times while the registry is unreachable.

        Raises AuthenticationError on refused credentials, RegistryUnavailableError when every
        attempt failed, RegistryProtocolError when the request cannot be made at all (a
        malformed URL, endless redirects).
        """
        failure = ""
        for _attempt in attempts(self.settings.attempts, initial=self.settings.backoff):
            self.attempts_made += 1
            merged = {**(headers or {}), **self.auth.get_auth_header()}
            try:
                response: requests.Response = _UNBOUNDED_DO_REQUEST(
                    self, url, method, data, merged, json, stream
                )
            except (requests.ConnectionError, requests.Timeout) as exc:
                failure = f"{type(exc).__name__}: {exc}"
                continue
            except ValueError as exc:  # oras: "Cannot respond to request for authentication."
                raise AuthenticationError(f"{method} {url}: {exc}", source=self.source) from exc
            except requests.RequestException as exc:
                raise RegistryProtocolError(
                    f"{method} {url}: {type(exc).__name__}: {exc}",
                    source=self.source,
                    rule="RegistryProtocol",
                ) from exc
            if response.status_code >= 500:
                failure = f"HTTP {response.status_code} {response.reason}"
                response.close()
                continue
            if response.status_code in (401, 403):
                raise AuthenticationError(
                    f"{method} {url}: registry refused access (HTTP {response.status_code})",
                    source=self.source,
                )
            return response
        raise RegistryUnavailableError(
            f"{method} {url}: registry unreachable after {self.settings.attempts} attempts: "
            f"{failure}",
            source=self.source,
            attempts=self.settings.attempts,
        )


__all__ = [
    "RegistryClient",
    "RegistryProtocolError",
    "RegistrySettings",
    "RegistryUnavailableError",
]
