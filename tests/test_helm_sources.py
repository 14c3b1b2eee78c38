"""Charts from every source kind, rendered by the helm format: an OCI chart pushed with
``helm push`` to the test registry, a chart ``.tgz`` over http, a chart directory in git, and a
Helm repository (``index.yaml`` made by ``helm repo index``, served over http). The hub resolves
version ranges (an index's versions, an OCI repository's tags) to one version pinned by
sha256/digest, and pins dependencies that are not vendored; the agent fetches by pin only.
"""

from __future__ import annotations

import hashlib
import shutil
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
from hub.errors import ResolveError, SourceUnavailableError
from hub.fleet.model import Bundle, ChartPin, SourceRef
from hub.fleet.render import source_dicts
from hub.resolve import Resolver, ResolveSettings
from tests.realenv.gitserver import GitDaemon
from tests.realenv.helm import ASSETS, HelmCli, StaticFiles, copy_chart
from tests.realenv.oci import OciClient, push_bundle
from tests.realenv.registry import Registry, free_port


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


def unvendored_chart(
    root: Path, name: str, version: str, dependency: str, repository: str, values: str
) -> Path:
    """A chart directory ``root/<name>`` that lists ``greeter``-like ``dependency`` (a
    ``name@range``) from ``repository`` without vendoring it."""
    dep_name, dep_range = dependency.split("@")
    chart = root / name
    (chart / "templates").mkdir(parents=True)
    (chart / "Chart.yaml").write_text(
        f"apiVersion: v2\nname: {name}\nversion: {version}\ndependencies:\n"
        f"  - name: {dep_name}\n    version: {dep_range!r}\n    repository: {repository}\n"
    )
    (chart / "values.yaml").write_text(values)
    (chart / "templates" / "cm.yaml").write_text(
        f"apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: {name}\ndata: {{a: b}}\n"
    )
    return chart


def tar(chart: Path, archive: Path, *, top: bool = True) -> Path:
    """The chart as a ``.tgz`` made without helm (which would insist on vendoring), with the
    chart in one top directory as Helm writes it, or (``top=False``) at the archive's root."""
    archive.parent.mkdir(parents=True, exist_ok=True)
    with tarfile.open(archive, "w:gz") as out:
        if top:
            out.add(chart, arcname=chart.name)
        else:
            for entry in sorted(chart.iterdir()):
                out.add(entry, arcname=entry.name)
    return archive


def helm_bundle(name: str, ref: SourceRef) -> Bundle:
    return Bundle(
        name=name,
        file=f"bundles/{name}.yaml",
        sources=(ref,),
        spec={"format": "helm"},
        targets=(),
        overrides=(),
    )


def test_dependencies_of_a_chart_archive_over_http_are_pinned_by_the_hub(
    helm: HelmCli, files: StaticFiles, store: ContentStore, tmp_path: Path
) -> None:
    """A chart .tgz over http (made by a tool other than `helm package`) that lists a
    dependency it does not vendor: the hub hashes the archive once, reads its Chart.yaml, pins
    the dependency from the Helm repository; the agent fetches both by pin and renders."""
    make_repository(helm, files, tmp_path)
    repo = files.url().rstrip("/")
    chart = unvendored_chart(
        tmp_path / "src", "shop", "0.3.0", "greeter@~1.0.0", repo, "greeter:\n  audience: http\n"
    )
    archive = tar(chart, files.root / "archives" / "shop-0.3.0.tgz")
    url = files.url("archives/shop-0.3.0.tgz")
    ref = SourceRef(kind="http", uri=url, ref_field="url", ref=url)
    before = len(files.gets)
    with Resolver() as resolver:
        pin = resolver.resolve_bundles([helm_bundle("shop", ref)])[ref]
    assert files.gets[before:].count("/archives/shop-0.3.0.tgz") == 1  # hashed and read at once
    assert isinstance(pin, ChartPin) and pin.pin == sha256(archive)
    [dependency] = pin.dependencies
    assert (dependency.kind, dependency.chart, dependency.version, dependency.destination) == (
        "helm",
        "greeter",
        "1.0.0",
        "shop/charts",
    )
    sources = source_dicts(ref, pin)
    assert sources[0] == {"kind": "http", "uri": url, "sha256": sha256(archive)}
    assert sources[1]["kind"] == "helm" and sources[1]["destination"] == "shop/charts"
    objects = render(store, sources, tmp_path / "tree")
    assert (tmp_path / "tree" / "shop" / "charts" / "greeter" / "Chart.yaml").is_file()
    assert message(objects, "shop") == "v1.0.0, http!"

    # Pinned by the bundle: the same pin, and content that no longer matches is refused.
    pinned = SourceRef(kind="http", uri=url, ref_field="sha256", ref=sha256(archive))
    wrong = SourceRef(kind="http", uri=url, ref_field="sha256", ref="0" * 64)
    with Resolver() as resolver:
        assert resolver.resolve_bundles([helm_bundle("shop", pinned)])[pinned] == pin
    with Resolver() as resolver, pytest.raises(ResolveError) as refused:
        resolver.resolve_bundles([helm_bundle("shop", wrong)])
    assert refused.value.failures[0][2] == (
        f"content hashes to sha256 {sha256(archive)}, the bundle pins {'0' * 64}"
    )

    # A plain bundle of the same archive is only hashed.
    plain = Bundle(
        name="raw", file="bundles/raw.yaml", sources=(ref,), spec={}, targets=(), overrides=()
    )
    with Resolver() as resolver:
        assert resolver.resolve_bundles([plain])[ref] == sha256(archive)

    # A chart at the archive's root (no top directory): its dependencies go to charts/.
    flat = tar(chart, files.root / "archives" / "flat.tgz", top=False)
    flat_url = files.url("archives/flat.tgz")
    flat_ref = SourceRef(kind="http", uri=flat_url, ref_field="url", ref=flat_url)
    with Resolver() as resolver:
        flat_pin = resolver.resolve_bundles([helm_bundle("shop", flat_ref)])[flat_ref]
    assert isinstance(flat_pin, ChartPin) and flat_pin.pin == sha256(flat)
    assert [d.destination for d in flat_pin.dependencies] == ["charts"]
    objects = render(store, source_dicts(flat_ref, flat_pin), tmp_path / "flat-tree")
    assert message(objects, "shop") == "v1.0.0, http!"


