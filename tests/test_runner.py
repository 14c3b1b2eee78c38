"""``fleetlet agent run`` as a supervisor and workers (``agent.runner``), against real parts.

- The supervisor stays small: after a whole tick done by a worker it has imported neither the
  ``kubernetes`` package, sigstore, oras nor the hub.
- Idle, it starts no worker: its drift checks compare resourceVersions and find nothing
  changed; an object edited in the cluster starts one, which puts it back.
- A worker killed (SIGKILL, as the OOM killer would) in the middle of an upgrade, or one that
  hangs past ``--worker-timeout``, is retried with backoff and reported (metrics, an Event and
  the ``WorkerFailed`` reason on every BundleDeployment); the retry finishes the move and the
  group ends wholly on the new revision.
- kill -9 of the supervisor during a move takes its worker with it (no orphan goes on moving
  the group); a restarted agent finishes the move.
- SIGTERM to ``agent run`` while its worker hangs (on a frozen API server, or stopped) ends the
  worker and its process group at once and exits 0 within seconds, not after
  ``--worker-timeout``; a stop asked for is no failure (no ``WorkerFailed`` anywhere), and a
  restarted agent finishes the interrupted move.
- Whatever a worker started dies with it, also a render tool in a process group of its own
  (as ``run_tool`` starts helm and kustomize) and that tool's children: at the worker's
  timeout, on a stop, and when the worker exits leaving one running; no process of its session
  is left, nor a zombie of the agent's.

The faults come from the agent's own fault injection, armed from outside once
(``FLEETLET_FAILPOINT=[stop:]<step>@FILE``: only while FILE exists, which the first worker to
get there removes).
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
import requests

from agent.kube import ApiNotServedError, KubeClient, ObjectRef
from tests.fleetlab import REPO_ROOT, Lab, conditions, configmap, live, namespace_manifest
from tests.realenv.gitserver import free_port
from tests.realenv.kube import Cluster
from tests.test_apply_group import crd
from tests.test_crash import Upgrades, Version
from tests.test_crds import crds as crds  # the fixture: the CRDs installed
from tests.test_metrics import value


def _wait(predicate: Callable[[], object], what: str, timeout: float = 120) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.3)


class Running:
    """An ``agent run`` process, its probe port and its log."""

    def __init__(self, popen: subprocess.Popen[bytes], port: int, log: Path) -> None:
        self.popen = popen
        self.port = port
        self.log = log

    def metric(self, name: str, **labels: str) -> float:
        text = requests.get(f"http://127.0.0.1:{self.port}/metrics", timeout=10).text
        return value(text, name, **labels) or 0.0

    def workers(self) -> list[int]:
        """The pids of this agent's worker processes (its children)."""
        found = []
        for entry in Path("/proc").iterdir():
            if not entry.name.isdigit():
                continue
            try:
                stat = (entry / "stat").read_text()
                cmdline = (entry / "cmdline").read_bytes()
            except OSError:
                continue
            ppid = int(stat[stat.rindex(")") + 2 :].split()[1])
            if ppid == self.popen.pid and b"agent.runner.worker" in cmdline:
                found.append(int(entry.name))
        return found


@contextmanager
def agent_run(
    lab: Lab,
    cluster: Cluster,
    *,
    namespace: str,
    workdir: Path,
    extra: list[str] | None = None,
    env: dict[str, str] | None = None,
) -> Iterator[Running]:
    port = free_port()
    log = workdir.parent / f"{workdir.name}-{port}.log"
    argv = [
        sys.executable, "-m", "fleetlet", "agent", "run",
        *lab.agent_args("edge-1", cluster, namespace=namespace, workdir=workdir),
        "--interval", "1", "--jitter", "0", "--probe-address", f"127.0.0.1:{port}",
        *(extra or []),
    ]  # fmt: skip
    popen = subprocess.Popen(
        argv,
        cwd=REPO_ROOT,
        stdout=subprocess.DEVNULL,
        stderr=log.open("w"),
        env={**os.environ, **(env or {})},
    )
    running = Running(popen, port, log)
    try:
        _wait(lambda: _answers(port), "the probe server")
        yield running
    finally:
        if popen.poll() is None:
            popen.send_signal(signal.SIGTERM)
            try:
                popen.wait(timeout=60)
            except subprocess.TimeoutExpired:
                popen.kill()
                popen.wait()
        print(log.read_text()[-6000:])  # shown when the test fails


