"""The dashboard in a real browser: Debian's chromium, headless, driven by Playwright.

The hub runs as users run it (``python -m hub.serve`` with ``--tokens``, ``--hub-key`` and
``--fleet``) over status branches pushed to the session's git daemon like agents push them.
The fleet has an installation in every state (Ready, Progressing, Degraded, RolledBack,
Paused) and a stale cluster; the tests check what a user sees: the state of every cell, the
filters, the cluster and installation pages, sensitive outputs masked for a read token and
shown to an admin token, the message for a missing or bad token, refreshes without reloads,
the rollouts and the enrollment requests (pending, accepted, denied) of a hub run with
``--enroll``.

Artifact: a screenshot of the matrix is written to ``test-artifacts/dashboard/matrix.png`` at
the repository root (git-ignored), or under ``$FLEETLET_TEST_ARTIFACTS`` when set.
"""

from __future__ import annotations

import base64
import os
import re
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
import requests
from nacl.public import PrivateKey
from playwright.sync_api import Browser, Page, expect

from agent.report.seal import OutputPlace, agent_sealing_key, seal
from hub.api.tokens import write_clear_tokens
from hub.fleet.load import load_fleet
from hub.publish.flow import prepare
from hub.publish.git import BranchStore
from hub.publish.shards import ShardedStore
from hub.publish.sign import PublicationSigner
from hub.rollout.controller import Controller
from hub.status.aggregate import FleetStatus
from tests.realenv.browser import chromium
from tests.realenv.gitserver import GitDaemon
from tests.realenv.hubserver import serving_hub
from tests.realenv.sigstore import MiniSigstore
from tests.rolloutsim import SimulatedAgents, digest_of, inventory, web_bundle
from tests.statusfleet import cluster_document, write_fleet_dir
from tests.test_hub_fleet import write_fleet
from tests.test_hub_status import StatusPusher, new_repo

ADMIN = "admin-token-0123456789"
READER = "read-token-0123456789"
SECRET = "db-password-s3cr3t"
ROOT = Path(__file__).resolve().parent.parent
ARTIFACTS = Path(os.environ.get("FLEETLET_TEST_ARTIFACTS") or ROOT / "test-artifacts") / "dashboard"
CODES = {"Ready": "R", "Progressing": "P", "Degraded": "D", "RolledBack": "RB", "Paused": "PA"}
CODES.update(Stale="S", AwaitingApproval="AA", Denied="DN")

# cluster -> (labels in the fleet repo, or None: not in it; bundle -> state; stale)
FLEET: dict[str, tuple[dict[str, str] | None, dict[str, str], bool]] = {
    "core-eu-1": (
        {"region": "eu", "tier": "core"},
        {"platform-crds": "Ready", "platform-operator": "Ready", "metrics": "Ready"},
        False,
    ),
    "lab-1": (None, {"metrics": "Degraded"}, False),
    "store-eu-001": (
        {"region": "eu", "tier": "store"},
        {
            "platform-crds": "Ready",
            "platform-operator": "Ready",
            "shop-frontend": "Ready",
            "shop-backend": "Degraded",
            "metrics": "Ready",
        },
        False,
    ),
    "store-eu-002": (
        {"region": "eu", "tier": "store"},
        {
            "platform-crds": "Ready",
            "platform-operator": "Ready",
            "shop-frontend": "RolledBack",
            "shop-backend": "Ready",
        },
        False,
    ),
    "store-us-001": (
        {"region": "us", "tier": "store"},
        {
            "platform-crds": "Ready",
            "platform-operator": "Denied",
            "shop-frontend": "AwaitingApproval",
            "shop-backend": "Paused",
            "metrics": "Progressing",
        },
        False,
    ),
    "store-us-002": (
        {"region": "us", "tier": "store"},
        {"platform-crds": "Ready", "shop-frontend": "Ready"},
        True,
    ),
}
# The approval requests of store-us-001's group "apps": one pending (it adds a
# ClusterRoleBinding), one denied.
REQUESTS = [
    {
        "name": "apps-s4-1a2b3c",
        "group": "apps",
        "serial": 4,
        "bundles": ["shop-frontend", "platform-operator"],
        "state": "Pending",
        "createdAt": "2026-11-22T23:00:00Z",
        "preview": {
            "source": "live",
            "created": 1,
            "changed": 1,
            "unchanged": 12,
            "findings": 1,
            "security": {
                "rbac": [
                    {
                        "bundle": "shop-frontend",
                        "object": "ClusterRoleBinding shop-view",
                        "action": "created",
                        "details": ["cluster-wide", "roleRef: ClusterRole view"],
                    }
                ]
            },
            "objects": [
                {
                    "bundle": "shop-frontend",
                    "apiVersion": "apps/v1",
                    "kind": "Deployment",
                    "namespace": "shop",
                    "name": "frontend",
                    "action": "changed",
                    "paths": ["spec.template.spec.containers[0].image"],
                },
                {
                    "bundle": "shop-frontend",
                    "apiVersion": "rbac.authorization.k8s.io/v1",
                    "kind": "ClusterRoleBinding",
                    "name": "shop-view",
                    "action": "created",
                },
            ],
        },
    },
    {
        "name": "apps-s3-9f8e7d",
        "group": "apps",
        "serial": 3,
        "bundles": ["shop-frontend", "platform-operator"],
        "state": "Denied",
        "createdAt": "2026-11-22T21:00:00Z",
        "decidedBy": "alice",
        "decidedAt": "2026-11-22T21:30:00Z",
        "reason": "not during the sale",
        "preview": {"source": "live", "changed": 2, "unchanged": 11},
    },
]
REFUSAL = {
    "reason": "SignatureInvalid",
    "message": "the publication's signature does not verify against the trusted root",
    "commit": "ab" * 20,
    "at": "2026-11-22T22:30:00Z",
}


