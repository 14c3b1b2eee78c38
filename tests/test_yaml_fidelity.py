"""YAML read as Kubernetes reads it: a differential test against the real kubectl, helm and
kustomize over a corpus of tricky scalars (``tests/assets/yaml/tricky-scalars.txt``).

Each scalar goes, as written, into a manifest (as a value and as a key), a helm values file and
``--set``; what fleetlet reads must be what the tools read, value for value and type for type.
kubectl reads a manifest offline with ``kubectl annotate --local`` (removing an annotation
nobody has), which prints the objects exactly as it would send them. What one side refuses
(NaN, a null key) the other must refuse too.
"""

from __future__ import annotations

import json
import subprocess
import tarfile
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import pytest
import yaml

from agent.api.yamlio import KUBE_LOADER, PURE_KUBE_LOADER
from agent.render.command import RenderOptions, RenderUsageError, run_render
from agent.render.formats import render_bundle
from agent.render.manifests import InvalidManifestError, parse_manifests
from agent.render.plain import RenderRequest
from agent.render.values import parse_set
from tests.realenv.binaries import kubectl

CORPUS = Path(__file__).resolve().parent / "assets" / "yaml" / "tricky-scalars.txt"
SCALARS = [
    line
    for line in CORPUS.read_text(encoding="utf-8").splitlines()
    if line.strip() and not line.startswith("#")
]
NOTHING = "fleetlet.io/fidelity-none-"  # removing what no object has

Obj = dict[str, Any]


def corpus_manifest(values: Iterable[str], keys: Iterable[str]) -> str:
    """An object holding each scalar as a list item and each as the key of a one-key map (so
    that ``y`` and ``true`` never meet in one mapping), with a timestamp annotation."""
    lines = [
        "apiVersion: fidelity.fleetlet.io/v1",
        "kind: Scalars",
        "metadata:",
        "  name: corpus",
        "  annotations:",
        "    created: 2025-04-28T14:36:22Z",
        "spec:",
        "  values:",
        *(f"  - {s}" for s in values),
        "  keys:",
        *(f"  - {s}: 0" for s in keys),
    ]
    return "\n".join(lines) + "\n"


def _kubectl_local(verb: str, path: Path) -> list[Obj]:
    done = subprocess.run(
        [kubectl(), verb, "--local", "-f", str(path), "-o", "json", NOTHING],
        capture_output=True,
        text=True,
        timeout=120,
        env={"PATH": "/usr/bin:/bin", "HOME": str(path.parent), "KUBECONFIG": "/dev/null"},
        check=False,
    )
    if done.returncode != 0:
        raise AssertionError(f"kubectl refused {path.name}: {done.stderr.strip()}")
    objects: list[Obj] = []
    decoder = json.JSONDecoder()
    text, at = done.stdout, 0
    while text[at:].strip():
        at += len(text[at:]) - len(text[at:].lstrip())
        obj, at = decoder.raw_decode(text, at)
        objects.extend(obj["items"] if obj.get("kind") == "List" else [obj])
    return objects


def kubectl_read(path: Path) -> list[Obj]:
    """The objects of a manifest file (or stream) as kubectl reads them, offline.

    Removing an annotation nobody has leaves ``annotations: {}`` on an object that had none,
    and removing such a label ``labels: {}``: each field is taken from the run that left it
    alone."""
    annotated = _kubectl_local("annotate", path)
    labelled = _kubectl_local("label", path)
    for obj, other in zip(annotated, labelled, strict=True):
        obj["metadata"].pop("annotations", None)
        if "annotations" in other["metadata"]:
            obj["metadata"]["annotations"] = other["metadata"]["annotations"]
    return annotated


def kubectl_refuses(path: Path) -> bool:
    try:
        kubectl_read(path)
    except AssertionError:
        return True
    return False


def fleetlet_refuses(text: str) -> bool:
    try:
        parse_manifests(text.encode(), source="corpus", file="corpus.yaml")
    except InvalidManifestError:
        return True
    return False


REFUSED_VALUES = [s for s in SCALARS if fleetlet_refuses(corpus_manifest([s], []))]
REFUSED_KEYS = [s for s in SCALARS if fleetlet_refuses(corpus_manifest([], [s]))]
VALUES = [s for s in SCALARS if s not in REFUSED_VALUES]
KEYS = [s for s in SCALARS if s not in REFUSED_KEYS]


