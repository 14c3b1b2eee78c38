"""The control-plane binaries of the test environment: found, or built once from the Go proxy.

Resolution, per binary: ``$KUBEBUILDER_ASSETS`` (the envtest convention; its assets hold only
kube-apiserver, etcd and kubectl, so the others fall through), then the cache
(``$FLEETLET_CACHE`` or ``~/.cache/fleetlet``, under ``bin/<KUBERNETES_VERSION>/``), then a build
from the Go module proxy into that cache. Builds write to a temporary name and rename, under a
file lock, so concurrent test workers never see half a binary and build each thing once.

The external renderers fleetlet runs (helm, kustomize; pinned in :mod:`agent.render.tools`) are
built by the same machinery (:func:`ensure_tools`) into ``tools/<name>-<version>/<name>`` of the
same cache, where the agent's :func:`agent.render.tools.find_tool` finds them.

``python -m tests.realenv.binaries [NAME ...]`` ensures every binary and tool (or the named ones),
the control plane and the tools side by side, and prints the paths (CI runs it before the tests so that the cold build, about 8 minutes on two
cores, is visible as its own step).
"""

from __future__ import annotations

import fcntl
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterable, Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from pathlib import Path
from typing import TextIO

from agent.render.tools import PINNED_TOOLS, cached_tool_path

# The one Kubernetes release of the test environment: the newest whose go.mod `go` line the
# machine's Go toolchain satisfies. Staging modules are pinned to the matching v0.Y.Z.
KUBERNETES_VERSION = "v1.37.2"
# etcd from the same release line as Kubernetes' own etcd client (>= 3.5.13 keeps watch progress
# requests on in kube-apiserver).
ETCD_VERSION = "v3.7.3"
KWOK_VERSION = "v0.8.0"

# kubectl too, of the same release: tests and benchmarks compare with it, and a fresh machine
# need not have one.
KUBE_BINARIES = ("kube-apiserver", "kube-controller-manager", "kube-scheduler", "kubectl")
ALL_BINARIES = (*KUBE_BINARIES, "etcd", "kwok")

_KUBE_MODULE = "k8s.io/kubernetes"
_ETCD_MODULE = "go.etcd.io/etcd/server/v3"
_KWOK_PACKAGE = "sigs.k8s.io/kwok/cmd/kwok"

# Which pinned version each cached binary was built from; a stamp file records it so that
# changing a pin rebuilds what it governs and nothing else.
_PINS = {
    **dict.fromkeys(KUBE_BINARIES, KUBERNETES_VERSION),
    "etcd": ETCD_VERSION,
    "kwok": KWOK_VERSION,
}


# The external renderers: the Go package `go install` builds for each, and the linker flags that
# stamp its version (Helm reports a bare "v4.3" otherwise; kustomize reads the module version
# from its build info).
TOOLS = tuple(PINNED_TOOLS)
_TOOL_PACKAGES = {
    "helm": "helm.sh/helm/v4/cmd/helm",
    "kustomize": "sigs.k8s.io/kustomize/kustomize/v5",
}
_TOOL_LDFLAGS = {"helm": "-X helm.sh/helm/v4/internal/version.version={version}"}

# Tools only the tests run, never fleetlet: `sops` encrypts the SOPS files the agent decrypts
# in Python (agent/secrets), so compatibility is proven against the binary users have. v3.13.3:
# the newest release (its go.mod asks for Go 1.25).
# `cosign` signs the OCI artifacts whose signatures the hub verifies in Python (sigstore-python
# and cryptography; hub/resolve/signatures.py): v3.1.3, the newest release.
# `gitsign` signs fleet commits keyless (hub/fleet/gitsign.py verifies them): v0.17.1, the
# newest release the Go module proxy serves. The proxy refuses gitsign's version list, which
# `go install pkg@version` reads for deprecation notices, so it is built in its downloaded
# module directory instead (same go.mod, go.sum and dependencies; the version stamped by
# ldflags). Its dependencies are mostly cosign's, already in the module cache.
# `notation` signs OCI artifacts with X.509 certificates (hub/resolve/notation.py verifies
# them): v1.3.2, the newest release the proxy serves; built like gitsign, for the same reason.
TEST_TOOLS = {"sops": "v3.13.3", "cosign": "v3.1.3", "gitsign": "v0.17.1", "notation": "v1.3.2"}
_TOOL_PACKAGES["sops"] = "github.com/getsops/sops/v3/cmd/sops"
_TOOL_PACKAGES["cosign"] = "github.com/sigstore/cosign/v3/cmd/cosign"
_TOOL_PACKAGES["gitsign"] = "github.com/sigstore/gitsign"
_TOOL_LDFLAGS["gitsign"] = "-X github.com/sigstore/gitsign/pkg/version.gitVersion={version}"
_TOOL_PACKAGES["notation"] = "github.com/notaryproject/notation/cmd/notation"
# Built in their module's directory (the proxy refuses their version lists): the module.
_BUILT_IN_MODULE_DIR = {
    "gitsign": "github.com/sigstore/gitsign",
    "notation": "github.com/notaryproject/notation",
}
_TOOL_LDFLAGS["cosign"] = "-X sigs.k8s.io/release-utils/version.gitVersion={version}"


