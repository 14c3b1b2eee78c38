"""Real git servers on loopback: ``git daemon`` (git://, push enabled) and smart HTTP.

The HTTP server is this file run as a script: a small threaded HTTP server that checks basic
auth and runs ``git http-backend`` as a CGI for each request. It runs as a separate process so
tests can kill and restart it, and so its work does not compete for the test process's GIL.
Both servers keep their port and repositories across stop()/start().
"""

from __future__ import annotations

import argparse
import base64
import contextlib
import gzip
import hashlib
import hmac
import io
import json
import os
import re
import secrets
import signal
import socket
import subprocess
import sys
import threading
import time
import zlib
from collections.abc import Mapping
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from types import TracebackType
from typing import IO
from urllib.parse import unquote, urlsplit

GIT_BINARY = "git"
_REALM = "fleetlet-test-git"
_DAEMON_REQUEST = re.compile(r"Request (?P<service>[\w-]+) for '(?P<path>[^']*)'")


class GitServerError(RuntimeError):
    """A git server process could not be prepared, started or stopped."""


@dataclass(frozen=True)
class GitRequest:
    """One request a git server served: the service or HTTP method, the repository path."""

    method: str
    path: str
    query: str = ""
    status: int = 0
    user: str | None = None


def add_user(users_file: Path, name: str) -> str:
    """Add ``name`` with a new random password (returned) to a GitHttpServer's users file."""
    password = secrets.token_urlsafe(24)
    with Path(users_file).open("a") as out:
        out.write(f"{name} {hashlib.sha256(password.encode()).hexdigest()}\n")
    return password


