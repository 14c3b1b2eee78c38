"""Charts from every source kind, rendered by the helm format: an OCI chart pushed with
``helm push`` to the test registry, a chart ``.tgz`` over http, a chart directory in git, and a
Helm repository (``index.yaml`` made by ``helm repo index``, served over http). The hub resolves
version ranges (an index's versions, an OCI repository's tags) to one version pinned by
sha256/digest, and pins dependencies that are not vendored; the agent fetches by pin only.
"""

from __future__ import annotations

import hashlib
import subprocess
import tarfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from agent.api import Source, from_dict
from agent.render.formats import render_bundle
from agent.render.plain import RenderRequest
from agent.source.cache import ContentCache
from agent.source.compose import ContentStore
from agent.source.content import DigestMismatchError, InvalidSourceError
from agent.source.git import GitFetcher
from agent.source.oci import OciFetcher, OciSettings
from hub.errors import ResolveError
from hub.fleet.model import Bundle, ChartPin, SourceRef
from hub.fleet.render import source_dicts
from hub.resolve import Resolver
from tests.realenv.gitserver import GitDaemon
from tests.realenv.helm import HelmCli, StaticFiles, copy_chart
from tests.realenv.registry import Registry


@pytest.fixture(scope="module")
def helm(tmp_path_factory: pytest.TempPathFactory) -> HelmCli:
    return HelmCli(tmp_path_factory.mktemp("helm-home"))


@pytest.fixture
def files(tmp_path: Path) -> Iterator[StaticFiles]:
    server = StaticFiles(tmp_path / "served")
    yield server
    server.close()


@pytest.fixture
def store(tmp_path: Path) -> ContentStore:
    return ContentStore(
        cache=ContentCache(root=tmp_path / "cache", max_bytes=1 << 28),
        oci=OciFetcher(settings=OciSettings(plain_http=True)),
        git=GitFetcher(repos_dir=tmp_path / "repos"),
    )


def sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def message(objects: list[dict[str, Any]], release: str = "greeter") -> str:
    settings = next(o for o in objects if o["metadata"].get("name") == f"{release}-settings")
    return str(settings["data"]["message"])


def render(
    store: ContentStore, sources: list[dict[str, Any]], dest: Path, **options: Any
) -> list[dict[str, Any]]:
    """Compose the sources as the agent does (by pin) and render the tree with helm."""
    typed = [from_dict(Source, s) for s in sources]
    tree = store.compose(typed, dest)
    return render_bundle(
        tree, format="helm", request=RenderRequest(source="chart", options=options)
    )


def bundle(name: str, *refs: SourceRef) -> Bundle:
    return Bundle(
        name=name, file=f"bundles/{name}.yaml", sources=refs, spec={}, targets=(), overrides=()
    )


def test_oci_chart_pushed_by_helm_is_fetched_by_digest_and_rendered(
    helm: HelmCli, registry: Registry, store: ContentStore, tmp_path: Path
) -> None:
    chart = copy_chart("greeter", tmp_path / "src")
    archive = helm.package(chart, tmp_path / "pkg", version="1.0.0")
    digest = helm.push(archive, registry.host, namespace="helm-oci")
    source = {"kind": "image", "uri": f"{registry.host}/helm-oci/greeter", "digest": digest}
    objects = render(store, [source], tmp_path / "tree", values={"greeting": "oci"})
    assert message(objects) == "oci, world!"
    assert (tmp_path / "tree" / "greeter" / "Chart.yaml").is_file()


def test_chart_archive_over_http_is_checked_and_rendered(
    helm: HelmCli, files: StaticFiles, store: ContentStore, tmp_path: Path
) -> None:
    archive = helm.package(copy_chart("greeter", tmp_path / "src"), files.root)
    source = {"kind": "http", "uri": files.url(archive.name), "sha256": sha256(archive)}
    assert message(render(store, [source], tmp_path / "tree")) == "hello, world!"
    tampered = dict(source, sha256="0" * 64)
    with pytest.raises(DigestMismatchError):
        render(store, [tampered], tmp_path / "tree2")


def push_work_tree(git_daemon: GitDaemon, name: str, work: Path) -> str:
    """Commit ``work`` and push it as branch main of the new repository ``name``."""
    git_daemon.create_bare(name)
    env = {
        "GIT_AUTHOR_NAME": "t",
        "GIT_AUTHOR_EMAIL": "t@example.invalid",
        "GIT_COMMITTER_NAME": "t",
        "GIT_COMMITTER_EMAIL": "t@example.invalid",
        "HOME": str(work.parent),
        "PATH": "/usr/bin:/bin",
    }
    for args in (
        ["init", "-q", "-b", "main"],
        ["add", "-A"],
        ["commit", "-q", "-m", "chart"],
        ["push", "-q", git_daemon.url_for(name), "main"],
    ):
        subprocess.run(["git", *args], cwd=work, env=env, check=True, timeout=60)
    return subprocess.run(
        ["git", "rev-parse", "HEAD"], cwd=work, env=env, capture_output=True, text=True
    ).stdout.strip()


