"""Fuzzing every parser of bytes that come from outside: the fleet repo loader, the manifest
loader, archive unpacking, the publication (statement, proof, set, and the whole verification),
the status document, the pkt-line / ls-refs client, and the hub API's requests.

Each input is a real seed (``tests/fuzz/corpus``, the example fleet, the example bundles)
mutated byte-wise, or random bytes (:mod:`tests.fuzz.mutate`). Whatever the input, the parser
accepts it or refuses it with fleetlet's own error (a :class:`~agent.errors.FleetletError`):
no other exception escapes, and the peak memory per input is bounded. ``FLEETLET_FUZZ_EXAMPLES``
sets the examples per parser (a few hundred by default, for CI; more for a long run by hand).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import socket
import tempfile
import threading
import tracemalloc
from collections.abc import Iterator
from datetime import datetime
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any
from urllib.parse import quote

import pytest
from hypothesis import given
from hypothesis import strategies as st

from agent.api.canonical import load_set
from agent.api.status import load_status
from agent.errors import FleetletError
from agent.render.manifests import parse_manifests
from agent.source.archive import extract_archive
from agent.source.lsrefs import NotProtocolV2, ls_ref_v2
from agent.verify import IdentityPolicy, TrustPolicy, verify_publication
from agent.verify.publication import ClusterProof, PublicationStatement
from hub.fleet.load import load_fleet
from tests.fuzz.mutate import (
    CORPUS,
    FUZZ,
    REPO_ROOT,
    Tally,
    inputs,
    json_inputs,
    seeds_in,
    survives,
    yaml_inputs,
)
from tests.realenv.gitserver import GitDaemon

EXAMPLES = REPO_ROOT / "fleet-examples"
PUBLICATION = CORPUS / "publication"
REPORT = os.environ.get("FLEETLET_FUZZ_REPORT")
"""A JSON file each test adds its tally to (examples run, how they ended): for docs."""


@pytest.fixture(scope="module", autouse=True)
def _tracing() -> Iterator[None]:
    tracemalloc.start()
    yield
    tracemalloc.stop()


@contextlib.contextmanager
def tallied(name: str) -> Iterator[Tally]:
    tally = Tally()
    yield tally
    if REPORT:
        path = Path(REPORT)
        data = json.loads(path.read_text()) if path.exists() else {}
        data[name] = {"examples": tally.examples, "endings": tally.errors}
        path.write_text(json.dumps(data, indent=2, sort_keys=True) + "\n")


# --- fleet repo loader (hub/fleet/load/) --------------------------------------------------


FLEET_FILES = {
    "fleet.yaml": seeds_in(EXAMPLES / "fleet.yaml"),
    "clusters/inventory.yaml": seeds_in(EXAMPLES / "clusters"),
    "bundles/fuzz.yaml": seeds_in(EXAMPLES / "bundles"),
}


def test_fleet_repo_loader() -> None:
    with tallied("fleet repo loader") as tally:

        @FUZZ
        @given(
            st.sampled_from(sorted(FLEET_FILES)).flatmap(
                lambda name: st.tuples(st.just(name), yaml_inputs(FLEET_FILES[name]))
            )
        )
        def run(case: tuple[str, bytes]) -> None:
            name, data = case
            with tempfile.TemporaryDirectory(prefix="fleetlet-fuzz-") as tmp:
                root = Path(tmp)
                for relative, seeds in FLEET_FILES.items():
                    path = root / relative
                    path.parent.mkdir(parents=True, exist_ok=True)
                    path.write_bytes(data if relative == name else seeds[0])
                survives(lambda: load_fleet(root), tally=tally)

        run()


# --- manifest loader (agent/render/manifests.py) -----------------------------------------


MANIFESTS = seeds_in(EXAMPLES / "content", pattern="*.yaml")


def test_manifest_loader() -> None:
    with tallied("manifest loader") as tally:

        @FUZZ
        @given(yaml_inputs(MANIFESTS), st.sampled_from(["m.yaml", "m.yml", "m.json"]))
        def run(data: bytes, file: str) -> None:
            survives(lambda: parse_manifests(data, source="fuzz", file=file), tally=tally)

        run()


# --- archive unpacking (agent/source/archive.py) -----------------------------------------


ARCHIVES = seeds_in(CORPUS / "archive")


def test_archive_unpacking() -> None:
    with tallied("archive unpacking") as tally:

        @FUZZ
        @given(inputs(ARCHIVES))
        def run(data: bytes) -> None:
            with tempfile.TemporaryDirectory(prefix="fleetlet-fuzz-") as tmp:
                root = Path(tmp)
                (root / "in.tar").write_bytes(data)
                dest = root / "out" / "tree"
                survives(lambda: extract_archive(root / "in.tar", dest, source="fuzz"), tally=tally)
                # Whatever happened, nothing was written beside the tree.
                outside = {p.name for p in root.iterdir()} | {
                    p.name for p in (root / "out").iterdir()
                }
                assert outside <= {"in.tar", "out", "tree"}, outside

        run()


# --- publication: statement, proof, set, verification (agent/verify/) -------------------


FILES = {p.name: p.read_bytes() for p in PUBLICATION.iterdir()}
META = json.loads(FILES["meta.json"])


@pytest.fixture(scope="module")
def trust() -> TrustPolicy:
    return TrustPolicy(
        trusted_root=PUBLICATION / "trusted_root.json",
        identity=IdentityPolicy(issuer=META["issuer"], subject=META["identity"]),
    )


def test_the_seed_publication_verifies(trust: TrustPolicy) -> None:
    """The fuzzing below starts from a publication that passes every check."""
    verified = verify_publication(
        files=FILES,
        cluster=META["cluster"],
        last_serial=None,
        trust=trust,
        now=datetime.fromisoformat(META["now"].replace("Z", "+00:00")),
    )
    assert verified.deployment_set.cluster == META["cluster"]


def _publication_inputs(name: str) -> st.SearchStrategy[bytes]:
    if name.endswith(".yaml"):
        return yaml_inputs([FILES[name]])
    return json_inputs([FILES[name]])


def test_publication_statement_and_proof() -> None:
    parsers = {
        "statement.json": lambda data: PublicationStatement.from_bytes(data),
        "proof.json": lambda data: ClusterProof.from_bytes(data),
        "set.yaml": lambda data: load_set(data, origin="fuzz"),
    }
    with tallied("publication statement, proof, set") as tally:

        @FUZZ
        @given(
            st.sampled_from(sorted(parsers)).flatmap(
                lambda name: st.tuples(st.just(name), _publication_inputs(name))
            )
        )
        def run(case: tuple[str, bytes]) -> None:
            name, data = case
            survives(lambda: parsers[name](data), tally=tally)

        run()


def test_publication_verification(trust: TrustPolicy) -> None:
    """One branch file mutated (or missing); the others as signed."""
    names = ["set.yaml", "statement.json", "statement.sigstore.json", "proof.json"]
    now = datetime.fromisoformat(META["now"].replace("Z", "+00:00"))
    with tallied("publication verification") as tally:

        @FUZZ
        @given(
            st.sampled_from(names).flatmap(
                lambda name: st.tuples(
                    st.just(name),
                    st.one_of(st.none(), _publication_inputs(name)),
                )
            )
        )
        def run(case: tuple[str, bytes | None]) -> None:
            name, data = case
            files = {n: FILES[n] for n in names if n != name}
            if data is not None:
                files[name] = data
            survives(
                lambda: verify_publication(
                    files=files, cluster=META["cluster"], last_serial=None, trust=trust, now=now
                ),
                tally=tally,
            )

        run()


# --- status document (agent/api/status.py) -----------------------------------------------


STATUS = seeds_in(CORPUS / "status")


def test_status_document() -> None:
    with tallied("status document") as tally:

        @FUZZ
        @given(json_inputs(STATUS))
        def run(data: bytes) -> None:
            survives(lambda: load_status(data, origin="fuzz"), tally=tally)

        run()


# --- pkt-line / ls-refs (agent/source/lsrefs.py) -----------------------------------------


class _Answering:
    """A git:// and an HTTP server on loopback whose answer to every request is ``answer``."""

    def __init__(self) -> None:
        self.answer = b""
        self.git = socket.create_server(("127.0.0.1", 0))
        self.git.settimeout(0.2)
        self._stop = threading.Event()
        threading.Thread(target=self._serve_git, daemon=True).start()
        outer = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, format: str, *args: object) -> None:
                return None

            def _reply(self) -> None:
                length = int(self.headers.get("Content-Length") or 0)
                self.rfile.read(length)
                self.send_response(200)
                self.send_header("Content-Length", str(len(outer.answer)))
                self.end_headers()
                self.wfile.write(outer.answer)

            do_GET = do_POST = _reply

        self.http = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.http.daemon_threads = True
        threading.Thread(target=self.http.serve_forever, daemon=True).start()

    def _serve_git(self) -> None:
        while not self._stop.is_set():
            try:
                conn, _ = self.git.accept()
            except TimeoutError:
                continue
            except OSError:
                if self._stop.is_set():  # the socket closed under accept() as the server stops
                    return
                raise
            with conn:
                conn.settimeout(2)
                with contextlib.suppress(OSError):
                    conn.recv(65536)
                    conn.sendall(self.answer)

    @property
    def urls(self) -> list[str]:
        return [
            f"git://127.0.0.1:{self.git.getsockname()[1]}/fleet.git",
            f"http://127.0.0.1:{self.http.server_address[1]}/fleet.git",
        ]

    def close(self) -> None:
        self._stop.set()
        self.http.shutdown()
        self.git.close()


