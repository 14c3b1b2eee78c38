"""What each of the agent's subcommands does once its arguments are parsed: ``agent run`` and
``agent sync`` (the settings read from the flags, the agent assembled, the exit status),
``render``, ``health`` and the approval commands.

Part of :mod:`agent.cli`; its argument parsing (``_arguments``) sets these as the handlers.
:mod:`agent.runner.worker` reads :func:`summary`; tests build agents with
:func:`settings_from_args`. Each command imports what it needs when it runs.
"""

from __future__ import annotations

import argparse
import sys
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from agent.render.tools import ToolSettings


def _render(args: argparse.Namespace) -> int:
    # fleetlet.cli gave helm or kustomize a head start before this parser was built
    # (agent.render.headstart); the render takes it over or it is killed here.
    from agent.render._launch import discard_early
    from agent.render.tools import ToolSettings

    try:
        return _render_now(args, ToolSettings.from_env())
    finally:
        discard_early()


def _render_now(args: argparse.Namespace, tools: ToolSettings) -> int:
    # Imported here: rendering pulls in YAML and format plugins the other commands never need.
    from agent.render.command import RenderOptions, run_render
    from agent.render.plain import InvalidManifestsError

    options = RenderOptions(
        format=args.format,
        path=args.path,
        namespace=args.namespace,
        values_files=args.values,
        set_values=args.set,
        set_string_values=args.set_string,
        set_json_values=args.set_json,
        set_file_values=args.set_file,
        release_name=args.release_name,
        install_namespace=args.install_namespace,
        watch_namespace=args.watch_namespace,
        kube_version=args.kube_version,
        output=args.output,
    )
    try:
        text = run_render(
            bundle_dir=args.bundle_dir,
            options=options,
            note=lambda line: print(f"fleetlet: {line}", file=sys.stderr),
            tools=tools,
        )
    except InvalidManifestsError as exc:
        # Every bad file, one per line.
        print(f"fleetlet: {exc.source}: {len(exc.errors)} files refused:", file=sys.stderr)
        for error in exc.errors:
            print(f"  {error.file}: {error.detail} [{error.rule}]", file=sys.stderr)
        return 1
    sys.stdout.write(text)
    return 0


def _health(args: argparse.Namespace) -> int:
    from agent.health.command import run_health
    from agent.options import kubeconfig_of

    text, code = run_health(
        filename=args.filename,
        output=args.output,
        kubeconfig=kubeconfig_of(args),
        context=args.context,
        offline=args.offline,
    )
    print(text)
    return code


def _preview(args: argparse.Namespace) -> int:
    from agent.approve.command import run_preview

    return run_preview(args)


def _approve(args: argparse.Namespace) -> int:
    from agent.approve.command import run_decision

    return run_decision(args, "approve")


def _deny(args: argparse.Namespace) -> int:
    from agent.approve.command import run_decision

    return run_decision(args, "deny")


def settings_from_args(args: argparse.Namespace) -> Any:
    """The agent's grouped settings from its flags (whose defaults are the ``FLEETLET_*``
    variables). Raises SettingsError naming the bad setting."""
    import os
    from pathlib import Path

    from agent.apply.guard import Guard
    from agent.assemble import make_failpoint
    from agent.render.tools import ToolSettings
    from agent.settings import (
        AgentSettings,
        LimitSettings,
        NetworkSettings,
        PollSettings,
        ReconcileSettings,
        RepoSettings,
        TrustSettings,
    )

    return AgentSettings(
        repo=RepoSettings(
            url=args.repo,
            cluster=args.cluster,
            status_url=args.status_repo,
            cache_dir=Path(args.cache_dir),
            protocol_v2=args.git_protocol == "2",
        ),
        trust=TrustSettings(
            trusted_root=Path(args.trusted_root or ""),
            identity=args.identity or "",
            issuer=args.issuer or "",
            max_validity=args.max_publication_validity,
            clock_skew=args.clock_skew,
            source_policy=Path(args.verify_sources) if args.verify_sources else None,
        ),
        reconcile=ReconcileSettings(
            agent_namespace=args.namespace,
            uninstall_failed_install=args.uninstall_failed_install,
            parallel_groups=args.parallel_groups,
            retry_backoff=args.retry_backoff,
            guard=Guard(
                agent_namespace=args.namespace,
                allowed=frozenset(
                    name.strip()
                    for name in (args.allow_agent_objects or "").split(",")
                    if name.strip()
                ),
            ),
            failpoint=make_failpoint(os.environ.get("FLEETLET_FAILPOINT")),
        ),
        poll=PollSettings(
            interval=getattr(args, "interval", 30.0),
            jitter=getattr(args, "jitter", 5.0),
            max_backoff=max(getattr(args, "max_backoff", 300.0), getattr(args, "interval", 30.0)),
            drift_interval=getattr(args, "drift_interval", 300.0),
            heartbeat=args.heartbeat,
            worker_timeout=getattr(args, "worker_timeout", 3600.0),
            warm_worker=getattr(args, "warm_worker", False),
        ),
        network=NetworkSettings(
            connect_timeout=args.connect_timeout,
            read_timeout=args.read_timeout,
            attempts=args.fetch_attempts,
        ),
        limits=LimitSettings(
            max_bundle_bytes=args.max_bundle_bytes,
            max_bundle_files=args.max_bundle_files,
            max_file_bytes=args.max_file_bytes,
            max_download_bytes=args.max_download_bytes,
            cache_bytes=args.cache_max_bytes,
        ),
        kubeconfig=args.kubeconfig,
        tools=ToolSettings.from_env(),
        status=not args.no_status,
        hub_public_key=Path(args.hub_public_key) if args.hub_public_key else None,
        agent_sealing_key=Path(args.agent_sealing_key) if args.agent_sealing_key else None,
        plain_http_registries=args.plain_http_registries,
    )


