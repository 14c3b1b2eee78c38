"""What the hub reads from a chart archive to pin its dependencies (:mod:`hub.resolve.charts`):
pure logic over archives written here, no server needed."""

from __future__ import annotations

import io
import tarfile
from pathlib import Path

import pytest

from hub.resolve.charts import ChartError, chart_in_archive, missing_dependencies, read_archive

UMBRELLA = (
    "apiVersion: v2\nname: shop\nversion: 1.0.0\ndependencies:\n"
    "  - {name: alpha, version: ^1, repository: https://charts.example}\n"
    "  - {name: beta, version: ^2, repository: https://charts.example}\n"
    "  - {name: gamma, version: ^3, repository: oci://registry.example/charts}\n"
)


def archive(path: Path, files: dict[str, str | bytes]) -> Path:
    with tarfile.open(path, "w:gz") as out:
        for name, content in files.items():
            data = content.encode() if isinstance(content, str) else content
            info = tarfile.TarInfo(name)
            info.size = len(data)
            out.addfile(info, io.BytesIO(data))
    return path


def test_vendored_subcharts_by_directory_or_archive_are_not_missing(tmp_path: Path) -> None:
    files: dict[str, str | bytes] = {
        "shop/Chart.yaml": UMBRELLA,
        # A subchart directory counts by its directory name and by the name in its Chart.yaml.
        "shop/charts/first/Chart.yaml": "apiVersion: v2\nname: alpha\nversion: 1.0.0\n",
        "shop/charts/beta-2.0.1.tgz": b"an archive, named as helm names them",
        "shop/templates/cm.yaml": "kind: ConfigMap\n",
    }
    chart = read_archive(archive(tmp_path / "shop.tgz", files))
    assert chart.top == "shop" and chart.vendored >= {"alpha", "beta"}
    assert [d["name"] for d in missing_dependencies(chart)] == ["gamma"]


def test_a_v1_chart_lists_its_dependencies_in_requirements_yaml(tmp_path: Path) -> None:
    files: dict[str, str | bytes] = {
        "old/Chart.yaml": "apiVersion: v1\nname: old\nversion: 0.1.0\n",
        "old/requirements.yaml": "dependencies:\n  - {name: redis, version: ~1, repository: "
        "https://charts.example}\n",
    }
    chart = read_archive(archive(tmp_path / "old.tgz", files))
    assert [d["name"] for d in missing_dependencies(chart)] == ["redis"]


def test_the_chart_is_found_where_the_helm_format_finds_it(tmp_path: Path) -> None:
    at_root = chart_in_archive(archive(tmp_path / "root.tgz", {"Chart.yaml": UMBRELLA}))
    assert at_root is not None and at_root.top == ""
    one_down = chart_in_archive(
        archive(tmp_path / "down.tgz", {"shop/Chart.yaml": UMBRELLA, "README.md": "hi"})
    )
    assert one_down is not None and one_down.top == "shop"
    two = archive(tmp_path / "two.tgz", {"a/Chart.yaml": UMBRELLA, "b/Chart.yaml": UMBRELLA})
    assert chart_in_archive(two) is None
    assert chart_in_archive(archive(tmp_path / "none.tgz", {"x/cm.yaml": "kind: A\n"})) is None
    (tmp_path / "not.tgz").write_bytes(b"not an archive at all")
    assert chart_in_archive(tmp_path / "not.tgz") is None
    # A Helm repository's archive is one directory; anything else is refused, named.
    with pytest.raises(ChartError, match="holds one directory, this one holds 2: a, b"):
        read_archive(two)
    with pytest.raises(ChartError, match=r"shop/Chart\.yaml has no chart name"):
        chart_in_archive(archive(tmp_path / "bad.tgz", {"shop/Chart.yaml": "version: 1\n"}))
