"""Signed fleet commits: the policy saying who may sign the fleet commit being published, and
its verification: SSH signatures, as git's ``gpg.format=ssh`` writes them (``signers``), and
gitsign's Sigstore keyless signatures (``identities``, verified in :mod:`hub.fleet.gitsign`).

Where the policy comes from matters more than what it says: the fleet repo's own copy
(``fleet.yaml: commitSigning``) is written by whoever pushes the commit, so an attacker who
can push can also add their key to it. The policy that decides is the hub's **trusted copy**
(``hub publish --commit-policy FILE``, part of the hub's deployment like its signing
identity; the agents' trusted root follows the same rule). The fleet repo's copy must be
identical, so the policy is reviewed with the fleet and a change shows in both places; a
change lands only when the hub's operator puts it in the hub's configuration too.

The signature's own header says which kind it is; a kind the policy does not list is refused
(an SSH signature when the policy names only gitsign identities, and the reverse). SSH
verification is git's, step by step, each failing closed with a reason the refusal names:

1. the fleet directory is a clean checkout of a commit (an edited tree is not signed);
2. the commit carries a signature, and an SSH one (``-----BEGIN SSH SIGNATURE-----``);
3. ``ssh-keygen -Y check-novalidate -n git``: the signature is good over the commit's bytes,
   made by the key it names (its fingerprint is read from the answer);
4. that key is one of the policy's signers, valid at the commit's committer time (as git
   passes ``-Overify-time``: the time is the signer's own claim, so a compromised key is
   removed from the policy, not left to expire);
5. ``ssh-keygen -Y verify`` with an allowed-signers file built from the policy, the signer's
   principal and the ``git`` namespace: exactly what ``git verify-commit`` runs.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import json
import re
import shutil
import subprocess
import tempfile
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import yaml

from agent.api.yamlio import SAFE_LOADER
from agent.errors import FieldProblem
from agent.verify.sources import (
    KeylessIdentity,
    ReadFile,
    file_reader,
    parse_identities,
    parse_trusted_root,
)
from hub.fleet.gitsign import GITSIGN_SIGNATURE, GitsignRefusal, verify_gitsign

SSH_SIGNATURE = b"-----BEGIN SSH SIGNATURE-----"
NAMESPACE = "git"
_KEY_TYPES = (
    "ssh-ed25519",
    "ssh-rsa",
    "ecdsa-sha2-nistp256",
    "ecdsa-sha2-nistp384",
    "ecdsa-sha2-nistp521",
    "sk-ssh-ed25519@openssh.com",
    "sk-ecdsa-sha2-nistp256@openssh.com",
)
# A principal goes into the allowed-signers file: no whitespace, quotes or commas there.
_PRINCIPAL = re.compile(r"^[A-Za-z0-9._@+-]{1,253}$")
_TIME = re.compile(r"^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ$")
_FINGERPRINT = re.compile(r"key (SHA256:[A-Za-z0-9+/]{43})")
_TIMEOUT = 30


@dataclass(frozen=True, slots=True)
class AllowedSigner:
    """One entry of the policy: who (``principal``), with which public key, and when."""

    principal: str
    key: str
    """``<type> <base64>``, as in an ``.pub`` file (without its comment)."""
    valid_after: datetime | None = None
    valid_before: datetime | None = None

    @property
    def fingerprint(self) -> str:
        """``SHA256:...``, as ``ssh-keygen -l`` prints it."""
        blob = base64.b64decode(self.key.split()[1])
        return "SHA256:" + base64.b64encode(hashlib.sha256(blob).digest()).decode().rstrip("=")

    def valid_at(self, moment: datetime) -> bool:
        if self.valid_after is not None and moment < self.valid_after:
            return False
        return self.valid_before is None or moment < self.valid_before

    def window(self) -> str:
        after = _text(self.valid_after) if self.valid_after else "any time"
        before = _text(self.valid_before) if self.valid_before else "no end"
        return f"valid from {after} until {before}"

    def line(self) -> str:
        """The signer's line of an allowed-signers file (``ssh-keygen(1)``)."""
        options = [f'namespaces="{NAMESPACE}"']
        if self.valid_after is not None:
            options.append(f'valid-after="{self.valid_after.strftime("%Y%m%d%H%M%SZ")}"')
        if self.valid_before is not None:
            options.append(f'valid-before="{self.valid_before.strftime("%Y%m%d%H%M%SZ")}"')
        return f"{self.principal} {','.join(options)} {self.key}"

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {"principal": self.principal, "key": self.key}
        if self.valid_after is not None:
            out["validAfter"] = _text(self.valid_after)
        if self.valid_before is not None:
            out["validBefore"] = _text(self.valid_before)
        return out