def _answers(port: int) -> bool:
    try:
        return requests.get(f"http://127.0.0.1:{port}/healthz", timeout=2).status_code == 200
    except requests.RequestException:
        return False


def test_the_supervisor_imports_neither_the_cluster_client_nor_sigstore_nor_the_hub(
    lab: Lab, crds: Cluster, namespace: str, tmp_path: Path
) -> None:
    ns, name = lab.name("light"), lab.name("cfg")
    files = {"01.yaml": namespace_manifest(ns), "02.yaml": configmap("c", ns, {"v": "1"})}
    lab.publish([{"name": name, "sources": [lab.source("cfg", lab.push("cfg", files, tag="1"))]}])
    flags = lab.agent_args("edge-1", crds, namespace=namespace, workdir=tmp_path / "agent")
    script = f"""
import json, sys
from fleetlet.cli import build_parser
from agent.assemble import build_supervisor
from agent.cli import settings_from_args
args = build_parser(agent_only=True).parse_args(["agent", "run", *{flags!r}])
supervisor = build_supervisor(settings_from_args(args), log_level="error", log_format="text")
supervisor.poll()  # the first poll: a worker does the whole tick
supervisor.poll()  # idle: one ls-refs
roots = sorted({{m.split(".")[0] for m in sys.modules}})
print(json.dumps({{"roots": roots, "summary": supervisor.last.summary}}))
"""
    done = subprocess.run(
        [sys.executable, "-c", script], cwd=REPO_ROOT, capture_output=True, text=True, timeout=300
    )
    assert done.returncode == 0, done.stderr
    report = json.loads(done.stdout.splitlines()[-1])
    assert "moved" in report["summary"], report["summary"]
    assert live(KubeClient(kubeconfig=str(crds.kubeconfig)), "v1", "ConfigMap", "c", ns)
    heavy = {"kubernetes", "sigstore", "oras", "hub", "tuf", "requests"} & set(report["roots"])
    assert not heavy, f"the supervisor imported {heavy}"


def test_idle_agent_runs_no_worker_and_an_edited_object_starts_one_that_puts_it_back(
    lab: Lab, crds: Cluster, namespace: str, tmp_path: Path
) -> None:
    kube = KubeClient(kubeconfig=str(crds.kubeconfig))
    ns, name = lab.name("idle"), lab.name("cfg")
    files = {"01.yaml": namespace_manifest(ns), "02.yaml": configmap("c", ns, {"v": "one"})}
    lab.publish([{"name": name, "sources": [lab.source("cfg", lab.push("cfg", files, tag="1"))]}])
    extra = ["--drift-interval", "1", "--heartbeat", "2"]
    with agent_run(lab, crds, namespace=namespace, workdir=tmp_path / "a", extra=extra) as agent:
        _wait(lambda: _is_ready(kube, name), "Ready")
        # Settled: a pass that finds nothing to do, then drift checks that find nothing.
        _wait(lambda: agent.metric("fleetlet_agent_drift_checks_total", result="unchanged") >= 2,
              "two idle drift checks")  # fmt: skip
        runs = agent.metric("fleetlet_agent_worker_runs_total", job="drift", result="ok")
        ticks = agent.metric("fleetlet_agent_worker_runs_total", job="tick", result="ok")
        unchanged = agent.metric("fleetlet_agent_drift_checks_total", result="unchanged")
        polls = agent.metric("fleetlet_agent_polls_total", outcome="unchanged")
        _wait(lambda: agent.metric("fleetlet_agent_drift_checks_total", result="unchanged")
              >= unchanged + 3, "three more idle drift checks")  # fmt: skip
        assert agent.metric("fleetlet_agent_polls_total", outcome="unchanged") > polls
        assert agent.metric("fleetlet_agent_worker_runs_total", job="drift", result="ok") == runs
        assert agent.metric("fleetlet_agent_worker_runs_total", job="tick", result="ok") == ticks

        # Someone edits the ConfigMap: the next drift check sees it, a worker puts it back.
        kube.patch(ObjectRef("v1", "ConfigMap", "c", ns), {"data": {"v": "edited"}})
        _wait(lambda: (live(kube, "v1", "ConfigMap", "c", ns) or {}).get("data") == {"v": "one"},
              "the drift put back")  # fmt: skip
        assert agent.metric("fleetlet_agent_drift_checks_total", result="changed") >= 1
        # The worker put it back; the supervisor counts it once it has the worker's result.
        _wait(lambda: agent.metric("fleetlet_agent_drift_corrections_total") >= 1,
              "the correction counted")  # fmt: skip
        assert agent.metric("fleetlet_agent_worker_runs_total", job="drift", result="ok") > runs
        assert conditions(kube, name)["Ready"]["status"] == "True"


