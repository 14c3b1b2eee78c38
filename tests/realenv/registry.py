"""A real OCI registry on loopback: Debian's ``docker-registry`` (CNCF distribution 2.8).

The registry writes one access-log line per request (Apache combined format) to a file, so tests
can count the requests a piece of code made (for instance: a cached digest costs no request).
Stopping and starting again keeps the same port and the same storage, for "registry down, then
back" tests.
"""

from __future__ import annotations

import contextlib
import http.client
import os
import re
import signal
import socket
import subprocess
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType

import yaml

REGISTRY_BINARY = "/usr/bin/docker-registry"
HTPASSWD_BINARY = "/usr/bin/htpasswd"

# Requests the harness itself makes carry these user agents and are left out of requests().
_PROBE_AGENT = "fleetlet-realenv-probe"
_SYNC_AGENT = "fleetlet-realenv-sync"

# 127.0.0.1 - user [22/Nov/2026:22:30:00 +0000] "GET /v2/ HTTP/1.1" 200 2 "referer" "agent"
_COMBINED = re.compile(
    r'^(?P<addr>\S+) \S+ \S+ \[[^\]]*\] "(?P<method>[A-Z]+) (?P<target>\S+) [^"]*" '
    r'(?P<status>\d{3}) \S+ "[^"]*" "(?P<agent>[^"]*)"'
)


class RegistryError(RuntimeError):
    """The registry process could not be prepared, started or stopped."""


@dataclass(frozen=True)
class AccessRecord:
    """One request as the registry logged it."""

    method: str
    path: str
    status: int
    user_agent: str