def expected_cells() -> dict[tuple[str, str], str]:
    """(cluster, bundle) -> the state the matrix must show: a stale cluster's are all Stale."""
    return {
        (cluster, bundle): "Stale" if stale else state
        for cluster, (_, states, stale) in FLEET.items()
        for bundle, state in states.items()
    }


def _documents(key: PrivateKey) -> dict[str, Any]:
    # Sealed by store-eu-001's agent for the newest run's output (bound to that place).
    place = OutputPlace(
        cluster="store-eu-001",
        bundle="shop-frontend",
        output="password",
        run="store-eu-001.shop-frontend.3.1",
    )
    sender = agent_sealing_key(key, place.cluster)
    sealed = seal(key.public_key, SECRET, place=place, sender=sender)
    now = datetime.now(UTC)
    documents = {}
    for cluster, (_, states, stale) in FLEET.items():
        outputs = None
        if cluster == "store-eu-001":
            outputs = {
                "shop-frontend": {"address": {"value": "10.0.0.7"}, "password": {"sealed": sealed}}
            }
        documents[cluster] = cluster_document(
            cluster, states, stale=stale, now=now, outputs=outputs
        )
    documents["store-eu-002"]["lastRefusal"] = REFUSAL
    documents["store-us-001"]["requests"] = REQUESTS
    return documents


@dataclass
class Hub:
    url: str
    repo: str
    workdir: Path
    tokens: Path


@pytest.fixture(scope="module")
def hub(git_daemon: GitDaemon, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Hub]:
    """The hub over the fleet above, with a read and an admin token, its key and the labels."""
    workdir = tmp_path_factory.mktemp("dashboard")
    key = PrivateKey.generate()
    key_file = workdir / "hub.key"
    key_file.write_text(base64.b64encode(bytes(key)).decode() + "\n")
    tokens = workdir / "tokens.yaml"
    write_clear_tokens(tokens, {ADMIN: "admin", READER: "read"})
    fleet_dir = write_fleet_dir(
        workdir / "fleet", {c: labels for c, (labels, _, _) in FLEET.items() if labels}
    )
    repo = new_repo(git_daemon, "dashboard")
    StatusPusher(repo, workdir / "agents").push(_documents(key))
    extra = ["--tokens", str(tokens), "--hub-key", str(key_file), "--fleet", str(fleet_dir)]
    with serving_hub(repo, workdir, extra) as url:
        yield Hub(url, repo, workdir, tokens)


@pytest.fixture(scope="module")
def browser() -> Iterator[Browser]:
    with chromium() as running:
        yield running


@dataclass
class Tab:
    """A page in a fresh browser context (its own session storage), and what it asked for."""

    page: Page
    requests: list[str]
    errors: list[str]


@pytest.fixture
def tab(browser: Browser) -> Iterator[Tab]:
    context = browser.new_context(viewport={"width": 1280, "height": 800})
    page = context.new_page()
    page.set_default_timeout(30_000)
    opened = Tab(page, [], [])
    page.on("request", lambda request: opened.requests.append(request.url))
    page.on("pageerror", lambda error: opened.errors.append(str(error)))
    yield opened
    context.close()
    assert opened.errors == [], "JavaScript errors in the page"


def open_matrix(tab: Tab, url: str, token: str = READER, query: str = "") -> Page:
    page = tab.page
    page.goto(f"{url}/{query}#token={token}")
    expect(page.locator("#matrix tbody tr").first).to_be_visible()
    return page


def shown_cells(page: Page) -> dict[tuple[str, str], tuple[str, str]]:
    """(cluster, bundle) -> (state, the code shown in the cell) of every installed cell."""
    cells = page.eval_on_selector_all(
        "#matrix td.cell:not(.none)",
        """cells => cells.map(c => [c.closest('tr').dataset.cluster, c.dataset.bundle,
            c.dataset.state, c.querySelector('a').textContent])""",
    )
    return {(c, b): (state, code) for c, b, state, code in cells}


