"""A bundle's ``sources``: each kind (image, git, http, helm) with the reference fields it takes,
and the SemVer ranges the hub resolves. Called by :mod:`hub.fleet.load._bundles`;
:func:`version_range` also by :mod:`hub.resolve.charts` (through :mod:`hub.fleet.load`).
"""

from __future__ import annotations

import re
from typing import Any

from agent.api.pins import is_commit, is_digest, is_sha256_hex
from hub.fleet.load._problems import _found, _Problems
from hub.fleet.model import SOURCE_KINDS, SourceRef

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
        if kind == "image":
            allowed.add("verify")  # the signature policy's name (hub.fleet.signing)
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
        verify = s.get("verify", "")
        if not isinstance(verify, str):
            problems.add(rel, f"{where}.verify", "the name of a sourceSigning policy", verify)
            continue
        out.append(
            SourceRef(
                kind=kind,
                uri=uri,
                ref_field=ref_field,
                ref=str(ref),
                extra=extra,
                chart=chart,
                verify=verify,
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