def free_port() -> int:
    """Return a TCP port on 127.0.0.1 that was free a moment ago."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def htpasswd_line(username: str, password: str) -> str:
    """Return one bcrypt htpasswd line for ``username``.

    Raises RegistryError if ``htpasswd`` (apache2-utils) is missing or fails.
    """
    try:
        done = subprocess.run(
            [HTPASSWD_BINARY, "-Bbn", username, password],
            capture_output=True,
            text=True,
            check=True,
            timeout=30,
        )
    except (OSError, subprocess.SubprocessError) as exc:
        raise RegistryError(f"cannot create a bcrypt htpasswd entry: {exc}") from exc
    return done.stdout.strip() + "\n"


class Registry:
    """A ``docker-registry serve`` process with filesystem storage in ``workdir``.

    ``username``/``password`` (both or neither) turn on htpasswd basic auth. The port is chosen
    once and kept across stop()/start().
    """

    def __init__(
        self,
        *,
        workdir: Path,
        username: str | None = None,
        password: str | None = None,
        port: int | None = None,
        startup_timeout: float = 30.0,
        binary: str = REGISTRY_BINARY,
    ) -> None:
        if (username is None) != (password is None):
            raise ValueError("give both username and password, or neither")
        self.workdir = Path(workdir)
        self.username = username
        self.password = password
        self.port = port if port is not None else free_port()
        self.startup_timeout = startup_timeout
        self.binary = binary
        self.storage_dir = self.workdir / "storage"
        self.config_path = self.workdir / "config.yml"
        self.access_log_path = self.workdir / "access.log"
        self.error_log_path = self.workdir / "registry.log"
        self.htpasswd_path = self.workdir / "htpasswd"
        self.startup_seconds: float | None = None
        self._process: subprocess.Popen[bytes] | None = None
        self._sync_counter = 0
        self._write_config()

    @property
    def host(self) -> str:
        """``127.0.0.1:PORT``: the registry part of a reference."""
        return f"127.0.0.1:{self.port}"

    @property
    def url(self) -> str:
        """Base URL of the registry (plain HTTP)."""
        return f"http://{self.host}"

    @property
    def running(self) -> bool:
        return self._process is not None and self._process.poll() is None

    def _write_config(self) -> None:
        self.storage_dir.mkdir(parents=True, exist_ok=True)
        config: dict[str, object] = {
            "version": 0.1,
            # The access log goes to stdout (redirected to access.log); app logs go to stderr.
            "log": {"level": "info", "accesslog": {"disabled": False}},
            "storage": {
                "filesystem": {"rootdirectory": str(self.storage_dir)},
                "delete": {"enabled": True},
            },
            "http": {"addr": self.host},
        }
        if self.username is not None and self.password is not None:
            self.htpasswd_path.write_text(htpasswd_line(self.username, self.password))
            config["auth"] = {
                "htpasswd": {"realm": "fleetlet-test-registry", "path": str(self.htpasswd_path)}
            }
        self.config_path.write_text(yaml.safe_dump(config, sort_keys=True))

    def start(self) -> None:
        """Start the registry and wait until ``/v2/`` answers.

        Raises RegistryError if the process exits or does not answer within startup_timeout.
        """
        if self.running:
            return
        began = time.monotonic()
        # Append: a restart keeps earlier access records, so counts stay monotonic.
        with (
            open(self.access_log_path, "ab") as access,
            open(self.error_log_path, "ab") as errors,
        ):
            self._process = subprocess.Popen(
                [self.binary, "serve", str(self.config_path)],
                stdin=subprocess.DEVNULL,
                stdout=access,
                stderr=errors,
                start_new_session=True,
            )
        deadline = began + self.startup_timeout
        while True:
            if self._process.poll() is not None:
                code = self._process.returncode
                self._process = None
                raise RegistryError(
                    f"docker-registry exited with {code} at start-up: {self._log_tail()}"
                )
            if self._v2_answers():
                break
            if time.monotonic() > deadline:
                self.kill()
                raise RegistryError(
                    f"docker-registry did not answer on {self.url}/v2/ within "
                    f"{self.startup_timeout} s: {self._log_tail()}"
                )
            time.sleep(0.05)
        self.startup_seconds = time.monotonic() - began

    def _v2_answers(self) -> bool:
        try:
            status, _ = self._request("GET", "/v2/", agent=_PROBE_AGENT, timeout=1.0)
        except OSError:
            return False
        # With auth, /v2/ answers 401: that is still a live registry.
        return status in (200, 401)

    def _request(self, method: str, path: str, *, agent: str, timeout: float) -> tuple[int, bytes]:
        conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=timeout)
        try:
            conn.request(method, path, headers={"User-Agent": agent})
            response = conn.getresponse()
            return response.status, response.read()
        finally:
            conn.close()

    def _log_tail(self, limit: int = 2000) -> str:
        try:
            return self.error_log_path.read_text(errors="replace")[-limit:]
        except OSError:
            return "(no log)"

    def stop(self, *, grace: float = 5.0) -> None:
        """Stop with SIGTERM, then SIGKILL after ``grace`` seconds (0 kills at once)."""
        process = self._process
        if process is None:
            return
        if process.poll() is None:
            if grace > 0:
                os.killpg(process.pid, signal.SIGTERM)
                with contextlib.suppress(subprocess.TimeoutExpired):
                    process.wait(timeout=grace)
            if process.poll() is None:
                os.killpg(process.pid, signal.SIGKILL)
                process.wait(timeout=30)
        self._process = None

    def kill(self) -> None:
        """Stop at once with SIGKILL (the registry needs 2-3 s to exit after SIGTERM)."""
        self.stop(grace=0)

    def freeze(self) -> None:
        """SIGSTOP the registry: it still accepts connections (the kernel does) and never
        answers, as a hung server. :meth:`thaw` resumes it."""
        if self._process is not None:
            os.killpg(self._process.pid, signal.SIGSTOP)

    def thaw(self) -> None:
        """SIGCONT after :meth:`freeze`."""
        if self._process is not None:
            os.killpg(self._process.pid, signal.SIGCONT)

    def restart(self) -> None:
        """Kill and start again on the same port and storage."""
        self.kill()
        self.start()

    def __enter__(self) -> Registry:
        self.start()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.kill()

    # --- access log ---------------------------------------------------------------------------

    def _sync_log(self) -> None:
        """Make sure every request answered so far is in the access log.

        The registry writes the log line around the time it finishes the response, so a client
        may see its answer a moment before the line lands. A marker request, waited for in the
        log, closes that window.
        """
        if not self.running:
            return
        self._sync_counter += 1
        marker = f"/v2/_fleetlet_sync/{uuid.uuid4().hex}"
        try:
            self._request("GET", marker, agent=_SYNC_AGENT, timeout=5.0)
        except OSError:
            return
        deadline = time.monotonic() + 5.0
        while time.monotonic() < deadline:
            if marker in self.access_log_path.read_text(errors="replace"):
                return
            time.sleep(0.01)

    def _records(self) -> Iterator[AccessRecord]:
        try:
            text = self.access_log_path.read_text(errors="replace")
        except FileNotFoundError:
            return
        for line in text.splitlines():
            match = _COMBINED.match(line)
            if match is None:
                continue
            agent = match["agent"]
            if agent.startswith((_PROBE_AGENT, _SYNC_AGENT)):
                continue
            yield AccessRecord(
                method=match["method"],
                path=match["target"],
                status=int(match["status"]),
                user_agent=agent,
            )

    def requests(self, *, since: int = 0) -> list[AccessRecord]:
        """Requests the registry served (harness probes left out), from index ``since`` on."""
        self._sync_log()
        return list(self._records())[since:]

    def request_count(self) -> int:
        """Number of requests served so far (harness probes left out); use as a mark."""
        return len(self.requests())