def test_dependencies_of_an_oci_chart_are_pinned_by_the_hub(
    helm: HelmCli, files: StaticFiles, registry: Registry, store: ContentStore, tmp_path: Path
) -> None:
    """An OCI chart (Helm's media types) pushed without its dependency, by tag and by tag
    range: the hub reads the chart layer at the pinned digest and pins the dependency."""
    make_repository(helm, files, tmp_path)
    repo = files.url().rstrip("/")
    chart = unvendored_chart(
        tmp_path / "src", "shop", "0.4.0", "greeter@^1.0", repo, "greeter:\n  audience: oci\n"
    )
    digest = helm.push(
        tar(chart, tmp_path / "pkg" / "shop-0.4.0.tgz"), registry.host, namespace="apps"
    )
    uri = f"{registry.host}/apps/shop"
    by_tag = SourceRef(kind="image", uri=uri, ref_field="tag", ref="0.4.0")
    by_range = SourceRef(kind="image", uri=uri, ref_field="version", ref="0.x")
    by_digest = SourceRef(kind="image", uri=uri, ref_field="digest", ref=digest)
    with Resolver() as resolver:
        pins = resolver.resolve_bundles(
            [helm_bundle("a", by_tag), helm_bundle("b", by_range), helm_bundle("c", by_digest)]
        )
    for ref in (by_tag, by_range, by_digest):
        pin = pins[ref]
        assert isinstance(pin, ChartPin) and pin.pin == digest
        [dependency] = pin.dependencies
        assert (dependency.chart, dependency.version, dependency.destination) == (
            "greeter",
            "1.1.0",
            "shop/charts",
        )
    range_pin = pins[by_range]
    assert isinstance(range_pin, ChartPin) and (range_pin.version, range_pin.tag) == (
        "0.4.0",
        "0.4.0",
    )
    assert source_dicts(by_range, range_pin)[0]["uri"] == f"{uri}:0.4.0"
    sources = source_dicts(by_tag, pins[by_tag])
    assert sources[0] == {"kind": "image", "uri": uri, "digest": digest}
    objects = render(store, sources, tmp_path / "tree")
    assert message(objects, "shop") == "v1.1.0, oci!"

    # A plain bundle of the same image is pinned by its digest alone.
    plain = Bundle(
        name="raw", file="bundles/raw.yaml", sources=(by_tag,), spec={}, targets=(), overrides=()
    )
    with Resolver() as resolver:
        assert resolver.resolve_bundles([plain])[by_tag] == digest


