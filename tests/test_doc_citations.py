"""The documentation's links and citations resolve.

* Every Markdown link of ``docs/`` and ``README.md`` to a local file names a file that exists
  and, with ``#anchor``, a heading of that file with GitHub's slug for it.
* Every ``docs/papers/<name>.md §N`` citation (in ``pflarena/``, ``docs/``, ``benchmarks/`` and
  ``tests/``) names a page of ``docs/papers/`` and a section of it that exists; every
  ``docs/methods/<name>.md §N`` citation names a section of that method page the same way.
* Nothing cites "the spec" or its item labels ("spec §3.2", "spec A9", "§B7"): the readings of
  the papers are ``docs/papers/<name>.md`` and ``docs/methods/<name>.md``, cited by section.
"""

import re
from collections import Counter
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PAPERS = ROOT / "docs" / "papers"
CITING = ("pflarena", "docs", "benchmarks", "tests")
GENERATED = re.compile(
    r"<!-- generated from the declaration: do not edit; make generated -->.*?<!-- end generated -->",
    re.S,
)

#: Files whose broken links or citations are fixed when their owners rewrite them; each entry
#: names exactly what is left, so that nothing else in the file is let through.
LINKS_LEFT: dict[str, set[str]] = {}

#: "spec" citations left in the declarations' descriptions, which the generated blocks of the
#: method pages and docs/methods.md are written from: exactly these strings are let through.
SPEC_LEFT: dict[str, set[str]] = {}

#: Files being rewritten elsewhere, whose "spec" citations go with that rewrite.
SPEC_FILES_LEFT: set[str] = set()

#: ``docs/methods/<name>.md §N`` citations whose section moved to ``docs/papers/<name>.md §N``
#: (the same number), left in files this change does not edit: (citing file, page, section).
#: Each becomes ``docs/papers/<name>.md §N`` when its file is next edited.
METHOD_SECTIONS_LEFT: set[tuple[str, str, str]] = set()


def _files(folders, suffixes=None):
    for folder in folders:
        base = ROOT / folder
        paths = [base] if base.is_file() else sorted(base.rglob("*"))
        for path in paths:
            if not path.is_file() or "__pycache__" in path.parts:
                continue
            if suffixes and path.suffix not in suffixes:
                continue
            try:
                yield path, path.read_text(encoding="utf-8")
            except UnicodeDecodeError:
                continue


def _slug(heading: str) -> str:
    """GitHub's anchor of a Markdown heading: lower case, punctuation dropped, spaces to -."""
    text = re.sub(r"[^\w\- ]", "", heading.strip().lower())
    return text.replace(" ", "-")


def _anchors(text: str) -> set[str]:
    """Every heading's anchor, with GitHub's -1, -2 … suffixes on repeated ones."""
    seen: Counter[str] = Counter()
    anchors = set()
    for heading in re.findall(r"^#{1,6} +(.+?) *#*$", _without_fences(text), re.M):
        slug = _slug(heading)
        anchors.add(slug if not seen[slug] else f"{slug}-{seen[slug]}")
        seen[slug] += 1
    return anchors


def _without_fences(text: str) -> str:
    return re.sub(r"^(```|~~~).*?^\1", "", text, flags=re.M | re.S)


def _without_code(text: str) -> str:
    """The text without fenced code blocks and inline code, where brackets are not links."""
    return re.sub(r"`[^`\n]*`", "", _without_fences(text))


def _links(text: str):
    for target in re.findall(r"\]\(<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\)", _without_code(text)):
        if re.match(r"[a-z][a-z0-9+.-]*:", target):  # https:, mailto:
            continue
        yield target


def test_local_links_resolve():
    broken = []
    for page, text in _files(["docs", "README.md"], {".md"}):
        name = str(page.relative_to(ROOT))
        for target in _links(text):
            if target in LINKS_LEFT.get(name, set()):
                continue
            path, _, anchor = target.partition("#")
            file = (page.parent / path).resolve() if path else page
            if not file.exists():
                broken.append(f"{name}: {target} (no such file)")
            elif (
                anchor
                and file.suffix == ".md"
                and anchor not in _anchors(file.read_text(encoding="utf-8"))
            ):
                broken.append(f"{name}: {target} (no such heading)")
    assert not broken, "broken links:\n" + "\n".join(broken)


#: ``docs/papers/x.md §9.8``, also ``[`docs/papers/x.md`](papers/x.md) §9.8`` and ranges §4-5.
PAPER_CITATION = re.compile(
    r"docs/papers/([\w.-]+?)\.md(?:`?\]\([\w/.#-]+\))?`?\)?\s*(?:§(\d+)(?:\.(\d+))?)?"
)


def _has_section(text: str, section: str, item: str | None) -> bool:
    """``§N`` is the page's ``## N.`` heading; ``§N.M`` its ``### N.M`` heading or, in a
    section without subsections, its item ``M.`` (``1. **…**``, ``**1. …**``, ``- **1. …**``)."""
    if item is None:
        return re.search(rf"^## {section}\. ", text, re.M) is not None
    if re.search(rf"^### {section}\.{item} ", text, re.M):
        return True
    body = re.split(rf"^## {section}\. .*$", text, maxsplit=1, flags=re.M)
    if len(body) < 2:
        return False
    body = re.split(r"^## ", body[1], maxsplit=1, flags=re.M)[0]
    if re.search(r"^### ", body, re.M):
        return False
    return re.search(rf"^(?:- )?\**{item}\. ", body, re.M) is not None


