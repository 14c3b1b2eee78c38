"""Safe manifest parsing: the hostile manifest corpus is refused with its rule; valid YAML and
JSON come out as plain, unshared JSON values."""

from __future__ import annotations

from pathlib import Path

import pytest

from agent.errors import PermanentError
from agent.render.manifests import InvalidManifestError, parse_manifests
from agent.render.plain import RenderLimits, RenderRequest, load_tree
from tests.hostile.manifests import CASES, ManifestCase, billion_laughs


@pytest.mark.parametrize("case", CASES, ids=[c.name for c in CASES])
def test_hostile_manifest_is_refused_with_its_rule(case: ManifestCase) -> None:
    with pytest.raises(InvalidManifestError) as refused:
        parse_manifests(case.data, source="bundle web", file=case.file, limits=case.limits)

    error = refused.value
    assert isinstance(error, PermanentError)
    assert error.rule == case.rule
    assert error.reason == "InvalidManifest"
    assert error.source == "bundle web"
    assert error.file.startswith(case.file)
    assert str(error).startswith(f"bundle web: {case.file}")
    assert len(str(error)) < 400  # one readable line, not the document


@pytest.mark.parametrize("case", CASES, ids=[c.name for c in CASES])
def test_hostile_manifest_in_a_bundle_tree_names_its_file(
    case: ManifestCase, tmp_path: Path
) -> None:
    (tmp_path / "ok").mkdir()
    (tmp_path / "ok" / "01_fine.yaml").write_bytes(
        b"apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: fine\n"
    )
    (tmp_path / "nested").mkdir()
    (tmp_path / "nested" / case.file).write_bytes(case.data)
    request = RenderRequest(source="bundle web", limits=RenderLimits(parse=case.limits))

    with pytest.raises(InvalidManifestError) as refused:
        load_tree(tmp_path, request)

    assert refused.value.rule == case.rule
    assert refused.value.file.startswith(f"nested/{case.file}")


def test_alias_bomb_is_refused_without_being_expanded() -> None:
    # Counting only: a constructed-and-walked bomb would be 10^9 nodes. The scan stops at the
    # node limit, so the exception carries the rule, not a MemoryError.
    with pytest.raises(InvalidManifestError) as refused:
        parse_manifests(billion_laughs(), source="s", file="bomb.yaml")
    assert refused.value.rule == "AliasBomb"
    assert "alias expansion" in str(refused.value)


def test_modest_aliases_are_expanded_into_independent_values() -> None:
    text = b"""
apiVersion: v1
kind: ConfigMap
metadata:
  name: a
  labels: &labels {app: web}
  annotations: *labels
data:
  when: 2024-01-02
  ratio: "1.5"
"""
    (obj,) = parse_manifests(text, source="s", file="a.yaml")
    obj["metadata"]["labels"]["extra"] = "x"
    assert obj["metadata"]["annotations"] == {"app": "web"}
    assert obj["data"] == {"when": "2024-01-02", "ratio": "1.5"}


def test_multi_document_yaml_json_lists_and_empty_documents() -> None:
    yaml_text = b"""---
apiVersion: v1
kind: Namespace
metadata: {name: ns}
---
# only a comment
---
apiVersion: v1
kind: List
items:
- {apiVersion: v1, kind: ConfigMap, metadata: {name: c1}}
- {apiVersion: v1, kind: ConfigMap, metadata: {name: c2}}
"""
    names = [o["metadata"]["name"] for o in parse_manifests(yaml_text, source="s", file="x.yaml")]
    assert names == ["ns", "c1", "c2"]
    (obj,) = parse_manifests(
        b'{"apiVersion": "v1", "kind": "Secret", "metadata": {"name": "s"}}',
        source="s",
        file="s.json",
    )
    assert obj["kind"] == "Secret"


def test_list_item_without_kind_is_refused_by_its_position() -> None:
    text = b"apiVersion: v1\nkind: List\nitems:\n- {apiVersion: v1, metadata: {name: x}}\n"
    with pytest.raises(InvalidManifestError) as refused:
        parse_manifests(text, source="s", file="l.yaml")
    assert refused.value.rule == "MissingKind"
    assert refused.value.file == "l.yaml (document 1, item 1)"


def test_a_key_a_merge_brings_in_may_be_overridden() -> None:
    # YAML's merge keys are meant to be overridden: that is not a duplicate.
    data = (
        b"defaults: &d {replicas: 1, image: web}\n"
        b"apiVersion: v1\nkind: ConfigMap\nmetadata: {name: merged}\n"
        b"data:\n  <<: *d\n  replicas: 3\n"
    )
    [obj] = parse_manifests(data, source="bundle web", file="merge.yaml")
    assert obj["data"] == {"replicas": 3, "image": "web"}
