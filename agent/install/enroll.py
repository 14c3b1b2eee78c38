"""``fleetlet agent install --enroll HUB_URL --token-file T``: the cluster asks the hub to join.

Read top to bottom::

    name ─► key ─► facts ─► submit ─► wait (pending) ─► open ─► install config

- name: ``--cluster``, else derived from the cluster itself (``c-`` and the first 12 hex
  digits of the ``kube-system`` namespace's UID: stable across re-runs, unique per cluster);
- key: an Ed25519 key pair made for this enrollment, its private part written only to the
  Secret ``fleetlet-enrollment`` of the agent's namespace (re-running the command reuses it,
  so an interrupted wait for manual acceptance resumes); it is never sent nor written to disk;
- facts: what the agent reports anyway (Kubernetes version, served API group versions, the
  formats this fleetlet renders);
- submit: ``POST /api/v1/enroll`` with the token, the name, the claimed labels, the facts, the
  public key, a nonce and the time, signed with the key (:func:`signed_request`): the hub
  refuses a request edited in flight or replayed, and refuses with a reason (expired, revoked,
  exhausted, out of scope, name taken) or answers pending or accepted;
- open: the hub's answer carries the repositories, the signer identity and the trusted root,
  and the cluster's git credentials sealed to the key (its X25519 form): only this cluster
  opens them.
"""

from __future__ import annotations

import base64
import json
import secrets
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Callable
from typing import Any

import nacl.exceptions
import nacl.public
import nacl.signing

from agent.errors import PermanentError, TemporaryError
from agent.install.manifests import Credentials, InstallConfig, namespace_objects
from agent.kube import KubeClient, ObjectRef

ENROLL_SECRET = "fleetlet-enrollment"
API = "/api/v1"
KEY_KIND = "ed25519"
SIGNATURE_HEADER = "Fleetlet-Signature"
SIGNED_CONTEXT = b"fleetlet-enroll-v1\n"
"""What a request's signature covers: this, the method and path, a newline, the body's bytes."""


class EnrollmentError(PermanentError):
    """The hub refused the enrollment, or its answer cannot be used."""


class HubUnreachableError(TemporaryError):
    """The hub did not answer (connection refused, timeout, 5xx)."""


def parse_labels(text: str | None) -> dict[str, str]:
    """``--labels k=v,k2=v2``. Raises EnrollmentError naming the bad pair (the hub checks
    keys and values)."""
    found: dict[str, str] = {}
    for pair in (text or "").split(","):
        if pair.strip():
            key, sep, value = pair.strip().partition("=")
            if not sep or not key:
                raise EnrollmentError(f"--labels: {pair.strip()!r} is not key=value")
            found[key] = value
    return found


def derived_name(kube: KubeClient) -> str:
    """``c-`` and 12 hex digits of the ``kube-system`` namespace's UID."""
    found = kube.get(ObjectRef("v1", "Namespace", "kube-system"))
    uid = str((found or {}).get("metadata", {}).get("uid") or "")
    digits = uid.replace("-", "").lower()
    if len(digits) < 12:
        raise EnrollmentError(
            "cannot derive the cluster's name (no kube-system UID): give --cluster"
        )
    return f"c-{digits[:12]}"


def cluster_facts(kube: KubeClient) -> dict[str, Any]:
    """The Kubernetes version, the served API group versions (``v1``, ``apps/v1``...) and the
    formats this fleetlet renders (built in and installed plugins: the agent image carries the
    same release)."""
    from agent.render.formats import available_formats

    versions = [v for v in kube.api_versions() if not v.split("/")[-1][:1].isupper()]
    return {
        "kubernetesVersion": kube.server_version(),
        "apiGroupVersions": versions,
        "formats": available_formats(),
    }


def cluster_key(kube: KubeClient, namespace: str, cluster: str) -> nacl.signing.SigningKey:
    """This cluster's enrollment key: the one in Secret ``fleetlet-enrollment`` when it was
    made for ``cluster``, else a new one stored there first."""
    from agent.install.installer import install

    ref = ObjectRef("v1", "Secret", ENROLL_SECRET, namespace)
    found = kube.get(ref)
    data = {k: base64.b64decode(v).decode() for k, v in ((found or {}).get("data") or {}).items()}
    if data.get("cluster") == cluster and data.get("kind") == KEY_KIND:
        return nacl.signing.SigningKey(base64.b64decode(data["private-key"]))
    key = nacl.signing.SigningKey.generate()
    secret = {
        "apiVersion": "v1",
        "kind": "Secret",
        "metadata": {"name": ENROLL_SECRET, "namespace": namespace},
        "type": "Opaque",
        "stringData": {
            "cluster": cluster,
            "kind": KEY_KIND,
            "private-key": base64.b64encode(bytes(key)).decode(),
            "public-key": base64.b64encode(bytes(key.verify_key)).decode(),
        },
    }
    install(kube, [*namespace_objects(namespace), secret])
    return key


