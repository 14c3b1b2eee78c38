"""Agent footprint: idle memory and CPU of ``fleetlet agent run``, and its peak memory while it
moves a 2,000-object group that includes a real Helm chart.

Starts one real control plane (``tests/realenv/kube.py``, CRDs and the agent namespace
installed), a registry, a ``git daemon`` and the mini Sigstore on loopback, pushes and
publishes (signed) a small set through the test harness (``tests/fleetlab.py``): three
bundles, each a Namespace, a Deployment, a ConfigMap and a Service. Then it runs the agent as
deployed, ``python3 -m fleetlet agent run ...`` (``Lab.agent_args``, probe server on), waits
until every BundleDeployment is Ready, lets it idle for ``--warmup`` seconds and measures:

- **idle**, for ``--seconds``: the memory of the agent's processes (``VmRSS``, ``RssAnon``,
  ``RssFile`` of ``/proc/<pid>/status``, sampled every second) and their CPU (``utime +
  stime`` and that of the children the agent reaped: its workers) over the window. The jobs
  run ``--scale`` times faster than in production (poll every 2 s instead of 30, heartbeat 4 s
  instead of 60, drift check 20 s instead of 300, the agent's Lease of 2 s instead of 30,
  renewed every third of it), so the window holds many of each; CPU per production hour is
  the window's CPU per hour divided by the scale, and so are the supervisor's requests to the
  API server (its ``fleetlet_agent_supervisor_api_requests_total``). Polls are the daemon's
  ``upload-pack`` requests, heartbeats its ``receive-pack`` requests for the status branch.
- **peak**, while the agent moves a new group of ``--objects`` objects: the podinfo chart
  (``tests/assets/charts/podinfo``, rendered by the real helm) and a plain bundle of the rest
  (5% Deployments, 15% Services, 30% Secrets, 50% ConfigMaps, as ``bench/apply.py``), from the
  publication's fetch and verification to every BundleDeployment Ready. Every 50 ms the
  agent's process tree (the agent, its workers, helm) is sampled: the sum of their ``VmRSS``,
  and the pod's memory as a memory limit sees it, each process's anonymous memory plus each
  mapped file counted once (``/proc/<pid>/smaps``: a library mapped by two processes is one
  page cache). Then the agent idles again and its memory is read once more.

For context it also measures, each in a fresh process, the RSS of ``python3 -c pass``, of the
supervisor's imports and of a worker's. Prints tables and one JSON line. From the repository
root (about 4 minutes; one cluster)::

    python3 bench/agent_footprint.py [--seconds 120] [--interval 2] [--warmup 30]
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import platform
import re
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:  # run as a script: the repository's packages and tests
    sys.path.insert(0, str(ROOT))

import yaml  # noqa: E402

from agent.kube import KubeClient  # noqa: E402
from tests.fleetlab import (  # noqa: E402
    Lab,
    configmap,
    deployment,
    namespace_manifest,
    service,
)
from tests.realenv.binaries import ensure_binaries  # noqa: E402
from tests.realenv.gitserver import GitDaemon  # noqa: E402
from tests.realenv.kube import Cluster  # noqa: E402
from tests.realenv.oci import OciClient, push_bundle  # noqa: E402
from tests.realenv.registry import Registry  # noqa: E402
from tests.realenv.sigstore import MiniSigstore  # noqa: E402

CRDS = ROOT / "crds"
CHART = ROOT / "tests" / "assets" / "charts" / "podinfo"
CLUSTER = "edge-1"
AGENT_NAMESPACE = "fleetlet-system"
IDLE_TARGET_MB = 60.0
PEAK_TARGET_MB = 150.0
CPU_TARGET_S = 2.0
PRODUCTION = {"interval": 30.0, "heartbeat": 60.0, "drift": 300.0, "lease": 30.0}
CLOCK_TICKS = os.sysconf("SC_CLK_TCK")

# Fresh processes for context: key -> (label, code run by `python3 -c`).
BASELINES: dict[str, tuple[str, str]] = {
    "pass": ("`python3 -c pass`", "pass"),
    "supervisor": (
        "the supervisor's imports (`agent run` before its first worker)",
        "import fleetlet.cli, agent.cli, agent.runner.supervisor, agent.schedule, agent.probe",
    ),
    "worker": (
        "a worker's imports (the whole agent: cluster client, sigstore, oras, reconcile)",
        "import agent.runner.worker, agent.cli, agent.loop, agent.inbound, agent.reconcile, "
        "agent.source.oci, agent.verify, sigstore.verify, sigstore.models, kubernetes.dynamic, "
        "kubernetes.config",
    ),
}


class BenchError(RuntimeError):
    """The set-up failed or the agent died (the message has its log tail)."""


# --- /proc ---------------------------------------------------------------------------------


def status_kb(pid: int) -> dict[str, int]:
    """The ``kB`` fields of ``/proc/<pid>/status`` (VmRSS, VmHWM, RssAnon, RssFile, ...)."""
    out: dict[str, int] = {}
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        key, _, value = line.partition(":")
        parts = value.split()
        if len(parts) == 2 and parts[1] == "kB":
            out[key] = int(parts[0])
    return out


def cpu_seconds(pid: int) -> float:
    """utime + stime + cutime + cstime of ``/proc/<pid>/stat``, in seconds (the children the
    process reaped count: the agent's workers)."""
    stat = Path(f"/proc/{pid}/stat").read_text()
    fields = stat[stat.rindex(")") + 2 :].split()
    utime, stime, cutime, cstime = (int(f) for f in fields[11:15])
    return (utime + stime + cutime + cstime) / CLOCK_TICKS


def descendants(pid: int) -> list[int]:
    """``pid`` and every process below it (``/proc/<pid>/task/<tid>/children``)."""
    found, todo = [], [pid]
    while todo:
        current = todo.pop()
        found.append(current)
        with contextlib.suppress(OSError):
            for task in Path(f"/proc/{current}/task").iterdir():
                with contextlib.suppress(OSError):
                    todo.extend(int(c) for c in (task / "children").read_text().split())
    return found


def command(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode().strip()
    except OSError:
        return ""


def role(pid: int, agent: int) -> str:
    if pid == agent:
        return "agent"
    line = command(pid)
    if "agent.runner.worker" in line:
        return "worker"
    for tool in ("helm", "kustomize", "git", "prlimit"):
        if re.search(rf"(^|/){tool}\b", line):
            return tool
    return "other"


_SMAPS_HEADER = re.compile(r"^[0-9a-f]+-[0-9a-f]+ \S+ \S+ (\S+) (\d+)\s*(.*)$")


def file_pages(pid: int) -> dict[tuple[str, str], int]:
    """kB of file-backed resident pages per mapped file (device, inode) of ``pid``."""
    out: dict[tuple[str, str], int] = {}
    key: tuple[str, str] | None = None
    rss = anonymous = 0

    def flush() -> None:
        if key is not None and key[1] != "0":
            out[key] = out.get(key, 0) + max(rss - anonymous, 0)

    with contextlib.suppress(OSError):
        for line in Path(f"/proc/{pid}/smaps").read_text().splitlines():
            header = _SMAPS_HEADER.match(line)
            if header:
                flush()
                key, rss, anonymous = (header.group(1), header.group(2)), 0, 0
            elif line.startswith("Rss:"):
                rss = int(line.split()[1])
            elif line.startswith("Anonymous:"):
                anonymous = int(line.split()[1])
        flush()
    return out


@dataclass
class TreeSample:
    """The agent's process tree at one moment (kB)."""

    rss_kb: int
    pod_kb: int
    """Each process's anonymous memory, plus each mapped file's resident pages once."""
    by_role: dict[str, int]
    pids: list[int]
    anon_by_role: dict[str, int] = field(default_factory=dict)
    files_kb: int = 0


class TreeSampler:
    """Samples the agent's process tree every ``period`` seconds in a thread; keeps peaks."""

    def __init__(self, agent: int, period: float = 0.05) -> None:
        self.agent = agent
        self.period = period
        self.peak_rss: TreeSample | None = None
        self.peak_pod: TreeSample | None = None
        self.peak_process_kb: dict[str, int] = {}
        self.workers: set[int] = set()
        self.helms: set[int] = set()
        self.samples = 0
        self._files: dict[int, tuple[float, dict[tuple[str, str], int]]] = {}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, daemon=True)

    def __enter__(self) -> TreeSampler:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()

    def sample(self) -> TreeSample | None:
        rss = anon = 0
        by_role: dict[str, int] = {}
        anon_by_role: dict[str, int] = {}
        files: dict[tuple[str, str], int] = {}
        pids = descendants(self.agent)
        now = time.monotonic()
        for pid in pids:
            try:
                kb = status_kb(pid)
            except OSError:
                continue
            who = role(pid, self.agent)
            if who == "worker":
                self.workers.add(pid)
            elif who == "helm":
                self.helms.add(pid)
            rss += kb.get("VmRSS", 0)
            anon += kb.get("RssAnon", 0) + kb.get("RssShmem", 0)
            by_role[who] = by_role.get(who, 0) + kb.get("VmRSS", 0)
            mine = kb.get("RssAnon", 0) + kb.get("RssShmem", 0)
            anon_by_role[who] = anon_by_role.get(who, 0) + mine
            self.peak_process_kb[who] = max(self.peak_process_kb.get(who, 0), kb.get("VmRSS", 0))
            cached = self._files.get(pid)
            if cached is None or now - cached[0] > 0.5:
                cached = (now, file_pages(pid))
                self._files[pid] = cached
            for key, pages in cached[1].items():
                files[key] = max(files.get(key, 0), pages)
        if not pids:
            return None
        sample = TreeSample(
            rss, anon + sum(files.values()), by_role, pids, anon_by_role, sum(files.values())
        )
        self.samples += 1
        if self.peak_rss is None or sample.rss_kb > self.peak_rss.rss_kb:
            self.peak_rss = sample
        if self.peak_pod is None or sample.pod_kb > self.peak_pod.pod_kb:
            self.peak_pod = sample
        return sample

    def _loop(self) -> None:
        while not self._stop.wait(self.period):
            with contextlib.suppress(Exception):
                self.sample()


def baseline_rss(code: str) -> int | None:
    """VmRSS (kB) of a fresh ``python3 -c code`` process, read by itself at the end (None:
    the code does not run here, e.g. modules an older tree lacks)."""
    probe = f"{code}\nimport sys\nsys.stdout.write(open('/proc/self/status').read())"
    done = subprocess.run(
        [sys.executable, "-c", probe], cwd=ROOT, capture_output=True, text=True, timeout=120
    )
    if done.returncode != 0:
        return None
    for line in done.stdout.splitlines():
        key, _, value = line.partition(":")
        if key == "VmRSS":
            return int(value.split()[0])
    raise BenchError(f"no VmRSS in the output of python3 -c {code!r}")


# --- the set-up ----------------------------------------------------------------------------


def _kubectl(kubectl: Path, cluster: Cluster, *args: str) -> None:
    done = subprocess.run(
        [str(kubectl), "--kubeconfig", str(cluster.kubeconfig), *args],
        capture_output=True,
        text=True,
        timeout=180,
    )
    if done.returncode != 0:
        raise BenchError(f"kubectl {' '.join(args)}: {done.stderr.strip()}")


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def small_set(lab: Lab) -> list[dict[str, Any]]:
    """Three bundles (Namespace, Deployment, ConfigMap, Service each), pushed."""
    bundles = []
    for app in ("web", "api", "worker"):
        ns, name = lab.name(app), lab.name(app)
        files = {
            "01-namespace.yaml": namespace_manifest(ns),
            "02-configmap.yaml": configmap(
                f"{app}-config", ns, {"LOG_LEVEL": "info", "GREETING": f"hello from {app}"}
            ),
            "03-deployment.yaml": deployment(app, ns, f"registry.example.invalid/{app}:1.0"),
            "04-service.yaml": service(app, ns),
        }
        digest = lab.push(f"footprint/{app}", files, tag="v1")
        bundles.append({"name": name, "sources": [lab.source(f"footprint/{app}", digest)]})
    return bundles


def chart_objects() -> int:
    """How many objects podinfo renders with its default values (helm template, no hooks)."""
    from agent.render.tools import ToolSettings

    helm = ToolSettings.from_env().find("helm")
    out = subprocess.run(
        [str(helm), "template", "podinfo", str(CHART), "--no-hooks"],
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    ).stdout
    return sum(1 for d in yaml.safe_load_all(out) if d)


def big_group(lab: Lab, work: Path, objects: int) -> tuple[list[dict[str, Any]], int]:
    """A group of ``objects`` objects in a namespace of its own: the podinfo chart and a plain
    bundle of the rest, pushed; returns its bundles and the chart's share."""
    from bench.apply import group_objects, write_tree

    client = OciClient(host=lab.registry.host)
    ns = lab.name("big")
    chart = push_bundle(client, "footprint/podinfo", CHART, tag="6.14.1").digest
    in_chart = chart_objects()
    tree = work / "big-tree"
    shutil.rmtree(tree, ignore_errors=True)
    write_tree(tree, group_objects(objects - in_chart, 1))
    plain = push_bundle(client, "footprint/big", tree, tag="v1").digest
    options = {"targetNamespace": ns}
    return [
        {
            "name": lab.name("big-apps"),
            "group": "big",
            "sources": [lab.source("footprint/big", plain)],
            "createNamespace": True,
            "formatOptions": options,
            "healthChecks": {"timeoutSeconds": 600},
        },
        {
            "name": lab.name("podinfo"),
            "group": "big",
            "format": "helm",
            "sources": [lab.source("footprint/podinfo", chart)],
            "createNamespace": True,
            "formatOptions": {**options, "releaseName": "podinfo"},
            "healthChecks": {"timeoutSeconds": 600},
        },
    ], in_chart


@dataclass
class AgentProcess:
    """The agent under measurement and its log."""

    popen: subprocess.Popen[bytes]
    log: Path
    port: int

    @property
    def pid(self) -> int:
        return self.popen.pid

    def check(self) -> None:
        if self.popen.poll() is not None:
            raise BenchError(f"the agent exited ({self.popen.returncode}):\n{self.tail()}")

    def tail(self, lines: int = 30) -> str:
        with contextlib.suppress(OSError):
            return "\n".join(self.log.read_text(errors="replace").splitlines()[-lines:])
        return "(no log)"

    def metrics(self) -> dict[str, float]:
        """``/metrics`` as ``{'name{labels}': value}`` (empty when unreadable)."""
        import urllib.request

        found: dict[str, float] = {}
        with contextlib.suppress(OSError):
            url = f"http://127.0.0.1:{self.port}/metrics"
            with urllib.request.urlopen(url, timeout=10) as answer:
                for line in answer.read().decode().splitlines():
                    if line and not line.startswith("#"):
                        name, _, number = line.rpartition(" ")
                        with contextlib.suppress(ValueError):
                            found[name] = float(number)
        return found

    def stop(self) -> None:
        if self.popen.poll() is None:
            self.popen.send_signal(signal.SIGTERM)
            try:
                self.popen.wait(timeout=60)
            except subprocess.TimeoutExpired:
                self.popen.kill()
                self.popen.wait()


@contextlib.contextmanager
def running_agent(
    argv: list[str], log: Path, port: int, env: dict[str, str] | None = None
) -> Iterator[AgentProcess]:
    with log.open("wb") as handle:
        popen = subprocess.Popen(
            [sys.executable, "-m", "fleetlet", *argv],
            cwd=ROOT,
            env={**os.environ, **(env or {})},
            stdout=handle,
            stderr=subprocess.STDOUT,
        )
    agent = AgentProcess(popen=popen, log=log, port=port)
    try:
        yield agent
    finally:
        agent.stop()


def wait_for(
    pending: Callable[[], str | None], goal: str, agent: AgentProcess, timeout: float
) -> float:
    """Wait until ``pending()`` returns None; returns the seconds it took."""
    began = time.monotonic()
    missing: str | None = "not checked yet"
    while True:
        agent.check()
        with contextlib.suppress(Exception):  # not there yet (e.g. the CRD's first list)
            missing = pending()
        if missing is None:
            return time.monotonic() - began
        if time.monotonic() - began > timeout:
            raise BenchError(f"timed out waiting for {goal}: {missing}\n{agent.tail()}")
        time.sleep(0.5)


def not_ready(kube: KubeClient, names: list[str]) -> Callable[[], str | None]:
    def check() -> str | None:
        for name in names:
            bd = kube.get(
                {"apiVersion": "fleetlet.io/v1alpha1", "kind": "BundleDeployment",
                 "metadata": {"name": name}}
            )  # fmt: skip
            found = {c["type"]: c for c in ((bd or {}).get("status") or {}).get("conditions") or []}
            ready = found.get("Ready", {})
            if ready.get("status") != "True":
                return f"{name}: Ready={ready.get('status')} {ready.get('reason', '')}"
        return None

    return check


# --- the measurements ----------------------------------------------------------------------


def _served(daemon: GitDaemon, service_name: str, repo: str) -> int:
    return sum(
        1
        for r in daemon.requests()
        if r.method == service_name and r.path.rstrip("/").endswith(repo)
    )


def _sum_metric(metrics: dict[str, float], prefix: str) -> float:
    return sum(v for k, v in metrics.items() if k.startswith(prefix))


@dataclass
class Idle:
    """The idle window (kB, seconds, counts)."""

    window: float
    rss_first_kb: int
    rss_median_kb: int
    rss_last_kb: int
    rss_anon_kb: int
    rss_file_kb: int
    tree_rss_max_kb: int
    threads: int
    cpu_seconds: float
    polls: int
    status_pushes: int
    workers: int
    drift_checks: float
    api_requests: dict[str, float]
    """The supervisor's requests to the API server in the window, by method."""
    scale: float

    @property
    def cpu_per_hour(self) -> float:
        """CPU seconds per production hour: the window's rate, scaled back."""
        return self.cpu_seconds * 3600.0 / self.window / self.scale

    @property
    def api_requests_per_hour(self) -> float:
        """The supervisor's API requests per production hour."""
        return sum(self.api_requests.values()) * 3600.0 / self.window / self.scale


def measure_idle(
    agent: AgentProcess, daemon: GitDaemon, lab: Lab, *, seconds: float, scale: float
) -> Idle:
    polls_0 = _served(daemon, "upload-pack", lab.repo_name)
    pushes_0 = _served(daemon, "receive-pack", lab.status_name)
    metrics_0 = agent.metrics()
    cpu_0 = cpu_seconds(agent.pid)
    began = time.monotonic()
    samples: list[dict[str, int]] = []
    tree_max = 0
    workers: set[int] = set()
    while True:
        agent.check()
        samples.append(status_kb(agent.pid))
        pids = descendants(agent.pid)
        workers.update(p for p in pids if role(p, agent.pid) == "worker")
        tree = 0
        for pid in pids:
            with contextlib.suppress(OSError):
                tree += status_kb(pid).get("VmRSS", 0)
        tree_max = max(tree_max, tree)
        left = began + seconds - time.monotonic()
        if left <= 0:
            break
        time.sleep(min(1.0, left))
    cpu_1 = cpu_seconds(agent.pid)
    window = time.monotonic() - began
    metrics_1 = agent.metrics()
    last = samples[-1]
    checks = "fleetlet_agent_drift_checks_total"
    requests = "fleetlet_agent_supervisor_api_requests_total"
    methods = {k.partition('method="')[2].partition('"')[0] for k in metrics_1 if requests in k}
    return Idle(
        window=window,
        rss_first_kb=samples[0]["VmRSS"],
        rss_median_kb=int(statistics.median(s["VmRSS"] for s in samples)),
        rss_last_kb=last["VmRSS"],
        rss_anon_kb=last.get("RssAnon", 0),
        rss_file_kb=last.get("RssFile", 0) + last.get("RssShmem", 0),
        tree_rss_max_kb=tree_max,
        threads=sum(1 for _ in Path(f"/proc/{agent.pid}/task").iterdir()),
        cpu_seconds=cpu_1 - cpu_0,
        polls=_served(daemon, "upload-pack", lab.repo_name) - polls_0,
        status_pushes=_served(daemon, "receive-pack", lab.status_name) - pushes_0,
        workers=len(workers),
        drift_checks=_sum_metric(metrics_1, checks) - _sum_metric(metrics_0, checks),
        api_requests={
            m: _sum_metric(metrics_1, f'{requests}{{method="{m}"')
            - _sum_metric(metrics_0, f'{requests}{{method="{m}"')
            for m in sorted(methods)
        },
        scale=scale,
    )


@dataclass
class Peak:
    """The move of the big group (kB, seconds)."""

    objects: int
    chart_objects: int
    seconds: float
    peak_rss_kb: int
    peak_rss_by_role: dict[str, int]
    peak_pod_kb: int
    peak_pod_by_role: dict[str, int]
    peak_pod_anon_by_role: dict[str, int]
    peak_pod_files_kb: int
    peak_process_kb: dict[str, int]
    workers: int
    helm_runs: int
    samples: int
    worker_max_rss_kb: int
    agent_rss_after_kb: int
    agent_hwm_kb: int
    total_reported: int = 0
    notes: list[str] = field(default_factory=list)


def measure_peak(
    agent: AgentProcess,
    lab: Lab,
    kube: KubeClient,
    bundles: list[dict[str, Any]],
    big: list[dict[str, Any]],
    *,
    objects: int,
    chart: int,
    settle: float,
) -> Peak:
    with TreeSampler(agent.pid) as sampler:
        began = time.monotonic()
        lab.publish([*bundles, *big])
        names = [b["name"] for b in big]
        seconds = wait_for(not_ready(kube, names), "the big group Ready", agent, timeout=900)
        seconds = time.monotonic() - began
    time.sleep(settle)
    gauge = agent.metrics().get("fleetlet_agent_worker_max_resident_bytes", 0.0)
    total = 0
    for name in names:
        bd = kube.get(
            {"apiVersion": "fleetlet.io/v1alpha1", "kind": "BundleDeployment",
             "metadata": {"name": name}}
        )  # fmt: skip
        total += int((((bd or {}).get("status") or {}).get("resources") or {}).get("total") or 0)
    after = status_kb(agent.pid)
    assert sampler.peak_rss is not None and sampler.peak_pod is not None
    return Peak(
        objects=objects,
        chart_objects=chart,
        seconds=seconds,
        peak_rss_kb=sampler.peak_rss.rss_kb,
        peak_rss_by_role=sampler.peak_rss.by_role,
        peak_pod_kb=sampler.peak_pod.pod_kb,
        peak_pod_by_role=sampler.peak_pod.by_role,
        peak_pod_anon_by_role=sampler.peak_pod.anon_by_role,
        peak_pod_files_kb=sampler.peak_pod.files_kb,
        peak_process_kb=sampler.peak_process_kb,
        workers=len(sampler.workers),
        helm_runs=len(sampler.helms),
        samples=sampler.samples,
        worker_max_rss_kb=int(gauge // 1024),
        agent_rss_after_kb=after["VmRSS"],
        agent_hwm_kb=after["VmHWM"],
        total_reported=total,
    )


def run_footprint(
    *,
    seconds: float,
    interval: float,
    warmup: float,
    objects: int,
    keep: Path | None,
) -> tuple[Idle, Peak, float]:
    """Set everything up, run the agent, measure it; stops every process it started."""
    scale = PRODUCTION["interval"] / interval
    heartbeat = PRODUCTION["heartbeat"] / scale
    drift = PRODUCTION["drift"] / scale
    lease = max(1, round(PRODUCTION["lease"] / scale))
    with contextlib.ExitStack() as stack:
        if keep is None:
            work = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="fleetlet-fp-")))
        else:
            work = keep
            work.mkdir(parents=True, exist_ok=True)
        binaries = ensure_binaries()
        cluster = stack.enter_context(
            Cluster(name="footprint", workdir=work / "kube", binaries=binaries)
        )
        registry = stack.enter_context(Registry(workdir=work / "registry"))
        daemon = GitDaemon(workdir=work / "git")
        stack.enter_context(daemon)
        sigstore = stack.enter_context(MiniSigstore(workdir=work / "sigstore", rekor_version=1))
        kubectl = binaries["kubectl"]
        _kubectl(kubectl, cluster, "apply", "--server-side", "-f", str(CRDS))
        _kubectl(kubectl, cluster, "wait", "--for=condition=Established", "--timeout=120s",
                 "crd", "--all")  # fmt: skip
        _kubectl(kubectl, cluster, "create", "namespace", AGENT_NAMESPACE)

        lab = Lab(
            registry=registry,
            git=daemon,
            sigstore=sigstore,
            tmp=work / "lab",
            clusters=[{"name": CLUSTER, "labels": {"tier": "production"}}],
        )
        bundles = small_set(lab)
        lab.publish(bundles)
        big, chart = big_group(lab, work, objects)
        port = _free_port()
        argv = [
            "agent", "run",
            *lab.agent_args(CLUSTER, cluster, namespace=AGENT_NAMESPACE, workdir=work / "agent"),
            "--heartbeat", f"{heartbeat:g}", "--drift-interval", f"{drift:g}",
            "--interval", f"{interval:g}", "--jitter", "0",
            "--probe-address", f"127.0.0.1:{port}",
        ]  # fmt: skip
        agent = stack.enter_context(
            running_agent(
                argv, work / "agent.log", port, env={"FLEETLET_AGENT_LEASE_DURATION": str(lease)}
            )
        )
        kube = stack.enter_context(KubeClient(kubeconfig=str(cluster.kubeconfig)))
        settle = wait_for(
            not_ready(kube, [b["name"] for b in bundles]), "the small set Ready", agent, 300
        )
        time.sleep(warmup)
        idle = measure_idle(agent, daemon, lab, seconds=seconds, scale=scale)
        peak = measure_peak(
            agent, lab, kube, bundles, big, objects=objects, chart=chart, settle=max(warmup, 5)
        )
        agent.check()
        return idle, peak, settle
    raise AssertionError("unreachable")  # for mypy: the with block returns or raises


