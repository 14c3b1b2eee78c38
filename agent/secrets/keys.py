"""The cluster's age key pair: made by its agent, kept in a Secret of the agent's namespace,
never sent anywhere. Called by the inbound pipeline (:class:`agent.inbound.InboundPipeline`)
before it renders, and for the facts it reports (the public keys only).

The Secret ``fleetlet-age-key`` holds ``keys.txt``, an age identity file (what ``age-keygen``
writes, so ``sops`` and ``age`` read it as it is), newest key first::

    # created: 2026-11-27T04:00:00Z
    # public key: age1...
    AGE-SECRET-KEY-1...

The agent makes it the first time it renders a set (``create``: two agents racing keep the
first one). Every key in the file opens files; the first is the one operators encrypt to.

Rotation, asked by a cluster admin on the Secret, done by the agent (so a private key is only
ever made inside the cluster):

- ``fleetlet.io/age-key-rotate: <any new word>``: the agent makes a new key and puts it first
  (once per word); the old keys stay, so files not yet re-encrypted keep opening;
- ``fleetlet.io/age-key-retire: age1...[,age1...]``: once the fleet's files are re-encrypted,
  the agent drops those keys (never the newest).
"""

from __future__ import annotations

import base64
import logging
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

import pyrage

from agent.errors import ConfigurationError
from agent.kube import ConflictError, KubeClient

log = logging.getLogger(__name__)

KEY_SECRET = "fleetlet-age-key"
KEY_FILE = "keys.txt"
ROTATE_ANNOTATION = "fleetlet.io/age-key-rotate"
ROTATED_ANNOTATION = "fleetlet.io/age-key-rotated"
RETIRE_ANNOTATION = "fleetlet.io/age-key-retire"
FIELD_MANAGER = "fleetlet-agent"


class KeyFileError(ConfigurationError):
    """The cluster's key Secret holds no usable age identity (the message says what)."""

    reason = "AgeKeyInvalid"


@dataclass(frozen=True)
class Keyring:
    """The cluster's age identities (newest first) and their public keys (recipients);
    ``problem``: why there are none (the Secret could not be read), said by every file that
    then does not open."""

    identities: tuple[pyrage.x25519.Identity, ...]
    recipients: tuple[str, ...]
    problem: str | None = None

    @property
    def current(self) -> str:
        """The recipient operators encrypt to (the newest key)."""
        return self.recipients[0]

    def __repr__(self) -> str:  # never the private keys
        return f"Keyring(recipients={list(self.recipients)!r})"


def parse_identities(text: str, *, origin: str) -> Keyring:
    """The keyring in an age identity file's text. Raises KeyFileError naming ``origin``."""
    identities = []
    for number, raw in enumerate(text.splitlines(), 1):
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        try:
            identities.append(pyrage.x25519.Identity.from_str(line))
        except pyrage.IdentityError:
            raise KeyFileError(f"{origin}: line {number} is not an age X25519 identity") from None
    if not identities:
        raise KeyFileError(f"{origin}: no age identity")
    return Keyring(
        identities=tuple(identities),
        recipients=tuple(str(i.to_public()) for i in identities),
    )


def identity_text(identity: pyrage.x25519.Identity, *, created: datetime) -> str:
    """One key as ``age-keygen`` writes it."""
    return (
        f"# created: {created.astimezone(UTC).strftime('%Y-%m-%dT%H:%M:%SZ')}\n"
        f"# public key: {identity.to_public()}\n{identity}\n"
    )