def free_port() -> int:
    """Return a TCP port on 127.0.0.1 that was free a moment ago."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _server_env(home: Path) -> dict[str, str]:
    """Environment for server-side git: no user or system config leaks in."""
    return {
        "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
        "HOME": str(home),
        "GIT_CONFIG_NOSYSTEM": "1",
        "LANG": "C",
    }


class _GitServer:
    """What both servers share: a repository root, a fixed port, a process, a log."""

    scheme = ""

    def __init__(self, *, workdir: Path, port: int | None, startup_timeout: float) -> None:
        self.workdir = Path(workdir)
        self.root = self.workdir / "repos"
        self.home = self.workdir / "home"
        self.log_path = self.workdir / "server.log"
        self.root.mkdir(parents=True, exist_ok=True)
        self.home.mkdir(parents=True, exist_ok=True)
        # As GitHub, GitLab and Gitea serve: fetches may filter what they take (partial
        # clones; the hub's status refresh takes commits alone). A repository can say
        # otherwise with create_bare(config={"uploadpack.allowFilter": "false"}).
        (self.home / ".gitconfig").write_text("[uploadpack]\n\tallowFilter = true\n")
        self.port = port if port is not None else free_port()
        self.startup_timeout = startup_timeout
        self.startup_seconds: float | None = None
        self._process: subprocess.Popen[bytes] | None = None

    @property
    def host(self) -> str:
        return f"127.0.0.1:{self.port}"

    @property
    def running(self) -> bool:
        return self._process is not None and self._process.poll() is None

    def url_for(self, name: str) -> str:
        """The clone URL of repository ``name``."""
        return f"{self.scheme}://{self.host}/{name}"

    def create_bare(
        self,
        name: str,
        *,
        initial_branch: str = "main",
        hooks: Mapping[str, str] | None = None,
        config: Mapping[str, str] | None = None,
    ) -> Path:
        """Create an empty bare repository ``name`` under the root; return its path.

        ``hooks`` maps hook names (``pre-receive``...) to script text, made executable;
        ``config`` sets git config keys of the repository. Raises GitServerError if git fails.
        """
        path = self.root / name
        self._git("init", "--quiet", "--bare", f"--initial-branch={initial_branch}", str(path))
        for key, value in (config or {}).items():
            self._git("config", "--file", str(path / "config"), key, value)
        for hook, script in (hooks or {}).items():
            hook_path = path / "hooks" / hook
            hook_path.write_text(script)
            hook_path.chmod(0o755)
        return path

    def _git(self, *args: str) -> None:
        try:
            subprocess.run(
                [GIT_BINARY, *args],
                env=_server_env(self.home),
                capture_output=True,
                check=True,
                timeout=60,
            )
        except subprocess.CalledProcessError as exc:
            raise GitServerError(f"git {' '.join(args)}: {exc.stderr.decode().strip()}") from exc
        except (OSError, subprocess.SubprocessError) as exc:
            raise GitServerError(f"git {' '.join(args)}: {exc}") from exc

    def _command(self) -> list[str]:
        raise NotImplementedError

    def _environment(self) -> dict[str, str]:
        return _server_env(self.home)

    def start(self) -> None:
        """Start the server and wait until it accepts connections.

        Raises GitServerError if it exits or does not listen within startup_timeout.
        """
        if self.running:
            return
        began = time.monotonic()
        with open(self.log_path, "ab") as log:
            self._process = subprocess.Popen(
                self._command(),
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=log,
                env=self._environment(),
                cwd=self.workdir,
                start_new_session=True,
            )
        deadline = began + self.startup_timeout
        while not self._accepts():
            if self._process.poll() is not None:
                code = self._process.returncode
                self._process = None
                raise GitServerError(f"{self._command()[:2]} exited with {code}: {self._tail()}")
            if time.monotonic() > deadline:
                self.kill()
                raise GitServerError(f"git server not listening on {self.host}: {self._tail()}")
            time.sleep(0.02)
        self.startup_seconds = time.monotonic() - began

    def _accepts(self) -> bool:
        try:
            with socket.create_connection(("127.0.0.1", self.port), timeout=0.5):
                return True
        except OSError:
            return False

    def _tail(self, limit: int = 2000) -> str:
        try:
            return self.log_path.read_text(errors="replace")[-limit:]
        except OSError:
            return "(no log)"

    def stop(self, *, grace: float = 5.0) -> None:
        """Stop the server and its children: SIGTERM, then SIGKILL after ``grace`` seconds."""
        process = self._process
        if process is None:
            return
        # The whole process group: git daemon forks a child per connection.
        if grace > 0 and process.poll() is None:
            try:
                os.killpg(process.pid, signal.SIGTERM)
                process.wait(timeout=grace)
            except (ProcessLookupError, subprocess.TimeoutExpired):
                pass
        with contextlib.suppress(ProcessLookupError):
            os.killpg(process.pid, signal.SIGKILL)
        process.wait(timeout=30)
        self._process = None
        # Children of the leader die a moment later (they are not ours to wait for); until
        # then one of them may still hold the listening socket. "Stopped" means refused.
        deadline = time.monotonic() + 10.0
        while self._accepts() and time.monotonic() < deadline:
            time.sleep(0.02)

    def kill(self) -> None:
        """Stop at once with SIGKILL."""
        self.stop(grace=0)

    def freeze(self) -> None:
        """SIGSTOP the server and its children: connections are still accepted (by the
        kernel) and never answered, as a hung server. :meth:`thaw` resumes it."""
        if self._process is not None:
            os.killpg(self._process.pid, signal.SIGSTOP)

    def thaw(self) -> None:
        """SIGCONT after :meth:`freeze`."""
        if self._process is not None:
            os.killpg(self._process.pid, signal.SIGCONT)

    def __enter__(self) -> _GitServer:
        self.start()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.kill()


class GitDaemon(_GitServer):
    """``git daemon`` serving every repository under ``workdir/repos`` over git://, with push."""

    scheme = "git"

    def __init__(
        self, *, workdir: Path, port: int | None = None, startup_timeout: float = 30.0
    ) -> None:
        super().__init__(workdir=workdir, port=port, startup_timeout=startup_timeout)

    def _command(self) -> list[str]:
        # git-daemon itself, not the ``git daemon`` wrapper: one process less to stop.
        exec_path = subprocess.run(
            [GIT_BINARY, "--exec-path"], capture_output=True, text=True, check=True
        ).stdout.strip()
        return [
            str(Path(exec_path) / "git-daemon"),
            "--reuseaddr",
            "--listen=127.0.0.1",
            f"--port={self.port}",
            f"--base-path={self.root}",
            "--export-all",
            "--enable=receive-pack",
            "--informative-errors",
            "--verbose",
            "--log-destination=stderr",
            str(self.root),
        ]

    def requests(self, *, since: int = 0) -> list[GitRequest]:
        """Services requested so far (``upload-pack``/``receive-pack`` and the repository)."""
        records = [
            GitRequest(method=m["service"], path=m["path"])
            for m in _DAEMON_REQUEST.finditer(self._tail(limit=1 << 30))
        ]
        return records[since:]

    def request_count(self) -> int:
        return len(self.requests())


