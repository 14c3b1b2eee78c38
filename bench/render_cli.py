"""The command line as a user runs it: ``fleetlet render`` against ``helm template`` and
``kustomize build`` as whole processes, and the read-only commands' start-up.

Every case is a whole process started the way a user starts it. The headline rows run the
``fleetlet`` console script in a **clean virtual environment** made for the run (``python -m
venv``; its site-packages holds one ``.pth`` of plain path lines naming this checkout and the
directories of fleetlet's dependencies, and the console script pip wrote, its first line
pointing at the venv): what ``pip install fleetlet`` into a venv gives. The rows marked *this
machine's interpreter* run the console script beside this Python, whose site-packages runs
start-up hooks at every start (the sandbox's certifi hook, the editable install's finder:
about 25 ms). helm and kustomize are the pinned binaries. The cases take turns in every round
(so load on the shared machine falls on all), ``--repeat`` rounds after one warm-up round; the
figure is the median wall time, and each render's ratio is to its baseline in the same run.

- ``fleetlet render CHART`` vs ``helm template podinfo CHART --namespace default
  --include-crds`` (podinfo 6.14.1, ``tests/assets/charts/podinfo``);
- ``fleetlet render TREE --path apps/production`` vs ``kustomize build TREE/apps/production``
  (Flux's example, ``tests/assets/flux2-kustomize-helm-example``);
- the floor of any Python command started by such a console script: the venv's ``python -c
  pass``, and ``python -c "import re"`` (pip's console script imports ``re`` before any of
  fleetlet's code runs); with a tool's own time, the least a render could take were all of
  fleetlet's own work free;
- with ``--before DIR``, the two renders once more with the code of another checkout (its own
  venv), in the same rounds (before and after a change, under the same load);
- ``fleetlet --version``, ``--help``, ``render --help``, ``health --offline``, ``hub --help``,
  with the number of modules each imports (``python -X importtime``).

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
    dev: bool = False  # this machine's interpreter (PYTHONPATH names the code), not a venv
    floor: str | None = None  # the case that is the least this one's Python start can take


# The console script pip writes (distlib's template, as in this Python's bin/fleetlet).
_PIP_SCRIPT = """# -*- coding: utf-8 -*-
import re
import sys
from fleetlet.cli import {entry}
if __name__ == '__main__':
    sys.argv[0] = re.sub(r'(-script\\.pyw|\\.exe)?$', '', sys.argv[0])
    sys.exit({entry}())
