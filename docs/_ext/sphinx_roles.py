"""Render the Sphinx roles and ``docs/*.md`` mentions of the docstrings as links on the API pages.

The docstrings are written for readers of the source and for Sphinx-minded tools
(``:class:`~phalanx.trainer_view.TrainerView```, ``:meth:`setup```, "see docs/trainer.md").
mkdocstrings renders Markdown, so without this module those roles show literally on the API
reference pages. This griffe extension (loaded by mkdocs.yml's mkdocstrings ``extensions`` option)
rewrites every docstring of the documented packages once they are loaded, without touching the
Python sources:

* a role whose target resolves, the Sphinx way (current class, current module, then as written),
  to an object of a documented package becomes an *optional* mkdocs-autorefs cross-reference to
  the object's canonical path: a link where the API reference renders that object, inline code
  where it does not (private helpers, members without docstrings). autorefs decides that at the
  end of the build, from the anchors the pages really rendered, so the link set cannot drift from
  the reference pages;
* a fully qualified target in a documented package (``phalanx.Foo``) that resolves to nothing is a
  broken reference: it becomes a *required* cross-reference and a warning, so
  ``mkdocs build --strict`` fails and names it;
* anything else (torch, the standard library, names that resolve nowhere) becomes inline code;
* ``docs/<page>.md`` becomes a link to that page, titled with the page's first heading.

The rewriting functions are pure (no griffe, no mkdocs), so ``tests/docs/test_site_refs.py`` tests
them in the development environment; the :class:`SphinxRoles` extension only wires them to griffe.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

try:
    from griffe import AliasResolutionError, CyclicAliasError, Extension
except ImportError:  # the dev venv tests the pure functions only; mkdocs always has griffe
    Extension = object  # type: ignore[assignment,misc]
    AliasResolutionError = CyclicAliasError = LookupError  # type: ignore[assignment,misc]

__all__ = [
    "Link",
    "SphinxRoles",
    "candidates",
    "doc_pages",
    "make_resolver",
    "rewrite",
    "rewrite_doc_paths",
    "rewrite_roles",
]

#: Under "mkdocs" so that ``mkdocs build --strict`` counts the warning and fails.
_log = logging.getLogger("mkdocs.plugins.phalanx_sphinx_roles")

#: ``:class:`x```, ``:py:meth:`~x.y```, ``:func:`title <x.y>```.
ROLE_RE = re.compile(r":(?:py:)?(?P<role>class|meth|func|mod|data|attr|exc|obj|const|type):`(?P<body>[^`]+)`")
#: ``docs/trainer.md`` or ``docs/trainer.md#anchor`` as plain text (not inside code, not in a path).
DOC_PATH_RE = re.compile(r"(?<![\w/`.-])docs/(?P<page>[\w-]+(?:/[\w-]+)*\.md)(?P<anchor>#[\w-]+)?(?![\w/`])")
#: Fenced code blocks are code: roles there stay as written.
FENCE_RE = re.compile(r"^\s*(```|~~~)")
#: Top-level packages whose objects may be linked: ``phalanx`` and the ``phalanx_*`` plugins.
OURS_RE = re.compile(r"^phalanx(_\w+)?$")
_CALLABLE_ROLES = frozenset({"meth", "func"})


@dataclass(frozen=True)
class Link:
    """Where a role points.

    ``required`` is False for a target that exists (a link if the reference renders it, inline code
    otherwise) and True for a broken one, which strict mode must reject.
    """

    identifier: str
    required: bool = False


#: ``(role, target) -> Link | None``; the target is written without ``~``, ``!`` or a title.
Resolver = Callable[[str, str], "Link | None"]


def _title(role: str, body: str) -> tuple[str, str, bool]:
    """Split a role's body into (title, target, linkable), the way Sphinx reads it."""
    explicit = re.fullmatch(r"(?P<title>.*?)\s*<(?P<target>[^<>]+)>", body, flags=re.DOTALL)
    if explicit and explicit["title"]:
        return explicit["title"], explicit["target"].lstrip("~!"), not explicit["target"].startswith("!")
    target = body.strip()
    linkable = not target.startswith("!")
    target = target.lstrip("!")
    short = target.startswith("~")
    target = target.lstrip("~")
    title = target.rsplit(".", 1)[-1] if short else target.lstrip(".")
    if role in _CALLABLE_ROLES and not title.endswith(")"):
        title += "()"  # Sphinx's add_function_parentheses default
    return title, target, linkable


def _code(text: str) -> str:
    """Inline code that survives backticks inside ``text``."""
    fence = "``" if "`" in text else "`"
    pad = " " if "`" in text else ""
    return f"{fence}{pad}{text}{pad}{fence}"


def rewrite_roles(text: str, resolve: Resolver) -> str:
    """Replace every Sphinx role of ``text`` (outside fenced code) with a link or inline code.

    ``resolve`` says where a target points; the output is Markdown that mkdocs-autorefs completes:
    ``<autoref identifier="..." optional>`` for existing objects, ``[`title`][identifier]`` (which
    strict mode checks) for broken ones, plain inline code for everything else.
    """

    def replace(match: re.Match[str]) -> str:
        role = match["role"]
        title, target, linkable = _title(role, match["body"])
        link = resolve(role, target) if linkable else None
        if link is None:
            return _code(title)
        if link.required:
            return f"[{_code(title)}][{link.identifier}]"
        return f'<autoref identifier="{link.identifier}" optional>{_code(title)}</autoref>'

    return _outside_fences(text, lambda chunk: ROLE_RE.sub(replace, chunk))


