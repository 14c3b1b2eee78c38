"""The SOPS file format, read: a YAML or JSON document whose values are encrypted one by one,
with a ``sops`` block saying how to open them. Called by :mod:`agent.secrets.tree` for each
such file of a bundle's tree, and by the tests against files the real ``sops`` wrote.

What SOPS (v3, ``github.com/getsops/sops/v3``) writes, and what is checked here, in order:

1. the ``sops`` block: ``age`` stanzas (one per recipient: ``recipient`` and ``enc``, an
   ASCII-armored age file holding the 32-byte data key), ``lastmodified``, ``mac`` and the rules
   that said which keys were encrypted (``encrypted_regex``, ``unencrypted_suffix``...). Other
   key kinds (KMS, PGP, Vault) may be listed beside ``age``; only age opens a file here. Shamir
   key groups and comment-driven rules are refused (PyYAML does not keep comments);
2. the data key: the first ``age`` stanza one of the cluster's identities opens. A file none
   of them opens is refused naming its recipients and the cluster's (``NotARecipient``), or,
   when the cluster is listed, as a wrong key (``WrongKey``);
3. every leaf: the values the rules say are encrypted are ``ENC[AES256_GCM,data:..,iv:..,
   tag:..,type:..]``, AES-256-GCM with the data key, the value's path (mapping keys joined by
   ``:``, with a trailing ``:``; list items add nothing) as additional data, and a type
   (``str``, ``int``, ``float``, ``bool``, ``bytes``, ``time``);
4. the MAC: SHA-512 over every leaf's plaintext bytes in document order (only the encrypted
   ones with ``mac_only_encrypted``), upper-case hex, compared with the ``mac`` value (itself
   encrypted with the ``lastmodified`` time as additional data). A mismatch is refused
   (``MacMismatch``): a value changed, added, removed or moved since sops wrote the file.

Nothing here writes plaintext anywhere; it returns the opened document to the caller.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import hmac
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from decimal import Decimal
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import pyrage
# pyrage and cryptography (about 7 MB) are imported where a file is opened: agent run's
# supervisor imports this module (through agent.reconcile's settings) and decrypts nothing.

from agent.source.content import ContentRefusedError

_ENC = re.compile(r"^ENC\[AES256_GCM,data:(.+),iv:(.+),tag:(.+),type:(.+)\]")
# sops.go: a MAC computed over the encrypted values only starts from these bytes.
_MAC_ONLY_ENCRYPTED_INIT = bytes.fromhex(
    "8a3fd2ad54ce66527b1034f3d147be0b0b975b3bf44f72c6fdadec8176f27d69"
)
_ARMOR_BEGIN = "-----BEGIN AGE ENCRYPTED FILE-----"
_ARMOR_END = "-----END AGE ENCRYPTED FILE-----"
_UNSUPPORTED = {
    "key_groups": "Shamir key groups",
    "shamir_threshold": "Shamir key groups",
    "encrypted_comment_regex": "comment-driven encryption (encrypted_comment_regex)",
    "unencrypted_comment_regex": "comment-driven encryption (unencrypted_comment_regex)",
}


class SopsError(ContentRefusedError):
    """A SOPS file of a bundle could not be opened; ``rule`` says why (``NotARecipient``,
    ``WrongKey``, ``MacMismatch``, ``BadValue``, ``SopsFormat``). The message names the bundle
    and the file, never a value."""

    reason = "SecretNotDecrypted"


@dataclass(frozen=True)
class Opened:
    """A SOPS document opened: the document without its ``sops`` block, and how many values
    were encrypted in it."""

    document: Any
    values: int


def is_sops_document(document: object) -> bool:
    """Whether ``document`` is a mapping carrying a SOPS metadata block (``sops`` with a
    ``mac`` and a ``version``)."""
    if not isinstance(document, Mapping):
        return False
    meta = document.get("sops")
    return isinstance(meta, Mapping) and "mac" in meta and "version" in meta


def recipients_of(document: Mapping[str, Any]) -> list[str]:
    """The age recipients a SOPS document is encrypted to, in file order."""
    stanzas = document.get("sops", {}).get("age") or []
    return [str(s.get("recipient", "")) for s in stanzas if isinstance(s, Mapping)]


def count_encrypted(document: object) -> int:
    """How many values of ``document`` are encrypted (``ENC[...]`` strings), its ``sops``
    block left out: what a cluster holding a key would decrypt."""
    if isinstance(document, Mapping):
        return sum(count_encrypted(v) for k, v in document.items() if k != "sops")
    if isinstance(document, list):
        return sum(count_encrypted(v) for v in document)
    return 1 if isinstance(document, str) and _ENC.match(document) else 0


def open_document(
    document: Mapping[str, Any],
    identities: Sequence[pyrage.x25519.Identity],
    *,
    recipients: Iterable[str],
    source: str,
    file: str,
) -> Opened:
    """Decrypt every encrypted value of a SOPS ``document`` with the data key one of
    ``identities`` opens (``recipients``: their public keys, named in the refusal), verify the
    MAC, and return the document without its ``sops`` block.

    Raises SopsError naming ``source`` and ``file`` (never a value).
    """

    def refuse(message: str, rule: str) -> SopsError:
        return SopsError(message, source=source, file=file, rule=rule)

    meta = document.get("sops")
    if not isinstance(meta, Mapping):
        raise refuse("no sops metadata block", "SopsFormat")
    for name, what in _UNSUPPORTED.items():
        if meta.get(name):
            raise refuse(f"{what} are not supported: encrypt to age recipients", "SopsFormat")
    key = _data_key(meta, identities, recipients=list(recipients), refuse=refuse)
    rules = _Rules.of(meta, refuse)
    digest = hashlib.sha512()
    if rules.mac_only_encrypted:
        digest.update(_MAC_ONLY_ENCRYPTED_INIT)
    count = [0]

    def leaf(value: Any, path: list[str]) -> Any:
        encrypted = rules.encrypted(path)
        if encrypted:
            if not isinstance(value, str):
                raise refuse(
                    f"{_path(path)}: expected an encrypted value, found a {type(value).__name__}",
                    "BadValue",
                )
            if value:
                value = _decrypt_value(value, key, aad=":".join(path) + ":", refuse=refuse)
                count[0] += 1
                if isinstance(value, _Comment):
                    return value
        if not rules.mac_only_encrypted or encrypted:
            digest.update(_to_bytes(value))
        return value

    def walk(value: Any, path: list[str]) -> Any:
        if isinstance(value, Mapping):
            return {k: walk(v, [*path, str(k)]) for k, v in value.items()}
        if isinstance(value, list):
            items = [walk(v, path) for v in value]
            return [v for v in items if not isinstance(v, _Comment)]
        if value is None:
            return None
        return leaf(value, path)

    body = walk({k: v for k, v in document.items() if k != "sops"}, [])
    stored = meta.get("mac")
    if not isinstance(stored, str) or not stored:
        raise refuse("the sops block has no MAC", "MacMismatch")
    expected = _decrypt_value(stored, key, aad=_last_modified(meta, refuse), refuse=refuse)
    computed = digest.hexdigest().upper()
    if not isinstance(expected, str) or not hmac.compare_digest(expected, computed):
        raise refuse(
            "MAC mismatch: the file was changed after sops encrypted it (re-encrypt it with "
            "sops; fleetlet never applies a file whose MAC does not verify)",
            "MacMismatch",
        )
    return Opened(document=body, values=count[0])


# --- the data key ---------------------------------------------------------------------------


def _data_key(
    meta: Mapping[str, Any],
    identities: Sequence[pyrage.x25519.Identity],
    *,
    recipients: list[str],
    refuse: Any,
) -> bytes:
    stanzas = [s for s in meta.get("age") or [] if isinstance(s, Mapping)]
    listed = [str(s.get("recipient", "")) for s in stanzas]
    mine = [s for s in stanzas if s.get("recipient") in recipients]
    if not mine:
        theirs = ", ".join(listed) or "no age recipient"
        raise refuse(
            f"not encrypted to this cluster: the file's age recipients are {theirs}; this "
            f"cluster's is {', '.join(recipients) or '(no key)'} (add it to the file's "
            "recipients, e.g. `sops updatekeys` after adding it to .sops.yaml)",
            "NotARecipient",
        )
    import pyrage

    for stanza in mine:
        try:
            wrapped = _dearmor(str(stanza.get("enc", "")))
            key = pyrage.decrypt(wrapped, list(identities))
        except (ValueError, pyrage.DecryptError):
            continue
        if len(key) == 32:
            return bytes(key)
    raise refuse(
        f"the age stanza for {mine[0].get('recipient')} does not open with this cluster's key "
        "(a wrong or corrupt stanza)",
        "WrongKey",
    )


def _dearmor(text: str) -> bytes:
    """The bytes of an ASCII-armored age file. Raises ValueError."""
    lines = [line.strip() for line in text.strip().splitlines()]
    if len(lines) < 2 or lines[0] != _ARMOR_BEGIN or lines[-1] != _ARMOR_END:
        raise ValueError("not an armored age file")
    try:
        return base64.b64decode("".join(lines[1:-1]), validate=True)
    except binascii.Error as exc:
        raise ValueError(str(exc)) from exc


# --- values ---------------------------------------------------------------------------------


class _Comment(str):
    """A decrypted comment (sops encrypts comments in lists as items): not a value."""


def _decrypt_value(text: str, key: bytes, *, aad: str, refuse: Any) -> Any:
    from cryptography.exceptions import InvalidTag
    from cryptography.hazmat.primitives.ciphers.aead import AESGCM

    match = _ENC.match(text)
    if match is None:
        raise refuse("a value is not in sops' ENC[AES256_GCM,...] form", "BadValue")
    try:
        data, iv, tag = (base64.b64decode(match.group(i), validate=True) for i in (1, 2, 3))
        plain = AESGCM(key).decrypt(iv, data + tag, aad.encode())
    except (binascii.Error, ValueError, InvalidTag) as exc:
        where = aad.rstrip(":") or "(MAC)"
        raise refuse(
            f"{where}: the value does not decrypt (changed, or moved from another path): "
            f"{type(exc).__name__}",
            "MacMismatch",
        ) from None
    kind = match.group(4)
    try:
        match kind:
            case "str" | "time":
                return plain.decode()
            case "int":
                return int(plain)
            case "float":
                return float(plain)
            case "bool":
                return _parse_bool(plain.decode())
            case "bytes":
                return plain.decode()
            case "comment":
                return _Comment(plain.decode())
    except ValueError:
        pass
    raise refuse(f"{aad.rstrip(':')}: a value of type {kind!r} that sops cannot have", "BadValue")


def _parse_bool(text: str) -> bool:
    # Go's strconv.ParseBool.
    if text in ("1", "t", "T", "TRUE", "true", "True"):
        return True
    if text in ("0", "f", "F", "FALSE", "false", "False"):
        return False
    raise ValueError(text)


def _to_bytes(value: Any) -> bytes:
    """sops' ``ToBytes``: what the MAC hashes for a value."""
    if isinstance(value, bool):
        return b"True" if value else b"False"
    if isinstance(value, int):
        return str(value).encode()
    if isinstance(value, float):
        # Go's FormatFloat(v, 'f', -1, 64): the shortest digits, never an exponent.
        return format(Decimal(repr(value)).normalize(), "f").encode()
    if isinstance(value, datetime):
        return _go_time(value).encode()
    return str(value).encode()


