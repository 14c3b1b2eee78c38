"""Loading and validating a fleet repo (the format is documented in ``docs/fleet-repo.md``).

Layout::

    FLEET_DIR/fleet.yaml        settings (signing identity, expiry and refresh windows, repo)
    FLEET_DIR/clusters/*.yaml   clusters with labels: one cluster per file, or ``clusters: [...]``
    FLEET_DIR/bundles/*.yaml    one bundle per file: sources, format, targets, overrides, ...

:func:`load_fleet` reads everything into :mod:`hub.fleet.model`'s types and reports every
problem in one :class:`~hub.errors.FleetRepoError`, each naming the file, the field and what is
wrong.
"""

from __future__ import annotations

import functools
import operator
import re
from collections.abc import Mapping
from itertools import repeat
from pathlib import Path, PurePosixPath
from typing import TYPE_CHECKING, Any

import yaml

from agent.api.pins import is_commit, is_digest, is_sha256_hex
from agent.api.yamlio import KUBE_LOADER
from agent.errors import FieldProblem
from hub.errors import FleetRepoError
from hub.fleet.commits import CommitPolicy, parse_commit_policy
from hub.fleet.durations import parse_duration
from hub.fleet.helmsets import check_sets
from hub.fleet.jump import shard_of_name
from hub.fleet.model import (
    APPROVALS,
    DEFAULT_EXPIRES_AFTER,
    DEFAULT_REFRESH_BEFORE,
    DEFAULT_SHARD_LABEL,
    MAX_SHARDS,
    SHARD_PLACEHOLDER,
    SOURCE_KINDS,
    Bundle,
    Cluster,
    Fleet,
    Override,
    Settings,
    Sharding,
    SourceRef,
    Target,
)
from hub.fleet.selectors import label_key_ok, label_value_ok, parse_selector
from hub.rollout.model import NONE, Strategy, parse_strategy

if TYPE_CHECKING:
    from hub.fleet.cache import ParsedFiles

# Cluster and bundle names end up in branch names and Kubernetes object names.
_NAME = re.compile(r"^[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?$")
_IMAGE_URI = re.compile(r"^[A-Za-z0-9.-]+(:[0-9]+)?(/[a-z0-9]+([._-][a-z0-9]+)*)+$")

# Which reference fields each source kind takes; the pinned one comes first.
# A `version` is a SemVer range (or one version) resolved by the hub: a Helm repository's chart
# versions, or an OCI repository's tags (Helm charts in a registry).
_REF_FIELDS: dict[str, tuple[str, ...]] = {
    "image": ("digest", "tag", "version"),
    "git": ("commit", "tag", "branch"),
    "http": ("sha256",),
    "helm": ("version",),
}
_CHART = re.compile(r"^[A-Za-z0-9]([A-Za-z0-9._-]*[A-Za-z0-9])?$")
_SOURCE_PASSTHROUGH = ("directory", "destination", "auth")
# Keys of a bundle file the hub consumes itself; every other key is passed to the
# BundleDeployment spec unchanged (the agent's API validates it).
_BUNDLE_OWN_KEYS = ("name", "sources", "targets", "overrides", "rollout", "encryptedValues")
# What an override changes (it needs one at least), and every key it may have.
_OVERRIDE_FIELDS = (
    "sources",
    "values",
    "encryptedValues",
    "paused",
    "approval",
    "namespace",
    "path",
    "patches",
    "setString",
    "setJson",
    "setFile",
)
_OVERRIDE_KEYS = ("clusters", "clusterSelector", *_OVERRIDE_FIELDS)


class _Problems:
    """Collects problems as ``FILE: FIELD`` paths."""

    def __init__(self) -> None:
        self.items: list[FieldProblem] = []

    def add(self, file: str, where: str, expected: str, found: object) -> None:
        path = f"{file}: {where}" if where else file
        self.items.append(FieldProblem(path=path, expected=expected, found=_show(found)))

    def extend(self, file: str, problems: list[FieldProblem]) -> None:
        for p in problems:
            self.items.append(
                FieldProblem(path=f"{file}: {p.path}", expected=p.expected, found=p.found)
            )


