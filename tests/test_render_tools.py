"""The external tools: where fleetlet finds helm and kustomize, and the bounds of the child
process they run in (time, memory, output), with the real pinned binaries."""

from __future__ import annotations

import gc
import os
import stat
import time
from pathlib import Path

import pytest

from agent.render import confine
from agent.render._process import (
    ToolFailedError,
    ToolMemoryError,
    ToolOutputTooLargeError,
    ToolTimeoutError,
    run_tool,
)
from agent.render.confine import support
from agent.render.tools import (
    PINNED_TOOLS,
    ToolNotFoundError,
    ToolSettings,
    cached_tool_path,
    find_tool,
)
from tests.realenv.binaries import ensure_tools
from tests.realenv.helm import ASSETS


def executable(path: Path, text: str = "#!/bin/sh\necho fake\n") -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    path.chmod(path.stat().st_mode | stat.S_IXUSR)
    return path


def test_pinned_tools_are_built_into_the_documented_cache_path() -> None:
    built = ensure_tools(["helm", "kustomize"])
    for name, path in built.items():
        assert path == cached_tool_path(name)
        assert path.parent.name == f"{name}-{PINNED_TOOLS[name]}"
        assert path.parent.parent.name == "tools"
    version = run_tool(
        [built["helm"], "version", "--short"], cwd=Path("/"), timeout=60, max_memory=512 << 20
    )
    assert version.decode().startswith(PINNED_TOOLS["helm"])
    version = run_tool(
        [built["kustomize"], "version"], cwd=Path("/"), timeout=60, max_memory=512 << 20
    )
    assert version.decode().strip() == PINNED_TOOLS["kustomize"]


