"""``fleetlet render``'s head start: helm or kustomize started before the rest of fleetlet loads.

A render of a small chart from the command line spends about as long loading PyYAML, argparse
and the render code as helm spends rendering, and the machine has other cores. For the common
cases (a chart or a kustomization in the directory rendered, no values, no ``--set``) the
renderer's process is known from the command line and the names of a few files, without
reading any YAML: :func:`start_for_command_line` (the first thing ``fleetlet render`` does,
before it even builds its argument parser) starts it at once with
:func:`agent.render._launch.start_early`, confined and bounded exactly as the render would start
it, and the render then runs as always (its argument parsing, checks, detection, the same
``run_tool`` call). That call takes the process over only when it asks for that very process
(argv, directory, environment, confinement, memory bound); for anything else it starts its own
and the head start is killed unread, so the output is the render's own either way. A guess
costs no more than a wasted renderer run; what the render's checks refuse (a path outside the
tree, a remote reference) helm or kustomize has then begun to read under the same confinement
(the tree only, no network), and its output is never used. Where the kernel cannot confine a
renderer (no Landlock) there is no head start: the render starts its renderer itself, and says
so.

This module and what it imports (``_launch``, ``_sandbox``, ``_toolenv``, ``_pins``) are kept
lean: no dataclasses, pathlib, typing or YAML, which the rest of the render loads while helm
runs. The agent never uses a head start: it renders content it has fetched, with the cache in
front.
"""

from __future__ import annotations

import os

from agent.render import _pins, _sandbox, _toolenv
from agent.render._launch import HeadStart, start_early

TYPE_CHECKING = False  # typing itself is not imported: it costs ~2 ms at start
if TYPE_CHECKING:
    from collections.abc import Mapping, Sequence

# The files that mark a format (agent.render.detect reads them; that module loads PyYAML).
_CHART = "Chart.yaml"
_KUSTOMIZATIONS = ("kustomization.yaml", "kustomization.yml", "Kustomization")
_MAX_CHART_FILE = 1024 * 1024
# `fleetlet render`'s options that take a value and that a head start follows, by the keyword
# of head_start they set (None: no bearing on the renderer's process).
_OPTIONS = {
    "--format": "format",
    "--path": "path",
    "--namespace": "namespace",
    "--release-name": "release_name",
    "--kube-version": "kube_version",
    "--output": None,
    "-o": None,
}

_scratch: list[object] = []  # the head starts' scratch directories, removed at exit


def start_for_command_line(args: Sequence[str], environ: Mapping[str, str]) -> HeadStart | None:
    """Start the renderer of ``fleetlet render ARGS`` (the words after ``render``), when the
    command line has the common shape: one bundle directory and only the options in
    ``_OPTIONS``, each spelled out (anything else, ``--values``, ``--set``, ``--help``, an
    abbreviation, is left to the render alone). ``environ`` holds ``FLEETLET_HELM``,
    ``FLEETLET_KUSTOMIZE`` and ``FLEETLET_CACHE``. None when there is no head start; never
    raises (the render's own parsing reports what is wrong)."""
    chosen: dict[str, str] = {}
    positional: list[str] = []
    words = iter(args)
    for word in words:
        if not word.startswith("-") or word == "-":
            positional.append(word)
            continue
        option, equals, value = word.partition("=")
        if option not in _OPTIONS:
            return None
        if not equals:
            value = next(words, None)  # type: ignore[assignment]
            if value is None:
                return None
        keyword = _OPTIONS[option]
        if keyword is not None:
            chosen[keyword] = value
    if len(positional) != 1:
        return None
    return head_start(
        bundle_dir=positional[0], format=chosen.get("format"), path=chosen.get("path"),
        namespace=chosen.get("namespace"), release_name=chosen.get("release_name"),
        kube_version=chosen.get("kube_version"), environ=environ,
    )  # fmt: skip


