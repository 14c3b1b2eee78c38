"""A simulated fleet for progressive rollouts: thousands of clusters whose *agents* are
simulated, nothing else.

The hub, git (a real ``git daemon``), signing and the status aggregation are real. What is
simulated is each agent's report: :class:`SimulatedAgents` reads every cluster branch as an
agent would see it (its serial and content, from the hub's commit trailers and one set per
content digest), decides what that agent would do (accept the serial; move the group to the new
content and become Ready, or fail and roll back when the cluster is *broken*; stay silent when
it is *offline*), and writes each cluster's status document on its status branch the way
:mod:`tests.statusfleet` writes them (one pack for the whole fleet).

Used by ``tests/test_rollout_fleet.py`` (1,000 clusters) and ``bench/rollout.py`` (10,000).
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import rfc8785

from agent.api import load_set
from agent.verify.publication import SET_FILE
from hub.publish.git import BranchStore
from hub.publish.pack import PackWriter
from tests.statusfleet import AUTHOR, STATUS_PREFIX, bundle_in
from tests.test_hub_status import make_status

IMAGE = "registry.example/retail/web"
ROOT = Path(__file__).resolve().parent.parent


def fleetlet(*args: str) -> subprocess.CompletedProcess[str]:
    """``fleetlet ARGS`` as its own process, from the repository's root."""
    return subprocess.run(
        [sys.executable, "-m", "fleetlet", *args],
        capture_output=True, text=True, timeout=300, cwd=ROOT,
    )  # fmt: skip


def ok(*args: str) -> Any:
    """The JSON ``fleetlet ARGS -o json`` prints, asserting it succeeded."""
    done = fleetlet(*args, "-o", "json")
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)


def until(check: Callable[[], Any], what: str, timeout: float = 90) -> Any:
    """``check()``'s first true answer, polled; fails naming ``what`` after ``timeout``."""
    deadline = time.monotonic() + timeout
    while True:
        found = check()
        if found:
            return found
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.3)


def sim_repos(
    git: Any, issuer: str, *, repo: str = "https://fleet.example.invalid/sim.git"
) -> tuple[dict[str, Any], Path]:
    """A fleet's settings over new bare ``fleet.git`` (cluster branches, ``shards.repo``) and
    ``status.git`` (``shards.statusRepo``) on the git server ``git``, signed by the mini
    Sigstore's default identity at ``issuer``: (settings, the status repo's path)."""
    from tests.realenv.sigstore.mini import DEFAULT_IDENTITY

    git.create_bare("fleet.git")
    status_path = git.create_bare("status.git")
    cluster_repo, status_repo = git.url_for("fleet.git"), git.url_for("status.git")
    settings = {
        "name": "sim",
        "repo": repo,
        "signing": {"identity": DEFAULT_IDENTITY, "issuer": issuer},
        "shards": {"repo": cluster_repo, "statusRepo": status_repo},
    }
    return settings, Path(status_path)


def signing_args(mini_sigstore: Any, tmp_path: Path) -> list[str]:
    """``hub publish``'s keyless signing flags against the mini Sigstore (a token in
    ``tmp_path``)."""
    from tests.realenv.sigstore.mini import DEFAULT_IDENTITY

    token = tmp_path / "oidc-token"
    token.write_text(mini_sigstore.minter.mint(DEFAULT_IDENTITY, lifetime=3600))
    return ["--trust-config", str(mini_sigstore.trust_config_path), "--identity-token", str(token)]


def web_bundle(digest: str, **extra: Any) -> dict[str, Any]:
    """The fleet-repo document of bundle ``web`` (group ``web``) at ``digest``."""
    return {
        "name": "web",
        "sources": [{"kind": "image", "uri": IMAGE, "digest": digest}],
        "format": "plain",
        "targets": [{"clusterSelector": {}}],
        **extra,
    }


def digest_of(n: int) -> str:
    return "sha256:" + f"{n:02x}" * 32


def inventory(count: int, *, canaries: int = 10) -> list[dict[str, Any]]:
    """``count`` stores; the first ``canaries`` have ``tier: canary``."""
    width = len(str(count))
    return [
        {
            "name": f"store-{i:0{width}d}",
            "labels": {
                "tier": "canary" if i < canaries else "production",
                "region": ("eu", "us", "ap")[i % 3],
            },
        }
        for i in range(count)
    ]


