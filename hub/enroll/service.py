"""Enrollment requests, read top to bottom: a request arrives with a bootstrap token; it is
checked (token live, signed by the key it carries, fresh and never seen, name free, labels in
scope), recorded, then accepted (by the token's policy, or later by an operator) or denied.
Accepting writes the cluster into the inventory file the hub owns (rewritten, committed, or
on a branch of its own for the operator to merge: :mod:`hub.enroll.inventory`) and seals the
cluster's credentials to the public key the cluster sent::

    submit ─► check_token ─► verified_body ─► check_request ─► claim_nonce ─► record (pending)
      ─┬─ approve: auto, policy true (or none) ─► accept
       └─ approve: manual, or policy false ───── (wait for `hub clusters accept|deny`)
    accept ─► issue credentials ─► inventory (file, commit or branch) ─► seal to the cluster's key

State lives in ``ENROLL_DIR`` (``hub serve --enroll ENROLL_DIR``), all of it guarded by one
file lock so that several hub processes share it safely:

- ``tokens.yaml``: the operator's tokens (:mod:`hub.enroll.tokens`), never written here;
- ``config.yaml``: what an accepted cluster is told (repositories, signer identity, trusted
  root, the hub's public key), where the inventory file is, how credentials are issued;
- ``requests/<cluster>.json`` and ``used.json``: every request, its decision, how many
  clusters each token enrolled (the hub's own state); ``nonces/``: the requests seen within
  the replay window (:mod:`hub.enroll.signed`).

A refusal raises :class:`EnrollRefused` with an HTTP status and a one-line reason.
"""

from __future__ import annotations

import base64
import contextlib
import fcntl
import json
import os
import re
import subprocess
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import nacl.public
import nacl.signing
import yaml

from hub.api.openapi import API_PREFIX
from hub.api.tokens import HubConfigError
from hub.enroll.inventory import Inventory, Mode
from hub.enroll.policy import admits, variables
from hub.enroll.refused import EnrollRefused
from hub.enroll.signed import claim_nonce, verified_body
from hub.enroll.tokens import EnrollToken, EnrollTokens
from hub.fleet.selectors import label_key_ok, label_value_ok

CONFIG_FILE = "config.yaml"
REQUESTS_DIR = "requests"
STATES = ("pending", "accepted", "denied")
MAX_FACTS_BYTES = 64 * 1024
_NAME = re.compile(r"^[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?$")


@dataclass(frozen=True, kw_only=True)
class EnrollConfig:
    """``config.yaml`` of an enrollment directory (see docs/operations.md, "Enrollment")."""

    repo: str
    status_repo: str
    identity: str
    issuer: str
    trusted_root: str
    inventory: Path
    hub_public_key: str | None = None
    commit: Mode = "file"
    """``commit``: false (``file``), true (``commit``) or ``branch``."""
    branch_prefix: str = "enroll/"
    base_branch: str = "HEAD"
    push_remote: str | None = None
    credentials_command: tuple[str, ...] = ()

    def inventory_writer(self) -> Inventory:
        return Inventory(
            path=self.inventory,
            mode=self.commit,
            branch_prefix=self.branch_prefix,
            base=self.base_branch,
            push_remote=self.push_remote,
        )

    @classmethod
    def load(cls, directory: Path) -> EnrollConfig:
        """Raises HubConfigError naming the file and the field."""
        path = directory / CONFIG_FILE
        try:
            raw = yaml.safe_load(path.read_text()) or {}
        except OSError as exc:
            raise HubConfigError(f"enrollment config {path}: {exc.strerror}") from exc
        except yaml.YAMLError:
            raise HubConfigError(f"enrollment config {path}: not valid YAML") from None

        def need(key: str) -> str:
            value = raw.get(key)
            if not isinstance(value, str) or not value:
                raise HubConfigError(f"enrollment config {path}: {key} is required (a string)")
            return value

        def read(key: str, *, required: bool) -> str | None:
            name = raw.get(key)
            if name is None and not required:
                return None
            file = directory / need(key)
            try:
                return file.read_text()
            except OSError as exc:
                raise HubConfigError(
                    f"enrollment config {path}: {key} {file}: {exc.strerror}"
                ) from exc

        commit = raw.get("commit", False)
        modes: dict[object, Mode] = {False: "file", True: "commit", "branch": "branch"}
        if commit not in modes:
            raise HubConfigError(
                f"enrollment config {path}: commit is true, false or branch, got {commit!r}"
            )
        for key in ("branchPrefix", "baseBranch", "pushRemote"):
            if raw.get(key) is not None and (not isinstance(raw[key], str) or not raw[key]):
                raise HubConfigError(f"enrollment config {path}: {key} is a non-empty string")
        command = raw.get("credentialsCommand") or []
        if not isinstance(command, list) or not all(isinstance(c, str) for c in command):
            raise HubConfigError(
                f"enrollment config {path}: credentialsCommand is a list of strings"
            )
        return cls(
            repo=need("repo"),
            status_repo=need("statusRepo"),
            identity=need("identity"),
            issuer=need("issuer"),
            trusted_root=read("trustedRoot", required=True) or "",
            hub_public_key=read("hubPublicKey", required=False),
            inventory=directory / need("inventory"),
            commit=modes[commit],
            branch_prefix=raw.get("branchPrefix") or "enroll/",
            base_branch=raw.get("baseBranch") or "HEAD",
            push_remote=raw.get("pushRemote"),
            credentials_command=tuple(command),
        )


