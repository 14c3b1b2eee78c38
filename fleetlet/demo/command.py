"""The ``fleetlet demo`` command: a :class:`~fleetlet.demo.environment.Demo` in a work directory,
its steps (the install, the encrypted Secret, then the scenario of ``--scenario`` from
:mod:`fleetlet.demo.scenarios`), Ctrl-C to stop. Called by ``fleetlet.cli``.
"""

from __future__ import annotations

import argparse
import shutil
import signal
import tempfile
from pathlib import Path
from types import FrameType

from fleetlet.demo.environment import Demo
from fleetlet.demo.scenarios import SCENARIOS
from fleetlet.demo.secret import encrypted_secret


def steps(demo: Demo) -> int:
    """The install every run starts with (and the encrypted Secret), then ``demo.scenario``;
    the exit code."""
    demo.start_components()
    demo.push_content()
    demo.publish_fleet()
    demo.start_agents_and_hub()
    demo.wait_for(demo.all_ready, "every installation Ready")
    secret = encrypted_secret(demo)
    print(demo.summary("Every installation is Ready"), flush=True)
    if secret:
        print(secret, flush=True)
    play = SCENARIOS[demo.scenario]
    if play is not None:
        play(demo)
    print(
        f"\nDashboard: {demo.dashboard}\n"
        f"API: {demo.hub_url}/api/v1 (read-only token: {demo.read_token})\n"
        f"Logs and state: {demo.workdir}",
        flush=True,
    )
    if demo.exit_when_ready:
        return 0
    print("Press Ctrl-C to stop everything.", flush=True)
    demo.wait_for_interrupt()
    return 0


def run_demo(args: argparse.Namespace) -> int:
    """The ``fleetlet demo`` command. Raises DemoError (the part that failed)."""
    keep = args.workdir is not None
    workdir = Path(args.workdir) if keep else Path(tempfile.mkdtemp(prefix="fleetlet-demo-"))
    workdir.mkdir(parents=True, exist_ok=True)
    demo = Demo(
        workdir=workdir,
        scenario=args.scenario,
        exit_when_ready=args.exit_when_ready,
        timeout=args.timeout,
        interval=args.interval,
    )

    def interrupted(signum: int, frame: FrameType | None) -> None:
        raise KeyboardInterrupt

    # SIGINT too: a shell starting the demo in the background hands it SIGINT ignored.
    previous = {s: signal.signal(s, interrupted) for s in (signal.SIGINT, signal.SIGTERM)}
    try:
        return demo.run(lambda: steps(demo))
    finally:
        for number, handler in previous.items():
            signal.signal(number, handler)
        if not keep:
            shutil.rmtree(workdir, ignore_errors=True)
