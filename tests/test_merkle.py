"""The RFC 6962 Merkle tree shared by hub (proof generation) and agent (proof verification)."""

from __future__ import annotations

import hashlib

import pytest
import rfc8785
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from agent.errors import InclusionProofError
from agent.verify.merkle import MerkleTree, publication_leaf, verify_inclusion

# The reference leaves and roots of Certificate Transparency's own test suites (RFC 6962 /
# trillian), which also publish the audit paths of leaves 0 and 5 in the 8-leaf tree.
CT_LEAVES = [
    bytes.fromhex(h)
    for h in (
        "",
        "00",
        "10",
        "2021",
        "3031",
        "40414243",
        "5051525354555657",
        "606162636465666768696a6b6c6d6e6f",
    )
]
CT_ROOTS = [
    "6e340b9cffb37a989ca544e6bb780a2c78901d3fb33738768511a30617afa01d",
    "fac54203e7cc696cf0dfcb42c92a1d9dbaf70ad9e621f4bd8d98662f00e3c125",
    "aeb6bcfe274b70a14fb067a5e5578264db0fa9b51af5e0ba159158f329e06e77",
    "d37ee418976dd95753c1c73862b9398fa2a2cf9b4ff0fdfe8b30cd95209614b7",
    "4e3bbb1f7b478dcfe71fb631631519a3bca12c9aefca1612bfce4c13a86264d4",
    "76e67dadbcdf1e10e1b74ddc608abd2f98dfb16fbce75277b5232a127f2087ef",
    "ddb89be403809e325750d3d263cd78929c2942b7942a34b77e122c9594a74c8c",
    "5dc9da79a70659a9ad559cb701ded9a2ab9d823aad2f4960cfe370eff4604328",
]
CT_PATHS_IN_8 = {
    0: [
        "96a296d224f285c67bee93c30f8a309157f0daa35dc5b87e410b78630a09cfc7",
        "5f083f0a1a33ca076a95279832580db3e0ef4584bdff1f54c8a360f50de3031e",
        "6b47aaf29ee3c2af9af889bc1fb9254dabd31177f16232dd6aab035ca39bf6e4",
    ],
    5: [
        "bc1a0643b12e4d2d7c77918f44e0f4f79a838b6cf9ec5b5c283e1f4d88599e6b",
        "ca854ea128ed050b41b35ffc1b87b8eb2bde461e9e3b5596ece6b9d5975a0ae0",
        "d37ee418976dd95753c1c73862b9398fa2a2cf9b4ff0fdfe8b30cd95209614b7",
    ],
}

MAX_LEAVES = 2000
EDGE_SIZES = [1, 2, 3, 4, 5, 7, 8, 9, 15, 16, 17, 31, 32, 33, 63, 64, 65, 127, 128, 129]
EDGE_SIZES += [255, 256, 257, 511, 512, 513, 1023, 1024, 1025, 1999, MAX_LEAVES]

sizes = st.one_of(st.sampled_from(EDGE_SIZES), st.integers(min_value=1, max_value=MAX_LEAVES))
slow_ok = settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])


# --- an independent reference: RFC 6962 section 2.1's recursive definitions, verbatim -------


def _split(n: int) -> int:
    k = 1
    while k * 2 < n:
        k *= 2
    return k


def reference_root(leaves: list[bytes]) -> bytes:
    """MTH(D[n]) exactly as RFC 6962 section 2.1 defines it."""
    if len(leaves) == 1:
        return hashlib.sha256(b"\x00" + leaves[0]).digest()
    k = _split(len(leaves))
    return hashlib.sha256(
        b"\x01" + reference_root(leaves[:k]) + reference_root(leaves[k:])
    ).digest()


def reference_path(m: int, leaves: list[bytes]) -> list[bytes]:
    """PATH(m, D[n]) exactly as RFC 6962 section 2.1.1 defines it."""
    if len(leaves) == 1:
        return []
    k = _split(len(leaves))
    if m < k:
        return [*reference_path(m, leaves[:k]), reference_root(leaves[k:])]
    return [*reference_path(m - k, leaves[k:]), reference_root(leaves[:k])]


def make_leaves(n: int) -> list[bytes]:
    return [
        publication_leaf(cluster=f"cluster-{i:05d}", serial=i + 1, set_digest=f"sha256:{i:064x}")
        for i in range(n)
    ]