def _show(value: object) -> str:
    if isinstance(value, str) and value.startswith("\x00"):
        return value[1:]  # already phrased
    text = f'"{value}"' if isinstance(value, str) else repr(value)
    return text if len(text) <= 80 else text[:77] + "..."


def _found(text: str) -> str:
    return "\x00" + text


_MAX_FILE_BYTES = 16 * 1024 * 1024
_NAME_OF = operator.attrgetter("name")
# A Cluster from its four fields without a Python call each (tuple.__new__, as
# namedtuple's _make does, minus its length check: the rows always have four).
_NEW_CLUSTER = functools.partial(tuple.__new__, Cluster)


def _load_yaml(path: Path, rel: str, problems: _Problems, *, data: bytes | None = None) -> Any:
    if data is None:
        try:
            data = path.read_bytes()
        except OSError as exc:
            problems.add(rel, "", "a readable file", _found(str(exc.strerror or exc)))
            return None
    if len(data) > _MAX_FILE_BYTES:
        problems.add(rel, "", f"at most {_MAX_FILE_BYTES} bytes", _found(f"{len(data)} bytes"))
        return None
    try:
        return yaml.load(data, Loader=KUBE_LOADER)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f"line {mark.line + 1}" if mark is not None else ""
        problem = getattr(exc, "problem", None) or str(exc).splitlines()[0]
        problems.add(rel, where, "valid YAML", _found(str(problem)))
        return None


def load_fleet(root: str | Path, *, cache_dir: Path | None = None) -> Fleet:
    """Load and validate the fleet repo in ``root``.

    ``cache_dir`` keeps the parsed cluster files by content hash (:mod:`hub.fleet.cache`):
    an unchanged inventory is not parsed again. Raises FleetRepoError listing every problem
    found (file, field, expected, found).
    """
    from hub.fleet.cache import ParsedFiles

    root = Path(root)
    problems = _Problems()
    if not root.is_dir():
        what = "a file" if root.exists() else "nothing there"
        problems.add(
            str(root), "", "a fleet repo directory (fleet.yaml, clusters/, bundles/)", _found(what)
        )
        raise FleetRepoError(problems.items)
    settings = _load_settings(root, problems)
    files: list[str] = ["fleet.yaml"]
    clusters: dict[str, Cluster] = {}
    parsed = ParsedFiles(cache_dir) if cache_dir is not None else None
    for path in _yaml_files(root / "clusters"):
        rel = path.relative_to(root).as_posix()
        files.append(rel)
        count = settings.shards.count if settings is not None else 1
        found = _cluster_file(path, rel, problems, parsed, count)
        before = len(clusters)
        merged = {**clusters, **dict(zip(map(_NAME_OF, found), found, strict=True))}
        if len(merged) == before + len(found):
            clusters = merged  # the common case: every name new (checked in one go)
            continue
        for c in found:
            if c.name in clusters:
                problems.add(
                    rel,
                    "name",
                    "a unique cluster name",
                    _found(f'"{c.name}" (also in {clusters[c.name].file})'),
                )
            else:
                clusters[c.name] = c
    if not (root / "clusters").is_dir():
        problems.add("clusters/", "", "a directory of cluster files", _found("missing"))
    bundles: dict[str, Bundle] = {}
    for path in _yaml_files(root / "bundles"):
        rel = path.relative_to(root).as_posix()
        files.append(rel)
        b = _load_bundle_file(path, rel, clusters, problems)
        if b is None:
            continue
        if b.name in bundles:
            problems.add(
                rel,
                "name",
                "a unique bundle name",
                _found(f'"{b.name}" (also in {bundles[b.name].file})'),
            )
        else:
            bundles[b.name] = b
    if not (root / "bundles").is_dir():
        problems.add("bundles/", "", "a directory of bundle files", _found("missing"))
    strategies = _group_strategies(bundles, settings, problems) if settings is not None else {}
    if problems.items:
        raise FleetRepoError(problems.items, origin=str(root))
    if parsed is not None:
        parsed.prune()
    assert settings is not None
    return Fleet(
        root=root,
        settings=settings,
        clusters=tuple(map(clusters.__getitem__, sorted(clusters))),
        bundles=tuple(bundles[n] for n in sorted(bundles)),
        files=tuple(sorted(files)),
        by_name=clusters,
        rollouts=strategies,
    )