def test_chart_directory_in_git_is_rendered(
    git_daemon: GitDaemon, store: ContentStore, tmp_path: Path
) -> None:
    work = tmp_path / "work"
    copy_chart("greeter", work / "charts")
    commit = push_work_tree(git_daemon, "charts-repo.git", work)
    source = {
        "kind": "git",
        "uri": git_daemon.url_for("charts-repo.git"),
        "commit": commit,
        "directory": "charts/greeter",
    }
    objects = render(store, [source], tmp_path / "tree", values={"audience": "git"})
    assert message(objects) == "hello, git!"


def make_repository(helm: HelmCli, files: StaticFiles, tmp_path: Path) -> dict[str, Path]:
    """A Helm repository with greeter 1.0.0, 1.1.0, 2.0.0-rc.1 and 2.0.0."""
    archives = {}
    for version in ("1.0.0", "1.1.0", "2.0.0-rc.1", "2.0.0"):
        chart = copy_chart("greeter", tmp_path / f"v{version}", version=version)
        values = chart / "values.yaml"
        values.write_text(values.read_text().replace("greeting: hello", f"greeting: v{version}"))
        archives[version] = helm.package(chart, files.root / "charts")
    helm.index(files.root, files.url())
    return archives


def test_helm_repository_range_resolves_to_one_pinned_version(
    helm: HelmCli, files: StaticFiles, store: ContentStore, tmp_path: Path
) -> None:
    archives = make_repository(helm, files, tmp_path)
    refs = {
        wanted: SourceRef(
            kind="helm",
            uri=files.url().rstrip("/"),
            ref_field="version",
            ref=wanted,
            chart="greeter",
        )
        for wanted in ("^1.0", "~1.0.0", "*", ">=1.0, <2.0", "1.1.0", ">=2.0.0-0")
    }
    with Resolver() as resolver:
        pins = resolver.resolve_bundles([bundle(f"b{i}", r) for i, r in enumerate(refs.values())])
        # One index download for every range of the repository.
        assert files.gets.count("/index.yaml") == 1
    resolved = {wanted: pins[ref] for wanted, ref in refs.items()}
    versions = {w: p.version for w, p in resolved.items() if isinstance(p, ChartPin)}
    assert versions == {
        "^1.0": "1.1.0",
        "~1.0.0": "1.0.0",
        "*": "2.0.0",  # a pre-release only when the range asks for one
        ">=1.0, <2.0": "1.1.0",
        "1.1.0": "1.1.0",
        ">=2.0.0-0": "2.0.0",
    }
    pin = resolved["^1.0"]
    assert isinstance(pin, ChartPin)
    assert pin.pin == sha256(archives["1.1.0"])
    assert pin.archive_url == files.url("charts/greeter-1.1.0.tgz")
    assert pin.dependencies == ()

    # The set's source: exact version, archive and sha256; the agent downloads only that.
    [source] = source_dicts(refs["^1.0"], pin)
    assert source == {
        "kind": "helm",
        "uri": files.url().rstrip("/"),
        "chart": "greeter",
        "version": "1.1.0",
        "archiveUrl": pin.archive_url,
        "sha256": pin.pin,
    }
    before = list(files.gets)
    objects = render(store, [source], tmp_path / "tree")
    assert message(objects) == "v1.1.0, world!"
    assert files.gets[len(before) :] == ["/charts/greeter-1.1.0.tgz"]  # no index.yaml


