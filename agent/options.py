"""Command-line option groups every ``fleetlet`` command shares, defined once.

- :func:`add_output_option`: ``-o table|json|yaml`` (printing: :mod:`agent.output`);
- :func:`add_cluster_options` and :func:`kubeconfig_of`: ``--kubeconfig`` and ``--context`` for
  commands a person runs against a cluster, resolved as kubectl resolves them;
- :func:`add_logging_arguments`: ``--log-level`` and ``--log-format``.

Values are read here, at the edge, and handed to the code below as plain arguments.
"""

from __future__ import annotations

import argparse
import os
from pathlib import Path

from agent.output import OUTPUT_FORMATS


def add_output_option(parser: argparse.ArgumentParser, *, default: str | None = "table") -> None:
    """``-o/--output table|json|yaml`` (``default`` None: the command decides)."""
    shown = f" ({default})" if default else ""
    parser.add_argument(
        "-o",
        "--output",
        choices=OUTPUT_FORMATS,
        default=default,
        help=f"how to print the result{shown}",
    )


def add_cluster_options(parser: argparse.ArgumentParser) -> None:
    """``--kubeconfig FILE`` and ``--context NAME`` (see :func:`kubeconfig_of`)."""
    parser.add_argument(
        "--kubeconfig",
        metavar="FILE",
        help="the cluster (default: $KUBECONFIG, else ~/.kube/config, else in-cluster)",
    )
    parser.add_argument("--context", metavar="NAME", help="kubeconfig context")


def kubeconfig_of(args: argparse.Namespace) -> str | None:
    """The kubeconfig to use, as kubectl finds it: ``--kubeconfig``, else the first file of
    ``$KUBECONFIG``, else ``~/.kube/config`` if it exists, else None (the in-cluster
    configuration)."""
    if getattr(args, "kubeconfig", None):
        return str(args.kubeconfig)
    configured = os.environ.get("KUBECONFIG", "").split(os.pathsep)[0]
    if configured:
        return configured
    home = Path.home() / ".kube" / "config"
    return str(home) if home.is_file() else None


def add_logging_arguments(p: argparse.ArgumentParser, *, default_level: str) -> None:
    """``--log-level`` and ``--log-format`` (``$FLEETLET_LOG_LEVEL``, ``$FLEETLET_LOG_FORMAT``)."""
    from agent.report.loglevels import FORMATS, LEVELS

    p.add_argument(
        "--log-level",
        choices=LEVELS,
        default=os.environ.get("FLEETLET_LOG_LEVEL") or default_level,
        help=f"least severe level logged ($FLEETLET_LOG_LEVEL, default {default_level})",
    )
    p.add_argument(
        "--log-format",
        choices=FORMATS,
        default=os.environ.get("FLEETLET_LOG_FORMAT") or "text",
        help="text lines, or one JSON object per line with cluster, bundle, group, serial and "
        "run where they apply ($FLEETLET_LOG_FORMAT, default text)",
    )


__all__ = ["add_cluster_options", "add_logging_arguments", "add_output_option", "kubeconfig_of"]
