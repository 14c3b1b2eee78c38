"""A bundle's sources: where content is fetched from, pinned to immutable content.

Part of :mod:`agent.api.models`; used by :class:`BundleDeploymentSpec`.
"""

# api_field() returns a dataclasses.field() (with our metadata); ruff cannot tell.
# ruff: noqa: RUF009

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from agent.api.models._patterns import (
    CHART_NAME,
    CHART_NAME_TEXT,
    CHART_VERSION,
    CHART_VERSION_TEXT,
    COMMIT,
    COMMIT_TEXT,
    DIGEST,
    DIGEST_TEXT,
    HTTP_URL,
    HTTP_URL_TEXT,
    NO_WHITESPACE,
    RELATIVE_PATH,
    RELATIVE_PATH_TEXT,
    SHA256_HEX,
    SHA256_HEX_TEXT,
    STAYS_INSIDE,
    SourceKind,
)
from agent.api.models._references import SourceAuth
from agent.api.signatures import SourceSignature
from agent.api.validation import ApiObject, Rule, api_field

# --- sources --------------------------------------------------------------------------------


def _only(field: str, attr: str, kind: str) -> Rule:
    return Rule(
        cel=f"!has(self.{field}) || self.kind == '{kind}'",
        expected=f"{field} only on {kind} sources",
        check=lambda s: getattr(s, attr) is None or s.kind == kind,
        field=field,
    )


def _only_kinds(field: str, attr: str, kinds: tuple[str, ...]) -> Rule:
    listed = ", ".join(f"'{k}'" for k in kinds)
    return Rule(
        cel=f"!has(self.{field}) || self.kind in [{listed}]",
        expected=f"{field} only on {' or '.join(kinds)} sources",
        check=lambda s: getattr(s, attr) is None or s.kind in kinds,
        field=field,
    )


def _pinned(field: str, attr: str, kind: str, text: str) -> Rule:
    return Rule(
        cel=f"self.kind != '{kind}' || has(self.{field})",
        expected=f"{text} ({kind} sources are pinned by {field})",
        check=lambda s: s.kind != kind or getattr(s, attr) is not None,
        field=field,
        pin=True,
    )


