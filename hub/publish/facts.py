"""The branch facts a hub keeps between runs, in a shard's cache directory.

Per cluster branch the tip and what the hub's commit trailers say it holds (content digest,
serial, expiry, signed, moving: :class:`BranchFacts`), and the tips that have
no facts (branches of clusters no longer in the fleet): what lets a run diff 100,000 clusters
without reading a commit, or, when no hub published meanwhile, without listing a shard.

Branches are kept in *groups* of the same content digest, expiry, signed and moving trailers
(all but tip and serial): a publication's clusters of one shape share them, so 100,000
branches are a few hundred groups, and the diff compares a shape with a group by a set
intersection, not cluster by cluster (:func:`hub.publish.compare.decide`).

Two files: a *base* with every branch, group by group, and a *journal* of the branches a run
changed since, a JSON line each. A run that moved 1% of the branches appends 1% of the lines;
the base is written anew when the journal has grown past a fifth of it, or after a listing
(many branches may have moved). The journal is named after its base's generation, so a base
written anew never takes another's journal. Every failure to read only costs a cold read
(trailers), every failure to write a later one: nothing here is raised.
"""

from __future__ import annotations

import contextlib
import json
import operator
import os
import re
import secrets
from collections.abc import KeysView, Mapping
from pathlib import Path
from typing import Any, NamedTuple

from hub.fastjson import loads

_TRAILER = re.compile(r"^([A-Z][A-Za-z-]*): (\S+)$", re.MULTILINE)


def trailers(message: str) -> dict[str, str]:
    return dict(_TRAILER.findall(message))


class BranchFacts(NamedTuple):
    """What a cluster branch's tip holds, from the hub's commit trailers.

    ``digest`` is the content digest (bundles and groups, see :mod:`hub.publish.flow`), empty
    when the tip was not written by a hub (then the set itself must be read). ``moving_since``
    is set on the branches of a cluster moving between shards (see docs/scaling.md). A tuple:
    the cache holds one per cluster.
    """

    tip: str
    digest: str
    serial: int
    expires_at: str
    signed: bool
    moving_since: str = ""

    @classmethod
    def of(cls, tip: str, message: str) -> BranchFacts:
        found = trailers(message)
        serial = found.get("Serial", "")
        return cls(
            tip=tip,
            digest=found.get("Content-Digest", ""),
            serial=int(serial) if serial.isdigit() else -1,
            expires_at=found.get("Expires-At", ""),
            signed=found.get("Signed") == "true",
            moving_since=found.get("Moving-Since", ""),
        )


Key = tuple[str, str, bool, str, bool]
"""A group's shared facts: content digest, expiry, signed, moving since, and whether its
serials are usable (a commit whose Serial trailer was not a number is judged by its set)."""

_BASE = "fleetlet-facts.json"
_FORMAT = 4  # 4: groups, a base and its journal
_JOURNAL_SHARE = 5  # the base is written anew past a journal of 1/5 of its rows
_TIP = operator.itemgetter(0)