def shown_rows(page: Page) -> list[str]:
    rows: list[str] = page.eval_on_selector_all(
        "#matrix tbody tr[data-cluster]", "r => r.map(x => x.dataset.cluster)"
    )
    return rows


def shown_columns(page: Page) -> list[str]:
    columns: list[str] = page.eval_on_selector_all(
        "#matrix thead th.bundle", "h => h.map(x => x.title)"
    )
    return columns


def test_matrix_shows_the_state_of_every_installation(hub: Hub, tab: Tab) -> None:
    page = open_matrix(tab, hub.url)
    # The token left the address bar for the tab's session storage.
    assert "token" not in page.url
    assert page.evaluate("sessionStorage.getItem('fleetlet.token')") == READER

    expected = expected_cells()
    assert shown_cells(page) == {key: (state, CODES[state]) for key, state in expected.items()}
    assert shown_rows(page) == sorted(FLEET)
    assert shown_columns(page) == sorted({b for _, states, _ in FLEET.values() for b in states})
    # Bundles a cluster does not have are marked, not left to a colour.
    assert page.locator('tr[data-cluster="core-eu-1"] td.cell.none').count() == 2

    stale = page.locator('tr[data-cluster="store-us-002"]')
    expect(stale).to_have_class(re.compile(r"\bstale\b"))
    expect(stale.locator("td.beat")).to_contain_text(re.compile(r"Stale\s*2h \d+m ago"))
    expect(page.locator('tr[data-cluster="store-eu-001"] td.beat')).to_contain_text(
        re.compile(r"^(\d+m )?\d+s ago$")
    )
    expect(page.locator('tr[data-cluster="store-eu-001"] td.labels')).to_have_text(
        "region=eu tier=store"
    )
    expect(page.locator('tr[data-cluster="lab-1"] td.labels')).to_have_text("")
    # The state counts cover every shown cell.
    for state in CODES:
        count = sum(1 for s in expected.values() if s == state)
        expect(page.locator(f'button.count[data-state="{state}"] strong')).to_have_text(str(count))

    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    page.screenshot(path=str(ARTIFACTS / "matrix.png"), full_page=True)
    assert (ARTIFACTS / "matrix.png").stat().st_size > 10_000


def test_filters_by_label_bundle_and_state_are_linkable(
    hub: Hub, tab: Tab, browser: Browser
) -> None:
    page = open_matrix(tab, hub.url)
    rows = page.locator("#matrix tbody tr[data-cluster]")

    page.get_by_label("Label selector").fill("region=eu")
    page.get_by_role("button", name="Apply filters").click()
    expect(rows).to_have_count(3)
    assert shown_rows(page) == ["core-eu-1", "store-eu-001", "store-eu-002"]
    assert "label=region%3Deu" in page.url

    page.get_by_label("State", exact=True).select_option("Degraded")
    expect(rows).to_have_count(1)
    assert shown_rows(page) == ["store-eu-001"]
    assert re.search(r"[?&]state=Degraded\b", page.url)

    # A label that is not set selects the clusters the fleet repo gave no labels (lab-1).
    page.get_by_label("Label selector").fill("!region")
    page.get_by_role("button", name="Apply filters").click()
    expect(rows).to_have_count(1)
    assert shown_rows(page) == ["lab-1"]

    page.get_by_role("link", name="Clear filters").click()
    expect(rows).to_have_count(len(FLEET))
    page.get_by_label("Bundle").select_option("shop-frontend")
    expect(page.locator("#matrix thead th.bundle")).to_have_count(1)
    assert shown_columns(page) == ["shop-frontend"]
    assert shown_rows(page) == ["store-eu-001", "store-eu-002", "store-us-001", "store-us-002"]
    page.get_by_label("State", exact=True).select_option("Stale")
    expect(rows).to_have_count(1)
    assert shown_cells(page) == {("store-us-002", "shop-frontend"): ("Stale", "S")}
    linked = page.url

    # The same address in another tab shows the same matrix, its filters filled in.
    other = browser.new_context().new_page()
    try:
        other.goto(f"{linked}#token={READER}")
        expect(other.locator("#matrix tbody tr[data-cluster]")).to_have_count(1)
        assert shown_cells(other) == {("store-us-002", "shop-frontend"): ("Stale", "S")}
        expect(other.get_by_label("Bundle")).to_have_value("shop-frontend")
        expect(other.get_by_label("State", exact=True)).to_have_value("Stale")
    finally:
        other.context.close()

    # Clicking a state count filters by it; a bad selector says what is wrong.
    page.goto(f"{hub.url}/")
    page.locator('button.count[data-state="Paused"]').click()
    expect(rows).to_have_count(1)
    assert shown_rows(page) == ["store-us-001"]
    page.get_by_label("Label selector").fill("bad key=1")
    page.get_by_role("button", name="Apply filters").click()
    expect(page.get_by_role("alert")).to_contain_text("label filter: 'bad key=1'")