def _group_strategies(
    bundles: Mapping[str, Bundle], settings: Settings, problems: _Problems
) -> dict[str, Strategy]:
    """Group -> rollout strategy: the one its bundles name (they must agree), else fleet.yaml's
    default, unless a bundle says ``rollout: none``."""
    said: dict[str, Bundle] = {}
    groups: set[str] = set()
    for name in sorted(bundles):
        b = bundles[name]
        groups.add(b.group)
        if b.rollout is None:
            continue
        first = said.get(b.group)
        if first is None:
            said[b.group] = b
        elif first.rollout != b.rollout:
            problems.add(
                b.file,
                "rollout",
                f"the rollout of {first.file} (group {b.group!r} moves as one)",
                _found("another one"),
            )
    out: dict[str, Strategy] = {}
    for group in sorted(groups):
        chosen = said[group].rollout if group in said else settings.rollout
        if isinstance(chosen, Strategy):
            out[group] = chosen
    return out


def _yaml_files(directory: Path) -> list[Path]:
    if not directory.is_dir():
        return []
    return sorted(p for p in directory.iterdir() if p.suffix in (".yaml", ".yml") and p.is_file())


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
        commit_signing=_commit_signing(raw.get("commitSigning"), rel, problems),
    )


def _commit_signing(raw: Any, rel: str, problems: _Problems) -> CommitPolicy | None:
    if raw is None:
        return None
    found: list[FieldProblem] = []
    policy = parse_commit_policy(raw, "commitSigning", found)
    problems.extend(rel, found)
    return policy


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


def _cluster_file(
    path: Path, rel: str, problems: _Problems, parsed: ParsedFiles | None, shards: int
) -> list[Cluster]:
    """The clusters of one file, from the parsed-file cache when its bytes were seen before."""
    if parsed is None:
        return _load_cluster_file(path, rel, problems)
    from hub.fleet.cache import content_key

    try:
        data = path.read_bytes()
    except OSError as exc:
        problems.add(rel, "", "a readable file", _found(str(exc.strerror or exc)))
        return []
    key = content_key(data)
    cached = parsed.clusters(key)
    if cached is not None:
        # Clusters with the same labels share one mapping (the cache stores each label set
        # once): memory at a million clusters, and one sort per label set when planning.
        names, labels = cached
        hints = parsed.shards(key, shards)
        if hints is None or len(hints) != len(names):
            hints = [shard_of_name(name, shards) for name in names]
            parsed.store_shards(key, shards, hints)
        pairs = [(shards, hint) for hint in range(shards)]  # one tuple per shard, shared
        fields = (names, labels, repeat(rel, len(names)), map(pairs.__getitem__, hints))
        rows = zip(*fields, strict=True)
        return list(map(_NEW_CLUSTER, rows))
    start = len(problems.items)
    found = _load_cluster_file(path, rel, problems, data=data)
    if len(problems.items) == start:
        # Each cluster's hashed shard is computed now, with the file, so that no later run
        # computes it (a SHA-256 per cluster).
        hints = [shard_of_name(c.name, shards) for c in found]
        parsed.store(key, ((c.name, dict(c.labels)) for c in found), shards=(shards, hints))
        pairs = [(shards, hint) for hint in range(shards)]
        found = [c._replace(hashed_shard=pairs[hint]) for c, hint in zip(found, hints, strict=True)]
    return found


