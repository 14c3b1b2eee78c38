"""Entry point of the ``fleetlet`` command.

Builds one argparse tree from the agent's and the hub's subcommands, runs the chosen handler and
turns every :class:`~agent.errors.FleetletError` into one line on stderr and a non-zero exit code.
Configuration is read here, at the edge, and passed down explicitly.
"""

from __future__ import annotations

import atexit
import gc
import os
import sys

from agent import __version__
from agent.errors import (
    ConfigurationError,
    FleetletError,
    NotImplementedYetError,
    TemporaryError,
)

# Imported where used, not here: ``fleetlet render`` starts helm before argparse and typing
# load (about 15 ms), see main().
TYPE_CHECKING = False
if TYPE_CHECKING:
    import argparse
    from collections.abc import Callable, Sequence
    from typing import Any

AGENT_COMMANDS = frozenset({"agent", "render", "health", "preview", "approve", "deny"})
"""Top-level commands of the agent: ``fleetlet agent run`` in a cluster never imports the hub
(its CLI pulls in the hub's server and status code: about 28 MB and half a second)."""

EXIT_OK = 0
EXIT_FAILED = 1
EXIT_USAGE = 2
EXIT_NOT_IMPLEMENTED = 3


def _demo(args: argparse.Namespace) -> int:
    # Imported here: the demo needs the test environment of a source checkout.
    from fleetlet.demo.command import run_demo

    return run_demo(args)


def _import_fleet(args: argparse.Namespace) -> int:
    from pathlib import Path

    from agent.output import render, table
    from hub.importer.fleet import (
        FleetImportError,
        ImportSettings,
        import_fleet,
        load_clusters,
        write_fleet_repo,
    )

    source = Path(args.dir)
    gitrepo = None
    if args.gitrepo:
        import yaml

        from agent.api.yamlio import load_kube

        try:
            gitrepo = load_kube(Path(args.gitrepo).read_text())
        except (OSError, yaml.YAMLError) as exc:
            raise FleetImportError(f"--gitrepo {args.gitrepo}: {exc}") from exc
        if not isinstance(gitrepo, dict) or gitrepo.get("kind") != "GitRepo":
            raise FleetImportError(f"--gitrepo {args.gitrepo}: not a Fleet GitRepo")
    name = args.name or str((gitrepo or {}).get("metadata", {}).get("name") or "")
    result = import_fleet(
        source,
        ImportSettings(
            name=name or source.resolve().name,
            source_url=args.source_url,
            branch=args.branch,
            commit=args.commit,
            gitrepo=gitrepo,
            clusters=load_clusters(Path(args.clusters)) if args.clusters else None,
        ),
    )
    write_fleet_repo(result, Path(args.out))
    data = {
        "out": args.out,
        "bundles": [
            {"name": b["name"], "format": b["format"], "overrides": len(b.get("overrides", []))}
            for b in result.bundles
        ],
        "notExpressed": [n.to_dict() for n in result.notes],
    }

    def show(d: dict[str, object]) -> str:
        lines = [f"imported {len(result.bundles)} bundles into {args.out}"]
        lines.append(table([(b["name"], b["format"], b["overrides"]) for b in data["bundles"]],
                           ["BUNDLE", "FORMAT", "OVERRIDES"]))  # fmt: skip
        if result.notes:
            lines.append(f"\nnot expressed ({len(result.notes)}):")
            lines.append(table([(n.bundle, n.field, n.message) for n in result.notes],
                               ["BUNDLE", "FIELD", "WHAT"]))  # fmt: skip
        else:
            lines.append("everything was expressed")
        return "\n".join(lines)

    print(render(data, args.output, table=show))
    return 0


def build_parser(
    *, agent_only: bool = False, command: str | None = None
) -> argparse.ArgumentParser:
    """The whole command tree; with ``agent_only``, the agent's commands alone; with
    ``command`` (the first word of the command line), the commands of its group alone when
    it is ``import``, ``demo`` or the ``--version`` flag, so that they load nothing else."""
    import argparse

    from agent import cli as agent_cli

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
        agent_cli.register(sub, only=command)
        return parser
    if command == "--version":
        return parser
    if command in _OWN_GROUPS:
        _OWN_GROUPS[command](sub)
        return parser
    from hub import cli as hub_cli
    from hub.enroll.command import register as register_enroll
    from hub.rollout.command import register as register_rollout

    hub_sub = hub_cli.register(sub)
    register_rollout(hub_sub)
    register_enroll(hub_sub)
    agent_cli.register(sub)
    hub_cli.register_installations(sub)
    for register in _OWN_GROUPS.values():
        register(sub)
    return parser