class FactsCache:
    """The facts of one repository's branches (``url``) in ``directory``; ``make`` builds a
    :class:`BranchFacts`."""

    def __init__(self, directory: Path, url: str, make: type[BranchFacts]) -> None:
        self.directory = Path(directory)
        self.url = url
        self._make = make
        self.groups: dict[Key, dict[str, tuple[str, int]]] = {}  # key -> name -> (tip, serial)
        self.where: dict[str, Key] = {}  # name -> its group
        self.others: dict[str, str] = {}  # cluster -> tip, for tips without facts
        self.loaded = False  # a record of every branch was read
        self._generation = ""
        self._journal_rows = 0
        self._changed: dict[str, BranchFacts | None] = {}
        self._rewrite = False
        self._load()

    # --- reading ------------------------------------------------------------------------

    def get(self, name: str) -> BranchFacts | None:
        key = self.where.get(name)
        if key is None:
            return None
        tip, serial = self.groups[key][name]
        return self._make(tip, key[0], serial, key[1], key[2], key[3])

    def __len__(self) -> int:
        return len(self.where)

    def tips(self) -> dict[str, str]:
        """Name -> tip of every branch with facts (built without a loop per branch)."""
        out: dict[str, str] = {}
        for members in self.groups.values():
            out.update(zip(members, map(_TIP, members.values()), strict=True))
        return out

    def members(self) -> dict[Key, KeysView[str]]:
        """Each group's names (views: set operations on them run without a loop per name)."""
        return {key: members.keys() for key, members in self.groups.items()}

    # --- what changed -------------------------------------------------------------------

    def learnt(self, name: str | None = None, facts: BranchFacts | None = None) -> None:
        """Facts were read from a commit (``name``: its branch), or the branches listed:
        the next save writes everything anew."""
        if name is not None and facts is not None:
            self._put(name, facts)
        self._rewrite = True

    def changed(self, cluster: str, facts: BranchFacts | None) -> None:
        """``cluster``'s branch now holds ``facts`` (None: it is gone)."""
        self.others.pop(cluster, None)
        self._put(cluster, facts)
        self._changed[cluster] = facts

    @property
    def dirty(self) -> bool:
        return self._rewrite or bool(self._changed)

    def _put(self, name: str, facts: BranchFacts | None) -> None:
        old = self.where.pop(name, None)
        if old is not None:
            group = self.groups[old]
            del group[name]
            if not group:
                del self.groups[old]
        if facts is None:
            return
        key = (facts.digest, facts.expires_at, facts.signed, facts.moving_since, facts.serial >= 0)
        self.groups.setdefault(key, {})[name] = (facts.tip, facts.serial)
        self.where[name] = key

    def _load(self) -> None:
        try:
            data = loads((self.directory / _BASE).read_bytes())
            if data.get("format") != _FORMAT or data.get("url") != self.url:
                return
            groups: dict[Key, dict[str, tuple[str, int]]] = {}
            where: dict[str, Key] = {}
            for digest, expires, signed, moving, names, tips, serials in data["groups"]:
                # (types checked without a Python call per branch)
                if set(map(type, (digest, expires, moving, *names, *tips))) - {str}:
                    return
                if set(map(type, serials)) - {int} or type(signed) is not bool:
                    return
                usable = not serials or min(serials) >= 0
                if not usable:  # (never written by a hub: judged by its set)
                    for name, tip, serial in zip(names, tips, serials, strict=True):
                        key = (digest, expires, signed, moving, serial >= 0)
                        groups.setdefault(key, {})[name] = (tip, serial)
                        where[name] = key
                    continue
                key = (digest, expires, signed, moving, True)
                groups[key] = dict(zip(names, zip(tips, serials, strict=True), strict=True))
                where.update(dict.fromkeys(names, key))
            others = data["others"]
            generation = data["generation"]
            if not all(type(t) is str for t in (*others, *others.values())):
                return
        except (OSError, ValueError, KeyError, TypeError, AttributeError, IndexError):
            return  # a cold cache: trailers are read again
        self.groups, self.where = groups, where
        self.others, self._generation = others, str(generation)
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
                facts = self._make._make(row[1:]) if len(row) == 7 else None
                if type(name) is not str or (facts is not None and type(facts.tip) is not str):
                    continue
            except (ValueError, TypeError, IndexError):
                continue  # a line cut short by a crash: that branch is read again if needed
            self.others.pop(name, None)
            self._put(name, facts)
            self._journal_rows += 1

    def _journal(self) -> Path:
        return self.directory / f"fleetlet-facts.{self._generation}.log"

    # --- writing ------------------------------------------------------------------------

    def save(self, tips: Mapping[str, str]) -> None:
        """Record the facts of ``tips`` (every branch): the changes since the last save,
        appended to the journal, or everything anew."""
        if not self.dirty:
            return
        if (
            self._rewrite
            or not self._generation
            or (self._journal_rows + len(self._changed)) * _JOURNAL_SHARE > max(len(self), 1000)
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
        groups: list[list[Any]] = []
        for (digest, expires, signed, moving, _), members in self.groups.items():
            # Only the facts of the listed tips.
            current = [(n, ts) for n, ts in members.items() if tips.get(n) == ts[0]]
            if current:
                names = [n for n, _ in current]
                groups.append(
                    [
                        digest,
                        expires,
                        signed,
                        moving,
                        names,
                        [t for _, (t, _) in current],
                        [s for _, (_, s) in current],
                    ]
                )
        where = self.where
        generation = secrets.token_hex(8)
        doc = {
            "format": _FORMAT,
            "url": self.url,
            "generation": generation,
            "groups": groups,
            # Every other branch of the last listing, so that a run may take them as the
            # remote's (see BranchStore.assume_listed).
            "others": {
                n: t
                for n, t in tips.items()
                if (k := where.get(n)) is None or self.groups[k][n][0] != t
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
