"""The agent assembled from its settings: the one place its parts are wired together.

:func:`build_agent` makes the in-process agent (``agent sync`` and every worker of ``agent
run``), :func:`build_supervisor` the long-lived half of ``agent run``. Settings come in as an
:class:`agent.settings.AgentSettings`, already read from the command line by :mod:`agent.cli`;
credentials from the mounted Secrets' directories or ``FLEETLET_GIT_*`` variables. Imports are
made where needed, so that a supervisor never loads the cluster client or sigstore.
"""

from __future__ import annotations

from typing import Any


def build_agent(
    settings: Any, *, metrics: Any = None, lazy_trust: bool = False, vouched: Any = None
) -> Any:
    """The agent's objects from :class:`agent.settings.AgentSettings`. ``metrics``: where they
    record (default a new :class:`~agent.report.metrics.Metrics`); ``lazy_trust``: load the
    trust policy, and sigstore with it, only when a publication is verified (for work that
    may verify none; the trust configuration is then not checked up front); ``vouched``: a
    :class:`~agent.verify.VouchedSignature` this job checked already. Credentials come
    from the mounted Secrets' directories (``FLEETLET_GIT_CREDENTIALS_DIR``,
    ``FLEETLET_STATUS_GIT_CREDENTIALS_DIR``) or ``FLEETLET_GIT_*`` variables.

    Raises ConfigurationError (kubeconfig, trust policy, CRDs not installed)."""
    import os

    from agent import __version__
    from agent.apply.intent import GroupRecords
    from agent.apply.store import RevisionStore
    from agent.apply.verified import VerifiedObjects
    from agent.inbound import InboundPipeline
    from agent.kube import KubeClient, KubeconfigError
    from agent.loop import Agent
    from agent.reconcile import Reconciler
    from agent.report.bundles import BundleDeployments
    from agent.report.events import EventRecorder
    from agent.report.metrics import Metrics
    from agent.report.runs import RunLog
    from agent.report.view import BundleViews
    from agent.source.archive import ArchiveLimits
    from agent.source.cache import ContentCache
    from agent.source.compose import ContentStore
    from agent.source.git import GitFetcher, GitSettings
    from agent.source.http import HttpFetcher, HttpSettings
    from agent.source.oci import OciFetcher, OciSettings
    from agent.state import ClusterState
    from agent.verify import DeferredTrust, IdentityPolicy

    if metrics is None:
        metrics = Metrics(cluster=settings.repo.cluster, version=__version__)
    credentials = git_credentials()
    repo = settings.repo
    cache = repo.cache_dir
    namespace = settings.namespace
    net = settings.network
    limits = settings.limits
    unpack = ArchiveLimits(
        max_files=limits.max_bundle_files,
        max_file_bytes=limits.max_file_bytes,
        max_total_bytes=limits.max_bundle_bytes,
    )
    check_cache_dir(cache)
    try:
        kube = KubeClient(
            kubeconfig=settings.kubeconfig,
            connect_timeout=net.connect_timeout,
            read_timeout=net.read_timeout,
        )
    except KubeconfigError as exc:
        raise KubeconfigError(
            f"{exc}. Give the cluster's kubeconfig with --kubeconfig FILE (or "
            "$FLEETLET_KUBECONFIG), or run the agent in its pod (deploy/agent/)"
        ) from exc
    check_crds(kube, settings.kubeconfig)
    # The trust policy after the cluster: a machine without a kubeconfig hears about that first.
    trust = (
        DeferredTrust(
            load=lambda: trust_policy(settings),
            identity=IdentityPolicy(issuer=settings.trust.issuer, subject=settings.trust.identity),
            max_validity=settings.trust.max_validity,
            vouched=vouched,
        )
        if lazy_trust or vouched is not None
        else trust_policy(settings)
    )
    state = ClusterState(kube=kube, namespace=namespace)
    events = EventRecorder(
        kube=kube,
        namespace="default",
        component="fleetlet-agent",
        instance=os.environ.get("HOSTNAME"),
    )
    bundles = BundleDeployments(kube=kube, owner=namespace, events=events)
    runs = RunLog(kube, namespace=namespace)
    store = RevisionStore(kube, namespace=namespace)
    pipeline = InboundPipeline(
        tools=settings.tools,
        installed=lambda bundle: store.latest_number(bundle) is not None,
        cluster=repo.cluster,
        watcher=branch_watcher(settings, credentials),
        trust=trust,
        content=ContentStore(
            cache=ContentCache(
                root=cache / "content", max_bytes=limits.cache_bytes, metrics=metrics
            ),
            oci=OciFetcher(
                settings=OciSettings(
                    plain_http=settings.plain_http_registries,
                    connect_timeout=net.connect_timeout,
                    timeout=net.read_timeout,
                    attempts=net.attempts,
                    max_layer_bytes=limits.max_download_bytes,
                    archive_limits=unpack,
                )
            ),
            git=GitFetcher(
                repos_dir=cache / "content" / "git",
                settings=GitSettings(
                    connect_timeout=net.connect_timeout,
                    io_timeout=net.read_timeout,
                    limits=unpack,
                ),
            ),
            http=HttpFetcher(
                settings=HttpSettings(
                    connect_timeout=net.connect_timeout,
                    timeout=net.read_timeout,
                    attempts=net.attempts,
                    max_bytes=limits.max_download_bytes,
                    archive_limits=unpack,
                )
            ),
            limits=unpack,
            verifier=source_verifier(settings, cache / "content" / "signatures"),
        ),
        kube=kube,
        state=state,
        agent_namespace=namespace,
        workdir=cache / "work",
        bundles=bundles,
        failpoint=settings.reconcile.failpoint,
        clock_skew=settings.trust.clock_skew,
    )
    reconciler = Reconciler(
        kube=kube,
        settings=settings.reconcile,
        store=store,
        records=GroupRecords(kube, namespace=namespace),
        runs=runs,
        views=BundleViews(bundles=bundles, runs=runs),
        outputs=outputs_stage(
            kube, namespace, repo.cluster, settings.hub_public_key, settings.agent_sealing_key
        ),
        metrics=metrics,
        verified=VerifiedObjects(cache / "work" / "verified.json"),
    )
    return Agent(
        cluster=repo.cluster,
        pipeline=pipeline,
        reconciler=reconciler,
        state=state,
        pusher=status_pusher(settings, credentials, metrics) if settings.status else None,
        metrics=metrics,
    )


