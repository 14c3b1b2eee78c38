"""The hub as it runs in production: HTTPS, hashed tokens, /metrics, keyless signing in CI.

- ``hub serve --tls-cert/--tls-key`` serves HTTPS only (a client checking the CA gets the API);
- tokens are stored hashed (``fleetlet hub tokens add`` prints a token once; the file never
  holds it); a file of the old clear-text format is refused with the command that converts it,
  and ``hub tokens migrate`` keeps the old tokens working;
- ``/metrics`` (a token needed) counts clusters by state and the status refreshes, parsed with
  prometheus_client's parser after a real aggregation of status branches;
- ``hub publish`` in a GitHub Actions job signs with the job's ambient OIDC credential, found
  the way sigstore-python finds it (the job's token endpoint, emulated on loopback, gives the
  mini Sigstore's token), and ``--metrics-file`` writes the publication's metrics.
"""

from __future__ import annotations

import datetime as dt
import ipaddress
import json
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from urllib.parse import parse_qs, urlparse

import pytest
import requests
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID

from agent.verify import verify_publication
from tests.fleetlab import REPO_ROOT
from tests.realenv.gitserver import GitDaemon, free_port
from tests.realenv.sigstore import MiniSigstore
from tests.statusfleet import cluster_document, write_status_repo
from tests.test_hub_publish import World, branch_files, fleetlet
from tests.test_hub_publish import http_files as http_files  # a fixture
from tests.test_hub_publish import world as world  # the fixture
from tests.test_metrics import value


def _self_signed(directory: Path) -> tuple[Path, Path]:
    """A certificate for 127.0.0.1 (it is its own CA) and its key."""
    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "fleetlet-hub test")])
    now = dt.datetime.now(dt.UTC)
    cert = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - dt.timedelta(minutes=5))
        .not_valid_after(now + dt.timedelta(hours=1))
        .add_extension(
            x509.SubjectAlternativeName([x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]),
            critical=False,
        )
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
        .sign(key, hashes.SHA256())
    )
    cert_path, key_path = directory / "tls.crt", directory / "tls.key"
    cert_path.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    key_path.write_bytes(
        key.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.NoEncryption(),
        )
    )
    return cert_path, key_path


@contextmanager
def https_hub(repo: str, workdir: Path, extra: list[str], ca: Path) -> Iterator[str]:
    """``python -m hub.serve`` over HTTPS on a free port; yields its base URL."""
    port = free_port()
    log = workdir / "hub.log"
    command = [
        sys.executable, "-m", "hub.serve", "--repo", repo, "--listen", f"127.0.0.1:{port}",
        "--refresh", "300ms", "--cache-dir", str(workdir / "cache"), *extra,
    ]  # fmt: skip
    with open(log, "ab") as out:
        process = subprocess.Popen(
            command, cwd=REPO_ROOT, stdout=out, stderr=out, start_new_session=True
        )
    url = f"https://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 60
        while True:
            try:
                requests.get(f"{url}/healthz", timeout=2, verify=str(ca))
                break
            except requests.ConnectionError:
                if process.poll() is not None or time.monotonic() > deadline:
                    raise RuntimeError(f"hub did not start: {log.read_text()}") from None
                time.sleep(0.1)
        yield url
    finally:
        os.killpg(process.pid, signal.SIGTERM)
        try:
            process.wait(timeout=20)
        except subprocess.TimeoutExpired:
            os.killpg(process.pid, signal.SIGKILL)
            process.wait(timeout=10)
            raise AssertionError(f"hub ignored SIGTERM: {log.read_text()[-3000:]}") from None


@pytest.fixture
def status_repo(git_daemon: GitDaemon) -> str:
    """A status repository with four clusters: Ready, Degraded (one bundle of two), RolledBack,
    and a stale one."""
    name = f"prod-status-{time.monotonic_ns()}.git"
    path = git_daemon.create_bare(name)
    write_status_repo(
        Path(path),
        {
            "edge-a": cluster_document("edge-a", {"web": "Ready", "db": "Ready"}),
            "edge-b": cluster_document("edge-b", {"web": "Ready", "db": "Degraded"}),
            "edge-c": cluster_document("edge-c", {"web": "RolledBack"}),
            "edge-old": cluster_document("edge-old", {"web": "Ready"}, stale=True),
        },
    )
    return git_daemon.url_for(name)