@dataclass(frozen=True, slots=True)
class CommitPolicy:
    """``commitSigning``: the fleet commit being published is signed by one of ``signers``
    (SSH keys) or of ``identities`` (gitsign, keyless, checked against ``trusted_root``)."""

    signers: tuple[AllowedSigner, ...]
    identities: tuple[KeylessIdentity, ...] = ()
    trusted_root: bytes | None = None
    """The ``trusted_root.json`` bytes for ``identities`` (None: the public-good root)."""

    def digest(self) -> str:
        """``sha256:`` of the policy's canonical JSON: the same signers give the same digest,
        whatever their order or the YAML's layout."""
        doc: dict[str, Any] = {
            "signers": sorted((s.to_dict() for s in self.signers), key=lambda d: json.dumps(d))
        }
        if self.identities:
            doc["identities"] = sorted(
                json.dumps(i.to_dict(), sort_keys=True) for i in self.identities
            )
            doc["trustedRoot"] = (
                "sha256:" + hashlib.sha256(self.trusted_root).hexdigest()
                if self.trusted_root is not None
                else "public-good"
            )
        data = json.dumps(doc, sort_keys=True, separators=(",", ":"))
        return "sha256:" + hashlib.sha256(data.encode()).hexdigest()

    def wanted(self) -> str:
        """What the policy asks, in one line."""
        kinds = []
        if self.signers:
            names = ", ".join(f"{s.principal} ({s.fingerprint})" for s in self.signers)
            kinds.append(f"an SSH signature by one of: {names}")
        if self.identities:
            names = ", ".join(i.describe() for i in self.identities)
            root = "its trusted root" if self.trusted_root is not None else "public-good Sigstore"
            kinds.append(f"a gitsign (keyless) signature by one of: {names}, under {root}")
        return f"{' or '.join(kinds)} (policy {self.digest()[:19]})"

    def allowed_signers(self) -> str:
        return "".join(s.line() + "\n" for s in self.signers)


_POLICY_FIELDS = ("signers", "identities", "trustedRoot")


def parse_commit_policy(
    raw: Any, where: str, problems: list[FieldProblem], read: ReadFile | None = None
) -> CommitPolicy | None:
    """``raw`` (``{signers: [{principal, key, validAfter?, validBefore?}], identities:
    [{issuer|issuerRegExp, subject|subjectRegExp}], trustedRoot?}``, at least one kind) as a
    policy; each problem is added to ``problems`` with its path under ``where`` ("": top
    level). ``read`` reads ``trustedRoot`` (None: a policy cannot name one)."""
    start = len(problems)
    prefix = f"{where}." if where else ""
    if not isinstance(raw, dict):
        problems.append(
            FieldProblem(
                path=where or "(document)",
                expected="a mapping with signers and/or identities",
                found=_brief(raw),
            )
        )
        return None
    for key in sorted(set(raw) - set(_POLICY_FIELDS), key=str):
        problems.append(
            FieldProblem(path=f"{prefix}{key}", expected=", ".join(_POLICY_FIELDS), found="unknown")
        )
    keyless = raw.get("identities") is not None
    identities = parse_identities(raw.get("identities"), f"{prefix}identities", problems)
    root: bytes | None = None
    if "trustedRoot" in raw:
        at = f"{prefix}trustedRoot"
        if read is None:
            problems.append(FieldProblem(path=at, expected="no trustedRoot here", found="set"))
        else:
            root = parse_trusted_root(raw["trustedRoot"], at, read, problems)
        if not keyless:
            problems.append(
                FieldProblem(
                    path=at,
                    expected="identities beside it (SSH keys need no root)",
                    found="no identities",
                )
            )
    entries = raw.get("signers")
    signers: list[AllowedSigner] = []
    if entries is not None or not keyless:
        if not isinstance(entries, list) or not entries:
            problems.append(
                FieldProblem(
                    path=f"{prefix}signers",
                    expected="a non-empty list of {principal, key, validAfter?, validBefore?} "
                    "(or gitsign identities)",
                    found=_brief(entries),
                )
            )
        else:
            signers = _signers(entries, prefix, problems)
    if len(problems) > start:
        return None
    return CommitPolicy(signers=tuple(signers), identities=identities, trusted_root=root)