class BinaryError(RuntimeError):
    """A binary could not be found or built (the message says which and why)."""


def cache_root() -> Path:
    """The cache directory outside the repository (``$FLEETLET_CACHE`` or ``~/.cache/fleetlet``)."""
    configured = os.environ.get("FLEETLET_CACHE")
    if configured:
        return Path(configured).expanduser()
    return Path.home() / ".cache" / "fleetlet"


def bin_dir() -> Path:
    """Where built binaries are cached, per pinned Kubernetes release."""
    return cache_root() / "bin" / KUBERNETES_VERSION


def _executable(path: Path) -> bool:
    return path.is_file() and os.access(path, os.X_OK)


def find_binary(name: str) -> Path | None:
    """Return the path of ``name`` from ``$KUBEBUILDER_ASSETS`` or the cache, or ``None``."""
    assets = os.environ.get("KUBEBUILDER_ASSETS")
    if assets and _executable(Path(assets) / name):
        return Path(assets) / name
    cached = bin_dir() / name
    stamp = bin_dir() / f"{name}.version"
    if _executable(cached) and stamp.is_file() and stamp.read_text().strip() == _PINS[name]:
        return cached
    return None


def install_binary(name: str, source: Path) -> Path:
    """Copy an already built ``source`` into the cache as ``name`` (atomically) and return it."""
    target_dir = bin_dir()
    target_dir.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{name}.", dir=target_dir)
    os.close(fd)
    shutil.copyfile(source, tmp)
    os.chmod(tmp, 0o755)
    os.replace(tmp, target_dir / name)
    (target_dir / f"{name}.version").write_text(_PINS[name] + "\n")
    return target_dir / name


def ensure_binaries(
    names: Iterable[str] = ALL_BINARIES, *, progress: TextIO | None = sys.stderr
) -> dict[str, Path]:
    """Return ``{name: path}`` for each binary, building the missing ones into the cache.

    Raises :class:`BinaryError` when a build fails (with the tail of the Go output) or ``go`` is
    missing.
    """
    wanted = list(dict.fromkeys(names))
    unknown = [n for n in wanted if n not in _PINS]
    if unknown:
        raise BinaryError(f"unknown binaries {unknown}; known: {list(ALL_BINARIES)}")
    found = {n: p for n in wanted if (p := find_binary(n)) is not None}
    missing = [n for n in wanted if n not in found]
    if not missing:
        return found
    bin_dir().mkdir(parents=True, exist_ok=True)
    with _lock(bin_dir() / ".build.lock", progress):
        # Another process may have built them while we waited for the lock.
        missing = [n for n in missing if find_binary(n) is None]
        kube = [n for n in missing if n in KUBE_BINARIES]
        if kube:
            # They share one compile: building them together costs little more than one.
            _build_kubernetes(kube, progress)
        if "etcd" in missing:
            _build_etcd(progress)
        if "kwok" in missing:
            _build_kwok(progress)
    result = {}
    for name in wanted:
        path = find_binary(name)
        if path is None:
            raise BinaryError(f"{name} is still missing from {bin_dir()} after building it")
        result[name] = path
    return result


@contextmanager
def _lock(path: Path, progress: TextIO | None) -> Iterator[None]:
    with open(path, "w") as handle:
        try:
            fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            _say(progress, f"waiting for another process building into {path.parent} ...")
            fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def _say(progress: TextIO | None, message: str) -> None:
    if progress is not None:
        print(f"[realenv binaries] {message}", file=progress, flush=True)


def _go_env() -> dict[str, str]:
    if shutil.which("go") is None:
        raise BinaryError("`go` is not on PATH: it is needed to build the control-plane binaries")
    env = dict(os.environ)
    # Fail clearly on a too-old toolchain instead of silently fetching another one.
    env["GOTOOLCHAIN"] = "local"
    env.setdefault("GOFLAGS", "-buildvcs=false")
    return env


