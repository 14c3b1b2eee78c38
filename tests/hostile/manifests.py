"""Hostile manifest files, each with the rule that must refuse it."""

from __future__ import annotations

from dataclasses import dataclass, field

from agent.render.manifests import ParseLimits


@dataclass(frozen=True)
class ManifestCase:
    name: str
    file: str
    data: bytes
    rule: str
    limits: ParseLimits = field(default_factory=ParseLimits)


def billion_laughs() -> bytes:
    """The classic: nine levels of nine aliases, 10^9 nodes once expanded, 1 KB of text."""
    lines = ['a: &a ["lol","lol","lol","lol","lol","lol","lol","lol","lol"]']
    previous = "a"
    for name in "bcdefghi":
        lines.append(f"{name}: &{name} [" + ",".join([f"*{previous}"] * 9) + "]")
        previous = name
    body = "\n".join("  " + line for line in lines)
    return f"apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: lol\ndata:\n{body}\n".encode()


def many_aliases() -> bytes:
    items = "\n".join(f"  k{i}: *x" for i in range(1_200))
    return (
        b"apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: many\n"
        + b"anchor: &x small\ndata:\n"
        + items.encode()
        + b"\n"
    )


CONFIGMAP = b"apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: ok\n"

CASES: list[ManifestCase] = [
    ManifestCase("alias-bomb", "bomb.yaml", billion_laughs(), "AliasBomb"),
    ManifestCase("too-many-aliases", "aliases.yaml", many_aliases(), "AliasBomb"),
    ManifestCase(
        "non-utf8",
        "latin1.yaml",
        b"apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: caf\xe9\n",
        "NotUtf8",
    ),
    ManifestCase("binary-junk", "junk.yaml", bytes(range(256)) * 4, "BinaryContent"),
    ManifestCase(
        "control-characters", "bell.yaml", CONFIGMAP + b"# \x07\x1b[31m\n", "BinaryContent"
    ),
    ManifestCase(
        "no-kind", "nokind.yaml", b"apiVersion: v1\nmetadata:\n  name: x\n", "MissingKind"
    ),
    ManifestCase(
        "no-api-version",
        "noapi.yaml",
        b"kind: ConfigMap\nmetadata:\n  name: x\n",
        "MissingApiVersion",
    ),
    ManifestCase(
        "no-name", "noname.yaml", b"apiVersion: v1\nkind: ConfigMap\nmetadata: {}\n", "MissingName"
    ),
    ManifestCase(
        "document-is-list", "list.yaml", b"- apiVersion: v1\n- kind: ConfigMap\n", "DocumentIsList"
    ),
    ManifestCase(
        "document-is-scalar", "scalar.yaml", CONFIGMAP + b"---\njust a string\n", "DocumentIsScalar"
    ),
    ManifestCase("json-array", "array.json", b'[{"apiVersion": "v1"}]', "DocumentIsList"),
    ManifestCase("json-scalar", "number.json", b"42", "DocumentIsScalar"),
    ManifestCase("yaml-syntax", "broken.yaml", b"apiVersion: v1\nkind: [unclosed\n", "YamlSyntax"),
    ManifestCase(
        "python-tag",
        "tag.yaml",
        b"apiVersion: v1\nkind: !!python/object/apply:os.system ['id']\n",
        "YamlSyntax",
    ),
    ManifestCase("json-syntax", "broken.json", b'{"apiVersion": ', "JsonSyntax"),
    ManifestCase("too-deep", "deep.yaml", b"a: " + b"[" * 500 + b"]" * 500 + b"\n", "TooDeep"),
    ManifestCase(
        "too-many-documents", "many.yaml", (CONFIGMAP + b"---\n") * 2_100, "TooManyDocuments"
    ),
    ManifestCase(
        "document-too-large",
        "large.yaml",
        CONFIGMAP + b"data:\n  big: " + b"x" * 3 * 1024 * 1024 + b"\n",
        "DocumentTooLarge",
        ParseLimits(max_file_bytes=16 * 1024 * 1024),
    ),
    ManifestCase(
        "file-too-large", "huge.yaml", CONFIGMAP + b"#" * (9 * 1024 * 1024), "FileTooLarge"
    ),
    ManifestCase(
        "labels-not-strings",
        "labels.yaml",
        CONFIGMAP + b"  labels:\n    nested: {a: b}\n",
        "InvalidMetadata",
    ),
    # Last wins in PyYAML: the object would land in kube-system, not where it seems to go.
    ManifestCase(
        "duplicate-key",
        "twice.yaml",
        CONFIGMAP + b"  namespace: web\n  namespace: kube-system\n",
        "DuplicateKey",
    ),
    ManifestCase(
        "duplicate-key-json",
        "twice.json",
        b'{"apiVersion": "v1", "kind": "ConfigMap", '
        b'"metadata": {"name": "ok", "namespace": "web", "namespace": "kube-system"}}',
        "DuplicateKey",
    ),
]