def _build_agent(args: argparse.Namespace) -> Any:
    """The agent, built from its settings (:mod:`agent.assemble` wires the parts)."""
    from agent.assemble import build_agent

    return build_agent(settings_from_args(args))


EXIT_CONVERGED = 0
"""``agent sync --once``: everything is on its target and healthy."""
EXIT_FAILED = 1
"""Something failed in this sync (a publication refused, a group rolled back or refused, a
server away)."""
EXIT_USAGE = 2
"""The command line or the agent's configuration is unusable."""
EXIT_DEGRADED = 4
"""The sync itself went fine, but not everything is Ready: a failure kept from an earlier
sync, a group waiting for a dependency or an approval."""


def summary(cluster: str, result: Any) -> str:
    """One line: what a tick did (the inbound outcome, the serial, groups by outcome)."""
    out = result.outbound
    parts = [f"{cluster}: {result.inbound}, serial {result.serial}"]
    if out is not None:
        for label, groups in (
            ("moved", out.moved),
            ("rolled back", out.rolled_back),
            ("failed", tuple(g for g in out.failed if g not in out.rolled_back)),
            ("waiting", out.waiting),
            ("awaiting approval", out.awaiting_approval),
            ("held", out.held),
            ("removed", out.removed),
        ):
            if groups:
                parts.append(f"{label}: {', '.join(groups)}")
        if out.drift_corrected:
            parts.append(f"{out.drift_corrected} drifted objects corrected")
        if out.converged:
            parts.append("converged")
    return "; ".join(parts)


def _sync(args: argparse.Namespace) -> int:
    """One reconcile. Prints a summary line, always, and on failure the reason in one line
    on stderr; the exit code says how it went (see the EXIT_* constants)."""
    from agent.errors import FleetletError, TemporaryError
    from agent.report.logs import error_line

    # One clear line on failure (the error itself); progress warnings would repeat it.
    _setup_logging(args)
    agent = _build_agent(args)
    error: FleetletError | None = None
    try:
        result = agent.tick()
    except FleetletError as exc:
        error = exc
        result = agent.last
    if result is not None:
        print(summary(args.cluster, result))
    if error is not None:
        temporary = " (temporary; retrying may help)" if isinstance(error, TemporaryError) else ""
        error_line(f"{args.cluster}: sync failed: {error}{temporary}{_hint(error)}", prefix="")
        return EXIT_FAILED
    assert result is not None
    if result.inbound == "refused-before":
        state = agent.state.load()
        error_line(
            f"{args.cluster}: commit {(state.refused_commit or '-')[:12]} was refused and the "
            f"branch has not moved since ({state.refusal_reason}: {state.refusal_message})",
            prefix="",
        )
        return EXIT_DEGRADED
    out = result.outbound
    if out is not None and out.failed_now:
        reasons = _failure_lines(agent, out.failed_now)
        error_line(f"{args.cluster}: {reasons}", prefix="")
        return EXIT_FAILED
    if out is not None and not out.converged:
        error_line(
            f"{args.cluster}: not everything is Ready: {_failure_lines(agent, out.failed or out.waiting or out.awaiting_approval or out.held)}",
            prefix="",
        )
        return EXIT_DEGRADED
    return EXIT_CONVERGED


def _hint(error: Any) -> str:
    """How to provide what an error says is missing (the agent's flags and variables)."""
    from agent.source.credentials import GitAuthError

    if isinstance(error, GitAuthError):
        return (
            ". Git credentials: mount a Secret at $FLEETLET_GIT_CREDENTIALS_DIR (username and "
            "password, or token), or set FLEETLET_GIT_TOKEN (or FLEETLET_GIT_USERNAME and "
            "FLEETLET_GIT_PASSWORD)"
        )
    return ""