def _now() -> str:
    return datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


class Enrollment:
    """The enrollment service of one ``ENROLL_DIR``; every method takes the directory's lock."""

    def __init__(self, directory: Path, *, known: Mapping[str, Any] | None = None) -> None:
        self.directory = Path(directory)
        self.config = EnrollConfig.load(self.directory)
        self.tokens = EnrollTokens(self.directory)
        # Clusters the fleet repo already names (hub serve --fleet): never enrolled over.
        self.known = frozenset(known or ())
        self._requests = self.directory / REQUESTS_DIR

    # --- state ---------------------------------------------------------------------------

    @contextlib.contextmanager
    def _locked(self) -> Iterator[_State]:
        """The requests, under the directory's lock."""
        with open(self.directory / ".lock", "a") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            try:
                yield _State(self._requests)
            finally:
                fcntl.flock(lock, fcntl.LOCK_UN)

    def list(self, state: str | None = None) -> dict[str, Any]:
        if state is not None and state not in STATES:
            raise EnrollRefused(400, f"state must be one of {', '.join(STATES)}, got {state!r}")
        with self._locked() as requests:
            items = [_public(r) for r in requests.all()]
        return {
            "items": self._merge_state([r for r in items if state is None or r["state"] == state])
        }

    def _merge_state(self, items: Sequence[dict[str, Any]]) -> Sequence[dict[str, Any]]:
        """``items`` with ``pendingMerge`` on those accepted onto a branch of their own: whether
        the base branch's inventory does not name the cluster yet."""
        if any("inventoryBranch" in r for r in items):
            writer = self.config.inventory_writer()
            base = writer.base_text()
            for r in items:
                if "inventoryBranch" in r:
                    r["pendingMerge"] = not writer.merged(r["cluster"], base_text=base)
        return items

    # --- the agent's side ----------------------------------------------------------------

    def submit(self, token: str, raw: bytes, signature: str) -> dict[str, Any]:
        """A cluster asks to join with the body ``raw`` it signed. Raises EnrollRefused (401
        token unknown, signature wrong, request stale; 403 token dead or out of scope; 409 name
        taken, request replayed; 400 malformed)."""
        entry = self.check_token(token)
        body = verified_body(raw, signature, path=f"{API_PREFIX}/enroll")
        cluster, claimed, facts, key = check_request(body)
        claim_nonce(self.directory, body["nonce"], body["issuedAt"])
        with self._locked() as requests:
            taken = requests.get(cluster)
            if taken is not None or cluster in self.known:
                state = taken["state"] if taken is not None else "accepted"
                raise EnrollRefused(
                    409, f"cluster {cluster!r} is already {state}: pick another name"
                )
            labels = in_scope(entry, claimed)
            used = requests.used(entry.id)
            if entry.max_clusters and used >= entry.max_clusters:
                raise EnrollRefused(
                    403,
                    f"enrollment token {entry.id!r} is exhausted "
                    f"({used} of {entry.max_clusters} clusters)",
                )
            record = {
                "cluster": cluster,
                "token": entry.id,
                "labels": labels,
                "facts": facts,
                "publicKey": key,
                "state": "pending",
                "requestedAt": _now(),
            }
            accepted, why = entry.approve == "auto", ""
            if accepted and entry.policy:
                scope = {
                    "id": entry.id,
                    "labels": dict(entry.labels),
                    "allowLabels": dict(entry.allow_labels or {}),
                    "maxClusters": entry.max_clusters,
                    "used": used,
                }
                accepted, why = admits(
                    entry.policy,
                    variables(
                        cluster=cluster, labels=labels, claimed=claimed, facts=facts, token=scope
                    ),
                )
            if accepted:
                self._accept(record, by=f"token:{entry.id}" + (" policy" if entry.policy else ""))
            elif why:
                record["waiting"] = why
            requests.put(record, count=+1)
            return self._answer(record)

    def poll(self, token: str, cluster: str) -> dict[str, Any]:
        """The request's state for the token that made it. Raises EnrollRefused."""
        entry = self.tokens.check(token)
        if entry is None or entry.revoked:
            raise EnrollRefused(401, "unknown or revoked enrollment token")
        if not _NAME.match(cluster):
            raise EnrollRefused(404, f"no enrollment request {cluster!r} by this token")
        with self._locked() as requests:
            found = requests.get(cluster)
            if found is None or found["token"] != entry.id:
                raise EnrollRefused(404, f"no enrollment request {cluster!r} by this token")
            return self._answer(found)

    def check_token(self, token: str) -> EnrollToken:
        entry = self.tokens.check(token)
        if entry is None:
            raise EnrollRefused(401, "unknown enrollment token")
        if entry.revoked:
            raise EnrollRefused(403, f"enrollment token {entry.id!r} was revoked")
        if datetime.now(UTC) >= entry.expires_at:
            raise EnrollRefused(
                403,
                f"enrollment token {entry.id!r} expired at {entry.expires_at:%Y-%m-%dT%H:%M:%SZ}",
            )
        return entry

    # --- the operator's side -------------------------------------------------------------

    def decide(self, cluster: str, verdict: str, *, by: str, reason: str = "") -> dict[str, Any]:
        """``accept`` or ``deny`` a pending request. Raises EnrollRefused (404, 409)."""
        if not _NAME.match(cluster):
            raise EnrollRefused(404, f"no enrollment request {cluster!r}")
        with self._locked() as requests:
            found = requests.get(cluster)
            if found is None:
                raise EnrollRefused(404, f"no enrollment request {cluster!r}")
            if found["state"] != "pending":
                raise EnrollRefused(409, f"cluster {cluster!r} is already {found['state']}")
            if verdict == "accept":
                self._accept(found, by=by)
                requests.put(found)
                accepted: dict[str, Any] = self._merge_state([_public(found)])[0]
                return accepted
            else:
                found.pop("waiting", None)
                found |= {"state": "denied", "decidedAt": _now(), "decidedBy": by, "reason": reason}
                requests.put(found, count=-1)  # a denied request does not use up the token
            return _public(found)

    # --- acceptance ----------------------------------------------------------------------

    def _accept(self, found: dict[str, Any], *, by: str) -> None:
        cluster = found["cluster"]
        # Credentials first: a git host that fails leaves the inventory as it was.
        secrets = self._credentials(cluster)
        branch = self.config.inventory_writer().add(cluster, found["labels"])
        if branch is not None:
            found["inventoryBranch"] = branch  # in the fleet once the operator merges it
        key = nacl.signing.VerifyKey(base64.b64decode(found["publicKey"]))
        box = nacl.public.SealedBox(key.to_curve25519_public_key())
        found.pop("waiting", None)
        found |= {
            "state": "accepted",
            "decidedAt": _now(),
            "decidedBy": by,
            # Only the cluster can open it; the hub keeps no clear copy.
            "sealedCredentials": base64.b64encode(
                box.encrypt(json.dumps(secrets).encode())
            ).decode(),
        }

    def _credentials(self, cluster: str) -> dict[str, Any]:
        """What the git host issues for ``cluster`` through ``credentialsCommand`` (called with
        the cluster's name, it prints ``{"git": {...}, "statusGit": {...}}``), else nothing:
        the repositories need none (a read-only mirror, a git daemon)."""
        if not self.config.credentials_command:
            return {}
        done = subprocess.run(
            [*self.config.credentials_command, cluster],
            capture_output=True, text=True, timeout=60, check=False,
        )  # fmt: skip
        if done.returncode != 0:
            raise EnrollRefused(
                502, f"credentialsCommand failed for {cluster!r}: {done.stderr.strip()[:300]}"
            )
        try:
            issued = json.loads(done.stdout)
        except ValueError:
            raise EnrollRefused(502, "credentialsCommand did not print JSON") from None
        return {k: issued[k] for k in ("git", "statusGit") if isinstance(issued.get(k), dict)}

    def _answer(self, record: Mapping[str, Any]) -> dict[str, Any]:
        answer = _public(record)
        if record["state"] == "accepted":
            c = self.config
            answer["config"] = {
                "repo": c.repo,
                "statusRepo": c.status_repo,
                "identity": c.identity,
                "issuer": c.issuer,
                "trustedRoot": c.trusted_root,
                "hubPublicKey": c.hub_public_key,
            }
            answer["sealedCredentials"] = record["sealedCredentials"]
        return answer


