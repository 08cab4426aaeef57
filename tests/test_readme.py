"""The README a newcomer reads in five minutes: at most about 150 lines, and every link in it, and in
the pages it sends them to, leads somewhere that exists (a file, and the heading an anchor names)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).parents[1]
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md")), ROOT / "deploy" / "README.md"]
LINK = re.compile(r"\]\(([^)\s]+)\)")


def slug(heading: str) -> str:
    """GitHub's anchor of a heading: lower case, punctuation dropped, spaces to hyphens."""
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


def anchors(page: Path) -> set[str]:
    """Its headings' anchors, and the explicit ones (`<a id="sft"></a>`, as docs/requests.md sets them)."""
    text = page.read_text()
    return {slug(line.lstrip("#")) for line in text.splitlines() if line.startswith("#")} | set(
        re.findall(r'<a id="([^"]+)">', text)
    )


def test_the_readme_is_short() -> None:
    assert len((ROOT / "README.md").read_text().splitlines()) <= 150


@pytest.mark.parametrize("page", PAGES, ids=lambda page: str(page.relative_to(ROOT)))
def test_every_link_resolves(page: Path) -> None:
    for target in LINK.findall(page.read_text()):
        if target.startswith(("http://", "https://", "mailto:")):
            continue
        path, _, anchor = target.partition("#")
        file = (page.parent / path).resolve() if path else page
        assert file.exists(), f"{page.relative_to(ROOT)}: {target} names nothing"
        if anchor and file.suffix == ".md":
            assert anchor in anchors(file), f"{page.relative_to(ROOT)}: {target}: no such heading"


def test_a_method_the_locked_trl_lacks_is_not_claimed_without_saying_so() -> None:
    """The README's opening names the methods adapterd trains; one the locked TRL does not have (`adapterd methods`:
    unavailable) is named only beside the reason (issue 63: PPO, removed in TRL 1.13, was listed as trained)."""
    from daemon.admission.capabilities import unsupported_reason
    from schemas.methods import METHODS

    opening = " ".join((ROOT / "README.md").read_text().split("\n\n")[1].split())
    missing = [method for method in METHODS if unsupported_reason(method) is not None]
    assert missing, "every method is available: nothing for this test to hold"
    for method in missing:
        name = method.upper()
        assert name in opening, f"the README's opening does not name {name}"
        said = opening[opening.index(name) :][:120]
        assert "removed" in said and "adapterd methods" in said, said
