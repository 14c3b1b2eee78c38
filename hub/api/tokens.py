"""The hub API's bearer tokens, stored hashed: the tokens file never holds a token in clear.

A tokens file (``hub serve --tokens FILE``)::

    # fleetlet hub tokens: the SHA-256 of each token, never the token itself
    tokens:
      - name: ci            # who holds it (shown in logs instead of the token)
        role: admin         # admin or read
        sha256: 3c9f...     # hex SHA-256 of the token

A token is checked by hashing what the client sent and comparing, in constant time, with every
stored hash. SHA-256 without salt or stretching is enough because tokens are random (32 bytes
from :func:`secrets.token_urlsafe`, as ``fleetlet hub tokens add`` makes them), not chosen
passwords: nobody can search a 256-bit space, and a leaked file lets nobody in.

The format before this one mapped tokens in clear to roles; loading such a file fails with a
message that says how to convert it in place (``fleetlet hub tokens migrate FILE``).
"""

from __future__ import annotations

import hashlib
import hmac
import os
import re
import secrets
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from agent.errors import PermanentError

ROLES = ("admin", "read")
_HEX = re.compile(r"^[0-9a-f]{64}$")
_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._@-]{0,62}$")
_HEADER = "# fleetlet hub tokens: the SHA-256 of each token, never the token itself\n"


class HubConfigError(PermanentError):
    """A hub setting (tokens file, key file) is missing or malformed."""


@dataclass(frozen=True, kw_only=True)
class TokenEntry:
    """One token as stored: who holds it, its role, its SHA-256 (hex)."""

    name: str
    role: str
    sha256: str


def token_digest(token: str) -> str:
    """The hex SHA-256 of ``token`` (what the tokens file stores)."""
    return hashlib.sha256(token.encode()).hexdigest()


def new_token() -> str:
    """A fresh random token (32 bytes, URL-safe base64)."""
    return secrets.token_urlsafe(32)


class Tokens:
    """The stored tokens; :meth:`check` says which one a request's bearer token is."""

    def __init__(self, entries: Iterable[TokenEntry]) -> None:
        self.entries = tuple(entries)
        self._digests = [(bytes.fromhex(e.sha256), e) for e in self.entries]

    @classmethod
    def from_clear(cls, tokens: Mapping[str, str]) -> Tokens:
        """Tokens from ``{token: role}`` held in memory (tests, the demo); named by position."""
        return cls(
            TokenEntry(name=f"token-{i + 1}", role=role, sha256=token_digest(token))
            for i, (token, role) in enumerate(tokens.items())
        )

    def __bool__(self) -> bool:
        return bool(self.entries)

    def check(self, token: str) -> TokenEntry | None:
        """The entry whose hash matches ``token``, or None. Every entry is compared, in
        constant time, so the answer's timing says nothing about the stored hashes."""
        given = hashlib.sha256(token.encode()).digest()
        found = None
        for digest, entry in self._digests:
            if hmac.compare_digest(given, digest):
                found = entry
        return found


def load_tokens(path: Path) -> Tokens:
    """Read a tokens file (see the module docstring).

    Raises HubConfigError naming the file and the bad entry, never a token; a file in the old
    clear-text format gets a message that says how to convert it.
    """
    data = _read(path)
    entries = data.get("tokens") if isinstance(data, dict) else None
    if isinstance(entries, dict) or (isinstance(data, dict) and "tokens" not in data and data):
        raise HubConfigError(
            f"tokens file {path}: holds tokens in clear (the format before fleetlet 0.2); tokens "
            f"are now stored as SHA-256 hashes. Convert it in place, keeping every token valid: "
            f"fleetlet hub tokens migrate {path}"
        )
    if not isinstance(entries, list) or not entries:
        raise HubConfigError(f"tokens file {path}: expected `tokens:` with a list of entries")
    found: list[TokenEntry] = []
    for i, item in enumerate(entries):
        where = f"tokens file {path}: entry {i + 1}"
        if not isinstance(item, dict):
            raise HubConfigError(f"{where}: expected a mapping with name, role and sha256")
        name, role, digest = item.get("name"), item.get("role"), item.get("sha256")
        if not isinstance(name, str) or not _NAME.match(name):
            raise HubConfigError(f"{where}: name must be 1-63 letters, digits or ._@-")
        if role not in ROLES:
            raise HubConfigError(f"{where} ({name}): role must be admin or read, got {role!r}")
        if not isinstance(digest, str) or not _HEX.match(digest):
            raise HubConfigError(f"{where} ({name}): sha256 must be 64 lowercase hex digits")
        found.append(TokenEntry(name=name, role=role, sha256=digest))
    names = [e.name for e in found]
    duplicates = sorted({n for n in names if names.count(n) > 1})
    if duplicates:
        raise HubConfigError(f"tokens file {path}: names used twice: {', '.join(duplicates)}")
    return Tokens(found)