"""


def _site_packages() -> list[str]:
    import site

    return [p for p in site.getsitepackages() if Path(p).is_dir()]


def _dev_script() -> Path:
    return Path(sys.executable).parent / "fleetlet"


def make_venv(where: Path, code: Path) -> Path:
    """A clean venv at ``where`` running ``code``'s fleetlet: its ``bin/fleetlet`` as pip
    writes it (for the entry point that checkout declares), and one ``.pth`` of path lines
    (the checkout, the dependencies' directories: no other ``.pth`` runs). Returns the
    console script."""
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(where)], check=True)
    python = where / "bin" / "python"
    purelib = subprocess.run(
        [str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
        capture_output=True, text=True, check=True,
    ).stdout.strip()  # fmt: skip
    lines = [str(code), *_site_packages()]
    (Path(purelib) / "fleetlet-bench.pth").write_text("\n".join(lines) + "\n")
    # The entry point that checkout declares (an older one's is main).
    entry = "run" if "\ndef run(" in (code / "fleetlet" / "cli.py").read_text() else "main"
    body = _PIP_SCRIPT.format(entry=entry)
    script = where / "bin" / "fleetlet"
    script.write_text(f"#!{python}\n{body}")
    script.chmod(0o755)
    return script


def _tool(name: str) -> str:
    from agent.render.tools import find_tool

    return str(find_tool(name, override=os.environ.get(f"FLEETLET_{name.upper()}")))


def cases(scratch: Path) -> list[Case]:
    health = scratch / "objects.yaml"
    health.write_text(HEALTH_FILE)
    helm, kustomize = _tool("helm"), _tool("kustomize")
    script = str(make_venv(scratch / "venv", CODE))
    python = str(scratch / "venv" / "bin" / "python")
    dev = str(_dev_script()) if _dev_script().is_file() else None
    chart = ["render", str(CHART), "--release-name", "podinfo"]
    tree = ["render", str(FLUX), "--path", "apps/production"]
    helm_case, kustomize_case = "helm template (podinfo)", "kustomize build (Flux apps/production)"
    floor = "python -c 'import re' (the console script's floor)"
    found = [
        Case(helm_case, [helm, "template", "podinfo", str(CHART), "--namespace", "default",
                         "--include-crds"]),
        Case("fleetlet render (podinfo)", [script, *chart], baseline=helm_case, floor=floor),
        Case(kustomize_case, [kustomize, "build", str(FLUX / "apps" / "production")]),
        Case("fleetlet render (Flux apps/production)", [script, *tree],
             baseline=kustomize_case, floor=floor),
    ]  # fmt: skip
    if BEFORE is not None:
        # The same renders with the other checkout's code (its own venv), in the same rounds.
        before = str(make_venv(scratch / "venv-before", BEFORE))
        found += [
            Case("fleetlet render (podinfo), before", [before, *chart], baseline=helm_case),
            Case("fleetlet render (Flux apps/production), before", [before, *tree],
                 baseline=kustomize_case),
        ]  # fmt: skip
    found += [
        Case("python -c pass (the interpreter)", [python, "-c", "pass"]),
        Case(floor, [python, "-c", "import re"]),
    ]
    if dev is not None:
        this = "this machine's interpreter"
        found += [
            Case(f"fleetlet render (podinfo), {this}", [dev, *chart], baseline=helm_case,
                 dev=True, floor=f"python -c pass, {this}"),
            Case(f"python -c pass, {this}", [sys.executable, "-c", "pass"], dev=True),
        ]  # fmt: skip
    found += [
        Case("fleetlet --version", [script, "--version"]),
        Case("fleetlet --help", [script, "--help"]),
        Case("fleetlet render --help", [script, "render", "--help"]),
        Case("fleetlet health --offline", [script, "health", "-f", str(health), "--offline"]),
        Case("fleetlet hub --help", [script, "hub", "--help"]),
    ]
    return found


CODE = ROOT
BEFORE: Path | None = None
# Where the commands run: not a checkout (``python -m`` puts its directory first on sys.path).
_NEUTRAL = "/"


def _env(case: Case) -> dict[str, str]:
    env = dict(os.environ)
    # As installed by pip: modules compiled once (the warm-up round writes __pycache__), not
    # compiled again by every command, whatever this shell says.
    env.pop("PYTHONDONTWRITEBYTECODE", None)
    env.pop("PYTHONPATH", None)
    if case.dev:
        env["PYTHONPATH"] = str(CODE)
    return env


def _run(case: Case) -> tuple[float, float]:
    """Wall time and CPU time (user + system, its children included) of one run, in s."""
    env = _env(case)
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    start = time.perf_counter()
    done = subprocess.run(case.argv, env=env, capture_output=True, check=False, cwd=_NEUTRAL)
    elapsed = time.perf_counter() - start
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if done.returncode != 0:
        raise SystemExit(f"{case.name}: exit {done.returncode}: {done.stderr.decode()[-400:]}")
    cpu = (after.ru_utime + after.ru_stime) - (before.ru_utime + before.ru_stime)
    return elapsed, cpu


def _modules(case: Case) -> int | None:
    """How many modules the command imports (``-X importtime`` lines); None for a tool."""
    argv = case.argv
    first = Path(argv[0])
    if first.name.startswith("python"):
        argv = [argv[0], "-X", "importtime", *argv[1:]]
    elif first.name == "fleetlet":
        python = first.read_text().split("\n", 1)[0].removeprefix("#!")
        argv = [python, "-X", "importtime", *argv]
    else:
        return None
    done = subprocess.run(argv, env=_env(case), capture_output=True, check=False, cwd=_NEUTRAL)
    return done.stderr.decode().count("import time:") - 1  # the header line


def measure(
    repeat: int,
) -> tuple[list[Case], dict[str, list[float]], dict[str, list[float]], dict[str, int | None]]:
    with tempfile.TemporaryDirectory(prefix="fleetlet-bench-cli-") as scratch:
        all_cases = cases(Path(scratch))
        times: dict[str, list[float]] = {c.name: [] for c in all_cases}
        cpu: dict[str, list[float]] = {c.name: [] for c in all_cases}
        for _ in range(1):  # warm-up: page cache, pyc files
            for case in all_cases:
                _run(case)
        for _ in range(repeat):
            for case in all_cases:
                wall, used = _run(case)
                times[case.name].append(wall)
                cpu[case.name].append(used)
        modules = {c.name: _modules(c) for c in all_cases}
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
        "`fleetlet` is the console script pip writes, in a clean virtual environment made for "
        "the run (its site-packages: one `.pth` of path lines naming this checkout and "
        "fleetlet's dependencies), its modules compiled once as pip installs them "
        "(`__pycache__`); helm and kustomize are the pinned binaries. The rows marked *this "
        "machine's interpreter* run the console script beside this Python instead, whose "
        "site-packages runs start-up hooks at every start (the sandbox's certifi hook, the "
        "editable install's finder). " + before + "Machine: "
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
        if case.baseline and case.floor:
            tool = median[case.baseline]
            ratio = median[case.name] / tool
            verdict = "met" if ratio <= TARGET else "not met"
            least = (median[case.floor] + tool) / tool
            lines.append(
                f"- {case.name}: {ratio:.2f}x of `{case.baseline}` "
                f"({fastest[case.name] / fastest[case.baseline]:.2f}x on the fastest runs; "
                f"target {TARGET}x: **{verdict}**); fleetlet's own share "
                f"{(median[case.name] - tool) * 1000:.0f} ms. Its floor: "
                f"`{case.floor.split(' (')[0]}` takes {median[case.floor] * 1000:.0f} ms before "
                f"any of fleetlet's code runs, so this command could take no less than "
                f"{least:.2f}x of the tool were all of fleetlet's own work free."
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
