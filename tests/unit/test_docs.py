"""The documentation says what the code does: every API the broker serves is in the README's
table with the versions it serves, and every configuration key `--help` lists is documented in
the README or docs/."""

from __future__ import annotations

import re
from pathlib import Path

from broker.config import KEYS
from protocol.registry import APIS

ROOT = Path(__file__).resolve().parents[2]
README = ROOT / "README.md"


def served_table() -> dict[str, str]:
    """The README's "What it serves" table: API name -> its versions as written."""
    text = README.read_text()
    section = text[text.index("## What it serves"):]
    section = section[:section.index("\n## ", 4)]
    table: dict[str, str] = {}
    for line in section.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) != 2 or cells[0] in ("API", "---"):
            continue
        names = [n.strip() for n in cells[0].split(" / ")]
        ranges = cells[1].split(" (")[0].split(" / ")
        assert len(names) == len(ranges), f"names and versions do not pair up: {line}"
        table.update(zip(names, (r.strip() for r in ranges), strict=True))
    return table


def test_every_served_api_is_in_the_readme_with_its_versions() -> None:
    table = served_table()
    expected = {s.name: (f"{s.min_version}–{s.max_version}" if s.min_version != s.max_version
                         else str(s.min_version)) for s in APIS.values()}
    missing = sorted(set(expected) - set(table))
    assert not missing, f"served but not in the README's table: {missing}"
    wrong = {name: (table[name], versions) for name, versions in expected.items()
             if table[name] != versions}
    assert not wrong, f"README versions differ from the registry (README, served): {wrong}"
    extra = sorted(set(table) - set(expected))
    assert not extra, f"in the README's table but not served: {extra}"


def test_every_configuration_key_is_documented() -> None:
    text = README.read_text() + "".join(p.read_text() for p in (ROOT / "docs").glob("*.md"))
    undocumented = [key for key in KEYS
                    if not re.search(r"(?<![\w.])" + re.escape(key) + r"(?![\w])", text)]
    assert not undocumented, f"keys --help lists that no document names: {undocumented}"
