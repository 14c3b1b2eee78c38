"""The encrypted Secret every demo run adds once the stores' agents have reported their age keys:
a small Secret (``payments/payments-db``, a random password) encrypted with the real ``sops``
binary to the stores' recipients (``fleetlet hub recipients``), committed to the fleet copy,
pushed as the content of the bundle ``payments-db`` and published again; each store's agent
decrypts it at render (docs/secrets.md). The plaintext stays in ``<workdir>/operator/``,
outside every git repository. Without sops the demo says so and skips this step only. Called by
:func:`fleetlet.demo.command.steps`.
"""

from __future__ import annotations

import base64
import os
import secrets
import shutil
import subprocess
from pathlib import Path
from typing import TYPE_CHECKING

import yaml

from fleetlet.demo.examples import REPOSITORY_PREFIX
from fleetlet.demo.realenv import DemoError, say

if TYPE_CHECKING:
    from fleetlet.demo.environment import Demo

SECRET_BUNDLE = "payments-db"  # the bundle of the encrypted Secret, added by the demo
SECRET_NAMESPACE = "payments"
SOPS_VERSION = "v3.13.3"  # the release the tests encrypt with (tests/realenv/binaries.py)


def _find_sops() -> Path | None:
    """The sops binary: on PATH, else the pinned release in the tools cache (where
    scripts/install.sh builds it, beside helm and kustomize), else None."""
    from agent.render.tools import default_cache_root

    on_path = shutil.which("sops")
    if on_path is not None:
        return Path(on_path)
    cached = default_cache_root() / "tools" / f"sops-{SOPS_VERSION}" / "sops"
    return cached if cached.is_file() and os.access(cached, os.X_OK) else None


def encrypted_secret(demo: Demo) -> str | None:
    """Encrypt a Secret to the stores' age recipients with sops, commit it to the fleet
    copy, push it as ``payments-db``'s content, publish and wait until every store has it.

    Returns the line the summary prints, or None when sops is missing (said in one line).
    """
    sops = _find_sops()
    if sops is None:
        say(
            f"sops is not installed (not on PATH, not in the cache): skipping the encrypted "
            f"Secret (`python3 -m tests.realenv.binaries sops` builds {SOPS_VERSION})"
        )
        return None
    status_repo = demo.git.url_for("fleet-status.git")
    listed: list[str] = []

    def reported() -> str | None:
        try:
            out = demo.fleetlet("hub", "recipients", str(demo.fleet),
                                 "--status-repo", status_repo)  # fmt: skip
        except DemoError as exc:
            return str(exc).splitlines()[-1]
        listed[:] = [out.strip()]
        return None

    demo.wait_for(reported, "every store's age key (fleetlet hub recipients)")
    recipients = listed[0]
    # The operator's side: the Secret in clear, in a directory of no git repository.
    operator = demo.directory("operator")
    operator.chmod(0o700)
    password = "pdb-" + secrets.token_urlsafe(18)
    plain = operator / f"{SECRET_BUNDLE}.yaml"
    plain.touch(mode=0o600)
    plain.write_text(
        yaml.safe_dump(
            {
                "apiVersion": "v1",
                "kind": "Secret",
                "metadata": {"name": SECRET_BUNDLE, "namespace": SECRET_NAMESPACE},
                "type": "Opaque",
                "stringData": {"username": "payments", "password": password},
            },
            sort_keys=False,
        )
    )
    done = subprocess.run(
        [str(sops), "--encrypt", "--age", recipients,
         "--encrypted-regex", "^(data|stringData)$", plain.name],
        cwd=operator, capture_output=True, text=True, timeout=120,
        env={k: v for k, v in os.environ.items() if not k.startswith("SOPS_")},
    )  # fmt: skip
    if done.returncode != 0:
        raise DemoError(f"sops --encrypt: {done.stderr.strip()}")
    if password in done.stdout:
        raise DemoError("sops --encrypt left the password in clear")
    content = demo.fleet / "secrets" / SECRET_BUNDLE
    content.mkdir(parents=True, exist_ok=True)
    (content / "01_secret.yaml").write_text(done.stdout)
    pushed = demo.env.oci.push_bundle(
        demo.env.oci.OciClient(host=demo.registry.host),
        REPOSITORY_PREFIX + SECRET_BUNDLE, content, tag="v1",
    )  # fmt: skip
    bundle = {
        "name": SECRET_BUNDLE,
        "sources": [
            {
                "kind": "image",
                "uri": f"{demo.registry.host}/{REPOSITORY_PREFIX}{SECRET_BUNDLE}",
                "digest": pushed.digest,
            }
        ],
        "formatOptions": {"targetNamespace": SECRET_NAMESPACE},
        "dependsOn": ["payments-config"],  # its namespace
        "targets": [{"clusterSelector": {}}],
    }
    (demo.fleet / "bundles" / f"{SECRET_BUNDLE}.yaml").write_text(
        "# The database password of the payment gateway: secrets/payments-db/01_secret.yaml,\n"
        "# encrypted with sops to every store's age key (fleet-examples/README.md).\n"
        + yaml.safe_dump(bundle, sort_keys=False)
    )
    demo.commit("payments-db: a Secret encrypted with sops to the stores' age keys")
    say(
        f"encrypted Secret {SECRET_NAMESPACE}/{SECRET_BUNDLE} with {sops} to "
        f"{len(recipients.split(','))} age recipients; committed and pushed, publishing"
    )
    demo.publish()
    demo.expected = demo.expected_states()
    demo.wait_for(demo.all_ready, f"every store to decrypt and apply {SECRET_BUNDLE}")
    for name, cluster in demo.clusters.items():
        encoded = demo.kubectl_out(
            cluster, "-n", SECRET_NAMESPACE, "get", "secret", SECRET_BUNDLE,
            "-o", "jsonpath={.data.password}",
        )  # fmt: skip
        if base64.b64decode(encoded).decode(errors="replace") != password:
            raise DemoError(f"{name}: Secret {SECRET_NAMESPACE}/{SECRET_BUNDLE} not decrypted")
    return (
        f"\nSecret {SECRET_NAMESPACE}/{SECRET_BUNDLE}: encrypted with sops to the stores' "
        f"age keys (only the ciphertext is in git), decrypted by each store's agent: in "
        f"{', '.join(demo.clusters)}. In clear only in {plain}"
    )
