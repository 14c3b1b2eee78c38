"""Inputs for fuzzing: real seeds mutated byte-wise (flips, insertions of tokens that parsers
trip on, deletions, truncations, splices of two seeds), and plain random bytes; plus the guard
that runs one input: only fleetlet's own errors may come out, within a memory bound."""

from __future__ import annotations

import contextlib
import copy
import json
import os
import tracemalloc
from collections.abc import Callable, Sequence
from datetime import timedelta
from pathlib import Path
from typing import Any

import yaml
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st

from agent.errors import FleetletError

CORPUS = Path(__file__).parent / "corpus"
REPO_ROOT = Path(__file__).resolve().parents[2]

EXAMPLES = int(os.environ.get("FLEETLET_FUZZ_EXAMPLES", "300"))
"""Examples per parser: a few hundred in CI (seconds each); set more by hand for a long run."""
MAX_INPUT = 64 * 1024
MEMORY_BOUND = 64 * 1024 * 1024
"""Bytes one input may make a parser allocate at its peak (inputs are at most 64 KiB)."""

RANDOM = os.environ.get("FLEETLET_FUZZ_RANDOM") == "1"
"""Explore new inputs each run (by hand, with more examples); CI runs the same inputs every
time, so that a red run is a change's doing and reproducible."""

FUZZ = settings(
    max_examples=EXAMPLES,
    derandomize=not RANDOM,
    # A hang guard, not a speed claim: a parser that takes this long on a 64 KiB input loops.
    deadline=timedelta(seconds=10),
    database=None,
    suppress_health_check=[
        HealthCheck.too_slow,
        HealthCheck.data_too_large,
        HealthCheck.function_scoped_fixture,
    ],
)

TOKENS: tuple[bytes, ...] = (
    b"\x00", b"\xff", b"\xef\xbb\xbf", b"\xc3\x28", b"\n", b"\r\n", b"\t", b" ",
    b"&a ", b"*a", b"<<: *a\n", b"!!python/object/apply:os.system ['true']", b"!!binary ",
    b"%YAML 1.1\n", b"---\n", b"...\n", b"? ", b": ", b"- ", b"|\n", b">-\n",
    b"[[[[[[[[[[[[[[[[", b"{{{{{{{{{{{{{{{{", b"]]]]", b"}}}}",
    b'"', b"'", b"\\", b"\\u0000", b"\\ud800", b"NaN", b"Infinity", b"-0.0", b"1e309",
    b"99999999999999999999999999", b"-1", b"0x7f", b"true", b"null", b"[]", b"{}",
    b"../", b"/etc/passwd", b"%2e%2e/", b"\xe2\x80\xae",
    b"0000", b"0001", b"0002", b"ffff", b"fff0", b"0004", b"ERR ", b"version 2\n",
    b"sha256:", b"1970-01-01T00:00:00Z", b"9999-12-31T23:59:59Z",
)  # fmt: skip


@st.composite
def mutated(draw: st.DrawFn, seeds: Sequence[bytes]) -> bytes:
    """One seed, edited a few times (see the module docstring)."""
    data = bytearray(draw(st.sampled_from(list(seeds))))
    for _ in range(draw(st.integers(min_value=0, max_value=6))):
        op = draw(st.sampled_from(("flip", "token", "delete", "truncate", "splice", "repeat")))
        at = draw(st.integers(min_value=0, max_value=len(data)))
        if op == "flip" and data:
            at = min(at, len(data) - 1)
            data[at] = draw(st.integers(min_value=0, max_value=255))
        elif op == "token":
            data[at:at] = draw(st.sampled_from(TOKENS))
        elif op == "delete":
            data[at : at + draw(st.integers(min_value=1, max_value=64))] = b""
        elif op == "truncate":
            del data[at:]
        elif op == "splice":
            other = draw(st.sampled_from(list(seeds)))
            start = draw(st.integers(min_value=0, max_value=len(other)))
            data[at:at] = other[start : start + draw(st.integers(min_value=1, max_value=256))]
        elif op == "repeat":
            piece = bytes(data[at : at + draw(st.integers(min_value=1, max_value=32))])
            data[at:at] = piece * draw(st.integers(min_value=1, max_value=64))
    return bytes(data[:MAX_INPUT])


def inputs(seeds: Sequence[bytes]) -> st.SearchStrategy[bytes]:
    """Mostly mutated seeds (they get past the first checks), some raw random bytes."""
    return st.one_of(mutated(seeds), mutated(seeds), mutated(seeds), st.binary(max_size=2048))


def seeds_in(*paths: Path, pattern: str = "*") -> list[bytes]:
    """The bytes of every file matching ``pattern`` under ``paths`` (sorted, for stable runs)."""
    found: list[bytes] = []
    for path in paths:
        files = [path] if path.is_file() else sorted(p for p in path.rglob(pattern) if p.is_file())
        found.extend(p.read_bytes() for p in files)
    assert found, f"no seeds in {paths}"
    return found


