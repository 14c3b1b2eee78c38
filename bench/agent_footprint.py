"""Agent footprint: the idle agent's resident memory, and its CPU per poll and per hour.

Starts one real control plane (``tests/realenv/kube.py``, CRDs and the agent namespace
installed), a registry, a ``git daemon`` and the mini Sigstore on loopback, pushes and
publishes (signed) a small realistic set through the test harness (``tests/fleetlab.py``):
three bundles, each a Namespace, a Deployment, a ConfigMap and a Service. Then it runs the
agent exactly as deployed, ``python3 -m fleetlet agent run ...`` (``Lab.agent_args``, with a
probe server), waits until every BundleDeployment is Ready, lets the agent idle for
``--warmup`` seconds and measures it for ``--seconds``:

- RSS: ``VmRSS`` of ``/proc/<pid>/status``, sampled every second of the window (first,
  median, last), its anonymous and file-backed parts, and the peak ``VmHWM`` (which includes
  the first sync: fetch, verify, render, apply);
- CPU: ``utime + stime`` (and that of reaped children) of ``/proc/<pid>/stat`` over the
  window, divided by the polls counted in the window (the ``upload-pack`` requests the git
  daemon served for the desired-state repository: one ref listing per idle poll).

The poll interval is ``--interval`` (2 s) rather than the production 30 s so that the window
holds many polls; the status heartbeat is scaled with it (``--heartbeat`` = 2 x interval, the
production ratio of 60 s to 30 s), so the CPU per poll includes its share of heartbeats. CPU
per hour at 30 s is that figure x 120 polls. CPU the agent spends between polls (scheduler
and probe threads) is counted in the polls, so the extrapolation errs high, if at all.

For context it also measures, each in a fresh process, the RSS of ``python3 -c pass``, of
``import kubernetes.client`` and the agent's other heavy dependencies, of everything ``agent
run`` imports before its first poll and of what an idle poll itself uses, each with and
without the kubernetes client (its share of the agent's memory). Prints a table and one JSON
line. Run from the repository root (about 3-4 minutes; one cluster)::

    python3 bench/agent_footprint.py [--seconds 120] [--interval 2] [--warmup 30]
"""

from __future__ import annotations

import argparse
import contextlib
import importlib.util
import json
import os
import platform
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:  # run as a script: the repository's packages and tests
    sys.path.insert(0, str(ROOT))

from agent.kube import KubeClient  # noqa: E402
from tests.fleetlab import (  # noqa: E402
    Lab,
    conditions,
    configmap,
    deployment,
    namespace_manifest,
    service,
)
from tests.realenv.binaries import ensure_binaries  # noqa: E402
from tests.realenv.gitserver import GitDaemon  # noqa: E402
from tests.realenv.kube import Cluster  # noqa: E402
from tests.realenv.registry import Registry  # noqa: E402
from tests.realenv.sigstore import MiniSigstore  # noqa: E402

CRDS = ROOT / "crds"
CLUSTER = "edge-1"
AGENT_NAMESPACE = "fleetlet-system"
TARGET_MB = 60.0
PRODUCTION_INTERVAL = 30.0
PRODUCTION_HEARTBEAT = 60.0
POLLS_PER_HOUR = 3600.0 / PRODUCTION_INTERVAL
CLOCK_TICKS = os.sysconf("SC_CLK_TCK")

# What ``fleetlet agent run`` imports before its first poll: ``fleetlet.cli``, the modules
# ``agent.cli._build_agent`` and ``_run`` import, sigstore (``TrustPolicy``) and the kubernetes
# client (``KubeClient``; ``agent.kube`` itself imports it lazily).
AGENT_IMPORTS = (
    "import fleetlet.cli, agent.cli, agent.apply, agent.apply.intent, agent.report.bundles, "
    "agent.kube, agent.loop, agent.reconcile, agent.report.push, agent.report.runs, "
    "agent.source.branch, agent.source.cache, agent.source.compose, agent.source.credentials, "
    "agent.source.oci, agent.inbound, agent.state, agent.verify, agent.probe, agent.schedule, "
    "sigstore.models, sigstore.verify"
)
# What an idle poll uses: the ref listing and status push (pygit2), the cluster state and
# drift check (the kubernetes client, the reconcile), the scheduler and the probe server.
IDLE_IMPORTS = "import agent.kube, agent.apply, agent.reconcile, agent.report.push, agent.schedule, agent.probe"
KUBERNETES = "import kubernetes.dynamic, kubernetes.config"
# securesystemslib (sigstore -> tuf) imports boto3 for its AWS KMS signer when installed.
NO_BOTO3 = "import sys; sys.modules['boto3'] = None"

