"""Every relative link in README.md and docs/ resolves inside the repository, anchors included, and
nothing links outside it: a reader of a checkout (or of the repository's web page) must never
follow a link into nothing."""

from __future__ import annotations

import re
from pathlib import Path

from tests.conftest import REPO

FENCE = re.compile(r"^(```|~~~).*?^\1", re.M | re.S)
INLINE_CODE = re.compile(r"`[^`\n]*`")
LINK = re.compile(r"!?\[[^\]]*\]\(\s*<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)|(?:href|src)=\"([^\"]+)\"")
HEADING = re.compile(r"^#{1,6}\s+(.*?)\s*#*\s*$", re.M)
EXTERNAL = ("http://", "https://", "mailto:")


def anchors(md: Path) -> set[str]:
    """GitHub's heading ids: lower case, punctuation but '-' and '_' dropped, spaces to '-'."""
    text = FENCE.sub("", md.read_text(encoding="utf-8"))
    out = set()
    for h in HEADING.findall(text):
        h = re.sub(r"`|\*\*|\[([^\]]*)\]\([^)]*\)", r"\1", h)
        out.add(re.sub(r"[^\w\- ]", "", h.lower()).replace(" ", "-"))
    return out


def broken_links(md: Path, repo: Path) -> tuple[list[str], int]:
    """(what is wrong with md's links, how many links were checked)."""
    text = INLINE_CODE.sub("", FENCE.sub("", md.read_text(encoding="utf-8")))
    wrong, n = [], 0
    for m in LINK.finditer(text):
        target = m.group(1) or m.group(2)
        n += 1
        if target.startswith(EXTERNAL):
            continue
        path, _, anchor = target.partition("#")
        if target.startswith(("/", "file:")) or re.match(r"^[a-z][a-z0-9+.-]*:", target):
            wrong.append(f"{md.name}: {target} points outside the repository")
            continue
        dest = (md.parent / path).resolve() if path else md.resolve()
        if not dest.is_relative_to(repo.resolve()):
            wrong.append(f"{md.name}: {target} points outside the repository")
        elif not dest.exists():
            wrong.append(f"{md.name}: {target} does not exist")
        elif anchor and dest.suffix == ".md" and anchor not in anchors(dest):
            wrong.append(f"{md.name}: {target}: no heading #{anchor} in {dest.name}")
    return wrong, n


def documents(repo: Path) -> list[Path]:
    return [repo / "README.md", *sorted((repo / "docs").glob("**/*.md"))]


def test_every_link_in_the_readme_and_docs_resolves_inside_the_repository():
    docs = documents(REPO)
    assert len(docs) >= 3, docs   # README, docs/top.md, docs/mlflow.md at least
    problems, checked = [], 0
    for md in docs:
        wrong, n = broken_links(md, REPO)
        problems += wrong
        checked += n
    assert checked >= 4, "the check found almost no links: is LINK still matching Markdown links?"
    assert not problems, "\n".join(problems)


def test_the_check_catches_a_missing_file_a_bad_anchor_and_a_link_outside(tmp_path):
    (tmp_path / "docs").mkdir()
    (tmp_path / "docs" / "a.md").write_text("# Title `x`\n\n## Two words\n")
    (tmp_path / "README.md").write_text(
        "[ok](docs/a.md) [ok](docs/a.md#two-words) [ok](#readme) [web](https://example.org)\n"
        "# README\n[gone](docs/b.md) [anchor](docs/a.md#three) [up](../shared/DESIGN.md) "
        "[abs](/etc/passwd) <a href=\"docs/c.md\">c</a>\n```\n[in code](nowhere.md)\n```\n`[inline](x.md)`\n")
    wrong, n = broken_links(tmp_path / "README.md", tmp_path)
    assert n == 9
    targets = [w.split(": ")[1].split()[0].rstrip(":") for w in wrong]
    assert targets == ["docs/b.md", "docs/a.md#three", "../shared/DESIGN.md", "/etc/passwd",
                       "docs/c.md"], wrong
