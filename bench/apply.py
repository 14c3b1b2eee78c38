"""Apply + health-check of a lockstep group: the agent's code vs ``kubectl apply --server-side``.

Starts one real control plane on loopback (etcd, kube-apiserver, controller-manager,
scheduler and kwok fake nodes, from ``tests/realenv``: Deployments really roll out and become
Available) and writes a group of ``--objects`` objects (2,000 by default: 5% Deployments of
one replica, 15% Services, 30% Secrets, 50% ConfigMaps, all in one namespace; one YAML file
per app, its Deployment first) in two revisions that differ in every object. Then it times,
against the same API server in the same run, each method in a fresh namespace of its own:

- **install**: revision 1 applied to the empty namespace, then waited for until healthy;
- **no-op**: the same files again (nothing changed);
- **update**: revision 2 (every object changes, every Deployment rolls out);
- **rollback**: revision 1 again, which is what the agent's rollback applies;
- **partial**: revision 3, which changes 5% of the objects of revision 1 (one Deployment in
  twenty rolls out): what most real upgrades look like.

The agent: its plain renderer reads the files (``load_tree`` + ``finish``), ``apply_group``
dry-runs the whole group then applies it (the agent's default pool of workers; after the
install every object is "reclaimed" as the lockstep engine does for what the bundle applied
before; objects verified before and unchanged since skip their dry run, with the agent's
``VerifiedObjects`` kept across the phases as the agent keeps it across its workers), the
prune plan from the previous revision's inventory is computed and run (it deletes nothing),
and ``wait_healthy`` polls, at the agent's default interval, until every object is Current
(kstatus: a Deployment's rollout must be complete). One long-lived ``KubeClient``, as in the
agent. (Run against an older tree, whose ``apply_group`` has no ``verified``, it does
without.)

kubectl (a new process each time, warm discovery cache): ``kubectl apply --server-side -f
<dir>`` of the same files; ``kubectl rollout status deployment -l ...``; then ``kubectl wait
--for=condition=Available deployment --all``. The baseline is apply + wait (the wait runs
after the rollout status, so if anything it is shorter than right after the apply); apply +
rollout status is reported too (the same health semantics as the agent for the Deployments;
``wait`` for Available does not wait for a rollout to end).

The floor of a method's phase is the CPU it made the machine spend (its client's and the
whole control plane's: etcd, kube-apiserver, controller-manager, scheduler, kwok) divided by
the CPUs: no way of doing that work can take less wall time here.

Each repetition creates both namespaces anew and deletes them (waiting until they are gone)
after; the methods take turns going first. Prints medians over ``--repeat`` repetitions: the
agent's time against ``kubectl apply --server-side`` + ``kubectl rollout status`` and
against its own CPU floor (and kubectl apply + ``kubectl wait``), with the CPU seconds of the
clients and of the control plane, then one JSON line; per-phase progress goes to stderr.
From the repository root::

    python3 bench/apply.py [--objects 2000] [--repeat 3]
"""

from __future__ import annotations

import argparse
import base64
import inspect
import json
import os
import platform
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from agent.apply import (  # noqa: E402
    ApplySettings,
    BundleInput,
    Inventory,
    apply_group,
    plan_prune,
    prune,
)
from agent.apply.plan import identity  # noqa: E402

try:
    from agent.apply.verified import VerifiedObjects
except ImportError:  # an older tree: every object is dry-run
    VerifiedObjects = None  # type: ignore[assignment,misc]
from agent.health import wait_healthy  # noqa: E402
from agent.kube import KubeClient, NotFoundError  # noqa: E402
from agent.reconcile import ReconcileSettings  # noqa: E402
from agent.render.plain import (  # noqa: E402
    BUNDLE_LABEL,
    GROUP_LABEL,
    RenderRequest,
    finish,
    load_tree,
)
from tests.realenv.binaries import ensure_binaries  # noqa: E402
from tests.realenv.kube import Cluster  # noqa: E402