# Fresh processes for context: key -> (label, code run by `python3 -c`).
BASELINES: dict[str, tuple[str, str]] = {
    "pass": ("`python3 -c pass`", "pass"),
    "kubernetes": ("`import kubernetes.client`", "import kubernetes.client"),
    "pygit2": ("`import pygit2`", "import pygit2"),
    "sigstore": ("`import sigstore.verify`", "import sigstore.verify"),
    "oras": ("`import oras.provider`", "import oras.provider"),
    "agent": ("`agent run`'s imports before its first poll", f"{AGENT_IMPORTS}\n{KUBERNETES}"),
    "agent_no_kubernetes": ("`agent run`'s imports without the kubernetes client", AGENT_IMPORTS),
    "agent_no_boto3": (
        "`agent run`'s imports, `boto3` (installed here) hidden",
        f"{NO_BOTO3}\n{AGENT_IMPORTS}\n{KUBERNETES}",
    ),
    "idle": ("an idle poll's imports (no sigstore, no oras)", f"{IDLE_IMPORTS}\n{KUBERNETES}"),
    "idle_no_kubernetes": ("an idle poll's imports without the kubernetes client", IDLE_IMPORTS),
}
if importlib.util.find_spec("boto3") is None:
    del BASELINES["agent_no_boto3"]


class BenchError(RuntimeError):
    """The set-up failed or the agent died (the message has its log tail)."""


# --- /proc ---------------------------------------------------------------------------------


def status_kb(pid: int | str) -> dict[str, int]:
    """The ``kB`` fields of ``/proc/<pid>/status`` (VmRSS, VmHWM, RssAnon, RssFile, ...)."""
    out: dict[str, int] = {}
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        key, _, value = line.partition(":")
        parts = value.split()
        if len(parts) == 2 and parts[1] == "kB":
            out[key] = int(parts[0])
    return out


def cpu_seconds(pid: int) -> float:
    """utime + stime + cutime + cstime of ``/proc/<pid>/stat``, in seconds."""
    stat = Path(f"/proc/{pid}/stat").read_text()
    fields = stat[stat.rindex(")") + 2 :].split()  # after "pid (comm) "; fields 3.. of proc(5)
    utime, stime, cutime, cstime = (int(f) for f in fields[11:15])
    return (utime + stime + cutime + cstime) / CLOCK_TICKS


def baseline_rss(code: str) -> int:
    """VmRSS (kB) of a fresh ``python3 -c code`` process, read by itself at the end."""
    probe = f"{code}\nimport sys\nsys.stdout.write(open('/proc/self/status').read())"
    done = subprocess.run(
        [sys.executable, "-c", probe],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    )
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


def publish_set(lab: Lab) -> list[str]:
    """Push three bundles (Namespace, Deployment, ConfigMap, Service each) and publish them
    to the cluster; returns the bundles' (BundleDeployments') names."""
    names = []
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
        names.append(name)
    lab.publish(bundles)
    return names


@dataclass
class AgentProcess:
    """The agent under measurement and its log."""

    popen: subprocess.Popen[bytes]
    log: Path

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

    def stop(self) -> None:
        if self.popen.poll() is None:
            self.popen.send_signal(signal.SIGTERM)
            try:
                self.popen.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.popen.kill()
                self.popen.wait()


@contextlib.contextmanager
def running_agent(argv: list[str], log: Path) -> Iterator[AgentProcess]:
    with log.open("wb") as handle:
        popen = subprocess.Popen(
            [sys.executable, "-m", "fleetlet", *argv],
            cwd=ROOT,
            stdout=handle,
            stderr=subprocess.STDOUT,
        )
    agent = AgentProcess(popen=popen, log=log)
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


# --- the measurement -----------------------------------------------------------------------