def _go(
    args: list[str],
    *,
    cwd: Path,
    env: dict[str, str],
    what: str,
    progress: TextIO | None = None,
    heartbeat: float = 60.0,
) -> str:
    """Run ``go ARGS``; raise :class:`BinaryError` with the output's tail when it fails.

    With ``progress``, a line every ``heartbeat`` seconds says the step is still running (a
    cold Kubernetes build prints nothing for many minutes; CI logs should not look stuck).
    """
    with tempfile.TemporaryFile("w+") as out, tempfile.TemporaryFile("w+") as err:
        proc = subprocess.Popen(["go", *args], cwd=cwd, env=env, stdout=out, stderr=err)
        started = time.monotonic()
        while True:
            try:
                proc.wait(timeout=heartbeat)
                break
            except subprocess.TimeoutExpired:
                minutes = (time.monotonic() - started) / 60
                _say(progress, f"... still {what} ({minutes:.0f} min so far)")
            except BaseException:
                proc.kill()
                proc.wait()
                raise
        out.seek(0)
        err.seek(0)
        stdout, stderr = out.read(), err.read()
    if proc.returncode != 0:
        tail = "\n".join((stdout + stderr).strip().splitlines()[-30:])
        raise BinaryError(f"{what} failed (go {' '.join(args[:2])} ...):\n{tail}")
    return stdout


def _module_gomod(module: str, version: str, *, env: dict[str, str], cwd: Path) -> str:
    """Return the text of ``module@version``'s own go.mod, downloaded through the proxy."""
    out = _go(
        ["mod", "download", "-json", f"{module}@{version}"],
        cwd=cwd,
        env=env,
        what=f"downloading {module}@{version}",
    )
    info = json.loads(out)
    if info.get("Error"):
        raise BinaryError(f"downloading {module}@{version}: {info['Error']}")
    return Path(info["GoMod"]).read_text()


def _go_line(gomod: str) -> str:
    for line in gomod.splitlines():
        if line.startswith("go "):
            return line.strip()
    return "go 1.22"


def relative_replaces(gomod: str, prefix: str) -> list[str]:
    """The module paths that ``gomod`` replaces with a local directory starting with ``prefix``.

    Works for both the block form (``replace ( ... )``) and single ``replace`` lines.
    """
    modules = []
    for raw in gomod.splitlines():
        line = raw.split("//", 1)[0].strip()
        if line.startswith("replace "):
            line = line[len("replace ") :].strip()
        if "=>" not in line:
            continue
        left, right = (part.strip() for part in line.split("=>", 1))
        if right.startswith(prefix) and left:
            modules.append(left.split()[0])
    return modules


def _write_wrapper(
    directory: Path,
    *,
    module: str,
    version: str,
    go_line: str,
    replaces: dict[str, str],
    imports: list[str],
) -> None:
    lines = [f"module fleetlet.local/build-{Path(module).name}", "", go_line, ""]
    lines.append(f"require {module} {version}")
    lines.append("")
    lines.append("replace (")
    lines.extend(f"\t{mod} => {mod} {ver}" for mod, ver in sorted(replaces.items()))
    lines.append(")")
    (directory / "go.mod").write_text("\n".join(lines) + "\n")
    # A tools file keeps the main packages' dependencies in go.mod through `go mod tidy`.
    body = "\n".join(f'\t_ "{pkg}"' for pkg in imports)
    (directory / "tools.go").write_text(
        f"//go:build tools\n\npackage tools\n\nimport (\n{body}\n)\n"
    )


def prepare_kubernetes_module(directory: Path, *, env: dict[str, str] | None = None) -> None:
    """Write and tidy the wrapper module that builds Kubernetes' commands from the Go proxy.

    ``k8s.io/kubernetes`` replaces its staging modules with ``./staging/...`` in its own go.mod,
    so it cannot be built as a dependency as is; the wrapper replaces each of them (the list read
    from that release's go.mod) with its published ``v0.Y.Z``. Raises :class:`BinaryError`.
    """
    env = env or _go_env()
    gomod = _module_gomod(_KUBE_MODULE, KUBERNETES_VERSION, env=env, cwd=directory)
    staging = relative_replaces(gomod, "./staging/")
    if not staging:
        raise BinaryError(f"{_KUBE_MODULE}@{KUBERNETES_VERSION}: no staging replaces in go.mod")
    staging_version = "v0." + KUBERNETES_VERSION.removeprefix("v").split(".", 1)[1]
    _write_wrapper(
        directory,
        module=_KUBE_MODULE,
        version=KUBERNETES_VERSION,
        go_line=_go_line(gomod),
        replaces=dict.fromkeys(staging, staging_version),
        imports=[f"{_KUBE_MODULE}/cmd/{name}" for name in KUBE_BINARIES],
    )
    _go(["mod", "tidy"], cwd=directory, env=env, what="go mod tidy for the Kubernetes wrapper")