@dataclass
class Agent:
    accepted: int = 0
    applied: int = 0  # the serial the group moved with
    version: str | None = None  # the web source digest running
    state: str = "Ready"
    run: int = 0


@dataclass
class SimulatedAgents:
    """The agents of every cluster, simulated; see the module docstring."""

    cluster_repo: str
    status_repo: Path
    workdir: Path
    bundle: str = "web"
    agents: dict[str, Agent] = field(default_factory=dict)
    sequence: int = 0
    _versions: dict[str, str | None] = field(default_factory=dict)
    _tips: dict[str, str] = field(default_factory=dict)

    def branches(self) -> dict[str, tuple[int, str | None]]:
        """Cluster -> (serial, the web source digest its set carries, None: no web)."""
        store = BranchStore(url=self.cluster_repo, cache_dir=self.workdir / "agents-view.git")
        store.fetch()
        out = {}
        for cluster in store.tips:
            facts = store.facts(cluster)
            assert facts is not None and facts.digest, f"{cluster}: not a hub's commit"
            if facts.digest not in self._versions:
                found = load_set(store.read_file(cluster, SET_FILE) or b"", origin=cluster)
                entry = found.entry(self.bundle)
                self._versions[facts.digest] = entry.spec.sources[0].pin if entry else None
            out[cluster] = (facts.serial, self._versions[facts.digest])
        return out

    def tick(
        self,
        *,
        broken: Iterable[str] = (),
        bad: str | None = None,
        offline: Iterable[str] = (),
        now: datetime | None = None,
    ) -> None:
        """Every agent polls once: accepts its branch's serial and moves the group; clusters
        in ``broken`` fail on version ``bad`` (roll back); ``offline`` ones report nothing new.
        Only the documents that changed are written (an agent pushes when something moved)."""
        broken, offline = set(broken), set(offline)
        now = now or datetime.now(UTC)
        self.sequence += 1
        changed = []
        for cluster, (serial, version) in self.branches().items():
            agent = self.agents.get(cluster)
            if agent is None:
                agent = self.agents[cluster] = Agent()
                changed.append(cluster)
            if cluster in offline or serial <= agent.accepted:
                continue
            agent.accepted = serial
            changed.append(cluster)
            if version == agent.version:
                continue  # the group did not change: nothing moves
            if cluster in broken and version == bad:
                agent.state, agent.run = "RolledBack", serial
            else:
                agent.version, agent.applied, agent.run, agent.state = (
                    version,
                    serial,
                    serial,
                    "Ready",
                )
        self.write(now, changed)

    def write(self, now: datetime, clusters: Iterable[str]) -> None:
        """Push the documents of ``clusters`` (one pack; every branch in ``packed-refs``)."""
        pack = PackWriter()
        stamp = int(now.timestamp())
        for cluster in dict.fromkeys(clusters):
            document = self.document(cluster, self.agents[cluster], now)
            tree = pack.tree({"status.json": pack.blob(rfc8785.dumps(document))})
            self._tips[cluster] = pack.commit(
                tree=tree, parents=[], author=AUTHOR, timestamp=stamp, message="status\n"
            )
        pack.write(self.status_repo)
        lines = ["# pack-refs with: peeled fully-peeled sorted"]
        lines += [f"{self._tips[c]} {STATUS_PREFIX}{c}" for c in sorted(self._tips)]
        (self.status_repo / "packed-refs").write_text("\n".join(lines) + "\n")

    def document(self, cluster: str, agent: Agent, now: datetime) -> dict[str, Any]:
        bundles = {}
        if agent.version is not None or agent.state == "RolledBack":
            report = bundle_in(
                agent.state, cluster, self.bundle, serial=max(agent.run, 2), history=False
            )
            report["group"] = self.bundle
            report["appliedRevision"] = (
                {"serial": agent.applied, "sources": [agent.version]} if agent.applied else None
            )
            if report["runs"]:
                report["runs"][0]["serial"] = agent.run
            bundles[self.bundle] = report
        document = make_status(cluster, sequence=self.sequence, heartbeat=now, bundles=bundles)
        document["lastAcceptedSerial"] = agent.accepted
        return document