def _go_time(value: datetime) -> str:
    text = value.isoformat()
    return text.replace("+00:00", "Z") if value.utcoffset() is not None else text


def _last_modified(meta: Mapping[str, Any], refuse: Any) -> str:
    """``lastmodified`` as Go's RFC 3339 (seconds, ``Z`` in UTC): the MAC's additional data."""
    value = meta.get("lastmodified")
    try:
        if isinstance(value, datetime):
            moment = value
        else:
            moment = datetime.fromisoformat(str(value).replace("Z", "+00:00"))
    except ValueError:
        raise refuse("the sops block's lastmodified is not a time", "SopsFormat") from None
    if moment.tzinfo is None:
        moment = moment.replace(tzinfo=UTC)
    moment = moment.replace(microsecond=0)
    if moment.utcoffset() == UTC.utcoffset(None):
        return moment.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
    return moment.isoformat()


def _path(path: list[str]) -> str:
    return ".".join(path) or "(root)"


@dataclass(frozen=True)
class _Rules:
    """Which values the file's rules say are encrypted (sops' ``shouldBeEncrypted``)."""

    unencrypted_suffix: str
    encrypted_suffix: str
    unencrypted_regex: re.Pattern[str] | None
    encrypted_regex: re.Pattern[str] | None
    mac_only_encrypted: bool

    @classmethod
    def of(cls, meta: Mapping[str, Any], refuse: Any) -> _Rules:
        def pattern(name: str) -> re.Pattern[str] | None:
            text = meta.get(name)
            if not text:
                return None
            try:
                return re.compile(str(text))
            except re.error as exc:
                raise refuse(f"{name} is not a regular expression: {exc}", "SopsFormat") from None

        rules = cls(
            unencrypted_suffix=str(meta.get("unencrypted_suffix") or ""),
            encrypted_suffix=str(meta.get("encrypted_suffix") or ""),
            unencrypted_regex=pattern("unencrypted_regex"),
            encrypted_regex=pattern("encrypted_regex"),
            mac_only_encrypted=bool(meta.get("mac_only_encrypted")),
        )
        return rules

    def encrypted(self, path: list[str]) -> bool:
        encrypted = True
        if self.unencrypted_suffix and any(p.endswith(self.unencrypted_suffix) for p in path):
            encrypted = False
        if self.encrypted_suffix:
            encrypted = any(p.endswith(self.encrypted_suffix) for p in path)
        if self.unencrypted_regex is not None and any(
            self.unencrypted_regex.search(p) for p in path
        ):
            encrypted = False
        if self.encrypted_regex is not None:
            encrypted = any(self.encrypted_regex.search(p) for p in path)
        return encrypted


__all__ = [
    "Opened",
    "SopsError",
    "count_encrypted",
    "is_sops_document",
    "open_document",
    "recipients_of",
]
