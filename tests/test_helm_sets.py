"""helm's --set-string, --set-json and --set-file as fleet-repo fields (issue #29, item 6):
from the bundle file and its overrides, through the hub's set, rendered by the agent exactly as
the real ``helm template`` renders the same flags."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path
from typing import Any

import pytest

from agent.api import to_dict
from agent.api.yamlio import load_kube_all
from agent.render.formats import render_bundle
from agent.render.helm import HelmChartError
from agent.render.plain import RenderRequest
from agent.render.tools import ToolSettings
from hub.errors import FleetRepoError
from hub.fleet.load import load_fleet
from hub.fleet.render import plan_clusters
from tests.realenv.helm import helm_binary
from tests.test_hub_fleet import CLUSTERS, image_bundle, write_fleet

DUMP = """apiVersion: v1
kind: ConfigMap
metadata:
  name: dump
data:
  values: {{ toJson .Values | quote }}
  types: "{{ range $k, $v := .Values }}{{ $k }}:{{ typeOf $v }} {{ end }}"
"""


def _chart(tree: Path) -> Path:
    chart = tree / "dump"
    (chart / "templates").mkdir(parents=True)
    (chart / "Chart.yaml").write_text("apiVersion: v2\nname: dump\nversion: 0.1.0\n")
    (chart / "values.yaml").write_text("replicas: 1\ntag: latest\nconfig: none\n")
    (chart / "templates" / "dump.yaml").write_text(DUMP)
    (tree / "files").mkdir()
    (tree / "files" / "app.conf").write_text("listen = 8080\nname = 'shop, eu'\n")
    (tree / "files" / "motd.txt").write_text("true\n")
    return chart


def _agent_render(tree: Path, options: dict[str, Any]) -> dict[str, Any]:
    request = RenderRequest(
        source="dump", namespace="shop", options=options, tools=ToolSettings.from_env()
    )
    objects = render_bundle(tree, format="helm", request=request)
    return dict(next(o for o in objects if o["kind"] == "ConfigMap")["data"])


def _helm_template(chart: Path, values: dict[str, Any], *flags: str) -> dict[str, Any]:
    done = subprocess.run(
        [str(helm_binary()), "template", "dump", str(chart), "--namespace", "shop",
         "--values", "-", *flags],
        input=json.dumps(values), capture_output=True, text=True, check=True, timeout=60,
    )  # fmt: skip
    docs = [d for d in load_kube_all(done.stdout) if d]
    return dict(docs[0]["data"])


SETS = {
    # Written out of helm's order: helm applies setJson, then setString, then setFile.
    "setFile": ["config=files/app.conf"],
    "setString": ["tag=1.10,port=080", "replicas=7", "labels.team\\.io/owner=web"],
    "setJson": ['resources={"cpu":"500m","count":3},replicas=5', 'extra=[1,{"a":null}]'],
}


def test_set_fields_from_the_fleet_repo_render_as_helm_template_with_the_same_flags(
    tmp_path: Path,
) -> None:
    bundle = image_bundle(
        "dump",
        format="helm",
        formatOptions={"values": {"replicas": 2, "tag": "stable"}, **SETS},
        overrides=[{"clusterSelector": {"matchLabels": {"region": "us"}},
                    "setString": ["tag=2.0"], "setFile": ["motd=files/motd.txt"]}],
    )  # fmt: skip
    root = write_fleet(tmp_path / "fleet", clusters=CLUSTERS, bundles=[bundle])
    fleet = load_fleet(root)
    plans = plan_clusters(fleet, {s: s.ref for s in fleet.bundles[0].all_sources})
    eu = dict(to_dict(plans["eu-edge-1"].entries[0].spec.format_options))
    us = dict(to_dict(plans["us-edge-1"].entries[0].spec.format_options))
    assert us["setString"] == [*SETS["setString"], "tag=2.0"]
    assert us["setFile"] == ["config=files/app.conf", "motd=files/motd.txt"]

    tree = tmp_path / "tree"
    chart = _chart(tree)
    files = tree / "files"
    base = {"replicas": 2, "tag": "stable"}
    flags = [
        *(f"--set-json={s}" for s in SETS["setJson"]),
        *(f"--set-string={s}" for s in SETS["setString"]),
        f"--set-file=config={files / 'app.conf'}",
    ]
    expected_eu = _helm_template(chart, base, *flags)
    assert _agent_render(tree, eu) == expected_eu
    # What a user checks: helm's precedence and typing.
    shown = json.loads(expected_eu["values"])
    assert shown["replicas"] == "7" and shown["tag"] == "1.10" and shown["port"] == "080"
    assert shown["config"] == "listen = 8080\nname = 'shop, eu'\n"
    assert shown["labels"] == {"team.io/owner": "web"}
    assert (
        "replicas:string" in expected_eu["types"] and "extra:[]interface {}" in expected_eu["types"]
    )

    expected_us = _helm_template(
        chart, base, *flags, "--set-string=tag=2.0", f"--set-file=motd={files / 'motd.txt'}"
    )
    assert _agent_render(tree, us) == expected_us
    assert json.loads(expected_us["values"])["motd"] == "true\n"


@pytest.mark.parametrize(
    ("options", "overrides", "where", "what"),
    [
        ({"setJson": ["resources={cpu: 1}"]}, None, "formatOptions.setJson[0]", "not JSON"),
        ({"setString": ["a..b=1"]}, None, "formatOptions.setString[0]", "empty key"),
        ({"setString": "tag=1"}, None, "formatOptions.setString", "a list of helm --set-string"),
        ({"setFile": ["cfg=../secrets/key"]}, None, "formatOptions.setFile[0]", "inside"),
        ({}, {"setJson": ["a=1", 5]}, "overrides[0].setJson", "a list of helm --set-json"),
        ({}, {"setFile": ["cfg"]}, "overrides[0].setFile[0]", "key=path"),
    ],
)
def test_a_bad_set_item_is_refused_at_load_naming_the_file_and_field(
    tmp_path: Path, options: dict[str, Any], overrides: dict[str, Any] | None, where: str, what: str
) -> None:
    extra: dict[str, Any] = {"format": "helm", "formatOptions": options}
    if overrides is not None:
        extra["overrides"] = [{"clusters": ["eu-core"], **overrides}]
    root = write_fleet(tmp_path / "f", clusters=CLUSTERS, bundles=[image_bundle("web", **extra)])
    with pytest.raises(FleetRepoError) as refused:
        load_fleet(root)
    message = str(refused.value)
    assert f"bundles/web.yaml: {where}" in message
    assert what in message


def test_set_fields_are_refused_where_helm_does_not_render(tmp_path: Path) -> None:
    bundle = image_bundle("web", format="kustomize", formatOptions={"setString": ["a=1"]})
    root = write_fleet(tmp_path / "f", clusters=CLUSTERS, bundles=[bundle])
    fleet = load_fleet(root)
    with pytest.raises(FleetRepoError) as refused:
        plan_clusters(fleet, {s: s.ref for s in fleet.bundles[0].all_sources})
    assert "formatOptions.setString only with helm" in str(refused.value)


def test_a_set_file_outside_the_bundle_tree_or_missing_is_refused_by_the_agent(
    tmp_path: Path,
) -> None:
    tree = tmp_path / "tree"
    _chart(tree)
    outside = tmp_path / "secret.txt"
    outside.write_text("not yours\n")
    (tree / "files" / "link").symlink_to(outside)
    with pytest.raises(HelmChartError) as escapes:
        _agent_render(tree, {"setFile": ["config=files/link"]})
    assert escapes.value.rule == "SetFileEscapes"
    assert "files/link" in str(escapes.value)
    with pytest.raises(HelmChartError) as missing:
        _agent_render(tree, {"setFile": ["config=files/nope.conf"]})
    assert missing.value.rule == "SetFileMissing"
    assert "formatOptions.setFile 'config=files/nope.conf'" in str(missing.value)