def _signers(entries: list[Any], prefix: str, problems: list[FieldProblem]) -> list[AllowedSigner]:
    signers: list[AllowedSigner] = []
    for i, entry in enumerate(entries):
        start = len(problems)
        at = f"{prefix}signers[{i}]"
        if not isinstance(entry, dict):
            problems.append(FieldProblem(path=at, expected="a mapping", found=_brief(entry)))
            continue
        allowed = {"principal", "key", "validAfter", "validBefore"}
        for key in sorted(set(entry) - allowed, key=str):
            problems.append(
                FieldProblem(
                    path=f"{at}.{key}", expected=", ".join(sorted(allowed)), found="unknown"
                )
            )
        principal = entry.get("principal")
        if not isinstance(principal, str) or not _PRINCIPAL.match(principal):
            problems.append(
                FieldProblem(
                    path=f"{at}.principal",
                    expected="an identity such as alice@example.com (letters, digits, ._@+-)",
                    found=_brief(principal),
                )
            )
        key = _public_key(entry.get("key"))
        if key is None:
            problems.append(
                FieldProblem(
                    path=f"{at}.key",
                    expected="an SSH public key (ssh-ed25519 AAAA..., as in a .pub file)",
                    found=_brief(entry.get("key")),
                )
            )
        times: dict[str, datetime | None] = {}
        for name in ("validAfter", "validBefore"):
            value = entry.get(name)
            times[name] = None
            if value is None:
                continue
            if isinstance(value, datetime):  # YAML reads an unquoted timestamp as one
                value = _text(value if value.tzinfo else value.replace(tzinfo=UTC))
            if not isinstance(value, str) or not _TIME.match(value):
                problems.append(
                    FieldProblem(
                        path=f"{at}.{name}",
                        expected="a UTC time YYYY-MM-DDTHH:MM:SSZ",
                        found=_brief(value),
                    )
                )
                continue
            times[name] = datetime.strptime(value, "%Y-%m-%dT%H:%M:%SZ").replace(tzinfo=UTC)
        after, before = times["validAfter"], times["validBefore"]
        if after is not None and before is not None and before <= after:
            problems.append(
                FieldProblem(
                    path=f"{at}.validBefore", expected="later than validAfter", found=_text(before)
                )
            )
        if len(problems) == start and isinstance(principal, str) and key is not None:
            signers.append(AllowedSigner(principal, key, after, before))
    return signers


def _public_key(value: Any) -> str | None:
    if not isinstance(value, str):
        return None
    parts = value.split()
    if len(parts) < 2 or parts[0] not in _KEY_TYPES:
        return None
    try:
        blob = base64.b64decode(parts[1], validate=True)
    except (binascii.Error, ValueError):
        return None
    # The blob starts with its own type name (RFC 4253 string): a key pasted whole.
    name = parts[0].encode()
    if blob[:4] != len(name).to_bytes(4, "big") or blob[4 : 4 + len(name)] != name:
        return None
    return f"{parts[0]} {parts[1]}"


# --- verification ---------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class CommitVerdict:
    """What the hub found about the fleet commit: signed as the policy wants, or why not."""

    commit: str
    ok: bool
    signer: str | None
    """The principal whose key made the signature, or gitsign's certificate subject (only
    when ``ok``)."""
    key: str | None
    """The signing key's fingerprint, when the signature named one and was good (gitsign:
    the certificate's)."""
    reason: str
    """``ok``: who signed; else what is wrong, in one sentence."""
    policy: str
    wanted: str
    format: str = "ssh"
    """``ssh`` or ``gitsign``: the kind of signature that was verified."""
    issuer: str | None = None
    """gitsign: the OIDC issuer in the signing certificate."""

    def signed_by(self) -> str:
        if self.ok and self.format == "gitsign":
            return f"{self.signer} from {self.issuer} (gitsign, certificate {self.key})"
        if self.ok:
            return f"{self.signer} ({self.key})"
        return f"key {self.key}" if self.key else "unsigned"

    def refusal(self) -> str:
        """The one-line refusal: the commit, who signed, what the policy wanted."""
        return (
            f"fleet commit {self.commit} is not signed as the commit policy requires: "
            f"{self.reason}; the policy wants {self.wanted}"
        )


