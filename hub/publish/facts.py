"""The branch facts a hub keeps between runs, in a shard's cache directory.

Per cluster branch the tip and what the hub's commit trailers say it holds (content digest,
serial, expiry, signed, moving: :class:`~hub.publish.git.BranchFacts`), and the tips that have
no facts (branches of clusters no longer in the fleet): what lets a run diff 100,000 clusters
without reading a commit, or, when no hub published meanwhile, without listing a shard.

Two files: a *base* with every branch, as columns with the repeated values (digests, expiry
times) in tables, and a *journal* of the branches a run changed since, a JSON line each. A run
that moved 1% of the branches appends 1% of the lines; the base is written anew when the
journal has grown past a fifth of it, or after a listing (many branches may have moved). The
journal is named after its base's generation, so a base written anew never takes another's
journal. Every failure to read only costs a cold read (trailers), every failure to write a
later one: nothing here is raised.
"""

from __future__ import annotations

import contextlib
import json
import os
import secrets
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

from hub.fastjson import loads

if TYPE_CHECKING:
    from hub.publish.git import BranchFacts

_BASE = "fleetlet-facts.json"
_FORMAT = 3  # 3: a base and its journal
_JOURNAL_SHARE = 5  # the base is written anew past a journal of 1/5 of its rows


class FactsCache:
    """The facts of one repository's branches (``url``) in ``directory``."""

    def __init__(self, directory: Path, url: str, make: type[BranchFacts]) -> None:
        self.directory = Path(directory)
        self.url = url
        self._make = make
        self.facts: dict[str, BranchFacts] = {}
        self.others: dict[str, str] = {}  # cluster -> tip, for tips without facts
        self.loaded = False  # a record of every branch was read
        self._generation = ""
        self._journal_rows = 0
        self._changed: dict[str, BranchFacts | None] = {}
        self._rewrite = False
        self._load()

    # --- what changed -------------------------------------------------------------------

    def learnt(self) -> None:
        """Facts were read from commits, or the branches listed: the next save writes all."""
        self._rewrite = True

    def changed(self, cluster: str, facts: BranchFacts | None) -> None:
        """``cluster``'s branch now holds ``facts`` (None: it is gone)."""
        self.others.pop(cluster, None)
        if facts is None:
            self.facts.pop(cluster, None)
        else:
            self.facts[cluster] = facts
        self._changed[cluster] = facts

    @property
    def dirty(self) -> bool:
        return self._rewrite or bool(self._changed)

    # --- reading ------------------------------------------------------------------------

    def _load(self) -> None:
        try:
            data = loads((self.directory / _BASE).read_bytes())
            if data.get("format") != _FORMAT or data.get("url") != self.url:
                return
            names, tips, serials = data["names"], data["tips"], data["serials"]
            digests = map(data["digests"].__getitem__, data["digest"])
            expiries = map(data["expiries"].__getitem__, data["expiry"])
            columns = (tips, digests, serials, expiries, data["signed"], data["moving"])
            make = self._make._make
            facts = dict(zip(names, map(make, zip(*columns, strict=True)), strict=True))
            others = data["others"]
            generation = data["generation"]
            if not all(type(t) is str for t in (*names, *tips, *others, *others.values())):
                return
        except (OSError, ValueError, KeyError, TypeError, AttributeError, IndexError):
            return  # a cold cache: trailers are read again
        self.facts, self.others, self._generation = facts, others, str(generation)
        self._replay()
        self.loaded = True

    def _replay(self) -> None:
        try:
            lines = self._journal().read_bytes().splitlines()
        except OSError:
            return
        for line in lines:
            try:
                row = loads(line)
                name = row[0]
                if type(name) is not str:
                    continue
                facts = self._make._make(row[1:]) if len(row) == 7 else None
            except (ValueError, TypeError, IndexError):
                continue  # a line cut short by a crash: that branch is read again if needed
            self.others.pop(name, None)
            if facts is None:
                self.facts.pop(name, None)
            else:
                self.facts[name] = facts
            self._journal_rows += 1

    def _journal(self) -> Path:
        return self.directory / f"fleetlet-facts.{self._generation}.log"

    # --- writing ------------------------------------------------------------------------

    def save(self, tips: Mapping[str, str]) -> None:
        """Record the facts of ``tips`` (every branch): the changes since the last save,
        appended to the journal, or everything anew."""
        if not self.dirty:
            return
        rows = len(self.facts)
        if (
            self._rewrite
            or not self._generation
            or (self._journal_rows + len(self._changed)) * _JOURNAL_SHARE > max(rows, 1000)
        ):
            self._write_base(tips)
            return
        lines = [
            json.dumps([name, *facts] if facts is not None else [name]) + "\n"
            for name, facts in self._changed.items()
        ]
        try:
            with open(self._journal(), "a", encoding="utf-8") as journal:
                journal.write("".join(lines))
        except OSError:
            return
        self._journal_rows += len(lines)
        self._changed.clear()

    def _write_base(self, tips: Mapping[str, str]) -> None:
        current = [(n, f) for n, f in self.facts.items() if tips.get(n) == f.tip]
        digests: dict[str, int] = {}
        expiries: dict[str, int] = {}
        generation = secrets.token_hex(8)
        doc: dict[str, Any] = {
            "format": _FORMAT,
            "url": self.url,
            "generation": generation,
            "names": [n for n, _ in current],
            "tips": [f.tip for _, f in current],
            "digest": [digests.setdefault(f.digest, len(digests)) for _, f in current],
            "serials": [f.serial for _, f in current],
            "expiry": [expiries.setdefault(f.expires_at, len(expiries)) for _, f in current],
            "signed": [f.signed for _, f in current],
            "moving": [f.moving_since for _, f in current],
            "digests": list(digests),
            "expiries": list(expiries),
            # Every other branch of the last listing, so that a run may take them as the
            # remote's (see BranchStore.assume_listed).
            "others": {
                n: t for n, t in tips.items() if (f := self.facts.get(n)) is None or f.tip != t
            },
        }
        path = self.directory / _BASE
        tmp = path.with_suffix(f".tmp{os.getpid()}")
        try:
            tmp.write_text(json.dumps(doc, separators=(",", ":")))
            os.replace(tmp, path)
        except OSError:
            tmp.unlink(missing_ok=True)
            return
        old = self._journal() if self._generation else None
        self._generation, self._journal_rows = generation, 0
        self._changed.clear()
        self._rewrite = False
        if old is not None:
            with contextlib.suppress(OSError):
                old.unlink(missing_ok=True)