def test_pkt_line_and_ls_refs() -> None:
    seeds = seeds_in(CORPUS / "pktline")
    server = _Answering()
    ref = "refs/heads/fleetlet/clusters/edge-1"
    try:
        with tallied("pkt-line / ls-refs") as tally:

            @FUZZ
            @given(inputs(seeds), st.sampled_from([0, 1]))
            def run(answer: bytes, which: int) -> None:
                server.answer = answer
                url = server.urls[which]
                survives(
                    lambda: ls_ref_v2(url, ref, None, connect_timeout=2, io_timeout=2),
                    # NotProtocolV2: the documented "use the libgit2 listing" answer.
                    allowed=(FleetletError, NotProtocolV2),
                    tally=tally,
                )

            run()
    finally:
        server.close()


# --- hub API requests (hub/api/) ---------------------------------------------------------


ADMIN = "admin-token-for-fuzzing"
READER = "read-token-for-fuzzing"


@pytest.fixture(scope="module")
def hub_app(git_daemon: GitDaemon, tmp_path_factory: pytest.TempPathFactory) -> Any:
    from hub.api.app import create_app
    from hub.status.aggregate import FleetStatus
    from tests.test_hub_status import StatusPusher, make_bundle, make_run, make_status, new_repo

    url = new_repo(git_daemon, "status-fuzz")
    runs = [make_run("edge-a", "web", 2, 1, result="RolledBack"), make_run("edge-a", "web", 1, 1)]
    StatusPusher(url, tmp_path_factory.mktemp("fuzz-agents")).push(
        {
            "edge-a": make_status("edge-a", bundles={"web": make_bundle(runs)}),
            "edge-b": make_status("edge-b"),
        }
    )
    status = FleetStatus(repo_url=url, cache_dir=tmp_path_factory.mktemp("fuzz-hub"))
    status.refresh()
    app = create_app(
        status=status,
        tokens={ADMIN: "admin", READER: "read"},
        labels={"edge-a": {"tier": "edge"}, "edge-b": {"tier": "core"}},
    )
    app.state.queries.warm()
    return app


