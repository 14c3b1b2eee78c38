"""``formatOptions.setString``, ``setJson`` and ``setFile``: helm's ``--set-string``,
``--set-json`` and ``--set-file`` as API fields (their patterns and rules; the fields are
declared on :class:`agent.api.models.FormatOptions`).

Each item is one flag's argument, written as on helm's command line and given to helm as it
is (:mod:`agent.render.helm`), so helm types and merges it itself, in helm's order whatever
the order of the fields: values files, ``values``, then ``setJson``, ``setString``,
``setFile``. The API checks the shape (``key=...``; for ``setFile`` a path inside the bundle
tree); the hub parses each item fully when it loads the fleet repo (:mod:`hub.fleet.helmsets`).
"""

from __future__ import annotations

from agent.api.validation import Rule

# A key (any character but '=', '\' escaping the next one), '=', then anything.
SET_ASSIGNMENT = r"^([^=\\]|\\[\s\S])+=[\s\S]*$"
SET_ASSIGNMENT_TEXT = "key=value, as helm's --set-string/--set-json take it"
# One key (no unescaped ','), '=', a relative path of the bundle tree.
SET_FILE = r"^([^=,\\]|\\[\s\S])+=[A-Za-z0-9._-]+(/[A-Za-z0-9._-]+)*$"
SET_FILE_TEXT = (
    "key=path, one key and a relative path of the bundle tree (segments of letters, digits, "
    "'.', '_', '-' joined by '/')"
)
MAX_SET_ITEMS = 64
MAX_SET_CHARS = 16384


def _file_escapes(value: str) -> bool:
    return "=../" in value or value.endswith("=..") or "/../" in value or value.endswith("/..")


SET_FILE_INSIDE = Rule(
    cel="!(self.contains('=../') || self.endsWith('=..') || self.contains('/../') "
    "|| self.endsWith('/..'))",
    expected="a path without '..' segments (the file must be inside the bundle tree)",
    check=lambda value: not _file_escapes(value),
)

HELM_SET_FIELDS = (("setString", "set_string"), ("setJson", "set_json"), ("setFile", "set_file"))
_NOT_HELM = ("plain", "kustomize", "registry+v1")


def _only_helm(field: str, attr: str) -> Rule:
    names = ", ".join(f"'{f}'" for f in _NOT_HELM)
    return Rule(
        cel=f"!has(self.formatOptions) || !has(self.formatOptions.{field}) "
        f"|| size(self.formatOptions.{field}) == 0 || !(self.format in [{names}])",
        expected=f"formatOptions.{field} only with helm or a plugin format",
        check=lambda s: not getattr(s.format_options, attr) or s.format not in _NOT_HELM,
        field=f"formatOptions.{field}",
    )


HELM_SET_RULES = tuple(_only_helm(field, attr) for field, attr in HELM_SET_FIELDS)
"""Rules of a BundleDeploymentSpec: the fields only where helm renders."""
