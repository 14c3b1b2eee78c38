"""The signer of ``hub publish`` (and of ``hub rollout``) from its flags: the OIDC identity
token, the Sigstore trust config, and the agents' trust policy fleet.yaml implies. Called by
:mod:`hub.cli._publish` and :mod:`hub.rollout.command`.
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path
from typing import Any

from hub.cli._context import TOKEN_ENV, UsageError


def signer_from_args(args: argparse.Namespace) -> tuple[Any, Any]:
    """(PublicationSigner, ClientTrustConfig) from the flags ((None, None) with --no-sign).

    Raises UsageError or PublishError.
    """
    if args.no_sign:
        if args.identity_token or args.trust_config:
            raise UsageError("--no-sign cannot be combined with --identity-token/--trust-config")
        print(
            "fleetlet: WARNING: --no-sign publishes UNSIGNED sets; agents refuse them. "
            "Use it only for local experiments.",
            file=sys.stderr,
        )
        return None, None
    token = _identity_token(args.identity_token)
    from sigstore.models import ClientTrustConfig

    from hub.errors import PublishError
    from hub.publish.sign import PublicationSigner

    try:
        if args.trust_config:
            trust = ClientTrustConfig.from_json(Path(args.trust_config).read_text())
        else:
            trust = ClientTrustConfig.production()
    except OSError as exc:
        raise UsageError(f"--trust-config {args.trust_config}: {exc.strerror}") from exc
    except Exception as exc:  # sigstore/pydantic parse errors, TUF refresh failures
        raise PublishError(f"signing trust config: unusable: {exc}") from exc
    return PublicationSigner.from_trust_config(trust_config=trust, token=token), trust


def _identity_token(path: str | None) -> str:
    """The OIDC identity token to sign with: ``--identity-token FILE``, else
    ``$SIGSTORE_ID_TOKEN``, else the CI system's ambient credential, found the way
    sigstore-python finds it (``sigstore.oidc.detect_credential``: GitHub Actions with
    ``permissions: id-token: write``, GitLab CI, Google Cloud, Buildkite, CircleCI).

    The token is masked in every log line from then on. Raises UsageError when there is none
    or the CI system refused one.
    """
    from agent.report.logs import mask

    if path:
        try:
            token = Path(path).read_text().strip()
        except OSError as exc:
            raise UsageError(f"--identity-token {path}: {exc.strerror}") from exc
    else:
        token = os.environ.get(TOKEN_ENV, "").strip()
    if not token and not path:
        from sigstore.oidc import IdentityError, detect_credential

        try:
            token = (detect_credential() or "").strip()
        except IdentityError as exc:
            raise UsageError(f"ambient OIDC credential of this CI job: {exc}") from exc
    if not token:
        raise UsageError(
            f"no OIDC identity token: give --identity-token FILE, set {TOKEN_ENV}, or run in a "
            "CI job with an ambient OIDC credential (GitHub Actions: permissions: id-token: "
            "write); or --no-sign, UNSAFE, for local experiments"
        )
    mask(token)
    return token


def agents_trust_policy(fleet: Any, trust: Any) -> Any:
    """The agents' trust policy when fleet.yaml names the signing identity, else None."""
    settings = fleet.settings
    if trust is None or not settings.identity or not settings.issuer:
        return None
    from agent.verify import IdentityPolicy, TrustPolicy

    return TrustPolicy(
        trusted_root=trust.trusted_root,
        identity=IdentityPolicy(issuer=settings.issuer, subject=settings.identity),
    )