Manifest = dict[str, Any]
BUNDLE = "bench"
PHASES = ("install", "no-op", "update", "rollback", "partial")
REVISIONS = (1, 1, 2, 1, 3)
PARTIAL_EVERY = 20
"""Revision 3 is revision 1 with one object in this many changed."""
HEALTH_TIMEOUT = 600.0
REVISION_ANNOTATION = "bench.fleetlet.io/revision"
_DEFAULTS = ReconcileSettings(agent_namespace="unused")


# --- the group -----------------------------------------------------------------------------


def mix(objects: int) -> dict[str, int]:
    """How many objects of each kind: 5% Deployments, 15% Services, 30% Secrets, the rest
    ConfigMaps."""
    deployments = max(1, objects * 5 // 100)
    services = objects * 15 // 100
    secrets = objects * 30 // 100
    return {
        "Deployment": deployments,
        "Service": services,
        "Secret": secrets,
        "ConfigMap": objects - deployments - services - secrets,
    }


def _metadata(name: str, revision: int, app: str) -> Manifest:
    return {
        "name": name,
        "labels": {BUNDLE_LABEL: BUNDLE, GROUP_LABEL: BUNDLE, "app": app},
        "annotations": {REVISION_ANNOTATION: str(revision)},
    }


def group_objects(objects: int, revision: int) -> list[Manifest]:
    """The group's objects (no namespace: the agent renders into its target namespace,
    kubectl applies with ``-n``). Revision 2 differs from 1 in every object; revision 3 in one
    object of every :data:`PARTIAL_EVERY` (of every kind)."""
    if revision == 3:
        base, changed = group_objects(objects, 1), group_objects(objects, 2)
        return [
            c if i % PARTIAL_EVERY == 0 else b
            for i, (b, c) in enumerate(zip(base, changed, strict=True))
        ]
    counts = mix(objects)
    apps = [f"app-{i:04d}" for i in range(counts["Deployment"])]
    out: list[Manifest] = []
    for i, app in enumerate(apps):
        out.append(
            {
                "apiVersion": "apps/v1",
                "kind": "Deployment",
                "metadata": _metadata(app, revision, app),
                "spec": {
                    "replicas": 1,
                    "selector": {"matchLabels": {"app": app}},
                    "template": {
                        "metadata": {"labels": {"app": app}},
                        "spec": {
                            "containers": [
                                {
                                    "name": "main",
                                    "image": f"example.com/app:{revision}",
                                    "ports": [{"containerPort": 8080}],
                                    "env": [{"name": "INDEX", "value": str(i)}],
                                }
                            ]
                        },
                    },
                },
            }
        )
    for i in range(counts["Service"]):
        app = apps[i % len(apps)]
        out.append(
            {
                "apiVersion": "v1",
                "kind": "Service",
                "metadata": _metadata(f"svc-{i:04d}", revision, app),
                "spec": {
                    "selector": {"app": app},
                    "ports": [{"name": "http", "port": 80, "targetPort": 8080}],
                },
            }
        )
    for i in range(counts["Secret"]):
        app = apps[i % len(apps)]
        value = f"secret {i} of revision {revision} ".encode() * 4
        out.append(
            {
                "apiVersion": "v1",
                "kind": "Secret",
                "type": "Opaque",
                "metadata": _metadata(f"secret-{i:04d}", revision, app),
                "data": {"password": base64.b64encode(value).decode()},
            }
        )
    for i in range(counts["ConfigMap"]):
        app = apps[i % len(apps)]
        out.append(
            {
                "apiVersion": "v1",
                "kind": "ConfigMap",
                "metadata": _metadata(f"cm-{i:04d}", revision, app),
                "data": {
                    "app.properties": f"name={app}\nindex={i}\nrevision={revision}\n" * 4,
                    "mode": "blue" if revision == 1 else "green",
                },
            }
        )
    return out


def write_tree(directory: Path, objects: list[Manifest]) -> None:
    """The objects as one YAML file per app (label ``app``): its Deployment, then its
    Services, Secrets and ConfigMaps, as a repository of many apps would have them."""
    directory.mkdir(parents=True)
    by_app: dict[str, list[Manifest]] = {}
    for obj in objects:
        by_app.setdefault(obj["metadata"]["labels"]["app"], []).append(obj)
    for app, documents in by_app.items():
        (directory / f"{app}.yaml").write_text(yaml.safe_dump_all(documents, sort_keys=False))


# --- measurements --------------------------------------------------------------------------


def _children_cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def control_plane_cpu() -> dict[str, float]:
    """CPU seconds used so far by each of this process's running children: the control
    plane's components (etcd, kube-apiserver, kube-controller-manager, kube-scheduler, kwok)."""
    ticks = os.sysconf("SC_CLK_TCK")
    used: dict[str, float] = {}
    me = os.getpid()
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit():
            continue
        try:
            stat = Path(entry.path, "stat").read_text()
        except OSError:
            continue
        name = stat[stat.index("(") + 1 : stat.rindex(")")]
        fields = stat[stat.rindex(")") + 2 :].split()
        if int(fields[1]) == me:  # ppid
            used[name] = used.get(name, 0.0) + (int(fields[11]) + int(fields[12])) / ticks
    return used


@dataclass
class Sample:
    """One phase of one method: seconds per step, the client's CPU seconds, and the control
    plane's CPU seconds (all its processes, over the whole phase)."""

    steps: dict[str, float] = field(default_factory=dict)
    cpu: float = 0.0
    server_cpu: dict[str, float] = field(default_factory=dict)

    @property
    def server_total(self) -> float:
        return sum(self.server_cpu.values())

    @property
    def total(self) -> float:
        return sum(self.steps.values())


class AgentMethod:
    """The agent's code: render, apply_group, prune, wait_healthy."""

    name = "agent"

    def __init__(self, kube: KubeClient, *, workers: int, interval: float) -> None:
        self.kube = kube
        self.workers = workers
        self.interval = interval
        self.inventory: Inventory | None = None
        self.counts: dict[str, dict[str, int]] = {}
        self.verified: Any = None
        self.skips = "verified" in inspect.signature(apply_group).parameters

    def reset(self) -> None:
        self.inventory = None
        self.verified = VerifiedObjects() if self.skips and VerifiedObjects is not None else None

    def phase(self, phase: str, tree: Path, namespace: str) -> Sample:
        sample = Sample()
        cpu = time.process_time()
        began = time.perf_counter()
        request = RenderRequest(source=BUNDLE, namespace=namespace)
        objects = finish(load_tree(tree, request), request)
        mark = time.perf_counter()
        sample.steps["render"] = mark - began
        previous = self.inventory
        reclaim = (
            frozenset(identity(e.ref) for e in previous) if previous is not None else frozenset()
        )
        extra: dict[str, Any] = {"verified": self.verified} if self.skips else {}
        result = apply_group(
            self.kube,
            [BundleInput(name=BUNDLE, objects=objects, settings=ApplySettings(reclaim=reclaim))],
            agent_namespace=namespace,
            workers=self.workers,
            **extra,
        )
        inventory = result.inventory_of(BUNDLE)
        if previous is not None:
            plan = plan_prune({BUNDLE: previous}, {BUNDLE: inventory})
            outcomes = prune(self.kube, plan)
            assert not [o for o in outcomes if o.done == "deleted"], outcomes
        self.inventory = inventory
        now = time.perf_counter()
        sample.steps["apply"], mark = now - mark, now
        report = wait_healthy(self.kube, objects, timeout=HEALTH_TIMEOUT, interval=self.interval)
        if not report.healthy:
            raise RuntimeError(f"agent {phase}: {report.summary()}")
        sample.steps["health"] = time.perf_counter() - mark
        sample.cpu = time.process_time() - cpu
        self.counts[phase] = result.counts
        if phase == "no-op":
            assert result.counts["unchanged"] == len(objects), result.counts
        elif phase == "install":
            assert result.counts["created"] == len(objects), result.counts
        elif phase == "partial":
            changed = len(range(0, len(objects), PARTIAL_EVERY))
            assert result.counts["configured"] == changed, result.counts
        else:
            assert result.counts["configured"] == len(objects), result.counts
        return sample


class KubectlMethod:
    """``kubectl apply --server-side``, then ``kubectl rollout status`` of the Deployments,
    then ``kubectl wait`` for them to be Available; each a new process."""

    name = "kubectl"

    def __init__(self, kubectl: Path, kubeconfig: Path, cache_dir: Path) -> None:
        self.base = [str(kubectl), f"--kubeconfig={kubeconfig}", f"--cache-dir={cache_dir}"]

    def reset(self) -> None:
        pass

    def _run(self, args: list[str]) -> float:
        began = time.perf_counter()
        done = subprocess.run(
            [*self.base, *args], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True
        )
        if done.returncode != 0:
            raise RuntimeError(f"kubectl {' '.join(args)} failed: {done.stderr.strip()}")
        return time.perf_counter() - began

    def phase(self, phase: str, tree: Path, namespace: str) -> Sample:
        sample = Sample()
        cpu = _children_cpu()
        timeout = f"--timeout={HEALTH_TIMEOUT:.0f}s"
        sample.steps["apply"] = self._run(
            ["apply", "--server-side", "-n", namespace, "-f", str(tree)]
        )
        selector = f"--selector={GROUP_LABEL}={BUNDLE}"
        sample.steps["rollout"] = self._run(
            ["rollout", "status", "deployment", "-n", namespace, selector, timeout]
        )
        # After the rollouts' end: if anything, shorter than right after the apply.
        sample.steps["wait"] = self._run(
            ["wait", "--for=condition=Available", "deployment", "--all", "-n", namespace, timeout]
        )
        sample.cpu = _children_cpu() - cpu
        return sample


Method = AgentMethod | KubectlMethod


def create_namespace(kube: KubeClient, namespace: str) -> None:
    kube.apply(
        {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": namespace}},
        field_manager="bench",
    )
    # The namespace's default ServiceAccount: not needed (the pods run nowhere), but wait for
    # the controllers' own writes so they do not fall into the timed phase.
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        account = {
            "apiVersion": "v1",
            "kind": "ServiceAccount",
            "metadata": {"name": "default", "namespace": namespace},
        }
        if kube.get(account) is not None:
            return
        time.sleep(0.1)


def delete_namespace(kube: KubeClient, namespace: str, timeout: float = 600.0) -> float:
    """Delete the namespace and wait until it is gone (its objects too); seconds taken."""
    began = time.monotonic()
    ref = {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": namespace}}
    try:
        kube.delete(ref)
    except NotFoundError:
        return 0.0
    while kube.get(ref) is not None:
        if time.monotonic() - began > timeout:
            raise RuntimeError(f"namespace {namespace} not gone after {timeout:.0f}s")
        time.sleep(0.5)
    return time.monotonic() - began


def run_method(
    method: Method,
    kube: KubeClient,
    trees: dict[int, Path],
    namespace: str,
    log: Callable[[str], None],
) -> dict[str, Sample]:
    """Every phase of one method in a fresh namespace, deleted afterwards."""
    create_namespace(kube, namespace)
    method.reset()
    samples: dict[str, Sample] = {}
    try:
        for phase, revision in zip(PHASES, REVISIONS, strict=True):
            before = control_plane_cpu()
            sample = method.phase(phase, trees[revision], namespace)
            after = control_plane_cpu()
            sample.server_cpu = {k: round(v - before.get(k, 0.0), 2) for k, v in after.items()}
            samples[phase] = sample
            steps = ", ".join(f"{k} {v:.2f}" for k, v in sample.steps.items())
            log(
                f"  {method.name:7s} {phase:8s} {sample.total:7.2f} s ({steps}; CPU client "
                f"{sample.cpu:.1f}, control plane {sample.server_total:.1f}: "
                f"{', '.join(f'{k} {v:.1f}' for k, v in sample.server_cpu.items())})"
            )
    finally:
        gone = delete_namespace(kube, namespace)
        log(f"  {method.name:7s} namespace deleted in {gone:.1f} s")
    return samples


def median(samples: list[dict[str, Sample]], phase: str, steps: tuple[str, ...]) -> float:
    return statistics.median(sum(s[phase].steps[k] for k in steps) for s in samples)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--objects", type=int, default=2000, help="objects in the group (2000)")
    parser.add_argument("--repeat", type=int, default=3, help="repetitions per method (3)")
    parser.add_argument(
        "--workers",
        type=int,
        default=_DEFAULTS.workers,
        help=f"the agent's apply pool ({_DEFAULTS.workers}, its default)",
    )
    parser.add_argument("--json", metavar="FILE", help="also write every sample as JSON")
    args = parser.parse_args(argv)

    def log(message: str) -> None:
        print(message, file=sys.stderr, flush=True)

    binaries = ensure_binaries()
    counts = mix(args.objects)
    load_start = os.getloadavg()[0]
    with tempfile.TemporaryDirectory(prefix="fleetlet-bench-apply-") as tmp_name:
        tmp = Path(tmp_name)
        trees = {}
        for revision in sorted(set(REVISIONS)):
            trees[revision] = tmp / f"rev{revision}"
            write_tree(trees[revision], group_objects(args.objects, revision))
        cluster = Cluster(name="bench", workdir=tmp / "kube", binaries=binaries)
        began = time.perf_counter()
        with (
            cluster,
            KubeClient(
                kubeconfig=cluster.kubeconfig, discovery_cache_dir=tmp / "discovery"
            ) as kube,
        ):
            log(f"control plane up in {time.perf_counter() - began:.1f} s ({cluster.workdir})")
            agent = AgentMethod(kube, workers=args.workers, interval=_DEFAULTS.health_interval)
            kubectl = KubectlMethod(binaries["kubectl"], cluster.kubeconfig, tmp / "kubectl-cache")
            methods: list[Method] = [agent, kubectl]
            # Warm-up (not timed): discovery caches, connections, the first Deployments.
            warm = {revision: tmp / f"warm{revision}" for revision in sorted(set(REVISIONS))}
            for revision, directory in warm.items():
                write_tree(directory, group_objects(20, revision))
            for method in methods:
                run_method(method, kube, warm, f"warm-{method.name}", lambda _m: None)
            results: dict[str, list[dict[str, Sample]]] = {m.name: [] for m in methods}
            for rep in range(args.repeat):
                log(f"repetition {rep + 1}/{args.repeat}")
                order = methods[rep % 2 :] + methods[: rep % 2]
                for method in order:
                    namespace = f"bench-{method.name}-{rep}"
                    results[method.name].append(run_method(method, kube, trees, namespace, log))
            load = os.getloadavg()[0]

    agent_runs, kubectl_runs = results["agent"], results["kubectl"]
    summary: dict[str, Any] = {
        "benchmark": "apply",
        "objects": args.objects,
        "mix": counts,
        "repeat": args.repeat,
        "workers": args.workers,
        "health_interval_s": _DEFAULTS.health_interval,
        "machine": f"{platform.machine()}, {os.cpu_count()} CPUs",
        "load_average_start": round(load_start, 2),
        "load_average_end": round(load, 2),
        "phases": {},
    }
    cores = os.cpu_count() or 1
    rows, cpu_rows = [], []
    for phase in PHASES:
        agent_s = median(agent_runs, phase, ("render", "apply", "health"))
        kubectl_s = median(kubectl_runs, phase, ("apply", "wait"))
        rollout_s = median(kubectl_runs, phase, ("apply", "rollout"))

        def floor(runs: list[dict[str, Sample]], phase: str = phase) -> float:
            """The CPU the phase made the machine spend, over its CPUs."""
            return statistics.median((r[phase].cpu + r[phase].server_total) / cores for r in runs)

        f: dict[str, Any] = {
            "agent_s": round(agent_s, 2),
            "agent_render_s": round(median(agent_runs, phase, ("render",)), 2),
            "agent_apply_s": round(median(agent_runs, phase, ("apply",)), 2),
            "agent_health_s": round(median(agent_runs, phase, ("health",)), 2),
            "kubectl_s": round(kubectl_s, 2),
            "kubectl_apply_s": round(median(kubectl_runs, phase, ("apply",)), 2),
            "kubectl_wait_s": round(median(kubectl_runs, phase, ("wait",)), 2),
            "kubectl_rollout_s": round(median(kubectl_runs, phase, ("rollout",)), 2),
            "kubectl_apply_rollout_s": round(rollout_s, 2),
            "ratio": round(kubectl_s / agent_s, 2),
            "ratio_apply_rollout": round(rollout_s / agent_s, 2),
            "agent_vs_apply_rollout": round(agent_s / rollout_s, 2),
            "agent_floor_s": round(floor(agent_runs), 2),
            "kubectl_floor_s": round(floor(kubectl_runs), 2),
            "agent_vs_floor": round(agent_s / floor(agent_runs), 2),
            "agent_vs_kubectl_floor": round(agent_s / floor(kubectl_runs), 2),
            "agent_client_cpu_s": round(statistics.median(r[phase].cpu for r in agent_runs), 2),
            "kubectl_client_cpu_s": round(statistics.median(r[phase].cpu for r in kubectl_runs), 2),
            "agent_control_plane_cpu_s": round(
                statistics.median(r[phase].server_total for r in agent_runs), 2
            ),
            "kubectl_control_plane_cpu_s": round(
                statistics.median(r[phase].server_total for r in kubectl_runs), 2
            ),
            "agent_samples_s": [round(r[phase].total, 2) for r in agent_runs],
            "kubectl_samples_s": [
                round(r[phase].steps["apply"] + r[phase].steps["wait"], 2) for r in kubectl_runs
            ],
            "kubectl_rollout_samples_s": [
                round(r[phase].steps["apply"] + r[phase].steps["rollout"], 2) for r in kubectl_runs
            ],
        }
        summary["phases"][phase] = f
        rows.append(
            f"| {phase} | {f['agent_s']:.1f} ({f['agent_render_s'] + f['agent_apply_s']:.1f} / "
            f"{f['agent_health_s']:.1f}) | {f['kubectl_apply_rollout_s']:.1f} "
            f"({f['kubectl_apply_s']:.1f} / {f['kubectl_rollout_s']:.1f}) | "
            f"**{f['agent_vs_apply_rollout']:.2f}x** | {f['agent_floor_s']:.1f} | "
            f"**{f['agent_vs_floor']:.2f}x** | {f['kubectl_floor_s']:.1f} | "
            f"{f['kubectl_s']:.1f} | {f['ratio']:.1f}x |"
        )
        cpu_rows.append(
            f"| {phase} | {f['agent_client_cpu_s']:.1f} | {f['agent_control_plane_cpu_s']:.1f} | "
            f"{f['kubectl_client_cpu_s']:.1f} | {f['kubectl_control_plane_cpu_s']:.1f} |"
        )
    mix_text = ", ".join(f"{n} {k}s" for k, n in counts.items())
    print(
        f"\napply + health of a {args.objects}-object group ({mix_text}) in one namespace; "
        f"medians of {args.repeat}, seconds; agent: {args.workers} workers, health interval "
        f"{_DEFAULTS.health_interval:g} s; {cores} CPUs, load average at the end {load:.1f}\n"
    )
    print(
        "| phase | agent (render+apply / health) | kubectl apply + rollout status (apply / "
        "rollout) | agent / that | agent's CPU floor | agent / its floor | kubectl's CPU "
        "floor | kubectl apply + wait Available | that / agent |"
    )
    print("|---|---:|---:|---:|---:|---:|---:|---:|---:|")
    print("\n".join(rows))
    print()
    print(
        "| phase | agent client CPU | agent control-plane CPU | kubectl client CPU "
        "| kubectl control-plane CPU |"
    )
    print("|---|---:|---:|---:|---:|")
    print("\n".join(cpu_rows))
    print()
    print(json.dumps(summary))
    if args.json:
        samples = {
            name: [
                {
                    p: {**s.steps, "cpu": s.cpu, "control_plane_cpu": s.server_cpu}
                    for p, s in run.items()
                }
                for run in runs
            ]
            for name, runs in results.items()
        }
        Path(args.json).write_text(json.dumps({**summary, "samples": samples}, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
