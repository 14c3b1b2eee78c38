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
- the same two renders run by ``python -S`` (no ``site``: without the .pth start-up hooks of
  this machine's site-packages, as a wheel in a clean environment starts), beside
  ``python -S -c pass``;
- with ``--before DIR``, the two renders once more with the code of another checkout, in the
  same rounds (before and after a change, under the same load);
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
import resource
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
    bare: bool = False  # run without this machine's .pth start-up hooks (see _BARE)
    code: Path | None = None  # another checkout's code (``--before``), else CODE


# The console script's own code, run by ``python -S``: the interpreter without ``site``, so
# without the .pth hooks of this machine's site-packages (the sandbox's certifi hook, the
# editable install's finder), with site-packages on PYTHONPATH instead: what the same command
# costs where fleetlet is installed from a wheel into a clean environment.
_BARE = "import sys; from fleetlet.cli import main; sys.exit(main())"


def _site_packages() -> list[str]:
    import site

    return [p for p in site.getsitepackages() if Path(p).is_dir()]


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
        Case("python -S -c pass (no site, no .pth hooks)", [sys.executable, "-S", "-c", "pass"]),
        Case("fleetlet render (podinfo), no .pth hooks", [sys.executable, "-S", "-c", _BARE,
             "render", str(CHART), "--release-name", "podinfo"],
             baseline="helm template (podinfo)", bare=True),
        Case("fleetlet render (Flux apps/production), no .pth hooks", [sys.executable, "-S",
             "-c", _BARE, "render", str(FLUX), "--path", "apps/production"],
             baseline="kustomize build (Flux apps/production)", bare=True),
        Case("fleetlet --version", [*fleetlet, "--version"]),
        Case("fleetlet --help", [*fleetlet, "--help"]),
        Case("fleetlet render --help", [*fleetlet, "render", "--help"]),
        Case("fleetlet health --offline", [*fleetlet, "health", "-f", str(health), "--offline"]),
        Case("fleetlet hub --help", [*fleetlet, "hub", "--help"]),
    ]  # fmt: skip


CODE = ROOT
BEFORE: Path | None = None
# Where the commands run: not a checkout (``python -m`` puts its directory first on sys.path).
_NEUTRAL = "/"