def verify_commit(
    repo_dir: Path, commit: str, policy: CommitPolicy, *, committed: bool = True
) -> CommitVerdict:
    """Check ``commit`` of the git repository holding ``repo_dir`` against ``policy`` (the
    numbered steps of the module docstring, or :mod:`hub.fleet.gitsign`'s). Never raises for
    a commit that fails: the verdict says why."""
    import pygit2  # here: loading a fleet (which parses the policy) reads no commit

    def refused(reason: str, key: str | None = None) -> CommitVerdict:
        return CommitVerdict(commit, False, None, key, reason, policy.digest(), policy.wanted())

    if not committed:
        return refused("the fleet directory has uncommitted changes (only a commit can be signed)")
    try:
        found = pygit2.discover_repository(str(repo_dir))
        if found is None:
            return refused("the fleet directory is not in a git repository")
        repo = pygit2.Repository(found)
        obj = repo.get(commit)
        if not isinstance(obj, pygit2.Commit):
            return refused("no such commit in the fleet repository")
        signature, payload = obj.gpg_signature
        moment = datetime.fromtimestamp(obj.commit_time, UTC)
    except (pygit2.GitError, ValueError, KeyError) as exc:
        return refused(f"the fleet repository cannot be read ({exc})")
    if not signature:
        return refused("unsigned")
    if signature.lstrip().startswith(GITSIGN_SIGNATURE):
        if not policy.identities:
            return refused("signed with gitsign (keyless), but the policy names only SSH signers")
        try:
            who = verify_gitsign(signature, payload, policy.identities, policy.trusted_root)
        except GitsignRefusal as exc:
            return refused(str(exc))
        return CommitVerdict(
            commit,
            True,
            who.identity,
            who.certificate,
            f"signed with gitsign by {who.identity} from {who.issuer} (log index {who.log_index})",
            policy.digest(),
            policy.wanted(),
            format="gitsign",
            issuer=who.issuer,
        )
    if not signature.lstrip().startswith(SSH_SIGNATURE):
        return refused(
            "signed, but neither with an SSH signature (gpg.format=ssh) nor by gitsign "
            "(OpenPGP signatures are not verified)"
        )
    if not policy.signers:
        return refused("signed with an SSH key, but the policy names only gitsign identities")
    return _verify_ssh(commit, signature, payload, moment, policy, refused)


def _verify_ssh(
    commit: str,
    signature: bytes,
    payload: bytes,
    moment: datetime,
    policy: CommitPolicy,
    refused: Callable[..., CommitVerdict],
) -> CommitVerdict:
    tool = shutil.which("ssh-keygen")
    if tool is None:
        return refused("ssh-keygen (openssh-client) is not installed on the hub")
    with tempfile.TemporaryDirectory(prefix="fleetlet-commit-") as tmp:
        sig_file = Path(tmp) / "signature"
        sig_file.write_bytes(signature)
        checked = _run(
            [tool, "-Y", "check-novalidate", "-n", NAMESPACE, "-s", str(sig_file)], payload
        )
        match = _FINGERPRINT.search(checked.stdout + checked.stderr)
        if checked.returncode != 0 or match is None:
            return refused("the signature does not verify over the commit (a bad signature)")
        fingerprint = match.group(1)
        known = [s for s in policy.signers if s.fingerprint == fingerprint]
        if not known:
            return refused(f"signed by key {fingerprint}, which is not in the policy", fingerprint)
        valid = [s for s in known if s.valid_at(moment)]
        if not valid:
            windows = "; ".join(f"{s.principal}: {s.window()}" for s in known)
            return refused(
                f"signed by {known[0].principal} ({fingerprint}) at {_text(moment)}, outside "
                f"the key's validity ({windows})",
                fingerprint,
            )
        allowed = Path(tmp) / "allowed_signers"
        allowed.write_text(policy.allowed_signers())
        principal = valid[0].principal
        verified = _run(
            [
                tool,
                "-Y",
                "verify",
                "-f",
                str(allowed),
                "-I",
                principal,
                "-n",
                NAMESPACE,
                "-s",
                str(sig_file),
                f"-Overify-time={moment.strftime('%Y%m%d%H%M%SZ')}",
            ],
            payload,
        )
        if verified.returncode != 0:
            said = (verified.stderr or verified.stdout).strip().splitlines()
            return refused(
                f"ssh-keygen -Y verify refused the signature of {principal} ({fingerprint}): "
                f"{said[-1] if said else 'no reason given'}",
                fingerprint,
            )
    return CommitVerdict(
        commit,
        True,
        principal,
        fingerprint,
        f"signed by {principal} ({fingerprint})",
        policy.digest(),
        policy.wanted(),
    )


