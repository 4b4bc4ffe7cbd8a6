"""Find the Python snippets of the Markdown docs and turn each into a script to run.

Every ```` ```python ```` fence in ``docs/**/*.md`` and ``README.md`` is a snippet. An HTML comment
on the line before a fence (invisible on the site) says how to run it:

- ``<!-- snippet: skip REASON -->``: not run; the reason is required and shown as the skip reason.
- ``<!-- snippet: long -->``: run with a longer timeout and the ``docs_long`` mark.
- ``<!-- snippet: id=NAME -->``: later snippets of the same page may build on it.
- ``<!-- snippet: uses=NAME[,NAME] -->``: the named snippets are put before this one in its script.

Words combine: ``<!-- snippet: long uses=model -->``. A snippet without a comment runs on its own.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path

__all__ = ["ROOT", "Snippet", "collect", "page_snippets"]

ROOT = Path(__file__).resolve().parents[2]
_FENCE = re.compile(r"^(?P<indent> *)```(?P<info>[^\n`]*)$")
_MARKER = re.compile(r"^\s*<!--\s*snippet:\s*(?P<body>.*?)\s*-->\s*$")


@dataclass
class Snippet:
    """One Python fence: where it is, its code, and how its marker says to run it."""

    page: Path
    line: int
    code: str
    skip: str | None = None
    long: bool = False
    name: str | None = None
    uses: list[str] = field(default_factory=list)

    @property
    def test_id(self) -> str:
        return f"{self.page.relative_to(ROOT).as_posix()}:{self.line}"


def _parse_marker(body: str, where: str) -> dict[str, object]:
    if body.startswith("skip"):
        reason = body[len("skip") :].strip()
        if not reason:
            msg = f"{where}: 'snippet: skip' needs a reason, e.g. <!-- snippet: skip needs 8 GPUs -->"
            raise ValueError(msg)
        return {"skip": reason}
    options: dict[str, object] = {}
    for word in body.split():
        if word == "long":
            options["long"] = True
        elif word.startswith("id="):
            options["name"] = word[3:]
        elif word.startswith("uses="):
            options["uses"] = [n for n in word[5:].split(",") if n]
        else:
            msg = f"{where}: unknown snippet option {word!r}; valid: skip REASON, long, id=NAME, uses=NAME[,NAME]"
            raise ValueError(msg)
    return options


def page_snippets(page: Path) -> list[Snippet]:
    """The Python snippets of one Markdown page, in order."""
    lines = page.read_text(encoding="utf-8").splitlines()
    found: list[Snippet] = []
    index = 0
    while index < len(lines):
        fence = _FENCE.match(lines[index])
        if fence is None:
            index += 1
            continue
        info, indent = fence.group("info").strip(), len(fence.group("indent"))
        end = index + 1
        while end < len(lines) and lines[end].strip() != "```":
            end += 1
        if info.split(" ")[0] == "python":
            marker = _MARKER.match(lines[index - 1]) if index > 0 else None
            where = f"{page.relative_to(ROOT)}:{index + 1}"
            options = _parse_marker(marker.group("body"), where) if marker else {}
            code = "\n".join(line[indent:] for line in lines[index + 1 : end]) + "\n"
            found.append(Snippet(page, index + 1, code, **options))  # type: ignore[arg-type]
        index = end + 1
    return found


def collect() -> list[Snippet]:
    """Every Python snippet of README.md and docs/, with ``uses=`` checked against the page's ids."""
    pages = [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]
    snippets = []
    for page in pages:
        on_page = page_snippets(page)
        names = {s.name for s in on_page if s.name}
        for snippet in on_page:
            unknown = [n for n in snippet.uses if n not in names]
            if unknown:
                msg = f"{snippet.test_id}: uses={','.join(unknown)} but the page defines only ids {sorted(names)}"
                raise ValueError(msg)
        snippets += on_page
    return snippets


def script_for(snippet: Snippet, page_snippets_: list[Snippet]) -> str:
    """The script that runs ``snippet``: the snippets it uses (in page order), then its own code."""
    used = [s for s in page_snippets_ if s.name in snippet.uses]
    return "".join(f"# --- {s.test_id}\n{s.code}" for s in [*used, snippet])
