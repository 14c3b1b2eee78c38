"""Entry point of the ``fleetlet`` command.

Builds one argparse tree from the agent's and the hub's subcommands, runs the chosen handler and
turns every :class:`~agent.errors.FleetletError` into one line on stderr and a non-zero exit code.
Configuration is read here, at the edge, and passed down explicitly.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

from agent import __version__
from agent import cli as agent_cli
from agent.errors import (
    ConfigurationError,
    FleetletError,
    NotImplementedYetError,
    TemporaryError,
)

AGENT_COMMANDS = frozenset({"agent", "render", "health"})
"""Top-level commands of the agent: ``fleetlet agent run`` in a cluster never imports the hub
(its CLI pulls in the hub's server and status code: about 28 MB and half a second)."""

EXIT_OK = 0
EXIT_FAILED = 1
EXIT_USAGE = 2
EXIT_NOT_IMPLEMENTED = 3


def _demo(args: argparse.Namespace) -> int:
    # Imported here: the demo needs the test environment of a source checkout.
    from fleetlet.demo import run_demo

    return run_demo(args)


def build_parser(*, agent_only: bool = False) -> argparse.ArgumentParser:
    """The whole command tree; with ``agent_only``, the agent's commands alone."""
    parser = argparse.ArgumentParser(
        prog="fleetlet",
        description=(
            "GitOps pull system for fleets of Kubernetes clusters. The hub publishes one signed, "
            "digest-pinned BundleDeployment set per cluster to git; an agent in each cluster "
            "pulls and verifies its own set, applies it group by group, and rolls a failed "
            "group back to its previous healthy state."
        ),
    )
    parser.add_argument("--version", action="version", version=f"fleetlet {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    if agent_only:
        agent_cli.register(sub)
        return parser
    from hub import cli as hub_cli

    hub_cli.register(sub)
    agent_cli.register(sub)
    hub_cli.register_installations(sub)
    demo = sub.add_parser(
        "demo",
        help="run a local demo fleet: clusters, git server, registry, Sigstore, hub, agents",
        description=(
            "Start three local Kubernetes clusters, a git server, an OCI registry and a local "
            "Sigstore on loopback, publish fleet-examples/ and run one agent per cluster."
        ),
    )
    demo.add_argument("--scenario", choices=["install", "failed-upgrade"], default="install")
    demo.add_argument(
        "--exit-when-ready",
        action="store_true",
        help="exit 0 once every installation is Ready (non-zero on failure or timeout)",
    )
    demo.add_argument(
        "--timeout",
        type=float,
        default=600.0,
        metavar="SECONDS",
        help="how long to wait for the fleet (and the scenario) to settle (600)",
    )
    demo.add_argument(
        "--interval", type=float, default=2.0, metavar="SECONDS", help="agents' poll interval"
    )
    demo.add_argument(
        "--workdir",
        metavar="DIR",
        help="keep state and logs here (default: a temporary directory, removed at the end)",
    )
    demo.set_defaults(handler=_demo)
    return parser


def _fail(message: str) -> None:
    """The one line of a failed command (JSON when the command set up JSON logs)."""
    from agent.report.logs import error_line

    error_line(message)


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    parser = build_parser(agent_only=bool(argv) and argv[0] in AGENT_COMMANDS)
    args = parser.parse_args(argv)
    try:
        code: int = args.handler(args)
    except NotImplementedYetError as exc:
        _fail(str(exc))
        return EXIT_NOT_IMPLEMENTED
    except ConfigurationError as exc:
        _fail(str(exc))
        return EXIT_USAGE
    except TemporaryError as exc:
        _fail(f"{exc} (temporary; retrying may help)")
        return EXIT_FAILED
    except FleetletError as exc:
        _fail(str(exc))
        return EXIT_FAILED
    except KeyboardInterrupt:
        _fail("interrupted")
        return 130
    return code