def trust_policy(settings: Any) -> Any:
    """The agent's :class:`~agent.verify.TrustPolicy` (this loads sigstore). Raises
    TrustConfigError."""
    from agent.verify import IdentityPolicy, TrustPolicy

    return TrustPolicy(
        trusted_root=settings.trust.trusted_root,
        identity=IdentityPolicy(issuer=settings.trust.issuer, subject=settings.trust.identity),
        max_validity=settings.trust.max_validity,
    )


def source_verifier(settings: Any, cache_dir: Any) -> Any:
    """The cluster's own source check (``--verify-sources``), or None. Raises
    SourcePolicyError when the policy file cannot be used (the agent does not start: it would
    otherwise apply what the cluster's policy was meant to stop)."""
    if settings.trust.source_policy is None:
        return None
    from agent.source.registry import RegistrySettings
    from agent.source.signed import SourceVerifier, load_cluster_policy

    net = settings.network
    return SourceVerifier(
        load_cluster_policy(settings.trust.source_policy),
        cache_dir=cache_dir,
        settings=RegistrySettings(
            plain_http=settings.plain_http_registries,
            timeout=net.read_timeout,
            connect_timeout=net.connect_timeout,
            attempts=net.attempts,
            user_agent="fleetlet-agent",
        ),
    )


def git_credentials() -> Any:
    """The desired-state repository's credentials: from ``FLEETLET_GIT_CREDENTIALS_DIR`` (the
    mounted Secret) or the ``FLEETLET_GIT_*`` variables; None when there are none."""
    import os
    from pathlib import Path

    from agent.source.credentials import GitCredentials

    creds_dir = os.environ.get("FLEETLET_GIT_CREDENTIALS_DIR")
    creds = GitCredentials.from_files(Path(creds_dir)) if creds_dir else GitCredentials.from_env()
    return None if creds.kind == "none" else creds


