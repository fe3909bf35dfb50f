"""The project's citations point at its own pages: every ``docs/methods/<x>.md`` exists, and
keeps the section a citation names, and nothing cites the paper readings kept outside the
repository."""

import re
from pathlib import Path

import pytest
from test_doc_citations import _has_section as has_section

ROOT = Path(__file__).resolve().parents[1]
PAGES = ROOT / "docs" / "methods"
CITING = ("pflarena", "docs", "benchmarks")
SCANNED = ("pflarena", "docs", "benchmarks", "tests")
#: the old citation of a paper reading outside the repository (split so this file holds none)
OUTSIDE = "spec" + "s/"
#: a cited page, optionally followed by the section it names: ``docs/methods/x.md §9.8``,
#: also as a Markdown link ``[`docs/methods/x.md`](methods/x.md) §9.8``
CITATION = re.compile(
    r"docs/methods/([\w.-]+?)\.md(?:`?\]\([\w/.-]+\))?`?\)?\s*(?:§(\d+)(?:\.(\d+))?)?"
)


#: Citations of sections that moved to docs/papers/<x>.md, left in files this change does not
#: edit: (citing file, cited page, section). Each goes when its file is rewritten.
MOVED_LEFT: set[tuple[str, str, str]] = set()


def _texts(folders):
    for folder in folders:
        for path in sorted((ROOT / folder).rglob("*")):
            if not path.is_file() or "__pycache__" in path.parts:
                continue
            try:
                yield path, path.read_text(encoding="utf-8")
            except UnicodeDecodeError:
                continue  # figures and other binary files


def _citations():
    for path, text in _texts(CITING):
        for match in CITATION.finditer(text):
            yield path.relative_to(ROOT), match.group(1), match.group(2), match.group(3)


def _has_section(page, section, item):
    """``§N`` is the page's ``## N.`` heading; ``§N.M`` its ``### N.M`` heading or, in a section
    without subsections (the ambiguities of §9), its item ``M.``."""
    text = (PAGES / f"{page}.md").read_text(encoding="utf-8")
    return has_section(text, section, item)


def test_citations_are_found():
    """The scan sees the citations (so that the checks below cannot pass on an empty list)."""
    cited = {page for _, page, _, _ in _citations()}
    assert {"pfedgt", "pfedsv", "ppfl", "page", "fedpg"} <= cited


def test_every_cited_method_page_exists():
    missing = sorted(
        f"{path}: docs/methods/{page}.md"
        for path, page, _, _ in _citations()
        if not (PAGES / f"{page}.md").is_file()
    )
    assert not missing, "cited pages that do not exist:\n" + "\n".join(missing)


def test_every_cited_section_exists_in_its_page():
    wrong = sorted(
        f"{path}: docs/methods/{page}.md §{section}{'.' + item if item else ''}"
        for path, page, section, item in _citations()
        if section is not None
        and (str(path), page, f"{section}{'.' + item if item else ''}") not in MOVED_LEFT
        and (PAGES / f"{page}.md").is_file()
        and not _has_section(page, section, item)
    )
    assert not wrong, "cited sections missing from their pages:\n" + "\n".join(wrong)


@pytest.mark.parametrize("folder", SCANNED)
def test_nothing_cites_paper_readings_outside_the_repository(folder):
    offending = [
        f"{path.relative_to(ROOT)}:{number}: {line.strip()[:120]}"
        for path, text in _texts([folder])
        for number, line in enumerate(text.splitlines(), 1)
        if OUTSIDE in line
    ]
    assert not offending, f"cite docs/methods/<x>.md instead of {OUTSIDE}<x>.md:\n" + "\n".join(
        offending
    )


def _slug(heading):
    """GitHub's anchor of a Markdown heading."""
    text = re.sub(r"[^\w\- ]", "", heading.strip().lower())
    return text.replace(" ", "-")


def test_links_of_the_method_pages_resolve():
    """Every relative link of ``docs/methods/*.md`` names an existing file and, with ``#``,
    one of its headings."""
    broken = []
    for page in sorted(PAGES.glob("*.md")):
        for target in re.findall(r"\]\(([^)\s]+)\)", page.read_text(encoding="utf-8")):
            if re.match(r"[a-z]+://", target):
                continue
            path, _, anchor = target.partition("#")
            file = (page.parent / path).resolve() if path else page
            if not file.is_file():
                broken.append(f"{page.name}: {target} (no such file)")
            elif anchor:
                headings = re.findall(r"^#+ (.+)$", file.read_text(encoding="utf-8"), re.M)
                if anchor not in {_slug(h) for h in headings}:
                    broken.append(f"{page.name}: {target} (no such heading)")
    assert not broken, "broken links:\n" + "\n".join(broken)


def test_moved_left_is_still_cited():
    """An entry of MOVED_LEFT whose citation is gone (fixed) is taken off the list."""
    cited = {
        (str(path), page, f"{section}{'.' + item if item else ''}")
        for path, page, section, item in _citations()
        if section is not None
    }
    assert not MOVED_LEFT - cited, f"fixed; take them off MOVED_LEFT: {sorted(MOVED_LEFT - cited)}"
