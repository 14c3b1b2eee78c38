"""``fleetlet demo`` as a newcomer runs it: the README's first command, on real clusters.

One run is non-interactive (``--exit-when-ready``: exit 0 once every installation is Ready, with
the summary printed); one is interactive with ``--scenario failed-upgrade``: the tests read the
dashboard's address and read-only token from its output like a user, check the API and the
dashboard in a real browser (Debian's chromium), then press Ctrl-C (SIGINT) and check that
nothing the demo started is left running. A third run times out on purpose: non-zero exit, and
again nothing left behind.

Artifact: a screenshot of the demo fleet's matrix, ``test-artifacts/demo/matrix.png``.
"""

from __future__ import annotations

import base64
import os
import re
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

import pygit2
import pytest
import requests
import yaml
from playwright.sync_api import Page, expect

from agent.kube import KubeClient
from tests.fleetlab import live
from tests.realenv.browser import chromium

ROOT = Path(__file__).resolve().parent.parent
# The demo's scenarios are the long tier's (scripts/test.sh): each starts three clusters.
pytestmark = pytest.mark.slow

ARTIFACTS = Path(os.environ.get("FLEETLET_TEST_ARTIFACTS") or ROOT / "test-artifacts") / "demo"
CLUSTERS = ("store-eu-1", "store-eu-2", "store-us-1")
BUNDLES = (
    "metrics",
    "payments-config",
    "payments-db",
    "platform-crds",
    "platform-operator",
    "shop-backend",
    "shop-frontend",
)
GROUPS = {
    "metrics": "metrics",
    "payments-config": "payments-config",
    "payments-db": "payments-db",
    "platform-crds": "platform",
    "platform-operator": "platform",
    "shop-backend": "shop",
    "shop-frontend": "shop",
}
CANARY = "store-eu-1"
# The Secret the demo encrypts with sops once the agents have reported their age keys, in
# the publication after the first one (so every store's set is on serial 2 from then on).
SECRET = ("payments", "payments-db")
CODES = {"Ready": "R", "Progressing": "P", "Degraded": "D", "RolledBack": "RB", "Paused": "PA"}


def demo_command(workdir: Path, *args: str) -> list[str]:
    return [
        sys.executable, "-m", "fleetlet", "demo", "--workdir", str(workdir),
        "--interval", "2", *args,
    ]  # fmt: skip