def rewrite_doc_paths(text: str, pages: Mapping[str, str], *, base: str = "../") -> str:
    """Turn ``docs/<page>.md`` into a Markdown link to the page, titled with its first heading.

    ``pages`` maps a page path relative to docs/ (``trainer.md``) to its title; ``base`` is the
    way from the page that renders the docstring to docs/ (the API pages live in docs/reference/).
    A page that does not exist stays a link, so mkdocs' link validation reports it.
    """

    def replace(match: re.Match[str]) -> str:
        page, anchor = match["page"], match["anchor"] or ""
        return f"[{pages.get(page, match[0])}]({base}{page}{anchor})"

    return _outside_fences(text, lambda chunk: DOC_PATH_RE.sub(replace, chunk))


def rewrite(text: str, resolve: Resolver, pages: Mapping[str, str]) -> str:
    """Both rewritings of one docstring."""
    return rewrite_doc_paths(rewrite_roles(text, resolve), pages)


def _outside_fences(text: str, apply: Callable[[str], str]) -> str:
    """Apply ``apply`` to the parts of ``text`` outside fenced code blocks."""
    out: list[str] = []
    chunk: list[str] = []
    fence: str | None = None
    for line in text.splitlines(keepends=True):
        opener = FENCE_RE.match(line)
        if fence is None and opener:
            out.append(apply("".join(chunk)))
            chunk, fence = [], opener[1]
            out.append(line)
        elif fence is not None:
            out.append(line)
            if line.strip().startswith(fence):
                fence = None
        else:
            chunk.append(line)
    out.append(apply("".join(chunk)))
    return "".join(out)


def candidates(target: str, *, module: str, cls: str | None = None) -> list[str]:
    """The paths Sphinx would try for ``target`` written in ``cls`` (or ``module``), best first.

    A leading dot makes the target relative (``.entry_points``: the current module, its package);
    otherwise the current class, the current module, then the target as written.
    """
    name = target.lstrip(".")
    scopes = [cls] if cls else []
    scopes.append(module)
    if target.startswith("."):
        scopes.append(module.rpartition(".")[0])
    found = [f"{scope}.{name}" for scope in scopes if scope]
    if not target.startswith("."):
        found.append(name)
    return list(dict.fromkeys(found))


def doc_pages(docs_dir: Path) -> dict[str, str]:
    """Every page of ``docs_dir`` (relative path with ``/``) and its first ``# `` heading."""
    pages = {}
    for path in sorted(docs_dir.rglob("*.md")):
        text = path.read_text(encoding="utf-8")
        heading = re.search(r"^# (.+)$", text, flags=re.MULTILINE)
        pages[path.relative_to(docs_dir).as_posix()] = heading[1].strip() if heading else path.stem
    return pages


class SphinxRoles(Extension):  # type: ignore[misc]
    """The griffe extension: rewrites the docstrings of each documented package once it is loaded.

    Options (mkdocs.yml): ``docs_dir`` (where the ``docs/*.md`` pages are, default ``docs``).
    """

    def __init__(self, docs_dir: str = "docs") -> None:
        self.pages = doc_pages(Path(docs_dir))

    def on_package(self, *, pkg: Any, loader: Any, **kwargs: Any) -> None:
        """Rewrite every docstring of ``pkg`` (its modules, classes, functions, attributes)."""
        if not OURS_RE.match(pkg.name):
            return
        lookup = _griffe_lookup(loader)
        for obj in _walk(pkg):
            module = obj.module.path
            cls = (
                obj.path
                if obj.is_class
                else (obj.parent.path if obj.parent is not None and obj.parent.is_class else None)
            )
            resolve = make_resolver(lookup, obj.path, module=module, cls=cls)
            obj.docstring.value = rewrite(obj.docstring.value, resolve, self.pages)


def _walk(obj: Any) -> Iterator[Any]:
    """The objects declared under ``obj`` (not aliases) that have a docstring."""
    if obj.docstring is not None:
        yield obj
    for member in obj.members.values():
        if not member.is_alias:
            yield from _walk(member)


def make_resolver(lookup: Callable[[str], str | None], where: str, *, module: str, cls: str | None) -> Resolver:
    """The resolver for the docstring of ``where`` (inside ``cls``, or ``module``).

    ``lookup`` maps a dotted path to the canonical path of the documented-package object it names,
    or None (missing, or outside the documented packages). A fully qualified target in a documented
    package that finds nothing is broken: a warning (strict mode fails) and a required link.
    """

    def resolve(role: str, target: str) -> Link | None:
        for path in candidates(target, module=module, cls=cls):
            if found := lookup(path):
                return Link(found)
        qualified = "." in target and not target.startswith(".")
        if qualified and OURS_RE.match(target.split(".", 1)[0]):
            _log.warning(
                "Broken cross-reference in the docstring of %s: :%s:`%s` names nothing in the documented "
                "packages. Fix: correct the dotted path (as importable), or write the name as ``code``.",
                where,
                role,
                target,
            )
            return Link(target, required=True)
        return None

    return resolve


def _griffe_lookup(loader: Any) -> Callable[[str], str | None]:
    """``lookup`` for :func:`make_resolver` over the packages ``loader`` has loaded."""
    collection = loader.modules_collection
    missing: set[str] = set()

    def lookup(path: str) -> str | None:
        top = path.split(".", 1)[0]
        if not OURS_RE.match(top) or top in missing:
            return None
        if top not in collection:
            try:
                loader.load(top)  # a plugin's docstring naming phalanx before phalanx's page loaded it
            except ImportError:
                missing.add(top)
                return None
        try:
            canonical: str = collection[path].canonical_path
        except (KeyError, ValueError, AliasResolutionError, CyclicAliasError):
            return None
        return canonical if OURS_RE.match(canonical.split(".", 1)[0]) else None

    return lookup