def _run(argv: Sequence[str], stdin: bytes) -> subprocess.CompletedProcess[str]:
    try:
        done = subprocess.run(argv, input=stdin, capture_output=True, timeout=_TIMEOUT, check=False)
    except (OSError, subprocess.TimeoutExpired) as exc:
        return subprocess.CompletedProcess(argv, 255, "", f"ssh-keygen failed: {exc}")
    return subprocess.CompletedProcess(
        argv,
        done.returncode,
        done.stdout.decode(errors="replace"),
        done.stderr.decode(errors="replace"),
    )


def _text(moment: datetime) -> str:
    return moment.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def _brief(value: Any) -> str:
    text = "missing" if value is None else repr(value)
    return text if len(text) <= 80 else text[:77] + "..."


# --- the fleet's commit, judged ---------------------------------------------------------------


def load_commit_policy(path: Path) -> CommitPolicy:
    """The hub's trusted policy file (YAML: ``signers: [...]``, as ``fleet.yaml:
    commitSigning``). Raises FleetRepoError naming the file and every problem."""
    from hub.errors import FleetRepoError

    where = str(path)
    try:
        raw = yaml.load(path.read_bytes(), Loader=SAFE_LOADER)
    except OSError as exc:
        problem = FieldProblem(path=where, expected="a readable file", found=str(exc.strerror))
        raise FleetRepoError([problem]) from exc
    except yaml.YAMLError as exc:
        problem = FieldProblem(path=where, expected="valid YAML", found=str(exc).splitlines()[0])
        raise FleetRepoError([problem]) from exc
    problems: list[FieldProblem] = []
    policy = parse_commit_policy(raw, "", problems, file_reader(path.parent))
    if policy is None:
        raise FleetRepoError(problems, origin=where)
    return policy


def judge_commit(
    *,
    root: Path,
    commit: str,
    committed: bool,
    declared: CommitPolicy | None,
    trusted: CommitPolicy | None,
) -> CommitVerdict | None:
    """The verdict on the fleet commit, or None when no policy asks for signed commits.

    ``declared``: ``fleet.yaml: commitSigning`` (at the commit itself: readable, not
    trustworthy); ``trusted``: the hub's own copy, which decides. They must agree.
    """
    if trusted is None and declared is None:
        return None
    if trusted is None:
        assert declared is not None
        return CommitVerdict(
            commit,
            False,
            None,
            None,
            "fleet.yaml asks for signed commits (commitSigning) but the hub has no trusted "
            "copy of the policy to check them with (--commit-policy FILE); the copy in the "
            "commit itself cannot vouch for the commit",
            declared.digest(),
            declared.wanted(),
        )
    if declared is None or declared.digest() != trusted.digest():
        found = f"policy {declared.digest()[:19]}" if declared else "no commitSigning"
        return CommitVerdict(
            commit,
            False,
            None,
            None,
            f"fleet.yaml has {found}, the hub's trusted policy is {trusted.digest()[:19]}: "
            "a policy change must be made in both (the hub's --commit-policy decides)",
            trusted.digest(),
            trusted.wanted(),
        )
    return verify_commit(root, commit, trusted, committed=committed)