def test_the_corpus_covers_what_readers_disagree_on() -> None:
    assert len(SCALARS) > 60
    # NaN and infinities have no JSON form; a null key, a merge key with no map and an
    # unsigned 64-bit key have no JSON key: what both refuse is checked on its own below.
    assert set(REFUSED_VALUES) == {".inf", "-.Inf", ".NaN"}
    assert {"~", "null", "<<", "18446744073709551615"} <= set(REFUSED_KEYS)


def test_the_c_and_the_pure_python_loaders_agree() -> None:
    text = corpus_manifest(VALUES, KEYS)
    assert yaml.load(text, Loader=PURE_KUBE_LOADER) == yaml.load(text, Loader=KUBE_LOADER)


def test_a_manifest_reads_as_kubectl_reads_it(tmp_path: Path) -> None:
    text = corpus_manifest(VALUES, KEYS)
    path = tmp_path / "corpus.yaml"
    path.write_text(text)
    (expected,) = kubectl_read(path)
    (read,) = parse_manifests(text.encode(), source="corpus", file="corpus.yaml")
    assert read["metadata"]["annotations"]["created"] == "2025-04-28T14:36:22Z"
    assert read["spec"]["values"][VALUES.index("=")] == "="
    mismatches = [
        (scalar, theirs, ours)
        for scalar, theirs, ours in zip(
            VALUES, expected["spec"]["values"], read["spec"]["values"], strict=True
        )
        if json.dumps(theirs) != json.dumps(ours)
    ]
    mismatches += [
        (scalar, theirs, ours)
        for scalar, theirs, ours in zip(
            KEYS, expected["spec"]["keys"], read["spec"]["keys"], strict=True
        )
        if json.dumps(theirs) != json.dumps(ours)
    ]
    assert mismatches == []
    assert json.dumps(read, sort_keys=True) == json.dumps(expected, sort_keys=True)


def test_what_fleetlet_refuses_kubectl_refuses(tmp_path: Path) -> None:
    accepted = []
    for index, text in enumerate(
        [corpus_manifest([s], []) for s in REFUSED_VALUES]
        + [corpus_manifest([], [s]) for s in REFUSED_KEYS]
    ):
        path = tmp_path / f"refused-{index}.yaml"
        path.write_text(text)
        if not kubectl_refuses(path):
            accepted.append(text.split("spec:")[1])
    assert accepted == []


def test_a_plain_bundle_and_a_kustomize_build_read_as_kubectl_reads_them(
    tmp_path: Path, kustomize_binary: Path
) -> None:
    tree = tmp_path / "tree"
    tree.mkdir()
    (tree / "corpus.yaml").write_text(corpus_manifest(VALUES, KEYS))
    direct = kubectl_read(tree / "corpus.yaml")
    plain = render_bundle(tree, format="plain", request=RenderRequest(source="corpus"))
    assert plain == direct

    # kustomize itself cannot hold a key that is not a string (a bool, a number, a time):
    # ``json: unsupported type: map[interface {}]interface {}``. Values only, there.
    (tree / "corpus.yaml").write_text(corpus_manifest(VALUES, []))
    (tree / "kustomization.yaml").write_text("resources:\n- corpus.yaml\n")
    built = subprocess.run(
        [str(kustomize_binary), "build", str(tree)],
        capture_output=True,
        check=True,
        timeout=120,
    ).stdout
    (tmp_path / "built.yaml").write_bytes(built)
    applied = kubectl_read(tmp_path / "built.yaml")  # what `kubectl apply -k` would send
    rendered = render_bundle(tree, format="kustomize", request=RenderRequest(source="corpus"))
    assert rendered == applied


# --- helm: values files and --set ------------------------------------------------------------

CHART = {
    "Chart.yaml": "apiVersion: v2\nname: corpus\nversion: 0.1.0\n",
    "values.yaml": "corpus: {}\n",
    # toJson shows types; printf "%v" shows how a template prints them (int64 against float64).
    "templates/corpus.yaml": (
        "apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: corpus\ndata:\n"
        "  json: {{ toJson .Values.corpus | quote }}\n"
        '  printed: {{ printf "%v" .Values.corpus | quote }}\n'
    ),
}