#: ``docs/methods/x.md §9.8``, written the same ways as a paper citation.
METHOD_CITATION = re.compile(PAPER_CITATION.pattern.replace("docs/papers/", "docs/methods/"))


#: files whose citations are examples (their docstrings), not citations
EXAMPLES = {Path(__file__).resolve(), ROOT / "tests" / "test_docs_references.py"}


def _citations(pattern):
    for path, text in _files(CITING):
        if path in EXAMPLES:
            continue
        for match in pattern.finditer(text):
            yield str(path.relative_to(ROOT)), match.group(1), match.group(2), match.group(3)


def _paper_citations():
    for path, text in _files(CITING):
        if path == Path(__file__).resolve():
            continue  # its examples
        for match in PAPER_CITATION.finditer(text):
            yield str(path.relative_to(ROOT)), match.group(1), match.group(2), match.group(3)


def test_paper_citations_are_found():
    """The scan sees the citations, so the check below cannot pass on an empty list."""
    cited = {page for _, page, section, _ in _paper_citations() if section}
    assert {"pfedgt", "pfedsv", "ppfl", "fedpg"} <= cited


def test_method_citations_name_existing_sections():
    """``docs/methods/<name>.md §N`` resolves as a paper citation does, in the method page."""
    wrong = []
    for path, page, section, item in _citations(METHOD_CITATION):
        cited = f"{section}{'.' + item if item else ''}"
        file = ROOT / "docs" / "methods" / f"{page}.md"
        if not file.is_file():
            wrong.append(f"{path}: docs/methods/{page}.md (no such page)")
        elif (
            section
            and (path, page, cited) not in METHOD_SECTIONS_LEFT
            and not _has_section(file.read_text(encoding="utf-8"), section, item)
        ):
            wrong.append(f"{path}: docs/methods/{page}.md §{cited}")
    assert not wrong, "citations of missing pages or sections:\n" + "\n".join(sorted(set(wrong)))


def test_paper_citations_name_existing_sections():
    wrong = []
    for path, page, section, item in _paper_citations():
        file = PAPERS / f"{page}.md"
        if not file.is_file():
            wrong.append(f"{path}: docs/papers/{page}.md (no such page)")
        elif section and not _has_section(file.read_text(encoding="utf-8"), section, item):
            wrong.append(f"{path}: docs/papers/{page}.md §{section}{'.' + item if item else ''}")
    assert not wrong, "citations of missing pages or sections:\n" + "\n".join(sorted(set(wrong)))


#: "spec §3.2", "spec's §9", "spec A9", "Spec T2", "spec §9 #3", "the pFedGT spec", "§B7"
SPEC = re.compile(
    r"\b[Ss]pec(?:'s)?\s*(?:§|[A-Z]\d|#\d)"
    r"|\b(?:[Tt]he|this|its) (?:(?:pFedGT|pFedSV|PPFL|FedPG|PAGE) )?spec(?:'s)?\b(?! ?(?:file|model|\(JSON))"
    r"|§[A-Z]\d"
)


@pytest.mark.parametrize("folder", CITING)
def test_nothing_cites_the_spec(folder):
    left = []
    for path, text in _files([folder], {".py", ".md", ".toml", ".txt"}):
        name = str(path.relative_to(ROOT))
        if name == "tests/test_doc_citations.py" or name in SPEC_FILES_LEFT:
            continue
        # the method pages' generated blocks come from the declarations: see SPEC_LEFT
        text = GENERATED.sub(lambda m: "\n" * m.group(0).count("\n"), text)
        allowed = SPEC_LEFT.get(name, set())
        for number, line in enumerate(text.splitlines(), 1):
            if SPEC.search(line) and not any(a in line for a in allowed):
                left.append(f"{name}:{number}: {line.strip()[:120]}")
    assert not left, "cite docs/papers/<name>.md §N instead of the spec:\n" + "\n".join(left)


def test_what_is_left_is_still_there():
    """An entry of SPEC_LEFT or LINKS_LEFT whose text is gone (fixed) is taken off the list."""
    gone = [
        f"{name}: {text}"
        for name, texts in SPEC_LEFT.items()
        for text in texts
        if text not in (ROOT / name).read_text(encoding="utf-8")
    ]
    gone += [
        f"{name}: {target}"
        for name, targets in LINKS_LEFT.items()
        for target in targets
        if f"]({target})" not in (ROOT / name).read_text(encoding="utf-8")
    ]
    cited = {
        (path, page, f"{section}{'.' + item if item else ''}")
        for path, page, section, item in _citations(METHOD_CITATION)
        if section
    }
    gone += [f"{entry}" for entry in sorted(METHOD_SECTIONS_LEFT - cited)]
    assert not gone, "fixed; take them off the list:\n" + "\n".join(gone)