class Tally:
    """What one fuzz test saw: examples run and which errors (by type) they ended with."""

    def __init__(self) -> None:
        self.examples = 0
        self.errors: dict[str, int] = {}

    def note(self, error: BaseException | None) -> None:
        self.examples += 1
        name = "accepted" if error is None else type(error).__name__
        self.errors[name] = self.errors.get(name, 0) + 1


def survives(
    call: Callable[[], object],
    *,
    allowed: tuple[type[BaseException], ...] = (FleetletError,),
    tally: Tally | None = None,
) -> None:
    """Run one input: it may be accepted or refused with one of ``allowed`` (fleetlet's own
    errors); anything else escapes and fails the test. Its peak allocation must stay under
    :data:`MEMORY_BOUND`."""
    started = not tracemalloc.is_tracing()
    if started:
        tracemalloc.start()
    tracemalloc.reset_peak()
    base = tracemalloc.get_traced_memory()[0]
    error: BaseException | None = None
    try:
        call()
    except allowed as exc:
        error = exc
    finally:
        peak = tracemalloc.get_traced_memory()[1] - base
        if started:
            tracemalloc.stop()
    if tally is not None:
        tally.note(error)
    assert peak < MEMORY_BOUND, f"one input made the parser allocate {peak} bytes"


# --- structure-aware: documents mutated field by field ----------------------------------------

_ODD_TEXT = st.sampled_from(
    ["", "\x00", "a" * 5000, "1970-01-01T00:00:00Z", "9999-12-31T23:59:59Z", "sha256:" + "0" * 64,
     "../../etc/passwd", "-1", "1e400", "null", "ſ", "\u202e", "${x}", "{{ .Values }}", " "]
)  # fmt: skip
ODD_VALUES: st.SearchStrategy[Any] = st.recursive(
    st.one_of(
        st.none(),
        st.booleans(),
        st.integers(min_value=-(2**70), max_value=2**70),
        st.floats(allow_nan=True, allow_infinity=True),
        st.text(max_size=40),
        _ODD_TEXT,
    ),
    lambda inner: st.one_of(
        st.lists(inner, max_size=3), st.dictionaries(st.text(max_size=8), inner, max_size=3)
    ),
    max_leaves=8,
)


def _paths(doc: Any, prefix: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
    """Every path to a value inside ``doc`` (dict keys and list indexes), the root included."""
    found = [prefix]
    if isinstance(doc, dict):
        for key, value in doc.items():
            found.extend(_paths(value, (*prefix, key)))
    elif isinstance(doc, list):
        for index, value in enumerate(doc):
            found.extend(_paths(value, (*prefix, index)))
    return found


@st.composite
def _edited(draw: st.DrawFn, seeds: Sequence[Any]) -> Any:
    doc = copy.deepcopy(draw(st.sampled_from(list(seeds))))
    for _ in range(draw(st.integers(min_value=1, max_value=4))):
        path = draw(st.sampled_from(_paths(doc)))
        if not path:
            continue
        parent = doc
        for step in path[:-1]:
            parent = parent[step]
        last = path[-1]
        op = draw(st.sampled_from(("replace", "replace", "delete", "add", "wrap")))
        if op == "replace":
            parent[last] = draw(ODD_VALUES)
        elif op == "delete":
            del parent[last]
        elif op == "wrap":
            parent[last] = [parent[last]] if draw(st.booleans()) else {"x": parent[last]}
        elif isinstance(parent, dict):
            parent[draw(st.text(max_size=12))] = draw(ODD_VALUES)
        else:
            parent.insert(last, draw(ODD_VALUES))
    return doc


def structured(
    seeds: Sequence[bytes], *, loads: Callable[[bytes], Any], dumps: Callable[[Any], bytes]
) -> st.SearchStrategy[bytes]:
    """Seeds parsed, edited field by field (odd types and values, keys removed or added,
    values wrapped), written again: inputs that get past the syntax to the checks."""
    documents = []
    for seed in seeds:
        with contextlib.suppress(Exception):
            documents.append(loads(seed))
    assert documents, "no seed parses"

    def dump(doc: Any) -> bytes:
        try:
            return dumps(doc)
        except (ValueError, TypeError, OverflowError):
            return b""

    return _edited(documents).map(dump)


def json_inputs(seeds: Sequence[bytes]) -> st.SearchStrategy[bytes]:
    """Byte-wise and field-wise mutations of JSON seeds."""
    return st.one_of(
        inputs(seeds),
        structured(seeds, loads=json.loads, dumps=lambda d: json.dumps(d).encode()),
        structured(seeds, loads=json.loads, dumps=lambda d: json.dumps(d).encode()),
    )


def yaml_inputs(seeds: Sequence[bytes]) -> st.SearchStrategy[bytes]:
    """Byte-wise and field-wise mutations of (multi-document) YAML seeds."""

    def loads(data: bytes) -> Any:
        return list(yaml.safe_load_all(data))

    def dumps(docs: Any) -> bytes:
        if isinstance(docs, list):
            return yaml.safe_dump_all(docs, allow_unicode=True).encode()
        return yaml.safe_dump(docs, allow_unicode=True).encode()

    return st.one_of(
        inputs(seeds),
        structured(seeds, loads=loads, dumps=dumps),
        structured(seeds, loads=loads, dumps=dumps),
    )
