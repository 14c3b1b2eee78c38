"""Time to converge: from ``hub publish`` to every cluster of the demo fleet reporting the new
revision Ready, and from a failed health check to the group rolled back and reported.

Starts the demo fleet of ``fleetlet demo`` (``fleetlet/demo.py``: three local clusters, a git
daemon, a registry, a local Sigstore, the hub, one ``fleetlet agent run`` per cluster, polling
every ``--interval`` seconds with a quarter of it as jitter, as the demo runs them) and waits
until every installation is Ready. Then:

- **publish to Ready**, ``--runs`` times: ``payments-config`` (on every store) moves between its
  v1 and v2 content; the clock starts before the hub's publish (resolve, render, sign once,
  push) and stops when the status branch of every cluster (``fleetlet/status/<cluster>`` in
  the status repository, read from the server's disk every 50 ms) says ``payments-config`` is
  Ready on the serial just published. Per cluster too, and the publish itself.
- **failed health check to rolled back and reported**, ``--rollbacks`` times: the canary
  store's ``shop`` group gets ``shop-backend`` v2, whose image never becomes ready (kwok); its
  health check gives up after the bundle's ``healthChecks.timeoutSeconds`` (30 s in the
  example fleet). The same failed target is not tried again by itself: from the second run
  on, the bench sets a new ``fleetlet.io/retry`` annotation on the BundleDeployment first, as
  a cluster admin would. The clock starts when the canary's BundleDeployment says the group is
  rolling back (read from its API server every 50 ms: the health check failed there and then)
  and stops when its status branch reports ``RolledBack``; when the cluster itself says
  ``RolledBack`` is timed too. Then the override is removed and the group moves back (a
  publish-to-Ready sample of the canary alone).

With ``--warm-worker`` the agents keep their next worker started and loaded (``agent run
--warm-worker``), in every run. With ``--channel`` the agents also hold a notification channel (``agent run --notify-url``,
polling every hour while it is up) to a second ``hub serve --channel-tokens`` that only serves
it: the publish-to-Ready runs are made twice in the same run, first with the channel, then
with that hub stopped (the agents back to polling every ``--interval``).

The hub's own refresh (``hub serve --refresh``) is not included: it adds up to its period to
what a dashboard shows. Prints medians and 95th percentiles next to the poll interval, and one
JSON line. From the repository root::

    python3 bench/e2e_latency.py [--interval 10] [--runs 10] [--rollbacks 3] [--channel]
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import platform
import random
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

import pygit2  # noqa: E402
import yaml  # noqa: E402

from agent.api.status import ClusterStatus, load_status  # noqa: E402
from bench import _stages as stages  # noqa: E402
from fleetlet.demo.environment import Demo, _free_port  # noqa: E402
from fleetlet.demo.examples import CANARY, bundle_files  # noqa: E402

CONVERGE_BUNDLE = "payments-config"
BROKEN_BUNDLE = "shop-backend"
SAMPLE = 0.05
SETTLE = 5.0
# Up to one poll interval more idle, drawn each time: publishes at a fixed cadence near the poll
# period land at the same point of every agent's poll cycle and make polling look faster (or
# slower) than it is.
PHASE = 10.0


class BenchError(RuntimeError):
    """The fleet did not reach what was waited for (the message says what)."""


def percentile(values: list[float], q: float) -> float:
    """The ``q`` quantile (0..1) by linear interpolation between the closest ranks."""
    ordered = sorted(values)
    if not ordered:
        return float("nan")
    position = (len(ordered) - 1) * q
    low = int(position)
    high = min(low + 1, len(ordered) - 1)
    return ordered[low] + (ordered[high] - ordered[low]) * (position - low)


class Fleet:
    """The demo fleet and what the bench reads of it."""

    def __init__(self, demo: Demo) -> None:
        self.demo = demo
        self.status_repo = pygit2.Repository(str(demo.git.root / "fleet-status.git"))
        self._clients: dict[str, Any] = {}

    def publish(self) -> dict[str, int]:
        """Publish the fleet as committed; the serial each changed cluster got."""
        from hub.publish.flow import prepare, publish
        from hub.publish.git import BranchStore
        from hub.publish.sign import PublicationSigner

        demo = self.demo
        signer = PublicationSigner.from_trust_config(
            trust_config=demo.sigstore.trust_config_path, token=demo.sigstore.mint_token()
        )
        with BranchStore(
            url=demo.git.url_for("fleet-state.git"), cache_dir=demo.workdir / "hub-publish"
        ) as store:
            report = publish(prepare(demo.fleet), store, signer=signer)
        return {c.cluster: int(c.serial_after) for c in report.changes if c.serial_after}

    def status(self, cluster: str) -> ClusterStatus | None:
        ref = self.status_repo.references.get(f"refs/heads/fleetlet/status/{cluster}")
        if ref is None:
            return None
        commit = self.status_repo[ref.target]
        assert isinstance(commit, pygit2.Commit)
        blob = self.status_repo[commit.tree["status.json"].id]
        assert isinstance(blob, pygit2.Blob)
        return load_status(bytes(blob.data), origin=cluster)

    def reported(self, cluster: str, bundle: str) -> tuple[int | None, str, str]:
        """(applied serial, Ready status, Ready reason) of a bundle in a cluster's status."""
        status = self.status(cluster)
        for report in status.bundles if status else ():
            if report.name == bundle:
                ready = next((c for c in report.conditions if c.type == "Ready"), None)
                serial = report.applied_revision.serial if report.applied_revision else None
                return serial, ready.status if ready else "", ready.reason if ready else ""
        return None, "", ""

    def phase(self, cluster: str, bundle: str) -> tuple[str, str]:
        """(status.phase, Ready reason) of a BundleDeployment, read from the cluster."""
        kube = self._kube(cluster)
        bd = kube.get(
            {"apiVersion": "fleetlet.io/v1alpha1", "kind": "BundleDeployment",
             "metadata": {"name": bundle}}
        )  # fmt: skip
        status = (bd or {}).get("status") or {}
        ready = next((c for c in status.get("conditions") or [] if c["type"] == "Ready"), {})
        return str(status.get("phase") or ""), str(ready.get("reason") or "")

    def _kube(self, cluster: str) -> Any:
        from agent.kube import KubeClient

        if cluster not in self._clients:
            self._clients[cluster] = KubeClient(
                kubeconfig=str(self.demo.clusters[cluster].kubeconfig)
            )
        return self._clients[cluster]

    def commit(self, message: str) -> None:
        self.demo.commit(message)