@dataclass
class Footprint:
    """What the window measured (kB, seconds)."""

    interval: float
    heartbeat: float
    warmup: float
    window: float
    settle_seconds: float
    rss_first_kb: int
    rss_median_kb: int
    rss_last_kb: int
    rss_anon_kb: int
    rss_file_kb: int
    hwm_kb: int
    threads: int
    cpu_seconds: float
    polls: int
    status_pushes: int

    @property
    def cpu_per_poll(self) -> float:
        return self.cpu_seconds / max(self.polls, 1)

    @property
    def cpu_per_hour(self) -> float:
        return self.cpu_per_poll * POLLS_PER_HOUR


def _served(daemon: GitDaemon, service: str, repo: str) -> int:
    return sum(
        1 for r in daemon.requests() if r.method == service and r.path.rstrip("/").endswith(repo)
    )


def measure(agent: AgentProcess, daemon: GitDaemon, lab: Lab, *, seconds: float) -> dict[str, Any]:
    """Sample the agent once a second for ``seconds``; CPU and polls between the ends."""
    polls_0 = _served(daemon, "upload-pack", lab.repo_name)
    pushes_0 = _served(daemon, "receive-pack", lab.status_name)
    cpu_0 = cpu_seconds(agent.pid)
    began = time.monotonic()
    samples: list[dict[str, int]] = []
    while True:
        agent.check()
        samples.append(status_kb(agent.pid))
        left = began + seconds - time.monotonic()
        if left <= 0:
            break
        time.sleep(min(1.0, left))
    cpu_1 = cpu_seconds(agent.pid)
    window = time.monotonic() - began
    last = samples[-1]
    threads = sum(1 for _ in Path(f"/proc/{agent.pid}/task").iterdir())
    return {
        "window": window,
        "rss_first_kb": samples[0]["VmRSS"],
        "rss_median_kb": int(statistics.median(s["VmRSS"] for s in samples)),
        "rss_last_kb": last["VmRSS"],
        "rss_anon_kb": last.get("RssAnon", 0),
        "rss_file_kb": last.get("RssFile", 0) + last.get("RssShmem", 0),
        "hwm_kb": last["VmHWM"],
        "threads": threads,
        "cpu_seconds": cpu_1 - cpu_0,
        "polls": _served(daemon, "upload-pack", lab.repo_name) - polls_0,
        "status_pushes": _served(daemon, "receive-pack", lab.status_name) - pushes_0,
    }


def run_footprint(
    *, seconds: float, interval: float, warmup: float, keep: Path | None
) -> Footprint:
    """Set everything up, run the agent, measure it; stops every process it started."""
    heartbeat = interval * PRODUCTION_HEARTBEAT / PRODUCTION_INTERVAL
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
        names = publish_set(lab)
        port = _free_port()
        argv = [
            "agent", "run",
            *lab.agent_args(CLUSTER, cluster, namespace=AGENT_NAMESPACE, workdir=work / "agent"),
            "--heartbeat", str(heartbeat),
            "--interval", str(interval), "--jitter", "0",
            "--probe-address", f"127.0.0.1:{port}",
        ]  # fmt: skip
        agent = stack.enter_context(running_agent(argv, work / "agent.log"))
        kube = stack.enter_context(KubeClient(kubeconfig=str(cluster.kubeconfig)))

        def not_ready() -> str | None:
            for name in names:
                ready = conditions(kube, name).get("Ready", {})
                if ready.get("status") != "True":
                    return f"{name}: Ready={ready.get('status')} {ready.get('reason', '')}"
            return None

        settle = wait_for(not_ready, "every BundleDeployment Ready", agent, timeout=300)
        time.sleep(warmup)
        measured = measure(agent, daemon, lab, seconds=seconds)
        agent.check()
        return Footprint(
            interval=interval,
            heartbeat=heartbeat,
            warmup=warmup,
            settle_seconds=settle,
            **measured,
        )
    raise AssertionError("unreachable")  # for mypy: the with block returns or raises


# --- the report ----------------------------------------------------------------------------


def mb(kb: float) -> float:
    return kb / 1024


