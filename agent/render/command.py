"""``fleetlet render BUNDLE_DIR``: print what a cluster would get from a bundle directory.

Without ``--format`` the format is detected (:mod:`agent.render.detect`) in the directory to
render (``--path``, default the bundle's root) and the choice is said on stderr. Every option
maps to the BundleDeployment's ``formatOptions`` (``--path`` to ``path``, ``--namespace`` to
``targetNamespace``, ``--values``/``--set`` to ``values``...), so the command renders exactly
as the agent does; options a format does not take are refused, as the API refuses them. The
format comes from :mod:`agent.render.formats`, so a format added there (or installed as a
plugin) is rendered here without any change.

Without a cluster, whether a kind is namespaced comes from the bundle's own CRDs and the
built-in kinds known to the installed ``kubernetes`` client; objects of other kinds keep the
namespace they were written with.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from agent.api.yamlio import KUBE_DUMPER
from agent.errors import PermanentError, ValidationError
from agent.render.detect import archive_hint, detect_format, kustomize_hint
from agent.render.facts import ClusterFacts
from agent.render.formats import render_bundle
from agent.render.manifests import InvalidManifestError
from agent.render.plain import RenderRequest, render_root
from agent.render.scope import builtin_scope
from agent.render.tools import ToolSettings
from agent.render.values import (
    file_assignments,
    load_values_file,
    merge,
    parse_set,
    parse_set_file,
    parse_set_json,
)
from agent.secrets.tree import open_tree

_Dumper: type[Any] = KUBE_DUMPER

# Which formats take which options (the API's rule: plugins take every option).
_ONLY = {
    "values": ("--values/--set", ("plain", "kustomize", "registry+v1"), "helm"),
    "releaseName": ("--release-name", ("plain", "kustomize", "registry+v1"), "helm"),
    "installNamespace": ("--install-namespace", ("plain", "kustomize", "helm"), "registry+v1"),
    "watchNamespace": ("--watch-namespace", ("plain", "kustomize", "helm"), "registry+v1"),
}


class BundleDirError(PermanentError):
    """The bundle directory does not exist or is not a directory."""

    reason = "InvalidSource"


class RenderUsageError(PermanentError):
    """An option the chosen format does not take, or an option value the API refuses."""


@dataclass(frozen=True, kw_only=True)
class RenderOptions:
    """The command's options (``None``/empty: not given)."""

    format: str | None = None
    path: str | None = None
    namespace: str | None = None
    values_files: Sequence[str] = ()
    set_values: Sequence[str] = ()
    set_string_values: Sequence[str] = ()
    set_json_values: Sequence[str] = ()
    set_file_values: Sequence[str] = ()
    release_name: str | None = None
    install_namespace: str | None = None
    watch_namespace: str | None = None
    kube_version: str | None = None
    output: str = "yaml"


def _format_options(options: RenderOptions) -> dict[str, Any]:
    """The ``formatOptions`` the flags stand for, checked by the API's own validation."""
    values: dict[str, Any] | None = None
    sets = _helm_sets(options)
    if options.values_files or sets:
        values = {}
        for name in options.values_files:
            values = merge(values, load_values_file(Path(name)))
        # helm's order, whatever the order of the flags: --set-json, --set, --set-string,
        # --set-file.
        values = merge(values, parse_set_json(options.set_json_values))
        values = merge(values, parse_set(options.set_values))
        values = merge(values, parse_set(options.set_string_values, strings=True))
        values = merge(values, parse_set_file(options.set_file_values))
    checked = {
        "path": options.path,
        "targetNamespace": options.namespace,
        "installNamespace": options.install_namespace,
        "watchNamespace": options.watch_namespace,
        "values": values,
    }
    checked = {k: v for k, v in checked.items() if v is not None}
    if checked:
        # Imported here, and only these: a render without options never loads the API's types.
        from agent.api.models import FormatOptions
        from agent.api.validation import from_dict

        try:
            from_dict(FormatOptions, checked)
        except ValidationError as exc:
            raise RenderUsageError(f"invalid option: {exc}") from exc
    if options.release_name is not None:
        checked["releaseName"] = options.release_name
    return checked