class GitHttpServer(_GitServer):
    """Smart HTTP (``git http-backend``) behind basic auth; every request needs credentials."""

    scheme = "http"

    def __init__(
        self,
        *,
        workdir: Path,
        username: str,
        password: str,
        port: int | None = None,
        startup_timeout: float = 30.0,
    ) -> None:
        super().__init__(workdir=workdir, port=port, startup_timeout=startup_timeout)
        self.username = username
        self.password = password
        self.request_log_path = self.workdir / "requests.jsonl"

    def _command(self) -> list[str]:
        return [
            sys.executable,
            str(Path(__file__).resolve()),
            "--port",
            str(self.port),
            "--root",
            str(self.root),
            "--request-log",
            str(self.request_log_path),
        ]

    def _environment(self) -> dict[str, str]:
        # Credentials go through the environment, not argv (visible to every user in ps).
        return {
            **super()._environment(),
            "FLEETLET_GIT_USER": self.username,
            "FLEETLET_GIT_PASSWORD": self.password,
        }

    @property
    def users_file(self) -> Path:
        """More users (``name sha256-of-password`` lines), read at each request."""
        return self.root.parent / "users"

    def add_user(self, name: str) -> str:
        """Let ``name`` in with a new random password (returned)."""
        return add_user(self.users_file, name)

    def requests(self, *, since: int = 0) -> list[GitRequest]:
        """HTTP requests served so far, in order (written before each response is sent)."""
        try:
            lines = self.request_log_path.read_text().splitlines()
        except FileNotFoundError:
            return []
        return [GitRequest(**json.loads(line)) for line in lines if line][since:]

    def request_count(self) -> int:
        return len(self.requests())


# --- the HTTP-to-CGI bridge (runs in the server process) ---------------------------------------


def _read_chunked(stream: io.BufferedIOBase) -> bytes:
    """Decode a chunked request body (libgit2 sends push packs this way)."""
    parts: list[bytes] = []
    while True:
        size_line = stream.readline(1024)
        if not size_line:
            raise ValueError("connection closed inside a chunked body")
        size = int(size_line.split(b";", 1)[0].strip(), 16)
        if size == 0:
            while stream.readline(1024) not in (b"\r\n", b"\n", b""):
                pass  # trailers
            return b"".join(parts)
        parts.append(stream.read(size))
        stream.readline(1024)  # the CRLF after each chunk


class _BridgeHandler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server: _BridgeServer

    def do_GET(self) -> None:
        self._serve()

    def do_POST(self) -> None:
        self._serve()

    def log_message(self, format: str, *args: object) -> None:
        sys.stderr.write(f"{self.address_string()} {format % args}\n")

    def _authenticated_user(self) -> str | None:
        header = self.headers.get("Authorization", "")
        scheme, _, encoded = header.partition(" ")
        if scheme.lower() != "basic":
            return None
        try:
            user, _, password = base64.b64decode(encoded).decode().partition(":")
        except (ValueError, UnicodeDecodeError):
            return None
        ok_user = hmac.compare_digest(user.encode(), self.server.username.encode())
        ok_password = hmac.compare_digest(password.encode(), self.server.password.encode())
        if ok_user and ok_password:
            return user
        # More users, added while it runs (``GitHttpServer.add_user``): "name sha256" lines.
        digest = hashlib.sha256(password.encode()).hexdigest()
        try:
            lines = self.server.users_file.read_text().splitlines()
        except FileNotFoundError:
            return None
        for line in lines:
            name, _, stored = line.partition(" ")
            if name == user and hmac.compare_digest(stored.encode(), digest.encode()):
                return user
        return None

    def _record(self, status: int, user: str | None) -> None:
        url = urlsplit(self.path)
        line = json.dumps(
            {
                "method": self.command,
                "path": unquote(url.path),
                "query": url.query,
                "status": status,
                "user": user,
            }
        )
        with self.server.log_lock:
            self.server.request_log.write(line + "\n")
            self.server.request_log.flush()

    def _serve(self) -> None:
        user = self._authenticated_user()
        if user is None:
            self._record(401, None)
            body = b"authentication required\n"
            self.send_response(401)
            self.send_header("WWW-Authenticate", f'Basic realm="{_REALM}"')
            self.send_header("Content-Type", "text/plain")
            self.send_header("Content-Length", str(len(body)))
            # The request body was not read: this connection cannot carry another request.
            self.send_header("Connection", "close")
            self.close_connection = True
            self.end_headers()
            self.wfile.write(body)
            return
        try:
            body = self._request_body()
        except (ValueError, OSError, EOFError, zlib.error) as exc:
            self._record(400, user)
            self.send_error(400, f"bad request body: {exc}")
            return
        status, headers, payload = self._run_backend(user, body)
        self._record(status, user)
        self.send_response(status)
        for name, value in headers:
            if name.lower() not in ("content-length", "transfer-encoding", "connection"):
                self.send_header(name, value)
        self.send_header("Content-Length", str(len(payload)))
        self.end_headers()
        self.wfile.write(payload)

    def _request_body(self) -> bytes:
        if "chunked" in self.headers.get("Transfer-Encoding", "").lower():
            body = _read_chunked(self.rfile)
        else:
            body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
        if self.headers.get("Content-Encoding", "").lower() in ("gzip", "x-gzip"):
            body = gzip.decompress(body)
        return body

    def _run_backend(self, user: str, body: bytes) -> tuple[int, list[tuple[str, str]], bytes]:
        url = urlsplit(self.path)
        env = {
            **_server_env(Path(os.environ.get("HOME", "/"))),
            "GIT_PROJECT_ROOT": str(self.server.root),
            "GIT_HTTP_EXPORT_ALL": "1",
            "REQUEST_METHOD": self.command,
            "PATH_INFO": unquote(url.path),
            "QUERY_STRING": url.query,
            "CONTENT_TYPE": self.headers.get("Content-Type", ""),
            "CONTENT_LENGTH": str(len(body)),
            "REMOTE_USER": user,
            "REMOTE_ADDR": self.client_address[0],
            "AUTH_TYPE": "Basic",
            "SERVER_PROTOCOL": "HTTP/1.1",
        }
        protocol = self.headers.get("Git-Protocol")
        if protocol:
            env["GIT_PROTOCOL"] = env["HTTP_GIT_PROTOCOL"] = protocol
        if user != self.server.username:
            own = _own_refs_only(self.server.root, unquote(url.path), user)
            if own:
                # Protocol v0: v2's fetch does not check wants against what was advertised,
                # so a hidden commit whose id is known could be fetched.
                env.pop("GIT_PROTOCOL", None)
                env.pop("HTTP_GIT_PROTOCOL", None)
            env |= own
        done = subprocess.run(
            [GIT_BINARY, "http-backend"], input=body, capture_output=True, env=env, check=False
        )
        if done.stderr:
            sys.stderr.write(done.stderr.decode(errors="replace"))
        head, sep, payload = done.stdout.partition(b"\r\n\r\n")
        if not sep:
            head, sep, payload = done.stdout.partition(b"\n\n")
        if not sep:
            return 502, [("Content-Type", "text/plain")], b"git http-backend gave no headers\n"
        status = 200
        headers: list[tuple[str, str]] = []
        for raw in head.decode("latin-1").splitlines():
            name, _, value = raw.partition(":")
            if name.lower() == "status":
                status = int(value.split()[0])
            elif name:
                headers.append((name.strip(), value.strip()))
        return status, headers, payload


