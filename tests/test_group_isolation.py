"""One bundle the agent cannot render fails its own group, not its publication: on the real
components (a real API server, registry, git server, helm, signatures from the mini Sigstore).

What a Flux or Fleet user checks, with a chart that does not template and with a plain bundle
holding a broken manifest, each in a publication with an independent group and a group that
``dependsOn`` the broken one:

- the publication is accepted (no ``last_refusal``, the serial moves), the independent group
  moves to it and is Ready;
- the broken group keeps its previous revision running, Ready False RenderFailed with the
  tool's own words; it is not rendered again on the next passes (only a new target, or the
  retry annotation, tries it again);
- the group that depends on it does not move (it waits);
- ``agent sync --once`` exits 1 and names the group and why;
- once a fixed publication comes, everything moves.

Hostile *source* content (a digest mismatch, links leaving the tree, unpack limits) still
refuses the whole publication: tests/test_agent_hostile.py.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import pytest

from agent.kube import KubeClient
from agent.state import ClusterState
from tests.fleetlab import Lab, conditions, configmap, live
from tests.fleetlab import lab as lab  # the fixture
from tests.realenv.kube import Cluster
from tests.realenv.oci import OciClient, push_bundle
from tests.test_crds import crds as crds  # the fixture: the CRDs installed

CHART = """apiVersion: v2
name: greeter
version: 1.0.0
"""

GOOD_TEMPLATE = """apiVersion: v1
kind: ConfigMap
metadata:
  name: chart
  namespace: {{ .Release.Namespace }}
data:
  v: {{ .Values.v | quote }}
"""

FAILING_TEMPLATE = '{{ fail "the greeting is broken" }}\n'


def push(lab: Lab, repository: str, files: Mapping[str, str]) -> str:
    """Push a tree (relative path -> text, subdirectories allowed); returns its digest."""
    directory = lab.tmp / "content" / repository / uuid.uuid4().hex[:8]
    for name, text in files.items():
        (directory / name).parent.mkdir(parents=True, exist_ok=True)
        (directory / name).write_text(text)
    tag = f"t{time.monotonic_ns()}"
    return push_bundle(OciClient(host=lab.registry.host), repository, directory, tag=tag).digest


def chart_bundle(lab: Lab, name: str, ns: str, version: str, *, broken: bool) -> dict[str, Any]:
    template = FAILING_TEMPLATE if broken else GOOD_TEMPLATE
    files = {"Chart.yaml": CHART, "templates/cm.yaml": template}
    return {
        "name": name,
        "format": "helm",
        "sources": [lab.source(name, push(lab, name, files))],
        "formatOptions": {"targetNamespace": ns, "values": {"v": version}},
    }


def plain_bundle(lab: Lab, name: str, ns: str, version: str, *, broken: bool) -> dict[str, Any]:
    files = {"cm.yaml": configmap("chart", ns, {"v": version})}
    if broken:
        files["broken.yaml"] = "apiVersion: v1\nkind: ConfigMap\nmetadata: {name: [unclosed\n"
    return {"name": name, "sources": [lab.source(name, push(lab, name, files))]}


# (the bundle's builder, the words of its failure the user must see)
CASES: dict[str, tuple[Callable[..., dict[str, Any]], str]] = {
    "helm-chart-fails-to-template": (chart_bundle, "the greeting is broken"),
    "plain-bundle-with-a-broken-manifest": (plain_bundle, "broken.yaml"),
}


@pytest.mark.parametrize("case", list(CASES))
def test_a_bundle_that_cannot_render_fails_only_its_group(
    lab: Lab, crds: Cluster, namespace: str, tmp_path: Path, case: str
) -> None:
    build, words = CASES[case]
    kube = KubeClient(kubeconfig=str(crds.kubeconfig))
    ns = lab.name("iso")
    kube.apply(
        {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": ns}}, field_manager="test"
    )
    good, bad, after = lab.name("good"), lab.name("bad"), lab.name("after")

    def publish(version: str, *, broken: bool) -> None:
        lab.publish(
            [
                {
                    "name": good,
                    "sources": [
                        lab.source(
                            good, push(lab, good, {"cm.yaml": configmap(good, ns, {"v": version})})
                        )
                    ],
                },
                build(lab, bad, ns, version, broken=broken),
                {
                    "name": after,
                    "sources": [
                        lab.source(
                            after,
                            push(lab, after, {"cm.yaml": configmap(after, ns, {"v": version})}),
                        )
                    ],
                    "dependsOn": [bad],
                },
            ]
        )

    def value(name: str) -> str | None:
        cm = live(kube, "v1", "ConfigMap", name, ns)
        return None if cm is None else str(cm["data"]["v"])

    workdir = tmp_path / "agent"
    publish("1", broken=False)
    first = lab.sync_once("edge-1", crds, namespace=namespace, workdir=workdir)
    assert first.returncode == 0, (first.stdout, first.stderr)
    assert [value(good), value("chart"), value(after)] == ["1", "1", "1"]

    # Serial 2: the bad bundle cannot be rendered. The publication is accepted anyway: the
    # independent group moves, the bad group keeps running serial 1, its dependent waits.
    publish("2", broken=True)
    second = lab.sync_once("edge-1", crds, namespace=namespace, workdir=workdir)
    assert second.returncode == 1, (second.stdout, second.stderr)
    summary = second.stdout.strip()
    assert summary.startswith("edge-1: rendered, serial 2"), summary
    assert f"moved: {good}" in summary and f"failed: {bad}" in summary, summary
    assert f"waiting: {after}" in summary, summary
    assert len(second.stderr.strip().splitlines()) == 1, second.stderr
    assert f"group {bad}: RenderFailed" in second.stderr and words in second.stderr
    assert [value(good), value("chart"), value(after)] == ["2", "1", "1"]
    ready = conditions(kube, bad)["Ready"]
    assert (ready["status"], ready["reason"]) == ("False", "RenderFailed"), ready
    assert words in ready["message"] and "serial 2 cannot be rendered" in ready["message"]
    assert conditions(kube, good)["Ready"]["status"] == "True"
    waiting = conditions(kube, after)["Ready"]
    assert waiting["reason"] == "WaitingForDependency" and bad in waiting["message"], waiting
    state = ClusterState(kube=kube, namespace=namespace).load()
    assert state.last_serial == 2 and state.refused_commit is None

    # The next passes neither refuse anything nor render the bad bundle again (a permanent
    # render failure waits for its target to change); the status document has no refusal.
    agent = lab.agent("edge-1", crds, namespace=namespace, workdir=workdir)
    result = agent.tick()
    assert result.inbound == "unchanged" and not result.failed_now
    assert result.outbound is not None and bad in result.outbound.failed
    assert agent.pipeline.renders.misses == 0  # nothing rendered (no render cache miss)
    assert agent.status_document().last_refusal is None
    kept = conditions(kube, bad)["Ready"]
    assert kept["reason"] == "RenderFailed" and words in kept["message"], kept
    assert "running serial 1" in kept["message"] and "fleetlet.io/retry" in kept["message"]
    again = lab.sync_once("edge-1", crds, namespace=namespace, workdir=workdir)
    assert again.returncode == 4, (again.stdout, again.stderr)  # still degraded, not failing now

    # A fixed publication: everything moves.
    publish("3", broken=False)
    fixed = lab.sync_once("edge-1", crds, namespace=namespace, workdir=workdir)
    assert fixed.returncode == 0, (fixed.stdout, fixed.stderr)
    assert [value(good), value("chart"), value(after)] == ["3", "3", "3"]
    for name in (good, bad, after):
        assert conditions(kube, name)["Ready"]["status"] == "True", name