class ClusterKeys:
    """The key Secret of one agent namespace: loaded, made when absent, rotated on request."""

    def __init__(
        self,
        kube: KubeClient,
        namespace: str,
        *,
        clock: Callable[[], datetime] = lambda: datetime.now(UTC),
    ) -> None:
        self._kube = kube
        self._namespace = namespace
        self._clock = clock

    @property
    def origin(self) -> str:
        return f"Secret {self._namespace}/{KEY_SECRET}"

    def keyring(self) -> Keyring:
        """The cluster's keys: made when the Secret is absent, rotated or retired when an
        admin asked on the Secret.

        Raises KeyFileError, and what the API server raises (ApiUnavailableError: temporary).
        """
        found = self._kube.get(self._ref())
        secret = found if found is not None else self._make()
        text = _file_text(secret, self.origin)
        updated = self._rotated(secret, text)
        if updated is not None:
            text = updated
        return parse_identities(text, origin=self.origin)

    def _ref(self) -> dict[str, Any]:
        return {
            "apiVersion": "v1",
            "kind": "Secret",
            "metadata": {"name": KEY_SECRET, "namespace": self._namespace},
        }

    def _secret(self, text: str) -> dict[str, Any]:
        obj = self._ref()
        obj["metadata"]["labels"] = {"app.kubernetes.io/managed-by": "fleetlet"}
        obj["type"] = "Opaque"
        obj["data"] = {KEY_FILE: base64.b64encode(text.encode()).decode()}
        return obj

    def _make(self) -> Mapping[str, Any]:
        text = identity_text(pyrage.x25519.Identity.generate(), created=self._clock())
        try:
            made = self._kube.create(self._secret(text), field_manager=FIELD_MANAGER)
        except ConflictError:  # another agent made it first: keep theirs
            found = self._kube.get(self._ref())
            if found is None:
                raise
            return found
        log.info("made this cluster's age key pair in %s", self.origin)
        return made

    def _rotated(self, secret: Mapping[str, Any], text: str) -> str | None:
        """The new file when an admin asked for a rotation or a retirement (written back to
        the Secret), else None."""
        meta = secret.get("metadata") or {}
        annotations: dict[str, str] = dict(meta.get("annotations") or {})
        rotate = annotations.get(ROTATE_ANNOTATION)
        retire = [r.strip() for r in annotations.pop(RETIRE_ANNOTATION, "").split(",") if r]
        if (not rotate or annotations.get(ROTATED_ANNOTATION) == rotate) and not retire:
            return None
        blocks = _blocks(text)
        if rotate and annotations.get(ROTATED_ANNOTATION) != rotate:
            fresh = pyrage.x25519.Identity.generate()
            blocks.insert(0, (str(fresh.to_public()), identity_text(fresh, created=self._clock())))
            annotations[ROTATED_ANNOTATION] = rotate
        newest = blocks[0][0]
        kept = [b for b in blocks if b[0] == newest or b[0] not in retire]
        new_text = "".join(block for _, block in kept)
        patch: dict[str, Any] = {
            "metadata": {
                # A merge patch naming the resourceVersion is refused (409) if the Secret
                # changed since it was read: the next read does it again.
                "resourceVersion": meta.get("resourceVersion"),
                "annotations": {ROTATED_ANNOTATION: annotations.get(ROTATED_ANNOTATION)}
                | ({RETIRE_ANNOTATION: None} if retire else {}),
            },
            "data": {KEY_FILE: base64.b64encode(new_text.encode()).decode()},
        }
        try:
            self._kube.patch(self._ref(), patch)
        except ConflictError:
            return None
        log.info(
            "%s: age keys now %s (rotate=%s, retired=%s)",
            self.origin,
            ", ".join(b[0] for b in kept),
            rotate or "-",
            ", ".join(retire) or "-",
        )
        return new_text


def _file_text(secret: Mapping[str, Any], origin: str) -> str:
    data = (secret.get("data") or {}).get(KEY_FILE)
    if not isinstance(data, str):
        raise KeyFileError(f"{origin}: no {KEY_FILE}")
    try:
        return base64.b64decode(data).decode()
    except (ValueError, UnicodeDecodeError):
        raise KeyFileError(f"{origin}: {KEY_FILE} is not base64 UTF-8 text") from None


def _blocks(text: str) -> list[tuple[str, str]]:
    """(recipient, the key's lines with their comments) for each key of the file, in order."""
    out: list[tuple[str, str]] = []
    pending: list[str] = []
    for line in text.splitlines(keepends=True):
        pending.append(line if line.endswith("\n") else line + "\n")
        stripped = line.strip()
        if stripped and not stripped.startswith("#"):
            try:
                recipient = str(pyrage.x25519.Identity.from_str(stripped).to_public())
            except pyrage.IdentityError:
                raise KeyFileError(f"a line of {KEY_FILE} is not an age identity") from None
            out.append((recipient, "".join(pending)))
            pending = []
    return out


__all__ = [
    "KEY_FILE",
    "KEY_SECRET",
    "RETIRE_ANNOTATION",
    "ROTATE_ANNOTATION",
    "ClusterKeys",
    "KeyFileError",
    "Keyring",
    "parse_identities",
]