def left_running(workdir: Path) -> list[str]:
    """Command lines of live processes that mention ``workdir`` (every component the demo
    starts has its state there: clusters, registry, git daemon, agents, hub)."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            argv = (entry / "cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        line = " ".join(a.decode(errors="replace") for a in argv if a)
        if str(workdir) in line and int(entry.name) != os.getpid():
            found.append(line[:200])
    return found


def summary(stdout: str, title: str) -> dict[tuple[str, str], tuple[str, str, str]]:
    """The table printed under ``title``: (cluster, bundle) -> (group, state, serial)."""
    after = stdout.split(title, 1)[1]
    lines = after[after.index("\nCLUSTER") + 1 :].split("\n\n")[0].splitlines()
    assert lines[0].split() == ["CLUSTER", "BUNDLE", "GROUP", "STATE", "SERIAL"]
    rows = {}
    for line in lines[1:]:
        cluster, bundle, group, state, serial = line.split()
        rows[(cluster, bundle)] = (group, state, serial)
    return rows


def ready_states() -> dict[tuple[str, str], str]:
    return {
        (c, b): "Paused" if (c, b) == ("store-us-1", "metrics") else "Ready"
        for c in CLUSTERS
        for b in BUNDLES
    }


def upgraded_states() -> dict[tuple[str, str], str]:
    states = ready_states()
    states[(CANARY, "shop-backend")] = states[(CANARY, "shop-frontend")] = "RolledBack"
    return states


def test_exit_when_ready_brings_the_example_fleet_to_ready_and_stops(tmp_path: Path) -> None:
    workdir = tmp_path / "demo"
    done = subprocess.run(
        demo_command(workdir, "--exit-when-ready"),
        capture_output=True,
        text=True,
        timeout=1800,
        cwd=ROOT,
    )
    assert done.returncode == 0, done.stderr[-4000:]
    rows = summary(done.stdout, "Every installation is Ready")
    assert {k: v[1] for k, v in rows.items()} == ready_states()
    assert {b: g for (_, b), (g, _, _) in rows.items()} == GROUPS
    # Everything installed is on the first serial but the encrypted Secret, on the second; the
    # paused bundle was never applied.
    assert {v[2] for k, v in rows.items() if v[1] == "Ready" and k[1] != "payments-db"} == {"1"}
    assert {v[2] for k, v in rows.items() if k[1] == "payments-db"} == {"2"}
    assert rows[("store-us-1", "metrics")][2] == "-"
    assert (
        "Secret payments/payments-db: encrypted with sops to the stores' age keys (only the "
        "ciphertext is in git), decrypted by each store's agent: in "
        "store-eu-1, store-eu-2, store-us-1." in done.stdout
    )
    # Progress was shown while it started.
    for said in (
        "[demo] starting 3 clusters",
        "[demo] pushed 8 bundle artifacts",
        "published",
        "[demo] encrypted Secret payments/payments-db with ",
    ):
        assert said in done.stderr
    assert re.search(r"^Dashboard: http://127\.0\.0\.1:\d+/#token=read-", done.stdout, re.M)
    assert left_running(workdir) == []


@pytest.mark.slow
def test_approval_scenario_previews_and_approves_on_the_canary(tmp_path: Path) -> None:
    """``--scenario approval``: payments-config v2 needs an approval; the production stores'
    ApprovalPolicy approves it, the canary waits until alice (a user of that cluster) has
    previewed and approved it."""
    workdir = tmp_path / "demo"
    done = subprocess.run(
        demo_command(workdir, "--scenario", "approval", "--exit-when-ready"),
        capture_output=True,
        text=True,
        timeout=1800,
        cwd=ROOT,
    )
    assert done.returncode == 0, done.stderr[-4000:]
    request = re.search(
        r"^\$ fleetlet preview (payments-config-s3-[0-9a-f]{6})$", done.stdout, re.M
    )
    assert request is not None, done.stdout
    assert f"Request:      {request.group(1)}\nCluster:      {CANARY}" in done.stdout
    assert "Objects (server-side dry run): 0 created, 1 changed" in done.stdout
    assert "+  endpoint: https://pay.example.com/v2/stores" in done.stdout
    assert f"BundleDeploymentRequest {request.group(1)} approved by alice" in done.stdout
    title = "Scenario approval: payments-config v2 approved by ApprovalPolicy store-defaults"
    rows = summary(done.stdout, title)
    for cluster in CLUSTERS:
        assert rows[(cluster, "payments-config")][1:] == ("Ready", "3"), rows
    assert left_running(workdir) == []


@pytest.mark.slow
def test_rollout_scenario_goes_canary_first_and_reverts_a_broken_version(tmp_path: Path) -> None:
    """``--scenario rollout``: payments-config v2 reaches the canary, waits for a promotion,
    is promoted (through the hub API, with the demo's admin token) and completes; a broken
    shop-backend v2 reaches the canary only, its rollout halts and the canary gets the previous
    version back: every store ends Ready, shop-backend on its first serial everywhere."""
    workdir = tmp_path / "demo"
    done = subprocess.run(
        demo_command(workdir, "--scenario", "rollout", "--exit-when-ready"),
        capture_output=True,
        text=True,
        timeout=1800,
        cwd=ROOT,
    )
    assert done.returncode == 0, done.stderr[-4000:]
    out = done.stdout
    payments = re.search(r"^rollout (payments-config-\S+): WaitingForPromotion", out, re.M)
    assert payments is not None, out
    assert re.search(rf"^{CANARY}\s+canary\s+released\s+\d+\s+passed", out, re.M)
    assert f"rollout {payments.group(1)}: promoted by ops-oncall: wave production" in out
    shop = re.search(r"^rollout (shop-\S+): Reverted", out, re.M)
    assert shop is not None, out
    assert f"  {CANARY}: shop-backend: serial 4 failed and was RolledBack" in out
    assert re.search(rf"^{CANARY}\s+canary\s+reverted\s+5\s+reverted", out, re.M)
    rows = summary(out, "Scenario rollout:")
    assert {k: v[1] for k, v in rows.items()} == ready_states()
    for cluster in CLUSTERS:
        assert rows[(cluster, "payments-config")][2] == "3", rows
        assert rows[(cluster, "shop-backend")][2] == "1", rows
    assert left_running(workdir) == []


def test_a_demo_that_times_out_exits_non_zero_and_stops_everything(tmp_path: Path) -> None:
    workdir = tmp_path / "demo"
    done = subprocess.run(
        demo_command(workdir, "--exit-when-ready", "--timeout", "3"),
        capture_output=True,
        text=True,
        timeout=1200,
        cwd=ROOT,
    )
    assert done.returncode == 1, done.stderr[-4000:]
    assert "timed out after 3s waiting for every installation Ready" in done.stderr
    assert "Every installation is Ready" not in done.stdout
    assert left_running(workdir) == []


# --- the interactive run --------------------------------------------------------------------


@dataclass
class RunningDemo:
    """``fleetlet demo --scenario failed-upgrade``, running until a test presses Ctrl-C."""

    process: subprocess.Popen[str]
    workdir: Path
    stdout: list[str] = field(default_factory=list)
    url: str = ""
    token: str = ""

    def text(self) -> str:
        return "".join(self.stdout)

    def get(self, path: str, token: str | None = None) -> Any:
        response = requests.get(
            f"{self.url}/api/v1{path}",
            headers={"Authorization": f"Bearer {token or self.token}"},
            timeout=30,
        )
        response.raise_for_status()
        return response.json()


def _pump(stream: IO[str], into: list[str]) -> None:
    for line in stream:
        into.append(line)


@pytest.fixture(scope="module")
def demo(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningDemo]:
    workdir = tmp_path_factory.mktemp("demo")
    errors = (workdir.parent / "demo.err").open("w")
    process = subprocess.Popen(
        demo_command(workdir, "--scenario", "failed-upgrade"),
        stdout=subprocess.PIPE,
        stderr=errors,
        text=True,
        cwd=ROOT,
    )
    running = RunningDemo(process=process, workdir=workdir)
    assert process.stdout is not None
    threading.Thread(target=_pump, args=(process.stdout, running.stdout), daemon=True).start()
    try:
        deadline = time.monotonic() + 1800
        while "Press Ctrl-C to stop everything." not in running.text():
            assert process.poll() is None, (workdir.parent / "demo.err").read_text()[-4000:]
            assert time.monotonic() < deadline, "the demo did not get ready"
            time.sleep(0.5)
        dashboard = re.search(r"^Dashboard: (http://127\.0\.0\.1:\d+)/#token=(\S+)$",
                              running.text(), re.M)  # fmt: skip
        assert dashboard is not None, running.text()
        running.url, running.token = dashboard.group(1), dashboard.group(2)
        yield running
    finally:
        if process.poll() is None:
            process.send_signal(signal.SIGINT)
            try:
                process.wait(timeout=180)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()
        errors.close()


def test_the_scenario_rolls_the_canarys_shop_group_back_and_the_rest_moves_on(
    demo: RunningDemo,
) -> None:
    text = demo.text()
    assert {k: v[1] for k, v in summary(text, "Every installation is Ready").items()} == (
        ready_states()
    )
    title = f"Scenario failed-upgrade: the shop group on {CANARY} rolled back"
    after = summary(text, title)
    assert {k: v[1] for k, v in after.items()} == upgraded_states()
    # payments-config moved to serial 3 everywhere (2 brought the encrypted Secret); the
    # canary's shop group is back on 1.
    for cluster in CLUSTERS:
        assert after[(cluster, "payments-config")][2] == "3"
    assert after[(CANARY, "shop-backend")][2] == after[(CANARY, "shop-frontend")][2] == "1"
    assert "catalog-api" in text.split(title, 1)[1].splitlines()[0]


def test_the_api_shows_the_rollback_its_runs_and_masked_outputs(demo: RunningDemo) -> None:
    items = demo.get("/installations")["items"]
    assert {(i["cluster"], i["bundle"]): i["state"] for i in items} == upgraded_states()

    runs = demo.get(f"/installations/{CANARY}/shop-backend/runs")["items"]
    latest = runs[0]
    assert (latest["result"], latest["serial"], latest["operation"]) == ("RolledBack", 3, "upgrade")
    assert latest["failedObject"] == "Deployment/shop/catalog-api", latest
    assert "health check timed out" in latest["message"], latest
    assert [(r["result"], r["serial"]) for r in runs[1:]] == [("Succeeded", 1)]

    outputs = demo.get("/installations/store-eu-2/payments-config/runs/latest/outputs")
    shown = {o["name"]: o["value"] for o in outputs["items"]}
    assert set(shown) == {"endpoint", "gateway-ip", "gateway-token"}
    assert shown["endpoint"].endswith("/v2/stores"), shown
    assert re.fullmatch(r"10\.96\.\d+\.\d+", shown["gateway-ip"]), shown
    assert shown["gateway-token"] == "<sensitive>"


def _open(page: Page, demo: RunningDemo, query: str = "") -> None:
    page.goto(f"{demo.url}/{query}#token={demo.token}")
    expect(page.locator("#matrix tbody tr").first).to_be_visible()


def test_the_dashboard_shows_the_demo_fleet(demo: RunningDemo) -> None:
    with chromium() as browser:
        page = browser.new_context(viewport={"width": 1280, "height": 720}).new_page()
        page.set_default_timeout(30_000)
        errors: list[str] = []
        page.on("pageerror", lambda error: errors.append(str(error)))
        _open(page, demo)
        cells = page.eval_on_selector_all(
            "#matrix td.cell:not(.none)",
            """cells => cells.map(c => [c.closest('tr').dataset.cluster, c.dataset.bundle,
                c.dataset.state, c.querySelector('a').textContent])""",
        )
        assert {(c, b): (s, code) for c, b, s, code in cells} == {
            key: (state, CODES[state]) for key, state in upgraded_states().items()
        }
        ARTIFACTS.mkdir(parents=True, exist_ok=True)
        page.screenshot(path=str(ARTIFACTS / "matrix.png"), full_page=True)

        # Filtering by state: only the canary has a rolled-back installation.
        page.get_by_label("State", exact=True).select_option("RolledBack")
        rows = page.locator("#matrix tbody tr[data-cluster]")
        expect(rows).to_have_count(1)
        expect(rows.first).to_have_attribute("data-cluster", CANARY)

        # The installation page: runs with their results, the sensitive output masked.
        page.goto(f"{demo.url}/ui/installations/store-eu-2/payments-config")
        expect(page.get_by_role("heading", level=1)).to_have_text(
            "Installation store-eu-2/payments-config"
        )
        expect(page.locator("#runs > tbody > tr").first).to_have_attribute(
            "data-result", "Succeeded"
        )
        outputs = page.locator("#outputs tbody tr")
        expect(outputs).to_have_count(3)
        token_row = outputs.filter(has_text="gateway-token")
        expect(token_row).to_contain_text("<sensitive>")
        expect(token_row.locator(".badge")).to_have_text("masked")
        page.goto(f"{demo.url}/ui/installations/{CANARY}/shop-backend")
        expect(page.locator("#runs > tbody > tr").first).to_have_attribute(
            "data-result", "RolledBack"
        )
        expect(page.locator("#runs > tbody > tr").first).to_contain_text(
            "Deployment/shop/catalog-api"
        )
        assert errors == []


def test_the_encrypted_secret_is_open_in_every_store_and_in_clear_in_no_git_blob(
    demo: RunningDemo,
) -> None:
    """The Secret the demo encrypted with sops to the stores' age keys: each store's API server
    has it decrypted; the fleet copy holds the ciphertext; no object of any git repository the
    demo made (fleet copy, cluster and status branches, the hub's and the agents' clones) holds
    the password, in clear or base64."""
    plain = yaml.safe_load((demo.workdir / "operator" / "payments-db.yaml").read_text())
    password = plain["stringData"]["password"]
    namespace, name = SECRET
    assert (plain["metadata"]["namespace"], plain["metadata"]["name"]) == SECRET
    for cluster in CLUSTERS:
        kubeconfig = demo.workdir / "clusters" / cluster / "admin.kubeconfig"
        secret = live(KubeClient(kubeconfig=str(kubeconfig)), "v1", "Secret", name, namespace)
        assert secret is not None, f"{cluster}: no Secret {namespace}/{name}"
        data = {k: base64.b64decode(v).decode() for k, v in secret["data"].items()}
        assert data == {"username": "payments", "password": password}, cluster
        assert "sops" not in secret
    committed = yaml.safe_load(
        (demo.workdir / "fleet" / "secrets" / "payments-db" / "01_secret.yaml").read_text()
    )
    assert committed["stringData"]["password"].startswith("ENC[AES256_GCM,")
    assert len(committed["sops"]["age"]) == len(CLUSTERS)
    needles = [password.encode(), base64.b64encode(password.encode())]
    repositories = sorted(
        head.parent for head in demo.workdir.rglob("HEAD") if (head.parent / "objects").is_dir()
    )
    names = {str(r.relative_to(demo.workdir)) for r in repositories}
    assert {"fleet/.git", "git/repos/fleet-state.git", "git/repos/fleet-status.git"} <= names, names
    for repository in repositories:
        repo = pygit2.Repository(str(repository))
        objects = [repo.odb.read(oid)[1] for oid in repo.odb]
        if repository.relative_to(demo.workdir).parts[0] in ("fleet", "git"):
            assert len(objects) > 10, repository  # the scan is not vacuous
        found = [n for n in needles for data in objects if n in data]
        assert not found, f"{repository}: the password in a git object"


def test_ctrl_c_stops_everything_the_demo_started(demo: RunningDemo) -> None:
    assert demo.process.poll() is None
    demo.process.send_signal(signal.SIGINT)
    assert demo.process.wait(timeout=180) == 0
    assert left_running(demo.workdir) == []
    with pytest.raises(requests.ConnectionError):
        requests.get(demo.url, timeout=5)
