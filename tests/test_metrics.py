"""Prometheus metrics of the agent (``agent.report.metrics``) and of the hub (``hub.api.metrics``).

Unit tests check that each recording method moves the series a user would alert on, read back
through ``prometheus_client.parser`` from the exposition text (what Prometheus scrapes). The
real tests scrape ``/metrics`` over HTTP: the agent's probe server after a real sync against a
real API server, git server, registry and Sigstore; the hub's ``hub serve`` after it
aggregated real status branches.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import pytest
import requests
from prometheus_client.parser import text_string_to_metric_families

from agent.errors import ReplayError
from agent.kube import KubeClient
from agent.probe import ProbeServer
from agent.render.confine import support
from agent.report.metrics import Metrics
from agent.source.branch import GitUnavailableError
from tests.fleetlab import Lab, configmap, namespace_manifest
from tests.realenv.git_fixtures import GitServerFactory
from tests.realenv.kube import Cluster
from tests.test_crds import crds as crds  # the fixture: the CRDs installed


def samples(text: str | bytes) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    """``{(sample name, sorted labels): value}`` of an exposition, parsed by prometheus_client."""
    if isinstance(text, bytes):
        text = text.decode()
    found: dict[tuple[str, tuple[tuple[str, str], ...]], float] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            found[(sample.name, tuple(sorted(sample.labels.items())))] = sample.value
    return found


def value(text: str | bytes, name: str, **labels: str) -> float | None:
    return samples(text).get((name, tuple(sorted(labels.items()))))


@dataclass
class _Pass:
    moved: tuple[str, ...] = ()
    rolled_back: tuple[str, ...] = ()
    failed: tuple[str, ...] = ()
    drift_corrected: int = 0


@dataclass
class _Tick:
    inbound: str = "unchanged"
    serial: int | None = 3
    outbound: _Pass | None = field(default_factory=_Pass)
    error: BaseException | None = None


# --- unit: each recording method ----------------------------------------------------------


def test_a_new_agent_exports_its_identity_and_zeroes() -> None:
    text = Metrics(cluster="edge-1", version="0.1.0").exposition()
    assert value(text, "fleetlet_agent_info", cluster="edge-1", version="0.1.0") == 1
    for result in ("success", "failed", "error"):
        assert value(text, "fleetlet_agent_syncs_total", result=result) == 0
    assert value(text, "fleetlet_agent_content_cache_lookups_total", result="hit") == 0
    assert value(text, "fleetlet_agent_status_pushes_total", result="failure") == 0
    assert value(text, "fleetlet_agent_accepted_serial") == 0
    # What this kernel offers renderers (the agent also logs it at start).
    found = support()
    assert value(text, "fleetlet_agent_render_confinement", mechanism="landlock") == (
        found.landlock_abi
    )
    assert value(text, "fleetlet_agent_render_confinement", mechanism="seccomp") == int(
        found.seccomp
    )


def test_recording_methods_move_their_series() -> None:
    metrics = Metrics(cluster="edge-1", version="0.1.0", clock=lambda: 1_700_000_000.0)
    metrics.poll_finished("rendered", 0.2)
    metrics.sync_finished("success", 1.5)
    metrics.sync_finished("failed", 3.0)
    metrics.serial_accepted(42)
    metrics.group_moved("web")
    metrics.group_moved("web")
    metrics.rolled_back("db")
    metrics.health_waited(12.0, healthy=False)
    metrics.refused("SerialNotNewer")
    metrics.drift_corrected(3)
    metrics.drift_corrected(0)
    metrics.cache_lookup(hit=True)
    metrics.cache_lookup(hit=False)
    metrics.cache_lookup(hit=True)
    metrics.status_pushed(ok=True)
    metrics.status_pushed(ok=False)
    text = metrics.exposition()
    assert value(text, "fleetlet_agent_polls_total", outcome="rendered") == 1
    assert value(text, "fleetlet_agent_poll_duration_seconds_count") == 1
    assert value(text, "fleetlet_agent_poll_duration_seconds_sum") == pytest.approx(0.2)
    assert value(text, "fleetlet_agent_syncs_total", result="success") == 1
    assert value(text, "fleetlet_agent_syncs_total", result="failed") == 1
    assert value(text, "fleetlet_agent_sync_duration_seconds_sum", result="failed") == 3.0
    # A failed sync does not move the time of the last successful one.
    assert value(text, "fleetlet_agent_last_successful_sync_timestamp_seconds") == 1.7e9
    assert value(text, "fleetlet_agent_accepted_serial") == 42
    assert value(text, "fleetlet_agent_group_moves_total", group="web") == 2
    assert value(text, "fleetlet_agent_group_rollbacks_total", group="db") == 1
    assert value(text, "fleetlet_agent_health_wait_duration_seconds_count", result="unhealthy") == 1
    assert value(text, "fleetlet_agent_verification_refusals_total", reason="SerialNotNewer") == 1
    assert value(text, "fleetlet_agent_drift_corrections_total") == 3
    assert value(text, "fleetlet_agent_content_cache_lookups_total", result="hit") == 2
    assert value(text, "fleetlet_agent_content_cache_lookups_total", result="miss") == 1
    assert value(text, "fleetlet_agent_status_pushes_total", result="success") == 1
    assert value(text, "fleetlet_agent_status_pushes_total", result="failure") == 1


def test_an_unknown_sync_result_is_refused() -> None:
    with pytest.raises(ValueError, match="sync result must be one of"):
        Metrics(cluster="c", version="v").sync_finished("ok", 1.0)


def test_record_tick_reads_what_a_tick_did() -> None:
    metrics = Metrics(cluster="c", version="v")
    metrics.record_tick(
        _Tick(inbound="rendered", serial=7, outbound=_Pass(moved=("a", "b"), drift_corrected=1)),
        2.0,
    )
    metrics.record_tick(
        _Tick(inbound="unchanged", serial=7, outbound=_Pass(rolled_back=("b",), failed=("b",))),
        1.0,
    )
    refusal = ReplayError("serial 6 is not newer than 7")
    metrics.record_tick(_Tick(inbound="failed", serial=7, error=refusal), 0.5)
    metrics.record_tick(_Tick(inbound="failed", serial=7, error=GitUnavailableError("down")), 0.5)
    metrics.record_tick(None, 0.1)  # raised before it had a result
    text = metrics.exposition()
    assert value(text, "fleetlet_agent_syncs_total", result="success") == 1
    assert value(text, "fleetlet_agent_syncs_total", result="failed") == 1
    assert value(text, "fleetlet_agent_syncs_total", result="error") == 3
    assert value(text, "fleetlet_agent_polls_total", outcome="rendered") == 1
    assert value(text, "fleetlet_agent_polls_total", outcome="failed") == 2
    assert value(text, "fleetlet_agent_accepted_serial") == 7
    assert value(text, "fleetlet_agent_group_moves_total", group="a") == 1
    assert value(text, "fleetlet_agent_group_rollbacks_total", group="b") == 1
    assert value(text, "fleetlet_agent_drift_corrections_total") == 1
    # Only a verification failure is a refusal; a git outage is not.
    assert value(text, "fleetlet_agent_verification_refusals_total", reason="SerialNotNewer") == 1
    assert not any(
        name == "fleetlet_agent_verification_refusals_total" and value_ > 0
        for (name, labels), value_ in samples(text).items()
        if ("reason", "SerialNotNewer") not in labels
    )


def test_instrument_records_a_tick_that_raises() -> None:
    metrics = Metrics(cluster="c", version="v")

    class Agent:
        last: _Tick | None = None

        def tick(self) -> _Tick:
            self.last = _Tick(inbound="failed", error=ReplayError("old"))
            raise self.last.error  # type: ignore[misc]

    tick = metrics.instrument(Agent())
    with pytest.raises(ReplayError):
        tick()
    text = metrics.exposition()
    assert value(text, "fleetlet_agent_syncs_total", result="error") == 1
    assert value(text, "fleetlet_agent_verification_refusals_total", reason="SerialNotNewer") == 1


# --- real: a sync, then a scrape of the probe server ----------------------------------------


def test_probe_server_serves_metrics_of_a_real_sync(
    lab: Lab, crds: Cluster, namespace: str, tmp_path: Path
) -> None:
    """A real agent syncs a published set twice (install, then a new serial); the probe
    server's /metrics, scraped over HTTP, says so."""
    ns, name = lab.name("metrics"), lab.name("cfg")

    def publish(value_: str) -> None:
        files = {"01.yaml": namespace_manifest(ns), "02.yaml": configmap("c", ns, {"v": value_})}
        lab.publish([{"name": name, "sources": [lab.source("cfg", lab.push("cfg", files, tag=value_))]}])  # fmt: skip

    publish("one")
    agent = lab.agent("edge-1", crds, namespace=namespace, workdir=tmp_path / "agent")
    metrics = Metrics(cluster="edge-1", version="test")
    tick = metrics.instrument(agent)

    class Poller:
        interval = 1.0
        running = True

    probe = ProbeServer("127.0.0.1:0", agent=agent, poller=Poller(), metrics=metrics)
    probe.start()
    try:
        tick()
        publish("two")
        tick()
        tick()  # nothing new: an unchanged poll
        response = requests.get(f"http://127.0.0.1:{probe.port}/metrics", timeout=10)
    finally:
        probe.stop()
    assert response.status_code == 200
    assert response.headers["Content-Type"].startswith("text/plain")
    text = response.text
    assert value(text, "fleetlet_agent_syncs_total", result="success") == 3
    assert value(text, "fleetlet_agent_polls_total", outcome="unchanged") == 1
    assert value(text, "fleetlet_agent_accepted_serial") == 2
    (group,) = {dict(labels)["group"] for (n, labels) in samples(text) if n == "fleetlet_agent_group_moves_total"}  # fmt: skip
    assert value(text, "fleetlet_agent_group_moves_total", group=group) == 2
    stamp = value(text, "fleetlet_agent_last_successful_sync_timestamp_seconds")
    assert stamp is not None and stamp > 1.7e9
    kube = KubeClient(kubeconfig=str(crds.kubeconfig))
    assert kube.get({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "c", "namespace": ns}})  # fmt: skip