def flip(data: bytes, bit: int) -> bytes:
    bit %= len(data) * 8
    out = bytearray(data)
    out[bit // 8] ^= 1 << (bit % 8)
    return bytes(out)


# --- fixed vectors --------------------------------------------------------------------------


@pytest.mark.parametrize("size", range(1, 9))
def test_roots_match_the_certificate_transparency_vectors(size: int) -> None:
    assert MerkleTree(CT_LEAVES[:size]).root.hex() == CT_ROOTS[size - 1]


@pytest.mark.parametrize("index", sorted(CT_PATHS_IN_8))
def test_audit_paths_match_the_certificate_transparency_vectors(index: int) -> None:
    tree = MerkleTree(CT_LEAVES)
    path = tree.inclusion_proof(index)
    assert [h.hex() for h in path] == CT_PATHS_IN_8[index]
    verify_inclusion(
        leaf=CT_LEAVES[index], index=index, tree_size=8, proof=path, root=bytes.fromhex(CT_ROOTS[7])
    )


def test_publication_leaves_are_canonical_json() -> None:
    leaf = publication_leaf(cluster="edge-1", serial=7, set_digest="sha256:" + "ab" * 32)
    assert leaf == b'{"cluster":"edge-1","serial":7,"setDigest":"sha256:' + b"ab" * 32 + b'"}'


@given(
    cluster=st.text(max_size=40),
    serial=st.integers(min_value=0, max_value=2**53 - 1),
    digest=st.text(max_size=80),
)
@example(cluster="\x7f", serial=0, digest="")  # DEL: escaped by json.dumps, not by RFC 8785
def test_publication_leaves_are_rfc8785_for_any_text(
    cluster: str, serial: int, digest: str
) -> None:
    expected = {"cluster": cluster, "serial": serial, "setDigest": digest}
    try:
        canonical = rfc8785.dumps(expected)
    except rfc8785.CanonicalizationError:  # lone surrogates cannot be canonical JSON
        with pytest.raises(rfc8785.CanonicalizationError):
            publication_leaf(cluster=cluster, serial=serial, set_digest=digest)
        return
    assert publication_leaf(cluster=cluster, serial=serial, set_digest=digest) == canonical


def test_an_empty_tree_is_refused() -> None:
    with pytest.raises(ValueError, match="at least one leaf"):
        MerkleTree([])


def test_a_leaf_outside_the_tree_has_no_proof() -> None:
    tree = MerkleTree(make_leaves(3))
    with pytest.raises(IndexError):
        tree.inclusion_proof(3)


# --- properties -----------------------------------------------------------------------------


@slow_ok
@given(size=sizes)
def test_every_leaf_proof_verifies_and_matches_the_rfc_definitions(size: int) -> None:
    leaves = make_leaves(size)
    tree = MerkleTree(leaves)
    assert tree.size == size
    assert tree.root == reference_root(leaves)
    for index, leaf in enumerate(leaves):
        proof = tree.inclusion_proof(index)
        verify_inclusion(leaf=leaf, index=index, tree_size=size, proof=proof, root=tree.root)
        # The full RFC PATH is quadratic here: compare it on a sample of leaves only.
        if index % 97 == 0 or index == size - 1:
            assert proof == reference_path(index, leaves)


@st.composite
def tree_and_leaf(draw: st.DrawFn) -> tuple[list[bytes], MerkleTree, int]:
    size = draw(sizes)
    leaves = make_leaves(size)
    return leaves, MerkleTree(leaves), draw(st.integers(min_value=0, max_value=size - 1))


@slow_ok
@given(case=tree_and_leaf(), which=st.integers(min_value=0), bit=st.integers(min_value=0))
def test_any_flipped_bit_in_the_proof_is_rejected(
    case: tuple[list[bytes], MerkleTree, int], which: int, bit: int
) -> None:
    leaves, tree, index = case
    proof = tree.inclusion_proof(index)
    if not proof:  # a one-leaf tree has an empty proof: nothing to flip
        assert tree.size == 1
        return
    which %= len(proof)
    bad = [*proof[:which], flip(proof[which], bit), *proof[which + 1 :]]
    with pytest.raises(InclusionProofError):
        verify_inclusion(
            leaf=leaves[index], index=index, tree_size=tree.size, proof=bad, root=tree.root
        )


@slow_ok
@given(case=tree_and_leaf(), bit=st.integers(min_value=0))
def test_any_flipped_bit_in_the_root_is_rejected(
    case: tuple[list[bytes], MerkleTree, int], bit: int
) -> None:
    leaves, tree, index = case
    with pytest.raises(InclusionProofError):
        verify_inclusion(
            leaf=leaves[index],
            index=index,
            tree_size=tree.size,
            proof=tree.inclusion_proof(index),
            root=flip(tree.root, bit),
        )


@slow_ok
@given(case=tree_and_leaf(), bit=st.integers(min_value=0))
def test_any_flipped_bit_in_the_leaf_is_rejected(
    case: tuple[list[bytes], MerkleTree, int], bit: int
) -> None:
    leaves, tree, index = case
    with pytest.raises(InclusionProofError):
        verify_inclusion(
            leaf=flip(leaves[index], bit),
            index=index,
            tree_size=tree.size,
            proof=tree.inclusion_proof(index),
            root=tree.root,
        )


@slow_ok
@given(case=tree_and_leaf(), other=st.integers(min_value=0))
def test_a_proof_at_another_index_is_rejected(
    case: tuple[list[bytes], MerkleTree, int], other: int
) -> None:
    leaves, tree, index = case
    # A one-leaf tree can only be asked about an index outside it.
    wrong = 1 if tree.size == 1 else (index + 1 + other % (tree.size - 1)) % tree.size
    assert wrong != index
    with pytest.raises(InclusionProofError):
        verify_inclusion(
            leaf=leaves[index],
            index=wrong,
            tree_size=tree.size,
            proof=tree.inclusion_proof(index),
            root=tree.root,
        )
    # Nor does another leaf's proof prove this leaf at its own index.
    if tree.size > 1:
        with pytest.raises(InclusionProofError):
            verify_inclusion(
                leaf=leaves[index],
                index=index,
                tree_size=tree.size,
                proof=tree.inclusion_proof(wrong),
                root=tree.root,
            )


def path_length(m: int, n: int) -> int:
    """len(PATH(m, D[n])) from the RFC's recursion, without hashing anything."""
    if n == 1:
        return 0
    k = _split(n)
    return 1 + (path_length(m, k) if m < k else path_length(m - k, n - k))


@slow_ok
@given(case=tree_and_leaf(), delta=st.integers(min_value=1, max_value=MAX_LEAVES))
def test_a_wrong_tree_size_is_rejected(
    case: tuple[list[bytes], MerkleTree, int], delta: int
) -> None:
    """A size that puts the leaf outside the tree or needs another path length is refused.

    A path alone cannot bind the size: leaf 0 of 3 and leaf 0 of 4 take the same turns, so
    the size must come from what was signed (the publication statement checks that).
    """
    leaves, tree, index = case
    proof = tree.inclusion_proof(index)
    for wrong_size in {tree.size + delta, tree.size - delta}:
        if index < wrong_size and path_length(index, wrong_size) == len(proof):
            continue
        with pytest.raises(InclusionProofError):
            verify_inclusion(
                leaf=leaves[index], index=index, tree_size=wrong_size, proof=proof, root=tree.root
            )


@slow_ok
@given(case=tree_and_leaf())
def test_a_proof_with_a_hash_added_or_removed_is_rejected(
    case: tuple[list[bytes], MerkleTree, int],
) -> None:
    leaves, tree, index = case
    proof = tree.inclusion_proof(index)
    variants = [[*proof, tree.root], [tree.root, *proof]]
    if proof:
        variants += [proof[:-1], proof[1:]]
    for bad in variants:
        with pytest.raises(InclusionProofError):
            verify_inclusion(
                leaf=leaves[index], index=index, tree_size=tree.size, proof=bad, root=tree.root
            )


def test_a_proof_hash_of_the_wrong_length_is_rejected() -> None:
    leaves = make_leaves(4)
    tree = MerkleTree(leaves)
    proof = tree.inclusion_proof(1)
    with pytest.raises(InclusionProofError, match="33 bytes"):
        verify_inclusion(
            leaf=leaves[1],
            index=1,
            tree_size=4,
            proof=[proof[0] + b"\x00", proof[1]],
            root=tree.root,
        )


def test_ten_thousand_leaves_and_all_their_proofs() -> None:
    """The hub's size: one tree of 10,000 clusters, every proof generated and checked."""
    leaves = make_leaves(10_000)
    tree = MerkleTree(leaves)
    for index in range(tree.size):
        proof = tree.inclusion_proof(index)
        assert len(proof) <= 14
        verify_inclusion(
            leaf=leaves[index], index=index, tree_size=10_000, proof=proof, root=tree.root
        )