def kubernetes_ldflags() -> str:
    """The linker flags that stamp the version, so ``/version`` reports the pinned release."""
    major, minor = KUBERNETES_VERSION.removeprefix("v").split(".")[:2]
    base = "k8s.io/component-base/version"
    return (
        f"-s -w -X {base}.gitVersion={KUBERNETES_VERSION}"
        f" -X {base}.gitMajor={major} -X {base}.gitMinor={minor}"
    )


def _build_kubernetes(names: list[str], progress: TextIO | None) -> None:
    env = _go_env()
    _say(
        progress,
        f"building {', '.join(names)} {KUBERNETES_VERSION} from the Go module proxy "
        "(a cold build takes about 6 minutes on two cores and ~3 GB of memory) ...",
    )
    started = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="kube-build-", dir=bin_dir()) as tmp:
        work = Path(tmp)
        prepare_kubernetes_module(work, env=env)
        out = work / "out"
        out.mkdir()
        _go(
            [
                "build",
                "-trimpath",
                "-ldflags",
                kubernetes_ldflags(),
                "-o",
                f"{out}/",
                *(f"{_KUBE_MODULE}/cmd/{name}" for name in names),
            ],
            cwd=work,
            env=env,
            what=f"building Kubernetes {KUBERNETES_VERSION}",
            progress=progress,
        )
        for name in names:
            _publish(out / name, name)
    _say(progress, f"built Kubernetes binaries in {time.monotonic() - started:.0f} s")


def _build_etcd(progress: TextIO | None) -> None:
    env = _go_env()
    _say(progress, f"building etcd {ETCD_VERSION} from the Go module proxy (a few minutes) ...")
    started = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="etcd-build-", dir=bin_dir()) as tmp:
        work = Path(tmp)
        gomod = _module_gomod(_ETCD_MODULE, ETCD_VERSION, env=env, cwd=work)
        # etcd's modules point at each other with `=> ../x`; all are tagged together, so each
        # such replace becomes the same module at the same version.
        siblings = relative_replaces(gomod, "../")
        _write_wrapper(
            work,
            module=_ETCD_MODULE,
            version=ETCD_VERSION,
            go_line=_go_line(gomod),
            replaces=dict.fromkeys(siblings, ETCD_VERSION),
            imports=[_ETCD_MODULE],
        )
        _go(["mod", "tidy"], cwd=work, env=env, what="go mod tidy for the etcd wrapper")
        out = work / "etcd"
        _go(
            ["build", "-trimpath", "-ldflags", "-s -w", "-o", str(out), _ETCD_MODULE],
            cwd=work,
            env=env,
            what=f"building etcd {ETCD_VERSION}",
            progress=progress,
        )
        _publish(out, "etcd")
    _say(progress, f"built etcd in {time.monotonic() - started:.0f} s")


def _build_kwok(progress: TextIO | None) -> None:
    env = _go_env()
    _say(progress, f"building kwok {KWOK_VERSION} from the Go module proxy (a few minutes) ...")
    started = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="kwok-build-", dir=bin_dir()) as tmp:
        work = Path(tmp)
        env["GOBIN"] = str(work)
        _go(
            ["install", "-trimpath", "-ldflags", "-s -w", f"{_KWOK_PACKAGE}@{KWOK_VERSION}"],
            cwd=work,
            env=env,
            what=f"building kwok {KWOK_VERSION}",
            progress=progress,
        )
        _publish(work / "kwok", "kwok")
    _say(progress, f"built kwok in {time.monotonic() - started:.0f} s")


def _publish(built: Path, name: str) -> None:
    """Move a freshly built binary into the cache under its final name (same filesystem)."""
    if not _executable(built):
        raise BinaryError(f"the build did not produce {built}")
    os.replace(built, bin_dir() / name)
    (bin_dir() / f"{name}.version").write_text(_PINS[name] + "\n")


def find_tool_binary(name: str) -> Path | None:
    """The cached pinned release of the tool ``name`` (``helm``, ``kustomize``), or ``None``.

    The version is in the directory's name and the binary is renamed into place only once
    built, so a present file is a complete build of that pin.
    """
    path = _tool_path(name)
    return path if _executable(path) else None