async def _request(
    app: Any, method: str, target: bytes, headers: list[tuple[bytes, bytes]], body: bytes
) -> int:
    """One request through the ASGI app as uvicorn would hand it over; the status code."""
    raw_path, _, query = target.partition(b"?")
    from urllib.parse import unquote

    scope = {
        "type": "http",
        "asgi": {"version": "3.0"},
        "http_version": "1.1",
        "method": method,
        "scheme": "http",
        "path": unquote(raw_path.decode("ascii")),
        "raw_path": raw_path,
        "query_string": query,
        "root_path": "",
        "headers": headers,
        "client": ("127.0.0.1", 40000),
        "server": ("127.0.0.1", 8080),
    }
    pending = [{"type": "http.request", "body": body, "more_body": False}]
    status: list[int] = []

    async def receive() -> dict[str, Any]:
        return pending.pop(0) if pending else {"type": "http.disconnect"}

    async def send(message: dict[str, Any]) -> None:
        if message["type"] == "http.response.start":
            status.append(int(message["status"]))

    await app(scope, receive, send)
    return status[0]


_SEGMENT = st.one_of(
    st.sampled_from(["edge-a", "edge-b", "web", "latest", "1", "edge-a.web.1.1", "", ".."]),
    st.text(min_size=0, max_size=40),
)
_PATHS = st.one_of(
    st.tuples(
        st.sampled_from(
            [
                "/api/v1/clusters/{}",
                "/api/v1/installations/{}/{}",
                "/api/v1/installations/{}/{}/runs",
                "/api/v1/installations/{}/{}/runs/{}/outputs",
                "/api/v1/{}",
                "/ui/{}",
                "/{}",
            ]
        ),
        st.lists(_SEGMENT, min_size=3, max_size=3),
    ).map(lambda t: t[0].format(*(quote(s, safe="") for s in t[1]))),
    st.sampled_from(
        ["/api/v1/clusters", "/api/v1/installations", "/api/v1/matrix", "/api/v1/openapi.json", "/"]
    ),
)
_PARAM = st.sampled_from(
    ["label", "bundle", "state", "name", "offset", "limit", "cluster", "x", ""]
)
_VALUE = st.one_of(
    st.sampled_from(
        ["tier=edge", "tier in (edge,core)", "!tier", "tier!=x", "Ready", "-1", "0", "99999999999"]
    ),
    st.text(max_size=60),
)
_QUERY = st.lists(st.tuples(_PARAM, _VALUE), max_size=5).map(
    lambda pairs: "&".join(f"{quote(k, safe='')}={quote(v, safe='')}" for k, v in pairs)
)
_AUTH = st.one_of(
    st.sampled_from(
        [f"Bearer {ADMIN}", f"Bearer {READER}", "Bearer", "Basic eDp5", "", "bearer  "]
    ),
    st.binary(max_size=80).map(lambda b: b.decode("latin-1")),
)