def test_override_wins_then_path_then_cache(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    on_path = executable(tmp_path / "bin" / "helm")
    cached = executable(cached_tool_path("helm", cache_root=tmp_path / "cache"))
    chosen = executable(tmp_path / "mine" / "my-helm")
    monkeypatch.setenv("PATH", str(tmp_path / "bin"))

    assert find_tool("helm", override=str(chosen), cache_root=tmp_path / "cache") == chosen
    assert find_tool("helm", cache_root=tmp_path / "cache") == on_path
    monkeypatch.setenv("PATH", str(tmp_path / "empty"))
    assert find_tool("helm", cache_root=tmp_path / "cache") == cached

    settings = ToolSettings.from_env(
        {"FLEETLET_HELM": str(chosen), "FLEETLET_CACHE": str(tmp_path / "cache")}
    )
    assert settings.find("helm") == chosen
    with pytest.raises(ToolNotFoundError):
        settings.find("kustomize")  # not on this PATH, not in this cache


def test_a_missing_tool_says_how_to_provide_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("PATH", str(tmp_path / "empty"))
    with pytest.raises(ToolNotFoundError) as missing:
        find_tool("kustomize", cache_root=tmp_path / "cache")
    message = str(missing.value)
    assert "FLEETLET_KUSTOMIZE" in message and "PATH" in message
    assert str(cached_tool_path("kustomize", cache_root=tmp_path / "cache")) in message
    assert "python3 -m tests.realenv.binaries kustomize" in message
    assert missing.value.reason == "ToolNotFound"

    with pytest.raises(ToolNotFoundError) as bad_override:
        find_tool("helm", override=str(tmp_path / "nope"), cache_root=tmp_path / "cache")
    assert f"FLEETLET_HELM={tmp_path / 'nope'}: not an executable file" in str(bad_override.value)


def test_a_failing_tool_reports_its_own_words(tmp_path: Path) -> None:
    helm = ensure_tools(["helm"])["helm"]
    with pytest.raises(ToolFailedError) as failed:
        run_tool(
            [helm, "template", "x", str(tmp_path / "no-such-chart")],
            cwd=tmp_path,
            timeout=60,
            max_memory=512 << 20,
            env={"HOME": str(tmp_path)},
        )
    assert "helm failed (exit code 1)" in str(failed.value)
    assert "no-such-chart" in str(failed.value) and "not found" in str(failed.value)
    assert failed.value.reason == "RenderFailed"


def test_memory_bound_stops_a_tool_that_needs_more(tmp_path: Path) -> None:
    helm = ensure_tools(["helm"])["helm"]
    # helm needs about 96 MiB of writable memory for the smallest render.
    with pytest.raises(ToolMemoryError) as starved:
        run_tool(
            [helm, "template", "x", str(ASSETS / "greeter")],
            cwd=tmp_path,
            timeout=60,
            max_memory=48 << 20,
            env={"HOME": str(tmp_path)},
        )
    assert "helm needed more than 48 MiB of memory" in str(starved.value)
    assert starved.value.reason == "RenderOutOfMemory"
    rendered = run_tool(
        [helm, "template", "x", str(ASSETS / "greeter")],
        cwd=tmp_path,
        timeout=60,
        max_memory=512 << 20,
        env={"HOME": str(tmp_path)},
    )
    assert b"kind: Deployment" in rendered


def test_time_bound_kills_the_whole_process_group(tmp_path: Path) -> None:
    pidfile = tmp_path / "child.pid"
    script = executable(
        tmp_path / "hang.sh", f"#!/bin/sh\nsleep 300 &\necho $! > {pidfile}\nwait\n"
    )
    with pytest.raises(ToolTimeoutError) as hung:
        run_tool([script], cwd=tmp_path, timeout=1.0, max_memory=512 << 20)
    assert "hang.sh ran longer than 1 s and was stopped" in str(hung.value)
    child = int(pidfile.read_text())
    # The grandchild was killed with the group: gone, or a zombie awaiting its reaper. A
    # SIGKILLed process takes a moment to exit on a busy machine (seen in CI: still "R").
    status = Path(f"/proc/{child}/stat")

    def dead() -> bool:
        try:
            return status.read_text().split(") ")[1].startswith(("Z", "X"))
        except (FileNotFoundError, ProcessLookupError):
            return True

    deadline = time.monotonic() + 30
    while not dead() and time.monotonic() < deadline:
        time.sleep(0.05)
    assert dead()


def test_output_is_capped_and_input_is_fed(tmp_path: Path) -> None:
    with pytest.raises(ToolOutputTooLargeError) as flood:
        run_tool(
            ["/usr/bin/yes"], cwd=tmp_path, timeout=60, max_memory=512 << 20, max_output=1 << 20
        )
    assert "printed more than 1048576 bytes" in str(flood.value)
    data = os.urandom(300_000).hex().encode()  # larger than a pipe buffer
    assert (
        run_tool(["/bin/cat"], cwd=tmp_path, timeout=60, max_memory=512 << 20, input=data) == data
    )


def test_the_tool_sees_only_the_environment_it_is_given(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("FLEETLET_SECRET_TOKEN", "do-not-leak")
    out = run_tool(
        ["/usr/bin/env"], cwd=tmp_path, timeout=60, max_memory=512 << 20, env={"ONLY": "this"}
    ).decode()
    assert "ONLY=this" in out
    assert "do-not-leak" not in out


def test_the_tool_runs_under_the_data_and_core_limits(tmp_path: Path) -> None:
    # The limits are set on the running child; its stdin is written only after that, so a
    # shell that waits for a line reads them as the tool's main work would.
    limits = run_tool(
        ["/bin/sh", "-c", "read line; ulimit -d; ulimit -c"],
        cwd=tmp_path,
        timeout=60,
        max_memory=256 << 20,
        input=b"go\n",
    )
    assert limits.split() == [str(256 << 10).encode(), b"0"]


@pytest.mark.skipif(not support().confined, reason="the kernel has no Landlock")
def test_a_confined_tool_reads_its_tree_only_and_its_starter_stays_free(tmp_path: Path) -> None:
    tree = tmp_path / "tree"
    tree.mkdir()
    (tree / "ours.txt").write_text("ours\n")
    (tmp_path / "theirs.txt").write_text("the agent's\n")
    cat = Path("/bin/cat").resolve()
    confinement = confine.for_tool(cat, tree=tree).plus(
        read=[Path("/etc/ld.so.cache")], execute=[Path("/lib"), Path("/usr/lib"), Path("/lib64")]
    )

    out = run_tool(
        [cat, "ours.txt"], cwd=tree, timeout=60, max_memory=512 << 20, confine=confinement
    )
    assert out == b"ours\n"
    with pytest.raises(ToolFailedError) as refused:
        run_tool(
            [cat, str(tmp_path / "theirs.txt")],
            cwd=tree,
            timeout=60,
            max_memory=512 << 20,
            confine=confinement,
        )
    assert "Permission denied" in str(refused.value)
    assert confine.CONFINED_HINT in str(refused.value)
    # The thread that started it was confined, not this one.
    assert (tmp_path / "theirs.txt").read_text() == "the agent's\n"
    assert gc.isenabled()  # paused while the confined thread ran, and back