def signed_request(
    key: nacl.signing.SigningKey,
    *,
    cluster: str,
    labels: dict[str, str],
    facts: dict[str, Any],
    now: float | None = None,
) -> tuple[bytes, str]:
    """The body of ``POST /api/v1/enroll`` and its signature (the ``Fleetlet-Signature``
    header): the key's public part, a fresh nonce and the time are in the body, and the
    signature covers the body's exact bytes, so the hub refuses it edited or replayed."""
    issued = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(time.time() if now is None else now))
    body = json.dumps(
        {
            "cluster": cluster,
            "labels": labels,
            "facts": facts,
            "publicKey": base64.b64encode(bytes(key.verify_key)).decode(),
            "nonce": secrets.token_hex(16),
            "issuedAt": issued,
        }
    ).encode()
    return body, signature(key, "POST", API + "/enroll", body)


def signature(key: nacl.signing.SigningKey, method: str, path: str, body: bytes) -> str:
    """Base64 of the Ed25519 signature of :data:`SIGNED_CONTEXT`, ``METHOD PATH``, the body."""
    message = SIGNED_CONTEXT + f"{method} {path}\n".encode() + body
    return base64.b64encode(key.sign(message).signature).decode()


def call(
    hub: str, token: str, method: str, path: str, body: bytes | None = None, signed: str = ""
) -> dict[str, Any]:
    """One request to the hub's enrollment API. Raises EnrollmentError (4xx, with the hub's
    reason), HubUnreachableError."""
    headers = {
        "Authorization": f"Bearer {token}",
        "Content-Type": "application/json",
        "Accept": "application/json",
    }
    if signed:
        headers[SIGNATURE_HEADER] = signed
    request = urllib.request.Request(
        hub.rstrip("/") + API + path, data=body, method=method, headers=headers
    )
    try:
        with urllib.request.urlopen(request, timeout=60) as response:
            answer: dict[str, Any] = json.loads(response.read())
            return answer
    except urllib.error.HTTPError as exc:
        try:
            reason = json.loads(exc.read()).get("error") or exc.reason
        except ValueError:
            reason = exc.reason
        if exc.code >= 500:
            raise HubUnreachableError(f"hub {hub}: {exc.code} {reason}") from None
        raise EnrollmentError(f"hub {hub} refused the enrollment: {reason}") from None
    except (urllib.error.URLError, OSError, ValueError) as exc:
        raise HubUnreachableError(f"hub {hub} did not answer: {exc}") from None


def enroll(
    kube: KubeClient,
    *,
    hub: str,
    token: str,
    image: str,
    namespace: str,
    cluster: str | None,
    labels: dict[str, str],
    wait: float,
    report: Callable[[str], None],
    **settings: Any,
) -> InstallConfig:
    """Enroll this cluster; the installation the hub's answer describes.

    Raises EnrollmentError (refused, denied, not accepted within ``wait`` seconds),
    HubUnreachableError.
    """
    name = cluster or derived_name(kube)
    key = cluster_key(kube, namespace, name)
    body, signed = signed_request(key, cluster=name, labels=labels, facts=cluster_facts(kube))
    try:
        answer = call(hub, token, "POST", "/enroll", body, signed)
    except EnrollmentError as exc:
        if "already pending" not in str(exc):
            raise
        # Our own earlier request (same key, kept in the cluster): wait for its decision.
        answer = call(hub, token, "GET", f"/enroll/{urllib.parse.quote(name)}")
    deadline = time.monotonic() + wait
    if answer["state"] == "pending":
        report(
            f"cluster {name}: enrollment pending; waiting for `fleetlet hub clusters accept {name}`"
        )
    while answer["state"] == "pending":
        if time.monotonic() >= deadline:
            raise EnrollmentError(
                f"cluster {name}: still pending after {wait:.0f}s; run the same command again "
                "to keep waiting (the request and its key are kept)"
            )
        time.sleep(min(2.0, max(0.1, deadline - time.monotonic())))
        answer = call(hub, token, "GET", f"/enroll/{urllib.parse.quote(name)}")
    if answer["state"] == "denied":
        why = f": {answer['reason']}" if answer.get("reason") else ""
        raise EnrollmentError(
            f"cluster {name}: enrollment denied by {answer.get('decidedBy')}{why}"
        )
    return _config(answer, key, image=image, namespace=namespace, cluster=name, **settings)


def open_sealed(key: nacl.signing.SigningKey, sealed: str) -> Any:
    """The JSON the hub sealed to this key's X25519 form. Raises CryptoError, ValueError."""
    box = nacl.public.SealedBox(key.to_curve25519_private_key())
    return json.loads(box.decrypt(base64.b64decode(sealed)))


def _config(answer: dict[str, Any], key: nacl.signing.SigningKey, **settings: Any) -> InstallConfig:
    try:
        issued = open_sealed(key, answer["sealedCredentials"])
        config = answer["config"]
    except (KeyError, ValueError, TypeError, nacl.exceptions.CryptoError) as exc:
        raise EnrollmentError(
            f"the hub's acceptance cannot be opened with this cluster's key: {exc}"
        ) from None

    def credentials(raw: Any) -> Credentials | None:
        if not isinstance(raw, dict):
            return None
        keys = ("username", "password", "token", "ssh_private_key", "known_hosts")
        return Credentials(**{k: str(raw[k]) for k in keys if raw.get(k)})

    return InstallConfig(
        repo=config["repo"],
        status_repo=config["statusRepo"],
        identity=config["identity"],
        issuer=config["issuer"],
        trusted_root=config["trustedRoot"],
        hub_public_key=config.get("hubPublicKey"),
        git=credentials(issued.get("git")),
        status_git=credentials(issued.get("statusGit")),
        **settings,
    )