def test_dependencies_of_an_oci_dependency_are_pinned_under_it(
    helm: HelmCli, files: StaticFiles, registry: Registry, store: ContentStore, tmp_path: Path
) -> None:
    """An http chart needs an OCI chart that itself needs a Helm repository chart, none
    vendored: each lands in its parent's charts/."""
    make_repository(helm, files, tmp_path)
    repo = files.url().rstrip("/")
    mid = unvendored_chart(
        tmp_path / "mid-src", "mid", "2.1.0", "greeter@~1.0", repo, "greeter:\n  audience: mid\n"
    )
    helm.push(tar(mid, tmp_path / "pkg" / "mid-2.1.0.tgz"), registry.host, namespace="nested")
    top = unvendored_chart(
        tmp_path / "top-src",
        "top",
        "1.0.0",
        "mid@^2",
        f"oci://{registry.host}/nested",
        "mid:\n  greeter:\n    audience: nested charts\n",
    )
    tar(top, files.root / "top-1.0.0.tgz")
    url = files.url("top-1.0.0.tgz")
    ref = SourceRef(kind="http", uri=url, ref_field="url", ref=url)
    with Resolver() as resolver:
        pin = resolver.resolve_bundles([helm_bundle("top", ref)])[ref]
    assert isinstance(pin, ChartPin)
    assert [(d.kind, d.chart, d.version, d.destination) for d in pin.dependencies] == [
        ("image", "mid", "2.1.0", "top/charts"),
        ("helm", "greeter", "1.0.0", "top/charts/mid/charts"),
    ]
    objects = render(store, source_dicts(ref, pin), tmp_path / "tree")
    assert (tmp_path / "tree" / "top" / "charts" / "mid" / "charts" / "greeter").is_dir()
    assert message(objects, "top") == "v1.0.0, nested charts!"


def test_a_dependency_that_cannot_be_pinned_is_refused_naming_chart_dependency_and_range(
    helm: HelmCli, files: StaticFiles, registry: Registry, tmp_path: Path
) -> None:
    make_repository(helm, files, tmp_path)
    repo = files.url().rstrip("/")
    helm.push(
        helm.package(copy_chart("greeter", tmp_path / "g"), tmp_path / "g-pkg"),
        registry.host,
        namespace="bad-deps",
    )
    down = f"http://127.0.0.1:{free_port()}/charts"
    cases = {
        "no-version": ("greeter@^9", repo),
        "no-tag": ("greeter@^9", f"oci://{registry.host}/bad-deps"),
        "no-repository": ("greeter@^1", "stable/greeter"),
        "alias": ("greeter@^1", "alias:stable"),
        "unreachable": ("greeter@~1.0", down),
    }
    refs = {}
    for name, (dependency, repository) in cases.items():
        chart = unvendored_chart(tmp_path / name, "shop", "0.1.0", dependency, repository, "")
        tar(chart, files.root / f"{name}.tgz")
        url = files.url(f"{name}.tgz")
        refs[name] = SourceRef(kind="http", uri=url, ref_field="url", ref=url)
    settings = ResolveSettings(attempts=1, backoff=0.0, timeout=5.0)
    with Resolver(settings=settings) as resolver, pytest.raises(ResolveError) as refused:
        resolver.resolve_bundles([helm_bundle(name, ref) for name, ref in refs.items()])
    problems = {bundle: problem for bundle, _, problem in refused.value.failures}
    assert problems["no-version"].startswith(
        f"chart shop: dependency greeter version '^9' from {repo!r}: "
        "no version of greeter in the range '^9' (newest: "
    )
    assert problems["no-tag"] == (
        f"chart shop: dependency greeter version '^9' from 'oci://{registry.host}/bad-deps': "
        "no tag in the range '^9' (tags: 1.0.0)"
    )
    assert problems["no-repository"] == (
        "chart shop: dependency greeter version '^1' from 'stable/greeter': not vendored in "
        "charts/, and only http(s):// and oci:// repositories can be pinned (file:// ones are "
        "charts in the same tree)"
    )
    assert problems["alias"] == (
        "chart shop: dependency greeter version '^1' from 'alias:stable': the repository names "
        "one of a local helm repositories.yaml, which fleetlet never reads: use the repository's "
        "full URL (https://... or oci://...)"
    )
    # The unreachable repository is reported once the missing ones are fixed (a retry may help).
    del refs["no-version"], refs["no-tag"], refs["no-repository"], refs["alias"]
    with Resolver(settings=settings) as resolver, pytest.raises(SourceUnavailableError) as gone:
        resolver.resolve_bundles([helm_bundle(name, ref) for name, ref in refs.items()])
    [(bundle_name, reference, problem)] = gone.value.failures
    assert (bundle_name, reference) == ("unreachable", f"http {files.url('unreachable.tgz')}")
    assert problem.startswith(
        f"chart shop: dependency greeter version '~1.0' from {down!r}: unreachable after 1 "
        "attempts ("
    )


