"""RFC 6962 / RFC 9162 Merkle tree: tree heads, inclusion proofs, and their verification.

The hub builds one tree per publication over the clusters' leaves and hands each cluster its
inclusion proof; the agent verifies its own leaf against the signed root. Both sides use this
module, so there is one implementation of the hashing rules.

Hashing (RFC 9162 section 2.1.1): leaf hash = SHA-256(0x00 || leaf), interior node =
SHA-256(0x01 || left || right); a tree of n > 1 leaves splits at the largest power of two
smaller than n.
"""

from __future__ import annotations

import hashlib
import hmac
import json
from collections.abc import Sequence

import rfc8785

from agent.errors import InclusionProofError

HASH_SIZE = 32

_LEAF_PREFIX = b"\x00"
_NODE_PREFIX = b"\x01"
_MAX_SAFE_INTEGER = 2**53 - 1


def leaf_hash(leaf: bytes) -> bytes:
    """Return the RFC 6962 hash of one leaf's bytes."""
    return hashlib.sha256(_LEAF_PREFIX + leaf).digest()


def node_hash(left: bytes, right: bytes) -> bytes:
    """Return the RFC 6962 hash of an interior node from its two children's hashes."""
    return hashlib.sha256(_NODE_PREFIX + left + right).digest()


def publication_leaf(*, cluster: str, serial: int, set_digest: str) -> bytes:
    """Return the leaf bytes for one cluster's set: RFC 8785 JSON of (cluster, serial, digest).

    Canonical JSON makes the encoding unambiguous (no separator a cluster name could contain)
    and identical whatever produced it.
    """
    leaf: dict[str, str | int] = {"cluster": cluster, "serial": serial, "setDigest": set_digest}
    # For ASCII strings and safe integers json.dumps gives the RFC 8785 bytes, ~10x faster
    # (10,000 leaves per publish), except for DEL, which it escapes and RFC 8785 does not;
    # anything else goes through the general encoder.
    if (
        cluster.isascii()
        and set_digest.isascii()
        and "\x7f" not in cluster
        and "\x7f" not in set_digest
        and 0 <= serial <= _MAX_SAFE_INTEGER
    ):
        return json.dumps(leaf, sort_keys=True, separators=(",", ":")).encode()
    return rfc8785.dumps(leaf)


class MerkleTree:
    """A Merkle tree over a fixed list of leaves, with every level kept for proof generation.

    The levels are built bottom-up once (an odd node at the end of a level is carried up
    unchanged, which yields exactly the RFC 6962 split-at-power-of-two shape), so the root
    costs n - 1 node hashes and each inclusion proof is a lookup of at most log2(n) hashes.

    Raises ``ValueError`` for an empty list of leaves (RFC 6962 trees of size 0 have no leaf
    to prove, and a publication always has at least one cluster).
    """

    __slots__ = ("_levels",)

    def __init__(self, leaves: Sequence[bytes]) -> None:
        if not leaves:
            raise ValueError("a Merkle tree needs at least one leaf")
        level = [leaf_hash(leaf) for leaf in leaves]
        levels = [level]
        while len(level) > 1:
            nxt = [node_hash(level[i], level[i + 1]) for i in range(0, len(level) - 1, 2)]
            if len(level) % 2:
                nxt.append(level[-1])
            levels.append(nxt)
            level = nxt
        self._levels: list[list[bytes]] = levels

    @property
    def size(self) -> int:
        """The number of leaves."""
        return len(self._levels[0])

    @property
    def root(self) -> bytes:
        """The tree head (32 bytes)."""
        return self._levels[-1][0]

    def inclusion_proof(self, index: int) -> list[bytes]:
        """Return the audit path of leaf ``index``, from the leaf's sibling up to the root.

        Raises ``IndexError`` when ``index`` is not a leaf of this tree.
        """
        if not 0 <= index < self.size:
            raise IndexError(f"leaf index {index} out of range for a tree of {self.size}")
        proof: list[bytes] = []
        for level in self._levels[:-1]:
            sibling = index ^ 1
            # A missing right sibling means this node was carried up: no hash at this level.
            if sibling < len(level):
                proof.append(level[sibling])
            index >>= 1
        return proof


def root_from_inclusion_proof(
    *, leaf: bytes, index: int, tree_size: int, proof: Sequence[bytes]
) -> bytes:
    """Recompute the tree head from a leaf and its audit path (RFC 9162 section 2.1.3.2).

    Raises :class:`InclusionProofError` when the index, size or path length cannot belong to a
    tree of that size (the root comparison is left to the caller).
    """
    if tree_size < 1:
        raise InclusionProofError(f"tree size {tree_size} is not a positive number")
    if not 0 <= index < tree_size:
        raise InclusionProofError(f"leaf index {index} is outside a tree of size {tree_size}")
    fn, sn = index, tree_size - 1
    r = leaf_hash(leaf)
    for p in proof:
        if len(p) != HASH_SIZE:
            raise InclusionProofError(f"proof hash of {len(p)} bytes, expected {HASH_SIZE}")
        if sn == 0:
            raise InclusionProofError("inclusion proof is longer than the tree is deep")
        if fn & 1 or fn == sn:
            r = node_hash(p, r)
            # Skip the levels where this node was carried up without a sibling.
            while not fn & 1 and fn != 0:
                fn >>= 1
                sn >>= 1
        else:
            r = node_hash(r, p)
        fn >>= 1
        sn >>= 1
    if sn != 0:
        raise InclusionProofError("inclusion proof is shorter than the tree is deep")
    return r


def verify_inclusion(
    *, leaf: bytes, index: int, tree_size: int, proof: Sequence[bytes], root: bytes
) -> None:
    """Check that ``leaf`` is leaf ``index`` of the tree of ``tree_size`` whose head is ``root``.

    A path alone does not bind the tree size (leaf 0 of 3 and of 4 take the same turns):
    ``tree_size`` and ``root`` must both come from what was signed.

    Raises :class:`InclusionProofError` on any mismatch; returns nothing on success.
    """
    computed = root_from_inclusion_proof(leaf=leaf, index=index, tree_size=tree_size, proof=proof)
    if not hmac.compare_digest(computed, root):
        raise InclusionProofError(
            f"leaf {index} of a tree of size {tree_size} does not lead to the signed root "
            f"(computed {computed.hex()}, signed {root.hex()})"
        )