def test_cluster_page_shows_heartbeat_serial_refusal_and_installations(hub: Hub, tab: Tab) -> None:
    page = open_matrix(tab, hub.url)
    page.get_by_role("link", name="store-eu-002", exact=True).click()
    expect(page.get_by_role("heading", level=1)).to_have_text("Cluster store-eu-002")
    assert page.url == f"{hub.url}/ui/clusters/store-eu-002"
    facts = page.locator("dl.facts").first
    expect(facts).to_contain_text(
        re.compile(r"Last heartbeat\s*\d{4}-\d\d-\d\d .* \((\d+m )?\d+s ago\)")
    )
    expect(facts).to_contain_text(re.compile(r"Last accepted serial\s*3"))
    expect(facts).to_contain_text("region=eu")
    refusal = page.locator("dl.facts").nth(1)
    expect(refusal).to_contain_text("SignatureInvalid")
    expect(refusal).to_contain_text(REFUSAL["message"])
    expect(refusal).to_contain_text("ab" * 20)
    table = page.locator("#installations tbody tr")
    expect(table).to_have_count(4)
    states = page.eval_on_selector_all(
        "#installations tbody tr",
        "rows => rows.map(r => [r.cells[0].innerText, r.cells[2].innerText])",
    )
    assert dict(states) == FLEET["store-eu-002"][1]

    # A stale cluster says so; the back button returns to the matrix.
    page.goto(f"{hub.url}/ui/clusters/store-us-002")
    expect(page.locator("dl.facts").first).to_contain_text("Stale")
    page.go_back()
    page.go_back()
    expect(page.locator("#matrix tbody tr[data-cluster]")).to_have_count(len(FLEET))


def test_installation_page_shows_runs_and_masks_sensitive_outputs(hub: Hub, tab: Tab) -> None:
    page = open_matrix(tab, hub.url)
    page.locator('tr[data-cluster="store-eu-001"] td[data-bundle="shop-frontend"] a').click()
    expect(page.get_by_role("heading", level=1)).to_have_text(
        "Installation store-eu-001/shop-frontend"
    )
    runs = page.locator("#runs > tbody > tr")
    expect(runs).to_have_count(2)
    assert page.eval_on_selector_all(
        "#runs > tbody > tr", "rows => rows.map(r => [r.dataset.run, r.dataset.result])"
    ) == [
        ["store-eu-001.shop-frontend.3.1", "Succeeded"],
        ["store-eu-001.shop-frontend.2.1", "Succeeded"],
    ]
    expect(runs.first).to_contain_text("1 created, 0 configured, 3 unchanged, 0 pruned")
    expect(page.locator("#conditions")).to_contain_text(re.compile(r"Ready\s*True\s*Healthy"))

    outputs = page.locator("#outputs tbody tr")
    expect(outputs).to_have_count(2)
    expect(outputs.nth(0)).to_have_text(re.compile(r"address\s*10\.0\.0\.7"))
    expect(outputs.nth(1)).to_contain_text("<sensitive>")
    expect(outputs.nth(1).locator(".badge")).to_have_text("masked")
    assert SECRET not in page.content()

    # A failed run: its result, message and failed object.
    page.goto(f"{hub.url}/ui/installations/store-eu-001/shop-backend")
    first = page.locator("#runs > tbody > tr").first
    expect(first).to_have_attribute("data-result", "Failed")
    expect(first).to_contain_text("Deployment shop-backend/shop-backend not Available")
    expect(first).to_contain_text("Failed object: apps/v1 Deployment shop-backend/shop-backend")
    expect(page.locator("dl.facts")).to_contain_text("Degraded")


def test_installation_page_shows_the_approval_requests_and_their_preview(
    hub: Hub, tab: Tab
) -> None:
    page = open_matrix(tab, hub.url)
    cell = page.locator('tr[data-cluster="store-us-001"] td[data-bundle="shop-frontend"] a')
    expect(cell).to_have_attribute("aria-label", "AwaitingApproval")
    cell.click()
    expect(page.locator("dl.facts").first).to_contain_text("AwaitingApproval")
    # Why, as fleetlet explain says it: the request it waits for and what unblocks it.
    why = page.locator("#explain")
    expect(why).to_have_attribute("data-check", "approval")
    expect(why).to_contain_text("waits for approval: request apps-s4-1a2b3c")
    expect(why).to_contain_text("fleetlet approve apps-s4-1a2b3c")
    requests_shown = page.locator("#requests section.request")
    expect(requests_shown).to_have_count(2)
    pending = page.locator('#requests section[data-request="apps-s4-1a2b3c"]')
    expect(pending).to_have_attribute("data-state", "Pending")
    expect(pending).to_contain_text("fleetlet preview apps-s4-1a2b3c")
    expect(pending).to_contain_text("1 created, 1 changed, 0 deleted, 12 unchanged")
    finding = pending.locator('li[data-category="rbac"]')
    expect(finding).to_contain_text("ClusterRoleBinding shop-view (created): cluster-wide")
    pending.locator("details summary").click()
    expect(pending.locator("table.request-objects tbody tr")).to_have_count(2)
    expect(pending.locator("table.request-objects")).to_contain_text(
        "spec.template.spec.containers[0].image"
    )
    denied = page.locator('#requests section[data-request="apps-s3-9f8e7d"]')
    expect(denied).to_contain_text("Denied by alice")
    expect(denied).to_contain_text("not during the sale")
    # The denied installation says so in its own state.
    page.goto(f"{hub.url}/ui/installations/store-us-001/platform-operator")
    expect(page.locator("dl.facts").first).to_contain_text("Denied")