def branch_watcher(settings: Any, credentials: Any) -> Any:
    """The watcher of this cluster's branch (its local repository under the cache)."""
    from agent.source.branch import BranchWatcher

    repo = settings.repo
    return BranchWatcher(
        repo_url=repo.url,
        cluster=repo.cluster,
        cache_dir=repo.cache_dir,
        credentials=credentials,
        protocol_v2=repo.protocol_v2,
        connect_timeout=settings.network.connect_timeout,
        io_timeout=settings.network.read_timeout,
    )


def status_pusher(settings: Any, credentials: Any, metrics: Any) -> Any:
    """The status pusher: to ``--status-repo`` (or the desired-state repository), with the
    status repository's own (write) credentials when they are mounted."""
    import os
    from pathlib import Path

    from agent.render.formats import available_formats
    from agent.report.push import StatusPusher
    from agent.source.credentials import GitCredentials
    from agent.upgrade import AGENT_FORMAT

    status_dir = os.environ.get("FLEETLET_STATUS_GIT_CREDENTIALS_DIR")
    status_creds = credentials
    if status_dir and Path(status_dir).is_dir() and any(Path(status_dir).iterdir()):
        found = GitCredentials.from_files(Path(status_dir))
        status_creds = None if found.kind == "none" else found
    repo = settings.repo
    return StatusPusher(
        repo_url=repo.status_url or repo.url,
        cluster=repo.cluster,
        credentials=status_creds,
        workdir=repo.cache_dir / "status",
        heartbeat_interval=settings.poll.heartbeat,
        connect_timeout=settings.network.connect_timeout,
        io_timeout=settings.network.read_timeout,
        metrics=metrics,
        formats=[*available_formats(), AGENT_FORMAT],  # the agent's entry: agent.upgrade
    )


def make_failpoint(spec: str | None) -> Any:
    """``FLEETLET_FAILPOINT=[stop:]<step prefix>[#n][@FILE]``: the agent kills itself (SIGKILL,
    as the OOM killer or a node failure would) at the n-th step whose name starts with the
    prefix; with ``stop:`` it stops itself there instead (SIGSTOP: a process that hangs). With
    ``@FILE`` it does so only while FILE exists, and removes it: armed from outside, once,
    whichever process gets there (an ``agent run`` starts a worker per job). For crash-safety
    tests; unset in production. With ``FLEETLET_TRACE`` set, every step is also a stage of
    the latency trace (:mod:`agent.report.trace`)."""
    from agent.report import trace

    if not spec:
        return (lambda name: trace.mark(name)) if trace.enabled() else None
    import os
    import signal

    action = signal.SIGKILL
    if spec.startswith("stop:"):
        action, spec = signal.SIGSTOP, spec[len("stop:") :]
    spec, _, armed = spec.partition("@")
    prefix, _, nth = spec.partition("#")
    wanted = int(nth) if nth.isdigit() else 1
    hits = 0

    def failpoint(name: str) -> None:
        nonlocal hits
        trace.mark(name)
        if not name.startswith(prefix):
            return
        hits += 1
        if hits != wanted:
            return
        if armed:
            try:
                os.unlink(armed)
            except FileNotFoundError:
                return
        os.kill(os.getpid(), action)

    return failpoint


def check_cache_dir(path: Any) -> None:
    """Fail at once, and clearly, when the cache directory cannot be written."""
    import tempfile

    from agent.errors import ConfigurationError

    try:
        path.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryFile(dir=path):
            pass
    except OSError as exc:
        raise ConfigurationError(
            f"--cache-dir {path}: the agent cannot write there ({exc.strerror or exc}): give "
            "it a writable directory (in its pod, an emptyDir volume)"
        ) from exc


