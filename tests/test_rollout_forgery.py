"""Issue 28 item 4: rollout state an agent's credential pushes is refused by the hub.

In a single-repository setup, a cluster's status credential can push any ref of the repository,
``refs/fleetlet/rollouts`` included. The attacker here holds that credential (the smart-HTTP git
server's user), reads the hub's state, marks a held cluster ``releasing`` with a variant of
its choosing (its own image digest) and pushes it, as ``git`` would. The hub's step must refuse
the state, say why, and publish nothing: no cluster branch moves, none carries the attacker's
digest. A replay of an older state the hub itself wrote is refused as well.
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path
from typing import Any

import pygit2
import pytest

from agent.api import BundleDeploymentEntry, from_dict
from agent.verify.publication import SET_FILE
from hub.fleet.load import load_fleet
from hub.publish.flow import prepare
from hub.publish.git import BranchStore
from hub.publish.shards import ShardedStore
from hub.publish.sign import PublicationSigner
from hub.rollout.content import variant_from_bytes, variant_of
from hub.rollout.controller import Controller
from hub.rollout.seal import KEY_ENV
from hub.rollout.state import ROLLOUT_REF, ForgedRolloutStateError, variant_file
from tests.realenv.git_fixtures import GIT_PASSWORD, GIT_USER
from tests.realenv.sigstore import MiniSigstore
from tests.rolloutsim import digest_of, inventory, web_bundle
from tests.test_hub_fleet import write_fleet
from tests.test_rollout_fleet import settings

V1, V2, EVIL = digest_of(1), digest_of(2), digest_of(0xEE)
STRATEGY = {
    "waves": [
        {"name": "canary", "clusterSelector": {"matchLabels": {"tier": "canary"}}},
        {"name": "rest", "size": "100%", "pauseBefore": True},
    ],
}


class Attacker:
    """Someone holding a cluster's status credential for the fleet's only repository."""

    def __init__(self, url: str, workdir: Path) -> None:
        self.url = url.replace("://", f"://{GIT_USER}:{GIT_PASSWORD}@", 1)
        self.repo = pygit2.init_repository(str(workdir), bare=True)

    def git(self, *args: str) -> str:
        done = subprocess.run(["git", "--git-dir", self.repo.path, *args],
                              capture_output=True, text=True, timeout=60)  # fmt: skip
        assert done.returncode == 0, done.stderr
        return done.stdout

    def state(self) -> pygit2.Commit:
        self.git("fetch", "--quiet", self.url, f"+{ROLLOUT_REF}:{ROLLOUT_REF}")
        return self.repo.revparse_single(ROLLOUT_REF).peel(pygit2.Commit)

    def push(self, oid: str) -> None:
        self.git("push", "--quiet", "--force", self.url, f"{oid}:{ROLLOUT_REF}")

    def forge(self, *, copy_seal: bool) -> str:
        """The hub's state with a held cluster releasing the attacker's variant."""
        head = self.state()
        files = {e.name: self.repo[e.id].data for e in head.tree}
        (name,) = [n for n in files if n.startswith("rollout-")]
        rollout = json.loads(files[name])
        held = next(n for n, row in rollout["members"].items() if row[3] == "held")
        row = rollout["members"][held]
        honest = rollout["variants"][row[2]]
        data = files[variant_file(honest)].replace(V2.encode(), EVIL.encode())
        evil_name = _variant_name(data)
        rollout["variants"].append(evil_name)
        rollout["members"][held] = [row[0], row[1], len(rollout["variants"]) - 1, "releasing", 0, 0]
        files[name] = json.dumps(rollout, sort_keys=True, separators=(",", ":")).encode()
        files[variant_file(evil_name)] = data
        builder = self.repo.TreeBuilder()
        for file, blob in sorted(files.items()):
            builder.insert(file, self.repo.create_blob(blob), pygit2.enums.FileMode.BLOB)
        seal = head.message.rstrip().splitlines()[-1] if copy_seal else ""
        signature = pygit2.Signature("fleetlet", "fleetlet@localhost")
        oid = self.repo.create_commit(None, signature, signature,
                                      f"fleetlet: rollouts (steps)\n\n{seal}\n",
                                      builder.write(), [head.id])  # fmt: skip
        self.forged_for = held
        return str(oid)


def _variant_name(data: bytes) -> str:
    """The content-addressed name of a variant file the attacker wrote (the code is public)."""
    entries = tuple(from_dict(BundleDeploymentEntry, item) for item in json.loads(data))
    name = variant_of(entries)
    assert variant_from_bytes(data, name=name) == entries
    return name


@pytest.fixture
def hub(
    git_server_factory: Any, mini_sigstore: MiniSigstore, tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> Any:  # fmt: skip
    monkeypatch.setenv(KEY_ENV, str(tmp_path / "hub-state.key"))
    (tmp_path / "hub-state.key").write_text("k" * 64)
    git = git_server_factory("http")
    git.create_bare("fleet.git")
    url = git.url_for("fleet.git")
    store = BranchStore(url=url, cache_dir=tmp_path / "hub", credentials=(GIT_USER, GIT_PASSWORD))
    controller = Controller(sharded=ShardedStore.of(store))
    fleet_dir = tmp_path / "fleet"

    def write(digest: str, **extra: Any) -> None:
        write_fleet(fleet_dir, clusters=inventory(4, canaries=1),
                    bundles=[web_bundle(digest, **extra)], settings=settings(mini_sigstore))  # fmt: skip

    def signer() -> PublicationSigner:
        return PublicationSigner.from_trust_config(
            trust_config=mini_sigstore.trust_config_path, token=mini_sigstore.mint_token()
        )

    write(V1)
    controller.publish(prepare(fleet_dir), signer=signer(), actor="ci")
    write(V2, rollout=STRATEGY)
    report = controller.publish(prepare(fleet_dir), signer=signer(), actor="ci")
    assert report.publication is not None and set(report.publication.pushed) == {"store-0"}
    yield store, controller, fleet_dir, signer, Attacker(url, tmp_path / "attacker")
    store.close()


def _branches(store: BranchStore) -> dict[str, str]:
    return {r: o for r, o in store.list_refs().items() if r.startswith("refs/heads/")}


def _carried(store: BranchStore, digest: str) -> list[str]:
    """The clusters whose branch's set names ``digest``."""
    store.fetch()
    return [
        c for c in sorted(store.tips) if digest.encode() in (store.read_file(c, SET_FILE) or b"")
    ]


