"""The hub's seal on rollout state: proof that a commit of ``refs/fleetlet/rollouts`` was
written by a hub of this fleet, not pushed by another holder of write access to the repository
(in a single-repository setup, every cluster's status credential).

Called by :class:`hub.rollout.state.RolloutStore`: :func:`seal` when it writes a state commit,
:func:`check` when it reads one. A seal is the last line of the commit message

    Fleetlet-State-Seal: v1 hmac-sha256 <64 hex>

an HMAC-SHA256, with the hub's state key, over the commit's parents and every entry of its tree
(name, mode, object id). The tree's entries name every file by its content hash (the variants
too), so changing any byte of any rollout, member, phase or variant, or grafting the state onto
other parents, breaks the seal. Only hubs hold the key: every hub of a fleet reads the same one.

The key: ``FLEETLET_HUB_STATE_KEY`` (the key itself, for CI secrets), else the file named by
``FLEETLET_HUB_STATE_KEY_FILE``, else
``$XDG_CONFIG_HOME/fleetlet/hub-state.key`` (``~/.config/...``), made (32 random bytes, mode
0600) the first time a hub needs it. A hub without the key that wrote the state refuses that
state: give every hub the same key (a Kubernetes Secret mounted as a file).
"""

from __future__ import annotations

import hashlib
import hmac
import os
import secrets
from collections.abc import Iterable
from pathlib import Path

from hub.errors import PublishError

KEY_ENV = "FLEETLET_HUB_STATE_KEY_FILE"
KEY_VALUE_ENV = "FLEETLET_HUB_STATE_KEY"
TRAILER = "Fleetlet-State-Seal"
SCHEME = "v1 hmac-sha256"
MIN_KEY_BYTES = 32


class StateKeyError(PublishError):
    """The hub's state key cannot be read or made."""


def key_source() -> str:
    """Where the key comes from, for messages."""
    if os.environ.get(KEY_VALUE_ENV, "").strip():
        return f"${KEY_VALUE_ENV}"
    return str(key_path())


def key_path() -> Path:
    named = os.environ.get(KEY_ENV, "").strip()
    if named:
        return Path(named)
    base = Path(os.environ.get("XDG_CONFIG_HOME") or Path.home() / ".config")
    return base / "fleetlet" / "hub-state.key"


def load_key() -> bytes:
    """The hub's state key (made when the default file does not exist yet). Raises
    StateKeyError."""
    value = os.environ.get(KEY_VALUE_ENV, "").strip()
    if value:
        if len(value) < MIN_KEY_BYTES:
            raise StateKeyError(
                f"${KEY_VALUE_ENV}: {len(value)} characters, at least {MIN_KEY_BYTES} expected"
            )
        return value.encode()
    path = key_path()
    named = bool(os.environ.get(KEY_ENV, "").strip())
    if not path.exists() and not named:
        _make(path)
    try:
        key = path.read_bytes().strip()
    except OSError as exc:
        raise StateKeyError(f"rollout state key {path}: {exc.strerror}") from exc
    if len(key) < MIN_KEY_BYTES:
        raise StateKeyError(
            f"rollout state key {path}: {len(key)} bytes, at least {MIN_KEY_BYTES} expected"
        )
    return key


def _make(path: Path) -> None:
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        temporary = path.with_name(f".{path.name}.{os.getpid()}.{secrets.token_hex(4)}")
        fd = os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(fd, "w") as out:
            out.write(secrets.token_hex(32) + "\n")
        try:
            os.link(temporary, path)  # never replaces a key another hub process just made
        except FileExistsError:
            pass
        finally:
            temporary.unlink()
    except OSError as exc:
        raise StateKeyError(f"rollout state key {path}: cannot be made: {exc}") from exc


def _mac(key: bytes, parents: Iterable[str], entries: Iterable[tuple[str, int, str]]) -> str:
    digest = hmac.new(key, b"fleetlet rollout state v1\n", hashlib.sha256)
    for parent in parents:
        digest.update(f"parent {parent}\n".encode())
    for name, mode, oid in sorted(entries):
        digest.update(f"entry {mode:o} {oid} {len(name)}:{name}\n".encode())
    return digest.hexdigest()


def seal(key: bytes, parents: Iterable[str], entries: Iterable[tuple[str, int, str]]) -> str:
    """The trailer line sealing a commit with these parents and tree entries."""
    return f"{TRAILER}: {SCHEME} {_mac(key, parents, entries)}"


def check(
    key: bytes, message: str, parents: Iterable[str], entries: Iterable[tuple[str, int, str]]
) -> str | None:
    """None when ``message`` carries a valid seal for these parents and entries; else why not."""
    lines = message.rstrip().splitlines()
    last = lines[-1] if lines else ""
    if not last.startswith(f"{TRAILER}:"):
        return "it carries no hub seal"
    scheme, _, mac = last.split(":", 1)[1].strip().rpartition(" ")
    if scheme != SCHEME:
        return f"its seal is of an unknown scheme {scheme!r}"
    if not hmac.compare_digest(mac, _mac(key, parents, entries)):
        return "its seal does not match its content (not written with this hub's state key)"
    return None


__all__ = [
    "KEY_ENV",
    "KEY_VALUE_ENV",
    "TRAILER",
    "StateKeyError",
    "check",
    "key_path",
    "key_source",
    "load_key",
    "seal",
]