def test_an_optional_object_waits_idle_for_its_crd_and_is_applied_once_it_appears(
    lab: Lab, crds: Cluster, namespace: str, tmp_path: Path
) -> None:
    kube = KubeClient(kubeconfig=str(crds.kubeconfig))
    ns, name, group = lab.name("opt"), lab.name("cfg"), f"{lab.name('w')}.example.com"
    widget = (
        f"apiVersion: {group}/v1\nkind: Widget\n"
        f"metadata:\n  name: w\n  namespace: {ns}\nspec:\n  size: 1\n"
    )
    files = {"01.yaml": namespace_manifest(ns), "02.yaml": configmap("c", ns, {"v": "1"}),
             "03.yaml": widget}  # fmt: skip
    optional = [{"apiGroup": group, "kind": "Widget"}]
    source = lab.source("opt", lab.push("opt", files, tag="1"))
    lab.publish([{"name": name, "sources": [source], "optional": optional}])
    extra = ["--drift-interval", "1", "--heartbeat", "2"]
    with agent_run(lab, crds, namespace=namespace, workdir=tmp_path / "a", extra=extra) as agent:
        _wait(lambda: _is_ready(kube, name), "Ready")
        # The Widget's API is not served: skipped, and the idle drift checks run no worker.
        _wait(lambda: agent.metric("fleetlet_agent_drift_checks_total", result="unchanged") >= 2,
              "two idle drift checks")  # fmt: skip
        runs = agent.metric("fleetlet_agent_worker_runs_total", job="drift", result="ok")
        unchanged = agent.metric("fleetlet_agent_drift_checks_total", result="unchanged")
        _wait(lambda: agent.metric("fleetlet_agent_drift_checks_total", result="unchanged")
              >= unchanged + 2, "two more idle drift checks")  # fmt: skip
        assert agent.metric("fleetlet_agent_worker_runs_total", job="drift", result="ok") == runs
        bd = live(kube, "fleetlet.io/v1alpha1", "BundleDeployment", name)
        assert bd is not None and bd["status"]["resources"]["skipped"] == 1

        # Its CRD is installed: the next drift check sees it, a worker applies the Widget.
        kube.apply(crd(group), field_manager="test")

        def widget() -> object:
            try:
                return live(kube, f"{group}/v1", "Widget", "w", ns)
            except ApiNotServedError:
                return None  # the CRD is not established yet

        _wait(lambda: widget() is not None, "the Widget")
        assert agent.metric("fleetlet_agent_drift_checks_total", result="changed") >= 1


def _worker_failed_event(kube: KubeClient, bundle: str) -> list[str]:
    events = kube.list("v1", "Event", namespace="default")
    return [
        str(e.get("message") or "")
        for e in events
        if e.get("reason") == "WorkerFailed"
        and (e.get("involvedObject") or {}).get("name") == bundle
    ]


def test_a_worker_killed_mid_upgrade_is_retried_reported_and_the_group_ends_whole(
    lab: Lab, crds: Cluster, namespace: str, tmp_path: Path
) -> None:
    kube = KubeClient(kubeconfig=str(crds.kubeconfig))
    upgrades = Upgrades(lab, kube)
    armed = tmp_path / "armed"
    v1, v2 = Version(1), Version(2)
    upgrades.publish(v1)
    env = {"FLEETLET_FAILPOINT": f"applied@{armed}"}
    with agent_run(lab, crds, namespace=namespace, workdir=tmp_path / "a", env=env) as agent:
        _wait(lambda: _ready(kube, upgrades), "v1 Ready")
        armed.touch()  # the next worker to reach "applied" is killed there
        upgrades.publish(v2)
        _wait(lambda: not armed.exists(), "the worker killed at 'applied'")
        _wait(lambda: agent.metric("fleetlet_agent_worker_failures_total", cause="signal") == 1,
              "the failure counted")  # fmt: skip
        _wait(lambda: _ready(kube, upgrades) and _serial(kube, upgrades) == 2, "v2 Ready")
        upgrades.assert_wholly_on(v2, [v1, v2])
        messages = _worker_failed_event(kube, upgrades.web)
        assert messages and "killed by signal 9" in messages[0], messages
        assert agent.metric("fleetlet_agent_worker_failures_total", cause="signal") == 1