def test_a_chart_pinned_in_the_fleet_publishes_without_its_server(
    helm: HelmCli, registry: Registry, tmp_path: Path
) -> None:
    """Reading a pinned chart for its dependencies is best effort: with its server down (one
    attempt) or without the content, the pin is kept as written, as a fleet of pins always
    published offline and the agent reports what it cannot fetch; an image that is not a Helm
    chart is kept as is too."""
    down = f"127.0.0.1:{free_port()}"
    http_pin = SourceRef(
        kind="http", uri=f"http://{down}/shop.tgz", ref_field="sha256", ref="a" * 64
    )
    image_pin = SourceRef(
        kind="image", uri=f"{down}/apps/shop", ref_field="digest", ref="sha256:" + "b" * 64
    )
    # A fleetlet bundle artifact (its own media types) holding a chart directory.
    plain = copy_chart("greeter", tmp_path / "plain")
    push_bundle(OciClient(host=registry.host), "apps/not-a-chart", plain.parent, tag="1")
    not_chart = SourceRef(
        kind="image", uri=f"{registry.host}/apps/not-a-chart", ref_field="tag", ref="1"
    )
    absent = SourceRef(
        kind="image",
        uri=f"{registry.host}/apps/absent",
        ref_field="digest",
        ref="sha256:" + "c" * 64,
    )
    with Resolver() as resolver:
        pins = resolver.resolve_bundles(
            [
                helm_bundle("a", http_pin),
                helm_bundle("b", image_pin),
                helm_bundle("c", not_chart),
                helm_bundle("d", absent),
            ]
        )
        assert resolver.requests["http"] == 1  # no retries for a best-effort read
    assert pins[http_pin] == "a" * 64
    assert pins[image_pin] == "sha256:" + "b" * 64
    assert pins[absent] == "sha256:" + "c" * 64
    assert isinstance(pins[not_chart], str) and pins[not_chart].startswith("sha256:")


def test_hub_diff_renders_a_helm_bundle_with_its_pinned_dependencies(
    helm: HelmCli, files: StaticFiles, tmp_path: Path
) -> None:
    """`hub diff --cluster` renders set entries with the agent's formats: a helm bundle whose
    dependency the hub pinned renders there too (with Helm's default capabilities: the hub
    does not know the cluster's)."""
    from agent.api import BundleDeploymentEntry
    from agent.render.tools import ToolSettings
    from hub.preview import BundleRenderer

    make_repository(helm, files, tmp_path)
    chart = unvendored_chart(
        tmp_path / "src",
        "shop",
        "0.3.0",
        "greeter@^1.0",
        files.url().rstrip("/"),
        "greeter:\n  audience: reviewers\n",
    )
    tar(chart, files.root / "shop.tgz")
    url = files.url("shop.tgz")
    ref = SourceRef(kind="http", uri=url, ref_field="url", ref=url)
    with Resolver() as resolver:
        pin = resolver.resolve_bundles([helm_bundle("shop", ref)])[ref]
    entry = from_dict(
        BundleDeploymentEntry,
        {"name": "shop", "spec": {"format": "helm", "sources": source_dicts(ref, pin)}},
    )
    renderer = BundleRenderer(
        cache_dir=tmp_path / "preview", tools=ToolSettings.from_env(), plain_http=True
    )
    objects = renderer.render([entry], serial=1)["shop"]
    assert message(objects, "shop") == "v1.1.0, reviewers!"


def test_a_file_dependency_in_the_same_git_tree_publishes_with_nothing_to_pin(
    git_daemon: GitDaemon, store: ContentStore, tmp_path: Path
) -> None:
    """`file://../lib/common`: the hub accepts it (the chart is in the signed tree, nothing to
    pin) and the agent places it from the tree at render."""
    work = tmp_path / "filedep"
    shutil.copytree(ASSETS / "filedep", work / "deploy")
    commit = push_work_tree(git_daemon, "filedep.git", work)
    ref = SourceRef(
        kind="git",
        uri=git_daemon.url_for("filedep.git"),
        ref_field="branch",
        ref="main",
        extra=(("directory", "deploy"),),
    )
    with Resolver() as resolver:
        pin = resolver.resolve_bundles([helm_bundle("app", ref)])[ref]
    assert pin == commit  # the bare commit: no extra source to pin
    objects = render(store, source_dicts(ref, pin), tmp_path / "tree")
    data = {o["metadata"]["name"]: o["data"] for o in objects}
    assert data == {"app-common": {"colour": "blue"}, "app-app": {"chart": "app"}}
