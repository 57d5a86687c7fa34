"""Every relative link in README.md and docs/ resolves inside the repository, anchors included, and
nothing links outside it: a reader of a checkout (or of the repository's web page) must never
follow a link into nothing. Nor does any text, code included, name a path outside the repository
(`../shared/...`, the checkout's own absolute location): a reader of the web page has no such
folder, so the documentation must say what it needs in words."""

from __future__ import annotations

import re
from pathlib import Path

from tests.conftest import REPO

FENCE = re.compile(r"^(```|~~~).*?^\1", re.M | re.S)
INLINE_CODE = re.compile(r"`[^`\n]*`")
LINK = re.compile(r"!?\[[^\]]*\]\(\s*<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)|(?:href|src)=\"([^\"]+)\"")
HEADING = re.compile(r"^#{1,6}\s+(.*?)\s*#*\s*$", re.M)
EXTERNAL = ("http://", "https://", "mailto:")
UPWARD = re.compile(r"(?<![\w.])(?:\.\./)+[\w.\-/]*")   # ../x, ../../y/z: relative paths that climb


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


def paths_outside(md: Path, repo: Path) -> list[str]:
    """Paths named in md's text (code too; link targets are broken_links' business) that lead out
    of the repository. Prose and commands are read from the repository's root, so there any
    ``../`` climbs out of it (``../shared/traces`` meant the folder beside the checkout)."""
    text = LINK.sub("", md.read_text(encoding="utf-8"))
    wrong = [f"{md.name}: {m.group()} leads outside the repository" for m in UPWARD.finditer(text)]
    # the folder the checkout sits in (so the checkout too) is one machine's, nobody else's
    root = repo.resolve()
    here = root.parent if root.parent != Path(root.anchor) else root
    if f"{here}/" in text:
        wrong.append(f"{md.name}: names {here}/, a path of one machine")
    return wrong


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


def test_no_text_in_the_readme_or_docs_names_a_path_outside_the_repository():
    problems = [w for md in documents(REPO) for w in paths_outside(md, REPO)]
    assert not problems, "\n".join(problems)


def test_the_path_check_catches_upward_paths_in_code_and_the_checkouts_location(tmp_path):
    """A link to ../README.md from docs/ is fine (broken_links resolves it); a ../ path in text or
    in a code block, and the checkout's absolute location, are not."""
    repo = tmp_path / "repo"
    (repo / "docs").mkdir(parents=True)
    (repo / "docs" / "a.md").write_text(
        "[fine](../README.md) see `../shared/DESIGN.md`\n"
        f"```\ncd ../../elsewhere\nls {repo}/tests\n```\n/var/lib/gpudiag is a runtime path\n")
    wrong = paths_outside(repo / "docs" / "a.md", repo)
    assert [w.split(": ", 1)[1] for w in wrong] == [
        "../shared/DESIGN.md leads outside the repository",
        "../../elsewhere leads outside the repository",
        f"names {tmp_path.resolve()}/, a path of one machine"], wrong


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
