"""``fleetlet render BUNDLE_DIR --format F [--namespace NS]``: print a bundle's rendered objects.

Without a cluster, whether a kind is namespaced comes from the bundle's own CRDs and the
built-in kinds known to the installed ``kubernetes`` client; objects of other kinds keep the
namespace they were written with.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml

from agent.errors import PermanentError
from agent.render.formats import render_bundle
from agent.render.plain import RenderRequest
from agent.render.scope import builtin_scope
from agent.render.tools import ToolSettings

try:
    _Dumper: type[Any] = yaml.CSafeDumper
except AttributeError:  # PyYAML built without libyaml
    _Dumper = yaml.SafeDumper


class BundleDirError(PermanentError):
    """The bundle directory does not exist or is not a directory."""

    reason = "InvalidSource"


def run_render(
    *, bundle_dir: str, format: str, namespace: str | None, tools: ToolSettings | None = None
) -> str:
    """Render ``bundle_dir`` and return the objects as a multi-document YAML stream.

    Raises BundleDirError, UnknownFormatError, InvalidManifestError (all PermanentError).
    """
    tree = Path(bundle_dir)
    if not tree.is_dir():
        raise BundleDirError(f"{bundle_dir}: not a directory")
    request = RenderRequest(
        source=bundle_dir, namespace=namespace, scope=builtin_scope, tools=tools or ToolSettings()
    )
    objects = render_bundle(tree, format=format, request=request)
    return yaml.dump_all(
        objects, Dumper=_Dumper, sort_keys=False, default_flow_style=False, explicit_start=True
    )
