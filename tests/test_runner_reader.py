"""The supervisor's metadata reader (agent/runner/reader.py): its LISTs against a real API
server on one kept connection, and a kept connection the server closed meanwhile replaced."""

from __future__ import annotations

import json
import threading
import uuid
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, ClassVar

import pytest

from agent.kube import KubeClient
from agent.runner.reader import ClusterReader, ReaderError, open_reader
from tests.realenv.kube import Cluster


def test_lists_names_uids_and_versions_on_one_kept_connection(kube_cluster: Cluster) -> None:
    namespace = f"reader-{uuid.uuid4().hex[:8]}"
    with KubeClient(kubeconfig=str(kube_cluster.kubeconfig)) as kube:
        kube.apply(
            {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": namespace}},
            field_manager="test",
        )
        made = [
            kube.apply(
                {
                    "apiVersion": "v1",
                    "kind": "ConfigMap",
                    "metadata": {"name": f"cm{i}", "namespace": namespace},
                    "data": {"i": str(i)},
                },
                field_manager="test",
            )
            for i in range(3)
        ]
        reader = open_reader(str(kube_cluster.kubeconfig))
        try:
            path = f"/api/v1/namespaces/{namespace}/configmaps"
            first = reader.list_versions(path)
            again = reader.list_versions(path)
            listed = {n: (v.uid, v.resource_version) for n, v in first.items()}
            listed.pop("kube-root-ca.crt", None)
            assert listed == {
                m["metadata"]["name"]: (m["metadata"]["uid"], m["metadata"]["resourceVersion"])
                for m in made
            }
            assert again == first
            # An edit is seen through the same reader.
            kube.apply(
                {"apiVersion": "v1", "kind": "ConfigMap",
                 "metadata": {"name": "cm0", "namespace": namespace}, "data": {"i": "edited"}},
                field_manager="test",
            )  # fmt: skip
            edited = reader.list_versions(path)
            assert edited["cm0"].resource_version != first["cm0"].resource_version
            assert edited["cm1"] == first["cm1"]
            with pytest.raises(ReaderError, match="HTTP 404"):
                reader.list_versions("/apis/nothing.example.com/v1/widgets")
            assert reader.list_versions(path) == edited  # the connection still serves
        finally:
            reader.close()
            kube.delete({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": namespace}})


class _Closing(BaseHTTPRequestHandler):
    """Answers a LIST with keep-alive, then closes the connection without saying so (as a
    server's idle timeout does between two drift checks)."""

    protocol_version = "HTTP/1.1"
    connections: ClassVar[list[int]] = []

    def handle(self) -> None:
        self.connections.append(1)
        self.handle_one_request()  # one answer, then the socket is closed under the client

    def do_GET(self) -> None:
        body = json.dumps(
            {"items": [{"metadata": {"name": "a", "uid": "u1", "resourceVersion": "7"}}],
             "metadata": {}}
        ).encode()  # fmt: skip
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args: Any) -> None:
        pass


@pytest.fixture
def closing_server() -> Iterator[ThreadingHTTPServer]:
    _Closing.connections = []
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Closing)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield server
    finally:
        server.shutdown()
        server.server_close()


def test_a_kept_connection_closed_by_the_server_is_replaced_once(
    closing_server: ThreadingHTTPServer,
) -> None:
    port = closing_server.server_address[1]
    reader = ClusterReader(server=f"http://127.0.0.1:{port}", context=None)
    try:
        for _ in range(3):
            listed = reader.list_versions("/api/v1/configmaps")
            assert listed["a"].resource_version == "7"
        assert len(_Closing.connections) == 3  # each closed one replaced by a new one
    finally:
        reader.close()
    closing_server.shutdown()
    closing_server.server_close()
    with pytest.raises(ReaderError):
        ClusterReader(server=f"http://127.0.0.1:{port}", context=None, timeout=2).list_versions(
            "/api/v1/configmaps"
        )