def head_start(
    *,
    bundle_dir: str,
    format: str | None,
    path: str | None,
    namespace: str | None,
    release_name: str | None,
    kube_version: str | None,
    environ: Mapping[str, str],
) -> HeadStart | None:
    """Start the renderer ``fleetlet render BUNDLE_DIR`` with these options will most likely
    run; None when there is no such guess. Call it only for a render without values, ``--set``
    flags or OLM options. Never raises (a head start is only ever a head start)."""
    try:
        if _sandbox.probe()[0] == 0:
            return None  # unconfined here: the render starts its renderer, and warns
        tree = _as_path(bundle_dir)
        root = _as_path(os.path.join(tree, path)) if path else tree
        real_tree = os.path.realpath(tree)
        real = os.path.realpath(root)
        if real != real_tree and not real.startswith(real_tree + os.sep):
            return None
        if os.path.isfile(os.path.join(root, _CHART)):
            if format not in (None, "helm"):
                return None
            return _helm(tree, root, namespace, release_name, kube_version, environ)
        kustomization = any(os.path.isfile(os.path.join(root, n)) for n in _KUSTOMIZATIONS)
        if format in (None, "kustomize") and kustomization:
            return _kustomize(tree, root, environ)
    except Exception:  # the render itself reports whatever is wrong
        return None
    return None


def _as_path(text: str) -> str:
    """``text`` as ``pathlib.Path`` spells it (the render's own paths are Paths): no trailing
    or doubled separator, no ``.`` component."""
    parts = [p for p in text.split(os.sep) if p not in ("", ".")]
    spelled = os.sep.join(parts)
    if text.startswith(os.sep):
        return os.sep + spelled
    return spelled or "."


def _tool(name: str, environ: Mapping[str, str]) -> str | None:
    found = _pins.locate(
        name,
        override=environ.get(_pins.OVERRIDE_VARIABLES[name]) or None,
        cache_root=environ.get("FLEETLET_CACHE") or None,
    )
    return _as_path(found) if found is not None else None


def _chart_name(text: bytes) -> str | None:
    """The chart's name, as the release name helm is given when none is: a plain
    ``name: ...`` line of Chart.yaml (quoted or not), else None."""
    for line in text.splitlines():
        if not line.startswith(b"name:"):
            continue
        value = line[len(b"name:") :].strip(b" \t")
        if value[:1] in (b'"', b"'"):
            if len(value) < 2 or value[-1:] != value[:1]:
                return None
            value = value[1:-1]
        name = value.decode("ascii", "replace")
        allowed = set("abcdefghijklmnopqrstuvwxyz0123456789-.")
        if not name or not name[0].isalnum() or not set(name) <= allowed:
            return None
        return name
    return None


def _helm(tree: str, chart: str, namespace: str | None, release_name: str | None,
          kube_version: str | None, environ: Mapping[str, str]) -> HeadStart | None:  # fmt: skip
    with open(os.path.join(chart, _CHART), "rb") as f:
        text = f.read(_MAX_CHART_FILE)
    if b"file://" in text:
        return None  # local dependencies: helm then renders a scratch copy of the chart
    if not release_name:
        release_name = _chart_name(text)
        if release_name is None:
            return None
    helm = _tool("helm", environ)
    if helm is None:
        return None
    argv = [helm, "template", release_name, os.path.realpath(chart),
            "--namespace", namespace or "default", "--include-crds"]  # fmt: skip
    if kube_version:
        argv += ["--kube-version", kube_version]
    return start_early(
        argv,
        cwd=chart,
        max_memory=_pins.HELM_MAX_MEMORY,
        env=_toolenv.HELM_ENVIRONMENT,
        confine=_sandbox.for_tool(helm, tree=tree),
    )


def _kustomize(tree: str, root: str, environ: Mapping[str, str]) -> HeadStart | None:
    import tempfile

    kustomize = _tool("kustomize", environ)
    if kustomize is None:
        return None
    scratch = tempfile.TemporaryDirectory(prefix="fleetlet-kustomize-")
    _scratch.append(scratch)
    work = scratch.name
    return start_early(
        [kustomize, "build", os.path.relpath(root, tree)],
        cwd=tree,
        max_memory=_pins.KUSTOMIZE_MAX_MEMORY,
        env=_toolenv.environment(scratch=work),
        confine=_sandbox.for_tool(kustomize, tree=tree, scratch=work),
        scratch=work,
    )


__all__ = ["head_start", "start_for_command_line"]