# --- the content cache and the status pusher, wired directly ---------------------------------


def test_content_cache_counts_hits_and_misses(tmp_path: Path) -> None:
    from agent.source.cache import ContentCache

    metrics = Metrics(cluster="c", version="v")
    cache = ContentCache(root=tmp_path / "cache", max_bytes=1 << 20, metrics=metrics)
    key = "image:sha256:" + "a" * 64
    assert cache.lookup(key) is None  # a miss ...
    cache.store(key, lambda tree: (tree / "f.yaml").write_text("x: 1\n"))  # ... then filled
    assert cache.lookup(key) is not None
    assert cache.lookup(key) is not None
    text = metrics.exposition()
    assert value(text, "fleetlet_agent_content_cache_lookups_total", result="miss") == 1
    assert value(text, "fleetlet_agent_content_cache_lookups_total", result="hit") == 2


def test_status_pusher_counts_pushes_and_failures(
    git_server_factory: GitServerFactory, tmp_path: Path
) -> None:
    from agent.errors import TemporaryError
    from agent.report.push import StatusPusher
    from tests.test_status_push import status

    server = git_server_factory("daemon")
    server.create_bare("status.git")
    metrics = Metrics(cluster="edge-1", version="v")
    pusher = StatusPusher(
        repo_url=server.url_for("status.git"),
        cluster="edge-1",
        credentials=None,
        workdir=tmp_path / "status",
        connect_timeout=2,
        io_timeout=5,
        metrics=metrics,
    )
    pusher.update(status("edge-1"))
    pusher.push()
    server.stop()
    pusher.update(status("edge-1", note="changed"))
    with pytest.raises(TemporaryError):
        pusher.push()
    text = metrics.exposition()
    assert value(text, "fleetlet_agent_status_pushes_total", result="success") == 1
    assert value(text, "fleetlet_agent_status_pushes_total", result="failure") == 1
