"""``fleetlet agent run`` as two processes: a small supervisor and a worker per job.

The supervisor (:mod:`agent.runner.supervisor`) lives as long as the pod. It polls the
cluster's branch (one ``ls-refs``), pushes the status document (heartbeats), serves the
probes and ``/metrics``, and checks for drift by comparing the resourceVersions of the objects
the accepted set owns (metadata-only LISTs, :mod:`agent.runner.fingerprint`). It imports
neither sigstore, oras, helm's callers nor the ``kubernetes`` package, so it idles small.

When there is work (the branch moved, something in the cluster changed, a retry is due), it
starts a worker (:mod:`agent.runner.worker`, ``python -m agent.runner.worker REQUEST``): a
process that builds the whole agent, runs one job (``tick``: poll, verify, fetch, render,
apply, health; ``drift``: the outbound pass alone) exactly as ``fleetlet agent sync --once``
would, writes its result (:mod:`agent.runner.protocol`) and exits, returning its memory.

Crash safety does not depend on the split: everything a move needs to finish or roll back
is in the cluster (the intent, the revision store), so a worker killed at any point is
resumed by the next one. A worker that dies or hangs (:mod:`agent.runner.launcher` kills it
after ``--worker-timeout``) is retried with the scheduler's backoff and reported: in the
metrics, in the status document, and as reason ``WorkerFailed`` on the BundleDeployments
(written by the next worker before it does anything else). A worker dies with its
supervisor (``PR_SET_PDEATHSIG``), so a killed supervisor never leaves a move running behind
the next one; on SIGTERM the supervisor stops its worker itself and exits at once (a stop it
asked for, not reported as a failure).
"""