def test_hub_api_requests(hub_app: Any) -> None:
    with tallied("hub API requests") as tally:

        @FUZZ
        @given(
            method=st.sampled_from(["GET", "GET", "GET", "HEAD", "POST", "PUT", "DELETE", "PATCH"]),
            path=_PATHS,
            query=st.one_of(_QUERY, st.binary(max_size=120).map(lambda b: quote(b, safe="=&"))),
            auth=_AUTH,
            extra=st.lists(
                st.tuples(st.binary(min_size=1, max_size=20), st.binary(max_size=60)), max_size=3
            ),
            body=st.binary(max_size=512),
        )
        def run(
            method: str,
            path: str,
            query: str,
            auth: str,
            extra: list[tuple[bytes, bytes]],
            body: bytes,
        ) -> None:
            target = (path + (f"?{query}" if query else "")).encode("ascii")
            headers = [(k.lower(), v) for k, v in extra]
            if auth:
                headers.append((b"authorization", auth.encode("latin-1")))
            codes: list[int] = []
            survives(
                lambda: codes.append(asyncio.run(_request(hub_app, method, target, headers, body))),
                allowed=(),
                tally=tally,
            )
            # An answer for the client's mistake, never a server error.
            assert codes and codes[0] < 500, (method, target, codes)

        run()


# --- the hub reading agents' status documents (hub/status/, hub/api/) -------------------------


def test_hub_status_documents_from_agents(tmp_path_factory: pytest.TempPathFactory) -> None:
    """A status document an agent (or anyone who can push to its branch) wrote: the hub's
    aggregation keeps it or marks it bad, and no API answer becomes a server error."""
    import pygit2

    from agent.api.status import SUMMARY_TRAILER
    from hub.api.app import create_app
    from hub.status.aggregate import FleetStatus

    tmp = tmp_path_factory.mktemp("fuzz-hub-status")
    signature = pygit2.Signature("agent", "agent@fleetlet.invalid", 1_700_000_000, 0)
    auth = [(b"authorization", f"Bearer {ADMIN}".encode())]
    targets = [
        b"/api/v1/clusters",
        b"/api/v1/clusters/edge-1",
        b"/api/v1/installations",
        b"/api/v1/installations?state=Ready",
        b"/api/v1/installations/edge-1/web",
        b"/api/v1/installations/edge-1/web/runs",
        b"/api/v1/installations/edge-1/web/runs/latest/outputs",
        b"/api/v1/installations/edge-1/conf/runs/edge-1.conf.2.1/outputs",
        b"/api/v1/matrix",
        b"/api/v1/matrix?state=Degraded&label=tier%3Dedge",
    ]
    good = STATUS[0]
    counter = iter(range(1_000_000))

    def hub_after(documents: list[bytes], *, as_summary: bool) -> Any:
        """A new hub that read ``documents``, one after the other, from edge-1's branch; the
        last one also as the summary in its commit's message, when ``as_summary``."""
        where = tmp / str(next(counter))
        bare = pygit2.init_repository(str(where / "status.git"), bare=True)
        status = FleetStatus(repo_url=str(where / "status.git"), cache_dir=where / "hub")
        ref = "refs/heads/fleetlet/status/edge-1"
        for document in documents:
            builder = bare.TreeBuilder()
            builder.insert("status.json", bare.create_blob(document), pygit2.GIT_FILEMODE_BLOB)
            parents = [bare.references[ref].target] if ref in bare.references else []
            message = "status"
            if as_summary and document is documents[-1]:
                line = document.decode("utf-8", "replace").replace("\n", " ")
                message = f"status\n\n{SUMMARY_TRAILER}: {line}\n"
            bare.create_commit(ref, signature, signature, message, builder.write(), parents)
            status.refresh()
        app = create_app(
            status=status, tokens={ADMIN: "admin"}, labels={"edge-1": {"tier": "edge"}}
        )
        app.state.queries.warm()
        return app

    with tallied("hub: status documents from agents") as tally:

        @FUZZ
        @given(json_inputs(STATUS), st.booleans(), st.booleans())
        def run(data: bytes, after_a_good_one: bool, as_summary: bool) -> None:
            def read() -> None:
                documents = [good, data] if after_a_good_one else [data]
                app = hub_after(documents, as_summary=as_summary)
                for target in targets:
                    code = asyncio.run(_request(app, "GET", target, auth, b""))
                    assert code < 500, (target, code)

            survives(read, allowed=(), tally=tally)

        run()