def _register_import(sub: Any) -> None:
    from agent.options import add_output_option

    importer = sub.add_parser(
        "import",
        help="convert another tool's fleet repo into a fleetlet fleet repo",
        description="Convert a fleet repo written for another GitOps tool.",
    )
    import_sub = importer.add_subparsers(dest="import_command", metavar="TOOL", required=True)
    fleet = import_sub.add_parser(
        "fleet",
        help="a Rancher Fleet GitRepo layout (fleet.yaml bundles)",
        description="Convert the Rancher Fleet GitRepo content in DIR (directories with "
        "fleet.yaml: namespaces, helm charts, values and valuesFiles, kustomize dirs, "
        "targetCustomizations, dependsOn, paused, keepResources, takeOwnership) into a "
        "fleetlet fleet repo in FLEET_DIR, and list what could not be expressed. Each bundle's "
        "content stays in the git repository (a git source with the bundle's directory).",
    )
    fleet.add_argument("dir", metavar="DIR", help="a checkout of the Fleet GitRepo's repository")
    fleet.add_argument("--out", required=True, metavar="FLEET_DIR", help="a new directory")
    fleet.add_argument(
        "--gitrepo",
        metavar="FILE",
        help="the Fleet GitRepo resource (YAML): its name, repo, branch, paths and targets",
    )
    fleet.add_argument("--name", help="the GitRepo's name (bundle name prefix; default: DIR's)")
    fleet.add_argument(
        "--source-url",
        metavar="GIT_URL",
        help="the git URL bundles fetch their content from (default: the GitRepo's repo, "
        "else DIR's origin remote)",
    )
    ref = fleet.add_mutually_exclusive_group()
    ref.add_argument("--branch", help="the branch to follow (default: the GitRepo's, else main)")
    ref.add_argument("--commit", metavar="SHA", help="pin the bundles to this commit")
    fleet.add_argument(
        "--clusters",
        metavar="FILE",
        help="the cluster inventory (fleetlet's format or Fleet Cluster objects): written to "
        "clusters/ and used to apply Fleet's first-match rule of targetCustomizations exactly",
    )
    add_output_option(fleet)
    fleet.set_defaults(handler=_import_fleet)


DEMO_SCENARIOS = ("install", "failed-upgrade", "approval", "rollout", "agent-upgrade")
"""The names of :data:`fleetlet.demo.scenarios.SCENARIOS` (a test checks they are the same),
offered to ``--scenario`` without importing the demo (its package loads PyYAML, its scenarios
the agent's upgrade artifacts)."""


def _register_demo(sub: Any) -> None:
    demo = sub.add_parser(
        "demo",
        help="run a local demo fleet: clusters, git server, registry, Sigstore, hub, agents",
        description=(
            "Start three local Kubernetes clusters, a git server, an OCI registry and a local "
            "Sigstore on loopback, publish fleet-examples/ and run one agent per cluster."
        ),
    )
    demo.add_argument(
        "--scenario",
        choices=list(DEMO_SCENARIOS),
        default="install",
        help="after the install: a broken upgrade rolled back on the canary (failed-upgrade), "
        "an upgrade that needs an approval, approved by the production stores' policy and "
        "by a person on the canary (approval; see docs/approvals.md), or progressive "
        "rollouts: a good version canary first, promoted to the rest, then a broken one "
        "halted and reverted on the canary (rollout; see docs/rollouts.md), or the agents "
        "upgrading themselves in two waves, broken images rolled back on the canary "
        "(agent-upgrade; see docs/operations.md)",
    )
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


# Top-level commands registered alone when they are the one run (see build_parser).
_OWN_GROUPS: dict[str, Callable[[Any], None]] = {"import": _register_import, "demo": _register_demo}


def _fail(message: str) -> None:
    """The one line of a failed command (JSON when the command set up JSON logs)."""
    from agent.report.logs import error_line

    error_line(message)


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:1] == ["render"] and not {"-h", "--help"} & set(argv):
        # helm or kustomize starts now, confined, and renders while the parser and the render
        # code load; the render takes it over if it asks for that very process
        # (agent.render.headstart). Not for a help, which loads none of it.
        from agent.render.headstart import start_for_command_line

        start_for_command_line(argv[1:], os.environ)
    parser = build_parser(
        agent_only=bool(argv) and argv[0] in AGENT_COMMANDS, command=argv[0] if argv else None
    )
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


def run() -> None:
    """The ``fleetlet`` console script (and ``python -m fleetlet``): :func:`main` on the command
    line, then exit with its code.

    ``render`` runs lighter, the way a user runs it (``bench/render_cli.py``): it is short,
    read-only and leaves no thread behind, so it runs without the cyclic garbage collector
    (whose passes over the ~180 modules it loads cost about 4 ms; reference counting frees its
    objects) and, once its output is flushed and the exit handlers have run (its head start
    killed, scratch directories removed), leaves without tearing the interpreter down module
    by module (about 8 ms). Every other command exits the usual way.
    """
    argv = sys.argv[1:]
    light = argv[:1] == ["render"]
    if light:
        gc.disable()
    code = main(argv)
    if light and _threading_idle():
        _exit_now(code)
    sys.exit(code)


def _threading_idle() -> bool:
    """Whether no thread but this one runs (so nothing is left to wait for at exit)."""
    threading = sys.modules.get("threading")
    return threading is None or threading.active_count() == 1


def _exit_now(code: int) -> None:
    atexit._run_exitfuncs()
    try:
        sys.stdout.flush()
        sys.stderr.flush()
    except OSError:
        return  # a closed pipe: the usual exit reports it
    os._exit(code)