def _load_cluster_file(
    path: Path, rel: str, problems: _Problems, *, data: bytes | None = None
) -> list[Cluster]:
    raw = _load_yaml(path, rel, problems, data=data)
    if raw is None:
        return []
    if isinstance(raw, dict) and "clusters" in raw and "name" not in raw:
        entries = raw["clusters"]
        if not isinstance(entries, list):
            problems.add(rel, "clusters", "a list of clusters", entries)
            return []
        for key in sorted(set(raw) - {"clusters"}, key=str):
            problems.add(rel, str(key), "only the field clusters", _found("unknown field"))
        prefix = "clusters"
    else:
        entries = [raw]
        prefix = ""
    out: list[Cluster] = []
    for i, entry in enumerate(entries):
        where = f"{prefix}[{i}]." if prefix else ""
        if not isinstance(entry, dict):
            problems.add(rel, where.rstrip(".") or "", "a cluster mapping (name, labels)", entry)
            continue
        for key in sorted(set(entry) - {"name", "labels"}, key=str):
            problems.add(rel, f"{where}{key}", "name or labels", _found("unknown field"))
        name = entry.get("name")
        ok = True
        if not isinstance(name, str) or not _NAME.match(name):
            problems.add(rel, f"{where}name", "a lowercase DNS label (cluster name)", name)
            ok = False
        labels = entry.get("labels", {}) or {}
        if not isinstance(labels, dict):
            problems.add(rel, f"{where}labels", "a mapping of label key to value", labels)
            ok = False
            labels = {}
        for k, v in labels.items():
            if not label_key_ok(k):
                problems.add(rel, f"{where}labels.{k}", "a label key", k)
                ok = False
            elif not label_value_ok(v):
                problems.add(rel, f"{where}labels.{k}", "a label value (string)", v)
                ok = False
        if ok:
            out.append(Cluster(name=str(name), labels=dict(labels), file=rel))
    return out


def _load_bundle_file(
    path: Path, rel: str, clusters: Mapping[str, Cluster], problems: _Problems
) -> Bundle | None:
    raw = _load_yaml(path, rel, problems)
    if raw is None:
        return None
    if not isinstance(raw, dict):
        problems.add(rel, "", "a bundle mapping", raw)
        return None
    start = len(problems.items)
    root = path.parents[len(PurePosixPath(rel).parts) - 1]
    name = raw.get("name")
    if not isinstance(name, str) or not _NAME.match(name):
        problems.add(rel, "name", "a lowercase DNS label (bundle name)", name)
    sources = _load_sources(raw.get("sources"), rel, problems)
    encrypted = _encrypted_values(root, raw, "encryptedValues", rel, problems)
    targets_raw = raw.get("targets")
    targets: list[Target] = []
    if not isinstance(targets_raw, list) or not targets_raw:
        problems.add(
            rel,
            "targets",
            "a non-empty list of targets (clusters and/or clusterSelector)",
            targets_raw,
        )
    else:
        for i, t in enumerate(targets_raw):
            target = _load_target(
                t, f"targets[{i}]", ("clusters", "clusterSelector"), rel, clusters, problems
            )
            if target is not None:
                targets.append(target)
    overrides: list[Override] = []
    overrides_raw = raw.get("overrides", []) or []
    if not isinstance(overrides_raw, list):
        problems.add(rel, "overrides", "a list of overrides", overrides_raw)
        overrides_raw = []
    for i, o in enumerate(overrides_raw):
        ov = _load_override(o, i, rel, clusters, problems, root=root)
        if ov is not None:
            overrides.append(ov)
    spec = {k: v for k, v in raw.items() if k not in _BUNDLE_OWN_KEYS}
    if isinstance(spec.get("formatOptions"), dict):
        check_sets(spec["formatOptions"], "formatOptions", functools.partial(problems.add, rel))
    rollout: Strategy | str | None = None
    if "rollout" in raw:
        found: list[FieldProblem] = []
        rollout = parse_strategy(raw["rollout"], "rollout", found)
        problems.extend(rel, found)
    if len(problems.items) > start:
        return None
    return Bundle(
        name=str(name),
        file=rel,
        sources=tuple(sources),
        spec=spec,
        targets=tuple(targets),
        overrides=tuple(overrides),
        rollout=rollout,
        encrypted_values=encrypted,
    )


def _encrypted_values(
    root: Path, raw: Mapping[str, Any], key: str, rel: str, problems: _Problems
) -> Mapping[str, Any] | None:
    """The SOPS document ``raw[key]`` names (None when absent, or after a problem)."""
    from hub.fleet.secrets import load_encrypted_values

    if key not in raw:
        return None
    return load_encrypted_values(
        root,
        raw[key],
        add=lambda expected, found: problems.add(rel, key, expected, found),
    )