def _is_ready(kube: KubeClient, bundle: str) -> bool:
    bd = live(kube, "fleetlet.io/v1alpha1", "BundleDeployment", bundle)
    found = {c["type"]: c for c in ((bd or {}).get("status") or {}).get("conditions") or []}
    return found.get("Ready", {}).get("status") == "True"


def _ready(kube: KubeClient, upgrades: Upgrades) -> bool:
    return all(_is_ready(kube, b) for b in (upgrades.web, upgrades.conf))


def _serial(kube: KubeClient, upgrades: Upgrades) -> int | None:
    bd = live(kube, "fleetlet.io/v1alpha1", "BundleDeployment", upgrades.web) or {}
    applied = (bd.get("status") or {}).get("appliedRevision") or {}
    serial = applied.get("serial")
    return int(serial) if serial is not None else None


def test_a_hung_worker_is_killed_after_the_timeout_retried_and_the_move_finishes(
    lab: Lab, crds: Cluster, namespace: str, tmp_path: Path
) -> None:
    kube = KubeClient(kubeconfig=str(crds.kubeconfig))
    upgrades = Upgrades(lab, kube)
    armed = tmp_path / "armed"
    v1, v2 = Version(1), Version(2)
    upgrades.publish(v1)
    env = {"FLEETLET_FAILPOINT": f"stop:applied@{armed}"}
    extra = ["--worker-timeout", "20"]
    with agent_run(
        lab, crds, namespace=namespace, workdir=tmp_path / "a", env=env, extra=extra
    ) as agent:
        _wait(lambda: _ready(kube, upgrades), "v1 Ready")
        armed.touch()
        upgrades.publish(v2)
        _wait(lambda: not armed.exists(), "the worker stopped at 'applied'")
        hung = agent.workers()
        assert len(hung) == 1
        # While it hangs, the supervisor still answers and pushes heartbeats.
        assert requests.get(f"http://127.0.0.1:{agent.port}/healthz", timeout=5).status_code == 200
        _wait(lambda: agent.metric("fleetlet_agent_worker_failures_total", cause="timeout") == 1,
              "the timeout", timeout=90)  # fmt: skip
        assert not Path(f"/proc/{hung[0]}").exists()
        _wait(lambda: _ready(kube, upgrades) and _serial(kube, upgrades) == 2, "v2 Ready")
        upgrades.assert_wholly_on(v2, [v1, v2])
        messages = _worker_failed_event(kube, upgrades.web)
        assert messages and "did not finish within 20 s" in messages[0], messages


def test_kill_9_of_the_supervisor_takes_its_worker_and_a_restart_finishes_the_move(
    lab: Lab, crds: Cluster, namespace: str, tmp_path: Path
) -> None:
    kube = KubeClient(kubeconfig=str(crds.kubeconfig))
    upgrades = Upgrades(lab, kube)
    armed = tmp_path / "armed"
    v1, v2 = Version(1), Version(2)
    upgrades.publish(v1)
    env = {"FLEETLET_FAILPOINT": f"stop:applied@{armed}"}
    workdir = tmp_path / "a"
    with agent_run(lab, crds, namespace=namespace, workdir=workdir, env=env) as agent:
        _wait(lambda: _ready(kube, upgrades), "v1 Ready")
        armed.touch()
        upgrades.publish(v2)
        _wait(lambda: not armed.exists(), "the worker stopped at 'applied'")
        (worker,) = agent.workers()
        agent.popen.kill()  # kill -9 of the supervisor, its worker in the middle of the move
        agent.popen.wait()
        _wait(lambda: not Path(f"/proc/{worker}").exists(), "the worker gone with it", timeout=10)
        assert upgrades.intent_exists(namespace)  # the move was interrupted
    with agent_run(lab, crds, namespace=namespace, workdir=workdir):
        _wait(lambda: _ready(kube, upgrades) and _serial(kube, upgrades) == 2, "v2 Ready")
        upgrades.assert_wholly_on(v2, [v1, v2])
        assert not upgrades.intent_exists(namespace)


