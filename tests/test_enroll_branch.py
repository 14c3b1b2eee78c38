"""Enrollment into a protected fleet repository (issue 30, ``config.yaml`` ``commit: branch``),
end to end on the real git server: ``hub clusters accept`` pushes a branch ``enroll/<cluster>``
with the inventory change, based on the fleet branch's head; the fleet branch, the hub's
checkout and its publication stay as they were, and the request shows "accepted (pending
merge of enroll/<cluster>)" in the API and the CLI. Once the operator merges the branch and
the hub's checkout has the merge, the request is plainly accepted and the next publication
gives the cluster its branch.
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import yaml
from playwright.sync_api import expect

from hub.publish.flow import prepare, publish
from hub.publish.git import BranchStore
from hub.publish.sign import PublicationSigner
from tests.fleetlab import Lab
from tests.realenv.hubserver import serving_hub
from tests.test_dashboard import Tab
from tests.test_dashboard import browser as browser  # the fixtures: a real browser
from tests.test_dashboard import tab as tab
from tests.test_enroll import READ, Hub, fleetlet, request_body


def git(where: Path, *args: str) -> str:
    done = subprocess.run(
        ["git", "-C", str(where), "-c", "user.name=operator", "-c", "user.email=op@example.test",
         *args],
        capture_output=True, text=True, timeout=120, check=False,
    )  # fmt: skip
    assert done.returncode == 0, f"git {' '.join(args)}: {done.stderr}"
    return done.stdout


def heads(url: str) -> dict[str, str]:
    listed = subprocess.run(
        ["git", "ls-remote", "--heads", url], capture_output=True, text=True, check=True
    ).stdout
    return {ref: sha for sha, ref in (line.split("\t") for line in listed.splitlines())}


def test_acceptance_onto_a_branch_waits_for_the_operators_merge_then_publishes(
    lab: Lab, tab: Tab, tmp_path: Path
) -> None:
    made = Hub(lab, tmp_path / "hub")
    lab.git.create_bare("fleet-source.git")
    origin = lab.git.url_for("fleet-source.git")
    git(made.fleet, "init", "-q", "--initial-branch=main")
    git(made.fleet, "add", "-A")
    git(made.fleet, "commit", "-q", "-m", "the fleet")
    git(made.fleet, "remote", "add", "origin", origin)
    git(made.fleet, "push", "-q", "origin", "main")
    main = git(made.fleet, "rev-parse", "HEAD").strip()
    config = yaml.safe_load((made.dir / "config.yaml").read_text())
    config |= {"commit": "branch", "pushRemote": "origin"}
    (made.dir / "config.yaml").write_text(yaml.safe_dump(config))
    token = made.token(
        "shops", "--approve", "manual", "--max-clusters", "0", "--labels", "tier=edge"
    )
    signer = PublicationSigner.from_trust_config(
        trust_config=lab.sigstore.trust_config_path, token=lab.sigstore.mint_token()
    )

    def publish_fleet() -> None:
        with BranchStore(url=lab.url, cache_dir=tmp_path / "hub-cache") as store:
            publish(prepare(made.fleet), store, signer=signer)

    work = tmp_path / "serve"
    work.mkdir()
    extra = ["--tokens", str(made.api_tokens), "--enroll", str(made.dir)]
    with serving_hub(lab.status_url, work, extra) as url:
        made.url = url
        admin = ["--hub", url, "--token-file", str(made.admin_file)]
        assert made.enroll(request_body("shop-z"), token.read_text()).json()["state"] == "pending"
        accepted = fleetlet("hub", "clusters", "accept", "shop-z", *admin).stdout
        assert accepted == "cluster shop-z accepted (pending merge of enroll/shop-z)\n"

        # The branch holds the one change, on the fleet branch's head; main is untouched.
        branches = heads(origin)
        assert set(branches) == {"refs/heads/main", "refs/heads/enroll/shop-z"}
        assert branches["refs/heads/main"] == main
        git(made.fleet, "fetch", "-q", "origin")
        assert git(made.fleet, "rev-parse", "origin/enroll/shop-z^").strip() == main
        changed = git(made.fleet, "diff", "--name-only", main, "origin/enroll/shop-z").split()
        assert changed == ["clusters/enrolled.yaml"]
        inventory = yaml.safe_load(
            git(made.fleet, "show", "origin/enroll/shop-z:clusters/enrolled.yaml")
        )
        assert inventory["clusters"] == [{"name": "shop-z", "labels": {"tier": "edge"}}]
        assert git(made.fleet, "rev-parse", "HEAD").strip() == main
        assert git(made.fleet, "status", "--porcelain") == ""
        assert made.inventory() == {}

        listed = json.loads(fleetlet("hub", "clusters", "list", *admin, "-o", "json").stdout)
        (request,) = listed["items"]
        assert (request["state"], request["inventoryBranch"], request["pendingMerge"]) == (
            "accepted", "enroll/shop-z", True,
        )  # fmt: skip
        table = fleetlet("hub", "clusters", "list", *admin).stdout.splitlines()
        assert table[1].split()[:6] == [
            "shop-z", "accepted", "(pending", "merge", "of", "enroll/shop-z)",
        ]  # fmt: skip
        tab.page.goto(f"{url}/ui/enrollments#token={READ}")
        row = tab.page.locator("#enrollments tbody tr").filter(has_text="shop-z")
        expect(row.locator("[data-state]")).to_have_text("accepted (pending merge)")
        expect(row).to_contain_text("merge branch enroll/shop-z")

        # Published before the merge: the cluster gets nothing yet.
        publish_fleet()
        assert "refs/heads/fleetlet/clusters/shop-z" not in heads(lab.url)
        assert "refs/heads/fleetlet/clusters/edge-1" in heads(lab.url)

        # The operator merges (here in a clone of their own, as a pull request would) ...
        clone = tmp_path / "operator"
        subprocess.run(["git", "clone", "-q", origin, str(clone)], check=True)
        git(clone, "merge", "-q", "--no-ff", "-m", "Merge enroll/shop-z", "origin/enroll/shop-z")
        git(clone, "push", "-q", "origin", "main")
        # ... and the hub's checkout takes the merge.
        git(made.fleet, "pull", "-q", "--ff-only", "origin", "main")
        assert made.inventory() == {"shop-z": {"tier": "edge"}}
        listed = json.loads(fleetlet("hub", "clusters", "list", *admin, "-o", "json").stdout)
        (request,) = listed["items"]
        assert (request["state"], request["pendingMerge"]) == ("accepted", False)
        tab.page.reload()
        expect(row.locator("[data-state]")).to_have_text("accepted")

        # The next publication gives the cluster its branch.
        publish_fleet()
        assert "refs/heads/fleetlet/clusters/shop-z" in heads(lab.url)


def test_a_bad_commit_setting_is_refused_naming_the_field(lab: Lab, tmp_path: Path) -> None:
    from hub.api.tokens import HubConfigError
    from hub.enroll.service import Enrollment

    made = Hub(lab, tmp_path / "hub")
    config = yaml.safe_load((made.dir / "config.yaml").read_text())
    for bad, said in (
        ({"commit": "pr"}, "commit is true, false or branch, got 'pr'"),
        ({"commit": "branch", "pushRemote": 7}, "pushRemote is a non-empty string"),
    ):
        (made.dir / "config.yaml").write_text(yaml.safe_dump(config | bad))
        try:
            Enrollment(made.dir)
        except HubConfigError as exc:
            assert str(exc) == f"enrollment config {made.dir / 'config.yaml'}: {said}"
        else:
            raise AssertionError(f"{bad} was taken")