def _load_sources(
    raw: Any, rel: str, problems: _Problems, path: str = "sources"
) -> list[SourceRef]:
    if not isinstance(raw, list) or not raw:
        problems.add(rel, path, "a non-empty list of sources", raw)
        return []
    out: list[SourceRef] = []
    for i, s in enumerate(raw):
        where = f"{path}[{i}]"
        if not isinstance(s, dict):
            problems.add(rel, where, "a source mapping (kind, uri, ...)", s)
            continue
        kind = s.get("kind")
        if kind not in SOURCE_KINDS:
            problems.add(rel, f"{where}.kind", " | ".join(SOURCE_KINDS), kind)
            continue
        ref_fields = _REF_FIELDS[kind]
        allowed = {"kind", "uri", *ref_fields, *_SOURCE_PASSTHROUGH}
        if kind == "helm":
            allowed.add("chart")
        for key in sorted(set(s) - allowed, key=str):
            problems.add(
                rel,
                f"{where}.{key}",
                f"one of {', '.join(sorted(allowed))} for {kind}",
                _found("unknown field"),
            )
        uri = s.get("uri")
        if not isinstance(uri, str) or not uri or any(c.isspace() for c in uri):
            problems.add(rel, f"{where}.uri", "a URI without spaces", uri)
            continue
        if kind in ("http", "helm") and not uri.startswith(("http://", "https://")):
            problems.add(rel, f"{where}.uri", "an http:// or https:// URL", uri)
            continue
        chart = s.get("chart", "")
        if kind == "helm" and (not isinstance(chart, str) or not _CHART.match(chart)):
            problems.add(rel, f"{where}.chart", "the chart's name in the repository", chart or None)
            continue
        if kind == "image" and not _IMAGE_URI.match(uri):
            problems.add(
                rel,
                f"{where}.uri",
                "REGISTRY/REPOSITORY without scheme, tag or digest (they go in tag/digest)",
                uri,
            )
            continue
        given = [f for f in ref_fields if f in s]
        if kind == "http":
            given = given or ["url"]
        if len(given) != 1:
            problems.add(
                rel,
                where,
                f"exactly one of {', '.join(ref_fields)}",
                _found(", ".join(given) if given else "none"),
            )
            continue
        ref_field = given[0]
        ref = uri if ref_field == "url" else s[ref_field]
        if not _ref_ok(ref_field, ref):
            problems.add(rel, f"{where}.{ref_field}", _REF_EXPECTED[ref_field], ref)
            continue
        extra = tuple((k, s[k]) for k in _SOURCE_PASSTHROUGH if k in s)
        out.append(
            SourceRef(
                kind=kind, uri=uri, ref_field=ref_field, ref=str(ref), extra=extra, chart=chart
            )
        )
    return out


_REF_EXPECTED = {
    "digest": "sha256:<64 lowercase hex>",
    "commit": "a full 40-hex commit SHA",
    "sha256": "64 lowercase hex",
    "tag": "a tag name",
    "branch": "a branch name",
    "url": "a URL",
    "version": "a version or a SemVer range such as 1.2.3, ^1.2, ~1.2.3 or >=1.0 <2.0",
}
_TAG = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9._-]{0,127}$")
_GIT_REF = re.compile(r"^(?!/)(?!.*\.\.)(?!.*//)[A-Za-z0-9._/-]+(?<![/.])$")


def _ref_ok(ref_field: str, ref: object) -> bool:
    if not isinstance(ref, str):
        return False
    if ref_field == "digest":
        return is_digest(ref)
    if ref_field == "commit":
        return is_commit(ref)
    if ref_field == "sha256":
        return is_sha256_hex(ref)
    if ref_field in ("tag", "branch"):
        return bool(_GIT_REF.match(ref)) and not ref.endswith(".lock")
    if ref_field == "version":
        return version_range(ref) is not None
    return True


def version_range(text: str) -> str | None:
    """``text`` as a normalised SemVer range (Helm's syntax: ``^1.2``, ``~1.2.3``, ``1.2.x``,
    ``>=1.0 <2.0``, ``>=1.0, <2.0``, ``a || b``), or None if it is not one."""
    if not text or len(text) > 256:
        return None
    # Helm (Masterminds semver) joins comparisons with commas; node-semver with spaces.
    normal = " ".join(text.replace(",", " ").split())
    # Imported here: the hub's extra, which the agent's image (whose CLI loads this module
    # for its subcommands' parsers) does not carry.
    from nodesemver import Range

    try:
        Range(normal, True)
    except (ValueError, TypeError):
        return None
    return normal