def _env() -> dict[str, str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = str(CODE)
    # As installed by pip: modules compiled once (the warm-up round writes __pycache__), not
    # compiled again by every command, whatever this shell says.
    env.pop("PYTHONDONTWRITEBYTECODE", None)
    return env


def _case_env(case: Case, env: dict[str, str]) -> dict[str, str]:
    code = str(case.code or CODE)
    if case.bare:
        return {**env, "PYTHONPATH": os.pathsep.join([code, *_site_packages()])}
    return {**env, "PYTHONPATH": code}


def _run(case: Case, env: dict[str, str]) -> tuple[float, float]:
    """Wall time and CPU time (user + system, its children included) of one run, in s."""
    env = _case_env(case, env)
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    start = time.perf_counter()
    done = subprocess.run(case.argv, env=env, capture_output=True, check=False, cwd=_NEUTRAL)
    elapsed = time.perf_counter() - start
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if done.returncode != 0:
        raise SystemExit(f"{case.name}: exit {done.returncode}: {done.stderr.decode()[-400:]}")
    cpu = (after.ru_utime + after.ru_stime) - (before.ru_utime + before.ru_stime)
    return elapsed, cpu


def _modules(case: Case, env: dict[str, str]) -> int | None:
    """How many modules the command imports (``-X importtime`` lines); None for a tool."""
    argv = case.argv
    env = _case_env(case, env)
    if argv[0] == sys.executable:
        argv = [sys.executable, "-X", "importtime", *argv[1:]]
    elif Path(argv[0]).name == "fleetlet":
        argv = [sys.executable, "-X", "importtime", "-m", "fleetlet", *argv[1:]]
    else:
        return None
    done = subprocess.run(argv, env=env, capture_output=True, check=False, cwd=_NEUTRAL)
    return done.stderr.decode().count("import time:") - 1  # the header line


def measure(
    repeat: int,
) -> tuple[list[Case], dict[str, list[float]], dict[str, list[float]], dict[str, int | None]]:
    env = _env()
    with tempfile.TemporaryDirectory(prefix="fleetlet-bench-cli-") as scratch:
        all_cases = cases(Path(scratch))
        if BEFORE is not None:
            # The same renders with the other checkout's code, in the same rounds.
            all_cases[4:4] = [
                Case(f"{c.name}, before", c.argv, baseline=c.baseline, code=BEFORE)
                for c in all_cases[:4]
                if c.baseline
            ]
        times: dict[str, list[float]] = {c.name: [] for c in all_cases}
        cpu: dict[str, list[float]] = {c.name: [] for c in all_cases}
        for _ in range(1):  # warm-up: page cache, pyc files
            for case in all_cases:
                _run(case, env)
        for _ in range(repeat):
            for case in all_cases:
                wall, used = _run(case, env)
                times[case.name].append(wall)
                cpu[case.name].append(used)
        modules = {c.name: _modules(c, env) for c in all_cases}
    return all_cases, times, cpu, modules


def report(
    all_cases: list[Case], times: dict[str, list[float]], cpu: dict[str, list[float]],
    modules: dict[str, int | None], repeat: int,
) -> str:  # fmt: skip
    median = {name: statistics.median(runs) for name, runs in times.items()}
    fastest = {name: min(runs) for name, runs in times.items()}
    load = os.getloadavg()[0]
    before = ""
    if BEFORE:
        before = f"The rows marked *before* run the code of `{BEFORE}` in the same rounds. "
    lines = [
        SECTION,
        "",
        f"`python -m bench.render_cli --repeat {repeat}"
        f"{' --before DIR' if BEFORE else ''} --write`: whole processes as a user "
        f"runs them, the cases taking turns in each of {repeat} rounds after a warm-up round; "
        "median and fastest wall time, median CPU time (user + system, the process's children "
        "included: what the command costs the machine, the least sensitive to its load). "
        "`fleetlet` is the console script with this checkout's code, its "
        "modules compiled once as pip installs them (`__pycache__`: this machine's shells set "
        "`PYTHONDONTWRITEBYTECODE`, which would compile every module on every command); helm "
        "and kustomize are the pinned binaries. The rows marked *no .pth hooks* run the same "
        "code with `python -S` and site-packages on `PYTHONPATH`: without the start-up hooks of "
        "this machine's site-packages (the sandbox's certifi hook, the editable install's "
        "finder), as a wheel installed in a clean environment would start. " + before + "Machine: "
        f"{platform.machine()}, {os.cpu_count()} CPUs shared with other work, load average "
        f"{load:.1f}, Python {platform.python_version()}.",
        "",
        "| command | median ms | min ms | CPU ms | vs baseline (median / min) | modules |",
        "|---|---:|---:|---:|---:|---:|",
    ]
    for case in all_cases:
        shown = ""
        if case.baseline:
            shown = (
                f"{median[case.name] / median[case.baseline]:.2f}x / "
                f"{fastest[case.name] / fastest[case.baseline]:.2f}x"
            )
        count = modules[case.name]
        lines.append(
            f"| `{case.name}` | {median[case.name] * 1000:.0f} | "
            f"{fastest[case.name] * 1000:.0f} | {statistics.median(cpu[case.name]) * 1000:.0f} | "
            f"{shown} | {'' if count is None else count} |"
        )
    lines.append("")
    for case in all_cases:
        if case.baseline:
            ratio = median[case.name] / median[case.baseline]
            verdict = "met" if ratio <= TARGET else "not met"
            floor = "python -S -c pass (no site, no .pth hooks)" if case.bare else (
                "python -c pass (the floor)")  # fmt: skip
            lines.append(
                f"- {case.name}: {ratio:.2f}x of `{case.baseline}` "
                f"({fastest[case.name] / fastest[case.baseline]:.2f}x on the fastest runs; "
                f"target {TARGET}x: **{verdict}**); fleetlet's own share "
                f"{(median[case.name] - median[case.baseline]) * 1000:.0f} ms, of which the "
                f"interpreter's start (`{floor.split(' (')[0]}`) is "
                f"{median[floor] * 1000:.0f} ms."
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
    parser.add_argument(
        "--before",
        type=Path,
        help="another checkout whose fleetlet renders the same inputs in the same rounds",
    )
    args = parser.parse_args(argv)
    global CODE, BEFORE
    CODE = args.code
    BEFORE = args.before
    all_cases, times, cpu, modules = measure(args.repeat)
    text = report(all_cases, times, cpu, modules, args.repeat)
    print(text)
    if args.write:
        write_section(text, DOCS)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
