"""``fleetlet hub diff --base REV --head REV`` as a pull-request check: the GitHub Actions and
GitLab CI jobs of docs/operations.md run as written (all but the installation step) against a
local fleet repository, content in a real registry, and a local receiver standing in for the
GitHub and GitLab APIs records the comment each job posts."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import threading
import urllib.parse
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.fleetlab import Lab, configmap
from tests.test_hub_fleet import write_fleet

REPO_ROOT = Path(__file__).resolve().parent.parent
DOCS = REPO_ROOT / "docs" / "operations.md"
SECTION = "## A pull request's diff as a check"
CLUSTERS = [
    {"name": "edge-1", "labels": {"tier": "canary"}},
    {"name": "edge-2", "labels": {"tier": "production"}},
    {"name": "edge-3", "labels": {"tier": "production"}},
    {"name": "edge-4", "labels": {"tier": "production"}},
]


def cluster_role(verbs: list[str], resources: list[str]) -> str:
    return yaml.safe_dump(
        {
            "apiVersion": "rbac.authorization.k8s.io/v1",
            "kind": "ClusterRole",
            "metadata": {"name": "ops-reader"},
            "rules": [{"apiGroups": [""], "resources": resources, "verbs": verbs}],
        }
    )


def bundles(lab: Lab, version: int) -> list[dict[str, Any]]:
    """v1: ops grants get/list on pods; v2 widens it to everything and pauses web on edge-1."""
    role = cluster_role(["get", "list"], ["pods"]) if version == 1 else cluster_role(["*"], ["*"])
    ops = lab.push("ops", {"role.yaml": role}, tag=f"v{version}")
    web = lab.push("web", {"c.yaml": configmap("settings", "default", {"a": "1"})}, tag="v1")
    return [
        {
            "name": "ops",
            "sources": [lab.source("ops", ops)],
            "approval": "manual",
            "rollout": {
                "waves": [
                    {"name": "canary", "clusterSelector": {"matchLabels": {"tier": "canary"}}},
                    {"name": "rest", "pauseBefore": True},
                ]
            },
            "targets": [{"clusterSelector": {}}],
        },
        {
            "name": "web",
            "sources": [lab.source("web", web)],
            "targets": [{"clusterSelector": {}}],
            **({"overrides": [{"clusters": ["edge-1"], "paused": True}]} if version == 2 else {}),
        },
    ]


def git(repo: Path, *args: str) -> str:
    done = subprocess.run(
        ["git", "-C", str(repo), "-c", "user.name=t", "-c", "user.email=t@example.com", *args],
        capture_output=True, text=True, check=True, timeout=60,
    )  # fmt: skip
    return done.stdout.strip()


@pytest.fixture
def fleet_repo(lab: Lab, tmp_path: Path) -> tuple[Path, str, str]:
    """A fleet repository at its merge request: (checkout, base commit, head commit)."""
    repo = tmp_path / "fleet"
    repo.mkdir()
    git(repo, "init", "-q", "-b", "main")
    write_fleet(repo, clusters=CLUSTERS, bundles=bundles(lab, 1))
    git(repo, "add", "-A")
    git(repo, "commit", "-q", "-m", "ops: read pods")
    base = git(repo, "rev-parse", "HEAD")
    git(repo, "checkout", "-q", "-b", "widen")
    write_fleet(repo, clusters=CLUSTERS, bundles=bundles(lab, 2))
    git(repo, "commit", "-q", "-am", "ops: everything; web paused on edge-1")
    return repo, base, git(repo, "rev-parse", "HEAD")


class Receiver:
    """An HTTP server on loopback that answers 201 and records every request."""

    def __init__(self) -> None:
        self.requests: list[dict[str, Any]] = []
        owner = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
                owner.requests.append(
                    {"path": self.path, "headers": dict(self.headers), "body": body}
                )
                self.send_response(201)
                self.send_header("Content-Type", "application/json")
                self.end_headers()
                self.wfile.write(b"{}")

            def log_message(self, *_args: Any) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def receiver() -> Iterator[Receiver]:
    found = Receiver()
    yield found
    found.close()


def documented_jobs() -> tuple[dict[str, Any], dict[str, Any]]:
    """The GitHub workflow and the GitLab job of the docs' section, parsed."""
    text = DOCS.read_text()
    section = text.split(SECTION, 1)[1].split("\n## ", 1)[0]
    github, gitlab = (yaml.safe_load(b) for b in re.findall(r"```yaml\n(.*?)```", section, re.S))
    return github, gitlab