def test_admin_token_sees_the_sensitive_value(hub: Hub, tab: Tab) -> None:
    page = tab.page
    page.goto(f"{hub.url}/ui/installations/store-eu-001/shop-frontend#token={ADMIN}")
    secret = page.locator("#outputs tbody tr").nth(1)
    expect(secret).to_contain_text(SECRET)
    expect(secret.locator(".badge")).to_have_text("sensitive")
    # And in the outputs of each run.
    page.get_by_text("2 outputs").first.click()
    expect(page.locator("#runs details").first).to_contain_text(SECRET)


def test_missing_or_bad_token_says_so(hub: Hub, tab: Tab) -> None:
    page = tab.page
    page.goto(f"{hub.url}/")
    alert = page.get_by_role("alert")
    expect(alert).to_contain_text("Token needed")
    expect(page.locator("#matrix tbody tr[data-cluster]")).to_have_count(0)

    page.get_by_label("Bearer token").fill("not-a-known-token")
    page.get_by_role("button", name="Use token").click()
    expect(alert).to_contain_text("Token invalid")
    expect(page.locator("#matrix tbody tr[data-cluster]")).to_have_count(0)

    page.get_by_label("Bearer token").fill(READER)
    page.get_by_role("button", name="Use token").click()
    expect(page.locator("#matrix tbody tr[data-cluster]")).to_have_count(len(FLEET))
    expect(alert).to_be_hidden()

    # A link with a bad token, on a detail page, says the same.
    other = page.context.new_page()
    other.goto(f"{hub.url}/ui/clusters/store-eu-001#token=wrong-token-123")
    expect(other.get_by_role("alert")).to_contain_text("Token invalid")


def test_accessible_markup_and_nothing_from_elsewhere(hub: Hub, tab: Tab) -> None:
    page = open_matrix(tab, hub.url)
    # Every form control has a label (its accessible name).
    unlabelled = page.eval_on_selector_all(
        "input, select",
        "els => els.filter(e => !(e.labels && e.labels.length) && !e.ariaLabel).map(e => e.id)",
    )
    assert unlabelled == []
    # Text on each state colour: contrast at least 4.5:1 (WCAG AA), both stripes for Stale.
    ratios = page.evaluate(
        """() => {
        const rgb = t => t.match(/\\d+(\\.\\d+)?/g).slice(0, 3).map(Number);
        const lum = c => { const [r, g, b] = rgb(c).map(v => { v /= 255;
            return v <= 0.03928 ? v / 12.92 : ((v + 0.055) / 1.055) ** 2.4; });
            return 0.2126 * r + 0.7152 * g + 0.0722 * b; };
        const ratio = (a, b) => { const [x, y] = [lum(a), lum(b)].sort((p, q) => q - p);
            return (x + 0.05) / (y + 0.05); };
        const out = {};
        for (const cell of document.querySelectorAll('#matrix td.cell:not(.none)')) {
            const style = getComputedStyle(cell);
            const backgrounds = [style.backgroundColor];
            for (const m of style.backgroundImage.matchAll(/rgba?\\([^)]*\\)/g)) backgrounds.push(m[0]);
            out[cell.dataset.state] = Math.min(...backgrounds.map(b => ratio(style.color, b)));
        }
        return out;
    }"""
    )
    assert set(ratios) == set(CODES)
    assert all(ratio >= 4.5 for ratio in ratios.values()), ratios
    # Everything came from the hub: no CDN, no other origin.
    assert tab.requests and all(
        url.startswith(hub.url) or url.startswith("data:") for url in tab.requests
    ), tab.requests
    assert page.evaluate("document.documentElement.lang") == "en"


