"""The command line as a user runs it: ``fleetlet render`` against ``helm template`` and
``kustomize build`` as whole processes, and the read-only commands' start-up.

Every case is a whole process started the way a user starts it: the ``fleetlet`` console script
beside this Python (``python -m fleetlet`` without one), with ``PYTHONPATH`` at this checkout so
its code runs; the pinned helm and kustomize themselves. The cases take turns in every round
(so load on the shared machine falls on all), ``--repeat`` rounds after one warm-up round; the
figure is the median wall time, and each render's ratio is to its baseline in the same run.

- ``fleetlet render CHART`` vs ``helm template podinfo CHART --namespace default
  --include-crds`` (podinfo 6.14.1, ``tests/assets/charts/podinfo``);
- ``fleetlet render TREE --path apps/production`` vs ``kustomize build TREE/apps/production``
  (Flux's example, ``tests/assets/flux2-kustomize-helm-example``);
- ``fleetlet --version``, ``--help``, ``render --help``, ``health --offline``, ``hub --help``
  and ``python -c pass`` (the floor: the interpreter and this machine's ``site``), with the
  number of modules each imports (``python -X importtime``).

Prints a markdown table and, with ``--write``, the section "Render: the command line" of
``docs/benchmarks.md``. Run from the repository root::

    python -m bench.render_cli --repeat 15 --write
"""

from __future__ import annotations

import argparse
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

from bench._docs import write_section

ROOT = Path(__file__).resolve().parent.parent
DOCS = ROOT / "docs" / "benchmarks.md"
SECTION = "## Render: the command line"
CHART = ROOT / "tests" / "assets" / "charts" / "podinfo"
FLUX = ROOT / "tests" / "assets" / "flux2-kustomize-helm-example"
TARGET = 1.3

HEALTH_FILE = """apiVersion: v1
kind: ConfigMap
metadata: {name: settings, namespace: shop}
data: {a: b}
"""


@dataclass(frozen=True)
class Case:
    name: str
    argv: list[str]
    baseline: str | None = None  # the case this one is compared to


def _fleetlet() -> list[str]:
    script = Path(sys.executable).parent / "fleetlet"
    return [str(script)] if script.is_file() else [sys.executable, "-m", "fleetlet"]


def _tool(name: str) -> str:
    from agent.render.tools import find_tool

    return str(find_tool(name, override=os.environ.get(f"FLEETLET_{name.upper()}")))


def cases(scratch: Path) -> list[Case]:
    fleetlet = _fleetlet()
    health = scratch / "objects.yaml"
    health.write_text(HEALTH_FILE)
    helm, kustomize = _tool("helm"), _tool("kustomize")
    return [
        Case("helm template (podinfo)", [helm, "template", "podinfo", str(CHART),
             "--namespace", "default", "--include-crds"]),
        Case("fleetlet render (podinfo)", [*fleetlet, "render", str(CHART),
             "--release-name", "podinfo"], baseline="helm template (podinfo)"),
        Case("kustomize build (Flux apps/production)", [kustomize, "build",
             str(FLUX / "apps" / "production")]),
        Case("fleetlet render (Flux apps/production)", [*fleetlet, "render", str(FLUX),
             "--path", "apps/production"], baseline="kustomize build (Flux apps/production)"),
        Case("python -c pass (the floor)", [sys.executable, "-c", "pass"]),
        Case("fleetlet --version", [*fleetlet, "--version"]),
        Case("fleetlet --help", [*fleetlet, "--help"]),
        Case("fleetlet render --help", [*fleetlet, "render", "--help"]),
        Case("fleetlet health --offline", [*fleetlet, "health", "-f", str(health), "--offline"]),
        Case("fleetlet hub --help", [*fleetlet, "hub", "--help"]),
    ]  # fmt: skip


CODE = ROOT
# Where the commands run: not a checkout (``python -m`` puts its directory first on sys.path).
_NEUTRAL = "/"