def test_https_hashed_tokens_and_metrics(status_repo: str, tmp_path: Path) -> None:
    cert, key = _self_signed(tmp_path)
    tokens = tmp_path / "tokens.yaml"
    made = fleetlet("hub", "tokens", "add", str(tokens), "--name", "ops", "--role", "admin")
    assert made.returncode == 0, made.stderr
    token = made.stdout.strip()
    assert len(token) >= 40
    stored = tokens.read_text()
    assert token not in stored and "sha256:" in stored and "name: ops" in stored
    assert oct(tokens.stat().st_mode & 0o777) == "0o600"

    extra = ["--tokens", str(tokens), "--tls-cert", str(cert), "--tls-key", str(key)]
    with https_hub(status_repo, tmp_path, extra, ca=cert) as url:
        auth = {"Authorization": f"Bearer {token}"}
        clusters = requests.get(
            f"{url}/api/v1/clusters", headers=auth, verify=str(cert), timeout=30
        )
        assert clusters.status_code == 200
        assert {c["name"] for c in clusters.json()["items"]} == {"edge-a", "edge-b", "edge-c", "edge-old"}  # fmt: skip
        assert (
            requests.get(f"{url}/api/v1/clusters", verify=str(cert), timeout=30).status_code == 401
        )
        wrong = {"Authorization": "Bearer " + token[:-1] + ("x" if token[-1] != "x" else "y")}
        assert requests.get(f"{url}/api/v1/clusters", headers=wrong, verify=str(cert), timeout=30).status_code == 401  # fmt: skip
        # HTTPS only: plain HTTP on the same port gets no answer.
        with pytest.raises(requests.ConnectionError):
            requests.get(url.replace("https://", "http://") + "/healthz", timeout=5)
        # /metrics, behind the same tokens.
        assert requests.get(f"{url}/metrics", verify=str(cert), timeout=30).status_code == 401
        scraped = requests.get(f"{url}/metrics", headers=auth, verify=str(cert), timeout=30)
    assert scraped.status_code == 200
    text = scraped.text
    assert value(text, "fleetlet_hub_clusters", state="Ready") == 1
    assert value(text, "fleetlet_hub_clusters", state="Degraded") == 1
    assert value(text, "fleetlet_hub_clusters", state="RolledBack") == 1
    assert value(text, "fleetlet_hub_clusters", state="Stale") == 1
    assert value(text, "fleetlet_hub_stale_clusters") == 1
    assert value(text, "fleetlet_hub_installations", state="Ready") == 3
    refreshes = value(text, "fleetlet_hub_status_refreshes_total", result="success")
    assert refreshes is not None and refreshes >= 1
    assert value(text, "fleetlet_hub_status_refresh_duration_seconds_count") == refreshes
    # JSON logs were asked for nowhere here: the hub logged text, and never the token.
    assert token not in (tmp_path / "hub.log").read_text()


def test_tls_needs_both_files(status_repo: str, tmp_path: Path) -> None:
    cert, _ = _self_signed(tmp_path)
    done = subprocess.run(
        [sys.executable, "-m", "fleetlet", "hub", "serve", "--repo", status_repo,
         "--allow-anonymous", "--tls-cert", str(cert)],
        capture_output=True, text=True, timeout=60, cwd=REPO_ROOT,
    )  # fmt: skip
    assert done.returncode == 1
    assert "--tls-cert and --tls-key go together" in done.stderr


