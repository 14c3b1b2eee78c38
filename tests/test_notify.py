"""Where a commit landed: ``hub serve --commit-status ... --alert-webhook ...`` posts each
rollout's progress as a commit status on the fleet repo's commit and sends an alert when a
rollout halts, to a local receiver standing in for GitHub's API and a webhook.

A fleet of four clusters (one canary) on a real git daemon, signed by the mini Sigstore; the
agents are simulated (:mod:`tests.rolloutsim`); the rollout is stepped from CI (``fleetlet hub
rollout step``) as a hub without signing leaves it. A broken version halts the rollout at the
canary: the status reads failure naming it, and one alert arrives; the fixed version rolls out
to every cluster and its commit's status goes from pending to success."""

from __future__ import annotations

import hashlib
import hmac
import json
import time
from pathlib import Path
from typing import Any

from hub.notify import (
    Alert,
    CommitStatus,
    NotifyConfigError,
    Outbox,
    StatusTarget,
    Webhook,
    status_target,
    webhook,
)
from tests.realenv.hubserver import serving_hub
from tests.realenv.sigstore import MiniSigstore
from tests.rolloutsim import (
    SimulatedAgents,
    digest_of,
    inventory,
    ok,
    signing_args,
    sim_repos,
    until,
    web_bundle,
)
from tests.test_hub_fleet import write_fleet
from tests.test_hub_review import Receiver, git

STRATEGY = {
    "waves": [
        {"name": "canary", "clusterSelector": {"matchLabels": {"tier": "canary"}}},
        {"name": "rest"},
    ],
}


def test_commit_statuses_follow_the_rollout_and_a_halt_sends_one_alert(
    git_server_factory: Any, mini_sigstore: MiniSigstore, tmp_path: Path
) -> None:
    server = git_server_factory("daemon")
    settings, status_path = sim_repos(
        server, mini_sigstore.issuer, repo="https://github.com/example/fleet.git"
    )
    repo, status_repo = settings["shards"]["repo"], settings["shards"]["statusRepo"]
    clusters = inventory(4, canaries=1)
    fleet = tmp_path / "fleet"

    def commit(version: int, **extra: Any) -> str:
        write_fleet(
            fleet,
            clusters=clusters,
            bundles=[web_bundle(digest_of(version), **extra)],
            settings=settings,
        )
        git(fleet, "add", "-A")
        git(fleet, "commit", "-q", "-m", f"web v{version}")
        return git(fleet, "rev-parse", "HEAD")

    fleet.mkdir()
    git(fleet, "init", "-q", "-b", "main")
    commit(1)
    signing = signing_args(mini_sigstore, tmp_path)
    publish = ["hub", "publish", str(fleet), *signing, "--cache-dir", str(tmp_path / "ci")]
    step = [
        "hub",
        "rollout",
        "step",
        str(fleet),
        *signing,
        "--cache-dir",
        str(tmp_path / "ci-steps"),
    ]
    ok(*publish)
    agents = SimulatedAgents(cluster_repo=repo, status_repo=status_path, workdir=tmp_path)
    agents.tick()

    receiver = Receiver()
    forge_token, secret = tmp_path / "forge-token", tmp_path / "alert-secret"
    forge_token.write_text("status-token\n")
    secret.write_text("alert-secret\n")
    tokens = tmp_path / "tokens.yaml"
    tokens.write_text("")
    extra = [
        "--allow-anonymous", "--fleet", str(fleet),
        "--commit-status", "github:example/fleet",
        "--commit-status-api", receiver.url,
        "--commit-status-token-file", str(forge_token),
        "--alert-webhook", f"json:{receiver.url}/hooks/ops",
        "--alert-secret-file", str(secret),
    ]  # fmt: skip
    workdir = tmp_path / "hub"
    workdir.mkdir()

    def statuses(sha: str) -> list[dict[str, Any]]:
        found = [
            r for r in receiver.requests if r["path"] == f"/repos/example/fleet/statuses/{sha}"
        ]
        for r in found:
            assert r["headers"]["Authorization"] == "Bearer status-token"
        return [json.loads(r["body"]) for r in found]

    def alerts() -> list[dict[str, Any]]:
        found = [r for r in receiver.requests if r["path"] == "/hooks/ops"]
        for r in found:  # each signed with the secret
            mac = hmac.new(b"alert-secret", r["body"], hashlib.sha256).hexdigest()
            assert r["headers"]["X-Fleetlet-Signature-256"] == f"sha256={mac}"
        return [json.loads(r["body"]) for r in found]

    try:
        with serving_hub(status_repo, workdir, extra, stale_after="1h") as _url:
            # A broken v2: the rollout starts at the canary, the commit's status is pending.
            broken = commit(2, rollout=STRATEGY)
            ok(*publish)
            pending = until(lambda: statuses(broken), "a pending status")
            assert pending[0]["state"] == "pending" and pending[0]["context"] == "fleetlet/web"
            assert (
                pending[0]["description"]
                == "Progressing, wave canary: 0/4 clusters Ready, 0 failed"
            )

            agents.tick(broken=["store-0"], bad=digest_of(2))
            assert ok(*step)["rollouts"][0]["status"] == "Halted"
            failed = until(
                lambda: [s for s in statuses(broken) if s["state"] == "failure"], "failure"
            )
            assert failed[0]["description"] == "halted: store-0; 0/4 clusters Ready"
            (alert,) = until(alerts, "an alert")
            assert alert["kind"] == "rollout-halted"
            assert list(alert["fields"]["failures"]) == ["store-0"]
            assert alert["title"].endswith("of group web halted")

            # The fix rolls out wave by wave; its commit's status ends in success.
            fixed = commit(3, rollout=STRATEGY)
            ok(*publish)
            for _ in range(4):
                agents.tick()
                if ok(*step)["rollouts"][0]["status"] == "Completed":
                    break
            done = until(lambda: [s for s in statuses(fixed) if s["state"] == "success"], "success")
            assert done[0]["description"] == "4/4 clusters Ready on it"
            assert statuses(fixed)[0]["state"] == "pending"
            # Once each: the halted commit's failure and the alert were not sent again.
            time.sleep(1.5)
            sent = statuses(broken)  # pending as the counts moved, then failure, each once
            assert [s["state"] for s in sent][-1] == "failure"
            assert [s["state"] for s in sent].count("failure") == 1
            said = [(s["state"], s["description"]) for s in sent]
            assert len(said) == len(set(said)), said
            assert len(alerts()) == 1
    finally:
        receiver.close()


