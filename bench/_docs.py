"""Writing a benchmark's figures into docs/benchmarks.md, one ``## Heading`` section each."""

from __future__ import annotations

import re
from pathlib import Path

DOCS = Path(__file__).resolve().parent.parent / "docs" / "benchmarks.md"


def write_section(section: str, path: Path = DOCS) -> None:
    """Replace the section of ``path`` headed by ``section``'s first line (``## ...``), or append
    it; every other section is left as it is. Raises ValueError for a section without one."""
    heading = section.lstrip("\n").split("\n", 1)[0]
    if not heading.startswith("## "):
        raise ValueError(f"a benchmark section starts with '## ', not {heading!r}")
    text = path.read_text() if path.exists() else "# Benchmarks\n"
    pattern = re.compile(rf"^{re.escape(heading)}\n.*?(?=^## |\Z)", re.M | re.S)
    body = section.strip("\n") + "\n\n"
    if pattern.search(text):
        text = pattern.sub(lambda _: body, text, count=1)
    else:
        text = text.rstrip("\n") + "\n\n" + body
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text.rstrip("\n") + "\n")
