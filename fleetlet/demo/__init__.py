"""``fleetlet demo``: a whole fleet on this machine, on embedded defaults.

Three Kubernetes clusters (kube-apiserver, etcd, controller-manager, scheduler and kwok, as the
tests run them), a git server, an OCI registry and a local Sigstore, all on loopback; the
bundles of ``fleet-examples/`` pushed to the registry; the fleet published by the hub, signed;
one agent per cluster and the hub with its dashboard. It waits until every installation is
Ready, prints a summary and the dashboard's address, and keeps running until Ctrl-C, which
stops everything it started. ``--scenario failed-upgrade`` then gives the canary store a broken
upgrade of the ``shop`` group (and every store a good upgrade of ``payments-config``) and
waits for the canary's group to roll back while the others move on. ``--scenario approval``
makes ``payments-config`` need an approval and upgrades it: the production stores' own
ApprovalPolicy approves it automatically, the canary waits for a person, and the demo shows the
request's preview and approves it as that person (docs/approvals.md). ``--scenario rollout``
gives ``payments-config`` and the ``shop`` group rollout strategies (the canary store first):
payments-config v2 reaches the canary, is promoted to the production stores and completes; a
broken shop-backend v2 reaches the canary only, and the hub halts its rollout and publishes the
previous version back there (docs/rollouts.md).

Once the stores' agents have reported their age keys, the demo encrypts a small Secret
(``payments/payments-db``, a random password) with the real ``sops`` binary to the stores'
recipients (``fleetlet hub recipients``), commits the encrypted file to its fleet copy, pushes it
as the content of the bundle ``payments-db`` and publishes again: each store's agent decrypts it
at render (docs/secrets.md, fleet-examples/README.md). The plaintext stays in
``<workdir>/operator/``, outside every git repository. Without sops the demo says so and skips
that step only.

The demo runs from a source checkout: the components live in ``tests/realenv`` (test code, not
shipped in the wheels). ``python -m fleetlet.demo pin [--check]`` recomputes the digests the
example fleet pins from ``fleet-examples/content``.

The rooms: :mod:`~fleetlet.demo.command` (the command and its steps),
:mod:`~fleetlet.demo.environment` (the clusters, servers, hub and agents, and what the steps act
with), :mod:`~fleetlet.demo.secret` (the encrypted Secret), :mod:`~fleetlet.demo.scenarios` (one
module per ``--scenario``, and their registry), :mod:`~fleetlet.demo.examples` (the example
fleet and its pins) and :mod:`~fleetlet.demo.realenv` (the components of ``tests/realenv``).
Called by ``fleetlet.cli`` (``fleetlet demo``), ``bench/e2e_latency.py`` and the tests. This
package re-exports only the example fleet's names: ``fleetlet.cli`` reads the scenarios' names
when it starts, and the environment's imports wait until a demo runs.
"""

from __future__ import annotations

from fleetlet.demo.examples import (
    CANARY,
    CONTENT,
    CRDS,
    EXAMPLES,
    OPERATOR,
    PINNED_HOST,
    REGISTRY_PORT,
    REPO_ROOT,
    REPOSITORY_PREFIX,
    bundle_files,
    content_digest,
    main,
    pin,
)
from fleetlet.demo.realenv import DemoError

__all__ = [
    "CANARY",
    "CONTENT",
    "CRDS",
    "EXAMPLES",
    "OPERATOR",
    "PINNED_HOST",
    "REGISTRY_PORT",
    "REPOSITORY_PREFIX",
    "REPO_ROOT",
    "DemoError",
    "bundle_files",
    "content_digest",
    "main",
    "pin",
]