def _own_refs_only(root: Path, path: str, user: str) -> dict[str, str]:
    """A repository whose config sets ``fleetlet.ownRefPrefix`` (e.g.
    ``refs/heads/fleetlet/clusters/``) shows a user other than the server's own only the ref
    named after them under that prefix: every other ref is hidden from upload-pack (not listed,
    not fetchable), through ``uploadpack.hideRefs`` given in the environment, as a web server
    in front of ``git http-backend`` can set per authenticated user, speaking protocol v0 to
    them (docs/operations.md, "Who may push what"). Pushes are the hooks' business."""
    parts = [p for p in path.split("/") if p]
    for i, part in enumerate(parts):
        if part.endswith(".git"):
            repository = root.joinpath(*parts[: i + 1])
            break
    else:
        return {}
    done = subprocess.run(
        [GIT_BINARY, "config", "--file", str(repository / "config"), "fleetlet.ownRefPrefix"],
        capture_output=True, text=True, check=False,
    )  # fmt: skip
    prefix = done.stdout.strip()
    if done.returncode != 0 or not prefix:
        return {}
    return {
        "GIT_CONFIG_COUNT": "3",
        "GIT_CONFIG_KEY_0": "uploadpack.hideRefs",
        "GIT_CONFIG_VALUE_0": "refs/",
        "GIT_CONFIG_KEY_1": "uploadpack.hideRefs",
        "GIT_CONFIG_VALUE_1": "HEAD",
        "GIT_CONFIG_KEY_2": "uploadpack.hideRefs",
        "GIT_CONFIG_VALUE_2": f"!{prefix}{user}",
    }


class _BridgeServer(ThreadingHTTPServer):
    daemon_threads = True

    def __init__(
        self, address: tuple[str, int], *, root: Path, username: str, password: str, log: IO[str]
    ) -> None:
        super().__init__(address, _BridgeHandler)
        self.root = root
        self.username = username
        self.password = password
        self.users_file = root.parent / "users"
        self.request_log = log
        self.log_lock = threading.Lock()


def _serve_http(argv: list[str]) -> None:
    parser = argparse.ArgumentParser(description="git smart HTTP with basic auth (tests only)")
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--root", type=Path, required=True)
    parser.add_argument("--request-log", type=Path, required=True)
    args = parser.parse_args(argv)
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
    with open(args.request_log, "a") as log:
        server = _BridgeServer(
            ("127.0.0.1", args.port),
            root=args.root,
            username=os.environ["FLEETLET_GIT_USER"],
            password=os.environ["FLEETLET_GIT_PASSWORD"],
            log=log,
        )
        server.serve_forever()


if __name__ == "__main__":
    _serve_http(sys.argv[1:])