def report(result: Footprint, baselines: dict[str, int], command: str) -> str:
    verdict = "met" if mb(result.rss_median_kb) < TARGET_MB else "NOT met"
    rows = [
        "| measure | value |",
        "|---|---:|",
        f"| idle RSS after warm-up (VmRSS, median of the window) | "
        f"{mb(result.rss_median_kb):.1f} MB |",
        f"| idle RSS, first / last sample | {mb(result.rss_first_kb):.1f} / "
        f"{mb(result.rss_last_kb):.1f} MB |",
        f"| of which anonymous / file-backed (last sample) | {mb(result.rss_anon_kb):.1f} / "
        f"{mb(result.rss_file_kb):.1f} MB |",
        f"| peak RSS (VmHWM, includes the first sync) | {mb(result.hwm_kb):.1f} MB |",
        f"| threads | {result.threads} |",
        f"| polls in the {result.window:.0f} s window (interval {result.interval:g} s) | "
        f"{result.polls} |",
        f"| status pushes in the window (heartbeat {result.heartbeat:g} s) | "
        f"{result.status_pushes} |",
        f"| CPU in the window (utime+stime) | {result.cpu_seconds:.2f} s |",
        f"| CPU per idle poll (with its share of heartbeats) | "
        f"{result.cpu_per_poll * 1000:.1f} ms |",
        f"| CPU per hour at {PRODUCTION_INTERVAL:g} s ({POLLS_PER_HOUR:.0f} polls, "
        f"extrapolated) | {result.cpu_per_hour:.2f} s |",
        f"| target: under {TARGET_MB:g} MB RSS | {verdict} |",
    ]
    base = [
        "| fresh process | VmRSS |",
        "|---|---:|",
        *(f"| {BASELINES[key][0]} | {mb(kb):.1f} MB |" for key, kb in baselines.items()),
    ]
    shares = []
    for whole, without, what in (
        ("agent", "agent_no_kubernetes", "`agent run`'s imports"),
        ("idle", "idle_no_kubernetes", "an idle poll's imports"),
    ):
        shares.append(
            f"the kubernetes client's share of {what}: "
            f"{mb(baselines[whole] - baselines[without]):.1f} MB"
        )
    machine = (
        f"{platform.machine()}, {os.cpu_count()} CPUs, load average {os.getloadavg()[0]:.1f}, "
        f"Python {platform.python_version()}"
    )
    return "\n".join(
        [
            f"Agent footprint: `{command}`",
            f"({machine}; all BundleDeployments Ready {result.settle_seconds:.0f} s after the "
            f"agent started, then {result.warmup:g} s warm-up; CPU per hour = CPU per poll x "
            f"{POLLS_PER_HOUR:.0f})",
            "",
            *rows,
            "",
            *base,
            "",
            "; ".join(shares),
        ]
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--seconds", type=float, default=120.0, help="measuring window (120)")
    parser.add_argument("--interval", type=float, default=2.0, help="poll interval, s (2)")
    parser.add_argument("--warmup", type=float, default=30.0, help="idle before measuring (30)")
    parser.add_argument("--keep", type=Path, help="work in this directory and keep it (logs)")
    args = parser.parse_args(argv)
    if args.interval <= 0 or args.seconds < args.interval:
        parser.error("need 0 < --interval <= --seconds")

    baselines = {key: baseline_rss(code) for key, (_, code) in BASELINES.items()}
    result = run_footprint(
        seconds=args.seconds, interval=args.interval, warmup=args.warmup, keep=args.keep
    )
    command = (
        f"python3 bench/agent_footprint.py --seconds {args.seconds:g} "
        f"--interval {args.interval:g} --warmup {args.warmup:g}"
    )
    print(report(result, baselines, command))
    line: dict[str, Any] = {
        "bench": "agent_footprint",
        **asdict(result),
        "rss_mb": round(mb(result.rss_median_kb), 1),
        "hwm_mb": round(mb(result.hwm_kb), 1),
        "cpu_ms_per_poll": round(result.cpu_per_poll * 1000, 2),
        "cpu_s_per_hour_at_30s": round(result.cpu_per_hour, 3),
        "target_mb": TARGET_MB,
        "target_met": mb(result.rss_median_kb) < TARGET_MB,
        "baseline_rss_mb": {key: round(mb(kb), 1) for key, kb in baselines.items()},
    }
    print(json.dumps(line, sort_keys=True))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
