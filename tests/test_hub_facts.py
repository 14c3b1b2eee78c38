"""The branch facts a hub keeps between runs (hub.publish.facts): what a run changed is
appended, the rest is read back as it was written, and whatever goes wrong with the files
costs a cold read, never a wrong answer from another repository or another generation."""

from __future__ import annotations

from pathlib import Path

from hub.publish.facts import BranchFacts, FactsCache

URL = "git://git.example/shard-0.git"


def facts(i: int, serial: int = 1) -> BranchFacts:
    return BranchFacts(
        tip=f"{i:040x}",
        digest=f"sha256:{i % 3:064x}",
        serial=serial,
        expires_at="2026-12-03T00:00:00Z",
        signed=True,
    )


def fleet(count: int) -> tuple[dict[str, BranchFacts], dict[str, str]]:
    known = {f"c{i:05d}": facts(i) for i in range(count)}
    return known, {name: f.tip for name, f in known.items()}


def every(cache: FactsCache) -> dict[str, BranchFacts | None]:
    return {name: cache.get(name) for name in cache.where}


def written(tmp_path: Path, count: int) -> tuple[FactsCache, dict[str, str]]:
    cache = FactsCache(tmp_path, URL, BranchFacts)
    known, tips = fleet(count)
    for name, f in known.items():
        cache.learnt(name, f)  # read from its commit
    cache.others["orphan"] = "f" * 40
    tips["orphan"] = "f" * 40
    cache.save(tips)
    return cache, tips


def test_a_run_that_changed_one_percent_appends_one_percent(tmp_path: Path) -> None:
    cache, tips = written(tmp_path, 10_000)
    base = (tmp_path / "fleetlet-facts.json").read_bytes()
    for i in range(0, 10_000, 100):
        moved = facts(i + 1_000_000, serial=2)
        cache.changed(f"c{i:05d}", moved)
        tips[f"c{i:05d}"] = moved.tip
    cache.changed("c00001", None)
    tips.pop("c00001")
    cache.save(tips)
    assert (tmp_path / "fleetlet-facts.json").read_bytes() == base  # the base is untouched
    [journal] = tmp_path.glob("fleetlet-facts.*.log")
    assert len(journal.read_bytes().splitlines()) == 101
    again = FactsCache(tmp_path, URL, BranchFacts)
    assert again.loaded
    assert every(again) == every(cache) and again.get("c00001") is None
    assert again.get("c00100") == facts(1_000_100, serial=2)
    assert again.others == {"orphan": "f" * 40}
    # Branches of one shape share a group: 10,000 branches are a few groups.
    assert len(again.members()) == 3


def test_the_base_is_written_anew_when_the_journal_grows(tmp_path: Path) -> None:
    cache, tips = written(tmp_path, 2_000)
    assert not list(tmp_path.glob("fleetlet-facts.*.log"))  # nothing appended yet
    for i in range(500):  # a quarter of the rows: past a fifth
        cache.changed(f"c{i:05d}", facts(i + 5_000, serial=2))
        tips[f"c{i:05d}"] = facts(i + 5_000).tip
    cache.save(tips)
    assert not list(tmp_path.glob("fleetlet-facts.*.log"))
    assert every(FactsCache(tmp_path, URL, BranchFacts)) == every(cache)


def test_a_torn_line_another_generation_or_another_url_cost_a_read_not_a_wrong_answer(
    tmp_path: Path,
) -> None:
    cache, tips = written(tmp_path, 100)
    cache.changed("c00005", facts(999, serial=7))
    tips["c00005"] = facts(999).tip
    cache.save(tips)
    [journal] = tmp_path.glob("fleetlet-facts.*.log")
    with open(journal, "a") as out:
        out.write('["c00006", "abc')  # a crash in the middle of an append
    again = FactsCache(tmp_path, URL, BranchFacts)
    assert again.get("c00005") == facts(999, serial=7) and again.get("c00006") == facts(6)
    # A journal of another generation (a base written anew since) is never replayed.
    journal.rename(tmp_path / "fleetlet-facts.0000000000000000.log")
    assert FactsCache(tmp_path, URL, BranchFacts).get("c00005") == facts(5)
    # Another repository's cache is not this one's.
    assert not FactsCache(tmp_path, "git://elsewhere/shard-0.git", BranchFacts).loaded
    (tmp_path / "fleetlet-facts.json").write_text("{not json")
    assert not FactsCache(tmp_path, URL, BranchFacts).loaded