def _load_target(
    raw: Any,
    where: str,
    allowed: tuple[str, ...],
    rel: str,
    clusters: Mapping[str, Cluster],
    problems: _Problems,
) -> Target | None:
    if not isinstance(raw, dict):
        problems.add(rel, where, "a mapping with clusters and/or clusterSelector", raw)
        return None
    start = len(problems.items)
    if "clusters" not in raw and "clusterSelector" not in raw:
        problems.add(rel, where, "clusters and/or clusterSelector", _found("neither"))
    for key in sorted(set(raw) - set(allowed), key=str):
        problems.add(rel, f"{where}.{key}", "one of " + ", ".join(allowed), _found("unknown field"))
    names: frozenset[str] | None = None
    if "clusters" in raw:
        lst = raw["clusters"]
        if not isinstance(lst, list) or not lst:
            problems.add(rel, f"{where}.clusters", "a non-empty list of cluster names", lst)
        else:
            for j, n in enumerate(lst):
                if not isinstance(n, str) or n not in clusters:
                    problems.add(rel, f"{where}.clusters[{j}]", "the name of a defined cluster", n)
            names = frozenset(n for n in lst if isinstance(n, str))
    selector = None
    if "clusterSelector" in raw:
        sel_problems: list[FieldProblem] = []
        selector = parse_selector(raw["clusterSelector"], f"{where}.clusterSelector", sel_problems)
        problems.extend(rel, sel_problems)
    if len(problems.items) > start:
        return None
    return Target(names=names, selector=selector)


def _load_override(
    raw: Any,
    index: int,
    rel: str,
    clusters: Mapping[str, Cluster],
    problems: _Problems,
    *,
    root: Path,
) -> Override | None:
    where = f"overrides[{index}]"
    target = _load_target(raw, where, _OVERRIDE_KEYS, rel, clusters, problems)
    if target is None or not isinstance(raw, dict):
        return None
    start = len(problems.items)
    encrypted = _encrypted_values(root, raw, "encryptedValues", f"{rel}: {where}", problems)
    ok = len(problems.items) == start
    values = raw.get("values")
    if values is not None and not isinstance(values, dict):
        problems.add(rel, f"{where}.values", "a mapping (merged into the bundle's values)", values)
        ok = False
    paused = raw.get("paused")
    if paused is not None and not isinstance(paused, bool):
        problems.add(rel, f"{where}.paused", "true or false", paused)
        ok = False
    approval = raw.get("approval")
    if approval is not None and approval not in APPROVALS:
        problems.add(rel, f"{where}.approval", " | ".join(APPROVALS), approval)
        ok = False
    namespace = raw.get("namespace")
    if namespace is not None and (not isinstance(namespace, str) or not _NAME.match(namespace)):
        problems.add(rel, f"{where}.namespace", "a namespace name (DNS label)", namespace)
        ok = False
    path = raw.get("path")
    if path is not None and (not isinstance(path, str) or not path):
        problems.add(rel, f"{where}.path", "a directory of the bundle's tree", path)
        ok = False
    patches = raw.get("patches")
    if patches is not None and not (
        isinstance(patches, list) and all(isinstance(x, dict) for x in patches)
    ):
        problems.add(rel, f"{where}.patches", "a list of patches ({patch, target})", patches)
        ok = False
    start = len(problems.items)
    sets = check_sets(raw, where, functools.partial(problems.add, rel))
    ok = ok and len(problems.items) == start
    sources = None
    if "sources" in raw:
        start = len(problems.items)
        sources = tuple(_load_sources(raw["sources"], rel, problems, f"{where}.sources"))
        ok = ok and len(problems.items) == start
    if not any(k in raw for k in _OVERRIDE_FIELDS):
        problems.add(rel, where, f"at least one of {', '.join(_OVERRIDE_FIELDS)}", _found("none"))
        ok = False
    if not ok:
        return None
    return Override(
        index=index,
        target=target,
        values=values,
        paused=paused,
        approval=approval,
        namespace=namespace,
        sources=sources,
        path=path,
        patches=tuple(patches) if patches is not None else None,
        encrypted_values=encrypted,
        sets=sets,
    )