def _tool_path(name: str) -> Path:
    if name in TEST_TOOLS:
        return cache_root() / "tools" / f"{name}-{TEST_TOOLS[name]}" / name
    return cached_tool_path(name, cache_root=cache_root())


def ensure_tools(
    names: Iterable[str] = TOOLS, *, progress: TextIO | None = sys.stderr
) -> dict[str, Path]:
    """Return ``{name: path}`` of the pinned helm/kustomize (and the tests' sops), building
    missing ones into the cache.

    Raises :class:`BinaryError` when a build fails (with the tail of the Go output).
    """
    wanted = list(dict.fromkeys(names))
    unknown = [n for n in wanted if n not in _TOOL_PACKAGES]
    if unknown:
        raise BinaryError(f"unknown tools {unknown}; known: {[*TOOLS, *TEST_TOOLS]}")
    tools_dir = cache_root() / "tools"
    if any(find_tool_binary(n) is None for n in wanted):
        tools_dir.mkdir(parents=True, exist_ok=True)
        with _lock(tools_dir / ".build.lock", progress):
            # Another process may have built some while we waited for the lock. The rest are
            # built two at a time: one's module downloads and link overlap the other's compile.
            missing = [n for n in wanted if find_tool_binary(n) is None]
            with ThreadPoolExecutor(max_workers=2) as pool:
                for future in [pool.submit(_build_tool, n, progress) for n in missing]:
                    future.result()
    result = {}
    for name in wanted:
        path = find_tool_binary(name)
        if path is None:
            raise BinaryError(f"{name} is still missing from {tools_dir} after building it")
        result[name] = path
    return result


def _build_tool(name: str, progress: TextIO | None) -> None:
    version = {**PINNED_TOOLS, **TEST_TOOLS}[name]
    package = _TOOL_PACKAGES[name]
    target = _tool_path(name)
    target.parent.mkdir(parents=True, exist_ok=True)
    env = _go_env()
    # Static, so the same binary runs in the agent's image.
    env["CGO_ENABLED"] = "0"
    _say(progress, f"building {name} {version} from the Go module proxy (a few minutes) ...")
    started = time.monotonic()
    ldflags = " ".join(["-s -w", _TOOL_LDFLAGS.get(name, "").format(version=version)]).strip()
    with tempfile.TemporaryDirectory(prefix=f"{name}-build-", dir=target.parent.parent) as tmp:
        work = Path(tmp)
        env["GOBIN"] = str(work)
        built = work / name
        module = _BUILT_IN_MODULE_DIR.get(name)
        if module is not None:
            info = json.loads(
                _go(
                    ["mod", "download", "-json", f"{module}@{version}"],
                    cwd=work,
                    env=env,
                    what=f"downloading {module}@{version}",
                )
            )
            build = ["build", "-trimpath", "-mod=readonly", "-ldflags", ldflags, "-o", str(built)]
            _go(
                [*build, "." + package.removeprefix(module)],
                cwd=Path(info["Dir"]),
                env=env,
                what=f"building {name} {version}",
                progress=progress,
            )
        else:
            # `go install` names the binary after the package, a major-version suffix dropped.
            _go(
                ["install", "-trimpath", "-ldflags", ldflags, f"{package}@{version}"],
                cwd=work,
                env=env,
                what=f"building {name} {version}",
                progress=progress,
            )
        if not _executable(built):
            raise BinaryError(f"the build of {name} did not produce {built}")
        os.replace(built, target)
    _say(progress, f"built {name} {version} in {time.monotonic() - started:.0f} s")


def kubectl() -> str:
    """The path of kubectl of the pinned release (built when missing)."""
    return str(ensure_binaries(["kubectl"])["kubectl"])


def main(argv: list[str] | None = None) -> int:
    """Ensure the named binaries and tools (default: all) and print ``name path`` lines."""
    names = (argv if argv is not None else sys.argv[1:]) or [*ALL_BINARIES, *TOOLS, *TEST_TOOLS]
    tools = (*TOOLS, *TEST_TOOLS)
    try:
        # The control plane and the tools build side by side (separate caches and locks).
        with ThreadPoolExecutor(max_workers=2) as pool:
            kube = pool.submit(ensure_binaries, [n for n in names if n not in tools])
            built = pool.submit(ensure_tools, [n for n in names if n in tools])
            paths = kube.result()
            paths.update(built.result())
    except BinaryError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    for name, path in paths.items():
        print(f"{name} {path}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