@pytest.mark.parametrize("copy_seal", [False, True], ids=["unsealed", "seal-copied"])
def test_forged_rollout_state_pushed_with_an_agent_credential_is_refused(
    hub: Any, copy_seal: bool
) -> None:
    store, controller, fleet_dir, signer, attacker = hub
    before = _branches(store)
    forged = attacker.forge(copy_seal=copy_seal)
    attacker.push(forged)  # the git server lets the credential push: nothing else stops it
    assert store.list_refs()[ROLLOUT_REF] == forged

    with pytest.raises(ForgedRolloutStateError) as refused:
        controller.step(load_fleet(fleet_dir), signer=signer())
    message = str(refused.value)
    assert f"{ROLLOUT_REF} of {store.url} at {forged[:12]} is refused" in message
    assert "no hub of this fleet wrote it" in message
    assert ("does not match its content" if copy_seal else "carries no hub seal") in message
    # Nothing was published: no branch moved, none carries the attacker's digest.
    assert _branches(store) == before
    assert _carried(store, EVIL) == []
    assert _carried(store, V2) == ["store-0"]
    # A fresh hub (nothing in memory) refuses it the same way, and so do the API's reads.
    with pytest.raises(ForgedRolloutStateError):
        Controller(sharded=ShardedStore.of(store)).read()


def test_an_older_hub_state_replayed_over_a_newer_one_is_refused(hub: Any) -> None:
    _store, controller, fleet_dir, signer, attacker = hub
    older = str(attacker.state().id)
    rollout = next(r for r in controller.read().active() if r.group == "web")
    controller.act(rollout.id, "pause", actor="alice")  # a newer sealed state
    newer = controller.read()
    assert newer.rollouts[rollout.id].status == "Paused"
    attacker.push(older)  # sealed by the hub, but older than what the hub has seen
    with pytest.raises(ForgedRolloutStateError, match="moved back from"):
        controller.step(load_fleet(fleet_dir), signer=signer())


def _documented_hook() -> str:
    """The status repository's pre-receive hook, as docs/operations.md gives it."""
    text = (Path(__file__).resolve().parent.parent / "docs" / "operations.md").read_text()
    start = text.index("#!/bin/sh\n# hooks/pre-receive of the status repository")
    return text[start : text.index("```", start)]


def test_the_documented_hook_lets_an_agent_push_its_own_status_branch_only(
    git_server_factory: Any, tmp_path: Path
) -> None:
    """docs/operations.md "Who may push what": the git server refuses a status credential's
    push of any ref but its own status branch (the agent's user is its cluster's name)."""
    git = git_server_factory("http")
    git.create_bare("status.git", hooks={"pre-receive": _documented_hook()})
    agent = Attacker(git.url_for("status.git"), tmp_path / "agent")
    signature = pygit2.Signature("agent", "agent@localhost")
    tree = agent.repo.TreeBuilder().write()
    commit = str(agent.repo.create_commit(None, signature, signature, "status", tree, []))

    def push(ref: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            ["git", "--git-dir", agent.repo.path, "push", agent.url, f"{commit}:{ref}"],
            capture_output=True, text=True, timeout=60,
        )  # fmt: skip

    assert push(f"refs/heads/fleetlet/status/{GIT_USER}").returncode == 0
    for ref in (
        "refs/heads/fleetlet/status/another",
        ROLLOUT_REF,
        "refs/heads/fleetlet/clusters/x",
    ):
        refused = push(ref)
        assert refused.returncode != 0
        assert f"fleetlet: {GIT_USER} may not push {ref}" in refused.stderr
