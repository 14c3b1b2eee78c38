"""A static HTTP file server as its own process (``python -m http.server``), for http sources
that tests take down: :meth:`StaticHttpServer.kill` (refused connections) and
:meth:`StaticHttpServer.freeze` (SIGSTOP: connections accepted, never answered)."""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path
from types import TracebackType


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


class StaticHttpServer:
    """Serves the files of ``workdir/files`` on ``127.0.0.1``; the port stays the same across
    restarts."""

    def __init__(self, *, workdir: Path, startup_timeout: float = 30.0) -> None:
        self.root = Path(workdir) / "files"
        self.root.mkdir(parents=True, exist_ok=True)
        self.log_path = Path(workdir) / "http.log"
        self.port = free_port()
        self.startup_timeout = startup_timeout
        self._process: subprocess.Popen[bytes] | None = None

    @property
    def base(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def url_for(self, name: str) -> str:
        return f"{self.base}/{name}"

    def put(self, name: str, data: bytes) -> str:
        """Serve ``data`` as ``name``; returns its URL."""
        (self.root / name).write_bytes(data)
        return self.url_for(name)

    def start(self) -> None:
        """Start the server; returns once it accepts connections. Raises RuntimeError."""
        if self._process is not None:
            return
        with open(self.log_path, "ab") as log:
            self._process = subprocess.Popen(
                [sys.executable, "-m", "http.server", str(self.port), "--bind", "127.0.0.1",
                 "--directory", str(self.root)],
                stdin=subprocess.DEVNULL, stdout=log, stderr=log, start_new_session=True,
            )  # fmt: skip
        deadline = time.monotonic() + self.startup_timeout
        while not self._accepts():
            if self._process.poll() is not None or time.monotonic() > deadline:
                self.kill()
                raise RuntimeError(f"http server not listening on {self.base}")
            time.sleep(0.02)

    def _accepts(self) -> bool:
        try:
            with socket.create_connection(("127.0.0.1", self.port), timeout=0.5):
                return True
        except OSError:
            return False

    def kill(self) -> None:
        """Stop at once (SIGKILL): connections are refused from now on."""
        process, self._process = self._process, None
        if process is None:
            return
        with contextlib.suppress(ProcessLookupError):
            os.killpg(process.pid, signal.SIGKILL)
        process.wait(timeout=30)

    def freeze(self) -> None:
        """SIGSTOP: the kernel still accepts connections, nothing answers them."""
        if self._process is not None:
            os.killpg(self._process.pid, signal.SIGSTOP)

    def thaw(self) -> None:
        if self._process is not None:
            os.killpg(self._process.pid, signal.SIGCONT)

    def __enter__(self) -> StaticHttpServer:
        self.start()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.kill()