def test_a_clear_text_tokens_file_is_refused_then_migrated(
    status_repo: str, tmp_path: Path
) -> None:
    old_token = "old-clear-token-0123456789"
    tokens = tmp_path / "tokens.yaml"
    tokens.write_text(f"{old_token}: read\n")
    refused = subprocess.run(
        [sys.executable, "-m", "fleetlet", "hub", "serve", "--repo", status_repo,
         "--tokens", str(tokens)],
        capture_output=True, text=True, timeout=60, cwd=REPO_ROOT,
    )  # fmt: skip
    assert refused.returncode == 1
    assert f"fleetlet hub tokens migrate {tokens}" in refused.stderr
    assert old_token not in refused.stderr
    migrated = fleetlet("hub", "tokens", "migrate", str(tokens))
    assert migrated.returncode == 0, migrated.stderr
    assert "1 tokens now stored as SHA-256 hashes" in migrated.stdout
    assert old_token not in tokens.read_text()
    from hub.api.tokens import load_tokens

    entry = load_tokens(tokens).check(old_token)
    assert entry is not None and entry.role == "read"


class _GitHubOidc(ThreadingHTTPServer):
    """GitHub Actions' ID-token endpoint: ``GET ?audience=A`` with the job's bearer token."""

    def __init__(self, sigstore: MiniSigstore, identity: str, request_token: str) -> None:
        self.requests: list[str] = []
        server = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                audience = parse_qs(urlparse(self.path).query).get("audience", [""])[0]
                server.requests.append(audience)
                if self.headers.get("Authorization") != f"bearer {request_token}":
                    self.send_response(403)
                    self.end_headers()
                    return
                body = json.dumps({"value": sigstore.minter.mint(identity, audience=audience)})
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.end_headers()
                self.wfile.write(body.encode())

            def log_message(self, format: str, *args: object) -> None:
                return

        super().__init__(("127.0.0.1", 0), Handler)


def test_publish_signs_with_the_ci_jobs_ambient_credential(world: World, tmp_path: Path) -> None:
    from tests.realenv.sigstore.mini import DEFAULT_IDENTITY

    repo = world.git.create_bare("hub-ambient.git")
    url = world.git.url_for("hub-ambient.git")
    fleet = world.fleet("fleet-ambient")
    endpoint = _GitHubOidc(world.sigstore, DEFAULT_IDENTITY, request_token="job-request-token")
    threading.Thread(target=endpoint.serve_forever, daemon=True).start()
    metrics_file = tmp_path / "publish.prom"
    env = {k: v for k, v in os.environ.items() if k != "SIGSTORE_ID_TOKEN"}
    env.update(
        {
            "GITHUB_ACTIONS": "true",
            "ACTIONS_ID_TOKEN_REQUEST_URL": f"http://127.0.0.1:{endpoint.server_address[1]}/token?api-version=2.0",
            "ACTIONS_ID_TOKEN_REQUEST_TOKEN": "job-request-token",
        }
    )  # fmt: skip
    try:
        done = subprocess.run(
            [sys.executable, "-m", "fleetlet", "hub", "publish", str(fleet), "--repo", url,
             "--trust-config", str(world.sigstore.trust_config_path), "-o", "json",
             "--metrics-file", str(metrics_file), "--log-format", "json", "--log-level", "info"],
            capture_output=True, text=True, timeout=300, cwd=REPO_ROOT, env=env,
        )  # fmt: skip
    finally:
        endpoint.shutdown()
    assert done.returncode == 0, done.stderr
    assert endpoint.requests == ["sigstore"]  # one token, for Sigstore's audience
    assert json.loads(done.stdout)["signed"] is True
    verify_publication(
        files=branch_files(Path(repo), "eu-core"),
        cluster="eu-core",
        last_serial=None,
        trust=world.trust(),
    )
    # Progress went out as JSON log lines.
    lines = [line for line in done.stderr.splitlines() if line.strip()]
    assert lines and all(json.loads(line)["level"] for line in lines)
    text = metrics_file.read_text()
    assert value(text, "fleetlet_hub_publishes_total", result="success") == 1
    assert value(text, "fleetlet_hub_publish_duration_seconds_count") == 1
    assert value(text, "fleetlet_hub_published_clusters", change="added") == 3
