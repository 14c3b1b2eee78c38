"""Hostile bundle trees aimed at the renderers (issue 28): each is built in code under a
directory the test gives, and says what it tries.

- :func:`shadowing_tree`: modules that would stand in for fleetlet's ``agent`` package, a
  standard library module and the plugin's own module if the plugin worker imported from the
  tree (each leaves a ``HIJACKED`` file in the tree and fails the render when imported);
- :func:`overlay_escape_tree`: a chart with a ``file://`` dependency whose relative link lies
  inside the tree where it is, but climbs out of the scratch copy helm renders from;
- :func:`escaping_link_chart`: a chart whose ``.Files.Get`` reads a link to a file outside
  its tree.
"""

from __future__ import annotations

import textwrap
from pathlib import Path

_HIJACK = """
import pathlib
pathlib.Path(__file__).with_name("HIJACKED").write_text("{name}")
raise SystemExit("hijacked by the bundle tree: {name}")
"""


def _write(root: Path, files: dict[str, str]) -> Path:
    for name, text in files.items():
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_text(textwrap.dedent(text).lstrip())
    return root


def shadowing_tree(root: Path, *, plugin_module: str) -> Path:
    """A tree with ``agent/__init__.py``, ``agent/render/__init__.py``, ``json.py``,
    ``encodings/__init__.py`` and ``<plugin_module>.py`` that each mark and abort."""
    names = ["agent/__init__.py", "agent/render/__init__.py", "json.py", "site.py",
             "encodings/__init__.py", f"{plugin_module}.py"]  # fmt: skip
    return _write(root, {n: _HIJACK.format(name=n) for n in names})


def overlay_escape_tree(root: Path, *, escape_name: str) -> Path:
    """``app`` depends on ``common`` (``file://../lib/x/y/common``); common's
    ``files/leak`` is ``../../../../../<escape_name>``: the tree's own ``<escape_name>``
    where it lies, but four levels up from ``overlay/charts/common/files`` in the scratch
    copy is the scratch directory's parent."""
    _write(
        root,
        {
            "app/Chart.yaml": """
                apiVersion: v2
                name: app
                version: 1.0.0
                dependencies:
                  - {name: common, version: 1.0.0, repository: "file://../lib/x/y/common"}
            """,
            "app/templates/cm.yaml": """
                apiVersion: v1
                kind: ConfigMap
                metadata: {name: app}
                data: {}
            """,
            "lib/x/y/common/Chart.yaml": "apiVersion: v2\nname: common\nversion: 1.0.0\n",
            "lib/x/y/common/templates/leak.yaml": """
                apiVersion: v1
                kind: ConfigMap
                metadata: {name: leak}
                data:
                  leak: {{ .Files.Get "files/leak" | quote }}
            """,
            escape_name: "the tree's own file\n",
        },
    )
    files = root / "lib/x/y/common/files"
    files.mkdir(parents=True)
    (files / "leak").symlink_to(f"../../../../../{escape_name}")
    return root


def escaping_link_chart(root: Path, *, outside: Path) -> Path:
    """A chart whose ``files/leak`` links to ``outside`` and whose template reads it."""
    _write(
        root,
        {
            "Chart.yaml": "apiVersion: v2\nname: leaky\nversion: 1.0.0\n",
            "values.yaml": "{}\n",
            "templates/leak.yaml": """
                apiVersion: v1
                kind: ConfigMap
                metadata: {name: leak}
                data:
                  leak: {{ .Files.Get "files/leak" | quote }}
            """,
        },
    )
    (root / "files").mkdir()
    (root / "files/leak").symlink_to(outside)
    return root