def check_crds(kube: Any, kubeconfig: str | None) -> None:
    """Fail at once, and clearly, on a cluster that cannot be reached or lacks fleetlet's
    CRDs."""
    from agent.errors import ConfigurationError
    from agent.kube import ApiNotServedError, ApiUnavailableError, ForbiddenError, KubeApiError
    from agent.report.bundles import GROUP_VERSION, KIND

    where = f"kubeconfig {kubeconfig}" if kubeconfig else "the in-cluster configuration"
    try:
        kube.resource_for(GROUP_VERSION, KIND)
        # Discovery may come from the cache: one small request that needs the credentials
        # (a name that need not exist; every worker start makes it, so not a whole list).
        kube.get({"apiVersion": GROUP_VERSION, "kind": KIND, "metadata": {"name": "fleetlet"}})
    except ApiUnavailableError as exc:
        raise ApiUnavailableError(
            f"{exc}. Is the cluster of {where} up (and is it the right kubeconfig)?",
            target=exc.target,
            status=exc.status,
        ) from exc
    except ForbiddenError as exc:
        raise ConfigurationError(
            f"{kube.server}: the agent's identity may not read the fleetlet CRDs ({exc}): "
            "give it the agent's RBAC (deploy/agent/), or another kubeconfig"
        ) from exc
    except KubeApiError as exc:
        if exc.status == 401:
            raise ConfigurationError(
                f"{kube.server}: the API server refused the credentials of {where} ({exc}): "
                "a token or certificate that expired, or another cluster's?"
            ) from exc
        raise
    except ApiNotServedError as exc:
        raise ConfigurationError(
            f"{kube.server}: the fleetlet CRDs are not installed ({KIND} {GROUP_VERSION} is not "
            "served): apply crds/ first (kubectl apply --server-side -f crds/)"
        ) from exc


def outputs_stage(
    kube: Any, namespace: str, cluster: str, hub_key_file: Any, sealing_file: Any
) -> Any:
    from agent.report.outputs import OutputsStage
    from agent.report.seal import read_private_key, read_public_key

    hub_key = read_public_key(hub_key_file) if hub_key_file else None
    sealing_key = read_private_key(sealing_file, what="agent sealing key") if sealing_file else None
    return OutputsStage(
        kube=kube,
        agent_namespace=namespace,
        cluster=cluster,
        hub_key=hub_key,
        sealing_key=sealing_key,
    )


def log_confinement() -> None:
    """Say once, at start, whether renderers run confined (the metric
    ``fleetlet_agent_render_confinement`` says it too)."""
    import logging

    from agent.render.confine import support

    found = support()
    logger = logging.getLogger("agent.render")
    (logger.info if found.confined else logger.warning)("%s", found.describe())


def build_supervisor(settings: Any, *, log_level: str, log_format: str) -> Any:
    """The long-lived half of ``agent run`` (:class:`agent.runner.supervisor.Supervisor`): its
    branch watcher, status pusher, metrics, worker launcher and, when the kubeconfig's
    credentials allow it, the reader of its drift checks."""
    import logging

    from agent import __version__
    from agent.report.metrics import Metrics
    from agent.runner.launcher import WorkerLauncher
    from agent.runner.reader import ReaderUnsupported, open_reader
    from agent.runner.supervisor import Supervisor

    metrics = Metrics(cluster=settings.repo.cluster, version=__version__)
    log_confinement()
    credentials = git_credentials()
    try:
        reader = open_reader(settings.kubeconfig)
    except (ReaderUnsupported, OSError, ValueError) as exc:
        logging.getLogger("agent.runner").warning(
            "drift checks start a worker each time: the supervisor cannot read the cluster "
            "itself (%s)",
            exc,
        )
        reader = None
    if reader is not None:
        reader.on_request = metrics.api_requested
    return Supervisor(
        settings=settings,
        launcher=WorkerLauncher(
            workdir=settings.repo.cache_dir / "worker",
            timeout=settings.poll.worker_timeout,
            warm=settings.poll.warm_worker,
        ),
        watcher=branch_watcher(settings, credentials),
        metrics=metrics,
        pusher=status_pusher(settings, credentials, metrics) if settings.status else None,
        reader=reader,
        log_level=log_level,
        log_format=log_format,
    )