def wait(check: Callable[[], bool], what: str, demo: Demo, timeout: float = 600) -> float:
    """Wait until ``check()``; the monotonic time it first held."""
    deadline = time.monotonic() + timeout
    while True:
        with contextlib.suppress(KeyError, ValueError, OSError):
            if check():
                return time.monotonic()
        if time.monotonic() > deadline:
            raise BenchError(f"timed out waiting for {what}")
        demo._check_alive()
        time.sleep(SAMPLE)


def set_payments(fleet: Fleet, version: str) -> None:
    demo = fleet.demo
    path = bundle_files(demo.fleet)[CONVERGE_BUNDLE]
    doc = yaml.safe_load(path.read_text())
    doc["sources"][0]["digest"] = demo.digests[(CONVERGE_BUNDLE, version)]
    path.write_text(yaml.safe_dump(doc, sort_keys=False))
    fleet.commit(f"{CONVERGE_BUNDLE} {version}")


def set_canary_backend(fleet: Fleet, version: str | None) -> None:
    demo = fleet.demo
    path = bundle_files(demo.fleet)[BROKEN_BUNDLE]
    doc = yaml.safe_load(path.read_text())
    doc.pop("overrides", None)
    if version is not None:
        source = dict(doc["sources"][0], digest=demo.digests[(BROKEN_BUNDLE, version)])
        doc["overrides"] = [
            {"clusterSelector": {"matchLabels": {"tier": "canary"}}, "sources": [source]}
        ]
    path.write_text(yaml.safe_dump(doc, sort_keys=False))
    fleet.commit(f"{BROKEN_BUNDLE} {version or 'as everywhere'} on the canary")


def converge(fleet: Fleet, version: str) -> dict[str, float]:
    """One publish-to-Ready sample: seconds to each cluster and to all, and of the publish."""
    set_payments(fleet, version)
    # Idle between publishes, as a fleet is (a standby worker is loaded), then a random phase.
    time.sleep(SETTLE + random.uniform(0.0, PHASE))
    began, began_wall = time.monotonic(), time.time()
    serials = fleet.publish()
    published = time.monotonic()
    if not serials:
        raise BenchError("the publish changed no cluster")
    done: dict[str, float] = {}

    def all_reported() -> bool:
        for cluster, serial in serials.items():
            if cluster in done:
                continue
            applied, ready, _ = fleet.reported(cluster, CONVERGE_BUNDLE)
            if applied == serial and ready == "True":
                done[cluster] = time.monotonic() - began
        return len(done) == len(serials)

    end = wait(all_reported, f"{CONVERGE_BUNDLE} {version} Ready everywhere", fleet.demo)
    return {"all": end - began, "publish": published - began, "began": began_wall, **done}