def shell_env(tmp_path: Path, **more: str) -> dict[str, str]:
    """The CI job's environment: ``fleetlet`` on PATH runs this checkout's code."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir(exist_ok=True)
    shim = bin_dir / "fleetlet"
    shim.write_text(f'#!/bin/sh\nexec "{sys.executable}" -m fleetlet "$@"\n')
    shim.chmod(0o755)
    return {
        "PATH": f"{bin_dir}:{os.environ['PATH']}",
        "HOME": str(tmp_path),
        "XDG_CACHE_HOME": str(tmp_path / "xdg-cache"),
        "PYTHONPATH": str(REPO_ROOT),
        **more,
    }


def run_script(script: str, cwd: Path, env: dict[str, str]) -> None:
    done = subprocess.run(
        ["bash", "--noprofile", "--norc", "-eo", "pipefail", "-c", script],
        cwd=cwd, env=env, capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert done.returncode == 0, f"{script}\n{done.stdout}\n{done.stderr}"


def check_comment(markdown: str) -> None:
    """What a reviewer reads: the widened ClusterRole, the clusters, the waves, the approval."""
    assert "`ops` (group `ops`): 4 clusters" in markdown
    assert "**changed** on 4 clusters: `edge-1`, `edge-2`, `edge-3`, `edge-4`" in markdown
    assert "1 created, 1 changed, 0 deleted" not in markdown  # ops: the role only changes
    assert "0 created, 1 changed, 0 deleted, 0 unchanged" in markdown
    assert "**RBAC**: ClusterRole ops-reader (changed): cluster-wide" in markdown
    assert "canary (1) → rest (3, after a promote)" in markdown
    assert "**Needs approval** on 4 clusters" in markdown
    # web changes on edge-1 only: one entry of its own, published at once.
    assert "`web` (group `web`): 1 cluster" in markdown
    assert "**changed** on 1 cluster: `edge-1`" in markdown
    assert "- `paused`: `(unset)` → `true`" in markdown


def test_the_documented_github_job_posts_the_diff_on_the_pull_request(
    fleet_repo: tuple[Path, str, str], receiver: Receiver, tmp_path: Path
) -> None:
    repo, base, head = fleet_repo
    github, _ = documented_jobs()
    expressions = {
        "github.event.pull_request.base.sha": base,
        "github.event.pull_request.head.sha": head,
        "github.event.pull_request.number": "7",
        "secrets.GITHUB_TOKEN": "gh-test-token",
    }
    env = shell_env(
        tmp_path, GITHUB_API_URL=receiver.url, GITHUB_REPOSITORY="example/fleet"
    )  # GitHub's default variables
    ran = 0
    for step in github["jobs"]["diff"]["steps"]:
        if "run" not in step or "working-directory" in step:  # the installation
            continue
        step_env = {
            k: re.sub(r"\$\{\{\s*(.*?)\s*\}\}", lambda m: expressions[m.group(1)], str(v))
            for k, v in step.get("env", {}).items()
        }
        run_script(step["run"], repo, {**env, **step_env})
        ran += 1
    assert ran == 2
    (posted,) = receiver.requests
    assert posted["path"] == "/repos/example/fleet/issues/7/comments"
    assert posted["headers"]["Authorization"] == "Bearer gh-test-token"
    comment = json.loads(posted["body"])["body"]
    check_comment(comment)
    assert (
        f"`{base[:12]}` → `{head[:12]}` · 4 clusters in the fleet, **4 clusters change** · "
        in comment
    )


def test_the_documented_gitlab_job_posts_the_diff_on_the_merge_request(
    fleet_repo: tuple[Path, str, str], receiver: Receiver, tmp_path: Path
) -> None:
    repo, base, head = fleet_repo
    _, gitlab = documented_jobs()
    job = gitlab["fleet-diff"]
    env = shell_env(
        tmp_path,
        CI_MERGE_REQUEST_DIFF_BASE_SHA=base,
        CI_COMMIT_SHA=head,
        CI_API_V4_URL=f"{receiver.url}/api/v4",
        CI_PROJECT_ID="42",
        CI_MERGE_REQUEST_IID="7",
        FLEET_DIFF_TOKEN="gl-test-token",
        **{k: str(v) for k, v in job.get("variables", {}).items()},
    )
    script = [line for line in job["script"] if not line.startswith("pip install")]
    assert len(script) == 2
    run_script("\n".join(script), repo, env)
    (posted,) = receiver.requests
    assert posted["path"] == "/api/v4/projects/42/merge_requests/7/notes"
    assert posted["headers"]["PRIVATE-TOKEN"] == "gl-test-token"
    (comment,) = urllib.parse.parse_qs(posted["body"].decode())["body"]
    check_comment(comment)


def test_json_names_every_cluster_and_a_bad_revision_is_one_line(
    fleet_repo: tuple[Path, str, str], tmp_path: Path
) -> None:
    repo, base, head = fleet_repo
    env = shell_env(tmp_path)

    def diff(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [sys.executable, "-m", "fleetlet", "hub", "diff", str(repo), "-q", *args],
            capture_output=True, text=True, timeout=300, env=env, cwd=REPO_ROOT,
        )  # fmt: skip

    done = diff("--base", "main", "--head", "widen", "-o", "json")
    assert done.returncode == 0, done.stderr
    data = json.loads(done.stdout)
    assert (data["base"]["commit"], data["head"]["commit"]) == (base, head)
    assert data["clusters"] == {"total": 4, "changed": 4}
    ops, web = data["bundles"]
    assert (ops["bundle"], ops["clusters"], ops["needApproval"]) == ("ops", 4, 4)
    (change,) = ops["changes"]
    assert change["names"] == ["edge-1", "edge-2", "edge-3", "edge-4"]
    assert change["renderedFor"] == "edge-1"
    (finding,) = change["preview"]["security"]["rbac"]
    assert finding["object"] == "ClusterRole ops-reader" and finding["action"] == "changed"
    assert [w["clusters"] for w in ops["rollout"]["waves"]] == [1, 3]
    assert (web["clusters"], web["rollout"]) == (1, None)

    # The same revision on both sides: nothing changes.
    same = diff("--base", "widen", "--head", head, "-o", "markdown")
    assert same.returncode == 0, same.stderr
    assert "No cluster receives anything new." in same.stdout

    bad = diff("--base", "no-such-branch", "--head", "widen", "-o", "markdown")
    assert bad.returncode == 1
    assert (
        bad.stderr.strip()
        .splitlines()[-1]
        .startswith("fleetlet: --base no-such-branch: not a commit of")
    )
    alone = diff("--base", "main")
    assert alone.returncode == 1 and "--base and --head go together" in alone.stderr


def pinned_bundle(replicas: int, *, eu: int | None = None) -> dict[str, Any]:
    """A bundle whose source is pinned (nothing to resolve), with a per-region override."""
    return {
        "name": "api",
        "sources": [{"kind": "image", "uri": "127.0.0.1:9/fleet/api", "digest": "sha256:" + "ab" * 32}],
        "format": "helm",
        "formatOptions": {"values": {"replicas": replicas}},
        "targets": [{"clusterSelector": {}}],
        **({"overrides": [{"clusterSelector": {"matchLabels": {"region": "eu"}}, "values": {"replicas": eu}}]} if eu else {}),
    }  # fmt: skip


def test_a_fleet_in_a_subdirectory_groups_identical_changes_and_refuses_links_out(
    tmp_path: Path,
) -> None:
    repo = tmp_path / "ops"
    repo.mkdir()
    git(repo, "init", "-q", "-b", "main")
    clusters = [
        {"name": f"c-{i}", "labels": {"region": "eu" if i < 3 else "us"}} for i in range(10)
    ]
    fleet = repo / "fleets" / "prod"
    write_fleet(fleet, clusters=clusters, bundles=[pinned_bundle(2)])
    git(repo, "add", "-A")
    git(repo, "commit", "-q", "-m", "api: 2 replicas")
    write_fleet(fleet, clusters=clusters, bundles=[pinned_bundle(3, eu=5)])
    git(repo, "commit", "-q", "-am", "api: 3 replicas, 5 in eu")

    def diff(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [sys.executable, "-m", "fleetlet", "hub", "diff", str(fleet), "-q", "--no-preview",
             *args],
            capture_output=True, text=True, timeout=300, cwd=REPO_ROOT,
        )  # fmt: skip

    done = diff("--base", "HEAD~1", "--head", "HEAD", "-o", "json")
    assert done.returncode == 0, done.stderr
    (api,) = json.loads(done.stdout)["bundles"]
    changes = {
        tuple((f["path"], f["before"], f["after"]) for f in c["fields"]): c["names"]
        for c in api["changes"]
    }
    assert changes == {
        (("formatOptions.values.replicas", 2, 5),): ["c-0", "c-1", "c-2"],
        (("formatOptions.values.replicas", 2, 3),): [f"c-{i}" for i in range(3, 10)],
    }
    assert all("preview" not in c for c in api["changes"])  # --no-preview: nothing fetched

    # A pull request whose fleet links to a file outside the fleet directory.
    (tmp_path / "secret.txt").write_text("clusters: [{name: leaked}]\n")
    (fleet / "clusters" / "more.yaml").symlink_to("../../../../secret.txt")
    git(repo, "add", "-A")
    git(repo, "commit", "-q", "-m", "a link out")
    refused = diff("--base", "HEAD~1", "--head", "HEAD")
    assert refused.returncode == 1
    assert refused.stderr.strip() == (
        f"fleetlet: clusters/more.yaml in commit {git(repo, 'rev-parse', 'HEAD')[:12]}: a link "
        "to '../../../../secret.txt', outside the fleet directory (refused: a pull request's "
        "links stay inside it)"
    )


def test_the_demo_fleets_pull_request_promoting_shop_backend(
    registry_factory: Any, tmp_path: Path
) -> None:
    """fleet-examples/ as a fleet repository whose pull request moves shop-backend to v2 (the
    content ``fleetlet demo --scenario failed-upgrade`` uses): the documented command's
    comment names the three stores, the new ConfigMap and the changed image."""
    from fleetlet.demo import CONTENT, EXAMPLES, PINNED_HOST, REPOSITORY_PREFIX
    from tests.realenv.oci import OciClient, push_bundle

    registry = registry_factory()
    client = OciClient(host=registry.host)
    digests = {
        (d.name, v.name): push_bundle(client, REPOSITORY_PREFIX + d.name, v, tag=v.name).digest
        for d in sorted(CONTENT.iterdir())
        if d.is_dir()
        for v in sorted(d.iterdir())
        if v.is_dir()
    }
    repo = tmp_path / "retail"
    shutil.copytree(EXAMPLES, repo, ignore=shutil.ignore_patterns("content"))
    for path in (repo / "bundles").glob("*.yaml"):
        path.write_text(path.read_text().replace(PINNED_HOST, registry.host))
    git(repo, "init", "-q", "-b", "main")
    git(repo, "add", "-A")
    git(repo, "commit", "-q", "-m", "the example fleet")
    git(repo, "checkout", "-q", "-b", "shop-backend-v2")
    backend = repo / "bundles" / "shop-backend.yaml"
    v1, v2 = digests[("shop-backend", "v1")], digests[("shop-backend", "v2")]
    assert v1 in backend.read_text()
    backend.write_text(backend.read_text().replace(v1, v2))
    git(repo, "commit", "-q", "-am", "shop-backend: v2")

    _, gitlab = documented_jobs()
    (command,) = [line for line in gitlab["fleet-diff"]["script"] if "hub diff" in line]
    env = shell_env(tmp_path, CI_MERGE_REQUEST_DIFF_BASE_SHA="main", CI_COMMIT_SHA="HEAD")
    run_script(command, repo, env)
    comment = (repo / "fleet-diff.md").read_text()
    assert "| `shop-backend` | 3 | 1 | 1 / 3 / 0 | none | at once (no rollout) | — |" in comment
    assert "**changed** on 3 clusters: `store-eu-1`, `store-eu-2`, `store-us-1`" in comment
    assert f"- `sources[0].digest`: `{v1}` → `{v2}`" in comment
    assert "  - created ConfigMap shop/search-index" in comment
    assert (
        "  - changed Deployment shop/catalog-api: spec.template.spec.containers[0].image" in comment
    )
    assert "+        image: registry.example.com/retail/catalog-api:broken" in comment
    # The Promotion's kind comes from platform-crds, of the group shop depends on: namespaced.
    assert "  - changed Promotion shop/weekend-sale: spec.discountPercent" in comment
