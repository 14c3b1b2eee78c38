"""``fleet.yaml``: the fleet's settings (signing identity, expiry and refresh windows, shards,
commit signing, the default rollout). Called by :func:`hub.fleet.load.load_fleet`.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from agent.errors import FieldProblem
from agent.verify.sources import file_reader
from hub.fleet.commits import CommitPolicy, parse_commit_policy
from hub.fleet.durations import parse_duration
from hub.fleet.load._problems import _NAME, _found, _load_yaml, _Problems
from hub.fleet.model import (
    DEFAULT_EXPIRES_AFTER,
    DEFAULT_REFRESH_BEFORE,
    DEFAULT_SHARD_LABEL,
    MAX_SHARDS,
    SHARD_PLACEHOLDER,
    Settings,
    Sharding,
)
from hub.fleet.selectors import label_key_ok
from hub.fleet.signing import SourceSigning, parse_source_signing
from hub.rollout.model import NONE, Strategy, parse_strategy


def _load_settings(root: Path, problems: _Problems) -> Settings | None:
    rel = "fleet.yaml"
    path = root / rel
    if not path.is_file():
        problems.add(rel, "", "a fleet settings file", _found("missing"))
        return None
    raw = _load_yaml(path, rel, problems)
    if raw is None:
        raw = {}
    if not isinstance(raw, dict):
        problems.add(rel, "", "a mapping", raw)
        return None
    known = {
        "apiVersion",
        "kind",
        "name",
        "repo",
        "publication",
        "signing",
        "insecureRegistries",
        "shards",
        "rollout",
        "commitSigning",
        "sourceSigning",
        "agent",  # the agent's own version: hub.fleet.agent
    }
    for key in sorted(set(raw) - known, key=str):
        problems.add(rel, str(key), "one of " + ", ".join(sorted(known)), _found("unknown field"))
    if raw.get("apiVersion", "fleetlet.io/v1alpha1") != "fleetlet.io/v1alpha1":
        problems.add(rel, "apiVersion", '"fleetlet.io/v1alpha1"', raw.get("apiVersion"))
    if raw.get("kind", "Fleet") != "Fleet":
        problems.add(rel, "kind", '"Fleet"', raw.get("kind"))
    name = raw.get("name", "fleet")
    if not isinstance(name, str) or not _NAME.match(name):
        problems.add(rel, "name", "a lowercase DNS label", name)
    repo = raw.get("repo")
    if repo is not None and (not isinstance(repo, str) or not repo):
        problems.add(rel, "repo", "the fleet repo URL (a string)", repo)
    pub = raw.get("publication", {}) or {}
    expires_after, refresh_before = DEFAULT_EXPIRES_AFTER, DEFAULT_REFRESH_BEFORE
    if not isinstance(pub, dict):
        problems.add(rel, "publication", "a mapping", pub)
        pub = {}
    for key in sorted(set(pub) - {"expiresAfter", "refreshBefore"}, key=str):
        problems.add(rel, f"publication.{key}", "expiresAfter or refreshBefore", _found("unknown"))
    if "expiresAfter" in pub:
        d = parse_duration(pub["expiresAfter"])
        if d is None:
            problems.add(
                rel,
                "publication.expiresAfter",
                'a duration like "7d" or "36h"',
                pub["expiresAfter"],
            )
        else:
            expires_after = d
    if "refreshBefore" in pub:
        d = parse_duration(pub["refreshBefore"])
        if d is None:
            problems.add(
                rel,
                "publication.refreshBefore",
                'a duration like "2d" or "12h"',
                pub["refreshBefore"],
            )
        else:
            refresh_before = d
    if refresh_before >= expires_after:
        problems.add(
            rel,
            "publication.refreshBefore",
            f"less than expiresAfter ({expires_after})",
            _found(str(refresh_before)),
        )
    signing = raw.get("signing", {}) or {}
    if not isinstance(signing, dict):
        problems.add(rel, "signing", "a mapping", signing)
        signing = {}
    for key in sorted(set(signing) - {"identity", "issuer"}, key=str):
        problems.add(rel, f"signing.{key}", "identity or issuer", _found("unknown"))
    identity, issuer = signing.get("identity"), signing.get("issuer")
    for key, value in (("identity", identity), ("issuer", issuer)):
        if value is not None and (not isinstance(value, str) or not value):
            problems.add(rel, f"signing.{key}", "a non-empty string", value)
    insecure = raw.get("insecureRegistries", []) or []
    if not isinstance(insecure, list) or not all(isinstance(h, str) and h for h in insecure):
        problems.add(rel, "insecureRegistries", "a list of registry hosts (host:port)", insecure)
        insecure = []
    return Settings(
        name=name if isinstance(name, str) else "fleet",
        repo=repo if isinstance(repo, str) else None,
        expires_after=expires_after,
        refresh_before=refresh_before,
        identity=identity if isinstance(identity, str) else None,
        issuer=issuer if isinstance(issuer, str) else None,
        insecure_registries=tuple(sorted(insecure)),
        shards=_load_sharding(raw.get("shards"), rel, problems),
        rollout=_default_rollout(raw.get("rollout"), rel, problems),
        commit_signing=_commit_signing(raw.get("commitSigning"), root, rel, problems),
        source_signing=_source_signing(raw, root, rel, problems),
    )


def _commit_signing(raw: Any, root: Path, rel: str, problems: _Problems) -> CommitPolicy | None:
    if raw is None:
        return None
    found: list[FieldProblem] = []
    policy = parse_commit_policy(raw, "commitSigning", found, file_reader(root))
    problems.extend(rel, found)
    return policy


def _source_signing(
    raw: dict[str, Any], root: Path, rel: str, problems: _Problems
) -> SourceSigning | None:
    if "sourceSigning" not in raw:
        return None
    found: list[FieldProblem] = []
    signing = parse_source_signing(raw["sourceSigning"], root, found)
    problems.extend(rel, found)
    return signing


def _default_rollout(raw: Any, rel: str, problems: _Problems) -> Strategy | None:
    if raw is None:
        return None
    found: list[FieldProblem] = []
    strategy = parse_strategy(raw, "rollout", found)
    problems.extend(rel, found)
    if strategy == NONE:
        problems.add(rel, "rollout", "a rollout strategy (waves, ...)", raw)
        return None
    return strategy if isinstance(strategy, Strategy) else None


def _load_sharding(raw: Any, rel: str, problems: _Problems) -> Sharding:
    if raw is None:
        return Sharding()
    if not isinstance(raw, dict):
        problems.add(rel, "shards", "a mapping (count, label, repo, statusRepo)", raw)
        return Sharding()
    for key in sorted(set(raw) - {"count", "label", "repo", "statusRepo"}, key=str):
        problems.add(rel, f"shards.{key}", "count, label, repo or statusRepo", _found("unknown"))
    count = raw.get("count", 1)
    if not isinstance(count, int) or isinstance(count, bool) or not 1 <= count <= MAX_SHARDS:
        problems.add(rel, "shards.count", f"a whole number from 1 to {MAX_SHARDS}", count)
        count = 1
    label = raw.get("label", DEFAULT_SHARD_LABEL)
    if not label_key_ok(label):
        problems.add(rel, "shards.label", "a label key", label)
        label = DEFAULT_SHARD_LABEL
    templates: dict[str, str | None] = {}
    for key in ("repo", "statusRepo"):
        value = raw.get(key)
        if value is not None and (
            not isinstance(value, str) or (count > 1 and SHARD_PLACEHOLDER not in value)
        ):
            problems.add(rel, f"shards.{key}", "a repository URL template with {shard}", value)
            value = None
        templates[key] = value
    return Sharding(
        count=count, label=label, repo=templates["repo"], status_repo=templates["statusRepo"]
    )