def test_unknown_chart_or_version_and_a_lying_index_are_refused(
    helm: HelmCli, files: StaticFiles, store: ContentStore, tmp_path: Path
) -> None:
    archives = make_repository(helm, files, tmp_path)
    repo = files.url().rstrip("/")
    missing_chart = SourceRef(kind="helm", uri=repo, ref_field="version", ref="*", chart="nope")
    no_version = SourceRef(kind="helm", uri=repo, ref_field="version", ref="^3", chart="greeter")
    with Resolver() as resolver, pytest.raises(ResolveError) as refused:
        resolver.resolve_bundles([bundle("a", missing_chart), bundle("b", no_version)])
    problems = {b: p for b, _, p in refused.value.failures}
    assert problems["a"] == f"no chart 'nope' in {repo}/index.yaml"
    assert problems["b"].startswith("no version of greeter in the range '^3'")

    # The archive no longer matches the index's digest: the hub refuses to pin it.
    archives["1.0.0"].write_bytes(archives["1.1.0"].read_bytes())
    exact = SourceRef(kind="helm", uri=repo, ref_field="version", ref="1.0.0", chart="greeter")
    with Resolver() as resolver, pytest.raises(ResolveError) as lying:
        resolver.resolve_bundles([bundle("c", exact)])
    assert "the index says" in lying.value.failures[0][2]

    # An archive that is not a chart is refused by the agent too.
    (files.root / "not-a-chart.tgz").write_bytes(b"not gzip at all, but pinned")
    source = {
        "kind": "helm",
        "uri": repo,
        "chart": "greeter",
        "version": "1.0.0",
        "archiveUrl": files.url("not-a-chart.tgz"),
        "sha256": sha256(files.root / "not-a-chart.tgz"),
    }
    with pytest.raises(InvalidSourceError) as not_chart:
        render(store, [source], tmp_path / "tree")
    assert not_chart.value.rule == "NotAChart"


def test_dependencies_that_are_not_vendored_are_pinned_and_placed(
    helm: HelmCli, files: StaticFiles, store: ContentStore, tmp_path: Path
) -> None:
    make_repository(helm, files, tmp_path)
    repo = files.url().rstrip("/")
    shop = tmp_path / "shop-src" / "shop"
    (shop / "templates").mkdir(parents=True)
    (shop / "Chart.yaml").write_text(
        "apiVersion: v2\nname: shop\nversion: 0.3.0\n"
        f"dependencies:\n  - name: greeter\n    version: ~1.0.0\n    repository: {repo}\n"
    )
    (shop / "values.yaml").write_text("greeter:\n  audience: shoppers\n  hooks: {enabled: false}\n")
    (shop / "templates" / "cm.yaml").write_text(
        "apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: shop\ndata: {a: b}\n"
    )
    # `helm package` vendors dependencies (it refuses a chart without them); archives made by
    # other tools need not, and neither do chart directories: this one is tarred as it is.
    with tarfile.open(files.root / "charts" / "shop-0.3.0.tgz", "w:gz") as archive:
        archive.add(shop, arcname="shop")
    helm.index(files.root, files.url())

    ref = SourceRef(kind="helm", uri=repo, ref_field="version", ref="0.3.x", chart="shop")
    with Resolver() as resolver:
        pin = resolver.resolve_bundles([bundle("shop", ref)])[ref]
    assert isinstance(pin, ChartPin) and pin.version == "0.3.0"
    [dependency] = pin.dependencies
    assert (dependency.chart, dependency.version, dependency.destination) == (
        "greeter",
        "1.0.0",
        "shop/charts",
    )
    sources = source_dicts(ref, pin)
    assert [s.get("destination") for s in sources] == [None, "shop/charts"]
    objects = render(store, sources, tmp_path / "tree")
    assert (tmp_path / "tree" / "shop" / "charts" / "greeter" / "Chart.yaml").is_file()
    names = {o["metadata"].get("name") for o in objects}
    assert {"shop", "shop-settings"} <= names
    assert message(objects, "shop") == "v1.0.0, shoppers!"

    # Without the hub's pins, the agent refuses instead of downloading.
    from agent.render.helm import HelmChartError

    with pytest.raises(HelmChartError) as refused:
        render(store, sources[:1], tmp_path / "tree-without")
    assert refused.value.rule == "MissingDependency"


def test_oci_tag_range_resolves_by_listing_tags(
    helm: HelmCli, registry: Registry, tmp_path: Path
) -> None:
    digests = {}
    for version in ("0.9.0", "1.0.0", "1.2.0+build.7", "2.0.0"):
        chart = copy_chart("greeter", tmp_path / version, version=version)
        digests[version] = helm.push(
            helm.package(chart, tmp_path / "pkg"), registry.host, namespace="ranges"
        )
    uri = f"{registry.host}/ranges/greeter"
    refs = {
        w: SourceRef(kind="image", uri=uri, ref_field="version", ref=w) for w in ("^1", "~0.9", "*")
    }
    mark = registry.request_count()
    with Resolver() as resolver:
        pins = resolver.resolve_bundles([bundle(f"b{i}", r) for i, r in enumerate(refs.values())])
    resolved = {w: pins[r] for w, r in refs.items()}
    assert {w: (p.version, p.pin) for w, p in resolved.items() if isinstance(p, ChartPin)} == {
        "^1": ("1.2.0+build.7", digests["1.2.0+build.7"]),
        "~0.9": ("0.9.0", digests["0.9.0"]),
        "*": ("2.0.0", digests["2.0.0"]),
    }
    listings = [r for r in registry.requests(since=mark) if "/tags/list" in r.path]
    assert len(listings) == 1  # one listing for every range of the repository
    [source] = source_dicts(refs["^1"], resolved["^1"])
    assert source == {
        "kind": "image",
        "uri": f"{uri}:1.2.0_build.7",
        "digest": digests["1.2.0+build.7"],
    }