def test_auto_refresh_updates_cells_without_a_reload(
    git_daemon: GitDaemon, tmp_path: Path, browser: Browser
) -> None:
    tokens = tmp_path / "tokens.yaml"
    write_clear_tokens(tokens, {READER: "read"})
    repo = new_repo(git_daemon, "dashboard-refresh")
    pusher = StatusPusher(repo, tmp_path / "agents")
    pusher.push({"edge-1": cluster_document("edge-1", {"web": "Progressing"})})
    with serving_hub(repo, tmp_path, ["--tokens", str(tokens)]) as url:
        page = browser.new_context().new_page()
        try:
            page.goto(f"{url}/#token={READER}")
            cell = page.locator('tr[data-cluster="edge-1"] td[data-bundle="web"]')
            expect(cell).to_have_attribute("data-state", "Progressing")
            page.evaluate("window.stillTheSamePage = true")
            pusher.push({"edge-1": cluster_document("edge-1", {"web": "Ready"}, sequence=2)})
            # The hub refreshes every 300 ms, the page every 5 s: within 30 s at the most.
            expect(cell).to_have_attribute("data-state", "Ready", timeout=30_000)
            expect(page.locator("#matrix-summary")).to_contain_text("Clusters 1–1 of 1")
            assert page.evaluate("window.stillTheSamePage") is True
            assert page.evaluate("performance.getEntriesByType('navigation').length") == 1
        finally:
            page.context.close()


def _api(hub: Hub, path: str, **params: str) -> requests.Response:
    headers = {"Authorization": f"Bearer {READER}"}
    return requests.get(f"{hub.url}{path}", params=params, headers=headers, timeout=30)


def test_matrix_api_pages_and_filters_the_whole_fleet(hub: Hub) -> None:
    """What the dashboard reads: ``/api/v1/matrix`` and the labels on ``/api/v1/clusters``."""
    whole = _api(hub, "/api/v1/matrix").json()
    assert whole["total"] == len(FLEET) and whole["fleet"]["stale"] == 1
    assert [row["name"] for row in whole["items"]] == sorted(FLEET)
    counts = {s: sum(1 for v in expected_cells().values() if v == s) for s in CODES}
    assert whole["states"] == counts
    pages = [
        [
            row["name"]
            for row in _api(hub, "/api/v1/matrix", offset=str(o), limit="4").json()["items"]
        ]
        for o in (0, 4)
    ]
    assert pages == [sorted(FLEET)[:4], sorted(FLEET)[4:]]

    selected = _api(hub, "/api/v1/matrix", label="tier in (core,store),region!=us").json()
    assert [row["name"] for row in selected["items"]] == [
        "core-eu-1",
        "store-eu-001",
        "store-eu-002",
    ]
    assert selected["items"][0]["labels"] == {"region": "eu", "tier": "core"}
    degraded = _api(hub, "/api/v1/matrix", bundle="metrics", state="Degraded").json()
    assert [(r["name"], r["cells"]) for r in degraded["items"]] == [
        ("lab-1", {"metrics": "Degraded"})
    ]
    assert degraded["bundles"] == ["metrics"] and degraded["states"]["Degraded"] == 1

    clusters = {c["name"]: c for c in _api(hub, "/api/v1/clusters").json()["items"]}
    assert clusters["store-us-001"]["labels"] == {"region": "us", "tier": "store"}
    assert clusters["lab-1"]["labels"] == {}

    for params, problem in [
        ({"limit": "0"}, "limit must be between 1 and 500, got 0"),
        ({"offset": "-1"}, "offset must be >= 0"),
        ({"limit": "ten"}, "limit must be a whole number"),
        ({"label": "tier in (core"}, "label filter"),
        ({"state": "Happy"}, "state must be one of"),
    ]:
        answer = _api(hub, "/api/v1/matrix", **params)
        assert answer.status_code == 400 and problem in answer.json()["error"], params


def test_the_shell_is_public_and_loads_nothing_from_elsewhere(hub: Hub) -> None:
    for path in ("/", "/ui/clusters/store-eu-001", "/ui/installations/a/b"):
        answer = requests.get(f"{hub.url}{path}", timeout=30)
        assert answer.status_code == 200 and "text/html" in answer.headers["content-type"]
        policy = answer.headers["content-security-policy"]
        assert "script-src 'self'" in policy and "connect-src 'self'" in policy
        assert "default-src 'none'" in policy
        # Every script and stylesheet is the hub's own.
        assert not re.search(r"""(src|href)=["']?(https?:)?//""", answer.text)
    script = requests.get(f"{hub.url}/ui/static/app.js", timeout=30)
    assert script.status_code == 200 and "javascript" in script.headers["content-type"]
    # The data is not public: the API still wants the token.
    assert requests.get(f"{hub.url}/api/v1/matrix", timeout=30).status_code == 401
    assert requests.get(f"{hub.url}/ui/static/nothing.js", timeout=30).status_code == 404