@pytest.fixture
def chart(tmp_path: Path) -> Path:
    root = tmp_path / "corpus"
    for name, text in CHART.items():
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_text(text)
    return root


def helm_data(helm: Path, chart: Path, *args: str) -> dict[str, str]:
    done = subprocess.run(
        [str(helm), "template", "corpus", str(chart), *args],
        capture_output=True,
        text=True,
        timeout=120,
        env={"PATH": "/usr/bin:/bin", "HOME": str(chart.parent)},
        check=False,
    )
    if done.returncode != 0:
        raise AssertionError(f"helm refused: {done.stderr.strip()}")
    out = chart.parent / "helm-out.yaml"
    out.write_text(done.stdout)
    (configmap,) = kubectl_read(out)
    data: dict[str, str] = configmap["data"]
    return data


def fleetlet_data(chart: Path, **options: Any) -> dict[str, str]:
    text = run_render(
        bundle_dir=str(chart), options=RenderOptions(format="helm", output="json", **options)
    )
    (configmap,) = json.loads(text)["items"]
    data: dict[str, str] = configmap["data"]
    return data


def _beyond_json_integers(scalar: str) -> bool:
    (read,) = parse_manifests(corpus_manifest([scalar], []).encode(), source="c", file="c.yaml")
    value = read["spec"]["values"][0]
    return isinstance(value, int) and not isinstance(value, bool) and abs(value) > 2**53 - 1


# Integers beyond ±(2**53 - 1) cannot travel in a signed set (I-JSON): fleetlet refuses them
# as values, with the reason (helm would read them as float64 and lose their last digits).
BIG = [s for s in VALUES if _beyond_json_integers(s)]
HELM_VALUES = [s for s in VALUES if s not in BIG]


def values_file(values: Iterable[str], keys: Iterable[str]) -> str:
    return (
        "corpus:\n  values:\n"
        + "".join(f"  - {s}\n" for s in values)
        + "  keys:\n"
        + "".join(f"  - {s}: 0\n" for s in keys)
    )


def test_a_values_file_reads_as_helm_reads_it(chart: Path, helm_binary: Path) -> None:
    path = chart.parent / "user-values.yaml"
    path.write_text(values_file(HELM_VALUES, KEYS))
    expected = helm_data(helm_binary, chart, "--values", str(path))
    assert fleetlet_data(chart, values_files=[str(path)]) == expected


def test_integers_a_signed_set_cannot_carry_are_refused_by_name(chart: Path) -> None:
    assert "9223372036854775807" in BIG
    path = chart.parent / "big.yaml"
    path.write_text(values_file(["9223372036854775807"], []))
    with pytest.raises(
        RenderUsageError,
        match=r"values.corpus.values\[0\]: expected an integer within ±9007199254740991, got "
        "9223372036854775807",
    ):
        fleetlet_data(chart, values_files=[str(path)])


def test_what_fleetlet_refuses_in_a_values_file_helm_refuses(
    chart: Path, helm_binary: Path
) -> None:
    accepted = []
    for index, text in enumerate(
        [values_file([s], []) for s in REFUSED_VALUES]
        + [values_file([], [s]) for s in REFUSED_KEYS]
    ):
        path = chart.parent / f"refused-{index}.yaml"
        path.write_text(text)
        try:
            helm_data(helm_binary, chart, "--values", str(path))
        except AssertionError:
            continue
        accepted.append(text)
    assert accepted == []


# Characters --set reads as syntax: a scalar holding them is not one value there.
_SET_SYNTAX = set(",\\")


def _big_set_value(scalar: str) -> bool:
    value = parse_set([f"x={scalar}"])["x"]
    return isinstance(value, int) and not isinstance(value, bool) and abs(value) > 2**53 - 1