def _group_members(pgid: int) -> list[int]:
    """The pids of the processes (zombies too) in process group ``pgid``."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:
            continue
        if int(stat[stat.rindex(")") + 2 :].split()[2]) == pgid:
            found.append(int(entry.name))
    return found


def _stuck_worker(agent: Running, *, seconds: float = 3) -> int:
    """The pid of a worker seen running for ``seconds`` in a row."""
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        workers = agent.workers()
        if len(workers) == 1:
            since = time.monotonic()
            while agent.workers() == workers and time.monotonic() - since < seconds:
                time.sleep(0.2)
            if agent.workers() == workers:
                return workers[0]
        time.sleep(0.3)
    raise AssertionError("no worker stayed stuck")


def _status_history(lab: Lab) -> bytes:
    """Every status document the agent pushed to git (each commit of its status branch)."""
    import pygit2

    repo = pygit2.Repository(str((lab.status_git or lab.git).root / lab.status_name))
    ref = repo.references.get("refs/heads/fleetlet/status/edge-1")
    if ref is None:
        return b""
    said = []
    for commit in repo.walk(ref.target):
        for entry in commit.tree:
            if entry.type_str == "blob":
                said.append(repo[entry.id].data)
    return b"\n".join(said)


@pytest.mark.parametrize("hang", ["api-server-frozen", "worker-stopped"])
def test_sigterm_stops_agent_run_and_its_hung_worker_at_once_and_reports_no_failure(
    hang: str, lab: Lab, crds: Cluster, namespace: str, tmp_path: Path
) -> None:
    # Found by the 600 s soak: agent run waited for its worker (up to --worker-timeout)
    # before it exited. A frozen API server: the worker waits on it and dies of the SIGTERM;
    # a stopped worker (SIGSTOP, at "applied") cannot, and is killed after the grace.
    kube = KubeClient(kubeconfig=str(crds.kubeconfig))
    upgrades = Upgrades(lab, kube)
    armed = tmp_path / "armed"
    v1, v2 = Version(1), Version(2)
    upgrades.publish(v1)
    env = {"FLEETLET_FAILPOINT": f"stop:applied@{armed}"} if hang == "worker-stopped" else {}
    # Without the fix the worker would hold agent run for minutes: each of its requests to a
    # frozen API server waits 120 s (a new connection's TLS handshake is bounded by the
    # connect timeout), and the worker may run 300 s.
    extra = ["--worker-timeout", "300", "--connect-timeout", "120", "--read-timeout", "120"]
    workdir = tmp_path / "a"
    with agent_run(lab, crds, namespace=namespace, workdir=workdir, env=env, extra=extra) as agent:
        _wait(lambda: _ready(kube, upgrades), "v1 Ready")
        _wait(lambda: agent.metric("fleetlet_agent_polls_total", outcome="unchanged") >= 1,
              "an idle poll: the first worker is done")  # fmt: skip
        frozen = False
        try:
            if hang == "worker-stopped":
                armed.touch()
                upgrades.publish(v2)
                _wait(lambda: not armed.exists(), "the worker stopped at 'applied'")
            else:
                upgrades.publish(v2)
                _wait(lambda: agent.workers(), "the worker of v2")
                crds.freeze_apiserver()
                frozen = True
            worker = _stuck_worker(agent)
            assert agent.metric("fleetlet_agent_worker_failures_total") == 0
            started = time.monotonic()
            agent.popen.send_signal(signal.SIGTERM)
            code = agent.popen.wait(timeout=120)
            took = time.monotonic() - started
        finally:
            if frozen:
                crds.thaw_apiserver()
        assert code == 0
        assert took < 20, f"agent run took {took:.1f} s to stop"
        assert not _group_members(worker), "the worker's process group outlived agent run"
        log = agent.log.read_text()
        assert "was stopped" in log, log[-3000:]
        assert "WorkerFailed" not in log and "retried with backoff" not in log, log[-3000:]
        assert b"WorkerFailed" not in _status_history(lab)
    # The move the stop interrupted is finished by the next agent, and nothing says it failed.
    with agent_run(lab, crds, namespace=namespace, workdir=workdir, extra=extra):
        _wait(lambda: _ready(kube, upgrades) and _serial(kube, upgrades) == 2, "v2 Ready")
        upgrades.assert_wholly_on(v2, [v1, v2])
        assert not _worker_failed_event(kube, upgrades.web)
        for bundle in (upgrades.web, upgrades.conf):
            said = {c.get("reason") for c in conditions(kube, bundle).values()}
            assert "WorkerFailed" not in said, (bundle, said)


def _drive(driver: str, tmp_path: Path, worker: Path, *args: str) -> dict[str, Any]:
    """Run a launcher ``driver`` in a process of its own (it may make itself a subreaper, as
    a container's first process is) with ``tmp_path``, ``worker`` and ``args``; the JSON
    report it prints last. Its output goes to a file: a child left running would hold a pipe
    open."""
    log = tmp_path / "driver.log"
    with log.open("wb") as out:
        done = subprocess.run(
            [sys.executable, "-c", driver, str(tmp_path), str(worker), *args],
            cwd=REPO_ROOT,
            stdout=out,
            stderr=out,
            timeout=180,
        )
    text = log.read_text()
    assert done.returncode == 0, text
    report: dict[str, Any] = json.loads(text.splitlines()[-1])
    return report


_ORPHANS = """
import ctypes, json, os, pathlib, sys
from agent.runner.launcher import WorkerFailedError, WorkerLauncher

# As a container's first process would: orphans of the worker's tree become ours.
PR_SET_CHILD_SUBREAPER = 36
assert ctypes.CDLL(None, use_errno=True).prctl(PR_SET_CHILD_SUBREAPER, 1) == 0
work = pathlib.Path(sys.argv[1])
launcher = WorkerLauncher(workdir=work / "w", timeout=120, python=sys.argv[2])
try:
    launcher.run("tick", settings={}, progress_interval=1)
except WorkerFailedError as exc:
    cause = exc.cause
pid = int((work / "helper.pid").read_text())
try:
    state = pathlib.Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
except FileNotFoundError:
    state = "gone"
print(json.dumps({"cause": cause, "helper": state}))
"""


def test_a_killed_workers_children_are_killed_and_reaped_not_left_as_zombies(
    tmp_path: Path,
) -> None:
    # A "worker" that starts a helper (as it would start helm) and is then killed (SIGKILL).
    worker = tmp_path / "worker.sh"
    worker.write_text(
        "#!/bin/sh\n"
        "sleep 300 &\n"
        f"echo $! > {tmp_path}/helper.pid.tmp && mv {tmp_path}/helper.pid.tmp {tmp_path}/helper.pid\n"
        "kill -9 $$\n"
    )
    worker.chmod(0o755)
    report = _drive(_ORPHANS, tmp_path, worker)
    assert report["cause"] == "signal"
    # Killed with the worker and waited for: neither running nor a zombie of the agent.
    assert report["helper"] == "gone", report


_STOP = """
import ctypes, json, pathlib, sys, threading, time
from agent.runner.launcher import WorkerLauncher

PR_SET_CHILD_SUBREAPER = 36
assert ctypes.CDLL(None, use_errno=True).prctl(PR_SET_CHILD_SUBREAPER, 1) == 0
work = pathlib.Path(sys.argv[1])
launcher = WorkerLauncher(workdir=work / "w", timeout=300, python=sys.argv[2], stop_grace=2)
outcome = {}

def run():
    started = time.monotonic()
    try:
        launcher.run("tick", settings={}, progress_interval=1)
        outcome["raised"] = None
    except Exception as exc:
        outcome["raised"] = type(exc).__name__
    outcome["seconds"] = time.monotonic() - started

thread = threading.Thread(target=run)
thread.start()
while not (work / "helper.pid").exists():
    time.sleep(0.05)
worker = launcher.running
launcher.stop()
thread.join(120)
pid = int((work / "helper.pid").read_text())
try:
    state = pathlib.Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
except FileNotFoundError:
    state = "gone"
try:
    launcher.run("tick", settings={}, progress_interval=1)
    again = None
except Exception as exc:
    again = type(exc).__name__
print(json.dumps({**outcome, "helper": state, "again": again,
                  "started_again": (work / "started").read_text().count("x")}))
"""


@pytest.mark.parametrize("answers_sigterm", [True, False])
def test_stop_ends_the_running_worker_and_its_children_and_starts_no_other(
    answers_sigterm: bool, tmp_path: Path
) -> None:
    # A "worker" that starts a helper (as it would start helm) and then waits; one that
    # ignores SIGTERM (so does its helper) is killed with SIGKILL after the grace.
    worker = tmp_path / "worker.sh"
    worker.write_text(
        "#!/bin/sh\n"
        + ("" if answers_sigterm else "trap '' TERM\n")
        + f"printf x >> {tmp_path}/started\n"
        "sleep 300 &\n"
        f"echo $! > {tmp_path}/helper.pid.tmp && mv {tmp_path}/helper.pid.tmp {tmp_path}/helper.pid\n"
        "wait\n"
    )
    worker.chmod(0o755)
    report = _drive(_STOP, tmp_path, worker)
    # A stop asked for, not a failure; far sooner than the worker's 300 s timeout.
    assert report["raised"] == "WorkerStoppedError", report
    assert report["seconds"] < 60, report
    assert report["helper"] == "gone", report  # killed with the worker and reaped
    assert report["again"] == "WorkerStoppedError" and report["started_again"] == 1, report


_TOOL_WORKER = """#!{python}
# A stand-in worker: starts a "render tool" as run_tool does (in a process group of its own),
# which starts a child of its own, then hangs or exits leaving the tool running.
import json, os, pathlib, subprocess, sys, time

work = pathlib.Path({work!r})
tool = subprocess.Popen(
    ["sh", "-c", f"sleep 300 & echo $! > {{work}}/child.pid.tmp && mv {{work}}/child.pid.tmp {{work}}/child.pid; wait"],
    process_group=0,
)
while not (work / "child.pid").exists():
    time.sleep(0.02)
pids = {{"worker": os.getpid(), "tool": tool.pid, "tool_group": os.getpgid(tool.pid),
        "tool_session": os.getsid(tool.pid), "child": int((work / "child.pid").read_text())}}
(work / "pids.tmp").write_text(json.dumps(pids))
(work / "pids.tmp").rename(work / "pids.json")
if {ending!r} == "exit":
    sys.exit(0)
time.sleep(600)
"""

_SESSION = """
import ctypes, json, os, pathlib, sys, threading, time
from agent.runner.launcher import WorkerLauncher

work, ending, subreaper = pathlib.Path(sys.argv[1]), sys.argv[3], sys.argv[4] == "1"
if subreaper:  # as a container's first process: orphans of the worker's session become ours
    assert ctypes.CDLL(None, use_errno=True).prctl(36, 1) == 0  # PR_SET_CHILD_SUBREAPER
timeout = 8 if ending == "timeout" else 300
launcher = WorkerLauncher(workdir=work / "w", timeout=timeout, python=sys.argv[2], stop_grace=2)
outcome = {}

def run():
    started = time.monotonic()
    try:
        launcher.run("tick", settings={}, progress_interval=1)
    except Exception as exc:
        outcome.update(raised=type(exc).__name__, cause=getattr(exc, "cause", None))
    outcome["seconds"] = time.monotonic() - started

thread = threading.Thread(target=run)
thread.start()
if ending == "stop":
    deadline = time.monotonic() + 60
    while not (work / "pids.json").exists() and time.monotonic() < deadline:
        time.sleep(0.05)
    launcher.stop()
thread.join(120)
pids = json.loads((work / "pids.json").read_text())
left = []  # every process of the worker's session still in /proc, zombies too, with its state
for entry in pathlib.Path("/proc").iterdir():
    try:
        stat = (entry / "stat").read_text() if entry.name.isdigit() else ""
    except OSError:
        continue
    fields = stat[stat.rindex(")") + 2 :].split() if stat else []
    if fields and int(fields[3]) == pids["worker"]:
        left.append([int(entry.name), fields[0]])
print(json.dumps({**outcome, **pids, "left": left}))
"""


@pytest.mark.parametrize(
    ("ending", "subreaper"),
    [("timeout", True), ("stop", True), ("exit", True), ("exit", False)],
)
def test_a_render_tool_in_its_own_process_group_dies_with_its_worker(
    ending: str, subreaper: bool, tmp_path: Path
) -> None:
    # run_tool starts helm and kustomize in a process group of their own, which a kill of the
    # worker's process group missed: a tool outlived a worker killed at its timeout or by a
    # stop, or one that exited, its own time bound enforced by no one. The worker's whole
    # session is killed now, and what the agent inherited of it is reaped.
    worker = tmp_path / "worker.py"
    worker.write_text(_TOOL_WORKER.format(python=sys.executable, work=str(tmp_path), ending=ending))
    worker.chmod(0o755)
    report = _drive(_SESSION, tmp_path, worker, ending, str(int(subreaper)))
    for pid, state in report["left"]:
        if state not in "ZX":  # a failed run leaves nothing behind
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
    # The stand-in is what run_tool makes: the tool leads a group of its own, in the session.
    assert report["tool_group"] == report["tool"] != report["worker"], report
    assert report["tool_session"] == report["worker"], report
    expected = {
        "timeout": ("WorkerFailedError", "timeout"),
        "stop": ("WorkerStoppedError", None),
        "exit": ("WorkerFailedError", "result"),  # it wrote no result
    }[ending]
    assert (report["raised"], report["cause"]) == expected, report
    assert report["seconds"] < 90, report  # not the tool's 300 s
    if subreaper:
        # Killed and reaped: neither running nor a zombie of the agent.
        assert report["left"] == [], report
    else:
        # Not ours to reap: dead (a zombie at most, until init reaps it).
        assert all(state in "ZX" for _pid, state in report["left"]), report


def test_a_worker_gets_the_agents_guard_with_its_settings(tmp_path: Path) -> None:
    # The worker rebuilds the settings from the request file: the agent's own objects stay off
    # limits there too, with the bundles a cluster admin allowed.
    from agent.cli import settings_from_args
    from agent.settings import settings_from_dict, settings_to_dict
    from fleetlet.cli import build_parser

    args = build_parser(agent_only=True).parse_args(
        ["agent", "run", "--repo", "git://x/r.git", "--cluster", "c", "--namespace", "agent-ns",
         "--allow-agent-objects", "upgrade-agent, other", "--trusted-root", str(tmp_path / "r"),
         "--identity", "i", "--issuer", "https://issuer"]
    )  # fmt: skip
    settings = settings_from_args(args)
    again = settings_from_dict(json.loads(json.dumps(settings_to_dict(settings))))
    guard = again.reconcile.guard
    assert guard is not None and guard == settings.reconcile.guard
    assert guard.agent_namespace == "agent-ns"
    assert guard.allowed == {"upgrade-agent", "other"}


def test_a_worker_gets_every_setting_of_the_agent(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Found when merging the reliability work: the worker rebuilt its settings without the
    # timeouts, content limits and clock skew given to `agent run`, and used the defaults;
    # the same for the format plugins' bounds.
    monkeypatch.setenv("FLEETLET_PLUGIN_TIMEOUT", "5")
    monkeypatch.setenv("FLEETLET_PLUGIN_MAX_MEMORY", "100")
    from agent.cli import settings_from_args
    from agent.settings import settings_from_dict, settings_to_dict
    from fleetlet.cli import build_parser

    args = build_parser(agent_only=True).parse_args(
        ["agent", "run", "--repo", "git://x/r.git", "--cluster", "c", "--trusted-root",
         str(tmp_path / "r"), "--identity", "i", "--issuer", "https://issuer",
         "--connect-timeout", "2", "--read-timeout", "7", "--fetch-attempts", "5",
         "--max-bundle-bytes", "10Mi", "--max-bundle-files", "99", "--max-file-bytes", "1Mi",
         "--max-download-bytes", "3Mi", "--cache-max-bytes", "20Mi", "--clock-skew", "30s"]
    )  # fmt: skip
    settings = settings_from_args(args)
    again = settings_from_dict(json.loads(json.dumps(settings_to_dict(settings))))
    assert again.network == settings.network and again.network.read_timeout == 7.0
    assert again.limits == settings.limits and again.limits.max_bundle_files == 99
    assert again.trust.clock_skew == settings.trust.clock_skew
    assert again.trust.clock_skew.total_seconds() == 30
    assert again.tools.plugin_timeout == 5.0 and again.tools.plugin_max_memory == 100 << 20
    assert again == replace(settings, reconcile=again.reconcile)