# --- the report ----------------------------------------------------------------------------


def mb(kb: float) -> float:
    return kb / 1024


def _roles(by_role: dict[str, int]) -> str:
    return ", ".join(f"{k} {mb(v):.1f}" for k, v in sorted(by_role.items(), key=lambda kv: -kv[1]))


def report(idle: Idle, peak: Peak, settle: float, baselines: dict[str, int], command: str) -> str:
    def verdict(ok: bool) -> str:
        return "met" if ok else "**not met**"

    per_hour = idle.cpu_per_hour
    rows = [
        "| measure | value | target |",
        "|---|---:|---|",
        f"| idle RSS of `agent run` (VmRSS, median of the window) | "
        f"{mb(idle.rss_median_kb):.1f} MB | under {IDLE_TARGET_MB:g} MB: "
        f"{verdict(mb(idle.rss_median_kb) < IDLE_TARGET_MB)} |",
        f"| idle RSS, first / last sample | {mb(idle.rss_first_kb):.1f} / "
        f"{mb(idle.rss_last_kb):.1f} MB | |",
        f"| of which anonymous / file-backed (last sample) | {mb(idle.rss_anon_kb):.1f} / "
        f"{mb(idle.rss_file_kb):.1f} MB | |",
        f"| largest RSS of all the agent's processes at once while idle | "
        f"{mb(idle.tree_rss_max_kb):.1f} MB | |",
        f"| worker processes started while idle | {idle.workers} | |",
        f"| polls / status pushes / drift checks in the {idle.window:.0f} s window | "
        f"{idle.polls} / {idle.status_pushes} / {idle.drift_checks:.0f} | |",
        f"| the supervisor's API requests in the window | "
        f"{', '.join(f'{k} {v:.0f}' for k, v in idle.api_requests.items()) or 'none'} | |",
        f"| of which per production hour | {idle.api_requests_per_hour:.0f} | |",
        f"| CPU in the window (agent and reaped workers) | {idle.cpu_seconds:.2f} s | |",
        f"| CPU per hour at a 30 s poll, 60 s heartbeat, 300 s drift check | {per_hour:.2f} s | "
        f"under {CPU_TARGET_S:g} s: {verdict(per_hour < CPU_TARGET_S)} |",
        f"| peak memory of the agent's processes while moving {peak.objects:,} objects "
        f"(anonymous + mapped files once) | {mb(peak.peak_pod_kb):.1f} MB | under "
        f"{PEAK_TARGET_MB:g} MB: {verdict(mb(peak.peak_pod_kb) < PEAK_TARGET_MB)} |",
        f"| at that moment: anonymous memory | {_roles(peak.peak_pod_anon_by_role)} MB | |",
        f"| at that moment: mapped files, each once | {mb(peak.peak_pod_files_kb):.1f} MB | |",
        f"| at that moment: VmRSS | {_roles(peak.peak_pod_by_role)} MB | |",
        f"| peak of the sum of their VmRSS | {mb(peak.peak_rss_kb):.1f} MB | |",
        f"| largest single process (VmRSS) | {_roles(peak.peak_process_kb)} | |",
        f"| the move: publish to every BundleDeployment Ready | {peak.seconds:.1f} s "
        f"({peak.workers} workers, {peak.helm_runs} helm runs seen, {peak.samples} samples) | |",
        f"| objects the BundleDeployments report | {peak.total_reported:,} (chart "
        f"{peak.chart_objects}) | |",
        f"| `agent run` RSS after the move (VmRSS) / its own peak (VmHWM) | "
        f"{mb(peak.agent_rss_after_kb):.1f} / {mb(peak.agent_hwm_kb):.1f} MB | |",
    ]
    base = [
        "| fresh process | VmRSS |",
        "|---|---:|",
        *(f"| {BASELINES[key][0]} | {mb(kb):.1f} MB |" for key, kb in baselines.items()),
    ]
    machine = (
        f"{platform.machine()}, {os.cpu_count()} CPUs, load average "
        f"{'/'.join(f'{x:.1f}' for x in os.getloadavg())}, Python {platform.python_version()}"
    )
    return "\n".join(
        [
            f"Agent footprint: `{command}`",
            f"({machine}; the small set Ready {settle:.0f} s after the agent started; jobs "
            f"{idle.scale:g}x faster than in production during the idle window)",
            "",
            *rows,
            "",
            *base,
        ]
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--seconds", type=float, default=120.0, help="idle window (120)")
    parser.add_argument("--interval", type=float, default=2.0, help="poll interval, s (2)")
    parser.add_argument("--warmup", type=float, default=30.0, help="idle before measuring (30)")
    parser.add_argument("--objects", type=int, default=2000, help="objects in the big group")
    parser.add_argument("--keep", type=Path, help="work in this directory and keep it (logs)")
    args = parser.parse_args(argv)
    if args.interval <= 0 or args.seconds < args.interval:
        parser.error("need 0 < --interval <= --seconds")

    measured = {key: baseline_rss(code) for key, (_, code) in BASELINES.items()}
    baselines = {key: kb for key, kb in measured.items() if kb is not None}
    idle, peak, settle = run_footprint(
        seconds=args.seconds,
        interval=args.interval,
        warmup=args.warmup,
        objects=args.objects,
        keep=args.keep,
    )
    command = (
        f"python3 bench/agent_footprint.py --seconds {args.seconds:g} "
        f"--interval {args.interval:g} --warmup {args.warmup:g} --objects {args.objects}"
    )
    print(report(idle, peak, settle, baselines, command))
    line: dict[str, Any] = {
        "bench": "agent_footprint",
        "idle": asdict(idle),
        "peak": asdict(peak),
        "idle_rss_mb": round(mb(idle.rss_median_kb), 1),
        "peak_pod_mb": round(mb(peak.peak_pod_kb), 1),
        "peak_rss_sum_mb": round(mb(peak.peak_rss_kb), 1),
        "cpu_s_per_hour": round(idle.cpu_per_hour, 3),
        "api_requests_per_hour": round(idle.api_requests_per_hour),
        "baseline_rss_mb": {key: round(mb(kb), 1) for key, kb in baselines.items()},
        "load_average": os.getloadavg(),
    }
    print(json.dumps(line, sort_keys=True))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
