"""Enrollment tokens, stored hashed like the API tokens (:mod:`hub.api.tokens`).

``ENROLL_DIR/tokens.yaml`` is written by ``fleetlet hub enroll-token create|revoke`` and read by
``hub serve --enroll ENROLL_DIR`` at each enrollment request (cached by modification time)::

    tokens:
      - id: stores-eu           # shown in list and in each request it enrolled
        sha256: 3c9f...         # of the token; the token itself is printed once, never stored
        labels: {tier: edge}    # set on every cluster it enrolls (a claim may not contradict)
        allowLabels: {matchExpressions: [{key: region, operator: In, values: [eu-1]}]}
        maxClusters: 50         # how many clusters it may enroll (0: no limit)
        expiresAt: "2026-12-01T00:00:00Z"
        approve: auto           # auto: accepted within scope; manual: waits for `hub clusters accept`
        policy: "'apps/v1' in facts.apiGroupVersions"   # optional CEL: auto acceptance needs it true
        revoked: false

The hub keeps how many clusters each token enrolled in its own state (:mod:`.service`), so the
operator's file and the hub's counts never race.
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import yaml

from agent.errors import FieldProblem
from hub.api.tokens import HubConfigError, new_token, token_digest
from hub.fleet.selectors import LabelSelector, label_key_ok, label_value_ok, parse_selector

TOKENS_FILE = "tokens.yaml"
APPROVE = ("auto", "manual")
_ID = re.compile(r"^[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?$")
_HEADER = "# fleetlet enrollment tokens: the SHA-256 of each token, never the token itself\n"


@dataclass(frozen=True, kw_only=True)
class EnrollToken:
    """One enrollment token's scope, as stored."""

    id: str
    sha256: str
    expires_at: datetime
    labels: Mapping[str, str] = field(default_factory=dict)
    allow_labels: Mapping[str, Any] | None = None
    max_clusters: int = 1
    approve: str = "auto"
    policy: str = ""
    revoked: bool = False

    def selector(self) -> LabelSelector | None:
        if self.allow_labels is None:
            return None
        problems: list[FieldProblem] = []
        return parse_selector(dict(self.allow_labels), "allowLabels", problems)

    def to_dict(self) -> dict[str, Any]:
        body: dict[str, Any] = {"id": self.id, "sha256": self.sha256}
        if self.labels:
            body["labels"] = dict(self.labels)
        if self.allow_labels is not None:
            body["allowLabels"] = dict(self.allow_labels)
        body |= {
            "maxClusters": self.max_clusters,
            "expiresAt": self.expires_at.strftime("%Y-%m-%dT%H:%M:%SZ"),
            "approve": self.approve,
        }
        if self.policy:
            body["policy"] = self.policy
        body["revoked"] = self.revoked
        return body


def parse_labels(text: str | None, flag: str = "--labels") -> dict[str, str]:
    """``k=v,k2=v2`` as a mapping. Raises HubConfigError naming the bad pair."""
    found: dict[str, str] = {}
    for pair in (text or "").split(","):
        if not pair.strip():
            continue
        key, sep, value = pair.strip().partition("=")
        if not sep or not label_key_ok(key) or not label_value_ok(value):
            raise HubConfigError(f"{flag}: {pair.strip()!r} is not a label key=value")
        found[key] = value
    return found


def parse_allow(text: str) -> dict[str, Any]:
    """``--allow-labels``: ``key in (a,b)``, ``key`` (exists) or ``key=v`` terms, comma-less
    between parentheses, joined by ``;``. Returns a LabelSelector mapping.

    Raises HubConfigError naming the bad term.
    """
    expressions: list[dict[str, Any]] = []
    for term in (t.strip() for t in text.split(";")):
        if not term:
            continue
        match = re.fullmatch(r"([^\s=()]+)\s+(in|notin)\s+\(([^)]*)\)", term)
        if match:
            values = [v.strip() for v in match[3].split(",") if v.strip()]
            operator = "In" if match[2] == "in" else "NotIn"
            expressions.append({"key": match[1], "operator": operator, "values": values})
        elif "=" in term:
            key, _, value = term.partition("=")
            expressions.append({"key": key.strip(), "operator": "In", "values": [value.strip()]})
        else:
            expressions.append({"key": term, "operator": "Exists"})
    raw = {"matchExpressions": expressions}
    problems: list[FieldProblem] = []
    if parse_selector(raw, "--allow-labels", problems) is None:
        raise HubConfigError(
            "; ".join(f"{p.path}: expected {p.expected}, found {p.found}" for p in problems)
        )
    return raw