def test_set_values_are_typed_as_helm_types_them(chart: Path, helm_binary: Path) -> None:
    scalars = [
        s
        for s in SCALARS
        if not _SET_SYNTAX & set(s) and not s.startswith("{") and not _big_set_value(s)
    ]
    assignments = [f"corpus.values[{i}]={s}" for i, s in enumerate(scalars)]
    assignments += [
        "corpus.empty={}",
        "corpus.list={NULL,+5,y,007,99999999999999999999,1e3,TRUE}",
        "corpus.escaped=a\\,b\\=c",
        "corpus.blank=",
        "corpus.million=1000000",
    ]
    flags = [arg for a in assignments for arg in ("--set", a)]
    expected = helm_data(helm_binary, chart, *flags)
    assert fleetlet_data(chart, set_values=assignments) == expected
    corpus = json.loads(expected["json"])
    assert corpus["empty"] == [""]
    assert corpus["list"] == [None, 5, "y", "007", "99999999999999999999", "1e3", True]
    assert "million:1000000" in expected["printed"]  # an int64, where a values file has 1e+06


# --- a real chart: kube-prometheus-stack --------------------------------------------------------

KPS = (
    Path(__file__).resolve().parent
    / "assets"
    / "charts"
    / "kube-prometheus-stack"
    / "kube-prometheus-stack-88.5.3.tgz"
)


def test_kube_prometheus_stack_renders_as_helm_template_renders_it(
    tmp_path: Path, helm_binary: Path
) -> None:
    tree = tmp_path / "tree"
    tree.mkdir()
    with tarfile.open(KPS) as archive:
        archive.extractall(tree, filter="data")
    flags = ["--namespace", "monitoring", "--include-crds"]
    done = subprocess.run(
        [str(helm_binary), "template", "kps", str(tree / "kube-prometheus-stack"), *flags],
        capture_output=True,
        timeout=300,
        env={"PATH": "/usr/bin:/bin", "HOME": str(tmp_path)},
        check=True,
    )
    (tmp_path / "helm.yaml").write_bytes(done.stdout)
    expected = kubectl_read(tmp_path / "helm.yaml")

    text = run_render(
        bundle_dir=str(tree),
        options=RenderOptions(
            format="helm", release_name="kps", namespace="monitoring", output="json"
        ),
    )
    rendered = json.loads(text)["items"]

    def canonical(objects: list[Obj]) -> list[str]:
        return [json.dumps(o, sort_keys=True) for o in objects]

    assert len(rendered) == len(expected) > 100
    assert canonical(rendered) == canonical(expected)
    crd = next(o for o in rendered if o["kind"] == "CustomResourceDefinition")
    assert crd["metadata"]["name"] == "alertmanagerconfigs.monitoring.coreos.com"
    assert '"="' in json.dumps(crd)


def test_set_string_json_and_file_as_helm_applies_them(chart: Path, helm_binary: Path) -> None:
    text = chart.parent / "motd.txt"
    text.write_text("hello, world\nkey: value = 1\n")
    given = {
        "set_json_values": ['corpus.json={"a": [1, 2.5, null], "b": "x"}', "corpus.order=1"],
        "set_values": ["corpus.order=2,corpus.n=+5"],
        "set_string_values": ["corpus.order=3,corpus.s=+5", "corpus.list={1,true}"],
        "set_file_values": [f"corpus.file={text}"],
    }
    flags = [
        *[a for v in given["set_json_values"] for a in ("--set-json", v)],
        *[a for v in given["set_values"] for a in ("--set", v)],
        *[a for v in given["set_string_values"] for a in ("--set-string", v)],
        *[a for v in given["set_file_values"] for a in ("--set-file", v)],
    ]
    # The flags in another order: helm applies them in its own (json, set, string, file).
    expected = helm_data(helm_binary, chart, *reversed_pairs(flags))
    assert fleetlet_data(chart, **given) == expected
    corpus = json.loads(expected["json"])
    assert corpus["order"] == "3"
    assert corpus["s"] == "+5"
    assert corpus["list"] == ["1", "true"]
    assert corpus["file"] == text.read_text()


def reversed_pairs(flags: list[str]) -> list[str]:
    pairs = [flags[i : i + 2] for i in range(0, len(flags), 2)]
    return [arg for pair in reversed(pairs) for arg in pair]


def test_a_number_longer_than_any_integer_is_text() -> None:
    digits = "1" * 5000
    (read,) = parse_manifests(corpus_manifest([digits], []).encode(), source="c", file="c.yaml")
    assert read["spec"]["values"] == [digits]  # as Go: too big for a float, so a string
    assert parse_set([f"a={digits}"]) == {"a": digits}
