"""Test-side Helm: the real pinned helm (built into the cache like the Kubernetes binaries) to
package charts, index a Helm repository and push charts to the test registry, and a small real
HTTP server on loopback that serves a directory (a Helm repository, chart archives).
"""

from __future__ import annotations

import http.server
import re
import shutil
import subprocess
import threading
from pathlib import Path

from tests.realenv.binaries import ensure_tools

ASSETS = Path(__file__).resolve().parent.parent / "assets" / "charts"


def helm_binary() -> Path:
    """The pinned helm (built on first use)."""
    return ensure_tools(["helm"])["helm"]


class HelmCli:
    """The real helm with its state (config, cache, registry logins) inside ``home``."""

    def __init__(self, home: Path) -> None:
        self.home = home
        home.mkdir(parents=True, exist_ok=True)
        self.binary = helm_binary()

    def run(self, *args: str) -> str:
        env = {
            "PATH": "/usr/bin:/bin",
            "HOME": str(self.home),
            "HELM_CONFIG_HOME": str(self.home / "config"),
            "HELM_CACHE_HOME": str(self.home / "cache"),
            "HELM_DATA_HOME": str(self.home / "data"),
        }
        done = subprocess.run(
            [str(self.binary), *args], env=env, capture_output=True, text=True, timeout=120
        )
        if done.returncode != 0:
            raise AssertionError(f"helm {' '.join(args)} failed: {done.stderr.strip()}")
        return done.stdout + done.stderr

    def package(self, chart: Path, dest: Path, *, version: str | None = None) -> Path:
        """``helm package`` into ``dest``; returns the archive."""
        dest.mkdir(parents=True, exist_ok=True)
        args = ["package", str(chart), "--destination", str(dest)]
        if version is not None:
            args += ["--version", version]
        out = self.run(*args)
        match = re.search(r"saved it to: (\S+\.tgz)", out)
        assert match, out
        return Path(match.group(1))

    def index(self, repository: Path, url: str) -> Path:
        """``helm repo index`` of a directory of archives served at ``url``."""
        self.run("repo", "index", str(repository), "--url", url)
        return repository / "index.yaml"

    def push(self, archive: Path, registry_host: str, *, namespace: str = "charts") -> str:
        """``helm push`` to the (plain HTTP) registry; returns the manifest digest."""
        out = self.run("push", str(archive), f"oci://{registry_host}/{namespace}", "--plain-http")
        match = re.search(r"Digest: (sha256:[0-9a-f]{64})", out)
        assert match, out
        return match.group(1)


def copy_chart(name: str, dest: Path, *, version: str | None = None) -> Path:
    """A copy of the test chart ``tests/assets/charts/<name>`` (optionally with another
    version in its Chart.yaml) at ``dest/<name>``."""
    target = dest / name
    shutil.copytree(ASSETS / name, target)
    if version is not None:
        chart_yaml = target / "Chart.yaml"
        text = re.sub(r"(?m)^version: .*$", f"version: {version}", chart_yaml.read_text())
        chart_yaml.write_text(text)
    return target


class _Quiet(http.server.SimpleHTTPRequestHandler):
    def log_message(self, format: str, *args: object) -> None:
        pass


class StaticFiles:
    """A real HTTP server on loopback serving ``root``; counts the GETs it answered."""

    def __init__(self, root: Path) -> None:
        self.root = root
        root.mkdir(parents=True, exist_ok=True)
        self.gets: list[str] = []
        outer = self

        class Handler(_Quiet):
            def __init__(self, *args: object, **kwargs: object) -> None:
                super().__init__(*args, directory=str(root), **kwargs)  # type: ignore[arg-type]

            def do_GET(self) -> None:
                outer.gets.append(self.path)
                super().do_GET()

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    def url(self, name: str = "") -> str:
        return f"http://127.0.0.1:{self.server.server_address[1]}/{name}"

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()
        self.thread.join(timeout=10)