def test_dependencies_of_a_chart_directory_in_git_are_pinned_by_the_hub(
    helm: HelmCli,
    files: StaticFiles,
    git_daemon: GitDaemon,
    store: ContentStore,
    tmp_path: Path,
) -> None:
    """An umbrella chart committed without its dependencies (as Argo CD's and Flux's examples
    keep them): the hub reads its Chart.yaml at the pinned commit and pins what is missing."""
    make_repository(helm, files, tmp_path)
    repo = files.url().rstrip("/")
    work = tmp_path / "umbrella"
    shop = work / "deploy" / "shop"
    (shop / "templates").mkdir(parents=True)
    (shop / "Chart.yaml").write_text(
        "apiVersion: v2\nname: shop\nversion: 0.1.0\n"
        f"dependencies:\n  - name: greeter\n    version: ^1.0\n    repository: {repo}\n"
    )
    (shop / "values.yaml").write_text("greeter:\n  audience: git users\n")
    (shop / "templates" / "cm.yaml").write_text(
        "apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: shop\ndata: {a: b}\n"
    )
    commit = push_work_tree(git_daemon, "umbrella.git", work)
    ref = SourceRef(
        kind="git",
        uri=git_daemon.url_for("umbrella.git"),
        ref_field="branch",
        ref="main",
        extra=(("directory", "deploy"),),
    )
    helm_bundle = Bundle(
        name="shop",
        file="bundles/shop.yaml",
        sources=(ref,),
        spec={"format": "helm"},
        targets=(),
        overrides=(),
    )
    with Resolver() as resolver:
        pin = resolver.resolve_bundles([helm_bundle])[ref]
    assert isinstance(pin, ChartPin) and pin.pin == commit
    [dependency] = pin.dependencies
    assert (dependency.chart, dependency.version, dependency.destination) == (
        "greeter",
        "1.1.0",
        "shop/charts",
    )
    sources = source_dicts(ref, pin)
    assert sources[0] == {
        "kind": "git",
        "uri": git_daemon.url_for("umbrella.git"),
        "commit": commit,
        "directory": "deploy",
    }
    objects = render(store, sources, tmp_path / "tree")
    assert message(objects, "shop") == "v1.1.0, git users!"

    # A plain bundle of the same source is left alone: no chart is read for it.
    plain = Bundle(
        name="raw", file="bundles/raw.yaml", sources=(ref,), spec={}, targets=(), overrides=()
    )
    with Resolver() as resolver:
        assert resolver.resolve_bundles([plain])[ref] == commit


def test_an_oci_dependency_is_pinned_by_its_tags_and_placed(
    helm: HelmCli, files: StaticFiles, registry: Registry, store: ContentStore, tmp_path: Path
) -> None:
    for version in ("1.0.0", "1.3.0"):
        chart = copy_chart("greeter", tmp_path / f"dep-{version}", version=version)
        helm.push(helm.package(chart, tmp_path / "dep-pkg"), registry.host, namespace="deps")
    shop = tmp_path / "oci-shop" / "shop"
    (shop / "templates").mkdir(parents=True)
    (shop / "Chart.yaml").write_text(
        "apiVersion: v2\nname: shop\nversion: 0.2.0\ndependencies:\n  - name: greeter\n"
        f"    version: ^1.0\n    repository: oci://{registry.host}/deps\n"
    )
    (shop / "values.yaml").write_text("greeter:\n  audience: registries\n")
    with tarfile.open(files.root / "shop-0.2.0.tgz", "w:gz") as archive:
        archive.add(shop, arcname="shop")
    helm.index(files.root, files.url())
    ref = SourceRef(
        kind="helm", uri=files.url().rstrip("/"), ref_field="version", ref="*", chart="shop"
    )
    with Resolver() as resolver:
        pin = resolver.resolve_bundles([bundle("shop", ref)])[ref]
    assert isinstance(pin, ChartPin)
    sources = source_dicts(ref, pin)
    assert sources[1]["kind"] == "image"
    assert sources[1]["uri"] == f"{registry.host}/deps/greeter:1.3.0"
    assert sources[1]["destination"] == "shop/charts"
    objects = render(store, sources, tmp_path / "tree")
    assert message(objects, "shop") == "hello, registries!"