def _failure_lines(agent: Any, groups: Any) -> str:
    """One line naming each group and why it is not Ready."""
    views = agent.reconciler.views
    said = []
    for group in groups:
        reasons = sorted(
            {
                f"{v.conditions['Ready'].reason}: {v.conditions['Ready'].message}"
                for v in (views.get(n) for n in views.names())
                if v is not None and v.group == group and "Ready" in v.conditions
            }
        )
        said.append(f"group {group}: " + ("; ".join(reasons) or "failed"))
    return " | ".join(said)


def _run(args: argparse.Namespace) -> int:
    """``agent run``: the supervisor (:mod:`agent.runner`) and its jobs until SIGTERM."""
    import logging
    import signal

    from agent.probe import ProbeServer
    from agent.schedule import AgentScheduler
    from agent.upgrade.rights import parse

    # What agent install granted it for upgrading itself (agent.upgrade.rights).
    rights = parse(args.self_upgrade, "--self-upgrade ($FLEETLET_SELF_UPGRADE)")
    _setup_logging(args)
    # The scheduler logs every run; the agent reports outcomes itself.
    logging.getLogger("apscheduler").setLevel(logging.ERROR)
    from agent.assemble import build_supervisor

    settings = settings_from_args(args)
    supervisor = build_supervisor(settings, log_level=args.log_level, log_format=args.log_format)
    poll = settings.poll
    from agent.upgrade.incluster import InClusterUpgrades, in_cluster
    from agent.upgrade.process import Upgrades  # one agent acts; upgrades: agent/upgrade/

    # In agent install's pod the candidate is a Deployment; elsewhere a process.
    kind = InClusterUpgrades if in_cluster() else Upgrades
    upgrades = kind(settings=settings, supervisor=supervisor, rights=rights)
    scheduler = AgentScheduler(
        poll=upgrades.gate(supervisor.poll),
        drift=upgrades.gate(supervisor.drift),
        heartbeat=upgrades.gate(supervisor.heartbeat, exclusive=False)
        if supervisor.pusher is not None
        else None,
        interval=poll.interval,
        jitter=poll.jitter,
        drift_interval=poll.drift_interval,
        heartbeat_interval=poll.heartbeat,
        max_backoff=poll.max_backoff,
    )
    channel = _notify_channel(args, settings.repo.cluster, scheduler, supervisor.metrics)
    scheduler.keep_polling = supervisor.awaiting  # decisions are made in the cluster
    supervisor.channel = None if channel is None else (lambda: channel.up)
    supervisor.on_fatal = lambda: scheduler.stop(wait=False)
    probe = (
        ProbeServer(
            args.probe_address, agent=supervisor, poller=scheduler, metrics=supervisor.metrics
        )
        if args.probe_address
        else None
    )

    def stop(signum: int, frame: Any) -> None:
        # The running worker too: the process cannot exit before the job waiting for it ends,
        # and a worker may run up to --worker-timeout. Killing it is safe at any point.
        supervisor.stop()
        scheduler.stop(wait=False)
        upgrades.stop()

    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGINT, stop)
    if probe is not None:
        probe.start()
    upgrades.start()  # the Lease first; a candidate proves itself here
    scheduler.start()
    if channel is not None:
        channel.start()
    try:
        scheduler.wait()
    finally:
        if channel is not None:
            channel.stop()
        scheduler.stop(wait=True)
        upgrades.stop()
        upgrades.finish()
        if probe is not None:
            probe.stop()
    if supervisor.fatal is not None:
        raise supervisor.fatal
    return 0


def _notify_channel(
    args: argparse.Namespace, cluster: str, scheduler: Any, metrics: Any = None
) -> Any:
    """The hub's notification channel of ``--notify-url`` (None without it), wired to the
    scheduler: a notification polls at once; while it is up the poll job slows down to
    ``--notify-poll-interval``. Raises SettingsError."""
    from pathlib import Path

    from agent.channel import NotifyChannel
    from agent.settings import SettingsError

    if not args.notify_url:
        return None
    if args.notify_poll_interval <= 0:
        raise SettingsError("--notify-poll-interval: must be positive")
    try:
        channel = NotifyChannel(
            url=args.notify_url,
            cluster=cluster,
            token_file=Path(args.notify_token_file) if args.notify_token_file else None,
            look=scheduler.poll_now,
            connect_timeout=args.connect_timeout,
            max_backoff=args.max_backoff,
            on_change=(lambda up: metrics.channel_up.set(1 if up else 0)) if metrics else None,
            on_event=metrics.notifications.inc if metrics else None,
        )
    except ValueError as exc:
        raise SettingsError(str(exc)) from None
    scheduler.channel_up = lambda: channel.up
    scheduler.channel_interval = max(args.notify_poll_interval, scheduler.interval)
    return channel


def _setup_logging(args: argparse.Namespace) -> None:
    from agent.report.logs import setup_logging

    setup_logging(level=args.log_level, format=args.log_format, cluster=args.cluster)