def write_tokens(path: Path, entries: Iterable[TokenEntry]) -> None:
    """Write a tokens file atomically, readable by its owner only. Raises OSError."""
    body = {"tokens": [{"name": e.name, "role": e.role, "sha256": e.sha256} for e in entries]}
    path = Path(path)
    tmp = path.with_name(f".{path.name}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as out:
        out.write(_HEADER + yaml.safe_dump(body, sort_keys=False))
    os.replace(tmp, path)


def add_token(path: Path, *, name: str, role: str) -> str:
    """Add a new random token named ``name`` with ``role`` to the file at ``path`` (created
    if missing) and return the token: the only time it is ever seen.

    Raises HubConfigError (bad name or role, the name taken, a file in the old format).
    """
    if role not in ROLES:
        raise HubConfigError(f"role must be admin or read, got {role!r}")
    if not _NAME.match(name):
        raise HubConfigError(f"token name {name!r}: use 1-63 letters, digits or ._@-")
    existing = list(load_tokens(path).entries) if Path(path).exists() else []
    if any(e.name == name for e in existing):
        raise HubConfigError(f"tokens file {path}: a token named {name!r} exists already")
    token = new_token()
    write_tokens(path, [*existing, TokenEntry(name=name, role=role, sha256=token_digest(token))])
    return token


def migrate_tokens(path: Path) -> int:
    """Rewrite a tokens file of the old clear-text format (``token: role``) with hashes, in
    place; the tokens stay valid. Returns how many were converted (0: already hashed).

    Raises HubConfigError for a file that is neither format.
    """
    data = _read(path)
    if isinstance(data, dict) and isinstance(data.get("tokens"), list):
        load_tokens(path)  # already hashed: only check it
        return 0
    clear = data.get("tokens") if isinstance(data, dict) and "tokens" in data else data
    if not isinstance(clear, dict) or not clear:
        raise HubConfigError(f"tokens file {path}: neither hashed entries nor token: role pairs")
    entries = []
    for i, (token, role) in enumerate(clear.items()):
        if not isinstance(token, str) or len(token) < 8:
            raise HubConfigError(f"tokens file {path}: entry {i + 1}: token shorter than 8")
        if role not in ROLES:
            raise HubConfigError(
                f"tokens file {path}: entry {i + 1}: role must be admin or read, got {role!r}"
            )
        entries.append(
            TokenEntry(name=f"token-{i + 1}", role=str(role), sha256=token_digest(token))
        )
    write_tokens(path, entries)
    return len(entries)


def _read(path: Path) -> Any:
    try:
        return yaml.safe_load(Path(path).read_text())
    except OSError as exc:
        raise HubConfigError(f"tokens file {path}: {exc.strerror}") from exc
    except yaml.YAMLError as exc:
        # Not the parser's message: it quotes the offending line, which may hold a token.
        mark = getattr(exc, "problem_mark", None)
        where = f" (line {mark.line + 1})" if mark is not None else ""
        raise HubConfigError(f"tokens file {path}: not valid YAML{where}") from None


def write_clear_tokens(path: Path, tokens: Mapping[str, str]) -> None:
    """Write a tokens file for ``{token: role}`` (hashed; named token-1, token-2...): for
    programs that make their own tokens, such as ``fleetlet demo`` and the tests."""
    write_tokens(path, Tokens.from_clear(tokens).entries)
