"""HTTP sources: download with a size cap, check the pinned sha256, unpack safely.

A download is streamed to a scratch file while hashing; it stops as soon as it passes
``max_bytes`` (whatever ``Content-Length`` claims). Only bytes whose sha256 equals the pin are
used: a tar or tar+gzip archive is unpacked with the safe extractor, anything else is kept as
one file named after the URL's last path segment (a single manifest file).
"""

from __future__ import annotations

import hashlib
import re
import shutil
import tempfile
import urllib.parse
from dataclasses import dataclass, field
from pathlib import Path

import requests

from agent.backoff import attempts
from agent.source.archive import ArchiveLimits, extract_archive, is_archive
from agent.source.content import (
    AuthenticationError,
    ContentRefusedError,
    Credentials,
    DigestMismatchError,
    FetchError,
    InvalidSourceError,
    check_hex_sha256,
)

_SAFE_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$")


class DownloadTooLargeError(ContentRefusedError):
    """The download is larger than the configured cap."""

    reason = "DownloadTooLarge"


@dataclass(frozen=True, kw_only=True)
class HttpSettings:
    """Timeouts, retries and the size cap of http sources.

    ``timeout`` bounds each read (a server that accepts and then says nothing), and
    ``connect_timeout`` the connection; ``attempts`` requests are made at most, ``backoff``
    seconds apart and doubling, with jitter (:func:`agent.backoff.attempts`)."""

    timeout: float = 10.0
    connect_timeout: float = 5.0
    attempts: int = 3
    backoff: float = 0.5
    max_bytes: int = 64 * 1024 * 1024
    archive_limits: ArchiveLimits = field(default_factory=ArchiveLimits)
    user_agent: str = "fleetlet-agent"


class HttpFetcher:
    """Downloads pinned http(s) content into a directory."""

    def __init__(self, *, settings: HttpSettings | None = None) -> None:
        self.settings = settings or HttpSettings()
        self.attempts_made = 0

    def fetch(
        self,
        *,
        uri: str,
        sha256: str,
        dest: Path,
        credentials: Credentials | None = None,
        source: str | None = None,
    ) -> None:
        """Download ``uri``, check its sha256 against the pin, unpack or place it in ``dest``.

        Raises InvalidSourceError, DigestMismatchError, DownloadTooLargeError,
        UnsafeArchiveError (permanent); AuthenticationError, FetchError (temporary).
        """
        label = source or f"http {uri}"
        expected = check_hex_sha256(sha256, source=label)
        parsed = urllib.parse.urlsplit(uri)
        if parsed.scheme not in ("http", "https") or not parsed.netloc:
            raise InvalidSourceError(
                f"expected an http(s) URL, got {uri!r}", source=label, rule="BadReference"
            )
        with tempfile.TemporaryDirectory(prefix="fleetlet-http-") as scratch:
            blob = Path(scratch) / "download"
            actual = self._download(uri, blob, credentials, label)
            if actual != expected:
                raise DigestMismatchError(
                    f"download hashes to sha256:{actual}, the pin is sha256:{expected}",
                    source=label,
                    file=uri,
                    rule="Sha256Mismatch",
                )
            if is_archive(blob):
                extract_archive(
                    blob,
                    dest,
                    source=label,
                    name=_file_name(parsed.path) or "download",
                    limits=self.settings.archive_limits,
                )
                return
            name = _file_name(parsed.path)
            if name is None:
                raise InvalidSourceError(
                    "a single-file download needs a plain file name at the end of its URL",
                    source=label,
                    file=uri,
                    rule="BadFileName",
                )
            dest.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(blob, dest / name)

    def _headers(self, credentials: Credentials | None) -> dict[str, str]:
        headers = {"User-Agent": self.settings.user_agent}
        if credentials is not None and credentials.token:
            headers["Authorization"] = f"Bearer {credentials.token}"
        return headers

    def _download(self, uri: str, out: Path, credentials: Credentials | None, label: str) -> str:
        auth = None
        if credentials is not None and credentials.username is not None:
            auth = (credentials.username, credentials.password or "")
        failure = ""
        for _attempt in attempts(self.settings.attempts, initial=self.settings.backoff):
            self.attempts_made += 1
            try:
                with requests.get(
                    uri,
                    headers=self._headers(credentials),
                    auth=auth,
                    stream=True,
                    timeout=(self.settings.connect_timeout, self.settings.timeout),
                ) as response:
                    if response.status_code in (401, 403):
                        raise AuthenticationError(
                            f"server refused access (HTTP {response.status_code})", source=label
                        )
                    if response.status_code >= 500:
                        failure = f"HTTP {response.status_code} {response.reason}"
                        continue
                    if response.status_code != 200:
                        raise FetchError(
                            f"GET {uri}: HTTP {response.status_code} {response.reason}",
                            source=label,
                        )
                    return self._stream(response, out, label, uri)
            except (
                requests.ConnectionError,
                requests.Timeout,
                requests.exceptions.ChunkedEncodingError,
            ) as exc:
                failure = f"{type(exc).__name__}: {exc}"
        raise FetchError(
            f"GET {uri}: unreachable after {self.settings.attempts} attempts: {failure}",
            source=label,
        )

    def _stream(self, response: requests.Response, out: Path, label: str, uri: str) -> str:
        limit = self.settings.max_bytes
        declared = response.headers.get("Content-Length")
        if declared is not None and declared.isdigit() and int(declared) > limit:
            raise DownloadTooLargeError(
                f"server announces {declared} bytes, more than the limit of {limit}",
                source=label,
                file=uri,
                rule="DownloadTooLarge",
            )
        hasher = hashlib.sha256()
        total = 0
        with open(out, "wb") as sink:
            for chunk in response.iter_content(64 * 1024):
                total += len(chunk)
                if total > limit:
                    raise DownloadTooLargeError(
                        f"download exceeds the limit of {limit} bytes",
                        source=label,
                        file=uri,
                        rule="DownloadTooLarge",
                    )
                hasher.update(chunk)
                sink.write(chunk)
        return hasher.hexdigest()


def _file_name(path: str) -> str | None:
    name = urllib.parse.unquote(path.rsplit("/", 1)[-1])
    return name if _SAFE_NAME.match(name) else None