class _State:
    """The requests of an enrollment directory, one file each (``requests/<cluster>.json``),
    and how many clusters each token enrolled (``used.json``): a request costs the same
    whatever the number enrolled before it. Used under the directory's lock only."""

    def __init__(self, directory: Path) -> None:
        self.directory = directory
        self._used = directory.parent / "used.json"

    def get(self, cluster: str) -> dict[str, Any] | None:
        try:
            found: dict[str, Any] = json.loads((self.directory / f"{cluster}.json").read_text())
            return found
        except FileNotFoundError:
            return None

    def all(self) -> list[dict[str, Any]]:
        if not self.directory.is_dir():
            return []
        return [json.loads(p.read_text()) for p in sorted(self.directory.glob("*.json"))]

    def used(self, token: str) -> int:
        return int(self._counts().get(token, 0))

    def put(self, record: Mapping[str, Any], *, count: int = 0) -> None:
        self.directory.mkdir(parents=True, exist_ok=True)
        if count:
            counts = self._counts()
            counts[record["token"]] = counts.get(record["token"], 0) + count
            _write(self._used, json.dumps(counts))
        _write(self.directory / f"{record['cluster']}.json", json.dumps(record))

    def _counts(self) -> dict[str, int]:
        try:
            found: dict[str, int] = json.loads(self._used.read_text())
            return found
        except FileNotFoundError:
            return {}