def roll_back(fleet: Fleet, run: int) -> dict[str, float]:
    """One failed-health-check sample on the canary; then the group moves back."""
    if run:
        # A target that failed is not tried again by itself: ask for one more attempt, as a
        # cluster admin would; the agent reads it with the publication that follows.
        kube = fleet._kube(CANARY)
        kube.patch(
            {"apiVersion": "fleetlet.io/v1alpha1", "kind": "BundleDeployment",
             "metadata": {"name": BROKEN_BUNDLE}},
            {"metadata": {"annotations": {"fleetlet.io/retry": f"bench-{run}"}}},
        )  # fmt: skip
    set_canary_backend(fleet, "v2")
    began = time.monotonic()
    fleet.publish()
    seen: dict[str, float] = {}

    def rolled_back_and_reported() -> bool:
        now = time.monotonic()
        phase, reason = fleet.phase(CANARY, BROKEN_BUNDLE)
        if phase == "RollingBack" or reason == "RolledBack":
            seen.setdefault("failed", now)  # the health check gave up: rolling back
        if reason == "RolledBack":
            seen.setdefault("in_cluster", now)
        if fleet.reported(CANARY, BROKEN_BUNDLE)[2] == "RolledBack":
            seen.setdefault("reported", now)
        return "reported" in seen and "in_cluster" in seen

    wait(rolled_back_and_reported, "the canary's group rolled back and reported", fleet.demo)
    failed = seen["failed"]
    set_canary_backend(fleet, None)
    back = time.monotonic()
    fleet.publish()
    # Back to what it runs already: the group stays on its healthy revision and says so.
    ready = wait(
        lambda: fleet.reported(CANARY, BROKEN_BUNDLE)[1:] == ("True", "Healthy"),
        "the canary's group Ready again",
        fleet.demo,
    )
    return {
        "publish_to_failed": failed - began,
        "failed_to_rolled_back": seen["in_cluster"] - failed,
        "failed_to_reported": seen["reported"] - failed,
        "revert_to_ready": ready - back,
    }


