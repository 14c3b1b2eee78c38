"""``fleetlet render``'s head start: helm or kustomize started before the rest of fleetlet loads.

A render of a small chart from the command line spends about as long loading PyYAML and the
render code as helm spends rendering, and the machine has other cores. For the common cases
(a chart or a kustomization in the directory rendered, no values, no ``--set``) the renderer's
process is known from the arguments and the names of a few files, without reading any YAML:
:func:`head_start` starts it at once with :func:`agent.render._process.start_early`, confined
and bounded exactly as the render would start it, and the render then runs as always (its
checks, detection, the same ``run_tool`` call). That call takes the process over only when it
asks for that very process (argv, directory, environment, confinement, memory bound); for
anything else it starts its own and the head start is killed unread, so the output is the
render's own either way. A guess costs no more than a wasted renderer run; what the render's
checks refuse (a path outside the tree, a remote reference) helm or kustomize has then begun to
read under the same confinement (the tree only, no network), and its output is never used.

The agent never uses a head start: it renders content it has fetched, with the cache in front.
"""

from __future__ import annotations

import os
import re
from pathlib import Path

from agent.render import confine
from agent.render._process import HeadStart, start_early
from agent.render.tools import HELM_MAX_MEMORY, KUSTOMIZE_MAX_MEMORY, ToolSettings

# The files that mark a format (agent.render.detect reads them; that module loads PyYAML).
_CHART = "Chart.yaml"
_KUSTOMIZATIONS = ("kustomization.yaml", "kustomization.yml", "Kustomization")
# The chart's name, as the release name helm is given when none is: a plain line of Chart.yaml.
_CHART_NAME = re.compile(rb"^name:[ \t]*([\"']?)([a-z0-9][-a-z0-9.]*)\1[ \t]*$", re.MULTILINE)
_MAX_CHART_FILE = 1024 * 1024

_scratch: list[object] = []  # the head starts' scratch directories, removed at exit


def head_start(
    *,
    bundle_dir: str,
    format: str | None,
    path: str | None,
    namespace: str | None,
    release_name: str | None,
    kube_version: str | None,
    tools: ToolSettings,
) -> HeadStart | None:
    """Start the renderer ``fleetlet render BUNDLE_DIR`` with these options will most likely
    run; None when there is no such guess. Call it only for a render without values, ``--set``
    flags or OLM options. Never raises (a head start is only ever a head start)."""
    try:
        tree = Path(bundle_dir)
        root = tree / path if path else tree
        real_tree = os.path.realpath(tree)
        real = os.path.realpath(root)
        if real != real_tree and not real.startswith(real_tree + os.sep):
            return None
        if (root / _CHART).is_file():
            if format not in (None, "helm"):
                return None
            return _helm(tree, root, namespace, release_name, kube_version, tools)
        if format in (None, "kustomize") and any((root / n).is_file() for n in _KUSTOMIZATIONS):
            return _kustomize(tree, root, tools)
    except Exception:  # the render itself reports whatever is wrong
        return None
    return None


def _helm(
    tree: Path,
    chart: Path,
    namespace: str | None,
    release_name: str | None,
    kube_version: str | None,
    tools: ToolSettings,
) -> HeadStart | None:
    with (chart / _CHART).open("rb") as f:
        text = f.read(_MAX_CHART_FILE)
    if b"file://" in text:
        return None  # local dependencies: helm then renders a scratch copy of the chart
    if not release_name:
        found = _CHART_NAME.search(text)
        if found is None:
            return None
        release_name = found.group(2).decode()
    helm = tools.find("helm")
    argv = [str(helm), "template", release_name, str(chart.resolve()),
            "--namespace", namespace or "default", "--include-crds"]  # fmt: skip
    if kube_version:
        argv += ["--kube-version", kube_version]
    return start_early(
        argv,
        cwd=chart,
        max_memory=HELM_MAX_MEMORY,
        env=confine.HELM_ENVIRONMENT,
        confine=confine.for_tool(helm, tree=tree),
    )


def _kustomize(tree: Path, root: Path, tools: ToolSettings) -> HeadStart | None:
    import tempfile

    kustomize = tools.find("kustomize")
    scratch = tempfile.TemporaryDirectory(prefix="fleetlet-kustomize-")
    _scratch.append(scratch)
    work = Path(scratch.name)
    return start_early(
        [kustomize, "build", os.path.relpath(root, tree)],
        cwd=tree,
        max_memory=KUSTOMIZE_MAX_MEMORY,
        env=confine.environment(scratch=work),
        confine=confine.for_tool(kustomize, tree=tree, scratch=work),
        scratch=work,
    )


__all__ = ["head_start"]