def _env() -> dict[str, str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = str(CODE)
    # As installed by pip: modules compiled once (the warm-up round writes __pycache__), not
    # compiled again by every command, whatever this shell says.
    env.pop("PYTHONDONTWRITEBYTECODE", None)
    return env


def _run(case: Case, env: dict[str, str]) -> float:
    start = time.perf_counter()
    done = subprocess.run(case.argv, env=env, capture_output=True, check=False, cwd=_NEUTRAL)
    elapsed = time.perf_counter() - start
    if done.returncode != 0:
        raise SystemExit(f"{case.name}: exit {done.returncode}: {done.stderr.decode()[-400:]}")
    return elapsed


def _modules(case: Case, env: dict[str, str]) -> int | None:
    """How many modules the command imports (``-X importtime`` lines); None for a tool."""
    argv = case.argv
    if argv[0] == sys.executable:
        argv = [sys.executable, "-X", "importtime", *argv[1:]]
    elif Path(argv[0]).name == "fleetlet":
        argv = [sys.executable, "-X", "importtime", "-m", "fleetlet", *argv[1:]]
    else:
        return None
    done = subprocess.run(argv, env=env, capture_output=True, check=False, cwd=_NEUTRAL)
    return done.stderr.decode().count("import time:") - 1  # the header line


def measure(repeat: int) -> tuple[list[Case], dict[str, list[float]], dict[str, int | None]]:
    env = _env()
    with tempfile.TemporaryDirectory(prefix="fleetlet-bench-cli-") as scratch:
        all_cases = cases(Path(scratch))
        times: dict[str, list[float]] = {c.name: [] for c in all_cases}
        for _ in range(1):  # warm-up: page cache, pyc files
            for case in all_cases:
                _run(case, env)
        for _ in range(repeat):
            for case in all_cases:
                times[case.name].append(_run(case, env))
        modules = {c.name: _modules(c, env) for c in all_cases}
    return all_cases, times, modules


def report(
    all_cases: list[Case], times: dict[str, list[float]], modules: dict[str, int | None],
    repeat: int,
) -> str:  # fmt: skip
    median = {name: statistics.median(runs) for name, runs in times.items()}
    load = os.getloadavg()[0]
    lines = [
        SECTION,
        "",
        f"`python -m bench.render_cli --repeat {repeat} --write`: whole processes as a user "
        f"runs them, the cases taking turns in each of {repeat} rounds after a warm-up round; "
        "median wall time. `fleetlet` is the console script with this checkout's code, its "
        "modules compiled once as pip installs them (`__pycache__`: this machine's shells set "
        "`PYTHONDONTWRITEBYTECODE`, which would compile every module on every command); helm "
        "and kustomize are the pinned binaries. Machine: "
        f"{platform.machine()}, {os.cpu_count()} CPUs shared with other work, load average "
        f"{load:.1f}, Python {platform.python_version()}.",
        "",
        "| command | median ms | min ms | vs baseline | modules imported |",
        "|---|---:|---:|---:|---:|",
    ]
    for case in all_cases:
        runs = times[case.name]
        ratio = ""
        if case.baseline:
            ratio = f"{median[case.name] / median[case.baseline]:.2f}x"
        count = modules[case.name]
        lines.append(
            f"| `{case.name}` | {median[case.name] * 1000:.0f} | {min(runs) * 1000:.0f} | "
            f"{ratio} | {'' if count is None else count} |"
        )
    lines.append("")
    for case in all_cases:
        if case.baseline:
            ratio = median[case.name] / median[case.baseline]
            verdict = "met" if ratio <= TARGET else "not met"
            lines.append(
                f"- {case.name}: {ratio:.2f}x of `{case.baseline}` (target {TARGET}x: "
                f"**{verdict}**); fleetlet's own share "
                f"{(median[case.name] - median[case.baseline]) * 1000:.0f} ms, of which the "
                f"interpreter's floor is {median['python -c pass (the floor)'] * 1000:.0f} ms."
            )
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.render_cli", description=__doc__)
    parser.add_argument("--repeat", type=int, default=15)
    parser.add_argument("--write", action="store_true", help="write docs/benchmarks.md")
    parser.add_argument(
        "--code",
        type=Path,
        default=ROOT,
        help="the checkout whose fleetlet runs (default: this one; another to compare)",
    )
    args = parser.parse_args(argv)
    global CODE
    CODE = args.code
    all_cases, times, modules = measure(args.repeat)
    text = report(all_cases, times, modules, args.repeat)
    print(text)
    if args.write:
        write_section(text, DOCS)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