def _helm_sets(options: RenderOptions) -> tuple[str, ...]:
    """The ``--set*`` flags as given to helm (a file's content as ``--set-literal``: helm
    reads no file of the user's)."""
    flags: list[str] = []
    for flag, given in (
        ("--set-json", options.set_json_values),
        ("--set", options.set_values),
        ("--set-string", options.set_string_values),
    ):
        flags += [f"{flag}={assignment}" for assignment in given]
    for key, text in file_assignments(options.set_file_values):
        flags.append(f"--set-literal={key}={text}")
    return tuple(flags)


def _check_applies(format: str, format_options: dict[str, Any]) -> None:
    for key, (flag, refused, owner) in _ONLY.items():
        if key in format_options and format in refused:
            raise RenderUsageError(
                f"{flag}: the {format} format takes no such option (only {owner} and plugin "
                "formats do)"
            )


def run_render(
    *,
    bundle_dir: str,
    options: RenderOptions,
    note: Callable[[str], None] = lambda _: None,
    tools: ToolSettings | None = None,
) -> str:
    """Render ``bundle_dir`` and return the objects as YAML (a multi-document stream) or JSON
    (a ``v1`` ``List``). ``note`` receives what the user should know (the detected format).

    Raises BundleDirError, RenderUsageError, ValuesError, UnknownFormatError (its
    FormatNotAvailableError for a format this build lacks), InvalidManifestError (and its
    InvalidManifestsError listing every bad file of a plain tree), the formats' own errors.
    """
    tree = Path(bundle_dir)
    if not tree.is_dir():
        what = "a file, not a directory" if tree.exists() else "no such directory"
        raise BundleDirError(f"{bundle_dir}: {what} (give the bundle's directory)")
    format_options = _format_options(options)
    request = RenderRequest(
        source=bundle_dir,
        namespace=options.namespace,
        scope=builtin_scope,
        options=format_options,
        cluster=ClusterFacts(kube_version=options.kube_version),
        tools=tools or ToolSettings(),
        helm_set=_helm_sets(options),
    )
    root = render_root(tree, request)
    detected = detect_format(root)
    shown = Path(bundle_dir, options.path or "").as_posix()
    if options.format is None:
        format = detected.format
        note(f"{shown}: rendering as {detected.describe()}")
    else:
        format = options.format
        if detected.format != format and detected.format != "plain":
            note(
                f"{shown}: looks like a {detected.format} bundle ({detected.evidence}); "
                f"rendering it as {format}, as asked"
            )
    _check_applies(format, format_options)
    sealed = open_tree(tree, None, source=bundle_dir)
    if sealed.files:
        files = ", ".join(f"{name} ({count})" for name, count in sealed.files.items())
        note(
            f"{shown}: {sealed.values} values in {len(sealed.files)} SOPS files stay encrypted "
            f"here ({files}): a cluster's agent decrypts them with its own age key"
        )
    guessed = options.format is None and format == "plain"
    try:
        objects = render_bundle(tree, format=format, request=request)
    except InvalidManifestError as exc:
        hint = kustomize_hint(root) if guessed else None
        if hint:
            raise RenderUsageError(hint) from exc
        raise
    hint = archive_hint(root) if guessed and not objects else None
    if hint:
        raise RenderUsageError(hint)
    if options.output == "json":
        listed = {"apiVersion": "v1", "kind": "List", "items": objects}
        return json.dumps(listed, indent=2) + "\n"
    if not objects:
        return ""
    return yaml.dump_all(
        objects, Dumper=_Dumper, sort_keys=False, default_flow_style=False, explicit_start=True
    )