class ScriptedReceiver(Receiver):
    """A :class:`Receiver` whose first answers are ``codes`` (then 201)."""

    def __init__(self, codes: list[int]) -> None:
        super().__init__()
        self.codes = codes
        handler = self.server.RequestHandlerClass
        owner = self
        original = handler.do_POST  # type: ignore[attr-defined]

        def do_post(self: Any) -> None:
            if owner.codes:
                self.rfile.read(int(self.headers.get("Content-Length") or 0))
                owner.requests.append({"path": self.path, "refused": True})
                self.send_response(owner.codes.pop(0))
                self.send_header("Retry-After", "0")
                self.end_headers()
                return
            original(self)

        handler.do_POST = do_post  # type: ignore[attr-defined]


def test_delivery_is_retried_deduplicated_and_rate_limited() -> None:
    receiver = ScriptedReceiver([503, 429])
    slept: list[float] = []
    outbox = Outbox(per_minute=3, sleep=slept.append)
    hook = Webhook(format="json", url=f"{receiver.url}/hook")
    alert = Alert(key="k", kind="clusters-stale", title="1 cluster gone stale", text="edge-1")
    try:
        outbox.offer("k", hook.request(alert))
        outbox.drain()
        assert [r.get("refused", False) for r in receiver.requests] == [True, True, False]
        assert slept == [1.0, 2.0]  # backoff after each refusal
        outbox.offer("k", hook.request(alert))  # said already: not sent again
        outbox.drain()
        assert len(receiver.requests) == 3
        # A fourth send within the minute waits for the rate limit.
        outbox.offer("k", hook.request(Alert(key="k", kind="clusters-stale", title="2", text="")))
        outbox.drain()
        assert len(receiver.requests) == 4 and slept[-1] > 50
        # Refused for good (4xx): tried once, and offered again at the next look.
        receiver.codes = [404]
        outbox.offer("j", hook.request(Alert(key="j", kind="rolled-back", title="x", text="")))
        outbox.drain()
        assert receiver.requests[-1]["refused"] and "j" not in outbox.sent
    finally:
        receiver.close()


def test_formats_and_settings() -> None:
    status = CommitStatus(sha="a" * 40, context="fleetlet/web", state="failure", description="d")
    gitlab = StatusTarget(kind="gitlab", api="https://gl/api/v4", repo="ops/fleet", token="t")
    request = gitlab.request(status)
    assert request.url == f"https://gl/api/v4/projects/ops%2Ffleet/statuses/{'a' * 40}"
    assert json.loads(request.body)["state"] == "failed"
    assert request.headers == {"PRIVATE-TOKEN": "t"}
    gitea = StatusTarget(kind="gitea", api="https://tea/api/v1", repo="ops/fleet", token="t")
    assert gitea.request(status).headers == {"Authorization": "token t"}
    alert = Alert(key="k", kind="rollout-halted", title="Rollout r halted", text="why")
    slack = Webhook(format="slack", url="https://hooks.slack.com/x").request(alert)
    assert json.loads(slack.body) == {"text": "*Rollout r halted*\nwhy"}
    teams = json.loads(Webhook(format="teams", url="https://x").request(alert).body)
    assert (teams["@type"], teams["title"], teams["text"]) == (
        "MessageCard",
        "Rollout r halted",
        "why",
    )
    for bad, message in (
        (lambda: status_target("bitbucket:x/y", api=None, token_file="f", target_url=None),
         "--commit-status 'bitbucket:x/y': expected github:OWNER/NAME"),
        (lambda: status_target("gitea:x/y", api=None, token_file="f", target_url=None),
         "--commit-status gitea:x/y: give --commit-status-api (gitea)"),
        (lambda: status_target("github:x/y", api=None, token_file="/nonexistent", target_url=None),
         "--commit-status-token-file /nonexistent: No such file or directory"),
        (lambda: webhook("irc:https://x", secret_file=None), "--alert-webhook 'irc:https://x'"),
        (lambda: webhook("json:file:///etc/passwd", secret_file=None), "not an http(s) URL"),
    ):  # fmt: skip
        try:
            bad()
        except NotifyConfigError as exc:
            assert message in str(exc), exc
        else:
            raise AssertionError(message)