def test_a_fleet_repo_that_does_not_load_stops_the_hub(
    hub: Hub, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from hub.serve import main

    broken = write_fleet_dir(tmp_path / "fleet", {"edge-1": {"region": "eu"}})
    (broken / "clusters" / "more.yaml").write_text("name: Not_A_Name\n")
    args = ["--repo", hub.repo, "--tokens", str(hub.tokens), "--fleet", str(broken)]
    assert main([*args, "--listen", "127.0.0.1:1", "--cache-dir", str(tmp_path / "c")]) == 1
    error = capsys.readouterr().err
    assert error.startswith("error: ") and "clusters/more.yaml: name" in error


# --- rollouts --------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def rollout_hub(
    git_daemon: GitDaemon, mini_sigstore: MiniSigstore, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[tuple[Hub, str]]:
    """A hub over 12 simulated clusters whose ``web`` rollout halted after its canary wave:
    one canary rolled the new revision back (its agent is simulated; hub, git, signing real)."""
    workdir = tmp_path_factory.mktemp("dashboard-rollouts")
    name = f"rollouts-{workdir.name}"
    git_daemon.create_bare(f"{name}.git")
    status_path = git_daemon.create_bare(f"{name}-status.git")
    state_repo = git_daemon.url_for(f"{name}.git")
    status_repo = git_daemon.url_for(f"{name}-status.git")
    settings = {
        "name": "sim",
        "repo": "https://fleet.example.invalid/sim.git",
        "shards": {"repo": state_repo},
    }
    clusters = inventory(12, canaries=2)
    fleet = write_fleet(
        workdir / "fleet", clusters=clusters, bundles=[web_bundle(digest_of(1))], settings=settings
    )
    store = BranchStore(url=state_repo, cache_dir=workdir / "branches")
    status = FleetStatus(repo_url=status_repo, cache_dir=workdir / "status")
    controller = Controller(sharded=ShardedStore.of(store), status=status)
    signer = PublicationSigner.from_trust_config(
        trust_config=mini_sigstore.trust_config_path, token=mini_sigstore.mint_token()
    )
    controller.publish(prepare(fleet), signer=signer, actor="ci")
    agents = SimulatedAgents(cluster_repo=state_repo, status_repo=status_path, workdir=workdir)
    agents.tick()
    strategy = {
        "waves": [
            {"name": "canary", "clusterSelector": {"matchLabels": {"tier": "canary"}}},
            {"name": "rest", "pauseBefore": True},
        ]
    }
    write_fleet(
        fleet,
        clusters=clusters,
        bundles=[web_bundle(digest_of(2), rollout=strategy)],
        settings=settings,
    )
    controller.publish(prepare(fleet), signer=signer, actor="ci")
    canaries = sorted(c["name"] for c in clusters if c["labels"]["tier"] == "canary")
    agents.tick(broken=canaries[:1], bad=digest_of(2))
    controller.step(load_fleet(fleet), signer=signer)
    rollout = controller.read().active()[0]
    assert rollout.status == "Halted"
    store.close()
    tokens = workdir / "tokens.yaml"
    write_clear_tokens(tokens, {ADMIN: "admin", READER: "read"})
    extra = ["--tokens", str(tokens), "--fleet", str(fleet)]
    with serving_hub(status_repo, workdir, extra, stale_after="1h") as url:
        yield Hub(url, status_repo, workdir, tokens), rollout.id


def test_rollouts_show_waves_clusters_per_verdict_and_why_it_halted(
    rollout_hub: tuple[Hub, str], tab: Tab
) -> None:
    hub, rid = rollout_hub
    page = tab.page
    page.goto(f"{hub.url}/ui/rollouts#token={READER}")
    row = page.locator("#rollouts tbody tr")
    expect(row).to_have_count(1)
    expect(row.locator('[data-status="Halted"]')).to_be_visible()
    expect(row).to_contain_text("1 / 0")  # one failure, a budget of none
    expect(page.locator("main")).to_contain_text("does not step them")
    row.get_by_role("link", name=rid).click()
    expect(page.locator("#rollout-title")).to_contain_text(rid)
    assert page.url.endswith(f"/ui/rollouts/{rid}")
    # Why it halted: the reason, the cluster, what its agent reported.
    halt = page.locator("#halt")
    expect(halt).to_contain_text("1 cluster failed, more than maxFailures 0 allows (0)")
    expect(halt.locator("#halt-failures tbody tr")).to_have_count(1)
    expect(halt.locator("#halt-failures")).to_contain_text("RolledBack")
    # The waves with their clusters by verdict.
    waves = page.locator("#waves tbody tr")
    expect(waves).to_have_count(2)
    expect(waves.nth(0)).to_contain_text("canary")
    expect(waves.nth(0).locator('[data-verdict="passed"] strong')).to_have_text("1")
    expect(waves.nth(0).locator('[data-verdict="failed"] strong')).to_have_text("1")
    expect(waves.nth(1)).to_contain_text("waits for promote")
    expect(waves.nth(1).locator('[data-verdict="held"] strong')).to_have_text("10")
    # The clusters, filtered by verdict; the events with who and when.
    expect(page.locator("#members tbody tr")).to_have_count(12)
    page.get_by_label("Verdict").select_option("failed")
    expect(page.locator("#members tbody tr")).to_have_count(1)
    expect(page.locator("#members")).to_contain_text("was RolledBack")
    events = page.locator("#events tbody")
    expect(events).to_contain_text("created")
    expect(events).to_contain_text("halted")
    expect(events.locator("tr").first).to_contain_text("ci")
    page.get_by_label("Verdict").select_option("")
    expect(page.locator("#members tbody tr")).to_have_count(12)
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    page.screenshot(path=str(ARTIFACTS / "rollout.png"), full_page=True)


def test_a_hub_without_rollouts_says_so(hub: Hub, tab: Tab) -> None:
    tab.page.goto(f"{hub.url}/ui/rollouts#token={READER}")
    expect(tab.page.locator("#no-rollouts")).to_contain_text("does not serve rollouts")


# --- enrollment ------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def enroll_hub(git_daemon: GitDaemon, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Hub]:
    """A hub taking enrollment requests (``--enroll``), with one accepted by its token's
    policy, one pending (the policy said no) and one denied by hand."""
    from nacl.signing import SigningKey

    from agent.install.enroll import signed_request
    from hub.enroll.service import Enrollment
    from hub.enroll.tokens import create_token

    workdir = tmp_path_factory.mktemp("dashboard-enroll")
    enroll = workdir / "enroll"
    enroll.mkdir()
    (enroll / "trusted_root.json").write_text("{}")
    (enroll / "config.yaml").write_text(
        "repo: https://git.example.invalid/fleet.git\n"
        "statusRepo: https://git.example.invalid/status.git\n"
        "identity: https://ci.example.invalid/publish\nissuer: https://issuer.example.invalid\n"
        f"trustedRoot: trusted_root.json\ninventory: {workdir / 'enrolled.yaml'}\n"
    )
    auto = create_token(
        enroll, id="stores", labels={"tier": "edge"}, allow_labels=None, max_clusters=0,
        expires=timedelta(hours=1), approve="auto",
        policy="facts.kubernetesVersion.startsWith('v1.3')",
    )  # fmt: skip
    manual = create_token(
        enroll, id="by-hand", labels={}, allow_labels=None, max_clusters=0,
        expires=timedelta(hours=1), approve="manual",
    )  # fmt: skip
    service = Enrollment(enroll)
    for cluster, version, token in (
        ("store-new", "v1.34.1", auto), ("store-old", "v1.29.0", auto), ("store-x", "v1.30.0", manual),
    ):  # fmt: skip
        body, signature = signed_request(
            SigningKey.generate(), cluster=cluster, labels={},
            facts={"kubernetesVersion": version, "apiGroupVersions": ["v1"]},
        )  # fmt: skip
        service.submit(token, body, signature)
    service.decide("store-x", "deny", by="ops", reason="not one of ours")
    tokens = workdir / "tokens.yaml"
    write_clear_tokens(tokens, {ADMIN: "admin", READER: "read"})
    repo = new_repo(git_daemon, "dashboard-enroll")
    StatusPusher(repo, workdir / "agents").push({})
    with serving_hub(repo, workdir, ["--tokens", str(tokens), "--enroll", str(enroll)]) as url:
        yield Hub(url, repo, workdir, tokens)


def test_enrollment_requests_show_pending_accepted_and_denied(enroll_hub: Hub, tab: Tab) -> None:
    page = tab.page
    page.goto(f"{enroll_hub.url}/#token={READER}")
    page.get_by_role("link", name="Enrollments").click()
    assert page.url.endswith("/ui/enrollments")
    rows = page.locator("#enrollments tbody tr")
    expect(rows).to_have_count(3)
    shown = {
        row.locator("[data-cluster]").inner_text(): row.locator("[data-state]").inner_text()
        for row in rows.all()
    }
    assert shown == {"store-new": "accepted", "store-old": "pending", "store-x": "denied"}
    counts = page.locator("#enrollment-counts")
    for state in ("pending", "accepted", "denied"):
        expect(counts.locator(f'[data-count="{state}"] strong')).to_have_text("1")
    # Why one waits, who denied the other and why; what each reported.
    old = rows.filter(has_text="store-old")
    expect(old).to_contain_text("the token's policy is false for this request")
    expect(old).to_contain_text("v1.29.0")
    expect(rows.filter(has_text="store-x")).to_contain_text("not one of ours")
    expect(rows.filter(has_text="store-x")).to_contain_text("ops")
    expect(rows.filter(has_text="store-new")).to_contain_text("tier=edge")
    page.get_by_label("State").select_option("pending")
    expect(rows).to_have_count(1)
    expect(rows).to_contain_text("store-old")


def test_a_hub_without_enrollment_says_so(hub: Hub, tab: Tab) -> None:
    tab.page.goto(f"{hub.url}/ui/enrollments#token={READER}")
    expect(tab.page.locator("#no-enrollment")).to_contain_text("does not take enrollment requests")