def _write(path: Path, text: str) -> None:
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(text)
    os.replace(tmp, path)


def _public(record: Mapping[str, Any]) -> dict[str, Any]:
    keys = (
        "cluster",
        "token",
        "labels",
        "facts",
        "state",
        "requestedAt",
        "decidedAt",
        "decidedBy",
        "reason",
        "waiting",
        "inventoryBranch",
    )
    return {k: record[k] for k in keys if k in record}


REQUEST_FIELDS = {"cluster", "labels", "facts", "publicKey", "nonce", "issuedAt"}


def check_request(body: Any) -> tuple[str, dict[str, str], dict[str, Any], str]:
    """(cluster, labels, facts, public key) of a request body whose signature, key, nonce and
    time :func:`~hub.enroll.signed.verified_body` checked. Raises EnrollRefused (400)."""
    unknown = sorted(set(body) - REQUEST_FIELDS)
    if unknown:
        raise EnrollRefused(400, f"unknown fields: {', '.join(map(str, unknown))}")
    cluster = body.get("cluster")
    if not isinstance(cluster, str) or not _NAME.match(cluster):
        raise EnrollRefused(400, f"cluster must be a lowercase DNS label, got {cluster!r}")
    labels = body.get("labels") or {}
    if not isinstance(labels, dict):
        raise EnrollRefused(400, "labels must be a mapping")
    for k, v in labels.items():
        if not label_key_ok(k) or not label_value_ok(v):
            raise EnrollRefused(400, f"label {k!r}={v!r} is not a label key=value")
    facts = body.get("facts") or {}
    if not isinstance(facts, dict) or len(json.dumps(facts)) > MAX_FACTS_BYTES:
        raise EnrollRefused(400, f"facts must be a mapping of at most {MAX_FACTS_BYTES} bytes")
    return cluster, dict(labels), facts, str(body["publicKey"])


def in_scope(entry: EnrollToken, claimed: Mapping[str, str]) -> dict[str, str]:
    """The labels the cluster gets: its claim within the token's scope, plus the token's fixed
    labels. Raises EnrollRefused (403) naming the first label outside the scope."""
    selector = entry.selector()
    allowed = set(entry.labels) | {r.key for r in (selector.requirements if selector else ())}
    for key, value in sorted(claimed.items()):
        fixed = entry.labels.get(key)
        if fixed is not None and fixed != value:
            raise EnrollRefused(
                403, f"label {key}={value} is outside the token's scope (it sets {key}={fixed})"
            )
        if key not in allowed:
            raise EnrollRefused(
                403, f"label {key}={value} is outside the token's scope (it allows no {key})"
            )
    labels = {**claimed, **entry.labels}
    if selector is not None and not selector.matches(labels):
        raise EnrollRefused(
            403,
            "labels "
            + (",".join(f"{k}={v}" for k, v in sorted(labels.items())) or "(none)")
            + " are outside the token's scope (allowLabels "
            + json.dumps(dict(entry.allow_labels or {}), sort_keys=True)
            + ")",
        )
    return labels