class EnrollTokens:
    """The tokens file of an enrollment directory, read again when it changed."""

    def __init__(self, directory: Path) -> None:
        self.path = Path(directory) / TOKENS_FILE
        self._seen: tuple[float, int] | None = None
        self._tokens: dict[str, EnrollToken] = {}

    def all(self) -> list[EnrollToken]:
        try:
            stat = self.path.stat()
        except FileNotFoundError:
            return []
        if self._seen != (stat.st_mtime, stat.st_size):
            self._tokens = {t.sha256: t for t in read_tokens(self.path)}
            self._seen = (stat.st_mtime, stat.st_size)
        return list(self._tokens.values())

    def check(self, token: str) -> EnrollToken | None:
        """The token's entry, or None (a dict lookup by SHA-256: tokens are random)."""
        self.all()
        return self._tokens.get(token_digest(token))


def read_tokens(path: Path) -> list[EnrollToken]:
    """Raises HubConfigError naming the file and the entry."""
    try:
        data = yaml.safe_load(Path(path).read_text()) or {}
    except OSError as exc:
        raise HubConfigError(f"enrollment tokens {path}: {exc.strerror}") from exc
    except yaml.YAMLError:
        raise HubConfigError(f"enrollment tokens {path}: not valid YAML") from None
    entries = data.get("tokens") if isinstance(data, dict) else None
    if not isinstance(entries, list):
        raise HubConfigError(f"enrollment tokens {path}: expected `tokens:` with a list")
    found = []
    for i, raw in enumerate(entries):
        where = f"enrollment tokens {path}: entry {i + 1}"
        try:
            found.append(
                EnrollToken(
                    id=str(raw["id"]),
                    sha256=str(raw["sha256"]),
                    labels=dict(raw.get("labels") or {}),
                    allow_labels=raw.get("allowLabels"),
                    max_clusters=int(raw.get("maxClusters", 1)),
                    expires_at=datetime.strptime(
                        str(raw["expiresAt"]), "%Y-%m-%dT%H:%M:%SZ"
                    ).replace(tzinfo=UTC),
                    approve=str(raw.get("approve", "auto")),
                    policy=str(raw.get("policy") or ""),
                    revoked=bool(raw.get("revoked", False)),
                )
            )
        except (KeyError, TypeError, ValueError) as exc:
            raise HubConfigError(f"{where}: malformed ({exc})") from None
    return found


def write_tokens(path: Path, tokens: list[EnrollToken]) -> None:
    """Atomically, mode 0600. Raises OSError."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as out:
        out.write(
            _HEADER + yaml.safe_dump({"tokens": [t.to_dict() for t in tokens]}, sort_keys=False)
        )
    os.replace(tmp, path)


def create_token(
    directory: Path,
    *,
    id: str,
    labels: Mapping[str, str],
    allow_labels: Mapping[str, Any] | None,
    max_clusters: int,
    expires: timedelta,
    approve: str,
    policy: str = "",
    now: datetime | None = None,
) -> str:
    """Store a new token's hash and scope; return the token (the only time it is seen).

    Raises HubConfigError (bad id, id taken, bad scope, a policy that cannot work).
    """
    if not _ID.match(id):
        raise HubConfigError(f"token id {id!r}: use 1-63 lowercase letters, digits or -")
    if approve not in APPROVE:
        raise HubConfigError(f"--approve must be auto or manual, got {approve!r}")
    if max_clusters < 0:
        raise HubConfigError(f"--max-clusters must be 0 (no limit) or more, got {max_clusters}")
    if expires.total_seconds() <= 0:
        raise HubConfigError("--expires must be a positive duration")
    if policy:
        from hub.enroll.policy import check_policy

        if approve != "auto":
            raise HubConfigError("--policy decides acceptance: it goes with --approve auto")
        check_policy(policy)
    path = Path(directory) / TOKENS_FILE
    existing = read_tokens(path) if path.exists() else []
    if any(t.id == id for t in existing):
        raise HubConfigError(f"enrollment tokens {path}: a token {id!r} exists already")
    token = new_token()
    entry = EnrollToken(
        id=id,
        sha256=token_digest(token),
        labels=dict(labels),
        allow_labels=dict(allow_labels) if allow_labels is not None else None,
        max_clusters=max_clusters,
        expires_at=(now or datetime.now(UTC)).replace(microsecond=0) + expires,
        approve=approve,
        policy=policy,
    )
    write_tokens(path, [*existing, entry])
    return token


def revoke_token(directory: Path, id: str) -> None:
    """Mark token ``id`` revoked (kept, so the requests it made still name it).

    Raises HubConfigError (no such token)."""
    path = Path(directory) / TOKENS_FILE
    existing = read_tokens(path) if path.exists() else []
    if not any(t.id == id for t in existing):
        raise HubConfigError(f"enrollment tokens {path}: no token {id!r}")
    write_tokens(
        path,
        [EnrollToken(**{**t.__dict__, "revoked": True}) if t.id == id else t for t in existing],
    )