def start_channel(demo: Demo) -> subprocess.Popen[bytes]:
    """A ``hub serve`` that serves the agents' notification channel (and sets the agents'
    flags to hold it); it watches the cluster branches every 200 ms."""
    from hub.channel import write_channel_tokens

    tokens = {name: f"channel-{name}-{os.urandom(8).hex()}" for name in demo.clusters}
    write_channel_tokens(demo.workdir / "channel.yaml", tokens)
    for name, token in tokens.items():
        (demo.workdir / f"channel-{name}.token").write_text(token)
    port = _free_port()
    log = demo.workdir / "channel-hub.log"
    command = [sys.executable, "-m", "hub.serve", "--repo", demo.git.url_for("fleet-status.git"),
               "--listen", f"127.0.0.1:{port}", "--allow-anonymous", "--refresh", "1h",
               "--cache-dir", str(demo.workdir / "channel-cache"),
               "--channel-tokens", str(demo.workdir / "channel.yaml"),
               "--channel-repo", demo.git.url_for("fleet-state.git"), "--channel-watch", "200ms"]  # fmt: skip
    with log.open("wb") as out:
        process = subprocess.Popen(command, cwd=ROOT, stdout=out, stderr=out)
    deadline = time.monotonic() + 60
    while b"serving on" not in log.read_bytes():
        if process.poll() is not None or time.monotonic() > deadline:
            raise BenchError(f"the channel's hub did not start: {log.read_text()}")
        time.sleep(0.2)
    demo.agent_extra = lambda name: [
        "--notify-url", f"http://127.0.0.1:{port}",
        "--notify-token-file", str(demo.workdir / f"channel-{name}.token"),
        "--notify-poll-interval", "3600",
    ]  # fmt: skip
    return process


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--interval", type=float, default=10.0, help="agents' poll interval")
    parser.add_argument("--runs", type=int, default=10, help="publish-to-Ready samples (10)")
    parser.add_argument("--rollbacks", type=int, default=3, help="rollback samples (3)")
    parser.add_argument(
        "--warm-worker", action="store_true", help="the agents keep a standby worker loaded"
    )
    parser.add_argument("--keep", type=Path, help="work in this directory and keep it (logs)")
    parser.add_argument(
        "--channel", action="store_true", help="the runs with the notification channel first"
    )
    parser.add_argument(
        "--settle", type=float, default=SETTLE, help="seconds idle before each publish (5)"
    )
    args = parser.parse_args(argv)
    globals()["SETTLE"] = args.settle
    globals()["PHASE"] = args.interval
    load_start = os.getloadavg()[0]
    workdir = args.keep or Path(tempfile.mkdtemp(prefix="fleetlet-e2e-"))
    workdir.mkdir(parents=True, exist_ok=True)
    # Every process started from here on (hub, agents, their workers) traces its stages.
    trace = workdir / "trace.jsonl"
    trace.unlink(missing_ok=True)
    os.environ["FLEETLET_TRACE"] = str(trace)
    demo = Demo(
        workdir=workdir,
        scenario="install",
        exit_when_ready=True,
        timeout=900,
        interval=args.interval,
    )
    converged: list[dict[str, float]] = []
    told: list[dict[str, float]] = []
    rolled: list[dict[str, float]] = []
    channel: subprocess.Popen[bytes] | None = None
    with demo.stack:
        try:
            demo.start_components()
            demo.push_content()
            demo.publish_fleet()
            if args.channel:
                channel = start_channel(demo)
            if args.warm_worker:
                extra = demo.agent_extra
                demo.agent_extra = lambda name: [*extra(name), "--warm-worker"]
            demo.start_agents_and_hub()
            demo.wait_for(demo.all_ready, "every installation Ready")
            fleet = Fleet(demo)
            if channel is not None:
                time.sleep(2 * args.interval)  # every agent's channel up, its polls quiet
                for run in range(args.runs):
                    sample = converge(fleet, "v2" if run % 2 == 0 else "v1")
                    told.append(sample)
                    print(f"with the channel {run + 1}/{args.runs}: {sample['all']:.1f} s",
                          file=sys.stderr)  # fmt: skip
                channel.terminate()
                channel.wait(timeout=30)
                time.sleep(2)  # the agents saw it go: polling at --interval again
            for run in range(args.runs):
                # Alternating on from the runs with the channel (an odd count of them too).
                sample = converge(fleet, "v2" if (len(told) + run) % 2 == 0 else "v1")
                converged.append(sample)
                print(
                    f"publish to Ready {run + 1}/{args.runs}: {sample['all']:.1f} s",
                    file=sys.stderr,
                )
            for run in range(args.rollbacks):
                sample = roll_back(fleet, run)
                rolled.append(sample)
                print(
                    f"rollback {run + 1}/{args.rollbacks}: failed to reported "
                    f"{sample['failed_to_reported']:.1f} s",
                    file=sys.stderr,
                )
        finally:
            if channel is not None and channel.poll() is None:
                channel.kill()
            demo._stop_processes()
    jitter = args.interval / 4
    clusters = (
        sorted(k for k in converged[0] if k not in ("all", "publish", "began")) if converged else []
    )

    def row(label: str, values: list[float]) -> str:
        if not values:  # --rollbacks 0, or no --channel
            return ""
        return (
            f"| {label} | {statistics.median(values):.1f} | {percentile(values, 0.95):.1f} | "
            f"{min(values):.1f} | {max(values):.1f} | {len(values)} |"
        )

    rows = [
        "| from | p50 s | p95 s | min s | max s | runs |",
        "|---|---:|---:|---:|---:|---:|",
        *(
            [row("`hub publish` to every cluster Ready, with the channel", [s["all"] for s in told]),
             row("of which the publish (resolve, render, sign, push)", [s["publish"] for s in told])]
            if told else []
        ),
        row("`hub publish` to every cluster reporting Ready", [s["all"] for s in converged]),
        *(row(f"`hub publish` to {c} reporting Ready", [s[c] for s in converged]) for c in clusters),
        row("of which the publish (resolve, render, sign, push)", [s["publish"] for s in converged]),
        *(
            [row(f"`hub publish` to every cluster Ready, polling every {args.interval:g} s",
                 [s["all"] for s in converged])] if told else []
        ),
        row("`hub publish` to the canary's health check failing", [s["publish_to_failed"] for s in rolled]),
        row("failed health check to the group rolled back (in the cluster)", [s["failed_to_rolled_back"] for s in rolled]),
        row("failed health check to the rollback reported (status branch)", [s["failed_to_reported"] for s in rolled]),
        row("revert `hub publish` to the canary's group Ready again", [s["revert_to_ready"] for s in rolled]),
    ]  # fmt: skip
    machine = (
        f"{platform.machine()}, {os.cpu_count()} CPUs, load average {load_start:.1f} at the "
        f"start and {os.getloadavg()[0]:.1f} at the end, Python {platform.python_version()}"
    )
    print(
        f"\nTime to converge, demo fleet ({len(clusters)} clusters); agents poll every "
        f"{args.interval:g} s + up to {jitter:g} s jitter; {machine}\n"
    )
    print("\n".join(r for r in rows if r))
    lines = stages.read(trace)
    for samples, title in ((told, "with the channel"), (converged, "polling")):
        if samples and lines:
            print("\nWhere the time goes, " + title + " (median over runs and clusters)\n")
            print("\n".join(stages.table(samples, lines, "stage, " + title)))
    print(
        json.dumps(
            {
                "bench": "e2e_latency",
                "interval": args.interval,
                "jitter": jitter,
                "converged": converged,
                "converged_with_channel": told,
                "rolled_back": rolled,
                "load_average_start": load_start,
                "load_average_end": os.getloadavg()[0],
            }
        )
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