@dataclass(frozen=True, kw_only=True, slots=True)
class Source(ApiObject):
    """One place content is fetched from, pinned to immutable content.

    Exactly one pin, matching ``kind``: ``digest`` for ``image``, ``commit`` for ``git``,
    ``sha256`` for ``http`` and ``helm``. Floating references (tags, branches, URLs without a
    hash, version ranges) are never accepted. Several sources compose one tree through
    ``destination``.

    A ``helm`` source is a chart of a Helm repository: ``uri`` is the repository, ``chart`` and
    ``version`` say which chart, and the hub resolved them (from the repository's
    ``index.yaml``) to ``archiveUrl`` and its ``sha256``. The agent downloads ``archiveUrl``
    and checks the sha256; it never reads the index.
    """

    RULES: ClassVar[tuple[Rule, ...]] = (
        _pinned("digest", "digest", "image", DIGEST_TEXT),
        _pinned("commit", "commit", "git", COMMIT_TEXT),
        _pinned("sha256", "sha256", "http", SHA256_HEX_TEXT),
        _pinned("sha256", "sha256", "helm", SHA256_HEX_TEXT),
        _pinned("version", "version", "helm", CHART_VERSION_TEXT),
        _pinned("archiveUrl", "archive_url", "helm", HTTP_URL_TEXT),
        _only("digest", "digest", "image"),
        _only("signature", "signature", "image"),
        _only("commit", "commit", "git"),
        _only_kinds("sha256", "sha256", ("http", "helm")),
        _only("directory", "directory", "git"),
        _only("chart", "chart", "helm"),
        _only("version", "version", "helm"),
        _only("archiveUrl", "archive_url", "helm"),
        Rule(
            cel="self.kind != 'helm' || has(self.chart)",
            expected="chart (the chart's name in the repository) on a helm source",
            check=lambda s: s.kind != "helm" or s.chart is not None,
            field="chart",
        ),
        Rule(
            cel="!(self.kind in ['http', 'helm']) || self.uri.startsWith('https://') "
            "|| self.uri.startsWith('http://')",
            expected="an http(s):// URL for an http or helm source",
            check=lambda s: (
                s.kind not in ("http", "helm") or s.uri.startswith(("https://", "http://"))
            ),
            field="uri",
        ),
        Rule(
            cel="self.kind != 'image' || !(self.uri.contains('@') || self.uri.contains('://'))",
            expected="an image repository without scheme or @digest "
            "(registry/repository[:tag]; the pin goes in digest)",
            check=lambda s: s.kind != "image" or not ("@" in s.uri or "://" in s.uri),
            field="uri",
        ),
    )

    kind: SourceKind = api_field(
        "What the source is: an OCI artifact or image (`image`, also a Helm chart pushed to "
        "a registry), a git repository (`git`), an archive over HTTP(S) (`http`, tar or "
        "tar.gz) or a chart of a Helm repository (`helm`)."
    )
    uri: str = api_field(
        "Where the content lives. `image`: `registry/repository[:tag]` (a tag is informational "
        "only; content is fetched by `digest`); `git`: the repository URL; `http`: the "
        "archive's URL; `helm`: the Helm repository's URL (where its `index.yaml` is).",
        pattern=NO_WHITESPACE,
        expected="a URI without whitespace",
        max_length=2048,
    )
    digest: str | None = api_field(
        "`image` pin: the OCI manifest or index digest.",
        default=None,
        pattern=DIGEST,
        expected=DIGEST_TEXT,
        pin=True,
        max_length=71,
    )
    commit: str | None = api_field(
        "`git` pin: the full commit id.",
        default=None,
        pattern=COMMIT,
        expected=COMMIT_TEXT,
        pin=True,
        max_length=40,
    )
    sha256: str | None = api_field(
        "`http` and `helm` pin: the sha256 of the archive, in hex.",
        default=None,
        pattern=SHA256_HEX,
        expected=SHA256_HEX_TEXT,
        pin=True,
        max_length=64,
    )
    chart: str | None = api_field(
        "`helm` only: the chart's name in the repository.",
        default=None,
        pattern=CHART_NAME,
        expected=CHART_NAME_TEXT,
        max_length=250,
    )
    version: str | None = api_field(
        "`helm` only: the chart's exact version (the hub resolves a range to one).",
        default=None,
        pattern=CHART_VERSION,
        expected=CHART_VERSION_TEXT,
        pin=True,
        max_length=128,
    )
    archive_url: str | None = api_field(
        "`helm` pin: the URL of the chart archive (`.tgz`) that the hub resolved from the "
        "repository's index; the agent downloads it and checks `sha256`.",
        default=None,
        pattern=HTTP_URL,
        expected=HTTP_URL_TEXT,
        pin=True,
        max_length=2048,
    )
    directory: str | None = api_field(
        "`git` only: the directory of the repository to take (default: the whole tree).",
        default=None,
        pattern=RELATIVE_PATH,
        expected=RELATIVE_PATH_TEXT,
        max_length=512,
        rules=(STAYS_INSIDE,),
    )
    destination: str | None = api_field(
        "Where this source's content goes inside the bundle's tree (default: its root). "
        "Relative, without `..`.",
        default=None,
        pattern=RELATIVE_PATH,
        expected=RELATIVE_PATH_TEXT,
        max_length=512,
        rules=(STAYS_INSIDE,),
    )
    auth: SourceAuth | None = api_field(
        "Credentials, as a reference to a Secret in the agent's namespace.", default=None
    )
    signature: SourceSignature | None = api_field(
        "`image` only: the source's signature as the hub verified it before publishing "
        "(absent: no signature policy covers it).",
        default=None,
    )

    @property
    def pin(self) -> str:
        """The pin of this source, whatever its kind."""
        return self.digest or self.commit or self.sha256 or ""
