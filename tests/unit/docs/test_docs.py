"""The README and docs/ stay usable: every relative link resolves, the README stays short, and its
performance table is what `python -m perf readme-table` prints from the committed results."""
from __future__ import annotations

import re

import pytest

from perf import RESULTS, report
from testing import REPO

PAGES = [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]
LINK = re.compile(r"\[[^\]]*\]\(([^)\s]+)\)")


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(REPO)))
def test_relative_links_resolve(page):
    text = re.sub(r"```.*?```", "", page.read_text(), flags=re.S)  # code blocks hold no links
    broken = [target for target in LINK.findall(text) if not re.match(r"[a-z]+:", target)
              and not target.startswith("#") and not (page.parent / target.split("#")[0]).exists()]
    assert not broken, f"{page.relative_to(REPO)}: links to missing files {broken}"


def test_readme_is_for_users():
    text = (REPO / "README.md").read_text()
    assert len(text.splitlines()) <= 350
    assert not re.search(r"\bissue \d+|\b[0-9a-f]{7}\b`|before and after", text, flags=re.I)


def test_readme_performance_table_is_generated_from_the_results():
    text = (REPO / "README.md").read_text()
    table = text.split(report.README_BEGIN + "\n", 1)[1].split(report.README_END, 1)[0]
    assert table == report.readme_table(RESULTS, REPO), "run `python -m perf readme-table --write`"


def test_ci_runs_the_readmes_test_command():
    assert "make test" in (REPO / "README.md").read_text() and "make test" in (REPO / ".ci" / "run").read_text()
